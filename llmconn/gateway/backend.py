"""The gateway's side of a connection: a conversation in, the connection's own events out.

The gateway is a client of the library. A request becomes a
:class:`~llmconn.types.CallSpec` of the gateway's own conversation (its
system prompt, earlier turns, the turn in progress, a provider-side
previous response id, ``store: false``) and goes through
:meth:`Connection.run <llmconn.connection.Connection.run>`, the entry
``invoke``, ``chat`` and ``stream`` use: the same checks, in-flight count,
deadline, retries, metrics, access log and usage ledger. Nothing here builds
or parses a provider body. The events are the public ones: ``thinking`` and
``text`` deltas, then one ``done`` whose ``reply`` is the backend's answer,
whole.

A user message's images and files are the turn's ``attachments``, and a
json_schema format on a backend that answers ``schema=`` natively is the
call's ``schema`` (:data:`llmconn.gateway.values.SCHEMA` in ``params``), so
both take the library's own path and checks.

Function tools go to the provider as manual tools (the gateway never runs
them); a conversation that ends with function outputs is sent as the turn
in progress (``CallSpec.items``: the backend's own calls with their
natives, then the outputs), so the provider renders them as its native tool
results. What an answer means (finished or cut short, which items must go
back) is the provider's to say (:mod:`llmconn.providers`).
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any, Iterator

from llmconn import items as mod_items
from llmconn.errors import GatewayError
from llmconn.gateway import values
from llmconn.gateway.items import Conversation
from llmconn.providers.base import SYSTEM
from llmconn.types import CallSpec, Event, drain

if TYPE_CHECKING:
    from llmconn.call_record import CallRecord


def kind(conn: Any) -> str:
    """The provider kind behind a connection (the capability matrix's column)."""
    return conn.provider.name


def check_replay(conn: Any, conversation: Conversation) -> None:
    """Refuse, before dispatch, a continuation the backend would refuse for want of its replayed items."""
    steps = list(conversation.items)
    if conversation.tag != conn.provider.tag:
        steps = mod_items.plain(steps)
    missing = conn.provider.lacks_replay(steps)
    if missing:
        raise GatewayError(f'input: {missing} a request answers, and this request carries none for them (they came '
                           'back without their sealed reasoning item, or another model or mode made them). Ask '
                           'for include: ["reasoning.encrypted_content"] and send the reasoning item back with the '
                           'calls, or store the response and continue it with previous_response_id',
                           param='input', code='reasoning_required')


def check_usable(conn: Any, model: str) -> None:
    if not conn.conf.is_active:
        raise GatewayError(f'The model {model!r} is not active on this gateway.', 404, code='model_not_found',
                           param='model')


def events(conn: Any, conversation: Conversation, params: dict, stream: bool, *,
           previous_response_id: str = '', store: bool = True, key_id: str = '', tools: tuple = (),
           hosted: tuple = (), fallbacks: tuple = (), on_failover: Any = None,
           record: 'CallRecord | None' = None) -> Iterator[Event]:
    """The connection's events for ``conversation``: ``thinking`` / ``text`` deltas and one ``done``.

    Checked now (bad input raises before any network call); the provider is
    reached on the first ``next``. The call is counted in the usage ledger
    under the gateway key ``key_id``, however it ends. It may fail over to
    ``fallbacks`` (:mod:`llmconn.gateway.fallbacks`), which calls
    ``on_failover(fallback)`` before any of that one's events. ``record``
    (a :class:`~llmconn.call_record.CallRecord`: the Responses route's) is
    kept by the pipeline at the points it would keep a chat.
    """
    if conversation.system and SYSTEM not in conn.provider.capabilities:
        raise GatewayError(f'instructions and system messages are not supported with a {kind(conn)} backend',
                           param='instructions', code='unsupported_field')
    params = dict(params)
    schema = params.pop(values.SCHEMA, None)       # json_schema asked of a backend that takes schema= (Claude, Gemini)
    chain = {'previous_response_id': previous_response_id} if previous_response_id else {}
    if previous_response_id and conversation.items and not conversation.turns and not conversation.text:
        chain['continuation'] = True        # the backend's chain holds the calls; only the outputs go
    return conn.run(CallSpec(
        conversation.text, params=params, stream=stream, tools=list(tools) or None, system=conversation.system,
        history=tuple(conversation.turns), items=tuple(conversation.items), tag=conversation.tag,
        hosted=tuple(hosted), chain=chain, stateless=not store, run_tools=False, key_id=key_id, schema=schema,
        attachments=list(conversation.attachments) or None, fallbacks=tuple(fallbacks), on_failover=on_failover,
        record=record))


def answer(events: Iterator[Event]) -> Any:
    """The backend's whole answer (the ``done`` event's reply), the events drained to their end."""
    return drain(events).reply


def finish(conn: Any, raw: Any) -> tuple[str, str]:
    """``("completed", "")`` or ``("incomplete", reason)``, as the backend's provider reads its raw answer."""
    return conn.provider.finish(raw)


def steps(reply: Any) -> list[dict]:
    """The answer as canonical items, every call with a call id (made here, once, if the backend gave none)."""
    out = list(getattr(reply, 'steps', ()) or ())
    return [dict(s, call_id='call_' + uuid.uuid4().hex[:24]) if s['kind'] == mod_items.CALL and not s['call_id']
            else s for s in out]


def calls(answer_steps: list[dict]) -> list[dict]:
    return mod_items.calls(answer_steps)


def opaque_items(conn: Any, reply: Any, answer_steps: list[dict] | None = None) -> dict | None:
    """The reply's items, tagged, for replay (natives to the same provider/model/mode only).

    The canonical steps when the answer has any beyond plain text (calls, reasoning, natives);
    else the bare natives (thinking) as before steps existed.
    """
    answer_steps = steps(reply) if answer_steps is None else answer_steps
    plain = all(s['kind'] == mod_items.TEXT and 'native' not in s for s in answer_steps)
    items = (getattr(reply, 'items', ()) or ()) if plain else answer_steps
    return {'tag': conn.provider.tag, 'items': list(items)} if items else None
