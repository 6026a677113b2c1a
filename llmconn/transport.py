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

Bodies are read by :mod:`llmconn.sse`. A stream request answered with one
plain JSON body (a server that ignores ``stream``, or Gemini's JSON array
when ``alt=sse`` is not honoured) comes back as a :class:`~llmconn.sse.JSONBody`,
an event stream as an :class:`~llmconn.sse.EventStream`.
"""

from __future__ import annotations

import email.utils
import json
import logging
import os
import random
import time as mod_time
from typing import Any, Iterator

import requests
from requests.adapters import HTTPAdapter

from llmconn.errors import LLMAuthError, LLMError, LLMRateLimited, LLMTimeout
from llmconn.redact import scrub
from llmconn.sse import SSE, EventStream, JSONBody, decode_json, iter_sse, sniff

logger = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({408, 409, 429, 529}) | frozenset(range(500, 600))
BACKOFF_BASE = 0.5          # seconds before the first retry without a Retry-After
BACKOFF_CAP = 8.0           # never wait longer than this between attempts on our own account
RETRY_AFTER_CAP = 60.0      # a provider asking for more than this is treated as a failure to retry now
CONNECT_TIMEOUT_CAP = 10.0  # opening a TCP connection never needs the whole read timeout
ERROR_BODY_CHARS = 10000    # how much of a non-JSON error body is kept for the caller



class Transport:
    """Sends JSON to one provider connection, with its pool, timeout and retry budget."""

    def __init__(self, name: str, *, pool_size: int, timeout: float, max_retries: int,
                 secret: str = '', address: str = '', sleep=None, session: requests.Session | None = None) -> None:
        self.name = name
        self.timeout = (min(timeout, CONNECT_TIMEOUT_CAP), timeout)
        self.max_retries = max_retries
        self._secret = secret
        self.sleep = sleep or mod_time.sleep
        self.session = session or requests.Session()
        adapter = HTTPAdapter(pool_connections=1, pool_maxsize=pool_size, max_retries=0)
        self.session.mount('http://', adapter)
        self.session.mount('https://', adapter)
        if address:
            read_environment_once(self.session, address)
        self._prepared: dict[tuple, tuple] = {}

    def __repr__(self) -> str:
        return f'<Transport {self.name!r}>'

    def get(self, url: str, headers: dict) -> Any:
        """A GET with the same retries and error translation; returns parsed JSON."""
        response = self._send('GET', url, headers, None, stream=False)
        return self._json(response)

    def post(self, url: str, headers: dict, body: dict) -> Any:
        """POST ``body`` and return the provider's parsed JSON answer."""
        response = self._send('POST', url, headers, body, stream=False)
        return self._json(response)

    def post_stream(self, url: str, headers: dict, body: dict) -> JSONBody | EventStream:
        """POST ``body``; the answer is read up to its first byte to tell an event stream from JSON."""
        response = self._send('POST', url, headers, body, stream=True)
        try:
            first, chunks = sniff(response.iter_content(chunk_size=None))
            if first in (b'{', b'['):
                return JSONBody(self._json_body(response, b''.join(chunks)))
        except requests.RequestException as e:
            response.close()
            raise self._broken(e) from None
        except BaseException:
            response.close()
            raise
        return EventStream(self._events(response, chunks))

    def _events(self, response, chunks) -> Iterator[SSE]:
        try:
            yield from iter_sse(chunks)
        except requests.RequestException as e:
            raise self._broken(e) from None
        finally:
            response.close()

    def _broken(self, e: Exception) -> LLMError:
        return self._error(f'the stream broke before it was complete ({type(e).__name__}); try again')

    def close(self) -> None:
        self.session.close()

    # -- internals -------------------------------------------------------------------------------

    def _send(self, method: str, url: str, headers: dict, body: dict | None, stream: bool):
        data = None if body is None else json.dumps(body, ensure_ascii=False).encode('utf-8')
        for attempt in range(self.max_retries + 1):
            last = attempt == self.max_retries
            try:
                response = self.session.send(self._prepare(method, url, headers, data),
                                             timeout=self.timeout, stream=stream)
            except requests.Timeout as e:
                if isinstance(e, requests.ConnectTimeout) and not last:
                    self.sleep(self._backoff(attempt))
                    continue
                raise LLMTimeout(self._redact(f'{self.name}: no answer from the provider within '
                                              f'{self.timeout[1]} s; raise "timeout" or check the provider'),
                                 connection=self.name) from None
            except requests.RequestException as e:
                if isinstance(e, requests.ConnectionError) and not last:
                    self.sleep(self._backoff(attempt))
                    continue
                raise self._error(f'cannot reach the provider ({type(e).__name__}); check "address" '
                                  f'and that the provider is up') from None
            if response.status_code < 400:
                return response
            wait = self._retry_wait(response, attempt)
            if wait is None or last:
                raise self._status_error(response)
            logger.info('%s: provider answered %s, retrying in %.2f s (attempt %d of %d)', self.name,
                        response.status_code, wait, attempt + 2, self.max_retries + 1)
            response.close()
            self.sleep(wait)
        raise AssertionError('unreachable')

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


def parse_retry_after(headers) -> float | None:
    """Seconds from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date), if given."""
    value = headers.get('retry-after-ms')
    if value:
        try:
            return max(0.0, float(value) / 1000)
        except ValueError:
            pass
    value = headers.get('retry-after')
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - mod_time.time())


def _text(raw: bytes) -> str:
    return raw.decode('utf-8', errors='replace')


def provider_message(body: Any) -> str:
    """The human message inside any provider's error body, with its kind (``overloaded_error``, ...)."""
    if isinstance(body, list) and body:
        body = body[0]      # Gemini's streaming endpoint wraps its error in an array
    if isinstance(body, dict):
        error = body.get('error', body)
        if isinstance(error, dict):
            message = str(error.get('message') or '')[:500]
            kind = error.get('type') or error.get('status') or error.get('code')
            return f'{message} ({kind})' if message and isinstance(kind, str) and kind else message
        if isinstance(error, str):
            return error[:500]
    if isinstance(body, str):
        return ' '.join(body.split())[:200]
    return ''


