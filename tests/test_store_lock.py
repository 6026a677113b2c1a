"""The per-chat lock, one test per failure mode, against a real Redis (threads of one process)."""

from __future__ import annotations

import threading
import time

import pytest

from llmconn.errors import ChatBusy, LockLost
from llmconn.store import chat_keys, open_store
from llmconn.store.lock import QUEUED
from llmconn.types import Turn

TTL = 5.0


@pytest.fixture
def store(redis_url):
    store = open_store(redis_url)
    yield store
    store.close()


@pytest.fixture
def other(redis_url):
    """A second store: another server of the same environment."""
    store = open_store(redis_url)
    yield store
    store.close()


def turn(text: str) -> Turn:
    return Turn(user=text, assistant='ok', ts=time.time())


def run_threads(count: int, target) -> None:
    errors = []

    def guarded(i):
        try:
            target(i)
        except BaseException as exc:     # surfaced below, not lost in a thread
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors


def assert_serialized(turns: list[Turn], expected: int) -> None:
    """Turn k was written by a call that saw exactly the k turns before it."""
    assert len(turns) == expected
    assert [int(t.user.split('saw=')[1]) for t in turns] == list(range(expected))


def contend(store, conn: str, threads: int, calls: int) -> None:
    def worker(i):
        for j in range(calls):
            with store.begin(conn, 'shared', window=1000, lock_ttl=TTL, lock_wait=30) as lock:
                seen = len(lock.turns)
                time.sleep(0.001)          # widen the window for interleaving, were it possible
                lock.save(turn(f'{i}.{j} saw={seen}'), expiry=60, max_turns=1000)

    run_threads(threads, worker)


def test_concurrent_threads_are_serialized(store, unique):
    contend(store, unique, threads=8, calls=5)
    assert_serialized(store.history(unique, 'shared'), 40)


def test_concurrent_threads_in_memory_store_are_serialized(unique):
    store = open_store(f'memory://{unique}')
    contend(store, 'conn', threads=6, calls=5)
    assert_serialized(store.history('conn', 'shared'), 30)
    store.close()


def test_different_chats_do_not_wait_for_each_other(store, unique):
    with store.begin(unique, 'one', window=5, lock_ttl=TTL, lock_wait=0):
        with store.begin(unique, 'two', window=5, lock_ttl=TTL, lock_wait=0):
            pass


def test_lock_wait_exceeded_raises_chat_busy(store, other, unique):
    with store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=0):
        started = time.monotonic()
        with pytest.raises(ChatBusy, match='lock_wait'):
            other.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=0.3)
        assert time.monotonic() - started >= 0.3        # it waited its lock_wait, then gave up
        with pytest.raises(ChatBusy):
            other.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=0)


def test_release_and_save_hand_over_to_a_waiter_in_one_wake_up(store, other, unique, redis_client):
    # A missed wake-up would show as a second BLPOP (after the cap or the holder's ttl) or a re-sent
    # ACQUIRE; polling as several. How fast the handoff is, is a figure of make bench.
    keys = chat_keys(unique, 'c')
    for i in range(10):
        sent = []
        script, block = other._runner.script, other._runner.block
        other._runner.script = lambda name, *a: sent.append(name) or script(name, *a)
        other._runner.block = lambda *a: sent.append('BLPOP') or block(*a)
        holder = store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL)
        waiter = threading.Thread(target=lambda: other.begin(unique, 'c', window=5, lock_ttl=TTL,
                                                             lock_wait=TTL).release())
        waiter.start()
        wait_until_queued(redis_client, keys, 1)
        if i % 2:
            holder.release()
        else:
            holder.save(turn(f'm{i}'), expiry=60, max_turns=100)
        waiter.join(10)
        other._runner.script, other._runner.block = script, block
        assert sent == ['acquire', 'BLPOP', 'finish'], (i, sent)


def test_waiting_sends_no_polling_commands(store, other, unique):
    sent = []
    script, block = other._runner.script, other._runner.block
    other._runner.script = lambda name, *a: sent.append(name) or script(name, *a)
    other._runner.block = lambda *a: sent.append('BLPOP') or block(*a)
    holder = store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL)
    threading.Timer(1.5, holder.release).start()
    started = time.monotonic()
    other.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL).release()
    assert time.monotonic() - started >= 1.5                # it waited for the release
    # ACQUIRE (busy, queued), one BLPOP woken by the release with the window, FINISH.
    assert sent == ['acquire', 'BLPOP', 'finish']


def test_a_waiter_keeps_its_place_however_long_it_waits(store, other, unique, redis_client):
    keys = chat_keys(unique, 'c')
    holder = store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL)
    first = threading.Thread(target=lambda: other.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL)
                             .save(turn('first'), expiry=60, max_turns=10))
    first.start()
    wait_until_queued(redis_client, keys, 1)
    time.sleep(1.5)                 # longer than any re-blocking interval a waiter used to have
    second = threading.Thread(target=lambda: other.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL)
                              .save(turn('second'), expiry=60, max_turns=10))
    second.start()
    wait_until_queued(redis_client, keys, 2)
    holder.save(turn('holder'), expiry=60, max_turns=10)
    first.join(10)
    second.join(10)
    assert [t.user for t in store.history(unique, 'c')] == ['holder', 'first', 'second']


def test_waiter_wakes_when_a_short_lock_expires(store, other, unique, redis_client):
    # A holder that stopped renewing: its lock runs out after lock_ttl, the waiter's BLPOP with it.
    token = 'dead-holder'
    redis_client.set(chat_keys(unique, 'c').lock, token, px=300)
    started = time.monotonic()
    other.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL).release()     # else ChatBusy after TTL
    assert time.monotonic() - started > 0.25


def test_renewal_keeps_a_lock_alive_past_its_ttl(store, other, unique, redis_client):
    lock = store.begin(unique, 'c', window=5, lock_ttl=0.5, lock_wait=TTL)
    time.sleep(1.5)
    assert redis_client.pttl(chat_keys(unique, 'c').lock) > 0
    with pytest.raises(ChatBusy):
        other.begin(unique, 'c', window=5, lock_ttl=0.5, lock_wait=0.1)
    lock.save(turn('long call'), expiry=60, max_turns=10)
    assert [t.user for t in store.history(unique, 'c')] == ['long call']


def test_save_after_the_lock_expired_raises_lock_lost_and_stores_nothing(store, unique, redis_client):
    lock = store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL)
    redis_client.delete(chat_keys(unique, 'c').lock)       # as if it had expired
    with pytest.raises(LockLost, match='not saved'):
        lock.save(turn('late'), expiry=60, max_turns=10)
    assert store.history(unique, 'c') == []


def test_stale_holder_cannot_save_over_or_release_the_new_holders_lock(store, other, unique, redis_client):
    stale = store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL)
    redis_client.delete(chat_keys(unique, 'c').lock)       # expired while the holder was paused
    fresh = other.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=0)
    with pytest.raises(LockLost):
        stale.save(turn('stale'), expiry=60, max_turns=10)
    stale.release()
    assert redis_client.exists(chat_keys(unique, 'c').lock)
    fresh.save(turn('fresh'), expiry=60, max_turns=10)
    assert [t.user for t in store.history(unique, 'c')] == ['fresh']


def test_renewer_marks_a_taken_lock_lost(store, other, unique, redis_client):
    stale = store.begin(unique, 'c', window=5, lock_ttl=0.3, lock_wait=TTL)
    redis_client.delete(chat_keys(unique, 'c').lock)
    fresh = other.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=0)
    deadline = time.monotonic() + 2
    while not stale.lost and time.monotonic() < deadline:
        time.sleep(0.02)
    assert stale.lost
    assert redis_client.get(chat_keys(unique, 'c').lock) == fresh._token.encode()
    with pytest.raises(LockLost):
        stale.save(turn('stale'), expiry=60, max_turns=10)
    fresh.release()


def test_release_is_idempotent_and_a_no_op_after_save(store, other, unique):
    lock = store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL)
    lock.release()
    lock.release()
    lock = store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=0)
    lock.save(turn('m0'), expiry=60, max_turns=10)
    held_by_other = other.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=0)
    lock.release()                                       # must not free the other's lock
    with pytest.raises(ChatBusy):
        store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=0)
    held_by_other.release()


def test_saving_twice_raises_lock_lost(store, unique):
    lock = store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL)
    lock.save(turn('m0'), expiry=60, max_turns=10)
    with pytest.raises(LockLost, match='already saved or released'):
        lock.save(turn('m1'), expiry=60, max_turns=10)
    assert len(store.history(unique, 'c')) == 1


def test_with_block_releases_on_error(store, unique):
    with pytest.raises(RuntimeError):
        with store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL):
            raise RuntimeError('provider failed')
    store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=0).release()
    assert store.history(unique, 'c') == []
    assert not store.held()                  # nothing left for the renewer


def test_repeated_begin_of_the_same_call_does_not_wait_for_itself(store, unique):
    # An ACQUIRE re-sent after its reply was lost finds its own token and counts as taken.
    lock = store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL)
    keys = chat_keys(unique, 'c')
    reply = store.script('acquire', (keys.lock, keys.turns, keys.queue, keys.seq), (lock._token, 5000, 5, 0, b''))
    assert reply[0] == 1
    lock.release()


def wait_until_queued(redis_client, keys, count: int) -> None:
    """Until ``count`` calls wait in the chat's queue."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if redis_client.llen(keys.queue) >= count:
            return
        time.sleep(0.005)
    raise AssertionError(f'{count} waiters never queued')


def test_waiters_are_served_in_the_order_they_arrived(store, other, unique, redis_client):
    keys = chat_keys(unique, 'c')
    holder = store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL)
    served = []

    def waiter(name):
        with other.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL) as lock:
            served.append(name)
            time.sleep(0.01)
            lock.save(turn(name), expiry=60, max_turns=100)

    threads = []
    for i, name in enumerate(['first', 'second', 'third', 'fourth']):
        threads.append(threading.Thread(target=waiter, args=(name,)))
        threads[-1].start()
        wait_until_queued(redis_client, keys, i + 1)
    holder.release()
    for thread in threads:
        thread.join(10)
    assert served == ['first', 'second', 'third', 'fourth']


def test_a_caller_that_just_released_cannot_jump_the_queue(store, other, unique, redis_client):
    keys = chat_keys(unique, 'c')
    holder = store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL)
    waiter = threading.Thread(target=lambda: other.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL)
                              .save(turn('waiter'), expiry=60, max_turns=100))
    waiter.start()
    wait_until_queued(redis_client, keys, 1)
    holder.save(turn('holder'), expiry=60, max_turns=100)
    # The same process asks again at once, before the waiter could even be scheduled.
    store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL).save(turn('again'), expiry=60, max_turns=100)
    waiter.join(10)
    assert [t.user for t in store.history(unique, 'c')] == ['holder', 'waiter', 'again']


def dead_waiter(redis_client, keys, token: str, ttl_ms: int, deadline_ms: int) -> None:
    """Queue an entry for a waiter that will never claim anything (killed while waiting), and mark
    the holder's lock QUEUED as its ACQUIRE did."""
    now_s, now_us = redis_client.time()
    redis_client.rpush(keys.queue, f'{token}:{ttl_ms}:{now_s * 1000 + now_us // 1000 + deadline_ms}:5')
    if not redis_client.get(keys.lock).endswith(QUEUED.encode()):
        redis_client.append(keys.lock, QUEUED)


def test_a_waiter_killed_in_the_queue_blocks_the_chat_at_most_its_lock_ttl(store, other, unique, redis_client):
    keys = chat_keys(unique, 'c')
    holder = store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL)
    dead_waiter(redis_client, keys, 'dead00', ttl_ms=400, deadline_ms=10_000)
    holder.release()
    assert redis_client.get(keys.lock) == b'dead00+'    # handed to it, in its turn (others may queue behind)
    started = time.monotonic()
    other.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL).release()     # else ChatBusy after TTL
    assert time.monotonic() - started > 0.3


def test_a_waiter_past_its_deadline_is_skipped(store, other, unique, redis_client):
    keys = chat_keys(unique, 'c')
    holder = store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL)
    dead_waiter(redis_client, keys, 'dead00', ttl_ms=5000, deadline_ms=-1)
    holder.release()
    assert not redis_client.exists(keys.lock)
    other.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=0).release()


def test_a_handed_over_waiter_gets_the_window_with_the_lock(store, other, unique, redis_client):
    keys = chat_keys(unique, 'c')
    holder = store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL)
    seen = []
    waiter = threading.Thread(target=lambda: seen.append(
        other.begin(unique, 'c', window=2, lock_ttl=TTL, lock_wait=TTL)))
    waiter.start()
    wait_until_queued(redis_client, keys, 1)
    holder.save(turn('m0'), expiry=60, max_turns=10)
    waiter.join(5)
    lock, = seen
    assert [t.user for t in lock.turns] == ['m0']         # the turn saved by the handover itself
    lock.save(turn('m1'), expiry=60, max_turns=10)
    assert [t.user for t in store.history(unique, 'c')] == ['m0', 'm1']


def test_a_waiter_that_gives_up_leaves_the_queue(store, other, unique, redis_client):
    keys = chat_keys(unique, 'c')
    holder = store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL)
    with pytest.raises(ChatBusy):
        other.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=0.2)
    assert redis_client.llen(keys.queue) == 0
    holder.release()
    other.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=0).release()


def test_a_lock_handed_to_a_waiter_as_it_gives_up_goes_to_the_next(store, other, unique, redis_client):
    keys = chat_keys(unique, 'c')
    holder = store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL)
    reply = other.script('acquire', (keys.lock, keys.turns, keys.queue, keys.seq), ('aa11', 5000, 5, 5000, b''))
    holder.release()                                   # hands the lock to aa11, which is giving up
    assert redis_client.get(keys.lock) == b'aa11+'
    from llmconn.store.lock import _leave
    _leave(other, keys, 'aa11', reply[3])
    assert not redis_client.exists(keys.lock)
    other.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=0).release()


def test_the_head_of_the_line_taking_a_dead_holders_lock_marks_it_for_the_one_behind(store, unique,
                                                                                 redis_client):
    # The holder died (its lock expired) with two calls in line. The first to look again takes the
    # free lock as the head of the line; the lock is marked QUEUED, so its release hands the chat to
    # the second instead of only deleting the lock (a save looks at the queue only when marked).
    keys = chat_keys(unique, 'c')
    acquire_keys = (keys.lock, keys.turns, keys.queue, keys.seq)
    store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL)
    first = store.script('acquire', acquire_keys, ('aa11', 5000, 5, 5000, b''))
    store.script('acquire', acquire_keys, ('bb22', 5000, 5, 5000, b''))
    redis_client.delete(keys.lock)                          # the holder's lock expired
    assert store.script('acquire', acquire_keys, ('aa11', 5000, 5, 5000, first[3]))[0] == 1
    assert redis_client.get(keys.lock) == b'aa11' + QUEUED.encode()
    store.finish(keys, ('aa11', b'', 0, 0, b'0', b''), durable=False)
    assert redis_client.get(keys.lock) == b'bb22' + QUEUED.encode()    # handed on, with its wake-up
    assert redis_client.llen(keys.wake('bb22')) == 1


def test_a_cancelled_waiter_leaves_the_queue(store, other, unique, redis_client):
    keys = chat_keys(unique, 'c')
    holder = store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL)

    class Cancelled(BaseException):
        """As a greenlet kill arrives in a blocked waiter."""

    block = other._runner.block

    def cancelled(key, timeout):
        raise Cancelled()

    other._runner.block = cancelled
    with pytest.raises(Cancelled):
        other.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL)
    other._runner.block = block
    assert redis_client.llen(keys.queue) == 0
    holder.release()
    assert not redis_client.exists(keys.lock)          # nobody was handed a lock it would never claim


def test_every_key_a_contended_chat_leaves_behind_expires(store, other, unique, redis_client):
    # The queue's counter (:seq) is created by the INCR of the first waiter: its expiry must be set
    # after that INCR, or it never expires (the operations guide promises every key does).
    keys = chat_keys(unique, 'c')
    holder = store.begin(unique, 'c', window=5, lock_ttl=TTL, lock_wait=TTL)
    acquire_keys = (keys.lock, keys.turns, keys.queue, keys.seq)
    for waiter in ('aa11', 'bb22'):
        reply = other.script('acquire', acquire_keys, (waiter, 5000, 5, 5000, b''))
        assert reply[0] == 0
    assert redis_client.get(keys.seq) == b'2'
    holder.save(turn('one'), expiry=60, max_turns=10)
    for key in redis_client.scan_iter(match=f'{keys.lock.rpartition(":")[0]}:*'):
        assert redis_client.pttl(key) > 0, key
    assert 0 < redis_client.pttl(keys.seq) <= 5000 + 5000
