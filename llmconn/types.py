"""The plain values that flow between connections, providers and the chat store.

A :class:`Turn` is what the store keeps: the user's message and the ordered
canonical items (:mod:`llmconn.items`) of everything that happened until the
final answer - tool calls and outputs, reasoning, hosted-tool items - tagged
with the provider, model and mode whose natives they carry. ``state`` is the
provider's own bookkeeping for stateful APIs, opaque to everything else. A
provider receives a :class:`Request`, answers with :class:`Event` deltas while
streaming and one :class:`Reply` at the end. A caller of a connection's one
entry, :meth:`llmconn.connection.Connection.run`, describes its call as a
:class:`CallSpec`, which may carry a record the pipeline keeps beside the
chat store (:mod:`llmconn.call_record`).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from llmconn import items as mod_items

if TYPE_CHECKING:
    from llmconn.call_record import CallRecord


@dataclass(frozen=True)
class Turn:
    """One complete exchange (or one waiting for manual tool outputs), saved whole or not at all."""

    user: str
    assistant: str
    # Canonical items after the user message; natives in them go back only to ``tag``.
    # Turns stored before items existed hold bare natives here; :meth:`steps` reads both.
    items: tuple = ()
    tag: str = ''
    state: Mapping = field(default_factory=dict)    # a stateful provider's bookkeeping
    ts: float = 0.0
    # Fields the provider attached to the reply to be handed back with this turn (template
    # endpoints: a thread or session id); JSON values, windowed with the turn.
    meta: Mapping = field(default_factory=dict)
    # The conversation before the window, summarized when this turn was made (llmconn.compaction):
    # {"text": str, "through": the ts of the last turn it covers}; empty on most turns.
    summary: Mapping = field(default_factory=dict)
    # What the user attached (llmconn.attachments.Attachment); stored as their meta, the bytes once
    # per chat by hash (llmconn.store.lock), and given back with the window.
    attachments: tuple = ()

    def steps(self) -> list[dict]:
        """The canonical items, ending with the final text unless calls are pending."""
        return mod_items.canonical(self.items, self.assistant)

    @property
    def pending(self) -> list[dict]:
        """Calls waiting for outputs given by the caller (manual tools)."""
        return mod_items.pending_calls(self.steps()) if self.items else []

    def to_dict(self) -> dict:
        d: dict[str, Any] = {'u': self.user, 'a': self.assistant, 'ts': self.ts}
        if self.items:
            d['i'] = list(self.items)
            d['t'] = self.tag
        if self.state:
            d['p'] = dict(self.state)
        if self.meta:
            d['m'] = dict(self.meta)
        if self.summary:
            d['s'] = dict(self.summary)
        if self.attachments:
            d['f'] = [a.meta() for a in self.attachments]
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> 'Turn':
        state = d.get('p') or {}
        if d.get('r'):      # stored before provider state had its own key (Responses chains)
            state = {'response_id': d['r'], 'chain': d.get('c', 0)}
        attached = ()
        if d.get('f'):
            from llmconn.attachments import Attachment      # only turns with attachments need it
            attached = tuple(Attachment.stored(meta) for meta in d['f'])
        return cls(user=d['u'], assistant=d['a'], items=tuple(d.get('i', ())), tag=d.get('t', ''),
                   state=state, ts=d.get('ts', 0.0), meta=d.get('m') or {}, summary=d.get('s') or {},
                   attachments=attached)


@dataclass(frozen=True)
class Request:
    """What a provider turns into a request body."""

    text: str
    system: str = ''
    history: tuple = ()                 # Turns, oldest first, already cut to the window
    params: Mapping = field(default_factory=dict)
    stream: bool = False
    items: tuple = ()                   # this turn's items so far (earlier rounds of a tool loop)
    tools: tuple = ()                   # llmconn.tools.Tool definitions offered to the model
    hosted: tuple = ()                  # provider-native hosted tool definitions
    chain: Mapping = field(default_factory=dict)    # a stateful provider's per-call state
    tag: str = ''                       # the tag of ``items``' natives (always this provider's)
    stateless: bool = False             # the provider must keep nothing of this call (a stateful API too)
    cache_key: str = ''                 # the chat's prompt cache key (llmconn.providers.caching), '' for none
    # The compaction summary ``system`` ends with (llmconn.compaction): Claude sends it as a block of
    # its own, after the skill's, so the skill stays cached when the summary changes.
    summary: str = ''
    schema: Any = None                  # llmconn.structured.OutputSchema the answer must follow, or None
    attachments: tuple = ()             # llmconn.attachments.Attachment objects sent with ``text``


@dataclass(frozen=True)
class CallSpec:
    """One call as its caller asks for it; :meth:`~llmconn.connection.Connection.run` checks and runs it.

    ``invoke``, ``chat`` and ``stream`` fill in the first fields. A caller that
    keeps the conversation itself (the gateway) gives the ``system`` prompt,
    the ``history`` turns and the turn in progress (``items``, whose natives are
    ``tag``'s) instead of a skill and a chat id, and may give a stateful
    provider's ``chain`` (``previous_response_id``, ``continuation``) itself.
    """

    text: str = ''
    chat_id: str = ''
    skill: str = ''
    params: Mapping = field(default_factory=dict)
    stream: bool = False
    tools: Any = None                   # callables / Tools / hosted dicts, as ``tools=`` takes them
    outputs: Mapping | None = None      # ``tool_outputs=`` answering a pending turn
    system: str = ''                    # a system prompt of the caller's own (no skill then)
    history: tuple = ()                 # the caller's own window of Turns (no chat id then)
    items: tuple = ()                   # the turn in progress, given by the caller
    tag: str = ''                       # whose natives ``items`` hold
    hosted: tuple = ()                  # hosted tool definitions the caller already checked
    chain: Mapping = field(default_factory=dict)    # the provider-side chain, when the caller keeps it
    stateless: bool = False             # the provider must keep nothing (the gateway's ``store: false``)
    run_tools: bool = True              # False: every call the model makes goes back to the caller
    key_id: str = ''                    # the gateway key the usage ledger counts the call under
    schema: Any = None                  # ``schema=``: a pydantic model class or a JSON Schema dict
    attachments: Any = None             # ``attachments=``: llmconn.Attachment objects
    # The connections the call may fail over to (llmconn.failover): None, the connection's own plan;
    # a tuple, exactly those (the gateway's, cut to the fallbacks that can honour its request).
    fallbacks: tuple | None = None
    # Called with the fallback Connection that takes the call over, before any of its events (the
    # gateway names it in its answer); never called when the connection itself answers.
    on_failover: Any = None
    # The caller's own record of the call (the gateway's Responses records), told when it starts and
    # how it ends at the points a chat is begun and saved (llmconn.call_record).
    record: 'CallRecord | None' = None


# The counts a call's usage holds (SPEC §17), 0 when the provider reports none. ``input_tokens``
# is the whole input, cached or not; the cache counts are the parts of it read from and written to
# the provider's prompt cache; ``reasoning_tokens`` the part of ``output_tokens`` spent thinking.
USAGE_KEYS = ('input_tokens', 'output_tokens', 'cache_read_tokens', 'cache_write_tokens', 'reasoning_tokens')
_usage_of = operator.attrgetter(*USAGE_KEYS)      # a Reply's counts, in USAGE_KEYS order


def add_usage(total: dict, usage: dict) -> dict:
    """``total`` with ``usage`` added to it, key by key (a tool loop's rounds, a stream's rounds)."""
    for key in USAGE_KEYS:
        total[key] = total.get(key, 0) + (usage.get(key) or 0)
    return total


@dataclass(frozen=True)
class Reply:
    """A provider's complete answer, normalized."""

    text: str
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    raw: Any = None
    thinking: str = ''
    items: tuple = ()                   # opaque natives (thinking, reasoning) the answer carried
    response_id: str = ''
    model: str = ''
    meta: Mapping = field(default_factory=dict)     # stored with the turn, see Turn.meta
    steps: tuple = ()                   # the answer as canonical items, in order

    @property
    def calls(self) -> list[dict]:
        return mod_items.calls(self.steps)

    @property
    def usage(self) -> dict:
        """This answer's counts, every key of :data:`USAGE_KEYS`."""
        return dict(zip(USAGE_KEYS, _usage_of(self)))

    def as_result(self) -> dict:
        """The plain dict ``invoke``, ``chat`` and the ``done`` event return."""
        result = {
            'text': self.text,
            'usage': self.usage,
            'raw': self.raw,
        }
        if self.model:
            result['model'] = self.model
        if self.response_id:
            result['response_id'] = self.response_id
        if self.thinking:
            result['thinking'] = self.thinking
        return result


@dataclass(frozen=True)
class HTTPAnswer:
    """A provider's final HTTP answer as it came, for providers that read status and text themselves."""

    status: int
    headers: Mapping        # names lower-cased
    text: str


@dataclass(frozen=True)
class Event:
    """One streamed event.

    ``thinking`` and ``text`` carry a delta in ``.text``; ``tool_call`` and
    ``tool_result`` a call in ``.call`` (``call_id``, ``name``, ``arguments``,
    and on ``tool_result`` its ``output`` and ``is_error``); ``done`` the result.
    """

    type: str
    text: str = ''
    result: dict | None = None
    call: dict | None = None
    reply: 'Reply | None' = None        # on ``done``: the last provider answer, whole (the gateway reads it)

    def __repr__(self) -> str:
        if self.type == 'done':
            return 'Event(type=done)'
        if self.call is not None:
            return f'Event(type={self.type}, call={self.call.get("name")!r})'
        return f'Event(type={self.type}, text={self.text!r})'


def drain(events: Iterable[Event]) -> Event | None:
    """The ``done`` event of a call's events, once they are all read (a call counts until its events end)."""
    done = None
    for event in events:
        if event.type == 'done':
            done = event
    return done
