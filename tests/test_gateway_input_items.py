"""``GET /v1/responses/{id}/input_items`` over real HTTP, through the ``openai`` SDK's own ``input_items.list``.

Every page is validated against the SDK's ``ResponseItemList``; ids must be
the same on every read, and a response another tenant (or another key's
models) owns, or one whose text was not kept, is 404 as if absent.
"""

import json

import openai
import pytest
import requests
from openai.types.responses import ResponseItemList

from gateway_stack import GatewayStack

ORDER_TOOL = {'type': 'function', 'name': 'get_order', 'description': 'Look an order up',
              'parameters': {'type': 'object', 'properties': {'order_id': {'type': 'string'}}}}
CONVERSATION = [{'role': 'system', 'content': 'be brief'},
                {'role': 'user', 'content': 'one'},
                {'role': 'assistant', 'content': 'ok'},
                {'role': 'user', 'content': [{'type': 'input_text', 'text': 'two'}]}]


@pytest.fixture(scope='module')
def gw():
    stack = GatewayStack(processes=1)
    yield stack
    stack.close()


def listing(gw, response_id: str, key: str = 'a', **query) -> requests.Response:
    from gateway_stack import KEYS
    return requests.get(f'{gw.url()}/responses/{response_id}/input_items', params=query, timeout=10,
                        headers={'Authorization': f'Bearer {KEYS[key][0]}'})


def page(gw, response_id: str, **query) -> ResponseItemList:
    answer = listing(gw, response_id, **query)
    assert answer.status_code == 200, answer.text
    return ResponseItemList.model_validate(answer.json())


def test_a_string_input_lists_as_one_user_message_with_a_stable_id(gw):
    client = gw.client()
    response = client.responses.create(model='Chat', input='hello there')
    items = client.responses.input_items.list(response.id)
    assert [(i.type, i.role, i.content[0].type, i.content[0].text) for i in items.data] == [
        ('message', 'user', 'input_text', 'hello there')]
    assert items.data[0].id.startswith('msg_') and items.has_more is False
    again = page(gw, response.id)
    assert again.first_id == again.last_id == items.data[0].id
    assert page(gw, response.id).model_dump() == again.model_dump()
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.input_items.list(response.id, include=['message.input_image.image_url'])
    assert refused.value.body['param'] == 'include'


def test_items_come_newest_first_by_default_and_in_input_order_with_asc(gw):
    client = gw.client()
    response = client.responses.create(model='Claude', input=CONVERSATION)
    newest_first = page(gw, response.id)
    oldest_first = page(gw, response.id, order='asc')
    assert [i.role for i in oldest_first.data] == ['system', 'user', 'assistant', 'user']
    assert [i.id for i in newest_first.data] == [i.id for i in reversed(oldest_first.data)]
    assert oldest_first.data[2].content[0].type == 'output_text'       # an assistant message, as OpenAI lists it
    assert len({i.id for i in oldest_first.data}) == 4


def test_pages_follow_after_and_before_and_the_sdk_walks_them_all(gw):
    client = gw.client()
    response = client.responses.create(model='Gemini', input=CONVERSATION)
    everything = [i.id for i in page(gw, response.id, order='asc').data]
    first = page(gw, response.id, order='asc', limit=3)
    assert [i.id for i in first.data] == everything[:3] and first.has_more is True
    rest = page(gw, response.id, order='asc', limit=3, after=first.last_id)
    assert [i.id for i in rest.data] == everything[3:] and rest.has_more is False
    before = page(gw, response.id, order='asc', limit=2, before=everything[3])
    assert [i.id for i in before.data] == everything[1:3] and before.has_more is True
    walked = [i.id for i in client.responses.input_items.list(response.id, limit=1, order='asc')]
    assert walked == everything
    assert [i.id for i in client.responses.input_items.list(response.id, limit=2)] == everything[::-1]


def test_only_the_requests_own_input_is_listed_not_the_chain_before_it(gw):
    client = gw.client()
    for model in ('Chat', 'Responses'):         # gateway-kept and backend-kept state alike
        first = client.responses.create(model=model, input='my name is Ann')
        second = client.responses.create(model=model, input='what is my name?', previous_response_id=first.id)
        items = page(gw, second.id).data
        assert [i.content[0].text for i in items] == ['what is my name?'], model
        assert items[0].id != page(gw, first.id).data[0].id


def test_function_calls_and_outputs_are_listed_with_their_ids(gw):
    client = gw.client()
    first = client.responses.create(model='Chat', input='call get_order {"order_id": "A-17"}', tools=[ORDER_TOOL])
    call = next(i for i in first.output if i.type == 'function_call')
    answer = client.responses.create(model='Chat', previous_response_id=first.id, tools=[ORDER_TOOL],
                                     input=[{'type': 'function_call_output', 'call_id': call.call_id,
                                             'output': 'shipped'}])
    (output,) = page(gw, answer.id).data
    assert (output.type, output.call_id, output.output, output.status) == (
        'function_call_output', call.call_id, 'shipped', 'completed')
    assert output.id.startswith('fco_')
    stateless = client.responses.create(model='Chat', tools=[ORDER_TOOL], input=[
        {'role': 'user', 'content': 'call get_order {"order_id": "A-17"}'},
        {'type': 'function_call', 'call_id': call.call_id, 'name': call.name, 'arguments': call.arguments},
        {'type': 'function_call_output', 'call_id': call.call_id, 'output': 'shipped'}])
    sent = page(gw, stateless.id, order='asc').data
    assert [i.type for i in sent] == ['message', 'function_call', 'function_call_output']
    assert sent[1].id == call.id and json.loads(sent[1].arguments) == {'order_id': 'A-17'}


def test_responses_another_tenant_or_key_owns_or_that_kept_no_text_are_404(gw):
    response = gw.client('a').responses.create(model='Chat', input='tenant a only')
    unstored = gw.client('a').responses.create(model='Chat', input='not kept', store=False)
    zero = gw.client('zero').responses.create(model='Chat', input='zero retention')
    for key, response_id in (('b', response.id), ('a_claude_only', response.id), ('a', unstored.id),
                             ('zero', zero.id), ('a', 'resp_' + '0' * 48), ('a', 'x' * 5000)):
        answer = listing(gw, response_id, key=key)
        assert answer.status_code == 404, (key, answer.text)
        assert answer.json()['error']['code'] == 'not_found'
    with pytest.raises(openai.NotFoundError):
        gw.client('b').responses.input_items.list(response.id)
    assert 'zero retention' not in gw.redis_text()


@pytest.mark.parametrize('query, param', [
    ({'limit': '0'}, 'limit'), ({'limit': '101'}, 'limit'), ({'limit': 'ten'}, 'limit'), ({'limit': '²'}, 'limit'),
    ({'order': 'newest'}, 'order'), ({'after': 'msg_nope'}, 'after'), ({'before': 'msg_nope'}, 'before'),
    ({'include[]': 'message.input_image.image_url'}, 'include'), ({'colour': 'red'}, 'colour'),
    ('limit=1&limit=2', 'limit')])
def test_a_bad_parameter_is_400_naming_it(gw, query, param):
    response = gw.client().responses.create(model='Chat', input='paged')
    answer = listing(gw, response.id, **query) if isinstance(query, dict) else requests.get(
        f'{gw.url()}/responses/{response.id}/input_items?{query}', timeout=10,
        headers={'Authorization': 'Bearer sk-gw-tenant-a-secret'})
    assert answer.status_code == 400, answer.text
    error = answer.json()['error']
    assert error['param'] == param and error['type'] == 'invalid_request_error' and error['message']


def test_only_get_is_allowed_on_input_items(gw):
    response = gw.client().responses.create(model='Chat', input='read only')
    answer = requests.delete(f'{gw.url()}/responses/{response.id}/input_items', timeout=10,
                             headers={'Authorization': 'Bearer sk-gw-tenant-a-secret'})
    assert answer.status_code == 405
    assert page(gw, response.id).data
