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
