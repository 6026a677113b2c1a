"""Deadlines that cut a provider call off however slowly the bytes trickle in.

A socket read timeout bounds each ``recv``, not a call: a server sending one
byte every 1.5 s never trips a 2 s read timeout and can hold a call (and its
chat lock) for as long as it likes. A :class:`Deadline` bounds the call
itself. While one is active (``with deadline.watching():`` around
the pool's ``urlopen``), the socket of every connection the pool hands out
(or opens) is recorded on it; when it expires, one shared watchdog shuts those
sockets down, which wakes
the blocked read at once (plain threads and gevent alike: ``shutdown`` is a
kernel-level event both see), and :attr:`Deadline.fired` tells the caller
that the broken read was the deadline, not the provider.

Failure timeline this guards against: t=0 request sent; t=1.5, 3.0, ... one
byte each; without a deadline the read never times out. With ``timeout: 2``
the watchdog shuts the socket at t=2, the read returns EOF, the transport
raises :class:`~llmconn.errors.LLMTimeout`, and the chat lock is released.

The socket itself is recorded, not the connection holding it: an answer with
``Connection: close`` (or a body that ends when the connection does) passes
the socket to the response, and ``http.client`` then forgets it on the
connection (``conn.sock`` is None while the body is still being read).

The watchdog is one daemon thread (a greenlet once gevent has patched
``threading``) sleeping until the earliest deadline; extending a deadline is
an attribute write, so a stream re-arming it for each event costs no lock.
"""

from __future__ import annotations

import contextlib
import contextvars
import heapq
import itertools
import os
import socket
import threading
import time as mod_time

from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

_current: contextvars.ContextVar['Deadline | None'] = contextvars.ContextVar('llmconn_deadline', default=None)
REBUILD_AFTER = 1024     # cancelled entries tolerated in the heap before it is compacted


class Deadline:
    """A point in time after which the sockets of one call are shut down."""

    __slots__ = ('when', 'key', 'done', 'fired', '_socks', '_lock')

    def __init__(self, when: float, lock=None) -> None:
        self.when = when          # monotonic time of expiry; may move
        self.key = when           # the earliest heap entry that represents this deadline
        self.done = False
        self.fired = False
        self._socks: list = []
        # Guards _socks and done against the watchdog; held for a few attribute writes, never across a
        # switch, so the deadlines of a process can share their watchdog's (one call makes one).
        self._lock = lock or threading.Lock()

    @classmethod
    def after(cls, seconds: float) -> 'Deadline':
        dog = _watchdog()
        deadline = cls(mod_time.monotonic() + seconds, dog.sockets_lock)
        dog.add(deadline)
        return deadline

    def remaining(self) -> float:
        return self.when - mod_time.monotonic()

    def move(self, when: float) -> None:
        """Expire at ``when`` instead (later is free; earlier re-queues the deadline)."""
        self.when = when
        if when < self.key and not self.done:
            _watchdog().add(self)

    @contextlib.contextmanager
    def watching(self):
        """Record on this deadline the socket of every pooled connection used inside the block."""
        token = _current.set(self)
        try:
            yield self
        finally:
            _current.reset(token)

    def adopt(self, sock) -> None:
        """Shut ``sock`` down if this deadline expires before it is cancelled."""
        with self._lock:
            if not self.done:
                self._socks.append(sock)

    def cancel(self) -> None:
        """Stop watching: after this returns, no socket of this call is shut down."""
        with self._lock:
            self.done = True
            self._socks.clear()

    def expire(self) -> None:
        with self._lock:
            if self.done:
                return
            self.done = self.fired = True
            socks, self._socks = self._socks, []
        for sock in socks:
            with contextlib.suppress(OSError):      # already closed: nothing left to wake
                sock.shutdown(socket.SHUT_RDWR)


class _Watchdog:
    """Sleeps until the earliest deadline, expires it, and goes back to sleep."""

    def __init__(self) -> None:
        self._heap: list = []
        self._order = itertools.count()
        # A plain lock under the condition: nothing takes it twice, and an RLock is Python code under gevent.
        self._wake = threading.Condition(threading.Lock())
        self.sockets_lock = threading.Lock()      # the deadlines' own (see Deadline._lock)
        self.pid = os.getpid()
        threading.Thread(target=self._run, name='llmconn-deadlines', daemon=True).start()

    def add(self, deadline: Deadline) -> None:
        with self._wake:
            deadline.key = deadline.when
            earliest = not self._heap or deadline.when < self._heap[0][0]
            heapq.heappush(self._heap, (deadline.when, next(self._order), deadline))
            if len(self._heap) > REBUILD_AFTER and len(self._heap) % REBUILD_AFTER == 0:
                self._heap = [e for e in self._heap if not e[2].done]
                heapq.heapify(self._heap)
            if earliest:
                self._wake.notify()

    def _run(self) -> None:
        with self._wake:
            while True:
                if not self._heap:
                    self._wake.wait()
                    continue
                key, _, deadline = self._heap[0]
                now = mod_time.monotonic()
                if key > now:
                    self._wake.wait(key - now)
                    continue
                heapq.heappop(self._heap)
                if deadline.done or deadline.key != key:
                    continue            # cancelled, or a stale entry of a deadline queued again earlier
                if deadline.when > now:
                    deadline.key = deadline.when
                    heapq.heappush(self._heap, (deadline.when, next(self._order), deadline))
                    continue
                deadline.expire()


_dog: _Watchdog | None = None
_dog_lock = threading.Lock()


def _forget_in_child() -> None:
    # A forked worker has no watchdog thread, and the lock may have been held mid-fork.
    global _dog, _dog_lock
    _dog, _dog_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)


def _watchdog() -> _Watchdog:
    """The process's watchdog, started on first use (and again in a forked child)."""
    global _dog
    dog = _dog
    if dog is None or dog.pid != os.getpid():
        with _dog_lock:
            if _dog is None or _dog.pid != os.getpid():
                _dog = _Watchdog()
            dog = _dog
    return dog


def _adopt(sock) -> None:
    deadline = _current.get()
    if deadline is not None and sock is not None:
        deadline.adopt(sock)


class _Watched:
    """Pool mixin: a kept-alive connection handed out while a deadline is active has its socket recorded."""

    def _get_conn(self, timeout=None):
        conn = super()._get_conn(timeout)
        _adopt(conn.sock)
        return conn


class _WatchedConnect:
    """Connection mixin: a socket opened while a deadline is active is recorded on it (proxy tunnel
    and TLS included: ``sock`` is the final socket once ``connect`` returns)."""

    def connect(self) -> None:
        super().connect()
        _adopt(self.sock)


class _OneSend:
    """Connection mixin: a request's head goes out with its body in one send.

    urllib3 sends the head (``endheaders``) and then the body: two syscalls and, with
    ``TCP_NODELAY``, two segments for every provider call. The head is held here until the
    body's send, which carries both; a request without a body sends its head as before.
    """

    _body_follows = False
    _holding = False
    _head: bytes | None = None

    def request(self, method, url, body=None, headers=None, **kw):
        self._body_follows = type(body) is bytes and len(body) > 0
        try:
            return super().request(method, url, body=body, headers=headers, **kw)
        finally:
            self._body_follows = False
            self._head = None

    def endheaders(self, message_body=None, *, encode_chunked=False):
        self._holding = self._body_follows      # the one send endheaders makes is the head
        try:
            return super().endheaders(message_body, encode_chunked=encode_chunked)
        finally:
            self._holding = False

    def send(self, data):
        if self._holding:
            self._head = data
            return
        head = self._head
        if head is not None:
            self._head = None
            data = head + data
        super().send(data)


class WatchedHTTPConnection(_WatchedConnect, _OneSend, HTTPConnection):
    pass


class WatchedHTTPSConnection(_WatchedConnect, _OneSend, HTTPSConnection):
    pass


class WatchedHTTPPool(_Watched, HTTPConnectionPool):
    ConnectionCls = WatchedHTTPConnection


class WatchedHTTPSPool(_Watched, HTTPSConnectionPool):
    ConnectionCls = WatchedHTTPSConnection


WATCHED_POOLS = {'http': WatchedHTTPPool, 'https': WatchedHTTPSPool}
