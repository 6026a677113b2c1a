"""A request's fields against the capability matrix: mapped to provider params, dropped as a named loss, or refused.

:func:`resolve` walks every field of a request body: unknown fields are
refused; structural ones (input, store, ...) are the route's business;
no-op values pass; a native or emulated field becomes provider params; an
unsupported one is a 400 naming it unless the request's :class:`Policy`
accepts its loss, which :class:`Resolution` then records for the answer's
``metadata["llmconn_downgrades"]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llmconn import items as canon
from llmconn.errors import GatewayError
from llmconn.gateway.capabilities import LOSSES, RESPONSES, ROUTES, UNSUPPORTED, Field, Support
from llmconn.gateway.echo import param as echo_param, shown, shown_all


# Conversation items that belong to tool calling (a backend without tools cannot be sent them).
TOOL_ITEM_TYPES = ('function_call', 'function_call_output', 'custom_tool_call', 'custom_tool_call_output')


@dataclass(frozen=True)
class Policy:
    """A request's ``fallback_policy``: the losses it accepts (none by default)."""

    allow_lossy: bool = False
    allowed_losses: frozenset = frozenset()

    @classmethod
    def parse(cls, raw: Any) -> 'Policy':
        if raw is None:
            return NO_LOSSES
        if not isinstance(raw, dict) or set(raw) - {'allow_lossy', 'allowed_losses'}:
            raise GatewayError('fallback_policy must be {"allow_lossy": bool, "allowed_losses": [loss, ...]}',
                               param='fallback_policy')
        allow, losses = raw.get('allow_lossy', False), raw.get('allowed_losses') or []
        if not isinstance(allow, bool) or not isinstance(losses, list) or not all(isinstance(x, str) for x in losses):
            raise GatewayError('fallback_policy.allow_lossy is a bool and allowed_losses a list of loss names',
                               param='fallback_policy')
        unknown = sorted(set(losses) - set(LOSSES))
        if unknown:
            raise GatewayError(f'fallback_policy.allowed_losses: unknown loss {shown_all(unknown)}; '
                               f'known losses are {", ".join(sorted(LOSSES))}', param='fallback_policy.allowed_losses')
        return cls(allow, frozenset(losses))

    def allows(self, loss: str) -> bool:
        return bool(loss) and self.allow_lossy and loss in self.allowed_losses


NO_LOSSES = Policy()     # a request without fallback_policy (frozen: one for all of them)


@dataclass
class Resolution:
    """What the fields of one request become: provider params, and the losses accepted on the way."""

    params: dict = field(default_factory=dict)
    downgrades: list = field(default_factory=list)

    def downgrade(self, name: str, loss: str) -> None:
        entry = f'{name}:{loss}'
        if entry not in self.downgrades:
            self.downgrades.append(entry)


def check_loss(resolution: Resolution, policy: Policy, name: str, loss: str, why: str) -> None:
    """Accept the named loss when the policy allows it, else refuse the request (400 naming ``name``)."""
    if policy.allows(loss):
        resolution.downgrade(name, loss)
        return
    raise GatewayError(f'{name}: {why}. To accept this, send fallback_policy {{"allow_lossy": true, '
                       f'"allowed_losses": ["{loss}"]}}', param=name, code='unsupported_field')


# Per route: the names a body may carry, and the fields that are parts of them (reasoning.summary, ...).
_TOP_LEVEL = {route: frozenset(name for name, spec in fields.items() if spec.part_of is None)
              for route, fields in ROUTES.items()}
_PARTS = {route: tuple(spec for spec in fields.values() if spec.part_of is not None)
          for route, fields in ROUTES.items()}


def resolve(route: str, kind: str, body: dict, policy: Policy) -> Resolution:
    """Map every non-structural field of ``body`` for ``kind``; refuse what cannot be honoured."""
    fields = ROUTES[route]
    if not _TOP_LEVEL[route].issuperset(body):
        unknown = sorted(set(body) - _TOP_LEVEL[route])
        raise GatewayError(f'unknown field {shown(unknown[0])} for {route}; the gateway refuses fields it does not '
                           f'know rather than ignore them', param=echo_param(unknown[0]), code='unknown_field')
    if not runs_tools(route, kind):
        _refuse_tool_items(route, kind, body)
    resolution = Resolution()
    for name, value in body.items():
        _field(fields[name], kind, value, policy, resolution)
    for spec in _PARTS[route]:
        part = spec.part_of(body)
        if part is not None:
            _field(spec, kind, part, policy, resolution)
    return resolution


def _field(spec: Field, kind: str, value: Any, policy: Policy, resolution: Resolution) -> None:
    """One field's value: a no-op, the route's own, provider params, an accepted loss, or a 400."""
    name = spec.name
    if spec.trivial(value):
        return
    if spec.structural and (kind not in spec.support or spec.support[kind].level != UNSUPPORTED):
        return      # the route's own business (an unsupported one is refused below all the same)
    support = spec.support.get(kind) or Support(UNSUPPORTED)
    if support.level == UNSUPPORTED:
        if not support.loss:
            raise GatewayError(f'{name} is not supported with {_a(kind)} backend'
                               + (f' ({support.how})' if support.how else ''), param=name,
                               code='unsupported_field')
        check_loss(resolution, policy, name, support.loss, f'not supported with {_a(kind)} backend')
        return
    if support.to_params is not None:
        _merge(resolution.params, support.to_params(value))


def _a(kind: str) -> str:
    """``kind`` with its article: 'an openai', 'a claude'."""
    return f'{"an" if kind[:1] in "aeiou" else "a"} {kind}'


def runs_tools(route: str, kind: str) -> bool:
    """Whether backends of ``kind`` take function tools on ``route`` (the matrix's ``tools`` row)."""
    support = ROUTES[route]['tools'].support.get(kind)
    return support is not None and support.level != UNSUPPORTED


def _refuse_tool_items(route: str, kind: str, body: dict) -> None:
    """A conversation holding function calls or outputs, for a backend without tools: 400 naming the item."""
    field = 'input' if route == RESPONSES else 'messages'
    entries = body.get(field)
    for index, entry in enumerate(entries if isinstance(entries, list) else ()):
        if isinstance(entry, dict) and (entry.get('type') in TOOL_ITEM_TYPES or entry.get('role') == 'tool'
                                        or (entry.get('role') == 'assistant' and entry.get('tool_calls'))):
            refuse_tool_history(kind, f'{field}[{index}]')


def check_history(route: str, kind: str, conversation: Any) -> None:
    """Function calls carried over from a previous response, for a backend without tools: 400."""
    if runs_tools(route, kind):
        return
    steps = list(conversation.items) + [step for turn in conversation.turns for step in turn.items]
    if any(isinstance(step, dict) and step.get('kind') in (canon.CALL, canon.OUTPUT) for step in steps):
        refuse_tool_history(kind, 'previous_response_id')


def refuse_tool_history(kind: str, param: str) -> None:
    raise GatewayError(f'{param}: {_a(kind)} backend runs no tools, so function calls and their outputs cannot be '
                       f'sent to it; continue this conversation with a model that has tools', param=param,
                       code='unsupported_field')


def _merge(into: dict, new: dict) -> None:
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value
