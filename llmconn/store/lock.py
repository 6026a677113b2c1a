"""The distributed per-chat lock: a held chat, its window, and its renewal.

A :class:`ChatLock` is what :meth:`ChatStore.begin` hands back: proof that
this call, and no other in any process sharing the Redis, may extend the
chat. It carries the window read under the lock and ends in one of two ways:
:meth:`ChatLock.save` (append the turn and unlock, one round trip) or
:meth:`ChatLock.release` (unlock without saving, e.g. the provider failed).

The lock is a Redis string holding a random token, set with an expiry of
``lock_ttl``. While held it is renewed by one :class:`LockRenewer` per store
(not one thread per call), so a provider call may run far longer than
``lock_ttl``; only a holder that stops renewing loses it.

Failure timeline, and why nothing is lost or duplicated::

    t0  process A: BEGIN -> lock = token_A (ttl 30 s), reads turns 1..n
    t1  process B: BEGIN fails, sets the waiting flag, blocks in BLPOP
    t2  A is SIGKILLed mid provider call: its renewer dies with it
    t3  t0 + ttl: Redis expires the lock. B's BLPOP ended at the lock's
        remaining ttl (or a 1 s cap), B retries BEGIN and takes the lock
    t4  B saves turn n+1, built on turns 1..n; A's turn never existed

    A paused instead of killed (GC, VM freeze, Redis unreachable) and
    resuming after t3: its renewal or SAVE finds token_B, not token_A, so
    the renewer marks the lock lost and SAVE writes nothing and raises
    LockLost. A stale holder can never overwrite, unlock or extend B's lock.

Handover, and why a busy chat is served in order::

    t0  A holds the chat; B, then C, fail BEGIN and block in BLPOP (in that order)
    t1  A saves: waiters exist, so the lock becomes a ticket reserved for ~1 s and
        the ticket is pushed; Redis gives it to B, the longest blocked
    t2  A calls again at once: the lock is taken (by the ticket), so A queues behind C
    t3  B's BEGIN presents the ticket and turns the reservation into its lock

    B killed between t1 and t3: the reservation lapses after HANDOFF_TTL_MS and C
    (whose BLPOP wait is capped at the lock's remaining ttl) takes the lock.

Every script is fenced by the token; see :mod:`llmconn.store.scripts`.
"""

from __future__ import annotations

import json
import logging
import threading
import time as mod_time
from typing import TYPE_CHECKING

from llmconn.errors import LockLost, StoreError
from llmconn.types import Turn

if TYPE_CHECKING:
    from llmconn.store.history import ChatStore
    from llmconn.store.keys import ChatKeys

logger = logging.getLogger(__name__)

# With no lock held yet, how often the renewer looks (it is woken early when
# a lock with a shorter ttl appears).
IDLE_RENEW_INTERVAL = 10.0

# A lock is renewed every ttl/3: two renewals may fail before it expires.
RENEWALS_PER_TTL = 3

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(',', ':')).encode


class ChatLock:
    """A held chat: its window in ``turns``, then exactly one ``save`` or ``release``."""

    __slots__ = ('turns', 'lost', '_store', '_keys', '_token', '_ttl_ms', '_open')

    def __init__(self, store: 'ChatStore', keys: 'ChatKeys', token: str, ttl_ms: int,
                 turns: list[Turn]) -> None:
        self.turns = turns          # the window, oldest first
        self.lost = False           # set by the renewer when the lock is found taken
        self._store = store
        self._keys = keys
        self._token = token
        self._ttl_ms = ttl_ms
        self._open = True           # save or release still has work to do

    def save(self, turn: Turn, *, expiry: float, max_turns: int, replace_last: bool = False) -> None:
        """Append ``turn`` (or put it in place of the last one), keep the last ``max_turns``,
        expire in ``expiry`` s, unlock."""
        if not self._open:
            raise LockLost('This chat lock was already saved or released; begin a new call to save another turn')
        # From here on this lock must not be renewed, whatever the outcome.
        self._store._held.pop(self._token, None)
        if self.lost:
            self._open = False
            raise self._lost()
        # surrogatepass: a lone surrogate in a text is stored, not a crash; json.loads reads it back.
        data = _dumps(turn.to_dict()).encode('utf-8', 'surrogatepass')
        saved = self._store._do_save(self._keys, self._token, data, max_turns, expiry, replace_last)
        # A StoreError above leaves _open set, so release() still tries to unlock.
        self._open = False
        if not saved:
            raise self._lost()

    def release(self) -> None:
        """Unlock without saving and wake one waiter; a no-op once saved or released."""
        if not self._open:
            return
        self._open = False
        self._store._held.pop(self._token, None)
        self._store._do_release(self._keys, self._token)

    def renewed(self) -> tuple:
        """What the renewer needs: (lock key, token, ttl in ms)."""
        return self._keys.lock, self._token, self._ttl_ms

    def _lost(self) -> LockLost:
        return LockLost('The chat lock expired before the turn could be saved, so the turn was not saved and '
                        'the history is as it was (was Redis unreachable or the process paused longer than '
                        'lock_ttl?). Retry the call; raise lock_ttl if this repeats.')

    def __enter__(self) -> 'ChatLock':
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.release()
            return
        # Do not hide the error that is already on its way; the lock expires on its own.
        try:
            self.release()
        except StoreError as release_error:
            logger.warning('Could not release a chat lock after an error, it expires by itself: %s',
                           release_error)

    def __repr__(self) -> str:
        state = 'lost' if self.lost else 'held' if self._open else 'done'
        return f'<ChatLock {state} turns={len(self.turns)}>'


class LockRenewer:
    """Keeps every lock this store holds alive, from one daemon thread (a greenlet under gevent).

    Registration is a dict set and a dict pop on the store's ``_held``; this
    thread reads a snapshot of it every ``min ttl / 3`` and renews all locks
    in one pipelined round trip.
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
            held = list(self._store._held.values())
            if not held:
                continue
            try:
                self._renew(held)
            except Exception as exc:    # the renewer must outlive any one failure
                logger.warning('Could not renew %d chat lock(s), will retry in %.1f s: %s',
                               len(held), self._interval(), exc)

    def _renew(self, held: list[ChatLock]) -> None:
        started = mod_time.monotonic()
        results = self._store._do_renew([lock.renewed() for lock in held])
        for lock, result in zip(held, results):
            if result == 0:
                lock.lost = True
                self._store._held.pop(lock._token, None)
            elif isinstance(result, Exception):
                logger.warning('Could not renew a chat lock: %s', result)
        logger.debug('Renewed %d chat lock(s) in %.1f ms', len(held), (mod_time.monotonic() - started) * 1000)
