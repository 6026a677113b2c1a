"""The gateway's records in the registry's Redis: responses by tenant and id, and small values beside them.

One JSON record per response, keyed by tenant and gateway response id
(``resp_`` + 48 random hex digits), expiring with the response::

    llmconn:gw:resp:{<response id>}:<tenant digest>     JSON record, EX response_expiry

What a record holds (store mode, ids, times, status, usage, and text only
under standard retention) is the gateway's business
(:mod:`llmconn.gateway.response_record`); this module writes and reads it whole
(``SET``, ``GET``, ``DEL``). A record of another tenant lives under another
key, so looking it up with the wrong tenant finds nothing, as if absent. A
response's record is written by the one request that made it, so there is
no read-modify-write to race. The gateway's other values (the tool-call
registry, the sealing secret, the chains DELETE follows) go through
:meth:`RecordStore.put`, :meth:`RecordStore.put_new`, :meth:`RecordStore.value`,
:meth:`RecordStore.replace` and the set calls.

Usage is not kept here: gateway calls count in the one usage ledger
(:mod:`llmconn.usage`) under their gateway key. ``redis`` exceptions become
:class:`~llmconn.errors.StoreError` here.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from enum import Enum
from typing import TYPE_CHECKING, Any, Callable

import redis
from redis.exceptions import RedisClusterException, RedisError, ResponseError

from llmconn import jsontext
from llmconn.errors import StoreError
from llmconn.store.runner import HeldConnections

if TYPE_CHECKING:
    from llmconn.store.history import ChatStore

RESPONSE_ID_PREFIX = 'resp_'


class StoreMode(str, Enum):
    """Who keeps a response's state, as its record says (``store_mode``).

    ``provider``: the backend keeps it (a Responses API with its own state);
    ``gateway``: the record keeps the canonical items to replay; ``none``:
    nothing can be continued (``store: false``, or zero retention).
    """

    PROVIDER = 'provider'
    GATEWAY = 'gateway'
    NONE = 'none'

    def __str__(self) -> str:       # the value in logs, f-strings and JSON, as enum.StrEnum (3.11+) would
        return self.value

    __format__ = str.__format__

_RESPONSE_ID = re.compile(r'^resp_[0-9a-f]{48}$')
MAX_CONNECTIONS = 100               # the records' connections to Redis, per gateway process
CONNECTION_WAIT = 5.0               # how long a request waits for one of them before a 503
ANSWERED_FRESH = 0.25               # s: Redis answered the records' connections this lately: no need to ask


def new_response_id() -> str:
    return RESPONSE_ID_PREFIX + secrets.token_hex(24)


def valid_response_id(response_id: Any) -> bool:
    return isinstance(response_id, str) and bool(_RESPONSE_ID.match(response_id))


def tenant_digest(tenant: str) -> str:
    return hashlib.sha256(tenant.encode('utf-8')).hexdigest()[:32]


def response_key(tenant: str, response_id: str) -> str:
    return f'llmconn:gw:resp:{{{response_id}}}:{tenant_digest(tenant)}'


def burst_client(store: 'ChatStore') -> Any:
    """A client of the store's Redis whose pool makes a burst of requests wait for a connection.

    redis-py's plain pool raises ``MaxConnectionsError`` once its connections are all in use, so
    500 concurrent gateway requests would fail where they should queue for a moment. For a plain
    pool the records get a blocking twin (same server and settings); any other client (the embedded
    ``memory://`` store, Cluster, Sentinel) is used as it is.
    """
    client = store.client
    pool = getattr(client, 'connection_pool', None)
    # redis-py's own connection classes only: the embedded store's fakeredis pool is a plain pool too.
    if type(pool) is not redis.ConnectionPool or not pool.connection_class.__module__.startswith('redis.'):
        return client
    twin = redis.BlockingConnectionPool(connection_class=pool.connection_class, max_connections=MAX_CONNECTIONS,
                                        timeout=CONNECTION_WAIT, **pool.connection_kwargs)
    return redis.Redis(connection_pool=twin)


class RecordStore:
    """Whole JSON records and values with an expiry, in the chat store's Redis."""

    fresh = ANSWERED_FRESH

    def __init__(self, store: 'ChatStore') -> None:
        self._client = burst_client(store)
        self._own_pool = self._client is not store.client
        self._held = HeldConnections(self._client) if self._own_pool else None
        self._answered = float('-inf')          # when Redis last answered an exchange of the records' own pool

    @property
    def client(self) -> Any:
        """The client the records are written with (a gateway request's other writes may share it)."""
        return self._client

    def save(self, record: dict, ttl: float, rider: Any = None) -> None:
        """Write ``record`` (with its ``tenant`` and ``id``) whole, expiring in ``ttl`` s.

        ``rider`` (``command()``, ``answer(reply)``, ``failed()``) sends one
        command of its own in the same round trip, after the record's SET: both
        packed into one send on one of the records' connections.
        """
        key, value = response_key(record['tenant'], record['id']), jsontext.dumps(record)
        self._with_rider(('SET', key, value, 'PX', max(1, int(ttl * 1000))), rider)

    def reach(self, rider: Any = None) -> None:
        """Make sure Redis answers, before a call it cannot record would be paid for: a ``PING``, with
        ``rider``'s command (a key's admission) in the same send. Raises
        :class:`~llmconn.errors.StoreError` when Redis does not answer."""
        self._with_rider(('PING',), rider)

    def answered_lately(self) -> bool:
        """Whether Redis answered this process's records within :attr:`fresh` seconds (their own pool
        only): under load, a call's :meth:`reach` would ask what the last exchange told a moment ago."""
        return time.monotonic() - self._answered < self.fresh

    def _with_rider(self, command: tuple, rider: Any) -> None:
        """``command``, and ``rider``'s own (when it has one) in the same send; an error reply of
        ``command`` raised as a :class:`~llmconn.errors.StoreError`."""
        extra = rider.command() if rider is not None else None
        if extra is None:
            self._one(command)
            return
        try:
            done, reply = _run(self._send, command, extra)
        except BaseException:
            rider.failed()
            raise
        rider.answer(reply)
        if isinstance(done, Exception):
            _run(_raise, done)

    def _one(self, command: tuple) -> None:
        """One command whose reply is not needed, on the records' connections."""
        if not self._own_pool:          # the embedded store, Cluster, Sentinel: the client's own way
            _run(self._client.execute_command, *command)
            return
        done, = _run(self._send, command)
        if isinstance(done, Exception):
            _run(_raise, done)

    def _send(self, *commands: tuple) -> list:
        """The commands in one send; each reply, or the error reply it was (raised for a broken connection).

        redis-py's pipeline object costs more CPU than the second command's round trip would, and
        its client's path for one command (its argument parsing, encoder and observability hooks)
        several times what the command's own packing and reading cost: for redis-py's own
        connection classes the commands are packed and read here, on a connection the records keep
        out of the client's pool once lent (:class:`~llmconn.store.runner.HeldConnections`; the
        pool's checkout keeps AUTH, TLS and health checks); a broken connection is retried once on a
        fresh one, as the client's own retry does.
        """
        if not self._own_pool:
            pipe = self._client.pipeline(transaction=False)
            for command in commands:
                pipe.execute_command(*command)
            return pipe.execute(raise_on_error=False)
        count = len(commands)
        replies = self._held.exchange(commands, lambda conn: _replies(conn, count))
        self._answered = time.monotonic()
        return replies

    def get(self, tenant: str, response_id: str) -> dict | None:
        """The record of ``tenant``'s response, or None (unknown, expired, another tenant's, malformed id)."""
        if not valid_response_id(response_id):
            return None
        raw = self.value(response_key(tenant, response_id))
        return jsontext.loads(raw) if raw else None

    def delete(self, tenant: str, response_id: str) -> bool:
        if not valid_response_id(response_id):
            return False
        return bool(_run(self._client.delete, response_key(tenant, response_id)))

    def put(self, key: str, value: str, ttl: float | None = None) -> None:
        """Set ``key`` to ``value``, expiring in ``ttl`` s (None: never)."""
        self._one(('SET', key, value) if ttl is None else ('SET', key, value, 'PX', max(1, int(ttl * 1000))))

    def put_new(self, key: str, value: str) -> bool:
        """Set ``key`` unless it exists; whether it was set."""
        return bool(_run(self._client.set, key, value, None, None, True))

    def replace(self, key: str, value: str) -> bool:
        """Set ``key`` to ``value`` only if it exists, keeping its expiry; whether it was set."""
        return bool(_run(lambda: self._client.set(key, value, xx=True, keepttl=True)))

    def remove(self, *keys: str) -> int:
        """Delete ``keys`` (one slot on a cluster); how many there were."""
        return int(_run(self._client.delete, *keys)) if keys else 0

    def add_member(self, key: str, member: str, ttl: float, *also: str) -> None:
        """Add ``member`` to the set ``key``; ``key`` and the keys ``also`` expire in ``ttl`` s (one round trip)."""
        pipe = self._client.pipeline(transaction=False)
        pipe.sadd(key, member)
        for name in (key, *also):
            pipe.pexpire(name, max(1, int(ttl * 1000)))
        _run(pipe.execute)

    def members(self, key: str) -> set[str]:
        """The members of the set ``key`` (empty when it does not exist)."""
        return {m.decode('utf-8', 'surrogatepass') if isinstance(m, bytes) else m
                for m in _run(self._client.smembers, key)}

    def value(self, key: str) -> str | None:
        return _text(_run(self._client.get, key))

    def values(self, keys: list[str]) -> list[str | None]:
        """The values of ``keys``, None for each missing one, in one round trip (one slot on a cluster)."""
        return [_text(raw) for raw in _run(self._client.mget, keys)]

    def close(self) -> None:
        """Drop the connections of this store's own pool (the chat store closes its own)."""
        if self._own_pool:
            self._held.close()
            self._client.connection_pool.disconnect(inuse_connections=False)


def _replies(conn: Any, count: int) -> list:
    """``count`` replies, an error reply as its exception: the connection stays in step."""
    replies = []
    for _ in range(count):
        try:
            replies.append(conn.read_response())
        except ResponseError as e:
            replies.append(e)
    return replies


def _text(raw: Any) -> str | None:
    return raw.decode('utf-8', 'surrogatepass') if isinstance(raw, bytes) else raw


def _raise(e: Exception) -> None:
    raise e


def _run(call: Callable, *args: Any) -> Any:
    try:
        return call(*args)
    except (RedisError, RedisClusterException) as e:
        raise StoreError(f'the gateway\'s state store failed ({type(e).__name__}); check that Redis is '
                         f'up and redis.url is right') from None
