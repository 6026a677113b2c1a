"""The usage ledger: calls, errors, tokens and tool calls per connection, model, key and UTC day.

Where the counts live is :mod:`llmconn.usage_keys`. A failed call counts in
``calls`` too. No message text is ever written.

The Redis side (the scripts, reading back) is :mod:`llmconn.store.usage`;
the counters are :data:`llmconn.usage_keys.COUNTERS`, so a new counter is
one more name there and in the tally.

How a call is counted, exactly once:

* A chat call whose turn is saved counts inside the save script (no extra
  round trip), in the day's hash of the chat's own cluster slot.
* Everything else (calls without a chat id, failed calls, a turn whose save
  failed) is added to an in-process tally. A background thread flushes it
  every ``FLUSH_INTERVAL`` seconds as batches, one per day, each written by
  one script that first sets the batch's marker key ``SET NX``: a batch whose
  reply was lost and is sent again is applied once. A batch that cannot be
  written (Redis down) is kept and sent again later, with the same id.
* A call that failed or was stopped while its save was on its way (a
  :class:`StoreError` after a lost reply, Ctrl-C) may have been saved all
  the same. Such a call is written on its own: the flusher first fences the
  chat (releases the lock if the call's token still holds it, so that a save
  still in flight finds it taken and writes nothing), then a script looks
  for the save's token among the chat's saved tokens: found, the save script
  counted the call and only its error is added; not found, all of it.
* A failed call keeps the tokens of the provider rounds that answered.
* Gateway calls are calls of their connection like any other, counted
  under their gateway key: there is no other ledger.
* ``close()`` (called by ``Registry.close()``) stops the thread and flushes
  what is left; a program that ends normally without closing its registry
  (a script that returns, ``sys.exit``, a multiprocessing child whose
  target returned) has its ledgers closed at exit. Only
  counts still unwritable at that moment are lost, and they are logged
  (numbers only). A process killed outright loses what it had not flushed:
  at most its last ``FLUSH_INTERVAL`` of calls without a saved turn.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing.util
import os
import threading
import time as mod_time
import weakref
from collections import defaultdict
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from llmconn.errors import LLMConnError, LLMError, LLMTimeout, LockLost, StoreError
from llmconn.store.keys import chat_keys, slot_of
from llmconn.store.lock import SaveCounters, SavedMarker
from llmconn.store.usage import Batch, UsageStore
from llmconn.usage_keys import ERROR_PREFIX, RETENTION_TTL, TOKEN_COUNTERS, day_of, field_prefix, ledger_key

if TYPE_CHECKING:
    from llmconn.store.history import ChatStore

logger = logging.getLogger(__name__)

FLUSH_INTERVAL = 1.0                    # seconds between flushes of the in-process tally

_NO_USAGE: dict = {}


def error_status(exc: BaseException) -> str:
    """How a failed call is counted: the provider's HTTP status, or what happened instead.

    ``timeout`` and ``no_response`` when the provider gave no status;
    ``cancelled`` when the call was stopped (the client left, Ctrl-C, a killed
    greenlet); else the class of the llmconn error that ended it (``ChatBusy``,
    ``StoreError``, ``LockLost``, ``ToolLoopLimit``, ...), ``error`` for any other.
    """
    if isinstance(exc, LLMTimeout):
        return 'timeout'
    if isinstance(exc, LLMError):
        return str(exc.status) if exc.status else 'no_response'
    if isinstance(exc, LLMConnError):
        return type(exc).__name__
    return 'error' if isinstance(exc, Exception) else 'cancelled'


# Ledgers of this process, so a forked child starts without its parent's tally and thread.
_ledgers: 'weakref.WeakSet[UsageLedger]' = weakref.WeakSet()


class UsageLedger:
    """Counts calls of one registry's connections into its chat store."""

    def __init__(self, store: 'ChatStore', *, clock: Callable[[], float] = mod_time.time,
                 flush_interval: float = FLUSH_INTERVAL) -> None:
        self.store = store
        self.clock = clock
        self.flush_interval = flush_interval
        self._redis = UsageStore(store)
        self._cluster = bool(getattr(store, 'cluster', False))
        self._prefixes: dict[tuple, str] = {}
        self._fields: dict[str, tuple] = {}
        self._day: tuple = (0.0, 0.0, '', '')            # start, end, 'YYYY-MM-DD', its ledger key
        self._pending: dict[tuple, dict[str, int]] = {}     # (day, prefix) -> counter -> n
        self._uncertain: list[Batch] = []                   # calls whose save may have run, see add_unless_saved
        self._unsent: list[Batch] = []                      # cut, not written yet, oldest first
        self._lock = threading.Lock()
        self._flushing = threading.Lock()
        self._wakeup = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._lost_reported = 0     # the calls close() last said were lost
        self._failing = False
        _ledgers.add(self)

    # -- the hot path ----------------------------------------------------------------------------

    def call(self, conn_name: str, model: str, key: str = '') -> 'CallTally':
        """A tally for one call; see :meth:`CallTally.track`."""
        return CallTally(self, self.prefix(conn_name, model, key))

    def prefix(self, conn_name: str, model: str, key: str = '') -> str:
        names = (conn_name, model, key)
        prefix = self._prefixes.get(names)
        if prefix is None:
            prefix = self._prefixes[names] = field_prefix(conn_name, model, key)
        return prefix

    def today(self) -> str:
        """Today's UTC day; recomputed only when the clock leaves the day last seen."""
        now = self.clock()
        start, end, day, _ = self._day
        if not start <= now < end:
            day = day_of(now)
            start = now // 86400 * 86400
            self._day = (start, start + 86400, day, ledger_key(day))
        return day

    def save_entry(self, conn_name: str, chat_id: str, prefix: str, result: dict) -> SaveCounters:
        """What the save script adds for this call: today's hash (of the chat's slot) and its increments."""
        day = self.today()
        key = ledger_key(day, slot_of(chat_keys(conn_name, chat_id).turns)) if self._cluster else self._day[3]
        usage = result.get('usage') or _NO_USAGE
        names = self._fields.get(prefix)
        if names is None:
            names = self._fields[prefix] = (prefix + 'calls', tuple((n, prefix + n) for n in TOKEN_COUNTERS),
                                            prefix + 'tool_calls')
        calls, tokens, tool_calls = names
        # 'calls' first: the save script sets the hash's expiry when that field is new.
        counts = {calls: 1}
        for name, field in tokens:
            n = usage.get(name)
            if n:                           # a count of 0 is no work for the script
                counts[field] = n
        tools = result.get('tool_calls')
        if tools:
            counts[tool_calls] = len(tools)
        return SaveCounters(key, counts, RETENTION_TTL)

    def add(self, prefix: str, counts: dict[str, int]) -> None:
        """Add ``counts`` to today's tally; written by the flusher, off the caller's path."""
        item = (self.today(), prefix)
        with self._lock:
            tally = self._pending.get(item)
            if tally is None:
                tally = self._pending[item] = defaultdict(int)
            for name, n in counts.items():
                tally[name] += n
        self._wake_flusher()

    def add_estimate(self, conn_name: str, model: str, key: str, usage: dict) -> None:
        """Tokens a call spent that its tally never saw: a stream its client left, estimated from its text.

        The call itself was counted (``cancelled``) by its tally; only the
        token counters of ``usage`` are added.
        """
        counts = {name: int(usage.get(name) or 0) for name in TOKEN_COUNTERS}
        if any(counts.values()):
            self.add(self.prefix(conn_name, model, key), counts)

    def add_unless_saved(self, counters: SaveCounters, marker: SavedMarker, prefix: str, counts: dict[str, int],
                         if_saved: dict[str, int]) -> None:
        """Add ``counts`` unless the save behind ``counters`` ran, else only ``if_saved``; off the caller's path.

        ``counters`` is what :meth:`save_entry` gave the save, ``marker`` its
        lock's. The flush runs the marker's fence first, so that a save still
        in flight cannot land after the saved tokens were read.
        """
        first = {prefix + name: n for name, n in if_saved.items() if n}
        fields = dict(first)
        fields.update((prefix + name, n) for name, n in counts.items() if n and name not in if_saved)
        # Its id is the save's token: one write per call, recognised if sent again.
        batch = Batch(marker.token, counters.key, counters.expiry, fields, unless_saved=marker, if_saved=len(first))
        with self._lock:
            self._uncertain.append(batch)
        self._wake_flusher()

    def _wake_flusher(self) -> None:
        if self._closed:        # a call that was still running when its registry closed (or reloaded its store)
            self.flush()
        elif self._thread is None:
            self._start()

    # -- flushing --------------------------------------------------------------------------------

    def flush(self) -> bool:
        """Write what was left unwritten, then what was counted since; True when nothing is left.

        New counts are cut into batches only once the older batches are written,
        so an outage keeps at most one batch per day besides the running tally.
        """
        with self._flushing:
            for _ in range(2):
                if not self._unsent:
                    self._cut_batches()
                if not self._write_unsent():
                    return False
            if self._failing:
                logger.warning('Usage counts written again after an outage')
            self._failing = False
            return True

    def _write_unsent(self) -> bool:
        while self._unsent:
            try:
                self._redis.write(self._unsent[0])
            except StoreError as exc:
                if not self._failing:
                    logger.warning('Could not write usage counts, keeping them to retry: %s', exc)
                self._failing = True
                return False
            self._unsent.pop(0)
        return True

    def close(self) -> None:
        """Stop the flusher and write what is left (called by ``Registry.close()``)."""
        self._closed = True
        self._wakeup.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        if self.flush():
            self._lost_reported = 0
            return
        lost = self.pending()
        if lost != self._lost_reported:     # at exit, after Registry.close() said so: not twice
            logger.error('Usage counts of %d call(s) could not be written before closing and are lost; '
                         'is Redis (%s) down?', lost, self.store.url_for_display)
        self._lost_reported = lost

    def has_unwritten(self) -> bool:
        """Counts of this process not written yet."""
        return bool(self._pending or self._uncertain or self._unsent)

    def pending(self) -> int:
        """Calls counted in this process and not yet written (for tests and the admin page)."""
        with self._lock:
            pending = sum(t.get('calls', 0) for t in self._pending.values()) + len(self._uncertain)
        return pending + sum(n for batch in self._unsent for f, n in batch.fields.items() if f.endswith(':calls'))

    def _cut_batches(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
            uncertain, self._uncertain = self._uncertain, []
        by_day: dict[str, dict[str, int]] = defaultdict(dict)
        for (day, prefix), tally in pending.items():
            for name, n in tally.items():
                if n:
                    by_day[day][prefix + name] = n
        for day, fields in sorted(by_day.items()):
            batch_id = os.urandom(12).hex()
            # On a cluster the batch goes to its own slot's hash of the day, where its marker lives too.
            key = ledger_key(day, slot_of(batch_id) if self._cluster else None)
            self._unsent.append(Batch(batch_id, key, RETENTION_TTL, fields))
        self._unsent += uncertain       # each its own write

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name='llmconn-usage-flusher', daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while not self._closed:
            self._wakeup.wait(self.flush_interval)
            if self._closed:
                return
            try:
                self.flush()
            except Exception:     # the flusher must outlive any one failure
                logger.exception('Usage flush failed; will retry')

    def _after_fork(self) -> None:
        # The parent's counts are the parent's to write; this child starts empty.
        self._pending, self._uncertain, self._unsent = {}, [], []
        self._lock, self._flushing = threading.Lock(), threading.Lock()
        self._wakeup = threading.Event()
        self._thread = None


class CallTally:
    """The count of one call: in the save script when its turn is saved, else in process."""

    __slots__ = ('ledger', 'prefix', 'result', 'in_script', 'status', 'done', 'counters', 'lock', 'answers')

    def __init__(self, ledger: UsageLedger, prefix: str) -> None:
        self.ledger = ledger
        self.prefix = prefix
        self.result: dict | None = None     # the provider's answer, once there is one
        self.in_script = False              # the save script counted it
        self.status = ''                    # why it failed, when it did
        self.done = False                   # its 'done' event went out: whatever follows, it succeeded
        self.counters: SaveCounters | None = None   # what its save carries, once the save was sent
        self.lock: Any = None               # the chat's lock that save went through
        self.answers: list = []             # the provider's answer of each round so far

    def save_entry(self, conn_name: str, chat_id: str, result: dict, lock: Any) -> SaveCounters:
        """Hand this to ``lock``'s save; call :meth:`saved` once the save succeeded."""
        self.result = result
        self.counters = self.ledger.save_entry(conn_name, chat_id, self.prefix, result)
        self.lock = lock
        return self.counters

    def saved(self) -> None:
        self.in_script = True

    def failed_over(self, prefix: str) -> None:
        """The call's connection failed and a fallback takes it: the failover is counted under the one
        that failed, the call under ``prefix`` (the fallback's), once it ends."""
        self.ledger.add(self.prefix, {'failovers': 1})
        self.prefix = prefix

    def counted_under(self, prefix: str) -> None:
        """The call counts under ``prefix`` after all (a call whose every fallback failed: its own connection's)."""
        self.prefix = prefix

    def answered(self, reply: Any) -> None:
        """A provider round answered: its tokens are spent, whatever happens to the call next."""
        self.answers.append(reply)

    @property
    def spent(self) -> dict[str, int]:
        """The tokens (and tool calls) of the rounds answered so far; summed only for a call that failed."""
        spent = dict.fromkeys(TOKEN_COUNTERS, 0)
        spent['tool_calls'] = 0
        for reply in self.answers:
            for name in TOKEN_COUNTERS:
                spent[name] += getattr(reply, name, 0) or 0
            spent['tool_calls'] += len(reply.calls)
        return spent

    def track(self, events: Iterable) -> Iterator:
        """Pass the call's events through, and count the call once it ends, however it ends."""
        try:
            for event in events:
                if event.type == 'done':
                    self.done = True
                    if self.result is None:
                        self.result = event.result
                yield event
        except BaseException as exc:    # GeneratorExit, KeyboardInterrupt, GreenletExit: cancelled
            if not self.done:           # a consumer that stops once it has its answer did not fail
                self.status = error_status(exc)
            raise
        finally:
            try:
                close = getattr(events, 'close', None)
                if close is not None:
                    close()         # a call stopped early frees its chat now, not when collected
            finally:
                self._settle()

    def _settle(self) -> None:
        if self.in_script or (self.result is None and not self.status):
            return          # counted by the save script, or never started
        counts = {'calls': 1}
        if self.result is not None:
            usage = self.result.get('usage') or _NO_USAGE
            counts.update({name: int(usage.get(name) or 0) for name in TOKEN_COUNTERS})
            counts['tool_calls'] = len(self.result.get('tool_calls') or ())
        else:                           # the rounds answered before it failed: their tokens were spent
            counts.update(self.spent)
        if not self.status:
            self.ledger.add(self.prefix, counts)
            return
        error = {'errors': 1, ERROR_PREFIX + self.status: 1}
        counts.update(error)
        if self.counters is not None and self.status != LockLost.__name__:
            # It failed (or was stopped) while its save was on its way: the save may have run, its
            # reply lost. The flush asks the chat whether it did. (LockLost: it did not.)
            self.ledger.add_unless_saved(self.counters, self.lock.saved_marker(), self.prefix, counts,
                                         if_saved=error)
        else:
            self.ledger.add(self.prefix, counts)


class _NoTally:
    """What a connection without a ledger counts with: nothing."""

    __slots__ = ()

    def track(self, events: Iterable) -> Iterable:
        return events

    def save_entry(self, conn_name: str, chat_id: str, result: dict, lock: Any) -> None:
        return None

    def saved(self) -> None:
        pass

    def failed_over(self, prefix: str) -> None:
        pass

    def counted_under(self, prefix: str) -> None:
        pass

    def answered(self, reply: Any) -> None:
        pass


class _NoLedger:
    """A ledger that counts nothing (a connection built on its own, or the ledger switched off)."""

    _tally = _NoTally()

    def call(self, conn_name: str, model: str, key: str = '') -> _NoTally:
        return self._tally

    def prefix(self, conn_name: str, model: str, key: str = '') -> str:
        return ''

    def close(self) -> None:
        pass


NO_LEDGER = _NoLedger()


def _forget_parent_state() -> None:
    for ledger in list(_ledgers):
        ledger._after_fork()


def _close_at_exit() -> None:
    # Before logging's own exit hook (registered earlier, so run later): a failure is still logged.
    for ledger in list(_ledgers):
        if not ledger._closed or ledger.has_unwritten():
            ledger.close()


def _close_at_multiprocessing_exit(_: object) -> None:
    # A multiprocessing child (fork, forkserver) ends with os._exit, past atexit; its exit runs
    # the finalizers registered in it instead.
    multiprocessing.util.Finalize(None, _close_at_exit, exitpriority=0)


os.register_at_fork(after_in_child=_forget_parent_state)
atexit.register(_close_at_exit)
multiprocessing.util.register_after_fork(_ledgers, _close_at_multiprocessing_exit)
