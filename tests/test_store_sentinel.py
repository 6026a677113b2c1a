"""The chat store through Sentinel (master, replica, three sentinels, started here): routing and failover."""

from __future__ import annotations

import time

import pytest
import redis

from llmconn.errors import ChatBusy, StoreError
from llmconn.store import chat_keys, open_store
from llmconn.types import Turn
from redis_topology import SentinelGroup
from serialization_checks import seen_by_processes, seen_by_threads

TTL = 5.0


@pytest.fixture(scope='module')
def group(tmp_path_factory):
    group = SentinelGroup(tmp_path_factory.mktemp('sentinel'))
    try:
        yield group.start()
    finally:
        group.stop()


@pytest.fixture
def store(group):
    store = open_store(group.url, replicas=1)
    yield store
    store.close()


def say(store, conn: str, chat: str, text: str) -> None:
    with store.begin(conn, chat, window=100, lock_ttl=TTL, lock_wait=TTL) as lock:
        lock.save(Turn(user=text, assistant='ok', ts=time.time()), expiry=60, max_turns=1000)


def test_calls_go_to_the_master_the_sentinels_name(group, store, unique):
    say(store, unique, 'c', 'hello')
    master = redis.Redis(port=group.current_master())
    assert master.llen(chat_keys(unique, 'c').turns) == 1
    assert [t.user for t in store.history(unique, 'c')] == ['hello']


def test_twenty_concurrent_calls_on_one_chat_are_serialized(store, unique):
    assert seen_by_threads(store, unique) == list(range(20))


def test_processes_on_one_chat_are_serialized(group, store, unique):
    assert seen_by_processes(store, group.url, unique) == list(range(15))


def test_a_failover_mid_conversation(group, store, unique):
    """SENTINEL FAILOVER while a waiter waits: calls fail cleanly or succeed, then succeed on the new master."""
    for i in range(3):
        say(store, unique, 'c', f'before {i}')
    acknowledged = [f'before {i}' for i in range(3)]
    old = group.current_master()
    new = group.failover()
    assert new != old
    # Scripts are not replicated: the promoted replica answers the first EVALSHA with NOSCRIPT.
    assert redis.Redis(port=new).script_exists(store._runner._scripts['finish'].sha) == [False]
    recovered = None
    deadline = time.monotonic() + 20
    i = 0
    while time.monotonic() < deadline and len(acknowledged) < 6:
        try:
            say(store, unique, 'c', f'after {i}')       # NOSCRIPT on the promoted replica is handled
            acknowledged.append(f'after {i}')
            recovered = recovered or time.monotonic()
        except (StoreError, ChatBusy):
            time.sleep(0.1)
        i += 1
    assert recovered is not None, 'no call succeeded after the failover'
    stored = [t.user for t in store.history(unique, 'c')]
    assert len(stored) == len(set(stored))
    assert [u for u in stored if u in acknowledged] == acknowledged
    assert redis.Redis(port=new).llen(chat_keys(unique, 'c').turns) == len(stored)
