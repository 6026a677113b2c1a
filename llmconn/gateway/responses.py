"""``POST /v1/responses``: a request checked and resolved into a :class:`Call`, ready to be sent.

:func:`prepare` does every check before any network call: the key's
models and hosted tools, each field against the capability matrix, the
input, and ``previous_response_id`` (same tenant, a stored mode, a status
that can be continued). It decides the new response's store mode::

    store: false                                   -> none
    the backend keeps state (Responses, state: provider)   -> provider
    retention: zero                                -> none
    otherwise                                      -> gateway (the ledger keeps the items to replay)

``instructions`` belong to one response only: they are hashed into its
record and never carried over, as OpenAI defines.

``include: ["reasoning.encrypted_content"]`` makes the answer's reasoning
item carry the backend's own items, sealed (:mod:`llmconn.gateway.reasoning`),
so a stateless client can continue a turn of function calls; sealed
reasoning items in ``input`` are opened whether or not the request asks
for more.

A call's Response objects are made by :mod:`.response_objects`, its record
by :mod:`.response_record`; :mod:`.dispatch` sends it.
"""

from __future__ import annotations

import logging
import time as mod_time
from dataclasses import dataclass, field
from typing import Any

from llmconn.errors import GatewayError
from llmconn import items as canon
from llmconn.gateway import backend, call_registry, effective, fallbacks, forget, items as mod_items
from llmconn.gateway import reasoning
from llmconn.gateway import tools as mod_tools
from llmconn.gateway.capabilities import RESPONSES
from llmconn.gateway.echo import shown, shown_all
from llmconn.gateway.policy import Policy, check_history, resolve
from llmconn.gateway.response_objects import usage_object  # noqa: F401  (imported from here by callers)
from llmconn.gateway.response_record import CONTINUABLE
from llmconn.gateway.turns import to_conversation
from llmconn.gateway_config import Retention
from llmconn.store.records import StoreMode, new_response_id

logger = logging.getLogger('llmconn.gateway')

DOWNGRADES_KEY = 'llmconn_downgrades'
MAX_METADATA_KEYS = 16          # OpenAI's limits on metadata
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512


@dataclass
class Call:
    """One checked Responses request, ready to be sent."""

    key: Any
    conn: Any
    model: str
    stream: bool
    store: bool
    mode: StoreMode                 # who keeps its state (see llmconn.store.records)
    instructions: str | None
    metadata: dict
    params: dict
    downgrades: list
    conversation: mod_items.Conversation
    context: list                  # the canonical items the new response continues (gateway mode)
    previous: dict | None
    input: list = field(default_factory=list)      # this request's own input items (canonical)
    provider_previous_id: str = ''
    tools: tuple = ()               # manual llmconn Tools (the client runs them)
    hosted: tuple = ()              # hosted tool definitions the key and the connection allow
    echo_tools: list = field(default_factory=list)      # the Response's ``tools``
    sealer: Any = None              # seals the answer into its reasoning item (include asked for it)
    custom: frozenset = frozenset()     # the names of the request's custom tools
    expiry: float = 30 * 86400     # seconds the record is kept (gateway.response_expiry)
    id: str = field(default_factory=new_response_id)
    created_at: int = field(default_factory=lambda: int(mod_time.time()))
    settings: dict = field(default_factory=dict)      # what the Response echoes (effective.settings)
    ended_at: int | None = None     # when it ended: one time for the answer and its record alike
    fallbacks: tuple = ()           # the connections that may take it over (llmconn.gateway.fallbacks)
    served: Any = None              # the fallback that answered, once one took the call over
    body: dict = field(default_factory=dict, repr=False)    # the request, for a fallback's settings
    admission: Any = None           # the key's limits (llmconn.gateway.limits), None for a key without
    warm: bool = False              # generate: false (WebSocket mode): prepares state, no model output

    @property
    def answering(self) -> Any:
        """The connection answering: ``conn``, or the fallback the call failed over to."""
        return self.served or self.conn

    def failed_over(self, fallback: Any) -> None:
        """A fallback takes the call over (before any of its events): the Response names it and
        echoes the settings it is sent with."""
        self.served = fallback
        self.metadata = dict(self.metadata, **{fallbacks.SERVED_BY_KEY: fallback.name})
        self.settings = effective.settings(fallback, self.body, self.downgrades)


def prepare(gw: Any, key: Any, body: Any, admission: Any = None, generate: bool = True) -> Call:
    """Check a create request whole, before any network call, and resolve it into a :class:`Call`
    (counted against ``admission``, the key's limits, when it has them).

    ``generate=False`` (the WebSocket mode's warm-up) prepares a response that only records its
    input, for the next to continue: the gateway keeps its items even for a backend that keeps
    state (the next response sends them), so it cannot continue a chain such a backend keeps.
    """
    if not isinstance(body, dict):
        raise GatewayError('the request body must be a JSON object')
    model = body.get('model')
    conn = gw.connection(key, model)
    check_hosted_tools(key, body.get('tools'))
    tools, hosted = mod_tools.definitions(key, conn, body.get('tools'))
    policy = Policy.parse(body.get('fallback_policy'))
    sealing, include = reasoning.split_include(body.get('include'))
    resolution = resolve(RESPONSES, backend.kind(conn), dict(body, include=include), policy)
    store, stream = _flag(body, 'store', True), _flag(body, 'stream', False)
    instructions = body.get('instructions')
    if instructions is not None:
        mod_items.check_text(instructions, 'instructions')
    new_items, sealer = _new_items(gw, key, body, sealing)
    previous = _previous(gw, key, body.get('previous_response_id'), conn)
    if not generate and _provider_kept(previous):
        raise GatewayError('generate: false cannot continue a response its backend keeps (it has no state '
                           'to prepare there); send the input with the next response instead',
                           param='previous_response_id')
    mode = StoreMode.NONE if not store else StoreMode.PROVIDER if conn.provider.keeps_state and generate else \
        StoreMode.NONE if key.retention == Retention.ZERO else StoreMode.GATEWAY
    custom = mod_tools.custom_names(hosted)
    if generate:
        context, conversation = _conversation(previous, new_items, instructions or '', policy, resolution)
        check_history(RESPONSES, backend.kind(conn), conversation)
        mod_tools.check_items(conn, context, custom)
        backend.check_replay(conn, conversation)
    else:       # nothing is sent: the items are checked whole, as a conversation, by the response continuing them
        context = list(previous.get('context') or ()) + new_items if previous else list(new_items)
        conversation = mod_items.Conversation(instructions or '', (), '')
    if resolution.downgrades:
        logger.info('Downgrade accepted: tenant=%s key=%s model=%s losses=%s', key.tenant, key.id, model,
                    ','.join(resolution.downgrades))
    call = Call(key=key, conn=conn, model=model, stream=stream, store=store, mode=mode,
                instructions=instructions, metadata=_metadata(body.get('metadata'), resolution.downgrades),
                params=resolution.params, downgrades=resolution.downgrades,
                conversation=conversation, context=context, previous=previous, input=new_items,
                expiry=gw.config.response_expiry,
                provider_previous_id=previous['provider_response_id'] if _provider_kept(previous) else '',
                tools=tools, hosted=hosted, sealer=sealer if sealing else None, custom=custom,
                echo_tools=[_echo(t) for t in tools] + [h for h in hosted if h.get('type') == 'custom'],
                settings=effective.settings(conn, body, resolution.downgrades), admission=admission,
                warm=not generate)
    if mode != StoreMode.PROVIDER and not call.provider_previous_id:      # else only its backend can continue it
        call.fallbacks = fallbacks.usable(conn, lambda fallback: _can_take(key, fallback, body, include, policy,
                                                                           resolution, call))
        call.body = body
    if previous is not None:
        forget.join(gw, key.tenant, previous, call.id)      # so that deleting an ancestor finds it
    return call


def _can_take(key: Any, fallback: Any, body: dict, include: Any, policy: Policy, resolution: Any, call: Call) -> None:
    """Raise unless ``fallback`` can answer ``call`` as its connection would (llmconn.gateway.fallbacks)."""
    fallbacks.same_call(resolution, resolve(RESPONSES, backend.kind(fallback), dict(body, include=include), policy))
    check_history(RESPONSES, backend.kind(fallback), call.conversation)
    mod_tools.check_items(fallback, call.context, call.custom)
    backend.check_replay(fallback, call.conversation)
    if call.hosted and mod_tools.definitions(key, fallback, body.get('tools'))[1] != call.hosted:
        raise GatewayError('it does not run the same hosted tools')


def _new_items(gw: Any, key: Any, body: dict, sealing: bool) -> tuple[list, Any]:
    """The input as gateway items, sealed reasoning opened (or the calls' items found in the tool-call
    registry); and the tenant's sealer, when one is needed."""
    if 'input' not in body:
        raise GatewayError('input is required', param='input')
    items = mod_items.from_responses_input(body['input'])
    sealer = reasoning.sealer(gw, key) if sealing or reasoning.has_sealed(items) else None
    return reasoning.restore(items, sealer, call_registry.of(gw, key)), sealer


def _echo(tool: Any) -> dict:
    return {'type': 'function', 'name': tool.name, 'description': tool.description or None,
            'parameters': tool.parameters, 'strict': bool(tool.strict)}


def _provider_kept(previous: dict | None) -> bool:
    return previous is not None and previous['store_mode'] == StoreMode.PROVIDER


def _conversation(previous: dict | None, new_items: list, instructions: str, policy: Policy,
                  resolution: Any) -> tuple[list, mod_items.Conversation]:
    """The items the new response continues, and what the provider is sent of them.

    A chain the backend keeps gets only the new input; otherwise the stored items are replayed.
    """
    if _provider_kept(previous) and any(i['type'] in mod_items.OUTPUT_TYPES for i in new_items):
        return list(new_items), _provider_outputs(previous, new_items)
    if _provider_kept(previous):
        conversation = to_conversation(new_items, instructions, policy, resolution)
        if conversation.turns:
            raise GatewayError('input may hold only new user messages when previous_response_id continues a '
                               'response the backend keeps', param='input')
        return list(new_items), conversation
    context = list(previous.get('context') or ()) + new_items if previous else list(new_items)
    return context, to_conversation(context, instructions, policy, resolution)


def _provider_outputs(previous: dict, new_items: list) -> mod_items.Conversation:
    """Outputs continuing a chain the backend keeps: joined to the previous response's calls, all of them."""
    waiting = {c['call_id']: c['name'] for c in previous.get('tool_calls') or ()}
    outputs = []
    for item in new_items:
        if item['type'] not in mod_items.OUTPUT_TYPES:
            raise GatewayError('input may hold only function_call_output items when it answers the calls of a '
                               'response the backend keeps', param='input')
        if item['call_id'] not in waiting or item['call_id'] in {o['call_id'] for o in outputs}:
            raise GatewayError(f'{item["type"]} for call_id {shown(item["call_id"])} answers no function call '
                               f'of the response it continues (unknown or already answered call id)',
                               param='input', code='unknown_call_id')
        outputs.append(canon.output(item['call_id'], item['output'], name=waiting[item['call_id']]))
    missing = [c for c in waiting if c not in {o['call_id'] for o in outputs}]
    if missing:
        raise GatewayError(f'the function calls {shown_all(missing)} have no function_call_output; answer each '
                           f'call (its call_id and output) before the conversation goes on', param='input',
                           code='unanswered_function_call')
    return mod_items.Conversation('', (), '', items=tuple(outputs), tag='')


def check_hosted_tools(key: Any, tools: Any) -> None:
    """Hosted tools the key does not allow are refused first, before anything else is looked at."""
    if not tools:
        return
    if not isinstance(tools, list):
        raise GatewayError('tools must be a list', param='tools')
    for index, tool in enumerate(tools):
        kind = tool.get('type') if isinstance(tool, dict) else None
        if kind not in (None, 'function', 'custom') and kind not in key.hosted_tools:
            raise GatewayError(f'tools[{index}]: this key may not use the hosted tool {shown(kind)}',
                               param=f'tools[{index}].type', code='hosted_tool_not_allowed')


def _flag(body: dict, name: str, default: bool) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise GatewayError(f'{name} must be true or false', param=name)
    return value


def _metadata(raw: Any, downgrades: list) -> dict:
    metadata = {} if raw is None else raw
    if not isinstance(metadata, dict) or len(metadata) > MAX_METADATA_KEYS or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= MAX_METADATA_KEY_CHARS
            and len(v) <= MAX_METADATA_VALUE_CHARS for k, v in metadata.items()):
        raise GatewayError(f'metadata must map at most {MAX_METADATA_KEYS} keys (up to {MAX_METADATA_KEY_CHARS} '
                           f'characters) to strings (up to {MAX_METADATA_VALUE_CHARS})', param='metadata')
    if downgrades:
        metadata = dict(metadata, **{DOWNGRADES_KEY: ','.join(downgrades)})
    return metadata


def _previous(gw: Any, key: Any, previous_id: Any, conn: Any) -> dict | None:
    """The record ``previous_response_id`` names, if this key may continue it; else 404 or 400."""
    if previous_id is None:
        return None
    record = gw.ledger.get(key.tenant, previous_id) if isinstance(previous_id, str) else None
    if record is None or not key.may_use(record['model']):
        raise GatewayError(f'Previous response with id {shown(previous_id)} not found.', 404,
                           param='previous_response_id', code='previous_response_not_found')
    if record['status'] not in CONTINUABLE:
        raise GatewayError(f'previous response {previous_id} is {record["status"]}; only a completed response '
                           f'can be continued', param='previous_response_id')
    mode = StoreMode(record['store_mode'])
    if mode == StoreMode.NONE:
        raise GatewayError(f'previous response {previous_id} was not stored (store: false or a zero-retention '
                           f'key), so there is nothing to continue from', param='previous_response_id',
                           code='previous_response_not_stored')
    if mode == StoreMode.PROVIDER and record['model'] != conn.name:
        raise GatewayError(f'previous response {previous_id} is kept by the backend of model {record["model"]!r}; '
                           f'continue it with that model', param='previous_response_id')
    if mode == StoreMode.GATEWAY and key.retention == Retention.ZERO:
        raise GatewayError('a zero-retention key cannot continue a response the gateway keeps; the replay would '
                           'reuse retained conversation text', param='previous_response_id')
    forget.check(gw, key.tenant, record)
    return record
