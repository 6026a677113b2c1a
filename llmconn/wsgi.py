"""The WSGI application of ``llmconn serve``: routing, API keys, error mapping, SSE.

Every response carries the request's correlation id in ``X-Cid``; every
error is a JSON ``{"error": message, "cid": ...}`` whose message is safe to
show: llmconn's own errors never carry secrets, and anything else becomes a
generic message while the traceback goes to the server log under the cid.

    unknown service 404 · bad JSON or input 400 · ChatBusy 429 + Retry-After
    LLMError 502 · StoreError 503 · anything else 500 · missing API key 401
"""

from __future__ import annotations

import hmac
import json
import logging
import time as mod_time
from http import HTTPStatus
from typing import Any, Iterable, Iterator

from llmconn.errors import ChatBusy, InvalidInput, LLMConnError, LLMError, StoreError
from llmconn.service import ServiceError, UnknownService, new_cid, run

logger = logging.getLogger('llmconn.server')

MAX_BODY_BYTES = 10 * 1024 * 1024   # a request body above this is refused with 413
CHAT_BUSY_RETRY_AFTER = 1           # seconds a client is told to wait when a chat is busy
CID_HEADER = 'X-Cid'
_JSON = 'application/json'
_SSE_HEADERS = [('Content-Type', 'text/event-stream; charset=utf-8'), ('Cache-Control', 'no-cache'),
                # Reverse proxies (nginx) would otherwise buffer the stream and defeat it.
                ('X-Accel-Buffering', 'no')]


class HTTPFailure(Exception):
    """A request refused by the host itself, with the status to send."""

    def __init__(self, status: int, message: str, headers: list | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers or []


class App:
    """The WSGI callable; ``host`` is a :class:`llmconn.deploy.Host`."""

    def __init__(self, host: Any) -> None:
        self.host = host
        self.active = 0             # requests whose response is not fully sent yet
        self.draining = False       # set on shutdown: answer, then close the connection

    def __call__(self, environ: dict, start_response) -> Iterable[bytes]:
        cid = new_cid()
        started = mod_time.perf_counter()
        method, path = environ['REQUEST_METHOD'], environ.get('PATH_INFO') or '/'
        self.active += 1
        try:
            status, headers, body = self._dispatch(environ, method, path, cid)
        except Exception as e:
            status, headers, body = error_response(e, cid, f'{method} {path}')
        headers.append((CID_HEADER, cid))
        if self.draining:
            headers.append(('Connection', 'close'))
        start_response(_status_line(status), headers)
        logger.info('%s %s %d %.1fms cid=%s', method, path, status, (mod_time.perf_counter() - started) * 1000, cid)
        return _Tracked(body, self._finished)

    def _finished(self) -> None:
        self.active -= 1

    def _dispatch(self, environ: dict, method: str, path: str, cid: str) -> tuple:
        if path.startswith(GATEWAY_PREFIX) and self.host.registry.config.gateway.enabled:
            return _gateway(self.host.registry, environ, method, path, cid)
        self._check_api_key(environ)
        name = path.strip('/')
        if name in ('health', 'services'):
            if method != 'GET':
                raise HTTPFailure(405, f'use GET for /{name}', [('Allow', 'GET')])
            if name == 'services':
                return _json(200, self._services())
            health = self._health()
            # Load balancers read the status: a server whose store is down cannot serve chats.
            return _json(200 if health['status'] == 'ok' else 503, health)
        if not name:
            raise HTTPFailure(404, 'POST /<service-name> to call a service; GET /services lists them')
        cls = self.host.get_service(name)
        if method != 'POST':
            raise HTTPFailure(405, f'call services with POST, not {method}', [('Allow', 'POST')])
        if getattr(cls, 'requires_api_key', False) and not self._api_keys():
            raise HTTPFailure(403, f'service {name} requires an API key, and none is configured; '
                                   f'set server.api_keys in the configuration to enable it')
        raw = _read_body(environ)
        service = cls(self.host.registry, cid=cid, invoker=self.host.get_service)
        response = run(service, _parse_json(raw), raw, _request_headers(environ))
        if response.events is not None:
            return sse_response(response.events, cid, response.headers)
        return encode_response(response)

    def _api_keys(self) -> list[bytes]:
        # An empty key (e.g. ${LLMCONN_API_KEY:-} left unset) means "no key", not "the empty key".
        keys = self.host.registry.config.server.api_keys
        return [k.get_secret_value().encode() for k in keys if k.get_secret_value()]

    def _check_api_key(self, environ: dict) -> None:
        keys = self._api_keys()
        if not keys:
            return
        given = environ.get('HTTP_X_API_KEY', '')
        auth = environ.get('HTTP_AUTHORIZATION', '')
        if not given and auth[:7].lower() == 'bearer ':
            given = auth[7:].strip()
        given_bytes = given.encode('utf-8', 'replace')
        # Compare with every key, always, so the time taken says nothing about which one was close.
        matched = False
        for key in keys:
            matched |= hmac.compare_digest(given_bytes, key)
        if not matched:
            raise HTTPFailure(401, 'a valid API key is required: send it as X-API-Key or Authorization: Bearer',
                              [('WWW-Authenticate', 'Bearer')])

    def _health(self) -> dict:
        registry = self.host.registry
        store = {'shared': bool(getattr(registry.store, 'shared', False)), 'reachable': True}
        try:
            registry.store.ping()
        except Exception as e:
            store['reachable'] = False
            store['error'] = str(e) if isinstance(e, LLMConnError) else type(e).__name__
        config = self.host.config.status() if self.host.config else {}
        return {'status': 'ok' if store['reachable'] else 'degraded', 'store': store,
                'connections': list(registry), 'services': sorted(self.host.deployer.services),
                'config_error': config.get('last_error')}

    def _services(self) -> dict:
        deployed = sorted(self.host.deployer.services.values(), key=lambda d: d.name)
        return {'services': [{'name': d.name, 'file': str(d.path), 'deployed_at': _iso(d.deployed_at)}
                             for d in deployed],
                'files': self.host.deployer.status(),
                'config': self.host.config.status() if self.host.config else None}


# ---- the OpenAI-compatible gateway (llmconn.gateway): /v1/... when gateway.keys are configured.
# It authenticates with its own keys and answers in OpenAI's error shape, so it is routed before the
# host's API key check.

GATEWAY_PREFIX = '/v1/'


def _gateway(registry: Any, environ: dict, method: str, path: str, cid: str) -> tuple:
    from llmconn.gateway.routes import handle      # only servers that enable the gateway load it
    return handle(registry, environ, method, path, cid)


class _Tracked:
    """A response body that reports when the server is done with it (sent, or the client left)."""

    def __init__(self, body: Iterable[bytes], on_close) -> None:
        self.body = body
        self.on_close = on_close

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.body)

    def close(self) -> None:
        try:
            close = getattr(self.body, 'close', None)
            if close is not None:
                close()
        finally:
            self.on_close()


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
        return 429, str(e), [('Retry-After', str(CHAT_BUSY_RETRY_AFTER))]
    if isinstance(e, LLMError):
        return 502, str(e), []
    if isinstance(e, StoreError):
        return 503, str(e), []
    if isinstance(e, LLMConnError):     # ConfigError, UnknownConnection...: our messages carry no secrets
        return 500, str(e), []
    return 500, 'internal error; the server log has the details under this cid', []


def error_response(e: BaseException, cid: str, what: str) -> tuple:
    status, message, extra = classify(e)
    if status >= 500:
        # Only the unexpected get a traceback; an LLMError or StoreError is explained by its message.
        logger.error('%s failed with %d (cid=%s): %s', what, status, cid, message,
                     exc_info=not isinstance(e, LLMConnError))
    status, headers, body = _json(status, {'error': message, 'cid': cid})
    return status, headers + list(extra), body


def encode_response(response: Any) -> tuple:
    """A service's response: dict/list → JSON, str → text/plain, bytes as they are, None → empty."""
    payload = response.payload
    if isinstance(payload, (dict, list)):
        body, content_type = json.dumps(payload, ensure_ascii=False).encode(), _JSON
    elif isinstance(payload, str):
        body, content_type = payload.encode(), 'text/plain; charset=utf-8'
    elif isinstance(payload, bytes):
        body, content_type = payload, 'application/octet-stream'
    elif payload is None:
        body, content_type = b'', 'text/plain; charset=utf-8'
    else:
        body, content_type = json.dumps(payload).encode(), _JSON
    headers = [('Content-Type', response.content_type or content_type), ('Content-Length', str(len(body)))]
    headers += [(str(k), str(v)) for k, v in response.headers.items()
                if k.lower() not in ('content-type', 'content-length')]
    return int(response.status_code), headers, [body]


def sse_response(events: Iterable, cid: str, extra_headers: dict | None = None) -> tuple:
    """Server-Sent Events, one per item of ``events``, each written to the socket as it comes.

    The first event is taken before answering, so a chat that is busy or a
    provider that refuses still gets its proper status code. Afterwards an
    error can only be reported in-band, as an ``error`` event. When the
    client goes away, the server closes this body, which closes ``events``:
    a connection's stream then saves nothing and frees the chat at once.
    """
    iterator = iter(events)
    first = next(iterator, None)

    def body() -> Iterator[bytes]:
        try:
            if first is not None:
                yield encode_event(first)
            for event in iterator:
                yield encode_event(event)
        except Exception as e:
            status, message, _ = classify(e)
            logger.error('Stream failed with %d (cid=%s): %s', status, cid, message,
                         exc_info=not isinstance(e, LLMConnError))
            yield _sse('error', {'error': message, 'status': status, 'cid': cid})
        finally:
            close = getattr(iterator, 'close', None)
            if close is not None:
                close()

    headers = list(_SSE_HEADERS) + [(str(k), str(v)) for k, v in (extra_headers or {}).items()]
    return 200, headers, body()


def encode_event(event: Any) -> bytes:
    """An llmconn Event (or a plain str, sent as text) as one SSE message."""
    if isinstance(event, str):
        return _sse('text', {'text': event})
    if event.type == 'done':
        # The provider's raw answer stays on the server: the client gets text, usage and model.
        return _sse('done', {k: v for k, v in (event.result or {}).items() if k != 'raw'})
    return _sse(event.type, {'text': event.text})


def _sse(event: str, data: Any) -> bytes:
    return f'event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n'.encode()


def _json(status: int, data: Any) -> tuple:
    body = json.dumps(data, ensure_ascii=False).encode()
    return status, [('Content-Type', _JSON), ('Content-Length', str(len(body)))], [body]


def _read_body(environ: dict) -> bytes:
    stream = environ['wsgi.input']
    if not environ.get('CONTENT_LENGTH') and environ.get('HTTP_TRANSFER_ENCODING', '').lower() == 'chunked':
        raw = stream.read(MAX_BODY_BYTES + 1)
        if len(raw) > MAX_BODY_BYTES:
            raise HTTPFailure(413, f'the request body is larger than the limit of {MAX_BODY_BYTES} bytes')
        return raw
    try:
        length = int(environ.get('CONTENT_LENGTH') or 0)
    except ValueError:
        raise HTTPFailure(400, 'the Content-Length header is not a number') from None
    if length > MAX_BODY_BYTES:
        raise HTTPFailure(413, f'the request body has {length} bytes, more than the limit of {MAX_BODY_BYTES}')
    return stream.read(length) if length else b''


def _parse_json(raw: bytes) -> Any:
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except ValueError as e:
        raise HTTPFailure(400, f'the request body is not valid JSON ({e}); send a JSON object') from None


def _request_headers(environ: dict) -> dict:
    headers = {k[5:].replace('_', '-').lower(): v for k, v in environ.items() if k.startswith('HTTP_')}
    for key in ('CONTENT_TYPE', 'CONTENT_LENGTH'):
        if environ.get(key):
            headers[key.replace('_', '-').lower()] = environ[key]
    # The key authenticated this request; the service has no use for it.
    headers.pop('x-api-key', None)
    headers.pop('authorization', None)
    return headers


def _status_line(status: int) -> str:
    try:
        return f'{status} {HTTPStatus(status).phrase}'
    except ValueError:
        return f'{status} Status'


def _iso(ts: float) -> str:
    return mod_time.strftime('%Y-%m-%dT%H:%M:%S', mod_time.gmtime(ts)) + f'.{int(ts % 1 * 1000):03d}Z'
