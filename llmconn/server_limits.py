"""Client connections of ``llmconn serve``: idle timeout, connection limit, strict request heads.

gevent's pywsgi handler waits for a client for ever: a client that opens a
connection and sends nothing (or one header byte a minute) holds a file
descriptor and a greenlet until it leaves, and a few hundred of them used
up a 256-fd limit so that ``/health`` stopped answering. :class:`Handler`
closes such connections:

- the request head (request line and headers) must arrive within
  ``idle_timeout`` seconds of the connection being ready for it: a fresh
  connection, or a keep-alive one after its last response;
- the request body must arrive within the same time (:func:`read_body`, which
  the host and the gateway both use, reads :data:`BODY_TIMEOUT_KEY` from the
  environ) and hold at most :data:`MAX_BODY_BYTES`; every write of the
  response is bounded by it per operation (a client that stops reading);
- at most ``max_connections`` are open: at the limit, a new connection
  closes the connection that has been idle (waiting for a request, none of
  it arrived) the longest; when none is idle, it gets a ``503`` and is
  closed. So slow or
  idle clients cannot starve the others, and the server keeps descriptors
  for Redis and the providers.

A request may take its connection over (a WebSocket upgrade): the callable
at :data:`TAKEOVER_KEY` in the environ hands it the socket (:class:`TakenOver`),
after which the handler writes nothing more for it, runs its body to the end
without sending it (the body does its own writes), and closes the
connection. While such a connection waits for its client it may be marked
idle, and so evicted at the limit like a keep-alive connection (after its
protocol's farewell, e.g. a WebSocket close frame). On shutdown every idle
taken-over connection is closed at once (:meth:`Limits.close_idle`), and so
is each one that becomes idle afterwards: a socket waiting for its next
message does not hold the drain for its whole grace.

The head is also checked where gevent is lenient: several ``Content-Length``
headers, or one with ``Transfer-Encoding``, are refused with ``400`` (a
request-smuggling vector behind proxies), without a traceback in the log.
"""

from __future__ import annotations

import json
import logging
import re
import select
import socket
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import gevent
from gevent.monkey import get_original
from gevent import Timeout
from gevent.pywsgi import OldMessage, WSGIHandler, format_date_time

from llmconn.responses import HTTPFailure

logger = logging.getLogger('llmconn.server')

MAX_BODY_BYTES = 10 * 1024 * 1024   # a request body above this is refused with 413
BODY_TIMEOUT_KEY = 'llmconn.body_timeout'     # environ key: seconds the whole request body may take
TAKEOVER_KEY = 'llmconn.take_over'  # environ key: () -> TakenOver, the connection for the request's own protocol
REFUSAL_LOG_INTERVAL = 10.0         # seconds between two log lines about refused connections
FD_RESERVE = 64                     # descriptors kept free for Redis, providers, deployed files
FAREWELL_TIMEOUT = 1.0              # seconds an evicted connection's last words may take to send
ONE_SEND_BYTES = 65536              # a response body up to this is sent with its head (one copy, one send)
_poll = get_original('select', 'poll')      # the real one: a look that must not yield to other greenlets


class Limits:
    """The counters shared by every connection of one server."""

    def __init__(self, idle_timeout: float, max_connections: int) -> None:
        self.idle_timeout = idle_timeout
        self.max_connections = max_connections
        self.open = 0
        self.refused = 0                # since the last log line about it
        self._refusal_logged_at = 0.0
        self.idle: OrderedDict = OrderedDict()      # handler → None, the longest idle first
        self.closing = False            # the server is shutting down: an idle connection closes at once

    def admit(self) -> bool:
        """Room for one more connection, evicting the longest-idle one at the limit."""
        if self.open >= self.max_connections:
            victim = next((h for h in self.idle if not h.has_pending_data()), None)
            if victim is None:
                return False
            del self.idle[victim]
            victim.evict()
        self.open += 1
        return True

    def close_idle(self) -> None:
        """On shutdown: close every idle taken-over connection now, and each one that becomes idle from now on.

        Idle keep-alive HTTP connections stay: a load balancer's kept-alive probe must still be told
        ``/ready`` 503 while the server drains.
        """
        self.closing = True
        for handler in [h for h in self.idle if h.taken]:
            self.idle.pop(handler, None)
            handler.evict()

    def log_refusal(self) -> None:
        # At most one line per REFUSAL_LOG_INTERVAL: a flood of connections must not flood the log.
        self.refused += 1
        now = time.monotonic()
        if now - self._refusal_logged_at >= REFUSAL_LOG_INTERVAL:
            logger.warning('Refused %d connection(s) with 503: all %d allowed connections are busy with requests',
                           self.refused, self.max_connections)
            self.refused, self._refusal_logged_at = 0, now


@dataclass(frozen=True)
class TakenOver:
    """A client connection a request took over: its socket, the bytes already read past the request head."""

    socket: socket.socket
    buffered: bytes
    set_idle: Callable[[bool], None]    # True while it waits for its client: evictable at the limit


def handler_class(limits: Limits) -> type:
    """A :class:`Handler` subclass bound to ``limits`` (pywsgi instantiates handlers itself)."""
    return type('BoundHandler', (Handler,), {'limits': limits})


class Handler(WSGIHandler):
    """pywsgi's handler with timeouts, a connection limit and stricter request heads."""

    limits: Limits
    _taken = False
    _farewell = b''

    def handle(self) -> None:
        limits = self.limits
        if not limits.admit():
            limits.log_refusal()
            _refuse(self.socket)
            return
        self.socket.settimeout(limits.idle_timeout)
        try:
            super().handle()
        finally:
            limits.open -= 1
            limits.idle.pop(self, None)

    def handle_one_request(self):
        # Waiting for a request head: bounded as a whole, and evictable while nothing arrived.
        self._head_timer = timer = gevent.Timeout.start_new(self.limits.idle_timeout)
        self.limits.idle[self] = None
        try:
            return super().handle_one_request()
        except gevent.Timeout as e:
            if e is not timer:
                raise
            return None         # closes the connection
        finally:
            timer.cancel()
            self.limits.idle.pop(self, None)

    def read_request(self, raw_requestline: str) -> bool:
        self.limits.idle.pop(self, None)        # a request line arrived: no longer idle
        try:
            return super().read_request(raw_requestline)
        finally:
            self._head_timer.cancel()       # the head is in; from here the per-operation timeout applies

    def log_request(self) -> None:
        # pywsgi formats an access line (a datetime, a %-format) for its ``log``, which the server
        # makes None: the line would be dropped. The app logs each request itself (llmconn.wsgi).
        pass

    def MessageClass(self, fp, *args):      # noqa: N802 (pywsgi's name): parses the headers
        headers = read_headers(fp)
        # Checked here, before pywsgi quietly drops Content-Length in favour of chunked.
        lengths = headers.get_all('content-length') or []
        if len(lengths) > 1:
            raise ValueError(f'{len(lengths)} Content-Length headers; send exactly one')
        if lengths and headers.get('transfer-encoding'):
            raise ValueError('both Content-Length and Transfer-Encoding; send one of them')
        return headers

    def _headers(self) -> list[tuple[str, str]]:
        # pywsgi's formats each parsed header as a "Name: value" line and splits it again; the head's
        # lines are pairs already (read_headers refuses folded lines, the one thing its loop joined).
        out = []
        for name, value in self.headers._headers:
            if '_' in name:         # as pywsgi: a name with an underscore could pose as another's variable
                continue
            key = name.replace('-', '_').upper()
            if key not in ('CONTENT_TYPE', 'CONTENT_LENGTH'):
                out.append(('HTTP_' + key, value.strip()))
        return out

    def get_environ(self) -> dict:
        environ = super().get_environ()
        environ[BODY_TIMEOUT_KEY] = self.limits.idle_timeout
        environ[TAKEOVER_KEY] = self._take_over
        return environ

    @property
    def taken(self) -> bool:
        """Whether a request took the connection over for its own protocol."""
        return self._taken

    def _take_over(self, farewell: bytes = b'') -> TakenOver:
        """``farewell``: what the request's protocol says before an eviction closes the connection."""
        self._taken = True
        self._farewell = farewell
        self.close_connection = True        # whatever the request's protocol leaves, HTTP cannot follow
        sock = self.socket
        sock.settimeout(0.0)                # only what the head's reads buffered already, never a wait
        try:
            buffered = self.rfile.read1(MAX_HEADER_LINE) or b''
        except (BlockingIOError, OSError):
            buffered = b''
        sock.settimeout(self.limits.idle_timeout)
        return TakenOver(sock, buffered, self._set_idle)

    def _set_idle(self, idle: bool) -> None:
        if not idle:
            self.limits.idle.pop(self, None)
        elif self.limits.closing:
            self.evict()
        else:
            self.limits.idle[self] = None

    def process_result(self) -> None:
        if not self._taken:
            return super().process_result()
        for _ in self.result:       # the body runs the protocol and writes to the socket itself
            pass
        return None

    def finalize_headers(self) -> None:
        if self.provided_date is None:      # pywsgi formats the date anew for every response
            self.response_headers.append((b'Date', _http_date()))
            self.provided_date = True
        super().finalize_headers()

    def _write_with_headers(self, data: bytes) -> None:
        # pywsgi sends the head, then the body's first part: two syscalls and two TCP segments for
        # every response. A small body of a declared length (never chunked) goes with its head.
        if not data or len(data) > ONE_SEND_BYTES or self.provided_content_length is None:
            return super()._write_with_headers(data)
        self.headers_sent = True
        self.finalize_headers()
        head = bytearray(b'HTTP/1.1 ')
        head += self.status
        head += b'\r\n'
        for header, value in self.response_headers:
            head += header
            head += b': '
            head += value
            head += b'\r\n'
        head += b'\r\n'
        head += data
        self._sendall(head)
        return None

    def has_pending_data(self) -> bool:
        """Whether bytes arrived that the handler has not read yet: a request on its way, not idle."""
        try:
            poller = _poll()        # a real, non-blocking look (gevent's would yield); poll has no fd limit
            poller.register(self.socket.fileno(), select.POLLIN)
            return bool(poller.poll(0))
        except (OSError, ValueError, AttributeError):
            return False

    def evict(self) -> None:
        """Make room: the blocked read of the next request line (or message) sees the end of the connection."""
        try:
            if self._farewell:
                self.socket.settimeout(FAREWELL_TIMEOUT)
                self.socket.sendall(self._farewell)
        except OSError:
            pass
        try:
            self.socket.shutdown(socket.SHUT_RDWR)
        except (OSError, AttributeError):       # already gone
            pass


_date: tuple = (0, b'')      # (second, its HTTP date): a response's Date changes once a second


def _http_date() -> bytes:
    """Now as an HTTP ``Date`` (pywsgi's format), made once a second."""
    global _date
    second = int(time.time())
    if _date[0] != second:
        _date = (second, format_date_time(second))
    return _date[1]


def _refuse(sock) -> None:
    body = json.dumps({'error': 'the server has too many open connections; try again shortly'}).encode()
    head = (f'HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {len(body)}'
            f'\r\nRetry-After: 1\r\nConnection: close\r\n\r\n').encode()
    try:
        sock.settimeout(1.0)
        sock.sendall(head + body)
    except OSError:
        pass
    finally:
        sock.close()


def default_max_connections(wanted: int) -> int:
    """``wanted`` (the server's default), or fewer when the process's descriptor limit is lower."""
    try:
        import resource
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, ValueError, OSError):
        return wanted
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, soft - FD_RESERVE))


MAX_HEADERS = 100               # as http.client allows
MAX_HEADER_LINE = 65536         # bytes, as http.client allows
# A name that is an RFC 9110 token, its colon, the value (latin-1 text: a byte each)
_HEADER_LINE = re.compile(r"([!#$%&'*+\-.^_`|~0-9A-Za-z]+):(.*)", re.S)


class RequestHead(OldMessage):
    """A request head as pywsgi reads it: the parsed ``(name, value)`` lines, looked up by lower-case name.

    The ``email`` package's lookups walk every line and run each value through its policy (a check
    for surrogates, which latin-1 text never has), for each of the dozen lookups pywsgi makes.
    """

    def __init__(self, headers: list[tuple[str, str]]) -> None:
        super().__init__()
        self._headers = headers     # what email's parser would have filled, without its feed parser
        self._index()

    def _index(self) -> None:
        self._first: dict[str, str] = {}
        for name, value in self._headers:
            self._first.setdefault(name.lower(), value)

    def get(self, name: str, failobj=None):
        return self._first.get(name.lower(), failobj)

    def get_all(self, name: str, failobj=None):
        name = name.lower()
        return [value for key, value in self._headers if key.lower() == name] or failobj

    def __setitem__(self, name: str, value: str) -> None:
        super().__setitem__(name, value)
        self._index()

    def __delitem__(self, name: str) -> None:     # pywsgi drops Content-Length of a chunked request
        super().__delitem__(name)
        self._index()


def read_headers(fp) -> RequestHead:
    """A request's header lines, up to the blank line, as the message pywsgi reads them from.

    ``http.client.parse_headers`` runs each head through the ``email``
    package's feed parser, about a tenth of the CPU of a gateway request; a
    request head is only ``Name: value`` lines, so they are split here. What
    RFC 9112 lets a server refuse is refused (ValueError, a 400): a line
    without a colon or with a name that is not a token, an obsolete folded
    line, more than 100 headers, a line over 64 KiB.
    """
    headers: list[tuple[str, str]] = []
    while True:
        line = fp.readline(MAX_HEADER_LINE + 1)
        if len(line) > MAX_HEADER_LINE:
            raise ValueError('a header line is longer than 65536 bytes; send shorter headers')
        if line in (b'\r\n', b'\n', b''):
            break
        matched = _HEADER_LINE.match(line.decode('latin-1'))
        if matched is None:
            if line[:1] in (b' ', b'\t'):
                raise ValueError('a folded header line (one that starts with a space); send each header on '
                                 'one line')
            raise ValueError('a malformed header line; send "Name: value" lines')
        name, value = matched.groups()
        headers.append((name, value.strip(' \t\r\n')))
        if len(headers) > MAX_HEADERS:
            raise ValueError(f'more than {MAX_HEADERS} headers; send fewer')
    return RequestHead(headers)


# A body read only in part leaves the connection mid-message: whatever follows would be parsed as
# the next request (a smuggled one), so every refusal here closes the connection.
_CLOSE = [('Connection', 'close')]


def read_body(environ: dict) -> bytes:
    """The request body; a body that ends early or stalls is the client's fault (400/408), not a 500."""
    deadline = Timeout(environ.get(BODY_TIMEOUT_KEY))     # None: unbounded (not under llmconn serve)
    deadline.start()
    try:
        return _read_body(environ)
    except Timeout as e:
        if e is not deadline:
            raise
        raise HTTPFailure(408, 'the request body did not arrive in time; send it whole', _CLOSE) from None
    except TimeoutError:
        raise HTTPFailure(408, 'the request body did not arrive in time; send it whole', _CLOSE) from None
    except (OSError, ValueError) as e:      # gevent: "unexpected end of file", a bad or missing chunk size
        logger.info('Incomplete request body: %s', e)
        raise HTTPFailure(400, 'the request body ended before its declared length, or its chunks are '
                               'malformed; send the whole body', _CLOSE) from None
    finally:
        deadline.cancel()


def _read_body(environ: dict) -> bytes:
    stream = environ['wsgi.input']
    if not environ.get('CONTENT_LENGTH') and environ.get('HTTP_TRANSFER_ENCODING', '').lower() == 'chunked':
        raw = stream.read(MAX_BODY_BYTES + 1)
        if len(raw) > MAX_BODY_BYTES:
            raise HTTPFailure(413, f'the request body is larger than the limit of {MAX_BODY_BYTES} bytes', _CLOSE)
        return raw
    try:
        length = int(environ.get('CONTENT_LENGTH') or 0)
    except ValueError:
        raise HTTPFailure(400, 'the Content-Length header is not a number', _CLOSE) from None
    if length > MAX_BODY_BYTES:
        raise HTTPFailure(413, f'the request body has {length} bytes, more than the limit of {MAX_BODY_BYTES}',
                          _CLOSE)
    return stream.read(length) if length else b''
