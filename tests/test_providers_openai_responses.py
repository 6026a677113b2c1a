"""OpenAI Responses mapping (local and provider state), checked against the openai SDK types."""

from __future__ import annotations

import pytest
from openai.types.responses import Response, ResponseInputItemParam, ResponseStreamEvent
from openai.types.responses.response_create_params import (ResponseCreateParamsNonStreaming,
                                                           ResponseCreateParamsStreaming)
from pydantic import TypeAdapter

from llmconn.errors import ConfigError, InvalidInput, LLMError
from llmconn.providers.base import CUSTOM_TOOLS, REASONING_REPLAY, SSE, STATEFUL, STREAM, STRUCTURED, SYSTEM, TOOLS
from llmconn.types import Request, Turn

from provider_helpers import SECRET, assert_valid, make_provider, run_stream, same_answer, sse

REASONING = {'type': 'reasoning', 'id': 'rs_1', 'summary': [{'type': 'summary_text', 'text': 'Ann said so.'}],
             'encrypted_content': 'gAAAAABo-opaque-blob'}
MESSAGE = {'type': 'message', 'id': 'msg_1', 'role': 'assistant', 'status': 'completed',
           'content': [{'type': 'output_text', 'text': 'Your name is Ann.', 'annotations': []}]}
EFFORT = {'reasoning': {'effort': 'low', 'summary': 'auto'}}


def responses(**fields):
    fields.setdefault('model', 'gpt-5-mini')
    return make_provider('openai-responses', **fields)


def assert_valid_body(body: dict) -> None:
    assert_valid(ResponseCreateParamsStreaming if body.get('stream') else ResponseCreateParamsNonStreaming, body)
    for item in body['input']:
        assert_valid(ResponseInputItemParam, item)


def response(output=(REASONING, MESSAGE), usage=(20, 8), **fields) -> dict:
    body = {'id': 'resp_1', 'object': 'response', 'created_at': 1700000000, 'model': 'gpt-5-mini',
            'status': 'completed', 'output': list(output), 'parallel_tool_calls': True, 'tool_choice': 'auto',
            'tools': [], 'error': None, 'incomplete_details': None,
            'usage': {'input_tokens': usage[0], 'output_tokens': usage[1], 'total_tokens': sum(usage),
                      'input_tokens_details': {'cached_tokens': 0, 'cache_write_tokens': 0},
                      'output_tokens_details': {'reasoning_tokens': 4}}}
    body.update(fields)
    return Response.model_validate(body).model_dump(mode='json', exclude_unset=True)


# ---- configuration and request bodies


def test_urls_headers_capabilities_and_mode():
    provider = responses(address='http://127.0.0.1:9/v1')
    assert provider.url() == provider.url(stream=True) == 'http://127.0.0.1:9/v1/responses'
    assert provider.ping_url() == 'http://127.0.0.1:9/v1/models'
    assert provider.headers() == {'content-type': 'application/json', 'authorization': f'Bearer {SECRET}'}
    assert provider.capabilities == {STREAM, SYSTEM, REASONING_REPLAY, STATEFUL, TOOLS, STRUCTURED, CUSTOM_TOOLS}
    assert provider.mode == 'local' and responses(state='provider').mode == 'provider'
    assert provider.tag == 'openai-responses/gpt-5-mini/local'


def test_secret_not_in_reprs():
    provider = responses()
    assert SECRET not in repr(provider.conf) and SECRET not in repr(provider.__dict__)


def test_local_minimal_body():
    body = responses().build_request(Request(text='Hello'))
    assert body == {'model': 'gpt-5-mini', 'input': [{'role': 'user', 'content': 'Hello'}],
                    'max_output_tokens': 1024, 'store': False}
    assert_valid_body(body)


def test_local_replays_history_with_instructions_and_stream():
    history = (Turn('my name is Ann', 'Hello Ann'),)
    body = responses().build_request(Request(text='what is my name?', system='Be brief.', history=history,
                                             stream=True))
    assert body['instructions'] == 'Be brief.' and body['stream'] is True and body['store'] is False
    assert body['input'] == [{'role': 'user', 'content': 'my name is Ann'},
                             {'role': 'assistant', 'content': 'Hello Ann'},
                             {'role': 'user', 'content': 'what is my name?'}]
    assert_valid_body(body)


def test_encrypted_reasoning_asked_for_only_when_reasoning_is_requested():
    assert 'include' not in responses().build_request(Request(text='hi'))
    body = responses(params=EFFORT).build_request(Request(text='hi'))
    assert body['include'] == ['reasoning.encrypted_content'] and body['reasoning'] == EFFORT['reasoning']
    assert_valid_body(body)
    assert 'include' not in responses(state='provider', params=EFFORT).build_request(Request(text='hi'))


def test_params_merged_last_and_reserved_keys_refused():
    provider = responses(params={'temperature': 0.2, 'top_p': 0.5})
    body = provider.build_request(Request(text='hi', params={'temperature': 0.9, 'max_output_tokens': 77}))
    assert (body['temperature'], body['top_p'], body['max_output_tokens']) == (0.9, 0.5, 77)
    assert_valid_body(body)
    with pytest.raises(InvalidInput, match='store'):
        provider.build_request(Request(text='hi', params={'store': True}))
    with pytest.raises(ConfigError, match='previous_response_id'):
        responses(params={'previous_response_id': 'resp_x'})


def test_provider_state_sends_only_the_new_input_after_previous_response():
    history = (Turn('my name is Ann', 'Hello Ann', state={'response_id': 'resp_0', 'chain': 1}),)
    provider = responses(state='provider')
    request = provider.chain(list(history)).request(Request(text='what is my name?', system='Be brief.'), [], None)
    body = provider.build_request(request)
    assert body['store'] is True and body['previous_response_id'] == 'resp_0'
    assert body['instructions'] == 'Be brief.'
    assert body['input'] == [{'role': 'user', 'content': 'what is my name?'}]
    assert_valid_body(body)


def test_provider_state_without_previous_id_replays_the_window():
    history = (Turn('my name is Ann', 'Hello Ann'),)
    body = responses(state='provider').build_request(Request(text='and now?', history=history))
    assert body['store'] is True and 'previous_response_id' not in body
    assert [i['role'] for i in body['input']] == ['user', 'assistant', 'user']
    assert_valid_body(body)


# ---- reasoning items: kept and replayed


def test_reasoning_reply_keeps_the_whole_output_verbatim_and_replays_it():
    provider = responses(params=EFFORT)
    body = response()
    reply = provider.parse_response(body)
    assert reply.items == (REASONING, MESSAGE) and reply.items[0] is body['output'][0]
    turn = Turn('what is my name?', reply.text, items=reply.items, tag=provider.tag)
    request = provider.build_request(Request(text='and again?', history=(turn,)))
    assert request['input'] == [{'role': 'user', 'content': 'what is my name?'}, REASONING, MESSAGE,
                                {'role': 'user', 'content': 'and again?'}]
    assert_valid_body(request)


@pytest.mark.parametrize('other', [{'model': 'gpt-5'}, {'state': 'provider'}])
def test_reasoning_items_become_plain_text_for_another_model_or_mode(other):
    made_by = responses()
    turn = Turn('q', 'Your name is Ann.', items=(REASONING, MESSAGE), tag=made_by.tag)
    body = responses(**other).build_request(Request(text='next', history=(turn,)))
    assert body['input'][1] == {'role': 'assistant', 'content': 'Your name is Ann.'}


def test_local_reasoning_without_encrypted_content_is_not_kept():
    bare = {k: v for k, v in REASONING.items() if k != 'encrypted_content'}
    assert responses().parse_response(response(output=(bare, MESSAGE))).items == ()
    assert responses(state='provider').parse_response(response(output=(bare, MESSAGE))).items == (bare, MESSAGE)


def test_reply_without_reasoning_keeps_no_items():
    reply = responses().parse_response(response(output=(MESSAGE,)))
    assert reply.items == () and reply.thinking == ''


def test_parse_response_text_thinking_usage_and_id():
    body = response()
    reply = responses().parse_response(body)
    assert (reply.text, reply.thinking) == ('Your name is Ann.', 'Ann said so.')
    assert (reply.input_tokens, reply.output_tokens) == (20, 8)
    assert reply.response_id == 'resp_1' and reply.model == 'gpt-5-mini' and reply.raw is body
    assert reply.as_result()['response_id'] == 'resp_1'


def test_parse_response_failed_raises():
    body = response(output=(), status='failed', error={'code': 'server_error', 'message': 'Something broke'})
    with pytest.raises(LLMError, match='Something broke') as info:
        responses().parse_response(body)
    assert info.value.provider_body is body


# ---- streaming

_events = TypeAdapter(ResponseStreamEvent)


def event(kind: str, n: int, **fields):
    return _events.validate_python({'type': kind, 'sequence_number': n, **fields})


def stream_of(final: dict, final_kind='response.completed'):
    created = {k: v for k, v in final.items() if k not in ('usage',)} | {'status': 'in_progress', 'output': []}
    return sse([
        event('response.created', 0, response=created),
        event('response.output_item.added', 1, output_index=0, item={**REASONING, 'summary': []}),
        event('response.reasoning_summary_text.delta', 2, item_id='rs_1', output_index=0, summary_index=0,
              delta='Ann said '),
        event('response.reasoning_summary_text.delta', 3, item_id='rs_1', output_index=0, summary_index=0,
              delta='so.'),
        event('response.output_item.added', 4, output_index=1, item={**MESSAGE, 'content': [],
                                                                     'status': 'in_progress'}),
        event('response.content_part.added', 5, item_id='msg_1', output_index=1, content_index=0,
              part={'type': 'output_text', 'text': '', 'annotations': []}),
        event('response.output_text.delta', 6, item_id='msg_1', output_index=1, content_index=0,
              delta='Your name ', logprobs=[]),
        event('response.output_text.delta', 7, item_id='msg_1', output_index=1, content_index=0,
              delta='is Ann.', logprobs=[]),
        event('response.output_text.done', 8, item_id='msg_1', output_index=1, content_index=0,
              text='Your name is Ann.', logprobs=[]),
        event(final_kind, 9, response=final),
    ])


def test_stream_deltas_then_done_equal_to_unstreamed():
    provider = responses(params=EFFORT)
    final = response()
    deltas, reply = run_stream(provider, stream_of(final))
    assert deltas == [('thinking', 'Ann said '), ('thinking', 'so.'), ('text', 'Your name '), ('text', 'is Ann.')]
    assert same_answer(reply, provider.parse_response(final))
    assert reply.items == (REASONING, MESSAGE) and (reply.input_tokens, reply.output_tokens) == (20, 8)


def test_stream_second_summary_is_a_new_paragraph():
    raw = stream_of(response())
    raw.insert(4, sse([event('response.reasoning_summary_text.delta', 3, item_id='rs_1', output_index=0,
                             summary_index=1, delta='Twice.')])[0])
    deltas, _ = run_stream(responses(), raw)
    assert [t for kind, t in deltas if kind == 'thinking'] == ['Ann said ', 'so.', '\n\n', 'Twice.']


def test_stream_incomplete_ends_with_the_partial_answer():
    final = response(status='incomplete', incomplete_details={'reason': 'max_output_tokens'})
    _, reply = run_stream(responses(), stream_of(final, 'response.incomplete'))
    assert reply.text == 'Your name is Ann.'


def test_stream_failed_raises_with_the_response():
    final = response(output=(), status='failed', error={'code': 'server_error', 'message': 'It broke'})
    with pytest.raises(LLMError, match='It broke') as info:
        list(responses().parse_stream(iter(stream_of(final, 'response.failed'))))
    assert info.value.provider_body['error']['code'] == 'server_error'


def test_stream_error_event_raises():
    raw = stream_of(response())[:3] + sse([event('error', 3, code='server_error', message='Overloaded',
                                                 param=None)])
    with pytest.raises(LLMError, match='Overloaded') as info:
        list(responses().parse_stream(iter(raw)))
    assert info.value.provider_body['code'] == 'server_error'


def test_stream_without_completed_raises():
    with pytest.raises(LLMError, match='response.completed'):
        list(responses().parse_stream(iter(stream_of(response())[:-1])))


def test_stream_garbage_raises():
    with pytest.raises(LLMError, match='not JSON'):
        list(responses().parse_stream(iter([SSE(('response.created', 'oops'))])))
