"""OpenAI Responses API (``POST {address}/responses``), stateless or stateful.

``state: local`` (the default) sends ``store: false`` and replays the chat
window as input items. ``state: provider`` sends ``store: true`` and, when
the connection gives a ``previous_response_id``, only the new user message;
without one (a new chain) the window is replayed as in local mode. A
stateless call (``Request.stateless``: the gateway's ``store: false``) sends
``store: false`` in either mode, and asks for the encrypted reasoning the
items would otherwise be unusable without.

Reasoning models pair each reasoning item with the output message that
followed it, by id: a reasoning item replayed without its message (or the
reverse) is rejected. So when a reply carries reasoning, the turn's opaque
items are the reply's whole ``output`` list, verbatim, and replaying the turn
means sending those items instead of a plain assistant message. Without
``store`` a reasoning item is only usable with its ``encrypted_content``,
which is asked for (``include``) when the call sets ``reasoning``. Asking
always would break non-reasoning models (gpt-4o, gpt-4.1 answer 400
"Encrypted content is not supported with this model"), so a local-mode reply
whose reasoning came back without it keeps no items and replays as text.

A stream's text is taken from ``response.completed``, which carries the
whole response; if that response holds no text, the deltas already streamed
are the answer (and the items finished by ``response.output_item.done``).

Tools: ``function_call`` items are answered by ``function_call_output``
items; under ``store: false`` the reasoning items that preceded the calls go
back with them, verbatim. A custom tool (a ``type: custom`` definition among
the hosted ones, free-form input) is called with ``custom_tool_call`` items:
canonically a call whose arguments are ``{"input": <text>}``, rendered back
as that item (and its output as ``custom_tool_call_output``) for the custom
tools the request declares. The provider-side chain (``state: provider``) is
this module's :class:`ResponsesChain`: the first call of a turn continues the
previous turn's response, later rounds continue the round before and send
only the outputs, and a chain the provider forgot is re-seeded from the
local window.
"""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from typing import Any, Iterable, Iterator

from llmconn import attachments as mod_attachments
from llmconn import items as mod_items
from llmconn.errors import LLMError
from llmconn.providers.base import CUSTOM_TOOLS, REASONING_REPLAY, SSE, STATEFUL, STREAM, STRUCTURED, SYSTEM, TOOLS
from llmconn.providers.base import Chain, Provider
from llmconn.providers.base import arguments_json, forgot_previous, is_done_marker, json_event, nonempty, plain_reply
from llmconn.providers.base import attached, parse_arguments
from llmconn.providers.base import tokens
from llmconn.providers.openai import bearer_headers, error_text
from llmconn.types import Event, Reply, Request, Turn

ENCRYPTED_REASONING = 'reasoning.encrypted_content'
CUSTOM_TOOL = 'custom'              # a tool definition with free-form input (not JSON arguments)
CUSTOM_CALL = 'custom_tool_call'

# Several reasoning summaries read as paragraphs, streamed and unstreamed alike.
THINKING_SEPARATOR = '\n\n'

# Events that end a stream with a response to parse; ``incomplete`` is a partial answer (max_output_tokens).
_final_events = ('response.completed', 'response.incomplete')
_text_deltas = ('response.output_text.delta', 'response.refusal.delta')
# Summaries from OpenAI; the raw reasoning text from servers that show it (vLLM, LM Studio).
_thinking_deltas = ('response.reasoning_summary_text.delta', 'response.reasoning_text.delta')



class OpenAIResponsesProvider(Provider):
    """OpenAI Responses, replaying reasoning items or continuing a provider-side chain."""

    name = 'openai-responses'
    default_address = 'https://api.openai.com/v1'
    capabilities = frozenset({STREAM, SYSTEM, REASONING_REPLAY, STATEFUL, TOOLS, STRUCTURED, CUSTOM_TOOLS})
    reserved_params = frozenset({'model', 'input', 'instructions', 'stream', 'store', 'previous_response_id',
                                 'tools'})
    accepts = {mod_attachments.DATA: mod_attachments.MEDIA_TYPES,
               mod_attachments.URL: mod_attachments.IMAGES | {mod_attachments.PDF}}

    @property
    def mode(self) -> str:
        return self.conf.state

    @property
    def keeps_state(self) -> bool:
        return self.conf.state == 'provider'

    def finish(self, raw: Any) -> tuple[str, str]:
        if isinstance(raw, dict) and raw.get('status') == 'incomplete':
            return 'incomplete', (raw.get('incomplete_details') or {}).get('reason') or 'max_output_tokens'
        return 'completed', ''

    def url(self, stream: bool = False) -> str:
        return f'{self.conf.address}/responses'

    def ping_url(self) -> str:
        return f'{self.conf.address}/models'

    def headers(self) -> dict[str, str]:
        return bearer_headers(self.conf)

    # ---- request

    def chain(self, window: list[Turn]) -> Chain:
        return ResponsesChain(self, window)

    def build_request(self, request: Request) -> dict[str, Any]:
        stateful = self.conf.state == 'provider'
        previous = request.chain.get('previous_response_id', '') if stateful else ''
        items: list[dict[str, Any]] = []
        custom = frozenset(t.get('name') for t in request.hosted if t.get('type') == CUSTOM_TOOL)
        if request.chain.get('continuation'):
            items += _round_items(request.items, custom)        # the chain holds the rest of the turn
        else:
            for turn in request.history:
                items += _turn_items(user_content(turn.user, attached(turn)), self.steps(turn), custom)
            items += _turn_items(user_content(request.text, request.attachments), self.current(request), custom)

        body: dict[str, Any] = {'model': self.conf.model}
        # Instructions are not carried along a chain: they go with every call.
        if request.system:
            body['instructions'] = request.system
        body['input'] = items
        body['max_output_tokens'] = self.conf.max_tokens
        body['store'] = stateful and not request.stateless
        if previous:
            body['previous_response_id'] = previous
        tools = [_tool(t) for t in request.tools] + list(request.hosted)
        if tools:
            body['tools'] = tools
        if request.schema is not None:
            body['text'] = {'format': {'type': 'json_schema', 'name': request.schema.name,
                                       'schema': request.schema.schema, 'strict': True}}
        if request.stream:
            body['stream'] = True
        params = self.body_params(request)
        if not body['store'] and 'reasoning' in params and 'include' not in params:
            body['include'] = [ENCRYPTED_REASONING]
        if self.conf.cache == 'auto' and request.cache_key:
            body['prompt_cache_key'] = request.cache_key        # keeps the chat on one cache (caching.py)
        body.update(params)
        return body

    # ---- response

    def parse_response(self, body: Any) -> Reply:
        if not isinstance(body, dict) or 'output' not in body:
            said = error_text(body)
            raise self.error(f'the provider answered with something that is not a response: {said}', body,
                             quoted=said)
        if body.get('error') or body.get('status') == 'failed':
            said = error_text(body)
            raise self.error(f'the response failed: {said}; try again', body, quoted=said)
        output = [i for i in body.get('output') or () if isinstance(i, dict)]
        text, thinking = [], []
        for item in output:
            if item.get('type') == 'message':
                text += [p.get('text') or p.get('refusal') or '' for p in item.get('content') or ()
                         if isinstance(p, dict)]
            elif item.get('type') == 'reasoning':
                thinking += _reasoning_texts(item)
        usage = body.get('usage') or {}
        replayable = self._replayable(output)
        steps = [_step(i) for i in output]
        if not replayable:
            # No reasoning to pair with (or none usable without store): the items go back from their
            # canonical fields; only hosted-tool items, which have no other form, keep their natives.
            steps = [s if s['kind'] == mod_items.HOSTED else _bare(s) for s in steps
                     if s['kind'] != mod_items.REASONING]
        return Reply(text=''.join(text), **_usage(usage), raw=body,
                     thinking=THINKING_SEPARATOR.join(t for t in thinking if t),
                     items=replayable, response_id=body.get('id') or '',
                     model=body.get('model') or '', steps=tuple(steps))

    def _replayable(self, output: list) -> tuple:
        reasoning = [i for i in output if i.get('type') == 'reasoning']
        if not reasoning:
            return ()
        # Without store, the provider keeps nothing: a reasoning item is only usable with its encrypted content.
        if self.conf.state == 'local' and not all(i.get('encrypted_content') for i in reasoning):
            return ()
        return tuple(output)

    def parse_stream(self, events: Iterable[SSE]) -> Iterator[Event]:
        last_summary = None
        streamed: list[str] = []
        finished: list[dict] = []     # items completed by output_item.done, for a bare response.completed
        thought: list[str] = []
        for sse in events:
            if is_done_marker(sse):
                continue
            data = json_event(self, sse)
            kind = data.get('type') or sse.event
            if kind in _text_deltas and data.get('delta'):
                streamed.append(data['delta'])
                yield Event('text', text=data['delta'])
            elif kind in _thinking_deltas and data.get('delta'):
                summary = (data.get('item_id'), data.get('summary_index', data.get('content_index')))
                if last_summary is not None and summary != last_summary:
                    thought.append(THINKING_SEPARATOR)
                    yield Event('thinking', text=THINKING_SEPARATOR)
                last_summary = summary
                thought.append(data['delta'])
                yield Event('thinking', text=data['delta'])
            elif kind == 'response.output_item.done' and isinstance(data.get('item'), dict):
                finished.append(data['item'])
            elif kind in _final_events:
                response = data.get('response')
                if isinstance(response, dict) and not response.get('output') and finished:
                    response = dict(response, output=finished)
                reply = self.parse_response(response)
                if not reply.text and streamed:
                    reply = dataclasses.replace(reply, text=''.join(streamed))
                if not reply.thinking and thought:
                    reply = dataclasses.replace(reply, thinking=''.join(thought))
                yield self.done(reply)
                return
            elif kind == 'response.failed':
                response = data.get('response') or {}
                said = error_text(response)
                raise self.error(f'the response failed: {said}; try again', response, quoted=said)
            elif kind == 'error':
                said = str(data.get('message') or error_text(data))
                raise self.error(f'the provider reported an error mid-stream: {said}; the reply was not saved, '
                                 f'try again', data, quoted=said)
        raise self.error('the stream ended before response.completed, so the reply is incomplete; try again')


class ResponsesChain(Chain):
    """``state: provider``: continue the provider's chain while it stays within the window."""

    def __init__(self, provider: OpenAIResponsesProvider, window: list[Turn]) -> None:
        super().__init__(window)
        self.stateful = provider.conf.state == 'provider'
        last = window[-1].state if window else {}
        if self.stateful and last.get('response_id') and last.get('chain', 0) + 1 <= provider.conf.max_history_turns:
            self.previous, self.length = last['response_id'], last.get('chain', 0) + 1
        else:
            self.previous, self.length = '', len(window) + 1
        self.items: list[dict] = []

    def request(self, base: Request, items: list[dict], last: Reply | None) -> Request:
        self.items = list(items)
        if self.stateful and last is not None and last.response_id:
            new = []
            for item in reversed(items):        # the outputs that answer the last round
                if item['kind'] != mod_items.OUTPUT:
                    break
                new.insert(0, item)
            return replace(base, history=(), items=tuple(new),
                           chain={'previous_response_id': last.response_id, 'continuation': True})
        if self.previous:
            return replace(base, history=(), items=tuple(items), chain={'previous_response_id': self.previous})
        return super().request(base, items, last)

    def recover(self, error: LLMError, request: Request) -> Request | None:
        previous = request.chain.get('previous_response_id', '')
        if not previous or not forgot_previous(error, previous):
            return None
        # The local window is the truth; the provider's copy of the chain is gone, and with it the
        # stored items our turns' natives refer to, so everything goes back as plain items.
        self.previous, self.length = '', len(self.window) + 1
        plain = tuple(replace(turn, tag='') for turn in self.window)
        return replace(request, history=plain, items=tuple(mod_items.plain(self.items)), chain={})

    def state(self, reply: Reply) -> dict:
        if not self.stateful or not reply.response_id:
            return {}
        return {'response_id': reply.response_id, 'chain': self.length}


def user_content(text: str, attached: tuple) -> Any:
    """A user message's content: its text, after ``input_image`` / ``input_file`` parts for its attachments."""
    if not attached:
        return text
    return [_attachment_part(a) for a in attached] + [{'type': 'input_text', 'text': text}]


def _attachment_part(attachment) -> dict:
    kind = attachment.media_type
    if kind in mod_attachments.IMAGES:
        return {'type': 'input_image', 'image_url': attachment.url or attachment.data_url, 'detail': 'auto'}
    if kind == mod_attachments.TEXT:
        return {'type': 'input_text', 'text': attachment.text}
    if attachment.url:
        return {'type': 'input_file', 'file_url': attachment.url}
    return {'type': 'input_file', 'file_data': attachment.data_url, 'filename': attachment.name or 'document.pdf'}


def _turn_items(user: Any, steps: list[dict], custom: frozenset = frozenset()) -> list[dict]:
    reply = plain_reply(steps)
    if reply is not None:
        return [_message('user', user), _message('assistant', reply)]
    return [_message('user', user)] + _round_items(steps, custom)


def _round_items(steps: Iterable[dict], custom: frozenset = frozenset()) -> list[dict]:
    """Items as input: natives verbatim, the rest from their canonical fields (``custom``: custom tool names)."""
    out: list[dict[str, Any]] = []
    steps = list(steps)
    custom_calls = {i['call_id'] for i in steps if i['kind'] == mod_items.CALL and (
        i['name'] in custom or (i.get('native') or {}).get('type') == CUSTOM_CALL)}
    for item in steps:
        kind = item['kind']
        if 'native' in item:
            out.append(item['native'])
        elif kind == mod_items.CALL and item['name'] in custom:
            arguments = item['arguments'] if isinstance(item['arguments'], dict) else {}
            out.append({'type': CUSTOM_CALL, 'call_id': item['call_id'], 'name': item['name'],
                        'input': str(arguments.get('input', ''))})
        elif kind == mod_items.CALL:
            out.append({'type': 'function_call', 'call_id': item['call_id'], 'name': item['name'],
                        'arguments': arguments_json(item['arguments'])})
        elif kind == mod_items.OUTPUT:
            answers_custom = item['call_id'] in custom_calls or item.get('name') in custom
            out.append({'type': CUSTOM_CALL + '_output' if answers_custom else 'function_call_output',
                        'call_id': item['call_id'], 'output': item['output']})
        elif kind in (mod_items.TEXT, mod_items.REFUSAL):
            out.append(_message('assistant', nonempty(item['text'])))
    return out


def _step(item: dict) -> dict:
    """An output item as a canonical item (its native kept verbatim)."""
    kind = item.get('type')
    if kind == 'reasoning':
        return mod_items.reasoning(item)
    if kind == 'message':
        parts = [p for p in item.get('content') or () if isinstance(p, dict)]
        if parts and all(p.get('type') == 'refusal' for p in parts):
            return mod_items.refusal(''.join(p.get('refusal') or '' for p in parts), native=item)
        return mod_items.text(''.join(p.get('text') or p.get('refusal') or '' for p in parts), native=item)
    if kind == 'function_call':
        return mod_items.call(item.get('call_id') or '', item.get('name') or '',
                              parse_arguments(item.get('arguments')), native=item)
    if kind == CUSTOM_CALL:
        return mod_items.call(item.get('call_id') or '', item.get('name') or '',
                              {'input': item.get('input') if isinstance(item.get('input'), str) else ''}, native=item)
    return mod_items.hosted(item)


def _bare(item: dict) -> dict:
    return {k: v for k, v in item.items() if k != 'native'}


def _tool(tool) -> dict:
    # The API wants strict stated; false is its own default, so an unset one is sent as false.
    definition = {'type': 'function', 'name': tool.name, 'parameters': tool.parameters,
                  'strict': bool(tool.strict)}
    if tool.description:
        definition['description'] = tool.description
    return definition

def _reasoning_texts(item: dict) -> list[str]:
    """A reasoning item's readable text: its summary, or else (vLLM, LM Studio, gpt-oss servers) its
    ``content`` of ``reasoning_text`` parts, the raw reasoning OpenAI itself keeps to itself."""
    summary = [s.get('text') or '' for s in item.get('summary') or () if isinstance(s, dict)]
    if any(summary):
        return summary
    return [p.get('text') or '' for p in item.get('content') or ()
            if isinstance(p, dict) and p.get('type', 'reasoning_text') == 'reasoning_text']


def _message(role: str, text: Any) -> dict[str, Any]:
    return {'role': role, 'content': text}


def _usage(usage: dict) -> dict:
    """Reply's counts from a Responses usage; the details are parts of the two totals."""
    return {'input_tokens': tokens(usage, 'input_tokens'), 'output_tokens': tokens(usage, 'output_tokens'),
            'cache_read_tokens': tokens(usage, 'input_tokens_details', 'cached_tokens'),
            'cache_write_tokens': tokens(usage, 'input_tokens_details', 'cache_write_tokens'),
            'reasoning_tokens': tokens(usage, 'output_tokens_details', 'reasoning_tokens')}
