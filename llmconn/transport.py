"""HTTP to the providers: one pooled ``requests.Session`` per connection, retries, SSE.

This is the one place where ``requests`` exceptions are translated into
:class:`~llmconn.errors.LLMError` and its subclasses; nothing above it sees
``requests.exceptions``.

Retry policy: 408, 409, 429, 5xx and 529 answers, and connections that could
not be opened, are retried at most ``max_retries`` times. The provider's
``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date) is honoured;
otherwise the wait is exponential with full jitter. A read timeout is not
retried (the provider may still be generating, and a retry would pay twice);
other 4xx answers are never retried. A stream is retried only before its
first byte.

Timeouts (SPEC §14): ``timeout`` bounds a non-streamed call's whole duration,
connect to last byte, retries and their waits included (a retry that cannot
fit in what is left is not made). For a stream it bounds the wait for the
answer's headers and first event, and for each next event (time the caller
spends between events does not count); ``stream_timeout`` bounds the whole
stream. Both are enforced by :mod:`llmconn.deadline`, which cuts the socket
off however slowly bytes trickle in, so a call can never hold its chat lock
past them.

Bodies are read by :mod:`llmconn.sse`. A stream request answered with one
plain JSON body (a server that ignores ``stream``, or Gemini's JSON array
when ``alt=sse`` is not honoured) comes back as a :class:`~llmconn.sse.JSONBody`,
an event stream as an :class:`~llmconn.sse.EventStream`.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time as mod_time
from typing import Any, Iterator

import requests

from llmconn import observe
from llmconn.answers import parse_retry_after, provider_message
from llmconn.deadline import Deadline, WatchedAdapter
from llmconn.errors import LLMAuthError, LLMError, LLMRateLimited, LLMTimeout
from llmconn.redact import scrub
from llmconn.sse import SSE, EventStream, JSONBody, decode_json, iter_sse, sniff
from llmconn.text import clean_value
from llmconn.types import HTTPAnswer

logger = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({408, 409, 429, 529}) | frozenset(range(500, 600))
BACKOFF_BASE = 0.5          # seconds before the first retry without a Retry-After
BACKOFF_CAP = 8.0           # never wait longer than this between attempts on our own account
RETRY_AFTER_CAP = 60.0      # a provider asking for more than this is treated as a failure to retry now
CONNECT_TIMEOUT_CAP = 10.0  # opening a TCP connection never needs the whole read timeout
ERROR_BODY_CHARS = 10000    # how much of a non-JSON error body is kept for the caller
DEFAULT_STREAM_TIMEOUT = 600.0  # the longest a whole stream may take, unless configured


class Transport:
    """Sends JSON to one provider connection, with its pool, timeout and retry budget."""

    def __init__(self, name: str, *, pool_size: int, timeout: float, max_retries: int,
                 secret: str = '', address: str = '', sleep=None, session: requests.Session | None = None,
                 stream_timeout: float = DEFAULT_STREAM_TIMEOUT) -> None:
        self.name = name
        self.timeout = (min(timeout, CONNECT_TIMEOUT_CAP), timeout)
        self.stream_timeout = stream_timeout
        self.max_retries = max_retries
        self._secret = secret
        self.sleep = sleep or mod_time.sleep
        self.session = session or requests.Session()
        adapter = WatchedAdapter(pool_connections=1, pool_maxsize=pool_size, max_retries=0)
        self.session.mount('http://', adapter)
        self.session.mount('https://', adapter)
        if address:
            read_environment_once(self.session, address)
        self._prepared: dict[tuple, tuple] = {}

    def __repr__(self) -> str:
        return f'<Transport {self.name!r}>'

    def get(self, url: str, headers: dict) -> Any:
        """A GET with the same retries and error translation; returns parsed JSON."""
        return self._whole('GET', url, headers, None)

    def post(self, url: str, headers: dict, body: dict) -> Any:
        """POST ``body`` and return the provider's parsed JSON answer."""
        return self._whole('POST', url, headers, body)

    def exchange(self, method: str, url: str, headers: dict, body: Any) -> HTTPAnswer:
        """Send ``body`` and return the final answer as it came, an error status included.

        Retries and the deadline are those of :meth:`post`; only the last answer
        of a failing status is handed back instead of raised, for a provider that
        reads statuses itself (template endpoints).
        """
        response = self._whole(method, url, headers, body, answer_errors=True)
        return HTTPAnswer(response.status_code, {k.lower(): v for k, v in response.headers.items()},
                          _text(response.content))

    def post_stream(self, url: str, headers: dict, body: dict) -> JSONBody | EventStream:
        """POST ``body``; the answer is read up to its first byte to tell an event stream from JSON.

        An event stream's events are read as they arrive, under the stream's deadlines.
        """
        deadline = Deadline.after(min(self.timeout[1], self.stream_timeout))
        end = mod_time.monotonic() + self.stream_timeout
        try:
            response = self._send('POST', url, headers, body, stream=True, deadline=deadline)
            try:
                first, chunks = sniff(response.iter_content(chunk_size=None))
                if first in (b'{', b'['):
                    answer = JSONBody(self._json_body(response, b''.join(chunks)))
                    self._raise_if_expired(deadline, stream=True)
                    response.close()
                    deadline.cancel()
                    return answer
            except (requests.RequestException, LLMError) as e:
                response.close()
                self._raise_if_expired(deadline, stream=True)
                if isinstance(e, LLMError):
                    raise
                raise self._broken(e) from None
            except BaseException:
                response.close()
                raise
        except BaseException:
            deadline.cancel()
            raise
        return EventStream(self._events(response, chunks, deadline, end))

    def _events(self, response, chunks, deadline: Deadline, end: float) -> Iterator[SSE]:
        try:
            try:
                for event in iter_sse(chunks):
                    deadline.move(end)           # the caller's time between events is not the provider's
                    yield event
                    deadline.move(min(end, mod_time.monotonic() + self.timeout[1]))
            except (requests.RequestException, LLMError) as e:
                self._raise_if_expired(deadline, stream=True)
                if isinstance(e, LLMError):
                    raise
                raise self._broken(e) from None
            finally:
                response.close()
            self._raise_if_expired(deadline, stream=True)
        finally:
            deadline.cancel()

    def _broken(self, e: Exception) -> LLMError:
        return self._error(f'the stream broke before it was complete ({type(e).__name__}); try again')

    def close(self) -> None:
        self.session.close()

    # -- internals -------------------------------------------------------------------------------

    def _whole(self, method: str, url: str, headers: dict, body: Any, answer_errors: bool = False) -> Any:
        """A non-streamed call, all of it (retries too) within ``timeout``: its JSON, or with
        ``answer_errors`` the response itself, read, whatever its status."""
        deadline = Deadline.after(self.timeout[1])
        try:
            response = self._send(method, url, headers, body, stream=True, deadline=deadline,
                                  answer_errors=answer_errors)
            try:
                response.content    # noqa: B018 - read the body while the deadline watches
            except requests.RequestException as e:
                self._raise_if_expired(deadline)
                raise self._error(f'the answer broke before it was complete ({type(e).__name__}); '
                                  f'try again') from None
            self._raise_if_expired(deadline)
            return response if answer_errors else self._json(response)
        finally:
            deadline.cancel()

    def _raise_if_expired(self, deadline: Deadline, stream: bool = False) -> None:
        if not deadline.fired:
            return
        if stream:
            what = (f'the stream stalled for more than "timeout" ({self.timeout[1]:g} s) or took longer '
                    f'than "stream_timeout" ({self.stream_timeout:g} s)')
        else:
            what = f'the provider did not answer completely within "timeout" ({self.timeout[1]:g} s)'
        raise LLMTimeout(self._redact(f'{self.name}: {what}; raise it or check the provider'),
                         connection=self.name) from None

    def _send(self, method: str, url: str, headers: dict, body: Any, stream: bool,
              deadline: Deadline, answer_errors: bool = False):
        data = None if body is None else _encode(body)
        for attempt in range(self.max_retries + 1):
            last = attempt == self.max_retries
            started = mod_time.perf_counter()
            try:
                with deadline.watching():
                    response = self.session.send(self._prepare(method, url, headers, data),
                                                 timeout=self._socket_timeout(deadline), stream=stream)
            except requests.RequestException as e:
                observe.provider_call(self.name, 'timeout' if deadline.fired or isinstance(e, requests.Timeout)
                                      else 'unreachable', started, attempt)
                self.sleep(self._unsent_wait(e, attempt, last, deadline))
                continue
            observe.provider_call(self.name, response.status_code, started, attempt)
            if response.status_code < 400:
                return response
            wait = self._retry_wait(response, attempt)
            if wait is None or last or wait >= deadline.remaining():
                if answer_errors:
                    return response
                raise self._refusal(response, deadline)
            logger.info('%s: provider answered %s, retrying in %.2f s (attempt %d of %d)', self.name,
                        response.status_code, wait, attempt + 2, self.max_retries + 1)
            response.close()
            self.sleep(wait)
        raise AssertionError('unreachable')

    def _unsent_wait(self, e: requests.RequestException, attempt: int, last: bool, deadline: Deadline) -> float:
        """How long to wait before retrying a request that got no answer; raises when it must not be."""
        self._raise_if_expired(deadline)
        if isinstance(e, requests.Timeout) and not isinstance(e, requests.ConnectTimeout):
            raise LLMTimeout(self._redact(f'{self.name}: no answer from the provider within '
                                          f'{self.timeout[1]:g} s; raise "timeout" or check the provider'),
                             connection=self.name) from None
        wait = self._backoff(attempt)
        if isinstance(e, requests.ConnectionError) and not last and wait < deadline.remaining():
            return wait
        if isinstance(e, requests.Timeout):
            raise LLMTimeout(self._redact(f'{self.name}: could not connect to the provider in time; '
                                          f'check "address" and that the provider is up'),
                             connection=self.name) from None
        raise self._error(f'cannot reach the provider ({type(e).__name__}); check "address" '
                          f'and that the provider is up') from None

    def _refusal(self, response, deadline: Deadline) -> LLMError:
        """The error for an answer that will not be retried (its body read within the deadline)."""
        try:
            error = self._status_error(response)
        except requests.RequestException as e:
            self._raise_if_expired(deadline)
            return self._error(f'the error answer broke before it was complete ({type(e).__name__}); '
                               f'try again', status=response.status_code)
        self._raise_if_expired(deadline)
        return error

    def _socket_timeout(self, deadline: Deadline) -> tuple[float, float]:
        """Per-socket-operation timeouts, never beyond what is left of the deadline."""
        left = max(0.001, deadline.remaining())
        return min(self.timeout[0], left), min(self.timeout[1], left)

    def _prepare(self, method: str, url: str, headers: dict, data: bytes | None) -> requests.PreparedRequest:
        """The request to send: a copy of one prepared per method, URL and headers, with this body.

        ``Session.request`` would parse the URL and merge settings, headers and
        cookies anew for every call (about 70 µs of CPU); a connection always
        sends the same method, URL and headers, so that work is done once.
        Cookies a provider sets later are not sent back: LLM APIs use none.
        """
        key = (method, url)
        cached = self._prepared.get(key)
        if cached is None or cached[0] is not headers:
            cached = self._prepared[key] = (headers, self.session.prepare_request(
                requests.Request(method, url, headers=headers)))
        prepared = cached[1].copy()
        if data is not None:
            prepared.body = data
            prepared.headers['Content-Length'] = str(len(data))
        return prepared

    def _retry_wait(self, response, attempt: int) -> float | None:
        """Seconds to wait before retrying this answer, or None when it must not be retried."""
        if response.status_code not in RETRY_STATUSES:
            return None
        wait = parse_retry_after(response.headers)
        if wait is None:
            return self._backoff(attempt)
        return wait if wait <= RETRY_AFTER_CAP else None

    @staticmethod
    def _backoff(attempt: int) -> float:
        return random.uniform(0, min(BACKOFF_CAP, BACKOFF_BASE * 2 ** attempt))

    def _json(self, response) -> Any:
        try:
            return decode_json(response.content, response.headers.get('content-type', ''))
        except ValueError:
            raise self._error('the provider answered with a body that is not JSON; check "address" points '
                              'at the provider API', status=response.status_code,
                              body=self._redact(_text(response.content[:2000]))) from None

    def _json_body(self, response, raw: bytes) -> Any:
        """A stream request answered with plain JSON (an object, or Gemini's array of chunks)."""
        try:
            return decode_json(raw, response.headers.get('content-type', ''))
        except ValueError:
            raise self._error('the provider answered the stream request with a body that is neither '
                              'server-sent events nor JSON; check "address" points at the provider API',
                              status=response.status_code, body=self._redact(_text(raw[:2000]))) from None

    def _status_error(self, response) -> LLMError:
        status = response.status_code
        raw = response.content
        try:
            body = self._redact(decode_json(raw, response.headers.get('content-type', '')))
        except ValueError:
            body = self._redact(_text(raw[:ERROR_BODY_CHARS]))
        detail = provider_message(body)
        cls = LLMError
        if status in (401, 403):
            cls, hint = LLMAuthError, 'check the connection\'s secret'
        elif status in (429, 529):
            cls, hint = LLMRateLimited, 'the provider is overloaded or rate-limiting; try again later'
        elif status >= 500 or status in (408, 409):
            hint = f'gave up after {self.max_retries + 1} attempts'
        else:
            hint = 'the request was refused; fix the input or the connection settings'
        message = f'{self.name}: provider answered HTTP {status}' + (f': {detail}' if detail else '') + f' ({hint})'
        return cls(self._redact(message), status=status, provider_body=body, connection=self.name)

    def _error(self, message: str, status: int | None = None, body: Any = None) -> LLMError:
        return LLMError(self._redact(f'{self.name}: {message}'), status=status, provider_body=body,
                        connection=self.name)

    def _redact(self, value: Any) -> Any:
        """``value`` with the connection's secret masked (provider bodies too: some quote the key they refused)."""
        return scrub(value, self._secret)


def read_environment_once(session: requests.Session, address: str) -> None:
    """Settle proxy and CA-bundle settings from the environment now, not on every request.

    With ``trust_env`` on, requests scans the whole environment for proxies on
    each call (about 100 µs, more than a Redis round trip). A connection talks to
    one address, so the answer never changes: read it once, then turn the scan off.
    """
    session.proxies.update(requests.utils.get_environ_proxies(address))
    bundle = os.environ.get('REQUESTS_CA_BUNDLE') or os.environ.get('CURL_CA_BUNDLE')
    if bundle:
        session.verify = bundle
    session.trust_env = False


def _encode(body: dict) -> bytes:
    """The JSON bytes of a request body; text that is not valid Unicode goes as U+FFFD.

    Input is checked before it gets here, but a chat stored by an older version
    may hold a lone surrogate in its history: one bad turn must not make the chat
    unusable, so it is cleaned here, on the way out, rather than refused.
    """
    text = json.dumps(body, ensure_ascii=False)
    try:
        return text.encode('utf-8')
    except UnicodeEncodeError:
        return json.dumps(clean_value(body), ensure_ascii=False).encode('utf-8')


def _text(raw: bytes) -> str:
    return raw.decode('utf-8', errors='replace')
