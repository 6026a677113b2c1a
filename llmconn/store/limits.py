"""The Redis side of per-key gateway limits (SPEC §18): one script that settles, then admits.

A key's counters are two hashes under one hash tag (one slot, so a cluster
runs the script too)::

    llmconn:limits:{<digest of the key id>}:minute    m (minute number), r (requests), t (tokens)
    llmconn:limits:{<digest of the key id>}:spend     p (period: day number or YYYYMM), s (micro-USD)

The windows are Redis's: the script reads ``TIME``, so every gateway process
sharing the Redis counts in the same minute and budget period whatever its
own clock says. A hash whose window is not the current one counts as zero
and is rewritten by the next write. Redis 7 replicates a script's effects,
so ``TIME`` before a write is safe (older servers are asked to, as well).

What a call spent is not a round trip of its own: the process keeps it
(:class:`~llmconn.gateway.limits` decides when) and hands it to the next
script of the same key, which adds it before it admits, or to a settle-only
run of the same script. Redis errors become
:class:`~llmconn.errors.StoreError` through the chat store's boundary.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

from redis.exceptions import NoScriptError

from llmconn.store.keys import KEY_PREFIX

if TYPE_CHECKING:
    from llmconn.store.history import ChatStore

# Days since 1970-01-01 to the (proleptic Gregorian) year and month, and back to a month's first day.
_CALENDAR = """
local function civil(days)                  -- days since 1970-01-01 -> year, month (proleptic Gregorian)
    local z = days + 719468
    local era = math.floor(z / 146097)
    local doe = z - era * 146097
    local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524) - math.floor(doe / 146096)) / 365)
    local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
    local mp = math.floor((5 * doy + 2) / 153)
    local month = mp < 10 and mp + 3 or mp - 9
    return yoe + era * 400 + (month <= 2 and 1 or 0), month
end
local function first_day(year, month)       -- year, month -> days since 1970-01-01 of its first day
    if month <= 2 then year = year - 1 end
    local era = math.floor(year / 400)
    local yoe = year - era * 400
    local mp = month > 2 and month - 3 or month + 9
    local doy = math.floor((153 * mp + 2) / 5)
    return era * 146097 + yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy - 719468
end
"""

# The current minute and budget period by Redis's clock, and the key's counters in them.
#   KEYS[1] - the minute hash, KEYS[2] - the spend hash; ARGV[1] - the period: 'day' or 'month'
_WINDOWS = """
if redis.replicate_commands then redis.replicate_commands() end
""" + _CALENDAR + """
local now = redis.call('TIME')
local secs, ms = tonumber(now[1]), math.floor(tonumber(now[2]) / 1000)
local minute, day = math.floor(secs / 60), math.floor(secs / 86400)
local period, period_end
if ARGV[1] == 'day' then
    period, period_end = day, (day + 1) * 86400
else
    local year, month = civil(day)
    period = year * 100 + month
    if month == 12 then year, month = year + 1, 1 else month = month + 1 end
    period_end = first_day(year, month) * 86400
end
local window = redis.call('HMGET', KEYS[1], 'm', 'r', 't')
local same_minute = tonumber(window[1]) == minute
local requests, tokens = 0, 0
if same_minute then requests, tokens = tonumber(window[2]) or 0, tonumber(window[3]) or 0 end
local budget_window = redis.call('HMGET', KEYS[2], 'p', 's')
local same_period = tonumber(budget_window[1]) == period
local spent = 0
if same_period then spent = tonumber(budget_window[2]) or 0 end
"""

# Adds what earlier calls of the key spent, then admits one request (or says which limit refuses it).
#   KEYS as above; ARGV[1] - 'day' or 'month', ARGV[2] - rpm, ARGV[3] - tpm, ARGV[4] - budget in micro-USD
#   (each 0: no such limit), ARGV[5] - the minute hash's ttl (s), ARGV[6] - the spend hash's ttl (s),
#   ARGV[7] - tokens to add, ARGV[8] - micro-USD to add, ARGV[9] - '1' to admit, '0' to add only.
# Returns {verdict, requests, tokens, spent, ms to the next minute, s to the next period, period}:
# verdict 0 admitted (requests counts it), 1 rpm reached, 2 tpm reached, 3 budget spent.
ADMIT = _WINDOWS + """
local add_tokens, add_cost = tonumber(ARGV[7]), tonumber(ARGV[8])
tokens, spent = tokens + add_tokens, spent + add_cost
local verdict, counted = 0, 0
if ARGV[9] == '1' then
    local rpm, tpm, budget = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
    if budget > 0 and spent >= budget then
        verdict = 3
    elseif rpm > 0 and requests >= rpm then
        verdict = 1
    elseif tpm > 0 and tokens >= tpm then
        verdict = 2
    else
        counted, requests = 1, requests + 1
    end
end
if counted + add_tokens > 0 then
    if same_minute then
        if counted > 0 then redis.call('HINCRBY', KEYS[1], 'r', 1) end
        if add_tokens > 0 then redis.call('HINCRBY', KEYS[1], 't', ARGV[7]) end
    else
        redis.call('HSET', KEYS[1], 'm', minute, 'r', counted, 't', ARGV[7])
        redis.call('EXPIRE', KEYS[1], ARGV[5])
    end
end
if add_cost > 0 then
    if same_period then
        redis.call('HINCRBY', KEYS[2], 's', ARGV[8])
    else
        redis.call('HSET', KEYS[2], 'p', period, 's', ARGV[8])
        redis.call('EXPIRE', KEYS[2], ARGV[6])
    end
end
return {verdict, requests, tokens, spent, 60000 - (secs % 60) * 1000 - ms, period_end - secs, period}
"""

# The counters now, for ``llmconn usage`` and ``/admin``: {requests, tokens, spent, period}.
READ = _WINDOWS + """
return {requests, tokens, spent, period}
"""

SETTLE_ONLY = '0'
ADMIT_ONE = '1'


def limit_keys(key_id: str) -> tuple[str, str]:
    """The counters of gateway key ``key_id``: its minute hash and its spend hash."""
    # A digest in the hash tag: a key id may hold braces, which would move the tag.
    tag = hashlib.sha256(key_id.encode('utf-8', 'surrogatepass')).hexdigest()[:24]
    base = f'{KEY_PREFIX}:limits:{{{tag}}}'
    return f'{base}:minute', f'{base}:spend'


class Script:
    """A script run by its sha (EVALSHA), loaded again when the server lost it (a restart, SCRIPT FLUSH)."""

    __slots__ = ('source', 'sha')

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def run(self, client: Any, keys: tuple, args: list) -> Any:
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            client.script_load(self.source)
            return client.evalsha(self.sha, len(keys), *keys, *args)

    def queue(self, pipe: Any, keys: tuple, args: list) -> None:
        """Add a run to ``pipe`` (no SCRIPT EXISTS round trip, as redis-py's own pipelined scripts make)."""
        pipe.evalsha(self.sha, len(keys), *keys, *args)


ADMIT_SCRIPT = Script(ADMIT)
READ_SCRIPT = Script(READ)


class LimitStore:
    """Runs the scripts through ``client`` (default the chat store's) and the chat store's error boundary."""

    def __init__(self, store: 'ChatStore', client: Any = None) -> None:
        self._store = store
        self.client = client if client is not None else store.client

    def boundary(self) -> Any:
        return self._store.boundary()

    @property
    def cluster(self) -> bool:
        """A Redis Cluster: its pipelines take no EVALSHA, so nothing rides another write's pipeline."""
        return self._store.cluster

    def admit(self, keys: tuple[str, str], args: list) -> list[int]:
        """``[verdict, requests, tokens, spent, ms to next minute, s to next period, period]`` (see :data:`ADMIT`).

        The chat store's own hot path runs it (its ``limits`` script): packed by hand on a pooled
        connection, NOSCRIPT reloaded, slot-routed on a cluster.
        """
        return self._store.script('limits', keys, args)

    @staticmethod
    def missing_script(result: Any) -> bool:
        """A pipelined run's answer that says the server lacked the script."""
        return isinstance(result, NoScriptError)

    def load(self) -> None:
        """Load the script (a pipeline that ran it found the server without it)."""
        with self._store.boundary():
            self.client.script_load(ADMIT)

    @staticmethod
    def command(keys: tuple[str, str], args: tuple) -> tuple:
        """The EVALSHA of :data:`ADMIT`, for another write's round trip to carry."""
        return ('EVALSHA', ADMIT_SCRIPT.sha, len(keys), *keys, *args)

    def settle_many(self, runs: list[tuple[tuple[str, str], list]]) -> None:
        """Settle-only runs of :data:`ADMIT`, all in one round trip (a pipeline)."""
        if self.cluster:        # off the hot path: one script per key, each on its slot's node
            for keys, args in runs:
                self._store.script('limits', keys, args)
            return
        with self._store.boundary():
            pipe = self.client.pipeline(transaction=False)
            for keys, args in runs:
                ADMIT_SCRIPT.queue(pipe, keys, args)
            results = pipe.execute(raise_on_error=False)
            if any(isinstance(r, NoScriptError) for r in results):      # the server lost it: once more
                self.client.script_load(ADMIT)
                pipe = self.client.pipeline(transaction=False)
                for (keys, args), r in zip(runs, results):
                    if isinstance(r, NoScriptError):
                        ADMIT_SCRIPT.queue(pipe, keys, args)
                results = pipe.execute(raise_on_error=False)
            for r in results:
                if isinstance(r, Exception):
                    raise r

    def read(self, keys: tuple[str, str], period: str) -> list[int]:
        """``[requests, tokens, spent, period]`` now (0 for an absent counter)."""
        with self._store.boundary():
            return [int(x) for x in READ_SCRIPT.run(self.client, keys, [period])]
