"""What ``llmconn serve`` sends: error mapping, a service's response checked and encoded, SSE.

Every error is a JSON ``{"error": message, "cid": ...}`` whose message is
safe to show a client: short, no secret, no Redis host:port and no advice
meant for the operator (``raise lock_wait``), which goes to the log under
the same cid. Anything unexpected becomes a generic message; its traceback
goes to the log.

    unknown service 404 · bad JSON or input 400 · ChatBusy 429 + Retry-After
    LLMError 502 · StoreError 503 · anything else 500 · missing API key 401

A service sets its status and headers freely, so they are checked before
anything is sent (:func:`check_response`): a status outside 200–599, a
header name that is not an HTTP token, a value with CR, LF, NUL or another
control character, or a hop-by-hop header is a 500 with a log line naming
the service and the fault, instead of a response gevent refuses half-way.
"""

from __future__ import annotations

import json
import logging
import re
from http import HTTPStatus
from typing import Any, Iterable, Iterator, Mapping

from llmconn.errors import (ChatBusy, InvalidInput, LLMConnError, LLMError, LockLost, ServiceError, StoreError,
                            UnknownService)
from llmconn.text import clean

logger = logging.getLogger('llmconn.server')

CHAT_BUSY_RETRY_AFTER = 1           # seconds a client is told to wait when a chat is busy
JSON_TYPE = 'application/json'
SSE_HEADERS = [('Content-Type', 'text/event-stream; charset=utf-8'), ('Cache-Control', 'no-cache'),
               # Reverse proxies (nginx) would otherwise buffer the stream and defeat it.
               ('X-Accel-Buffering', 'no')]
INTERNAL_ERROR = 'internal error; the server log has the details under this cid'
CHAT_BUSY = f'the chat is busy with another call; retry in {CHAT_BUSY_RETRY_AFTER} s'
STORE_DOWN = 'the chat store is unavailable; try again shortly'
LOCK_LOST = 'the call lost its hold on the chat and stored nothing; retry it'

# RFC 9110 token characters: what a header name may hold.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# A field value: visible characters, spaces and tabs, no CR/LF/NUL or other controls (obs-text allowed).
_BAD_VALUE = re.compile(r'[\x00-\x08\x0a-\x1f\x7f]')
# PEP 3333: an application must not set hop-by-hop headers; the server owns the connection.
_HOP_BY_HOP = {'connection', 'keep-alive', 'proxy-authenticate', 'proxy-authorization', 'te', 'trailer',
               'transfer-encoding', 'upgrade'}
_HOST_OWNED = {'content-length'}        # computed from the body
_SET_APART = _HOST_OWNED | {'content-type'}     # sent once, from response.content_type or the payload kind


class HTTPFailure(Exception):
    """A request refused by the host itself, with the status to send."""

    def __init__(self, status: int, message: str, headers: list | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers or []


class InvalidResponse(Exception):
    """A service set a status or header that HTTP cannot carry."""


def classify(e: BaseException) -> tuple[int, str, list]:
    """The HTTP status, a message safe for the client, and extra headers for an exception."""
    if isinstance(e, HTTPFailure):
        return e.status, str(e), e.headers
    if isinstance(e, UnknownService):
        return 404, str(e), []
    if isinstance(e, ServiceError):
        return e.status, str(e), []
    if isinstance(e, InvalidInput):
        return 400, str(e), []
    if isinstance(e, ChatBusy):
        return 429, CHAT_BUSY, [('Retry-After', str(CHAT_BUSY_RETRY_AFTER))]
    if isinstance(e, LLMError):
        return 502, str(e), []
    if isinstance(e, LockLost):
        return 503, LOCK_LOST, []
    if isinstance(e, StoreError):
        return 503, STORE_DOWN, []
    if isinstance(e, LLMConnError):     # ConfigError, UnknownConnection...: our messages carry no secrets
        return 500, str(e), []
    return 500, INTERNAL_ERROR, []


def log_failure(e: BaseException, status: int, cid: str, what: str) -> None:
    """The operator's side of an error: the whole message (advice, store address), a traceback if unexpected."""
    if isinstance(e, (ChatBusy, StoreError)):
        logger.log(logging.WARNING if status < 500 else logging.ERROR, '%s answered %d (cid=%s): %s',
                   what, status, cid, e)
    elif isinstance(e, InvalidResponse):
        logger.error('%s failed with %d (cid=%s): %s', what, status, cid, e)
    elif status >= 500:
        # Only the unexpected get a traceback; an LLMError or ConfigError is explained by its message
        # (an LLMError's without the provider's words: the caller's error has them, under this cid).
        logger.error('%s failed with %d (cid=%s): %s', what, status, cid, e.logged() if isinstance(e, LLMError)
                     else e if isinstance(e, LLMConnError) else f'{type(e).__name__}: {e}',
                     exc_info=not isinstance(e, LLMConnError))


def error_response(e: BaseException, cid: str, what: str) -> tuple:
    status, message, extra = classify(e)
    log_failure(e, status, cid, what)
    status, headers, body = json_response(status, {'error': message, 'cid': cid})
    return status, headers + list(extra), body


def check_response(response: Any, service: str) -> None:
    """Refuse (:class:`InvalidResponse`) a status or headers that cannot go out as HTTP."""
    status = response.status_code
    if isinstance(status, bool) or not isinstance(status, int) or not 200 <= status <= 599:
        # 1xx cannot end a response (101 would even switch protocols): only final statuses.
        raise InvalidResponse(f'service {service} set status_code {status!r}; use an int from 200 to 599')
    if not isinstance(response.headers, Mapping):
        raise InvalidResponse(f'service {service} set response.headers to a {type(response.headers).__name__}; '
                              f'use a dict of str to str')
    items = list(response.headers.items())
    if response.content_type:
        items.append(('Content-Type', response.content_type))
    for name, value in items:
        _check_header(service, name, value)


def _check_header(service: str, name: Any, value: Any) -> None:
    where = f'service {service} set the response header {name!r}'
    if not isinstance(name, str) or not _TOKEN.fullmatch(name):
        raise InvalidResponse(f'{where}: a header name must be a non-empty str of letters, digits and !#$%&\'*+-.^_`|~')
    if name.lower() in _HOP_BY_HOP:
        raise InvalidResponse(f'{where}: hop-by-hop headers belong to the server, a service cannot set them')
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise InvalidResponse(f'{where} to a {type(value).__name__}; use a str')
    text = str(value)
    if _BAD_VALUE.search(text):
        raise InvalidResponse(f'{where} to a value holding CR, LF, NUL or another control character')
    try:
        text.encode('latin-1')
    except UnicodeEncodeError:
        raise InvalidResponse(f'{where} to a value with characters outside ISO-8859-1; '
                              f'percent-encode it') from None


def encode_response(response: Any) -> tuple:
    """A service's response: dict/list → JSON, str → text/plain, bytes as they are, None → empty."""
    payload = response.payload
    if isinstance(payload, (dict, list)):
        body, content_type = utf8(json.dumps(payload, ensure_ascii=False)), JSON_TYPE
    elif isinstance(payload, str):
        body, content_type = utf8(payload), 'text/plain; charset=utf-8'
    elif isinstance(payload, bytes):
        body, content_type = payload, 'application/octet-stream'
    elif payload is None:
        body, content_type = b'', 'text/plain; charset=utf-8'
    else:
        body, content_type = json.dumps(payload).encode(), JSON_TYPE
    headers = [('Content-Type', response.content_type or content_type), ('Content-Length', str(len(body)))]
    headers += [(k, str(v)) for k, v in response.headers.items() if k.lower() not in _SET_APART]
    return response.status_code, headers, [body]


def sse_response(events: Iterable, cid: str, extra_headers: dict | None = None) -> tuple:
    """Server-Sent Events, one per item of ``events``, each written to the socket as it comes.

    The first event is taken before answering, so a chat that is busy or a
    provider that refuses still gets its proper status code. Afterwards an
    error can only be reported in-band, as an ``error`` event
    (``{"error", "status", "cid"}``). When the client goes away, the server
    closes this body, which closes ``events``: a connection's stream then
    saves nothing and frees the chat at once.
    """
    from gevent import GreenletExit

    iterator = iter(events)
    first = next(iterator, None)

    def body() -> Iterator[bytes]:
        try:
            if first is not None:
                yield encode_event(first)
            for event in iterator:
                yield encode_event(event)
        except (GreenletExit, GeneratorExit):      # killed, or the client went away: nobody to tell
            raise
        except BaseException as e:      # SystemExit and KeyboardInterrupt too: this stream only
            status, message, _ = classify(e)
            log_failure(e, status, cid, 'Stream')
            yield sse('error', {'error': message, 'status': status, 'cid': cid})
        finally:
            close = getattr(iterator, 'close', None)
            if close is not None:
                close()

    headers = list(SSE_HEADERS) + [(k, str(v)) for k, v in (extra_headers or {}).items()
                                   if k.lower() not in _SET_APART]
    return 200, headers, body()


def encode_event(event: Any) -> bytes:
    """An llmconn Event (or a plain str, sent as text) as one SSE message."""
    if isinstance(event, str):
        return sse('text', {'text': event})
    if event.type == 'done':
        # The provider's raw answer stays on the server: the client gets text, usage and model.
        return sse('done', {k: v for k, v in (event.result or {}).items() if k != 'raw'})
    return sse(event.type, {'text': event.text})


def sse(event: str, data: Any) -> bytes:
    return utf8(f'event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n')


def utf8(text: str) -> bytes:
    """``text`` as UTF-8; a lone surrogate (a tool's or an old turn's bad text) goes as U+FFFD, not a 500."""
    try:
        return text.encode()
    except UnicodeEncodeError:
        return clean(text).encode()


def json_response(status: int, data: Any) -> tuple:
    body = utf8(json.dumps(data, ensure_ascii=False))
    return status, [('Content-Type', JSON_TYPE), ('Content-Length', str(len(body)))], [body]


_STATUS_LINES = {int(s): f'{int(s)} {s.phrase}' for s in HTTPStatus}    # made once: an enum lookup per response


def status_line(status: int) -> str:
    """``200 OK``; a status HTTP does not name is ``<status> Status``."""
    return _STATUS_LINES.get(status) or f'{status} Status'
