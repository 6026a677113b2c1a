"""Exactly-once and durable saves: a lost reply, a missing replica (real Redis, a proxy that drops replies)."""

from __future__ import annotations

import time

import pytest
import redis

from llmconn.errors import LockLost, StoreError
from llmconn.store import open_store
from llmconn.types import Turn
from llmconn.store.keys import chat_keys
from llmconn.store.lock import SaveCounters
from redis_topology import DroppingProxy, Servers, free_ports, replica_online

TTL = 5.0


def turn(text: str) -> Turn:
    return Turn(user=text, assistant='ok', ts=time.time())


@pytest.fixture
def proxy(redis_server):
    proxy = DroppingProxy(redis_server.port)
    yield proxy
    proxy.close()


def test_a_save_whose_reply_was_lost_is_reported_saved_and_stored_once(proxy, unique):
    store = open_store(f'redis://127.0.0.1:{proxy.port}/0')
    try:
        store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL).save(turn('before'), expiry=60,
                                                                             max_turns=10)
        lock = store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL)
        proxy.drop_reply_to(b'DROP-THIS-REPLY')
        lock.save(turn('DROP-THIS-REPLY'), expiry=60, max_turns=10)     # re-sent on a new connection
        assert proxy.dropped == 1
        assert [t.user for t in store.history(unique, 'c')] == ['before', 'DROP-THIS-REPLY']
    finally:
        store.close()


def test_a_save_whose_reply_was_lost_twice_in_a_row_is_reported_saved_and_stored_once(proxy, unique):
    # The runner re-sends once on a fresh connection; that reply is lost too. The store sends it
    # again: it finds its token among the saved ones, and says saved (SPEC §10).
    store = open_store(f'redis://127.0.0.1:{proxy.port}/0')
    try:
        store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL).save(turn('before'), expiry=60,
                                                                             max_turns=10)
        lock = store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL)
        proxy.drop_reply_to(b'DROP-THESE-REPLIES', times=2)
        lock.save(turn('DROP-THESE-REPLIES'), expiry=60, max_turns=10)
        assert proxy.dropped == 2
        assert [t.user for t in store.history(unique, 'c')] == ['before', 'DROP-THESE-REPLIES']
        store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=0).release()     # and the chat is free
    finally:
        store.close()


def test_a_save_that_never_gets_an_answer_says_it_may_have_been_saved(proxy, unique):
    store = open_store(f'redis://127.0.0.1:{proxy.port}/0')
    store._sleep = lambda s: None
    try:
        store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL).save(turn('before'), expiry=60,
                                                                             max_turns=10)
        lock = store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL)
        proxy.drop_reply_to(b'NEVER-ANSWERED', times=100)
        with pytest.raises(StoreError, match='may have been saved') as info:
            lock.save(turn('NEVER-ANSWERED'), expiry=60, max_turns=10)
        assert not isinstance(info.value, LockLost)
        assert [t.user for t in store.history(unique, 'c')] == ['before', 'NEVER-ANSWERED']     # it was, once
    finally:
        store.close()


def test_a_resent_save_is_recognised_after_another_call_saved_in_between(redis_url, unique):
    store = open_store(redis_url)
    try:
        first = store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL)
        args = (first._token, b'{"u":"first","a":"ok"}', 10, 60000, b'0', b'')
        assert store.finish(first._keys, args, durable=True) == 1
        store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL).save(turn('second'), expiry=60,
                                                                             max_turns=10)
        assert store.finish(first._keys, args, durable=True) == 2       # the re-send: already saved
        assert [t.user for t in store.history(unique, 'c')] == ['first', 'second']
    finally:
        store.close()


def test_replace_last_overwrites_a_pending_turn(redis_url, unique):
    store = open_store(redis_url)
    try:
        store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL).save(turn('pending'), expiry=60,
                                                                             max_turns=10)
        store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL).save(turn('answered'), expiry=60,
                                                                             max_turns=10, replace_last=True)
        assert [t.user for t in store.history(unique, 'c')] == ['answered']
    finally:
        store.close()


def test_a_turn_no_replica_acknowledged_raises_store_error(redis_server, unique):
    store = open_store(redis_server.url, replicas=1, replica_timeout=0.1)
    try:
        lock = store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL)
        with pytest.raises(StoreError, match='may not survive a failover'):
            lock.save(turn('lonely'), expiry=60, max_turns=10)
    finally:
        store.close()


@pytest.fixture
def with_replica(tmp_path):
    servers = Servers(tmp_path)
    master, replica = free_ports(2)
    try:
        servers.start(master)
        servers.start(replica, '--replicaof', '127.0.0.1', str(master))
        deadline = time.monotonic() + 10
        while not replica_online(master):
            assert time.monotonic() < deadline, 'the replica never connected'
            time.sleep(0.05)
        yield master, replica
    finally:
        servers.stop()


def test_with_a_replica_the_save_and_its_wait_are_one_round_trip(with_replica, unique, monkeypatch):
    master, replica = with_replica
    store = open_store(f'redis://127.0.0.1:{master}/0', replicas=1)
    try:
        store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL).save(turn('warm'), expiry=60, max_turns=10)
        sent = []
        original = redis.connection.Connection.send_packed_command
        monkeypatch.setattr(redis.connection.Connection, 'send_packed_command',
                            lambda conn, command, check_health=True: sent.append(command) or original(conn, command,
                                                                                                     check_health))
        store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL).save(turn('durable'), expiry=60,
                                                                             max_turns=10)
        monkeypatch.undo()
        assert len(sent) == 2                       # ACQUIRE, then FINISH + WAIT pipelined
        assert redis.Redis(port=replica).llen(chat_keys(unique, 'c').turns) == 2
    finally:
        store.close()


def test_a_lock_lost_in_a_failover_fences_the_old_holders_save(tmp_path, unique):
    """The master dies with the lock unreplicated; on the promoted replica B takes it; A's save writes nothing.

    The replica follows the master through a proxy that stops passing data on (the write never
    reaches it); clients reach "the master" through another proxy that is pointed at the
    promoted replica, as a virtual IP or DNS name is after a failover.
    """
    servers = Servers(tmp_path)
    master, replica = free_ports(2)
    link = front = None
    try:
        servers.start(master)
        link = DroppingProxy(master)
        servers.start(replica, '--replicaof', '127.0.0.1', str(link.port))
        deadline = time.monotonic() + 10
        while not replica_online(master):
            assert time.monotonic() < deadline, 'the replica never synced'
            time.sleep(0.05)
        front = DroppingProxy(master)
        url = f'redis://127.0.0.1:{front.port}/0'
        a, b = open_store(url), open_store(url, replicas=1, replica_timeout=0.2)
        a.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL).save(turn('replicated'), expiry=60,
                                                                         max_turns=10)
        deadline = time.monotonic() + 5
        while redis.Redis(port=replica).llen(chat_keys(unique, 'c').turns) < 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        link.frozen = True                                   # from here on nothing reaches the replica
        held = a.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL)
        with pytest.raises(StoreError, match='may not survive a failover'):
            # replicas: 1 refuses to report a turn only the master has
            b.begin(unique, 'other', window=5, lock_ttl=TTL, lock_wait=TTL).save(turn('unacked'), expiry=60,
                                                                                 max_turns=10)
        servers.kill(master)                                 # the failover
        redis.Redis(port=replica).replicaof('NO', 'ONE')
        front.upstream = replica
        front.cut()
        fresh = a.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=0)   # the lock did not survive
        with pytest.raises(LockLost):
            held.save(turn('stale holder'), expiry=60, max_turns=10)
        fresh.save(turn('new holder'), expiry=60, max_turns=10)
        assert [t.user for t in a.history(unique, 'c')] == ['replicated', 'new holder']
        a.close()
        b.close()
    finally:
        for proxy in (link, front):
            if proxy:
                proxy.close()
        servers.stop()


def test_counters_count_once_per_saved_turn_even_when_the_save_is_resent(proxy, unique):
    store = open_store(f'redis://127.0.0.1:{proxy.port}/0')
    try:
        keys = chat_keys(unique, 'c')
        ledger = keys.beside('usage')
        store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL).save(
            turn('one'), expiry=60, max_turns=10, counters=SaveCounters(ledger, {'calls': 1, 'tokens': 7}))
        proxy.drop_reply_to(b'DROP-THIS-REPLY')
        store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL).save(
            turn('DROP-THIS-REPLY'), expiry=60, max_turns=10,
            counters=SaveCounters(ledger, {'calls': 1, 'tokens': 5}))
        assert proxy.dropped == 1
        assert store._runner.client.hgetall(ledger) == {b'calls': b'2', b'tokens': b'12'}
    finally:
        store.close()


@pytest.mark.parametrize('field', ['input tokens', 'input\ttokens', 'input_tokens\n', ''])
def test_a_counter_field_with_a_space_is_refused_before_anything_is_saved(redis_url, unique, field):
    # The save script gets all increments as one space-separated argument: a field with whitespace
    # would be split into other fields, so it is refused, and the lock is released as usual.
    store = open_store(redis_url)
    try:
        ledger = chat_keys(unique, 'c').beside('usage')
        with pytest.raises(ValueError, match='without spaces'):
            with store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL) as lock:
                lock.save(turn('one'), expiry=60, max_turns=10, counters=SaveCounters(ledger, {field: 7}))
        assert store.history(unique, 'c') == []
        assert store._runner.client.exists(ledger) == 0
        store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=0).release()    # the chat is free again
    finally:
        store.close()


def test_counters_with_the_hash_expiry_set_it_once_on_the_first_new_field(redis_url, unique):
    store = open_store(redis_url)
    try:
        ledger = chat_keys(unique, 'c').beside('usage')
        for n in (3, 4):
            store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL).save(
                turn(f'{n}'), expiry=60, max_turns=10,
                counters=SaveCounters(ledger, {'calls': 1, 'input_tokens': n}, 1000))
            if n == 3:
                store._runner.client.expire(ledger, 5000)       # a later save must not reset it
        client = store._runner.client
        assert client.hgetall(ledger) == {b'calls': b'2', b'input_tokens': b'7'}
        assert 4000 < client.ttl(ledger) <= 5000
    finally:
        store.close()


def test_each_save_counts_its_own_numbers_whatever_its_fields_hold(redis_url, unique):
    # The increments are formatted from one format per set of fields: the numbers are each save's,
    # a '%' in a field is a plain character, and another set of fields gets a format of its own.
    store = open_store(redis_url)
    try:
        ledger = chat_keys(unique, 'c').beside('usage')
        for n, counts in ((3, {'calls': 1, 'in%d%%': 3}), (4, {'calls': 1, 'in%d%%': 40}),
                          (5, {'calls': 1, 'in%d%%': 500, 'tools': 2})):
            store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL).save(
                turn(f'{n}'), expiry=60, max_turns=10, counters=SaveCounters(ledger, counts))
        assert store._runner.client.hgetall(ledger) == {b'calls': b'3', b'in%d%%': b'543', b'tools': b'2'}
    finally:
        store.close()


def test_a_durable_save_on_a_server_that_lost_its_scripts_loads_them_and_keeps_the_connection_in_step(
        redis_server, unique):
    # EVALSHA and WAIT go out in one send: a NOSCRIPT reply must not leave WAIT's reply unread.
    store = open_store(redis_server.url, replicas=1, replica_timeout=0.05)
    try:
        lock = store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL)
        redis.Redis(port=redis_server.port).script_flush()
        with pytest.raises(StoreError, match='reached only 0 of 1'):      # this server has no replica
            lock.save(turn('one'), expiry=60, max_turns=10)
        assert [t.user for t in store.history(unique, 'c')] == ['one']
        assert store._runner.client.ping() is True
    finally:
        store.close()
