"""The gateway's records on a real Redis: a SET packed and read by the records themselves, as redis-py would.

A record is written on the records' own pool without redis-py's per-command
layers (:meth:`RecordStore._send`); what reaches Redis, what comes back, and
how a refusal or a broken connection surfaces must be what the client's own
``set`` gives.
"""

from __future__ import annotations

import redis
import pytest

from llmconn.errors import StoreError
from llmconn.store import open_store
from llmconn.store.records import RecordStore, new_response_id, response_key


@pytest.fixture
def records(redis_server):
    store = open_store(redis_server.url)
    records = RecordStore(store)
    yield records
    records.close()
    store.close()


def test_a_record_written_on_the_records_own_pool_reads_back_with_its_expiry(records, redis_server):
    assert records._own_pool, 'a plain redis:// store gets a pool of its own for the records'
    response_id = new_response_id()
    record = {'tenant': 'acme', 'id': response_id, 'status': 'completed', 'output': [{'text': 'héllo 😀'}]}
    records.save(record, ttl=30)
    assert records.get('acme', response_id) == record
    ttl_ms = redis.Redis.from_url(redis_server.url).pttl(response_key('acme', response_id))
    assert 25_000 < ttl_ms <= 30_000
    records.put('plain-key', 'for ever')
    assert records.value('plain-key') == 'for ever'
    assert redis.Redis.from_url(redis_server.url).pttl('plain-key') == -1


def test_a_set_redis_refuses_is_a_store_error_and_the_connection_stays_in_step(records, redis_server):
    admin = redis.Redis.from_url(redis_server.url)
    admin.config_set('maxmemory-policy', 'noeviction')
    admin.config_set('maxmemory', '1')          # every write is refused with an OOM error reply
    try:
        with pytest.raises(StoreError, match='check that Redis is'):
            records.put('k', 'v' * 100, ttl=10)
    finally:
        admin.config_set('maxmemory', '0')
    records.put('k', 'after', ttl=10)           # the next command reads its own reply, not a stale one
    assert records.value('k') == 'after'


def test_a_redis_that_went_away_is_a_store_error_and_a_restarted_one_is_used_again(records, redis_server):
    records.put('k', 'before', ttl=10)
    redis_server.stop()
    with pytest.raises(StoreError):
        records.put('k', 'while down', ttl=10)
    redis_server.start()
    records.put('k', 'after', ttl=10)
    assert records.value('k') == 'after'


def test_records_keep_their_connections_and_a_restart_costs_one_failed_send(records, redis_server):
    # The records send on connections kept out of the pool once lent: a busy moment leaves several
    # on the free list; after a restart the first send on one fails with nothing written, the others
    # (as old) are handed back with it, and the one retry goes out on a fresh connection.
    held = records._held
    conns = [held.take() for _ in range(3)]
    for conn in conns:
        held.keep(conn)
    records.put('k', 'before', ttl=10)
    assert len(held._free) == 3
    redis_server.stop()
    redis_server.start()                        # same port, empty
    records.put('k', 'after', ttl=10)           # no StoreError: the retry answered
    assert records.value('k') == 'after'
    assert len(held._free) == 1                 # the fresh one; the stale ones went back to the pool


def test_a_closed_record_store_drops_a_connection_that_comes_back_to_it(records):
    held = records._held
    conn = held.take()
    records.close()
    held.keep(conn)                             # a call in flight at close: its connection is not kept
    assert len(held._free) == 0 and conn._sock is None
