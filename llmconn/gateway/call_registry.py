"""What a stateless Chat Completions client cannot send back: the provider items behind its tool calls.

Claude with thinking wants its signed thinking blocks before the
``tool_use`` it answers; Gemini wants each ``functionCall`` with its
``thoughtSignature``. A Chat Completions client sends back only the
assistant's ``tool_calls``, so the gateway keeps the answer's canonical
items (natives included) under the tenant and the first call id::

    llmconn:gw:call:{<tenant digest>}:<sha256 of the call id>    JSON {"tag", "steps"}, EX response_expiry

and when a later request of the same tenant carries an assistant message
whose ``tool_calls`` are exactly that answer's calls, the stored items take
its place (to the same provider, model and mode only, as every replay).
Only under standard retention: a zero-retention key keeps nothing, and its
calls go back as the client sent them.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from llmconn import items as canon
from llmconn.gateway.ledger import Ledger, tenant_digest


def call_key(tenant: str, call_id: str) -> str:
    digest = hashlib.sha256(call_id.encode('utf-8', 'surrogatepass')).hexdigest()
    return f'llmconn:gw:call:{{{tenant_digest(tenant)}}}:{digest}'


def remember(gw: Any, key: Any, steps: list[dict], tag: str) -> None:
    """Keep an answer's items when it made calls and carries natives a replay needs."""
    calls = canon.calls(steps)
    if not calls or key.retention != 'standard' or not any('native' in s for s in steps):
        return
    value = json.dumps({'tag': tag, 'steps': steps}, ensure_ascii=False)
    ttl = max(1, int(gw.config.response_expiry * 1000))
    Ledger._run(gw.ledger.client.set, call_key(key.tenant, calls[0]['call_id']), value, None, ttl)


def restore(gw: Any, key: Any, items: list[dict]) -> list[dict]:
    """``items`` with each assistant message's calls (and its text) replaced by the stored answer, if any."""
    out: list[dict] = []
    index = 0
    while index < len(items):
        item = items[index]
        group = item.get('message')
        if group is None:
            out.append(item)
            index += 1
            continue
        end = index
        while end < len(items) and items[end].get('message') == group:
            end += 1
        out += _stored(gw, key, items[index:end]) or items[index:end]
        index = end
    return out


def _stored(gw: Any, key: Any, said: list[dict]) -> list[dict] | None:
    sent = [(i['call_id'], i['arguments']) for i in said if i['type'] == 'function_call']
    ids = [call_id for call_id, _ in sent]
    if not ids or key.retention != 'standard':
        return None
    raw = Ledger._run(gw.ledger.client.get, call_key(key.tenant, ids[0]))
    if not raw:
        return None
    stored = json.loads(raw)
    if [(c['call_id'], c['arguments']) for c in canon.calls(stored['steps'])] != sent:
        return None         # not that answer's calls as they were made: the client's own are sent
    return [{'type': 'message', 'role': 'assistant', 'text': canon.final_text(stored['steps']),
             'opaque': {'tag': stored['tag'], 'items': stored['steps']}}]
