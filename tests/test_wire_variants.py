"""Valid answers that differ from what our own fake provider sends.

Each test feeds a mapping (or ``iter_sse``, or the transport through a tiny
scripted HTTP server) an answer the real APIs, their official SDKs, or the
servers that imitate them (vLLM, Ollama, LiteLLM, simulators) may send: other
line endings, missing optional fields, extra fields, other block types,
bodies that ignore ``stream``. And each request body is held to what the
real API accepts, checked with the official SDK types where they exist.
"""

from __future__ import annotations

import gzip
import json
import time

import pytest
from anthropic.types import MessageParam
from openai.types.chat import ChatCompletionMessageParam
from openai.types.chat.completion_create_params import CompletionCreateParamsNonStreaming
from openai.types.responses import ResponseInputItemParam

from llmconn.errors import ConfigError, InvalidInput, LLMError, LLMRateLimited
from llmconn.providers.base import EMPTY_REPLY, SSE
from llmconn.sse import EventStream, JSONBody
from llmconn.registry import Registry
from llmconn.sse import iter_sse
from llmconn.transport import Transport
from llmconn.types import Reply, Request, Turn

from provider_helpers import assert_valid, make_provider, run_stream


def events_of(raw: bytes, size: int | None = None) -> list[tuple[str, str]]:
    """Parse ``raw`` in one chunk, or in chunks of ``size`` bytes."""
    chunks = [raw] if size is None else [raw[i:i + size] for i in range(0, len(raw), size)]
    return [tuple(e) for e in iter_sse(chunks)]


def as_sse(*objects, named: bool = False) -> list[SSE]:
    return [SSE((o.get('type', '') if named else '', json.dumps(o))) for o in objects]


# ---- iter_sse: the SSE grammar as browsers and the SDKs read it


def test_data_without_space_after_colon_keeps_the_value_whole():
    assert events_of(b'data:{"a": 1}\n\ndata:  two spaces\n\n') == [('', '{"a": 1}'), ('', ' two spaces')]


@pytest.mark.parametrize('end', [b'\n', b'\r\n', b'\r'])
def test_every_line_ending_splits_lines_and_events(end):
    raw = end.join([b'event: a', b'data: 1', b'', b'data: 2', b'data: 3', b'', b''])
    expected = [('a', '1'), ('', '2\n3')]
    assert events_of(raw) == expected
    assert events_of(raw, size=1) == expected       # a CRLF split between chunks is still one line end


def test_cr_then_lf_in_the_next_chunk_is_one_line_end_not_an_empty_line():
    # Parsing CR and LF as two line ends would dispatch "a" alone, before "b" arrived.
    assert [tuple(e) for e in iter_sse([b'data: a\r', b'\ndata: b\r\n\r\n'])] == [('', 'a\nb')]


def test_comments_keep_alives_and_unknown_fields_are_ignored():
    raw = b': OPENROUTER PROCESSING\n\n:\n\nid: 7\nretry: 100\nfoo: bar\ndata: x\n\n'
    assert events_of(raw) == [('', 'x')]


def test_event_without_data_and_blank_data_are_not_events():
    assert events_of(b'event: ping\n\ndata:\n\ndata: \n\nevent: a\ndata: 1\n\n') == [('a', '1')]


def test_last_event_counts_without_its_blank_line_or_final_newline():
    assert events_of(b'data: 1\n\ndata: [DONE]') == [('', '1'), ('', '[DONE]')]
    assert events_of(b'data: 1\n\ndata: 2\n') == [('', '1'), ('', '2')]


def test_a_leading_byte_order_mark_is_dropped():
    assert events_of(b'\xef\xbb\xbfdata: 1\n\n') == [('', '1')]
    assert events_of(b'\xef\xbb\xbfevent: e\ndata: 1\n\n', size=1) == [('e', '1')]


def test_utf8_split_across_chunks_and_bad_bytes_do_not_break_the_stream():
    raw = 'data: {"t": "žluťoučký 🐎"}\n\n'.encode()
    assert json.loads(events_of(raw, size=1)[0][1]) == {'t': 'žluťoučký 🐎'}
    assert events_of(b'data: a\xffb\n\n') == [('', 'a\ufffdb')]


def test_a_very_long_line_in_small_chunks_is_parsed_in_linear_time():
    text = 'x' * 2_000_000
    raw = f'data: {json.dumps({"t": text})}\n\n'.encode()
    chunks = [raw[i:i + 100] for i in range(0, len(raw), 100)]
    started = time.perf_counter()
    events = list(iter_sse(chunks))
    # Copying and re-scanning the growing line on every chunk took ~6 s here; one pass takes ~0.03 s.
    assert time.perf_counter() - started < 1.0
    assert json.loads(events[0].data)['t'] == text


def test_byte_by_byte_equals_whole_for_a_real_claude_stream():
    raw = (b'event: message_start\r\ndata: {"type":"message_start","message":{"id":"m","content":[],'
           b'"usage":{"input_tokens":3,"output_tokens":1}}}\r\n\r\nevent: ping\r\ndata: {"type": "ping"}\r\n\r\n'
           b'event: content_block_delta\r\ndata: {"type":"content_block_delta","index":0,'
           b'"delta":{"type":"text_delta","text":"\xc5\xbe"}}\r\n\r\n')
    assert events_of(raw, size=1) == events_of(raw, size=7) == events_of(raw)
    assert len(events_of(raw)) == 3


# ---- Claude Messages


def claude(**fields):
    fields.setdefault('model', 'claude-sonnet-5-5')
    return make_provider('claude', **fields)


def claude_stream(*events, named=True, stop=True):
    start = {'type': 'message_start', 'message': {'id': 'msg_1', 'type': 'message', 'role': 'assistant',
                                                  'model': 'claude-sonnet-5-5', 'content': [],
                                                  'usage': {'input_tokens': 5, 'output_tokens': 1}}}
    end = [{'type': 'message_delta', 'delta': {'stop_reason': 'end_turn'}, 'usage': {'output_tokens': 4}}]
    end += [{'type': 'message_stop'}] if stop else []
    return as_sse(start, *events, *end, named=named)


def text_delta(text, index=0):
    return {'type': 'content_block_delta', 'index': index, 'delta': {'type': 'text_delta', 'text': text}}


def test_claude_stream_without_event_lines_reads_the_type_from_data():
    deltas, reply = run_stream(claude(), claude_stream(
        {'type': 'content_block_start', 'index': 0, 'content_block': {'type': 'text', 'text': ''}},
        text_delta('Hi'), {'type': 'content_block_stop', 'index': 0}, named=False))
    assert deltas == [('text', 'Hi')] and reply.text == 'Hi' and (reply.input_tokens, reply.output_tokens) == (5, 4)


def test_claude_stream_deltas_without_block_start_and_unknown_events_are_fine():
    deltas, reply = run_stream(claude(), claude_stream(
        text_delta('Hel'), {'type': 'some_future_event', 'x': 1}, text_delta('lo'), {'type': 'ping'}))
    assert deltas == [('text', 'Hel'), ('text', 'lo')] and reply.text == 'Hello'


def test_claude_stream_with_tool_use_keeps_only_text_in_text():
    deltas, reply = run_stream(claude(), claude_stream(
        {'type': 'content_block_start', 'index': 0, 'content_block': {'type': 'text', 'text': ''}},
        text_delta('Checking.'),
        {'type': 'content_block_start', 'index': 1,
         'content_block': {'type': 'tool_use', 'id': 't1', 'name': 'get', 'input': {}}},
        {'type': 'content_block_delta', 'index': 1, 'delta': {'type': 'input_json_delta', 'partial_json': '{"a":'}},
        {'type': 'content_block_delta', 'index': 1, 'delta': {'type': 'input_json_delta', 'partial_json': ' 1}'}}))
    assert reply.text == 'Checking.' and deltas == [('text', 'Checking.')]
    assert reply.raw['content'][1]['input'] == {'a': 1}


def test_claude_stream_tolerates_a_trailing_done_marker():
    events = claude_stream(text_delta('x')) + [SSE(('', '[DONE]'))]
    assert run_stream(claude(), events)[1].text == 'x'


@pytest.mark.parametrize('stop_reason', ['max_tokens', 'refusal', 'pause_turn', 'tool_use'])
def test_claude_other_stop_reasons_are_replies(stop_reason):
    body = {'id': 'msg_1', 'type': 'message', 'role': 'assistant', 'model': 'claude-sonnet-5-5',
            'content': [{'type': 'text', 'text': 'Part'}], 'stop_reason': stop_reason,
            'usage': {'input_tokens': 2, 'output_tokens': 3}}
    assert claude().parse_response(body).text == 'Part'


def test_claude_non_text_blocks_and_cache_usage():
    body = {'id': 'msg_1', 'type': 'message', 'role': 'assistant', 'model': 'claude-sonnet-5-5',
            'content': [{'type': 'server_tool_use', 'id': 's', 'name': 'web_search', 'input': {}},
                        {'type': 'web_search_tool_result', 'tool_use_id': 's', 'content': []},
                        {'type': 'text', 'text': 'A', 'citations': [{'type': 'web_search_result_location'}]},
                        {'type': 'tool_use', 'id': 't', 'name': 'f', 'input': {}},
                        {'type': 'text', 'text': 'B'}],
            'stop_reason': 'tool_use', 'container': None, 'future_field': {'x': 1},
            'usage': {'input_tokens': 10, 'cache_creation_input_tokens': 100, 'cache_read_input_tokens': 1000,
                      'output_tokens': 7, 'server_tool_use': {'web_search_requests': 1}, 'service_tier': 'standard',
                      'cache_creation': {'ephemeral_5m_input_tokens': 100, 'ephemeral_1h_input_tokens': 0}}}
    reply = claude().parse_response(body)
    assert reply.text == 'AB' and reply.items == ()
    assert (reply.input_tokens, reply.output_tokens) == (1110, 7)


def test_claude_empty_content_and_null_usage_fields_do_not_crash():
    body = {'type': 'message', 'content': [], 'stop_reason': 'refusal',
            'usage': {'input_tokens': 4, 'output_tokens': 0, 'cache_read_input_tokens': None}}
    reply = claude().parse_response(body)
    assert reply.text == '' and (reply.input_tokens, reply.output_tokens) == (4, 0)


def test_claude_replays_an_empty_reply_as_non_empty_text_and_never_ends_on_thinking():
    thinking = {'type': 'thinking', 'thinking': 'hm', 'signature': 'sig'}
    provider = claude(max_tokens=4096, thinking={'type': 'enabled', 'budget_tokens': 2048})
    turns = (Turn('a', ''), Turn('b', ' ', items=(thinking,), tag=provider.tag))
    body = provider.build_request(Request('c', history=turns))
    assert body['messages'][1]['content'] == EMPTY_REPLY
    assert body['messages'][3]['content'] == [thinking, {'type': 'text', 'text': EMPTY_REPLY}]
    for message in body['messages']:
        assert_valid(MessageParam, message)


@pytest.mark.parametrize('param', [{'temperature': 0.2}, {'top_k': 5}])
def test_claude_refuses_sampling_params_that_thinking_forbids(param):
    thinking = {'type': 'enabled', 'budget_tokens': 1024}
    with pytest.raises(ConfigError, match=next(iter(param))):
        claude(thinking=thinking, max_tokens=2048, params=param)
    provider = claude(thinking=thinking, max_tokens=2048)
    with pytest.raises(InvalidInput, match='thinking'):
        provider.build_request(Request('x', params=param))
    assert provider.build_request(Request('x', params={'temperature': 1}))['temperature'] == 1
    assert claude(params=param).build_request(Request('x'))[next(iter(param))] == next(iter(param.values()))
    assert claude(thinking={'type': 'disabled'}, params=param)


# ---- OpenAI Chat Completions


def openai(**fields):
    fields.setdefault('model', 'gpt-4.1-mini')
    return make_provider('openai', **fields)


def chunk(delta=None, finish=None, usage=None, choices=None, **extra):
    body = {'id': 'c1', 'object': 'chat.completion.chunk', 'created': 1, 'model': 'm', **extra}
    body['choices'] = choices if choices is not None else [{'index': 0, 'delta': delta or {},
                                                            'finish_reason': finish}]
    if usage is not None:
        body['usage'] = usage
    return body


DONE = SSE(('', '[DONE]'))


def test_openai_content_null_with_refusal_is_the_text():
    body = {'choices': [{'index': 0, 'message': {'role': 'assistant', 'content': None, 'refusal': 'No.'},
                         'finish_reason': 'stop'}]}
    assert openai().parse_response(body).text == 'No.'


def test_openai_missing_usage_null_error_and_unknown_fields_are_fine():
    body = {'id': 'x', 'object': 'chat.completion', 'error': None, 'x_groq': {'id': 'q'}, 'kv_transfer_params': None,
            'prompt_logprobs': None, 'choices': [{'index': 0, 'logprobs': None, 'stop_reason': None,
                                                  'finish_reason': 'length',
                                                  'message': {'role': 'assistant', 'content': 'Hi', 'tool_calls': [],
                                                              'annotations': [], 'audio': None}}]}
    reply = openai().parse_response(body)
    assert reply.text == 'Hi' and (reply.input_tokens, reply.output_tokens) == (0, 0)


def test_openai_content_as_a_list_of_parts_is_joined():
    body = {'choices': [{'index': 0, 'message': {'role': 'assistant', 'content': [
        {'type': 'text', 'text': 'A'}, {'type': 'image_url', 'image_url': {}}, {'type': 'text', 'text': 'B'}]}}]}
    assert openai().parse_response(body).text == 'AB'


@pytest.mark.parametrize('choices', [[], None, ['oops']])
def test_openai_no_usable_choice_is_a_clear_error(choices):
    with pytest.raises(LLMError, match='without any choice') as info:
        openai().parse_response({'id': 'x', 'choices': choices})
    assert info.value.provider_body == {'id': 'x', 'choices': choices}


def test_openai_stream_of_a_server_that_ignores_include_usage():
    events = as_sse(chunk({'role': 'assistant'}), chunk({'content': None}), chunk({}),
                    chunk({'content': 'Hi'}), chunk(choices=[]), chunk({'content': '!'}, finish='stop')) + [DONE]
    deltas, reply = run_stream(openai(), events)
    assert deltas == [('text', 'Hi'), ('text', '!')]
    assert reply.text == 'Hi!' and (reply.input_tokens, reply.output_tokens) == (0, 0)


def test_openai_stream_usage_on_every_chunk_keeps_the_last():
    events = as_sse(chunk({'content': 'a'}, usage={'prompt_tokens': 3, 'completion_tokens': 1}),
                    chunk({}, finish='stop', usage={'prompt_tokens': 3, 'completion_tokens': 2}),
                    chunk(choices=[], usage=None)) + [DONE]
    reply = run_stream(openai(), events)[1]
    assert (reply.input_tokens, reply.output_tokens) == (3, 2)


def test_openai_stream_refusal_and_list_content_deltas():
    deltas, reply = run_stream(openai(), as_sse(chunk({'refusal': 'I can'}), chunk({'refusal': "'t."}),
                                                chunk({}, finish='stop')) + [DONE])
    assert reply.text == "I can't." and deltas == []
    reply = run_stream(openai(), as_sse(chunk({'content': [{'type': 'text', 'text': 'ok'}]}),
                                        chunk({}, finish='stop')) + [DONE])[1]
    assert reply.text == 'ok'


def test_openai_stream_null_error_field_is_not_an_error():
    assert run_stream(openai(), as_sse(chunk({'content': 'x'}, error=None), chunk({}, finish='stop')) + [DONE])


def test_openai_stream_cut_before_finish_says_what_was_missing():
    assert list(openai().parse_stream(iter(as_sse(chunk({'content': 'x'}), chunk({}, finish='stop')))))[-1] \
        .as_result()['text'] == 'x'
    with pytest.raises(LLMError, match=r'no finish_reason, no "data: \[DONE\]"') as info:
        list(openai().parse_stream(iter(as_sse(chunk({'content': 'x'})))))
    assert info.value.provider_body['choices'][0]['message']['content'] == 'x'


@pytest.mark.parametrize('model', ['o1', 'o3-mini', 'o4-mini-2025-04-16', 'gpt-5', 'gpt-5.1', 'gpt-5-mini'])
def test_openai_reasoning_models_get_max_completion_tokens(model):
    body = openai(model=model, max_tokens=300).build_request(Request('x'))
    assert body['max_completion_tokens'] == 300 and 'max_tokens' not in body
    assert_valid(CompletionCreateParamsNonStreaming, body)
    explicit = openai(model=model).build_request(Request('x', params={'max_tokens': 50}))
    assert explicit['max_tokens'] == 50 and 'max_completion_tokens' not in explicit


@pytest.mark.parametrize('model', ['gpt-4o', 'gpt-4.1-mini', 'llama3.2', 'omni-7b', 'o'])
def test_openai_other_models_keep_max_tokens(model):
    body = openai(model=model).build_request(Request('x'))
    assert 'max_tokens' in body and 'max_completion_tokens' not in body


def test_openai_replays_an_empty_reply_as_non_empty_text():
    body = openai().build_request(Request('next', history=(Turn('q', ''),)))
    assert body['messages'][1] == {'role': 'assistant', 'content': EMPTY_REPLY}
    for message in body['messages']:
        assert_valid(ChatCompletionMessageParam, message)


# ---- Gemini generateContent


def gemini(**fields):
    fields.setdefault('model', 'gemini-2.5-flash')
    return make_provider('gemini', **fields)


def candidate(*parts, finish='STOP'):
    body = {'content': {'role': 'model', 'parts': list(parts)}, 'index': 0}
    if finish:
        body['finishReason'] = finish
    return body


def test_gemini_several_parts_thoughts_and_other_part_kinds():
    body = {'candidates': [candidate({'text': 'Let me think', 'thought': True}, {'text': 'Hel'},
                                     {'functionCall': {'name': 'f', 'args': {}}}, {'text': 'lo', 'thoughtSignature': 'x'},
                                     {'executableCode': {'code': 'print(1)'}})],
            'usageMetadata': {'promptTokenCount': 4, 'candidatesTokenCount': 2, 'thoughtsTokenCount': 5,
                              'totalTokenCount': 11, 'promptTokensDetails': [{'modality': 'TEXT', 'tokenCount': 4}]},
            'modelVersion': 'gemini-2.5-flash', 'responseId': 'r1', 'createTime': '2025-01-01T00:00:00Z'}
    reply = gemini().parse_response(body)
    assert (reply.text, reply.thinking) == ('Hello', 'Let me think')
    assert (reply.input_tokens, reply.output_tokens) == (4, 7)


def test_gemini_max_tokens_with_text_and_missing_usage_counts():
    body = {'candidates': [candidate({'text': 'Trunc'}, finish='MAX_TOKENS')],
            'usageMetadata': {'promptTokenCount': 3, 'totalTokenCount': 3}}
    reply = gemini().parse_response(body)
    assert reply.text == 'Trunc' and (reply.input_tokens, reply.output_tokens) == (3, 0)
    reply = gemini().parse_response({'candidates': [candidate({'text': 'x'})]})
    assert (reply.input_tokens, reply.output_tokens) == (0, 0)


def test_gemini_prompt_feedback_without_block_is_fine_with_block_is_an_error():
    ratings = {'safetyRatings': [{'category': 'HARM_CATEGORY_HARASSMENT', 'probability': 'NEGLIGIBLE'}]}
    assert gemini().parse_response({'candidates': [candidate({'text': 'ok'})], 'promptFeedback': ratings}).text == 'ok'
    with pytest.raises(LLMError, match='PROHIBITED_CONTENT'):
        gemini().parse_response({'promptFeedback': {'blockReason': 'PROHIBITED_CONTENT', **ratings},
                                 'usageMetadata': {'promptTokenCount': 3}})


def test_gemini_stream_keeps_usage_from_an_earlier_chunk_and_a_candidateless_last_chunk():
    events = as_sse({'candidates': [candidate({'text': 'Hel'}, finish=None)],
                     'usageMetadata': {'promptTokenCount': 4, 'candidatesTokenCount': 1}},
                    {'candidates': [candidate({'text': 'lo'})],
                     'usageMetadata': {'promptTokenCount': 4, 'candidatesTokenCount': 2}},
                    {'usageMetadata': {}, 'modelVersion': 'gemini-2.5-flash'})
    deltas, reply = run_stream(gemini(), events)
    assert deltas == [('text', 'Hel'), ('text', 'lo')] and reply.text == 'Hello'
    assert (reply.input_tokens, reply.output_tokens) == (4, 2) and reply.model == 'gemini-2.5-flash'


def test_gemini_stream_tolerates_a_done_marker_and_thought_chunks():
    events = as_sse({'candidates': [candidate({'text': 'hm', 'thought': True}, finish=None)]},
                    {'candidates': [candidate({'text': 'Yes'})]}) + [DONE]
    deltas, reply = run_stream(gemini(), events)
    assert deltas == [('thinking', 'hm'), ('text', 'Yes')] and (reply.text, reply.thinking) == ('Yes', 'hm')


def test_gemini_snake_case_generation_config_is_merged_not_sent_twice():
    body = gemini(max_tokens=77, params={'generation_config': {'temperature': 0.5}}).build_request(Request('x'))
    assert body['generationConfig'] == {'maxOutputTokens': 77, 'temperature': 0.5}
    assert 'generation_config' not in body


def test_gemini_replays_an_empty_reply_as_non_empty_text():
    body = gemini().build_request(Request('next', history=(Turn('q', ''),)))
    assert body['contents'][1] == {'role': 'model', 'parts': [{'text': EMPTY_REPLY}]}


# ---- OpenAI Responses


def responses(**fields):
    fields.setdefault('model', 'gpt-5')
    return make_provider('openai-responses', **fields)


def response_body(output, status='completed', **extra):
    return {'id': 'resp_1', 'object': 'response', 'status': status, 'model': 'gpt-5', 'error': None,
            'incomplete_details': None, 'output': output,
            'usage': {'input_tokens': 9, 'input_tokens_details': {'cached_tokens': 4}, 'output_tokens': 20,
                      'output_tokens_details': {'reasoning_tokens': 12}, 'total_tokens': 29}, **extra}


def message_item(*parts):
    return {'id': 'msg_1', 'type': 'message', 'role': 'assistant', 'status': 'completed', 'content': list(parts)}


def output_text(text):
    return {'type': 'output_text', 'text': text, 'annotations': [], 'logprobs': []}


def test_responses_reasoning_several_text_parts_and_other_items():
    body = response_body([{'id': 'rs_1', 'type': 'reasoning', 'summary': [], 'content': None},
                          {'id': 'ws_1', 'type': 'web_search_call', 'status': 'completed'},
                          message_item(output_text('Hel'), output_text('lo'))],
                         reasoning={'effort': 'low', 'summary': None}, future={'x': 1})
    reply = responses().parse_response(body)
    assert (reply.text, reply.thinking) == ('Hello', '') and (reply.input_tokens, reply.output_tokens) == (9, 20)


def test_responses_refusal_and_incomplete_are_replies():
    refusal = responses().parse_response(response_body([message_item({'type': 'refusal', 'refusal': 'No.'})]))
    assert refusal.text == 'No.'
    partial = responses().parse_response(response_body(
        [message_item(output_text('Par'))], status='incomplete', incomplete_details={'reason': 'max_output_tokens'}))
    assert partial.text == 'Par'


def test_responses_stream_uses_deltas_when_the_final_response_carries_no_text():
    events = as_sse({'type': 'response.created', 'response': response_body([], status='in_progress')},
                    {'type': 'response.output_text.delta', 'item_id': 'msg_1', 'output_index': 0,
                     'content_index': 0, 'delta': 'Hi'},
                    {'type': 'response.completed', 'response': response_body([])})
    deltas, reply = run_stream(responses(), events)
    assert deltas == [('text', 'Hi')] and reply.text == 'Hi' and reply.input_tokens == 9


def test_responses_stream_error_event_with_nested_error_object():
    events = as_sse({'type': 'error', 'error': {'type': 'server_error', 'message': 'boom'}})
    with pytest.raises(LLMError, match='boom'):
        list(responses().parse_stream(iter(events)))


def test_responses_replays_an_empty_reply_as_non_empty_text():
    body = responses().build_request(Request('next', history=(Turn('q', ''),)))
    assert body['input'][1] == {'role': 'assistant', 'content': EMPTY_REPLY}
    for item in body['input']:
        assert_valid(ResponseInputItemParam, item)


def reasoning_content_item(*texts):
    """A reasoning item as vLLM, LM Studio and gpt-oss servers send it: empty summary, text in content."""
    return {'id': 'rs_1', 'type': 'reasoning', 'summary': [],
            'content': [{'type': 'reasoning_text', 'text': t} for t in texts]}


def test_responses_reasoning_in_content_rather_than_summary_reaches_thinking():
    reply = responses().parse_response(response_body([reasoning_content_item('We need to greet.', 'Say hi.'),
                                                      message_item(output_text('Hi'))]))
    assert (reply.text, reply.thinking) == ('Hi', 'We need to greet.\n\nSay hi.')


def test_responses_summary_wins_over_raw_reasoning_content():
    item = dict(reasoning_content_item('raw'), summary=[{'type': 'summary_text', 'text': 'short'}])
    assert responses().parse_response(response_body([item, message_item(output_text('x'))])).thinking == 'short'


def test_responses_stream_reasoning_text_deltas_and_final_content_reach_thinking():
    final = response_body([reasoning_content_item('Think.'), message_item(output_text('Hi'))])
    events = as_sse({'type': 'response.reasoning_text.delta', 'item_id': 'rs_1', 'output_index': 0,
                     'content_index': 0, 'delta': 'Think.'},
                    {'type': 'response.output_text.delta', 'item_id': 'msg_1', 'delta': 'Hi'},
                    {'type': 'response.completed', 'response': final})
    deltas, reply = run_stream(responses(), events)
    assert deltas == [('thinking', 'Think.'), ('text', 'Hi')] and reply.thinking == 'Think.'
    # A final response that drops the reasoning still keeps what the deltas carried.
    events[-1] = as_sse({'type': 'response.completed', 'response': response_body([message_item(output_text('Hi'))])})[0]
    assert run_stream(responses(), events)[1].thinking == 'Think.'


LITELLM_FORGOT = {'error': {'message': "litellm.BadRequestError: OpenAIException - Previous response with id "
                                       "'resp_1' not found.", 'type': None, 'param': None, 'code': '400'}}
LITELLM_QUOTED = {'error': {'message': 'litellm.BadRequestError: OpenAIException - {"error": {"message": '
                                       '"Previous response with id \'resp_1\' not found.", "code": '
                                       '"previous_response_not_found"}}', 'type': 'None', 'param': 'None',
                            'code': '400'}}


@pytest.mark.parametrize('status, body, forgot', [
    (400, LITELLM_FORGOT, True),
    (400, LITELLM_QUOTED, True),
    (404, {'detail': "Response with id 'resp_1' not found"}, True),
    (400, "Prediction history node with id 'resp_1' not found while building the chain", True),
    (404, {'error': {'message': 'The model `gpt-9` does not exist or was not found', 'code': '404'}}, False),
    (400, {'error': {'message': 'Invalid value for max_output_tokens', 'param': None, 'code': '400'}}, False),
], ids=['litellm-rewrapped', 'litellm-quoted-json', 'detail-404', 'lm-studio-text', 'model-404', 'other-400'])
def test_a_forgotten_chain_is_recognised_in_the_forms_gateways_send(status, body, forgot):
    from llmconn.providers.openai_responses import forgot_previous as _forgot_previous
    error = LLMError(f'wire: provider answered HTTP {status}', status=status, provider_body=body)
    assert _forgot_previous(error, 'resp_1') is forgot


def test_a_chain_forgotten_behind_a_gateway_is_reseeded_from_local_history(server, redis_url, unique):
    first = response_body([message_item(output_text('one'))])
    second = dict(response_body([message_item(output_text('two'))]), id='resp_2')
    server.script = [(200, {}, json.dumps(first).encode()),
                     (400, {'content-type': 'application/json'}, json.dumps(LITELLM_FORGOT).encode()),
                     (200, {}, json.dumps(second).encode())]
    conn = Registry.from_dict({'redis': {'url': redis_url}, 'llm': [
        {'name': 'wire', 'provider': 'openai-responses', 'model': 'gpt-5', 'address': server.url,
         'state': 'provider', 'max_retries': 0}]})['wire']
    try:
        conn.chat('a', chat_id=unique)
        assert conn.chat('b', chat_id=unique)['text'] == 'two'
    finally:
        conn.close()
    resent = json.loads(server.received[2][2])
    assert 'previous_response_id' not in resent
    assert [item['content'] for item in resent['input']] == ['a', 'one', 'b']


# ---- a stream request answered with one plain JSON body


def unstreamed(provider, body) -> tuple[list, object]:
    out = list(provider.read_stream(JSONBody(body)))
    assert [isinstance(e, Reply) for e in out].count(True) == 1 and isinstance(out[-1], Reply), out
    return [(e.type, e.text) for e in out[:-1]], out[-1]


def test_every_mapping_accepts_an_unstreamed_answer_to_a_stream_request():
    claude_body = {'type': 'message', 'content': [{'type': 'text', 'text': 'C'}], 'usage': {'input_tokens': 1}}
    openai_body = {'choices': [{'index': 0, 'message': {'role': 'assistant', 'content': 'O'}}]}
    gemini_body = {'candidates': [candidate({'text': 'G'})]}
    for provider, body, text in [(claude(), claude_body, 'C'), (openai(), openai_body, 'O'),
                                 (gemini(), gemini_body, 'G'),
                                 (responses(), response_body([message_item(output_text('R'))]), 'R')]:
        deltas, reply = unstreamed(provider, body)
        assert deltas == [('text', text)] and reply.text == text, provider.name


def test_an_unstreamed_error_body_is_still_an_error():
    with pytest.raises(LLMError, match='overloaded'):
        unstreamed(openai(), {'error': {'message': 'overloaded', 'type': 'server_error'}})


# ---- through HTTP, against the scripted server (tests/scripted_server.py)


def transport(max_retries=2):
    sleeps = []
    return Transport('wire', pool_size=2, timeout=5, max_retries=max_retries, sleep=sleeps.append), sleeps


def connection(server, provider, model, **fields):
    conf = {'name': 'wire', 'provider': provider, 'model': model, 'address': server.url, 'max_retries': 1,
            **fields}
    return Registry.from_dict({'llm': [conf]})['wire']


NON_ASCII = {'choices': [{'index': 0, 'message': {'role': 'assistant', 'content': 'Grüße, žluťoučký kůň'}}]}


@pytest.mark.parametrize('content_type', ['application/json; charset=utf-8', 'application/json', None,
                                          'text/plain', 'text/html', 'application/json; charset="UTF-8"'])
def test_utf8_json_is_read_whatever_the_content_type_says(server, content_type):
    headers = {'content-type': content_type} if content_type else {}
    server.script = [(200, headers, json.dumps(NON_ASCII, ensure_ascii=False).encode())]
    assert transport()[0].post(server.url, {}, {}) == NON_ASCII


def test_a_declared_charset_other_than_utf8_is_honoured(server):
    server.script = [(200, {'content-type': 'application/json; charset=iso-8859-1'},
                      json.dumps({'t': 'Grüße'}, ensure_ascii=False).encode('latin-1'))]
    assert transport()[0].post(server.url, {}, {}) == {'t': 'Grüße'}


def test_gzip_bodies_are_decoded_plain_and_streamed(server):
    body = json.dumps(NON_ASCII).encode()
    stream = b'data: {"a": 1}\n\ndata: [DONE]\n\n'
    server.script = [(200, {'content-encoding': 'gzip', 'content-type': 'application/json'}, gzip.compress(body)),
                     (200, {'content-encoding': 'gzip', 'content-type': 'text/event-stream'}, gzip.compress(stream))]
    tr = transport()[0]
    assert tr.post(server.url, {}, {}) == NON_ASCII
    assert [tuple(e) for e in tr.post_stream(server.url, {}, {}).events] == [('', '{"a": 1}'), ('', '[DONE]')]


def test_claude_529_overloaded_is_retried_then_rate_limited_with_its_message(server):
    overloaded = json.dumps({'type': 'error', 'error': {'type': 'overloaded_error', 'message': 'Overloaded'},
                             'request_id': 'req_1'}).encode()
    server.script = [(529, {'content-type': 'application/json', 'x-should-retry': 'true'}, overloaded)] * 3
    tr, sleeps = transport(max_retries=2)
    with pytest.raises(LLMRateLimited, match=r'529: Overloaded \(overloaded_error\)') as info:
        tr.post(server.url, {}, {})
    assert len(server.received) == 3 and len(sleeps) == 2 and info.value.provider_body['request_id'] == 'req_1'


def test_retry_after_ms_is_read_whatever_the_header_case(server):
    server.script = [(429, {'Retry-After-Ms': '120', 'RETRY-AFTER': '30'}, b'{}'), (200, {}, b'{"ok": 1}')]
    tr, sleeps = transport()
    assert tr.post(server.url, {}, {}) == {'ok': 1} and sleeps == [0.12]


def test_an_html_error_page_is_an_llm_error_with_the_page_as_body(server):
    page = b'<html>\n<head><title>502 Bad Gateway</title></head>\n<body>nginx</body>\n</html>'
    server.script = [(502, {'content-type': 'text/html'}, page)] * 2
    with pytest.raises(LLMError, match='502 Bad Gateway') as info:
        transport(max_retries=1)[0].post(server.url, {}, {})
    assert info.value.status == 502 and info.value.provider_body == page.decode()
    assert '\n' not in str(info.value)


def test_a_slow_stream_split_inside_characters_and_line_ends_arrives_whole(server):
    raw = 'event: a\r\ndata: {"t": "kůň 🐎"}\r\n\r\ndata: [DONE]'.encode()
    server.script = [(200, {'content-type': 'text/event-stream'}, [raw[i:i + 3] for i in range(0, len(raw), 3)])]
    assert [tuple(e) for e in transport()[0].post_stream(server.url, {}, {}).events] == [
        ('a', '{"t": "kůň 🐎"}'), ('', '[DONE]')]


def test_a_stream_request_answered_with_a_json_array_is_one_json_body(server):
    # Gemini's streamGenerateContent without alt=sse: a JSON array, streamed, with CRLFs between elements.
    raw = b'\xef\xbb\xbf [{"candidates": []}\r\n,\r\n{"usageMetadata": {}}\r\n]'
    server.script = [(200, {'content-type': 'application/json'}, [raw[:5], raw[5:20], raw[20:]])]
    answer = transport()[0].post_stream(server.url, {}, {})
    assert answer == JSONBody([{'candidates': []}, {'usageMetadata': {}}])


def test_a_stream_request_answered_with_garbage_is_a_clear_error(server):
    server.script = [(200, {'content-type': 'application/json'}, b'{"not json')]
    with pytest.raises(LLMError, match='neither server-sent events nor JSON'):
        list(transport()[0].post_stream(server.url, {}, {}))


def test_gemini_end_to_end_when_the_server_ignores_alt_sse(server):
    chunks = [{'candidates': [candidate({'text': 'Hel'}, finish=None)]},
              {'candidates': [candidate({'text': 'lo'})], 'usageMetadata': {'promptTokenCount': 2,
                                                                           'candidatesTokenCount': 1}}]
    server.script = [(200, {'content-type': 'application/json; charset=UTF-8'}, json.dumps(chunks).encode())]
    events = list(connection(server, 'gemini', 'gemini-2.5-flash').stream('hi'))
    assert [(e.type, e.text) for e in events[:-1]] == [('text', 'Hel'), ('text', 'lo')]
    assert events[-1].result['text'] == 'Hello' and events[-1].result['usage'] == {
        'input_tokens': 2, 'output_tokens': 1, 'cache_read_tokens': 0, 'cache_write_tokens': 0, 'reasoning_tokens': 0}
    assert server.received[0][0] == '/models/gemini-2.5-flash:streamGenerateContent?alt=sse'


def test_openai_end_to_end_when_the_server_ignores_stream(server):
    body = {'id': 'c', 'object': 'chat.completion', 'choices': [
        {'index': 0, 'message': {'role': 'assistant', 'content': 'Whole'}, 'finish_reason': 'stop'}],
        'usage': {'prompt_tokens': 3, 'completion_tokens': 1}}
    server.script = [(200, {'content-type': 'application/json'}, json.dumps(body).encode())]
    events = list(connection(server, 'openai', 'llama3.2').stream('hi'))
    assert [(e.type, e.text) for e in events] == [('text', 'Whole'), ('done', '')]
    assert events[-1].result['usage'] == {'input_tokens': 3, 'output_tokens': 1, 'cache_read_tokens': 0, 'cache_write_tokens': 0, 'reasoning_tokens': 0}
    assert json.loads(server.received[0][2])['stream'] is True


def test_claude_end_to_end_stream_with_crlf_no_event_lines_and_no_final_blank_line(server):
    events = claude_stream(text_delta('Hi'), named=False)
    raw = '\r\n\r\n'.join(f'data:{e.data}' for e in events).encode()
    server.script = [(200, {'content-type': 'text/event-stream; charset=utf-8'}, [raw[:40], raw[40:]])]
    result = list(connection(server, 'claude', 'claude-sonnet-5-5').stream('hi'))[-1].result
    assert result['text'] == 'Hi' and result['usage'] == {'input_tokens': 5, 'output_tokens': 4,
                                                             'cache_read_tokens': 0, 'cache_write_tokens': 0, 'reasoning_tokens': 0}


# ---- a surrogate pair split between two stream events (a mock server and LiteLLM's /v1/messages do it)


def split_pair_streams():
    halves = ('a \ud83d', '\ude00 b')
    return {
        'claude': (claude(), claude_stream(*(text_delta(h) for h in halves))),
        'openai': (openai(), as_sse(chunk({'content': halves[0]}), chunk({'content': halves[1]}), chunk({}, finish='stop'))
                   + [DONE]),
        'gemini': (gemini(), as_sse({'candidates': [candidate({'text': halves[0]}, finish=None)]},
                                    {'candidates': [candidate({'text': halves[1]})]})),
        'openai-responses': (responses(), as_sse(
            *({'type': 'response.output_text.delta', 'item_id': 'msg_1', 'delta': h} for h in halves),
            {'type': 'response.completed', 'response': response_body([message_item(output_text(''.join(halves)))])})),
    }


@pytest.mark.parametrize('name', list(split_pair_streams()))
def test_every_mapping_joins_a_surrogate_pair_split_between_events(name):
    provider, events = split_pair_streams()[name]
    out = list(provider.read_stream(EventStream(iter(events))))
    assert [e.text for e in out[:-1] if e.type == 'text'] == ['a ', '\U0001f600 b']
    assert out[-1].as_result()['text'] == 'a \U0001f600 b'
    json.dumps(out[-1].as_result(), ensure_ascii=False).encode('utf-8')     # no lone surrogate anywhere
