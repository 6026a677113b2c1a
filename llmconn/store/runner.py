"""How the chat store's commands reach Redis: one small protocol, one implementation per deployment.

A chat call needs three things from Redis, and the lock module asks for
nothing else: run a script (:meth:`Runner.script`), block on a list
(:meth:`Runner.block`), and run a script followed by ``WAIT`` in one
pipelined round trip (:meth:`Runner.script_and_wait`). Renewals pipeline
many scripts (:meth:`Runner.scripts`).

All of it is redis-py's own clients: ``redis.Redis`` for one node,
``Sentinel(...).master_for(...)`` for a Sentinel-managed master (its pool
finds the master again after a failover), ``redis.cluster.RedisCluster`` for
a cluster (slot routing, MOVED/ASK, topology refresh). Scripts are
redis-py ``Script`` objects, so a server that lost its script cache (a
promoted replica, a restart, a resharded slot) gets the script loaded again
(NOSCRIPT). Connection handling - health checks, fork safety, TLS, AUTH -
stays redis-py's.

Blocking waits run on a second client of the same kind whose socket timeout
outlasts the longest wait, so a waiter never re-issues its BLPOP early and
the hot path's connections are never tied up by waiters.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Protocol

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import MovedError, NoScriptError, RedisClusterException, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from llmconn.store.lock import BLOCK_CAP

# What the cluster's fast path gives up on, for redis-py's own path to handle.
_REDIS_ERRORS = (RedisError, RedisClusterException)

# A blocked waiter's socket outlasts its longest BLPOP by this much.
BLOCKING_SOCKET_MARGIN = 5.0


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
    the round trip itself. Here a script is sent on a connection checked out
    of the client's own pool, so redis-py's connection handling stays whole -
    the pool's fork check, its "connection has unread data" check on
    checkout, the connection's health check, its packer, AUTH, TLS, and for
    Sentinel the master lookup and the READONLY-after-failover reconnect.
    What it drops is redis-py's retry wrapper, replaced by the same policy:
    a connection error is retried once on a fresh connection (every store
    script is safe to send twice). ``make bench`` measures it side by side
    with :class:`RedisRunner`.
    """

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
        pool = self.client.connection_pool
        for attempt in (1, 2):
            conn = pool.get_connection()
            try:
                if not wait:
                    conn.send_command('EVALSHA', sha, len(keys), *keys, *args)
                    return conn.read_response()
                conn.send_packed_command(conn.pack_commands((('EVALSHA', sha, len(keys), *keys, *args),
                                                             ('WAIT', *wait))))
                return _two_replies(conn)
            except (RedisConnectionError, RedisTimeoutError):
                conn.disconnect()
                if attempt == 2:
                    raise
            except ResponseError:
                raise               # a clean error reply: the connection is in step
            except BaseException:
                conn.disconnect()   # a greenlet killed mid-read: never reuse half a reply
                raise
            finally:
                pool.release(conn)
        raise AssertionError('unreachable')


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


class ClusterRunner:
    """A Redis Cluster through ``RedisCluster``, made on first use (its constructor reads the topology)."""

    def __init__(self, make: Callable[[float | None], Any], sources: dict[str, str],
                 socket_timeout: float) -> None:
        self._make = make
        self._socket_timeout = socket_timeout
        self._sources = sources
        self._lock = threading.Lock()
        self._client: Any = None
        self._blocking: Any = None
        self._scripts: dict = {}

    @property
    def client(self) -> Any:
        if self._client is None:
            with self._lock:
                if self._client is None:
                    client = self._make(self._socket_timeout)
                    self._scripts = {name: client.register_script(src) for name, src in self._sources.items()}
                    self._client = client
        return self._client

    def _blocking_client(self) -> Any:
        if self._blocking is None:
            with self._lock:
                if self._blocking is None:
                    self._blocking = self._make(BLOCK_CAP + BLOCKING_SOCKET_MARGIN)
        return self._blocking

    def script(self, name: str, keys: tuple, args: tuple) -> Any:
        client = self.client
        script = self._scripts[name]
        try:
            return _on_slot_node(client, keys[0], ('EVALSHA', script.sha, len(keys), *keys, *args))[0]
        except _REDIS_ERRORS:
            # MOVED, ASK, NOSCRIPT, TRYAGAIN, CLUSTERDOWN, a dead node, a slot not covered:
            # redis-py's own path handles each (every store script is safe to send twice).
            return script(keys=keys, args=args, client=client)

    def scripts(self, name: str, calls: list) -> list:
        # A cluster pipeline refuses EVALSHA: one pipeline per node, on that node's own client.
        client = self.client
        by_node: dict[str, list[int]] = {}
        nodes = {}
        for i, (keys, _) in enumerate(calls):
            node = client.get_node_from_key(keys[0])
            nodes[node.name] = node
            by_node.setdefault(node.name, []).append(i)
        results: list = [None] * len(calls)
        for name_, indexes in by_node.items():
            try:
                replies = _pipelined(client.get_redis_connection(nodes[name_]), self._scripts[name],
                                     [calls[i] for i in indexes])
            except Exception as exc:     # this node's locks fail this time; the others are renewed
                replies = [exc] * len(indexes)
            for i, reply in zip(indexes, replies):
                results[i] = reply
        return results

    def script_and_wait(self, name: str, keys: tuple, args: tuple, replicas: int, timeout_ms: int) -> tuple:
        # WAIT has no key: it must go to the node that ran the script, so both go to the slot's master
        # on that node's own client. A moved slot or a dead node: refresh the topology, once more (the
        # save script is idempotent by token, so sending it twice stores it once).
        client = self.client
        script = self._scripts[name]
        try:
            return tuple(_on_slot_node(client, keys[0], ('EVALSHA', script.sha, len(keys), *keys, *args),
                                       ('WAIT', replicas, timeout_ms)))
        except _REDIS_ERRORS:
            pass            # as in script(): redis-py's path below, on the node's own client
        for attempt in (1, 2):
            node = client.get_redis_connection(client.get_node_from_key(keys[0]))
            try:
                return _script_and_wait(node, script, keys, args, replicas, timeout_ms)
            except (MovedError, RedisConnectionError):
                if attempt == 2:
                    raise
                client.nodes_manager.initialize()
        raise AssertionError('unreachable')

    def block(self, key: str, timeout: float) -> Any:
        return self._blocking_client().blpop([key], timeout)

    def close(self) -> None:
        for client in (self._client, self._blocking):
            if client is not None:
                client.close()


def _on_slot_node(client: Any, key: str, *commands: tuple) -> list:
    """Send ``commands`` in one write to the master of ``key``'s slot, on a connection of its pool.

    The cluster's fast path: ``RedisCluster.execute_command`` spends more CPU
    than the round trip on its generic routing (command parsing to find the
    keys, per-try bookkeeping, metrics), where a chat's scripts name their
    slot in their first key. The node and its pool are redis-py's own (the
    slot table it keeps current, the node's ``Redis`` with its fork check,
    health check, AUTH, TLS), so after a failover or a reshard this finds the
    new master as soon as redis-py knows it. It retries nothing: any error
    (an error reply such as MOVED, ASK or NOSCRIPT, a broken connection)
    is raised for the caller to send again through redis-py's path, which
    handles each. An error reply is raised only once every reply was read,
    so the connection goes back to the pool in step.
    """
    node = client.get_node_from_key(key)
    pool = (node.redis_connection or client.get_redis_connection(node)).connection_pool
    conn = pool.get_connection()
    try:
        if len(commands) == 1:
            conn.send_command(*commands[0])
        else:
            conn.send_packed_command(conn.pack_commands(commands))
        replies, error = [], None
        for _ in commands:
            try:
                replies.append(conn.read_response())
            except ResponseError as exc:
                error = error or exc
        if error is not None:
            raise error
        return replies
    except ResponseError:
        raise
    except BaseException:
        conn.disconnect()       # broken, or a greenlet killed mid-read: never reuse half a reply
        raise
    finally:
        pool.release(conn)


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


__all__ = ['ClusterRunner', 'RedisRunner', 'Runner', 'SentinelRunner']
