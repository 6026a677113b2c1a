"""``DELETE /v1/responses/{id}``: what a key may delete, and what deleting a response of a chain forgets.

The ``openai`` SDK against ``llmconn serve``. DELETE sees what GET sees (the
key's models, responses stored with their text); deleting response ``a`` of
a chain ``a -> b`` removes the conversation ``b`` kept and refuses
continuing ``b`` (or anything after it) before any network call.
"""

import openai
import pytest

from gateway_stack import ASK, ORDER_TOOL, GatewayStack, create
from llmconn.gateway.call_registry import call_key


@pytest.fixture(scope='module')
def gw():
    stack = GatewayStack(processes=1)
    yield stack
    stack.close()


def test_a_key_cannot_delete_a_response_of_a_model_outside_its_list(gw):
    response = create(gw.client('a'), model='Chat', input='a Chat answer of tenant-a')
    narrow = gw.client('a_claude_only')         # the same tenant, models: [Claude]
    with pytest.raises(openai.NotFoundError):
        narrow.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError):
        narrow.responses.delete(response.id)
    assert gw.client('a').responses.retrieve(response.id).id == response.id


def test_deleting_a_zero_retention_response_is_404_as_reading_it(gw):
    response = create(gw.client('zero'), model='Chat', input='kept as metadata only')
    with pytest.raises(openai.NotFoundError):
        gw.client('zero').responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError):
        gw.client('zero').responses.delete(response.id)


@pytest.mark.parametrize('model', ['Chat', 'Claude', 'Responses'])
def test_deleting_a_response_forgets_it_in_every_continuation(gw, model):
    client = gw.client()
    a = create(client, model=model, input='SECRET-OF-A is the code')
    b = create(client, model=model, input='what was it?', previous_response_id=a.id)
    c = create(client, model=model, input='and again?', previous_response_id=b.id)
    assert gw.record('a', c.id)['lineage'] == [a.id, b.id]
    client.responses.delete(a.id)
    for continued in (b, c):
        record = gw.record('a', continued.id)
        assert 'context' not in record and record['forgotten'] == a.id
        assert client.responses.retrieve(continued.id).output_text == continued.output_text
    gw.fake.clear()
    for continued in (b, c):
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(model=model, input='go on', previous_response_id=continued.id)
        assert refused.value.body['code'] == 'previous_response_forgotten' and a.id in refused.value.body['message']
    assert gw.fake.requests == []


def test_deleting_one_branch_leaves_the_others(gw):
    client = gw.client()
    a = create(client, model='Chat', input='the root')
    b = create(client, model='Chat', input='branch b', previous_response_id=a.id)
    c = create(client, model='Chat', input='branch c', previous_response_id=a.id)
    client.responses.delete(b.id)
    assert 'context' in gw.record('a', c.id)
    d = create(client, model='Chat', input='recall: after c', previous_response_id=c.id)
    assert 'first: the root' in d.output_text and 'users: 3' in d.output_text
    assert create(client, model='Chat', input='after a', previous_response_id=a.id).status == 'completed'


def test_deleting_a_response_drops_what_the_call_registry_kept_of_its_calls(gw):
    client = gw.client()
    first = create(client, model='Claude', input=ASK, tools=[ORDER_TOOL])
    call = next(i for i in first.output if i.type == 'function_call')
    assert gw.redis.exists(call_key('tenant-a', call.call_id))
    client.responses.delete(first.id)
    assert not gw.redis.exists(call_key('tenant-a', call.call_id))
    items = [{'role': 'user', 'content': ASK}] + [i.model_dump(exclude_none=True) for i in first.output] + [
        {'type': 'function_call_output', 'call_id': call.call_id, 'output': 'shipped'}]
    with pytest.raises(openai.BadRequestError) as refused:      # nothing of it is restored any more
        client.responses.create(model='Claude', input=items, tools=[ORDER_TOOL])
    assert refused.value.body['code'] == 'reasoning_required'
