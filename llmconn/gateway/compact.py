"""``POST /v1/responses/compact``: a conversation summarized into one compaction item (SPEC §17).

The request names the conversation as a create request does (``input``,
``previous_response_id`` of a response the gateway keeps, ``instructions``);
the answer is a ``response.compaction`` object whose ``output`` is one
``compaction`` item, usable as the first item of the next request's
``input``: the gateway reads it back as a developer message holding the
summary, so the summary joins the system prompt, right after the
instructions.

The summary is written by the model's connection, or by its ``compaction``
connection when it has one, as a call counted under the key. The item's
``encrypted_content`` is the summary encoded, not encrypted: the client
holds the conversation it summarizes anyway.
"""

from __future__ import annotations

import json
import time as mod_time
import uuid
from typing import Any

from llmconn import compaction
from llmconn.config import DEFAULT_COMPACTION_INSTRUCTIONS
from llmconn.errors import GatewayError
from llmconn.gateway import items as mod_items
from llmconn.gateway.summary_item import encode
from llmconn.store.records import StoreMode
from llmconn.gateway.response_objects import usage_object
from llmconn.gateway.responses import _previous
from llmconn.types import USAGE_KEYS, CallSpec

def compact(gw: Any, key: Any, body: Any) -> dict:
    """Check the request, summarize its conversation, answer the compacted response."""
    if not isinstance(body, dict):
        raise GatewayError('the request body must be a JSON object')
    conn = gw.connection(key, body.get('model'))
    instructions = body.get('instructions')
    if instructions is not None:
        mod_items.check_text(instructions, 'instructions')
    previous = _previous(gw, key, body.get('previous_response_id'), conn)
    if previous is not None and previous['store_mode'] == StoreMode.PROVIDER:
        raise GatewayError('previous_response_id names a response its backend keeps, so the gateway does not have '
                           'its conversation to compact; send the conversation as input instead',
                           param='previous_response_id')
    new = mod_items.from_responses_input(body['input']) if body.get('input') is not None else []
    context = list(previous.get('context') or ()) + new if previous else new
    if not context:
        raise GatewayError('input or previous_response_id is required: the conversation to compact', param='input')
    summarizer = compaction.summarizer_of(conn.conf, gw.registry) if conn.conf.compaction else conn
    how = conn.conf.compaction.instructions if conn.conf.compaction else DEFAULT_COMPACTION_INSTRUCTIONS
    done = next(e for e in summarizer.run(CallSpec(text=_prompt(how, instructions, context), key_id=key.id))
                if e.type == 'done')
    usage = done.result['usage']
    item = {'id': 'cmp_' + uuid.uuid4().hex, 'type': 'compaction', 'encrypted_content': encode(done.result['text'])}
    return {'id': 'resp_' + uuid.uuid4().hex + uuid.uuid4().hex[:16], 'object': 'response.compaction',
            'created_at': int(mod_time.time()), 'output': [item],
            'usage': usage_object(**{k: usage.get(k, 0) for k in USAGE_KEYS})}


def _prompt(how: str, instructions: str | None, context: list[dict]) -> str:
    lines = [how, '']
    if instructions:
        lines += ['The assistant\'s instructions were:', instructions, '']
    lines.append('Conversation:')
    for item in context:
        if item['type'] == 'message':
            lines.append(f'{item["role"].capitalize()}: {item["text"]}')
        elif item['type'] in ('function_call', 'custom_tool_call'):
            lines.append(f'Assistant called {item["name"]}: {json.dumps(item["arguments"], ensure_ascii=False)}')
        elif 'output' in item:
            lines.append(f'Tool output: {item["output"]}')
    return '\n'.join(lines)
