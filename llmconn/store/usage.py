"""The usage ledger in Redis: its two write scripts and reading its day hashes back.

What is counted, and when, is :mod:`llmconn.usage`'s; where it lives is
:mod:`llmconn.usage_keys`'. This module sends a :class:`Batch` - the counts
of many calls, or of one call whose save may have run - through the chat
store's client, exactly once however often it is sent, and reads the
hashes back for ``llmconn usage`` and ``/admin``. Redis errors become
:class:`~llmconn.errors.StoreError` here, through the store's boundary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator

from llmconn.store.lock import SavedMarker

if TYPE_CHECKING:
    from llmconn.store.history import ChatStore

BATCH_MARKER_TTL = 86400                # a batch sent again within a day is recognized
SCAN_COUNT = 1000

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


@dataclass(frozen=True, slots=True)
class Batch:
    """Counts to add to one hash, once: its ``id`` names the marker that makes a re-send a no-op.

    With ``unless_saved`` the batch is one call whose save may have run:
    its first ``if_saved`` fields are added either way, the others only when
    the chat's saved tokens do not hold the save's token.
    """

    id: str
    key: str                            # the ledger hash (on a cluster, the marker shares its slot)
    ttl: int                            # the hash's expiry, s, renewed by each write
    fields: dict[str, int]
    unless_saved: SavedMarker | None = None
    if_saved: int = 0

    @property
    def marker(self) -> str:
        return f'{self.key}:batch:{self.id}'


class UsageStore:
    """The ledger's Redis: the chat store's own client and error boundary."""

    def __init__(self, store: 'ChatStore') -> None:
        self._store = store
        self._scripts: dict[str, Any] = {}      # registered on first use: connects nothing now

    @property
    def cluster(self) -> bool:
        return self._store.cluster

    def write(self, batch: Batch) -> int:
        """Add ``batch`` once (see the scripts' returns); :class:`StoreError` when Redis failed."""
        pairs = [item for pair in batch.fields.items() for item in pair]
        marker = batch.unless_saved
        if marker is None:
            with self._store.boundary():
                return self._script(FLUSH)(keys=(batch.key, batch.marker),
                                           args=[batch.ttl, BATCH_MARKER_TTL, *pairs])
        marker.fence()      # no save of this token can land from now on; raises while Redis is down
        with self._store.boundary():
            return self._script(FLUSH_UNLESS_SAVED)(keys=(batch.key, batch.marker, marker.saved_key),
                                                    args=[batch.ttl, BATCH_MARKER_TTL, marker.token,
                                                          batch.if_saved, *pairs])

    def _script(self, source: str) -> Any:
        script = self._scripts.get(source)
        if script is None:
            script = self._scripts[source] = self._store.client.register_script(source)
        return script


def read_hashes(store: 'ChatStore', match: str,
                keep: Callable[[str], bool]) -> Iterator[tuple[str, dict[str, str]]]:
    """(key, {field: value}) of every hash whose key matches ``match`` and ``keep`` (every master of a cluster)."""
    client = store.client
    for raw in store.scan(match, SCAN_COUNT):
        key = raw.decode()
        if not keep(key):
            continue
        with store.boundary():
            fields = client.hgetall(key)
        yield key, {f.decode(): v.decode() for f, v in fields.items()}
