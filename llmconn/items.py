"""The canonical items of a turn: what every provider mapping renders to and parses from.

A turn is the user's message followed by an ordered list of items, each a
plain JSON-able dict with a ``kind`` (typed as the :class:`TextItem`,
:class:`CallItem`, :class:`OutputItem` and :class:`OpaqueItem` TypedDicts,
so they stay dicts on the wire and in Redis):

* ``text`` - assistant text (``text``)
* ``refusal`` - the model declined (``text``)
* ``call`` - a function call (``call_id``, ``name``, ``arguments``: a dict)
* ``output`` - a function's output (``call_id``, ``output``: str, ``is_error``; ``name`` of the call, optional)
* ``reasoning`` - the model's reasoning, opaque (``native``)
* ``hosted`` - a provider-run tool's item, opaque (``native``)

Any item may also carry ``native``: the provider's own form, verbatim
(signatures, ids, encrypted content). Natives belong to the provider, model
and mode in the turn's tag and are replayed only there; elsewhere the opaque
kinds are dropped as a whole and the rest is rendered from its canonical
fields (see :func:`plain`). Turns stored before items existed held only
natives; :func:`canonical` reads them.
"""

from __future__ import annotations

from typing import Any, Iterable, TypedDict, Union

TEXT = 'text'
REFUSAL = 'refusal'
CALL = 'call'
OUTPUT = 'output'
REASONING = 'reasoning'
HOSTED = 'hosted'
OPAQUE = frozenset({REASONING, HOSTED})
KINDS = frozenset({TEXT, REFUSAL, CALL, OUTPUT, REASONING, HOSTED})


class _Natives(TypedDict, total=False):
    native: Any             # the provider's own form, replayed only to the turn's tag


class TextItem(_Natives):
    """``text`` or ``refusal``: what the assistant said."""

    kind: str
    text: str


class CallItem(_Natives):
    """``call``: a function call; ``arguments`` is a dict (or what the provider gave, verbatim)."""

    kind: str
    call_id: str
    name: str
    arguments: Any


class _OutputName(TypedDict, total=False):
    name: str               # the call's, for a mapping that renders outputs by the tool they answer


class OutputItem(_OutputName):
    """``output``: a function's output, joined to its call by ``call_id``."""

    kind: str
    call_id: str
    output: str
    is_error: bool


class OpaqueItem(TypedDict):
    """``reasoning`` or ``hosted``: the provider's item, nothing canonical beside it."""

    kind: str
    native: Any


Item = Union[TextItem, CallItem, OutputItem, OpaqueItem]


def text(value: str, native: Any = None) -> TextItem:
    return _with_native({'kind': TEXT, 'text': value}, native)


def refusal(value: str, native: Any = None) -> TextItem:
    return _with_native({'kind': REFUSAL, 'text': value}, native)


def call(call_id: str, name: str, arguments: Any, native: Any = None) -> CallItem:
    return _with_native({'kind': CALL, 'call_id': call_id, 'name': name, 'arguments': arguments}, native)


def output(call_id: str, value: str, is_error: bool = False, name: str = '') -> OutputItem:
    item: OutputItem = {'kind': OUTPUT, 'call_id': call_id, 'output': value, 'is_error': bool(is_error)}
    if name:
        item['name'] = name
    return item


def reasoning(native: Any) -> OpaqueItem:
    return {'kind': REASONING, 'native': native}


def hosted(native: Any) -> OpaqueItem:
    return {'kind': HOSTED, 'native': native}


def _with_native(item: Any, native: Any) -> Any:
    if native is not None:
        item['native'] = native
    return item


def canonical(items: Iterable, assistant: str) -> list[Item]:
    """A turn's items in canonical form, ending with its final text unless calls are pending.

    Items without a ``kind`` are natives of a turn stored before items existed
    (Claude thinking blocks; a Responses output list): they become reasoning,
    and a Responses assistant message becomes the text it said.
    """
    out: list[Item] = []
    for item in items:
        if isinstance(item, dict) and item.get('kind') in KINDS:
            out.append(item)
        elif isinstance(item, dict) and item.get('type') == 'message' and item.get('role', 'assistant') == 'assistant':
            out.append(text(assistant, native=item))
        else:
            out.append(reasoning(item))
    if not out or (out[-1]['kind'] not in (TEXT, REFUSAL) and not pending_calls(out)):
        out.append(text(assistant))
    return out


def is_plain(steps: list[Item]) -> bool:
    """A turn that is one text answer and nothing else (no calls, reasoning or natives)."""
    return len(steps) == 1 and steps[0]['kind'] == TEXT and 'native' not in steps[0]


def plain(items: Iterable[Item]) -> list[Item]:
    """The items as a provider other than their maker may see them: no opaque kinds, no natives."""
    return [{k: v for k, v in item.items() if k != 'native'} for item in items if item['kind'] not in OPAQUE]


def calls(items: Iterable[Item]) -> list[CallItem]:
    return [item for item in items if item['kind'] == CALL]


def pending_calls(items: Iterable[Item]) -> list[CallItem]:
    """Calls that have no output yet, in order."""
    items = list(items)
    answered = {item['call_id'] for item in items if item['kind'] == OUTPUT}
    return [item for item in calls(items) if item['call_id'] not in answered]


def final_text(items: Iterable[Item]) -> str:
    """The text said after the last call (the answer), or '' when the turn ends in calls."""
    said: list[str] = []
    for item in items:
        if item['kind'] in (CALL, OUTPUT):
            said = []
        elif item['kind'] in (TEXT, REFUSAL):
            said.append(item['text'])
    return ''.join(said)


def tool_calls(items: Iterable[Item]) -> list[dict]:
    """``reply['tool_calls']`` / history's form: each call joined with its output by call id."""
    items = list(items)
    outputs = {item['call_id']: item for item in items if item['kind'] == OUTPUT}
    joined = []
    for item in calls(items):
        entry = {'call_id': item['call_id'], 'name': item['name'], 'arguments': item['arguments']}
        if item['call_id'] in outputs:
            entry['output'] = outputs[item['call_id']]['output']
            entry['is_error'] = outputs[item['call_id']]['is_error']
        joined.append(entry)
    return joined


def rounds(items: Iterable[Item]) -> list[tuple[list[Item], list[OutputItem]]]:
    """Split a turn's items into (assistant items, outputs that answer them) pairs, in order."""
    out: list[tuple[list[dict], list[dict]]] = []
    said: list[dict] = []
    answers: list[dict] = []
    for item in items:
        if item['kind'] == OUTPUT:
            answers.append(item)
            continue
        if answers:
            out.append((said, answers))
            said, answers = [], []
        said.append(item)
    if said or answers:
        out.append((said, answers))
    return out
