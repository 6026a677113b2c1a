"""How the chat store's commands reach Redis: one small protocol, one implementation per deployment.

A chat call needs three things from Redis, and the lock module asks for
nothing else: run a script (:meth:`Runner.script`), block on a list
(:meth:`Runner.block`), and run a script followed by ``WAIT`` in one
pipelined round trip (:meth:`Runner.script_and_wait`). Renewals pipeline
many scripts (:meth:`Runner.scripts`).

All of it is redis-py's own clients: ``redis.Redis`` for one node,
``Sentinel(...).master_for(...)`` for a Sentinel-managed master (its pool
finds the master again after a failover), ``redis.cluster.RedisCluster`` for
a cluster (slot routing, MOVED/ASK, topology refresh; its runner is in
:mod:`llmconn.store.cluster`). Scripts are
redis-py ``Script`` objects, so a server that lost its script cache (a
promoted replica, a restart, a resharded slot) gets the script loaded again
(NOSCRIPT). Connection handling - health checks, fork safety, TLS, AUTH -
stays redis-py's.

Blocking waits run on a second client of the same kind whose socket timeout
outlasts the longest wait, so a waiter never re-issues its BLPOP early and
the hot path's connections are never tied up by waiters.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from typing import Any, Callable, Protocol

from gevent.monkey import get_original
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from llmconn.store.lock import BLOCK_CAP

# The real select: a look at an idle socket must not yield to other greenlets.
_select = get_original('select', 'select')

# A blocked waiter's socket outlasts its longest BLPOP by this much.
BLOCKING_SOCKET_MARGIN = 5.0

# A pooled connection idle longer than this (s) is looked at before it is sent on (a
# zero-timeout select); one back on the free list for less is a busy store's, sent on at once.
IDLE_CHECK_AFTER = 1.0

_monotonic = time.monotonic


class Runner(Protocol):
    """What the chat store needs from a Redis deployment."""

    client: Any         # the redis-py client, for everything off the hot path

    def script(self, name: str, keys: tuple, args: tuple) -> Any:
        """Run one of the store's scripts by name; NOSCRIPT reloads it."""

    def scripts(self, name: str, calls: list[tuple[tuple, tuple]]) -> list:
        """Run a script once per (keys, args) in pipelined round trips; results or exceptions, in order."""

    def script_and_wait(self, name: str, keys: tuple, args: tuple, replicas: int, timeout_ms: int) -> tuple:
        """Run a script, then ``WAIT replicas timeout_ms`` on the same node, in one round trip: (result, acks)."""

    def block(self, key: str, timeout: float) -> Any:
        """BLPOP one key for at most ``timeout`` s."""

    def close(self) -> None:
        """Drop every connection."""


class RedisRunner:
    """One Redis node, or a Sentinel-managed master: both are a ``redis.Redis`` with its own pool."""

    def __init__(self, make: Callable[[float | None], Any], sources: dict[str, str],
                 socket_timeout: float) -> None:
        self.client = make(socket_timeout)
        self._blocking = make(BLOCK_CAP + BLOCKING_SOCKET_MARGIN)
        self._scripts = {name: self.client.register_script(src) for name, src in sources.items()}

    def script(self, name: str, keys: tuple, args: tuple) -> Any:
        return self._scripts[name](keys=keys, args=args)

    def scripts(self, name: str, calls: list) -> list:
        return _pipelined(self.client, self._scripts[name], calls)

    def script_and_wait(self, name: str, keys: tuple, args: tuple, replicas: int, timeout_ms: int) -> tuple:
        return _script_and_wait(self.client, self._scripts[name], keys, args, replicas, timeout_ms)

    def block(self, key: str, timeout: float) -> Any:
        return self._blocking.blpop([key], timeout)

    def close(self) -> None:
        for client in (self.client, self._blocking):
            client.connection_pool.disconnect()


class PooledRunner(RedisRunner):
    """:class:`RedisRunner` whose two hot-path scripts skip ``Redis.execute_command``, not the pool.

    ``execute_command`` costs about 40 µs of CPU per command beyond the round
    trip (retry closures, observability hooks, reply callbacks): as much as
    the round trip itself. Here a script is sent on a redis-py connection of
    the client's own pool, so redis-py's connection handling stays whole -
    the connection's health check, its packer, AUTH, TLS, and for Sentinel
    the master lookup and the READONLY-after-failover reconnect. What it
    drops is redis-py's retry wrapper, replaced by the same policy: a
    connection error is retried once on a fresh connection (every store
    script is safe to send twice).

    The runner also keeps the connections it checked out
    (:class:`HeldConnections`) instead of handing each back to the pool
    after every script. ``make bench`` measures
    the runner side by side with :class:`RedisRunner`.
    """

    def __init__(self, make: Callable[[float | None], Any], sources: dict[str, str],
                 socket_timeout: float) -> None:
        super().__init__(make, sources, socket_timeout)
        self._held = HeldConnections(self.client)

    def script(self, name: str, keys: tuple, args: tuple) -> Any:
        script = self._scripts[name]
        try:
            return self._send(script.sha, keys, args)
        except NoScriptError:
            script.sha = self.client.script_load(script.script)
            return self._send(script.sha, keys, args)

    def script_and_wait(self, name: str, keys: tuple, args: tuple, replicas: int, timeout_ms: int) -> tuple:
        # EVALSHA and WAIT packed into one send on one pooled connection: redis-py's pipeline object
        # cost more than the WAIT itself. NOSCRIPT: nothing ran (WAIT alone did), load and send both again.
        script = self._scripts[name]
        try:
            return self._send(script.sha, keys, args, wait=(replicas, timeout_ms))
        except NoScriptError:
            script.sha = self.client.script_load(script.script)
            return self._send(script.sha, keys, args, wait=(replicas, timeout_ms))

    def _send(self, sha: str, keys: tuple, args: tuple, wait: tuple = ()) -> Any:
        """EVALSHA (then ``WAIT *wait`` in the same send): its reply, or (reply, acks)."""
        evalsha = ('EVALSHA', sha, len(keys), *keys, *args)
        if not wait:
            return self._held.exchange((evalsha,), _one_reply)
        return self._held.exchange((evalsha, ('WAIT', *wait)), _two_replies)

    def close(self) -> None:
        self._held.close()
        self.client.connection_pool.disconnect(inuse_connections=False)
        self._blocking.connection_pool.disconnect()


class HeldConnections:
    """Connections of a redis-py client's pool, checked out once and kept in step for the hot path's sends.

    The pool's checkout and release, with their lock, events and
    connection-count metrics, cost a call more than its commands' own
    packing; so a connection once lent stays out of the pool, on a free list
    (as many as calls ran at once). What that checkout checked is kept here:
    a connection goes back on the list only in step (its whole reply read,
    :meth:`keep`); a broken one is handed back to the pool (:meth:`drop`),
    and so is one the server closed while it sat on the list for more than
    ``IDLE_CHECK_AFTER`` (a zero-timeout select, where redis-py's
    ``can_read`` costs five times more): whatever is not the fast path is
    the pool's own checkout (for Sentinel, its master lookup). A connection
    back on the list for less is sent on without that system call; if the
    server closed it meanwhile (a restart), the send fails with nothing run,
    every connection that came back before that failure (as old as it) is
    handed back when it is next popped (:meth:`broken`), and the caller's one
    retry goes out on a fresh one. A pool that makes a thread wait for a
    connection (a blocking pool at its size) gets back the next one a thread
    is done with, so a burst beyond the pool's size queues rather than
    starves. Each connection is one thread's at a
    time: it is popped from the list (atomic, no lock) or lent by the pool,
    and no other thread disconnects it - :meth:`close` drops only those that
    nobody is using. A forked child starts with an empty list (the pool
    starts over there too), emptied by a fork hook rather than a
    ``getpid()`` per send.
    """

    def __init__(self, client: Any) -> None:
        self._pool = client.connection_pool
        self._free: list = []           # (connection, when it came back): held out of the pool, in step
        self._stale_before = 0.0        # one back on the list before this (a connection error) is handed back
        self._waiting = 0               # threads asking the pool for a connection now
        self._lock = threading.Lock()
        _held.add(self)

    def take(self) -> Any:
        """A connection to send on: the newest kept one still good, else the pool's."""
        conn = self._kept()
        if conn is not None:
            return conn
        # The pool may make this thread wait (a blocking pool at its size): one coming back is then
        # handed to the pool rather than kept (see keep), and the list is looked at once more after
        # saying so, in case it was kept just before.
        with self._lock:
            self._waiting += 1
        try:
            conn = self._kept()
            return conn if conn is not None else self._pool.get_connection()
        finally:
            with self._lock:
                self._waiting -= 1

    def exchange(self, commands: tuple, read: Callable[[Any], Any]) -> Any:
        """``commands`` in one send on a kept connection, and what ``read(conn)`` makes of the replies.

        A broken connection is retried once on a fresh one (what is sent here is safe to send
        twice); an error reply ``read`` raises leaves the connection in step, kept; anything else
        (a greenlet killed mid-read) drops it, as half a reply must never be read by the next call.
        """
        for attempt in (1, 2):
            conn = self.take()
            try:
                conn.send_packed_command(packed(conn, *commands))
                result = read(conn)
            except (RedisConnectionError, RedisTimeoutError) as exc:
                self.broken(conn, exc)
                if attempt == 2:
                    raise
                continue
            except ResponseError:
                self.keep(conn)
                raise
            except BaseException:
                self.drop(conn)
                raise
            self.keep(conn)
            return result
        raise AssertionError('unreachable')

    def _kept(self) -> Any:
        free = self._free
        while True:
            try:
                conn, since = free.pop()        # atomic: two threads never get the same connection
            except IndexError:
                return None
            if since > self._stale_before:
                if _monotonic() - since < IDLE_CHECK_AFTER:
                    return conn
                sock = conn._sock
                try:
                    # Readable while idle: the server closed it (a restart, a Sentinel failover's role
                    # change, an idle timeout) or sent what nobody asked for.
                    stale = sock is None or bool(_select([sock], [], [], 0)[0])
                except (OSError, ValueError):
                    stale = True
                if not stale:
                    return conn
            self.drop(conn)

    def keep(self, conn: Any) -> None:
        """``conn`` is in step (every reply it was sent read): back on the free list, or to the pool
        when a thread waits there for one."""
        if self._waiting:
            self._pool.release(conn)
        else:
            self._free.append((conn, _monotonic()))

    def broken(self, conn: Any, exc: Exception) -> None:
        """``conn`` failed with ``exc``; a connection error makes every older kept connection suspect."""
        self.drop(conn)
        if isinstance(exc, RedisConnectionError):
            # The others went stale with it. Each is handed back by the thread that pops it:
            # other threads may be popping from the list now, so it is not emptied here.
            self._stale_before = _monotonic()

    def drop(self, conn: Any) -> None:
        """Hand a connection back to the pool disconnected, which reconnects it (for Sentinel: to the
        master it finds now) when it lends it again."""
        conn.disconnect()
        self._pool.release(conn)

    def close(self) -> None:
        """Disconnect the kept connections; one in use comes back to a closed list, which drops it.

        Only what no thread is using is disconnected: a call in flight reads its reply whole (a
        socket closed under its read would fail it inside redis-py), then its connection comes back
        to a closed list, which hands it back to the pool disconnected.
        """
        free, self._free = self._free, _ClosedList(self)
        while True:
            try:
                conn, _ = free.pop()
            except IndexError:
                break
            self.drop(conn)


class _ClosedList(list):
    """A closed free list: whatever comes back to it is handed back to the pool, disconnected."""

    def __init__(self, held: HeldConnections) -> None:
        super().__init__()
        self._held = held

    def append(self, item: tuple) -> None:
        self._held.drop(item[0])


# An argument at least this long is packed without the copy that formatting it would make.
BIG_ARGUMENT = 64 * 1024

# Free lists of this process, so a forked child starts with empty ones: its parent's sockets
# are not its own (and a getpid() per send, the other way to tell, is a system call each).
_held: 'weakref.WeakSet[HeldConnections]' = weakref.WeakSet()


def _forget_parent_connections() -> None:
    for held in list(_held):
        held._free = []


os.register_at_fork(after_in_child=_forget_parent_connections)


def packed(conn: Any, *commands: tuple) -> list[bytes]:
    """``commands`` in RESP, as ``conn.pack_commands`` makes them, for one send on ``conn``.

    The hot path's arguments are str, bytes and int; redis-py's packer runs
    its encoder's type dispatch for each (13 arguments a script call, about
    10 µs), this a ``type() is`` test. Any other type goes through the
    connection's own encoder, so what is sent is byte for byte redis-py's
    (utf-8, strict: the store's clients keep redis-py's default encoding).
    """
    encode = conn.encoder.encode
    parts = []
    for command in commands:
        parts.append(b'*%d\r\n' % len(command))
        for arg in command:
            kind = type(arg)
            if kind is str:
                arg = arg.encode()
            elif kind is int:
                arg = b'%d' % arg
            elif kind is not bytes:
                arg = encode(arg)       # float, memoryview, ...; a bool is refused there, as redis-py does
            if len(arg) < BIG_ARGUMENT:
                parts.append(b'$%d\r\n%b\r\n' % (len(arg), arg))    # one piece: half the packing of three
            else:
                parts += (b'$%d\r\n' % len(arg), arg, b'\r\n')      # an attachment's bytes: copied once, by join
    return [b''.join(parts)]


def _one_reply(conn: Any) -> Any:
    return conn.read_response()


def _two_replies(conn: Any) -> tuple:
    """Both replies of a two-command send; an error reply of the first is raised once the second is read."""
    try:
        first = conn.read_response()
    except ResponseError as exc:
        conn.read_response()        # WAIT's reply: the connection stays in step
        raise exc
    return first, conn.read_response()


class SentinelRunner(PooledRunner):
    """A master found through Sentinel; after a failover its pool asks the sentinels again.

    redis-py's ``SentinelManagedConnection`` turns a READONLY reply (the old
    master, now a replica) into a connection error, so the one retry lands
    on the new master. Everything else is :class:`PooledRunner`'s.
    """


def _pipelined(client: Any, script: Any, calls: list) -> list:
    """EVALSHA each call in one pipeline; calls that met NOSCRIPT run again one by one (loading it)."""
    pipe = client.pipeline(transaction=False)
    for keys, args in calls:
        pipe.evalsha(script.sha, len(keys), *keys, *args)
    results = pipe.execute(raise_on_error=False)
    for i, result in enumerate(results):
        if isinstance(result, NoScriptError):
            keys, args = calls[i]
            try:
                results[i] = script(keys=keys, args=args, client=client)
            except Exception as exc:     # reported per call, like the pipeline's own errors
                results[i] = exc
    return results


def _script_and_wait(client: Any, script: Any, keys: tuple, args: tuple, replicas: int, timeout_ms: int) -> tuple:
    """EVALSHA + WAIT pipelined on one node's client. NOSCRIPT: load, and both once more (nothing ran)."""
    for attempt in (1, 2):
        pipe = client.pipeline(transaction=False)
        pipe.evalsha(script.sha, len(keys), *keys, *args)
        pipe.execute_command('WAIT', replicas, timeout_ms)
        result, acks = pipe.execute(raise_on_error=False)
        if isinstance(result, NoScriptError) and attempt == 1:
            script.sha = client.script_load(script.script)
            continue
        for reply in (result, acks):
            if isinstance(reply, Exception):
                raise reply
        return result, acks
    raise AssertionError('unreachable')


__all__ = ['HeldConnections', 'packed', 'PooledRunner', 'RedisRunner', 'Runner', 'SentinelRunner']
