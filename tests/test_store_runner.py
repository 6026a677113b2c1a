"""The fast runners: their packer sends exactly what redis-py's would, their free list skips a look
at a busy store's connections and recovers from a restart in one retry."""

from __future__ import annotations

import pytest
from redis.connection import Connection
from redis.exceptions import DataError

from llmconn.store import open_store
from llmconn.store import runner as runner_module
from llmconn.store.runner import packed
from llmconn.types import Turn

EVALSHA = ('EVALSHA', 'a' * 40, 4, 'llmconn:{conn\x00chat}:lock', 'llmconn:{conn\x00chat}:turns', 'kë', '鍵',
           '0' * 32, b'{"u":"hi","a":"there"}', 100, 60000, b'0', b'')


@pytest.mark.parametrize('command', [
    EVALSHA,
    ('WAIT', 1, 1000),
    ('SET', 'x', -5),
    ('SET', 'x', 1.5),
    ('SET', 'x', b'y' * 200_000),               # past redis-py's buffer cutoff
    ('SET', 'x', memoryview(b'a view')),
    ('SET', 'x', b''),
], ids=['evalsha', 'wait', 'negative', 'float', 'large', 'memoryview', 'empty'])
def test_packed_is_byte_for_byte_redis_py(command):
    conn = Connection()
    assert b''.join(packed(conn, command)) == b''.join(conn.pack_commands([command]))


def test_two_commands_are_one_buffer_in_order():
    conn = Connection()
    out = packed(conn, EVALSHA, ('WAIT', 1, 1000))
    assert len(out) == 1
    assert out[0] == b''.join(conn.pack_commands([EVALSHA, ('WAIT', 1, 1000)]))


@pytest.mark.parametrize('value', [True, None, object()], ids=['bool', 'none', 'object'])
def test_what_redis_py_refuses_is_refused(value):
    with pytest.raises(DataError):
        packed(Connection(), ('SET', 'x', value))


def test_a_lone_surrogate_in_a_key_is_refused_as_redis_py_refuses_it():
    with pytest.raises(UnicodeEncodeError):
        packed(Connection(), ('GET', 'bad\ud800'))
    with pytest.raises(UnicodeEncodeError):
        Connection().pack_commands([('GET', 'bad\ud800')])


def _chat(store, unique: str, text: str) -> None:
    with store.begin(unique, 'c', window=5, lock_ttl=5.0, lock_wait=5.0) as lock:
        lock.save(Turn(user=text, assistant='a'), expiry=60, max_turns=10)


def test_a_busy_stores_connections_are_sent_on_without_a_look(redis_url, unique, monkeypatch):
    # A connection back on the free list for less than IDLE_CHECK_AFTER is sent on at once: no
    # system call per script to see whether the server closed it. One idle longer is looked at.
    store = open_store(redis_url)
    looks = []
    real = runner_module._select
    monkeypatch.setattr(runner_module, '_select', lambda *a: looks.append(a) or real(*a))
    try:
        _chat(store, unique, 'warm')
        looks.clear()
        for i in range(5):
            _chat(store, unique, f'm{i}')
        assert looks == []
        monkeypatch.setattr(runner_module, 'IDLE_CHECK_AFTER', 0.0)
        _chat(store, unique, 'after a pause')
        assert len(looks) == 2                  # ACQUIRE's and FINISH's connection
    finally:
        store.close()


def test_connections_a_restarted_redis_closed_cost_one_failed_send(redis_server, unique):
    # Three connections came back from a busy moment, then Redis restarted: the first send on one
    # of them fails with nothing run, the others (as old) are handed back with it, and the retry
    # goes out on a fresh connection, so the call does not fail.
    store = open_store(redis_server.url)
    runner = store._runner
    try:
        _chat(store, unique, 'before')
        held = [runner._held.take() for _ in range(3)]
        for conn in held:
            conn.send_command('PING')
            assert conn.read_response() in (b'PONG', 'PONG', True)
        runner._held._free += [(conn, runner_module._monotonic()) for conn in held]
        redis_server.stop()
        redis_server.start()                    # same port, empty
        _chat(store, unique, 'after')
        assert [t.user for t in store.history(unique, 'c')] == ['after']
        assert len(runner._held._free) == 1     # the fresh one
    finally:
        store.close()
