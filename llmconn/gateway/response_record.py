"""What a response's record holds: the ledger's account of one ``/v1/responses`` call.

:func:`record` is written whole at each point of the call (in progress,
then its ending: :mod:`llmconn.gateway.recording`) and read back by
``GET``, ``previous_response_id`` and ``DELETE``. The prompt and answer
text (instructions, input and output items, the context a gateway-mode
response is continued from) are kept only when the response is stored under
standard retention; ids, times, status, usage, counts and the tool-call
registry always are. ``instructions`` are kept as a hash too, never carried
over to the next response.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from llmconn import items as canon
from llmconn.gateway import backend, forget, input_items
from llmconn.gateway import tools as mod_tools
from llmconn.gateway.response_objects import ended_at
from llmconn.gateway_config import Retention
from llmconn.store.records import StoreMode

if TYPE_CHECKING:
    from llmconn.gateway.responses import Call

CONTINUABLE = ('completed', 'incomplete')       # the statuses a new response may continue from


def instructions_hash(instructions: str | None) -> str:
    return 'sha256:' + hashlib.sha256(instructions.encode('utf-8')).hexdigest() if instructions else ''


def record(call: Call, status: str, usage: dict | None, output: list, *, provider_id: str = '',
           answer: dict | None = None, reason: str = '', error: dict | None = None, calls: list | None = None) -> dict:
    """The ledger record of ``call``; prompt and answer text only when stored under standard retention.

    ``answer`` is the canonical assistant item the response added to the conversation (gateway mode).
    """
    ttl = call.expiry
    rec = {'id': call.id, 'tenant': call.key.tenant, 'key_id': call.key.id, 'model': call.model,
           'provider_kind': backend.kind(call.answering), 'store_mode': call.mode, 'retention': call.key.retention,
           'previous_response_id': call.previous['id'] if call.previous else None,
           'chain': forget.chain_of(call.previous) if call.previous else call.id,
           'lineage': forget.lineage(call.previous),
           'provider_response_id': provider_id if call.mode == StoreMode.PROVIDER else '',
           'created_at': call.created_at, 'expires_at': call.created_at + ttl,
           'completed_at': ended_at(call, status),
           'status': status, 'usage': usage or {}, 'downgrades': call.downgrades,
           'counts': {'input_items': len(call.context), 'output_items': len(output),
                      'function_calls': len(calls or ())}}
    keep_text = call.store and call.key.retention == Retention.STANDARD
    if keep_text:
        rec.update(instructions_hash=instructions_hash(call.instructions), instructions=call.instructions,
                   metadata=call.metadata, output=output, input_items=input_items.render(call.id, call.input),
                   settings=call.settings, tools=call.echo_tools)
    if calls:
        rec['tool_calls'] = mod_tools.registry(calls)
    answered = _answered(call)
    if answered:
        rec['tool_outputs'] = answered
    if reason:
        rec['incomplete_details'] = {'reason': reason}
    if error:
        # A provider's message may quote the prompt (a 400 naming the bad input): without retention
        # only its code is kept.
        rec['error'] = error if keep_text else {'code': error.get('code') or 'server_error'}
    if call.mode == StoreMode.GATEWAY and keep_text and status in CONTINUABLE and (answer is not None or call.warm):
        rec['context'] = call.context + ([answer] if answer is not None else [])     # a warm-up's: its input
    return rec


def _answered(call: Call) -> list:
    """The registry entries of the calls this request answers (joined to the response that made them)."""
    items = call.conversation.items
    if not items or call.previous is None:
        return []
    names = {c['call_id']: c['name'] for c in call.previous.get('tool_calls') or ()}
    return [{'call_id': i['call_id'], 'name': names.get(i['call_id'], ''), 'response_id': call.previous['id'],
             'status': 'answered'} for i in items if i['kind'] == canon.OUTPUT]
