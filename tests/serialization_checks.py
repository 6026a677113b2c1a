"""The two serialization checks every Redis deployment's tests run against its own store.

Each returns how many turns every call saw when it held the chat's lock; serialized
calls see 0, 1, 2, ... in the order they saved.
"""

from __future__ import annotations

import threading

from llmconn.types import Turn
from test_store_processes import CONTENDER, finish, spawn

TTL = 5.0


def seen_by_threads(store, name: str, count: int = 20) -> list[int]:
    """``count`` threads of this process, each one call on the chat ``shared``."""
    def call(i):
        with store.begin(name, 'shared', window=100, lock_ttl=TTL, lock_wait=30) as lock:
            seen = len(lock.turns)
            lock.save(Turn(user=f'{i} saw={seen}', assistant='ok'), expiry=60, max_turns=100)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return _seen(store, name)


def seen_by_processes(store, url: str, name: str, processes: int = 3, calls: int = 5) -> list[int]:
    """``processes`` OS processes making ``calls`` calls each on the chat ``shared``."""
    workers = [spawn(CONTENDER, url, name, str(calls)) for _ in range(processes)]
    for worker in workers:
        finish(worker)
    return _seen(store, name)


def _seen(store, name: str) -> list[int]:
    return [int(t.user.split('saw=')[1]) for t in store.history(name, 'shared')]
