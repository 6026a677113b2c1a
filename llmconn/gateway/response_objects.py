"""The Response objects of ``/v1/responses``: made for a call as it ends, or from its stored record.

:func:`response_object` shapes a Response as the Open Responses
specification and ``openai.types.responses.Response`` do, every required
field in its order with the settings that were sent upstream
(:mod:`llmconn.gateway.effective`); :func:`from_record` makes the same
object from what a record kept (``GET /v1/responses/{id}``). A call's end
time is taken once (:func:`ended_at`), so its answer and its record agree.
"""

from __future__ import annotations

import time as mod_time
from typing import TYPE_CHECKING, Any

from llmconn.gateway import effective
from llmconn.gateway import tools as mod_tools
from llmconn.gateway.stream import message_item, reasoning_item

if TYPE_CHECKING:
    from llmconn.gateway.responses import Call


def usage_object(input_tokens: int, output_tokens: int, estimated: bool = False, *, cache_read_tokens: int = 0,
                 cache_write_tokens: int = 0, reasoning_tokens: int = 0) -> dict:
    """A Response's usage; ``usage_object(**reply.usage)`` carries a reply's cache and reasoning counts."""
    usage = {'input_tokens': input_tokens,
             'input_tokens_details': {'cached_tokens': cache_read_tokens, 'cache_write_tokens': cache_write_tokens},
             'output_tokens': output_tokens, 'output_tokens_details': {'reasoning_tokens': reasoning_tokens},
             'total_tokens': input_tokens + output_tokens}
    if estimated:
        usage['estimated'] = True
    return usage


def response_object(call: Call, status: str, output: list, usage: dict | None, *, reason: str = '',
                    error: dict | None = None) -> dict:
    """A Response as the Open Responses specification and ``openai.types.responses.Response`` shape it."""
    return _resource(id=call.id, created_at=call.created_at, completed_at=_completed_at(call, status), status=status,
                     model=call.model, output=output, instructions=call.instructions, metadata=call.metadata,
                     previous_response_id=call.previous['id'] if call.previous else None, usage=usage,
                     error=error, incomplete_details={'reason': reason} if reason else None,
                     tools=call.echo_tools, store=call.store, settings=call.settings)


def _resource(*, settings: dict, **fields: Any) -> dict:
    """Every field the specification requires, in its order; ``settings`` as :mod:`effective` made them."""
    return {'id': fields['id'], 'object': 'response', 'created_at': int(fields['created_at']),
            'completed_at': fields['completed_at'], 'status': fields['status'],
            'incomplete_details': fields['incomplete_details'], 'model': fields['model'],
            'previous_response_id': fields['previous_response_id'], 'instructions': fields['instructions'],
            'output': fields['output'], 'error': fields['error'], 'tools': fields['tools'], 'tool_choice': 'auto',
            'parallel_tool_calls': True, 'background': False, 'store': fields['store'],
            'metadata': fields['metadata'], 'usage': fields['usage'],
            **(settings or effective.stored_defaults())}


def _completed_at(call: Call, status: str) -> int | None:
    """When the response ended; only a completed one has a completion time (as OpenAI reports it)."""
    return ended_at(call, status) if status == 'completed' else None


def ended_at(call: Call, status: str) -> int | None:
    """The time ``call`` ended, taken once (the answer and the record, written a moment apart, agree)."""
    if status == 'in_progress':
        return None
    if call.ended_at is None:
        call.ended_at = int(mod_time.time())
    return call.ended_at


def output_items(thinking: str, text: str, status: str, calls: list | None = None, sealed: str = '',
                 custom: frozenset = frozenset()) -> list:
    """The Response's output: reasoning (carrying ``sealed``), the message (unless the answer is only calls),
    the calls (a custom tool's as ``custom_tool_call``)."""
    out = [reasoning_item(thinking, sealed=sealed)] if thinking or sealed else []
    if text or not calls:
        out.append(message_item(text, 'incomplete' if status == 'incomplete' else 'completed'))
    return out + [mod_tools.call_item(c, custom) for c in calls or ()]


def _stored_usage(usage: dict | None) -> dict | None:
    """A record's usage as a Response carries it (a cancelled response's estimate has no details)."""
    if not usage:
        return None
    if 'input_tokens_details' in usage:
        return {k: v for k, v in usage.items() if k != 'estimated'}
    return usage_object(usage.get('input_tokens') or 0, usage.get('output_tokens') or 0)


def from_record(rec: dict) -> dict:
    """The Response a stored record describes (GET /v1/responses/{id})."""
    completed = rec['status'] == 'completed' and rec.get('completed_at')
    return _resource(id=rec['id'], created_at=rec['created_at'], completed_at=int(rec['completed_at']) if completed
                     else None, status=rec['status'], model=rec['model'], output=rec.get('output') or [],
                     instructions=rec.get('instructions'), metadata=rec.get('metadata') or {},
                     previous_response_id=rec.get('previous_response_id'), usage=_stored_usage(rec.get('usage')),
                     error=rec.get('error'), incomplete_details=rec.get('incomplete_details'),
                     tools=rec.get('tools') or [], store=True, settings=rec.get('settings') or {})
