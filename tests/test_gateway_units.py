"""The gateway's parts without HTTP: keys, the capability matrix and its page, items, the stream normalizer."""

import hmac

import pytest
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from llmconn import config
from llmconn.errors import ConfigError, GatewayError
from llmconn.gateway import capabilities, docs, items, keys
from llmconn.gateway.capabilities import CHAT, KINDS, LOSSES, RESPONSES, ROUTES
from llmconn.gateway.policy import Policy, Resolution, resolve
from llmconn.gateway.stream import ResponseEvents
from llmconn.gateway.turns import to_conversation

SECRET = 'sk-gateway-secret-never-shown'


def gateway_config(**key):
    entry = {'id': 'k1', 'secret': SECRET, 'tenant': 't1', 'models': ['*'], **key}
    return {'llm': [{'name': 'A', 'model': 'claude-x'}], 'gateway': {'keys': [entry]}}


# ---- keys

def test_gateway_secrets_never_show_in_reprs():
    conf = config.load_dict(gateway_config())
    assert SECRET not in repr(conf) and SECRET not in str(conf.gateway)


@pytest.mark.parametrize('bad, message', [
    ({'secret': ''}, 'at least 8 characters'),
    ({'retention': 'forever'}, 'retention'),
    ({'models': ['Nope']}, 'name no connection'),
    ({'models': []}, 'models'),
    ({'colour': 'red'}, 'unknown key'),
])
def test_a_bad_gateway_key_fails_at_load_naming_the_field(bad, message):
    with pytest.raises(ConfigError) as failed:
        config.load_dict(gateway_config(**bad))
    assert message in str(failed.value) and SECRET not in str(failed.value)


def test_two_keys_with_one_secret_are_refused():
    data = gateway_config()
    data['gateway']['keys'].append(dict(data['gateway']['keys'][0], id='k2'))
    with pytest.raises(ConfigError, match='same secret'):
        config.load_dict(data)


def test_the_secret_comes_from_the_environment():
    conf = config.load_dict(gateway_config(secret='${GW_SECRET}'), environ={'GW_SECRET': SECRET})
    assert keys.find_key(conf.gateway, SECRET).id == 'k1'


def test_every_key_is_compared_even_when_the_first_matches(monkeypatch):
    conf = keys.GatewayConfig(keys=[keys.GatewayKey(id=f'k{i}', secret=f'secret-number-{i}', tenant='t',
                                                    models=['*']) for i in range(5)])
    calls = []
    real = hmac.compare_digest
    monkeypatch.setattr(keys.hmac, 'compare_digest', lambda a, b: calls.append(1) or real(a, b))
    assert keys.find_key(conf, 'secret-number-0').id == 'k0'
    assert len(calls) == 5
    calls.clear()
    with pytest.raises(GatewayError) as refused:
        keys.find_key(conf, 'nope')
    assert refused.value.status == 401 and len(calls) == 5


@pytest.mark.parametrize('header, token', [('Bearer abc', 'abc'), ('bearer  abc ', 'abc'), ('Basic abc', ''),
                                           ('', ''), ('Bearer', '')])
def test_bearer_token(header, token):
    assert keys.bearer_token(header) == token


# ---- the capability matrix

def test_the_compatibility_page_matches_the_matrix():
    page = docs.DOC.read_text(encoding='utf-8')
    assert docs.render(page) == page, 'docs/gateway.md is stale: run python -m llmconn.gateway.docs'


def test_every_field_covers_every_kind_and_names_only_known_losses():
    for route, fields in ROUTES.items():
        for name, spec in fields.items():
            assert set(spec.support) == set(KINDS), (route, name)
            for support in spec.support.values():
                assert not support.loss or support.loss in LOSSES, (route, name, support.loss)
                assert support.level in (capabilities.NATIVE, capabilities.EMULATED, capabilities.UNSUPPORTED)


def test_fields_map_to_each_backends_own_names():
    body = {'temperature': 0.2, 'max_output_tokens': 50}
    assert resolve(RESPONSES, 'gemini', body, Policy()).params == {
        'generationConfig': {'temperature': 0.2, 'maxOutputTokens': 50}}
    assert resolve(RESPONSES, 'claude', body, Policy()).params == {'temperature': 0.2, 'max_tokens': 50}
    chat = resolve(CHAT, 'openai-responses', {'response_format': {'type': 'json_schema', 'json_schema': {
        'name': 'x', 'schema': {'type': 'object'}}}}, Policy()).params
    assert chat == {'text': {'format': {'type': 'json_schema', 'name': 'x', 'schema': {'type': 'object'}}}}


def test_no_op_values_pass_everywhere():
    for kind in KINDS:
        assert resolve(CHAT, kind, {'n': 1, 'tool_choice': 'auto', 'logprobs': False, 'tools': []}, Policy()).params == {}


def test_a_reasoning_object_with_only_a_summary_sets_nothing_a_connection_decides():
    summary, effort = {'reasoning': {'summary': 'auto'}}, {'reasoning': {'effort': 'low', 'summary': 'auto'}}
    assert resolve(RESPONSES, 'openai-responses', summary, Policy()).params == summary
    assert resolve(RESPONSES, 'openai-responses', effort, Policy()).params == effort
    for kind in ('claude', 'gemini'):
        assert resolve(RESPONSES, kind, summary, Policy()).params == {}
        with pytest.raises(GatewayError, match=f'reasoning: not supported with a {kind} backend.*'
                                               'reasoning_settings_ignored'):
            resolve(RESPONSES, kind, effort, Policy())
    with pytest.raises(GatewayError, match='reasoning.summary: not supported with an openai backend'):
        resolve(RESPONSES, 'openai', summary, Policy())


def test_a_policy_naming_an_unknown_loss_is_refused():
    with pytest.raises(GatewayError, match='unknown loss'):
        Policy.parse({'allow_lossy': True, 'allowed_losses': ['everything']})
    with pytest.raises(GatewayError):
        Policy.parse({'allow_lossy': 'yes'})


def test_allowed_losses_count_only_with_allow_lossy():
    policy = Policy.parse({'allow_lossy': False, 'allowed_losses': ['no_logprobs']})
    with pytest.raises(GatewayError):
        resolve(RESPONSES, 'claude', {'top_logprobs': 3}, policy)


# ---- items

def test_unsupported_items_are_refused_naming_the_item():
    with pytest.raises(GatewayError) as refused:
        items.from_responses_input([{'role': 'user', 'content': 'x'},
                                    {'type': 'item_reference', 'id': 'msg_1'}])
    assert refused.value.param == 'input[1].type'
    with pytest.raises(GatewayError) as arguments:
        items.from_responses_input([{'type': 'function_call', 'call_id': 'c', 'name': 'f', 'arguments': '[1]'}])
    assert arguments.value.param == 'input[0].arguments'
    with pytest.raises(GatewayError) as audio:
        items.from_responses_input([{'role': 'user', 'content': [{'type': 'input_audio', 'input_audio': {}}]}])
    assert audio.value.param == 'input[0].content[0].type'
    with pytest.raises(GatewayError) as image:
        items.from_responses_input([{'role': 'user', 'content': [{'type': 'input_image', 'image_url': 'x'}]}])
    assert image.value.param == 'input[0].content[0].image_url' and 'http or https' in str(image.value)
    with pytest.raises(GatewayError) as not_user:
        items.from_responses_input([{'role': 'system', 'content': [{'type': 'input_image', 'image_url': 'x'}]}])
    assert not_user.value.param == 'input[0].content[0].type' and 'user messages only' in str(not_user.value)


def test_an_output_must_answer_a_call_of_the_assistant_before_it():
    user = items.message('user', 'look it up')
    call = items.function_call('call_1', 'get_order', '{"id": 1}', 'x')
    with pytest.raises(GatewayError) as unknown:
        to_conversation([user, call, items.function_output('call_2', 'x', 'y')], '', Policy(), Resolution())
    assert unknown.value.code == 'unknown_call_id' and 'call_2' in str(unknown.value)
    with pytest.raises(GatewayError) as twice:
        to_conversation([user, call, items.function_output('call_1', 'a', 'y'),
                               items.function_output('call_1', 'b', 'y')], '', Policy(), Resolution())
    assert twice.value.code == 'unknown_call_id'
    with pytest.raises(GatewayError) as unanswered:
        to_conversation([user, call, items.message('user', 'next')], '', Policy(), Resolution())
    assert unanswered.value.code == 'unanswered_function_call' and 'call_1' in str(unanswered.value)
    turn = to_conversation([user, call, items.function_output('call_1', 'ok', 'y')], '', Policy(),
                                 Resolution())
    assert turn.text == 'look it up' and [i['kind'] for i in turn.items] == ['call', 'output']


def test_a_lone_surrogate_is_refused():
    with pytest.raises(GatewayError, match='surrogate'):
        items.from_responses_input('bad \ud800 text')


def test_merging_and_hoisting_are_named_losses():
    conversation = [items.message('user', 'a'), items.message('user', 'b'), items.message('system', 's')]
    with pytest.raises(GatewayError, match='messages_merged'):
        to_conversation(conversation, '', Policy(), Resolution())
    policy = Policy.parse({'allow_lossy': True, 'allowed_losses': ['messages_merged', 'system_messages_hoisted']})
    resolution = Resolution()
    result = to_conversation(conversation, 'rules', policy, resolution)
    assert (result.system, result.turns, result.text) == ('rules\n\ns', (), 'a\n\nb')
    assert resolution.downgrades == ['input:messages_merged', 'input:system_messages_hoisted']


# ---- the stream normalizer

def test_interleaved_thinking_and_text_become_well_formed_items():
    events = ResponseEvents({'id': 'resp_x', 'status': 'in_progress'})
    out = events.start()
    for kind, delta in [('thinking', 'hm'), ('text', 'Hel'), ('thinking', 'again'), ('text', 'lo')]:
        out += events.feed(kind, delta)
    out += events.finish('Hello', {'id': 'resp_x', 'status': 'completed'})
    assert [i['type'] for i in events.output] == ['reasoning', 'message', 'reasoning', 'message']
    assert [e['sequence_number'] for e in out] == list(range(len(out)))
    adapter = TypeAdapter(ResponseStreamEvent)
    for event in out[2:-1]:
        adapter.validate_python(event)


def test_an_answer_without_deltas_still_has_its_message():
    events = ResponseEvents({'id': 'resp_x', 'status': 'in_progress'})
    events.start()
    out = events.finish('whole text', {'id': 'resp_x', 'status': 'incomplete'})
    assert out[-1]['type'] == 'response.incomplete'
    assert events.output[0]['content'][0]['text'] == 'whole text'


# ---- stop reasons (each provider's own hook)

@pytest.mark.parametrize('kind, raw, expected', [
    ('claude', {'stop_reason': 'max_tokens'}, ('incomplete', 'max_output_tokens')),
    ('claude', {'stop_reason': 'end_turn'}, ('completed', '')),
    ('openai', {'choices': [{'finish_reason': 'length'}]}, ('incomplete', 'max_output_tokens')),
    ('openai', {'choices': [{'finish_reason': 'stop'}]}, ('completed', '')),
    ('gemini', {'candidates': [{'finishReason': 'MAX_TOKENS'}]}, ('incomplete', 'max_output_tokens')),
    ('openai-responses', {'status': 'incomplete', 'incomplete_details': {'reason': 'max_output_tokens'}},
     ('incomplete', 'max_output_tokens')),
    ('openai-responses', {'status': 'completed'}, ('completed', '')),
    ('claude', None, ('completed', '')),
])
def test_a_cut_short_answer_is_incomplete_on_every_kind(kind, raw, expected):
    from tests.provider_helpers import make_provider
    assert make_provider(kind).finish(raw) == expected


# ---- the response records' Redis client

def test_a_burst_beyond_the_records_connections_waits_instead_of_failing(redis_url, unique):
    import threading

    import redis

    from llmconn.store import open_store
    from llmconn.store import records as mod_records

    store = open_store(redis_url)
    book = mod_records.RecordStore(store)
    assert isinstance(book._client.connection_pool, redis.BlockingConnectionPool)
    n = mod_records.MAX_CONNECTIONS + 50
    failures, start, ids = [], threading.Barrier(n), [mod_records.new_response_id() for _ in range(n)]

    def save(response_id):
        start.wait()
        try:
            book.save({'id': response_id, 'tenant': unique, 'key_id': 'k', 'model': 'm', 'status': 'completed',
                       'created_at': 0}, 5)
        except Exception as e:
            failures.append(e)

    threads = [threading.Thread(target=save, args=(i,)) for i in ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert all(book.get(unique, i)['id'] == i for i in ids)
    book.close()
    store.close()


def test_the_embedded_store_keeps_its_own_client():
    from llmconn.store import open_store
    from llmconn.store import records as mod_records

    store = open_store('memory://gateway-test')
    assert mod_records.burst_client(store) is store.client
    store.close()


def test_a_hostile_call_id_is_refused_without_echoing_it():
    for call_id in ('', 'x' * 10_000, 7, 'bad \ud800'):
        with pytest.raises(GatewayError) as refused:
            items.from_responses_input([{'type': 'function_call_output', 'call_id': call_id, 'output': 'o'}])
        assert refused.value.param == 'input[0].call_id' and len(str(refused.value)) < 300
