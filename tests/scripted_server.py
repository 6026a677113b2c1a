"""A tiny HTTP server that answers from a script, for tests of what the transport does with answers.

Each request gets the next ``(status, headers, body[, delay])`` of ``script``;
``body`` is bytes, or a list of pieces sent chunked with a short pause
between them (a stream arriving in parts). ``received`` records
``(path, headers, raw body)`` of every request, so every attempt is visible.
A callable ``delay`` is called instead of slept (e.g. a barrier's ``wait``:
requests that must be in the server at once).
A :class:`Cut` body stops halfway and the connection closes.
A :class:`Trickle` body is sent one byte at a time, ``pause`` seconds apart
(a provider that keeps a connection alive without ever finishing); its
``framing`` is ``chunked`` (the default), ``length`` (Content-Length announced
up front) or ``close`` (no length: the body ends when the connection closes).
"""

from __future__ import annotations

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PIECE_PAUSE = 0.005     # seconds between the pieces of a chunked answer


class Trickle:
    """A body sent chunked, piece by piece (bytes: byte by byte), ``pause`` seconds apart."""

    def __init__(self, data, pause: float, framing: str = 'chunked') -> None:
        self.pieces = [data[i:i + 1] for i in range(len(data))] if isinstance(data, bytes) else list(data)
        self.pause = pause
        self.framing = framing

    def frame(self, piece: bytes) -> bytes:
        return b'%x\r\n%s\r\n' % (len(piece), piece) if self.framing == 'chunked' else piece


class Cut:
    """A body announced whole (Content-Length) but cut off after its first half: the connection closes."""

    def __init__(self, data: bytes) -> None:
        self.data = data


class ScriptedServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(('127.0.0.1', 0), _Handler)
        self.script: list = []
        self.received: list = []
        self.peers: set = set()         # the client addresses requests came from (one per connection)
        self.url = f'http://127.0.0.1:{self.server_address[1]}'

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().server_bind()

    def handle_error(self, request, client_address) -> None:
        pass        # clients that cut the connection (timeouts, trickles) are what these tests make

    def start(self) -> 'ScriptedServer':
        threading.Thread(target=self.serve_forever, kwargs={'poll_interval': 0.01}, daemon=True).start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        length = int(self.headers.get('content-length', 0))
        self.server.received.append((self.path, dict(self.headers), self.rfile.read(length)))
        self.server.peers.add(self.client_address)
        status, headers, body, *delay = self.server.script.pop(0) if self.server.script else (200, {}, b'{}')
        wait = delay[0] if delay else 0
        try:
            wait() if callable(wait) else time.sleep(wait)
        except threading.BrokenBarrierError:
            status, headers, body = 500, {}, b'{"error": {"message": "the barrier broke"}}'
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        if isinstance(body, Trickle):
            self._trickle(body)
            return
        if isinstance(body, Cut):
            self.send_header('content-length', str(len(body.data)))
            self.end_headers()
            self.wfile.write(body.data[:len(body.data) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if isinstance(body, bytes):
            self.send_header('content-length', str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_header('transfer-encoding', 'chunked')
        self.end_headers()
        for piece in body:
            self.wfile.write(b'%x\r\n%s\r\n' % (len(piece), piece))
            self.wfile.flush()
            time.sleep(PIECE_PAUSE)
        self.wfile.write(b'0\r\n\r\n')

    do_GET = do_POST

    def _trickle(self, body: Trickle) -> None:
        if body.framing == 'chunked':
            self.send_header('transfer-encoding', 'chunked')
        elif body.framing == 'length':
            self.send_header('content-length', str(sum(map(len, body.pieces))))
        else:
            self.close_connection = True
        self.end_headers()
        for piece in body.pieces:
            try:
                self.wfile.write(body.frame(piece))
                self.wfile.flush()
            except OSError:
                return          # the client gave up on us: what a trickle test wants
            time.sleep(body.pause)
        if body.framing == 'chunked':
            self.wfile.write(b'0\r\n\r\n')
