"""The distributed per-chat lock: acquire, wait in line, renew, hand over, save.

A :class:`ChatLock` is what :meth:`ChatStore.begin` hands back: proof that
this call, and no other in any process sharing the Redis, may extend the
chat. It carries the window read under the lock and ends in one of two ways:
:meth:`ChatLock.save` (append the turn and unlock, one round trip) or
:meth:`ChatLock.release` (unlock without saving, e.g. the provider failed).

The lock is a Redis string holding the call's random token, with an expiry
of ``lock_ttl``; a waiter that queues appends ``+`` to it (:data:`QUEUED`), so
that a save looks at the queue only when somebody queued while the lock was
held (a lock handed over from the queue starts marked). While held it is
renewed (RENEW, below) by one :class:`~llmconn.store.renewer.LockRenewer` per
store, so a provider call may run far longer than ``lock_ttl``; only a holder
that stops renewing loses it. Every script that writes, releases or
extends checks the token first (fencing).

Waiting in line, first come first served, without polling::

    t0  A holds the chat. B's ACQUIRE finds it taken: B is appended to the chat's
        queue (entry "token:ttl:deadline:window") and blocks in BLPOP on its own
        wake-up list, for as long as A's lock has left (A renewing keeps B asleep).
    t1  C queues behind B the same way.
    t2  A saves: FINISH pops the queue's head (B), sets the lock to B's token and
        pushes B's window (A's turn included) as B's wake-up: B holds the chat and
        has read it, in one round trip. The lock never becomes free, so nobody
        (not A calling again) can jump the queue.
    t3  B waited 40 s? It still has its place: its place is in Redis, not in a
        blocked connection, and re-blocking (each BLOCK_CAP, or a reconnect)
        never re-queues it.

Failure timelines, and why nothing is lost or duplicated::

    Holder killed: t0 A holds, B waits; t1 A is SIGKILLed, its renewer dies with
    it; t2 A's lock expires after lock_ttl. B's BLPOP was bounded by that ttl:
    B wakes, ACQUIRE finds the lock free with a queue, passes it to the queue's
    head (B itself, or whoever came first) - the order still holds.

    Waiter killed: its entry stays queued. A handoff to it reserves the lock
    for it (its ttl), nobody claims it, it expires: a dead waiter costs at
    most lock_ttl, as a dead holder does. An entry past its lock_wait deadline
    is skipped without a handoff. A waiter that gives up (ChatBusy) leaves the
    queue, and passes on a lock handed to it at that instant.

    Holder paused (GC, VM freeze, Redis unreachable) past lock_ttl: B takes the
    lock; A's renewal or save finds token_B, not token_A: nothing is written,
    the renewer marks A lost and save raises LockLost.

    Reply of a save lost (connection dropped after Redis ran it): the client
    sends it again. The lock is no longer A's, but FINISH remembers the tokens
    of the last SAVED_TOKENS saves of the chat: it finds token_A there and
    answers "already saved". Never LockLost for a stored turn, never two copies.

    Failover with an unreplicated write: A's lock (or A's save) reached the
    master but not its replica when the master died. The promoted replica
    has no lock: B takes it. A's save then finds token_B and writes nothing
    (LockLost) - A's turn is lost as a whole, never interleaved with B's.
    With ``redis.replicas: 1`` a save reports success only once a replica
    holds it (WAIT, same round trip), so no acknowledged turn is lost this way.

Scripts are literal constants below, each headed by its KEYS, ARGV and
return value; the handover loop is repeated in ACQUIRE and FINISH rather
than assembled, so each reads whole. All keys of a chat share one hash tag:
the wake-up list a script derives from the lock key lives in the same slot.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Protocol

from llmconn.errors import ChatBusy, LockLost, StoreError
from llmconn.types import Turn

if TYPE_CHECKING:
    from llmconn.store.keys import ChatKeys

logger = logging.getLogger(__name__)

# A waiter re-blocks at least this often (and re-checks the holder is alive);
# it keeps its place in the queue. Below the blocking client's socket timeout.
BLOCK_CAP = 30.0

# BLPOP's timeout 0 means "forever"; never ask for less than this.
MIN_BLOCK = 0.01

# How many saved tokens a chat remembers, so a re-sent save is recognised even
# if this many other calls saved in between (a re-send follows within a
# reconnect, so a handful would do). FINISH trims the list back to this many only once it
# holds 16 more, so a save mostly pays one LPUSH for it.
SAVED_TOKENS = 64

# Turns travel from ACQUIRE as one string, one compact JSON turn per line: JSON
# escapes every newline inside its strings, so the separator never occurs
# within a turn, and Python splits the window without parsing it.
TURN_SEPARATOR = b'\n'

# What a window line holding an attachment's bytes starts with ("=<sha256>:<base64>"); a turn's
# line starts with "{".
FILE_LINE = b'='


def split_files(window: bytes) -> tuple[bytes, dict[str, str]]:
    """A window from ACQUIRE (or a hand-over): its turns' lines, and the attachments' base64 by sha256."""
    if b'\n' + FILE_LINE not in window:        # no attachments (the common case), found at C speed
        return window, {}
    lines = window.split(TURN_SEPARATOR)
    turns = [line for line in lines if not line.startswith(FILE_LINE)]
    files = dict(line[1:].decode('ascii').split(':', 1) for line in lines if line.startswith(FILE_LINE))
    return TURN_SEPARATOR.join(turns), files


# FINISH's answers.
DONE, ALREADY_SAVED, NOT_OURS = 1, 2, 0

# What a lock's value ends with once somebody queued for it (or it was handed over from the
# queue): "<token>+". Its holder's save then looks at the queue; a lock nobody queued for is
# only deleted. Tokens are hex, so the mark is never part of one.
QUEUED = '+'

# Takes the lock and reads the window, or queues the caller.
#   KEYS[1] - lock, KEYS[2] - turns, KEYS[3] - queue, KEYS[4] - seq
#   ARGV[1] - our token, ARGV[2] - lock ttl (ms), ARGV[3] - the window: "W" (the last W turns)
#             or "W/K" (its start moves K turns at a time, see window_spec()),
#   ARGV[4] - how long we may wait (ms); '0' = do not queue,
#   ARGV[5] - our queue entry from an earlier attempt, or ''
# Returns {1, turns, sha256, base64, ...} - the window's turns, oldest first, joined
# by "\n", then each attachment they name (from the chat's "files" hash, the key beside
# KEYS[2]) - when the lock is ours (also when it already held our token: handed to us,
# or this call re-sent after a lost reply); else {0, pttl of the holder, our place, our
# entry}. A waiter the lock is handed to gets its window as one string, each attachment
# a line "=<sha256>:<base64>" after the turns. A caller that queues (or stays queued) marks
# the holder's lock "<token>+" (QUEUED), and so does a lock taken with others queued.
ACQUIRE = """
local function window(spec)             -- the window's turns, and {sha256, base64, ...} of their attachments
    local n, step = string.match(spec, '^(%d+)/?(%d*)$')
    n, step = tonumber(n) or 0, tonumber(step) or 1
    if step > 1 then                    -- past n turns, drop whole steps: n - step + 1 .. n are sent
        local stored = redis.call('LLEN', KEYS[2])
        if stored > n then n = stored - math.ceil((stored - n) / step) * step end
    end
    if n <= 0 then return '', {} end    -- LRANGE key -0 -1 would be the whole list
    local text, found = table.concat(redis.call('LRANGE', KEYS[2], -n, -1), '\\n'), {}
    if not string.find(text, '"sha256":"', 1, true) then return text, found end
    local files, seen = string.gsub(KEYS[2], 'turns$', 'files'), {}
    for sha in string.gmatch(text, '"sha256":"(%x+)"') do
        if not seen[sha] then
            seen[sha] = true
            local blob = redis.call('HGET', files, sha)
            if blob then found[#found + 1] = sha; found[#found + 1] = blob end
        end
    end
    return text, found
end
local function ours(spec)               -- {1, turns, sha256, base64, ...}: each blob its own reply element
    local text, found = window(spec)
    local reply = {1, text}
    for _, value in ipairs(found) do reply[#reply + 1] = value end
    return reply
end
local function handed(spec)             -- a waiter's window as one string: its attachments as lines
    local text, found = window(spec)
    local lines = {text}
    for i = 1, #found, 2 do lines[#lines + 1] = '=' .. found[i] .. ':' .. found[i + 1] end
    return table.concat(lines, '\\n')
end
local now                               -- the server's clock in ms, read only when a deadline is compared
local function clock()
    if not now then
        local t = redis.call('TIME')
        now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    end
    return now
end
-- Taken first, looked at after (one command on the common path, a free chat): nobody sees
-- the lock between two commands of a script, so holding it while the queue is looked at is
-- the same as looking first.
local holder = false
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    holder = redis.call('GET', KEYS[1])
    if holder == ARGV[1] or holder == ARGV[1] .. '+' then
        redis.call('PEXPIRE', KEYS[1], ARGV[2])
        return ours(ARGV[3])
    end
end
if not holder then
    -- Was free (it holds our token now). With nobody queued it is ours; with a queue its
    -- holder died: the head goes first.
    while true do
        local entry = redis.call('LPOP', KEYS[3])
        if not entry then
            return ours(ARGV[3])
        end
        local token, ttl, deadline, size = string.match(entry, '^(%x+):(%d+):(%d+):([%d/]+)$')
        if token == ARGV[1] then
            redis.call('SET', KEYS[1], ARGV[1] .. '+', 'PX', ARGV[2])   -- others may be queued behind us
            return ours(ARGV[3])
        end
        if token and tonumber(deadline) > clock() then
            holder = token .. '+'       -- others may be queued behind it
            redis.call('SET', KEYS[1], holder, 'PX', ttl)
            local wake = KEYS[1] .. ':' .. token
            redis.call('RPUSH', wake, handed(size))
            redis.call('PEXPIRE', wake, ttl)
            break
        end
    end
end
if ARGV[4] == '0' then
    return {0, redis.call('PTTL', KEYS[1]), 0, ''}
end
if string.byte(holder, -1) ~= 43 then       -- not marked '+' yet: its holder's save must look at the queue
    redis.call('SET', KEYS[1], holder .. '+', 'KEEPTTL')
end
local entry = ARGV[5]
if entry == '' or not redis.call('LPOS', KEYS[3], entry) then
    entry = ARGV[1] .. ':' .. ARGV[2] .. ':' .. (clock() + tonumber(ARGV[4])) .. ':' .. ARGV[3]
    redis.call('RPUSH', KEYS[3], entry)
    local place = redis.call('INCR', KEYS[4])     -- before its PEXPIRE: INCR may create the key
    local keep = tonumber(ARGV[4]) + tonumber(ARGV[2])
    if redis.call('PTTL', KEYS[3]) < keep then
        redis.call('PEXPIRE', KEYS[3], keep)
    end
    if redis.call('PTTL', KEYS[4]) < keep then
        redis.call('PEXPIRE', KEYS[4], keep)
    end
    return {0, redis.call('PTTL', KEYS[1]), place, entry}
end
return {0, redis.call('PTTL', KEYS[1]), 0, entry}
"""

# Saves a turn (or only releases) and hands the lock to the first live waiter, with its window.
#   KEYS[1] - lock, KEYS[2] - turns, KEYS[3] - queue, KEYS[4] - saved tokens
#   ARGV[1] - our token, ARGV[2] - the turn as compact JSON ('' = release, save nothing),
#   ARGV[3] - max stored turns, ARGV[4] - chat expiry (ms),
#   ARGV[5] - '1' to replace the last stored turn (a pending one) instead of appending, else '0';
#             followed by 'f' when the window or the turn names attachments: only then are the
#             chat's attachments kept alive with its turns (their bytes are only ever sent with
#             a turn of the window, and the window only moves on)
#   ARGV[6] - our queue entry, when we give up waiting, or ''
#   KEYS[5], ARGV[7] (optional) - a hash in this slot (a usage ledger) and its increments as
#   one string, "<expiry s> <field> <increment> <field> <increment> ...", space-separated
#   (one argument: packing each pair separately cost more than the save's own arguments);
#   counted with the saved turn, never for a re-sent save; the hash gets its expiry
#   ('0' = none) when the first field is new ('' with no ledger, when ARGV[8..] follow)
#   ARGV[8], ARGV[9], ... - pairs of sha256 and base64 bytes: the turn's attachments, kept in
#   the "files" hash beside KEYS[2] unless there already; "filerefs" beside it counts the
#   turns naming each (their "sha256":"..." in the JSON), and a hash no turn names any
#   more (trimmed or replaced) is deleted; both expire with the chat's last save that had
#   attachments in its window (then no window will name them again); a turn naming one
#   while "filerefs" has lapsed counts the stored turns' names again first
# Returns 1 - saved (or released); 2 - this token's turn was saved before (a re-sent
# save: nothing written again); 0 - the lock was not ours (nothing written). The queue is
# looked at only when the lock is marked QUEUED; else the lock is deleted.
FINISH = """
local files = string.gsub(KEYS[2], 'turns$', 'files')
local refs = string.gsub(KEYS[2], 'turns$', 'filerefs')
local function unref(turn)              -- a turn leaves the chat: its attachments lose a reference
    for sha in string.gmatch(turn, '"sha256":"(%x+)"') do
        if redis.call('HINCRBY', refs, sha, -1) <= 0 then
            redis.call('HDEL', refs, sha)
            redis.call('HDEL', files, sha)
        end
    end
end
local held = redis.call('GET', KEYS[1])
if held ~= ARGV[1] and held ~= ARGV[1] .. '+' then
    if ARGV[2] ~= '' then
        for _, token in ipairs(redis.call('LRANGE', KEYS[4], 0, -1)) do
            if token == ARGV[1] then return 2 end
        end
    elseif ARGV[6] ~= '' then
        redis.call('LREM', KEYS[3], 1, ARGV[6])
    end
    return 0
end
if ARGV[2] ~= '' then
    local max_turns = tonumber(ARGV[3])
    for i = 8, #ARGV, 2 do              -- the turn's new attachments, stored once per chat
        redis.call('HSETNX', files, ARGV[i], ARGV[i + 1])
    end
    if string.find(ARGV[2], '"sha256":"', 1, true) then     -- a plain search first: most turns name none
        if redis.call('EXISTS', refs) == 0 then     -- new, or lapsed while no window named any: count again
            for _, turn in ipairs(redis.call('LRANGE', KEYS[2], 0, -1)) do
                for sha in string.gmatch(turn, '"sha256":"(%x+)"') do
                    redis.call('HINCRBY', refs, sha, 1)
                end
            end
        end
        for sha in string.gmatch(ARGV[2], '"sha256":"(%x+)"') do
            redis.call('HINCRBY', refs, sha, 1)
        end
    end
    if string.byte(ARGV[5], 1) == 49 and redis.call('LLEN', KEYS[2]) > 0 then     -- '1': replace
        unref(redis.call('LINDEX', KEYS[2], -1))
        redis.call('LSET', KEYS[2], -1, ARGV[2])
    else
        local stored = redis.call('RPUSH', KEYS[2], ARGV[2])
        if stored > max_turns then      -- the oldest leave (popped: read and trimmed in one command)
            for _, turn in ipairs(redis.call('LPOP', KEYS[2], stored - max_turns)) do
                if string.find(turn, '"sha256":"', 1, true) and redis.call('EXISTS', refs) == 1 then
                    unref(turn)         -- it frees its attachments
                end
            end
        end
    end
    redis.call('PEXPIRE', KEYS[2], ARGV[4])
    if string.byte(ARGV[5], 2) == 102 then      -- 'f': the window or the turn names attachments
        redis.call('PEXPIRE', files, ARGV[4])
        redis.call('PEXPIRE', refs, ARGV[4])
    end
    if redis.call('LPUSH', KEYS[4], ARGV[1]) > 80 then      -- trimmed once per 17 saves, to SAVED_TOKENS
        redis.call('LTRIM', KEYS[4], 0, 63)
    end
    redis.call('PEXPIRE', KEYS[4], ARGV[4])
    if KEYS[5] then
        local expiry, first = string.match(ARGV[7], '^(%d+)'), true
        for field, n in string.gmatch(ARGV[7], ' (%S+) (%S+)') do
            local total = redis.call('HINCRBY', KEYS[5], field, n)
            if first and expiry ~= '0' and total == tonumber(n) then
                redis.call('EXPIRE', KEYS[5], expiry)
            end
            first = false
        end
    end
end
if held == ARGV[1] then                 -- nobody queued while it was ours
    redis.call('DEL', KEYS[1])
    return 1
end
local function window(spec)             -- as ACQUIRE's: the waiter's window, with its attachments
    local n, step = string.match(spec, '^(%d+)/?(%d*)$')
    n, step = tonumber(n) or 0, tonumber(step) or 1
    if step > 1 then
        local stored = redis.call('LLEN', KEYS[2])
        if stored > n then n = stored - math.ceil((stored - n) / step) * step end
    end
    if n <= 0 then return '' end
    local text = table.concat(redis.call('LRANGE', KEYS[2], -n, -1), '\\n')
    if not string.find(text, '"sha256":"', 1, true) then return text end
    local lines, seen = {text}, {}
    for sha in string.gmatch(text, '"sha256":"(%x+)"') do
        if not seen[sha] then
            seen[sha] = true
            local blob = redis.call('HGET', files, sha)
            if blob then lines[#lines + 1] = '=' .. sha .. ':' .. blob end
        end
    end
    return table.concat(lines, '\\n')
end
local now                               -- the server's clock in ms, read only when a deadline is compared
local function clock()
    if not now then
        local t = redis.call('TIME')
        now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    end
    return now
end
while true do
    local entry = redis.call('LPOP', KEYS[3])
    if not entry then
        redis.call('DEL', KEYS[1])
        return 1
    end
    local token, ttl, deadline, size = string.match(entry, '^(%x+):(%d+):(%d+):([%d/]+)$')
    if token and token ~= ARGV[1] and tonumber(deadline) > clock() then
        redis.call('SET', KEYS[1], token .. '+', 'PX', ttl)    -- others may be queued behind it
        local wake = KEYS[1] .. ':' .. token
        redis.call('RPUSH', wake, window(size))     -- so the waiter need not read it again
        redis.call('PEXPIRE', wake, ttl)
        return 1
    end
end
"""

# Extends the lock, if it is still ours (marked QUEUED or not).
#   KEYS[1] - lock
#   ARGV[1] - our token, ARGV[2] - lock ttl (ms)
# Returns 1 when extended, 0 when the lock was no longer ours.
RENEW = """
local held = redis.call('GET', KEYS[1])
if held ~= ARGV[1] and held ~= ARGV[1] .. '+' then
    return 0
end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
"""

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(',', ':')).encode


def window_spec(turns: int, step: int = 1) -> str:
    """The scripts' window argument: the last ``turns`` turns, or with ``step`` > 1 a window whose
    start moves ``step`` turns at a time once the chat holds more, so it keeps ``turns - step + 1``
    to ``turns`` of them and the same first turn for ``step`` calls in a row (SPEC §17).

    The start is computed from the stored count, so past ``max_stored_turns`` (the oldest turn
    trimmed on every save) it moves on every call again.
    """
    return str(turns) if step <= 1 else f'{turns}/{step}'


class LockBackend(Protocol):
    """What the lock needs of a store, and all it uses (as redis-py's ``Lock`` is handed a client).

    :class:`~llmconn.store.history.ChatStore` implements it; each call raises
    :class:`StoreError` (never a redis exception) when Redis fails.
    """

    def script(self, name: str, keys: tuple, args: tuple) -> Any:
        """Run the store's script ``name`` (``'acquire'``, ``'finish'``, ``'renew'``) once."""

    def block(self, key: str, timeout: float) -> Any:
        """BLPOP ``key`` for at most ``timeout`` s; None when nothing came (or the node changed role)."""

    def finish(self, keys: 'ChatKeys', args: tuple, *, durable: bool, extra_keys: tuple = ()) -> int:
        """Run FINISH; ``durable``: a save, re-sent until its outcome is known (and replicated if asked)."""

    def hold(self, lock: 'ChatLock') -> None:
        """Keep ``lock`` alive (renewed) until :meth:`let_go`."""

    def let_go(self, token: str) -> None:
        """Stop renewing the lock of ``token``."""


@dataclass(frozen=True, slots=True)
class SaveCounters:
    """Counters a save adds in its own script, once per saved turn (a usage ledger's day hash).

    ``key`` lives in the chat's slot (see :meth:`ChatKeys.beside`); ``counts``
    maps each field to its increment; ``expiry`` (s, 0 for none) is set when
    the first field is new in the hash.
    """

    key: str
    counts: dict[str, int]
    expiry: int = 0


@dataclass(frozen=True, slots=True)
class SavedMarker:
    """How to tell later whether a lock's save ran: the chat's saved tokens hold its token.

    ``fence()`` first releases the lock if the token still holds it, so that a
    save of it still in flight (sent, not yet arrived) finds the lock taken and
    writes nothing; only then do the saved tokens say for good whether it ran.
    """

    saved_key: str
    token: str
    fence: Callable[[], None]


def acquire(store: LockBackend, keys: 'ChatKeys', token: str, *, window: int | str, ttl_ms: int, lock_wait: float,
            clock: Callable[[], float], busy: Callable[[], ChatBusy]) -> tuple[bytes, int, dict[str, str]]:
    """Take the chat's lock, waiting in line up to ``lock_wait`` s: (the window, our place or 0, the
    base64 of its attachments by sha256; a window handed over holds them as lines, see :func:`split_files`)."""
    acquire_keys = (keys.lock, keys.turns, keys.queue, keys.seq)
    wait_ms = int(lock_wait * 1000)
    reply = store.script('acquire', acquire_keys, (token, ttl_ms, window, wait_ms, b''))
    if reply[0] == 1:
        return reply[1], 0, _files(reply) if len(reply) > 2 else _NO_FILES
    if wait_ms <= 0:
        raise busy()
    deadline = clock() + lock_wait
    pttl, place, entry = reply[1], reply[2], reply[3]
    try:
        while True:
            remaining = deadline - clock()
            if remaining <= 0:
                raise busy()
            # Asleep for as long as the holder's lock has left: a dead holder is noticed when it expires.
            timeout = min(remaining, BLOCK_CAP, pttl / 1000.0 if pttl > 0 else MIN_BLOCK if pttl == -2 else BLOCK_CAP)
            woken = store.block(keys.wake(token), max(timeout, MIN_BLOCK))
            if woken:       # handed over: the lock holds our token, the wake-up our window
                return woken[1], place, {}
            reply = store.script('acquire', acquire_keys, (token, ttl_ms, window, int(remaining * 1000) or 1, entry))
            if reply[0] == 1:
                return reply[1], place, _files(reply)
            pttl, entry = reply[1], reply[3]
    except BaseException as exc:
        # Giving up (ChatBusy), or cancelled (a greenlet killed, a client gone): leave the line, so
        # nobody hands this call the lock and waits for it. With Redis down there is nothing to leave.
        if not isinstance(exc, StoreError):
            _leave(store, keys, token, entry)
        raise


_NO_FILES: dict = {}     # never written: what a window without attachments comes with


def _files(reply: list) -> dict[str, str]:
    """ACQUIRE's attachments after the window: sha256, base64, ..."""
    if len(reply) <= 2:
        return {}
    return {sha.decode('ascii'): blob.decode('ascii') for sha, blob in zip(reply[2::2], reply[3::2])}


def _leave(store: LockBackend, keys: 'ChatKeys', token: str, entry: bytes) -> None:
    """Give up our place; a lock handed to us at this instant goes on to the next in line."""
    try:
        store.finish(keys, (token, b'', 0, 0, b'', entry), durable=False)
    except StoreError as exc:
        logger.warning('Could not leave the queue of a busy chat; its entry lapses by itself: %s', exc)


def _fence(store: LockBackend, keys: 'ChatKeys', token: str) -> None:
    """Release ``token``'s hold on the chat, if it still has one, and hand it to the next waiter."""
    store.finish(keys, (token, b'', 0, 0, b'0', b''), durable=False)


# FINISH's ARGV[5] of a save: (replace the last turn, keep the chat's attachments alive) -> flags.
_SAVE_FLAGS = {(False, False): b'0', (True, False): b'1', (False, True): b'0f', (True, True): b'1f'}

_formats: dict[tuple, str] = {}         # (*fields, expiry) -> FINISH's ARGV[7] with %d for each increment
MAX_FORMATS = 1024                      # field sets are per connection, model and key: few


def _increments(increments: dict, expiry: float) -> str:
    """FINISH's ARGV[7]: the expiry, then each field and its increment, space-separated.

    The fields are checked and the string's format made once per set of
    fields; a save only fills in the numbers.
    """
    key = (*increments, expiry)
    text = _formats.get(key)
    if text is None:
        fields = list(increments)
        if any(field.split() != [field] for field in fields):    # the script splits on whitespace
            raise ValueError(f'counter fields must be non-empty and without spaces, not {fields!r}')
        text = ' '.join([str(int(expiry)), *(field.replace('%', '%%') + ' %d' for field in fields)])
        if len(_formats) >= MAX_FORMATS:
            _formats.clear()
        _formats[key] = text
    return text % (*increments.values(),)


class ChatLock:
    """A held chat: its window in ``turns``, then exactly one ``save`` or ``release``."""

    __slots__ = ('turns', 'lost', 'place', 'files', '_store', '_keys', '_token', '_ttl_ms', '_open')

    def __init__(self, store: LockBackend, keys: 'ChatKeys', token: str, ttl_ms: int,
                 turns: list[Turn], place: int = 0, files: frozenset = frozenset()) -> None:
        self.turns = turns          # the window, oldest first
        self.files = files          # the sha256 of every attachment the window came with
        self.lost = False           # set by the renewer when the lock is found taken
        self.place = place          # this call's number in the chat's queue; 0 if it did not wait
        self._store = store
        self._keys = keys
        self._token = token
        self._ttl_ms = ttl_ms
        self._open = True           # save or release still has work to do

    def save(self, turn: Turn, *, expiry: float, max_turns: int, replace_last: bool = False,
             counters: SaveCounters | None = None) -> None:
        """Append ``turn`` (or replace the last, pending one), keep ``max_turns``, expire in ``expiry`` s, unlock.

        ``counters`` are added in the same script, once per saved turn (a
        re-sent save does not count twice). Raises :class:`LockLost`
        (nothing written) when the lock was no longer ours, and
        :class:`StoreError` when Redis failed or, with ``redis.replicas``, the
        turn did not reach enough replicas.
        """
        if not self._open:
            raise LockLost('This chat lock was already saved or released; begin a new call to save another turn')
        # From here on this lock must not be renewed, whatever the outcome.
        self._store.let_go(self._token)
        if self.lost:
            self._open = False
            raise self._lost()
        # surrogatepass: a lone surrogate in a text is stored, not a crash; json.loads reads it back.
        data = _dumps(turn.to_dict()).encode('utf-8', 'surrogatepass')
        # The chat's attachments are kept alive only by a save whose window or turn names some.
        flags = _SAVE_FLAGS[replace_last, bool(self.files) or any(a.sha256 for a in turn.attachments)]
        args = (self._token, data, max_turns, max(1, int(expiry * 1000)), flags, b'')
        extra_keys = ()
        if counters is not None:
            extra_keys = (counters.key,)
            args += (_increments(counters.counts, counters.expiry),)
        if turn.attachments:
            new = [(a.sha256, a.base64) for a in turn.attachments if a.sha256 and a.sha256 not in self.files
                   and a.present]       # what the chat may not hold yet (the window's it holds)
            if new:
                args = args if counters is not None else args + (b'',)
                args += tuple(value for pair in dict(new).items() for value in pair)
        result = self._store.finish(self._keys, args, durable=True, extra_keys=extra_keys)
        # A StoreError above leaves _open set, so release() still tries to unlock.
        self._open = False
        if result == NOT_OURS:
            raise self._lost()

    def release(self) -> None:
        """Unlock without saving and hand the chat to the next waiter; a no-op once saved or released."""
        if not self._open:
            return
        self._open = False
        self._store.let_go(self._token)
        _fence(self._store, self._keys, self._token)

    def saved_marker(self) -> SavedMarker:
        """How to tell later whether this lock's save ran (see :class:`SavedMarker`)."""
        return SavedMarker(self._keys.saved, self._token, partial(_fence, self._store, self._keys, self._token))

    @property
    def token(self) -> str:
        """This call's random token: what the lock key holds while the chat is ours."""
        return self._token

    def renewed(self) -> tuple[str, str, int]:
        """What the renewer sends: (lock key, token, ttl in ms)."""
        return self._keys.lock, self._token, self._ttl_ms

    def _lost(self) -> LockLost:
        return LockLost('The chat lock expired before the turn could be saved, so the turn was not saved and '
                        'the history is as it was (was Redis unreachable, failed over, or the process paused '
                        'longer than lock_ttl?). Retry the call; raise lock_ttl if this repeats.')

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
