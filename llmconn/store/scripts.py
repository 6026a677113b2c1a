"""The Lua scripts behind a chat call: one atomic round trip each.

A chat call costs two round trips when nobody else holds the chat: BEGIN
(take the lock, read the window) and SAVE (append the turn, trim, expire,
unlock, wake a waiter). RELEASE unlocks without saving (the provider failed)
and RENEW keeps a lock alive while a long provider call runs. Every script
that changes or releases the lock first checks that the lock still holds the
caller's random token, so a holder whose lock expired can never release,
renew or write over somebody else's turn (fencing).

Handing over without polling, in order: a blocked caller sets the chat's
``waiting`` flag (short expiry, refreshed on each attempt) and blocks in
BLPOP on the chat's ``wake`` list. When the flag exists, SAVE and RELEASE do
not free the lock: they reserve it for a moment under a ticket and push the
ticket to the list. Redis hands a pushed element to the client that has been
blocked longest, and only the holder of the ticket can turn the reservation
into its lock (BEGIN), so waiters are served first come, first served and a
caller that just arrived (the releasing process calling again, typically)
cannot jump the queue. When nobody waits, the uncontended path pays one
EXISTS and nothing more. A ticket nobody claims (its waiter died or gave up)
is picked up by the next caller to wait, or its reservation lapses after
HANDOFF_TTL_MS; a stale ticket costs one extra attempt, never a wrong result.
"""

# A waiter blocks at most this long per BLPOP, so a lost wake-up (a holder
# that died, an expired lock) costs it at most this much.
WAKE_WAIT_CAP = 1.0

# The "someone is waiting" flag outlives a waiter's BLPOP by a margin; each
# attempt refreshes it, so it vanishes soon after the last waiter leaves.
WAITING_FLAG_TTL_MS = int(WAKE_WAIT_CAP * 3000)

# A wake-up nobody picked up is gone after this long.
WAKE_TTL_MS = int(WAKE_WAIT_CAP * 3000)

# How long a lock handed to a waiter stays reserved for it: a live waiter
# claims it within a round trip; one that died costs the others this much.
HANDOFF_TTL_MS = int(WAKE_WAIT_CAP * 1000)

# A handed-over lock holds this prefix and the releasing call's token; tokens
# are hex, so a ticket can never equal one.
TICKET_PREFIX = 'handoff:'

# Turns travel from BEGIN as one string, one compact JSON turn per line: JSON
# escapes every newline inside its strings, so the separator never occurs
# within a turn, and Python splits the window without parsing it.
TURN_SEPARATOR = b'\n'

# Hands the lock to the waiter that has waited longest, or frees it when none waits.
# Shared tail of SAVE and RELEASE, run once the lock is known to be ours.
#   KEYS[1] - lock, KEYS[3] - wake list, KEYS[4] - waiting flag, ARGV[1] - our token
_HAND_OVER = f"""
if redis.call('EXISTS', KEYS[4]) == 1 then
    local ticket = '{TICKET_PREFIX}' .. ARGV[1]
    redis.call('SET', KEYS[1], ticket, 'PX', {HANDOFF_TTL_MS})
    redis.call('LPUSH', KEYS[3], ticket)
    redis.call('LTRIM', KEYS[3], 0, 0)
    redis.call('PEXPIRE', KEYS[3], {WAKE_TTL_MS})
else
    redis.call('DEL', KEYS[1])
end
"""

# Takes the lock and reads the window, or reports how long the holder has left.
#   KEYS[1] - lock, KEYS[2] - turns, KEYS[3] - waiting flag
#   ARGV[1] - our random token, ARGV[2] - lock ttl (ms), ARGV[3] - window (turns),
#   ARGV[4] - the ticket a waiter was woken with, or '' (a lock handed to that ticket is ours)
# Returns {1, turns} - the last ARGV[3] turns, oldest first, joined by TURN_SEPARATOR
# (an empty string when there are none) - or {0, pttl of the lock}. Finding our
# own token counts as taken, so a call retried after its reply was lost does not
# wait for itself.
BEGIN = f"""
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
        or redis.call('GET', KEYS[1]) == ARGV[1]
        or (ARGV[4] ~= '' and redis.call('GET', KEYS[1]) == ARGV[4]
            and redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])) then
    local window = tonumber(ARGV[3])
    -- LRANGE key -0 -1 would be the whole list, so window 0 is answered here
    if window <= 0 then
        return {{1, ''}}
    end
    return {{1, table.concat(redis.call('LRANGE', KEYS[2], -window, -1), '\\n')}}
end
redis.call('SET', KEYS[3], 1, 'PX', {WAITING_FLAG_TTL_MS})
return {{0, redis.call('PTTL', KEYS[1])}}
"""

# Appends a turn and releases the lock, if the lock is still ours.
#   KEYS[1] - lock, KEYS[2] - turns, KEYS[3] - wake list, KEYS[4] - waiting flag
#   ARGV[1] - our token, ARGV[2] - the turn as compact JSON, ARGV[3] - max stored turns,
#   ARGV[4] - chat expiry (ms), ARGV[5] - '1' to replace the last turn (a pending tool turn
#   completed) instead of appending
# Returns 1 when saved, 0 when the lock was no longer ours (nothing written).
SAVE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
end
local max_turns = tonumber(ARGV[3])
if ARGV[5] == '1' and redis.call('LLEN', KEYS[2]) > 0 then
    redis.call('LSET', KEYS[2], -1, ARGV[2])
elseif redis.call('RPUSH', KEYS[2], ARGV[2]) > max_turns then
    redis.call('LTRIM', KEYS[2], -max_turns, -1)
end
redis.call('PEXPIRE', KEYS[2], ARGV[4])
""" + _HAND_OVER + """
return 1
"""

# Releases the lock without saving, if it is still ours.
#   KEYS[1] - lock, KEYS[2] - unused (keeps the KEYS positions of SAVE),
#   KEYS[3] - wake list, KEYS[4] - waiting flag
#   ARGV[1] - our token
# Returns 1 when released, 0 when the lock was no longer ours.
RELEASE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
end
""" + _HAND_OVER + """
return 1
"""

# Extends the lock, if it is still ours.
#   KEYS[1] - lock
#   ARGV[1] - our token, ARGV[2] - lock ttl (ms)
# Returns 1 when extended, 0 when the lock was no longer ours.
RENEW = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
"""
