"""Per-key limits on the gateway (SPEC §18): rpm, tpm and a budget per day or month.

How a request is counted, across every gateway process sharing the Redis:

* Before the call, one script (:data:`llmconn.store.limits.ADMIT`) reads the
  key's counters and, unless a limit is reached, counts the request in the
  current minute: the check and the count are one atomic step, so a burst
  from many processes is admitted exactly ``rpm`` times a minute.
* After the call, a second script adds its tokens (input + output) to the
  minute it ended in and its cost (micro-USD, the connection's ``pricing``)
  to the period. tpm and the budget are therefore counted *after* the call:
  a request is refused once the minute's tokens reached tpm, or the
  period's spend reached the budget, so either is overspent by at most the
  requests already in flight. A stream the client left early adds no tokens.
* A key without limits costs no Redis round trip. With limits, Redis down is
  a 503 (:class:`~llmconn.errors.StoreError`): never unlimited service.

Every answer of a limited key carries OpenAI's ``x-ratelimit-*`` headers.
"""

from __future__ import annotations

import calendar
import contextvars
import logging
import time
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from llmconn.errors import LimitExceeded, StoreError
from llmconn.pricing import cost_micro_usd
from llmconn.store.limits import LimitStore, limit_keys

logger = logging.getLogger('llmconn.gateway')

MINUTE_TTL = 120                                    # a minute's counters outlive it, for the one after
PERIOD_TTL = {'day': 2 * 86400, 'month': 32 * 86400}
_current: contextvars.ContextVar['Grant | None'] = contextvars.ContextVar('llmconn_limit_grant', default=None)
_stores: 'weakref.WeakKeyDictionary[Any, LimitStore]' = weakref.WeakKeyDictionary()   # per chat store


def period_of(now: float, period: str) -> str:
    """The budget period ``now`` falls in, in UTC: ``2026-12-01`` or ``2026-12``."""
    return time.strftime('%Y-%m-%d' if period == 'day' else '%Y-%m', time.gmtime(now))


@dataclass(slots=True)
class Grant:
    """An admitted request of a limited key: where its spend is counted, and its answer's headers."""

    store: LimitStore
    key: Any
    keys: tuple[str, str, str]
    requests: int
    tokens: int
    reset: float                    # seconds to the next minute

    def headers(self) -> list[tuple[str, str]]:
        return rate_headers(self.key.limits, self.requests, self.tokens, self.reset)

    def settle(self, conn: Any, usage: dict | None) -> None:
        """Count what the call spent; a store failure now is logged (the answer is already out)."""
        usage = usage or {}
        tokens = int(usage.get('input_tokens') or 0) + int(usage.get('output_tokens') or 0)
        cost = int(usage.get('cost') or 0) or cost_micro_usd(getattr(conn.conf, 'pricing', None), usage)
        if not tokens and not cost:
            return
        try:
            self.store.settle(self.keys[1], self.keys[2], tokens, cost, MINUTE_TTL,
                              PERIOD_TTL[self.key.limits.budget_period])
        except StoreError as e:
            logger.error('Could not count %d tokens of gateway key %s against its limits: %s', tokens,
                         self.key.id, e)


def rate_headers(limits: Any, requests: int, tokens: int, reset: float) -> list[tuple[str, str]]:
    headers = []
    if limits.rpm is not None:
        headers += [('x-ratelimit-limit-requests', str(limits.rpm)),
                    ('x-ratelimit-remaining-requests', str(max(0, limits.rpm - requests))),
                    ('x-ratelimit-reset-requests', f'{max(1, int(reset + 0.999))}s')]
    if limits.tpm is not None:
        headers += [('x-ratelimit-limit-tokens', str(limits.tpm)),
                    ('x-ratelimit-remaining-tokens', str(max(0, limits.tpm - tokens))),
                    ('x-ratelimit-reset-tokens', f'{max(1, int(reset + 0.999))}s')]
    return headers


def _store(registry_store: Any) -> LimitStore:
    store = _stores.get(registry_store)
    if store is None:           # a reloaded configuration's new store gets its own scripts
        store = _stores[registry_store] = LimitStore(registry_store)
    return store


def admit(gw: Any, key: Any, clock: Callable[[], float] = time.time) -> Grant | None:
    """Count a request of ``key``, or refuse it with 429; None (and no round trip) for a key without limits."""
    limits = key.limits
    if not limits.enabled:
        return None
    now = clock()
    minute = int(now // 60)
    reset = 60 - now % 60
    keys = limit_keys(key.id, minute, period_of(now, limits.budget_period))
    store = _store(gw.registry.store)
    budget = round(limits.budget_usd * 1_000_000) if limits.budget_usd is not None else 0
    verdict, requests, tokens, spent = store.admit(keys, limits.rpm or 0, limits.tpm or 0, budget, MINUTE_TTL)
    if verdict == 0:
        return Grant(store, key, keys, requests, tokens, reset)
    headers = rate_headers(limits, requests, tokens, reset)
    if verdict == 3:
        retry = _period_end(now, limits.budget_period) - now
        raise LimitExceeded(f'You exceeded your current quota: gateway key {key.id!r} spent its '
                            f'{limits.budget_period}ly budget of ${limits.budget_usd:g} '
                            f'(${spent / 1e6:.2f}); it renews at the start of the next {limits.budget_period} (UTC).',
                            'insufficient_quota', headers + [('Retry-After', str(int(retry) + 1))])
    what = (f'requests per minute (RPM): Limit {limits.rpm}, Used {requests}' if verdict == 1 else
            f'tokens per minute (TPM): Limit {limits.tpm}, Used {tokens}')
    raise LimitExceeded(f'Rate limit reached for gateway key {key.id!r} on {what}. '
                        f'Please try again in {int(reset) + 1}s.', 'rate_limit_exceeded',
                        headers + [('Retry-After', str(int(reset) + 1))])


def _period_end(now: float, period: str) -> float:
    day = now // 86400 * 86400 + 86400
    if period == 'day':
        return day
    t = time.gmtime(now)
    year, month = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
    return float(calendar.timegm((year, month, 1, 0, 0, 0)))


@contextmanager
def granted(grant: Grant | None) -> Iterator[None]:
    """While the route prepares its call, the calls it starts are settled against ``grant``."""
    token = _current.set(grant)
    try:
        yield
    finally:
        _current.reset(token)


def settled(conn: Any, events: Iterator) -> Iterator:
    """``events`` of a call started under a grant, counted against it when they end; else ``events``."""
    grant = _current.get()
    if grant is None:
        return events
    return _settling(grant, conn, events)


def _settling(grant: Grant, conn: Any, events: Iterator) -> Iterator:
    usage = None
    try:
        for event in events:
            if event.type == 'done':
                usage = getattr(event.reply, 'usage', None)
            yield event
    finally:
        close = getattr(events, 'close', None)
        if close is not None:
            close()
        grant.settle(conn, usage)


def report(registry: Any, clock: Callable[[], float] = time.time) -> list[dict]:
    """Each limited key's use in the current minute and period against its limits (``llmconn usage``, ``/admin``)."""
    now = clock()
    rows = []
    for key in registry.config.gateway.keys:
        limits = key.limits
        if not limits.enabled:
            continue
        period = period_of(now, limits.budget_period)
        requests, tokens, spent = _store(registry.store).read(limit_keys(key.id, int(now // 60), period))
        rows.append({'key': key.id, 'requests': requests, 'rpm': limits.rpm, 'tokens': tokens, 'tpm': limits.tpm,
                     'spent_usd': spent / 1e6, 'budget_usd': limits.budget_usd, 'period': period})
    return rows


def format_report(rows: list[dict]) -> str:
    """The rows of :func:`report` as a text table; a limit a key does not have shows as ``-``."""
    def of(used: Any, limit: Any, fmt: str = '{}') -> str:
        return f'{fmt.format(used)} / {fmt.format(limit) if limit is not None else "-"}'
    lines = [f'{"gateway key":<24} {"requests this minute":>22} {"tokens this minute":>24} {"spent (USD)":>22}  period']
    for r in rows:
        lines.append(f'{r["key"]:<24} {of(r["requests"], r["rpm"]):>22} {of(r["tokens"], r["tpm"]):>24} '
                     f'{of(r["spent_usd"], r["budget_usd"], "{:.4f}"):>22}  {r["period"]}')
    return '\n'.join(lines)
