"""The fake Anthropic Messages API: ``POST /v1/messages`` and ``GET /v1/models``.

Thinking: when the request enables ``thinking`` and the last user text starts
with ``think:``, the reply opens with a ``thinking`` block whose ``signature``
this server computed; ``redact:`` gives a ``redacted_thinking`` block instead.
Replayed thinking blocks are checked as the real API checks them: an altered
or foreign signature (or redacted ``data``) is a 400.

Tools (see :mod:`llmconn.testing.fake_tools`): calls come as ``tool_use``
blocks, preceded by a signed thinking block when thinking is on, and the
rules are Claude's: each ``tool_use`` answered by a ``tool_result`` in the
next message and no other, and with thinking on, an assistant message that
continues after ``tool_use`` starts with its thinking block.
"""

from __future__ import annotations

from typing import Any

from llmconn.testing.fake_common import (
    REDACT_PREFIX, THINK_PREFIX, ApiError, Call, JSONAnswer, StreamAnswer, count_words, new_id,
    reply_text, require_json_object, text_chunks)
from llmconn.testing.fake_cache import CacheRefused, claude_usage
from llmconn.testing.fake_attachments import claude_attached
from llmconn.testing.fake_structured import answer, claude_format
from llmconn.testing.fake_tools import argument_chunks, decide, violation

NAME = 'claude'
MODELS = ('claude-sonnet-5-5', 'claude-haiku-5-5', 'claude-opus-5-5')
_THINKING_TYPES = ('enabled', 'adaptive')

_ERROR_TYPES = {
    400: 'invalid_request_error', 401: 'authentication_error', 403: 'permission_error',
    404: 'not_found_error', 413: 'request_too_large', 429: 'rate_limit_error',
    500: 'api_error', 504: 'timeout_error', 529: 'overloaded_error',
}


def error_body(status: int, message: str = '') -> dict:
    kind = _ERROR_TYPES.get(status, 'api_error' if status >= 500 else 'invalid_request_error')
    return {'type': 'error', 'error': {'type': kind, 'message': message or kind.replace('_', ' ')}}


def error(status: int, message: str) -> ApiError:
    return ApiError(status, error_body(status, message))


def auth_ok(call: Call, api_key: str) -> bool:
    return call.headers.get('x-api-key') == api_key


def models(call: Call) -> JSONAnswer:
    data = [{'type': 'model', 'id': m, 'display_name': m, 'created_at': '2025-01-01T00:00:00Z'}
            for m in MODELS]
    return JSONAnswer(200, {'data': data, 'has_more': False, 'first_id': MODELS[0], 'last_id': MODELS[-1]})


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return '\n'.join(b.get('text', '') for b in content if isinstance(b, dict) and b.get('type') == 'text')
    return ''


def _blocks(message: dict, kind: str) -> list:
    content = message.get('content')
    return [b for b in content if isinstance(b, dict) and b.get('type') == kind] if isinstance(content, list) else []


def _result_text(block: dict) -> str:
    content = block.get('content')
    return content if isinstance(content, str) else _text_of(content)


def _check_tool_pairs(messages: list, call: Call, thinking_on: bool) -> None:
    """Claude's rules for tool_use / tool_result, and thinking before a continued tool_use."""
    for i, message in enumerate(messages):
        uses = [b.get('id') for b in _blocks(message, 'tool_use')] if message['role'] == 'assistant' else []
        following = messages[i + 1] if i + 1 < len(messages) else None
        results = [b.get('tool_use_id') for b in _blocks(following, 'tool_result')] if following else []
        if uses and following is not None and set(uses) - set(results):
            raise violation(call, 'claude: tool_use without tool_result', error(
                400, f'messages.{i + 1}: `tool_use` ids were found without `tool_result` blocks immediately '
                     f'after: {", ".join(sorted(set(uses) - set(results)))}. Each `tool_use` block must have a '
                     f'corresponding `tool_result` block in the next message.'))
        if message['role'] == 'user' and _blocks(message, 'tool_result'):
            previous = [b.get('id') for b in _blocks(messages[i - 1], 'tool_use')] if i else []
            stray = [r for r in (b.get('tool_use_id') for b in _blocks(message, 'tool_result')) if r not in previous]
            if stray:
                raise violation(call, 'claude: tool_result without tool_use', error(
                    400, f'messages.{i}.content.0: unexpected `tool_use_id` found in `tool_result` blocks: '
                         f'{stray[0]}. Each `tool_result` block must have a corresponding `tool_use` block in '
                         f'the previous message.'))
    last = messages[-2] if len(messages) > 1 else None
    if thinking_on and last is not None and _blocks(last, 'tool_use') and _blocks(messages[-1], 'tool_result'):
        first = last['content'][0].get('type') if isinstance(last['content'][0], dict) else None
        if first not in ('thinking', 'redacted_thinking'):
            raise violation(call, 'claude: thinking before tool_use', error(
                400, f'messages.{len(messages) - 2}.content.0.type: Expected `thinking` or `redacted_thinking`, '
                     f'but found `{first}`. When `thinking` is enabled, a final `assistant` message must start '
                     f'with a thinking block (preceeding the lastmost set of `tool_use` and `tool_result` '
                     f'blocks). We recommend you include thinking blocks from previous turns. To avoid this '
                     f'requirement, disable `thinking`.'))


def _validate(body: dict, call: Call) -> list:
    if 'anthropic-version' not in call.headers:
        raise error(400, 'anthropic-version: header is required')
    if not body.get('model'):
        raise error(400, 'model: Field required')
    if 'max_tokens' not in body:
        raise error(400, 'max_tokens: Field required')
    messages = body.get('messages')
    if not isinstance(messages, list) or not messages:
        raise error(400, 'messages: at least one message is required')
    expected = 'user'
    for i, message in enumerate(messages):
        role = message.get('role') if isinstance(message, dict) else None
        if role not in ('user', 'assistant'):
            raise error(400, f'messages.{i}.role: Input should be \'user\' or \'assistant\'')
        if role != expected:
            raise error(400, f'messages: roles must alternate between "user" and "assistant", '
                             f'starting with "user"; message {i} is "{role}"')
        expected = 'assistant' if role == 'user' else 'user'
    return messages


def _check_replayed_thinking(messages: list, call: Call) -> None:
    signer = call.state.signer
    for i, message in enumerate(messages):
        content = message.get('content')
        if message['role'] != 'assistant' or not isinstance(content, list):
            continue
        for j, block in enumerate(content):
            kind = block.get('type') if isinstance(block, dict) else None
            if kind == 'thinking' and not signer.verify(block.get('thinking'), block.get('signature')):
                raise violation(call, 'claude: thinking signature', error(
                    400, f'messages.{i}.content.{j}: Invalid `signature` in `thinking` block'))
            if kind == 'redacted_thinking' and signer.unseal(block.get('data')) is None:
                raise violation(call, 'claude: redacted thinking data', error(
                    400, f'messages.{i}.content.{j}: Invalid `data` in `redacted_thinking` block'))


def _thinking_on(body: dict) -> bool:
    thinking = body.get('thinking')
    return isinstance(thinking, dict) and thinking.get('type') in _THINKING_TYPES


def _thinking_blocks(body: dict, last_user: str, signer) -> list:
    if not _thinking_on(body):
        return []
    if last_user.startswith(THINK_PREFIX):
        text = f'The user asked: {last_user[len(THINK_PREFIX):].strip()}. I will echo it.'
        return [{'type': 'thinking', 'thinking': text, 'signature': signer.sign(text)}]
    if last_user.startswith(REDACT_PREFIX):
        return [{'type': 'redacted_thinking', 'data': signer.seal(f'hidden reasoning: {last_user}')}]
    return []


def messages(call: Call) -> JSONAnswer | StreamAnswer:
    body = require_json_object(call, error)
    history = _validate(body, call)
    _check_replayed_thinking(history, call)
    _check_tool_pairs(history, call, _thinking_on(body))
    usage = _cache_usage(call, body)
    said = [(i, m) for i, m in enumerate(history) if m['role'] == 'user' and not _blocks(m, 'tool_result')]
    users = [_text_of(m.get('content')) for _, m in said]
    attached = [claude_attached(m.get('content'), f'messages.{i}', error) for i, m in said]
    outputs = [_result_text(b) for b in _blocks(history[-1], 'tool_result')]
    declared = [t.get('name') for t in body.get('tools') or () if isinstance(t, dict)]
    system = _text_of(body.get('system'))
    schema = claude_format(body.get('output_config'), error)
    action = decide(users[-1] if users else '', outputs, declared)
    if isinstance(action, list):
        content = _tool_blocks(body, action, call.state.signer)
        text, stop = '', 'tool_use'
    else:
        text = action if isinstance(action, str) else reply_text(users, bool(system), attached)
        stop = 'end_turn'
        if schema is not None:
            text, refusal = answer(schema, users[-1] if users else '')
            text, stop = (refusal, 'refusal') if refusal else (text, stop)
        thinking = _thinking_blocks(body, users[-1] if users else '', call.state.signer) if not outputs else []
        content = thinking + [{'type': 'text', 'text': text}]
    message = {
        'id': new_id('msg_'), 'type': 'message', 'role': 'assistant', 'model': body['model'],
        'content': content, 'stop_reason': stop, 'stop_sequence': None,
        'usage': dict(usage, output_tokens=max(1, count_words(text))),
    }
    if body.get('stream'):
        return _stream(message)
    return JSONAnswer(200, message)


def _cache_usage(call: Call, body: dict) -> dict:
    """The input's usage as Claude's prompt cache bills it (see fake_cache); a bad breakpoint is a 400."""
    try:
        return claude_usage(call.state.cache, body)
    except CacheRefused as e:
        raise error(400, str(e)) from None


def _tool_blocks(body: dict, calls: list, signer) -> list:
    blocks = []
    if _thinking_on(body):
        text = f'I will call {", ".join(name for name, _ in calls)}.'
        blocks.append({'type': 'thinking', 'thinking': text, 'signature': signer.sign(text)})
    blocks += [{'type': 'tool_use', 'id': new_id('toolu_'), 'name': name, 'input': arguments}
               for name, arguments in calls]
    return blocks


def _block_events(index: int, block: dict) -> list:
    kind = block['type']
    if kind == 'redacted_thinking':
        deltas = []
        start = block
    elif kind == 'thinking':
        deltas = [{'type': 'thinking_delta', 'thinking': t} for t in text_chunks(block['thinking'])]
        deltas.append({'type': 'signature_delta', 'signature': block['signature']})
        start = {'type': 'thinking', 'thinking': '', 'signature': ''}
    elif kind == 'tool_use':
        deltas = [{'type': 'input_json_delta', 'partial_json': t} for t in argument_chunks(block['input'])]
        start = dict(block, input={})
    else:
        deltas = [{'type': 'text_delta', 'text': t} for t in text_chunks(block['text'])]
        start = {'type': 'text', 'text': ''}
    events = [('content_block_start', {'type': 'content_block_start', 'index': index, 'content_block': start})]
    events += [('content_block_delta', {'type': 'content_block_delta', 'index': index, 'delta': d})
               for d in deltas]
    events.append(('content_block_stop', {'type': 'content_block_stop', 'index': index}))
    return events


def _stream(message: dict) -> StreamAnswer:
    usage = message['usage']
    # The real stream reports a token or so of output up front; the total comes in message_delta.
    opening = dict(message, content=[], stop_reason=None, usage=dict(usage, output_tokens=1))
    events = [('message_start', {'type': 'message_start', 'message': opening})]
    for index, block in enumerate(message['content']):
        events += _block_events(index, block)
        if index == 0:
            events.insert(2, ('ping', {'type': 'ping'}))
    events.append(('message_delta', {'type': 'message_delta',
                                     'delta': {'stop_reason': message['stop_reason'], 'stop_sequence': None},
                                     'usage': {'output_tokens': usage['output_tokens']}}))
    events.append(('message_stop', {'type': 'message_stop'}))
    first = next(i for i, (name, _) in enumerate(events) if name == 'content_block_delta')
    failure = [('error', error_body(529, 'Overloaded'))]
    return StreamAnswer(events, first, failure)
