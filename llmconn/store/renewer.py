"""One thread per store that keeps every held chat lock alive (the RENEW script of :mod:`llmconn.store.lock`).

A lock is renewed every ``lock_ttl / 3``, so two renewals in a row may fail
before it expires; all locks of a store go in one pipelined round trip (one
per cluster master). A lock found taken by another call is marked lost, so
its save raises ``LockLost`` without writing.
"""

from __future__ import annotations

import logging
import threading
import time as mod_time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmconn.store.history import ChatStore
    from llmconn.store.lock import ChatLock

logger = logging.getLogger('llmconn.store.lock')

# With no lock held yet, how often the renewer looks (it is woken early when
# a lock with a shorter ttl appears).
IDLE_RENEW_INTERVAL = 10.0

# A lock is renewed every ttl/3: two renewals may fail before it expires.
RENEWALS_PER_TTL = 3


class LockRenewer:
    """Keeps every lock this store holds alive, from one daemon thread (a greenlet under gevent).

    Registration is the store's ``hold`` and ``let_go`` (a dict set and pop); this
    thread reads a snapshot of ``held()`` every ``min ttl / 3`` and renews all locks
    in one pipelined round trip (one per cluster node).
    """

    def __init__(self, store: 'ChatStore') -> None:
        self.min_ttl_ms = float('inf')
        self._store = store
        self._wakeup = threading.Event()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name='llmconn-lock-renewer', daemon=True)

    def start(self) -> None:
        self._thread.start()

    def shorten(self, ttl_ms: int) -> None:
        """A lock with a shorter ttl than any before: renew more often, starting now."""
        self.min_ttl_ms = ttl_ms
        self._wakeup.set()

    def stop(self) -> None:
        self._stopped = True
        self._wakeup.set()

    def _interval(self) -> float:
        if self.min_ttl_ms == float('inf'):
            return IDLE_RENEW_INTERVAL
        return self.min_ttl_ms / 1000.0 / RENEWALS_PER_TTL

    def _run(self) -> None:
        while True:
            self._wakeup.wait(self._interval())
            self._wakeup.clear()
            if self._stopped:
                return
            held = self._store.held()
            if not held:
                continue
            try:
                self._renew(held)
            except Exception as exc:    # the renewer must outlive any one failure
                logger.warning('Could not renew %d chat lock(s), will retry in %.1f s: %s',
                               len(held), self._interval(), exc)

    def _renew(self, held: list['ChatLock']) -> None:
        started = mod_time.monotonic()
        results = self._store.renew_all([lock.renewed() for lock in held])
        for lock, result in zip(held, results):
            if result == 0:
                lock.lost = True
                self._store.let_go(lock.token)
            elif isinstance(result, Exception):
                logger.warning('Could not renew a chat lock: %s', result)
        logger.debug('Renewed %d chat lock(s) in %.1f ms', len(held), (mod_time.monotonic() - started) * 1000)
