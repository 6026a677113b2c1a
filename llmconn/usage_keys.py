"""Where the usage ledger lives in Redis: its key names, hash fields and cluster slot tags.

Hashes in the chat store's Redis, expiring ``RETENTION_DAYS`` after they
were created::

    llmconn:usage:<YYYY-MM-DD>            one hash per UTC day (one Redis, Sentinel, memory://)
    llmconn:usage:{<tag>}:<YYYY-MM-DD>    Redis Cluster: one hash per day and slot

A hash field is ``<connection>:<model>:<key>:<counter>``, the first three
base64url-encoded as in :mod:`llmconn.store.keys` (so ``:`` separates them
safely); ``<key>`` is the gateway key and empty until there is one. Counters:
``calls``, ``errors``, the token counts of :data:`llmconn.types.USAGE_KEYS`
(input, output, cache read and written, reasoning), ``cost`` (micro-USD, for a
connection with ``pricing``), ``tool_calls``, ``failovers`` (calls this connection
failed that moved on to a fallback, see :mod:`llmconn.failover`; the call
itself counts under the connection that answered) and
``error:<status>`` (see :func:`llmconn.usage.error_status`: the provider's
HTTP status, ``timeout``, ``no_response``, ``cancelled``, or the class of the
llmconn error that ended the call, such as ``ChatBusy``).

On a cluster a script may touch only its chat's slot, so the hash a save
script writes is the day's hash *of that slot*: ``<tag>`` comes from a table
mapping each of the 16384 slots to a short tag hashing to it. Their number
stays bounded: at most one per slot and day.
"""

from __future__ import annotations

import threading
import time as mod_time
from typing import Any

from llmconn.store.keys import HASH_SLOTS, KEY_PREFIX, encode, slot_of
from llmconn.types import USAGE_KEYS

USAGE_PREFIX = f'{KEY_PREFIX}:usage:'
RETENTION_DAYS = 400                    # a day's counts are kept for over a year
RETENTION_TTL = RETENTION_DAYS * 86400  # the save script has it too: scripts.USAGE_TTL_S
# What a result's usage reports (llmconn.types.USAGE_KEYS), counted under the same names, and the
# cost of a priced connection's call (integer micro-USD, llmconn.pricing).
TOKEN_COUNTERS = (*USAGE_KEYS, 'cost')
COUNTERS = ('calls', 'errors', *TOKEN_COUNTERS, 'tool_calls', 'failovers')
ERROR_PREFIX = 'error:'

_slot_tags: list[str] = []
_slot_tags_lock = threading.Lock()


def slot_tags() -> list[str]:
    """For each cluster slot, a short hash tag whose keys land in it (built once, about 0.1 s)."""
    if not _slot_tags:
        with _slot_tags_lock:
            if not _slot_tags:
                tags: list[Any] = [None] * HASH_SLOTS
                missing, i = HASH_SLOTS, 0
                while missing:
                    tag = format(i, 'x')
                    slot = slot_of(tag)
                    if tags[slot] is None:
                        tags[slot] = tag
                        missing -= 1
                    i += 1
                _slot_tags.extend(tags)
    return _slot_tags


def day_of(ts: float) -> str:
    """The UTC day of a timestamp, as the ledger's keys spell it."""
    return mod_time.strftime('%Y-%m-%d', mod_time.gmtime(ts))


def ledger_key(day: str, slot: int | None = None) -> str:
    """The hash of ``day``; on a cluster, the one living in ``slot``."""
    if slot is None:
        return USAGE_PREFIX + day
    return f'{USAGE_PREFIX}{{{slot_tags()[slot]}}}:{day}'


def field_prefix(conn_name: str, model: str, key: str = '') -> str:
    """``<connection>:<model>:<key>:``, encoded; a counter's name completes the field."""
    return ':'.join(encode(n) for n in (conn_name, model, key)) + ':'

