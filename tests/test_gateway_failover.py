"""Failover behind the gateway: both routes, plain and streamed, against one ``llmconn serve``.

The fake provider's scripted faults fail the primary's request; the
answer must come from the fallback, name it (``metadata["llmconn_served_by"]``
and the ``x-llmconn-served-by`` header), still be a valid Response or
completion, and be counted under the connection that answered.
"""

from __future__ import annotations

import json

import openai
import pytest
import requests

from conformance_checks import check_chunk, check_completion, check_response, check_stream, post, sse_data
from gateway_stack import KEYS, GatewayStack, settled_usage
from test_gateway_template import TEMPLATE_CONNECTION

EXTRA = TEMPLATE_CONNECTION + '''
  - {name: Flaky, provider: claude, model: claude-sonnet-5-5, address: "FAKE_URL", max_retries: 0,
     fallbacks: [Chat]}
  - {name: FlakyThinking, provider: claude, model: claude-sonnet-5-5, address: "FAKE_URL", max_retries: 0,
     max_tokens: 2048, thinking: {type: enabled, budget_tokens: 1024}, fallbacks: [Reasoner]}
  - {name: Reasoner, provider: openai-responses, model: gpt-5, address: "FAKE_URL/v1", max_retries: 0,
     params: {reasoning: {effort: low}}}
  - {name: FlakyTools, provider: claude, model: claude-sonnet-5-5, address: "FAKE_URL", max_retries: 0,
     fallbacks: [Template, Chat]}
  - {name: FlakyStateful, provider: openai-responses, model: gpt-5, address: "FAKE_URL/v1", state: provider,
     max_retries: 0, fallbacks: [Chat]}
'''
SECRET = KEYS['a'][0]
TOOL = {'type': 'function', 'name': 'get_order', 'description': 'Look an order up',
        'parameters': {'type': 'object', 'properties': {'order_id': {'type': 'string'}}}}


@pytest.fixture(scope='module')
def gw():
    stack = GatewayStack(processes=1, extra_llm=EXTRA)
    yield stack
    stack.close()


@pytest.fixture
def fake(gw):
    gw.fake.clear()
    yield gw.fake
    gw.fake.clear_faults()


def paths(fake):
    return [r['path'] for r in fake.requests]


def test_a_response_fails_over_and_names_who_answered(gw, fake):
    fake.fail(500)
    answer = post(gw.url() + '/responses', SECRET, {'model': 'Flaky', 'input': 'my name is Ann'})
    assert answer.status_code == 200, answer.text
    assert answer.headers['x-llmconn-served-by'] == 'Chat'
    body = answer.json()
    check_response(body)
    assert body['model'] == 'Flaky' and body['metadata'] == {'llmconn_served_by': 'Chat'}
    assert paths(fake) == ['/v1/messages', '/v1/chat/completions']
    assert gw.record('a', body['id'])['provider_kind'] == 'openai'
    # The conversation goes on with the primary, which sees the fallback's turn.
    again = post(gw.url() + '/responses', SECRET, {'model': 'Flaky', 'input': 'what is my name?',
                                                   'previous_response_id': body['id']})
    assert again.headers['x-llmconn-served-by'] == 'Flaky' and again.json()['metadata'] == {}
    text = again.json()['output'][-1]['content'][0]['text']
    assert 'users: 2' in text and 'previous: my name is Ann' in text


def test_a_streamed_response_fails_over_before_its_first_event(gw, fake):
    fake.fail(503)
    answer = requests.post(gw.url() + '/responses', json={'model': 'Flaky', 'input': 'hello', 'stream': True},
                           headers={'Authorization': f'Bearer {SECRET}'}, stream=True, timeout=20)
    assert answer.headers['x-llmconn-served-by'] == 'Chat'
    events = [json.loads(data) for data in sse_data(answer)]
    check_stream(events)
    assert events[0]['response']['metadata'] == {'llmconn_served_by': 'Chat'}
    assert events[-1]['type'] == 'response.completed'
    assert events[-1]['response']['metadata'] == {'llmconn_served_by': 'Chat'}
    # Recorded by the pipeline before response.completed went out, as answered by the fallback.
    record = gw.record('a', events[0]['response']['id'])
    assert record['status'] == 'completed' and record['provider_kind'] == 'openai'
    assert record['metadata'] == {'llmconn_served_by': 'Chat'}


def test_a_chat_completion_fails_over_plain_and_streamed(gw, fake):
    fake.fail(429)
    answer = post(gw.url() + '/chat/completions', SECRET,
                  {'model': 'Flaky', 'messages': [{'role': 'user', 'content': 'hello'}]})
    assert answer.status_code == 200, answer.text
    assert answer.headers['x-llmconn-served-by'] == 'Chat'
    check_completion(answer.json())
    assert answer.json()['metadata'] == {'llmconn_served_by': 'Chat'}
    fake.fail(500)
    streamed = requests.post(gw.url() + '/chat/completions', headers={'Authorization': f'Bearer {SECRET}'},
                             json={'model': 'Flaky', 'stream': True,
                                   'messages': [{'role': 'user', 'content': 'hello'}]}, stream=True, timeout=20)
    assert streamed.headers['x-llmconn-served-by'] == 'Chat'
    chunks = [json.loads(data) for data in sse_data(streamed) if data != '[DONE]']
    for chunk in chunks:
        check_chunk(chunk)
    assert chunks[-1]['metadata'] == {'llmconn_served_by': 'Chat'}
    assert 'echo: hello' in ''.join(c['choices'][0]['delta'].get('content') or '' for c in chunks if c['choices'])


def test_a_refusal_does_not_fail_over(gw, fake):
    fake.fail(400)
    with pytest.raises(openai.BadRequestError) as refused:
        gw.client().responses.create(model='Flaky', input='hello')
    assert paths(fake) == ['/v1/messages']
    assert refused.value.response.headers['x-llmconn-served-by'] == 'Flaky'     # who refused: every answer says


def test_a_failure_no_fallback_answered_names_the_last_one_tried(gw, fake):
    fake.fail(500, count=2)
    for route in ('responses', 'chat'):
        with pytest.raises(openai.APIStatusError) as failed:
            if route == 'responses':
                gw.client().responses.create(model='Flaky', input='hello')
            else:
                gw.client().chat.completions.create(model='Flaky', messages=[{'role': 'user', 'content': 'hi'}])
        assert failed.value.status_code == 502
        assert failed.value.response.headers['x-llmconn-served-by'] == 'Chat', route
        fake.fail(500, count=2)


def test_a_fallback_the_capability_matrix_refuses_is_skipped(gw, fake):
    fake.fail(500)
    plain = post(gw.url() + '/responses', SECRET, {'model': 'FlakyTools', 'input': 'hello'})
    assert plain.headers['x-llmconn-served-by'] == 'Template'
    fake.fail(500)
    tools = post(gw.url() + '/responses', SECRET, {'model': 'FlakyTools', 'input': 'hello', 'tools': [TOOL]})
    assert tools.status_code == 200, tools.text
    assert tools.json()['metadata'] == {'llmconn_served_by': 'Chat'}        # the template takes no tools
    fake.fail(500)
    warm = post(gw.url() + '/responses', SECRET, {'model': 'FlakyTools', 'input': 'hello', 'temperature': 0.5})
    assert warm.json()['metadata'] == {'llmconn_served_by': 'Chat'}     # nor a temperature (its matrix says)
    assert fake.requests[-1]['body']['temperature'] == 0.5


def test_a_response_the_backend_keeps_does_not_fail_over(gw, fake):
    fake.fail(500)
    with pytest.raises(openai.APIStatusError) as info:
        gw.client().responses.create(model='FlakyStateful', input='hello')
    assert info.value.status_code == 502
    assert paths(fake) == ['/v1/responses']


def test_thinking_goes_back_only_to_the_backend_that_made_it(gw, fake):
    client = gw.client()
    first = client.responses.create(model='FlakyThinking', input='think: one')
    fake.fail(500)
    second = client.responses.create(model='FlakyThinking', input='think: two', previous_response_id=first.id)
    assert second.metadata == {'llmconn_served_by': 'Reasoner'}
    assert [item.type for item in second.output] == ['reasoning', 'message']
    sent = next(r['body'] for r in fake.requests if r['path'] == '/v1/responses')
    assert 'signature' not in json.dumps(sent) and 'thinking' not in json.dumps(sent['input'])
    third = client.responses.create(model='FlakyThinking', input='three', previous_response_id=second.id)
    assert 'users: 3' in third.output_text and not third.metadata      # the fake checked the signature
    claude = [r['body'] for r in fake.requests if r['path'] == '/v1/messages'][-1]
    said = [m['content'] for m in claude['messages'] if m['role'] == 'assistant']
    assert said[0][0]['type'] == 'thinking' and said[1] == second.output_text


def test_usage_and_metrics_count_the_answering_connection_and_the_failover(gw, fake):
    client = gw.client('b')
    fake.fail(500)
    client.chat.completions.create(model='Flaky', messages=[{'role': 'user', 'content': 'count me'}])
    chat = settled_usage(gw, ('key-b', 'Chat'), lambda counts: counts.get('calls') == 1)
    assert chat['calls'] == 1 and chat['input_tokens'] > 0 and 'errors' not in chat
    flaky = settled_usage(gw, ('key-b', 'Flaky'), lambda counts: counts.get('failovers') == 1)
    assert flaky == {'failovers': 1}
    metrics = requests.get(f'http://127.0.0.1:{gw.ports[0]}/metrics', timeout=10).text
    assert 'llmconn_failovers_total{connection="Flaky",fallback="Chat",reason="500"}' in metrics


def test_a_response_over_a_websocket_fails_over_and_names_who_answered(gw, fake):
    from test_gateway_websocket import response_events
    fake.fail(500)
    with gw.client().responses.connect() as conn:
        conn.response.create(model='Flaky', input='hello over a socket')
        events = response_events(conn)
        check_stream(events)
        assert events[0]['response']['metadata'] == {'llmconn_served_by': 'Chat'}
        assert events[-1]['type'] == 'response.completed'
        assert events[-1]['response']['metadata'] == {'llmconn_served_by': 'Chat'}
        conn.response.create(model='Flaky', input='and again', previous_response_id=events[-1]['response']['id'])
        again = response_events(conn)
    assert again[-1]['response']['metadata'] == {} and 'users: 2' in json.dumps(again[-1]['response']['output'])
    assert paths(fake) == ['/v1/messages', '/v1/chat/completions', '/v1/messages']


def test_when_every_connection_is_rate_limited_the_answer_waits_the_least(gw, fake):
    fake.fail(429, headers={'Retry-After': '40'})       # Flaky, the primary
    fake.fail(429, headers={'retry-after-ms': '12200'})     # Chat, its fallback
    answer = post(gw.url() + '/responses', SECRET, {'model': 'Flaky', 'input': 'hello'})
    assert answer.status_code == 429, answer.text
    assert answer.headers['Retry-After'] == '13' and answer.headers['x-llmconn-served-by'] == 'Chat'
    assert paths(fake) == ['/v1/messages', '/v1/chat/completions']
    fake.clear()
    fake.fail(429, headers={'Retry-After': '5'})
    fake.fail(429, headers={'Retry-After': '30'})
    answer = post(gw.url() + '/chat/completions', SECRET,
                  {'model': 'Flaky', 'messages': [{'role': 'user', 'content': 'hi'}]})
    assert answer.status_code == 429 and answer.headers['Retry-After'] == '5'
