"""Anthropic Messages API (``POST /v1/messages``).

Extended thinking is configured with Anthropic's own shape (``thinking:`` in
the connection) and sent as is. The reply's ``thinking`` and
``redacted_thinking`` blocks are kept verbatim, signatures included, as the
turn's opaque items; they go back in front of the assistant's text only to
the same model in the same thinking mode, because a signature is only valid
where it was made.

Streaming rebuilds the whole Message from its events (as the SDK does) and
parses that, so a streamed reply is exactly what the same answer unstreamed
would give. The rebuild does not insist on every event the real API sends
(a delta for a block that was never started starts it), but a stream is
complete only at ``message_stop``.

Tools: function calls are ``tool_use`` blocks, answered by ``tool_result``
blocks in the next user message; server-tool blocks are hosted items. An
assistant message that continues after ``tool_use`` carries the thinking
blocks that preceded it, verbatim, as Claude requires when thinking is on.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Iterator

from llmconn import attachments as mod_attachments
from llmconn import items as mod_items
from llmconn.errors import InvalidInput
from llmconn.providers.base import REASONING_REPLAY, SSE, STREAM, STRUCTURED, SYSTEM, THINKING, TOOLS, Provider
from llmconn.providers.base import attached, is_done_marker, json_event, nonempty, plain_reply
from llmconn.providers.base import tokens
from llmconn.providers.caching import place_breakpoints, system_blocks
from llmconn.types import Event, Reply, Request

ANTHROPIC_VERSION = '2023-06-01'

# Blocks that carry the model's reasoning; both must be replayed untouched.
_thinking_types = ('thinking', 'redacted_thinking')

# Several thinking blocks read as paragraphs, streamed and unstreamed alike.
THINKING_SEPARATOR = '\n\n'

# Body keys this mapping owns: a param setting them would break the chat or mislabel its items
# (thinking belongs in the connection, so the tag on stored thinking blocks stays true).

# Thinking types that sign their blocks: a continuation after tool_use must send them back.
_SIGNED_THINKING = ('enabled', 'adaptive')

# Sampling params Anthropic refuses while thinking is on ("temperature may only be set to 1 when
# thinking is enabled"; top_k not at all): refused here, before a call is paid for.
_not_with_thinking = ('temperature', 'top_k')


class ClaudeProvider(Provider):
    """Claude Messages, with extended thinking replayed to the model that produced it."""

    name = 'claude'
    default_address = 'https://api.anthropic.com'
    capabilities = frozenset({STREAM, SYSTEM, THINKING, REASONING_REPLAY, TOOLS, STRUCTURED})
    reserved_params = frozenset({'model', 'messages', 'system', 'stream', 'thinking', 'tools'})
    accepts = {mod_attachments.DATA: mod_attachments.MEDIA_TYPES,
               mod_attachments.URL: mod_attachments.IMAGES | {mod_attachments.PDF}}

    @classmethod
    def check_config(cls, conf) -> None:
        super().check_config(conf)
        _check_sampling(conf, conf.params, ValueError)

    cut_short = {'max_tokens': 'max_output_tokens', 'refusal': 'content_filter'}

    @property
    def mode(self) -> str:
        return self.conf.thinking.type if self.conf.thinking else 'plain'

    def stop_reason(self, raw: dict) -> Any:
        return raw.get('stop_reason')

    def lacks_replay(self, steps: list[dict]) -> str:
        """With thinking on, the assistant message that continues after ``tool_use`` must start with
        its signed thinking block; calls sent back bare (no natives) have none to send."""
        if self.mode not in _SIGNED_THINKING or not steps:
            return ''
        said = mod_items.rounds(steps)[-1][0]
        if mod_items.calls(said) and not any('native' in s for s in said):
            return 'Claude with extended thinking must get its signed thinking back before the function calls'
        return ''

    def url(self, stream: bool = False) -> str:
        return f'{self.conf.address}/v1/messages'

    def ping_url(self) -> str:
        return f'{self.conf.address}/v1/models'

    def headers(self) -> dict[str, str]:
        headers = {'content-type': 'application/json', 'anthropic-version': ANTHROPIC_VERSION}
        if self.conf.secret_value:
            headers['x-api-key'] = self.conf.secret_value
        return headers

    def body_params(self, request: Request) -> dict[str, Any]:
        params = super().body_params(request)
        _check_sampling(self.conf, params, InvalidInput)
        return params

    # ---- request

    def build_request(self, request: Request) -> dict[str, Any]:
        messages: list[dict[str, Any]] = []
        for turn in request.history:
            messages += _turn_messages(user_content(turn.user, attached(turn)), self.steps(turn))
        history_messages = len(messages)
        messages += _turn_messages(user_content(request.text, request.attachments), self.current(request))

        body: dict[str, Any] = {'model': self.conf.model, 'max_tokens': self.conf.max_tokens}
        if request.system:
            body['system'] = system_blocks(request.system, request.summary)
        body['messages'] = messages
        if self.conf.thinking is not None:
            body['thinking'] = self.conf.thinking.wire()
        tools = [_tool(t) for t in request.tools] + list(request.hosted)
        if tools:
            body['tools'] = tools
        if request.schema is not None:
            body['output_config'] = {'format': {'type': 'json_schema', 'schema': request.schema.schema}}
        if request.stream:
            body['stream'] = True
        body.update(self.body_params(request))
        if self.conf.cache == 'auto':
            place_breakpoints(body, history_messages, self.conf.cache_ttl, summary=bool(request.summary))
        return body

    # ---- response

    def parse_response(self, body: Any) -> Reply:
        if not isinstance(body, dict) or body.get('type') == 'error' or 'content' not in body:
            raise self.error('Claude answered with something that is not a message; see provider_body', body)
        blocks = [b for b in body['content'] or () if isinstance(b, dict)]
        text = ''.join(b.get('text') or '' for b in blocks if b.get('type') == 'text')
        items = tuple(b for b in blocks if b.get('type') in _thinking_types)
        steps = tuple(_step(b) for b in blocks)
        if body.get('stop_reason') == 'refusal':    # what it said instead of answering is a refusal
            steps = tuple(mod_items.refusal(s['text']) if s['kind'] == mod_items.TEXT else s for s in steps)
            steps = steps or (mod_items.refusal(''),)
        thinking = THINKING_SEPARATOR.join(b.get('thinking') or '' for b in items if b.get('type') == 'thinking')
        return Reply(text=text, **_usage(body.get('usage') or {}), raw=body,
                     thinking=thinking, items=items, response_id=body.get('id', ''),
                     model=body.get('model', ''), steps=steps)

    def parse_stream(self, events: Iterable[SSE]) -> Iterator[Event]:
        state = _StreamState()
        for sse in events:
            if is_done_marker(sse):
                continue
            data = json_event(self, sse)
            kind = data.get('type') or sse.event
            if kind == 'error':
                said = _error_message(data)
                raise self.error(f'Claude reported an error mid-stream: {said}; the reply was not saved, try again',
                                 data, quoted=said)
            if kind == 'message_stop':
                state.stopped = True
                break
            yield from state.apply(kind, data)
        if not state.complete:
            raise self.error('the Claude stream ended before message_stop, so the reply is incomplete; '
                             'try again', state.message)
        yield self.done(self.parse_response(state.finish()))


class _StreamState:
    """The Message being rebuilt from stream events, as the SDK's accumulator does."""

    def __init__(self) -> None:
        self.message: dict | None = None
        self.blocks: dict[int, dict] = {}
        self.thinking_started = False
        self.stopped = False        # message_stop came

    @property
    def complete(self) -> bool:
        # message_delta's stop_reason already says the model finished; a server that then closes
        # without message_stop lost nothing (the official SDK accepts such a stream too).
        finished = self.stopped or bool(self.message and self.message.get('stop_reason'))
        return finished and (self.message is not None or bool(self.blocks))

    def apply(self, kind: str, data: dict) -> Iterator[Event]:
        if kind == 'message_start':
            self.message = dict(data.get('message') or {})
            self.message['usage'] = dict(self.message.get('usage') or {})
        elif kind == 'content_block_start':
            block = dict(data.get('content_block') or {'type': 'text', 'text': ''})
            self.blocks[data.get('index', len(self.blocks))] = block
            if block.get('type') == 'thinking' and self.thinking_started:
                yield Event('thinking', text=THINKING_SEPARATOR)
            if block.get('type') == 'thinking' and block.get('thinking'):
                self.thinking_started = True
                yield Event('thinking', text=block['thinking'])
            elif block.get('type') == 'text' and block.get('text'):
                yield Event('text', text=block['text'])
        elif kind == 'content_block_delta':
            delta = data.get('delta') or {}
            block = self.blocks.setdefault(data.get('index', 0), _block_for(delta))
            yield from self._delta(block, delta)
        elif kind == 'message_delta':
            message = self._started()
            message.update(data.get('delta') or {})
            # Usage in message_delta is cumulative: it replaces, never adds to, message_start's.
            message['usage'].update({k: v for k, v in (data.get('usage') or {}).items() if v is not None})
        # ping and content_block_stop carry nothing to keep.

    def _delta(self, block: dict, delta: dict) -> Iterator[Event]:
        kind = delta.get('type')
        if kind == 'text_delta':
            text = delta.get('text') or ''
            block['text'] = block.get('text', '') + text
            if text:
                yield Event('text', text=text)
        elif kind == 'thinking_delta':
            text = delta.get('thinking') or ''
            block['thinking'] = block.get('thinking', '') + text
            if text:
                self.thinking_started = True
                yield Event('thinking', text=text)
        elif kind == 'signature_delta':
            block['signature'] = block.get('signature', '') + (delta.get('signature') or '')
        elif kind == 'citations_delta':
            block['citations'] = [*(block.get('citations') or []), delta['citation']]
        elif kind == 'input_json_delta':
            block['_partial_json'] = block.get('_partial_json', '') + delta.get('partial_json', '')

    def _started(self) -> dict:
        if self.message is None:
            self.message = {'type': 'message', 'role': 'assistant', 'usage': {}}
        return self.message

    def finish(self) -> dict:
        message = dict(self._started())
        message['content'] = [_closed(self.blocks[i]) for i in sorted(self.blocks)]
        return message


def user_content(text: str, attached: tuple) -> Any:
    """A user message's content: its text, after ``image`` / ``document`` blocks for its attachments."""
    if not attached:
        return text
    return [_attachment_block(a) for a in attached] + [{'type': 'text', 'text': text}]


def _attachment_block(attachment) -> dict:
    kind = attachment.media_type
    if kind in mod_attachments.IMAGES:
        return {'type': 'image', 'source': _source(attachment)}
    if kind == mod_attachments.TEXT:
        source = {'type': 'text', 'media_type': kind, 'data': attachment.text}
    else:
        source = _source(attachment)
    block = {'type': 'document', 'source': source}
    if attachment.name:
        block['title'] = attachment.name
    return block


def _source(attachment) -> dict:
    if attachment.url:
        return {'type': 'url', 'url': attachment.url}
    return {'type': 'base64', 'media_type': attachment.media_type, 'data': attachment.base64}


def _turn_messages(user: Any, steps: list[dict]) -> list[dict]:
    """One turn as alternating messages: the user's, then each round's assistant blocks and results."""
    messages: list[dict[str, Any]] = [{'role': 'user', 'content': user}]
    reply = plain_reply(steps)
    if reply is not None:
        return messages + [{'role': 'assistant', 'content': reply}]
    for said, answers in mod_items.rounds(steps):
        if said:
            messages.append({'role': 'assistant', 'content': _assistant_content(said)})
        if answers:
            messages.append({'role': 'user', 'content': [_tool_result(a) for a in answers]})
    return messages


def _assistant_content(said: list[dict]) -> Any:
    if len(said) == 1 and said[0]['kind'] in (mod_items.TEXT, mod_items.REFUSAL) and 'native' not in said[0]:
        return nonempty(said[0]['text'])
    blocks = []
    for item in said:
        kind = item['kind']
        if 'native' in item:
            blocks.append(item['native'])
        elif kind == mod_items.CALL:
            blocks.append({'type': 'tool_use', 'id': item['call_id'], 'name': item['name'],
                           'input': item['arguments'] if isinstance(item['arguments'], dict) else {}})
        elif kind in (mod_items.TEXT, mod_items.REFUSAL) and item['text'].strip():
            blocks.append({'type': 'text', 'text': item['text']})
    # Claude refuses an assistant message that ends in thinking, or has no content.
    if not blocks or blocks[-1].get('type') in _thinking_types:
        blocks.append({'type': 'text', 'text': nonempty('')})
    return blocks


def _tool_result(item: dict) -> dict:
    block = {'type': 'tool_result', 'tool_use_id': item['call_id'], 'content': item['output']}
    if item['is_error']:
        block['is_error'] = True
    return block


def _tool(tool) -> dict:
    definition = {'name': tool.name, 'input_schema': tool.parameters}
    if tool.description:
        definition['description'] = tool.description
    if tool.strict is not None:
        definition['strict'] = tool.strict
    return definition


def _step(block: dict) -> dict:
    """A content block as a canonical item."""
    kind = block.get('type')
    if kind in _thinking_types:
        return mod_items.reasoning(block)
    if kind == 'text':
        return mod_items.text(block.get('text') or '', native=block if block.get('citations') else None)
    if kind == 'tool_use':
        return mod_items.call(block.get('id') or '', block.get('name') or '', block.get('input') or {},
                              native=block)
    return mod_items.hosted(block)      # server tools (web search, code execution) and their results


def _block_for(delta: dict) -> dict:
    """The block a delta belongs to, for servers that send deltas without content_block_start."""
    if delta.get('type') in ('thinking_delta', 'signature_delta'):
        return {'type': 'thinking', 'thinking': '', 'signature': ''}
    if delta.get('type') == 'input_json_delta':
        return {'type': 'tool_use', 'input': {}}
    return {'type': 'text', 'text': ''}


def _closed(block: dict) -> dict:
    if '_partial_json' in block:
        block = dict(block)
        partial = block.pop('_partial_json')
        try:
            block['input'] = json.loads(partial) if partial else {}
        except ValueError:
            block['input'] = {'_partial_json': partial}     # tool input is not ours to judge; keep it
    return block


def _check_sampling(conf, params: dict, error: type[Exception]) -> None:
    if conf.thinking is None or conf.thinking.type == 'disabled':
        return
    refused = [k for k in _not_with_thinking if k in params and not (k == 'temperature' and params[k] == 1)]
    if refused:
        raise error(f'params {", ".join(refused)} cannot be used while thinking is on (Claude refuses them); '
                    f'remove them or set thinking to disabled')


def _usage(usage: dict) -> dict:
    """Reply's counts from Claude's usage; Claude reports no thinking tokens apart from output."""
    # Claude's input_tokens is only the part after the last cache breakpoint: the cached prompt is
    # still input the model read, so the whole input is the sum, as Anthropic's docs total it.
    read, written = tokens(usage, 'cache_read_input_tokens'), tokens(usage, 'cache_creation_input_tokens')
    return {'input_tokens': tokens(usage, 'input_tokens') + read + written, 'output_tokens': tokens(usage, 'output_tokens'),
            'cache_read_tokens': read, 'cache_write_tokens': written}


def _error_message(data: dict) -> str:
    error = data.get('error') or {}
    return f'{error.get("type", "error")}: {error.get("message", "no message")}'
