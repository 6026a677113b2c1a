"""Function tools through the gateway: the ``openai`` SDK against ``llmconn serve``, the fake provider behind.

The fake model calls a declared tool when the user says ``call NAME {args}``
and answers ``tool said: <output>`` once the outputs come back; it refuses
(and records a replay violation) whatever its real API would refuse: a
Claude tool_use replayed without its signed thinking, a Gemini call without
its thoughtSignature, an output without its call. Every body and event is
validated with the SDK's own types.
"""

import json
import uuid

import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from gateway_stack import ASK, ORDER_TOOL, GatewayStack, create, reasoning_params, streamed

CHAT_TOOL = {'type': 'function', 'function': {k: v for k, v in ORDER_TOOL.items() if k != 'type'}}
# Backends whose function-call round trip goes through gateway state (thinking, encrypted reasoning,
# thought signatures replayed from the ledger) and the one that keeps the chain itself.
RESPONSES_BACKENDS = ['Claude', 'ResponsesLocal', 'Gemini', 'Chat', 'Responses']


# A backend that runs web search itself, and lists it.
SEARCHING = '''  - {name: Searching, provider: openai-responses, model: gpt-5, address: "FAKE_URL/v1", max_retries: 0,
     hosted_tools: [{type: web_search}]}'''


@pytest.fixture(scope='module')
def gw():
    stack = GatewayStack(processes=1, extra_llm=SEARCHING)
    yield stack
    stack.close()


def check_call_events(events: list[dict]) -> None:
    """Numbered without gaps; each function call added, its argument deltas, done, item done, in order."""
    assert [e['sequence_number'] for e in events] == list(range(len(events)))
    assert events[-1]['type'] == 'response.completed'
    calls = [e for e in events if e['type'].startswith('response.function_call_arguments')
             or (e['type'].startswith('response.output_item') and e['item']['type'] == 'function_call')]
    assert calls, 'no function call was streamed'
    assert calls[0]['type'] == 'response.output_item.added' and calls[0]['item']['arguments'] == ''
    deltas = [e['delta'] for e in calls if e['type'].endswith('.delta')]
    done = next(e for e in calls if e['type'] == 'response.function_call_arguments.done')
    assert ''.join(deltas) == done['arguments'] and json.loads(done['arguments']) == {'order_id': 'A-17'}
    assert calls[-1]['type'] == 'response.output_item.done' and calls[-1]['item']['arguments'] == done['arguments']
    assert {e.get('item_id', e.get('item', {}).get('id')) for e in calls} == {calls[-1]['item']['id']}


@pytest.mark.parametrize('stream', [False, True], ids=['plain', 'streamed'])
@pytest.mark.parametrize('model', RESPONSES_BACKENDS)
def test_a_function_call_round_trip_is_joined_by_call_id(gw, model, stream):
    gw.fake.clear()
    client = gw.client()
    kw = dict(model=model, input=ASK, tools=[ORDER_TOOL], **reasoning_params(model))
    if stream:
        events, first = streamed(client, **kw)
        check_call_events(events)
    else:
        first = create(client, **kw)
    calls = [i for i in first.output if i.type == 'function_call']
    assert first.status == 'completed' and len(calls) == 1 and first.usage.total_tokens > 0
    call = calls[0]
    assert call.name == 'get_order' and json.loads(call.arguments) == {'order_id': 'A-17'} and call.call_id
    assert gw.record('a', first.id)['tool_calls'] == [
        {'call_id': call.call_id, 'name': 'get_order', 'status': 'awaiting_output'}]
    again = client.responses.retrieve(first.id)      # the id a backend did not give is made once, then kept
    assert [(i.call_id, i.arguments) for i in again.output if i.type == 'function_call'] == [
        (call.call_id, call.arguments)]
    answer_kw = dict(model=model, previous_response_id=first.id, tools=[ORDER_TOOL], **reasoning_params(model),
                     input=[{'type': 'function_call_output', 'call_id': call.call_id, 'output': 'shipped'}])
    second = streamed(client, **answer_kw)[1] if stream else create(client, **answer_kw)
    assert second.status == 'completed' and second.output_text == 'tool said: shipped'
    assert gw.record('a', second.id)['tool_outputs'] == [
        {'call_id': call.call_id, 'name': 'get_order', 'response_id': first.id, 'status': 'answered'}]
    assert gw.fake.violations == []


def test_claude_gets_its_signed_thinking_back_before_the_tool_use(gw):
    gw.fake.clear()
    client = gw.client()
    first = create(client, model='Claude', input=ASK, tools=[ORDER_TOOL])
    assert first.output[0].type == 'reasoning'
    call = next(i for i in first.output if i.type == 'function_call')
    create(client, model='Claude', previous_response_id=first.id, tools=[ORDER_TOOL],
           input=[{'type': 'function_call_output', 'call_id': call.call_id, 'output': 'ok'}])
    sent = [r for r in gw.fake.requests if r['path'].endswith('/messages')][-1]['body']
    assistant = sent['messages'][1]['content']
    assert [b['type'] for b in assistant][:1] == ['thinking'] and assistant[0].get('signature')
    assert assistant[-1]['type'] == 'tool_use' and assistant[-1]['id'] == call.call_id
    result = sent['messages'][2]['content'][0]
    assert result['type'] == 'tool_result' and result['tool_use_id'] == call.call_id
    assert gw.fake.violations == []


@pytest.mark.parametrize('model', ['Claude', 'Responses'])
def test_an_output_for_an_unknown_call_id_is_400_before_dispatch(gw, model):
    client = gw.client()
    first = create(client, model=model, input=ASK, tools=[ORDER_TOOL])
    gw.fake.clear()
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=model, previous_response_id=first.id, tools=[ORDER_TOOL],
                                input=[{'type': 'function_call_output', 'call_id': 'call_forged', 'output': 'x'}])
    assert refused.value.body['code'] == 'unknown_call_id' and 'call_forged' in refused.value.body['message']
    assert gw.fake.requests == []


def test_a_call_left_unanswered_is_400_naming_it(gw):
    client = gw.client()
    first = create(client, model='Claude', input=ASK, tools=[ORDER_TOOL])
    call_id = next(i for i in first.output if i.type == 'function_call').call_id
    gw.fake.clear()
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model='Claude', previous_response_id=first.id, tools=[ORDER_TOOL],
                                input='never mind that')
    assert refused.value.body['code'] == 'unanswered_function_call' and call_id in refused.value.body['message']
    assert gw.fake.requests == []


def test_another_tenant_cannot_answer_the_calls_of_a_response(gw):
    first = create(gw.client('a'), model='Claude', input=ASK, tools=[ORDER_TOOL])
    call_id = next(i for i in first.output if i.type == 'function_call').call_id
    with pytest.raises(openai.NotFoundError):
        gw.client('b').responses.create(model='Claude', previous_response_id=first.id, tools=[ORDER_TOOL],
                                        input=[{'type': 'function_call_output', 'call_id': call_id, 'output': 'x'}])


@pytest.mark.parametrize('model', ['Chat', 'Claude', 'Gemini', 'ResponsesLocal'])
def test_chat_completions_tool_calls_and_tool_messages(gw, model):
    gw.fake.clear()
    client = gw.client()
    messages = [{'role': 'user', 'content': ASK}]
    raw = client.chat.completions.with_raw_response.create(model=model, messages=messages, tools=[CHAT_TOOL])
    first = ChatCompletion.model_validate(raw.http_response.json())
    choice = first.choices[0]
    assert choice.finish_reason == 'tool_calls' and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.function.name == 'get_order' and json.loads(call.function.arguments) == {'order_id': 'A-17'}
    messages += [choice.message.model_dump(exclude_none=True, include={'role', 'content', 'tool_calls'}),
                 {'role': 'tool', 'tool_call_id': call.id, 'content': 'shipped'}]
    second = client.chat.completions.create(model=model, messages=messages, tools=[CHAT_TOOL])
    assert second.choices[0].finish_reason == 'stop'
    assert second.choices[0].message.content == 'tool said: shipped'
    assert gw.fake.violations == []     # Claude's signed thinking, Gemini's signatures: from the call registry


def test_chat_completions_stream_tool_calls_as_openai_does(gw):
    chunks = []
    for chunk in gw.client().chat.completions.create(model='Chat', messages=[{'role': 'user', 'content': ASK}],
                                                     tools=[CHAT_TOOL], stream=True):
        ChatCompletionChunk.model_validate(chunk.model_dump(mode='json', warnings=False))
        chunks.append(chunk)
    deltas = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert deltas[0].index == 0 and deltas[0].id and deltas[0].function.name == 'get_order'
    assert all(d.index == 0 and d.id is None for d in deltas[1:])
    assert json.loads(''.join(d.function.arguments or '' for d in deltas)) == {'order_id': 'A-17'}
    assert chunks[-1].choices[0].finish_reason == 'tool_calls'


def test_a_tool_message_answering_no_call_is_400_before_dispatch(gw):
    gw.fake.clear()
    with pytest.raises(openai.BadRequestError) as refused:
        gw.client().chat.completions.create(model='Chat', tools=[CHAT_TOOL], messages=[
            {'role': 'user', 'content': ASK}, {'role': 'tool', 'tool_call_id': 'call_nobody', 'content': 'x'}])
    assert refused.value.body['code'] == 'unknown_call_id' and 'call_nobody' in refused.value.body['message']
    assert gw.fake.requests == []


def test_a_hosted_tool_passes_only_where_the_key_and_the_backend_allow_it(gw):
    gw.fake.clear()
    answer = create(gw.client('a_search'), model='Searching', input='search the news', tools=[{'type': 'web_search'}])
    assert answer.status == 'completed'
    assert gw.fake.requests[-1]['body']['tools'] == [{'type': 'web_search'}]
    gw.fake.clear()
    for key, model in (('a', 'Searching'), ('a_search', 'ResponsesLocal')):
        with pytest.raises(openai.BadRequestError) as refused:
            gw.client(key).responses.create(model=model, input='search', tools=[{'type': 'web_search'}])
        assert refused.value.body['code'] == 'hosted_tool_not_allowed'
    assert gw.fake.requests == []


def test_a_stateless_round_trip_sends_the_calls_back_in_the_input(gw):
    client = gw.client()
    first = create(client, model='Chat', input=ASK, tools=[ORDER_TOOL], store=False)
    call = next(i for i in first.output if i.type == 'function_call')
    gw.fake.clear()
    second = create(client, model='Chat', tools=[ORDER_TOOL], store=False, input=[
        {'role': 'user', 'content': ASK}, call.model_dump(exclude_none=True),
        {'type': 'function_call_output', 'call_id': call.call_id, 'output': 'shipped'}])
    assert second.output_text == 'tool said: shipped' and gw.fake.violations == []


def test_a_call_sent_again_with_previous_response_id_is_400_not_sent_twice(gw):
    client = gw.client()
    first = create(client, model='ResponsesLocal', input=ASK, tools=[ORDER_TOOL])
    call = next(i for i in first.output if i.type == 'function_call')
    gw.fake.clear()
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model='ResponsesLocal', previous_response_id=first.id, tools=[ORDER_TOOL], input=[
            call.model_dump(exclude_none=True),
            {'type': 'function_call_output', 'call_id': call.call_id, 'output': 'x'}])
    assert refused.value.body['code'] == 'duplicate_call_id' and gw.fake.requests == []


def test_parallel_tool_calls_false_is_refused_rather_than_ignored(gw):
    with pytest.raises(openai.BadRequestError) as refused:
        gw.client().responses.create(model='Claude', input=ASK, tools=[ORDER_TOOL], parallel_tool_calls=False)
    assert refused.value.body['param'] == 'parallel_tool_calls'


def test_zero_retention_tool_calls_leave_no_arguments_in_redis(gw):
    marker = f'ZTOOL{uuid.uuid4().hex}'
    ask = 'call get_order {"order_id": "%s"}' % marker
    zero = gw.client('zero')
    chat = zero.chat.completions.create(model='Gemini', messages=[{'role': 'user', 'content': ask}],
                                        tools=[CHAT_TOOL])
    assert chat.choices[0].finish_reason == 'tool_calls'
    answer = create(zero, model='Claude', input=ask, tools=[ORDER_TOOL])
    assert any(i.type == 'function_call' for i in answer.output)
    assert marker not in gw.redis_text()
    standard = gw.client().chat.completions.create(model='Gemini', messages=[{'role': 'user', 'content': ask}],
                                                   tools=[CHAT_TOOL])
    assert standard.choices[0].finish_reason == 'tool_calls' and marker in gw.redis_text()   # the call registry
