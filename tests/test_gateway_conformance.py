"""Every Response, stream event and completion the gateway sends, against the Open Responses schema and the SDK.

The real gateway (``llmconn serve``) on every backend kind, plain and
streamed, with and without tools and reasoning; each raw body and each raw
SSE event is validated strictly (:mod:`conformance_checks`), and the
settings a Response echoes are the ones that went upstream.
"""

from __future__ import annotations

import json

import pytest

from conformance_checks import (check_chunk, check_completion, check_event, check_response, check_stream, post,
                                sse_data)
from gateway_stack import ASK, KEYS, ORDER_TOOL, GatewayStack, reasoning_params

TEMPLATE = '''  - {name: Template, provider: template, model: gpt-4.1, address: "FAKE_URL/v1/chat/completions",
     max_retries: 0, request_template_file: "etc/templates/chat-completions.request.j2",
     response_template_file: "etc/templates/chat-completions.response.j2"}
  - {name: ClaudePlain, provider: claude, model: claude-sonnet-5-5, address: "FAKE_URL", max_retries: 0}'''
MODELS = ['Chat', 'Claude', 'ClaudePlain', 'Responses', 'ResponsesLocal', 'Gemini', 'Template']
TOOL_MODELS = [m for m in MODELS if m != 'Template']
# The max_tokens each connection sends upstream when a request sets none (gateway_stack's llm.yaml).
CONFIGURED_LIMIT = {'Claude': 2048, 'Chat': 1024, 'ClaudePlain': 1024, 'Responses': 1024, 'ResponsesLocal': 1024,
                    'Gemini': 1024, 'Template': None}
SECRET = KEYS['a'][0]


@pytest.fixture(scope='module')
def gw():
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    stack = GatewayStack(processes=1, extra_llm=TEMPLATE.replace('etc/templates', str(root / 'etc' / 'templates')))
    yield stack
    stack.close()


def _variant(model: str, variant: str) -> dict:
    if variant == 'tools':
        return {'input': ASK, 'tools': [ORDER_TOOL]}
    if variant == 'reasoning':
        return {'input': 'think: first', **reasoning_params(model)}
    return {'input': 'hello there'}


def _responses(gw, body: dict):
    return post(f'{gw.url()}/responses', SECRET, body)


def _events(answer) -> list[dict]:
    return [json.loads(data) for data in sse_data(answer)]


@pytest.mark.parametrize('variant', ['plain', 'tools', 'reasoning'])
@pytest.mark.parametrize('model', MODELS)
def test_every_response_and_its_stored_copy_conform(gw, model, variant):
    if variant == 'tools' and model not in TOOL_MODELS:
        pytest.skip('a template endpoint takes no tools (its matrix column refuses them)')
    answer = _responses(gw, {'model': model, **_variant(model, variant)})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    response = check_response(body)
    assert isinstance(body['created_at'], int) and body['completed_at'] >= body['created_at']
    assert body['max_output_tokens'] == CONFIGURED_LIMIT[model]
    if variant == 'tools':
        assert [i['type'] for i in body['output']][-1] == 'function_call'
    if variant == 'reasoning' and model.startswith('Responses'):
        assert body['reasoning'] == {'effort': 'low', 'summary': 'auto'}
    stored = gw.client().responses.with_raw_response.retrieve(response.id).http_response.json()
    check_response(stored)
    assert stored == body


@pytest.mark.parametrize('variant', ['plain', 'tools', 'reasoning'])
@pytest.mark.parametrize('model', MODELS)
def test_every_stream_event_conforms(gw, model, variant):
    if variant == 'tools' and model not in TOOL_MODELS:
        pytest.skip('a template endpoint takes no tools')
    events = _events(_responses(gw, {'model': model, 'stream': True, **_variant(model, variant)}))
    check_stream(events)
    final = events[-1]['response']
    assert final['status'] == 'completed' and final['max_output_tokens'] == CONFIGURED_LIMIT[model]
    assert events[0]['response']['completed_at'] is None and isinstance(final['completed_at'], int)
    done = [e['item'] for e in events if e['type'] == 'response.output_item.done']
    assert done == final['output']
    if variant == 'reasoning' and model in ('Claude', 'Responses', 'ResponsesLocal'):
        assert any(i['type'] == 'reasoning' for i in done), [e['type'] for e in events]


def test_the_settings_echoed_are_the_ones_sent_upstream(gw):
    answer = _responses(gw, {'model': 'Chat', 'input': 'hi', 'temperature': 0.3, 'top_p': 0.5,
                             'max_output_tokens': 77, 'text': {'verbosity': 'low'}, 'service_tier': 'flex',
                             'prompt_cache_key': 'chat-7', 'safety_identifier': 'user-9'})
    body = answer.json()
    check_response(body)
    sent = gw.fake.requests[-1]['body']
    assert (sent['temperature'], sent['top_p'], sent['max_tokens'], sent['verbosity']) == (0.3, 0.5, 77, 'low')
    assert (body['temperature'], body['top_p'], body['max_output_tokens']) == (0.3, 0.5, 77)
    assert body['text'] == {'format': {'type': 'text'}, 'verbosity': 'low'}
    assert (body['service_tier'], body['prompt_cache_key'], body['safety_identifier']) == \
        ('flex', 'chat-7', 'user-9')


def test_a_setting_dropped_as_a_loss_is_not_echoed_as_if_sent(gw):
    body = _responses(gw, {'model': 'Claude', 'input': 'hi', 'text': {'verbosity': 'high'},
                           'fallback_policy': {'allow_lossy': True, 'allowed_losses': ['verbosity_ignored']}}).json()
    check_response(body)
    assert body['text'] == {'format': {'type': 'text'}}
    assert body['metadata']['llmconn_downgrades'] == 'text.verbosity:verbosity_ignored'
    assert 'verbosity' not in json.dumps(gw.fake.requests[-1]['body'])


def test_a_json_schema_format_is_echoed_whole(gw):
    fmt = {'type': 'json_schema', 'name': 'order', 'schema': {'type': 'object', 'properties': {}}}
    body = _responses(gw, {'model': 'ResponsesLocal', 'input': 'hi', 'text': {'format': fmt}}).json()
    check_response(body)
    assert body['text']['format'] == dict(fmt, description=None, strict=False)


def test_a_failed_response_conforms_streamed_and_stored(gw):
    gw.fake.fail_stream('error')
    events = _events(_responses(gw, {'model': 'Chat', 'input': 'tell me a long story', 'stream': True}))
    check_stream(events)
    assert events[-1]['type'] == 'response.failed' and events[-1]['response']['completed_at'] is None
    stored = gw.client().responses.with_raw_response.retrieve(events[-1]['response']['id']).http_response.json()
    assert check_response(stored).status == 'failed'


def test_function_call_output_continuation_conforms(gw):
    first = _responses(gw, {'model': 'Chat', 'input': ASK, 'tools': [ORDER_TOOL]}).json()
    call = first['output'][-1]
    events = _events(_responses(gw, {'model': 'Chat', 'stream': True, 'previous_response_id': first['id'],
                                     'tools': [ORDER_TOOL], 'input': [{'type': 'function_call_output',
                                                                       'call_id': call['call_id'],
                                                                       'output': '{"status": "shipped"}'}]}))
    check_stream(events)
    assert events[-1]['response']['previous_response_id'] == first['id']


@pytest.mark.parametrize('model', MODELS)
def test_every_chat_completion_and_chunk_conforms(gw, model):
    url = f'{gw.url()}/chat/completions'
    messages = [{'role': 'user', 'content': ASK if model in TOOL_MODELS else 'hi'}]
    tools = [{'type': 'function', 'function': {k: v for k, v in ORDER_TOOL.items() if k != 'type'}}] \
        if model in TOOL_MODELS else None
    body = {'model': model, 'messages': messages, **({'tools': tools} if tools else {})}
    answer = post(url, SECRET, body)
    assert answer.status_code == 200, answer.text
    completion = check_completion(answer.json())
    assert completion.choices[0].finish_reason == ('tool_calls' if tools else 'stop')
    streamed = list(sse_data(post(url, SECRET, dict(body, stream=True, stream_options={'include_usage': True}))))
    assert streamed[-1] == '[DONE]'
    chunks = [check_chunk(json.loads(data)) for data in streamed[:-1]]
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens > 0


def test_an_event_with_a_float_created_at_is_refused_by_the_oracle():
    """The oracle itself: what the gateway sent before this fix fails it."""
    event = {'type': 'response.created', 'sequence_number': 0,
             'response': {'id': 'resp_1', 'object': 'response', 'created_at': 1796161829.26, 'status': 'in_progress',
                          'model': 'Chat', 'output': [], 'tools': [], 'tool_choice': 'auto',
                          'parallel_tool_calls': True}}
    with pytest.raises(Exception, match='created_at|completed_at'):
        check_event(event)


@pytest.mark.parametrize('stream', [False, True], ids=['plain', 'streamed'])
@pytest.mark.parametrize('model', ['Claude', 'ResponsesLocal'])
def test_sealed_reasoning_for_a_stateless_client_conforms(gw, model, stream):
    body = {'model': model, 'input': 'think: ' + ASK, 'tools': [ORDER_TOOL], 'store': False, 'stream': stream,
            'include': ['reasoning.encrypted_content'], **reasoning_params(model)}
    answer = _responses(gw, body)
    if stream:
        events = _events(answer)
        check_stream(events)
        output = events[-1]['response']['output']
    else:
        output = check_response(answer.json()).model_dump(mode='json')['output']
    assert any(i['type'] == 'reasoning' and i.get('encrypted_content') for i in output), output
