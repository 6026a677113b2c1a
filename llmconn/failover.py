"""Failover across connections: ``fallbacks: [NAME, ...]`` (SPEC §18).

A connection may name fallbacks. When its provider fails after the
connection's own retries (:mod:`llmconn.transport`) in a way another
provider may not - a connection that could not be opened or broke, a
timeout, a 5xx, a 429 - and nothing of the answer has reached the caller
yet, the call moves on to the next connection of its plan
(:func:`plan`). Any other failure (a 400, bad credentials, an answer
outside its schema) is the caller's to see: another provider would refuse
it too, or the problem is ours.

Where it happens: inside the one entry, :meth:`Connection.run
<llmconn.connection.Connection.run>`, so ``invoke``, ``chat``, ``stream``
and both gateway routes fail over alike. A chat stays the primary's: its
window was read, and its lock is held, under the primary's name; the
fallback answers from that same window (its own provider items are
replayed only to it, another's go as plain canonical items, see
:mod:`llmconn.items`) and the turn is saved back into it, under the same
lock. What can fail over, and when::

    before the first event        yes: nothing was handed on, nothing ran
    a stream after its first event  no: the caller has part of an answer
    a later round of a tool loop  no: its tools ran; the fallback would run them again
    a gateway previous_response_id  no: the conversation lives at the primary's provider

A fallback that cannot honour the call (a capability, an attachment's
type, ``schema=``, tools; the gateway also checks its capability matrix)
is skipped, as is one that is inactive. Each fallback's own ``fallbacks``
follow it in the plan, so what a call can reach is the whole chain the
configuration draws (cycles are refused at load, :mod:`llmconn.config`).

Each failover is logged (no secret, no provider words: the reason is a
status or a kind), counted in the metrics
(``llmconn_failovers_total{connection,fallback,reason}``) and in the usage
ledger (``failovers`` under the connection that failed); the call itself
is counted once, under the connection that answered, which the result's
``connection`` names - or, when none did, as a failed call of the
connection it was made on (the error raised is the last one's).
"""

from __future__ import annotations

import logging
from typing import Iterable

from llmconn.errors import LLMError, LLMTimeout, LLMUnreachable

logger = logging.getLogger(__name__)

TIMEOUT = 'timeout'
UNREACHABLE = 'unreachable'
RATE_LIMITED = frozenset({429, 529})        # 529: Anthropic's "overloaded", a 5xx too


def reason(error: BaseException) -> str:
    """Why ``error`` moves a call on (``timeout``, ``unreachable`` or the HTTP status), or '' when it does not."""
    if isinstance(error, LLMTimeout):
        return TIMEOUT
    if isinstance(error, LLMUnreachable):
        return UNREACHABLE
    if isinstance(error, LLMError) and error.status is not None and (
            error.status in RATE_LIMITED or 500 <= error.status < 600):
        return str(error.status)
    return ''


def plan(name: str, fallbacks_of, given: Iterable[str] | None = None) -> list[str]:
    """The connections a call on ``name`` may move on to, in order.

    ``fallbacks_of(name)`` gives a connection's own ``fallbacks``; each is
    followed by its own (depth first), none twice, never ``name`` itself.
    ``given``: the caller's own list instead of ``name``'s (the gateway's,
    already cut to the fallbacks that can honour its request), not expanded.
    """
    if given is not None:
        return [n for n in dict.fromkeys(given) if n != name]
    out: list[str] = []

    def walk(of: str) -> None:
        for fallback in fallbacks_of(of):
            if fallback != name and fallback not in out:
                out.append(fallback)
                walk(fallback)

    walk(name)
    return out


def failed_over(connection: str, fallback: str, why: str) -> None:
    """The log line of one failover: who failed, why, and who takes the call."""
    logger.warning('Connection "%s" failed (%s) after its retries; the call fails over to "%s"',
                   connection, why if why in (TIMEOUT, UNREACHABLE) else f'HTTP {why}', fallback)


def skipped(connection: str, fallback: str, problem: str) -> None:
    """The log line of a fallback that cannot take the call (the problem is llmconn's own words)."""
    logger.info('Connection "%s" failed; its fallback "%s" is skipped: %s', connection, fallback, problem)
