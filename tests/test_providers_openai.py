"""OpenAI Chat Completions mapping, checked against the official openai SDK types."""

from __future__ import annotations

import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessageParam
from openai.types.chat.completion_create_params import (CompletionCreateParamsNonStreaming,
                                                        CompletionCreateParamsStreaming)

from llmconn.errors import ConfigError, InvalidInput, LLMError
from llmconn.providers.base import SSE, STREAM, SYSTEM, TOOLS, STRUCTURED
from llmconn.types import Request, Turn

from provider_helpers import SECRET, assert_valid, make_provider, run_stream, same_answer, sse


def openai(**fields):
    fields.setdefault('model', 'gpt-4.1-mini')
    return make_provider('openai', **fields)


def assert_valid_body(body: dict) -> None:
    assert_valid(CompletionCreateParamsStreaming if body.get('stream') else CompletionCreateParamsNonStreaming, body)
    for item in body['messages']:
        assert_valid(ChatCompletionMessageParam, item)


def completion(text='Hello Ann', usage=(11, 3), **message) -> dict:
    body = {'id': 'chatcmpl-1', 'object': 'chat.completion', 'created': 1700000000, 'model': 'gpt-4.1-mini',
            'choices': [{'index': 0, 'finish_reason': 'stop',
                         'message': {'role': 'assistant', 'content': text, **message}}],
            'usage': {'prompt_tokens': usage[0], 'completion_tokens': usage[1], 'total_tokens': sum(usage)}}
    return ChatCompletion.model_validate(body).model_dump(mode='json', exclude_unset=True)


def chunk(delta=None, finish_reason=None, usage=None, choices=True) -> ChatCompletionChunk:
    body = {'id': 'chatcmpl-1', 'object': 'chat.completion.chunk', 'created': 1700000000,
            'model': 'gpt-4.1-mini', 'choices': [], 'usage': usage}
    if choices:
        body['choices'] = [{'index': 0, 'delta': delta or {}, 'finish_reason': finish_reason}]
    return ChatCompletionChunk.model_validate(body)


def stream(*deltas, usage=(11, 3), done=True):
    chunks = [chunk({'role': 'assistant', 'content': ''})]
    chunks += [chunk(d) for d in deltas]
    chunks += [chunk({}, finish_reason='stop'),
               chunk(choices=False, usage={'prompt_tokens': usage[0], 'completion_tokens': usage[1],
                                           'total_tokens': sum(usage)})]
    events = sse(chunks, named=False)
    return events + [SSE(('', '[DONE]'))] if done else events


# ---- configuration and request bodies


def test_urls_headers_and_capabilities():
    provider = openai(address='http://127.0.0.1:9/v1')
    assert provider.url() == provider.url(stream=True) == 'http://127.0.0.1:9/v1/chat/completions'
    assert provider.ping_url() == 'http://127.0.0.1:9/v1/models'
    assert provider.headers() == {'content-type': 'application/json', 'authorization': f'Bearer {SECRET}'}
    assert provider.capabilities == {STREAM, SYSTEM, TOOLS, STRUCTURED}
    assert openai().conf.address == 'https://api.openai.com/v1'


def test_local_server_without_secret_gets_no_authorization():
    provider = make_provider('openai', model='llama3.2', address='http://localhost:11434/v1', secret=None)
    assert provider.headers() == {'content-type': 'application/json'}


def test_secret_not_in_reprs():
    provider = openai()
    assert SECRET not in repr(provider.conf) and SECRET not in repr(provider.__dict__)


def test_minimal_body_validates():
    body = openai().build_request(Request(text='Hello'))
    assert body == {'model': 'gpt-4.1-mini', 'messages': [{'role': 'user', 'content': 'Hello'}],
                    'max_tokens': 1024}
    assert_valid_body(body)


def test_system_first_then_history_then_new_message_and_stream_flags():
    history = (Turn('my name is Ann', 'Hello Ann'),)
    body = openai().build_request(Request(text='what is my name?', system='Be brief.', history=history,
                                          stream=True))
    assert body['messages'] == [{'role': 'system', 'content': 'Be brief.'},
                                {'role': 'user', 'content': 'my name is Ann'},
                                {'role': 'assistant', 'content': 'Hello Ann'},
                                {'role': 'user', 'content': 'what is my name?'}]
    assert body['stream'] is True and body['stream_options'] == {'include_usage': True}
    assert_valid_body(body)


def test_history_items_of_other_providers_are_never_sent():
    turn = Turn('q', 'a', items=({'type': 'thinking', 'thinking': 't', 'signature': 's'},), tag='claude/x/enabled')
    body = openai().build_request(Request(text='next', history=(turn,)))
    assert body['messages'][1] == {'role': 'assistant', 'content': 'a'}


def test_params_merged_last_and_max_completion_tokens_replaces_max_tokens():
    provider = openai(params={'temperature': 0.2, 'seed': 7})
    body = provider.build_request(Request(text='hi', params={'temperature': 0.9, 'max_completion_tokens': 50}))
    assert body['temperature'] == 0.9 and body['seed'] == 7 and body['max_completion_tokens'] == 50
    assert 'max_tokens' not in body
    assert_valid_body(body)


def test_params_may_not_replace_what_llmconn_owns():
    with pytest.raises(InvalidInput, match='stream'):
        openai().build_request(Request(text='hi', params={'stream': True}))
    with pytest.raises(ConfigError, match='messages'):
        openai(params={'messages': []})


# ---- responses


def test_parse_response():
    body = completion()
    reply = openai().parse_response(body)
    assert (reply.text, reply.input_tokens, reply.output_tokens) == ('Hello Ann', 11, 3)
    assert reply.raw is body and reply.model == 'gpt-4.1-mini' and reply.response_id == 'chatcmpl-1'
    assert reply.items == () and reply.thinking == ''


def test_parse_response_reasoning_of_compatible_servers_becomes_thinking():
    body = completion()
    body['choices'][0]['message']['reasoning_content'] = 'Ann said so.'
    assert openai().parse_response(body).thinking == 'Ann said so.'


@pytest.mark.parametrize('body', [{'error': {'message': 'model not found', 'type': 'invalid_request_error'}},
                                  {'id': 'x', 'choices': []}, 'not json'])
def test_parse_response_refuses_errors_and_empty_answers(body):
    with pytest.raises(LLMError) as info:
        openai().parse_response(body)
    assert info.value.provider_body == body


# ---- streaming


def test_stream_deltas_then_done_equal_to_unstreamed_with_usage():
    provider = openai()
    deltas, reply = run_stream(provider, stream({'content': 'Hello'}, {'content': ' Ann'}))
    assert deltas == [('text', 'Hello'), ('text', ' Ann')]
    assert same_answer(reply, provider.parse_response(completion()))
    assert (reply.input_tokens, reply.output_tokens) == (11, 3)
    assert reply.raw['choices'][0]['finish_reason'] == 'stop'


def test_stream_reasoning_deltas_become_thinking_events():
    raw = stream({'content': 'Ann'}, usage=(1, 1))
    raw.insert(1, SSE(('', '{"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"reasoning": "hm"}}]}')))
    deltas, reply = run_stream(openai(), raw)
    assert deltas == [('thinking', 'hm'), ('text', 'Ann')] and reply.thinking == 'hm'


def test_stream_cut_before_the_model_finished_raises():
    cut = stream({'content': 'Hello'}, done=False)[:2]       # role chunk and one delta, then EOF
    with pytest.raises(LLMError, match=r'no finish_reason.*not saved'):
        list(openai().parse_stream(iter(cut)))


def test_stream_that_finished_but_omits_done_marker_is_complete():
    # The official SDK accepts this too: finish_reason (and here usage) already arrived.
    events = list(openai().parse_stream(iter(stream({'content': 'Hello'}, done=False))))
    assert events[-1].as_result()['text'] == 'Hello' and events[-1].as_result()['usage']['output_tokens'] == 3


def test_stream_error_chunk_raises_with_the_provider_body():
    error = {'error': {'message': 'overloaded', 'type': 'server_error'}}
    events = stream({'content': 'Hello'})[:2] + [SSE(('', '{"error": {"message": "overloaded", '
                                                          '"type": "server_error"}}'))]
    with pytest.raises(LLMError, match='overloaded') as info:
        list(openai().parse_stream(iter(events)))
    assert info.value.provider_body == error


def test_stream_garbage_raises():
    with pytest.raises(LLMError, match='not JSON'):
        list(openai().parse_stream(iter([SSE(('', 'Internal Server Error'))])))
