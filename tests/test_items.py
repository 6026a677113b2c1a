"""The canonical item model and each mapping's rendering of it, without HTTP."""

from __future__ import annotations

from llmconn import items
from llmconn.tools import Tool
from llmconn.types import Request, Turn

from provider_helpers import make_provider

CALL = items.call('c1', 'add', {'a': 1})
OUTPUT = items.output('c1', '2')


def tool_turn(provider, native_call=None, reasoning=None):
    steps = ([items.reasoning(reasoning)] if reasoning else []) + [
        items.call('c1', 'add', {'a': 1}, native=native_call), OUTPUT, items.text('two')]
    return Turn('add one', 'two', items=tuple(steps), tag=provider.tag)


def test_rounds_pair_each_round_with_the_outputs_that_answer_it():
    steps = [items.text('let me see'), CALL, OUTPUT, items.text('two')]
    assert items.rounds(steps) == [([items.text('let me see'), CALL], [OUTPUT]), ([items.text('two')], [])]
    assert items.final_text(steps) == 'two' and items.pending_calls(steps) == []
    assert items.pending_calls([CALL]) == [CALL]


def test_a_legacy_responses_turn_keeps_its_message_native_as_the_text():
    message = {'type': 'message', 'id': 'msg_1', 'role': 'assistant', 'content': []}
    reasoning = {'type': 'reasoning', 'id': 'rs_1', 'summary': []}
    steps = Turn('q', 'answer', items=(reasoning, message), tag='t').steps()
    assert steps == [items.reasoning(reasoning), items.text('answer', native=message)]


def test_claude_sends_calls_from_another_model_as_plain_tool_use_without_thinking():
    made = make_provider('claude', model='claude-opus-5-5')
    thinking = {'type': 'thinking', 'thinking': 'hm', 'signature': 'sig'}
    turn = tool_turn(made, native_call={'type': 'tool_use', 'id': 'c1', 'name': 'add', 'input': {'a': 1}},
                     reasoning=thinking)
    other = make_provider('claude', model='claude-haiku-5-5')
    messages = other.build_request(Request('next', history=(turn,)))['messages']
    assert messages[1] == {'role': 'assistant', 'content': [{'type': 'tool_use', 'id': 'c1', 'name': 'add',
                                                             'input': {'a': 1}}]}
    assert messages[2] == {'role': 'user', 'content': [{'type': 'tool_result', 'tool_use_id': 'c1', 'content': '2'}]}
    same = made.build_request(Request('next', history=(turn,)))['messages']
    assert same[1]['content'][0] == thinking


def test_gemini_signatures_stay_with_their_model_and_ids_go_back_only_when_given():
    made = make_provider('gemini', model='gemini-2.5-flash')
    part = {'functionCall': {'name': 'add', 'args': {'a': 1}}, 'thoughtSignature': 'sig'}
    turn = tool_turn(made, native_call=part)
    contents = made.build_request(Request('next', history=(turn,)))['contents']
    assert contents[1]['parts'] == [part]
    assert contents[2]['parts'] == [{'functionResponse': {'name': 'add', 'response': {'output': '2'}}}]
    other = make_provider('gemini', model='gemini-2.5-pro').build_request(Request('next', history=(turn,)))
    assert other['contents'][1]['parts'] == [{'functionCall': {'name': 'add', 'args': {'a': 1}}}]


def test_gemini_synthesizes_a_call_id_once_and_keeps_the_provider_one():
    provider = make_provider('gemini', model='gemini-2.5-flash')
    body = {'candidates': [{'content': {'role': 'model', 'parts': [
        {'functionCall': {'name': 'a', 'args': {}}}, {'functionCall': {'id': 'given', 'name': 'b', 'args': {}}}]},
        'finishReason': 'STOP'}]}
    first, second = provider.parse_response(body).calls
    assert first['call_id'].startswith('call_') and second['call_id'] == 'given'


def test_responses_without_usable_reasoning_sends_calls_without_item_ids():
    provider = make_provider('openai-responses', model='gpt-4.1')
    body = {'id': 'resp_1', 'status': 'completed', 'output': [
        {'type': 'function_call', 'id': 'fc_1', 'call_id': 'c1', 'name': 'add', 'arguments': '{"a":1}'}]}
    reply = provider.parse_response(body)
    assert reply.steps == (items.call('c1', 'add', {'a': 1}),)
    sent = provider.build_request(Request('add one', items=reply.steps + (OUTPUT,)))['input']
    assert sent[1:] == [{'type': 'function_call', 'call_id': 'c1', 'name': 'add', 'arguments': '{"a": 1}'},
                        {'type': 'function_call_output', 'call_id': 'c1', 'output': '2'}]


def test_openai_keeps_arguments_that_are_not_json_for_the_validator_to_report():
    provider = make_provider('openai', model='gpt-4o-mini')
    body = {'choices': [{'index': 0, 'finish_reason': 'tool_calls', 'message': {'role': 'assistant', 'content': None,
            'tool_calls': [{'id': 'c1', 'type': 'function', 'function': {'name': 'add', 'arguments': '{"a": 1'}}]}}]}
    [call] = provider.parse_response(body).calls
    assert call['arguments'] == '{"a": 1'


def test_tool_definitions_on_each_wire_format():
    tool = Tool('add', 'Add.', {'type': 'object', 'properties': {}})
    request = Request('hi', tools=(tool,))
    assert make_provider('claude').build_request(request)['tools'] == [
        {'name': 'add', 'description': 'Add.', 'input_schema': tool.parameters}]
    assert make_provider('gemini').build_request(request)['tools'] == [
        {'functionDeclarations': [{'name': 'add', 'description': 'Add.', 'parametersJsonSchema': tool.parameters}]}]
    assert make_provider('openai-responses').build_request(request)['tools'] == [
        {'type': 'function', 'name': 'add', 'description': 'Add.', 'parameters': tool.parameters, 'strict': False}]
