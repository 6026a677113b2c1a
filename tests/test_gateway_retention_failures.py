"""Zero retention and ``store: false`` when the backend fails: a provider's error quoting the prompt leaves no text.

A provider's 400 often quotes what it refused (the field, the text). The
failure record of a response kept without retention holds an error code,
never that message; the client still gets the message in its answer.
"""

import json
import uuid

import openai
import pytest

from gateway_stack import KEYS, GatewayStack


@pytest.fixture(scope='module')
def gw():
    stack = GatewayStack(processes=1)
    yield stack
    stack.close()


def quoting(marker: str) -> dict:
    """Claude's 400 body, quoting the prompt as a real refusal may."""
    return {'type': 'error', 'error': {'type': 'invalid_request_error',
                                       'message': f'messages.0.content: cannot accept "{marker} the prompt"'}}


def records(gw) -> set:
    """The keys of the response records in the stack's Redis now."""
    return set(gw.redis.scan_iter(match='llmconn:gw:resp:*'))


def made_since(gw, tenant: str, since: set) -> list[dict]:
    """The response records of ``tenant`` made since ``since`` (the keys there were then)."""
    made = [json.loads(gw.redis.get(k)) for k in records(gw) - since]
    return [r for r in made if r['tenant'] == tenant]


@pytest.mark.parametrize('stream', [False, True], ids=['plain', 'streamed'])
@pytest.mark.parametrize('key, store', [('zero', True), ('a', False)], ids=['zero-retention', 'store-false'])
def test_a_failure_record_keeps_the_error_code_never_the_providers_message(gw, key, store, stream):
    marker, since = f'PROMPT-{uuid.uuid4().hex}', records(gw)
    gw.fake.fail(400, body=quoting(marker))
    with pytest.raises(openai.BadRequestError) as refused:
        gw.client(key).responses.create(model='Claude', input=f'{marker} the prompt', store=store, stream=stream)
    assert marker in refused.value.body['message']      # the caller is told what the provider said
    assert marker not in gw.redis_text()
    [record] = made_since(gw, KEYS[key][1], since)
    if not stream:      # a stream refused before its first event is recorded failed elsewhere (its own fix)
        assert record['status'] == 'failed' and record['error'] == {'code': 'server_error'}


def test_a_stored_failure_keeps_the_message_for_get(gw):
    marker, since = f'PROMPT-{uuid.uuid4().hex}', records(gw)
    gw.fake.fail(400, body=quoting(marker))
    with pytest.raises(openai.BadRequestError):
        gw.client('a').responses.create(model='Claude', input=f'{marker} the prompt')
    [record] = made_since(gw, 'tenant-a', since)
    assert record['status'] == 'failed' and marker in record['error']['message']
