"""What every provider module implements: a pure mapping, no I/O.

A provider turns a :class:`~llmconn.types.Request` into a URL, headers and a
JSON body, and turns the provider's JSON (or its server-sent events) back
into a :class:`~llmconn.types.Reply` (or :class:`~llmconn.types.Event`
objects). The transport does the HTTP; the connection does history and
locking. Keeping the mapping pure means most tests need no network.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Iterable, Iterator

from llmconn import items as mod_items, jsontext
from llmconn.errors import InvalidInput, LLMError
from llmconn.sse import SSE, EventStream, JSONBody
from llmconn.text import Joiner, clean, clean_value, has_surrogate
from llmconn.types import Event, Reply, Request, Turn

if TYPE_CHECKING:
    from llmconn.config import ConnectionConfig

# Capability names; a connection asked for one its provider lacks fails loudly.
STREAM = 'stream'
SYSTEM = 'system'
THINKING = 'thinking'
REASONING_REPLAY = 'reasoning_replay'
STATEFUL = 'stateful'
TOOLS = 'tools'
STRUCTURED = 'structured'       # schema= answered natively (llmconn.structured)
CUSTOM_TOOLS = 'custom_tools'       # tools with free-form input (``type: custom``), besides JSON functions

# OpenAI's end-of-stream marker; some servers imitating other providers send it too.
DONE_MARKER = '[DONE]'

# What an empty reply is replayed as. Claude and Gemini refuse an empty text block ("text content
# blocks must be non-empty", "empty text parameter"), and Claude a turn ending in a thinking block,
# so one refusal or exhausted max_tokens would otherwise break the chat for good.
EMPTY_REPLY = '(no reply)'


class Provider:
    """Base of the provider mappings; one subclass per wire format."""

    name: ClassVar[str] = ''
    default_address: ClassVar[str] = ''
    capabilities: ClassVar[frozenset[str]] = frozenset()
    # The attachments (llmconn.attachments) the API takes: from their bytes (DATA) or a URL, by media type.
    accepts: ClassVar[dict[str, frozenset[str]]] = {}
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

    @functools.cached_property
    def tag(self) -> str:
        """Which provider, model and mode produced a turn's opaque items (fixed by the frozen config)."""
        return f'{self.name}/{self.conf.model}/{self.mode}'

    @property
    def mode(self) -> str:
        return ''

    def replays_items(self, turn: Turn) -> bool:
        """Opaque items go back only to the exact provider, model and mode that made them."""
        return bool(turn.items) and turn.tag == self.tag

    def steps(self, turn: Turn) -> list[dict]:
        """A stored turn's items as this provider may see them: natives only where they were made."""
        if not turn.items:          # a plain text turn, the common case: no canonical form to build
            return [{'kind': mod_items.TEXT, 'text': turn.assistant}]
        steps = turn.steps()
        return steps if turn.tag == self.tag else mod_items.plain(steps)

    def current(self, request: Request) -> list[dict]:
        """The turn in progress: its earlier rounds (made by this provider, natives kept)."""
        return list(request.items)

    def chain(self, window: list[Turn]) -> 'Chain':
        """How each call of a turn is built from the window; stateful providers override it."""
        return Chain(window)

    # -- what an answer means, for callers that report it (the gateway): per provider kind

    # The provider's stop reasons that mean "cut short", each as the reason a Response gives
    # (``incomplete_details.reason``); :meth:`stop_reason` finds the provider's own in its answer.
    cut_short: ClassVar[dict[str, str]] = {}

    def stop_reason(self, raw: dict) -> Any:
        """Why the model stopped, in the provider's own words (None when the answer does not say)."""
        return None

    def finish(self, raw: Any) -> tuple[str, str]:
        """``("completed", "")``, or ``("incomplete", reason)`` for an answer that was cut short."""
        reason = self.cut_short.get(self.stop_reason(raw)) if isinstance(raw, dict) else None
        return ('incomplete', reason) if reason else ('completed', '')

    @property
    def keeps_state(self) -> bool:
        """True when the provider itself keeps each answer and continues from its id (no replay needed)."""
        return False

    def lacks_replay(self, steps: list[dict]) -> str:
        """What continuing the turn in progress ``steps`` (as this provider would see them) needs of the
        provider's own items that they do not carry, so the provider would refuse the call ('' if nothing)."""
        return ''

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

    def parse_stream(self, events: Iterable[SSE]) -> Iterator[Event | Reply]:
        """Yield ``thinking`` / ``text`` deltas, then the :class:`Reply`, last.

        A stream that ends without its terminal event, or that carries an
        error event, raises :class:`LLMError`.
        """
        raise NotImplementedError

    def error(self, message: str, body: Any = None, status: int | None = None, quoted: str = '') -> LLMError:
        """An :class:`LLMError` of this connection; ``quoted``: the provider's words ``message`` quotes."""
        return LLMError(message, status=status, provider_body=body, connection=self.conf.name, quoted=quoted)

    def body_params(self, request: Request) -> dict[str, Any]:
        """Connection ``params`` overlaid by per-call params: merged into the body last."""
        merged = dict(self.conf.params)
        if request.params:
            check_reserved(self.reserved_params, request.params, InvalidInput)
            merged.update(request.params)
        return merged

    @staticmethod
    def done(reply: Reply) -> Reply:
        """The whole reply, as a parse ends with it; its text is valid Unicode whatever the provider
        sent (see :mod:`llmconn.text`)."""
        if not _has_surrogate(reply):
            return reply        # the common case, found at C speed: nothing to walk and copy
        return dataclasses.replace(reply, text=clean(reply.text), thinking=clean(reply.thinking),
                                   items=clean_value(reply.items), raw=clean_value(reply.raw),
                                   steps=clean_value(reply.steps), meta=clean_value(reply.meta))

    # Whether a JSON answer to a stream request is a list of stream chunks (Gemini without
    # alt=sse) rather than one whole reply.
    json_answer_is_chunks: ClassVar[bool] = False

    def read_stream(self, answer: JSONBody | EventStream) -> Iterator[Event | Reply]:
        """The events of a stream request's answer: :meth:`parse_stream`, unless the server
        answered with plain JSON (it ignored ``stream``), which is then one whole reply.

        Deltas leave here as valid Unicode: a surrogate pair split between two events is joined.
        """
        joiners = {'text': Joiner(), 'thinking': Joiner()}
        for event in self._read_stream(answer):
            joiner = joiners.get(getattr(event, 'type', None))
            if joiner is not None:
                text = joiner.feed(event.text)
                if text:        # most deltas come through whole: the event itself (it is frozen) goes on
                    yield event if text == event.text else dataclasses.replace(event, text=text)
                continue
            if isinstance(event, Reply):
                for kind, joiner in joiners.items():
                    rest = joiner.flush()
                    if rest:
                        yield Event(kind, text=rest)
            yield event

    def _read_stream(self, answer: JSONBody | EventStream) -> Iterator[Event | Reply]:
        if isinstance(answer, EventStream):
            yield from self.parse_stream(answer.events)
        elif self.json_answer_is_chunks:
            chunks = answer.body if isinstance(answer.body, list) else [answer.body]
            yield from self.parse_stream(SSE(('', json.dumps(c, ensure_ascii=False))) for c in chunks)
        else:
            yield from self.unstreamed(answer.body)

    def unstreamed(self, body: Any) -> Iterator[Event | Reply]:
        """The events of a whole answer that came back unstreamed."""
        reply = self.parse_response(body)
        if reply.thinking:
            yield Event('thinking', text=reply.thinking)
        if reply.text:
            yield Event('text', text=reply.text)
        yield self.done(reply)


class Chain:
    """Builds each provider call of one turn; this one, for stateless APIs, replays the window.

    ``request`` makes the call after ``last`` (None for the first) with the
    turn's items so far; ``recover`` may answer a failed call with another
    request to try instead (None: the error stands); ``state`` is what the
    provider keeps with the saved turn.
    """

    def __init__(self, window: list[Turn]) -> None:
        self.window = tuple(window)

    def request(self, base: Request, items: list[dict], last: Reply | None) -> Request:
        if not items and not self.window:
            return base         # a call without history (invoke, the gateway's first turn): as built
        return replace(base, history=self.window, items=tuple(items))

    def recover(self, error: LLMError, request: Request) -> Request | None:
        """Ids a template endpoint's replies kept (``Turn.meta``) that it forgot: the window goes
        back without them, and without the natives that may refer to them."""
        kept = _kept_ids(self.window)
        if not kept or not any(forgot_previous(error, kept_id) for kept_id in kept):
            return None
        self.window = tuple(replace(turn, items=(), meta={}) for turn in self.window)
        return replace(request, history=self.window)

    def state(self, reply: Reply) -> dict:
        return {}


def forgot_previous(error: LLMError, previous_id: str = '') -> bool:
    """The provider no longer knows the response we continue from (expired, deleted, restarted).

    OpenAI says so with ``code: previous_response_not_found``; gateways rewrap
    it (LiteLLM: HTTP 400, ``"code": "400"``, ``"param": null``, the original
    message, sometimes the original JSON quoted inside it; LM Studio: "history
    node with id ... not found"). So the whole error is read as text: the code
    anywhere in it, or "not found" together with "previous response" or the id
    we sent. Getting it wrong the other way costs more: a chat that resends a
    dead id fails for good, while a needless re-seed only resends local history.
    """
    body = error.provider_body
    text = ' '.join((str(error), body if isinstance(body, str) else _json_text(body)))
    lower = text.lower()
    if 'previous_response_not_found' in lower:
        return True
    if 'not found' not in lower:
        return False
    return ('previous response' in lower or 'previous_response_id' in lower
            or bool(previous_id) and previous_id in text)


def _json_text(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


def _kept_ids(window: tuple) -> list[str]:
    """The ids the window's replies kept for the provider (``['']`` when they kept only other values)."""
    kept = [value for turn in window for value in turn.meta.values()]
    return [value for value in kept if isinstance(value, str) and value] or ([''] if kept else [])


# What the surrogate check serializes an answer with: whatever it holds becomes text.
_dump_any = json.JSONEncoder(ensure_ascii=False, default=str).encode


def _has_surrogate(reply: Reply) -> bool:
    if has_surrogate(reply.text) or has_surrogate(reply.thinking):
        return True
    try:
        return has_surrogate(_dump_any([reply.raw, reply.items, reply.steps, reply.meta]))
    except (TypeError, ValueError, RecursionError):
        return True         # cannot tell cheaply: walk it


def attached(turn: Turn) -> tuple:
    """A stored turn's attachments that can go back: a URL, or bytes the window brought (one whose
    bytes were lost apart from the turn is left out rather than sent empty)."""
    return tuple(a for a in turn.attachments if a.present) if turn.attachments else ()


def said(turn: Turn) -> str:
    """The assistant's text of a turn as it is replayed: never empty (see :data:`EMPTY_REPLY`)."""
    return turn.assistant if turn.assistant.strip() else EMPTY_REPLY


def plain_reply(steps: list[dict]) -> str | None:
    """The replayed answer of a turn that is one text and nothing else, or None for any other turn."""
    return nonempty(steps[0]['text']) if mod_items.is_plain(steps) else None


def nonempty(text: str) -> str:
    """A final text as it is replayed: never empty (see :data:`EMPTY_REPLY`)."""
    return text if text.strip() else EMPTY_REPLY


def arguments_json(arguments: Any) -> str:
    """A call's arguments as the JSON string OpenAI's formats carry."""
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def parse_arguments(raw: Any) -> Any:
    """A call's arguments from a JSON string; what is not JSON is kept as the string (validation
    then reports it to the model)."""
    if not isinstance(raw, str):
        return raw if raw is not None else {}
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def check_reserved(reserved: frozenset[str], keys: Iterable[str], error: type[Exception]) -> None:
    """Refuse params that would overwrite what the mapping itself must set."""
    clash = sorted(reserved & set(keys))
    if clash:
        raise error(f'params may not set {", ".join(clash)}: llmconn sets it from the configuration '
                    f'and the chat; remove it from params')


def json_event(provider: Provider, sse: SSE) -> dict:
    """The JSON object a stream event carries, or an LLMError saying the stream is not what we expect."""
    try:
        data = jsontext.loads(sse.data)
    except ValueError:
        raise provider.error(f'the provider sent a stream event that is not JSON; check that "address" '
                             f'points at the {provider.name} API', sse.data) from None
    if not isinstance(data, dict):
        raise provider.error('the provider sent a stream event that is not a JSON object', data)
    return data


def is_done_marker(sse: SSE) -> bool:
    """``data: [DONE]``: OpenAI's end of stream, which compatible servers also append to other formats."""
    return sse.data.strip() == DONE_MARKER


def tokens(usage: Any, *path: str) -> int:
    """The count at ``path`` in a provider's usage object; 0 where it is absent, null or not a count
    (servers that imitate a format often leave its details out)."""
    value = usage
    for key in path:
        if not isinstance(value, dict):
            return 0
        value = value.get(key)
    # JSON decodes counts as int, never a subclass: type() also leaves bool (True is not a count) out.
    return value if type(value) is int and value > 0 else 0
