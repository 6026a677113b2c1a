"""Reasoning replay around tool calls, proven against the fake's enforcement of each provider's rules.

Each positive test runs a loop with reasoning on and asserts the fake
recorded no violation; each negative test breaks the replay on purpose and
shows the fake does refuse it, so the positive tests are not vacuous.
"""

from __future__ import annotations

import json

import pytest
import requests

from llmconn import items
from llmconn.providers.claude import _turn_messages
from llmconn.store.keys import chat_keys
from tests.tools_helpers import add, connection_config, get_order

THINKING = {'thinking': {'type': 'enabled', 'budget_tokens': 1024}, 'max_tokens': 2048}
REASONING = {'params': {'reasoning': {'effort': 'low', 'summary': 'auto'}}}


@pytest.fixture
def make(redis_url, provider, unique, open_registry):
    def make(kind, name=None, **conn):
        name = name or unique
        return open_registry(connection_config(redis_url, provider.url, name, kind, **conn))[name]
    return make


def bodies(provider):
    return [r['body'] for r in provider.requests]


def test_claude_thinking_loop_replays_thinking_before_tool_use(make, provider):
    conn = make('claude', **THINKING)
    reply = conn.chat('call get_order {"order_id": "123"}; call add {"a": 1}', chat_id='t', tools=[get_order, add])
    assert reply['text'] == 'tool said: shipped | 2'
    continued = bodies(provider)[1]['messages'][1]
    assert continued['role'] == 'assistant' and continued['content'][0]['type'] == 'thinking'
    assert [b['type'] for b in continued['content']] == ['thinking', 'tool_use', 'tool_use']
    conn.chat('call add {"a": 5}', chat_id='t', tools=[add])      # the stored turn replays too
    assert provider.violations == []


def test_claude_thinking_in_stream_loop(make, provider):
    conn = make('claude', **THINKING)
    events = list(conn.stream('call add {"a": 2, "b": 2}', chat_id='ts', tools=[add]))
    assert events[-1].result['text'] == 'tool said: 4'
    assert [e.type for e in events].count('thinking') >= 1
    assert provider.violations == []


def test_the_fake_refuses_a_continued_tool_use_without_its_thinking(provider):
    # The loop's second call with its thinking block left out: prove the fake notices.
    steps = [items.call('toolu_x', 'add', {'a': 1}), items.output('toolu_x', '2')]
    messages = _turn_messages('call add {"a": 1}', steps)
    body = {'model': 'claude-sonnet-5-5', 'max_tokens': 2048, 'messages': messages,
            'thinking': THINKING['thinking'], 'tools': [{'name': 'add', 'input_schema': {'type': 'object'}}]}
    answer = requests.post(provider.url + '/v1/messages', json=body, headers={'anthropic-version': '2023-06-01'})
    assert answer.status_code == 400 and 'Expected `thinking`' in answer.json()['error']['message']
    assert [v['rule'] for v in provider.violations] == ['claude: thinking before tool_use']


def test_claude_thinking_blocks_go_as_plain_calls_to_another_model(make, provider, unique):
    thinking = make('claude', name=unique + 'a', **THINKING)
    thinking.chat('call add {"a": 1}', chat_id='x', tools=[add])
    # Same chat store, another model: the thinking blocks stay home, the calls travel as plain items.
    plain = make('claude', name=unique + 'a', model='claude-haiku-5-5')
    provider.clear()
    plain.chat('next', chat_id='x', tools=[add])
    sent = bodies(provider)[0]['messages']
    assert [b['type'] for b in sent[1]['content']] == ['tool_use']
    assert provider.violations == []


def test_responses_local_state_sends_encrypted_reasoning_with_its_function_calls(make, provider):
    conn = make('openai-responses', **REASONING)
    reply = conn.chat('call get_order {"order_id": "456"}', chat_id='r', tools=[get_order])
    assert reply['text'] == 'tool said: lost'
    second = bodies(provider)[1]
    assert second['store'] is False and second['include'] == ['reasoning.encrypted_content']
    kinds = [i.get('type', 'message') for i in second['input']]
    assert kinds == ['message', 'reasoning', 'function_call', 'function_call_output']
    assert second['input'][1]['encrypted_content']
    conn.chat('call add {"a": 1}', chat_id='r', tools=[add])      # the stored turn replays its reasoning
    third = bodies(provider)[2]
    assert [i.get('type', 'message') for i in third['input']][:5] == [
        'message', 'reasoning', 'function_call', 'function_call_output', 'reasoning']
    assert provider.violations == []


def test_the_fake_refuses_a_function_call_without_its_reasoning(make, provider):
    conn = make('openai-responses', **REASONING)
    conn.chat('call add {"a": 1}', chat_id='r', tools=[add])
    second = bodies(provider)[1]
    second['input'] = [i for i in second['input'] if i.get('type') != 'reasoning']
    answer = requests.post(provider.url + '/v1/responses', json=second)
    assert answer.status_code == 400 and "without its required 'reasoning' item" in answer.json()['error']['message']
    assert [v['rule'] for v in provider.violations] == ['responses: reasoning before function_call']


def test_responses_provider_state_continues_the_chain_with_outputs_only(make, provider):
    conn = make('openai-responses', state='provider')
    reply = conn.chat('call add {"a": 3}', chat_id='c', tools=[add])
    assert reply['text'] == 'tool said: 4'
    first, second = bodies(provider)
    assert second['previous_response_id'] and [i['type'] for i in second['input']] == ['function_call_output']
    assert 'users: 2' in conn.chat('and?', chat_id='c', tools=[add])['text']
    assert 'previous_response_id' in bodies(provider)[2]
    assert provider.violations == []


def test_gemini_returns_each_thought_signature_with_its_function_call(make, provider):
    conn = make('gemini')
    reply = conn.chat('call get_order {"order_id": "123"}; call add {"a": 1}', chat_id='g', tools=[get_order, add])
    assert reply['text'] == 'tool said: shipped | 2'
    model, responses = bodies(provider)[1]['contents'][1:3]
    assert all(p['thoughtSignature'] for p in model['parts'])
    assert [p['functionResponse']['name'] for p in responses['parts']] == ['get_order', 'add']
    ids = [c['call_id'] for c in reply['tool_calls']]
    assert len(set(ids)) == 2 and ids == [c['call_id'] for c in conn.history('g')[1]['tool_calls']]
    assert provider.violations == []


def test_the_fake_refuses_a_gemini_call_without_its_signature(make, provider):
    conn = make('gemini')
    conn.chat('call add {"a": 1}', chat_id='g', tools=[add])
    second = bodies(provider)[1]
    del second['contents'][1]['parts'][0]['thoughtSignature']
    answer = requests.post(provider.url + '/v1beta/models/gemini-2.5-flash:generateContent', json=second)
    assert answer.status_code == 400 and 'thought_signature' in answer.json()['error']['message']
    assert [v['rule'] for v in provider.violations] == ['gemini: thought signature']


def test_a_turn_stored_before_items_existed_still_loads_and_replays(make, provider, redis_client):
    conn = make('claude')
    conn.chat('first', chat_id='old')
    key = chat_keys(conn.name, 'old').turns
    old = {'u': 'legacy', 'a': 'legacy answer', 'ts': 1.0}
    redis_client.rpush(key, json.dumps(old))
    provider.clear()
    reply = conn.chat('call add {"a": 1}', chat_id='old', tools=[add])
    assert reply['text'] == 'tool said: 2'
    sent = bodies(provider)[0]['messages']
    assert sent[2:4] == [{'role': 'user', 'content': 'legacy'}, {'role': 'assistant', 'content': 'legacy answer'}]
    assert conn.history('old')[3] == {'role': 'assistant', 'content': 'legacy answer'}
