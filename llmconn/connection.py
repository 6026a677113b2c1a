"""One configured LLM connection: ``invoke``, ``chat``, ``stream``, ``ping`` and history.

All three call styles run one pipeline, :meth:`Connection._events`, which
yields normalized events; ``invoke`` and ``chat`` simply drain it. With a
chat id the pipeline is::

    begin  (1 Redis round trip: take the chat's lock, read the window)
    call   (the provider; the lock is renewed in the background meanwhile)
    save   (1 Redis round trip: append the turn, trim, expire, release)

Everything that can be checked is checked before ``begin``, so bad input
never costs a network call, and a store outage is found before any token
is spent. A turn is saved only after the provider's answer is complete,
and before ``done`` is handed out; a failure, a broken stream or a caller
that stops iterating early saves nothing and frees the lock at once.
"""

from __future__ import annotations

import json
import time as mod_time
from dataclasses import replace
from typing import Any, Iterator

from llmconn import observe
from llmconn.checks import MAX_CHAT_ID_CHARS, MAX_TEXT_CHARS, check_params, check_skill  # noqa: F401
from llmconn.checks import check_chat_id as _check_chat_id
from llmconn.checks import check_text as _check_text
from llmconn.config import ConnectionConfig
from llmconn.errors import InactiveConnection, InvalidInput, LLMError
from llmconn.lifetime import Counted, InFlight
from llmconn.providers import PROVIDERS
from llmconn.providers.base import STREAM, SYSTEM
from llmconn.skills import SkillCache
from llmconn.text import clean
from llmconn.transport import Transport
from llmconn.types import Event, Request, Turn
from llmconn.usage import NO_LEDGER

PING_TEXT = 'ping'              # what ping() asks a server that has no model list


class Connection:
    """A named provider connection with its HTTP pool and access to the chat store."""

    def __init__(self, conf: ConnectionConfig, store, skills: SkillCache, transport: Transport | None = None,
                 usage=None) -> None:
        self.conf = conf
        self.name = conf.name
        self.provider = PROVIDERS[conf.provider](conf)
        self.store = store
        self.skills = skills
        self.transport = transport or Transport(conf.name, pool_size=conf.pool_size, timeout=conf.timeout,
                                                max_retries=conf.max_retries, secret=conf.secret_value,
                                                address=conf.address, stream_timeout=conf.stream_timeout)
        self._headers = self.provider.headers()
        self.usage = usage or NO_LEDGER      # counts every call, see llmconn.usage
        self.calls = InFlight()         # running calls: a connection a reload replaced closes after the last
        self.closed = False

    def __repr__(self) -> str:
        return f'<Connection {self.name!r} provider={self.conf.provider} model={self.conf.model}>'

    # -- public API ------------------------------------------------------------------------------

    def invoke(self, text: str, skill: str = '', **params: Any) -> dict:
        """One-shot call: no history is read, written or locked."""
        return self._drain(self._events(text, '', skill, params, stream=False))

    def chat(self, text: str, chat_id: str = '', skill: str = '', **params: Any) -> dict:
        """A call that continues the conversation ``chat_id``; without one it is exactly ``invoke``."""
        return self._drain(self._events(text, chat_id, skill, params, stream=False))

    def stream(self, text: str, chat_id: str = '', skill: str = '', **params: Any) -> Iterator[Event]:
        """Like ``chat``, but yields ``thinking`` / ``text`` deltas and one final ``done``."""
        if STREAM not in self.provider.capabilities:
            raise InvalidInput(f'{self.name}: provider {self.conf.provider} does not support the capability '
                               f'"{STREAM}"; use chat() instead')
        return self._events(text, chat_id, skill, params, stream=True)

    def ping(self) -> bool:
        """True when the provider answers; raises LLMError otherwise.

        Asks for the model list, which costs no tokens; a server that has none
        (404 or 405: some compatible servers and gateways) is asked a one-word question.
        """
        self._check_active()
        with self.calls:
            return self._ping()

    def _ping(self) -> bool:
        url = self.provider.ping_url()
        try:
            if url:
                self.transport.get(url, self._headers)
                return True
        except LLMError as e:
            if e.status not in (404, 405):
                raise
        self._drain(self._call(Request(PING_TEXT)))
        return True

    def history(self, chat_id: str) -> list[dict]:
        """Every stored message of the chat, oldest first, as ``{"role", "content"}``."""
        _check_chat_id(chat_id, required=True)
        messages = []
        with self.calls:
            turns = self.store.history(self.name, chat_id)
        for turn in turns:
            # clean(): a turn stored before text was cleaned may hold a lone surrogate.
            messages.append({'role': 'user', 'content': clean(turn.user)})
            messages.append({'role': 'assistant', 'content': clean(turn.assistant)})
        return messages

    def delete_history(self, chat_id: str) -> None:
        _check_chat_id(chat_id, required=True)
        with self.calls:
            self.store.delete(self.name, chat_id)

    def close(self) -> None:
        self.closed = True
        self.transport.close()

    def retire(self, then=None) -> None:
        """Close once the calls running now have finished, then run ``then`` (see :mod:`llmconn.lifetime`)."""
        def close_then() -> None:
            self.close()
            if then is not None:
                then()
        self.calls.retire(close_then)

    # -- the pipeline ----------------------------------------------------------------------------

    def _events(self, text: str, chat_id: str, skill: str, params: dict, stream: bool) -> Iterator[Event]:
        """Check everything now (so bad input fails at the call), then return the lazy pipeline."""
        self._check_active()
        _check_text(text)
        _check_chat_id(chat_id, required=False)
        check_params(params, self.provider.reserved_params)
        tally = self.usage.call(self.name, self.conf.model)
        return Counted(observe.call(self.name, tally.track(self._pipeline(text, chat_id, self._system(skill), params,
                                                                          stream, tally))),
                       self.calls)

    def _pipeline(self, text: str, chat_id: str, system: str, params: dict, stream: bool,
                  tally) -> Iterator[Event]:
        if not chat_id:
            yield from self._call(Request(text, system, (), params, stream))
            return
        conf = self.conf
        # The lock is released on every way out; if that release fails while another error is
        # already on its way out, the store logs it rather than hide the first error.
        with self.store.begin(self.name, chat_id, window=conf.max_history_turns - 1,
                              lock_ttl=conf.lock_ttl, lock_wait=conf.lock_wait) as lock:
            request, chain = self._chat_request(lock.turns, text, system, params, stream)
            done = None
            for event, chain in self._call_reseeding(request, lock.turns, chain):
                if event.type == 'done':
                    done = event
                else:
                    yield event
            if done is None:
                raise LLMError(f'{self.name}: the provider\'s answer ended without a result', connection=self.name)
            reply = done.reply
            keep_id = conf.state == 'provider'
            lock.save(Turn(user=text, assistant=reply.text, items=reply.items,
                           tag=self.provider.tag if reply.items else '',
                           response_id=reply.response_id if keep_id else '', chain=chain if keep_id else 0,
                           ts=mod_time.time(), meta=reply.meta),
                      expiry=conf.chat_expiry, max_turns=conf.max_stored_turns,
                      counters=tally.save_entry(self.name, chat_id, done.result))
            tally.saved()
            yield done

    def _chat_request(self, window: list, text: str, system: str, params: dict, stream: bool):
        """The request for a chat call, and the provider-side chain length it makes (stateful mode)."""
        last = window[-1] if window else None
        if (self.conf.state == 'provider' and last is not None and last.response_id
                and last.chain + 1 <= self.conf.max_history_turns):
            return Request(text, system, (), params, stream, previous_response_id=last.response_id), last.chain + 1
        return Request(text, system, tuple(window), params, stream), len(window) + 1

    def _call_reseeding(self, request: Request, window: list, chain: int) -> Iterator[tuple[Event, int]]:
        """Call the provider, yielding each event with the provider-side chain length it makes.

        If the provider forgot the chain we continue, a new one starts from local history. The
        state may also be ids a template endpoint's reply kept (``Turn.meta``): dropped the same way.
        """
        events = self._call(request)
        state_ids = [request.previous_response_id] if request.previous_response_id else _kept_ids(request.history)
        if state_ids:
            try:
                first = next(events)
            except LLMError as e:
                if not any(_forgot_previous(e, state_id) for state_id in state_ids):
                    raise
                # The local window is the truth; the provider's copy of the chain is gone, and with it
                # the stored items our turns' reasoning refers to, so those turns go back as plain text.
                plain = tuple(replace(turn, items=(), meta={}) for turn in window)
                events = self._call(Request(request.text, request.system, plain, request.params, request.stream))
                chain = len(window) + 1
            else:
                yield first, chain
        for event in events:
            yield event, chain

    def _call(self, request: Request) -> Iterator[Event]:
        body = self.provider.build_request(request)
        if request.stream:
            yield from self.provider.read_stream(
                self.transport.post_stream(self.provider.url(stream=True), self._headers, body))
        elif self.provider.raw_answers:
            yield self.provider.done(self.provider.parse_response(
                self.transport.exchange(self.provider.http_method, self.provider.url(), self._headers, body)))
        else:
            yield self.provider.done(self.provider.parse_response(
                self.transport.post(self.provider.url(stream=False), self._headers, body)))

    # -- checks ----------------------------------------------------------------------------------

    def _check_active(self) -> None:
        if not self.conf.is_active:
            raise InactiveConnection(f'connection "{self.name}" is not active; set is_active: true in its '
                                     f'configuration to use it')

    def _system(self, skill: str) -> str:
        if not skill:
            return ''
        check_skill(skill)
        if SYSTEM not in self.provider.capabilities:
            raise InvalidInput(f'{self.name}: provider {self.conf.provider} does not support the capability '
                               f'"{SYSTEM}" that skills need')
        return self.skills.get(skill).instructions

    @staticmethod
    def _drain(events: Iterator[Event]) -> dict:
        result = None
        for event in events:
            if event.type == 'done':
                result = event.result
        return result


def _forgot_previous(error: LLMError, previous_id: str = '') -> bool:
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


def _kept_ids(history: tuple) -> list[str]:
    """The ids the window's replies kept for the provider (``['']`` when they kept only other values)."""
    kept = [value for turn in history for value in turn.meta.values()]
    return [value for value in kept if isinstance(value, str) and value] or ([''] if kept else [])


def _json_text(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)
    # An HTTP error nests it under "error"; a stream's error event carries it at the top.
    for detail in (body.get('error'), body):
        if not isinstance(detail, dict):
            continue
        if detail.get('code') == 'previous_response_not_found':
            return True
        # Some servers answer with a generic code but name the parameter.
        if detail.get('param') == 'previous_response_id' and 'not found' in str(detail.get('message', '')).lower():
            return True
    return False
