"""The fake OpenAI Chat Completions API: ``POST /v1/chat/completions`` and ``GET /v1/models``.

Also the home of the OpenAI error shape and auth check, which the fake
Responses API shares.

Tools (see :mod:`llmconn.testing.fake_tools`): calls come as the assistant
message's ``tool_calls`` (streamed as argument deltas per call ``index``),
and every ``role: tool`` message must answer a call id of the assistant
message before it, each of which must be answered.
"""

from __future__ import annotations

import json
from typing import Any

from llmconn.testing.fake_cache import openai_cached
from llmconn.testing.fake_common import (
    ApiError, Call, JSONAnswer, StreamAnswer, count_words, new_id, now, reply_text,
    require_json_object, text_chunks)
from llmconn.testing.fake_attachments import chat_attached
from llmconn.testing.fake_structured import answer, openai_format
from llmconn.testing.fake_tools import argument_chunks, decide, violation

NAME = 'openai'
MODELS = ('gpt-4o-mini', 'gpt-4.1', 'gpt-5', 'o4-mini')
ROLES = ('system', 'developer', 'user', 'assistant', 'tool', 'function')
SYSTEM_ROLES = ('system', 'developer')

_ERROR_KINDS = {
    400: ('invalid_request_error', None), 401: ('invalid_request_error', 'invalid_api_key'),
    403: ('invalid_request_error', 'unsupported_country_region_territory'),
    404: ('invalid_request_error', 'not_found'), 429: ('requests', 'rate_limit_exceeded'),
}


def error_body(status: int, message: str = '', param: str | None = None, code: str | None = None) -> dict:
    kind, default_code = _ERROR_KINDS.get(status, ('server_error', None))
    if not message:
        message = ('The server had an error while processing your request. Sorry about that!'
                   if status >= 500 else kind.replace('_', ' '))
    return {'error': {'message': message, 'type': kind, 'param': param, 'code': code or default_code}}


def error(status: int, message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(status, error_body(status, message, param, code))


def missing(param: str) -> ApiError:
    return error(400, f"Missing required parameter: '{param}'.", param, 'missing_required_parameter')


def empty_array(param: str) -> ApiError:
    return error(400, f"Invalid '{param}': empty array. Expected an array with minimum length 1, "
                      f'but got an empty array instead.', param, 'empty_array')


def auth_ok(call: Call, api_key: str) -> bool:
    return call.headers.get('authorization') == f'Bearer {api_key}'


def models(call: Call) -> JSONAnswer:
    data = [{'id': m, 'object': 'model', 'created': 1700000000, 'owned_by': 'system'} for m in MODELS]
    return JSONAnswer(200, {'object': 'list', 'data': data})


def content_text(content: Any) -> str:
    """The text of a message's ``content``: a string or a list of text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return '\n'.join(p.get('text', '') for p in content
                         if isinstance(p, dict) and isinstance(p.get('text'), str))
    return ''


def _check_tool_answers(messages: list, call: Call) -> None:
    """Tool messages answer exactly the call ids of the assistant message before them."""
    open_ids: list = []
    for i, message in enumerate(messages + [{'role': 'end'}]):
        role = message.get('role')
        if role == 'tool':
            if message.get('tool_call_id') not in open_ids:
                raise violation(call, 'openai: tool message without its call', error(
                    400, "Invalid parameter: messages with role 'tool' must be a response to a preceeding "
                         "message with 'tool_calls'.", f'messages.[{i}].role'))
            open_ids.remove(message['tool_call_id'])
            continue
        if open_ids:
            raise violation(call, 'openai: call without tool message', error(
                400, f"An assistant message with 'tool_calls' must be followed by tool messages responding to "
                     f"each 'tool_call_id'. The following tool_call_ids did not have response messages: "
                     f"{', '.join(open_ids)}", f'messages.[{i}].role'))
        open_ids = [c.get('id') for c in message.get('tool_calls') or () if isinstance(c, dict)] \
            if role == 'assistant' else []


def _validate(body: dict) -> list:
    if not body.get('model'):
        raise error(400, 'you must provide a model parameter')
    if 'messages' not in body:
        raise missing('messages')
    messages = body['messages']
    if not isinstance(messages, list) or not messages:
        raise empty_array('messages')
    tool_calls_open = False
    for i, message in enumerate(messages):
        role = message.get('role') if isinstance(message, dict) else None
        if role not in ROLES:
            raise error(400, f"Invalid value: '{role}'. Supported values are: 'system', 'assistant', "
                             f"'user', 'function', 'tool', and 'developer'.", f'messages[{i}].role',
                        'invalid_value')
        if role == 'tool' and not tool_calls_open:
            raise error(400, "Invalid parameter: messages with role 'tool' must be a response to a "
                             "preceeding message with 'tool_calls'.", f'messages.[{i}].role')
        tool_calls_open = role == 'tool' or (role == 'assistant' and bool(message.get('tool_calls')))
    if 'stream_options' in body and not body.get('stream'):
        raise error(400, "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                    'stream_options')
    return messages


def chat_completions(call: Call) -> JSONAnswer | StreamAnswer:
    body = require_json_object(call, error)
    messages = _validate(body)
    _check_tool_answers(messages, call)
    texts = [content_text(m.get('content')) for m in messages]
    users = [t for m, t in zip(messages, texts) if m['role'] == 'user']
    attached = [chat_attached(m.get('content'), f'messages[{i}]', error) for i, m in enumerate(messages)
                if m['role'] == 'user']
    system = any(t for m, t in zip(messages, texts) if m['role'] in SYSTEM_ROLES)
    outputs = []
    for message, text in zip(reversed(messages), reversed(texts)):
        if message['role'] != 'tool':
            break
        outputs.insert(0, text)
    declared = [(t.get('function') or {}).get('name') for t in body.get('tools') or () if isinstance(t, dict)]
    schema = openai_format(body.get('response_format'), 'response_format', error)
    action = decide(users[-1] if users else '', outputs, declared)
    calls = action if isinstance(action, list) else []
    text = action if isinstance(action, str) else '' if calls else reply_text(users, system, attached)
    refusal = ''
    if schema is not None and not calls:
        text, refusal = answer(schema, users[-1] if users else '')
    tool_calls = [{'id': new_id('call_'), 'type': 'function',
                   'function': {'name': name, 'arguments': json.dumps(args, separators=(',', ':'))}}
                  for name, args in calls]
    billed = openai_cached(call.state.cache, body, texts)
    prompt, completion = billed.total, max(1, count_words(text or refusal))
    usage = {'prompt_tokens': prompt, 'completion_tokens': completion, 'total_tokens': prompt + completion,
             'prompt_tokens_details': {'cached_tokens': billed.read, 'audio_tokens': 0},
             'completion_tokens_details': {'reasoning_tokens': 0, 'audio_tokens': 0,
                                           'accepted_prediction_tokens': 0,
                                           'rejected_prediction_tokens': 0}}
    head = {'id': new_id('chatcmpl-'), 'created': now(), 'model': body['model'],
            'system_fingerprint': 'fp_fake', 'service_tier': 'default'}
    if body.get('stream'):
        include_usage = bool((body.get('stream_options') or {}).get('include_usage'))
        return _stream(head, text, usage if include_usage else None, tool_calls, refusal)
    message = {'role': 'assistant', 'content': text or None, 'refusal': refusal or None, 'annotations': []}
    if tool_calls:
        message['tool_calls'] = tool_calls
    choice = {'index': 0, 'message': message, 'logprobs': None,
              'finish_reason': 'tool_calls' if tool_calls else 'stop'}
    return JSONAnswer(200, dict(head, object='chat.completion', choices=[choice], usage=usage))


def _call_deltas(tool_calls: list) -> list[dict]:
    deltas = []
    for index, tool_call in enumerate(tool_calls):
        function = tool_call['function']
        deltas.append({'tool_calls': [{'index': index, 'id': tool_call['id'], 'type': 'function',
                                       'function': {'name': function['name'], 'arguments': ''}}]})
        deltas += [{'tool_calls': [{'index': index, 'function': {'arguments': piece}}]}
                   for piece in argument_chunks(json.loads(function['arguments']))]
    return deltas


def _stream(head: dict, text: str, usage: dict | None, tool_calls: list, refusal: str = '') -> StreamAnswer:
    def chunk(delta: dict | None, finish: str | None = None) -> tuple:
        data = dict(head, object='chat.completion.chunk')
        data['choices'] = [] if delta is None else [
            {'index': 0, 'delta': delta, 'logprobs': None, 'finish_reason': finish}]
        if usage is not None:
            # With include_usage every chunk carries "usage": null, and one last chunk the totals.
            data['usage'] = usage if delta is None else None
        return '', data

    events = [chunk({'role': 'assistant', 'content': '', 'refusal': None})]
    if text:
        events += [chunk({'content': piece}) for piece in text_chunks(text)]
    if refusal:
        events += [chunk({'refusal': piece}) for piece in text_chunks(refusal)]
    events += [chunk(delta) for delta in _call_deltas(tool_calls)]
    events.append(chunk({}, 'tool_calls' if tool_calls else 'stop'))
    if usage is not None:
        events.append(chunk(None))
    events.append(('', '[DONE]'))
    failure = [('', error_body(500))]
    return StreamAnswer(events, 1, failure)
