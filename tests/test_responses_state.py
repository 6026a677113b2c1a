"""OpenAI Responses state modes end to end: a real Redis, the fake provider over HTTP.

``state: local`` keeps the conversation here (``store: false``, the window
replayed, reasoning items carried by their encrypted content).
``state: provider`` lets the provider keep it (``previous_response_id``,
only the new input sent) but never lets the chain outgrow the window, and
falls back to the local copy when the provider has forgotten the chain.
The fake keeps its own store, so its ``users:`` count is what the model saw.
"""

from __future__ import annotations

import re

import pytest
import requests

from llmconn import ConfigError, LLMError, Registry
from llmconn.providers.openai_responses import forgot_previous as _forgot_previous

MODEL = 'gpt-5-mini'
REASONING = {'reasoning': {'effort': 'low', 'summary': 'auto'}}
ENCRYPTED = 'reasoning.encrypted_content'




@pytest.fixture
def make(redis_url, provider, unique, skills_dir, open_registry):
    def make(**fields):
        conf = {'name': unique, 'provider': 'openai-responses', 'model': MODEL, 'address': provider.url + '/v1',
                'max_retries': 0, **fields}
        return open_registry({'redis': {'url': redis_url}, 'skills_dir': str(skills_dir), 'llm': [conf]})[unique]

    return make


def bodies(provider, text):
    """Responses request bodies whose new user message is ``text``, oldest first."""
    return [r['body'] for r in provider.requests
            if r['path'] == '/v1/responses' and r['body']['input'][-1] == {'role': 'user', 'content': text}]


def users_seen(result) -> int:
    return int(re.search(r'users: (\d+)', result['text']).group(1))


def forget(provider, response_id):
    """Make the provider forget a stored response, as its retention or a restart would."""
    answer = requests.delete(f'{provider.url}/v1/responses/{response_id}', timeout=5)
    assert answer.status_code == 200, answer.text


# ---- state: local


def test_local_state_replays_the_window_stores_nothing_and_sends_the_skill_each_time(make, provider):
    conn = make()
    first = conn.chat('my name is Ann', chat_id='l', skill='terse')
    second = conn.chat('what is my name?', chat_id='l', skill='terse')
    assert second['text'] == 'echo: what is my name? | users: 2 | previous: my name is Ann | system: yes'
    for text in ('my name is Ann', 'what is my name?'):
        body = bodies(provider, text)[-1]
        assert body['store'] is False and 'previous_response_id' not in body
        assert 'SECRET-SAUCE' in body['instructions']
        assert 'include' not in body        # not a reasoning call: non-reasoning models refuse it
    assert bodies(provider, 'what is my name?')[-1]['input'] == [
        {'role': 'user', 'content': 'my name is Ann'}, {'role': 'assistant', 'content': first['text']},
        {'role': 'user', 'content': 'what is my name?'}]
    assert first['response_id'] not in provider.state.responses
    assert all('SECRET-SAUCE' not in m['content'] for m in conn.history('l'))


def test_local_state_replays_reasoning_items_by_their_encrypted_content(make, provider):
    conn = make(params=REASONING)
    first = conn.chat('think about Ann', chat_id='r')
    assert first['thinking'] == 'Reasoning about: think about Ann'
    assert bodies(provider, 'think about Ann')[-1]['include'] == [ENCRYPTED]
    output = first['raw']['output']
    assert [item['type'] for item in output] == ['reasoning', 'message'] and output[0]['encrypted_content']
    # Nothing was stored at the provider: only the encrypted content makes the item usable again.
    assert output[0]['id'] not in provider.state.items
    second = conn.chat('and then?', chat_id='r')
    assert 'users: 2 | previous: think about Ann' in second['text']
    assert bodies(provider, 'and then?')[-1]['input'] == [{'role': 'user', 'content': 'think about Ann'},
                                                          *output, {'role': 'user', 'content': 'and then?'}]
    assert conn.history('r')[1] == {'role': 'assistant', 'content': first['text']}


def test_local_state_streams_reasoning_before_text_and_replays_it(make, provider):
    conn = make(params=REASONING)
    events = list(conn.stream('think in a stream', chat_id='rs'))
    types = [e.type for e in events]
    thinking = types.count('thinking')
    assert thinking >= 1 and types[:thinking] == ['thinking'] * thinking
    assert set(types[thinking:-1]) == {'text'} and types[-1] == 'done'
    result = events[-1].result
    assert ''.join(e.text for e in events if e.type == 'thinking') == result['thinking']
    assert ''.join(e.text for e in events if e.type == 'text') == result['text']
    assert result['usage']['input_tokens'] > 0 and result['usage']['output_tokens'] > 0
    conn.chat('next', chat_id='rs')
    assert bodies(provider, 'next')[-1]['input'][1:3] == result['raw']['output']


# ---- state: provider


def test_provider_state_sends_only_the_new_input_after_the_previous_response(make, provider):
    conn = make(state='provider')
    first = conn.chat('one', chat_id='p', skill='terse')
    second = conn.chat('two', chat_id='p', skill='terse')
    third = conn.chat('three', chat_id='p', skill='terse')
    assert third['text'] == 'echo: three | users: 3 | previous: two | system: yes'
    one, two, three = (bodies(provider, t)[-1] for t in ('one', 'two', 'three'))
    assert one['store'] is True and 'previous_response_id' not in one
    assert two['previous_response_id'] == first['response_id'] and two['input'] == [{'role': 'user', 'content': 'two'}]
    assert three['previous_response_id'] == second['response_id']
    assert three['input'] == [{'role': 'user', 'content': 'three'}]
    # Instructions are not inherited along a chain, so every call carries the skill.
    assert all('SECRET-SAUCE' in body['instructions'] for body in (one, two, three))
    assert [m['content'] for m in conn.history('p') if m['role'] == 'user'] == ['one', 'two', 'three']


def test_provider_state_restarts_the_chain_so_the_window_stays_true(make, provider):
    conn = make(state='provider', max_history_turns=3)
    results = [conn.chat(f'w{i}', chat_id='win') for i in range(6)]
    sent = [bodies(provider, f'w{i}')[-1] for i in range(6)]
    assert [users_seen(r) for r in results] == [1, 2, 3, 3, 3, 3]
    # Two calls continue the chain; from then on it would carry a fourth turn, so each call starts afresh.
    assert ['previous_response_id' in body for body in sent] == [False, True, True, False, False, False]
    assert sent[3]['input'] == [{'role': 'user', 'content': 'w1'}, {'role': 'assistant', 'content': results[1]['text']},
                                {'role': 'user', 'content': 'w2'}, {'role': 'assistant', 'content': results[2]['text']},
                                {'role': 'user', 'content': 'w3'}]
    for i, result in enumerate(results[1:], 1):
        assert f'previous: w{i - 1} |' in result['text']


def test_provider_state_with_a_one_turn_window_never_chains(make, provider):
    conn = make(state='provider', max_history_turns=1)
    results = [conn.chat(f'solo{i}', chat_id='one') for i in range(3)]
    assert [users_seen(r) for r in results] == [1, 1, 1]
    assert not any('previous_response_id' in bodies(provider, f'solo{i}')[-1] for i in range(3))


def test_provider_state_reseeds_from_local_history_when_the_provider_forgot(make, provider):
    conn = make(state='provider')
    conn.chat('one', chat_id='f')
    second = conn.chat('two', chat_id='f')
    forget(provider, second['response_id'])
    third = conn.chat('three', chat_id='f')
    assert third['text'] == 'echo: three | users: 3 | previous: two | system: no'
    refused, reseeded = bodies(provider, 'three')
    assert refused['previous_response_id'] == second['response_id']
    assert 'previous_response_id' not in reseeded and len(reseeded['input']) == 5
    # The new chain goes on from the re-seeded response.
    fourth = conn.chat('four', chat_id='f')
    assert bodies(provider, 'four')[-1]['previous_response_id'] == third['response_id']
    assert 'users: 4 | previous: three' in fourth['text']


def test_provider_state_stream_reseeds_when_the_provider_forgot(make, provider):
    conn = make(state='provider')
    first = conn.chat('one', chat_id='fs')
    forget(provider, first['response_id'])
    events = list(conn.stream('two', chat_id='fs'))
    assert [e.type for e in events][-1] == 'done'
    assert events[-1].result['text'] == 'echo: two | users: 2 | previous: one | system: no'
    assert ''.join(e.text for e in events if e.type == 'text') == events[-1].result['text']
    assert conn.chat('three', chat_id='fs')['text'].startswith('echo: three | users: 3')
    assert bodies(provider, 'three')[-1]['previous_response_id'] == events[-1].result['response_id']


def test_provider_state_with_reasoning_reseeds_after_the_provider_forgot_everything(make, provider):
    conn = make(state='provider', params=REASONING)
    first = conn.chat('think: one', chat_id='fr')
    second = conn.chat('think: two', chat_id='fr')
    assert second['thinking'] and 'users: 2' in second['text']
    for result in (first, second):          # as after a provider restart: the chain and its items are gone
        forget(provider, result['response_id'])
    third = conn.chat('three', chat_id='fr')
    assert third['text'] == 'echo: three | users: 3 | previous: think: two | system: no'


def test_provider_state_with_reasoning_restarts_the_chain_with_its_stored_items(make, provider):
    conn = make(state='provider', params=REASONING, max_history_turns=2)
    results = [conn.chat(f'think: r{i}', chat_id='rw') for i in range(4)]
    assert [users_seen(r) for r in results] == [1, 2, 2, 2]
    # A fresh chain replays the last turn's whole output, which the provider still holds.
    assert bodies(provider, 'think: r3')[-1]['input'][1:3] == results[2]['raw']['output']


@pytest.mark.parametrize('body, forgot', [
    ({'error': {'message': "Previous response with id 'resp_1' not found.", 'type': 'invalid_request_error',
                'param': 'previous_response_id', 'code': 'previous_response_not_found'}}, True),
    ({'type': 'error', 'code': 'previous_response_not_found', 'message': 'not found', 'sequence_number': 2}, True),
    ({'error': {'message': "Previous response with id 'resp_1' not found.", 'type': 'invalid_request_error',
                'param': 'previous_response_id', 'code': None}}, True),
    ({'error': {'message': 'Rate limit reached', 'type': 'requests', 'param': None, 'code': 'rate_limit_exceeded'}},
     False),
    ('upstream said no', False),
    (None, False),
], ids=['http-error', 'stream-error-event', 'no-code', 'other-error', 'text', 'no-body'])
def test_what_counts_as_a_forgotten_previous_response(body, forgot):
    assert _forgot_previous(LLMError('x', status=400, provider_body=body)) is forgot


def test_provider_state_streamed_reply_continues_the_chain(make, provider):
    conn = make(state='provider')
    events = list(conn.stream('streamed', chat_id='sc'))
    response_id = events[-1].result['response_id']
    assert response_id in provider.state.responses
    assert 'users: 2' in conn.chat('after', chat_id='sc')['text']
    assert bodies(provider, 'after')[-1]['previous_response_id'] == response_id


# ---- configuration


@pytest.mark.parametrize('kind', ['claude', 'openai', 'gemini'])
def test_provider_state_on_a_stateless_provider_is_a_config_error(redis_url, unique, kind):
    conf = {'name': unique, 'provider': kind, 'model': 'some-model', 'state': 'provider'}
    with pytest.raises(ConfigError, match='"state"') as info:
        Registry.from_dict({'redis': {'url': redis_url}, 'llm': [conf]})
    assert kind in str(info.value) and unique in str(info.value)


def test_unknown_state_is_a_config_error(redis_url, unique):
    conf = {'name': unique, 'provider': 'openai-responses', 'model': MODEL, 'state': 'remote'}
    with pytest.raises(ConfigError, match='state'):
        Registry.from_dict({'redis': {'url': redis_url}, 'llm': [conf]})
