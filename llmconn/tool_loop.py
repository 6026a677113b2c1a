"""One turn of the tool loop: the items, usage and rounds so far, and the manual-tool checks.

The connection's pipeline drives the loop; :class:`TurnLoop` is what it
builds on the way - the turn's canonical items (a pending turn's, when
``tool_outputs`` complete it, or the caller's own turn in progress), the
usage summed over every provider call, the rounds made - and the result
dict it hands out at the end.
"""

from __future__ import annotations

import json
from typing import Any

from llmconn import items as mod_items
from llmconn.checks import check_tool_outputs
from llmconn.errors import InvalidInput
from llmconn.pricing import cost_micro_usd
from llmconn.types import Reply, Turn, add_usage


class TurnLoop:
    """The turn being built: its items, usage and rounds so far."""

    def __init__(self, pending: Turn | None, outputs: dict | None, tag: str, given: tuple = (),
                 given_tag: str = '', pricing: Any = None) -> None:
        # ``given``: a turn in progress the caller keeps (the gateway's calls and outputs), natives
        # kept only for the provider, model and mode that made them; it is not this call's to count.
        self.items: list[dict] = (list(given) if given_tag == tag else mod_items.plain(given)) if given else []
        self.given = len(self.items)
        self.last: Reply | None = None
        self.rounds = 0
        self.usage: dict = {}
        self.pricing = pricing          # the connection's prices: the usage then says what it cost
        self.waiting = False
        self.state: dict = {}
        if pending is not None:
            steps = pending.steps()
            self.items = steps if pending.tag == tag else mod_items.plain(steps)
            self.items += [mod_items.output(c['call_id'], _output_text(outputs[c['call_id']]))
                           for c in pending.pending]
            self.items = _outputs_in_call_order(self.items)
            self.last = Reply('', response_id=pending.state.get('response_id', ''))
            self.state = dict(pending.state)

    def add(self, reply: Reply, state: dict) -> None:
        if self.rounds:
            add_usage(self.usage, reply.usage)
        else:
            self.usage = reply.usage        # a dict of its own, every count in it
        self.rounds += 1
        self.items += list(reply.steps) or [mod_items.text(reply.text)]
        self.last = reply
        self.state = state

    @property
    def text(self) -> str:
        return mod_items.final_text(self.items)

    def stored_items(self) -> tuple:
        """What the turn stores beside its text: nothing for a plain answer."""
        plain = len(self.items) == 1 and self.items[0]['kind'] == mod_items.TEXT and 'native' not in self.items[0]
        return () if plain else tuple(self.items)

    @property
    def result(self) -> dict:
        result = self.last.as_result()
        result['text'] = self.text
        result['usage'] = dict(self.usage)
        if self.pricing is not None:
            result['usage']['cost'] = cost_micro_usd(self.pricing, result['usage'])
        result['rounds'] = self.rounds
        calls = mod_items.tool_calls(self.items[self.given:])
        if calls:
            result['tool_calls'] = calls
        if self.waiting:
            result['stop_reason'] = 'tool_calls'
        return result


def _outputs_in_call_order(items: list[dict]) -> list[dict]:
    """The last round's outputs in the order of its calls (some came later, from the caller)."""
    order = {c['call_id']: i for i, c in enumerate(mod_items.calls(items))}
    cut = len(items)
    while cut and items[cut - 1]['kind'] == mod_items.OUTPUT:
        cut -= 1
    return items[:cut] + sorted(items[cut:], key=lambda o: order.get(o['call_id'], len(order)))


def public_call(item: dict) -> dict:
    return {'call_id': item['call_id'], 'name': item['name'], 'arguments': item['arguments']}


def _output_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def check_outputs(text: Any, outputs: Any) -> None:
    if text:
        raise InvalidInput('give either text or tool_outputs, not both: the pending tool calls must be '
                           'answered before the chat continues')
    if not isinstance(outputs, dict) or not outputs:
        raise InvalidInput('tool_outputs must be a non-empty dict {call_id: output}')
    for call_id, value in outputs.items():
        if not isinstance(call_id, str):
            raise InvalidInput(f'tool_outputs keys must be call ids (str), got {type(call_id).__name__}')
        try:
            _output_text(value)
        except (TypeError, ValueError):
            raise InvalidInput(f'tool_outputs[{call_id!r}] must be a str or a JSON value') from None
    check_tool_outputs(outputs)


def check_pending(pending: Turn | None, call) -> None:
    """Before any provider call: tool outputs answer exactly the pending calls; no text meanwhile."""
    if call.outputs is None:
        if pending is not None:
            ids = ', '.join(c['call_id'] for c in pending.pending)
            raise InvalidInput(f'this chat waits for the outputs of tool calls {ids}; answer them with '
                               f'chat(chat_id=..., tool_outputs={{call_id: output}}) before sending new text')
        return
    if pending is None:
        raise InvalidInput('tool_outputs given, but this chat has no pending tool calls')
    want = [c['call_id'] for c in pending.pending]
    if set(call.outputs) != set(want):
        raise InvalidInput(f'tool_outputs must answer exactly the pending call ids {want}, '
                           f'got {sorted(call.outputs)}')
