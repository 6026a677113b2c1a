"""The chat store: per-turn history in Redis, read and written under the chat lock.

A chat is a Redis list of JSON turns, oldest first, capped at
``max_turns`` and expiring ``expiry`` seconds after its last turn. A chat
call reads only its window (O(window), whatever is stored) and writes one
turn: ACQUIRE and FINISH of :mod:`llmconn.store.lock`, one atomic script
and one round trip each, sent through the deployment's runner
(:mod:`llmconn.store.runner`).

This module is the one place where ``redis`` exceptions become
:class:`StoreError`; nothing above :mod:`llmconn.store` sees them.
"""

from __future__ import annotations

import json
import os
import threading
import time as mod_time
import weakref
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, Iterator

from redis.exceptions import AuthenticationError, RedisClusterException, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from llmconn import observe
from llmconn.attachments import Attachment
from llmconn.errors import ChatBusy, StoreAuthError, StoreError
from llmconn.redact import scrub
from llmconn.store import lock as mod_lock
from llmconn.store.keys import ChatKeys, chat_keys
from llmconn.store.lock import TURN_SEPARATOR, ChatLock
from llmconn.store.renewer import LockRenewer
from llmconn.store.urls import CLUSTER
from llmconn.types import Turn

if TYPE_CHECKING:
    from llmconn.store.runner import Runner
    from llmconn.store.urls import RedisTarget

# What redis-py raises: its own errors, and the cluster client's topology errors (not RedisErrors).
_REDIS_ERRORS = (RedisError, RedisClusterException)

# A command sent that got no answer: it may have run.
_UNANSWERED = (RedisConnectionError, RedisTimeoutError)

# A save that got no answer is sent again after each pause (s); None: give up. Each send is one
# runner call, which itself retries once on a fresh connection.
SAVE_RESEND_PAUSES = (0.0, 0.05, 0.25, None)

# Decoded turns are kept by their stored bytes, up to this many bytes of them.
MAX_CACHED_TURN_BYTES = 8 * 1024 * 1024

_from_dict = Turn.from_dict
_loads = json.loads
_NO_FILES: frozenset = frozenset()


def _new_token() -> str:
    """A lock token no other call in any process will hold: 128 random bits, one syscall."""
    return os.urandom(16).hex()


# Stores of this process, so a forked child starts without its parent's renewer and locks.
_stores: 'weakref.WeakSet[ChatStore]' = weakref.WeakSet()


class ChatStore:
    """History and locks of every chat, in one Redis deployment (or the embedded ``memory://`` store)."""

    def __init__(self, runner: 'Runner', target: 'RedisTarget', *, shared: bool,
                 clock: Callable[[], float] | None = None, replicas: int = 0, replica_timeout: float = 1.0) -> None:
        self.url_for_display = target.display
        self.shared = shared
        self.replicas = replicas
        self._target = target
        self._runner = runner
        self._replica_timeout_ms = max(1, int(replica_timeout * 1000))
        self._clock = clock or mod_time.monotonic
        self._sleep = mod_time.sleep
        self._held: dict[str, ChatLock] = {}    # token -> lock, what the renewer keeps alive
        self._turns = TurnCache(MAX_CACHED_TURN_BYTES)
        self._renewer: LockRenewer | None = None
        self._start_lock = threading.Lock()
        self._closed = False
        _stores.add(self)

    # ################################################################################################
    # The two round trips of a chat call

    def begin(self, conn_name: str, chat_id: str, *, window: int, lock_ttl: float,
              lock_wait: float, window_step: int = 1) -> ChatLock:
        """Lock the chat and read its last ``window`` turns; wait in line up to ``lock_wait`` s for the lock.

        ``window_step`` > 1: the window's start moves that many turns at a time (see
        :func:`~llmconn.store.lock.window_spec`).
        """
        renewer = self._renewer or self._start_renewer()
        ttl_ms = int(lock_ttl * 1000) or 1
        if ttl_ms < renewer.min_ttl_ms:
            renewer.shorten(ttl_ms)
        keys = chat_keys(conn_name, chat_id)
        token = _new_token()

        def busy() -> ChatBusy:
            return ChatBusy(f'Chat {chat_id[:64]!r} of connection {conn_name!r} is busy: other calls held it for '
                            f'longer than lock_wait ({lock_wait:g} s) - a provider call, or tools the model asked '
                            f'for, which hold the chat while they run (up to tool_timeout each). Try again later, '
                            f'or raise lock_wait in the connection\'s configuration.')

        started = self._clock()
        try:
            spec = mod_lock.window_spec(window, window_step)
            window_bytes, place, files = mod_lock.acquire(self, keys, token, window=spec, ttl_ms=ttl_ms,
                                                          lock_wait=lock_wait, clock=self._clock, busy=busy)
        except ChatBusy:
            observe.lock_waited(conn_name, self._clock() - started)      # the wait of a call that gave up
            raise
        observe.lock_waited(conn_name, self._clock() - started if place else 0.0)     # place 0: it was free
        if not window_bytes:        # an empty window (a new chat, or max_history_turns: 1): nothing to decode
            lock = ChatLock(self, keys, token, ttl_ms, [], place)
        else:
            window_bytes, handed = mod_lock.split_files(window_bytes)
            if handed:
                files = {**files, **handed}
            turns = self._turns.decode(window_bytes)
            if files:
                turns = with_files(turns, files)
            lock = ChatLock(self, keys, token, ttl_ms, turns, place, frozenset(files) if files else _NO_FILES)
        self._held[token] = lock    # hold(): the renewer keeps it alive
        return lock

    # The lock's backend (:class:`~llmconn.store.lock.LockBackend`): what the lock module sends,
    # each translated here (the one redis exception boundary).

    def script(self, name: str, keys: tuple, args: tuple) -> Any:
        try:
            return self._runner.script(name, keys, args)
        except _REDIS_ERRORS as exc:
            raise self._error(exc) from exc

    def block(self, key: str, timeout: float) -> Any:
        try:
            return self._runner.block(key, timeout)
        except RedisError as exc:
            if str(exc).startswith('UNBLOCKED'):
                return None        # the node changed role (failover): look again, on the new master
            raise self._error(exc) from exc
        except RedisClusterException as exc:
            raise self._error(exc) from exc

    def finish(self, keys: ChatKeys, args: tuple, *, durable: bool, extra_keys: tuple = ()) -> int:
        """FINISH (save or release); with ``replicas``, a save also waits for them in the same round trip.

        A save whose reply was lost is sent again (it is recognised by its
        token, so it is never written twice) after each of
        ``SAVE_RESEND_PAUSES``, beyond the runner's own retry: a stored turn is
        not reported lost because two replies in a row were.
        """
        finish_keys = (keys.lock, keys.turns, keys.queue, keys.saved, *extra_keys)
        if not durable:
            return self.script('finish', finish_keys, args)
        for pause in SAVE_RESEND_PAUSES:
            try:
                if not self.replicas:
                    return self._runner.script('finish', finish_keys, args)
                return self._save(finish_keys, args)
            except _UNANSWERED as exc:
                if pause is None:
                    raise StoreError(f'{self._error(exc)} The turn may have been saved all the same: its save '
                                     f'and each re-send got no answer; read the chat\'s history before '
                                     f'sending the message again.') from exc
                self._sleep(pause)
            except _REDIS_ERRORS as exc:
                raise self._error(exc) from exc
        raise AssertionError('unreachable')

    def _save(self, finish_keys: tuple, args: tuple) -> int:
        """FINISH and ``WAIT`` for the replicas in one round trip (``redis.replicas``)."""
        result, acks = self._runner.script_and_wait('finish', finish_keys, args, self.replicas,
                                                    self._replica_timeout_ms)
        if result != mod_lock.NOT_OURS and acks < self.replicas:
            raise StoreError(f'The turn was saved on the Redis master of {self.url_for_display} but reached only '
                             f'{acks} of {self.replicas} replica(s) within {self._replica_timeout_ms} ms, so it '
                             f'may not survive a failover; check the replicas (INFO replication), or lower '
                             f'redis.replicas.')
        return result

    def hold(self, lock: ChatLock) -> None:
        self._held[lock.token] = lock

    def let_go(self, token: str) -> None:
        self._held.pop(token, None)

    # What the renewer needs.

    def held(self) -> list[ChatLock]:
        """The locks this store keeps alive now."""
        return list(self._held.values())

    def renew_all(self, locks: list[tuple]) -> list:
        """Renew (key, token, ttl_ms) locks in pipelined round trips; 1 or 0 (lost) or an error each."""
        try:
            return self._runner.scripts('renew', [((key,), (token, ttl_ms)) for key, token, ttl_ms in locks])
        except _REDIS_ERRORS as exc:
            raise self._error(exc) from exc

    # ################################################################################################
    # Outside a chat call

    def history(self, conn_name: str, chat_id: str) -> list[Turn]:
        """Every stored turn of the chat, oldest first (empty when unknown or expired)."""
        try:
            items = self._runner.client.lrange(chat_keys(conn_name, chat_id).turns, 0, -1)
        except _REDIS_ERRORS as exc:
            raise self._error(exc) from exc
        return [_from_dict(_loads(item)) for item in items]

    def delete(self, conn_name: str, chat_id: str) -> None:
        """Forget the chat's turns. A call holding its lock keeps it and may still save its turn."""
        try:
            keys = chat_keys(conn_name, chat_id)
            self._runner.client.delete(keys.turns, keys.beside('files'), keys.beside('filerefs'))
        except _REDIS_ERRORS as exc:
            raise self._error(exc) from exc

    def scan(self, match: str, count: int = 1000) -> Iterator[bytes]:
        """Every key matching ``match`` (a SCAN glob), on every master of a cluster; for admin tools."""
        client = self._runner.client
        try:
            if hasattr(client, 'get_primaries'):        # RedisCluster: SCAN is per node
                for node in client.get_primaries():
                    yield from client.get_redis_connection(node).scan_iter(match=match, count=count)
            else:
                yield from client.scan_iter(match=match, count=count)
        except _REDIS_ERRORS as exc:
            raise self._error(exc) from exc

    @property
    def client(self) -> Any:
        """The redis-py client for commands off the hot path (usage ledger, admin commands)."""
        return self._runner.client

    @property
    def cluster(self) -> bool:
        """A Redis Cluster: a script may write only keys of its chat's slot."""
        return self._target.kind == CLUSTER

    def ping(self) -> None:
        """Raise :class:`StoreError` unless Redis answers."""
        try:
            self._runner.client.ping()
        except _REDIS_ERRORS as exc:
            raise self._error(exc) from exc

    def close(self) -> None:
        """Stop renewing locks and drop the connections; begin() fails from now on."""
        with self._start_lock:
            self._closed = True
            renewer, self._renewer = self._renewer, None
        if renewer is not None:
            renewer.stop()
        self._runner.close()

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
        # redis-py's pools see the new pid and open their own connections.

    @contextmanager
    def boundary(self) -> Iterator[None]:
        """Run Redis commands of another part of :mod:`llmconn.store` with their errors translated here."""
        try:
            yield
        except _REDIS_ERRORS as exc:
            raise self._error(exc) from exc

    def _error(self, exc: Exception) -> StoreError:
        """The one translation of a redis exception, with what to do next and no password."""
        observe.store_error(exc)
        kind = StoreError
        if isinstance(exc, AuthenticationError):
            kind, hint = StoreAuthError, 'check the user name and password in redis.url'
        elif isinstance(exc, (RedisConnectionError, RedisTimeoutError)):
            hint = 'check that Redis is running and reachable at that address (calls without a chat_id still work)'
        else:
            hint = 'check the Redis server and its log'
        detail = scrub(f'{type(exc).__name__}: {exc}', self._target.password or '')
        detail = scrub(detail, self._target.options.get('sentinel_password') or '')
        return kind(f'Chat store {self.url_for_display} failed ({detail}); {hint}.')

    def __repr__(self) -> str:
        return f'<ChatStore {self.url_for_display} held={len(self._held)}>'


def with_files(turns: list[Turn], files: dict[str, str]) -> list[Turn]:
    """The window's turns with their attachments' bytes (base64, as the window brought them)."""
    out = []
    for turn in turns:
        if turn.attachments:
            turn = replace(turn, attachments=tuple(
                Attachment.stored(a.meta(), files.get(a.sha256, '')) if a.sha256 else a for a in turn.attachments))
        out.append(turn)
    return out


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
