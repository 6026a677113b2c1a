"""HTTP to the providers: one urllib3 connection pool per connection, retries, SSE.

urllib3 is the engine under ``requests``; the transport drives its pools
directly because every call goes to the same origin with the same method
and headers, and ``requests``' per-call layers (adapter, hooks, cookie jar,
settings merge) cost about a third of the CPU of a call without doing
anything an LLM API needs. The connection handling (keep-alive, dropped
connection detection, TLS verification against certifi's bundle, proxies
from the environment) stays urllib3's own.

This is the one place where HTTP exceptions are translated into
:class:`~llmconn.errors.LLMError` and its subclasses; nothing above it sees
``urllib3.exceptions``.

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

import http.client
import logging
import os
import random
import time as mod_time
from typing import Any, Iterator
from urllib.parse import urlsplit

import certifi
import urllib3
from requests.utils import get_environ_proxies
from urllib3 import exceptions as http_errors

from llmconn import __version__, jsontext, observe
from llmconn.answers import parse_retry_after, provider_message, rate_limit_wait
from llmconn.deadline import WATCHED_POOLS, Deadline
from llmconn.errors import LLMAuthError, LLMError, LLMRateLimited, LLMTimeout, LLMUnreachable
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
READ_PIECE = 65536          # the most one read of an unchunked stream takes from the socket
MAX_CACHED_URLS = 32        # a connection calls a handful of URLs; more means they are built per call
DEFAULT_HEADERS = {'user-agent': f'llmconn/{__version__}', 'accept': '*/*', 'accept-encoding': 'gzip, deflate'}
# What a failed send or read raises: urllib3's own errors, the socket's, and http.client's.
HTTP_ERRORS = (http_errors.HTTPError, http.client.HTTPException, OSError)


class Transport:
    """Sends JSON to one provider connection, with its pool, timeout and retry budget."""

    def __init__(self, name: str, *, pool_size: int, timeout: float, max_retries: int,
                 secret: str = '', address: str = '', sleep=None,
                 stream_timeout: float = DEFAULT_STREAM_TIMEOUT) -> None:
        self.name = name
        self.timeout = (min(timeout, CONNECT_TIMEOUT_CAP), timeout)
        self.stream_timeout = stream_timeout
        self.max_retries = max_retries
        self._secret = secret
        self.sleep = sleep or mod_time.sleep
        self.proxy, self.ca_certs = read_environment(address)
        options = {'num_pools': 4, 'maxsize': pool_size, 'block': False, 'retries': False,
                   'cert_reqs': 'CERT_REQUIRED', 'ca_certs': self.ca_certs}
        self._manager = urllib3.ProxyManager(self.proxy, **options) if self.proxy else urllib3.PoolManager(**options)
        self._manager.pool_classes_by_scheme = WATCHED_POOLS
        self._targets: dict[str, tuple] = {}
        self._headers: tuple = (None, {})        # the caller's headers dict, and it over the defaults

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
                first, chunks = sniff(response.iter_content())
                if first in (b'{', b'['):
                    answer = JSONBody(self._json_body(response, b''.join(chunks)))
                    self._raise_if_expired(deadline, stream=True)
                    response.close()
                    deadline.cancel()
                    return answer
            except (*HTTP_ERRORS, LLMError) as e:
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
                    # A body without chunks ends cleanly when the deadline shuts its socket: the half
                    # event read so far must not be handed on as if it were whole.
                    self._raise_if_expired(deadline, stream=True)
                    deadline.move(end)           # the caller's time between events is not the provider's
                    yield event
                    deadline.move(min(end, mod_time.monotonic() + self.timeout[1]))
            except (*HTTP_ERRORS, LLMError) as e:
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
        return self._error(f'the stream broke before it was complete ({type(e).__name__}); try again',
                           cls=LLMUnreachable)

    def close(self) -> None:
        self._manager.clear()

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
            except HTTP_ERRORS as e:
                self._raise_if_expired(deadline)
                raise self._error(f'the answer broke before it was complete ({type(e).__name__}); '
                                  f'try again', cls=LLMUnreachable) from None
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
                    response = self._open(method, url, headers, data, deadline)
            except HTTP_ERRORS as e:
                observe.provider_call(self.name, 'timeout' if deadline.fired or _timed_out(e)
                                      else 'unreachable', started, attempt)
                self.sleep(self._unsent_wait(e, attempt, last, deadline))
                continue
            observe.provider_call(self.name, response.status_code, started, attempt)
            if response.status_code < 300:
                return response
            if response.status_code < 400:
                response.close()        # redirects are not followed: a POST must not turn into a GET
                where = response.headers.get('location', '')
                raise self._error(f'the provider answered HTTP {response.status_code} (a redirect'
                                  f'{" to " + where[:200] if where else ""}); set "address" to the URL it '
                                  f'points at', status=response.status_code)
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

    def _unsent_wait(self, e: Exception, attempt: int, last: bool, deadline: Deadline) -> float:
        """How long to wait before retrying a request that got no answer; raises when it must not be."""
        self._raise_if_expired(deadline)
        if _timed_out(e) and not _connect_timed_out(e):
            raise LLMTimeout(self._redact(f'{self.name}: no answer from the provider within '
                                          f'{self.timeout[1]:g} s; raise "timeout" or check the provider'),
                             connection=self.name) from None
        wait = self._backoff(attempt)
        if not isinstance(e, ValueError) and not last and wait < deadline.remaining():
            return wait     # not connected, reset, or cut before the answer: sending again is safe
        if _connect_timed_out(e):
            raise LLMTimeout(self._redact(f'{self.name}: could not connect to the provider in time; '
                                          f'check "address" and that the provider is up'),
                             connection=self.name) from None
        raise self._error(f'cannot reach the provider ({type(e).__name__}); check "address" '
                          f'and that the provider is up', cls=LLMUnreachable) from None

    def _refusal(self, response, deadline: Deadline) -> LLMError:
        """The error for an answer that will not be retried (its body read within the deadline)."""
        try:
            error = self._status_error(response)
        except HTTP_ERRORS as e:
            self._raise_if_expired(deadline)
            return self._error(f'the error answer broke before it was complete ({type(e).__name__}); '
                               f'try again', status=response.status_code)
        self._raise_if_expired(deadline)
        return error

    def _socket_timeout(self, deadline: Deadline) -> urllib3.Timeout:
        """Per-socket-operation timeouts, never beyond what is left of the deadline."""
        left = max(0.001, deadline.remaining())
        return urllib3.Timeout(connect=min(self.timeout[0], left), read=min(self.timeout[1], left))

    def _open(self, method: str, url: str, headers: dict, data: bytes | None, deadline: Deadline) -> 'Answer':
        """Send one request on a pooled connection; the answer's headers are read, its body is not."""
        pool, target = self._target(url)
        raw = pool.urlopen(method, target, body=data, headers=self._with_defaults(headers), retries=False,
                           redirect=False, assert_same_host=False, timeout=self._socket_timeout(deadline),
                           preload_content=False, decode_content=True, release_conn=False)
        return Answer(raw)

    def _target(self, url: str) -> tuple:
        """The pool for ``url``'s origin and what goes on the request line, found once per URL.

        ``PoolManager.urlopen`` would parse the URL and look its pool up on
        every call; a connection calls the same few URLs (the cache is
        emptied should it ever hold more than ``MAX_CACHED_URLS``).
        """
        found = self._targets.get(url)
        if found is None:
            if len(self._targets) >= MAX_CACHED_URLS:
                self._targets.clear()
            parts = urlsplit(url)
            through_proxy = self.proxy is not None and parts.scheme == 'http'
            path = url if through_proxy else (parts.path or '/') + (f'?{parts.query}' if parts.query else '')
            found = self._targets[url] = (self._manager.connection_from_url(url), path)
        return found

    def _with_defaults(self, headers: dict) -> dict:
        """``headers`` over the transport's defaults; merged again only when the caller's dict changes
        (a connection passes the same dict on every call)."""
        cached = self._headers
        if cached[0] is not headers:
            cached = self._headers = (headers, {**DEFAULT_HEADERS, **{k.lower(): v for k, v in headers.items()}})
        return cached[1]

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
        extra = {'retry_after': rate_limit_wait(response.headers)} if cls is LLMRateLimited else {}
        return cls(self._redact(message), status=status, provider_body=body, connection=self.name, quoted=detail,
                   **extra)

    def _error(self, message: str, status: int | None = None, body: Any = None, cls: type = LLMError) -> LLMError:
        return cls(self._redact(f'{self.name}: {message}'), status=status, provider_body=body, connection=self.name)

    def _redact(self, value: Any) -> Any:
        """``value`` with the connection's secret masked (provider bodies too: some quote the key they refused)."""
        return scrub(value, self._secret)


def read_environment(address: str) -> tuple[str | None, str]:
    """The proxy for ``address`` and the CA bundle, settled from the environment once.

    ``HTTPS_PROXY`` / ``HTTP_PROXY`` / ``NO_PROXY`` and ``REQUESTS_CA_BUNDLE`` /
    ``CURL_CA_BUNDLE`` mean what they mean to ``requests``. A connection talks to
    one address, so the answer never changes while it lives.
    """
    proxies = get_environ_proxies(address) if address else {}
    scheme = urlsplit(address).scheme or 'https'
    proxy = proxies.get(scheme) or proxies.get('all')
    bundle = os.environ.get('REQUESTS_CA_BUNDLE') or os.environ.get('CURL_CA_BUNDLE') or certifi.where()
    return proxy or None, bundle


class Answer:
    """A provider's answer as the transport reads it: status, headers, then the body once."""

    __slots__ = ('raw', 'status_code', 'headers', '_content')

    def __init__(self, raw: urllib3.BaseHTTPResponse) -> None:
        self.raw = raw
        self.status_code = raw.status
        self.headers = raw.headers          # case-insensitive
        self._content: bytes | None = None

    @property
    def content(self) -> bytes:
        """The whole body, decoded (gzip, deflate); the connection goes back to the pool after it."""
        if self._content is None:
            self._content = self.raw.read(decode_content=True)
            self.raw.release_conn()
        return self._content

    def iter_content(self) -> Iterator[bytes]:
        """The body's pieces as they arrive, however the body is framed.

        ``stream(None)`` reads an unchunked body (Content-Length, or until the
        connection closes) whole before yielding anything, so an event stream
        sent that way would arrive as one piece at its end: read what the socket
        has instead, each time.
        """
        if self.raw.chunked:
            return self.raw.stream(None, decode_content=True)
        return self._pieces()

    def _pieces(self) -> Iterator[bytes]:
        while piece := self.raw.read1(READ_PIECE, decode_content=True):
            yield piece

    def close(self) -> None:
        """Done with the answer: a body not read to its end closes the connection instead of reusing it."""
        if self._content is None:
            self.raw.close()
        self.raw.release_conn()


def _timed_out(e: BaseException) -> bool:
    """A connect or read that ran out of time (not a refused connection, which urllib3 files under timeouts)."""
    return isinstance(e, (http_errors.TimeoutError, TimeoutError)) and not isinstance(e, http_errors.NewConnectionError)


def _connect_timed_out(e: BaseException) -> bool:
    """A connect that timed out (urllib3's "could not connect" error is a subclass of its connect timeout)."""
    return isinstance(e, http_errors.ConnectTimeoutError) and not isinstance(e, http_errors.NewConnectionError)


def _encode(body: dict) -> bytes:
    """The JSON bytes of a request body; text that is not valid Unicode goes as U+FFFD.

    Input is checked before it gets here, but a chat stored by an older version
    may hold a lone surrogate in its history: one bad turn must not make the chat
    unusable, so it is cleaned here, on the way out, rather than refused.
    """
    text = jsontext.dumps(body)
    try:
        return text.encode('utf-8')
    except UnicodeEncodeError:
        return jsontext.dumps(clean_value(body)).encode('utf-8')


def _text(raw: bytes) -> str:
    return raw.decode('utf-8', errors='replace')
