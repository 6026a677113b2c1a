"""Claude extended thinking end to end: a real Redis, the fake provider over HTTP.

The fake signs every thinking block it hands out and refuses a replayed
block whose signature (or redacted ``data``) it did not make for exactly
that text, as Anthropic does. So a chat that keeps working over several
turns proves the blocks went back untouched, and the recorded request
bodies show where they went: in front of the assistant's text, only to the
model and thinking mode that made them.
"""

from __future__ import annotations

import json

import pytest
import yaml

from llmconn import ConfigError, InvalidInput, LLMError, Registry
from llmconn.store.keys import chat_keys

MODEL = 'claude-sonnet-5-5'
OTHER_MODEL = 'claude-haiku-5-5'
ENABLED = {'type': 'enabled', 'budget_tokens': 1024}




def conn_conf(name, provider_url, **fields):
    return {'name': name, 'provider': 'claude', 'model': MODEL, 'address': provider_url, 'max_retries': 0,
            'max_tokens': 2048, 'thinking': ENABLED, **fields}


@pytest.fixture
def make(redis_url, provider, unique, open_registry):
    def make(**fields):
        return open_registry({'redis': {'url': redis_url}, 'llm': [conn_conf(unique, provider.url, **fields)]})[unique]

    return make


@pytest.fixture
def reconfigure(redis_url, provider, unique, tmp_path):
    """A file-based registry, and a function that rewrites its connection and reloads it."""
    path = tmp_path / 'llm.yaml'
    state = {}

    def write(**fields):
        path.write_text(yaml.safe_dump({'redis': {'url': redis_url},
                                        'llm': [conn_conf(unique, provider.url, **fields)]}))
        if 'registry' in state:
            state['registry'].reload()
        else:
            state['registry'] = Registry.from_file(path)
        return state['registry'][unique]

    yield write
    if 'registry' in state:
        state['registry'].close()


def bodies(provider, marker):
    """Claude request bodies whose last user message is ``marker``."""
    return [r['body'] for r in provider.requests
            if r['path'] == '/v1/messages' and r['body']['messages'][-1]['content'] == marker]


def assistant_contents(body):
    return [m['content'] for m in body['messages'] if m['role'] == 'assistant']


def replayed(result):
    """What the assistant turn of ``result`` must look like when it is replayed with its blocks."""
    return result['raw']['content']


# ---- round trips


def test_thinking_goes_back_byte_for_byte_over_several_turns(make, provider):
    conn = make()
    first = conn.chat('think: one', chat_id='t')
    assert first['thinking'] == 'The user asked: one. I will echo it.'
    assert first['text'] == 'echo: think: one | users: 1 | previous: - | system: no'
    assert [b['type'] for b in first['raw']['content']] == ['thinking', 'text']
    second = conn.chat('think: two', chat_id='t')
    third = conn.chat('plain three', chat_id='t')
    assert 'thinking' not in third          # the fake thinks only when asked to
    fourth = conn.chat('four', chat_id='t')
    assert fourth['text'] == 'echo: four | users: 4 | previous: plain three | system: no'

    body = bodies(provider, 'four')[-1]
    assert body['thinking'] == ENABLED
    contents = assistant_contents(body)
    # Each thinking turn goes back as Claude made it: thinking block (signature and all), then the text.
    assert contents[:2] == [replayed(first), replayed(second)]
    for sent, made in zip(contents[:2], (first, second)):
        assert json.dumps(sent[0]) == json.dumps(made['raw']['content'][0])
        assert sent[0]['signature'] and sent[1] == {'type': 'text', 'text': made['text']}
    assert contents[2] == third['text']
    assert conn.history('t') == [
        {'role': 'user', 'content': 'think: one'}, {'role': 'assistant', 'content': first['text']},
        {'role': 'user', 'content': 'think: two'}, {'role': 'assistant', 'content': second['text']},
        {'role': 'user', 'content': 'plain three'}, {'role': 'assistant', 'content': third['text']},
        {'role': 'user', 'content': 'four'}, {'role': 'assistant', 'content': fourth['text']}]


def test_a_thinking_block_altered_in_the_store_is_refused_by_the_provider(make, redis_client):
    # The oracle's side of the round trip test: the fake does check what comes back.
    conn = make(lock_wait=0)
    conn.chat('think: secret', chat_id='alt')
    key = chat_keys(conn.name, 'alt').turns
    turn = json.loads(redis_client.lindex(key, 0))
    turn['i'][0]['native']['thinking'] += ' (edited)'
    redis_client.lset(key, 0, json.dumps(turn))
    with pytest.raises(LLMError) as info:
        conn.chat('next', chat_id='alt')
    assert info.value.status == 400 and 'signature' in str(info.value)
    assert len(conn.history('alt')) == 2
    assert not redis_client.exists(chat_keys(conn.name, 'alt').lock)


def test_redacted_thinking_round_trips(make, provider):
    conn = make()
    first = conn.chat('redact: hide this', chat_id='red')
    block = first['raw']['content'][0]
    assert block['type'] == 'redacted_thinking' and block['data']
    assert not first.get('thinking'), 'redacted thinking has no visible text'
    second = conn.chat('and now?', chat_id='red')
    assert 'users: 2 | previous: redact: hide this' in second['text']
    assert assistant_contents(bodies(provider, 'and now?')[-1]) == [replayed(first)]
    assert conn.history('red')[1] == {'role': 'assistant', 'content': first['text']}


def test_adaptive_thinking_is_sent_as_is_and_round_trips(make, provider):
    conn = make(thinking={'type': 'adaptive'})
    first = conn.chat('think: adapt', chat_id='ad')
    assert first['thinking']
    conn.chat('next', chat_id='ad')
    body = bodies(provider, 'next')[-1]
    assert body['thinking'] == {'type': 'adaptive'}
    assert assistant_contents(body) == [replayed(first)]


def test_window_trimming_drops_a_turns_blocks_with_it(make, provider):
    conn = make(max_history_turns=2)
    old = conn.chat('think: old', chat_id='win')
    kept = conn.chat('think: kept', chat_id='win')
    conn.chat('now', chat_id='win')
    body = bodies(provider, 'now')[-1]
    assert [m['content'] for m in body['messages'] if m['role'] == 'user'] == ['think: kept', 'now']
    assert assistant_contents(body) == [replayed(kept)]
    assert old['raw']['content'][0]['signature'] not in json.dumps(body)


# ---- only to the model and mode that made them


def test_after_a_model_change_old_turns_go_back_as_plain_text(reconfigure, provider):
    conn = reconfigure()
    first = conn.chat('think: one', chat_id='m')
    second = conn.chat('think: two', chat_id='m')

    conn = reconfigure(model=OTHER_MODEL)
    third = conn.chat('think: three', chat_id='m')
    assert third['thinking'] and 'users: 3' in third['text']
    body = bodies(provider, 'think: three')[-1]
    assert body['model'] == OTHER_MODEL
    assert assistant_contents(body) == [first['text'], second['text']]

    # Back on the first model, its own turns carry their blocks again; the other model's do not.
    conn = reconfigure()
    conn.chat('four', chat_id='m')
    assert assistant_contents(bodies(provider, 'four')[-1]) == [replayed(first), replayed(second), third['text']]


@pytest.mark.parametrize('thinking', [{'type': 'adaptive'}, None], ids=['adaptive', 'off'])
def test_after_a_thinking_mode_change_old_turns_go_back_as_plain_text(reconfigure, provider, thinking):
    conn = reconfigure()
    first = conn.chat('think: one', chat_id='mode')
    conn = reconfigure(thinking=thinking)
    second = conn.chat('two', chat_id='mode')
    assert 'users: 2 | previous: think: one' in second['text']
    body = bodies(provider, 'two')[-1]
    assert body.get('thinking') == thinking
    assert assistant_contents(body) == [first['text']]


# ---- streaming


def test_streamed_thinking_comes_before_the_text_and_its_blocks_replay(make, provider):
    conn = make()
    events = list(conn.stream('think: streamed', chat_id='st'))
    types = [e.type for e in events]
    assert types[-1] == 'done' and types.count('done') == 1
    thinking_count = types.count('thinking')
    assert thinking_count > 1 and types[:thinking_count] == ['thinking'] * thinking_count
    assert set(types[thinking_count:-1]) == {'text'}
    result = events[-1].result
    assert ''.join(e.text for e in events if e.type == 'thinking') == result['thinking']
    assert ''.join(e.text for e in events if e.type == 'text') == result['text']
    unstreamed = conn.invoke('think: streamed')
    assert (result['thinking'], result['text'], result['usage']) == \
           (unstreamed['thinking'], unstreamed['text'], unstreamed['usage'])
    # The signature was put together from signature_delta; the provider accepts it back.
    conn.chat('after the stream', chat_id='st')
    sent = assistant_contents(bodies(provider, 'after the stream')[-1])[0]
    assert sent == replayed(result) and sent[0]['signature'] == unstreamed['raw']['content'][0]['signature']


# ---- configuration


@pytest.mark.parametrize('fields, words', [
    ({'thinking': {'type': 'enabled', 'budget_tokens': 1000}}, 'at least 1024'),
    ({'thinking': {'type': 'enabled'}}, 'budget_tokens'),
    ({'thinking': {'type': 'enabled', 'budget_tokens': 2048}}, 'below max_tokens'),
    ({'thinking': {'type': 'adaptive', 'budget_tokens': 2000}}, 'budget_tokens'),
    ({'thinking': {'type': 'sometimes'}}, 'thinking.type'),
    ({'params': {'thinking': {'type': 'disabled'}}}, 'thinking'),
])
def test_bad_thinking_settings_are_refused_at_load(redis_url, unique, fields, words):
    with pytest.raises(ConfigError, match=words) as info:
        Registry.from_dict({'redis': {'url': redis_url}, 'llm': [conn_conf(unique, 'http://127.0.0.1:9', **fields)]})
    assert unique in str(info.value)


@pytest.mark.parametrize('kind', ['openai', 'gemini', 'openai-responses'])
def test_thinking_on_a_provider_without_it_is_a_config_error_naming_the_capability(redis_url, unique, kind):
    conf = conn_conf(unique, 'http://127.0.0.1:9', provider=kind, model='some-model')
    with pytest.raises(ConfigError, match='"thinking"') as info:
        Registry.from_dict({'redis': {'url': redis_url}, 'llm': [conf]})
    assert kind in str(info.value)


def test_thinking_as_a_call_param_is_invalid_input_before_any_request(make, provider):
    conn = make()
    provider.clear()
    with pytest.raises(InvalidInput, match='thinking'):
        conn.chat('hi', chat_id='p', thinking={'type': 'disabled'})
    assert provider.requests == []
