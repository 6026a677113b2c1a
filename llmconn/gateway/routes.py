"""HTTP routing of the gateway: authentication, its routes, OpenAI-shaped errors.

    POST   /v1/responses          create (plain or ``stream: true``)
    GET    /v1/responses/{id}     a stored response of the key's tenant
    GET    /v1/responses/{id}/input_items   the input it was made from, a page at a time
    DELETE /v1/responses/{id}     forget it, and its content in every continuation (:mod:`.forget`)
    POST   /v1/responses/compact  the conversation summarized into one input item (:mod:`.compact`)
    POST   /v1/chat/completions   stateless, plain or streamed
    GET    /v1/models[/{id}]      the connections the key may use

Every request needs a gateway key (``Authorization: Bearer``); an unknown
one is 401. A body's field types, ranges and sizes are checked
(:mod:`.shapes`) before a route reads it. A model or response the key may not see is 404, worded as when
it does not exist. Errors are ``{"error": {"message", "type", "param",
"code"}}`` so the ``openai`` SDK raises its own exception classes; their
messages are llmconn's own (no secrets, no tracebacks).
"""

from __future__ import annotations

import logging
import math
import weakref
from functools import cached_property
from typing import Any, Callable, Iterable, TypeVar

from llmconn import jsontext
from llmconn.errors import (GatewayError, InvalidInput, LimitExceeded, LLMAuthError, LLMConnError, LLMError,
                            LLMRateLimited, LLMTimeout, StoreError, StructuredOutputError)
from llmconn.gateway import chat_completions, compact, dispatch, fallbacks, forget, input_items, limits, responses
from llmconn.gateway import response_objects, shapes
from llmconn.gateway.backend import check_usable
from llmconn.gateway.capabilities import CHAT, RESPONSES
from llmconn.gateway.echo import MAX_PARAM_CHARS, bounded, shown
from llmconn.gateway.keys import GatewayConfig, bearer_token, find_key
from llmconn.responses import HTTPFailure
from llmconn.server_limits import read_body
from llmconn.store.records import RecordStore

logger = logging.getLogger('llmconn.gateway')

PREFIX = '/v1/'
_JSON = 'application/json'
_SSE_HEADERS = [('Content-Type', 'text/event-stream; charset=utf-8'), ('Cache-Control', 'no-cache'),
                ('X-Accel-Buffering', 'no')]
T = TypeVar('T')
_gateways: 'weakref.WeakKeyDictionary[Any, Gateway]' = weakref.WeakKeyDictionary()
NOT_ENABLED = ('The OpenAI-compatible gateway is not enabled on this server: its llm.yaml configures no '
               'gateway.keys. The operator enables it by adding gateway.keys (see docs/gateway.md).')


class Gateway:
    """The gateway of one registry generation's store: its ledger and the model lookup."""

    def __init__(self, registry: Any) -> None:
        self.registry = registry
        self.ledger = RecordStore(registry.store)     # response records; usage counts in registry.usage

    @cached_property
    def limiter(self) -> limits.Limiter:
        """The limits of the store's keys in this process: plans, reserves, spend to write."""
        return limits.limiter(self.registry.store, self.ledger.client)

    @property
    def config(self) -> GatewayConfig:
        return self.registry.config.gateway

    def connection(self, key: Any, model: Any) -> Any:
        """The connection ``model`` names, if the key may use it; 404 as if absent otherwise."""
        if not isinstance(model, str) or not model:
            raise GatewayError('model is required: the name of a connection (GET /v1/models lists them)',
                               param='model')
        if not key.may_use(model) or model not in self.registry:
            raise GatewayError(f'The model {shown(model)} does not exist or you do not have access to it.', 404,
                               param='model', code='model_not_found')
        conn = self.registry[model]
        check_usable(conn, model)
        return conn


def gateway_for(registry: Any) -> Gateway:
    store = registry.store
    gateway = _gateways.get(store)
    if gateway is None:
        gateway = _gateways[store] = Gateway(registry)
    return gateway


def handle(registry: Any, environ: dict, method: str, path: str, cid: str) -> tuple[int, list, Iterable[bytes]]:
    """Answer one request under ``/v1/``: ``(status, headers, body)``, never raising."""
    try:
        if not registry.config.gateway.enabled:
            raise GatewayError(NOT_ENABLED, 404, code='gateway_not_enabled')
        gw = gateway_for(registry)
        key = find_key(gw.config, bearer_token(environ.get('HTTP_AUTHORIZATION', '')))
        return _route(gw, key, environ, method, path[len(PREFIX):].rstrip('/'))
    except HTTPFailure as e:        # the body could not be read whole: the connection closes too
        status, headers, body = error(GatewayError(str(e), e.status), cid, f'{method} {path}')
        return status, headers + list(e.headers), body
    except Exception as e:
        return error(e, cid, f'{method} {path}')


def _route(gw: Gateway, key: Any, environ: dict, method: str, route: str) -> tuple:
    if route in ('responses', 'chat/completions'):
        _allow(method, 'POST')
        try:
            body = _read_json(environ)
        except GatewayError as e:
            count_refused(gw, key, e)
            raise
        (status, headers, data), rate = admitted(gw, key, route, body, lambda adm: _create(gw, key, route, body, adm))
        return status, headers + rate, data
    if route == 'responses/compact':
        _allow(method, 'POST')
        return _json(200, compact.compact(gw, key, _read_json(environ)))
    if route.startswith('responses/'):
        response_id, _, tail = route[len('responses/'):].partition('/')
        if tail == 'input_items':
            _allow(method, 'GET')
            params = input_items.parse_query(environ.get('QUERY_STRING', ''))
            return _json(200, input_items.page(_stored(gw, key, response_id).get('input_items') or [], params))
        if not tail:
            _allow(method, 'GET', 'DELETE')
            return _stored_response(gw, key, method, response_id)
    if route == 'models' or route.startswith('models/'):
        _allow(method, 'GET')
        models = [_model(name) for name in gw.registry if key.may_use(name)]
        if route == 'models':
            return _json(200, {'object': 'list', 'data': models})
        wanted = route[len('models/'):]
        found = [m for m in models if m['id'] == wanted]
        if not found:
            raise GatewayError(f'The model {shown(wanted)} does not exist or you do not have access to it.', 404,
                               param='model', code='model_not_found')
        return _json(200, found[0])
    raise GatewayError(f'no gateway route {shown(method)} {shown("/v1/" + route)}', 404, code='not_found')


def admitted(gw: Gateway, key: Any, route: str, body: Any, create: Callable[[Any], T]) -> tuple[T, list]:
    """``create(admission)`` for a create request of ``route``, under the key's limits, once its fields passed.

    ``admission`` (:class:`llmconn.gateway.limits.Admission`, None for a key without limits) goes
    with the call it prepares, which counts what it spends against it.

    Returns what ``create`` returned and the key's rate headers. The one way in for a create, over
    HTTP and over a WebSocket (:mod:`llmconn.gateway.responses_ws`).
    """
    try:
        shapes.check(RESPONSES if route == 'responses' else CHAT, body)
    except Exception as e:
        count_refused(gw, key, e)
        raise
    adm = limits.admission(gw, key)
    if adm is None:
        return create(None), []
    if route != 'responses':
        adm.admit()         # its own round trip; a Response's rides the write that records it started
    try:
        result = create(adm)
    except LimitExceeded:
        raise
    except Exception as e:
        # Refused before it was admitted (a 404 model): admitted now, so it counts, or is 429, as if first.
        e.rate_headers = adm.headers()
        raise
    return result, adm.headers()


def count_refused(gw: Gateway, key: Any, e: Exception) -> None:
    """A create refused before its admission (not JSON, a field of the wrong type): admitted now, so it
    counts and ``e``'s answer carries the key's rate headers as every answer does (or it is the 429)."""
    adm = limits.admission(gw, key)
    if adm is not None:
        e.rate_headers = adm.headers()


def _create(gw: Gateway, key: Any, route: str, body: Any, adm: Any) -> tuple:
    # A stream's first event is in hand when its body is returned: a failover, if any, has happened.
    call = (responses if route == 'responses' else chat_completions).prepare(gw, key, body, adm)
    try:
        if route == 'responses':
            status, headers, data = _sse(dispatch.stream(gw, call)) if call.stream else \
                _json(200, dispatch.respond(gw, call))
        else:
            status, headers, data = _sse(chat_completions.stream(gw, call)) if call.stream else \
                _json(200, chat_completions.complete(gw, call))
    except LLMError as e:       # a backend's refusal or failure names who gave it, as an answer does
        e.served_by = fallbacks.header(call.answering)
        raise
    return status, headers + [fallbacks.header(call.answering)], data


def _missing(response_id: str) -> GatewayError:
    return GatewayError(f'Response with id {shown(response_id)} not found.', 404, code='not_found')


def _stored_response(gw: Gateway, key: Any, method: str, response_id: str) -> tuple:
    # DELETE finds what GET finds: a response of another model of the key's list, or one kept without
    # its text (store: false, zero retention), is 404 to both.
    record = _stored(gw, key, response_id)
    if method == 'DELETE':
        forget.forget(gw, key.tenant, record)
        return _json(200, {'id': response_id, 'object': 'response', 'deleted': True})
    return _json(200, response_objects.from_record(record))


def _stored(gw: Gateway, key: Any, response_id: str) -> dict:
    """The record of a response stored with its text, of the key's tenant and models; else 404."""
    record = gw.ledger.get(key.tenant, response_id)
    # Not stored (store: false, zero retention) or of a model this key may not see: as if absent.
    if record is None or 'output' not in record or not key.may_use(record['model']):
        raise _missing(response_id)
    return record


def _model(name: str) -> dict:
    return {'id': name, 'object': 'model', 'created': 0, 'owned_by': 'llmconn'}


def _allow(method: str, *allowed: str) -> None:
    if method not in allowed:
        raise GatewayError(f'use {" or ".join(allowed)} here, not {shown(method)}', 405, code='method_not_allowed')


def _read_json(environ: dict) -> Any:
    return parse_json(read_body(environ))


def parse_json(raw: bytes | str) -> Any:
    """A request body (or a WebSocket message) as JSON, which has no NaN, Infinity or 1e400."""
    try:
        return _STRICT.loads(raw)
    except RecursionError:
        raise GatewayError('the request body is JSON nested too deeply; send a flatter object') from None
    except ValueError as e:
        raise GatewayError(f'the request body is not valid JSON ({e})') from None


def _not_json(name: str) -> None:
    # Python's parser takes NaN and Infinity, which JSON (RFC 8259) does not have.
    raise ValueError(f'{name} is not a JSON number')


def _finite(text: str) -> float:
    value = float(text)
    if value in (float('inf'), float('-inf')):        # 1e400: valid JSON, but no float holds it
        raise ValueError(f'the number {text[:32]} is too large')
    return value


_STRICT = jsontext.StrictDecoder(parse_constant=_not_json, parse_float=_finite)


_REFUSAL_CHARS = 300        # of a refusal's words quoted in the error


def _off_schema(e: StructuredOutputError) -> GatewayError:
    """A json_schema answer a Claude or Gemini backend gave outside the schema (or refused to give)."""
    if e.refusal:
        words = e.refusal[:_REFUSAL_CHARS] + ('…' if len(e.refusal) > _REFUSAL_CHARS else '')
        return GatewayError(f'the model refused to answer in the json_schema format: {words}', 502,
                            type='server_error', code='structured_output_refused')
    return GatewayError('the backend\'s answer does not validate against the json_schema format; try again',
                        502, type='server_error', code='structured_output_invalid')


def classify(e: BaseException) -> GatewayError:
    """Any exception as the OpenAI-shaped error a client gets.

    A backend's failure is told in the client's terms (what happened, and whether trying again helps):
    the advice the library's message gives an operator ("check \"address\"", "check the connection's
    secret") stays in the server log (SPEC §14), which :func:`error` writes for every 5xx.
    """
    if isinstance(e, GatewayError):
        return e
    if isinstance(e, InvalidInput):
        return GatewayError(str(e))
    if isinstance(e, LLMTimeout):
        return GatewayError('the backend did not answer in time; try again later', 504, type='server_error',
                            code='backend_timeout')
    if isinstance(e, LLMRateLimited):
        return GatewayError('the backend is rate-limiting or overloaded; try again later', 429,
                            type='rate_limit_error', code='rate_limit_exceeded')
    if isinstance(e, StructuredOutputError):
        return _off_schema(e)
    if isinstance(e, LLMAuthError):
        return GatewayError('the backend refused the gateway\'s credentials', 502, type='server_error',
                            code='backend_auth')
    if isinstance(e, LLMError):
        status = f'HTTP {e.status}' if e.status else 'no answer'
        if e.status in (400, 413, 422):
            said = f': {e.quoted}' if e.quoted else ''
            return GatewayError(f'the backend refused the request ({status}){said}', 400, code='backend_rejected')
        return GatewayError(f'the backend failed to answer ({status}); try again later', 502, type='server_error',
                            code='backend_error')
    if isinstance(e, StoreError):
        return GatewayError('the gateway\'s store is unavailable; try again later', 503, type='server_error',
                            code='store_unavailable')
    return GatewayError('internal error; the server log has the details under this request\'s cid', 500,
                        type='server_error')


BACKEND_WAIT_RANGE = (1, 3600)      # seconds: a provider's Retry-After as the gateway passes it on


def backend_wait(seconds: float) -> int:
    """A provider's wait (``Retry-After`` / ``retry-after-ms``) as whole seconds a client is told: rounded
    up, so a client never comes back early, and kept in :data:`BACKEND_WAIT_RANGE`."""
    low, high = BACKEND_WAIT_RANGE
    if not math.isfinite(seconds):      # "inf" or "nan" parse as floats: the longest wait, not a crash
        return high
    return max(low, min(high, math.ceil(seconds)))


def error(e: BaseException, cid: str, what: str) -> tuple:
    """The OpenAI-shaped answer to ``e``: message and param bounded, whatever they quote."""
    status, headers, body = error_answer(e, cid, what)
    status, base, data = _json(status, body)
    return status, base + headers, data


def error_answer(e: BaseException, cid: str, what: str) -> tuple[int, list, dict]:
    """:func:`error`'s status, headers of its own (rate, Retry-After, served-by) and body, not yet encoded."""
    failure = classify(e)
    if failure.status >= 500:
        logger.error('%s failed with %d (cid=%s): %s', bounded(what, MAX_PARAM_CHARS), failure.status, cid,
                     bounded(e.logged() if isinstance(e, LLMError) else str(e) or str(failure)),
                     exc_info=not isinstance(e, LLMConnError))
    headers = [('WWW-Authenticate', 'Bearer')] if failure.status == 401 else list(getattr(e, 'rate_headers', ()))
    if getattr(e, 'served_by', None):
        headers.append(e.served_by)
    if isinstance(e, LLMRateLimited) and e.retry_after is not None:
        headers.append(('Retry-After', str(backend_wait(e.retry_after))))
    body = failure.body()
    body['error'].update(message=bounded(body['error']['message']),
                         param=bounded(body['error']['param'], MAX_PARAM_CHARS))
    return failure.status, headers, body


def _json(status: int, data: Any) -> tuple:
    body = jsontext.dumps(data).encode()
    return status, [('Content-Type', _JSON), ('Content-Length', str(len(body)))], [body]


def _sse(body: Iterable[bytes]) -> tuple:
    return 200, list(_SSE_HEADERS), body
