"""The WSGI application of ``llmconn serve``: routing, API keys, request bodies, probes.

Every response carries the request's correlation id in ``X-Cid``. Errors
are mapped to statuses in :mod:`llmconn.responses`; this module never lets
anything a service raises escape: ``SystemExit`` and ``KeyboardInterrupt``
from ``handle()`` are a 500 for that request, only a greenlet kill (the
server stopping the request) passes through.

Routes of the host itself are the :data:`ROUTES` dict, path (without the
leading ``/``) → :class:`Route`; anything else is a service name. To add one
(``/metrics``, ``/admin``), add an entry: a handler ``(app, environ, cid)``
returning ``(status, headers, body)``, its methods, and ``public=True`` if
it must answer without an API key.

``/health`` is liveness and needs no key: 200 while the process serves,
``status`` "ok", or "config-error" with the error when an edit of the
configuration file failed to reload (a restart would not help: the process
could not start with it). ``/ready`` is readiness for a load balancer: 200
when the chat store answers and the server is not shutting down, else 503
with a short reason that holds no secret and no host:port. A failed reload
leaves it ready, ``status`` "degraded": the last good configuration keeps
serving, and one typo must not take every host of a fleet out of its
balancer at once.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import time as mod_time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

from gevent import GreenletExit, Timeout

from llmconn.responses import (CHAT_BUSY_RETRY_AFTER, HTTPFailure, InvalidResponse, check_response,  # noqa: F401
                               classify, encode_event, encode_response, error_response, json_response,
                               sse_response, status_line)
from llmconn import admin_page
from llmconn import logs, observe
from llmconn.errors import StoreAuthError
from llmconn.server_limits import MAX_BODY_BYTES, read_body  # noqa: F401 - MAX_BODY_BYTES: part of this module's API
from llmconn.service import new_cid, run

logger = logging.getLogger('llmconn.server')

READY_STORE_TIMEOUT = 2.0           # seconds /ready waits for the store's answer
CID_HEADER = 'X-Cid'


@dataclass(frozen=True)
class Route:
    """A path the host answers itself."""

    handler: Callable[['App', dict, str], tuple]
    methods: tuple = ('GET',)
    public: bool = False        # answers without an API key


class App:
    """The WSGI callable; ``host`` is a :class:`llmconn.deploy.Host`."""

    def __init__(self, host: Any) -> None:
        self.host = host
        self.active = 0             # requests whose response is not fully sent yet
        self.draining = False       # set on shutdown: answer, then close the connection

    def __call__(self, environ: dict, start_response) -> Iterable[bytes]:
        cid = new_cid()
        method, path = environ['REQUEST_METHOD'], environ.get('PATH_INFO') or '/'
        tally = observe.start_request(cid, method, path)
        tally.service = self._label(path)       # known from the start: the request's other log lines carry it
        self.active += 1
        try:
            try:
                status, headers, body = self._dispatch(environ, method, path, cid)
            except GreenletExit:
                raise
            except BaseException as e:      # SystemExit, KeyboardInterrupt: this request only
                status, headers, body = error_response(e, cid, f'{method} {path}')
            headers.append((CID_HEADER, cid))
            if self.draining:
                headers.append(('Connection', 'close'))
            start_response(status_line(status), headers)
        except BaseException:
            self.active -= 1        # no body to close: nothing else would count this request out
            raise
        tally.status = status
        return _Tracked(body, self, tally)

    def _finished(self, tally: observe.RequestTally) -> None:
        self.active -= 1
        observe.finish_request(tally)
        logs.access(logger, tally)      # when the last byte is sent: a stream's line has its tokens

    def _label(self, path: str) -> str:
        """The path's service name for metrics, or '' when it names none (bounded: not the client's to choose)."""
        name = path.strip('/')
        if path.startswith(GATEWAY_PREFIX):     # ids in the path become {id}
            return _GATEWAY_LABELS.get(name) or next((f'{p}/{{id}}' for p in _GATEWAY_LABELS
                                                      if name.startswith(p + '/')), '')
        return name if name in self.host.deployer.services or name in ROUTES else ''

    def _dispatch(self, environ: dict, method: str, path: str, cid: str) -> tuple:
        if path.startswith(GATEWAY_PREFIX):     # without gateway.keys it says so, in OpenAI's error shape
            return _gateway(self.host.registry, environ, method, path, cid)
        name = path.strip('/')
        route = ROUTES.get(name)
        if route is None or not route.public:
            self._check_api_key(environ)
        if route is not None:
            if method not in route.methods:
                raise HTTPFailure(405, f'use {" or ".join(route.methods)} for /{name}',
                                  [('Allow', ', '.join(route.methods))])
            return route.handler(self, environ, cid)
        if not name:
            raise HTTPFailure(404, 'POST /<service-name> to call a service; GET /services lists them')
        return self._call_service(environ, method, name, cid)

    def _call_service(self, environ: dict, method: str, name: str, cid: str) -> tuple:
        cls = self.host.get_service(name)
        if method != 'POST':
            raise HTTPFailure(405, f'call services with POST, not {method}', [('Allow', 'POST')])
        if getattr(cls, 'requires_api_key', False) and not self._api_keys():
            raise HTTPFailure(403, f'service {name} requires an API key, and none is configured; '
                                   f'set server.api_keys in the configuration to enable it')
        raw = read_body(environ)
        service = cls(self.host.registry, cid=cid, invoker=self.host.get_service)
        response = run(service, parse_json(raw), raw, request_headers(environ))
        check_response(response, name)
        if response.events is not None:
            return sse_response(response.events, cid, response.headers)
        return encode_response(response)

    def _api_keys(self) -> list[bytes]:
        # An empty key (e.g. ${LLMCONN_API_KEY:-} left unset) means "no key", not "the empty key".
        keys = self.host.registry.config.server.api_keys
        return [k.get_secret_value().encode() for k in keys if k.get_secret_value()]

    def _check_api_key(self, environ: dict, extra: tuple = ()) -> None:
        keys = self._api_keys() + [k.encode() for k in extra if k]
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

    def config_error(self) -> str:
        """Why the configuration file failed to reload (the previous one keeps serving), or ''."""
        status = self.host.config.status() if self.host.config else {}
        error = status.get('last_error') or ''
        # Paths relative to the configuration's directory (the files it names are there too), not
        # where it lives: /health answers anyone. The errors never quote values.
        return error.replace(str(self.host.config.path.parent) + os.sep, '') if error else ''

    def store_problem(self) -> str:
        """'' when the chat store answers, else a short reason without its address."""
        try:
            with Timeout(READY_STORE_TIMEOUT):
                self.host.registry.store.ping()
        except Timeout:
            return f'the chat store did not answer within {READY_STORE_TIMEOUT:g} s'
        except Exception as e:
            logger.warning('/ready: the chat store does not answer: %s', e)
            if isinstance(e, StoreAuthError):
                return 'the chat store refused its credentials (the user name and password in redis.url)'
            return 'the chat store does not answer'
        return ''


def _health(app: App, environ: dict, cid: str) -> tuple:
    error = app.config_error()
    if error:
        return json_response(200, {'status': 'config-error', 'reason': _CONFIG_REASON, 'error': error})
    return json_response(200, {'status': 'ok'})


def _ready(app: App, environ: dict, cid: str) -> tuple:
    reason = 'the server is shutting down' if app.draining else app.store_problem()
    if reason:
        return json_response(503, {'status': 'not-ready', 'reason': reason})
    if app.config_error():
        return json_response(200, {'status': 'degraded', 'reason': _DEGRADED_REASON})
    return json_response(200, {'status': 'ready'})


_CONFIG_REASON = 'the configuration file failed to reload; the last good configuration keeps serving'
_DEGRADED_REASON = ('serving the last good configuration: an edit of the configuration file failed to reload '
                    '(GET /health has the error)')


def _services(app: App, environ: dict, cid: str) -> tuple:
    host = app.host
    deployed = sorted(host.deployer.services.values(), key=lambda d: d.name)
    registry = host.registry
    return json_response(200, {
        'services': [{'name': d.name, 'file': d.path.name, 'deployed_at': _iso(d.deployed_at)} for d in deployed],
        'files': host.deployer.status(),
        'config': host.config.status() if host.config else None,
        'connections': list(registry),
        'store': {'shared': bool(getattr(registry.store, 'shared', False))}})


def _metrics(app: App, environ: dict, cid: str) -> tuple:
    from llmconn.metrics import respond     # not imported until scraped: prometheus_client stays unloaded
    return respond(app, environ)


# The host's own paths; everything else is a service name. Add an entry to add a route.
ROUTES: dict[str, Route] = {
    'health': Route(_health, public=True),
    'ready': Route(_ready, public=True),
    'services': Route(_services),
    'admin': Route(admin_page.handle, public=True),     # checks the key itself (also a browser's Basic login)
    'metrics': Route(_metrics, public=True),    # checks its own keys: see llmconn.metrics.respond
}


# ---- the OpenAI-compatible gateway (llmconn.gateway): /v1/... when gateway.keys are configured.
# It authenticates with its own keys and answers in OpenAI's error shape, so it is routed before the
# host's API key check.

GATEWAY_PREFIX = '/v1/'
# The gateway's paths as metrics label them (llmconn.gateway.routes).
_GATEWAY_LABELS = {p: p for p in ('v1/responses', 'v1/chat/completions', 'v1/models')}


_routes_handle: Callable | None = None      # llmconn.gateway.routes.handle, once a /v1/ request loaded it


def _gateway(registry: Any, environ: dict, method: str, path: str, cid: str) -> tuple:
    # Only servers asked for /v1/ load the gateway (and only a WebSocket upgrade its WebSocket mode).
    global _routes_handle
    if 'HTTP_UPGRADE' in environ and environ['HTTP_UPGRADE'].strip().lower() == 'websocket':
        from llmconn.gateway.responses_ws import handle
        return handle(registry, environ, method, path, cid)
    if _routes_handle is None:
        from llmconn.gateway.routes import handle as _routes_handle
    return _routes_handle(registry, environ, method, path, cid)


class _Tracked:
    """A response body that reports when the server is done with it (sent, or the client left)."""

    __slots__ = ('body', 'app', 'tally')

    def __init__(self, body: Iterable[bytes], app: App, tally: observe.RequestTally) -> None:
        self.body = body
        self.app = app
        self.tally = tally

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.body)

    def close(self) -> None:
        try:
            close = getattr(self.body, 'close', None)
            if close is not None:
                close()
        finally:
            self.app._finished(self.tally)


def parse_json(raw: bytes) -> Any:
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except RecursionError:
        raise HTTPFailure(400, 'the request body is JSON nested too deeply; send a flatter object') from None
    except ValueError as e:
        raise HTTPFailure(400, f'the request body is not valid JSON ({e}); send a JSON object') from None


def request_headers(environ: dict) -> dict:
    headers = {k[5:].replace('_', '-').lower(): v for k, v in environ.items() if k.startswith('HTTP_')}
    for key in ('CONTENT_TYPE', 'CONTENT_LENGTH'):
        if environ.get(key):
            headers[key.replace('_', '-').lower()] = environ[key]
    # The key authenticated this request; the service has no use for it.
    headers.pop('x-api-key', None)
    headers.pop('authorization', None)
    return headers


def _iso(ts: float) -> str:
    return mod_time.strftime('%Y-%m-%dT%H:%M:%S', mod_time.gmtime(ts)) + f'.{int(ts % 1 * 1000):03d}Z'
