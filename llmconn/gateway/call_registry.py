"""The tool-call registry: the provider items behind the calls the gateway issued, found again by call id.

Claude with thinking wants its signed thinking blocks before the
``tool_use`` they led to, Gemini each ``functionCall`` with its
``thoughtSignature``, a Responses backend its reasoning items. A client
that replays the conversation itself sends back only what it was shown: a
Chat Completions client the assistant's ``tool_calls``; a Responses client
(the OpenAI Agents SDK, pydantic-ai, LangChain, ``llm``) the ``rs_…``
reasoning items without ``encrypted_content``, the ``fc_…`` function calls
and their outputs, with ``store`` at its default and no ``include``. So
the gateway keeps every answer that made calls and carries natives, its
canonical items whole, under the tenant and the answer's first call id::

    llmconn:gw:call:{<tenant digest>}:<sha256 of the call id>    JSON {"tag", "steps"}, PX response_expiry

When a later request of the same tenant carries an assistant message (Chat)
or a run of assistant-side items (Responses) whose calls are exactly that
answer's calls (ids, names and arguments, in order) and whose text is its
text, the stored answer takes their place: for every earlier tool turn of
the conversation, not only the one being continued. The natives then go
back to the provider, model and mode of the tag only, as every replay.

Only under standard retention, and on the Responses route only for a
stored response (``store`` true): a zero-retention key or ``store: false``
keeps nothing here, and its calls go back as the client sent them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from llmconn import items as canon
from llmconn.gateway.items import CALL_TYPES
from llmconn.gateway_config import Retention
from llmconn.store.records import RecordStore, tenant_digest

RETENTION = Retention.STANDARD   # the only retention under which the registry keeps anything


def call_key(tenant: str, call_id: str) -> str:
    digest = hashlib.sha256(call_id.encode('utf-8', 'surrogatepass')).hexdigest()
    return f'llmconn:gw:call:{{{tenant_digest(tenant)}}}:{digest}'


@dataclass(frozen=True)
class Registry:
    """The registry of one key's tenant; ``keeps`` is False under zero retention (it keeps and finds nothing)."""

    records: RecordStore
    tenant: str
    ttl: float
    keeps: bool

    def remember(self, steps: list[dict], tag: str) -> None:
        """Keep an answer's items when it made calls and carries natives a replay needs."""
        calls = canon.calls(steps)
        if not self.keeps or not calls or not any('native' in s for s in steps):
            return
        value = json.dumps({'tag': tag, 'steps': steps}, ensure_ascii=False)
        self.records.put(call_key(self.tenant, calls[0]['call_id']), value, self.ttl)

    def answers(self, groups: list[list[dict]]) -> list[dict | None]:
        """The stored answer each group (one answer's gateway items) is, or None; in one round trip."""
        sent = [_calls(group) for group in groups]
        asked = [i for i, calls in enumerate(sent) if calls]
        if not self.keeps or not asked:
            return [None] * len(groups)
        # One hash slot per tenant ({tenant digest}): a single MGET, in a Redis Cluster too.
        raws = self.records.values([call_key(self.tenant, sent[i][0][0]) for i in asked])
        found: list[dict | None] = [None] * len(groups)
        for i, raw in zip(asked, raws):
            found[i] = _match(groups[i], sent[i], json.loads(raw)) if raw else None
        return found


def _calls(said: list[dict]) -> list[tuple]:
    return [(i['call_id'], i['name'], i['arguments']) for i in said if i['type'] in CALL_TYPES]


def _match(said: list[dict], sent: list[tuple], stored: dict) -> dict | None:
    """The stored answer, if ``said`` is its calls and text as they were made; else None (theirs are sent)."""
    steps = stored['steps']
    text = ''.join(s['text'] for s in steps if s['kind'] in (canon.TEXT, canon.REFUSAL))
    texts = [i['text'] for i in said if i['type'] == 'message']
    made = [(c['call_id'], c['name'], c['arguments']) for c in canon.calls(steps)]
    if made != sent or (texts and ''.join(texts) != text):
        return None
    return {'type': 'message', 'role': 'assistant', 'text': text, 'opaque': {'tag': stored['tag'], 'items': steps}}


def of(gw: Any, key: Any) -> Registry:
    """The registry of ``key``'s tenant in the gateway's store."""
    return Registry(gw.ledger, key.tenant, gw.config.response_expiry, key.retention == RETENTION)


def remember(gw: Any, key: Any, steps: list[dict], tag: str) -> None:
    if canon.calls(steps):      # an answer without calls keeps nothing: no registry to look up for it
        of(gw, key).remember(steps, tag)


def forget(gw: Any, tenant: str, call_ids: list[str]) -> None:
    """Drop what the registry keeps for these calls (their response was deleted)."""
    gw.ledger.remove(*[call_key(tenant, call_id) for call_id in call_ids])


def remember_answer(gw: Any, call: Any, answer: dict) -> None:
    """Keep a Responses answer's items (its canonical assistant item) when the response is stored."""
    opaque = answer.get('opaque')
    if call.store and opaque:
        remember(gw, call.key, canon.canonical(opaque['items'], answer['text']), opaque['tag'])


def restore(gw: Any, key: Any, items: list[dict]) -> list[dict]:
    """Chat ``items`` with each assistant message's calls (and its text) replaced by the stored answer, if any."""
    for item in items:
        if item.get('message') is not None:
            break
    else:
        return items        # no assistant message made calls: nothing stored could stand in for one
    groups: list[list[dict]] = []
    for item in items:
        group = item.get('message')
        if group is not None and groups and groups[-1][0].get('message') == group:
            groups[-1].append(item)
        else:
            groups.append([item])
    said = [i for i, group in enumerate(groups) if group[0].get('message') is not None]
    found = dict(zip(said, of(gw, key).answers([groups[i] for i in said])))
    return [entry for i, group in enumerate(groups) for entry in ([found[i]] if found.get(i) else group)]
