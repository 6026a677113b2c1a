"""The chat store's runner for a Redis Cluster: redis-py's ``RedisCluster``, with a fast path per slot.

A chat's scripts name their slot in their first key, so they are sent
straight to that slot's master, on a connection of that node's own redis-py
pool (:func:`_on_slot_node`). Anything else than a clean reply - MOVED,
ASK, NOSCRIPT, TRYAGAIN, CLUSTERDOWN, a dead node - sends the call again
through ``RedisCluster``'s generic routing, which handles each (and keeps
its slot table current). Every store script is safe to send twice: a
re-sent ACQUIRE finds its own token, a re-sent FINISH its saved token.
``make bench`` measures it against PINGs on the same client and against
one node.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import MovedError, RedisClusterException, RedisError, ResponseError

from llmconn.store.lock import BLOCK_CAP
from llmconn.store.runner import BLOCKING_SOCKET_MARGIN, _pipelined, _script_and_wait, packed

# What the fast path gives up on, for redis-py's own path to handle.
_REDIS_ERRORS = (RedisError, RedisClusterException)


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
        conn.send_packed_command(packed(conn, *commands))
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


__all__ = ['ClusterRunner']
