"""The observer seam: the few points where llmconn reports its own work to whoever listens.

Library code calls the functions below, one line each, where something
worth counting happens::

    transport.py   provider_call()   each HTTP attempt: status, seconds, retry or not
    store          lock_waited()     how long a chat call waited for its chat's lock
                   store_error()     a redis exception translated into StoreError
    connection.py  call()            wraps the events of every Connection.run call (invoke, chat,
                                     stream, the gateway's routes): tokens, errors, ChatBusy
                   failover()        a call moved on to a fallback connection (llmconn.failover)
    wsgi.py        start_request() / finish_request()   one served HTTP request

Nobody listens unless an :class:`Observer` is installed (``llmconn serve``
installs one; the Prometheus metrics of :mod:`llmconn.metrics` are one).
Until then every function is a global lookup and a return, :func:`call`
hands the events back untouched, and nothing here imports
``prometheus_client``: a library user pays nothing.

A request being served is a :class:`RequestTally` in a context variable
(each gevent greenlet has its own context), so a connection call made by a
service or by the gateway adds its tokens and connection name to the
request that made it, and log lines written meanwhile carry the request's
cid.
"""

from __future__ import annotations

import contextvars
import time as mod_time
from typing import Any, Iterator

from llmconn.errors import ChatBusy

_observer: 'Observer | None' = None
_current: contextvars.ContextVar['RequestTally | None'] = contextvars.ContextVar('llmconn_request', default=None)


class Observer:
    """What a listener may implement; every hook of this base does nothing."""

    def provider_call(self, connection: str, status: str, seconds: float, retry: bool) -> None:
        """One HTTP attempt to a provider ended (``status``: the HTTP code, ``timeout`` or ``unreachable``)."""

    def lock_waited(self, connection: str, seconds: float) -> None:
        """A chat call got its chat's lock after ``seconds`` (0 when nobody held it)."""

    def store_error(self, error: str) -> None:
        """The chat store failed (``error``: the redis exception's class name)."""

    def call_done(self, connection: str, input_tokens: int, output_tokens: int, usage: dict | None = None) -> None:
        """An invoke, chat or stream call finished with this usage (``usage``: the result's whole
        usage, cache and reasoning counts included)."""

    def call_failed(self, connection: str, error: str) -> None:
        """An invoke, chat or stream call raised ``error`` (an exception class name, e.g. ``ChatBusy``)."""

    def chat_busy(self, connection: str) -> None:
        """A chat call gave up waiting for its chat's lock."""

    def failover(self, connection: str, fallback: str, reason: str) -> None:
        """A call on ``connection`` failed (``reason``: ``timeout``, ``unreachable`` or the HTTP status)
        and moved on to ``fallback``."""

    def request_done(self, tally: 'RequestTally') -> None:
        """The host finished sending a response (or the client went away)."""

    def close(self) -> None:
        """The server is stopping: write out anything kept back."""


class RequestTally:
    """One HTTP request as the host served it: what the access log line and the metrics need."""

    __slots__ = ('cid', 'method', 'path', 'service', 'status', 'started', 'duration', 'connections',
                 'input_tokens', 'output_tokens')

    def __init__(self, cid: str, method: str, path: str) -> None:
        self.cid = cid
        self.method = method
        self.path = path
        self.service = ''           # set once the path named a deployed service (or a built-in route)
        self.status = 0
        self.started = mod_time.perf_counter()
        self.duration = 0.0         # seconds, set by finish_request
        self.connections: list[str] = []
        self.input_tokens = 0
        self.output_tokens = 0

    def used(self, connection: str) -> None:
        if connection not in self.connections:
            self.connections.append(connection)


def install(observer: 'Observer | None') -> None:
    """Make ``observer`` the listener of this process (None: nobody listens)."""
    global _observer
    _observer = observer


def installed() -> 'Observer | None':
    return _observer


def current() -> 'RequestTally | None':
    """The request this code runs for, if a host is serving one in this greenlet."""
    return _current.get()


# -- hooks called from library code (each costs a global lookup when nobody listens) -----------


def provider_call(connection: str, status: Any, started: float, attempt: int) -> None:
    """An HTTP attempt begun at ``started`` (``perf_counter``) ended with ``status``."""
    if _observer is not None:
        _observer.provider_call(connection, str(status), mod_time.perf_counter() - started, attempt > 0)


def lock_waited(connection: str, seconds: float) -> None:
    if _observer is not None:
        _observer.lock_waited(connection, seconds)


def store_error(exc: BaseException) -> None:
    if _observer is not None:
        _observer.store_error(type(exc).__name__)


def failover(connection: str, fallback: str, reason: str) -> None:
    if _observer is not None:
        _observer.failover(connection, fallback, reason)


def call(connection: str, events: Iterator) -> Iterator:
    """``events`` of one call, watched for its usage and its error when someone listens."""
    observer = _observer
    if observer is None:
        return events
    return _watched(observer, connection, events)


def _watched(observer: Observer, connection: str, events: Iterator) -> Iterator:
    tally = _current.get()
    if tally is not None:
        tally.used(connection)
    try:
        for event in events:
            if event.type == 'done':
                result = event.result or {}
                usage = result.get('usage') or {}
                input_tokens, output_tokens = usage.get('input_tokens') or 0, usage.get('output_tokens') or 0
                served = result.get('connection') or connection     # a fallback's name, when one answered
                observer.call_done(served, input_tokens, output_tokens, usage)
                if tally is not None:
                    tally.used(served)
                    tally.input_tokens += input_tokens
                    tally.output_tokens += output_tokens
            yield event
    except Exception as e:
        if isinstance(e, ChatBusy):
            observer.chat_busy(connection)
        observer.call_failed(connection, type(e).__name__)
        raise
    finally:
        # A caller that stops iterating closes us; the pipeline must be closed too (it frees the chat).
        close = getattr(events, 'close', None)
        if close is not None:
            close()


# -- the host's side -----------------------------------------------------------------------------


def start_request(cid: str, method: str, path: str) -> RequestTally:
    """A request arrived: the tally its calls and log lines attach to (in this greenlet's context)."""
    tally = RequestTally(cid, method, path)
    _current.set(tally)
    return tally


def finish_request(tally: RequestTally) -> None:
    """The response is sent: fix the duration and tell the listener."""
    tally.duration = mod_time.perf_counter() - tally.started
    if _current.get() is tally:
        _current.set(None)
    if _observer is not None:
        _observer.request_done(tally)
