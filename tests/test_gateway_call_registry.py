"""The tool-call registry: provider items restored for the calls the gateway issued, and only for those.

A client sends a response's output items back as it got them (no
``include``, ``store`` at its default): the backend gets its own items
again. Calls the client changed, another tenant's calls and calls of a
response not stored go as the client sent them, which Claude with thinking
refuses before dispatch (400 ``reasoning_required``).
"""

import json

import openai
import pytest

from gateway_stack import ASK, ORDER_TOOL, GatewayStack, create
from llmconn.gateway.call_registry import call_key


@pytest.fixture(scope='module')
def gw():
    stack = GatewayStack(processes=1)
    yield stack
    stack.close()


def sent_back(first, output: str = 'shipped') -> list[dict]:
    call = next(i for i in first.output if i.type == 'function_call')
    return ([{'role': 'user', 'content': ASK}] + [i.model_dump(exclude_none=True) for i in first.output]
            + [{'type': 'function_call_output', 'call_id': call.call_id, 'output': output}])


def test_the_output_items_sent_back_get_the_thinking_they_were_made_with(gw):
    first = create(gw.client(), model='Claude', input=ASK, tools=[ORDER_TOOL])
    assert first.output[0].type == 'reasoning' and first.output[0].encrypted_content is None
    gw.fake.clear()
    second = create(gw.client(), model='Claude', input=sent_back(first), tools=[ORDER_TOOL])
    assert second.output_text == 'tool said: shipped' and gw.fake.violations == []
    assistant = gw.fake.requests[-1]['body']['messages'][1]['content']
    assert assistant[0]['type'] == 'thinking' and assistant[-1]['id'] == first.output[-1].call_id
    call_id = first.output[-1].call_id
    assert 0 < gw.redis.pttl(call_key('tenant-a', call_id)) <= 300_000       # response_expiry


def test_calls_the_client_changed_go_as_its_own(gw):
    first = create(gw.client(), model='Claude', input=ASK, tools=[ORDER_TOOL])
    items = sent_back(first)
    items[2]['arguments'] = json.dumps({'order_id': 'OTHER'})
    gw.fake.clear()
    with pytest.raises(openai.BadRequestError) as refused:
        gw.client().responses.create(model='Claude', input=items, tools=[ORDER_TOOL])
    assert refused.value.body['code'] == 'reasoning_required' and gw.fake.requests == []


def test_another_tenants_calls_get_nothing(gw):
    first = create(gw.client('a'), model='Claude', input=ASK, tools=[ORDER_TOOL])
    with pytest.raises(openai.BadRequestError) as refused:
        gw.client('b').responses.create(model='Claude', input=sent_back(first), tools=[ORDER_TOOL])
    assert refused.value.body['code'] == 'reasoning_required'


def test_a_response_not_stored_leaves_nothing_in_the_registry(gw):
    first = create(gw.client(), model='Claude', input=ASK, tools=[ORDER_TOOL], store=False)
    assert gw.redis.get(call_key('tenant-a', first.output[-1].call_id)) is None
    with pytest.raises(openai.BadRequestError) as refused:
        gw.client().responses.create(model='Claude', input=sent_back(first), tools=[ORDER_TOOL])
    assert refused.value.body['code'] == 'reasoning_required'


def test_calls_of_a_response_come_back_as_chat_history_with_their_thinking(gw):
    """The registry is the tenant's, not the route's: a Responses answer continues on Chat Completions."""
    first = create(gw.client(), model='Claude', input=ASK, tools=[ORDER_TOOL])
    call = first.output[-1]
    messages = [{'role': 'user', 'content': ASK},
                {'role': 'assistant', 'content': None, 'tool_calls': [
                    {'id': call.call_id, 'type': 'function', 'function': {'name': call.name, 'arguments': call.arguments}}]},
                {'role': 'tool', 'tool_call_id': call.call_id, 'content': 'shipped'}]
    chat_tool = {'type': 'function', 'function': {k: v for k, v in ORDER_TOOL.items() if k != 'type'}}
    answer = gw.client().chat.completions.create(model='Claude', messages=messages, tools=[chat_tool])
    assert answer.choices[0].message.content == 'tool said: shipped' and gw.fake.violations == []
