"""The chat store's history: window, cap, expiry, keys, round trips and failures (real Redis)."""

from __future__ import annotations

import logging
import socket
import time

import pytest
import redis
from redis.crc import key_slot

from llmconn.errors import ConfigError, StoreError
from llmconn.store import ChatStore, chat_keys, mask_url, open_store
from llmconn.store import connect as store_connect
from llmconn.types import Turn

TTL = 5.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


@pytest.fixture
def store(redis_url):
    store = open_store(redis_url)
    yield store
    store.close()


def turn(text: str, **extra) -> Turn:
    return Turn(user=text, assistant=f'reply to {text}', ts=time.time(), **extra)


def say(store: ChatStore, conn: str, chat: str, text: str, *, window: int = 100, expiry: int = 60,
        max_turns: int = 1000) -> list[Turn]:
    """One chat call: lock, read the window, save; returns the window it saw."""
    with store.begin(conn, chat, window=window, lock_ttl=TTL, lock_wait=TTL) as lock:
        seen = lock.turns
        lock.save(turn(text), expiry=expiry, max_turns=max_turns)
    return seen


def users(turns: list[Turn]) -> list[str]:
    return [t.user for t in turns]


def test_window_returns_last_turns_oldest_first(store, unique):
    for i in range(6):
        say(store, unique, 'c', f'm{i}')
    with store.begin(unique, 'c', window=3, lock_ttl=TTL, lock_wait=TTL) as lock:
        assert users(lock.turns) == ['m3', 'm4', 'm5']


def test_window_larger_than_history_returns_all(store, unique):
    say(store, unique, 'c', 'only')
    with store.begin(unique, 'c', window=50, lock_ttl=TTL, lock_wait=TTL) as lock:
        assert users(lock.turns) == ['only']


def test_window_zero_returns_no_turns(store, unique):
    # LRANGE key -0 -1 would return the whole list.
    for i in range(3):
        say(store, unique, 'c', f'm{i}')
    with store.begin(unique, 'c', window=0, lock_ttl=TTL, lock_wait=TTL) as lock:
        assert lock.turns == []


def test_unknown_chat_starts_empty(store, unique):
    assert say(store, unique, 'never-seen', 'first') == []


def test_turn_round_trips_whole(store, unique):
    full = Turn(user='q', assistant='a', items=({'type': 'thinking', 'thinking': 'hm', 'signature': 's'},),
                tag='claude:m:thinking', state={'response_id': 'resp_1', 'chain': 3}, ts=12.5)
    with store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL) as lock:
        lock.save(full, expiry=60, max_turns=10)
    assert store.history(unique, 'c') == [full]
    with store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL) as lock:
        assert lock.turns == [full]


def test_texts_with_newlines_quotes_and_lone_surrogates_survive(store, unique):
    odd = ['line one\nline two\r\n', '"quoted" \\ back', 'emoji 🎉 and 日本語', 'lone \ud800 surrogate']
    for text in odd:
        say(store, unique, 'c', text)
    assert users(store.history(unique, 'c')) == odd
    with store.begin(unique, 'c', window=10, lock_ttl=TTL, lock_wait=TTL) as lock:
        assert users(lock.turns) == odd


def test_storage_cap_trims_oldest(store, unique):
    for i in range(7):
        say(store, unique, 'c', f'm{i}', max_turns=4)
    assert users(store.history(unique, 'c')) == ['m3', 'm4', 'm5', 'm6']


def test_each_save_renews_expiry(store, unique, redis_client):
    key = chat_keys(unique, 'c').turns
    say(store, unique, 'c', 'm0', expiry=2)
    assert 0 < redis_client.pttl(key) <= 2000
    time.sleep(1.2)
    say(store, unique, 'c', 'm1', expiry=2)
    # Counted from the last message, not the first.
    assert redis_client.pttl(key) > 1500
    assert users(store.history(unique, 'c')) == ['m0', 'm1']


def test_expired_chat_starts_empty(store, unique):
    say(store, unique, 'c', 'm0', expiry=1)
    time.sleep(1.2)
    assert store.history(unique, 'c') == []
    assert say(store, unique, 'c', 'm1') == []


def test_delete_forgets_turns(store, unique):
    say(store, unique, 'c', 'm0')
    store.delete(unique, 'c')
    assert store.history(unique, 'c') == []
    assert say(store, unique, 'c', 'm1') == []


def test_delete_leaves_a_held_lock_alone(store, unique):
    say(store, unique, 'c', 'm0')
    with store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL) as lock:
        store.delete(unique, 'c')
        lock.save(turn('m1'), expiry=60, max_turns=10)
    assert users(store.history(unique, 'c')) == ['m1']


ODD_CHAT_IDS = ['plain', '}', '{', ':', '{a}', 'a}:{b', 'with space', ' ', '日本語', 'x' * 256, '\x00nul',
                'llmconn:{x}:turns', '*', 'lone \udfff']


def test_any_chat_id_is_its_own_chat(store, unique):
    for chat in ODD_CHAT_IDS:
        say(store, unique, chat, f'said in {chat!r}')
    for chat in ODD_CHAT_IDS:
        assert users(store.history(unique, chat)) == [f'said in {chat!r}']


def test_keys_never_collide_and_share_one_slot_per_chat():
    names = ['a', 'a:', 'a}', 'b', '日本', 'x' * 256]
    seen = set()
    for conn in names:
        for chat in dict.fromkeys(ODD_CHAT_IDS + names):
            keys = chat_keys(conn, chat)
            assert not seen & set(keys)
            seen.update(keys)
            slots = {key_slot(key.encode()) for key in keys}
            assert len(slots) == 1, keys
            # The hash tag is the first {...}: nothing from the ids can open or close it early.
            assert keys.lock.count('{') == 1 and keys.lock.count('}') == 1


def test_two_connections_with_one_chat_id_do_not_share(store, unique):
    say(store, unique + '-a', 'same', 'to a')
    say(store, unique + '-b', 'same', 'to b')
    assert users(store.history(unique + '-a', 'same')) == ['to a']
    assert users(store.history(unique + '-b', 'same')) == ['to b']


def test_warm_begin_and_save_cost_two_round_trips(store, unique, monkeypatch):
    say(store, unique, 'c', 'warm-up')     # connects, loads the scripts
    sent = []
    original = redis.connection.Connection.send_packed_command

    def counting(conn, command, check_health=True):
        sent.append(command)
        return original(conn, command, check_health)

    monkeypatch.setattr(redis.connection.Connection, 'send_packed_command', counting)
    lock = store.begin(unique, 'c', window=19, lock_ttl=TTL, lock_wait=TTL)
    lock.save(turn('counted'), expiry=60, max_turns=1000)
    lock.release()                          # a no-op after save: no third round trip
    monkeypatch.undo()
    assert len(sent) == 2
    assert [b''.join(c).split(b'\r\n')[2] for c in sent] == [b'EVALSHA', b'EVALSHA']


def test_scripts_lost_by_the_server_are_loaded_again(redis_server, unique):
    store = open_store(redis_server.url)      # a server of this test's own: it is flushed
    try:
        say(store, unique, 'c', 'm0')
        redis.Redis.from_url(redis_server.url).script_flush()
        say(store, unique, 'c', 'm1')
        assert users(store.history(unique, 'c')) == ['m0', 'm1']
    finally:
        store.close()


def test_opening_a_store_does_not_connect(unique):
    # The registry loads while Redis is down; only a chat call needs it.
    store = open_store('redis://127.0.0.1:1/0')
    assert store.shared is True
    store.close()


def test_redis_down_raises_store_error_quickly_without_password(unique):
    store = open_store(f'redis://user:s3cret-pw@127.0.0.1:{free_port()}/0')
    started = time.monotonic()
    with pytest.raises(StoreError) as info:
        store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL)
    assert time.monotonic() - started < 1.0
    message = str(info.value)
    assert 's3cret-pw' not in message and 'user:***@' in message
    assert 'check that Redis is running' in message
    for call in (store.ping, lambda: store.history(unique, 'c'), lambda: store.delete(unique, 'c')):
        with pytest.raises(StoreError):
            call()
    store.close()


def test_store_error_after_restart_then_recovers(redis_server, unique):
    store = open_store(redis_server.url)
    say(store, unique, 'c', 'before')
    redis_server.stop()
    with pytest.raises(StoreError):
        say(store, unique, 'c', 'during')
    redis_server.start()                    # same port, empty, no scripts loaded
    # Pooled sockets died with the old server: retried on fresh connections, scripts reloaded.
    assert say(store, unique, 'c', 'after') == []
    store.ping()
    store.close()


def test_closed_store_refuses_new_calls(redis_url, unique):
    store = open_store(redis_url)
    say(store, unique, 'c', 'm0')
    store.close()
    with pytest.raises(StoreError, match='closed'):
        store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL)


def test_url_for_display_masks_passwords():
    assert mask_url('redis://user:pw@host:6379/0') == 'redis://user:***@host:6379/0'
    assert mask_url('rediss://:pw@host/1') == 'rediss://:***@host/1'
    assert mask_url('unix:///run/redis.sock?db=2&password=pw') == 'unix:///run/redis.sock?db=2&password=***'
    assert mask_url('redis://host:6379/0') == 'redis://host:6379/0'
    assert open_store('redis://u:pw@h:1/0').url_for_display == 'redis://u:***@h:1/0'
    assert 'pw' not in repr(open_store('redis://u:pw@h:1/0'))


def test_unsupported_url_is_a_config_error():
    with pytest.raises(ConfigError, match='redis://'):
        open_store('http://u:pw@host')
    with pytest.raises(ConfigError) as info:
        open_store('redis://u:pw@host:notaport/0')
    assert 'pw' not in str(info.value).replace('password', '')


def test_memory_store_keeps_history_in_process(unique, monkeypatch, caplog):
    monkeypatch.setattr(store_connect, '_memory_warned', False)
    with caplog.at_level(logging.WARNING, logger='llmconn.store'):
        first = open_store(f'memory://{unique}')
        again = open_store(f'memory://{unique}')
    warnings = [r for r in caplog.records if 'this process only' in r.getMessage()]
    assert len(warnings) == 1
    assert first.shared is False
    say(first, 'conn', 'c', 'm0')
    say(again, 'conn', 'c', 'm1', window=1)
    # A store reopened on the same URL (a registry reload) sees the same history.
    assert users(again.history('conn', 'c')) == ['m0', 'm1']
    first.close()
    again.close()
