"""One PooledRunner shared by OS threads while Redis drops their connections, or the store closes
under them: a connection is used by one thread at a time, and a call either gets its own reply or a
redis connection error, never another call's reply or a crash inside redis-py."""

from __future__ import annotations

import select
import sys
import threading
import time

import pytest
import redis
from redis.connection import Connection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from llmconn.store import runner as runner_module
from llmconn.store.runner import PooledRunner

THREADS = 8
SECONDS = 2.0


class OwnedConnection(Connection):
    """A redis-py connection that notes the thread sending on it until its reply is read, and every
    other thread that sends on it or disconnects it meanwhile (a clash)."""

    clashes: list = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._owner = None

    def _clash(self, what: str) -> None:
        OwnedConnection.clashes.append(f'{what} by thread {threading.get_ident()} while '
                                       f'thread {self._owner} was using it')

    def send_packed_command(self, command, check_health=True):
        me = threading.get_ident()
        if self._owner not in (None, me):
            self._clash('send')
        self._owner = me
        try:
            return super().send_packed_command(command, check_health)
        except BaseException:
            if self._owner == me:
                self._owner = None
            raise

    def read_response(self, *args, **kwargs):
        me = threading.get_ident()
        try:
            return super().read_response(*args, **kwargs)
        finally:
            if self._owner == me:
                self._owner = None

    def disconnect(self, *args, **kwargs):
        if self._owner not in (None, threading.get_ident()):
            self._clash('disconnect')
        return super().disconnect(*args, **kwargs)


class PausedList(list):
    """A free list whose pop, in one thread, waits for ``go``: the thread switch between loading the
    list and popping from it, made to happen where it otherwise happens one time in many."""

    def __init__(self, items, thread_name: str) -> None:
        super().__init__(items)
        self.thread_name = thread_name
        self.popping = threading.Event()
        self.go = threading.Event()

    def pop(self, *args):
        if threading.current_thread().name == self.thread_name and not self.go.is_set():
            self.popping.set()
            self.go.wait(10)
        return super().pop(*args)


def ping(conn) -> int:
    """Its client id, with the connection left in step."""
    conn.send_command('CLIENT', 'ID')
    return conn.read_response()


def closed_by_server(conn) -> None:
    deadline = time.monotonic() + 5
    while not select.select([conn._sock], [], [], 0.05)[0]:
        assert time.monotonic() < deadline, 'the server did not close the connection'


def echo_in_thread_b(runner) -> tuple[threading.Thread, list]:
    """Thread "b" sending one echo script on ``runner``: the thread, and its reply or error once done."""
    replies = []

    def send():
        try:
            replies.append(runner.script('echo', ('k',), ('b',)))
        except BaseException as exc:     # kept for the assertion, not lost in a thread
            replies.append(exc)

    thread = threading.Thread(target=send, name='b', daemon=True)
    thread.start()
    return thread, replies


def in_one_place_each(runner) -> bool:
    """Every connection is on the free list once, or idle in the pool, never both."""
    free = [conn for conn, _ in runner._held._free]
    return len(free) == len(set(free)) and not set(free) & set(runner.client.connection_pool._available_connections)


@pytest.fixture
def runner(redis_server):
    OwnedConnection.clashes = []

    def make(timeout):
        pool = redis.ConnectionPool(port=redis_server.port, socket_timeout=timeout, socket_connect_timeout=2.0,
                                    connection_class=OwnedConnection)
        return redis.Redis(connection_pool=pool)

    runner = PooledRunner(make, {'echo': "return ARGV[1]"}, 5.0)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)         # threads switch between any two lines, as on a loaded machine
    yield runner
    sys.setswitchinterval(interval)
    runner.close()


def hammer(runner, while_running) -> tuple[int, int, list]:
    """THREADS threads send echo scripts on ``runner`` while ``while_running(stop)`` runs here:
    (calls answered, calls that failed with a redis connection error, anything else)."""
    stop = threading.Event()
    answered, failed, wrong = [0] * THREADS, [0] * THREADS, []

    def worker(i):
        n = 0
        while not stop.is_set():
            n += 1
            sent = f'{i}:{n}'
            try:
                reply = runner.script('echo', ('k',), (sent,))
            except (RedisConnectionError, RedisTimeoutError):
                failed[i] += 1
                continue
            except BaseException as exc:     # kept for the assertion, not lost in a thread
                wrong.append(repr(exc))
                return
            if reply != sent.encode():
                wrong.append(f'sent {sent!r}, got {reply!r}')
                return
            answered[i] += 1

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    try:
        while_running(stop)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    return sum(answered), sum(failed), wrong


def test_threads_share_a_runner_while_redis_kills_their_connections(runner, redis_server):
    # A soak: a race here shows only when a thread switch lands between two bytecodes, seldom; the
    # tests below make those switches happen.
    killer = redis.Redis(port=redis_server.port)
    killed = []

    def kill_every_few_ms(stop):
        deadline = time.monotonic() + SECONDS
        while time.monotonic() < deadline:
            killed.append(killer.client_kill_filter(_type='normal', skipme=True))
            time.sleep(0.003)

    answered, failed, wrong = hammer(runner, kill_every_few_ms)
    killer.close()
    assert wrong == [] and OwnedConnection.clashes == []
    assert sum(killed) > 10 and answered > 100, (sum(killed), answered, failed)


def test_threads_share_a_runner_while_it_is_closed_under_them(runner):
    def close_again_and_again(stop):
        deadline = time.monotonic() + SECONDS
        while time.monotonic() < deadline:
            runner.close()
            time.sleep(0.005)

    answered, failed, wrong = hammer(runner, close_again_and_again)
    # A call in flight when the runner closes reads its reply whole: nothing failed.
    assert wrong == [] and OwnedConnection.clashes == [] and failed == 0
    assert answered > 100


def test_a_failed_send_leaves_alone_a_connection_another_thread_is_popping(runner, redis_server):
    # Thread "b" has loaded the free list and is about to pop; this thread's send fails on a connection
    # the server closed. What b pops must be b's alone, not also handed back to the pool and lent again.
    older, dead = runner._held.take(), runner._held.take()
    dead_id = ping(dead)
    ping(older)
    now = runner_module._monotonic()
    runner._held._free = free = PausedList([(older, now), (dead, now)], 'b')
    redis.Redis(port=redis_server.port).client_kill_filter(_id=dead_id)
    closed_by_server(dead)
    b, replies = echo_in_thread_b(runner)
    assert free.popping.wait(10)
    try:
        assert runner.script('echo', ('k',), ('a',)) == b'a'        # the one retry answered
    finally:
        free.go.set()
        b.join(10)
    assert replies == [b'b'] and in_one_place_each(runner)


def test_a_thread_that_finds_the_free_list_emptied_under_it_takes_a_pool_connection(runner):
    conn = runner._held.take()
    ping(conn)
    runner._held._free = free = PausedList([(conn, runner_module._monotonic())], 'b')
    b, replies = echo_in_thread_b(runner)
    assert free.popping.wait(10)                    # b saw one connection on the list ...
    mine = runner._held.take()                      # ... which this thread takes first
    free.go.set()
    b.join(10)
    runner._held._free.append((mine, runner_module._monotonic()))
    assert replies == [b'b'] and in_one_place_each(runner)
