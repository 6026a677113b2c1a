"""Complete usage (SPEC §17): cache reads, cache writes and reasoning tokens from every provider.

Each provider's answer is built with its official SDK type (the wire
reference), parsed, and its counts read back: ``input_tokens`` stays the
whole input, the cache counts are parts of it, ``reasoning_tokens`` part of
the output. The gateway's usage objects are held to the SDK types too.
"""

from __future__ import annotations

from anthropic.types import Message
from openai.types import CompletionUsage
from openai.types.chat import ChatCompletion
from openai.types.responses import Response, ResponseUsage

from llmconn.gateway.chat_completions import _usage as completion_usage
from llmconn.gateway.responses import usage_object
from llmconn.tool_loop import TurnLoop
from llmconn.types import USAGE_KEYS, Reply

from provider_helpers import make_provider, run_stream, sse


def counts(reply: Reply) -> tuple:
    return tuple(reply.usage[k] for k in USAGE_KEYS)


def test_claude_input_is_the_uncached_part_plus_what_was_read_and_written():
    body = Message.model_validate({
        'id': 'msg_1', 'type': 'message', 'role': 'assistant', 'model': 'claude-sonnet-5-5',
        'content': [{'type': 'text', 'text': 'Hi'}], 'stop_reason': 'end_turn', 'stop_sequence': None,
        'usage': {'input_tokens': 12, 'cache_read_input_tokens': 3000, 'cache_creation_input_tokens': 400,
                  'output_tokens': 9}}).model_dump(mode='json')
    reply = make_provider('claude', model='claude-sonnet-5-5').parse_response(body)
    assert counts(reply) == (3412, 9, 3000, 400, 0)
    assert reply.as_result()['usage'] == dict(zip(USAGE_KEYS, (3412, 9, 3000, 400, 0)))


def test_claude_stream_takes_the_cache_counts_of_message_start():
    provider = make_provider('claude', model='claude-sonnet-5-5')
    usage = {'input_tokens': 5, 'cache_read_input_tokens': 2048, 'cache_creation_input_tokens': 0,
             'output_tokens': 1}
    start = {'type': 'message_start', 'message': {
        'id': 'msg_1', 'type': 'message', 'role': 'assistant', 'model': 'claude-sonnet-5-5', 'content': [],
        'stop_reason': None, 'stop_sequence': None, 'usage': usage}}
    events = [start, {'type': 'content_block_start', 'index': 0, 'content_block': {'type': 'text', 'text': ''}},
              {'type': 'content_block_delta', 'index': 0, 'delta': {'type': 'text_delta', 'text': 'Hi'}},
              {'type': 'content_block_stop', 'index': 0},
              {'type': 'message_delta', 'delta': {'stop_reason': 'end_turn', 'stop_sequence': None},
               'usage': {'output_tokens': 7}},
              {'type': 'message_stop'}]
    _, reply = run_stream(provider, sse(events))
    assert counts(reply) == (2053, 7, 2048, 0, 0)


def test_openai_chat_details_are_parts_of_the_totals():
    body = ChatCompletion.model_validate({
        'id': 'c1', 'object': 'chat.completion', 'created': 1, 'model': 'gpt-5',
        'choices': [{'index': 0, 'finish_reason': 'stop', 'message': {'role': 'assistant', 'content': 'Hi'}}],
        'usage': {'prompt_tokens': 2100, 'completion_tokens': 300, 'total_tokens': 2400,
                  'prompt_tokens_details': {'cached_tokens': 1920},
                  'completion_tokens_details': {'reasoning_tokens': 256}}}).model_dump(mode='json')
    assert counts(make_provider('openai').parse_response(body)) == (2100, 300, 1920, 0, 256)


def test_openai_chat_server_without_details_or_with_nulls_reports_zero():
    body = {'id': 'c1', 'object': 'chat.completion', 'choices': [{'index': 0, 'message': {'content': 'Hi'}}],
            'usage': {'prompt_tokens': 4, 'completion_tokens': 2, 'prompt_tokens_details': None,
                      'completion_tokens_details': {'reasoning_tokens': None}}}
    assert counts(make_provider('openai').parse_response(body)) == (4, 2, 0, 0, 0)


def test_openai_responses_details_are_parts_of_the_totals():
    body = Response.model_validate({
        'id': 'resp_1', 'object': 'response', 'created_at': 1, 'model': 'gpt-5', 'status': 'completed',
        'output': [{'type': 'message', 'id': 'msg_1', 'role': 'assistant', 'status': 'completed',
                    'content': [{'type': 'output_text', 'text': 'Hi', 'annotations': []}]}],
        'parallel_tool_calls': True, 'tool_choice': 'auto', 'tools': [],
        'usage': {'input_tokens': 1500, 'output_tokens': 80, 'total_tokens': 1580,
                  'input_tokens_details': {'cached_tokens': 1152, 'cache_write_tokens': 128},
                  'output_tokens_details': {'reasoning_tokens': 64}}}).model_dump(mode='json')
    assert counts(make_provider('openai-responses').parse_response(body)) == (1500, 80, 1152, 128, 64)


def test_gemini_cached_content_and_thoughts():
    body = {'candidates': [{'content': {'role': 'model', 'parts': [{'text': 'Hi'}]}, 'finishReason': 'STOP'}],
            'usageMetadata': {'promptTokenCount': 3000, 'cachedContentTokenCount': 2048,
                              'candidatesTokenCount': 10, 'thoughtsTokenCount': 40, 'totalTokenCount': 3050}}
    # Thinking is output: the 40 thought tokens are in output_tokens and named as reasoning.
    assert counts(make_provider('gemini', model='gemini-2.5-flash').parse_response(body)) == (3000, 50, 2048, 0, 40)


def test_tool_loop_sums_every_count_of_every_round():
    loop = TurnLoop(None, None, 'claude/m/plain')
    loop.add(Reply('', input_tokens=3000, output_tokens=20, cache_read_tokens=2048, cache_write_tokens=900,
                   reasoning_tokens=5, steps=({'kind': 'text', 'text': ''},)), {})
    loop.add(Reply('done', input_tokens=3100, output_tokens=30, cache_read_tokens=2948, reasoning_tokens=7), {})
    assert loop.result['usage'] == {'input_tokens': 6100, 'output_tokens': 50, 'cache_read_tokens': 4996,
                                    'cache_write_tokens': 900, 'reasoning_tokens': 12}


def test_gateway_response_usage_carries_the_counts_and_is_a_response_usage():
    reply = Reply('Hi', input_tokens=3412, output_tokens=9, cache_read_tokens=3000, cache_write_tokens=400,
                  reasoning_tokens=4)
    usage = usage_object(**reply.usage)
    ResponseUsage.model_validate(usage)
    assert usage['input_tokens_details'] == {'cached_tokens': 3000, 'cache_write_tokens': 400}
    assert usage['output_tokens_details'] == {'reasoning_tokens': 4} and usage['total_tokens'] == 3421


def test_gateway_completion_usage_carries_the_counts_and_is_a_completion_usage():
    reply = Reply('Hi', input_tokens=2100, output_tokens=300, cache_read_tokens=1920, reasoning_tokens=256)
    usage = completion_usage(reply)
    CompletionUsage.model_validate(usage)
    assert usage['prompt_tokens_details']['cached_tokens'] == 1920
    assert usage['completion_tokens_details'] == {'reasoning_tokens': 256}
