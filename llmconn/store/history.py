"""The chat store: per-turn history in Redis, read and written under the chat lock.

A chat is a Redis list of JSON turns, oldest first, capped at
``max_turns`` and expiring ``expiry`` seconds after its last turn. A chat
call reads only its window (O(window), whatever is stored) and writes one
turn: BEGIN and SAVE, one atomic script and one round trip each.

This module is the one place where ``redis`` exceptions become
:class:`StoreError`; nothing above :mod:`llmconn.store` sees them.
"""

from __future__ import annotations

import json
import os
import threading
import time as mod_time
import weakref
from typing import Any, Callable

from redis.exceptions import AuthenticationError, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from llmconn.errors import ChatBusy, StoreError
from llmconn.store import scripts
from llmconn.store.keys import ChatKeys, chat_keys
from llmconn.store.lock import ChatLock, LockRenewer
from llmconn.store.scripts import TURN_SEPARATOR, WAKE_WAIT_CAP
from llmconn.store.wire import NoConnectionAvailable, Wire
from llmconn.types import Turn

# BLPOP's timeout 0 means "forever"; never ask for less than this.
MIN_WAKE_WAIT = 0.002

# Decoded turns are kept by their stored bytes, up to this many bytes of them.
MAX_CACHED_TURN_BYTES = 8 * 1024 * 1024

_from_dict = Turn.from_dict
_loads = json.loads


def _new_token() -> str:
    """A lock token no other call in any process will hold: 128 random bits, one syscall."""
    return os.urandom(16).hex()


# Stores of this process, so a forked child starts without its parent's renewer and locks.
_stores: 'weakref.WeakSet[ChatStore]' = weakref.WeakSet()


class ChatStore:
    """History and locks of every chat, in one Redis (or the embedded ``memory://`` store)."""

    def __init__(self, client: Any, *, url_for_display: str, shared: bool,
                 clock: Callable[[], float] | None = None) -> None:
        self.url_for_display = url_for_display
        self.shared = shared
        self._client = client                  # everything but the hot path
        self._wire = Wire(client.connection_pool)
        self._clock = clock or mod_time.monotonic
        self._begin = client.register_script(scripts.BEGIN)
        self._save = client.register_script(scripts.SAVE)
        self._release = client.register_script(scripts.RELEASE)
        self._renew = client.register_script(scripts.RENEW)
        self._held: dict[str, ChatLock] = {}    # token -> lock, what the renewer keeps alive
        self._turns = TurnCache(MAX_CACHED_TURN_BYTES)
        self._renewer: LockRenewer | None = None
        self._start_lock = threading.Lock()
        self._closed = False
        _stores.add(self)

    # ################################################################################################
    # The two round trips of a chat call

    def begin(self, conn_name: str, chat_id: str, *, window: int, lock_ttl: float,
              lock_wait: float) -> ChatLock:
        """Lock the chat and read its last ``window`` turns; wait up to ``lock_wait`` s for the lock."""
        renewer = self._renewer or self._start_renewer()
        ttl_ms = int(lock_ttl * 1000) or 1
        if ttl_ms < renewer.min_ttl_ms:
            renewer.shorten(ttl_ms)
        keys = chat_keys(conn_name, chat_id)
        token = _new_token()
        args = (token, ttl_ms, window, b'')
        taken, value = self._run(self._begin, (keys.lock, keys.turns, keys.waiting), args)
        if not taken:
            value = self._wait(keys, args, value, lock_wait, conn_name, chat_id)
        lock = ChatLock(self, keys, token, ttl_ms, self._turns.decode(value))
        self._held[token] = lock
        return lock

    def _wait(self, keys: ChatKeys, args: tuple, pttl: int, lock_wait: float, conn_name: str,
              chat_id: str) -> bytes:
        """Block until a SAVE or RELEASE hands us the lock (or the holder's lock runs out), then take it.

        The wake-up carries a ticket; BEGIN with it claims the lock reserved for
        that ticket, so waiters are served in the order Redis unblocks them.
        """
        deadline = self._clock() + lock_wait
        while True:
            remaining = deadline - self._clock()
            if remaining <= 0:
                raise ChatBusy(f'Chat {chat_id[:64]!r} of connection {conn_name!r} is busy: another call held it '
                               f'for longer than lock_wait ({lock_wait:g} s). Try again later, or raise lock_wait '
                               f'in the connection\'s configuration.')
            timeout = min(remaining, WAKE_WAIT_CAP, pttl / 1000.0 if pttl > 0 else WAKE_WAIT_CAP)
            try:
                woken = self._wire.call('BLPOP', keys.wake, max(timeout, MIN_WAKE_WAIT))
            except RedisError as exc:
                raise self._error(exc) from exc
            ticket = woken[1] if woken else b''
            taken, value = self._run(self._begin, (keys.lock, keys.turns, keys.waiting), args[:3] + (ticket,))
            if taken:
                return value
            pttl = value

    def _do_save(self, keys: ChatKeys, token: str, data: bytes, max_turns: int, expiry: float,
                 replace_last: bool = False) -> bool:
        args = (token, data, max_turns, max(1, int(expiry * 1000)), '1' if replace_last else '0')
        return self._run(self._save, (keys.lock, keys.turns, keys.wake, keys.waiting), args) == 1

    def _do_release(self, keys: ChatKeys, token: str) -> bool:
        return self._run(self._release, (keys.lock, keys.turns, keys.wake, keys.waiting), (token,)) == 1

    def _do_renew(self, locks: list[tuple]) -> list:
        """Renew (key, token, ttl_ms) locks in one pipelined round trip; 1 or 0 (lost) or an error each."""
        pipe = self._client.pipeline(transaction=False)
        for key, token, ttl_ms in locks:
            self._renew(keys=(key,), args=(token, ttl_ms), client=pipe)
        return pipe.execute(raise_on_error=False)

    def _run(self, script: Any, keys: tuple, args: tuple) -> Any:
        try:
            return self._wire.evalsha(script, keys, args)
        except RedisError as exc:
            raise self._error(exc) from exc

    # ################################################################################################
    # Outside a chat call

    def history(self, conn_name: str, chat_id: str) -> list[Turn]:
        """Every stored turn of the chat, oldest first (empty when unknown or expired)."""
        try:
            items = self._client.lrange(chat_keys(conn_name, chat_id).turns, 0, -1)
        except RedisError as exc:
            raise self._error(exc) from exc
        return [_from_dict(_loads(item)) for item in items]

    def delete(self, conn_name: str, chat_id: str) -> None:
        """Forget the chat's turns. A call holding its lock keeps it and may still save its turn."""
        try:
            self._client.delete(chat_keys(conn_name, chat_id).turns)
        except RedisError as exc:
            raise self._error(exc) from exc

    def ping(self) -> None:
        """Raise :class:`StoreError` unless Redis answers."""
        try:
            self._client.ping()
        except RedisError as exc:
            raise self._error(exc) from exc

    def close(self) -> None:
        """Stop renewing locks and drop the connections; begin() fails from now on."""
        with self._start_lock:
            self._closed = True
            renewer, self._renewer = self._renewer, None
        if renewer is not None:
            renewer.stop()
        self._wire.close()
        self._client.connection_pool.disconnect()

    # ################################################################################################

    def _start_renewer(self) -> LockRenewer:
        with self._start_lock:
            if self._closed:
                raise StoreError(f'The chat store {self.url_for_display} was closed; use a store (registry) '
                                 f'that is still open')
            if self._renewer is None:
                renewer = LockRenewer(self)
                renewer.start()
                self._renewer = renewer
            return self._renewer

    def _after_fork(self) -> None:
        # The parent's renewer thread does not exist here, and its locks are not ours.
        self._renewer = None
        self._held = {}
        self._start_lock = threading.Lock()
        self._wire.forget()

    def _error(self, exc: RedisError) -> StoreError:
        """The one translation of a redis exception, with what to do next and no password."""
        if isinstance(exc, NoConnectionAvailable):
            hint = 'too many chat calls wait on Redis at once in this process; is Redis overloaded?'
        elif isinstance(exc, AuthenticationError):
            hint = 'check the user name and password in redis.url'
        elif isinstance(exc, (RedisConnectionError, RedisTimeoutError)):
            hint = 'check that Redis is running and reachable at that address (calls without a chat_id still work)'
        else:
            hint = 'check the Redis server and its log'
        detail = f'{type(exc).__name__}: {exc}'
        password = self._client.connection_pool.connection_kwargs.get('password')
        if password:
            detail = detail.replace(str(password), '***')
        return StoreError(f'Chat store {self.url_for_display} failed ({detail}); {hint}.')

    def __repr__(self) -> str:
        return f'<ChatStore {self.url_for_display} held={len(self._held)}>'


class TurnCache:
    """Turns decoded before, by their stored JSON bytes: a chat's window is mostly the last call's.

    Stored turns never change, and :class:`Turn` is immutable, so a hit is
    exactly what decoding would give. Emptied whole when it outgrows its
    bytes (cheap, and a cold window only costs what no cache would).
    """

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._bytes = 0
        self._turns: dict[bytes, Turn] = {}

    def decode(self, window: bytes) -> list[Turn]:
        if not window:
            return []
        turns, get = [], self._turns.get
        for item in window.split(TURN_SEPARATOR):
            turn = get(item)
            if turn is None:
                turn = self._add(item)
            turns.append(turn)
        return turns

    def _add(self, item: bytes) -> Turn:
        turn = _from_dict(_loads(item))
        if self._bytes + len(item) > self._max_bytes:
            self._turns.clear()
            self._bytes = 0
        self._turns[item] = turn
        self._bytes += len(item)
        return turn


def _forget_parent_state() -> None:
    for store in list(_stores):
        store._after_fork()


os.register_at_fork(after_in_child=_forget_parent_state)
