"""The fake OpenAI Responses API: ``POST /v1/responses``, ``GET``/``DELETE /v1/responses/{id}``.

Stateful like the real one: unless ``store`` is false, each response is kept
and ``previous_response_id`` continues its conversation (the echo counts the
user messages of the whole chain). A request with ``reasoning`` gets a
reasoning item with a summary first; ``include: ["reasoning.encrypted_content"]``
adds a sealed ``encrypted_content`` that is verified when replayed. A
replayed reasoning item without it must name an item this server stored.

Tools (see :mod:`llmconn.testing.fake_tools`): calls come as
``function_call`` items (after a reasoning item when ``reasoning`` is set),
answered by ``function_call_output`` items whose ``call_id`` must name a call
in the input or the chain; a function call this server issued after a
reasoning item must come back preceded by that reasoning item. A declared
``custom`` tool is called the same way with a ``custom_tool_call`` item,
whose ``input`` is the ``input`` argument the message asked for, answered
by a ``custom_tool_call_output`` item.
"""

from __future__ import annotations

import json

from llmconn.testing.fake_cache import openai_cached
from llmconn.testing.fake_common import (
    Call, JSONAnswer, StreamAnswer, count_words, new_id, now, numbered, reply_text,
    require_json_object, text_chunks)
from llmconn.testing.fake_openai import SYSTEM_ROLES, content_text, empty_array, error, missing
from llmconn.testing.fake_attachments import responses_attached
from llmconn.testing.fake_structured import answer, openai_format
from llmconn.testing.fake_tools import argument_chunks, decide, violation

ROLES = ('user', 'assistant', 'system', 'developer')
ENCRYPTED_REASONING = 'reasoning.encrypted_content'
_CALLS = ('function_call', 'custom_tool_call')
_OUTPUTS = ('function_call_output', 'custom_tool_call_output')


def _previous(call: Call, body: dict) -> dict | None:
    previous_id = body.get('previous_response_id')
    if not previous_id:
        return None
    record = call.state.responses.get(previous_id)
    if record is None:
        raise error(400, f"Previous response with id '{previous_id}' not found.", 'previous_response_id',
                    'previous_response_not_found')
    return record


def _check_reasoning_item(call: Call, item: dict) -> None:
    if 'encrypted_content' in item and item['encrypted_content'] is not None:
        if call.state.signer.unseal(item['encrypted_content']) is None:
            raise violation(call, 'responses: encrypted reasoning', error(
                400, f"The encrypted content for item {item.get('id')} could not be verified.",
                None, 'invalid_encrypted_content'))
    elif item.get('id') not in call.state.items:
        raise error(404, f"Item with id '{item.get('id')}' not found. Items are not persisted when "
                         f'`store` is set to false. Try again with `store` set to true, or remove this '
                         f'item from your input.', 'input')


def _check_function_call(call: Call, raw: list, i: int, item: dict) -> None:
    """A function call issued after a reasoning item comes back right after that reasoning item."""
    reasoning_id = call.state.call_reasoning.get(item.get('id'))
    if reasoning_id is None:
        return
    before = [x.get('id') for x in raw[:i] if isinstance(x, dict) and x.get('type') == 'reasoning']
    if reasoning_id not in before:
        raise violation(call, 'responses: reasoning before function_call', error(
            400, f"Item '{item.get('id')}' of type 'function_call' was provided without its required "
                 f"'reasoning' item: '{reasoning_id}'.", 'input'))


def _input_messages(call: Call, body: dict, known_calls: set, attached: list) -> tuple[list, list, set]:
    """``(role, text)`` of every input message, the trailing function outputs and the call ids; the
    media types of each user message's attachments are appended to ``attached``.

    Replayed reasoning items and function calls are verified; every output must answer a known call.
    """
    raw = body['input']
    if isinstance(raw, str):
        attached.append([])
        return [('user', raw)], [], set()
    if not isinstance(raw, list):
        raise error(400, "Invalid type for 'input': expected a string or an array.", 'input', 'invalid_type')
    messages, outputs, call_ids = [], [], set()
    for i, item in enumerate(raw):
        kind = item.get('type', 'message') if isinstance(item, dict) else None
        if kind != 'function_call_output':
            outputs = []
        if kind == 'reasoning':
            _check_reasoning_item(call, item)
        elif kind in _CALLS:
            _check_function_call(call, raw, i, item)
            call_ids.add(item.get('call_id'))
        elif kind in _OUTPUTS:
            if item.get('call_id') not in call_ids | known_calls:
                raise violation(call, 'responses: output without its call', error(
                    400, f"No tool call found for function call output with call_id {item.get('call_id')}.",
                    'input'))
            outputs.append(item.get('output') if isinstance(item.get('output'), str) else '')
        elif kind == 'message':
            role = item.get('role')
            if role not in ROLES:
                raise error(400, f"Invalid value: '{role}'. Supported values are: 'user', 'assistant', "
                                 f"'system', and 'developer'.", f'input[{i}].role', 'invalid_value')
            messages.append((role, content_text(item.get('content'))))
            if role == 'user':
                attached.append(responses_attached(item.get('content'), f'input[{i}]', error))
        elif kind is None:
            raise error(400, f"Invalid type for 'input[{i}]': expected an object.", f'input[{i}]',
                        'invalid_type')
    return messages, outputs, call_ids


def _calls_output(body: dict, calls: list, signer, state) -> list:
    output = []
    reasoning_id = None
    if body.get('reasoning') is not None:
        summary = f'Calling {", ".join(name for name, _ in calls)}'
        item = {'id': new_id('rs_'), 'type': 'reasoning', 'summary': [{'type': 'summary_text', 'text': summary}]}
        if ENCRYPTED_REASONING in (body.get('include') or ()):
            item['encrypted_content'] = signer.seal(summary)
        output.append(item)
        reasoning_id = item['id']
    custom = _declared(body, 'custom')
    for name, arguments in calls:
        if name in custom:
            text = arguments.get('input')
            item = {'id': new_id('ctc_'), 'type': 'custom_tool_call', 'status': 'completed',
                    'call_id': new_id('call_'), 'name': name,
                    'input': text if isinstance(text, str) else json.dumps(arguments, separators=(',', ':'))}
        else:
            item = {'id': new_id('fc_'), 'type': 'function_call', 'status': 'completed',
                    'call_id': new_id('call_'), 'name': name, 'arguments': json.dumps(arguments, separators=(',', ':'))}
        if reasoning_id:
            with state.lock:
                state.call_reasoning[item['id']] = reasoning_id
        output.append(item)
    return output


def _declared(body: dict, *kinds: str) -> list:
    return [t.get('name') for t in body.get('tools') or () if isinstance(t, dict) and t.get('type') in kinds]


def _output(body: dict, text: str, last_user: str, signer, refusal: str = '') -> list:
    output = []
    if body.get('reasoning') is not None:
        summary = f'Reasoning about: {last_user}'
        item = {'id': new_id('rs_'), 'type': 'reasoning',
                'summary': [{'type': 'summary_text', 'text': summary}]}
        if ENCRYPTED_REASONING in (body.get('include') or ()):
            item['encrypted_content'] = signer.seal(summary)
        output.append(item)
    part = ({'type': 'refusal', 'refusal': refusal} if refusal else
            {'type': 'output_text', 'text': text, 'annotations': [], 'logprobs': []})
    output.append({'id': new_id('msg_'), 'type': 'message', 'role': 'assistant', 'status': 'completed',
                   'content': [part]})
    return output


def _usage(input_tokens: int, output_tokens: int, reasoning_tokens: int, cached_tokens: int = 0) -> dict:
    return {'input_tokens': input_tokens,
            'input_tokens_details': {'cached_tokens': cached_tokens, 'cache_write_tokens': 0},
            'output_tokens': output_tokens, 'output_tokens_details': {'reasoning_tokens': reasoning_tokens},
            'total_tokens': input_tokens + output_tokens}


def _validate(body: dict) -> None:
    if not body.get('model'):
        raise missing('model')
    if 'input' not in body:
        raise missing('input')
    if body['input'] == [] or body['input'] == '':
        raise empty_array('input')


def responses(call: Call) -> JSONAnswer | StreamAnswer:
    body = require_json_object(call, error)
    _validate(body)
    previous = _previous(call, body)
    known = set(previous.get('call_ids', ())) if previous else set()
    attached = list(previous.get('attached', ())) if previous else []
    current, outputs, call_ids = _input_messages(call, body, known, attached)
    context = (previous['context'] if previous else []) + current
    users = [text for role, text in context if role == 'user']
    instructions = body.get('instructions') or ''
    declared = _declared(body, 'function', 'custom')
    schema = openai_format((body.get('text') or {}).get('format'), 'text.format', error)
    action = decide(users[-1] if users else '', outputs, declared)
    refusal = ''
    if isinstance(action, list):
        text = ''
        output = _calls_output(body, action, call.state.signer, call.state)
    else:
        text = action if isinstance(action, str) else reply_text(
            users, bool(instructions) or any(t for r, t in current if r in SYSTEM_ROLES), attached)
        if schema is not None:
            text, refusal = answer(schema, users[-1] if users else '')
        output = _output(body, text, users[-1] if users else '', call.state.signer, refusal)
    reasoning_tokens = sum(count_words(s['text']) for o in output for s in o.get('summary', ()))
    billed = openai_cached(call.state.cache, body, [instructions, *(t for _, t in context), *outputs])
    usage = _usage(billed.total, max(1, count_words(text or refusal)), reasoning_tokens, billed.read)
    response = {
        'id': new_id('resp_'), 'object': 'response', 'created_at': now(), 'completed_at': now(),
        'status': 'completed', 'error': None, 'incomplete_details': None, 'instructions': body.get('instructions'),
        'max_output_tokens': body.get('max_output_tokens'), 'model': body['model'], 'output': output,
        'parallel_tool_calls': True, 'previous_response_id': body.get('previous_response_id'),
        'reasoning': body.get('reasoning') or {'effort': None, 'summary': None},
        'store': body.get('store') is not False, 'temperature': 1.0,
        'text': body.get('text') or {'format': {'type': 'text'}},
        'tool_choice': 'auto', 'tools': body.get('tools') or [], 'top_p': 1.0, 'truncation': 'disabled',
        'usage': usage, 'metadata': body.get('metadata') or {},
    }
    if response['store']:
        issued = {o['call_id'] for o in output if o['type'] in _CALLS}
        said = [('assistant', text)] if text else []
        call.state.store_response(response['id'], {'response': response, 'context': context + said,
                                                   'attached': attached,
                                                   'call_ids': sorted(known | call_ids | issued)},
                                  [item['id'] for item in output])
    if body.get('stream'):
        return _stream(response)
    return JSONAnswer(200, response)


def stored(call: Call) -> JSONAnswer:
    """``GET`` a stored response, or ``DELETE`` it."""
    response_id = call.params['response_id']
    record = call.state.responses.get(response_id)
    if record is None:
        raise error(404, f"No response found with id '{response_id}'.")
    if call.method == 'DELETE':
        del call.state.responses[response_id]
        call.state.items.difference_update(record.get('item_ids', ()))
        return JSONAnswer(200, {'id': response_id, 'object': 'response.deleted', 'deleted': True})
    return JSONAnswer(200, record['response'])


def _event(name: str, **fields) -> tuple[str, dict]:
    return name, dict(type=name, **fields)


def _reasoning_events(index: int, item: dict) -> list:
    where = {'item_id': item['id'], 'output_index': index, 'summary_index': 0}
    summary = item['summary'][0]['text']
    events = [_event('response.output_item.added', output_index=index,
                     item={'id': item['id'], 'type': 'reasoning', 'summary': []}),
              _event('response.reasoning_summary_part.added', part={'type': 'summary_text', 'text': ''}, **where)]
    events += [_event('response.reasoning_summary_text.delta', delta=d, **where) for d in text_chunks(summary)]
    events += [_event('response.reasoning_summary_text.done', text=summary, **where),
               _event('response.reasoning_summary_part.done', part=item['summary'][0], **where),
               _event('response.output_item.done', output_index=index, item=item)]
    return events


def _message_events(index: int, item: dict) -> list:
    where = {'item_id': item['id'], 'output_index': index, 'content_index': 0}
    part = item['content'][0]
    events = [_event('response.output_item.added', output_index=index,
                     item=dict(item, status='in_progress', content=[]))]
    if part['type'] == 'refusal':
        events.append(_event('response.content_part.added', part=dict(part, refusal=''), **where))
        events += [_event('response.refusal.delta', delta=d, **where) for d in text_chunks(part['refusal'])]
        events.append(_event('response.refusal.done', refusal=part['refusal'], **where))
    else:
        events.append(_event('response.content_part.added', part=dict(part, text=''), **where))
        events += [_event('response.output_text.delta', delta=d, logprobs=[], **where)
                   for d in text_chunks(part['text'])]
        events.append(_event('response.output_text.done', text=part['text'], logprobs=[], **where))
    events += [_event('response.content_part.done', part=part, **where),
               _event('response.output_item.done', output_index=index, item=item)]
    return events


def _call_events(index: int, item: dict) -> list:
    where = {'item_id': item['id'], 'output_index': index}
    events = [_event('response.output_item.added', output_index=index,
                     item=dict(item, status='in_progress', arguments=''))]
    events += [_event('response.function_call_arguments.delta', delta=d, **where)
               for d in argument_chunks(json.loads(item['arguments']))]
    events += [_event('response.function_call_arguments.done', arguments=item['arguments'], **where),
               _event('response.output_item.done', output_index=index, item=item)]
    return events


def _custom_call_events(index: int, item: dict) -> list:
    where = {'item_id': item['id'], 'output_index': index}
    events = [_event('response.output_item.added', output_index=index,
                     item=dict(item, status='in_progress', input=''))]
    events += [_event('response.custom_tool_call_input.delta', delta=d, **where) for d in text_chunks(item['input'])]
    events += [_event('response.custom_tool_call_input.done', input=item['input'], **where),
               _event('response.output_item.done', output_index=index, item=item)]
    return events


_item_events = {'reasoning': _reasoning_events, 'message': _message_events, 'function_call': _call_events,
                'custom_tool_call': _custom_call_events}


def _stream(response: dict) -> StreamAnswer:
    pending = dict(response, status='in_progress', output=[], usage=None, completed_at=None)
    events = [_event('response.created', response=pending), _event('response.in_progress', response=pending)]
    for index, item in enumerate(response['output']):
        events += _item_events[item['type']](index, item)
    events.append(_event('response.completed', response=response))
    events = numbered(events)
    first = next(i for i, (name, _) in enumerate(events) if name.endswith('.delta'))
    failed = dict(pending, status='failed',
                  error={'code': 'server_error', 'message': 'The model failed to generate a response.'})
    failure = numbered([_event('response.failed', response=failed)], first + 1)
    return StreamAnswer(events, first, failure)
