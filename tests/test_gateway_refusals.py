"""What a client is told when the gateway cannot serve it: OpenAI's error shape, no operator advice.

Without ``gateway.keys`` the ``/v1/`` routes say so in the shape the
``openai`` SDK reads, naming ``gateway.keys``; a missing and a wrong key
get the same words. A backend's failure is a 502/504 saying what happened;
the advice meant for the operator ("check \\"address\\"", "check the
connection's secret") stays in the server log (SPEC §14).
"""

from __future__ import annotations

import json
import logging

import openai
import pytest
import requests

from conftest import free_port
from gateway_stack import GatewayStack
from llmconn.demo import start_server, stop
from llmconn.errors import LLMAuthError, LLMError, LLMTimeout
from llmconn.gateway import routes

ADVICE = ('check', 'address', 'secret', 'timeout')


@pytest.fixture(scope='module')
def plain_server(tmp_path_factory):
    """``llmconn serve`` with a connection but no gateway.keys."""
    tmp = tmp_path_factory.mktemp('no-gateway')
    (tmp / 'services').mkdir()
    config = tmp / 'llm.yaml'
    config.write_text('redis: {url: "memory://"}\nllm:\n  - {name: Chat, provider: openai, model: gpt-4.1, '
                      'address: "http://127.0.0.1:9/v1", max_retries: 0}\n')
    port = free_port()
    proc = start_server(config, tmp / 'services', port)
    yield f'http://127.0.0.1:{port}/v1'
    stop(proc)


def test_without_gateway_keys_the_sdk_shows_what_to_configure(plain_server):
    client = openai.OpenAI(base_url=plain_server, api_key='sk-anything', max_retries=0, timeout=10)
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.create(model='Chat', input='hi')
    assert 'gateway.keys' in str(missing.value) and missing.value.body['code'] == 'gateway_not_enabled'
    with pytest.raises(openai.NotFoundError) as listed:
        client.models.list()
    assert 'gateway.keys' in str(listed.value)


@pytest.fixture(scope='module')
def gw():
    dead = free_port()        # nothing listens there: the connection cannot reach its provider
    stack = GatewayStack(processes=1, extra_llm=f'''  - {{name: Dead, provider: openai, model: gpt-4.1,
     address: "http://127.0.0.1:{dead}/v1", max_retries: 0, timeout: 2}}''')
    yield stack
    stack.close()


def test_a_missing_and_a_wrong_key_get_the_same_answer(gw):
    body = {'model': 'Chat', 'input': 'hi'}
    missing = requests.post(f'{gw.url()}/responses', json=body, timeout=10)
    wrong = requests.post(f'{gw.url()}/responses', json=body, headers={'Authorization': 'Bearer sk-wrong'},
                          timeout=10)
    assert missing.status_code == wrong.status_code == 401
    assert missing.json() == wrong.json() and missing.json()['error']['code'] == 'invalid_api_key'


def test_a_backend_that_cannot_be_reached_is_a_502_without_operator_advice(gw):
    for route, body in (('responses', {'input': 'hi'}),
                        ('chat/completions', {'messages': [{'role': 'user', 'content': 'hi'}]})):
        with pytest.raises(openai.InternalServerError) as failed:
            gw.client().with_options(timeout=20).post(f'/{route}', body=dict(body, model='Dead'), cast_to=object)
        error = failed.value.body
        assert failed.value.status_code == 502 and error['code'] == 'backend_error'
        assert not any(word in error['message'].lower() for word in ADVICE), error['message']


def test_a_provider_error_is_a_502_without_operator_advice(gw):
    gw.fake.fail(503, count=1)
    with pytest.raises(openai.InternalServerError) as failed:
        gw.client().responses.create(model='Chat', input='hi')
    assert failed.value.status_code == 502 and failed.value.body['message'] == \
        'the backend failed to answer (HTTP 503); try again later'


@pytest.mark.parametrize('error, status', [
    (LLMError('Chat: cannot reach the provider (ConnectionError); check "address" and that the provider is up'),
     502),
    (LLMAuthError('Chat: provider answered HTTP 401 (check the connection\'s secret)', status=401), 502),
    (LLMTimeout('Chat: no answer from the provider within 2 s; raise "timeout" or check the provider'), 504),
])
def test_the_advice_goes_to_the_log_and_not_to_the_client(caplog, error, status):
    with caplog.at_level(logging.ERROR, logger='llmconn.gateway'):
        answer_status, _, body = routes.error(error, 'cid-1', 'POST /v1/responses')
    assert answer_status == status
    message = json.loads(b''.join(body))['error']['message']
    assert not any(word in message.lower() for word in ADVICE), message
    assert 'check' in caplog.text and 'cid-1' in caplog.text
