"""The Redis side of per-key gateway limits (SPEC §18): two scripts, one per end of a call.

A key's counters share one hash tag, so each script touches one slot (a
cluster runs it too). The minute and the budget period are fixed windows
named in the counters' keys; every gateway process sharing the Redis counts
in the same keys, so the limits hold across processes. Redis errors become
:class:`~llmconn.errors.StoreError` through the store's boundary.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

from llmconn.store.keys import KEY_PREFIX

if TYPE_CHECKING:
    from llmconn.store.history import ChatStore

# Admits one request, or says which limit refuses it; counts the request when admitted.
#   KEYS[1] - requests in this minute, KEYS[2] - tokens in this minute, KEYS[3] - micro-USD spent this period
#   ARGV[1] - rpm, ARGV[2] - tpm, ARGV[3] - budget in micro-USD (each 0: no such limit),
#   ARGV[4] - the minute counters' ttl (s)
# Returns {verdict, requests, tokens, spent}: verdict 0 admitted (requests counts it), 1 rpm reached,
# 2 tpm reached, 3 budget spent.
ADMIT = """
local requests = tonumber(redis.call('GET', KEYS[1]) or '0')
local tokens = tonumber(redis.call('GET', KEYS[2]) or '0')
local spent = tonumber(redis.call('GET', KEYS[3]) or '0')
local rpm, tpm, budget = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if budget > 0 and spent >= budget then
    return {3, requests, tokens, spent}
end
if rpm > 0 and requests >= rpm then
    return {1, requests, tokens, spent}
end
if tpm > 0 and tokens >= tpm then
    return {2, requests, tokens, spent}
end
requests = redis.call('INCR', KEYS[1])
if requests == 1 then
    redis.call('EXPIRE', KEYS[1], ARGV[4])
end
return {0, requests, tokens, spent}
"""

# Counts what an admitted request spent, once it ended.
#   KEYS[1] - tokens in the minute it ended, KEYS[2] - micro-USD spent this period
#   ARGV[1] - tokens, ARGV[2] - micro-USD, ARGV[3] - the minute's ttl (s), ARGV[4] - the period's ttl (s)
# Returns 1.
SETTLE = """
if tonumber(ARGV[1]) > 0 then
    redis.call('INCRBY', KEYS[1], ARGV[1])
    redis.call('EXPIRE', KEYS[1], ARGV[3])
end
if tonumber(ARGV[2]) > 0 then
    redis.call('INCRBY', KEYS[2], ARGV[2])
    redis.call('EXPIRE', KEYS[2], ARGV[4])
end
return 1
"""


def limit_keys(key_id: str, minute: int, period: str) -> tuple[str, str, str]:
    """The counters of gateway key ``key_id``: requests and tokens in ``minute``, spend in ``period``."""
    # A digest in the hash tag: a key id may hold braces, which would move the tag.
    tag = hashlib.sha256(key_id.encode('utf-8', 'surrogatepass')).hexdigest()[:24]
    base = f'{KEY_PREFIX}:limits:{{{tag}}}'
    return f'{base}:rpm:{minute}', f'{base}:tpm:{minute}', f'{base}:spend:{period}'


class LimitStore:
    """Runs the two scripts through the chat store's client and error boundary."""

    def __init__(self, store: 'ChatStore') -> None:
        self._store = store
        self._scripts: dict[str, Any] = {}

    def admit(self, keys: tuple[str, str, str], rpm: int, tpm: int, budget: int, minute_ttl: int) -> list[int]:
        """``[verdict, requests, tokens, spent]`` (see :data:`ADMIT`)."""
        with self._store.boundary():
            return [int(x) for x in self._script(ADMIT)(keys=keys, args=[rpm, tpm, budget, minute_ttl])]

    def settle(self, tokens_key: str, spend_key: str, tokens: int, cost: int, minute_ttl: int,
               period_ttl: int) -> None:
        with self._store.boundary():
            self._script(SETTLE)(keys=(tokens_key, spend_key), args=[tokens, cost, minute_ttl, period_ttl])

    def read(self, keys: tuple[str, str, str]) -> list[int]:
        """The three counters now (0 for an absent one), for ``llmconn usage`` and ``/admin``."""
        with self._store.boundary():
            return [int(x or 0) for x in (self._store.client.get(k) for k in keys)]

    def _script(self, source: str) -> Any:
        script = self._scripts.get(source)
        if script is None:
            script = self._scripts[source] = self._store.client.register_script(source)
        return script
