"""How the fake provider APIs use tools, deterministically, and the replay rules they enforce.

A user message made of ``call NAME {json args}`` segments (separated by
``;``) makes the model call those tools, if the request declares them all;
for example ``call get_order {"order_id": "123"}; call get_user {}`` asks
for two calls at once. When the conversation ends with tool outputs, the
model answers ``tool said: <output> | <output>``, unless the last output is
itself such a call request, in which case it calls again (so a test can
drive a loop of any length).

Every fake API checks what comes back as the real one does and answers
with its real 400; each refusal is also recorded as a *replay violation*
(``FakeState.violations``), so a test of the tool loop asserts there were none.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterable

_SEGMENT = re.compile(r'^call ([a-zA-Z0-9_-]{1,64})\s*(\{.*\})?$', re.DOTALL)
TOOL_ANSWER_PREFIX = 'tool said: '


def requested_calls(text: str, declared: Iterable[str]) -> list[tuple[str, dict]]:
    """The calls a message asks for, or [] when it is not a call request for declared tools."""
    declared = set(declared)
    if not declared or not isinstance(text, str) or not text.strip().startswith('call '):
        return []
    calls = []
    for segment in text.split(';'):
        match = _SEGMENT.match(segment.strip())
        if match is None or match.group(1) not in declared:
            return []
        try:
            arguments = json.loads(match.group(2)) if match.group(2) else {}
        except ValueError:
            return []
        if not isinstance(arguments, dict):
            return []
        calls.append((match.group(1), arguments))
    return calls


def decide(last_user: str, outputs: list[str] | None, declared: Iterable[str]) -> list[tuple[str, dict]] | str | None:
    """What the model does next: calls to make, a text answering tool outputs, or None (echo)."""
    declared = list(declared)
    if outputs:
        again = requested_calls(outputs[-1], declared)
        return again or TOOL_ANSWER_PREFIX + ' | '.join(outputs)
    return requested_calls(last_user, declared) or None


def argument_chunks(arguments: dict) -> list[str]:
    """A call's arguments as JSON text in a few pieces, the way the APIs stream them."""
    text = json.dumps(arguments, separators=(',', ':'))
    step = max(1, len(text) // 3)
    return [text[i:i + step] for i in range(0, len(text), step)] or ['']


def signed_call(name: str, arguments: Any) -> str:
    """The text a fake signs for one call, so an altered call or a foreign signature is refused."""
    return json.dumps([name, arguments], sort_keys=True, separators=(',', ':'))


def violation(call, rule: str, error):
    """Record a replay violation on the fake's state, then hand back the API's error to raise."""
    call.state.add_violation({'api': call.path, 'rule': rule, 'status': error.status, 'body': error.body})
    return error
