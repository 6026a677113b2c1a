"""WebSocket mode of ``/v1/responses``, as the ``openai`` SDK's ``client.responses.connect()`` speaks it.

    GET /v1/responses   Upgrade: websocket, Authorization: Bearer <gateway key>

The key is checked before the upgrade: a missing or wrong one is the same
401 as over HTTP, and no socket opens. Then each client message is a
``response.create`` event, the fields of ``POST /v1/responses`` inline
(``{"type": "response.create", "model": ..., "input": ...}``), and its
answer is the events of the SSE stream of the same request, one text
message each, from ``response.created`` to ``response.completed``. The
request goes the HTTP route's one way in (:func:`llmconn.gateway.routes.admitted`):
the same field checks, the key's limits, ``responses.prepare`` and
``dispatch.stream``, so records, retention, ``previous_response_id`` and usage
are what they are over HTTP; a socket may carry any number of responses in
sequence, each continuing any earlier one.

- A request that is refused (a bad field, an unknown ``previous_response_id``,
  a limit reached: 429) is an ``error`` event (``status``, and ``error``
  with ``type``, ``code``, ``message``, ``param`` and, for a limit, the rate
  ``headers``): the socket stays open for the next request. A key that a
  reload removed gets its 401 as an ``error`` event, and the socket closes.
- One response at a time: a message that arrives while a response streams
  is answered with an ``error`` event (``response_in_progress``), and the
  response goes on.
- A client that closes its socket mid-response cancels it, as one that
  leaves an SSE stream: the backend's stream is closed and the response is
  recorded ``cancelled``. It is noticed before the next event is sent.
- ``gateway.websocket.idle_timeout`` bounds the wait for each message, and
  ``max_message_bytes`` the size of one: a larger message closes that socket
  (close code 1009), and only that one (:mod:`llmconn.websocket`).
- ``stream`` is implicit (``stream: false`` is refused), ``stream_id``
  (parallel lanes) is refused: one socket carries one response at a time.
- ``generate: false`` warms up: the response records its input and
  settings without asking the provider (``response.created``,
  ``response.in_progress``, ``response.completed`` with no output and no
  usage), and the next response continues it with ``previous_response_id``.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterator

from llmconn import jsontext
from llmconn.errors import GatewayError, WebSocketClosed
from llmconn.gateway import dispatch, responses, routes
from llmconn.gateway.echo import shown
from llmconn.gateway.keys import bearer_token, find_key
from llmconn.websocket import WebSocket, can_take_over, handshake

logger = logging.getLogger('llmconn.gateway')

CREATE = 'response.create'
_RATE_HEADERS = ('x-ratelimit-', 'retry-after')
BUSY = ('a response is already in progress on this socket: send the next response.create after its '
        'response.completed (one response at a time per socket), or open another socket')


def handle(registry: Any, environ: dict, method: str, path: str, cid: str) -> tuple:
    """Answer a WebSocket upgrade under ``/v1/``: a 101 whose body runs the socket, or an HTTP error."""
    try:
        if not registry.config.gateway.enabled:
            raise GatewayError(routes.NOT_ENABLED, 404, code='gateway_not_enabled')
        gw = routes.gateway_for(registry)
        token = bearer_token(environ.get('HTTP_AUTHORIZATION', ''))
        find_key(gw.config, token)
        if path.rstrip('/') != routes.PREFIX + 'responses':
            raise GatewayError(f'no WebSocket route {shown(path)}: WebSocket mode is on /v1/responses', 404,
                               code='not_found')
        if method != 'GET':
            raise GatewayError(f'open a WebSocket with GET, not {shown(method)}', 405, code='method_not_allowed')
        if not can_take_over(environ):
            raise GatewayError('this server cannot take a connection over for a WebSocket; serve the gateway '
                               'with llmconn serve', 400, code='websocket_unsupported')
        settings = gw.config.websocket
        answer = handshake(environ, [('X-Cid', cid)])
        if answer.status_code != 101:
            said = answer.body.decode('utf-8', 'replace').strip()
            raise GatewayError(f'not a valid WebSocket handshake ({said}); use a WebSocket client', 400,
                               code='invalid_websocket_handshake')
    except Exception as e:
        return routes.error(e, cid, f'{method} {path}')
    return 101, [], Session(registry, token, cid,
                            lambda: WebSocket.open(environ, answer, settings.max_message_bytes, settings.idle_timeout))


class Session:
    """The body of the 101 answer: the server runs it, and it writes to the socket itself."""

    def __init__(self, registry: Any, token: str, cid: str, open_socket: Callable[[], WebSocket]) -> None:
        self.registry = registry
        self.token = token
        self.cid = cid
        self._open = open_socket

    def __iter__(self) -> Iterator[bytes]:
        try:
            ws = self._open()
        except WebSocketClosed as e:        # gone before its 101 was sent
            logger.debug('WebSocket cid=%s closed: %s', self.cid, e)
            return iter(())
        try:
            while True:
                self._answer(ws, ws.receive())
        except WebSocketClosed as e:
            logger.debug('WebSocket cid=%s closed: %s', self.cid, e)
        finally:
            ws.close()
        return iter(())

    def _answer(self, ws: WebSocket, message: str | bytes) -> None:
        """One client message: a response streamed, or an error event."""
        try:
            gw = routes.gateway_for(self.registry)          # a reload's new store and keys, as HTTP gets them
            key = find_key(gw.config, self.token)
            try:
                body = create_body(message)
            except GatewayError as e:
                routes.count_refused(gw, key, e)
                raise
            generate = body.pop('generate', True)
            answer = dispatch.stream if generate else dispatch.warm
            events, _ = routes.admitted(gw, key, 'responses', body, lambda adm: answer(
                gw, responses.prepare(gw, key, body, adm, generate), jsontext.dumps))
        except Exception as e:
            event = error_event(e, self.cid)
            ws.send_text(jsontext.dumps(event))
            if event['status'] == 401:
                ws.close(1008, 'invalid API key')
                raise WebSocketClosed('the key no longer authenticates') from None
            return
        _relay(ws, events)


def _relay(ws: WebSocket, events: Iterator[str]) -> None:
    """Send a response's events; a client that closed its socket meanwhile cancels it (events.close())."""
    try:
        for text in events:
            # Looked at before each event, never after the last: a request sent once the client had
            # response.completed is the next one, not one that came in while this one ran.
            for _ in ws.poll():
                ws.send_text(jsontext.dumps(busy_event()))
            ws.send_text(text)
    finally:
        events.close()


def create_body(message: str | bytes) -> dict:
    """The ``POST /v1/responses`` body a ``response.create`` message carries, streamed."""
    if not isinstance(message, str):
        raise GatewayError('send each event as a text message holding a JSON object, not a binary one')
    event = routes.parse_json(message)
    if not isinstance(event, dict):
        raise GatewayError('each message must be a JSON object with "type": "response.create"')
    kind = event.get('type')
    if kind != CREATE:
        raise GatewayError(f'unsupported event type {shown(kind)}: this socket takes {CREATE!r} events',
                           param='type', code='unsupported_event_type')
    body = {name: value for name, value in event.items() if name != 'type'}
    if 'stream_id' in body:
        raise GatewayError('stream_id (parallel lanes) is not supported: a socket carries one response at a '
                           'time; leave stream_id out, or open another socket', param='stream_id')
    if body.get('stream', True) is not True:
        raise GatewayError('over a WebSocket every response is streamed; leave stream out', param='stream')
    if not isinstance(body.get('generate', True), bool):
        raise GatewayError('generate must be true or false', param='generate')
    body['stream'] = True
    return body


def busy_event() -> dict:
    return {'type': 'error', 'status': 400, 'error': {'type': 'invalid_request_error', 'code': 'response_in_progress',
                                                      'message': BUSY, 'param': None}}


def error_event(e: BaseException, cid: str) -> dict:
    """``e`` as the ``error`` event the SDK reads: the HTTP route's error body, its status, its rate headers."""
    status, headers, body = routes.error_answer(e, cid, f'WebSocket {CREATE}')
    event = {'type': 'error', 'status': status, 'error': body['error']}
    rate = {name.lower(): value for name, value in headers if name.lower().startswith(_RATE_HEADERS)}
    if rate:
        event['error']['headers'] = rate
    return event
