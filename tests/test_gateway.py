"""The gateway over real HTTP: the ``openai`` SDK against two ``llmconn serve`` processes.

Every provider kind sits behind it (the fake provider speaking each wire
format), and every body is checked against the SDK's own pydantic types:
the SDK itself builds its objects without validating them.
"""

import uuid

import openai
import pytest
import requests
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from gateway_stack import (BACKENDS, GatewayStack, create, gateway_usage, quiet_usage, reasoning_params,
                           settled_usage)

STREAM_EVENT = TypeAdapter(ResponseStreamEvent)
TERMINAL = ('response.completed', 'response.incomplete', 'response.failed')


@pytest.fixture(scope='module')
def gw():
    stack = GatewayStack()
    yield stack
    stack.close()


@pytest.mark.parametrize('model', BACKENDS)
def test_basic_response_has_stable_ids_and_usage(gw, model):
    client = gw.client()
    response = create(client, model=model, input='hello there')
    assert response.id.startswith('resp_') and response.status == 'completed'
    assert response.output_text.startswith('echo: hello there')
    assert response.usage.input_tokens > 0 and response.usage.output_tokens > 0
    again = Response.model_validate(client.responses.with_raw_response.retrieve(response.id).http_response.json())
    assert again.id == response.id
    assert [i.id for i in again.output] == [i.id for i in response.output]
    assert again.output_text == response.output_text and again.usage == response.usage


@pytest.mark.parametrize('model', BACKENDS)
def test_previous_response_id_continues_within_the_tenant_only(gw, model):
    first = create(gw.client('a'), model=model, input='my name is Ann')
    second = create(gw.client('a', process=1), model=model, input='what is my name?', previous_response_id=first.id)
    assert 'users: 2' in second.output_text and 'previous: my name is Ann' in second.output_text
    assert second.previous_response_id == first.id
    with pytest.raises(openai.NotFoundError) as refused:
        gw.client('b').responses.create(model=model, input='steal it', previous_response_id=first.id)
    assert refused.value.body['code'] == 'previous_response_not_found'
    with pytest.raises(openai.NotFoundError):
        gw.client('b').responses.retrieve(first.id)


@pytest.mark.parametrize('model', BACKENDS)
def test_instructions_are_never_carried_over(gw, model):
    client = gw.client()
    first = create(client, model=model, input='hi', instructions='SECRET-RULE answer in French')
    assert first.output_text.endswith('system: yes') and first.instructions == 'SECRET-RULE answer in French'
    gw.fake.clear()
    second = create(client, model=model, input='and now?', previous_response_id=first.id)
    assert second.output_text.endswith('system: no') and second.instructions is None
    sent = gw.fake.requests[-1]['body']
    assert 'SECRET-RULE' not in str(sent)


def test_reasoning_replays_to_the_same_backend_in_gateway_mode(gw):
    """Claude's signed thinking blocks come back verbatim: the fake refuses altered ones."""
    client = gw.client()
    first = create(client, model='Claude', input='think: what is 2+2')
    assert [i.type for i in first.output] == ['reasoning', 'message']
    assert 'The user asked' in first.output[0].summary[0].text
    second = create(client, model='Claude', input='think: and 3+3', previous_response_id=first.id)
    assert 'users: 2' in second.output_text
    replayed = gw.fake.requests[-1]['body']['messages'][1]['content']
    assert replayed[0]['type'] == 'thinking' and replayed[0]['signature']


def test_delete_removes_the_state(gw):
    client = gw.client()
    first = create(client, model='Chat', input='remember this')
    assert client.responses.delete(first.id) is None
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model='Chat', input='more', previous_response_id=first.id)
    assert gw.record('a', first.id) is None


def test_record_attributes_usage_to_tenant_key_and_model(gw):
    response = create(gw.client('a', process=1), model='Gemini', input='count me')
    record = gw.record('a', response.id)
    assert (record['tenant'], record['key_id'], record['model']) == ('tenant-a', 'key-a', 'Gemini')
    assert record['usage']['input_tokens'] == response.usage.input_tokens
    assert record['store_mode'] == 'gateway' and record['status'] == 'completed'
    assert record['expires_at'] - record['created_at'] == pytest.approx(300)
    assert 0 < gw.redis.pttl(f'llmconn:gw:resp:{{{response.id}}}:' + record_key_tail(record)) <= 300_000


def record_key_tail(record):
    from llmconn.store.records import tenant_digest
    return tenant_digest(record['tenant'])


def test_responses_backend_keeps_the_state_itself(gw):
    client = gw.client()
    first = create(client, model='Responses', input='first')
    record = gw.record('a', first.id)
    assert record['store_mode'] == 'provider' and record['provider_response_id'].startswith('resp_')
    assert 'context' not in record
    gw.fake.clear()
    create(client, model='Responses', input='second', previous_response_id=first.id)
    sent = gw.fake.requests[-1]['body']
    assert sent['previous_response_id'] == record['provider_response_id']
    assert [m['content'] for m in sent['input']] == ['second']


# ---- streaming

def check_stream_order(events: list[dict]) -> None:
    """Numbered from 0 without gaps; created, in_progress; items opened and closed in order; one terminal."""
    assert [e['sequence_number'] for e in events] == list(range(len(events)))
    assert [e['type'] for e in events[:2]] == ['response.created', 'response.in_progress']
    assert events[-1]['type'] in TERMINAL and not any(e['type'] in TERMINAL for e in events[:-1])
    open_item, parts, deltas, seen = None, None, [], []
    for event in events[2:-1]:
        kind = event['type']
        if kind == 'response.output_item.added':
            assert open_item is None and event['output_index'] == len(seen)
            open_item = event['item']
        elif kind == 'response.output_item.done':
            assert open_item is not None and parts is None and event['item']['id'] == open_item['id']
            seen.append(event['item'])
            open_item = None
        elif kind.endswith('part.added'):
            assert open_item is not None and parts is None and event['item_id'] == open_item['id']
            parts, deltas = kind, []
        elif kind.endswith('.delta'):
            assert parts is not None and event['item_id'] == open_item['id']
            deltas.append(event['delta'])
        elif kind in ('response.output_text.done', 'response.reasoning_summary_text.done'):
            assert parts is not None and event['text'] == ''.join(deltas)
        elif kind.endswith('part.done'):
            assert parts is not None
            parts = None
        else:
            raise AssertionError(f'unexpected event {kind}')
    assert open_item is None
    final = events[-1]['response']
    assert [i['id'] for i in final['output']] == [i['id'] for i in seen]
    assert any(i['type'] == 'message' for i in seen)


@pytest.mark.parametrize('model', BACKENDS)
def test_stream_events_come_in_a_valid_order(gw, model):
    client = gw.client()
    events = []
    with client.responses.stream(model=model, input='think: tell me a story of seven words',
                                 **reasoning_params(model)) as stream:
        for event in stream:
            data = event.model_dump(mode='json', warnings=False)
            STREAM_EVENT.validate_python(data)
            events.append(data)
        final = stream.get_final_response()
    check_stream_order(events)
    assert final.status == 'completed' and final.output_text.startswith('echo: think: tell me')
    Response.model_validate(events[-1]['response'])
    if model in ('Claude', 'Responses', 'ResponsesLocal'):
        assert final.output[0].type == 'reasoning' and final.output[0].summary[0].text
    record = gw.record('a', final.id)
    assert record['status'] == 'completed' and record['usage']['output_tokens'] == final.usage.output_tokens


def test_a_streamed_response_can_be_continued_at_once_from_the_other_process(gw):
    with gw.client('a', 0).responses.stream(model='Chat', input='streamed first') as stream:
        final = stream.get_final_response()
    second = create(gw.client('a', 1), model='Chat', input='then', previous_response_id=final.id)
    assert 'previous: streamed first' in second.output_text


def test_a_provider_failure_mid_stream_ends_in_response_failed(gw):
    gw.fake.fail_stream('error')
    with gw.client().responses.stream(model='Chat', input='this will break') as stream:
        events = [e.model_dump(mode='json', warnings=False) for e in stream]
    check_stream_order(events)
    assert events[-1]['type'] == 'response.failed'
    assert gw.record('a', events[0]['response']['id'])['status'] == 'failed'


# ---- Chat Completions

@pytest.mark.parametrize('model', BACKENDS)
def test_chat_completions_plain_and_streamed(gw, model):
    client = gw.client()
    messages = [{'role': 'system', 'content': 'be brief'}, {'role': 'user', 'content': 'one'},
                {'role': 'assistant', 'content': 'ok'}, {'role': 'user', 'content': 'two'}]
    raw = client.chat.completions.with_raw_response.create(model=model, messages=messages)
    completion = ChatCompletion.model_validate(raw.http_response.json())
    assert completion.choices[0].message.content == 'echo: two | users: 2 | previous: one | system: yes'
    assert completion.usage.prompt_tokens > 0 and completion.choices[0].finish_reason == 'stop'
    chunks = list(client.chat.completions.create(model=model, messages=messages, stream=True,
                                                 stream_options={'include_usage': True}))
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk.model_dump(mode='json', warnings=False))
    text = ''.join(c.choices[0].delta.content or '' for c in chunks if c.choices)
    assert text == completion.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == completion.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == 'stop'
    unmetered = list(client.chat.completions.create(model=model, messages=messages, stream=True))
    assert all(c.usage is None for c in unmetered) and unmetered[-1].choices


@pytest.mark.parametrize('model', ['Chat', 'Responses'])
def test_chat_completions_are_not_stored(gw, model):
    before = set(gw.redis.scan_iter('llmconn:gw:resp:*'))
    gw.fake.clear()
    gw.client().chat.completions.create(model=model, messages=[{'role': 'user', 'content': 'stateless'}])
    assert set(gw.redis.scan_iter('llmconn:gw:resp:*')) == before
    assert gw.fake.requests[-1]['body'].get('store') in (None, False)   # nor by a backend that could


# ---- keys, tenants, isolation

def test_an_unknown_key_is_401_in_openai_shape(gw):
    with pytest.raises(openai.AuthenticationError) as refused:
        gw.client('sk-not-a-key-at-all').models.list()
    assert refused.value.body['code'] == 'invalid_api_key'
    assert 'sk-not-a-key' not in str(refused.value.body)


def test_a_model_the_key_may_not_use_is_404_as_if_absent(gw):
    client = gw.client('a_claude_only')
    assert [m.id for m in client.models.list()] == ['Claude']
    with pytest.raises(openai.NotFoundError) as hidden:
        client.responses.create(model='Chat', input='hi')
    with pytest.raises(openai.NotFoundError) as absent:
        client.responses.create(model='NoSuchModel', input='hi')
    assert hidden.value.body['code'] == absent.value.body['code'] == 'model_not_found'
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model='Gemini', messages=[{'role': 'user', 'content': 'hi'}])


def test_a_response_of_a_model_the_key_may_not_see_is_404(gw):
    response = create(gw.client('a'), model='Chat', input='tenant a, chat model')
    with pytest.raises(openai.NotFoundError):
        gw.client('a_claude_only').responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError):
        gw.client('a_claude_only').responses.create(model='Claude', input='x', previous_response_id=response.id)


def test_hostile_response_ids_are_404_without_touching_state(gw):
    client = gw.client()
    for bad in ('resp_' + 'x' * 48, '../../etc', 'resp_{tenant-a}', 'a' * 5000):
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(bad)


# ---- strict by default, lossy on request

def test_an_unsupported_field_is_refused_naming_it(gw):
    gw.fake.clear()
    with pytest.raises(openai.BadRequestError) as refused:
        gw.client().responses.create(model='Claude', input='hi', reasoning={'effort': 'high'})
    assert refused.value.body['param'] == 'reasoning' and 'reasoning_settings_ignored' in refused.value.message
    with pytest.raises(openai.BadRequestError) as tools:
        gw.client().responses.create(model='Chat', input='hi', tools=[
            {'type': 'function', 'name': 'not a name!', 'parameters': {'type': 'object', 'properties': {}}}])
    assert tools.value.body['param'] == 'tools[0].name' and 'not a name!' in tools.value.message
    with pytest.raises(openai.BadRequestError) as unknown:
        gw.client().responses.create(model='Chat', input='hi', extra_body={'frobnicate': 1})
    assert unknown.value.body['param'] == 'frobnicate'
    assert gw.fake.requests == []


def test_a_lossy_downgrade_is_marked_and_the_field_not_sent(gw):
    gw.fake.clear()
    policy = {'allow_lossy': True, 'allowed_losses': ['reasoning_settings_ignored']}
    response = create(gw.client(), model='Gemini', input='hi', reasoning={'effort': 'high'},
                      extra_body={'fallback_policy': policy}, metadata={'mine': 'kept'})
    assert response.metadata == {'mine': 'kept', 'llmconn_downgrades': 'reasoning:reasoning_settings_ignored'}
    assert 'reasoning' not in str(gw.fake.requests[-1]['body'])
    half = {'allow_lossy': True, 'allowed_losses': ['no_logprobs']}
    with pytest.raises(openai.BadRequestError):
        gw.client().responses.create(model='Gemini', input='hi', reasoning={'effort': 'high'},
                                     extra_body={'fallback_policy': half})


def test_chat_completions_downgrade_marker(gw):
    client = gw.client()
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model='Claude', messages=[{'role': 'user', 'content': 'x'}], seed=7)
    assert refused.value.body['param'] == 'seed'
    policy = {'allow_lossy': True, 'allowed_losses': ['sampling_params_ignored']}
    raw = client.chat.completions.with_raw_response.create(
        model='Claude', messages=[{'role': 'user', 'content': 'x'}], seed=7, extra_body={'fallback_policy': policy})
    assert raw.http_response.json()['metadata'] == {'llmconn_downgrades': 'seed:sampling_params_ignored'}


def test_an_unauthorised_hosted_tool_is_refused_before_dispatch(gw):
    gw.fake.clear()
    with pytest.raises(openai.BadRequestError) as refused:
        gw.client('a').responses.create(model='Responses', input='search', tools=[{'type': 'web_search'}])
    assert refused.value.body['code'] == 'hosted_tool_not_allowed'
    with pytest.raises(openai.BadRequestError) as pending:
        gw.client('a_search').responses.create(model='Responses', input='search', tools=[{'type': 'web_search'}])
    assert pending.value.body['param'] == 'tools'
    assert gw.fake.requests == []


# ---- retention

def test_zero_retention_and_store_false_leave_no_prompt_text_in_redis(gw):
    marker = f'ZMARK{uuid.uuid4().hex}'
    zero = gw.client('zero')
    plain = create(zero, model='Claude', input=f'{marker} plain', instructions=f'{marker} rules',
                   metadata={'note': marker})
    with zero.responses.stream(model='Gemini', input=f'{marker} streamed') as stream:
        streamed = stream.get_final_response()
    zero.chat.completions.create(model='Chat', messages=[{'role': 'user', 'content': f'{marker} chat'}])
    unstored = create(gw.client('a'), model='Chat', input=f'{marker} store false', store=False)
    assert marker in plain.output_text            # the answer itself is whole
    kept = create(gw.client('a'), model='Chat', input=f'KEPT{marker} standard')
    text = gw.redis_text()
    assert marker not in text.replace(f'KEPT{marker}', '')
    assert f'KEPT{marker}' in text                # the scan does see what a standard key stores
    assert gw.record('a', kept.id)['store_mode'] == 'gateway'
    record = gw.record('zero', plain.id)
    assert record['status'] == 'completed' and record['usage']['input_tokens'] > 0
    assert record['store_mode'] == 'none' and record['counts'] == {'input_items': 1, 'output_items': 1, 'function_calls': 0}
    assert gw.record('zero', streamed.id)['status'] == 'completed'
    assert gw.record('a', unstored.id)['store_mode'] == 'none'
    with pytest.raises(openai.BadRequestError) as refused:
        zero.responses.create(model='Claude', input='more', previous_response_id=plain.id)
    assert refused.value.body['code'] == 'previous_response_not_stored'
    with pytest.raises(openai.NotFoundError):
        gw.client('a').responses.retrieve(unstored.id)


def test_hostile_bodies_get_openai_shaped_400s(gw):
    import requests
    headers = {'Authorization': 'Bearer sk-gw-tenant-a-secret', 'Content-Type': 'application/json'}
    bodies = [b'not json', b'[1, 2]', b'{"model": ["Chat"], "input": "x"}', b'{"model": "Chat"}',
              b'{"model": "Chat", "input": [[[[]]]]}', b'{"model": "Chat", "input": "x", "stream": "yes"}',
              b'{"model": "Chat", "input": "x", "metadata": {"k": 1}}', b'{"model": "Chat", "input": "   "}',
              b'{"model": "Chat", "input": "\\ud800"}', b'{"model": "Chat", "input": []}',
              b'{"model": "Chat", "input": "x", "fallback_policy": "everything"}']
    gw.fake.clear()
    for body in bodies:
        for route in ('responses', 'chat/completions'):
            answer = requests.post(f'{gw.url()}/{route}', data=body, headers=headers, timeout=10)
            assert answer.status_code == 400, (route, body, answer.text)
            error = answer.json()['error']
            assert error['type'] == 'invalid_request_error' and error['message'], (route, body)
    assert gw.fake.requests == []
    assert requests.put(f'{gw.url()}/responses', headers=headers, timeout=10).status_code == 405


def test_another_tenant_cannot_delete_a_response(gw):
    response = create(gw.client('a'), model='Chat', input='mine')
    with pytest.raises(openai.NotFoundError):
        gw.client('b').responses.delete(response.id)
    assert gw.client('a').responses.retrieve(response.id).id == response.id


def test_a_provider_failure_is_recorded_and_counted(gw):
    before = quiet_usage(gw, ('key-b', 'Claude')).get('errors', 0)
    gw.fake.fail(500, count=1)
    with pytest.raises(openai.InternalServerError) as failed:
        gw.client('b').responses.create(model='Claude', input='this fails')
    assert failed.value.status_code == 502 and failed.value.body['code'] == 'backend_error'
    failed_ids = [k for k in gw.redis.scan_iter('llmconn:gw:resp:*')
                  if b'"status": "failed"' in gw.redis.get(k) and b'tenant-b' in gw.redis.get(k)]
    assert failed_ids
    usage = settled_usage(gw, ('key-b', 'Claude'), lambda u: u.get('errors', 0) > before)
    assert usage['errors'] == before + 1


def test_daily_usage_is_attributed_per_key_and_model_in_the_one_ledger(gw):
    before = quiet_usage(gw, ('key-b', 'Gemini'))
    other_key = gateway_usage(gw, ('key-a', 'Gemini'))       # quiet too: every process flushed meanwhile
    response = create(gw.client('b'), model='Gemini', input='one two three')
    completion = gw.client('b', process=1).chat.completions.create(
        model='Gemini', messages=[{'role': 'user', 'content': 'four five'}])
    after = settled_usage(gw, ('key-b', 'Gemini'),
                          lambda u: u.get('calls', 0) >= before.get('calls', 0) + 2)
    assert after['calls'] - before.get('calls', 0) == 2
    assert after['input_tokens'] - before.get('input_tokens', 0) == \
        response.usage.input_tokens + completion.usage.prompt_tokens
    assert after['output_tokens'] - before.get('output_tokens', 0) == \
        response.usage.output_tokens + completion.usage.completion_tokens
    assert gateway_usage(gw, ('key-a', 'Gemini')) == other_key      # another key's, of another tenant
    assert list(gw.redis.scan_iter('llmconn:gw:usage:*')) == []      # no second ledger


def test_gateway_calls_count_in_the_operations_usage_ledger_under_their_key(gw):
    import time

    from llmconn.store import open_store
    from llmconn.usage_report import read_usage

    create(gw.client('b'), model='Chat', input='ledger me')
    gw.client('b', process=1).chat.completions.create(model='Chat', messages=[{'role': 'user', 'content': 'me too'}])
    store = open_store(gw.redis_server.url)
    try:
        deadline = time.monotonic() + 15       # each process flushes its tally about every second
        while True:
            rows = [r for r in read_usage(store, connection='Chat') if r['key'] == 'key-b']
            if sum(r['calls'] for r in rows) >= 2 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    finally:
        store.close()
    assert sum(r['calls'] for r in rows) >= 2 and sum(r['input_tokens'] for r in rows) > 0
    assert rows[0]['model'] == 'gpt-4.1'


def gateway_raw(gw, data: bytes) -> bytes:
    """``data`` sent as is to the first process; everything it answers until it closes."""
    import socket
    port = gw.ports[0]
    with socket.create_connection(('127.0.0.1', port), timeout=10) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b''.join(chunks)


GATEWAY_HEAD = b'POST /v1/responses HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-gw-tenant-a-secret\r\n'


def test_deeply_nested_json_to_the_gateway_is_400_not_500(gw):
    body = b'{"model": "Chat", "input": ' + b'[' * 50000 + b']' * 50000 + b'}'
    answer = requests.post(f'{gw.url()}/responses', data=body, timeout=20,
                           headers={'Authorization': 'Bearer sk-gw-tenant-a-secret', 'Content-Type': 'application/json'})
    assert answer.status_code == 400 and 'nested' in answer.json()['error']['message']


@pytest.mark.parametrize('chunk', [b'zz\r\n', b'\r\n'])
def test_a_malformed_chunked_body_to_the_gateway_is_400_and_nothing_after_it_is_served(gw, chunk):
    smuggled = GATEWAY_HEAD + b'Content-Length: 2\r\n\r\n{}'
    answer = gateway_raw(gw, GATEWAY_HEAD + b'Transfer-Encoding: chunked\r\n\r\n' + chunk + smuggled)
    assert answer.startswith(b'HTTP/1.1 400') and answer.count(b'HTTP/1.1 ') == 1, answer
