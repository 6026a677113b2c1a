"""The chat lock across OS processes: serialized saves, a SIGKILLed holder, gevent, fork."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from llmconn.errors import ChatBusy
from llmconn.store import open_store
from llmconn.types import Turn

ROOT = Path(__file__).resolve().parent.parent

CONTENDER = '''
import os, sys, time
from llmconn.store import open_store
from llmconn.types import Turn

url, conn, calls = sys.argv[1], sys.argv[2], int(sys.argv[3])
store = open_store(url)
for j in range(calls):
    with store.begin(conn, 'shared', window=1000, lock_ttl=5, lock_wait=30) as lock:
        seen = len(lock.turns)
        time.sleep(0.002)
        lock.save(Turn(user=f'{os.getpid()}.{j} saw={seen}', assistant='ok'), expiry=60, max_turns=1000)
store.close()
'''

HOLDER = '''
import sys, time
from llmconn.store import open_store
from llmconn.types import Turn

url, conn = sys.argv[1], sys.argv[2]
store = open_store(url)
lock = store.begin(conn, 'c', window=5, lock_ttl=1.0, lock_wait=5)
print('locked', flush=True)
time.sleep(60)
lock.save(Turn(user='from the killed holder', assistant='never'), expiry=60, max_turns=10)
'''

GEVENT = '''
from gevent import monkey
monkey.patch_all()

import sys, time
import gevent
from llmconn.errors import ChatBusy
from llmconn.store import open_store
from llmconn.types import Turn

url, conn = sys.argv[1], sys.argv[2]
store = open_store(url)

def call(i):
    with store.begin(conn, 'shared', window=1000, lock_ttl=5, lock_wait=30) as lock:
        seen = len(lock.turns)
        gevent.sleep(0.005)
        lock.save(Turn(user=f'{i} saw={seen}', assistant='ok'), expiry=60, max_turns=1000)

gevent.joinall([gevent.spawn(call, i) for i in range(20)], raise_error=True)
seen = [int(t.user.split('saw=')[1]) for t in store.history(conn, 'shared')]
assert seen == list(range(20)), seen

# The renewer is a greenlet here: a lock held 3 x its ttl across gevent.sleep stays held.
held = store.begin(conn, 'long', window=5, lock_ttl=0.3, lock_wait=1)
gevent.sleep(1.0)
try:
    store.begin(conn, 'long', window=5, lock_ttl=0.3, lock_wait=0.05)
    raise SystemExit('a renewed lock was taken')
except ChatBusy:
    pass
held.save(Turn(user='long', assistant='ok'), expiry=60, max_turns=10)
store.close()
print('ok', flush=True)
'''

FORK = '''
import os, sys, time
from llmconn.store import open_store
from llmconn.types import Turn

url, conn = sys.argv[1], sys.argv[2]
store = open_store(url)
with store.begin(conn, 'parent', window=5, lock_ttl=0.3, lock_wait=1) as lock:   # starts the renewer
    lock.save(Turn(user='parent', assistant='ok'), expiry=60, max_turns=10)
pid = os.fork()
if pid == 0:
    # The parent's renewer thread does not exist here: the child must start its own.
    lock = store.begin(conn, 'child', window=5, lock_ttl=0.3, lock_wait=1)
    time.sleep(1.0)
    lock.save(Turn(user='child', assistant='ok'), expiry=60, max_turns=10)
    os._exit(0)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
print([t.user for t in store.history(conn, 'child')], flush=True)
'''


def spawn(code: str, *args: str, **kwargs) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=f'{ROOT}{os.pathsep}{os.environ.get("PYTHONPATH", "")}')
    return subprocess.Popen([sys.executable, '-c', textwrap.dedent(code), *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def finish(process: subprocess.Popen, timeout: float = 60) -> str:
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err
    return out


@pytest.fixture
def store(redis_url):
    store = open_store(redis_url)
    yield store
    store.close()


def test_processes_contending_for_one_chat_are_serialized(store, redis_url, unique):
    processes = [spawn(CONTENDER, redis_url, unique, '10') for _ in range(4)]
    for process in processes:
        finish(process)
    turns = store.history(unique, 'shared')
    assert len(turns) == 40
    # Each save saw every save before it: nothing lost, duplicated or interleaved.
    assert [int(t.user.split('saw=')[1]) for t in turns] == list(range(40))
    assert len({t.user.split(' ')[0].split('.')[0] for t in turns}) == 4


def test_killed_holder_blocks_the_chat_at_most_lock_ttl(store, redis_url, unique):
    holder = spawn(HOLDER, redis_url, unique)
    try:
        assert holder.stdout.readline().strip() == 'locked'
        # Alive, it renews its 1 s lock from its own process.
        time.sleep(1.5)
        with pytest.raises(ChatBusy):
            store.begin(unique, 'c', window=5, lock_ttl=1.0, lock_wait=0.05)
        os.kill(holder.pid, signal.SIGKILL)
        killed = time.monotonic()
        with store.begin(unique, 'c', window=5, lock_ttl=1.0, lock_wait=5) as lock:
            waited = time.monotonic() - killed
            assert lock.turns == []
            lock.save(Turn(user='after the kill', assistant='ok'), expiry=60, max_turns=10)
    finally:
        holder.kill()
        holder.communicate()
    assert waited < 1.0 + 0.5
    assert [t.user for t in store.history(unique, 'c')] == ['after the kill']


def test_gevent_greenlets_are_serialized_and_renewed(redis_url, unique):
    assert finish(spawn(GEVENT, redis_url, unique)).strip() == 'ok'


@pytest.mark.skipif(not hasattr(os, 'fork'), reason='needs fork')
def test_forked_child_renews_its_own_locks(redis_url, unique):
    assert finish(spawn(FORK, redis_url, unique)).strip() == "['child']"


QUEUER = '''
import sys, threading
from llmconn.store import open_store
from llmconn.types import Turn

url, conn, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
store = open_store(url)

def call():
    with store.begin(conn, 'fair', window=1, lock_ttl=5, lock_wait=60) as lock:
        lock.save(Turn(user=f'place={lock.place}', assistant='ok'), expiry=60, max_turns=1000)

workers = [threading.Thread(target=call) for _ in range(threads)]
for w in workers:
    w.start()
for w in workers:
    w.join()
store.close()
'''


def test_forty_waiters_across_processes_are_served_first_come_first_served(store, redis_url, unique):
    import redis
    from llmconn.store import chat_keys

    client = redis.Redis.from_url(redis_url)
    holder = store.begin(unique, 'fair', window=1, lock_ttl=5, lock_wait=5)
    workers = [spawn(QUEUER, redis_url, unique, '11') for _ in range(4)]
    deadline = time.monotonic() + 30
    while client.llen(chat_keys(unique, 'fair').queue) < 44:
        assert time.monotonic() < deadline, 'the waiters never queued'
        time.sleep(0.01)
    time.sleep(1.2)                   # every waiter has waited past the old one-second re-block
    holder.release()
    for worker in workers:
        finish(worker)
    places = [int(t.user.split('=')[1]) for t in store.history(unique, 'fair')]
    assert len(places) == 44
    inversions = sum(1 for a, b in zip(places, places[1:]) if a > b)
    assert inversions == 0, places
