"""A caller's record of one call, kept by the one pipeline beside the chat store (SPEC §15).

A :class:`~llmconn.types.CallSpec` may carry a ``record``: an object the
caller keeps its own account of the call in (the gateway's Responses
records, :mod:`llmconn.gateway.recording`). :meth:`Connection.run
<llmconn.connection.Connection.run>` calls it at the points where it begins
and saves a chat, with the same failure semantics::

    started()             on the first read of the events, before the provider is reached:
                          a store outage (or a refusal) costs no tokens and no call
    ended(result, reply)  the answer is whole (a chat's turn saved), before ``done`` is handed out:
                          a caller that has ``done`` can rely on the record
    failed(error)         the call failed before ``done`` (a provider failing before its first
                          event, a failover that found no one, an ``ended`` that could not save)
    cancelled(usage)      the caller stopped reading before ``done`` (a client that left): the usage
                          of the rounds answered so far, else estimated from the text streamed

At most one of ``ended``, ``failed`` and ``cancelled`` follows ``started``
(``failed`` and ``cancelled`` once the provider's stream is closed and a
chat's lock freed); nothing follows an ``ended``, since a caller that stops
reading after ``done`` has its answer. A ``started`` that raises ends the
call before anything was sent, and the call is not counted: the record sits
outside the usage tally and the observer, as a failed check would.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, Protocol

from llmconn.types import add_usage

if TYPE_CHECKING:
    from llmconn.types import Event, Reply

# A stream its caller left: the provider sent no usage yet, so the output is estimated from the text
# streamed, at this many characters per token (a common rule of thumb), and marked as estimated.
CHARS_PER_TOKEN_ESTIMATE = 4
_STREAMED = ('text', 'thinking')


class CallRecord(Protocol):
    """What :meth:`Connection.run <llmconn.connection.Connection.run>` tells a call's record, and when."""

    def started(self) -> None:
        """The call is about to reach the provider (raise to stop it: nothing is sent)."""

    def ended(self, result: dict, reply: 'Reply') -> None:
        """The call answered: its result and last provider answer, before ``done`` goes out."""

    def failed(self, error: Exception) -> None:
        """The call failed with ``error`` before its answer was whole."""

    def cancelled(self, usage: dict) -> None:
        """The caller stopped reading before ``done``; ``usage`` so far (``estimated: True`` when guessed)."""


def estimated_usage(streamed_chars: int) -> dict:
    """The usage of ``streamed_chars`` characters of output no provider reported, marked as estimated."""
    output = -(-streamed_chars // CHARS_PER_TOKEN_ESTIMATE)
    return {'input_tokens': 0, 'output_tokens': output, 'total_tokens': output, 'estimated': True}


def recorded(record: CallRecord, events: Iterator['Event'], answers: list) -> Iterator['Event']:
    """``events`` of one call, told to ``record`` at its points (see the module's docstring).

    ``answers`` holds the :class:`~llmconn.types.Reply` of each provider round answered so far
    (the pipeline adds to it); a call cancelled before any of them reported usage is estimated
    from its text deltas.
    """
    record.started()
    streamed, done = 0, False
    try:
        for event in events:
            if event.type == 'done':
                record.ended(event.result, event.reply)
                done = True
            elif event.type in _STREAMED:
                streamed += len(event.text)
            yield event
    except BaseException as e:
        if done:
            raise
        _close(events)          # the provider's stream and the chat's lock go first
        if isinstance(e, Exception):
            record.failed(e)
        else:                   # GeneratorExit, GreenletExit, KeyboardInterrupt: stopped, not failed
            record.cancelled(_usage_so_far(answers, streamed))
        raise
    finally:
        _close(events)


def _usage_so_far(answers: list, streamed: int) -> dict:
    spent: dict = {}
    for reply in answers:
        add_usage(spent, reply.usage)
    return spent if any(spent.values()) else estimated_usage(streamed)


def _close(events: Iterator) -> None:
    close = getattr(events, 'close', None)
    if close is not None:
        close()
