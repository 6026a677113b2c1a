"""Closing what a reload replaced, once the calls still using it have finished.

``Registry.reload()`` swaps in a new set of connections at once, but calls
that began before the swap keep the connection (and chat store) they
started with. Closing those right away would pull the HTTP pool out from
under a running request and stop the store's lock renewal mid-call, so the
lock could expire and another caller interleave a turn. Instead each
connection counts its calls in flight (:class:`InFlight`); a retired one
closes when its count drops to zero, and a replaced store closes when the
last connection using it has closed (:class:`CloseAfter`).

Every call counts from the moment ``Connection.run`` returns its events
(``stream()`` and the gateway's routes hand them out) until they are
exhausted, fail, are closed, or are garbage collected unfinished
(:class:`Counted`): a gateway stream a client is still reading keeps its
connection open across a reload.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Iterator

logger = logging.getLogger(__name__)


class InFlight:
    """A count of running calls; after :meth:`retire`, ``then`` runs once, when none is left."""

    def __init__(self) -> None:
        self._count = 0
        self._then: Callable[[], None] | None = None
        self._retired = False
        self._lock = threading.Lock()

    def __enter__(self) -> 'InFlight':
        with self._lock:
            self._count += 1
        return self

    def __exit__(self, *exc_info) -> None:
        with self._lock:
            self._count -= 1
            then = self._take()
        _run(then)

    @property
    def count(self) -> int:
        return self._count

    def retire(self, then: Callable[[], None]) -> None:
        """Run ``then`` now if nothing is running, else when the last running call ends."""
        with self._lock:
            self._retired, self._then = True, then
            then = self._take()
        _run(then)

    def _take(self) -> Callable[[], None] | None:
        if not self._retired or self._count or self._then is None:
            return None
        then, self._then = self._then, None
        return then


class CloseAfter:
    """Runs ``then`` once ``parts`` callers have each called :meth:`done` (at once if ``parts`` is 0)."""

    def __init__(self, parts: int, then: Callable[[], None]) -> None:
        self._left = parts
        self._then = then
        self._lock = threading.Lock()
        if parts == 0:
            _run(then)

    def done(self) -> None:
        with self._lock:
            self._left -= 1
            then = self._then if self._left == 0 else None
        _run(then)


class Counted:
    """An event iterator that holds one :class:`InFlight` count until it ends, however it ends."""

    __slots__ = ('_events', '_calls', '_open')

    def __init__(self, events: Iterator, calls: InFlight) -> None:
        calls.__enter__()
        self._events, self._calls, self._open = events, calls, True

    def __iter__(self) -> 'Counted':
        return self

    def __next__(self):
        try:
            return next(self._events)
        except BaseException:
            self._release()
            raise

    def close(self) -> None:
        try:
            close = getattr(self._events, 'close', None)
            if close is not None:
                close()
        finally:
            self._release()

    def __del__(self) -> None:
        if getattr(self, '_open', False):
            self.close()

    def _release(self) -> None:
        if self._open:
            self._open = False
            self._calls.__exit__(None, None, None)


def _run(then: Callable[[], None] | None) -> None:
    if then is None:
        return
    try:
        then()
    except Exception:       # closing is best effort: a failure must not surface in a caller's call
        logger.exception('Could not close a replaced connection or store')
