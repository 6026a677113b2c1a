"""Sending a prepared Responses call and recording what happened, plain or streamed.

The call goes through the connection's one entry (:mod:`llmconn.gateway.backend`),
which checks it before anything is recorded. A response's record is saved
before its answer goes out: a client that has ``response.completed`` (or
the JSON body) can continue from its id at once, on any gateway process
sharing the Redis. A response is recorded ``in_progress`` first (before the
provider is called, so a store outage costs no tokens), then ``completed`` /
``incomplete`` / ``failed`` (a backend that fails before its first event
included); if the client goes away mid-stream the server closes the body,
which closes the provider's stream (its HTTP connection) and records the
response ``cancelled`` with the usage seen so far (estimated from the streamed text
when the provider had not reported any, and marked so).
"""

from __future__ import annotations

import itertools
import logging
from typing import Any, Callable, Iterator

from llmconn.errors import LimitExceeded, LLMConnError, StoreError
from llmconn.gateway import backend, call_registry, items as mod_items, limits
from llmconn.gateway.echo import bounded
from llmconn.gateway.reasoning import sealed_answer
from llmconn.gateway.responses import Call, output_items, record, response_object, usage_object
from llmconn.gateway.tools import call_item
from llmconn.gateway.stream import ResponseEvents, estimated_usage, sse

logger = logging.getLogger('llmconn.gateway')


def _provider_events(call: Call, stream: bool) -> Iterator:
    return backend.events(call.conn, call.conversation, call.params, stream,
                          previous_response_id=call.provider_previous_id, store=call.store, key_id=call.key.id,
                          tools=call.tools, hosted=call.hosted, fallbacks=call.fallbacks, on_failover=call.failed_over)


def _finished(call: Call, reply: Any) -> tuple[str, str, dict, dict, list]:
    """The ending of an answer: status, reason, usage, its canonical assistant item, its calls."""
    status, reason = backend.finish(call.answering, reply.raw)
    usage = usage_object(**reply.usage)
    steps = backend.steps(reply)
    answer = mod_items.message('assistant', reply.text, backend.opaque_items(call.answering, reply, steps))
    return status, reason, usage, answer, backend.calls(steps)


def _started(gw: Any, call: Call, events: Iterator, adm: Any) -> None:
    """Record the response in progress before the provider is reached: a store outage costs no tokens.

    A key with limits is admitted in the same round trip (:mod:`.limits`); refused, the record goes again.
    """
    rec = record(call, 'in_progress', None, [])
    try:
        try:
            gw.ledger.save(rec, call.expiry, rider=adm.admit_rider() if adm is not None else None)
        except LimitExceeded:
            _forget_quietly(gw, call)
            raise
    except BaseException:
        events.close()          # never started: it leaves the connection's calls in flight now
        raise


def _forget_quietly(gw: Any, call: Call) -> None:
    """A refused response's in_progress record: nobody was given its id."""
    try:
        gw.ledger.delete(call.key.tenant, call.id)
    except StoreError as e:
        logger.error('Could not remove the record of refused response %s: %s', call.id, e)


def _settling(adm: Any) -> Any:
    """What the ending's record carries for the key's limits: the spend its call (and others) left."""
    return adm.settle_rider() if adm is not None else None


def respond(gw: Any, call: Call) -> dict:
    """A plain (unstreamed) response: record it started, call, record the ending, answer."""
    events = _provider_events(call, False)
    adm = limits.current()
    _started(gw, call, events, adm)
    try:
        reply = backend.answer(events)
    except Exception as e:
        _record_failure(gw, call, e, [])
        raise
    status, reason, usage, answer, calls = _finished(call, reply)
    call_registry.remember_answer(gw, call, answer)
    output = output_items(reply.thinking, reply.text, status, calls, sealed_answer(call.sealer, answer), call.custom)
    gw.ledger.save(record(call, status, usage, output, provider_id=reply.response_id, answer=answer,
                          reason=reason, calls=calls), call.expiry, rider=_settling(adm))
    return response_object(call, status, output, usage, reason=reason)


def stream(gw: Any, call: Call, encode: Callable[[dict], Any] = sse) -> Iterator:
    """The events of a streamed response, each ``encode``-d: by default the SSE body.

    The provider is reached (and may refuse) before this returns. The WebSocket mode
    (:mod:`llmconn.gateway.responses_ws`) encodes the same events as the text of its messages.
    """
    events = _provider_events(call, True)
    adm = limits.current()
    _started(gw, call, events, adm)
    try:
        first = next(events)
    except Exception as e:      # refused, unreachable, or failed before its first event: recorded failed
        _record_failure(gw, call, e, [])
        raise
    normalizer = ResponseEvents(response_object(call, 'in_progress', [], None))
    return _body(gw, call, normalizer, itertools.chain([first], events), events, adm, encode)


def _body(gw: Any, call: Call, normalizer: ResponseEvents, events: Iterator, provider: Any,
          adm: Any, encode: Callable[[dict], Any]) -> Iterator:
    ended = False
    try:
        for event in normalizer.start():
            yield encode(event)
        for event in events:
            if event.type != 'done':
                for out in normalizer.feed(event.type, event.text):
                    yield encode(out)
                continue
            reply = event.reply
            status, reason, usage, answer, calls = _finished(call, reply)
            call_registry.remember_answer(gw, call, answer)
            closing = normalizer.finish(reply.text, response_object(call, status, [], usage, reason=reason),
                                        [call_item(c, call.custom) for c in calls], sealed_answer(call.sealer, answer))
            gw.ledger.save(record(call, status, usage, normalizer.output, provider_id=reply.response_id,
                                  answer=answer, reason=reason, calls=calls), call.expiry, rider=_settling(adm))
            ended = True
            for out in closing:
                yield encode(out)
            return
    except LLMConnError as e:
        ended = True
        closing = normalizer.fail(response_object(call, 'failed', [], None, error=_error(e)))
        _record_failure(gw, call, e, normalizer.output)
        for out in closing:
            yield encode(out)
    finally:
        provider.close()        # a client that left closes the provider's stream too
        if not ended:
            usage = estimated_usage(normalizer.streamed_chars)
            logger.info('Response %s cancelled by the client after %d streamed characters', call.id,
                        normalizer.streamed_chars)
            limits.estimated(adm, call.answering, usage)
            _save_quietly(gw, record(call, 'cancelled', usage, normalizer.partial_output()), call, _settling(adm))
            gw.registry.usage.add_estimate(call.answering.name, call.answering.conf.model, call.key.id, usage)


def _save_quietly(gw: Any, rec: dict, call: Call, rider: Any = None) -> None:
    """Record an ending that has no one left to report a store failure to."""
    try:
        gw.ledger.save(rec, call.expiry, rider=rider)
    except StoreError as e:
        logger.error('Could not record response %s as %s: %s', call.id, rec['status'], e)


def _error(e: Exception) -> dict:
    message = str(e) if isinstance(e, LLMConnError) else 'internal error'     # no internals in a record
    return {'code': 'server_error', 'message': bounded(message)}


def _record_failure(gw: Any, call: Call, e: Exception, output: list) -> None:
    _save_quietly(gw, record(call, 'failed', None, output, error=_error(e)), call)
