"""A server-side WebSocket (RFC 6455) on a connection that ``llmconn serve`` handed over, under gevent.

The protocol is the ``websockets`` package's sans-I/O ``ServerProtocol``, the
same package the ``openai`` SDK's WebSocket client runs on: it checks the
handshake, unmasks frames, answers pings and the closing handshake, checks
that text is UTF-8, and refuses a message larger than ``max_message_bytes``
as soon as a frame header announces it, before its payload is read (close
code 1009). No extension is offered, so no compressed message can expand
past the limit. This module only moves bytes between that protocol and the
socket, in the greenlet that serves the connection (no thread, no second
greenlet):

- :meth:`WebSocket.receive` waits for the next message for at most
  ``idle_timeout`` from the moment it is called. Pings and pongs are answered
  but do not count as activity: a client that keeps a socket open and sends
  no message is closed (code 1000, "idle timeout") when that time is up.
  While it waits, the connection is idle to the server's connection limit
  (:mod:`llmconn.server_limits`), so at the limit it may be evicted first,
  and on shutdown it is closed at once; either way with close code 1001.
- :meth:`WebSocket.poll` reads only what has already arrived, without
  waiting: a route streaming an answer calls it between two events, to see a
  client that closed or sent something meanwhile.
- Every failure of the socket or of the protocol is :class:`WebSocketClosed`;
  after it nothing more can be sent, and the caller stops.

A send is bounded by ``idle_timeout`` too: a client that stops reading
cannot hold the greenlet for longer.
"""

from __future__ import annotations

import logging
import select
import socket
import time as mod_time
from collections import deque
from typing import Any

import gevent
from gevent.monkey import get_original
from websockets.datastructures import Headers
from websockets.frames import Close, CloseCode, Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import State
from websockets.server import ServerProtocol

from llmconn.errors import WebSocketClosed
from llmconn.server_limits import TAKEOVER_KEY, TakenOver

logger = logging.getLogger('llmconn.websocket')

READ_CHUNK = 65536
READS_PER_POLL = 16     # a poll between two events reads at most this many chunks: the answer goes on
IDLE_CLOSE_CODE = 1000
# What an idle socket hears when the server evicts it (at its connection limit, or shutting down).
GOING_AWAY = Frame(Opcode.CLOSE, Close(CloseCode.GOING_AWAY, 'server closing idle connections').serialize()).serialize(
    mask=False)
_poll = get_original('select', 'poll')      # a real, non-blocking look: it must not yield to other greenlets
# The protocol logs every connection opened and closed at INFO: a burst of sockets must not flood the server
# log with them; its warnings and errors still come through.
_protocol_logger = logging.getLogger('llmconn.websocket.protocol')
_protocol_logger.setLevel(logging.WARNING)


def handshake(environ: dict, headers: list) -> Any:
    """The handshake answer to the request: a 101 unless the request is not a valid WebSocket handshake."""
    request_headers = Headers()
    for name, value in environ.items():
        if name.startswith('HTTP_'):
            request_headers[name[5:].replace('_', '-')] = value
    path = environ.get('PATH_INFO') or '/'
    if environ.get('QUERY_STRING'):
        path += '?' + environ['QUERY_STRING']
    # This protocol only checks the request pywsgi parsed already; the socket's frames get their own
    # (WebSocket), which starts OPEN rather than waiting to parse a request head.
    response = ServerProtocol(logger=_protocol_logger).accept(Request(path, request_headers))
    for name, value in headers:
        response.headers[name] = value
    return response


def can_take_over(environ: dict) -> bool:
    """Whether the server lets a request take its connection over (``llmconn serve`` does)."""
    return callable(environ.get(TAKEOVER_KEY))


class WebSocket:
    """One accepted WebSocket: whole text messages in and out."""

    def __init__(self, taken: TakenOver, response: Any, max_message_bytes: int, idle_timeout: float) -> None:
        self._sock = taken.socket
        self._protocol = ServerProtocol(state=State.OPEN, max_size=max_message_bytes, logger=_protocol_logger)
        self._set_idle = taken.set_idle
        self.idle_timeout = idle_timeout
        self._messages: deque = deque()
        self._partial = bytearray()     # the message being assembled from its fragments
        self._text = True           # whether the message being assembled is text
        self._closed = ''           # why, once closed
        self._send_all(response.serialize())
        if taken.buffered:          # a client that did not wait for the 101
            self._feed(taken.buffered)

    @classmethod
    def open(cls, environ: dict, response: Any, max_message_bytes: int, idle_timeout: float) -> 'WebSocket':
        """Take the request's connection over and answer its handshake with ``response`` (a 101)."""
        return cls(environ[TAKEOVER_KEY](farewell=GOING_AWAY), response, max_message_bytes, idle_timeout)

    @property
    def closed(self) -> str:
        """'' while open, else why it closed."""
        return self._closed

    def receive(self) -> str | bytes:
        """The next message (text as str), waiting at most ``idle_timeout``; WebSocketClosed otherwise."""
        deadline = mod_time.monotonic() + self.idle_timeout
        self._set_idle(True)
        try:
            while not self._messages:
                left = deadline - mod_time.monotonic()
                if left <= 0:
                    self.close(IDLE_CLOSE_CODE, 'idle timeout')
                    raise WebSocketClosed(f'no message for {self.idle_timeout:g} s (idle timeout)')
                self._read(left)
        finally:
            self._set_idle(False)
        return self._messages.popleft()

    def poll(self) -> list:
        """The messages that arrived already, without waiting; WebSocketClosed if the socket closed."""
        for _ in range(READS_PER_POLL):
            if not self._readable():
                break
            self._read(self.idle_timeout)
        self._check_open()
        messages = list(self._messages)
        self._messages.clear()
        return messages

    def send_text(self, text: str) -> None:
        self._check_open()
        self._protocol.send_text(text.encode('utf-8'))
        self._flush()

    def close(self, code: int = 1000, reason: str = '') -> None:
        """Send a close frame (if the socket is still open) and end the connection."""
        if self._protocol.state is State.OPEN:
            try:
                self._protocol.send_close(code, reason)
                self._flush()
            except WebSocketClosed:
                pass
        self._end(self._closed or reason or 'closed by the server')

    # ---- bytes in and out

    def _read(self, timeout: float) -> None:
        self._sock.settimeout(timeout)
        try:
            data = self._sock.recv(READ_CHUNK)
        except (socket.timeout, TimeoutError):
            return
        except OSError as e:
            self._end(f'the connection failed ({e.__class__.__name__})')
            raise WebSocketClosed(self._closed) from None
        if data:
            self._feed(data)
            # A recv that finds data returns without yielding: a client that sends without pause (a ping
            # flood) must not keep the other greenlets of the process from running. idle(), not sleep(0):
            # the loop must also poll for I/O (accepts, the other sockets) before this socket is read again.
            gevent.idle()
        else:
            self._protocol.receive_eof()
            self._flush()
            self._end('the client closed the connection')
        self._check_open()

    def _feed(self, data: bytes) -> None:
        self._protocol.receive_data(data)
        for frame in self._protocol.events_received():
            if frame.opcode not in (Opcode.TEXT, Opcode.BINARY, Opcode.CONT):
                continue            # pings, pongs, close: the protocol answers them
            if frame.opcode is not Opcode.CONT:
                self._text = frame.opcode is Opcode.TEXT
            self._partial += frame.data         # one buffer: a message in 1-byte fragments costs its size
            if frame.fin:
                whole, self._partial = bytes(self._partial), bytearray()
                if not self._text:
                    self._messages.append(whole)
                    continue
                try:
                    self._messages.append(whole.decode('utf-8'))
                except UnicodeDecodeError as e:     # the protocol checks fragmented text only
                    self._protocol.fail(CloseCode.INVALID_DATA, f'invalid UTF-8 at position {e.start}')
                    break
        self._flush()       # pongs, the answer to a close, the close of a failed protocol
        protocol = self._protocol
        if protocol.parser_exc is not None:
            self._end(f'the client broke the protocol: {protocol.parser_exc}')
        elif protocol.close_rcvd is not None or protocol.state is State.CLOSED:
            self._end('the client closed the WebSocket')
        elif protocol.close_sent is not None:       # failed here (text that is not UTF-8)
            self._end(f'closed: {protocol.close_sent}')

    def _flush(self) -> None:
        for data in self._protocol.data_to_send():
            if self._closed:
                return
            if data:
                self._send_all(data)
                continue
            try:                # the protocol is done: half-close, the client closes its side
                self._sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def _send_all(self, data: bytes) -> None:
        try:
            self._sock.settimeout(self.idle_timeout)
            self._sock.sendall(data)
        except OSError as e:
            self._end(f'the connection failed ({e.__class__.__name__})')
            raise WebSocketClosed(self._closed) from None

    def _readable(self) -> bool:
        if self._closed:
            return False
        try:
            poller = _poll()
            poller.register(self._sock.fileno(), select.POLLIN)
            return bool(poller.poll(0))
        except (OSError, ValueError):
            return False

    def _check_open(self) -> None:
        if self._closed:
            raise WebSocketClosed(self._closed)

    def _end(self, why: str) -> None:
        if not self._closed:
            self._closed = why
            logger.debug('WebSocket closed: %s', why)
