"""Per-key limits on the gateway (SPEC §18): rpm, tpm and a budget per day or month.

How a request is counted, across every gateway process sharing the Redis:

* One script (:data:`llmconn.store.limits.ADMIT`) admits it: it reads the
  key's counters in the current minute and budget period *by Redis's clock*
  and, unless a limit is reached, counts the request. The check and the
  count are one atomic step, so a burst from many processes is admitted
  exactly ``rpm`` times a minute. On the Responses route the script rides
  the round trip that records the response ``in_progress`` (packed after
  its SET in one send); on Chat Completions it is a round trip of its
  own. A busy key's request is admitted from a reserve instead (below).
  On a Redis Cluster nothing rides another write.
* What the call spent (input + output tokens to the minute, its cost in
  micro-USD at the connection's ``pricing`` to the period) is not a round
  trip of its own. The process keeps it and the next script of the same
  key adds it first (settle, then admit); a Response's final record
  carries it (same send) when it brings the key to its tpm or budget;
  what no script carried within :data:`SETTLE_INTERVAL` is written then by
  a background flush (with every other key's kept half as long), at once
  when it brings the key to its tpm or budget as this process last saw
  them, and at exit. A busy key's scripts come sooner than that: its spend
  costs no write of its own.
  tpm and the budget are therefore counted after the call: a request is
  refused once the minute's tokens reached tpm, or the period's spend the
  budget, so either is overspent by at most the requests in flight (and
  those that ended in the last :data:`SETTLE_INTERVAL`).
* A stream the client left early counts its estimated tokens (the ones the
  usage ledger counts for it) and their cost.
* Far from its limits, a key's script also reserves a few more requests
  for the process that ran it (:data:`RESERVE_MIN` at first, twice the
  last reserve's size when the process used that up within its lifetime,
  half when it used less than half, never more than :data:`RESERVE_MAX`;
  and only while
  the rpm keeps 16 times the reserve free and tpm and budget 4 times its
  worth at the most one call of the key took): they are admitted from the
  process, counted already, without a round trip, for at most
  :data:`RESERVE_LIFETIME` and never past the minute. What is left unused is
  handed back to the minute's count by the key's next script or the
  flush. Within reach of a limit every request is its own script, so a
  burst from many processes is still admitted exactly ``rpm`` times.
* A key without limits costs no Redis round trip. With limits, Redis down is
  a 503 (:class:`~llmconn.errors.StoreError`): never unlimited service. A
  settlement that cannot be written is kept and written later; a script
  whose reply was lost is sent again, so it may count twice (erring on the
  side of the limit).

Every answer of a limited key carries OpenAI's ``x-ratelimit-*`` headers.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from typing import Any

from gevent.monkey import get_original

from llmconn.errors import LimitExceeded, StoreError
from llmconn.pricing import cost_micro_usd
from llmconn.store.limits import NOTHING_BACK, SETTLE_ONLY, LimitStore, limit_key

logger = logging.getLogger('llmconn.gateway')

MINUTE_TTL = 120                                    # a minute's counters outlive it, for the one after
PERIOD_TTL = {'day': 2 * 86400, 'month': 32 * 86400}
PERIOD_WORD = {'day': 'daily', 'month': 'monthly'}     # a refusal names its budget's period
SETTLE_INTERVAL = 0.2                               # s: the longest a call's spend waits in its process
RESERVE_MIN = 16                                    # requests a process asks to hold admitted ahead for a key,
RESERVE_MAX = 256                                   # at first and at the most (a busy key's reserve grows)
RESERVE_LIFETIME = 0.2                              # s: the longest it holds them (never past the minute)
ASK_WAIT = 2.0                                      # s: the longest a request waits for another's reserve
# The lock of a limiter's lists is held for a few dict operations, never across a switch to another
# greenlet: the interpreter's own lock, not gevent's cooperative one (a Python call on each side).
_list_lock = get_original('threading', 'Lock')
_limiters: 'weakref.WeakKeyDictionary[Any, Limiter]' = weakref.WeakKeyDictionary()   # per chat store
_all: 'weakref.WeakSet[Limiter]' = weakref.WeakSet()


class Plan:
    """What a limited key's script is sent, computed once per key: its counters' name, its limits, its headers."""

    __slots__ = ('key', 'keys', 'spec', 'rpm', 'tpm', 'budget', 'fixed', 'max_tokens', 'max_cost', 'last',
                 'asking', 'want')

    def __init__(self, key: Any) -> None:
        limits = key.limits
        self.key = key
        self.keys = (limit_key(key.id),)
        self.rpm = limits.rpm or 0
        self.tpm = limits.tpm or 0
        self.budget = round(limits.budget_usd * 1_000_000) if limits.budget_usd is not None else 0
        ttl = max(MINUTE_TTL, PERIOD_TTL[limits.budget_period])
        self.spec = f'{limits.budget_period} {limits.rpm or 0} {self.tpm} {self.budget} {ttl}'     # ARGV[1]
        self.fixed = (('x-ratelimit-limit-requests', str(limits.rpm)) if limits.rpm is not None else None,
                      ('x-ratelimit-limit-tokens', str(limits.tpm)) if limits.tpm is not None else None)
        self.max_tokens = self.max_cost = -1    # the most one call of the key took here (-1: none yet)
        self.last = -RESERVE_LIFETIME           # when this process last admitted one of its requests
        self.asking: threading.Event | None = None      # set when this process's ask for a reserve is answered
        self.want = RESERVE_MIN                 # the size of the next reserve asked for (see :meth:`sized`)

    def run(self, kept: 'Kept', admit: bool) -> tuple[tuple, 'threading.Event | None']:
        """ARGV of the key's script (settle ``kept``, and admit one request or not), and the event its
        answer sets when it asks for a reserve (:meth:`answered`).

        A key busy in this process (its last request admitted within :data:`RESERVE_LIFETIME`)
        asks for a reserve, one script at a time: the key's other requests meanwhile wait for
        its answer (:meth:`Limiter.after_asking`) rather than each ask for one of their own.
        A lone request does not ask, so it is answered by Redis as it is now.
        """
        back = f'{kept.back} {kept.minute}' if kept.back else NOTHING_BACK
        if not admit:
            return (self.spec, kept.tokens, kept.cost, SETTLE_ONLY, back), None
        now = time.monotonic()
        asking = None
        if now - self.last < RESERVE_LIFETIME and self.asking is None:
            asking = self.asking = threading.Event()
        self.last = now
        return (self.spec, kept.tokens, kept.cost, f'{self.want if asking else 0} {self.max_tokens} '
                f'{self.max_cost}', back), asking

    def answered(self, asking: 'threading.Event | None') -> None:
        """The ask ``run`` made is answered (its reserve held) or failed: its waiters go on."""
        if asking is not None:
            self.asking = None
            asking.set()

    def sized(self, reserve: 'Reserve') -> None:
        """Size the next reserve by how ``reserve``, handed back now, went: twice it when its requests
        were all taken (within its lifetime: the key is busier than it), half when fewer than half were."""
        if reserve.left <= 0:
            self.want = max(RESERVE_MIN, min(RESERVE_MAX, 2 * reserve.size))
        elif reserve.left * 2 > reserve.size:
            self.want = max(RESERVE_MIN, reserve.size // 2)

    def spent(self, tokens: int, cost: int) -> None:
        if tokens > self.max_tokens:
            self.max_tokens = tokens
        if cost > self.max_cost:
            self.max_cost = cost


class Kept:
    """What a key's next script is to write: spend not counted yet, a reserve's unused requests."""

    __slots__ = ('plan', 'tokens', 'cost', 'back', 'minute', 'since', 'urgent')

    def __init__(self, plan: Plan, tokens: int = 0, cost: int = 0, back: int = 0, minute: int = 0,
                 urgent: bool = False) -> None:
        self.plan = plan
        self.tokens = tokens
        self.cost = cost
        self.back = back            # requests reserved in ``minute`` (Redis's) and not used
        self.minute = minute
        self.since = time.monotonic()       # kept since: the flush writes it by ``since + interval``
        self.urgent = urgent                # it brought its key to a limit: written at once

    def __bool__(self) -> bool:
        return bool(self.tokens or self.cost or self.back)

    def merge(self, other: 'Kept') -> None:
        self.since = min(self.since, other.since)
        self.urgent = self.urgent or other.urgent
        self.tokens += other.tokens
        self.cost += other.cost
        if other.back:
            if self.back and self.minute != other.minute:
                self.back = 0       # an older minute's: its count is gone already
            self.back += other.back
            self.minute = other.minute


NOTHING = Kept(None)     # type: ignore[arg-type]


class Reserve:
    """Requests a key's script admitted ahead for this process, and the counters it saw then."""

    __slots__ = ('plan', 'size', 'left', 'minute', 'requests', 'tokens', 'spent', 'minute_ends', 'expires')

    def __init__(self, grant: 'Grant', left: int, minute: int, now: float) -> None:
        self.plan = grant.plan
        self.size = self.left = left
        self.minute = minute
        self.requests, self.tokens, self.spent = grant.requests, grant.tokens, grant.spent
        self.minute_ends = now + grant.reset
        self.expires = min(now + RESERVE_LIFETIME, self.minute_ends)

    def take(self, now: float) -> 'Grant | None':
        """One of its requests, as a grant, while it lasts and the key is short of its tpm and budget."""
        plan = self.plan
        if (self.left <= 0 or now >= self.expires or (plan.tpm and self.tokens >= plan.tpm)
                or (plan.budget and self.spent >= plan.budget)):
            return None
        self.left -= 1
        plan.last = now
        return Grant(plan, self.requests - self.left, self.tokens, self.spent, self.minute_ends - now, self)


class Grant:
    """An admitted request of a limited key: what the counters said, for its answer's headers."""

    __slots__ = ('plan', 'requests', 'tokens', 'spent', 'reset', 'reserve')

    def __init__(self, plan: Plan, requests: int, tokens: int, spent: int, reset: float,
                 reserve: Reserve | None = None) -> None:
        self.plan = plan
        self.requests = requests
        self.tokens = tokens
        self.spent = spent
        self.reset = reset                  # seconds to the next minute, by Redis's clock
        self.reserve = reserve              # the reserve it came from or made, whose view its spend updates

    def headers(self) -> list[tuple[str, str]]:
        return rate_headers(self.plan, self.requests, self.tokens, self.reset)


# The reset headers of each whole second to the next minute (1 to 60), made once.
_RESETS = [(('x-ratelimit-reset-requests', f'{s}s'), ('x-ratelimit-reset-tokens', f'{s}s')) for s in range(61)]


def rate_headers(plan: Plan, requests: int, tokens: int, reset: float) -> list[tuple[str, str]]:
    requests_limit, tokens_limit = plan.fixed
    seconds = int(reset + 0.999)
    reset_requests, reset_tokens = _RESETS[min(max(seconds, 1), 60)]
    headers = []
    if requests_limit is not None:
        left = plan.rpm - requests
        headers += (requests_limit, ('x-ratelimit-remaining-requests', str(left if left > 0 else 0)), reset_requests)
    if tokens_limit is not None:
        left = plan.tpm - tokens
        headers += (tokens_limit, ('x-ratelimit-remaining-tokens', str(left if left > 0 else 0)), reset_tokens)
    return headers


def _usd(micro: int) -> str:
    """Dollars from micro-USD, in cents, or to the micro-dollar below a cent (a budget may be smaller)."""
    return f'{micro / 1e6:.2f}' if micro >= 10_000 else f'{micro / 1e6:.6f}'.rstrip('0').rstrip('.')


def verdict(plan: Plan, result: Any) -> Grant:
    """The grant of an ADMIT run, or the 429 it says (Retry-After from Redis's clock).

    A grant that reserved requests carries its :class:`Reserve` (not yet the limiter's).
    """
    code, requests, tokens, spent, reset_ms, period_left, _, *reserved = result.split()
    if code == b'0':
        grant = Grant(plan, int(requests), int(tokens), int(spent), int(reset_ms) / 1000)
        granted = int(reserved[0]) if reserved else 1
        if granted > 1:
            grant.reserve = Reserve(grant, granted - 1, int(reserved[1]), time.monotonic())
            grant.requests -= granted - 1       # as used: the reserve's requests are not, yet
        return grant
    requests, tokens, spent, reset = int(requests), int(tokens), int(spent), int(reset_ms) / 1000
    limits = plan.key.limits
    headers = rate_headers(plan, requests, tokens, reset)
    if code == b'3':
        raise LimitExceeded(f'You exceeded your current quota: gateway key {plan.key.id!r} spent its '
                            f'{PERIOD_WORD[limits.budget_period]} budget of ${limits.budget_usd:g} '
                            f'(${_usd(spent)}); it renews at the start of the next {limits.budget_period} (UTC).',
                            'insufficient_quota', headers + [('Retry-After', str(max(1, int(period_left))))])
    what = (f'requests per minute (RPM): Limit {limits.rpm}, Used {requests}' if code == b'1' else
            f'tokens per minute (TPM): Limit {limits.tpm}, Used {tokens}')
    raise LimitExceeded(f'Rate limit reached for gateway key {plan.key.id!r} on {what}. '
                        f'Please try again in {int(reset) + 1}s.', 'rate_limit_exceeded',
                        headers + [('Retry-After', str(int(reset) + 1))], 'requests' if code == b'1' else 'tokens')


class Limiter:
    """The limits of one chat store's keys in this process: their plans, reserves and what is to write."""

    def __init__(self, redis: LimitStore, interval: float = SETTLE_INTERVAL) -> None:
        self.redis = redis
        self.interval = interval
        self._plans: dict[str, Plan] = {}
        self._pending: dict[str, Kept] = {}         # key id -> what its next script writes
        self._reserves: dict[str, Reserve] = {}     # key id -> requests admitted ahead for this process
        self._writing: frozenset = frozenset()      # key ids whose spend a flush is writing now
        self._lock = _list_lock()
        self._flushing = threading.Lock()
        self._wake = threading.Event()
        self._retry_at = 0.0                        # after a failed flush, the next is not before this
        self._thread: threading.Thread | None = None
        self._closed = False
        self._failing = False
        self._lost_reported: list = []
        _all.add(self)

    def plan(self, key: Any) -> Plan:
        plan = self._plans.get(key.id)
        if plan is None or plan.key is not key:         # a reloaded configuration's key: its own plan
            plan = self._plans[key.id] = Plan(key)
        return plan

    # -- what is kept in this process ------------------------------------------------------------

    def take(self, plan: Plan) -> Kept:
        """What the key's next script writes (spend, unused reserve), now the caller's (or :meth:`give_back`).

        While a flush is writing the key's spend, the caller waits for it: the script it is about to
        run would not see that spend otherwise (taken off the list, not in Redis yet).
        """
        if plan.key.id in self._writing:
            with self._flushing:
                pass
        if not self._pending:
            return NOTHING
        with self._lock:
            return self._pending.pop(plan.key.id, NOTHING)

    def give_back(self, kept: Kept) -> None:
        """A write of ``kept`` failed: keep it for the next one (never written from here)."""
        if kept:
            self._keep(kept)
            if not self._closed:
                self._wake_flusher()

    def add(self, plan: Plan, tokens: int, cost: int, urgent: bool) -> None:
        """Keep what a call spent; written by the key's next round trip or the flush thread."""
        plan.spent(tokens, cost)
        with self._lock:
            entry = self._pending.get(plan.key.id)
            if entry is None:
                entry = self._pending[plan.key.id] = Kept(plan, tokens, cost, urgent=urgent)
                new = True
            else:
                entry.tokens += tokens
                entry.cost += cost
                new = urgent and not entry.urgent
                entry.urgent = entry.urgent or urgent
        if self._closed:        # a call that ended after its limiter closed (a reloaded store)
            self.flush()
        elif new:               # the flusher learns of a new entry's time, or writes an urgent one now
            self._wake_flusher()

    def _keep(self, kept: Kept) -> None:
        """Keep ``kept`` (taken off the list, its write failed) for the key's next write."""
        with self._lock:
            entry = self._pending.get(kept.plan.key.id)
            if entry is None:
                self._pending[kept.plan.key.id] = kept
            else:
                entry.merge(kept)

    def _wake_flusher(self) -> None:
        if self._thread is None:
            self._start()
        self._wake.set()

    # -- reserves ----------------------------------------------------------------------------------

    def reserved(self, plan: Plan) -> Grant | None:
        """A request of the key admitted from this process's reserve, without a round trip, or None."""
        if not self._reserves:
            return None
        with self._lock:
            reserve = self._reserves.get(plan.key.id)
            if reserve is None:
                return None
            grant = reserve.take(time.monotonic()) if reserve.plan is plan else None
            if grant is None:           # spent, expired, near a limit or a reloaded key's: hand it back
                self._drop(plan.key.id, reserve)
            return grant

    def hold(self, grant: Grant) -> None:
        """Keep the reserve an admission made (an older one of the key is handed back)."""
        reserve = grant.reserve
        if reserve is None:
            return
        with self._lock:
            old = self._reserves.get(reserve.plan.key.id)
            if old is not None:
                self._drop(reserve.plan.key.id, old)
            self._reserves[reserve.plan.key.id] = reserve
        self._wake_flusher()       # it hands the reserve back should it outlive its use

    def _drop(self, key_id: str, reserve: Reserve) -> None:
        # Under the lock. What was not used goes back to its minute's count with the next write.
        del self._reserves[key_id]
        reserve.plan.sized(reserve)
        if reserve.left > 0:
            back = Kept(reserve.plan, back=reserve.left, minute=reserve.minute)
            entry = self._pending.get(key_id)
            if entry is None:
                self._pending[key_id] = back
            else:
                entry.merge(back)
        reserve.left = 0

    def _expire(self, everything: bool = False) -> None:
        """Hand back the reserves past their time (all of them, closing)."""
        now = time.monotonic()
        with self._lock:
            for key_id, reserve in list(self._reserves.items()):
                if everything or now >= reserve.expires or reserve.left <= 0:
                    self._drop(key_id, reserve)

    def _until_due(self) -> float | None:
        """Seconds until the flusher has work: a kept entry :attr:`interval` old (at once when it
        reached a limit), a reserve's end; None when there is none. Never before a failed flush's retry."""
        soonest = None
        with self._lock:
            for kept in self._pending.values():
                due = kept.since + (0.0 if kept.urgent else self.interval)
                if soonest is None or due < soonest:
                    soonest = due
            for reserve in self._reserves.values():
                if soonest is None or reserve.expires < soonest:
                    soonest = reserve.expires
        if soonest is None:
            return None
        return max(0.0, max(soonest, self._retry_at) - time.monotonic())

    # -- the round trips -------------------------------------------------------------------------

    def after_asking(self, plan: Plan) -> Grant | None:
        """A request of the key from the reserve another's script is asking for now, once it is answered;
        None when no script asks, or its answer reserved nothing for this one."""
        asking = plan.asking
        if asking is None:
            return None
        asking.wait(ASK_WAIT)
        return self.reserved(plan)

    def admit(self, plan: Plan) -> Grant:
        """One request: from the reserve, else settle what is kept and admit (and reserve) in one round
        trip; 429 or 503 when refused."""
        grant = self.reserved(plan) or self.after_asking(plan)
        if grant is not None:
            return grant
        kept = self.take(plan)
        argv, asking = plan.run(kept, True)
        try:
            try:
                result = self.redis.admit(plan.keys, argv)
            except BaseException:
                self.give_back(kept)
                raise
            grant = verdict(plan, result)
            self.hold(grant)
            return grant
        finally:
            plan.answered(asking)

    def _due(self) -> list[str]:
        """The keys whose kept entry the flusher writes now: those kept :attr:`interval` or that reached a
        limit and, when there are any, those kept half as long (one write for them all)."""
        now = time.monotonic()
        with self._lock:
            ages = {key_id: float('inf') if kept.urgent else now - kept.since for key_id, kept in self._pending.items()}
        if not any(age >= self.interval for age in ages.values()):
            return []
        return [key_id for key_id, age in ages.items() if age >= self.interval / 2]

    def flush(self, keys: list[str] | None = None) -> bool:
        """Write kept spend and unused reserves in one round trip, every key's or those of ``keys``;
        False when the write failed (what it carried is kept)."""
        with self._flushing:
            with self._lock:
                if keys is None:
                    pending, self._pending = self._pending, {}
                else:
                    pending = {key_id: self._pending.pop(key_id) for key_id in keys if key_id in self._pending}
                self._writing = frozenset(pending)
            entries = [kept for kept in pending.values() if kept]
            try:
                if not entries:
                    return True
                self.redis.settle_many([(kept.plan.keys, kept.plan.run(kept, False)[0]) for kept in entries])
            except StoreError as e:
                for kept in entries:
                    self._keep(kept)
                if not self._failing:
                    logger.warning('Could not count the spend of %d gateway key(s) against their limits, '
                                   'keeping it to retry: %s', len(entries), e)
                self._failing = True
                return False
            finally:
                self._writing = frozenset()
            if self._failing:
                logger.warning('Gateway limits counted again after an outage')
            self._failing = False
            return True

    def close(self) -> None:
        """Stop the flush thread, hand back the reserves and write what is left."""
        self._closed = True
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)
        self._expire(everything=True)
        if not self.flush():
            with self._lock:
                lost = [(kept.plan.key.id, kept.tokens, kept.cost) for kept in self._pending.values()
                        if kept.tokens or kept.cost]     # a reserve not handed back only lapses with its minute
            if lost == self._lost_reported:     # at exit, after the registry's close said so: not twice
                return
            self._lost_reported = lost
            for key_id, tokens, cost in lost:
                logger.error('Gateway key %s: %d tokens and %d micro-USD could not be counted against its '
                             'limits before closing', key_id, tokens, cost)

    def _start(self) -> None:
        with self._lock:
            thread = None
            if self._thread is None:
                thread = self._thread = threading.Thread(target=self._run, name='llmconn-limits-flusher',
                                                         daemon=True)
        if thread is not None:
            thread.start()          # outside the lock: starting a thread may switch greenlets

    def _run(self) -> None:
        # A busy key's next script carries what its calls spent (and hands back its reserve) within
        # the interval: the flusher writes only what waited that long, or reached a limit.
        while not self._closed:
            self._wake.wait(self._until_due())
            self._wake.clear()
            if self._closed:
                return
            try:
                self._expire()
                due = self._due()
                if due and not self.flush(due):
                    self._retry_at = time.monotonic() + self.interval
            except Exception:       # the flusher must outlive any one failure
                logger.exception('Gateway limits flush failed; will retry')
                self._retry_at = time.monotonic() + self.interval

    def _after_fork(self) -> None:
        # The parent's spend and reserves are the parent's to write; this child starts empty.
        self._pending, self._reserves, self._writing = {}, {}, frozenset()
        self._lock, self._flushing = _list_lock(), threading.Lock()
        for plan in self._plans.values():
            plan.asking = None          # the parent's ask, answered in the parent
        self._wake, self._retry_at = threading.Event(), 0.0
        self._thread = None


def limiter(registry_store: Any, client: Any = None) -> Limiter:
    """The limiter of a chat store (a reloaded configuration's new store gets its own)."""
    found = _limiters.get(registry_store)
    if found is None:
        found = _limiters[registry_store] = Limiter(LimitStore(registry_store, client))
    elif client is not None and found.redis.client is not client:
        found.redis.client = client         # made for a report first: the gateway's requests bring theirs
    return found


class Admission:
    """A request of a limited key, admitted (``grant``) or not yet; what its call spends is counted here."""

    __slots__ = ('limiter', 'plan', 'grant', 'counted', 'urgent')

    def __init__(self, lim: Limiter, plan: Plan) -> None:
        self.limiter = lim
        self.plan = plan
        self.grant: Grant | None = None
        self.counted = False
        self.urgent = False         # its spend brought the key to its tpm or budget, as last seen

    def admit(self) -> Grant:
        """Admit the request in a round trip of its own, unless a rider admitted it already."""
        if self.grant is None:
            self.grant = self.limiter.admit(self.plan)
        return self.grant

    def headers(self) -> list[tuple[str, str]]:
        return (self.grant or self.admit()).headers()

    def settle(self, conn: Any, usage: dict) -> None:
        """Count what ``conn``'s call spent, ``usage`` (once): kept in the process, written by the next
        round trip. ``conn`` is the connection that answered: a fallback is priced as itself."""
        grant = self.grant
        if grant is None or self.counted:
            return
        self.counted = True
        tokens = int(usage.get('input_tokens') or 0) + int(usage.get('output_tokens') or 0)
        cost = int(usage.get('cost') or 0) or cost_micro_usd(conn.conf.pricing, usage)
        if not tokens and not cost:
            return
        plan = self.plan
        # Near a limit, as this process last saw the counters: written now, so other processes see it.
        urgent = bool((plan.tpm and grant.tokens + tokens >= plan.tpm) or
                      (plan.budget and grant.spent + cost >= plan.budget))
        grant.tokens += tokens
        grant.spent += cost
        if grant.reserve is not None:       # what this process's next requests from it see
            grant.reserve.tokens += tokens
            grant.reserve.spent += cost
        self.urgent = urgent
        self.limiter.add(self.plan, tokens, cost, urgent)

    # -- riding another round trip (:meth:`llmconn.store.records.RecordStore.save`) -----------

    def admit_rider(self) -> 'Rider | None':
        """Admission in the pipeline of another write, or None when admitted already: from the reserve,
        or (on a cluster) now."""
        if self.grant is None:
            self.grant = self.limiter.reserved(self.plan) or self.limiter.after_asking(self.plan)
        if self.grant is not None:
            return None
        if self.limiter.redis.cluster:
            self.admit()
            return None
        return Rider(self, True)

    def settle_rider(self) -> 'Rider | None':
        """The key's kept spend, written with another write, when this call brought the key to a limit.

        Otherwise (and on a cluster) it waits for the key's next admission, which the next request
        makes anyway, or the flush: a second command on every ending cost more CPU than it saves.
        """
        return Rider(self, False) if self.urgent and not self.limiter.redis.cluster else None


class Rider:
    """One ADMIT run sent after another write, in its round trip, carrying what the key's script writes."""

    __slots__ = ('admission', 'admits', 'kept', 'asking')

    def __init__(self, admission: Admission, admits: bool) -> None:
        self.admission = admission
        self.admits = admits            # admits the request; else only settles
        self.kept = NOTHING
        self.asking: threading.Event | None = None      # its ask for a reserve, answered by answer or failed

    def command(self) -> tuple | None:
        """The command to send (None: nothing to), what was kept now carried by it."""
        adm = self.admission
        self.kept = adm.limiter.take(adm.plan)
        if not self.admits and not self.kept:
            return None
        argv, self.asking = adm.plan.run(self.kept, self.admits)
        return adm.limiter.redis.command(adm.plan.keys, argv)

    def answer(self, result: Any) -> None:
        """The command's reply; an admission refused raises its 429, a failed one its 503."""
        try:
            self._answer(result)
        finally:
            self._answered()

    def _answer(self, result: Any) -> None:
        adm = self.admission
        if isinstance(result, BaseException):
            self.failed()
            if adm.limiter.redis.missing_script(result):     # a new (or restarted) Redis: loaded once
                if self.admits:
                    adm.grant = adm.limiter.admit(adm.plan)
                else:
                    adm.limiter.redis.load()
                return
            if not self.admits:
                return              # kept for the next write
            with adm.limiter.redis.boundary():
                raise result
        if self.admits:
            adm.grant = verdict(adm.plan, result)
            adm.limiter.hold(adm.grant)

    def failed(self) -> None:
        adm = self.admission
        adm.limiter.give_back(self.kept)
        self.kept = NOTHING
        self._answered()

    def _answered(self) -> None:
        # Its ask for a reserve (if it made one) is over: the key's requests waiting on it go on.
        self.admission.plan.answered(self.asking)
        self.asking = None


def admission(gw: Any, key: Any) -> Admission | None:
    """The admission of a request of ``key`` on gateway ``gw``; None (and no round trip) for a key without limits."""
    if not key.limits.enabled:
        return None
    lim = gw.limiter
    return Admission(lim, lim.plan(key))


def spent(adm: Admission | None, conn: Any, usage: dict) -> None:
    """Count ``usage``, what ``conn`` answered with, against ``adm`` (nothing for a key without limits):
    an answer's reported usage, or the estimate of a stream its client left (as the ledger counts it)."""
    if adm is not None:
        adm.settle(conn, usage)


def report(registry: Any) -> list[dict]:
    """Each limited key's use in the current minute and period against its limits (``llmconn usage``, ``/admin``)."""
    rows = []
    lim = limiter(registry.store)
    for key in registry.config.gateway.keys:
        limits = key.limits
        if not limits.enabled:
            continue
        requests, tokens, spent, period = lim.redis.read(lim.plan(key).keys, lim.plan(key).spec)
        rows.append({'key': key.id, 'requests': requests, 'rpm': limits.rpm, 'tokens': tokens, 'tpm': limits.tpm,
                     'spent_usd': spent / 1e6, 'budget_usd': limits.budget_usd, 'period': period_name(period)})
    return rows


def period_name(period: int) -> str:
    """A period as the script numbers it (a day since 1970, or YYYYMM) as ``2026-12-01`` or ``2026-12``."""
    if period > 190000:
        return f'{period // 100}-{period % 100:02d}'
    return time.strftime('%Y-%m-%d', time.gmtime(period * 86400))


def format_report(rows: list[dict]) -> str:
    """The rows of :func:`report` as a text table; a limit a key does not have shows as ``-``."""
    def of(used: Any, limit: Any, fmt: str = '{}') -> str:
        return f'{fmt.format(used)} / {fmt.format(limit) if limit is not None else "-"}'
    lines = [f'{"gateway key":<24} {"requests this minute":>22} {"tokens this minute":>24} {"spent (USD)":>22}  period']
    for r in rows:
        lines.append(f'{r["key"]:<24} {of(r["requests"], r["rpm"]):>22} {of(r["tokens"], r["tpm"]):>24} '
                     f'{of(r["spent_usd"], r["budget_usd"], "{:.4f}"):>22}  {r["period"]}')
    return '\n'.join(lines)


def _forget_parent_state() -> None:
    for lim in list(_all):
        lim._after_fork()


def _close_at_exit() -> None:
    for lim in list(_all):
        lim.close()


os.register_at_fork(after_in_child=_forget_parent_state)
atexit.register(_close_at_exit)
