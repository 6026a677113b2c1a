"""Sending a prepared Responses call and answering with what it made, plain or streamed.

The call goes through the connection's one entry (:mod:`llmconn.gateway.backend`,
:meth:`Connection.run <llmconn.connection.Connection.run>`), which checks it
and keeps its record (:mod:`llmconn.gateway.recording`) at the points it
would begin and save a chat: before the provider is reached (a stream's
record ``in_progress``), the ending before ``done`` comes out of it. This
module only turns what the call made into the answer: the Response object,
or its stream of events.
A client that goes away mid-stream makes the server close the body, which
closes the call's events (the provider's stream, its HTTP connection), and
the pipeline records the response ``cancelled``.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Iterator

from llmconn.errors import LLMConnError
from llmconn.gateway import backend
from llmconn.gateway.recording import ResponseRecord
from llmconn.gateway.response_objects import response_object, usage_object
from llmconn.gateway.response_record import record
from llmconn.gateway.responses import Call
from llmconn.gateway.stream import ResponseEvents, sse


def _provider_events(call: Call, stream: bool, rec: ResponseRecord) -> Iterator:
    return backend.events(call.conn, call.conversation, call.params, stream,
                          previous_response_id=call.provider_previous_id, store=call.store, key_id=call.key.id,
                          tools=call.tools, hosted=call.hosted, fallbacks=call.fallbacks, on_failover=call.failed_over,
                          record=rec)


def respond(gw: Any, call: Call) -> dict:
    """A plain (unstreamed) response: the call recorded by the pipeline, its Response made of its ending."""
    rec = ResponseRecord(gw, call, call.admission)
    backend.answer(_provider_events(call, False, rec))
    end = rec.ending
    return response_object(call, end.status, end.output, end.usage, reason=end.reason)


def stream(gw: Any, call: Call, encode: Callable[[dict], Any] = sse) -> Iterator:
    """The events of a streamed response, each ``encode``-d: by default the SSE body.

    The provider is reached (and may refuse) before this returns. The WebSocket mode
    (:mod:`llmconn.gateway.responses_ws`) encodes the same events as the text of its messages.
    """
    rec = ResponseRecord(gw, call, call.admission)
    events = _provider_events(call, True, rec)
    first = next(events)        # refused, unreachable or failed before its first event: recorded, raised
    # Made after the first event: a fallback that took the call over is named from response.created on.
    rec.normalizer = ResponseEvents(response_object(call, 'in_progress', [], None))
    return _body(rec, itertools.chain([first], events), events, encode)


def warm(gw: Any, call: Call, encode: Callable[[dict], Any] = sse) -> Iterator:
    """The events of a warm-up (the WebSocket mode's ``generate: false``): a response that records
    its request's input and settings for the next one to continue, without asking the provider.

    Recorded ``completed``, with no output and no usage, before its first event goes out (a key
    with limits admitted first: it counts as a request); its id continues as any response's does.
    """
    if call.admission is not None:
        call.admission.admit()
    usage = usage_object(0, 0)
    gw.ledger.save(record(call, 'completed', usage, []), call.expiry)
    events = ResponseEvents(response_object(call, 'in_progress', [], None))
    final = response_object(call, 'completed', [], usage)
    encoded = [encode(event) for event in events.start() + events.prepared(final)]
    return (text for text in encoded)           # an iterator that closes, as a stream's body does


def _body(rec: ResponseRecord, events: Iterator, provider: Any, encode: Callable[[dict], Any]) -> Iterator:
    normalizer = rec.normalizer
    try:
        for event in normalizer.start():
            yield encode(event)
        for event in events:
            if event.type == 'done':        # recorded by now: the closing events may go
                for out in rec.ending.closing:
                    yield encode(out)
                return
            for out in normalizer.feed(event.type, event.text):
                yield encode(out)
    except LLMConnError:                    # recorded failed: the stream ends with response.failed
        for out in rec.ending.closing:
            yield encode(out)
    finally:
        provider.close()        # a client that left closes the provider's stream too
