"""Template connections end to end: the shipped templates, the fake provider over HTTP, a real Redis.

The OpenAI Responses template against the fake's ``/v1/responses`` (which
keeps state for ``previous_response_id``, so its ``users:`` count is what the
model remembered), a stateless template against Chat Completions, the
session-agent template against a small agent server, and the conversation
memory evaluation.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from openai.types.chat.completion_create_params import CompletionCreateParamsNonStreaming
from openai.types.responses import ResponseInputItemParam
from openai.types.responses.response_create_params import ResponseCreateParamsNonStreaming

from llmconn.errors import InvalidInput, LLMAuthError, LLMError
from llmconn.testing import template_eval
from llmconn.testing.fake_server import FakeProviderServer

from provider_helpers import assert_valid
from session_agent import SessionAgent

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = ROOT / 'etc' / 'templates'
MODEL = 'gpt-5-mini'


def template_conf(name: str, adapter: str, address: str, **fields) -> dict:
    return {'name': name, 'provider': 'template', 'model': MODEL, 'address': address, 'max_retries': 0,
            'request_template_file': str(TEMPLATES / f'{adapter}.request.j2'),
            'response_template_file': str(TEMPLATES / f'{adapter}.response.j2'), **fields}


@pytest.fixture
def make(redis_url, unique, skills_dir, open_registry):
    def make(adapter: str, address: str, **fields):
        config = {'redis': {'url': redis_url}, 'skills_dir': str(skills_dir),
                  'llm': [template_conf(unique, adapter, address, **fields)]}
        return open_registry(config)[unique]

    return make


def bodies(provider, path: str) -> list[dict]:
    return [r['body'] for r in provider.requests if r['path'] == path]


def users_seen(result) -> int:
    return int(re.search(r'users: (\d+)', result['text']).group(1))


# ---- the OpenAI Responses template


def test_responses_template_sends_the_state_id_and_only_new_messages_in_sdk_valid_bodies(make, provider):
    conn = make('openai-responses', provider.url + '/v1/responses', params={'max_output_tokens': 256})
    texts = ['my name is Ann', 'what is 2+2?', 'what is my name?']
    replies = [conn.chat(text, chat_id='c', skill='terse') for text in texts]
    sent = bodies(provider, '/v1/responses')
    assert len(sent) == 3
    for body in sent:
        assert_valid(ResponseCreateParamsNonStreaming, body)
        for item in body['input']:
            assert_valid(ResponseInputItemParam, item)
        assert 'SECRET-SAUCE' in body['instructions'] and body['max_output_tokens'] == 256
    assert 'previous_response_id' not in sent[0]
    for turn in (1, 2):
        assert sent[turn]['previous_response_id'] == replies[turn - 1]['raw']['id']
        assert sent[turn]['input'] == [{'role': 'user', 'content': texts[turn]}]
    # The provider kept the conversation: it saw all three user messages, and the skill each time.
    assert replies[2]['text'] == 'echo: what is my name? | users: 3 | previous: what is 2+2? | system: yes'
    assert replies[2]['usage'] == {'input_tokens': replies[2]['raw']['usage']['input_tokens'],
                                   'output_tokens': replies[2]['raw']['usage']['output_tokens'], 'cache_read_tokens': 0, 'cache_write_tokens': 0, 'reasoning_tokens': 0}
    assert conn.history('c') == [m for text, reply in zip(texts, replies)
                                 for m in ({'role': 'user', 'content': text},
                                           {'role': 'assistant', 'content': reply['text']})]


def test_the_extras_are_stored_with_the_turn_in_redis(make, provider):
    conn = make('openai-responses', provider.url + '/v1/responses')
    reply = conn.chat('hello', chat_id='m')
    [turn] = conn.store.history(conn.name, 'm')
    assert turn.meta == {'response_id': reply['raw']['id']}
    assert conn.history('m')[1] == {'role': 'assistant', 'content': reply['text']}


def test_the_window_still_cuts_what_the_template_sees_and_the_chain_goes_on(make, provider):
    conn = make('openai-responses', provider.url + '/v1/responses', max_history_turns=2)
    replies = [conn.chat(f'turn {i}', chat_id='w') for i in range(1, 5)]
    sent = bodies(provider, '/v1/responses')
    assert sent[3]['previous_response_id'] == replies[2]['raw']['id']
    assert sent[3]['input'] == [{'role': 'user', 'content': 'turn 4'}]
    assert len(conn.history('w')) == 8


def test_a_refusal_is_the_reply_and_is_kept_beside_it(make, provider, monkeypatch):
    from llmconn.providers.template import TemplateProvider
    conn = make('openai-responses', provider.url + '/v1/responses')
    refusal = {'id': 'resp_r', 'output': [{'type': 'message', 'id': 'msg_1', 'role': 'assistant', 'status': 'completed',
                                           'content': [{'type': 'refusal', 'refusal': 'I cannot help with that.'}]}],
               'usage': {'input_tokens': 3, 'output_tokens': 6}}
    from llmconn.types import HTTPAnswer
    reply = TemplateProvider(conn.conf).parse_response(HTTPAnswer(200, {}, json.dumps(refusal)))
    assert reply.text == 'I cannot help with that.'
    assert reply.meta == {'response_id': 'resp_r', 'refusal': 'I cannot help with that.'}
    assert (reply.input_tokens, reply.output_tokens) == (3, 6)


def test_an_endpoint_error_saves_nothing_and_a_retried_one_is_seen_only_once(make, provider):
    conn = make('openai-responses', provider.url + '/v1/responses', max_retries=1)
    conn.chat('first', chat_id='e')
    provider.fail(500, count=2)
    with pytest.raises(LLMError) as caught:
        conn.chat('lost', chat_id='e')
    assert caught.value.status == 500 and 'HTTP 500' in str(caught.value)
    assert [m['content'] for m in conn.history('e')][::2] == ['first']
    provider.fail(503, count=1)                   # retried by the transport, then answered
    assert users_seen(conn.chat('second', chat_id='e')) == 2
    assert [m['content'] for m in conn.history('e')][::2] == ['first', 'second']


def test_a_forgotten_previous_response_restarts_the_chain_from_the_local_window(make, provider):
    import requests
    conn = make('openai-responses', provider.url + '/v1/responses')
    first = conn.chat('one', chat_id='f')
    assert requests.delete(f'{provider.url}/v1/responses/{first["raw"]["id"]}', timeout=5).status_code == 200
    second = conn.chat('two', chat_id='f')
    # The dead id was refused, then the window went again as plain messages, and a new chain began.
    refused, reseeded = bodies(provider, '/v1/responses')[1:]
    assert refused['previous_response_id'] == first['raw']['id']
    assert 'previous_response_id' not in reseeded and [m['content'] for m in reseeded['input']] == \
        ['one', first['text'], 'two']
    assert users_seen(second) == 2
    assert conn.store.history(conn.name, 'f')[-1].meta == {'response_id': second['raw']['id']}
    assert users_seen(conn.chat('three', chat_id='f')) == 3
    assert bodies(provider, '/v1/responses')[-1]['previous_response_id'] == second['raw']['id']


def test_template_syntax_in_what_users_and_providers_say_stays_text(make, provider):
    conn = make('openai-responses', provider.url + '/v1/responses')
    text = "{{ 7 * 7 }} {% raw %}{{ ''.__class__ }}{% endraw %} {{ secret }}"
    reply = conn.chat(text, chat_id='t')
    assert bodies(provider, '/v1/responses')[0]['input'] == [{'role': 'user', 'content': text}]
    assert reply['text'].startswith(f'echo: {text} | users: 1')
    assert conn.history('t')[0]['content'] == text


def test_stream_is_a_capability_error_before_any_request(make, provider):
    conn = make('openai-responses', provider.url + '/v1/responses')
    with pytest.raises(InvalidInput, match='does not support the capability "stream"'):
        conn.stream('hello', chat_id='s')
    assert provider.requests == []


def test_ping_asks_the_template_endpoint_a_question(make, provider):
    assert make('openai-responses', provider.url + '/v1/responses').ping() is True
    assert [r['path'] for r in provider.requests] == ['/v1/responses']


def test_headers_carry_the_secret_and_a_refused_key_is_an_auth_error_without_it(redis_url, open_registry, unique):
    with FakeProviderServer(api_key='sk-right-key-123') as fake:
        def conn(secret):
            return open_registry({'redis': {'url': redis_url}, 'llm': [template_conf(
                unique, 'openai-responses', fake.url + '/v1/responses', secret=secret,
                headers={'Authorization': 'Bearer {{ secret }}'})]})[unique]
        assert users_seen(conn('sk-right-key-123').chat('hi', chat_id='k')) == 1
        with pytest.raises(LLMAuthError) as caught:
            conn('sk-wrong-key-456').chat('hi', chat_id='k2')
    assert caught.value.status == 401 and 'sk-wrong-key-456' not in str(caught.value)
    assert 'sk-wrong-key-456' not in json.dumps(caught.value.provider_body)


def test_the_gateway_backend_calls_a_template_connection_whole_even_when_asked_to_stream(make, provider):
    from llmconn.gateway.backend import events
    from llmconn.gateway.items import Conversation
    from llmconn.types import Turn
    conn = make('chat-completions', provider.url + '/v1/chat/completions')
    conversation = Conversation(system='be brief', turns=(Turn('one', 'first'),), text='two')
    for stream in (False, True):
        out = list(events(conn, conversation, {}, stream))
        assert out[-1].type == 'done' and out[-1].result['text'] == 'echo: two | users: 2 | previous: one | system: yes'
    assert [e.type for e in out] == ['text', 'done']


# ---- a stateless template, the session agent


def test_a_stateless_template_sends_the_window_to_chat_completions(make, provider):
    conn = make('chat-completions', provider.url + '/v1/chat/completions', max_history_turns=2,
                params={'temperature': 0.2})
    replies = [conn.chat(text, chat_id='cc', skill='terse') for text in ('one', 'two', 'three')]
    sent = bodies(provider, '/v1/chat/completions')
    for body in sent:
        assert_valid(CompletionCreateParamsNonStreaming, body)
        assert body['messages'][0]['role'] == 'system' and body['temperature'] == 0.2
    # Window of 2 turns: the previous turn and the new message, nothing older.
    assert sent[2]['messages'][1:] == [{'role': 'user', 'content': 'two'},
                                       {'role': 'assistant', 'content': replies[1]['text']},
                                       {'role': 'user', 'content': 'three'}]
    assert replies[2]['text'] == 'echo: three | users: 2 | previous: two | system: yes'
    assert replies[2]['usage']['input_tokens'] > 0 and replies[2]['usage']['output_tokens'] > 0
    assert len(conn.history('cc')) == 6


@pytest.fixture
def agent():
    server = SessionAgent().start()
    yield server
    server.stop()


def test_the_session_agent_template_continues_the_agents_session(make, agent):
    conn = make('session-agent', agent.url + '/run')
    replies = [conn.chat(text, chat_id='a', skill='terse') for text in ('hello', 'again', 'recall: first?')]
    first, second, third = agent.received
    assert 'session_id' not in first and first['input'] == 'hello' and first['agent'] == MODEL
    session = replies[0]['raw']['session_id']
    assert second['session_id'] == third['session_id'] == session and third['input'] == 'recall: first?'
    assert replies[2]['text'].endswith('users: 3 | previous: again | system: yes | first: hello')
    assert [t.meta for t in conn.store.history(conn.name, 'a')] == [{'session_id': session}] * 3
    agent.sessions.clear()                    # the platform forgot the session: a new one starts
    assert conn.chat('lost', chat_id='a')['text'].startswith('echo: lost | users: 1')
    assert agent.received[-2]['session_id'] == session and 'session_id' not in agent.received[-1]
    assert conn.store.history(conn.name, 'a')[-1].meta['session_id'] != session
    assert len(conn.history('a')) == 8


# ---- across processes, the shipped configuration, the memory evaluation


def test_a_template_chat_continues_across_two_processes_on_a_real_redis(redis_url, provider, unique):
    config = {'redis': {'url': redis_url}, 'llm': [template_conf(unique, 'openai-responses',
                                                                 provider.url + '/v1/responses')]}
    worker = ROOT / 'tests' / 'chat_worker.py'

    def run(label: str, count: int) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, str(worker), json.dumps(config), 'shared', str(count), label],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    outputs = []
    for process in [run('a', 2)] + [run('b', 4), run('c', 4)]:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        outputs += out.splitlines()[:-1]
    # One chain, never forked: every call continued the turn saved just before it, whichever
    # process saved it, so the provider saw 1, 2, ... 10 user messages.
    assert sorted(int(re.search(r'users: (\d+)', line).group(1)) for line in outputs) == list(range(1, 11))
    sent = bodies(provider, '/v1/responses')
    assert sum('previous_response_id' not in body for body in sent) == 1
    assert all(len(body['input']) == 1 for body in sent)


def test_llmconn_check_loads_the_shipped_templates(capsys):
    from llmconn.cli import main
    assert main(['check', str(ROOT / 'etc' / 'llm.yaml')]) == 0
    listed = [line for line in capsys.readouterr().out.splitlines() if 'provider=template' in line]
    assert len(listed) == 3, listed


@pytest.mark.parametrize('name', ['Responses Template', 'Responses Simple'])
def test_the_shipped_connections_hold_a_conversation_against_the_fake(provider, name, monkeypatch, capsys):
    monkeypatch.setenv('OPENAI_BASE_URL', f'{provider.url}/v1')
    monkeypatch.setenv('OPENAI_API_KEY', 'sk-fake')
    assert template_eval.main(['--config', str(ROOT / 'etc' / 'llm.yaml'), '--name', name]) == 0
    assert capsys.readouterr().out.count('PASS') == 5
    assert all(r['headers'].get('authorization') == 'Bearer sk-fake' for r in provider.requests)


def test_the_memory_evaluation_passes_for_the_shipped_stateful_templates():
    for adapter in ('openai-responses', 'responses-simple'):
        checks = template_eval.against_fake(adapter=adapter)
        assert all(check.passed for check in checks), [str(c) for c in checks]
        assert len(checks) == 5


def test_the_memory_evaluation_catches_a_template_that_drops_the_state(tmp_path):
    shutil.copy(TEMPLATES / 'openai-responses.response.j2', tmp_path / 'forgetful.response.j2')
    (tmp_path / 'forgetful.request.j2').write_text(
        '{"model": {{ model_info.model_key | tojson }}, "input": [{"role": "user", '
        '"content": {{ input.messages[-1].content | tojson }}}]}')
    failed = {c.name for c in template_eval.against_fake(tmp_path, 'forgetful') if not c.passed}
    assert failed == {'turn 2 continues turn 1 with only the new message',
                      'turn 3 continues turn 2 with only the new message', 'turn 3 recalls turn 1'}


def test_the_memory_evaluation_command_exits_zero_and_prints_its_checks():
    done = subprocess.run([sys.executable, '-m', 'llmconn.testing.template_eval'], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count('PASS') == 5 and 'FAIL' not in done.stdout


def test_editing_a_template_file_reloads_the_configuration(tmp_path, provider):
    from llmconn.host import ConfigWatch
    from llmconn.registry import Registry
    for name in ('chat-completions.request.j2', 'chat-completions.response.j2'):
        shutil.copy(TEMPLATES / name, tmp_path / name)
    (tmp_path / 'llm.yaml').write_text(
        f'llm:\n  - {{name: T, provider: template, model: m, max_retries: 0,\n'
        f'     address: "{provider.url}/v1/chat/completions",\n'
        f'     request_template_file: chat-completions.request.j2,\n'
        f'     response_template_file: chat-completions.response.j2}}\n')
    registry = Registry.from_file(tmp_path / 'llm.yaml')
    try:
        watch = ConfigWatch(registry, tmp_path / 'llm.yaml')
        assert registry['T'].invoke('hi')['text'].startswith('echo: hi')
        response = tmp_path / 'chat-completions.response.j2'
        response.write_text('{"choices": [{"message": {"content": "edited"}}]}')
        watch.scan()
        watch.scan()                    # a change is taken once it has settled
        assert registry['T'].invoke('hi')['text'] == 'edited'
        response.write_text('{% if %}')
        watch.scan()
        watch.scan()
        assert 'chat-completions.response.j2) line 1' in watch.status()['last_error']
        assert registry['T'].invoke('hi')['text'] == 'edited'     # the last good one keeps serving
    finally:
        registry.close()


def test_the_memory_evaluation_refuses_a_connection_that_is_not_a_template(capsys):
    assert template_eval.main(['--config', str(ROOT / 'etc' / 'llm.yaml'), '--name', 'My Responses']) == 1
    assert 'is provider openai-responses' in capsys.readouterr().err
