"""The fake provider against the official SDKs: its bodies and streams must be the real wire formats.

One server serves the whole module; each test starts with no recorded
requests and no queued faults. The SDK models (``anthropic.types.Message``,
``openai`` ``ChatCompletion`` / ``Response`` and their stream events) are the
oracle, and the SDK clients themselves are pointed at the server.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import anthropic
import openai
import pytest
import requests
from anthropic.types import Message, RawMessageStreamEvent
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from llmconn.testing.fake_server import FakeProviderServer, listening_socket
from waiting import wait_until

CLAUDE_HEADERS = {'anthropic-version': '2023-06-01', 'x-api-key': 'x'}
THINKING = {'type': 'enabled', 'budget_tokens': 1024}


@pytest.fixture(scope='module')
def srv():
    with FakeProviderServer() as server:
        yield server


@pytest.fixture(autouse=True)
def clean(srv):
    srv.clear()
    srv.clear_faults()
    srv.latency = 0
    yield


@pytest.fixture(scope='module')
def http():
    with requests.Session() as session:
        yield session


@pytest.fixture
def claude(srv):
    return anthropic.Anthropic(base_url=srv.url, api_key='x', max_retries=0)


@pytest.fixture
def oai(srv):
    return openai.OpenAI(base_url=srv.url + '/v1', api_key='x', max_retries=0)


def sse_events(response: requests.Response) -> list[tuple[str, str]]:
    """``(event, data)`` pairs of a server-sent event stream."""
    events = []
    for block in response.text.split('\n\n'):
        if not block.strip():
            continue
        fields = dict(line.split(': ', 1) for line in block.split('\n'))
        events.append((fields.get('event', ''), fields['data']))
    return events


def claude_post(http, srv, body: dict, **kwargs) -> requests.Response:
    base = {'model': 'claude-sonnet-5-5', 'max_tokens': 2048}
    return http.post(srv.url + '/v1/messages', json=dict(base, **body), headers=CLAUDE_HEADERS, **kwargs)


def user(text: str) -> dict:
    return {'role': 'user', 'content': text}


# Claude Messages


def test_claude_sdk_create_echoes_the_conversation(claude):
    message = claude.messages.create(
        model='claude-sonnet-5-5', max_tokens=100, system='be brief',
        messages=[user('my name is Ann'), {'role': 'assistant', 'content': 'hi Ann'}, user('what is my name?')])
    assert isinstance(message, Message)
    assert message.content[0].text == 'echo: what is my name? | users: 2 | previous: my name is Ann | system: yes'
    assert message.model == 'claude-sonnet-5-5'
    assert message.usage.input_tokens == 2 + 4 + 2 + 4
    assert message.usage.output_tokens == len(message.content[0].text.split())


def test_claude_stream_is_the_real_event_sequence(http, srv):
    response = claude_post(http, srv, {'messages': [user('hello there')], 'stream': True})
    events = sse_events(response)
    adapter = TypeAdapter(RawMessageStreamEvent)
    parsed = [adapter.validate_python(json.loads(data)) for name, data in events if name != 'ping']
    names = [name for name, _ in events]
    assert names[:3] == ['message_start', 'content_block_start', 'ping']
    assert names[-3:] == ['content_block_stop', 'message_delta', 'message_stop']
    assert all(json.loads(data)['type'] == name for name, data in events)
    text = ''.join(e.delta.text for e in parsed if e.type == 'content_block_delta')
    assert text == 'echo: hello there | users: 1 | previous: - | system: no'
    assert parsed[-2].usage.output_tokens == len(text.split())


def test_claude_sdk_stream_gives_the_final_message(claude):
    with claude.messages.stream(model='claude-sonnet-5-5', max_tokens=100, messages=[user('hi')]) as stream:
        deltas = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(deltas) > 1
    assert ''.join(deltas) == final.content[0].text == 'echo: hi | users: 1 | previous: - | system: no'


def test_claude_thinking_block_replays_when_untouched(claude):
    first = claude.messages.create(model='claude-sonnet-5-5', max_tokens=2048, thinking=THINKING,
                                   messages=[user('think: what is 2+2?')])
    assert [b.type for b in first.content] == ['thinking', 'text']
    assert first.content[0].signature and 'what is 2+2?' in first.content[0].thinking
    history = [user('think: what is 2+2?'), {'role': 'assistant', 'content': first.content}, user('and 3+3?')]
    second = claude.messages.create(model='claude-sonnet-5-5', max_tokens=2048, thinking=THINKING,
                                    messages=history)
    assert second.content[-1].text.startswith('echo: and 3+3? | users: 2')


def test_claude_altered_thinking_is_rejected(claude):
    first = claude.messages.create(model='claude-sonnet-5-5', max_tokens=2048, thinking=THINKING,
                                   messages=[user('think: secret plan')])
    block = first.content[0].model_dump()
    block['thinking'] += ' (edited)'
    with pytest.raises(anthropic.BadRequestError) as info:
        claude.messages.create(model='claude-sonnet-5-5', max_tokens=2048, thinking=THINKING,
                               messages=[user('think: secret plan'),
                                         {'role': 'assistant', 'content': [block, first.content[1].model_dump()]},
                                         user('next')])
    assert info.value.body['error']['type'] == 'invalid_request_error'
    assert 'signature' in info.value.body['error']['message']


def test_claude_altered_or_foreign_redacted_thinking_is_rejected(claude, srv):
    first = claude.messages.create(model='claude-sonnet-5-5', max_tokens=2048, thinking=THINKING,
                                   messages=[user('redact: hide this')])
    assert first.content[0].type == 'redacted_thinking'
    good = first.content[0].data
    for data, ok in ((good, True), (good[:-4] + 'AAAA', False), ('Zm9yZWlnbg==', False)):
        history = [user('redact: hide this'),
                   {'role': 'assistant', 'content': [{'type': 'redacted_thinking', 'data': data},
                                                     {'type': 'text', 'text': first.content[1].text}]},
                   user('next')]
        if ok:
            claude.messages.create(model='claude-sonnet-5-5', max_tokens=2048, messages=history)
        else:
            with pytest.raises(anthropic.BadRequestError):
                claude.messages.create(model='claude-sonnet-5-5', max_tokens=2048, messages=history)


def test_claude_thinking_streams_deltas_and_signature(http, srv):
    response = claude_post(http, srv, {'messages': [user('think: why?')], 'stream': True,
                                       'thinking': {'type': 'adaptive'}})
    deltas = [json.loads(d)['delta'] for n, d in sse_events(response) if n == 'content_block_delta']
    kinds = [d['type'] for d in deltas]
    assert kinds[0] == 'thinking_delta' and 'signature_delta' in kinds and kinds[-1] == 'text_delta'
    thinking = ''.join(d['thinking'] for d in deltas if d['type'] == 'thinking_delta')
    signature = next(d['signature'] for d in deltas if d['type'] == 'signature_delta')
    replay = [user('think: why?'), {'role': 'assistant', 'content': [
        {'type': 'thinking', 'thinking': thinking, 'signature': signature}]}, user('ok')]
    assert claude_post(http, srv, {'messages': replay}).status_code == 200


def test_claude_without_thinking_enabled_has_no_thinking(claude):
    message = claude.messages.create(model='claude-sonnet-5-5', max_tokens=10, messages=[user('think: x')])
    assert [b.type for b in message.content] == ['text']


@pytest.mark.parametrize('body, words', [
    ({'max_tokens': None}, 'max_tokens'),
    ({'model': ''}, 'model'),
    ({'messages': []}, 'messages'),
    ({'messages': [{'role': 'assistant', 'content': 'hi'}]}, 'roles'),
    ({'messages': [user('a'), user('b')]}, 'roles'),
    ({'messages': [{'role': 'system', 'content': 'a'}]}, 'role'),
])
def test_claude_rejects_what_the_real_api_rejects(http, srv, body, words):
    payload = {'model': 'claude-sonnet-5-5', 'max_tokens': 10, 'messages': [user('hi')]}
    payload.update(body)
    payload = {k: v for k, v in payload.items() if v is not None}
    response = http.post(srv.url + '/v1/messages', json=payload, headers=CLAUDE_HEADERS)
    assert response.status_code == 400
    assert response.json()['type'] == 'error'
    assert response.json()['error']['type'] == 'invalid_request_error'
    assert words in response.json()['error']['message']


def test_claude_requires_anthropic_version(http, srv):
    response = http.post(srv.url + '/v1/messages', json={'model': 'm', 'max_tokens': 1, 'messages': [user('x')]})
    assert response.status_code == 400
    assert 'anthropic-version' in response.json()['error']['message']


# OpenAI Chat Completions


def test_openai_sdk_create(oai):
    completion = oai.chat.completions.create(
        model='gpt-4o-mini', messages=[{'role': 'system', 'content': 'be brief'}, user('hello')])
    assert isinstance(completion, ChatCompletion)
    assert completion.choices[0].message.content == 'echo: hello | users: 1 | previous: - | system: yes'
    assert completion.choices[0].finish_reason == 'stop'
    assert completion.usage.prompt_tokens == 3
    assert completion.usage.completion_tokens == 11


def test_openai_sdk_stream_with_usage(oai):
    chunks = list(oai.chat.completions.create(model='gpt-4o-mini', messages=[user('hello')], stream=True,
                                              stream_options={'include_usage': True}))
    assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
    text = ''.join(c.choices[0].delta.content or '' for c in chunks if c.choices)
    assert text == 'echo: hello | users: 1 | previous: - | system: no'
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(text.split())
    assert chunks[-2].choices[0].finish_reason == 'stop'


def test_openai_stream_ends_with_done_and_has_no_usage_unless_asked(http, srv):
    response = http.post(srv.url + '/v1/chat/completions', json={
        'model': 'm', 'messages': [user('hi')], 'stream': True})
    events = sse_events(response)
    assert events[-1] == ('', '[DONE]')
    chunks = [json.loads(data) for _, data in events[:-1]]
    assert all('usage' not in c for c in chunks)
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk)


@pytest.mark.parametrize('body, code', [
    ({'messages': [user('hi')]}, None),
    ({'model': 'm'}, 'missing_required_parameter'),
    ({'model': 'm', 'messages': []}, 'empty_array'),
    ({'model': 'm', 'messages': [{'role': 'robot', 'content': 'x'}]}, 'invalid_value'),
    ({'model': 'm', 'messages': [user('hi')], 'stream_options': {'include_usage': True}}, None),
])
def test_openai_rejects_what_the_real_api_rejects(http, srv, body, code):
    response = http.post(srv.url + '/v1/chat/completions', json=body)
    assert response.status_code == 400
    error = response.json()['error']
    assert set(error) == {'message', 'type', 'param', 'code'}
    assert error['code'] == code
    assert error['type'] == 'invalid_request_error'


def test_models_list_speaks_each_dialect(http, srv, claude, oai):
    assert claude.models.list().data[0].id.startswith('claude')
    assert oai.models.list().data[0].object == 'model'
    assert http.get(srv.url + '/v1beta/models').json()['models'][0]['name'].startswith('models/gemini')


# OpenAI Responses


def test_responses_sdk_create_and_chain(oai):
    first = oai.responses.create(model='gpt-5', input='my name is Ann', instructions='be brief')
    assert isinstance(first, Response)
    assert first.output_text == 'echo: my name is Ann | users: 1 | previous: - | system: yes'
    second = oai.responses.create(model='gpt-5', input='what is my name?', previous_response_id=first.id)
    assert second.output_text == 'echo: what is my name? | users: 2 | previous: my name is Ann | system: no'
    third = oai.responses.create(model='gpt-5', input=[user('and now?')], previous_response_id=second.id)
    assert third.output_text.startswith('echo: and now? | users: 3 | previous: what is my name?')
    # The chain's earlier input and output count as input, as they do for the real API.
    assert second.usage.input_tokens == 4 + len(first.output_text.split()) + 4 + 2 - 2


def test_responses_unknown_previous_id_is_previous_response_not_found(oai):
    with pytest.raises(openai.BadRequestError) as info:
        oai.responses.create(model='gpt-5', input='hi', previous_response_id='resp_nope')
    assert info.value.status_code == 400
    assert info.value.code == 'previous_response_not_found'
    assert info.value.param == 'previous_response_id'


def test_responses_not_stored_cannot_be_continued(oai):
    first = oai.responses.create(model='gpt-5', input='hi', store=False)
    with pytest.raises(openai.BadRequestError):
        oai.responses.create(model='gpt-5', input='again', previous_response_id=first.id)


def test_responses_local_replay_counts_every_user_message(oai):
    response = oai.responses.create(model='gpt-5', store=False, input=[
        {'role': 'user', 'content': [{'type': 'input_text', 'text': 'one'}]},
        {'role': 'assistant', 'content': [{'type': 'output_text', 'text': 'ok'}]},
        {'type': 'message', 'role': 'user', 'content': 'two'}])
    assert response.output_text == 'echo: two | users: 2 | previous: one | system: no'


def test_responses_stream_is_the_real_event_sequence(http, srv):
    response = http.post(srv.url + '/v1/responses', json={'model': 'gpt-5', 'input': 'hi', 'stream': True})
    adapter = TypeAdapter(ResponseStreamEvent)
    events = [adapter.validate_python(json.loads(data)) for _, data in sse_events(response)]
    assert [name for name, _ in sse_events(response)] == [e.type for e in events]
    kinds = [e.type for e in events]
    assert kinds[:5] == ['response.created', 'response.in_progress', 'response.output_item.added',
                         'response.content_part.added', 'response.output_text.delta']
    assert kinds[-4:] == ['response.output_text.done', 'response.content_part.done',
                          'response.output_item.done', 'response.completed']
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].response.output_text == 'echo: hi | users: 1 | previous: - | system: no'


def test_responses_reasoning_streams_summary_and_encrypted_content(http, srv, oai):
    body = {'model': 'o4-mini', 'input': 'think hard', 'stream': True, 'store': False,
            'reasoning': {'effort': 'low', 'summary': 'auto'}, 'include': ['reasoning.encrypted_content']}
    events = [json.loads(d) for _, d in sse_events(http.post(srv.url + '/v1/responses', json=body))]
    summary = ''.join(e['delta'] for e in events if e['type'] == 'response.reasoning_summary_text.delta')
    assert summary == 'Reasoning about: think hard'
    item = events[-1]['response']['output'][0]
    assert item['type'] == 'reasoning' and item['encrypted_content']
    replay = [user('think hard'), item, events[-1]['response']['output'][1], user('more')]
    again = oai.responses.create(model='o4-mini', input=replay, store=False, reasoning={'effort': 'low'})
    assert again.output_text.startswith('echo: more | users: 2')
    item = dict(item, encrypted_content=item['encrypted_content'][:-4] + 'AAAA')
    with pytest.raises(openai.BadRequestError) as info:
        oai.responses.create(model='o4-mini', input=[user('think hard'), item, user('more')], store=False)
    assert info.value.code == 'invalid_encrypted_content'


def test_responses_unstored_reasoning_item_without_content_is_not_found(oai):
    item = {'type': 'reasoning', 'id': 'rs_unknown', 'summary': []}
    with pytest.raises(openai.NotFoundError):
        oai.responses.create(model='o4-mini', input=[user('a'), item, user('b')], store=False)


def test_responses_sdk_stream_with_chain(oai):
    first = oai.responses.create(model='gpt-5', input='first')
    with oai.responses.stream(model='gpt-5', input='second', previous_response_id=first.id,
                              reasoning={'effort': 'low', 'summary': 'auto'}) as stream:
        deltas = [e.delta for e in stream if e.type == 'response.output_text.delta']
        final = stream.get_final_response()
    assert ''.join(deltas) == final.output_text == 'echo: second | users: 2 | previous: first | system: no'
    assert [o.type for o in final.output] == ['reasoning', 'message']
    assert oai.responses.retrieve(final.id).id == final.id


# Gemini


def gemini_post(http, srv, body: dict, method: str = 'generateContent', **query) -> requests.Response:
    return http.post(f'{srv.url}/v1beta/models/gemini-2.5-flash:{method}', json=body, params=query,
                     headers={'x-goog-api-key': 'x'})


GEMINI_BODY = {'systemInstruction': {'parts': [{'text': 'be brief'}]},
               'contents': [{'role': 'user', 'parts': [{'text': 'my name is Ann'}]},
                            {'role': 'model', 'parts': [{'text': 'hi'}]},
                            {'role': 'user', 'parts': [{'text': 'who am I?'}]}]}


def test_gemini_generate_content(http, srv):
    body = gemini_post(http, srv, GEMINI_BODY).json()
    candidate = body['candidates'][0]
    assert candidate['content'] == {'role': 'model', 'parts': [
        {'text': 'echo: who am I? | users: 2 | previous: my name is Ann | system: yes'}]}
    assert candidate['finishReason'] == 'STOP'
    assert body['usageMetadata']['promptTokenCount'] == 2 + 4 + 1 + 3
    assert body['usageMetadata']['candidatesTokenCount'] == 16
    assert body['modelVersion'] == 'gemini-2.5-flash'


def test_gemini_stream_sse(http, srv):
    response = gemini_post(http, srv, GEMINI_BODY, 'streamGenerateContent', alt='sse')
    chunks = [json.loads(data) for name, data in sse_events(response)]
    assert len(chunks) > 1 and all(name == '' for name, _ in sse_events(response))
    text = ''.join(c['candidates'][0]['content']['parts'][0]['text'] for c in chunks)
    assert text.startswith('echo: who am I? | users: 2')
    assert chunks[-1]['candidates'][0]['finishReason'] == 'STOP'
    assert chunks[-1]['usageMetadata']['candidatesTokenCount'] == len(text.split())


def test_gemini_thoughts_when_asked(http, srv):
    body = {'contents': [{'parts': [{'text': 'think: why?'}]}],
            'generationConfig': {'thinkingConfig': {'includeThoughts': True}}}
    parts = gemini_post(http, srv, body).json()['candidates'][0]['content']['parts']
    assert parts[0]['thought'] is True and parts[1]['text'].startswith('echo: think: why?')


@pytest.mark.parametrize('body', [{}, {'contents': []}, {'contents': [{'role': 'bot', 'parts': [{'text': 'x'}]}]}])
def test_gemini_rejects_bad_contents(http, srv, body):
    response = gemini_post(http, srv, body)
    assert response.status_code == 400
    assert response.json()['error']['status'] == 'INVALID_ARGUMENT'
    assert response.json()['error']['code'] == 400


def gemini_calling(config: dict | None, declared: tuple = ('get_order',), text: str = 'call get_order {"id": "7"}'):
    body = {'contents': [{'role': 'user', 'parts': [{'text': text}]}]}
    if declared:
        body['tools'] = [{'functionDeclarations': [{'name': n, 'parameters': {'type': 'object'}} for n in declared]}]
    if config is not None:
        body['toolConfig'] = {'functionCallingConfig': config}
    return body


@pytest.mark.parametrize('config', [None, {}, {'mode': 'AUTO'}, {'mode': 'ANY'}, {'mode': 'VALIDATED'},
                                    {'mode': 'VALIDATED', 'allowedFunctionNames': ['get_order']}])
def test_gemini_calls_under_each_mode_that_allows_it(http, srv, config):
    parts = gemini_post(http, srv, gemini_calling(config)).json()['candidates'][0]['content']['parts']
    assert parts[0]['functionCall'] == {'name': 'get_order', 'args': {'id': '7'}}


def test_gemini_calls_nothing_under_none_or_outside_the_allowed_names(http, srv):
    for config, declared in (({'mode': 'NONE'}, ('get_order',)),
                             ({'mode': 'ANY', 'allowedFunctionNames': ['get_user']}, ('get_order', 'get_user'))):
        parts = gemini_post(http, srv, gemini_calling(config, declared)).json()['candidates'][0]['content']['parts']
        assert parts[0]['text'].startswith('echo: call get_order')


@pytest.mark.parametrize('config, declared, says', [
    ({'mode': 'STRICT'}, ('get_order',), "Invalid value at 'tool_config.function_calling_config.mode'"),
    ({'mode': 'validated'}, ('get_order',), '"validated"'),
    ({'mode': 'AUTO', 'allowedFunctionNames': ['get_order']}, ('get_order',), 'only be set when the mode is ANY'),
    ({'mode': 'ANY', 'allowedFunctionNames': ['get_user']}, ('get_order',), 'must name declared functions'),
    ({'mode': 'VALIDATED'}, (), 'without function_declarations'),
    ('VALIDATED', ('get_order',), "Invalid value at 'tool_config.function_calling_config'"),
])
def test_gemini_refuses_a_function_calling_config_it_does_not_know(http, srv, config, declared, says):
    response = gemini_post(http, srv, gemini_calling(config, declared))
    assert response.status_code == 400 and response.json()['error']['status'] == 'INVALID_ARGUMENT'
    assert says in response.json()['error']['message']


def test_gemini_takes_the_validated_mode_the_provider_sends_for_a_strict_tool(http, srv):
    from llmconn.tools import Tool
    from llmconn.types import Request
    from provider_helpers import make_provider
    schema = {'type': 'object', 'properties': {'id': {'type': 'string'}}, 'required': ['id'],
              'additionalProperties': False}
    body = make_provider('gemini').build_request(Request(text='call get_order {"id": "7"}', tools=(
        Tool('get_order', 'Look it up', schema, strict=True),)))
    assert body['toolConfig'] == {'functionCallingConfig': {'mode': 'VALIDATED'}}
    parts = gemini_post(http, srv, body).json()['candidates'][0]['content']['parts']
    assert parts[0]['functionCall'] == {'name': 'get_order', 'args': {'id': '7'}}


# Strict validation: the SDK clients parse leniently, the models themselves do not.


@pytest.mark.parametrize('path, body, headers, model', [
    ('/v1/messages', {'model': 'c', 'max_tokens': 2048, 'thinking': THINKING,
                      'messages': [user('think: x')]}, CLAUDE_HEADERS, Message),
    ('/v1/messages', {'model': 'c', 'max_tokens': 2048, 'thinking': THINKING,
                      'messages': [user('redact: x')]}, CLAUDE_HEADERS, Message),
    ('/v1/chat/completions', {'model': 'g', 'messages': [user('x')]}, {}, ChatCompletion),
    ('/v1/responses', {'model': 'o', 'input': 'x', 'reasoning': {'effort': 'low'},
                       'include': ['reasoning.encrypted_content']}, {}, Response),
])
def test_bodies_validate_strictly_against_sdk_models(http, srv, path, body, headers, model):
    response = http.post(srv.url + path, json=body, headers=headers)
    assert response.status_code == 200
    model.model_validate(response.json(), strict=False)


@pytest.mark.parametrize('path, body, headers, adapter', [
    ('/v1/messages', {'model': 'c', 'max_tokens': 2048, 'thinking': THINKING, 'stream': True,
                      'messages': [user('think: x')]}, CLAUDE_HEADERS, TypeAdapter(RawMessageStreamEvent)),
    ('/v1/chat/completions', {'model': 'g', 'messages': [user('x')], 'stream': True,
                              'stream_options': {'include_usage': True}}, {}, TypeAdapter(ChatCompletionChunk)),
    ('/v1/responses', {'model': 'o', 'input': 'x', 'reasoning': {'effort': 'low'}, 'stream': True,
                       'include': ['reasoning.encrypted_content']}, {}, TypeAdapter(ResponseStreamEvent)),
])
def test_stream_events_validate_against_sdk_models(http, srv, path, body, headers, adapter):
    events = sse_events(http.post(srv.url + path, json=body, headers=headers))
    assert len(events) > 2      # a stream, not an empty or one-shot answer
    for name, data in events:
        if name != 'ping' and data != '[DONE]':
            adapter.validate_python(json.loads(data))


# Faults


def test_fail_answers_in_each_providers_error_shape_then_recovers(http, srv, claude, oai):
    srv.fail(429, count=2, headers={'Retry-After': '7', 'retry-after-ms': '7000'})
    with pytest.raises(anthropic.RateLimitError) as info:
        claude.messages.create(model='c', max_tokens=5, messages=[user('x')])
    assert info.value.body['error']['type'] == 'rate_limit_error'
    assert info.value.response.headers['retry-after'] == '7'
    assert info.value.response.headers['retry-after-ms'] == '7000'
    with pytest.raises(openai.RateLimitError) as info:
        oai.chat.completions.create(model='g', messages=[user('x')])
    assert info.value.code == 'rate_limit_exceeded'
    assert oai.chat.completions.create(model='g', messages=[user('x')]).choices


def test_fail_shapes_gemini_errors_and_keeps_a_given_body(http, srv):
    srv.fail(503)
    error = gemini_post(http, srv, GEMINI_BODY).json()['error']
    assert error == {'code': 503, 'message': error['message'], 'status': 'UNAVAILABLE'}
    srv.fail(500, body={'custom': True})
    response = http.post(srv.url + '/v1/chat/completions', json={'model': 'm', 'messages': [user('x')]})
    assert (response.status_code, response.json()) == (500, {'custom': True})


def test_faults_are_taken_in_order(http, srv, oai):
    srv.fail(529)
    srv.garbage()
    with pytest.raises(openai.InternalServerError):
        oai.chat.completions.create(model='g', messages=[user('x')])
    response = http.post(srv.url + '/v1/chat/completions', json={'model': 'm', 'messages': [user('x')]})
    assert response.status_code == 200
    with pytest.raises(ValueError):
        response.json()
    assert http.post(srv.url + '/v1/chat/completions', json={'model': 'm', 'messages': [user('x')]}).json()


def test_hang_delays_the_answer_and_times_out_a_client(http, srv):
    srv.hang(0.5)
    with pytest.raises(requests.Timeout):
        http.post(srv.url + '/v1/chat/completions', json={'model': 'm', 'messages': [user('x')]}, timeout=0.1)
    srv.hang(0.2)
    started = time.perf_counter()
    response = http.post(srv.url + '/v1/chat/completions', json={'model': 'm', 'messages': [user('x')]})
    assert response.status_code == 200 and time.perf_counter() - started >= 0.2


def test_stream_break_cuts_the_connection_after_the_first_delta(http, srv, claude, oai):
    srv.fail_stream('break', count=2)
    with pytest.raises(requests.exceptions.ChunkedEncodingError):
        claude_post(http, srv, {'messages': [user('hi')], 'stream': True})
    with pytest.raises(openai.APIConnectionError):
        with oai.responses.stream(model='gpt-5', input='hi') as stream:
            for _ in stream:
                pass
    # Non-streaming requests never take a stream fault; the queue is now empty.
    assert claude_post(http, srv, {'messages': [user('hi')], 'stream': True}).status_code == 200


@pytest.mark.parametrize('path, body, headers, last', [
    ('/v1/messages', {'model': 'c', 'max_tokens': 5, 'stream': True, 'messages': [user('hi')]}, CLAUDE_HEADERS,
     ('error', 'overloaded_error')),
    ('/v1/responses', {'model': 'o', 'input': 'hi', 'stream': True}, {}, ('response.failed', 'server_error')),
    ('/v1/chat/completions', {'model': 'g', 'stream': True, 'messages': [user('hi')]}, {}, ('', 'server_error')),
])
def test_stream_error_sends_the_providers_error_event(http, srv, path, body, headers, last):
    srv.fail_stream('error')
    events = sse_events(http.post(srv.url + path, json=body, headers=headers))
    name, data = events[-1]
    data = json.loads(data)
    kind = data['error']['type'] if 'error' in data and 'type' in data['error'] else data['response']['error']['code']
    assert (name, kind) == last
    assert 'delta' in json.dumps(events[-2][1])


def test_stream_error_makes_the_sdks_raise(srv, claude, oai):
    srv.fail_stream('error', count=3)
    with pytest.raises(anthropic.APIStatusError):
        with claude.messages.stream(model='c', max_tokens=5, messages=[user('x')]) as stream:
            stream.get_final_message()
    with pytest.raises(openai.APIError):
        list(oai.chat.completions.create(model='g', messages=[user('x')], stream=True))
    with oai.responses.stream(model='o', input='x') as stream:
        events = [event.type for event in stream]
    assert events[-1] == 'response.failed'


def test_control_api_over_http(http, srv):
    assert http.post(srv.url + '/_fake/faults', json={'status': 418}).status_code == 200
    assert http.post(srv.url + '/_fake/faults', json={'stream_break': True, 'count': 2}).status_code == 200
    assert http.post(srv.url + '/_fake/faults', json={'nothing': 1}).status_code == 400
    assert http.get(srv.url + '/v1/models').status_code == 418
    assert http.post(srv.url + '/_fake/latency', json={'seconds': 0.25}).json() == {'seconds': 0.25}
    assert srv.latency == 0.25
    assert [r['path'] for r in http.get(srv.url + '/_fake/requests').json()] == ['/v1/models']
    http.delete(srv.url + '/_fake/requests')
    http.delete(srv.url + '/_fake/faults')
    assert srv.requests == [] and not srv.state.stream_faults


# Recording, latency, auth


def test_requests_are_recorded_with_lowercase_headers_body_and_query(http, srv):
    gemini_post(http, srv, GEMINI_BODY, 'streamGenerateContent', alt='sse')
    [record] = srv.requests
    assert record['method'] == 'POST'
    assert record['path'] == '/v1beta/models/gemini-2.5-flash:streamGenerateContent'
    assert record['headers']['x-goog-api-key'] == 'x'
    assert record['headers']['content-type'] == 'application/json'
    assert record['body'] == GEMINI_BODY
    assert record['query'] == {'alt': 'sse'}


def test_latency_applies_per_request_so_concurrent_requests_overlap(srv):
    srv.latency = 1.0
    statuses = []

    def call():
        statuses.append(requests.post(srv.url + '/v1/chat/completions',
                                      json={'model': 'm', 'messages': [user('x')]}).status_code)

    threads = [threading.Thread(target=call) for _ in range(10)]
    for thread in threads:
        thread.start()
    # All ten are inside the fake (recorded on arrival) before the first has its answer: they overlap.
    wait_until(lambda: len(srv.requests) == 10 or statuses, 'ten requests reached the fake')
    assert statuses == []
    for thread in threads:
        thread.join()
    assert statuses == [200] * 10


def test_keep_alive_requests_are_not_delayed_by_acks(http, srv):
    # Without TCP_NODELAY each keep-alive answer would wait ~40 ms for a delayed ACK; accepted
    # sockets inherit it from the listening one (Linux, the BSDs).
    sock = listening_socket('127.0.0.1', 0)
    try:
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        sock.close()
    for _ in range(3):
        assert http.post(srv.url + '/v1/chat/completions', json={'model': 'm', 'messages': [user('x')]}).ok


@pytest.mark.parametrize('path, body, good, bad, kind', [
    ('/v1/messages', {'model': 'c', 'max_tokens': 5, 'messages': [user('x')]},
     {'x-api-key': 'k1', 'anthropic-version': '2023-06-01'}, {'x-api-key': 'no', 'anthropic-version': '2023-06-01'},
     lambda b: b['error']['type'] == 'authentication_error'),
    ('/v1/chat/completions', {'model': 'g', 'messages': [user('x')]},
     {'authorization': 'Bearer k1'}, {}, lambda b: b['error']['code'] == 'invalid_api_key'),
    ('/v1beta/models/gemini-2.5-flash:generateContent', GEMINI_BODY,
     {'x-goog-api-key': 'k1'}, {'x-goog-api-key': 'k2'}, lambda b: b['error']['status'] == 'UNAUTHENTICATED'),
])
def test_api_key_is_checked_when_configured(http, path, body, good, bad, kind):
    with FakeProviderServer(api_key='k1') as keyed:
        assert http.post(keyed.url + path, json=body, headers=good).status_code == 200
        response = http.post(keyed.url + path, json=body, headers=bad)
        assert response.status_code == 401 and kind(response.json())
        assert 'k1' not in response.text


# Lifecycle


def test_stop_closes_the_port_and_ends_the_thread():
    server = FakeProviderServer().start()
    port, thread = server.port, server._thread
    assert requests.get(server.url + '/v1/models').status_code == 200
    server.stop()
    assert not thread.is_alive()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(('127.0.0.1', port), timeout=1).close()
    server.stop()   # a second stop is harmless


def test_spawned_subprocess_is_shared_and_controlled_over_http():
    with FakeProviderServer.spawn(latency=0.0) as proc:
        client = openai.OpenAI(base_url=proc.url + '/v1', api_key='x', max_retries=0)
        assert client.chat.completions.create(model='g', messages=[user('hi')]).choices[0].message.content \
            == 'echo: hi | users: 1 | previous: - | system: no'
        assert [r['path'] for r in proc.requests()] == ['/v1/chat/completions']
        proc.fail(503, headers={'retry-after-ms': '1'})
        with pytest.raises(openai.InternalServerError):
            client.chat.completions.create(model='g', messages=[user('hi')])
        proc.clear()
        assert proc.requests() == []
        proc.set_latency(0.2)
        started = time.perf_counter()
        client.chat.completions.create(model='g', messages=[user('hi')])
        assert time.perf_counter() - started >= 0.2
        process = proc.process
    assert process.poll() is not None


def test_deleted_or_evicted_responses_cannot_be_continued(oai, monkeypatch):
    from llmconn.testing import fake_app
    first = oai.responses.create(model='gpt-5', input='one')
    oai.responses.delete(first.id)
    with pytest.raises(openai.BadRequestError):
        oai.responses.create(model='gpt-5', input='two', previous_response_id=first.id)
    monkeypatch.setattr(fake_app, 'MAX_STORED_RESPONSES', 2)
    oldest, *newer = [oai.responses.create(model='gpt-5', input=str(i)) for i in range(3)]
    with pytest.raises(openai.BadRequestError):
        oai.responses.create(model='gpt-5', input='x', previous_response_id=oldest.id)
    assert oai.responses.create(model='gpt-5', input='x', previous_response_id=newer[0].id).output_text
