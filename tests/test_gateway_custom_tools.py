"""Custom tools (free-form input) through the gateway: native on an openai-responses backend, refused elsewhere.

The fake Responses API calls a declared custom tool when the user says
``call NAME {"input": "..."}``, with a ``custom_tool_call`` item whose
``input`` is that text, and answers ``tool said: <output>`` once a
``custom_tool_call_output`` comes back. Bodies and events are validated
with the ``openai`` SDK's own types.
"""

import openai
import pytest

from gateway_stack import GatewayStack, create, streamed

SQL_TOOL = {'type': 'custom', 'name': 'run_sql', 'description': 'Run one SQL query',
            'format': {'type': 'grammar', 'syntax': 'regex', 'definition': '^SELECT .*$'}}
ORDER_TOOL = {'type': 'function', 'name': 'get_order', 'parameters': {'type': 'object', 'properties': {}}}
QUERY = 'SELECT status FROM orders WHERE id = 17'
ASK = 'call run_sql {"input": "%s"}' % QUERY


@pytest.fixture(scope='module')
def gw():
    stack = GatewayStack(processes=1)
    yield stack
    stack.close()


def answer(call_id: str, output: str = '3 rows') -> dict:
    return {'type': 'custom_tool_call_output', 'call_id': call_id, 'output': output}


def last_body(gw) -> dict:
    return [r for r in gw.fake.requests if r['path'].endswith('/responses')][-1]['body']


@pytest.mark.parametrize('stream', [False, True], ids=['plain', 'streamed'])
@pytest.mark.parametrize('model', ['ResponsesLocal', 'Responses'])
def test_a_custom_tool_call_round_trip_with_previous_response_id(gw, model, stream):
    client = gw.client()
    gw.fake.clear()
    kw = dict(model=model, input=ASK, tools=[SQL_TOOL])
    events, first = streamed(client, **kw) if stream else (None, create(client, **kw))
    assert last_body(gw)['tools'] == [SQL_TOOL]         # the definition goes to the backend verbatim
    call = first.output[-1]
    assert call.type == 'custom_tool_call' and call.name == 'run_sql' and call.input == QUERY and call.call_id
    assert [t.type for t in first.tools] == ['custom']
    if stream:
        deltas = [e['delta'] for e in events if e['type'] == 'response.custom_tool_call_input.delta']
        done = next(e for e in events if e['type'] == 'response.custom_tool_call_input.done')
        assert ''.join(deltas) == done['input'] == QUERY and done['item_id'] == call.id
    assert gw.record('a', first.id)['tool_calls'] == [
        {'call_id': call.call_id, 'name': 'run_sql', 'status': 'awaiting_output'}]
    second = create(client, model=model, previous_response_id=first.id, tools=[SQL_TOOL],
                    input=[answer(call.call_id)])
    assert second.output_text == 'tool said: 3 rows' and gw.fake.violations == []
    sent = [i for i in last_body(gw)['input'] if i.get('type', '').startswith('custom_tool_call')]
    assert sent[-1] == answer(call.call_id)     # answered as a custom call, not as a function's output


def test_a_stateless_custom_tool_round_trip_sends_the_call_back_in_the_input(gw):
    client = gw.client()
    first = create(client, model='ResponsesLocal', input=ASK, tools=[SQL_TOOL, ORDER_TOOL], store=False)
    call = first.output[-1]
    gw.fake.clear()
    second = create(client, model='ResponsesLocal', tools=[SQL_TOOL, ORDER_TOOL], store=False, input=[
        {'role': 'user', 'content': ASK}, call.model_dump(exclude_none=True), answer(call.call_id, 'none')])
    assert second.output_text == 'tool said: none' and gw.fake.violations == []
    sent = last_body(gw)['input']
    assert sent[1] == {'type': 'custom_tool_call', 'call_id': call.call_id, 'name': 'run_sql', 'input': QUERY}
    assert sent[2] == answer(call.call_id, 'none')


@pytest.mark.parametrize('model', ['Claude', 'Gemini', 'Chat'])
def test_a_custom_tool_on_another_backend_is_400_naming_it_before_dispatch(gw, model):
    gw.fake.clear()
    with pytest.raises(openai.BadRequestError) as refused:
        gw.client().responses.create(model=model, input=ASK, tools=[ORDER_TOOL, SQL_TOOL])
    assert refused.value.body['param'] == 'tools[1].type' and 'custom' in refused.value.body['message']
    assert gw.fake.requests == []


def test_custom_tool_items_for_another_backend_are_400_before_dispatch(gw):
    gw.fake.clear()
    with pytest.raises(openai.BadRequestError) as refused:
        gw.client().responses.create(model='Claude', input=[
            {'role': 'user', 'content': ASK},
            {'type': 'custom_tool_call', 'call_id': 'call_1', 'name': 'run_sql', 'input': QUERY},
            answer('call_1')])
    assert refused.value.body['code'] == 'unsupported_field' and 'custom_tool_call' in refused.value.body['message']
    assert gw.fake.requests == []


@pytest.mark.parametrize('tool, param', [
    (dict(SQL_TOOL, format={'type': 'grammar', 'syntax': 'ebnf', 'definition': 'x'}), 'tools[0].format'),
    (dict(SQL_TOOL, name='bad name'), 'tools[0].name'),
    (dict(SQL_TOOL, defer_loading=True), 'tools[0].defer_loading'),
])
def test_a_malformed_custom_tool_is_400_naming_the_field(gw, tool, param):
    with pytest.raises(openai.BadRequestError) as refused:
        gw.client().responses.create(model='ResponsesLocal', input='hi', tools=[tool])
    assert refused.value.body['param'] == param


def test_a_custom_tool_and_a_function_of_one_name_are_400(gw):
    with pytest.raises(openai.BadRequestError) as refused:
        gw.client().responses.create(model='ResponsesLocal', input='hi', tools=[SQL_TOOL, dict(ORDER_TOOL, name='run_sql')])
    assert refused.value.body['param'] == 'tools'


def test_a_custom_call_sent_back_without_its_tool_declared_is_400(gw):
    with pytest.raises(openai.BadRequestError) as refused:
        gw.client().responses.create(model='ResponsesLocal', store=False, input=[
            {'role': 'user', 'content': ASK},
            {'type': 'custom_tool_call', 'call_id': 'call_1', 'name': 'run_sql', 'input': QUERY}, answer('call_1')])
    assert refused.value.body['param'] == 'tools' and 'run_sql' in refused.value.body['message']


def test_chat_completions_refuses_custom_tools(gw):
    with pytest.raises(openai.BadRequestError) as refused:
        gw.client().chat.completions.create(model='ResponsesLocal', messages=[{'role': 'user', 'content': 'hi'}],
                                            tools=[{'type': 'custom', 'custom': {'name': 'run_sql'}}])
    assert refused.value.body['param'] == 'tools[0].type'
