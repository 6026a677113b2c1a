"""A Responses call's record, kept by the connection's one pipeline at the points it keeps a chat.

:class:`ResponseRecord` is the :class:`~llmconn.call_record.CallRecord` of
one ``/v1/responses`` call: :mod:`.dispatch` puts it in the call's spec and
:meth:`Connection.run <llmconn.connection.Connection.run>` tells it how the
call goes, so a record is saved exactly where a chat turn would be::

    started     before the provider is reached, so a store outage costs no tokens: a stream's record
                in_progress (its client has the id from response.created on; a key with limits is
                admitted in the same round trip; refused, the record goes again); a plain response's
                id is known to nobody before its ending, so Redis is only asked to answer: a PING
                (the key's admission in the same send), or nothing when the call has no admission
                to send and read its previous response's record, or Redis answered this process's
                records within the last ANSWERED_FRESH (0.25 s): under load, never
    ended       completed / incomplete, before the answer (or response.completed) goes out: a client
                that has it can continue from its id at once, on any gateway process sharing the Redis
    failed      failed, a backend that fails before its first event included (the error's code only,
                without retention)
    cancelled   cancelled, when the client went away mid-stream: the usage seen so far, estimated
                from the streamed text when the provider had not reported any (and marked so)

Each records the connection that answered (``call.answering``: a fallback,
once the call failed over to one). What an ending makes (status, usage, the
output items and, when streamed, the closing events of
:class:`~llmconn.gateway.stream.ResponseEvents`) is kept on the record for
:mod:`.dispatch` to answer with.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from llmconn.errors import LimitExceeded, LLMConnError, StoreError
from llmconn.gateway import backend, call_registry, items as mod_items, limits
from llmconn.gateway.echo import bounded
from llmconn.gateway.reasoning import sealed_answer
from llmconn.gateway.response_objects import output_items, response_object, usage_object
from llmconn.gateway.response_record import record
from llmconn.gateway.responses import Call
from llmconn.gateway.stream import ResponseEvents
from llmconn.gateway.tools import call_item

logger = logging.getLogger('llmconn.gateway')


@dataclass
class Ending:
    """How a response ended, as its record says and its answer shows."""

    status: str
    usage: dict | None
    output: list
    reason: str = ''
    closing: list = field(default_factory=list)     # a stream's last events (ResponseEvents.finish or .fail)


class ResponseRecord:
    """The record of one Responses call; ``normalizer`` is its stream's, once it has one."""

    def __init__(self, gw: Any, call: Call, admission: Any = None) -> None:
        self.gw = gw
        self.call = call
        self.admission = admission          # the key's limits (llmconn.gateway.limits), None without
        self.normalizer: ResponseEvents | None = None
        self.ending: Ending | None = None

    def started(self) -> None:
        gw, call, adm = self.gw, self.call, self.admission
        rider = adm.admit_rider() if adm is not None else None
        if not call.stream:
            # Not when Redis answered this request already (its previous response), or this process a
            # moment ago: an outage since costs that call's tokens, as one during the call would.
            if rider is not None or (call.previous is None and not gw.ledger.answered_lately()):
                gw.ledger.reach(rider)
            return
        try:
            gw.ledger.save(record(call, 'in_progress', None, []), call.expiry, rider=rider)
        except LimitExceeded:
            self._forget_quietly()
            raise

    def ended(self, result: dict, reply: Any) -> None:
        gw, call, adm = self.gw, self.call, self.admission
        answering = call.answering
        status, reason = backend.finish(answering, reply.raw)
        usage = usage_object(**reply.usage)
        steps = backend.steps(reply)
        answer = mod_items.message('assistant', reply.text, backend.opaque_items(answering, reply, steps))
        calls = backend.calls(steps)
        limits.spent(adm, answering, reply.usage)       # before the record, which carries it; a fallback as itself
        call_registry.remember_answer(gw, call, answer)
        sealed = sealed_answer(call.sealer, answer)
        if self.normalizer is None:
            output, closing = output_items(reply.thinking, reply.text, status, calls, sealed, call.custom), []
        else:
            closing = self.normalizer.finish(reply.text, response_object(call, status, [], usage, reason=reason),
                                             [call_item(c, call.custom) for c in calls], sealed)
            output = self.normalizer.output
        gw.ledger.save(record(call, status, usage, output, provider_id=reply.response_id, answer=answer,
                              reason=reason, calls=calls), call.expiry, rider=self._settling())
        self.ending = Ending(status, usage, output, reason, closing)

    def failed(self, error: Exception) -> None:
        call, closing = self.call, []
        if self.normalizer is not None:
            closing = self.normalizer.fail(response_object(call, 'failed', [], None, error=_error(error)))
        output = self.normalizer.output if self.normalizer is not None else []
        self._save_quietly(record(call, 'failed', None, output, error=_error(error)))
        self.ending = Ending('failed', None, output, closing=closing)

    def cancelled(self, usage: dict) -> None:
        gw, call = self.gw, self.call
        streamed = self.normalizer.streamed_chars if self.normalizer is not None else 0
        logger.info('Response %s cancelled by the client after %d streamed characters', call.id, streamed)
        limits.spent(self.admission, call.answering, usage)
        output = self.normalizer.partial_output() if self.normalizer is not None else []
        self._save_quietly(record(call, 'cancelled', usage, output), self._settling())
        if usage.get('estimated'):      # reported usage was counted by the call's own tally
            gw.registry.usage.add_estimate(call.answering.name, call.answering.conf.model, call.key.id, usage)
        self.ending = Ending('cancelled', usage, output)

    def _settling(self) -> Any:
        """What the ending's record carries for the key's limits: the spend its call (and others) left."""
        return self.admission.settle_rider() if self.admission is not None else None

    def _save_quietly(self, rec: dict, rider: Any = None) -> None:
        """Record an ending that has no one left to report a store failure to."""
        try:
            self.gw.ledger.save(rec, self.call.expiry, rider=rider)
        except StoreError as e:
            logger.error('Could not record response %s as %s: %s', self.call.id, rec['status'], e)

    def _forget_quietly(self) -> None:
        """A refused response's in_progress record: nobody was given its id."""
        try:
            self.gw.ledger.delete(self.call.key.tenant, self.call.id)
        except StoreError as e:
            logger.error('Could not remove the record of refused response %s: %s', self.call.id, e)


def _error(e: Exception) -> dict:
    message = str(e) if isinstance(e, LLMConnError) else 'internal error'     # no internals in a record
    return {'code': 'server_error', 'message': bounded(message)}
