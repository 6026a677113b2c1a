"""The usage ledger: calls, errors, tokens and tool calls per connection, model, key and UTC day.

Where the counts live is :mod:`llmconn.usage_keys`. A failed call counts in
``calls`` too. No message text is ever written.

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
* Counters of other hashes (the gateway's, per tenant and day) go the same
  way through :meth:`UsageLedger.add_to`: tallied in process, written in
  marked batches, one per hash.
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
from typing import Any, Callable, Iterable, Iterator

from redis.crc import key_slot
from redis.exceptions import RedisClusterException, RedisError

from llmconn.errors import LLMConnError, LLMError, LLMTimeout, LockLost, StoreError
from llmconn.store.keys import chat_keys
from llmconn.usage_keys import ERROR_PREFIX, RETENTION_TTL, day_of, field_prefix, ledger_key

logger = logging.getLogger(__name__)

FLUSH_INTERVAL = 1.0                    # seconds between flushes of the in-process tally
BATCH_MARKER_TTL = 86400                # a batch sent again within a day is recognized

# Adds one batch of counts to a day's hash, once, however often the batch is sent.
#   KEYS[1] - the day's ledger hash, KEYS[2] - the batch's marker (same slot)
#   ARGV[1] - ledger ttl (s), ARGV[2] - marker ttl (s), ARGV[3..] - field, increment, field, ...
# Returns 1 when applied, 0 when this batch had been applied before.
FLUSH = """
if not redis.call('SET', KEYS[2], 1, 'NX', 'EX', ARGV[2]) then
    return 0
end
for i = 3, #ARGV, 2 do
    redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
end
redis.call('EXPIRE', KEYS[1], ARGV[1])
return 1
"""

# Adds the counts of one call whose save may have run, once: when the chat's saved tokens hold
# the save's token, its script counted the call, and only the pairs it could not count are added.
#   KEYS[1] - the ledger hash, KEYS[2] - this write's marker, KEYS[3] - the chat's saved tokens
#   (one slot: the hash is the one the save script would have written)
#   ARGV[1] - ledger ttl (s), ARGV[2] - marker ttl (s), ARGV[3] - the save's token,
#   ARGV[4] - how many of the pairs to add when it was saved (they come first),
#   ARGV[5..] - field, increment, field, ...
# Returns 0 - written before (nothing done); 1 - not saved: every pair added; 2 - saved: the first ones.
FLUSH_UNLESS_SAVED = """
if not redis.call('SET', KEYS[2], 1, 'NX', 'EX', ARGV[2]) then
    return 0
end
local last, result = #ARGV, 1
for _, token in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
    if token == ARGV[3] then
        last, result = 4 + 2 * tonumber(ARGV[4]), 2
        break
    end
end
for i = 5, last, 2 do
    redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
end
redis.call('EXPIRE', KEYS[1], ARGV[1])
return result
"""

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

    def __init__(self, store: Any, *, clock: Callable[[], float] = mod_time.time,
                 flush_interval: float = FLUSH_INTERVAL) -> None:
        self.store = store
        self.clock = clock
        self.flush_interval = flush_interval
        self._cluster = bool(getattr(store, 'cluster', False))
        self._scripts: dict[str, Any] = {}                  # registered on first use: connects nothing now
        self._prefixes: dict[tuple, str] = {}
        self._fields: dict[str, tuple] = {}
        self._day: tuple = (0.0, 0.0, '', '')            # start, end, 'YYYY-MM-DD', its ledger key
        self._pending: dict[tuple, dict[str, int]] = {}     # (day, prefix) -> counter -> n
        self._hashes: dict[tuple, dict[str, int]] = {}      # (hash key, ttl) -> field -> n (add_to)
        self._uncertain: list[tuple] = []                   # calls whose save may have run, see add_unless_saved
        # (batch id, day or None, field -> n, (hash key, ttl) or None,
        #  (saved tokens key, pairs to add if saved, fence) or None), oldest first
        self._unsent: list[tuple[str, str | None, dict, tuple | None, tuple | None]] = []
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

    def save_entry(self, conn_name: str, chat_id: str, prefix: str, result: dict) -> tuple:
        """``counters`` for the save: (ledger key, {field: increment}, its expiry); on the hot path."""
        day = self.today()
        if self._cluster:
            key = ledger_key(day, key_slot(chat_keys(conn_name, chat_id).turns.encode()))
        else:
            key = self._day[3]
        usage = result.get('usage') or _NO_USAGE
        names = self._fields.get(prefix)
        if names is None:
            names = self._fields[prefix] = tuple(prefix + c for c in ('calls', 'input_tokens', 'output_tokens',
                                                                      'tool_calls'))
        # 'calls' first: the save script sets the hash's expiry when that field is new.
        counts = {names[0]: 1, names[1]: usage.get('input_tokens') or 0, names[2]: usage.get('output_tokens') or 0}
        tools = result.get('tool_calls')
        if tools:
            counts[names[3]] = len(tools)
        return key, counts, RETENTION_TTL

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

    def add_to(self, key: str, ttl: int, counts: dict[str, int]) -> None:
        """Add ``counts`` to the hash ``key`` (expiring ``ttl`` s after each write), off the caller's path.

        The marker of a batch is ``key`` + a suffix, so ``key`` must carry its own
        hash tag on a cluster (the gateway's keys do).
        """
        with self._lock:
            tally = self._hashes.get((key, ttl))
            if tally is None:
                tally = self._hashes[(key, ttl)] = defaultdict(int)
            for name, n in counts.items():
                tally[name] += n
        self._wake_flusher()

    def add_unless_saved(self, counters: tuple, marker: tuple, prefix: str, counts: dict[str, int],
                         if_saved: dict[str, int]) -> None:
        """Add ``counts`` unless the save behind ``counters`` ran, else only ``if_saved``; off the caller's path.

        ``counters`` is what :meth:`save_entry` gave the save, ``marker`` the
        lock's ``saved_marker()``: (saved tokens key, token, fence). The flush
        runs the fence first, so that a save still in flight cannot land after
        the saved tokens were read.
        """
        key, _, ttl = counters
        saved_key, token, fence = marker
        first = {prefix + name: n for name, n in if_saved.items() if n}
        fields = dict(first)
        fields.update((prefix + name, n) for name, n in counts.items() if n and name not in if_saved)
        with self._lock:
            self._uncertain.append((token, None, fields, (key, ttl), (saved_key, len(first), fence)))
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
            batch_id, day, fields, target, saved = self._unsent[0]
            try:
                self._write(batch_id, day, fields, target, saved)
            except (RedisError, RedisClusterException, StoreError) as exc:
                if not self._failing:
                    error = exc if isinstance(exc, StoreError) else self.store._error(exc)
                    logger.warning('Could not write usage counts, keeping them to retry: %s', error)
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
        """Counts of this process not written yet (of any hash)."""
        return bool(self._pending or self._hashes or self._uncertain or self._unsent)

    def pending(self) -> int:
        """Calls counted in this process and not yet written (for tests and the admin page)."""
        with self._lock:
            pending = sum(t.get('calls', 0) for t in self._pending.values()) + len(self._uncertain)
        return pending + sum(v for _, day, fields, _, saved in self._unsent if day or saved
                             for f, v in fields.items() if f.endswith(':calls'))

    def _cut_batches(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
            hashes, self._hashes = self._hashes, {}
            uncertain, self._uncertain = self._uncertain, []
        by_day: dict[str, dict[str, int]] = defaultdict(dict)
        for (day, prefix), tally in pending.items():
            for name, n in tally.items():
                if n:
                    by_day[day][prefix + name] = n
        for day, fields in sorted(by_day.items()):
            self._unsent.append((os.urandom(12).hex(), day, fields, None, None))
        for target, tally in hashes.items():
            fields = {name: n for name, n in tally.items() if n}
            if fields:
                self._unsent.append((os.urandom(12).hex(), None, fields, target, None))
        self._unsent += uncertain       # each its own write; its id is the save's token

    def _write(self, batch_id: str, day: str | None, fields: dict[str, int], target: tuple | None = None,
               saved: tuple | None = None) -> None:
        if target is None:
            key, ttl = ledger_key(day, key_slot(batch_id.encode()) if self._cluster else None), RETENTION_TTL
        else:
            key, ttl = target
        marker = f'{key}:batch:{batch_id}'
        pairs = [item for pair in fields.items() for item in pair]
        if saved is None:
            self._script(FLUSH)(keys=(key, marker), args=[ttl, BATCH_MARKER_TTL, *pairs])
            return
        saved_key, if_saved, fence = saved
        fence()             # no save of this token can land from now on; raises while Redis is down
        self._script(FLUSH_UNLESS_SAVED)(keys=(key, marker, saved_key),
                                         args=[ttl, BATCH_MARKER_TTL, batch_id, if_saved, *pairs])

    def _script(self, source: str) -> Any:
        script = self._scripts.get(source)
        if script is None:
            script = self._scripts[source] = self.store.client.register_script(source)
        return script

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
        self._pending, self._hashes, self._uncertain, self._unsent = {}, {}, [], []
        self._lock, self._flushing = threading.Lock(), threading.Lock()
        self._wakeup = threading.Event()
        self._thread = None


class CallTally:
    """The count of one call: in the save script when its turn is saved, else in process."""

    __slots__ = ('ledger', 'prefix', 'result', 'in_script', 'status', 'done', 'saving', 'spent')

    def __init__(self, ledger: UsageLedger, prefix: str) -> None:
        self.ledger = ledger
        self.prefix = prefix
        self.result: dict | None = None     # the provider's answer, once there is one
        self.in_script = False              # the save script counted it
        self.status = ''                    # why it failed, when it did
        self.done = False                   # its 'done' event went out: whatever follows, it succeeded
        self.saving: tuple | None = None    # (counters, the chat's lock) once its save was sent
        self.spent = [0, 0, 0]              # input, output tokens and tool calls of the rounds answered so far

    def save_entry(self, conn_name: str, chat_id: str, result: dict, lock: Any) -> tuple:
        """Hand this to ``lock``'s save; call :meth:`saved` once the save succeeded."""
        self.result = result
        counters = self.ledger.save_entry(conn_name, chat_id, self.prefix, result)
        self.saving = (counters, lock)
        return counters

    def saved(self) -> None:
        self.in_script = True

    def answered(self, reply: Any) -> None:
        """A provider round answered: its tokens are spent, whatever happens to the call next."""
        spent = self.spent
        spent[0] += reply.input_tokens
        spent[1] += reply.output_tokens
        spent[2] += len(reply.calls)

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
            usage = self.result.get('usage') or {}
            counts.update(input_tokens=int(usage.get('input_tokens') or 0),
                          output_tokens=int(usage.get('output_tokens') or 0),
                          tool_calls=len(self.result.get('tool_calls') or ()))
        else:                           # the rounds answered before it failed: their tokens were spent
            counts.update(input_tokens=self.spent[0], output_tokens=self.spent[1], tool_calls=self.spent[2])
        if not self.status:
            self.ledger.add(self.prefix, counts)
            return
        error = {'errors': 1, ERROR_PREFIX + self.status: 1}
        counts.update(error)
        if self.saving is not None and self.status != LockLost.__name__:
            # It failed (or was stopped) while its save was on its way: the save may have run, its
            # reply lost. The flush asks the chat whether it did. (LockLost: it did not.)
            counters, lock = self.saving
            self.ledger.add_unless_saved(counters, lock.saved_marker(), self.prefix, counts, if_saved=error)
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

    def answered(self, reply: Any) -> None:
        pass


class _NoLedger:
    """A ledger that counts nothing (a connection built on its own, or the ledger switched off)."""

    _tally = _NoTally()

    def call(self, conn_name: str, model: str, key: str = '') -> _NoTally:
        return self._tally

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
