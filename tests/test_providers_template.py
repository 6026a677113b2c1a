"""The template mapping without HTTP: what the templates see, what they must render, what is refused.

End-to-end behaviour (the fake provider, Redis, several processes) is in
test_template_endpoints.py; the sandbox attacks are in test_template_sandbox.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmconn.config import load_dict
from llmconn.errors import ConfigError, LLMAuthError, LLMError, LLMRateLimited
from llmconn.providers.base import STREAM, SYSTEM
from llmconn.types import HTTPAnswer, Request, Turn

from provider_helpers import SECRET, make_provider

ROOT = Path(__file__).resolve().parent.parent
# Renders everything it sees, so a test can read the context from the body.
ECHO_CONTEXT = '{"messages": {{ input.messages | tojson }}, "model": {{ model_info.model_key | tojson }}, ' \
               '"kwargs": {{ kwargs | tojson }}}'
REPLY = '{"choices": [{"message": {"role": "assistant", "content": {{ (body | fromjson).text | tojson }}}}]}'


def template(request_template: str = ECHO_CONTEXT, response_template: str = REPLY, **fields):
    return make_provider('template', address='http://127.0.0.1:9/run', request_template=request_template,
                         response_template=response_template, **fields)


def answer(body, status: int = 200, headers: dict | None = None) -> HTTPAnswer:
    return HTTPAnswer(status, headers or {'content-type': 'application/json'},
                      body if isinstance(body, str) else json.dumps(body))


def load(base_dir='.', **fields):
    conn = {'name': 'Agent', 'provider': 'template', 'model': 'm', 'address': 'http://127.0.0.1:9/run',
            'request_template': '{}', 'response_template': REPLY, **fields}
    if 'request_template_file' in fields and 'request_template' not in fields:
        del conn['request_template']
    return load_dict({'llm': [{k: v for k, v in conn.items() if v is not None}]}, base_dir=base_dir)


# ---- what the request template sees


def test_request_template_sees_system_window_new_message_and_the_extras_of_each_answer():
    history = (Turn('one', 'first answer', meta={'response_id': 'resp_1', 'thread_id': 't'}),
               Turn('two', 'second answer', meta={'response_id': 'resp_2'}),
               Turn('three', 'plain answer'))
    body = template(params={'temperature': 0.5}).build_request(
        Request('four', system='be brief', history=history, params={'top_p': 0.9}))
    assert body == {'model': 'test-model', 'kwargs': {'temperature': 0.5, 'top_p': 0.9}, 'messages': [
        {'role': 'system', 'content': 'be brief'},
        {'role': 'user', 'content': 'one'},
        {'response_id': 'resp_1', 'thread_id': 't', 'role': 'assistant', 'content': 'first answer'},
        {'role': 'user', 'content': 'two'},
        {'response_id': 'resp_2', 'role': 'assistant', 'content': 'second answer'},
        {'role': 'user', 'content': 'three'},
        {'role': 'assistant', 'content': 'plain answer'},
        {'role': 'user', 'content': 'four'}]}


def test_extras_cannot_overwrite_what_was_said():
    history = (Turn('one', 'what was said', meta={'content': 'forged', 'role': 'user'}),)
    body = template().build_request(Request('two', history=history))
    assert body['messages'][1] == {'role': 'assistant', 'content': 'what was said'}


def test_request_template_sees_the_secret_and_headers_render_it_once():
    provider = template('{"key": {{ secret | tojson }}}', headers={'Authorization': 'Bearer {{ secret }}',
                                                                  'X-Model': '{{ model_info.model_key }}'})
    assert provider.build_request(Request('hi')) == {'key': SECRET}
    assert provider.headers() == {'content-type': 'application/json', 'authorization': f'Bearer {SECRET}',
                                  'x-model': 'test-model'}


def test_user_text_that_looks_like_a_template_is_sent_as_text_never_rendered():
    text = '{{ 7 * 7 }} {% for x in kwargs %}{{ x }}{% endfor %} {{ "".__class__ }}'
    assert template().build_request(Request(text))['messages'][-1]['content'] == text


def test_capabilities_no_stream_no_tools_and_a_url_that_is_the_address():
    provider = template(method='PUT')
    assert provider.capabilities == {SYSTEM} and STREAM not in provider.capabilities
    assert provider.url() == 'http://127.0.0.1:9/run' and provider.ping_url() == ''
    assert provider.raw_answers and provider.http_method == 'PUT'


# ---- what the response template sees and must render


def test_response_template_sees_body_status_and_headers_and_its_extras_are_kept():
    provider = template(response_template=(
        '{% set r = body | fromjson %}{"choices": [{"message": {"role": "assistant", "content": {{ r.text | tojson }}, '
        '"thread_id": {{ headers["x-thread"] | tojson }}, "status": {{ status_code }}}}], '
        '"usage": {"num_prompt_tokens": 3, "num_completion_tokens": 4, "num_cached_tokens": 2, '
        '"num_reasoning_tokens": 1}}'))
    reply = provider.parse_response(answer({'text': 'hello'}, 201, {'x-thread': 'th_9'}))
    assert (reply.text, reply.input_tokens, reply.output_tokens) == ('hello', 3, 4)
    assert reply.meta == {'thread_id': 'th_9', 'status': 201}
    assert reply.raw == {'text': 'hello'}
    assert reply.as_result() == {'text': 'hello', 'raw': {'text': 'hello'}, 'usage': {
        'input_tokens': 3, 'output_tokens': 4, 'cache_read_tokens': 2, 'cache_write_tokens': 0, 'reasoning_tokens': 1}}


def test_a_usage_detail_that_is_not_a_count_names_the_key():
    provider = template(response_template=(
        '{"choices": [{"message": {"role": "assistant", "content": "x"}}], '
        '"usage": {"num_prompt_tokens": 3, "num_completion_tokens": 4, "num_cached_tokens": "2"}}'))
    with pytest.raises(LLMError, match='num_cached_tokens as counts'):
        provider.parse_response(answer({'text': 'hello'}, 200, {}))


def test_usage_is_optional_and_a_body_that_is_not_json_is_raw_text():
    reply = template(response_template='{"choices": [{"message": {"content": {{ body | tojson }}}}]}') \
        .parse_response(answer('plain words'))
    assert (reply.text, reply.input_tokens, reply.output_tokens, reply.raw, reply.meta) == \
        ('plain words', 0, 0, 'plain words', {})


@pytest.mark.parametrize('rendered, missing', [
    ('not json at all', 'did not render JSON'),
    ('[1, 2]', '"choices" list'),
    ('{"choices": []}', '"choices" list'),
    ('{"choices": [{"text": "x"}]}', 'choices[0].message object'),
    ('{"choices": [{"message": {"role": "assistant"}}]}', 'choices[0].message.content string'),
    ('{"choices": [{"message": {"content": null}}]}', 'choices[0].message.content string'),
    ('{"choices": [{"message": {"role": "user", "content": "x"}}]}', 'role "assistant"'),
    ('{"choices": [{"message": {"content": "x"}}], "usage": {"num_prompt_tokens": 1}}', 'usage with'),
    ('{"choices": [{"message": {"content": "x"}}], "usage": {"num_prompt_tokens": -1, "num_completion_tokens": 1}}',
     'usage with'),
    ('{"choices": [{"message": {"content": "x"}}], "usage": {"num_prompt_tokens": "1", "num_completion_tokens": 1}}',
     'usage with'),
])
def test_a_reply_of_the_wrong_shape_is_an_llm_error_naming_the_template_and_what_is_missing(rendered, missing):
    with pytest.raises(LLMError) as caught:
        template(response_template=rendered).parse_response(answer({'text': 'x'}))
    assert 'response_template' in str(caught.value) and missing in str(caught.value)
    assert caught.value.provider_body == {'text': 'x'} and caught.value.status == 200


def test_extras_too_large_to_store_with_every_turn_are_refused():
    provider = template(response_template='{"choices": [{"message": {"content": "x", "blob": '
                                          '{{ ("a" * 70000) | tojson }}}}]}')
    with pytest.raises(LLMError, match='extra fields take more than'):
        provider.parse_response(answer({}))


@pytest.mark.parametrize('status, cls', [(400, LLMError), (401, LLMAuthError), (403, LLMAuthError),
                                         (429, LLMRateLimited), (500, LLMError)])
def test_an_error_the_template_reports_is_an_llm_error_with_the_status_and_the_body(status, cls):
    provider = template(response_template='{% if status_code != 200 %}{"error": "refused with {{ status_code }}"}'
                                          '{% else %}' + REPLY + '{% endif %}')
    body = {'error': {'message': f'bad key {SECRET}'}}
    with pytest.raises(cls) as caught:
        provider.parse_response(answer(body, status))
    error = caught.value
    assert type(error) is cls and error.status == status and error.connection == 'test template'
    assert f'refused with {status}' in str(error) and f'HTTP {status}' in str(error) and 'bad key' in str(error)
    assert SECRET not in str(error) and SECRET not in json.dumps(error.provider_body)


def test_a_template_that_ignores_the_status_fails_with_the_status_and_the_providers_words():
    with pytest.raises(LLMAuthError) as caught:
        template().parse_response(answer({'error': {'message': 'Incorrect API key'}}, 401))
    assert "has no attribute 'text'" in str(caught.value) and 'HTTP 401' in str(caught.value)
    assert 'Incorrect API key' in str(caught.value)


def test_a_render_that_is_not_json_names_the_template_and_masks_the_secret():
    with pytest.raises(LLMError) as caught:
        template('{"key": {{ secret }}}').build_request(Request('hi'))
    assert 'request_template did not render JSON' in str(caught.value)
    assert SECRET not in str(caught.value) and '***' in str(caught.value)


def test_a_failing_render_names_the_template_and_its_line():
    with pytest.raises(LLMError) as caught:
        template('{\n"a": 1,\n"b": {{ input.messages[0].response_id | tojson }}\n}').build_request(Request('hi'))
    assert "request_template line 3: 'dict object' has no attribute 'response_id'" in str(caught.value)
    with pytest.raises(LLMError, match='response_template line 2: fromjson: the text is not JSON'):
        template(response_template='\n{{ body | fromjson }}').parse_response(answer('<html>'))


def test_a_secret_a_failing_template_quotes_is_masked():
    with pytest.raises(LLMError) as caught:
        template('{{ (secret ~ "x") | int(secret) }}{{ nope[secret] }}').build_request(Request('hi'))
    assert SECRET not in str(caught.value)


# ---- configuration


def test_template_files_are_read_relative_to_the_configuration_file(tmp_path):
    (tmp_path / 'tpl').mkdir()
    (tmp_path / 'tpl' / 'req.j2').write_text('{"q": {{ input.messages[-1].content | tojson }}}')
    (tmp_path / 'tpl' / 'resp.j2').write_text(REPLY)
    (tmp_path / 'llm.yaml').write_text(
        'llm:\n  - {name: A, provider: template, model: m, address: "http://127.0.0.1:9/x",\n'
        '     request_template_file: tpl/req.j2, response_template_file: tpl/resp.j2}\n')
    from llmconn.config import load_file
    from llmconn.providers.template import TemplateProvider
    conf = load_file(tmp_path / 'llm.yaml').llm[0]
    assert TemplateProvider(conf).build_request(Request('hello')) == {'q': 'hello'}


def test_syntax_error_is_a_config_error_naming_connection_template_file_and_line(tmp_path):
    (tmp_path / 'bad.j2').write_text('{\n  "model": {{ model_info.model_key | tojson }},\n  {% if %}\n}')
    with pytest.raises(ConfigError) as caught:
        load(request_template_file='bad.j2', base_dir=tmp_path)
    assert str(caught.value).startswith('<dict>: connection "Agent": request_template (bad.j2) line 3: ')


@pytest.mark.parametrize('fields, words', [
    ({'response_template': '{{ body | nosuchfilter }}'}, 'response_template line 1: No filter named'),
    ({'response_template': '{% for x in y %}'}, 'response_template line 1: Unexpected end of template'),
    ({'request_template': '{{ 1 is nosuchtest }}'}, 'request_template line 1: No test named'),
    ({'request_template': '\n{% include "other" %}'}, 'request_template line 2: include is not available'),
    ({'request_template': '{% import "x" as y %}'}, 'import is not available'),
    ({'request_template': '{% from "x" import y %}'}, 'fromimport is not available'),
    ({'request_template': '{% extends "base" %}'}, 'extends is not available'),
    ({'headers': {'X-Key': '{{ secret'}}, 'headers.X-Key line 1'),
    ({'headers': {'Bad Name': 'x'}}, "'Bad Name' is not a valid header name"),
    ({'headers': {'X-A': 'a{{ "\\n" }}b'}}, 'renders a line break'),
    ({'headers': {'X-A': 'café'}}, 'renders non-ASCII text'),
    ({'headers': {'X-A': '{{ nope }}'}}, "headers.X-A line 1: 'nope' is undefined"),
    ({'address': ''}, 'field "address": provider template needs'),
    ({'response_template': ''}, 'needs response_template or response_template_file'),
    ({'request_template': '{}', 'request_template_file': 'x.j2'}, 'give request_template or request_template_file, not both'),
    ({'request_template': None, 'request_template_file': 'missing.j2'}, 'cannot read'),
    ({'method': 'DELETE'}, 'field "method"'),
    ({'state': 'provider'}, 'field "state"'),
    ({'thinking': {'type': 'adaptive'}}, 'does not support thinking'),
])
def test_bad_template_configuration_fails_at_load_naming_the_connection(fields, words):
    with pytest.raises(ConfigError) as caught:
        load(**fields)
    assert 'connection "Agent"' in str(caught.value) and words in str(caught.value)


def test_a_header_error_at_load_does_not_show_the_secret():
    with pytest.raises(ConfigError) as caught:
        load(secret=SECRET, headers={'X-A': '{{ secret }}{{ "\\n" }}'})
    assert SECRET not in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        load(secret=SECRET, headers={'X-A': '{{ secret | int(secret.nope) }}'})
    assert SECRET not in str(caught.value)


@pytest.mark.parametrize('key', ['request_template', 'response_template_file', 'headers', 'method'])
def test_template_keys_on_another_provider_are_refused_not_ignored(key):
    value = {'headers': {'X-A': 'b'}, 'method': 'PUT'}.get(key, 'x')
    with pytest.raises(ConfigError, match=f'field "{key}": only provider template reads it'):
        load_dict({'llm': [{'name': 'O', 'provider': 'openai', 'model': 'gpt-4o', key: value}]})


def test_a_template_file_that_is_not_text_or_too_big_is_refused(tmp_path):
    (tmp_path / 'bin.j2').write_bytes(b'\xff\xfe\x00')
    with pytest.raises(ConfigError, match='not UTF-8'):
        load(request_template_file='bin.j2', base_dir=tmp_path)
    (tmp_path / 'big.j2').write_bytes(b' ' * ((1 << 20) + 1))
    with pytest.raises(ConfigError, match='larger than'):
        load(request_template_file='big.j2', base_dir=tmp_path)


def test_the_stored_turn_keeps_extras_under_a_short_key_and_only_when_there_are_some():
    plain = Turn('u', 'a', ts=1.0)
    assert 'm' not in plain.to_dict() and Turn.from_dict(plain.to_dict()) == plain
    rich = Turn('u', 'a', ts=1.0, meta={'response_id': 'r', 'n': [1, {'x': None}]})
    assert rich.to_dict()['m'] == {'response_id': 'r', 'n': [1, {'x': None}]}
    assert Turn.from_dict(json.loads(json.dumps(rich.to_dict()))) == rich


def test_a_lone_surrogate_the_endpoint_escapes_never_reaches_the_store():
    provider = template(response_template='{% set r = body | fromjson %}{"choices": [{"message": '
                                          '{"content": {{ r.text | tojson }}, "id": {{ r.text | tojson }}}}]}')
    reply = provider.done(provider.parse_response(answer('{"text": "a\\ud800b"}')))
    assert reply.text == 'a\ufffdb' and reply.meta == {'id': 'a\ufffdb'}


def test_llmconn_check_reports_a_broken_template_with_its_file_and_line(tmp_path, capsys):
    from llmconn.cli import main
    (tmp_path / 'req.j2').write_text('{\n  "input": {{ input.messages | tojson }\n}')
    (tmp_path / 'llm.yaml').write_text(
        'llm:\n  - {name: Broken, provider: template, model: m, address: "http://127.0.0.1:9/x",\n'
        '     request_template_file: req.j2, response_template: "{}"}\n')
    assert main(['check', str(tmp_path / 'llm.yaml')]) == 1
    err = capsys.readouterr().err
    assert 'connection "Broken": request_template (req.j2) line 2:' in err
