"""The one seam between the gateway and a connection: a conversation in, llmconn events out.

The gateway needs what ``conn.invoke`` does not take: a system prompt of the
request's own, turns that are not a stored chat, a provider-side previous
response id, ``store: false``. So it builds the :class:`~llmconn.types.Request`
itself and runs it through the connection's pure provider mapping
(``build_request`` / ``parse_response`` / ``read_stream``) and its transport
(``post`` / ``post_stream``), exactly as the connection's own pipeline does,
without reading or writing the connection's chat store. The events are the
public ones: ``thinking`` and ``text`` deltas, then one ``done``.

Function tools go to the provider as manual tools (the gateway never runs
them); a conversation that ends with function outputs is sent as the turn in
progress (``Request.items``: the backend's own calls with their natives, then
the outputs), so the provider renders them as its native tool results.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Iterator

from llmconn import items as mod_items
from llmconn.errors import GatewayError
from llmconn.gateway.items import Conversation
from llmconn.providers.base import STREAM, SYSTEM
from llmconn.types import Event, Reply, Request

RESPONSES_KIND = 'openai-responses'
_THINKING_MODES = ('enabled', 'adaptive')     # Claude's thinking types that sign their blocks

# The provider's stop reason (in its raw answer) that means "cut short", per kind.
_INCOMPLETE = {
    'claude': ('stop_reason', {'max_tokens': 'max_output_tokens', 'refusal': 'content_filter'}),
    'openai': ('finish_reason', {'length': 'max_output_tokens', 'content_filter': 'content_filter'}),
    'gemini': ('finishReason', {'MAX_TOKENS': 'max_output_tokens', 'SAFETY': 'content_filter'}),
}


def kind(conn: Any) -> str:
    """The provider kind behind a connection (the capability matrix's column)."""
    return conn.conf.provider


def keeps_state(conn: Any) -> bool:
    """True when the backend itself keeps responses and continues from their ids."""
    return kind(conn) == RESPONSES_KIND and conn.conf.state == 'provider'


def check_replay(conn: Any, conversation: Conversation) -> None:
    """Refuse, before dispatch, continuing calls that Claude with thinking on would refuse without their thinking.

    Claude wants the assistant message that continues after ``tool_use`` to start with its signed
    thinking block; a stateless client that did not ask for (or send back) the sealed reasoning
    item has none to send, and no other form of the turn is faithful.
    """
    if kind(conn) != 'claude' or conn.provider.mode not in _THINKING_MODES or not conversation.items:
        return
    steps = list(conversation.items)
    if conversation.tag != conn.provider.tag:
        steps = mod_items.plain(steps)
    said = mod_items.rounds(steps)[-1][0]
    if mod_items.calls(said) and not any('native' in s for s in said):     # the client's own calls, bare
        raise GatewayError('input: Claude with extended thinking must get its signed thinking back before the '
                           'function calls a request answers, and this request carries none for them (they came '
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
           hosted: tuple = ()) -> Iterator[Event]:
    """Call the connection's provider; yields ``thinking`` / ``text`` deltas and one ``done``.

    The call is counted in the registry's usage ledger under the connection, its model and the
    gateway key ``key_id``, however it ends (answered, failed, or closed early by a client that left).
    """
    provider, transport = conn.provider, conn.transport
    if conversation.system and SYSTEM not in provider.capabilities:
        raise GatewayError(f'instructions and system messages are not supported with a {kind(conn)} backend',
                           param='instructions', code='unsupported_field')
    if stream and STREAM not in provider.capabilities:
        # A backend that cannot stream answers whole; the stream is built from that one answer.
        return _whole(events(conn, conversation, params, False, previous_response_id=previous_response_id,
                             store=store, key_id=key_id, tools=tools, hosted=hosted))
    chain = {'previous_response_id': previous_response_id} if previous_response_id else {}
    if previous_response_id and conversation.items and not conversation.turns and not conversation.text:
        chain['continuation'] = True        # the backend's chain holds the calls; only the outputs go
    turn = conversation.items
    if turn and conversation.tag != provider.tag:
        turn = tuple(mod_items.plain(turn))     # natives go back only to the provider, model and mode that made them
    request = Request(text=conversation.text, system=conversation.system, history=conversation.turns,
                      params=params, stream=stream, chain=chain, items=turn, tools=tuple(tools),
                      hosted=tuple(hosted), tag=provider.tag)
    body = provider.build_request(request)
    if not store and 'store' in body:
        body['store'] = False       # the request said store: false; the backend must not keep it either
    headers = provider.headers()
    if stream:
        answer = provider.read_stream(transport.post_stream(provider.url(stream=True), headers, body))
    else:
        answer = _plain(provider, transport, headers, body)
    return _counted(conn, key_id, _done_events(answer))


@dataclass(frozen=True)
class Done:
    """The gateway's own last event: the result and the whole :class:`Reply` it came from."""

    reply: Reply
    type: str = 'done'
    text: str = ''

    @property
    def result(self) -> dict:
        """The reply as the usage ledger counts it: with its calls, so each one counts in ``tool_calls``."""
        result = self.reply.as_result()
        calls = self.reply.calls
        if calls:
            result['tool_calls'] = calls
        return result


def _done_events(answer: Iterator) -> Iterator:
    """A provider's parse ends with its Reply; the gateway hands it on as a ``done`` event."""
    for event in answer:
        yield Done(event) if isinstance(event, Reply) else event


def _plain(provider: Any, transport: Any, headers: dict, body: dict) -> Iterator[Reply]:
    if getattr(provider, 'raw_answers', False):     # a template endpoint reads the status and text itself
        answer = transport.exchange(provider.http_method, provider.url(), headers, body)
    else:
        answer = transport.post(provider.url(stream=False), headers, body)
    yield provider.done(provider.parse_response(answer))


def _counted(conn: Any, key_id: str, answer: Iterator[Event]) -> Iterator[Event]:
    usage = getattr(conn, 'usage', None)     # the operations usage ledger (llmconn.usage), when there is one
    if usage is None:
        return answer
    return usage.call(conn.name, conn.conf.model, key_id).track(answer)


def _whole(answer: Iterator[Event]) -> Iterator[Event]:
    for event in answer:
        reply = event.reply
        if reply.thinking:
            yield Event('thinking', text=reply.thinking)
        if reply.text:
            yield Event('text', text=reply.text)
        yield event


def finish(conn: Any, raw: Any) -> tuple[str, str]:
    """``("completed", "")`` or ``("incomplete", reason)`` from the provider's raw answer."""
    if not isinstance(raw, dict):
        return 'completed', ''
    if kind(conn) == RESPONSES_KIND:
        if raw.get('status') == 'incomplete':
            return 'incomplete', (raw.get('incomplete_details') or {}).get('reason') or 'max_output_tokens'
        return 'completed', ''
    field, reasons = _INCOMPLETE.get(kind(conn), ('', {}))
    value = raw.get(field)
    if value is None:
        holder = (raw.get('choices') or raw.get('candidates') or [{}])[0]
        value = holder.get(field) if isinstance(holder, dict) else None
    reason = reasons.get(value)
    return ('incomplete', reason) if reason else ('completed', '')


def provider_response_id(reply: Any) -> str:
    return getattr(reply, 'response_id', '') or ''


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
