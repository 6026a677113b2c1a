"""No silent drops: every field the ``openai`` SDK can send has a capability row, and each row does what it says.

The SDK's request TypedDicts (``ResponseCreateParams``, Chat
``CompletionCreateParams``, streaming and not) are read for their fields; a
field the matrix has no row for fails here, so a new SDK release cannot add
a field the gateway would drop unseen. Each row is then driven per backend
kind through :func:`llmconn.gateway.policy.resolve` with a sample value: a
native or emulated field is taken, an unsupported one is a 400 naming it,
or, when the request accepts its loss, dropped and reported. Over HTTP: the
parts of fields that used to vanish (``tools[].strict``,
``reasoning.summary``, ``text.verbosity``), and wrong-typed or out-of-range
values, refused before the provider is called.
"""

from __future__ import annotations

import typing

import openai
import pytest
from openai.types.chat import completion_create_params
from openai.types.responses import response_create_params

from conformance_checks import check_response, post
from gateway_stack import KEYS, ORDER_TOOL, GatewayStack
from llmconn.errors import GatewayError
from llmconn.gateway import shapes
from llmconn.gateway.capabilities import CHAT, KINDS, LOSSES, RESPONSES, ROUTES, UNSUPPORTED
from llmconn.gateway.policy import Policy, resolve

SDK_PARAMS = {
    RESPONSES: (response_create_params.ResponseCreateParamsNonStreaming,
                response_create_params.ResponseCreateParamsStreaming),
    CHAT: (completion_create_params.CompletionCreateParamsNonStreaming,
           completion_create_params.CompletionCreateParamsStreaming),
}
STRICT_TOOL = dict(ORDER_TOOL, strict=True)
CHAT_STRICT_TOOL = {'type': 'function', 'function': {k: v for k, v in STRICT_TOOL.items() if k != 'type'}}

# A value of each field that asks for something (not a no-op), as a body fragment.
SAMPLES = {
    RESPONSES: {
        'temperature': {'temperature': 0.5}, 'top_p': {'top_p': 0.5}, 'max_output_tokens': {'max_output_tokens': 99},
        'reasoning': {'reasoning': {'effort': 'low'}}, 'text': {'text': {'format': {'type': 'json_object'}}},
        'text.format.json_schema': {'text': {'format': {'type': 'json_schema', 'name': 'order', 'schema': {
            'type': 'object', 'properties': {'id': {'type': 'string'}}}}}},
        'truncation': {'truncation': 'auto'}, 'user': {'user': 'u-1'}, 'safety_identifier': {'safety_identifier': 's'},
        'prompt_cache_key': {'prompt_cache_key': 'k'}, 'service_tier': {'service_tier': 'flex'},
        'include': {'include': ['message.output_text.logprobs']}, 'top_logprobs': {'top_logprobs': 2},
        'background': {'background': True}, 'conversation': {'conversation': 'conv_1'},
        'prompt': {'prompt': {'id': 'pmpt_1'}}, 'tool_choice': {'tool_choice': 'required'},
        'parallel_tool_calls': {'parallel_tool_calls': False}, 'max_tool_calls': {'max_tool_calls': 3},
        'reasoning.summary': {'reasoning': {'summary': 'auto'}}, 'text.verbosity': {'text': {'verbosity': 'low'}},
        'tools[].strict': {'tools': [STRICT_TOOL]}, 'prompt_cache_options': {'prompt_cache_options': {'ttl': '30m'}},
        'prompt_cache_retention': {'prompt_cache_retention': '24h'},
        'access_programs': {'access_programs': {'cyber': 'standard'}},
        'image': {'image': {'context_compression': 'auto'}},
        'background_options': {'background_options': {'completion_window': '2h'}},
        'context_management': {'context_management': [{'type': 'compaction'}]},
        'moderation': {'moderation': {'model': 'omni-moderation-latest'}},
    },
    CHAT: {
        'store': {'store': True}, 'temperature': {'temperature': 0.5}, 'top_p': {'top_p': 0.5},
        'max_tokens': {'max_tokens': 99}, 'max_completion_tokens': {'max_completion_tokens': 99}, 'n': {'n': 2},
        'stop': {'stop': ['END']}, 'presence_penalty': {'presence_penalty': 0.5},
        'frequency_penalty': {'frequency_penalty': 0.5}, 'seed': {'seed': 7},
        'response_format': {'response_format': {'type': 'json_object'}}, 'reasoning_effort': {'reasoning_effort': 'low'},
        'response_format.json_schema': {'response_format': {'type': 'json_schema', 'json_schema': {
            'name': 'order', 'schema': {'type': 'object', 'properties': {'id': {'type': 'string'}}}}}},
        'user': {'user': 'u-1'}, 'safety_identifier': {'safety_identifier': 's'}, 'prompt_cache_key': {'prompt_cache_key': 'k'},
        'service_tier': {'service_tier': 'flex'}, 'logprobs': {'logprobs': True}, 'top_logprobs': {'top_logprobs': 2},
        'logit_bias': {'logit_bias': {'12': 1}}, 'modalities': {'modalities': ['text', 'audio']},
        'audio': {'audio': {'voice': 'alloy', 'format': 'mp3'}}, 'prediction': {'prediction': {'type': 'content',
                                                                                            'content': 'x'}},
        'web_search_options': {'web_search_options': {}}, 'functions': {'functions': [{'name': 'f'}]},
        'function_call': {'function_call': 'none'}, 'tool_choice': {'tool_choice': 'required'},
        'parallel_tool_calls': {'parallel_tool_calls': False}, 'verbosity': {'verbosity': 'low'},
        'tools[].strict': {'tools': [CHAT_STRICT_TOOL]}, 'prompt_cache_options': {'prompt_cache_options': {'ttl': '30m'}},
        'prompt_cache_retention': {'prompt_cache_retention': '24h'},
        'moderation': {'moderation': {'model': 'omni-moderation-latest'}},
    },
}
BASE = {RESPONSES: {'model': 'M', 'input': 'hi'}, CHAT: {'model': 'M', 'messages': [{'role': 'user', 'content': 'hi'}]}}


def sdk_fields(route: str) -> set[str]:
    """Every key of the SDK's request TypedDicts for ``route`` (both the streaming and the plain one)."""
    return {name for params in SDK_PARAMS[route] for name in typing.get_type_hints(params)}


@pytest.mark.parametrize('route', [RESPONSES, CHAT])
def test_every_sdk_request_field_has_a_row_for_every_backend_kind(route):
    fields = ROUTES[route]
    missing = sorted(sdk_fields(route) - set(fields))
    assert missing == [], f'{route}: no capability row for {missing}'
    for name, spec in fields.items():
        assert set(spec.support) == set(KINDS), (route, name)
        for kind, support in spec.support.items():
            assert support.loss in ('', *LOSSES), (route, name, kind)


def _rows(route: str):
    for name, spec in ROUTES[route].items():
        if not spec.structural or any(s.level == UNSUPPORTED for s in spec.support.values()):
            if name in ('model', 'input', 'messages', 'stream', 'tools'):
                continue        # the route's own (tools on a template: test_gateway_template)
            yield name, spec


@pytest.mark.parametrize('route', [RESPONSES, CHAT])
def test_every_row_has_a_sample_that_asks_for_something(route):
    rows = {name for name, _ in _rows(route)}
    assert rows - set(SAMPLES[route]) == set(), 'give each new row a sample value'
    for name, fragment in SAMPLES[route].items():
        shapes.check(route, dict(BASE[route], **fragment))         # a valid value of its type
        spec = ROUTES[route][name]
        value = spec.part_of(fragment) if spec.part_of else fragment[name]
        assert not spec.trivial(value), (route, name)


def _parent(route: str, name: str, kind: str, fragment: dict) -> str | None:
    """The field a part belongs to, when that field itself is refused on ``kind`` for this sample."""
    parent = name.partition('.')[0].partition('[')[0]
    spec = ROUTES[route].get(parent)
    if parent == name or spec is None or spec.support[kind].level != UNSUPPORTED or spec.trivial(fragment[parent]):
        return None
    return parent


@pytest.mark.parametrize('kind', KINDS)
@pytest.mark.parametrize('route', [RESPONSES, CHAT])
def test_each_row_is_taken_refused_or_dropped_as_it_says(route, kind):
    for name, fragment in SAMPLES[route].items():
        support = ROUTES[route][name].support[kind]
        parent = _parent(route, name, kind, fragment)
        refusing = [(field, ROUTES[route][field].support[kind]) for field in (parent, name)
                    if field and ROUTES[route][field].support[kind].level == UNSUPPORTED]
        if not refusing:
            resolution = resolve(route, kind, dict(fragment), Policy())
            assert resolution.downgrades == [], (route, kind, name)
            if support.to_params is not None:
                assert resolution.params, (route, kind, name, 'taken but nothing sent')
            continue
        with pytest.raises(GatewayError) as refused:
            resolve(route, kind, dict(fragment), Policy())
        assert refused.value.status == 400 and refused.value.param == refusing[0][0], (route, kind, name)
        allowed = Policy(True, frozenset(s.loss for _, s in refusing if s.loss))
        if not all(s.loss for _, s in refusing):        # a field no policy may drop (moderation, ...)
            with pytest.raises(GatewayError):
                resolve(route, kind, dict(fragment), allowed)
            continue
        resolution = resolve(route, kind, dict(fragment), allowed)
        assert resolution.downgrades == [f'{field}:{s.loss}' for field, s in refusing], (route, kind, name)


def test_the_shapes_allow_exactly_the_sdk_values():
    from openai.types.shared import ReasoningEffort
    from openai.types.shared_params import reasoning
    assert set(typing.get_args(shapes.Effort)) == set(typing.get_args(typing.get_args(ReasoningEffort)[0]))
    summary = typing.get_type_hints(reasoning.Reasoning)['summary']
    assert set(typing.get_args(shapes.Summary)) == set(typing.get_args(typing.get_args(summary)[0]))
    tier = typing.get_type_hints(completion_create_params.CompletionCreateParamsBase)['service_tier']
    assert set(typing.get_args(shapes.Tier)) == set(typing.get_args(typing.get_args(tier)[0]))


# ---- over HTTP, on the real gateway

@pytest.fixture(scope='module')
def gw():
    stack = GatewayStack(processes=1)
    yield stack
    stack.close()


SECRET = KEYS['a'][0]
LOSSY = {'allow_lossy': True}


def _create(gw, route: str = 'responses', **body):
    return post(f'{gw.url()}/{route}', SECRET, body)


@pytest.mark.parametrize('model, sent', [
    ('Responses', lambda body: body['tools'][0]['strict']),
    ('Chat', lambda body: body['tools'][0]['function']['strict']),
    ('Claude', lambda body: body['tools'][0]['strict']),
])
def test_tools_strict_reaches_every_backend_that_has_it(gw, model, sent):
    answer = _create(gw, model=model, input='hi', tools=[STRICT_TOOL])
    assert answer.status_code == 200, answer.text
    assert sent(gw.fake.requests[-1]['body']) is True
    assert check_response(answer.json()).tools[0].strict is True
    chat = _create(gw, 'chat/completions', model=model, messages=[{'role': 'user', 'content': 'hi'}],
                   tools=[CHAT_STRICT_TOOL])
    assert chat.status_code == 200, chat.text
    assert sent(gw.fake.requests[-1]['body']) is True


def test_tools_strict_on_gemini_asks_for_validated_function_calls(gw):
    answer = _create(gw, model='Gemini', input='hi', tools=[STRICT_TOOL])
    assert answer.status_code == 200, answer.text
    sent = gw.fake.requests[-1]['body']
    assert sent['toolConfig'] == {'functionCallingConfig': {'mode': 'VALIDATED'}}
    assert check_response(answer.json()).tools[0].strict is True
    _create(gw, model='Gemini', input='hi', tools=[ORDER_TOOL])
    assert 'toolConfig' not in gw.fake.requests[-1]['body']


def test_a_reasoning_summary_on_a_chat_completions_backend_is_refused_not_dropped(gw):
    refused = _create(gw, model='Chat', input='hi', reasoning={'effort': 'low', 'summary': 'auto'})
    assert refused.status_code == 400 and refused.json()['error']['param'] == 'reasoning.summary'
    answer = _create(gw, model='Chat', input='hi', reasoning={'effort': 'low', 'summary': 'auto'},
                     fallback_policy=dict(LOSSY, allowed_losses=['no_reasoning_summary']))
    assert answer.status_code == 200 and gw.fake.requests[-1]['body']['reasoning_effort'] == 'low'
    assert answer.json()['metadata']['llmconn_downgrades'] == 'reasoning.summary:no_reasoning_summary'
    assert answer.json()['reasoning'] == {'effort': 'low', 'summary': None}      # as it was sent


def test_text_verbosity_is_sent_where_the_backend_has_it_and_refused_where_not(gw):
    assert _create(gw, model='Chat', input='hi', text={'verbosity': 'high'}).status_code == 200
    assert gw.fake.requests[-1]['body']['verbosity'] == 'high'
    assert _create(gw, model='ResponsesLocal', input='hi', text={'verbosity': 'high'}).status_code == 200
    assert gw.fake.requests[-1]['body']['text']['verbosity'] == 'high'
    refused = _create(gw, model='Gemini', input='hi', text={'verbosity': 'high'})
    assert refused.status_code == 400 and refused.json()['error']['param'] == 'text.verbosity'


BAD = [
    ('responses', {'text': 'abc'}, 'text'),
    ('responses', {'reasoning': 'high'}, 'reasoning'),
    ('responses', {'temperature': 'hot'}, 'temperature'),
    ('responses', {'temperature': 2.5}, 'temperature'),
    ('responses', {'top_p': -1}, 'top_p'),
    ('responses', {'max_output_tokens': 15}, 'max_output_tokens'),
    ('chat/completions', {'max_tokens': 2 ** 40}, 'max_tokens'),
    ('responses', {'prompt_cache_key': 'k' * 65}, 'prompt_cache_key'),
    ('responses', {'text': {'format': {'type': 'json_schema', 'name': 'x'}}}, 'text.format.schema'),
    ('responses', {'reasoning': {'effort': 'extreme'}}, 'reasoning.effort'),
    ('responses', {'store': 'yes'}, 'store'),
    ('chat/completions', {'response_format': 'json'}, 'response_format'),
    ('chat/completions', {'modalities': 5}, 'modalities'),
    ('chat/completions', {'stop': 5}, 'stop'),
    ('chat/completions', {'stop': ['a', 5]}, 'stop[1]'),
    ('chat/completions', {'max_tokens': -5}, 'max_tokens'),
    ('chat/completions', {'n': 1.5}, 'n'),
    ('chat/completions', {'presence_penalty': 3}, 'presence_penalty'),
    ('chat/completions', {'logit_bias': {'7': 101}}, 'logit_bias'),
]


@pytest.mark.parametrize('route, fields, param', BAD)
def test_a_wrong_typed_or_out_of_range_field_is_a_400_naming_it_before_any_call(gw, route, fields, param):
    base = {'model': 'Chat', 'input': 'hi'} if route == 'responses' else \
        {'model': 'Chat', 'messages': [{'role': 'user', 'content': 'hi'}]}
    before = len(gw.fake.requests)
    answer = _create(gw, route, **base, **fields)
    assert answer.status_code == 400, answer.text
    error = answer.json()['error']
    assert error['param'] == param and error['type'] == 'invalid_request_error' and param in error['message']
    assert len(gw.fake.requests) == before


@pytest.mark.parametrize('number', ['NaN', 'Infinity', '-Infinity', '1e400'])
def test_numbers_json_does_not_have_are_refused(gw, number):
    import requests
    before = len(gw.fake.requests)
    for route, rest in (('responses', '"input": "hi"'), ('chat/completions', '"messages": [{"role": "user", '
                                                                               '"content": "hi"}]')):
        answer = requests.post(f'{gw.url()}/{route}', data=f'{{"model": "Chat", {rest}, "temperature": {number}}}',
                               headers={'Authorization': f'Bearer {SECRET}', 'Content-Type': 'application/json'},
                               timeout=10)
        assert answer.status_code == 400 and 'JSON' in answer.json()['error']['message'], answer.text
    assert len(gw.fake.requests) == before


def test_the_sdk_raises_its_own_error_for_a_bad_field(gw):
    with pytest.raises(openai.BadRequestError) as refused:
        gw.client().chat.completions.create(model='Chat', messages=[{'role': 'user', 'content': 'hi'}],
                                            temperature='hot')
    assert refused.value.body['param'] == 'temperature'
