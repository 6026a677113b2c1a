"""Stateless (``store: false``) function-call turns through the gateway, reasoning carried by the client.

With ``include: ["reasoning.encrypted_content"]`` the answer's reasoning
item carries the backend's own items, sealed; the client sends the output
items back with its function outputs and the backend gets exactly what its
replay rules want: Claude its signed thinking before the ``tool_use``,
Gemini each ``functionCall`` with its ``thoughtSignature``, a Responses
backend its reasoning items with their ``encrypted_content``. The fake
provider refuses (and records a violation) whatever the real API would.
"""

import json
import uuid

import openai
import pytest
from openai.types.responses import Response

from gateway_stack import ASK, ORDER_TOOL, GatewayStack, create, reasoning_params, streamed
from llmconn.errors import GatewayError
from llmconn.gateway import reasoning as sealing

INCLUDE = ['reasoning.encrypted_content']
STATELESS = ['Claude', 'Gemini', 'ResponsesLocal', 'Responses']
# The same Claude model with thinking off: another mode, so another replay tag.
CLAUDE_PLAIN = '''  - {name: ClaudePlain, provider: claude, model: claude-sonnet-5-5, address: "FAKE_URL", max_tokens: 2048,
     max_retries: 0}'''


@pytest.fixture(scope='module')
def gw():
    stack = GatewayStack(processes=1, extra_llm=CLAUDE_PLAIN)
    yield stack
    stack.close()


def first_turn(client, model: str, stream: bool = False, ask: str = ASK, **kw) -> Response:
    kw = dict(model=model, input=ask, tools=[ORDER_TOOL], store=False, **reasoning_params(model), **kw)
    return streamed(client, **kw)[1] if stream else create(client, **kw)


def sent_back(first: Response, output: str = 'shipped', ask: str = ASK) -> list[dict]:
    """The next request's input: the user's message, the response's output items as they came, the output."""
    call = next(i for i in first.output if i.type == 'function_call')
    return ([{'role': 'user', 'content': ask}] + [i.model_dump(exclude_none=True) for i in first.output]
            + [{'type': 'function_call_output', 'call_id': call.call_id, 'output': output}])


def backend_body(gw, model: str) -> dict:
    path = {'Claude': '/messages', 'ClaudePlain': '/messages', 'Gemini': 'enerateContent'}.get(model, '/responses')
    return [r for r in gw.fake.requests if path in r['path']][-1]['body']


def check_natives_arrived(gw, model: str, first: Response) -> None:
    """What the backend got back before its call: the item its replay rule wants, verbatim."""
    call = next(i for i in first.output if i.type == 'function_call')
    body = backend_body(gw, model)
    if model == 'Claude':
        assistant = body['messages'][1]['content']
        assert assistant[0]['type'] == 'thinking' and assistant[0]['signature']
        assert assistant[-1] == {'type': 'tool_use', 'id': call.call_id, 'name': 'get_order',
                                 'input': {'order_id': 'A-17'}}
    elif model == 'Gemini':
        part = body['contents'][1]['parts'][0]
        assert part['functionCall']['name'] == 'get_order' and part['thoughtSignature']
    else:
        kinds = [i.get('type') for i in body['input']]
        assert kinds[1:3] == ['reasoning', 'function_call'] and body['input'][1]['encrypted_content']
        assert body['store'] is False


@pytest.mark.parametrize('stream', [False, True], ids=['plain', 'streamed'])
@pytest.mark.parametrize('model', STATELESS)
def test_a_stateless_turn_of_calls_continues_with_the_sealed_reasoning(gw, model, stream):
    client = gw.client()
    first = first_turn(client, model, stream, include=INCLUDE)
    sealed = [i for i in first.output if i.type == 'reasoning' and i.encrypted_content]
    assert len(sealed) == 1 and sealed[0].encrypted_content.startswith(sealing.FORMAT + '.')
    assert first.output[-1].type == 'function_call'
    gw.fake.clear()
    kw = dict(model=model, tools=[ORDER_TOOL], store=False, include=INCLUDE, input=sent_back(first), **reasoning_params(model))
    second = streamed(client, **kw)[1] if stream else create(client, **kw)
    assert second.status == 'completed' and second.output_text == 'tool said: shipped'
    assert gw.fake.violations == []
    check_natives_arrived(gw, model, first)
    assert 'output' not in gw.record('a', first.id) and 'context' not in gw.record('a', second.id)


def test_the_streamed_carrier_is_complete_in_its_output_item_done(gw):
    events, final = streamed(gw.client(), model='Claude', input=ASK, tools=[ORDER_TOOL], store=False,
                             include=INCLUDE)
    done = [e['item'] for e in events if e['type'] == 'response.output_item.done' and e['item']['type'] == 'reasoning']
    assert [i['id'] for i in done] == [i.id for i in final.output if i.type == 'reasoning']
    assert done[-1]['encrypted_content'] and done[-1]['encrypted_content'] == final.output[-2].encrypted_content
    assert final.output[-1].type == 'function_call'


def test_without_include_there_is_no_encrypted_content(gw):
    first = first_turn(gw.client(), 'Claude')
    assert first.output[0].type == 'reasoning' and first.output[0].encrypted_content is None


def test_claude_thinking_without_the_sealed_reasoning_is_400_with_advice_before_dispatch(gw):
    client = gw.client()
    first = first_turn(client, 'Claude')
    gw.fake.clear()
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model='Claude', tools=[ORDER_TOOL], store=False, input=sent_back(first))
    assert refused.value.body['code'] == 'reasoning_required'
    assert 'reasoning.encrypted_content' in refused.value.body['message']
    assert gw.fake.requests == []


def test_gemini_without_the_sealed_reasoning_is_refused_by_the_backend(gw):
    """Gemini 3 wants the signature back (the fake's rule), 2.5 does not: the backend decides."""
    client = gw.client()
    first = first_turn(client, 'Gemini')
    assert not any(i.type == 'reasoning' for i in first.output)
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model='Gemini', tools=[ORDER_TOOL], store=False, input=sent_back(first))
    assert refused.value.body['code'] == 'backend_rejected' and 'thought_signature' in refused.value.body['message']
    gw.fake.clear()


def altered(content: str) -> str:
    head, payload, mac = content.rsplit('.', 2)
    flipped = payload[:-3] + ('A' if payload[-3] != 'A' else 'B') + payload[-2:]
    return f'{head}.{flipped}.{mac}'


@pytest.mark.parametrize('change', ['altered', 'garbage', 'other_tenant', 'not_a_string'])
def test_a_sealed_item_the_gateway_did_not_make_for_this_tenant_is_400_naming_it(gw, change):
    client = gw.client()
    first = first_turn(gw.client('b') if change == 'other_tenant' else client, 'Claude', include=INCLUDE)
    items = sent_back(first)
    content = items[1]['encrypted_content']
    items[1]['encrypted_content'] = {'altered': altered(content), 'garbage': 'gAAAA-from-somewhere-else',
                                     'other_tenant': content, 'not_a_string': 42}[change]
    gw.fake.clear()
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model='Claude', tools=[ORDER_TOOL], store=False, include=INCLUDE, input=items)
    assert refused.value.body['param'] == 'input[1].encrypted_content'
    assert gw.fake.requests == []


def test_a_sealed_item_of_another_mode_is_dropped_and_the_calls_go_plain(gw):
    client = gw.client()
    first = first_turn(client, 'Claude', include=INCLUDE)
    gw.fake.clear()
    second = create(client, model='ClaudePlain', tools=[ORDER_TOOL], store=False, input=sent_back(first))
    assert second.output_text == 'tool said: shipped' and gw.fake.violations == []
    call = next(i for i in first.output if i.type == 'function_call')
    assistant = backend_body(gw, 'ClaudePlain')['messages'][1]['content']
    assert assistant == [{'type': 'tool_use', 'id': call.call_id, 'name': 'get_order', 'input': {'order_id': 'A-17'}}]


def test_calls_the_client_changed_are_sent_as_its_own_not_with_the_sealed_thinking(gw):
    client = gw.client()
    first = first_turn(client, 'Claude', include=INCLUDE)
    items = sent_back(first)
    items[2]['arguments'] = json.dumps({'order_id': 'B-99'})
    gw.fake.clear()
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model='Claude', tools=[ORDER_TOOL], store=False, include=INCLUDE, input=items)
    assert refused.value.body['code'] == 'reasoning_required' and gw.fake.requests == []


def test_two_sealed_items_in_one_responses_items_are_400(gw):
    client = gw.client()
    first = first_turn(client, 'Claude', include=INCLUDE)
    items = sent_back(first)
    items.insert(2, dict(items[1], id='rs_second'))
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model='Claude', tools=[ORDER_TOOL], store=False, include=INCLUDE, input=items)
    assert refused.value.body['param'] == 'input[2]'


def test_a_zero_retention_key_continues_statelessly_and_leaves_no_arguments_in_redis(gw):
    marker = f'ZSEAL{uuid.uuid4().hex}'
    ask = 'call get_order {"order_id": "%s"}' % marker
    zero = gw.client('zero')
    gw.fake.clear()
    first = first_turn(zero, 'Claude', ask=ask, include=INCLUDE)
    second = create(zero, model='Claude', tools=[ORDER_TOOL], store=False, include=INCLUDE,
                    input=sent_back(first, ask=ask))
    assert second.output_text == 'tool said: shipped' and gw.fake.violations == []
    assert marker not in gw.redis_text()


def test_other_include_values_still_go_through_the_capability_matrix(gw):
    with pytest.raises(openai.BadRequestError) as refused:
        gw.client().responses.create(model='Claude', input='hi', include=INCLUDE + ['message.output_text.logprobs'])
    assert refused.value.body['param'] == 'include'


# ---- the seal itself

def test_a_seal_opens_only_for_its_tenant_and_unchanged():
    answer = {'type': 'message', 'role': 'assistant', 'text': 'hi',
              'opaque': {'tag': 'claude/m/enabled', 'items': [{'kind': 'reasoning', 'native': {'signature': 's'}}]}}
    mine, theirs = sealing.Sealer(b'k' * 32, 'tenant-a'), sealing.Sealer(b'k' * 32, 'tenant-b')
    content = mine.seal(answer)
    assert mine.unseal(content, 'input[0]') == answer
    for bad in (altered(content), content + 'x', content.replace(sealing.FORMAT, 'llmconn.r0'), ''):
        with pytest.raises(GatewayError):
            mine.unseal(bad, 'input[0]')
    with pytest.raises(GatewayError) as other:
        theirs.unseal(content, 'input[3]')
    assert other.value.param == 'input[3].encrypted_content' and 'kkkk' not in repr(mine)


def test_a_sealed_answer_too_large_to_be_ours_is_refused_after_the_mac():
    huge = {'type': 'message', 'role': 'assistant', 'text': 'x' * (sealing.MAX_SEALED_BYTES + 10),
            'opaque': {'tag': 't', 'items': []}}
    sealer = sealing.Sealer(b'k' * 32, 't')
    with pytest.raises(GatewayError) as refused:
        sealer.unseal(sealer.seal(huge), 'input[0]')
    assert refused.value.code == 'invalid_encrypted_content'


@pytest.mark.parametrize('model', ['Claude', 'Gemini'])
def test_a_stateless_turn_of_two_rounds_sends_each_rounds_sealed_reasoning(gw, model):
    client = gw.client()
    again = 'call get_order {"order_id": "B-2"}'      # the first output asks the fake model to call again
    first = first_turn(client, model, include=INCLUDE)
    items = sent_back(first, output=again)
    kw = dict(model=model, tools=[ORDER_TOOL], store=False, include=INCLUDE)
    second = create(client, input=items, **kw)
    call = second.output[-1]
    assert call.type == 'function_call' and json.loads(call.arguments) == {'order_id': 'B-2'}
    gw.fake.clear()
    third = create(client, input=items + [i.model_dump(exclude_none=True) for i in second.output]
                   + [{'type': 'function_call_output', 'call_id': call.call_id, 'output': 'shipped'}], **kw)
    assert third.output_text == 'tool said: shipped' and gw.fake.violations == []
