"""The fake provider's WSGI application: routing, recording, faults and the control API.

:class:`FakeState` is everything a test can see or change: the recorded
requests, queued faults, latency, the optional API key, and the Responses
store. The test thread and the server's greenlets both touch it, so every
change goes through one lock (held briefly, never across a switch).

Faults are queued and each provider request takes one from the head: a
status (with its body and headers), a hang (sleep, then answer normally) or
garbage (a 200 that is not JSON). Stream faults sit in their own queue and
are taken only by streaming requests: ``break`` cuts the connection right
after the first delta, ``error`` sends the provider's error event there.
"""

from __future__ import annotations

import errno
import json
import re
import threading
import time
from collections import deque
from typing import Any
from urllib.parse import parse_qsl

import gevent

from llmconn.testing import fake_claude, fake_gemini, fake_openai, fake_responses
from llmconn.testing.fake_cache import PromptCache
from llmconn.testing.fake_common import ApiError, Call, JSONAnswer, Signer, StreamAnswer, sse

CONTROL_PREFIX = '/_fake/'
STREAM_FAULTS = ('break', 'error')
# Bounds for long benchmark runs: the oldest records and stored responses go first.
MAX_RECORDED = 100_000
MAX_STORED_RESPONSES = 100_000
GARBAGE = b'<html><body><h1>502 Bad Gateway</h1>this is not JSON</body></html>'

_STATUS_TEXT = {200: 'OK', 400: 'Bad Request', 401: 'Unauthorized', 403: 'Forbidden', 404: 'Not Found',
                408: 'Request Timeout', 409: 'Conflict', 429: 'Too Many Requests',
                500: 'Internal Server Error', 502: 'Bad Gateway', 503: 'Service Unavailable',
                504: 'Gateway Timeout', 529: 'Overloaded'}
_GEMINI_MODEL = re.compile(r'^/v1beta/models/([^/]+)$')
_STORED_RESPONSE = re.compile(r'^/v1/responses/([^/]+)$')


class FakeState:
    """What tests record, inject and read; shared by the server and the test thread."""

    def __init__(self, latency: float = 0.0, api_key: str | None = None) -> None:
        self.lock = threading.Lock()
        self.recorded: deque = deque(maxlen=MAX_RECORDED)
        self.faults: deque = deque()
        self.stream_faults: deque = deque()
        self.latency = float(latency)
        self.api_key = api_key
        self.signer = Signer()
        self.cache = PromptCache()      # the providers' prompt caches (see fake_cache)
        # Responses API state: response id -> record, and the ids of the items they output.
        self.responses: dict[str, dict] = {}
        self.items: set[str] = set()
        # Requests refused for breaking a provider's replay rules (see fake_tools).
        self.violations: list[dict] = []
        # Responses: function-call item id -> the reasoning item id that must precede it.
        self.call_reasoning: dict[str, str] = {}

    def add_violation(self, entry: dict) -> None:
        with self.lock:
            self.violations.append(entry)

    def record(self, call: Call) -> None:
        entry = {'method': call.method, 'path': call.path, 'headers': call.headers, 'body': call.body,
                 'query': call.query, 'time': time.time()}
        with self.lock:
            self.recorded.append(entry)

    def store_response(self, response_id: str, record: dict, item_ids: list[str]) -> None:
        """Keep a Responses API response so later requests can continue from it."""
        record['item_ids'] = item_ids
        self.responses[response_id] = record
        self.items.update(item_ids)
        while len(self.responses) > MAX_STORED_RESPONSES:
            oldest = self.responses.pop(next(iter(self.responses)))
            self.items.difference_update(oldest['item_ids'])

    def snapshot(self) -> list[dict]:
        with self.lock:
            return list(self.recorded)

    def clear(self) -> int:
        with self.lock:
            count = len(self.recorded)
            self.recorded.clear()
            self.violations.clear()
            return count

    def add_fault(self, fault: dict, count: int = 1) -> None:
        if count < 1:
            raise ValueError(f'count must be at least 1, got {count}')
        queue = self.stream_faults if 'stream' in fault else self.faults
        with self.lock:
            queue.append([fault, count])

    def clear_faults(self) -> None:
        with self.lock:
            self.faults.clear()
            self.stream_faults.clear()

    def take(self, queue: deque) -> dict | None:
        with self.lock:
            if not queue:
                return None
            entry = queue[0]
            entry[1] -= 1
            if entry[1] <= 0:
                queue.popleft()
            return entry[0]


def fault_from_json(spec: Any) -> tuple[dict, int]:
    """A fault as the control API receives it, checked; returns ``(fault, count)``."""
    if not isinstance(spec, dict):
        raise ValueError('send a JSON object such as {"status": 429, "count": 1}')
    count = int(spec.get('count', 1))
    if 'status' in spec:
        return {'status': int(spec['status']), 'body': spec.get('body'), 'headers': spec.get('headers')}, count
    if 'hang' in spec:
        return {'hang': float(spec['hang'])}, count
    if spec.get('garbage'):
        return {'garbage': True}, count
    if spec.get('stream_break'):
        return {'stream': 'break'}, count
    if spec.get('stream_error'):
        return {'stream': 'error'}, count
    raise ValueError('a fault needs one of: status, hang, garbage, stream_break, stream_error')


def resolve(call: Call) -> tuple[Any, Any] | None:
    """The API module (for error shape and auth) and the handler serving ``call``, or None."""
    method, path = call.method, call.path.rstrip('/')
    if method == 'POST' and path == '/v1/messages':
        return fake_claude, fake_claude.messages
    if method == 'POST' and path == '/v1/chat/completions':
        return fake_openai, fake_openai.chat_completions
    if method == 'POST' and path == '/v1/responses':
        return fake_openai, fake_responses.responses
    if method in ('GET', 'DELETE') and _STORED_RESPONSE.match(path):
        call.params['response_id'] = _STORED_RESPONSE.match(path).group(1)
        return fake_openai, fake_responses.stored
    if method == 'GET' and path == '/v1/models':
        # One path serves both APIs; Anthropic's clients always send anthropic-version.
        claude = 'anthropic-version' in call.headers or 'x-api-key' in call.headers
        return (fake_claude, fake_claude.models) if claude else (fake_openai, fake_openai.models)
    if method == 'GET' and path == '/v1beta/models':
        return fake_gemini, fake_gemini.models
    match = _GEMINI_MODEL.match(path)
    routed = fake_gemini.route_model(match.group(1)) if method == 'POST' and match else None
    if routed:
        call.params['model'], call.params['method'] = routed
        return fake_gemini, fake_gemini.generate_content
    return None


def _headers(environ: dict) -> dict:
    headers = {key[5:].replace('_', '-').lower(): value for key, value in environ.items()
               if key.startswith('HTTP_')}
    for key in ('CONTENT_TYPE', 'CONTENT_LENGTH'):
        if environ.get(key):
            headers[key.replace('_', '-').lower()] = environ[key]
    return headers


def _json_or_none(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


class FakeApp:
    """The WSGI callable; one instance per server."""

    def __init__(self, state: FakeState) -> None:
        self.state = state

    def __call__(self, environ: dict, start_response) -> Any:
        method, path = environ['REQUEST_METHOD'], environ.get('PATH_INFO', '')
        raw = environ['wsgi.input'].read()
        if path.startswith(CONTROL_PREFIX):
            answer = self.control(method, path, raw)
        else:
            call = Call(method, path, _headers(environ), dict(parse_qsl(environ.get('QUERY_STRING', ''))),
                        _json_or_none(raw), state=self.state)
            answer = self.provider(call)
        return self.respond(answer, start_response)

    def provider(self, call: Call) -> Any:
        self.state.record(call)
        route = resolve(call)
        if route is None:
            return JSONAnswer(404, {'error': {'message': f'The fake provider has no {call.method} {call.path}; '
                                                         f'see llmconn/testing/fake_server.py for its endpoints'}})
        api, handler = route
        if self.state.latency > 0:
            gevent.sleep(self.state.latency)
        answer = self.apply_fault(api)
        if answer is not None:
            return answer
        if self.state.api_key is not None and not api.auth_ok(call, self.state.api_key):
            return JSONAnswer(401, api.error_body(401, 'Invalid API key; pass the key this fake '
                                                       'provider was started with.'))
        try:
            answer = handler(call)
        except ApiError as exc:
            return JSONAnswer(exc.status, exc.body, exc.headers)
        if isinstance(answer, StreamAnswer):
            fault = self.state.take(self.state.stream_faults)
            return answer, (fault or {}).get('stream')
        return answer

    def apply_fault(self, api: Any) -> JSONAnswer | None:
        fault = self.state.take(self.state.faults)
        if fault is None:
            return None
        if 'hang' in fault:
            gevent.sleep(fault['hang'])
            return None
        if fault.get('garbage'):
            return JSONAnswer(200, GARBAGE, {'Content-Type': 'text/html'})
        body = fault['body'] if fault.get('body') is not None else api.error_body(fault['status'])
        return JSONAnswer(fault['status'], body, fault.get('headers') or {})

    def control(self, method: str, path: str, raw: bytes) -> JSONAnswer:
        name = path[len(CONTROL_PREFIX):].rstrip('/')
        state = self.state
        try:
            if (method, name) == ('GET', 'requests'):
                return JSONAnswer(200, state.snapshot())
            if (method, name) == ('GET', 'violations'):
                with state.lock:
                    return JSONAnswer(200, list(state.violations))
            if (method, name) == ('DELETE', 'requests'):
                return JSONAnswer(200, {'cleared': state.clear()})
            if (method, name) == ('POST', 'faults'):
                state.add_fault(*fault_from_json(_json_or_none(raw)))
                return JSONAnswer(200, {'ok': True})
            if (method, name) == ('DELETE', 'faults'):
                state.clear_faults()
                return JSONAnswer(200, {'ok': True})
            if (method, name) == ('POST', 'latency'):
                state.latency = float((_json_or_none(raw) or {})['seconds'])
                return JSONAnswer(200, {'seconds': state.latency})
            if (method, name) == ('DELETE', 'cache'):
                state.cache.clear()
                return JSONAnswer(200, {'ok': True})
            if (method, name) == ('GET', 'health'):
                return JSONAnswer(200, {'ok': True})
        except (ValueError, KeyError, TypeError) as exc:
            return JSONAnswer(400, {'error': {'message': f'Bad control request: {exc}'}})
        return JSONAnswer(404, {'error': {'message': f'Unknown control endpoint {method} {path}'}})

    def respond(self, answer: Any, start_response) -> Any:
        if isinstance(answer, tuple):
            stream, fault = answer
            start_response('200 OK', [('Content-Type', 'text/event-stream; charset=utf-8'),
                                      ('Cache-Control', 'no-cache')])
            return _stream_body(stream, fault)
        if isinstance(answer.body, bytes):
            body, content_type = answer.body, 'text/plain'
        else:
            body, content_type = json.dumps(answer.body).encode('utf8'), 'application/json'
        headers = {'content-type': ('Content-Type', content_type)}
        for key, value in answer.headers.items():
            headers[str(key).lower()] = (str(key), str(value))
        # The length is ours to state, whatever a fault's headers said.
        headers['content-length'] = ('Content-Length', str(len(body)))
        status = f'{answer.status} {_STATUS_TEXT.get(answer.status, "Error")}'
        start_response(status, list(headers.values()))
        return [body]


def _stream_body(answer: StreamAnswer, fault: str | None):
    if fault is None:
        for name, data in answer.events:
            yield sse(name, data)
        return
    for name, data in answer.events[:answer.first_delta + 1]:
        yield sse(name, data)
    if fault == 'break':
        # pywsgi treats a reset as the client's doing: it closes the socket without
        # the final chunk and without logging, so the client sees a truncated body.
        raise ConnectionResetError(errno.ECONNRESET, 'fake provider broke the stream')
    for name, data in answer.failure:
        yield sse(name, data)
