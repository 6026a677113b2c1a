"""Client connections of ``llmconn serve``: idle timeout, connection limit, strict request heads.

gevent's pywsgi handler waits for a client for ever: a client that opens a
connection and sends nothing (or one header byte a minute) holds a file
descriptor and a greenlet until it leaves, and a few hundred of them used
up a 256-fd limit so that ``/health`` stopped answering. :class:`Handler`
closes such connections:

- the request head (request line and headers) must arrive within
  ``idle_timeout`` seconds of the connection being ready for it: a fresh
  connection, or a keep-alive one after its last response;
- every later read of the body and write of the response is bounded by the
  same timeout per operation (a client that stops reading its response);
- at most ``max_connections`` are open: at the limit, a new connection
  closes the connection that has been idle (waiting for a request) the
  longest; when none is idle, it gets a ``503`` and is closed. So slow or
  idle clients cannot starve the others, and the server keeps descriptors
  for Redis and the providers.

The head is also checked where gevent is lenient: several ``Content-Length``
headers, or one with ``Transfer-Encoding``, are refused with ``400`` (a
request-smuggling vector behind proxies), without a traceback in the log.
"""

from __future__ import annotations

import json
import logging
import socket
from collections import OrderedDict

import gevent
from gevent.pywsgi import WSGIHandler

logger = logging.getLogger('llmconn.server')

from llmconn.server import DEFAULT_MAX_CONNECTIONS

FD_RESERVE = 64                     # descriptors kept free for Redis, providers, deployed files


class Limits:
    """The counters shared by every connection of one server."""

    def __init__(self, idle_timeout: float, max_connections: int) -> None:
        self.idle_timeout = idle_timeout
        self.max_connections = max_connections
        self.open = 0
        self.idle: OrderedDict = OrderedDict()      # handler → None, the longest idle first

    def admit(self) -> bool:
        """Room for one more connection, evicting the longest-idle one at the limit."""
        if self.open >= self.max_connections:
            if not self.idle:
                return False
            handler, _ = self.idle.popitem(last=False)
            handler.evict()
        self.open += 1
        return True


def handler_class(limits: Limits) -> type:
    """A :class:`Handler` subclass bound to ``limits`` (pywsgi instantiates handlers itself)."""
    return type('BoundHandler', (Handler,), {'limits': limits})


class Handler(WSGIHandler):
    """pywsgi's handler with timeouts, a connection limit and stricter request heads."""

    limits: Limits

    def handle(self) -> None:
        limits = self.limits
        if not limits.admit():
            _refuse(self.socket, limits.max_connections)
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

    def MessageClass(self, fp, *args):      # noqa: N802 (pywsgi's name): parses the headers
        # Checked here, before pywsgi quietly drops Content-Length in favour of chunked.
        headers = super().MessageClass(fp, *args)
        lengths = headers.get_all('content-length') or []
        if len(lengths) > 1:
            raise ValueError(f'{len(lengths)} Content-Length headers; send exactly one')
        if lengths and headers.get('transfer-encoding'):
            raise ValueError('both Content-Length and Transfer-Encoding; send one of them')
        return headers

    def evict(self) -> None:
        """Make room: the blocked read of the next request line sees the end of the connection."""
        try:
            self.socket.shutdown(socket.SHUT_RDWR)
        except (OSError, AttributeError):       # already gone
            pass


def _refuse(sock, limit: int) -> None:
    body = json.dumps({'error': 'the server has too many open connections; try again shortly'}).encode()
    head = (f'HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {len(body)}'
            f'\r\nRetry-After: 1\r\nConnection: close\r\n\r\n').encode()
    logger.warning('Refused a connection: all %d allowed connections are busy with requests', limit)
    try:
        sock.settimeout(1.0)
        sock.sendall(head + body)
    except OSError:
        pass
    finally:
        sock.close()


def default_max_connections() -> int:
    """:data:`DEFAULT_MAX_CONNECTIONS`, or fewer when the process's descriptor limit is lower."""
    try:
        import resource
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, ValueError, OSError):
        return DEFAULT_MAX_CONNECTIONS
    if soft == resource.RLIM_INFINITY:
        return DEFAULT_MAX_CONNECTIONS
    return max(1, min(DEFAULT_MAX_CONNECTIONS, soft - FD_RESERVE))
