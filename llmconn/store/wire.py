"""The hot path to Redis: one command on a pooled connection, and little else.

A chat call's budget beyond its two round trips is a few tens of
microseconds. redis-py's ``Redis.execute_command`` costs about 40 µs more
than the round trip itself (metrics hooks, retry closures, a readiness
poll on every checkout), so the two chat scripts and the waiter's BLPOP go
through :class:`Wire` instead: redis-py's own ``Connection`` objects (so
TLS, unix sockets, AUTH, SELECT and RESP parsing are redis-py's), kept in a
plain list. Every other command uses the ordinary ``redis.Redis`` client.

A connection that fails in any way mid-command is disconnected, so no reply
is ever read by the wrong caller. A *reused* connection failing with a
connection error (Redis restarted under it) is retried once on a fresh one;
a fresh connection failing means Redis is down, and that is reported at once.
"""

from __future__ import annotations

import threading
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

# Most connections open at once; a caller beyond that waits for one.
MAX_CONNECTIONS = 1000

# How long a caller waits for a free connection before giving up.
CONNECTION_WAIT = 5.0


class NoConnectionAvailable(RedisConnectionError):
    """Every connection was busy for ``CONNECTION_WAIT`` seconds."""


class Wire:
    """Runs commands on connections made like ``pool`` makes them, pooled in a list."""

    def __init__(self, pool: Any, *, max_connections: int = MAX_CONNECTIONS,
                 connection_wait: float = CONNECTION_WAIT) -> None:
        self._connection_class = pool.connection_class
        self._connection_kwargs = pool.connection_kwargs
        self._idle: list = []       # list.pop/append are atomic: no lock on the hot path
        self._slots = threading.BoundedSemaphore(max_connections)
        self._wait = connection_wait
        self._max_connections = max_connections

    def call(self, *args: Any) -> Any:
        """Send one command and return its parsed reply; redis exceptions pass through."""
        command = [pack(args)]     # send_packed_command takes a list of buffers
        if not self._slots.acquire(timeout=self._wait):
            raise NoConnectionAvailable(f'all {self._max_connections} Redis connections stayed busy for '
                                        f'{self._wait:g} s')
        try:
            try:
                conn = self._idle.pop()
            except IndexError:
                return self._on(self._new(), command)
            try:
                return self._on(conn, command)
            except RedisConnectionError:
                # A pooled socket the server closed (restart, idle timeout): once more, on a new one.
                return self._on(self._new(), command)
        finally:
            self._slots.release()

    def evalsha(self, script: Any, keys: tuple, args: tuple) -> Any:
        """Run a registered ``redis.commands.core.Script``, loading it when the server lost it."""
        try:
            return self.call('EVALSHA', script.sha, len(keys), *keys, *args)
        except NoScriptError:
            script.sha = self.call('SCRIPT', 'LOAD', script.script).decode('ascii')
            return self.call('EVALSHA', script.sha, len(keys), *keys, *args)

    def _on(self, conn: Any, command: list) -> Any:
        try:
            conn.send_packed_command(command)
            reply = conn.read_response()
        except ResponseError:
            # A clean error reply: the connection is in step and can be reused.
            self._idle.append(conn)
            raise
        except BaseException:
            # Timeout, broken socket, or a greenlet killed mid-read: never reuse half a reply.
            conn.disconnect()
            raise
        self._idle.append(conn)
        return reply

    def _new(self) -> Any:
        return self._connection_class(**self._connection_kwargs)

    def forget(self) -> None:
        """Drop the connections without closing them (a forked child shares the parent's sockets)."""
        self._idle = []
        self._slots = threading.BoundedSemaphore(self._max_connections)

    def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.disconnect()


def pack(args: tuple) -> bytes:
    """One command in RESP: what redis-py's packer makes of str, bytes, int and float, in a third of the time."""
    out = [b'*%d\r\n' % len(args)]
    for arg in args:
        kind = type(arg)
        if kind is str:
            arg = arg.encode('utf-8')
        elif kind is int:
            arg = b'%d' % arg
        elif kind is float:
            arg = repr(arg).encode('ascii')
        elif kind is not bytes:
            raise TypeError(f'cannot send a {kind.__name__} to Redis')
        out.append(b'$%d\r\n%s\r\n' % (len(arg), arg))
    return b''.join(out)
