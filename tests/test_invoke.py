"""invoke() and ping() over every wire format, configured only in YAML, and input checked first."""

from __future__ import annotations

import json
import logging

import pytest

from llmconn import InvalidInput, LLMAuthError, LLMError, Registry

SECRET = 'sk-invoke-test-secret-value'

PROVIDERS = {
    'claude': ('claude-sonnet-5-5', ''),
    'openai': ('gpt-4o-mini', '/v1'),
    'gemini': ('gemini-2.5-flash', '/v1beta'),
    'openai-responses': ('gpt-4.1-mini', '/v1'),
}


@pytest.fixture
def registry(tmp_path, provider, monkeypatch):
    skill = tmp_path / 'skills' / 'brief' / 'SKILL.md'
    skill.parent.mkdir(parents=True)
    skill.write_text('---\nname: brief\ndescription: be brief\n---\nAnswer in one line.\n')
    entries = ''.join(f'''
  - name: {name}
    provider: {name}
    model: {model}
    address: {provider.url}{suffix}
    secret: ${{INVOKE_TEST_KEY}}
    max_retries: 0
''' for name, (model, suffix) in PROVIDERS.items())
    path = tmp_path / 'llm.yaml'
    path.write_text(f'skills_dir: skills\nllm:{entries}')
    monkeypatch.setenv('INVOKE_TEST_KEY', SECRET)
    registry = Registry.from_file(path)
    yield registry
    registry.close()


@pytest.mark.parametrize('name', list(PROVIDERS))
def test_the_same_invoke_works_for_every_provider(registry, provider, name):
    result = registry[name].invoke('hello there', skill='brief')
    assert result['text'] == 'echo: hello there | users: 1 | previous: - | system: yes'
    assert result['usage']['input_tokens'] > 0 and result['usage']['output_tokens'] > 0
    assert isinstance(result['raw'], dict)
    sent = provider.requests[-1]
    assert SECRET in str(sent['headers'])           # the key went to the provider ...
    assert SECRET not in repr(result) and SECRET not in repr(registry[name]) and SECRET not in repr(registry)


@pytest.mark.parametrize('name', list(PROVIDERS))
def test_ping(registry, name):
    assert registry[name].ping() is True


@pytest.mark.parametrize('text, words', [
    (None, 'must be a str'), (b'bytes', 'must be a str'), ('', 'empty'), ('   ', 'empty'),
    ('x' * 1_000_001, 'more than the limit'),
])
def test_bad_text_is_refused_before_any_request(registry, provider, text, words):
    with pytest.raises(InvalidInput, match=words) as e:
        registry['claude'].invoke(text)
    assert isinstance(e.value, ValueError)
    assert provider.requests == []


@pytest.mark.parametrize('kwargs, words', [
    ({'chat_id': 42}, 'chat_id must be a str'), ({'chat_id': 'x' * 257}, '1 to 256'),
    ({'skill': '../etc'}, 'not valid'), ({'skill': 'missing'}, 'not found'),
    ({'temperature': object()}, 'JSON values'), ({'model': 'other'}, 'params may not set model'),
])
def test_bad_arguments_are_refused_before_any_request(registry, provider, kwargs, words):
    with pytest.raises(InvalidInput, match=words):
        registry['openai'].chat('hello', **kwargs)
    assert provider.requests == []


def test_params_are_merged_into_the_body(registry, provider):
    registry['openai'].invoke('hello', temperature=0.25, user='u-1')
    body = provider.requests[-1]['body']
    assert body['temperature'] == 0.25 and body['user'] == 'u-1'


def test_provider_errors_carry_status_and_body_and_no_secret(registry, provider, caplog):
    caplog.set_level(logging.DEBUG)
    provider.fail(401, count=1)
    with pytest.raises(LLMAuthError) as e:
        registry['claude'].invoke('hello')
    assert e.value.status == 401 and e.value.provider_body['type'] == 'error'
    provider.fail(400, count=1)
    with pytest.raises(LLMError) as e:
        registry['gemini'].invoke('hello')
    assert e.value.status == 400 and 'error' in e.value.provider_body
    assert SECRET not in caplog.text and SECRET not in str(e.value)


def test_ping_falls_back_to_a_question_when_the_server_has_no_model_list(server):
    completion = {'id': 'c1', 'object': 'chat.completion', 'created': 1, 'model': 'm',
                  'choices': [{'index': 0, 'finish_reason': 'stop',
                               'message': {'role': 'assistant', 'content': 'pong'}}]}
    server.script = [(404, {'content-type': 'application/json'}, b'{"detail": "Not Found"}'),
                     (200, {'content-type': 'application/json'}, json.dumps(completion).encode())]
    registry = Registry.from_dict({'llm': [{'name': 'gw', 'provider': 'openai', 'model': 'm',
                                            'address': server.url + '/v1', 'max_retries': 0}]})
    assert registry['gw'].ping() is True
    assert [path for path, _, _ in server.received] == ['/v1/models', '/v1/chat/completions']
    server.script = [(401, {}, b'{"error": {"message": "bad key"}}')]
    with pytest.raises(LLMAuthError):
        registry['gw'].ping()
    registry.close()
