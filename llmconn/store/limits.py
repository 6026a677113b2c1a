"""The Redis side of per-key gateway limits (SPEC §18): one script that settles, then admits.

A key's counters are one hash (one key, so a cluster runs the script too)::

    llmconn:limits:{<digest of the key id>}    m (minute number), r (requests), t (tokens) in it,
                                               p (period: day number or YYYYMM), s (micro-USD) in it

The windows are Redis's: the script reads ``TIME``, so every gateway process
sharing the Redis counts in the same minute and budget period whatever its
own clock says. A window that is not the current one counts as zero and is
rewritten by the next write. Redis 7 replicates a script's effects,
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
#   KEYS[1] - the key's counters; ARGV[1] - the key's limits: 'PERIOD RPM TPM BUDGET TTL', PERIOD 'day' or
#   'month', RPM, TPM and BUDGET (micro-USD) 0 for no such limit, TTL the counters' expiry (s)
_WINDOWS = """
if redis.replicate_commands then redis.replicate_commands() end
""" + _CALENDAR + """
local kind, rpm, tpm, budget, ttl = string.match(ARGV[1], '^(%a+) (%d+) (%d+) (%d+) (%d+)$')
rpm, tpm, budget = tonumber(rpm), tonumber(tpm), tonumber(budget)
local now = redis.call('TIME')
local secs, ms = tonumber(now[1]), math.floor(tonumber(now[2]) / 1000)
local minute, day = math.floor(secs / 60), math.floor(secs / 86400)
local period, period_end
if kind == 'day' then
    period, period_end = day, (day + 1) * 86400
else
    local year, month = civil(day)
    period = year * 100 + month
    if month == 12 then year, month = year + 1, 1 else month = month + 1 end
    period_end = first_day(year, month) * 86400
end
local stored = redis.call('HMGET', KEYS[1], 'm', 'r', 't', 'p', 's')
local same_minute, same_period = tonumber(stored[1]) == minute, tonumber(stored[4]) == period
local requests, tokens, spent = 0, 0, 0
if same_minute then requests, tokens = tonumber(stored[2]) or 0, tonumber(stored[3]) or 0 end
if same_period then spent = tonumber(stored[5]) or 0 end
"""

# Adds what earlier calls of the key spent and hands back what a process reserved and did not use,
# then admits one request and reserves up to WANT more for that process (or says which limit refuses).
#   KEYS[1], ARGV[1] as above; ARGV[2] - tokens to add, ARGV[3] - micro-USD to add,
#   ARGV[4] - '0' to add only, else 'WANT MAXTOKENS MAXCOST': admit one and reserve up to WANT more, as
#   long as the rpm keeps RESERVE_SHARE times the reserve free and tpm and budget keep MARGIN times the
#   reserve's worth at the most a call of the key took (MAXTOKENS, MAXCOST; -1 not known yet: no reserve);
#   ARGV[5] - 'BACK MINUTE': requests reserved in MINUTE and not used (given back in that minute only).
# Returns 'VERDICT REQUESTS TOKENS SPENT MS_TO_NEXT_MINUTE S_TO_NEXT_PERIOD PERIOD GRANTED MINUTE' (one reply
# to parse): verdict 0 admitted (requests counts it and the GRANTED - 1 reserved), 1 rpm reached, 2 tpm
# reached, 3 budget spent.
ADMIT = _WINDOWS + """
local RESERVE_SHARE, MARGIN = 16, 4
local add_tokens, add_cost = tonumber(ARGV[2]), tonumber(ARGV[3])
tokens, spent = tokens + add_tokens, spent + add_cost
local back, back_minute = string.match(ARGV[5], '^(%d+) (%d+)$')
back = same_minute and tonumber(back_minute) == minute and math.min(tonumber(back), requests) or 0
requests = requests - back
local verdict, counted = 0, 0
local want, max_tokens, max_cost = string.match(ARGV[4], '^(%d+) (-?%d+) (-?%d+)$')
if want then
    if budget > 0 and spent >= budget then
        verdict = 3
    elseif rpm > 0 and requests >= rpm then
        verdict = 1
    elseif tpm > 0 and tokens >= tpm then
        verdict = 2
    else
        local reserve = tonumber(want)
        if rpm > 0 then reserve = math.min(reserve, math.floor((rpm - requests - 1) / RESERVE_SHARE)) end
        max_tokens, max_cost = tonumber(max_tokens), tonumber(max_cost)
        if tpm > 0 and max_tokens < 0 or budget > 0 and max_cost < 0 then
            reserve = 0         -- what a call of the key takes is not known yet
        end
        if tpm > 0 and max_tokens > 0 then
            reserve = math.min(reserve, math.floor((tpm - tokens) / (MARGIN * max_tokens)))
        end
        if budget > 0 and max_cost > 0 then
            reserve = math.min(reserve, math.floor((budget - spent) / (MARGIN * max_cost)))
        end
        counted = 1 + math.max(0, reserve)
        requests = requests + counted
    end
end
local renewed = false
if counted + back + add_tokens > 0 then
    if same_minute then
        if counted - back ~= 0 then redis.call('HINCRBY', KEYS[1], 'r', counted - back) end
        if add_tokens > 0 then redis.call('HINCRBY', KEYS[1], 't', ARGV[2]) end
    else
        redis.call('HSET', KEYS[1], 'm', minute, 'r', counted, 't', ARGV[2])
        renewed = true
    end
end
if add_cost > 0 then
    if same_period then
        redis.call('HINCRBY', KEYS[1], 's', ARGV[3])
    else
        redis.call('HSET', KEYS[1], 'p', period, 's', ARGV[3])
        renewed = true
    end
end
if renewed then redis.call('EXPIRE', KEYS[1], ttl) end      -- once a minute at most: a new window
return string.format('%d %d %d %d %d %d %d %d %d', verdict, requests, tokens, spent,
                     60000 - (secs % 60) * 1000 - ms, period_end - secs, period, counted, minute)
"""

# The counters now, for ``llmconn usage`` and ``/admin``: {requests, tokens, spent, period}.
READ = _WINDOWS + """
return {requests, tokens, spent, period}
"""

SETTLE_ONLY = '0'
NOTHING_BACK = '0 0'


def limit_key(key_id: str) -> str:
    """The counters of gateway key ``key_id``: one hash (this minute's and this period's)."""
    # A digest in the hash tag: a key id may hold braces, which would move the tag.
    tag = hashlib.sha256(key_id.encode('utf-8', 'surrogatepass')).hexdigest()[:24]
    return f'{KEY_PREFIX}:limits:{{{tag}}}'


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

    def admit(self, keys: tuple[str], args: tuple) -> Any:
        """The reply of :data:`ADMIT` (its seven numbers in one string).

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
    def command(keys: tuple[str], args: tuple) -> tuple:
        """The EVALSHA of :data:`ADMIT`, for another write's round trip to carry."""
        return ('EVALSHA', ADMIT_SCRIPT.sha, len(keys), *keys, *args)

    def settle_many(self, runs: list[tuple[tuple[str], tuple]]) -> None:
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

    def read(self, keys: tuple[str], spec: str) -> list[int]:
        """``[requests, tokens, spent, period]`` now (0 for an absent counter); ``spec`` is ARGV[1]."""
        with self._store.boundary():
            return [int(x) for x in READ_SCRIPT.run(self.client, keys, [spec])]
