"""The gateway's state ledger and usage records, in the registry's Redis.

One JSON record per response, keyed by tenant and gateway response id
(``resp_`` + 48 random hex digits), expiring with the response::

    llmconn:gw:resp:{<response id>}:<tenant digest>     JSON record, EX response_expiry
    llmconn:gw:usage:{<tenant digest>}:<UTC day>        hash, field [key id, model, metric] -> count

The record holds the provider's response id, the previous id, the model
(connection name), the store mode (``provider``: the backend keeps the
state; ``gateway``: the record keeps the canonical items to replay; ``none``),
the instructions' hash, times, status, usage and counts (``input_items``,
``output_items``, ``function_calls``: the calls it made). Prompt and answer
text (``context``, ``output``, ``metadata``) is written only when the
response is stored under standard retention; otherwise the record is ids,
times, status and counts, nothing a person wrote.

A record of another tenant lives under another key, so looking it up with
the wrong tenant finds nothing, as if absent. The ledger writes whole
records (``SET``); a response's record is written by the one request that
made it, so there is no read-modify-write to race.

``redis`` exceptions become :class:`~llmconn.errors.StoreError` here, the
gateway's one boundary with that library.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import time as mod_time
from typing import Any, Callable

import redis
from redis.exceptions import RedisError

from llmconn.errors import StoreError

RESPONSE_ID_PREFIX = 'resp_'
_RESPONSE_ID = re.compile(r'^resp_[0-9a-f]{48}$')
USAGE_EXPIRY = 400 * 86400          # usage counters outlive a year of daily reports
USAGE_METRICS = ('requests', 'input_tokens', 'output_tokens', 'errors', 'cancelled', 'tool_calls',
                 'cache_read_tokens', 'cache_write_tokens', 'reasoning_tokens')
MAX_CONNECTIONS = 100               # the ledger's connections to Redis, per gateway process
CONNECTION_WAIT = 5.0               # how long a request waits for one of them before a 503


def store_client(store: Any) -> Any:
    """The redis-py client of the registry's chat store: the gateway's only dependency on the store.

    Uses ``store.client`` when the store offers it, else the client the store was built with.
    """
    client = getattr(store, 'client', None)
    return client if client is not None else store._client


def ledger_client(store: Any) -> Any:
    """A client of the store's Redis whose pool makes a burst of requests wait for a connection.

    redis-py's plain pool raises ``MaxConnectionsError`` once its connections are all in use, so
    500 concurrent gateway requests would fail where they should queue for a moment. For a plain
    pool the ledger gets a blocking twin (same server and settings); any other client (the embedded
    ``memory://`` store, Cluster, Sentinel) is used as it is.
    """
    client = store_client(store)
    pool = getattr(client, 'connection_pool', None)
    # redis-py's own connection classes only: the embedded store's fakeredis pool is a plain pool too.
    if type(pool) is not redis.ConnectionPool or not pool.connection_class.__module__.startswith('redis.'):
        return client
    twin = redis.BlockingConnectionPool(connection_class=pool.connection_class, max_connections=MAX_CONNECTIONS,
                                        timeout=CONNECTION_WAIT, **pool.connection_kwargs)
    return redis.Redis(connection_pool=twin)


def new_response_id() -> str:
    return RESPONSE_ID_PREFIX + secrets.token_hex(24)


def valid_response_id(response_id: Any) -> bool:
    return isinstance(response_id, str) and bool(_RESPONSE_ID.match(response_id))


def tenant_digest(tenant: str) -> str:
    return hashlib.sha256(tenant.encode('utf-8')).hexdigest()[:32]


def response_key(tenant: str, response_id: str) -> str:
    return f'llmconn:gw:resp:{{{response_id}}}:{tenant_digest(tenant)}'


def usage_key(tenant: str, day: str) -> str:
    return f'llmconn:gw:usage:{{{tenant_digest(tenant)}}}:{day}'


class Ledger:
    """Response records and usage counters of every tenant.

    With ``usage`` (the registry's :class:`~llmconn.usage.UsageLedger`) the
    counters are tallied in process and written in batches, exactly once,
    off the request's path: a request costs no Redis round trip for them,
    and a Redis outage after the backend answered loses no count and fails
    no request. Without it they are written at once, in the request.
    """

    def __init__(self, client: Any, clock: Callable[[], float] = mod_time.time, usage: Any = None) -> None:
        self.client = client
        self.clock = clock
        self.tally = usage

    def save(self, record: dict, ttl: float, count_usage: bool = False) -> None:
        """Write ``record`` whole (expiring in ``ttl`` s); with ``count_usage`` add it to the day's usage."""
        value = json.dumps(record, ensure_ascii=False)
        if count_usage and self.tally is None:
            pipe = self.client.pipeline(transaction=False)
            pipe.set(response_key(record['tenant'], record['id']), value, px=max(1, int(ttl * 1000)))
            self._add_usage(pipe, record)
            self._run(pipe.execute)
            return
        key = response_key(record['tenant'], record['id'])
        self._run(lambda: self.client.set(key, value, px=max(1, int(ttl * 1000))))
        if count_usage:
            self.count(record)

    def count(self, record: dict) -> None:
        """Add a record to the day's usage (a stored one through :meth:`save`)."""
        if self.tally is not None:
            key, counts = self._usage_fields(record)
            self.tally.add_to(key, USAGE_EXPIRY, counts)
            return
        pipe = self.client.pipeline(transaction=False)
        self._add_usage(pipe, record)
        self._run(pipe.execute)

    def get(self, tenant: str, response_id: str) -> dict | None:
        if not valid_response_id(response_id):
            return None
        raw = self._run(self.client.get, response_key(tenant, response_id))
        return json.loads(raw) if raw else None

    def delete(self, tenant: str, response_id: str) -> bool:
        if not valid_response_id(response_id):
            return False
        return bool(self._run(self.client.delete, response_key(tenant, response_id)))

    def usage(self, tenant: str, day: str | None = None) -> dict:
        """``{(key id, model): {metric: count}}`` of one tenant's UTC day (default today)."""
        raw = self._run(self.client.hgetall, usage_key(tenant, day or self._day()))
        usage: dict = {}
        for field, value in raw.items():
            key_id, model, metric = json.loads(field)
            usage.setdefault((key_id, model), {})[metric] = int(value)
        return usage

    def _usage_fields(self, record: dict) -> tuple[str, dict[str, int]]:
        """The day's usage hash of the record's tenant, and the increments of its fields."""
        key = usage_key(record['tenant'], self._day(record.get('created_at')))
        usage = record.get('usage') or {}
        counts = {'requests': 1, 'input_tokens': usage.get('input_tokens') or 0,
                  'output_tokens': usage.get('output_tokens') or 0,
                  'errors': int(record.get('status') == 'failed'),
                  'cancelled': int(record.get('status') == 'cancelled'),
                  'tool_calls': len(record.get('tool_calls') or ()),      # the function calls it made
                  **_details(usage)}
        return key, {json.dumps([record['key_id'], record['model'], metric]): int(value)
                     for metric, value in counts.items() if value}

    def _add_usage(self, pipe: Any, record: dict) -> None:
        key, counts = self._usage_fields(record)
        for field, value in counts.items():
            pipe.hincrby(key, field, value)
        pipe.expire(key, USAGE_EXPIRY)

    def _day(self, ts: float | None = None) -> str:
        return mod_time.strftime('%Y-%m-%d', mod_time.gmtime(self.clock() if ts is None else ts))

    @staticmethod
    def _run(call: Callable, *args: Any) -> Any:
        try:
            return call(*args)
        except RedisError as e:
            raise StoreError(f'the gateway\'s state store failed ({type(e).__name__}); check that Redis is '
                             f'up and redis.url is right') from None


def _details(usage: dict) -> dict[str, int]:
    """The cache and reasoning counts of a record's usage: flat (a completion's), or nested as a Response's."""
    read = (usage.get('input_tokens_details') or {}).get('cached_tokens')
    written = (usage.get('input_tokens_details') or {}).get('cache_write_tokens')
    reasoning = (usage.get('output_tokens_details') or {}).get('reasoning_tokens')
    return {'cache_read_tokens': usage.get('cache_read_tokens') or read or 0,
            'cache_write_tokens': usage.get('cache_write_tokens') or written or 0,
            'reasoning_tokens': usage.get('reasoning_tokens') or reasoning or 0}
