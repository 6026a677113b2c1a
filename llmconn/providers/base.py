"""What every provider module implements: a pure mapping, no I/O.

A provider turns a :class:`~llmconn.types.Request` into a URL, headers and a
JSON body, and turns the provider's JSON (or its server-sent events) back
into a :class:`~llmconn.types.Reply` (or :class:`~llmconn.types.Event`
objects). The transport does the HTTP; the connection does history and
locking. Keeping the mapping pure means most tests need no network.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Iterable, Iterator

from llmconn.errors import InvalidInput, LLMError
from llmconn.text import Joiner, clean, clean_value
from llmconn.types import Event, Reply, Request, Turn

if TYPE_CHECKING:
    from llmconn.config import ConnectionConfig

# Capability names; a connection asked for one its provider lacks fails loudly.
STREAM = 'stream'
SYSTEM = 'system'
THINKING = 'thinking'
REASONING_REPLAY = 'reasoning_replay'
STATEFUL = 'stateful'

# The event name the transport gives a stream request's answer that came as one plain JSON body
# (a server that ignored "stream"); no real SSE event can be named this, it contains a space.
JSON_BODY = 'json body'

# OpenAI's end-of-stream marker; some servers imitating other providers send it too.
DONE_MARKER = '[DONE]'

# What an empty reply is replayed as. Claude and Gemini refuse an empty text block ("text content
# blocks must be non-empty", "empty text parameter"), and Claude a turn ending in a thinking block,
# so one refusal or exhausted max_tokens would otherwise break the chat for good.
EMPTY_REPLY = '(no reply)'


class SSE(tuple):
    """One server-sent event as ``(event, data)``; ``event`` is '' when the stream names none."""

    __slots__ = ()

    @property
    def event(self) -> str:
        return self[0]

    @property
    def data(self) -> str:
        return self[1]


class Provider:
    """Base of the provider mappings; one subclass per wire format."""

    name: ClassVar[str] = ''
    default_address: ClassVar[str] = ''
    capabilities: ClassVar[frozenset[str]] = frozenset()
    # Body keys the mapping itself sets from the configuration and the chat; params may not.
    reserved_params: ClassVar[frozenset[str]] = frozenset()
    # True when parse_response takes the final HTTPAnswer (status, headers, text, errors included)
    # instead of the parsed JSON of a successful answer; http_method is then the method to send.
    raw_answers: ClassVar[bool] = False
    http_method: str = 'POST'

    def __init__(self, conf: 'ConnectionConfig') -> None:
        self.conf = conf

    @classmethod
    def check_config(cls, conf: 'ConnectionConfig') -> None:
        """Refuse, at load, settings this provider cannot honour (raise ValueError)."""
        if conf.thinking is not None and THINKING not in cls.capabilities:
            raise ValueError(f'field "thinking": provider {cls.name} does not support thinking; '
                             f'remove the key or use a provider that does (claude)')
        if conf.state != 'local' and STATEFUL not in cls.capabilities:
            raise ValueError(f'field "state": provider {cls.name} is stateless, only "local" is valid')
        check_reserved(cls.reserved_params, conf.params, ValueError)

    @classmethod
    def read_files(cls, data: dict, base_dir: Path) -> dict:
        """A connection's raw settings with the files they name read in, relative to ``base_dir``."""
        return data

    @property
    def tag(self) -> str:
        """Which provider, model and mode produced a turn's opaque items."""
        return f'{self.name}/{self.conf.model}/{self.mode}'

    @property
    def mode(self) -> str:
        return ''

    def replays_items(self, turn: Turn) -> bool:
        """Opaque items go back only to the exact provider, model and mode that made them."""
        return bool(turn.items) and turn.tag == self.tag

    def url(self, stream: bool = False) -> str:
        raise NotImplementedError

    def ping_url(self) -> str:
        """A cheap GET that proves the provider answers and accepts our credentials ('' when there is none)."""
        raise NotImplementedError

    def headers(self) -> dict[str, str]:
        raise NotImplementedError

    def build_request(self, request: Request) -> dict[str, Any]:
        raise NotImplementedError

    def parse_response(self, body: Any) -> Reply:
        raise NotImplementedError

    def parse_stream(self, events: Iterable[SSE]) -> Iterator[Event]:
        """Yield ``thinking`` / ``text`` deltas, then one ``done`` whose ``reply`` is set.

        A stream that ends without its terminal event, or that carries an
        error event, raises :class:`LLMError`.
        """
        raise NotImplementedError

    def error(self, message: str, body: Any = None, status: int | None = None) -> LLMError:
        return LLMError(message, status=status, provider_body=body, connection=self.conf.name)

    def body_params(self, request: Request) -> dict[str, Any]:
        """Connection ``params`` overlaid by per-call params: merged into the body last."""
        merged = dict(self.conf.params)
        if request.params:
            check_reserved(self.reserved_params, request.params, InvalidInput)
            merged.update(request.params)
        return merged

    @staticmethod
    def done(reply: Reply) -> Event:
        """The final event; its text is valid Unicode whatever the provider sent (see :mod:`llmconn.text`)."""
        reply = dataclasses.replace(reply, text=clean(reply.text), thinking=clean(reply.thinking),
                                    items=clean_value(reply.items), raw=clean_value(reply.raw),
                                    meta=clean_value(reply.meta))
        return Event('done', result=reply.as_result(), reply=reply)

    # Whether a JSON answer to a stream request is a list of stream chunks (Gemini without
    # alt=sse) rather than one whole reply.
    json_answer_is_chunks: ClassVar[bool] = False

    def read_stream(self, events: Iterable[SSE]) -> Iterator[Event]:
        """The events of a stream request's answer: :meth:`parse_stream`, unless the server
        answered with plain JSON (it ignored ``stream``), which is then one whole reply.

        Deltas leave here as valid Unicode: a surrogate pair split between two events is joined.
        """
        joiners = {'text': Joiner(), 'thinking': Joiner()}
        for event in self._read_stream(events):
            joiner = joiners.get(event.type)
            if joiner is not None:
                text = joiner.feed(event.text)
                if text:
                    yield dataclasses.replace(event, text=text)
                continue
            if event.type == 'done':
                for kind, joiner in joiners.items():
                    rest = joiner.flush()
                    if rest:
                        yield Event(kind, text=rest)
            yield event

    def _read_stream(self, events: Iterable[SSE]) -> Iterator[Event]:
        events = iter(events)
        first = next(events, None)
        if first is not None and first.event == JSON_BODY and not self.json_answer_is_chunks:
            yield from self.unstreamed(json_event(self, first))
            return
        yield from self.parse_stream(itertools.chain(() if first is None else (first,), events))

    def unstreamed(self, body: Any) -> Iterator[Event]:
        """The events of a whole answer that came back unstreamed (a :data:`JSON_BODY` event)."""
        reply = self.parse_response(body)
        if reply.thinking:
            yield Event('thinking', text=reply.thinking)
        if reply.text:
            yield Event('text', text=reply.text)
        yield self.done(reply)


def said(turn: Turn) -> str:
    """The assistant's text of a turn as it is replayed: never empty (see :data:`EMPTY_REPLY`)."""
    return turn.assistant if turn.assistant.strip() else EMPTY_REPLY


def check_reserved(reserved: frozenset[str], keys: Iterable[str], error: type[Exception]) -> None:
    """Refuse params that would overwrite what the mapping itself must set."""
    clash = sorted(reserved & set(keys))
    if clash:
        raise error(f'params may not set {", ".join(clash)}: llmconn sets it from the configuration '
                    f'and the chat; remove it from params')


def json_event(provider: Provider, sse: SSE) -> dict:
    """The JSON object a stream event carries, or an LLMError saying the stream is not what we expect."""
    try:
        data = json.loads(sse.data)
    except ValueError:
        raise provider.error(f'the provider sent a stream event that is not JSON; check that "address" '
                             f'points at the {provider.name} API', sse.data) from None
    if not isinstance(data, dict):
        raise provider.error('the provider sent a stream event that is not a JSON object', data)
    return data


def is_done_marker(sse: SSE) -> bool:
    """``data: [DONE]``: OpenAI's end of stream, which compatible servers also append to other formats."""
    return sse.data.strip() == DONE_MARKER
