"""The chat lock across a tool loop: held and renewed throughout; any failure mid-loop saves nothing."""

from __future__ import annotations

import threading
import time

import pytest

from llmconn import LLMError
from tests.tools_helpers import connection_config


@pytest.fixture
def make(redis_url, provider, unique, open_registry):
    def make(kind='openai', **conn):
        return open_registry(connection_config(redis_url, provider.url, unique, kind, **conn))[unique]
    return make


def test_a_second_caller_waits_for_the_whole_loop_and_sees_the_complete_turn(make):
    conn = make(lock_ttl=0.3, lock_wait=10)
    started = threading.Event()

    def slow(n: int) -> str:
        """Works for longer than the lock's ttl, so the loop only survives if the lock is renewed."""
        started.set()
        time.sleep(1.0)     # the tool's own work, not synchronization
        return f'slow {n}'

    first: dict = {}
    worker = threading.Thread(target=lambda: first.update(
        conn.chat('call slow {"n": 1}', chat_id='held', tools=[slow])))
    worker.start()
    assert started.wait(10)
    second = conn.chat('after', chat_id='held')     # blocks until the first turn is saved
    worker.join(10)
    assert first['text'] == 'tool said: slow 1'
    assert 'users: 2 | previous: call slow' in second['text']
    assert [m['content'] for m in conn.history('held')][0::2] == ['call slow {"n": 1}', 'after']


def test_a_provider_failure_in_a_later_round_saves_nothing(make, provider):
    conn = make(lock_wait=0)
    conn.chat('before', chat_id='f')

    def breaks_the_provider() -> str:
        """Makes the next provider call fail."""
        provider.fail(500)
        return 'ok'

    with pytest.raises(LLMError):
        conn.chat('call breaks_the_provider {}', chat_id='f', tools=[breaks_the_provider])
    assert [m['content'] for m in conn.history('f')][0::2] == ['before']
    assert 'users: 2' in conn.chat('next', chat_id='f')['text']        # lock_wait=0: the lock was freed


def test_a_consumer_that_stops_mid_loop_saves_nothing(make):
    conn = make(lock_wait=0)

    def add(a: int) -> int:
        """Adds one."""
        return a + 1

    events = conn.stream('call add {"a": 1}', chat_id='stop', tools=[add])
    for event in events:
        if event.type == 'tool_result':
            break
    events.close()
    assert conn.history('stop') == []
    assert 'users: 1' in conn.chat('again', chat_id='stop')['text']


def test_a_tool_that_raises_a_base_exception_saves_nothing(make):
    conn = make(lock_wait=0)

    def interrupt() -> str:
        """Stands for a process being stopped mid-tool."""
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        conn.chat('call interrupt {}', chat_id='ki', tools=[interrupt])
    assert conn.history('ki') == []
    assert 'users: 1' in conn.chat('again', chat_id='ki')['text']
