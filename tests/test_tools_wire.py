"""Tool bodies and tool-call streams against the official SDK types (Gemini: its documented shapes).

Every body a tool loop sends - definitions, calls, results, reasoning
around them - validates against the ``anthropic`` / ``openai`` request
types; the SDKs' own stream accumulators parse the fake's tool-call streams
into the calls we sent for, which is what proves the fake streams like the
real APIs.
"""

from __future__ import annotations

import json

import anthropic
import openai
import pytest
from anthropic.types import MessageParam
from anthropic.types.message_create_params import MessageCreateParamsNonStreaming, MessageCreateParamsStreaming
from openai.types.chat import ChatCompletionMessageParam
from openai.types.chat.completion_create_params import (CompletionCreateParamsNonStreaming,
                                                        CompletionCreateParamsStreaming)
from openai.types.responses import ResponseInputItemParam
from openai.types.responses.response_create_params import (ResponseCreateParamsNonStreaming,
                                                           ResponseCreateParamsStreaming)

from provider_helpers import assert_valid
from tests.tools_helpers import PROVIDERS, add, connection_config, get_order

GEMINI_REQUEST_FIELDS = {'contents', 'tools', 'toolConfig', 'safetySettings', 'systemInstruction',
                         'generationConfig', 'cachedContent'}
# Part (ai.google.dev/api/caching#Part): one data field, plus thought / thoughtSignature.
GEMINI_PART_DATA = {'text', 'functionCall', 'functionResponse', 'executableCode', 'codeExecutionResult',
                    'inlineData', 'fileData'}
SETTINGS = {'claude': {'thinking': {'type': 'enabled', 'budget_tokens': 1024}, 'max_tokens': 2048},
            'openai': {}, 'openai-responses': {'params': {'reasoning': {'effort': 'low'}}}, 'gemini': {}}


def check_claude(body):
    assert_valid(MessageCreateParamsStreaming if body.get('stream') else MessageCreateParamsNonStreaming, body)
    for message in body['messages']:
        assert_valid(MessageParam, message)


def check_openai(body):
    assert_valid(CompletionCreateParamsStreaming if body.get('stream') else CompletionCreateParamsNonStreaming, body)
    for message in body['messages']:
        assert_valid(ChatCompletionMessageParam, message)


def check_responses(body):
    assert_valid(ResponseCreateParamsStreaming if body.get('stream') else ResponseCreateParamsNonStreaming, body)
    for item in body['input']:
        assert_valid(ResponseInputItemParam, item)


def check_gemini(body):
    assert set(body) <= GEMINI_REQUEST_FIELDS
    roles = [c['role'] for c in body['contents']]
    assert roles[0] == 'user' and roles[-1] == 'user' and all(a != b for a, b in zip(roles, roles[1:]))
    for content in body['contents']:
        for part in content['parts']:
            assert len(set(part) & GEMINI_PART_DATA) == 1 and set(part) <= GEMINI_PART_DATA | {'thought',
                                                                                                'thoughtSignature'}
            if 'functionCall' in part:
                assert set(part['functionCall']) <= {'id', 'name', 'args'} and isinstance(part['functionCall']['args'], dict)
            if 'functionResponse' in part:
                response = part['functionResponse']
                assert set(response) <= {'id', 'name', 'response'} and isinstance(response['response'], dict)
    for tool in body['tools']:
        for declaration in tool['functionDeclarations']:
            assert set(declaration) <= {'name', 'description', 'parameters', 'parametersJsonSchema', 'response'}


CHECKS = {'claude': check_claude, 'openai': check_openai, 'openai-responses': check_responses,
          'gemini': check_gemini}


@pytest.fixture
def make(redis_url, provider, unique, open_registry):
    def make(kind):
        config = connection_config(redis_url, provider.url, unique, kind, **SETTINGS[kind])
        return open_registry(config)[unique]
    return make


@pytest.mark.parametrize('stream', [False, True])
@pytest.mark.parametrize('kind', PROVIDERS)
def test_every_body_of_a_tool_loop_validates(make, provider, kind, stream):
    conn = make(kind)
    text = 'call get_order {"order_id": "123"}; call add {"a": 1}'
    if stream:
        list(conn.stream(text, chat_id='w', tools=[get_order, add]))
    else:
        conn.chat(text, chat_id='w', tools=[get_order, add])
    conn.chat('call add {"a": 2}', chat_id='w', tools=[get_order, add])     # the stored tool turn replayed
    bodies = [r['body'] for r in provider.requests]
    assert len(bodies) == 4
    for body in bodies:
        CHECKS[kind](body)
    assert provider.violations == []


TOOL = {'name': 'add', 'description': 'Add.', 'input_schema': {'type': 'object', 'properties': {'a': {'type': 'integer'}}}}


def test_the_anthropic_sdk_assembles_the_fake_tool_use_stream(provider):
    client = anthropic.Anthropic(base_url=provider.url, api_key='x', max_retries=0)
    with client.messages.stream(model='claude-sonnet-5-5', max_tokens=2048, tools=[TOOL],
                                thinking={'type': 'enabled', 'budget_tokens': 1024},
                                messages=[{'role': 'user', 'content': 'call add {"a": 7, "b": 1}'}]) as stream:
        message = stream.get_final_message()
    assert message.stop_reason == 'tool_use'
    assert [b.type for b in message.content] == ['thinking', 'tool_use']
    assert message.content[1].input == {'a': 7, 'b': 1} and message.content[0].signature


def test_the_openai_sdk_assembles_the_fake_tool_call_stream(provider):
    client = openai.OpenAI(base_url=provider.url + '/v1', api_key='x', max_retries=0)
    tools = [{'type': 'function', 'function': {'name': n, 'parameters': {'type': 'object'}}} for n in ('add', 'get')]
    with client.chat.completions.stream(model='gpt-4o-mini', tools=tools, messages=[
            {'role': 'user', 'content': 'call add {"a": 7}; call get {"id": "x y"}'}]) as stream:
        completion = stream.get_final_completion()
    choice = completion.choices[0]
    assert choice.finish_reason == 'tool_calls'
    calls = choice.message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [('add', {'a': 7}),
                                                                                   ('get', {'id': 'x y'})]


def test_the_openai_sdk_parses_the_fake_responses_function_call_stream(provider):
    client = openai.OpenAI(base_url=provider.url + '/v1', api_key='x', max_retries=0)
    tools = [{'type': 'function', 'name': 'add', 'parameters': {'type': 'object'}, 'strict': False}]
    with client.responses.stream(model='gpt-5', tools=tools, input='call add {"a": 7}', store=False,
                                 reasoning={'effort': 'low'}, include=['reasoning.encrypted_content']) as stream:
        deltas = [e.delta for e in stream if e.type == 'response.function_call_arguments.delta']
        response = stream.get_final_response()
    assert ''.join(deltas) == '{"a":7}'
    kinds = [o.type for o in response.output]
    assert kinds == ['reasoning', 'function_call'] and response.output[0].encrypted_content
    assert json.loads(response.output[1].arguments) == {'a': 7}
