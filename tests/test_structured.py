"""Structured output (SPEC §16): ``schema=`` sent natively on every provider, the answer parsed and validated.

Against the fake provider, which checks each API's format field as the real
one does (strict schemas, names, MIME type) and answers with a JSON document
made from the schema; ``answer: <text>`` and ``refuse: <words>`` make it say
something else. Bodies validate against the SDK request types.
"""

from __future__ import annotations

import json

import openai
import pydantic
import pytest
from anthropic.types.message_create_params import MessageCreateParamsNonStreaming, MessageCreateParamsStreaming
from openai.types.chat.completion_create_params import (CompletionCreateParamsNonStreaming,
                                                        CompletionCreateParamsStreaming)
from openai.types.responses.response_create_params import (ResponseCreateParamsNonStreaming,
                                                           ResponseCreateParamsStreaming)

from llmconn import InvalidInput, LLMError, StructuredOutputError
from llmconn import structured
from provider_helpers import assert_valid
from tests.tools_helpers import PROVIDERS, connection_config, get_order


class Line(pydantic.BaseModel):
    sku: str
    quantity: int


class Order(pydantic.BaseModel):
    order_id: str
    lines: list[Line]
    note: str | None = None


ORDER = Order(order_id='order_id', lines=[Line(sku='sku', quantity=1)], note='note')
POINT = {'title': 'point', 'type': 'object', 'properties': {'x': {'type': 'integer'}, 'y': {'type': 'integer'}},
         'required': ['x']}
SDK_TYPES = {'claude': (MessageCreateParamsNonStreaming, MessageCreateParamsStreaming),
             'openai': (CompletionCreateParamsNonStreaming, CompletionCreateParamsStreaming),
             'openai-responses': (ResponseCreateParamsNonStreaming, ResponseCreateParamsStreaming)}
REFUSING = ('claude', 'openai', 'openai-responses')      # Gemini has no refusal of its own


@pytest.fixture
def make(redis_url, provider, unique, open_registry):
    def make(kind, **conn):
        return open_registry(connection_config(redis_url, provider.url, unique, kind, **conn))[unique]
    return make


def native_schema(kind: str, body: dict) -> dict:
    """The schema a body asks the answer to follow, from its provider's own field."""
    if kind == 'openai':
        fmt = body['response_format']
        assert fmt['type'] == 'json_schema' and fmt['json_schema']['strict'] is True
        return fmt['json_schema']['schema']
    if kind == 'openai-responses':
        fmt = body['text']['format']
        assert fmt['type'] == 'json_schema' and fmt['strict'] is True and fmt['name']
        return fmt['schema']
    if kind == 'claude':
        assert body['output_config']['format']['type'] == 'json_schema'
        return body['output_config']['format']['schema']
    generation = body['generationConfig']
    assert generation['responseMimeType'] == 'application/json'
    return generation['responseJsonSchema']


def strings(value) -> list[str]:
    """Every string in a JSON value."""
    if isinstance(value, dict):
        return [s for v in value.values() for s in strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return [value] if isinstance(value, str) else []


def check_body(kind: str, body: dict) -> None:
    if kind in SDK_TYPES:
        assert_valid(SDK_TYPES[kind][bool(body.get('stream'))], body)


@pytest.mark.parametrize('kind', PROVIDERS)
def test_a_pydantic_schema_is_sent_natively_and_parsed_into_the_model(make, provider, kind):
    reply = make(kind).invoke('Extract the order', schema=Order)
    assert reply['parsed'] == ORDER and isinstance(reply['parsed'], Order)
    assert json.loads(reply['text']) == ORDER.model_dump()
    [request] = provider.requests
    check_body(kind, request['body'])
    sent = native_schema(kind, request['body'])
    assert sent['additionalProperties'] is False and sent['required'] == ['order_id', 'lines', 'note']
    assert sent['$defs']['Line']['additionalProperties'] is False
    assert provider.violations == []


@pytest.mark.parametrize('kind', PROVIDERS)
def test_a_dict_schema_gives_the_validated_dict_and_the_stream_done_carries_it(make, provider, kind):
    events = list(make(kind).stream('Where?', schema=POINT))
    assert [e.type for e in events].count('done') == 1 and events[-1].type == 'done'
    deltas = ''.join(e.text for e in events if e.type == 'text')
    assert events[-1].result['parsed'] == {'x': 1, 'y': 1} == json.loads(deltas)
    body = provider.requests[0]['body']
    check_body(kind, body)
    # The caller's dict is not changed; what is sent is its strict copy.
    assert 'additionalProperties' not in POINT and native_schema(kind, body)['required'] == ['x', 'y']


@pytest.mark.parametrize('kind', PROVIDERS)
def test_a_chat_stores_the_answer_text_and_sends_it_back_as_text(make, provider, kind):
    conn = make(kind)
    first = conn.chat('Extract the order', chat_id='c', schema=Order)
    conn.chat('And now?', chat_id='c')
    assert conn.history('c')[1] == {'role': 'assistant', 'content': first['text']}
    assert first['text'] in strings(provider.requests[1]['body'])
    assert 'parsed' not in conn.chat('Plain', chat_id='c')


@pytest.mark.parametrize('kind', PROVIDERS)
def test_an_answer_that_is_not_json_raises_with_its_text_and_saves_nothing(make, kind):
    conn = make(kind)
    with pytest.raises(StructuredOutputError, match='is not JSON') as caught:
        conn.chat('answer: sorry, no JSON today', chat_id='c', schema=Order)
    assert caught.value.text == 'sorry, no JSON today' and caught.value.refusal == ''
    assert isinstance(caught.value, LLMError) and caught.value.connection == conn.name
    assert conn.history('c') == []


@pytest.mark.parametrize('schema', [Order, {**POINT, 'properties': {'x': {'type': 'integer'}}}])
@pytest.mark.parametrize('kind', PROVIDERS)
def test_json_that_does_not_validate_raises_with_its_text(make, kind, schema):
    with pytest.raises(StructuredOutputError, match='does not validate') as caught:
        make(kind).invoke('answer: {"order_id": 7, "x": "seven"}', schema=schema)
    assert caught.value.text == '{"order_id": 7, "x": "seven"}'


@pytest.mark.parametrize('stream', [False, True])
@pytest.mark.parametrize('kind', REFUSING)
def test_a_refusal_raises_with_the_refusal(make, kind, stream):
    conn = make(kind)
    with pytest.raises(StructuredOutputError, match='refused') as caught:
        if stream:
            list(conn.stream('refuse: I will not read that', chat_id='r', schema=Order))
        else:
            conn.chat('refuse: I will not read that', chat_id='r', schema=Order)
    assert caught.value.refusal == 'I will not read that'
    assert conn.history('r') == []


@pytest.mark.parametrize('kind', PROVIDERS)
def test_with_tools_the_schema_applies_to_the_final_answer(make, provider, kind):
    reply = make(kind).chat('call get_order {"order_id": "123"}', chat_id='t', tools=[get_order], schema=Order)
    assert reply['rounds'] == 2 and reply['tool_calls'][0]['output'] == 'shipped'
    assert reply['parsed'] == ORDER
    for request in provider.requests:
        check_body(kind, request['body'])
        native_schema(kind, request['body'])       # every round asks for it; the model uses it to answer
    assert provider.violations == []


BAD_SCHEMAS = [
    ('a string', 'Order', 'pydantic model class or a JSON Schema dict'),
    ('not an object', {'type': 'array', 'items': {}}, '"type": "object"'),
    ('not JSON Schema', {'type': 'object', 'properties': {'a': {'type': 'nope'}}}, 'not a valid JSON Schema'),
    ('too deep', {'type': 'object', 'properties': {'a': {'type': 'object', 'properties': {
        'b': {'allOf': [{'allOf': [{'allOf': [{'allOf': [{'allOf': [{'allOf': [{'allOf': [{}]}]}]}]}]}]}]}}}}},
     'levels deep'),
    ('a remote $ref', {'type': 'object', 'properties': {'a': {'$ref': 'https://example.com/s.json'}}},
     'points outside'),
    ('not JSON', {'type': 'object', 'default': object()}, 'is not JSON'),
]


@pytest.mark.parametrize('what, schema, message', BAD_SCHEMAS, ids=[b[0] for b in BAD_SCHEMAS])
def test_a_bad_schema_is_refused_before_any_request(make, provider, what, schema, message):
    conn = make('openai')
    for call in (lambda: conn.invoke('x', schema=schema), lambda: conn.chat('x', chat_id='b', schema=schema),
                 lambda: conn.stream('x', chat_id='b', schema=schema)):
        with pytest.raises(InvalidInput, match=message):
            call()
    assert provider.requests == []


def test_a_provider_without_structured_output_refuses_the_schema(provider, open_registry, unique):
    conn = open_registry({'llm': [{'name': unique, 'provider': 'template', 'model': 'm', 'address': provider.url,
                                   'request_template': '{}', 'response_template': '{{ body }}'}]})[unique]
    with pytest.raises(InvalidInput, match='"structured"'):
        conn.invoke('x', schema=Order)
    assert provider.requests == []


def test_the_fake_refuses_a_schema_that_is_not_strict_as_openai_does(provider):
    client = openai.OpenAI(base_url=provider.url + '/v1', api_key='x', max_retries=0)
    loose = {'type': 'object', 'properties': {'x': {'type': 'integer'}}}
    with pytest.raises(openai.BadRequestError, match='additionalProperties'):
        client.chat.completions.create(model='gpt-4o-mini', messages=[{'role': 'user', 'content': 'x'}],
                                       response_format={'type': 'json_schema', 'json_schema': {
                                           'name': 'p', 'schema': loose, 'strict': True}})
    closed = dict(loose, additionalProperties=False)
    with pytest.raises(openai.BadRequestError, match="Missing 'x'"):
        client.responses.create(model='gpt-5', input='x', text={'format': {
            'type': 'json_schema', 'name': 'p', 'schema': closed, 'strict': True}})


def test_the_openai_sdk_parses_the_fakes_structured_answers(provider):
    client = openai.OpenAI(base_url=provider.url + '/v1', api_key='x', max_retries=0)
    completion = client.chat.completions.parse(model='gpt-4o-mini', response_format=Order,
                                               messages=[{'role': 'user', 'content': 'Extract'}])
    assert completion.choices[0].message.parsed == ORDER
    response = client.responses.parse(model='gpt-5', input='Extract', text_format=Order)
    assert response.output_parsed == ORDER
    refused = client.chat.completions.parse(model='gpt-4o-mini', response_format=Order,
                                            messages=[{'role': 'user', 'content': 'refuse: no'}])
    assert refused.choices[0].message.refusal == 'no' and refused.choices[0].message.parsed is None


def test_strict_closes_every_object_and_leaves_the_given_schema_alone():
    given = {'type': 'object', 'properties': {'a': {'type': 'array', 'items': {'type': 'object', 'properties': {
        'b': {'anyOf': [{'type': 'object', 'properties': {'c': {}}}, {'type': 'null'}]}}}}},
        'additionalProperties': True}
    made = structured.strict(given)
    inner = made['properties']['a']['items']
    assert made['additionalProperties'] is True and made['required'] == ['a']      # what the caller said stays
    assert inner['additionalProperties'] is False and inner['required'] == ['b']
    assert inner['properties']['b']['anyOf'][0] == {'type': 'object', 'properties': {'c': {}},
                                                    'additionalProperties': False, 'required': ['c']}
    assert 'required' not in given['properties']['a']['items']
