"""A ``template`` connection behind the gateway: what its column of the capability matrix claims, over HTTP.

The connection is the shipped stateless Chat Completions template, against
the fake provider. It answers plain, streamed (whole, as events),
continued (replayed by the gateway) and through Chat Completions; every
setting its templates might not honour, and anything to do with tools, is
a 400 naming the field before any request reaches the endpoint, unless the
request accepts the named loss.
"""

from pathlib import Path

import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from gateway_stack import GatewayStack
from llmconn.gateway.capabilities import RESPONSES, ROUTES, TEMPLATE, UNSUPPORTED

TEMPLATES = Path(__file__).resolve().parent.parent / 'etc' / 'templates'
TEMPLATE_CONNECTION = f'''  - {{name: Template, provider: template, model: gpt-4.1,
     address: "FAKE_URL/v1/chat/completions", max_retries: 0, request_template_file: "{TEMPLATES}/chat-completions.request.j2",
     response_template_file: "{TEMPLATES}/chat-completions.response.j2"}}'''
STREAM_EVENT = TypeAdapter(ResponseStreamEvent)
TOOL = {'type': 'function', 'name': 'get_order', 'parameters': {'type': 'object', 'properties': {}}}
USER = [{'role': 'user', 'content': 'hi'}]


@pytest.fixture(scope='module')
def gw():
    stack = GatewayStack(processes=1, extra_llm=TEMPLATE_CONNECTION)
    yield stack
    stack.close()


def create(client, **kw) -> Response:
    return Response.model_validate(client.responses.with_raw_response.create(**kw).http_response.json())


def test_a_template_model_answers_plain_with_instructions_and_continued(gw):
    client = gw.client()
    first = create(client, model='Template', input='my name is Ann', instructions='be brief')
    assert first.status == 'completed' and first.output_text.endswith('system: yes')
    assert first.usage.input_tokens > 0
    second = create(client, model='Template', input='what is my name?', previous_response_id=first.id)
    assert 'users: 2' in second.output_text and 'previous: my name is Ann' in second.output_text
    assert second.output_text.endswith('system: no')      # instructions are not carried over
    assert gw.record('a', second.id)['provider_kind'] == TEMPLATE


def test_a_streamed_request_gets_the_whole_answer_as_events(gw):
    events = []
    with gw.client().responses.stream(model='Template', input='tell me a story') as stream:
        for event in stream:
            data = event.model_dump(mode='json', warnings=False)
            STREAM_EVENT.validate_python(data)
            events.append(data['type'])
        final = stream.get_final_response()
    assert events[0] == 'response.created' and events[-1] == 'response.completed'
    assert 'response.output_text.delta' in events and final.output_text.startswith('echo: tell me a story')


def test_chat_completions_plain_and_streamed(gw):
    client = gw.client()
    messages = [{'role': 'system', 'content': 'be brief'}] + USER
    completion = client.chat.completions.create(model='Template', messages=messages)
    assert completion.choices[0].message.content == 'echo: hi | users: 1 | previous: - | system: yes'
    chunks = list(client.chat.completions.create(model='Template', messages=messages, stream=True))
    assert ''.join(c.choices[0].delta.content or '' for c in chunks if c.choices) == \
        completion.choices[0].message.content


@pytest.mark.parametrize('field, value', [
    ('temperature', 0.2), ('top_p', 0.5), ('max_output_tokens', 64), ('reasoning', {'effort': 'high'}),
    ('text', {'format': {'type': 'json_object'}}), ('truncation', 'auto'), ('user', 'u-1'),
    ('tools', [TOOL]), ('tool_choice', 'required')])
def test_a_setting_the_templates_might_not_honour_is_400_naming_it(gw, field, value):
    gw.fake.clear()
    with pytest.raises(openai.BadRequestError) as refused:
        gw.client().responses.create(model='Template', input='hi', extra_body={field: value})
    assert refused.value.body['param'] == field
    assert gw.fake.requests == []


@pytest.mark.parametrize('field, value', [('stop', ['x']), ('seed', 7), ('max_tokens', 9),
                                          ('response_format', {'type': 'json_object'}), ('tools', [
                                              {'type': 'function', 'function': {'name': 'get_order'}}])])
def test_chat_completions_settings_are_refused_the_same_way(gw, field, value):
    gw.fake.clear()
    with pytest.raises(openai.BadRequestError) as refused:
        gw.client().chat.completions.create(model='Template', messages=USER, extra_body={field: value})
    assert refused.value.body['param'] == field
    assert gw.fake.requests == []


def test_an_accepted_loss_drops_the_setting_and_says_so(gw):
    gw.fake.clear()
    policy = {'allow_lossy': True, 'allowed_losses': ['sampling_params_ignored']}
    response = create(gw.client(), model='Template', input='hi', temperature=0.2,
                      extra_body={'fallback_policy': policy})
    assert response.metadata == {'llmconn_downgrades': 'temperature:sampling_params_ignored'}
    assert 'temperature' not in gw.fake.requests[-1]['body']


def test_function_calls_and_outputs_cannot_reach_a_template_model(gw):
    client = gw.client()
    gw.fake.clear()
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model='Template', input=USER + [
            {'type': 'function_call', 'call_id': 'call_1', 'name': 'get_order', 'arguments': '{}'},
            {'type': 'function_call_output', 'call_id': 'call_1', 'output': 'shipped'}])
    assert refused.value.body['param'] == 'input[1]' and refused.value.body['code'] == 'unsupported_field'
    with pytest.raises(openai.BadRequestError) as chat:
        client.chat.completions.create(model='Template', messages=USER + [
            {'role': 'assistant', 'content': None, 'tool_calls': [
                {'id': 'call_1', 'type': 'function', 'function': {'name': 'get_order', 'arguments': '{}'}}]},
            {'role': 'tool', 'tool_call_id': 'call_1', 'content': 'shipped'}])
    assert chat.value.body['param'] == 'messages[1]'
    assert gw.fake.requests == []
    # A conversation that used tools elsewhere cannot be continued here: its calls would be dropped.
    called = client.responses.create(model='Chat', input='call get_order {"order_id": "A-1"}', tools=[TOOL])
    call = next(i for i in called.output if i.type == 'function_call')
    answered = client.responses.create(model='Chat', previous_response_id=called.id, tools=[TOOL], input=[
        {'type': 'function_call_output', 'call_id': call.call_id, 'output': 'shipped'}])
    gw.fake.clear()
    with pytest.raises(openai.BadRequestError) as carried:
        client.responses.create(model='Template', input='and now?', previous_response_id=answered.id)
    assert carried.value.body['param'] == 'previous_response_id'
    assert gw.fake.requests == []


def test_the_template_column_claims_nothing_it_cannot_check():
    """Every non-structural field is unsupported on a template endpoint (its templates decide what is sent)."""
    for name, spec in ROUTES[RESPONSES].items():
        if not spec.structural:
            assert spec.support[TEMPLATE].level == UNSUPPORTED, name
    assert ROUTES[RESPONSES]['tools'].support[TEMPLATE].level == UNSUPPORTED
