"""Claude Messages mapping, checked against the official anthropic SDK types."""

from __future__ import annotations

import pytest
from anthropic.types import (Message, MessageParam, RawContentBlockDeltaEvent, RawContentBlockStartEvent,
                             RawContentBlockStopEvent, RawMessageDeltaEvent, RawMessageStartEvent,
                             RawMessageStopEvent, ThinkingConfigParam)
from anthropic.types.message_create_params import MessageCreateParamsNonStreaming, MessageCreateParamsStreaming

from llmconn.errors import ConfigError, InvalidInput, LLMError
from llmconn.providers.base import REASONING_REPLAY, SSE, STREAM, SYSTEM, THINKING, TOOLS, STRUCTURED
from llmconn.types import Request, Turn

from provider_helpers import SECRET, assert_valid, make_provider, run_stream, same_answer, sse

THINKING_ON = {'type': 'enabled', 'budget_tokens': 2048}
SIGNATURE = 'EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds'
THINKING_BLOCK = {'type': 'thinking', 'thinking': 'The user wants a name.', 'signature': SIGNATURE}
REDACTED_BLOCK = {'type': 'redacted_thinking', 'data': 'EmwKAhgBEgy3va3pzix/LafPsn4a'}


def claude(**fields):
    fields.setdefault('model', 'claude-sonnet-5-5')
    fields.setdefault('max_tokens', 4096)
    return make_provider('claude', **fields)


def message(content, usage=None, **fields) -> dict:
    """A Messages API response, validated by the SDK model, as JSON."""
    body = {'id': 'msg_01', 'type': 'message', 'role': 'assistant', 'model': 'claude-sonnet-5-5',
            'content': content, 'stop_reason': 'end_turn', 'stop_sequence': None,
            'usage': usage or {'input_tokens': 12, 'output_tokens': 7}}
    body.update(fields)
    return Message.model_validate(body).model_dump(mode='json', exclude_unset=True)


def assert_valid_body(body: dict) -> None:
    assert_valid(MessageCreateParamsStreaming if body.get('stream') else MessageCreateParamsNonStreaming, body)
    for item in body['messages']:
        assert_valid(MessageParam, item)
    if 'thinking' in body:
        assert_valid(ThinkingConfigParam, body['thinking'])


# ---- configuration and request bodies


def test_urls_headers_and_capabilities():
    provider = claude(address='http://127.0.0.1:9/')
    assert provider.url() == provider.url(stream=True) == 'http://127.0.0.1:9/v1/messages'
    assert provider.ping_url() == 'http://127.0.0.1:9/v1/models'
    assert provider.headers() == {'content-type': 'application/json', 'anthropic-version': '2023-06-01',
                                  'x-api-key': SECRET}
    assert provider.capabilities == {STREAM, SYSTEM, THINKING, REASONING_REPLAY, TOOLS, STRUCTURED}
    assert claude().conf.address == 'https://api.anthropic.com'


def test_no_secret_means_no_key_header():
    assert 'x-api-key' not in make_provider('claude', model='claude-x', secret=None).headers()


def test_secret_not_in_reprs():
    provider = claude()
    assert SECRET not in repr(provider.conf) and SECRET not in repr(provider.__dict__)
    assert SECRET not in repr(Request(text='hi', system='be brief'))


def test_minimal_body_validates_and_omits_empty_system():
    body = claude().build_request(Request(text='Hello'))
    assert body == {'model': 'claude-sonnet-5-5', 'max_tokens': 4096,
                    'messages': [{'role': 'user', 'content': 'Hello'}]}
    assert_valid_body(body)


def test_system_history_and_stream_flag():
    history = (Turn('my name is Ann', 'Hello Ann'), Turn('I like tea', 'Noted'))
    body = claude().build_request(Request(text='what is my name?', system='Be brief.', history=history,
                                          stream=True))
    assert body['system'] == 'Be brief.' and body['stream'] is True
    assert [(m['role'], m['content']) for m in body['messages']] == [
        ('user', 'my name is Ann'), ('assistant', 'Hello Ann'), ('user', 'I like tea'),
        ('assistant', 'Noted'), ('user', 'what is my name?')]
    assert_valid_body(body)


@pytest.mark.parametrize('thinking, mode', [(THINKING_ON, 'enabled'), ({'type': 'adaptive'}, 'adaptive'),
                                            (None, 'plain')])
def test_thinking_sent_as_configured_and_names_the_mode(thinking, mode):
    provider = claude(thinking=thinking) if thinking else claude()
    body = provider.build_request(Request(text='think: why?'))
    assert body.get('thinking') == thinking
    assert provider.mode == mode and provider.tag == f'claude/claude-sonnet-5-5/{mode}'
    assert_valid_body(body)


def test_params_merged_last_per_call_over_connection():
    provider = claude(params={'service_tier': 'auto', 'stop_sequences': ['END']})
    body = provider.build_request(Request(text='hi', params={'stop_sequences': ['STOP'], 'max_tokens': 100}))
    assert body['service_tier'] == 'auto' and body['stop_sequences'] == ['STOP'] and body['max_tokens'] == 100
    assert_valid_body(body)


def test_params_may_not_replace_what_llmconn_owns():
    with pytest.raises(InvalidInput, match='messages'):
        claude().build_request(Request(text='hi', params={'messages': []}))
    with pytest.raises(ConfigError, match='thinking'):
        claude(params={'thinking': THINKING_ON})


# ---- replay of thinking blocks


def test_thinking_blocks_replayed_verbatim_to_same_model_and_mode():
    provider = claude(thinking=THINKING_ON)
    turn = Turn('think: who?', 'Ann.', items=(THINKING_BLOCK, REDACTED_BLOCK), tag=provider.tag)
    body = provider.build_request(Request(text='and then?', history=(turn,)))
    assert body['messages'][1] == {'role': 'assistant', 'content': [
        THINKING_BLOCK, REDACTED_BLOCK, {'type': 'text', 'text': 'Ann.'}]}
    assert body['messages'][1]['content'][0] is THINKING_BLOCK   # the stored dict itself, untouched
    assert_valid_body(body)


@pytest.mark.parametrize('other', [{'model': 'claude-opus-5-5'}, {'thinking': {'type': 'adaptive'}}, {}])
def test_thinking_blocks_become_plain_text_elsewhere(other):
    made_by = claude(thinking=THINKING_ON)
    turn = Turn('think: who?', 'Ann.', items=(THINKING_BLOCK,), tag=made_by.tag)
    body = claude(**other).build_request(Request(text='and then?', history=(turn,)))
    assert body['messages'][1] == {'role': 'assistant', 'content': 'Ann.'}
    assert_valid_body(body)


# ---- responses


def test_parse_response_text_usage_and_ids():
    body = message([{'type': 'text', 'text': 'Hello '}, {'type': 'text', 'text': 'Ann'}],
                   usage={'input_tokens': 10, 'output_tokens': 4, 'cache_read_input_tokens': 5})
    reply = claude().parse_response(body)
    assert (reply.text, reply.input_tokens, reply.output_tokens) == ('Hello Ann', 15, 4)
    assert reply.raw is body and reply.response_id == 'msg_01' and reply.model == 'claude-sonnet-5-5'
    assert reply.items == () and reply.thinking == ''
    assert reply.as_result()['usage'] == {'input_tokens': 15, 'output_tokens': 4, 'cache_read_tokens': 5,
                                            'cache_write_tokens': 0, 'reasoning_tokens': 0}


def test_parse_response_keeps_thinking_blocks_verbatim():
    body = message([THINKING_BLOCK, REDACTED_BLOCK, {'type': 'text', 'text': 'Ann.'}])
    reply = claude(thinking=THINKING_ON).parse_response(body)
    assert reply.items == (THINKING_BLOCK, REDACTED_BLOCK)
    assert reply.items[0] is body['content'][0]
    assert reply.thinking == 'The user wants a name.' and reply.text == 'Ann.'


def test_parse_response_refuses_an_error_body():
    with pytest.raises(LLMError) as info:
        claude().parse_response({'type': 'error', 'error': {'type': 'api_error', 'message': 'boom'}})
    assert info.value.provider_body['error']['message'] == 'boom'


# ---- streaming


def stream_events(blocks_events, input_tokens=12, output_tokens=7):
    start = RawMessageStartEvent.model_validate({'type': 'message_start', 'message': {
        'id': 'msg_01', 'type': 'message', 'role': 'assistant', 'model': 'claude-sonnet-5-5', 'content': [],
        'stop_reason': None, 'stop_sequence': None, 'usage': {'input_tokens': input_tokens, 'output_tokens': 1}}})
    end = [RawMessageDeltaEvent.model_validate({'type': 'message_delta', 'delta': {
               'stop_reason': 'end_turn', 'stop_sequence': None}, 'usage': {'output_tokens': output_tokens}}),
           RawMessageStopEvent(type='message_stop')]
    return sse([start, {'type': 'ping'}, *blocks_events, *end])


def block(index, start, *deltas):
    return [RawContentBlockStartEvent.model_validate({'type': 'content_block_start', 'index': index,
                                                      'content_block': start}),
            *[RawContentBlockDeltaEvent.model_validate({'type': 'content_block_delta', 'index': index,
                                                        'delta': d}) for d in deltas],
            RawContentBlockStopEvent(type='content_block_stop', index=index)]


THINKING_STREAM = [
    *block(0, {'type': 'thinking', 'thinking': '', 'signature': ''},
           {'type': 'thinking_delta', 'thinking': 'The user '}, {'type': 'thinking_delta', 'thinking': 'wants a name.'},
           {'type': 'signature_delta', 'signature': SIGNATURE}),
    *block(1, REDACTED_BLOCK),
    *block(2, {'type': 'text', 'text': ''}, {'type': 'text_delta', 'text': 'Ann'},
           {'type': 'text_delta', 'text': '.'}),
]


def test_stream_yields_deltas_in_order_then_one_done_equal_to_unstreamed():
    provider = claude(thinking=THINKING_ON)
    deltas, reply = run_stream(provider, stream_events(THINKING_STREAM))
    assert deltas == [('thinking', 'The user '), ('thinking', 'wants a name.'), ('text', 'Ann'), ('text', '.')]
    unstreamed = provider.parse_response(message([THINKING_BLOCK, REDACTED_BLOCK, {'type': 'text', 'text': 'Ann.'}]))
    assert same_answer(reply, unstreamed)
    assert reply.items == (THINKING_BLOCK, REDACTED_BLOCK)      # signature rebuilt from its delta
    assert (reply.input_tokens, reply.output_tokens) == (12, 7)


def test_stream_usage_from_message_delta_replaces_message_start():
    # message_delta's usage is cumulative; when it carries input_tokens they are the total.
    events = stream_events(block(0, {'type': 'text', 'text': ''}, {'type': 'text_delta', 'text': 'x'}))
    events[-2] = SSE(('message_delta', '{"type": "message_delta", "delta": {"stop_reason": "end_turn"}, '
                                       '"usage": {"input_tokens": 30, "output_tokens": 9}}'))
    _, reply = run_stream(claude(), events)
    assert (reply.input_tokens, reply.output_tokens) == (30, 9)


def test_stream_cut_before_the_model_finished_raises():
    # Everything up to the text delta, then EOF: no stop_reason, no message_stop.
    events = stream_events(block(0, {'type': 'text', 'text': ''}, {'type': 'text_delta', 'text': 'Ann'}))[:-3]
    with pytest.raises(LLMError, match='message_stop'):
        list(claude().parse_stream(iter(events)))


def test_stream_with_stop_reason_but_no_message_stop_is_complete():
    events = stream_events(block(0, {'type': 'text', 'text': ''}, {'type': 'text_delta', 'text': 'Ann'}))[:-1]
    result = list(claude().parse_stream(iter(events)))[-1].as_result()
    assert result['text'] == 'Ann' and result['usage']['output_tokens'] == 7


def test_stream_error_event_raises_with_the_provider_body():
    error = {'type': 'error', 'error': {'type': 'overloaded_error', 'message': 'Overloaded'}}
    events = stream_events([])[:2] + sse([error])
    with pytest.raises(LLMError, match='overloaded_error') as info:
        list(claude().parse_stream(iter(events)))
    assert info.value.provider_body == error


def test_empty_stream_raises():
    with pytest.raises(LLMError):
        list(claude().parse_stream(iter([])))


def test_stream_event_that_is_not_json_raises():
    with pytest.raises(LLMError, match='not JSON'):
        list(claude().parse_stream(iter([SSE(('message_start', '<html>'))])))
