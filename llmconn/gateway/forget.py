"""What ``DELETE /v1/responses/{id}`` forgets: the response, and its content in every continuation.

In gateway mode a response's record keeps the whole conversation it
continued (``context``), so deleting response ``a`` of a chain ``a -> b``
would leave ``a``'s text in ``b`` and send it again when ``b`` is continued.
Instead, DELETE of ``a``:

1. marks ``a`` deleted in its chain (the set below), which outlives every
   response of the chain;
2. removes the kept conversation from every response that continues ``a``
   (they stay readable with GET, their own output and input; they can no
   longer be continued);
3. drops what the tool-call registry keeps of ``a``'s calls, so ``a``'s
   items sent back by a client get nothing restored;
4. deletes ``a``'s record.

Continuing a response whose lineage holds a deleted response is then a 400
``previous_response_forgotten``, before any network call, whatever the
store mode: in ``provider`` mode the backend still holds ``a`` in its own
chain, and nothing of it is sent again either. Each record names its
``chain`` (the id of the chain's first response) and its ``lineage`` (the
ids of the responses it continues, oldest first)::

    llmconn:gw:chain:{<chain id>}:<tenant digest>:members   set of the ids continuing the chain
    llmconn:gw:chain:{<chain id>}:<tenant digest>:deleted   set of its deleted ids

Both expire ``response_expiry`` after the chain's last new response, so they
outlive every record that could name them. A response being created from
``a`` while ``a`` is deleted may still be written with ``a``'s content (step
2 found it not yet written), but it cannot be continued (step 1).
"""

from __future__ import annotations

import json
from typing import Any

from llmconn.errors import GatewayError
from llmconn.gateway import call_registry
from llmconn.gateway.echo import shown
from llmconn.store.records import RecordStore, response_key, tenant_digest


def _keys(tenant: str, chain: str) -> tuple[str, str]:
    base = f'llmconn:gw:chain:{{{chain}}}:{tenant_digest(tenant)}'
    return base + ':members', base + ':deleted'


def chain_of(record: dict) -> str:
    """The id of the first response of ``record``'s chain."""
    return record.get('chain') or record['id']


def lineage(previous: dict | None) -> list[str]:
    """The ids a response continuing ``previous`` continues, oldest first."""
    return [*(previous.get('lineage') or ()), previous['id']] if previous else []


def join(gw: Any, tenant: str, previous: dict, response_id: str) -> None:
    """Add a new response continuing ``previous`` to its chain (before it can hold any of the chain's text)."""
    members, deleted = _keys(tenant, chain_of(previous))
    gw.ledger.add_member(members, response_id, gw.config.response_expiry, deleted)


def check(gw: Any, tenant: str, previous: dict) -> None:
    """Refuse continuing ``previous`` when a response of its lineage was deleted."""
    ancestors = previous.get('lineage') or ()
    if not ancestors:
        return
    gone = gw.ledger.members(_keys(tenant, chain_of(previous))[1])
    forgotten = [a for a in ancestors if a in gone]
    if forgotten:
        raise GatewayError(f'previous response {shown(previous["id"])} continues response {shown(forgotten[0])}, '
                           f'which was deleted, and with it the conversation it held; send the conversation to '
                           f'continue in input instead of previous_response_id', param='previous_response_id',
                           code='previous_response_forgotten')


def forget(gw: Any, tenant: str, record: dict) -> None:
    """Delete ``record``'s response and its content from every response continuing it."""
    members, deleted = _keys(tenant, chain_of(record))
    gw.ledger.add_member(deleted, record['id'], gw.config.response_expiry)
    for member in gw.ledger.members(members):
        _scrub(gw.ledger, tenant, member, record['id'])
    call_registry.forget(gw, tenant, [c['call_id'] for c in record.get('tool_calls') or ()])
    gw.ledger.delete(tenant, record['id'])


def _scrub(records: RecordStore, tenant: str, response_id: str, deleted_id: str) -> None:
    """Drop the kept conversation of a response that continues ``deleted_id`` (its expiry kept), once."""
    key = response_key(tenant, response_id)
    raw = records.value(key)
    rec = json.loads(raw) if raw else None
    if rec is None or deleted_id not in (rec.get('lineage') or ()) or 'forgotten' in rec:
        return
    rec.pop('context', None)
    rec['forgotten'] = deleted_id       # the first deleted response of its lineage
    records.replace(key, json.dumps(rec, ensure_ascii=False))
