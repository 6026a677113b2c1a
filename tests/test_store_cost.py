"""What one uncontended chat call costs Redis: the commands its two scripts run (issue 19's benchmark).

Counted with ``INFO commandstats`` on a Redis of this test's own, so each
figure is exact: a command added to the common path shows here before it
shows in ``bench/store_cost.py``.
"""

from __future__ import annotations

import time

import redis

from llmconn.store import chat_keys, open_store
from llmconn.store.lock import SAVED_TOKENS, SaveCounters
from llmconn.types import Turn

CALLS = 16
OUTSIDE = {'evalsha', 'config|resetstat', 'info'}     # the scripts themselves, and this test's own commands


def commands(client: redis.Redis) -> dict[str, int]:
    """Calls of each command so far, scripts' own commands included."""
    return {name.removeprefix('cmdstat_'): stats['calls'] for name, stats in client.info('commandstats').items()}


def chat_calls(store, chat: str, count: int, max_turns: int = 1000, counters: SaveCounters | None = None) -> None:
    for i in range(count):
        with store.begin('cost', chat, window=4, lock_ttl=5.0, lock_wait=1.0) as lock:
            lock.save(Turn(user=f'q{i}', assistant='a', ts=time.time()), expiry=60, max_turns=max_turns,
                      counters=counters)


def test_free_chat_takes_lock_and_window_in_set_lpop_lrange(redis_server):
    client, store = redis.Redis.from_url(redis_server.url), open_store(redis_server.url)
    try:
        chat_calls(store, 'warm', 1)            # scripts loaded, connections open
        client.config_resetstat()
        chat_calls(store, 'c', CALLS)
        counted = commands(client)
    finally:
        store.close()
        client.close()
    assert counted['evalsha'] == 2 * CALLS
    # ACQUIRE on a free chat: SET NX, LPOP of the empty queue, LRANGE; no GET (FINISH's only).
    assert counted['get'] == CALLS
    assert counted['set'] == CALLS
    # ACQUIRE looks at the queue; FINISH only deletes a lock nobody queued for (not marked QUEUED).
    assert counted['lpop'] == CALLS
    # FINISH expires the turns and the saved tokens; a chat whose window and turn name no attachment
    # leaves its attachments' hashes alone.
    assert counted['pexpire'] == 2 * CALLS
    # The saved tokens are trimmed only once they exceed SAVED_TOKENS by 16.
    assert 'ltrim' not in counted
    # The floor, whole: ACQUIRE's SET, LPOP, LRANGE; FINISH's GET, RPUSH, PEXPIRE, LPUSH, PEXPIRE, DEL.
    assert sum(n for name, n in counted.items() if name not in OUTSIDE) == 9 * CALLS, counted


def test_a_save_counts_its_usage_with_one_hincrby_per_counter(redis_server):
    client, store = redis.Redis.from_url(redis_server.url), open_store(redis_server.url)
    counters = SaveCounters(chat_keys('cost', 'u').beside('usage'), {'m:calls': 1, 'm:input_tokens': 12,
                                                                     'm:output_tokens': 3}, 3600)
    try:
        chat_calls(store, 'u', 1, counters=counters)
        client.config_resetstat()
        chat_calls(store, 'u', CALLS, counters=counters)
        counted = commands(client)
    finally:
        store.close()
        client.close()
    assert counted['hincrby'] == 3 * CALLS
    assert 'expire' not in counted              # set once, when the hash was new
    assert sum(n for name, n in counted.items() if name not in OUTSIDE) == 12 * CALLS, counted


def test_a_chat_at_its_stored_turns_pops_the_oldest_in_the_save_with_one_command(redis_server):
    client, store = redis.Redis.from_url(redis_server.url), open_store(redis_server.url)
    try:
        chat_calls(store, 'full', 4, max_turns=4)       # at max_stored_turns from here on
        client.config_resetstat()
        chat_calls(store, 'full', CALLS, max_turns=4)
        counted = commands(client)
        stored = [t.user for t in store.history('cost', 'full')]
    finally:
        store.close()
        client.close()
    assert stored == [f'q{i}' for i in range(CALLS - 4, CALLS)]
    # Each save pops the turn it trims (FINISH's one LPOP) and looks no further: no LTRIM of the
    # turns, no EXISTS of the attachments' counts for a turn that names none.
    assert counted['lpop'] == 2 * CALLS      # ACQUIRE's look at the queue, FINISH's trim
    assert 'exists' not in counted
    assert counted.get('ltrim', 0) == 0


def test_saved_tokens_keep_at_least_the_last_64_and_at_most_80(redis_server):
    store, client = open_store(redis_server.url), redis.Redis.from_url(redis_server.url)
    try:
        saved = chat_keys('cost', 'long').saved
        lengths = []
        for _ in range(10):
            chat_calls(store, 'long', 13)
            lengths.append(client.llen(saved))
    finally:
        store.close()
        client.close()
    assert lengths[:4] == [13, 26, 39, 52]
    assert all(SAVED_TOKENS <= n <= SAVED_TOKENS + 16 for n in lengths[5:]), lengths
