"""The plain values that flow between connections, providers and the chat store.

A :class:`Turn` is what the store keeps: one user message, the reply, and any
opaque provider items (Claude thinking blocks, Responses reasoning items)
tagged with the provider, model and mode that produced them. A provider
receives a :class:`Request`, answers with :class:`Event` objects while
streaming and one :class:`Reply` at the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class Turn:
    """One complete exchange, saved whole or not at all."""

    user: str
    assistant: str
    # Provider items replayed verbatim, but only to the provider/model/mode in ``tag``.
    items: tuple = ()
    tag: str = ''
    # Responses API, state=provider: the reply's id and the length of the
    # provider-side chain that ends with this turn.
    response_id: str = ''
    chain: int = 0
    ts: float = 0.0
    # Fields the provider attached to the reply to be handed back with this turn (template
    # endpoints: a thread or session id); JSON values, windowed with the turn.
    meta: Mapping = field(default_factory=dict)

    def to_dict(self) -> dict:
        d: dict[str, Any] = {'u': self.user, 'a': self.assistant, 'ts': self.ts}
        if self.items:
            d['i'] = list(self.items)
            d['t'] = self.tag
        if self.response_id:
            d['r'] = self.response_id
            d['c'] = self.chain
        if self.meta:
            d['m'] = dict(self.meta)
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> 'Turn':
        return cls(user=d['u'], assistant=d['a'], items=tuple(d.get('i', ())), tag=d.get('t', ''),
                   response_id=d.get('r', ''), chain=d.get('c', 0), ts=d.get('ts', 0.0),
                   meta=d.get('m') or {})


@dataclass(frozen=True)
class Request:
    """What a provider turns into a request body."""

    text: str
    system: str = ''
    history: tuple = ()                 # Turns, oldest first, already cut to the window
    params: Mapping = field(default_factory=dict)
    stream: bool = False
    previous_response_id: str = ''     # Responses API, state=provider


@dataclass(frozen=True)
class Reply:
    """A provider's complete answer, normalized."""

    text: str
    input_tokens: int = 0
    output_tokens: int = 0
    raw: Any = None
    thinking: str = ''
    items: tuple = ()                   # opaque items to store with the turn
    response_id: str = ''
    model: str = ''
    meta: Mapping = field(default_factory=dict)     # stored with the turn, see Turn.meta

    def as_result(self) -> dict:
        """The plain dict ``invoke``, ``chat`` and the ``done`` event return."""
        result = {
            'text': self.text,
            'usage': {'input_tokens': self.input_tokens, 'output_tokens': self.output_tokens},
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
    """One streamed event: ``thinking`` and ``text`` carry a delta, ``done`` the result."""

    type: str
    text: str = ''
    result: dict | None = None
    reply: Reply | None = None          # set on ``done`` for internal use

    def __repr__(self) -> str:
        if self.type == 'done':
            return 'Event(type=done)'
        return f'Event(type={self.type}, text={self.text!r})'
