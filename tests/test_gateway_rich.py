"""Rich turns through the gateway (SPEC §16): images and files in, json_schema answers out, on every backend.

The clients are the official ``openai`` SDK against ``llmconn serve`` on the
fake provider, which checks each backend's native image and file parts as
the real API does and echoes ``attached: <media types>``; a json_schema
format on Claude and Gemini goes through the library's ``schema=``, so the
fake's schema-conforming answer comes back as the response's text, checked
against the schema here.
"""

from __future__ import annotations

import base64
import json

import jsonschema
import openai
import pytest

from conformance_checks import check_completion, check_response, check_stream, post, sse_data
from gateway_stack import KEYS, GatewayStack, create
from test_attachments import PDF, PNG

BACKENDS = ('Claude', 'Chat', 'Responses', 'Gemini')
PNG_URL = 'data:image/png;base64,' + base64.b64encode(PNG).decode()
PDF_DATA = 'data:application/pdf;base64,' + base64.b64encode(PDF).decode()
LYING_PNG = 'data:image/png;base64,' + base64.b64encode(b'GIF89a not a png at all').decode()
ORDER = {'type': 'object', 'properties': {'order_id': {'type': 'string'}, 'total': {'type': 'number'},
                                          'paid': {'type': 'boolean'}},
         'required': ['order_id', 'total', 'paid'], 'additionalProperties': False}


@pytest.fixture(scope='module')
def gw():
    stack = GatewayStack(processes=1)
    yield stack
    stack.close()


def responses_input(*parts: dict) -> list:
    return [{'role': 'user', 'content': [{'type': 'input_text', 'text': 'what is this?'}, *parts]}]


def chat_messages(*parts: dict) -> list:
    return [{'role': 'user', 'content': [{'type': 'text', 'text': 'what is this?'}, *parts]}]


def chat(client, **kw):
    raw = client.chat.completions.with_raw_response.create(**kw)
    body = json.loads(raw.text)
    check_completion(body)
    return body['choices'][0]['message']['content']


@pytest.mark.parametrize('model', BACKENDS)
def test_an_image_reaches_every_backend_on_the_responses_route(gw, model):
    response = create(gw.client(), model=model, input=responses_input(
        {'type': 'input_image', 'image_url': PNG_URL, 'detail': 'auto'}))
    assert 'attached: image/png' in response.output_text, response.output_text
    assert gw.fake.requests[-1]['body'], 'the backend was called'


@pytest.mark.parametrize('model', BACKENDS)
def test_an_image_reaches_every_backend_on_the_chat_route(gw, model):
    text = chat(gw.client(), model=model, messages=chat_messages(
        {'type': 'image_url', 'image_url': {'url': PNG_URL}}))
    assert 'attached: image/png' in text, text


@pytest.mark.parametrize('model', BACKENDS)
def test_a_pdf_file_reaches_every_backend_on_both_routes(gw, model):
    response = create(gw.client(), model=model, input=responses_input(
        {'type': 'input_file', 'file_data': PDF_DATA, 'filename': 'invoice.pdf'}))
    assert 'attached: application/pdf' in response.output_text, response.output_text
    text = chat(gw.client(), model=model, messages=chat_messages(
        {'type': 'file', 'file': {'file_data': PDF_DATA, 'filename': 'invoice.pdf'}}))
    assert 'attached: application/pdf' in text, text


def test_an_image_by_url_reaches_the_backend(gw):
    response = create(gw.client(), model='Claude', input=responses_input(
        {'type': 'input_image', 'image_url': 'https://example.com/scan.png'}))
    assert 'attached: ' in response.output_text and 'attached: -' not in response.output_text


def test_an_earlier_turns_image_is_replayed_with_previous_response_id(gw):
    first = create(gw.client(), model='Gemini', input=responses_input(
        {'type': 'input_image', 'image_url': PNG_URL}))
    second = create(gw.client(), model='Gemini', previous_response_id=first.id, input='and now?')
    assert 'files: 1' in second.output_text, second.output_text
    listed = gw.client().responses.input_items.list(first.id)
    assert [p.type for p in listed.data[0].content] == ['input_image', 'input_text']


@pytest.mark.parametrize('route', ['responses', 'chat'])
def test_a_png_that_is_not_a_png_is_a_400_naming_the_field(gw, route):
    before = len(gw.fake.requests)
    with pytest.raises(openai.BadRequestError) as refused:
        if route == 'responses':
            gw.client().responses.create(model='Claude', input=responses_input(
                {'type': 'input_image', 'image_url': LYING_PNG}))
        else:
            gw.client().chat.completions.create(model='Claude', messages=chat_messages(
                {'type': 'image_url', 'image_url': {'url': LYING_PNG}}))
    error = refused.value.body
    where = 'input[0].content[1].image_url' if route == 'responses' else 'messages[0].content[1].image_url.url'
    assert error['param'] == where, error
    assert 'image/png' in error['message'] and 'GIF' in error['message'], error['message']
    assert len(gw.fake.requests) == before, 'refused before any network call'


def test_a_type_the_backend_cannot_take_by_url_is_a_400_naming_it(gw):
    before = len(gw.fake.requests)
    with pytest.raises(openai.BadRequestError) as refused:
        gw.client().chat.completions.create(model='Chat', messages=chat_messages(
            {'type': 'image_url', 'image_url': {'url': 'https://example.com/invoice.pdf'}}))
    assert 'application/pdf' in refused.value.body['message'], refused.value.body
    assert len(gw.fake.requests) == before


def test_an_uploaded_file_id_is_refused_naming_it(gw):
    with pytest.raises(openai.BadRequestError) as refused:
        gw.client().responses.create(model='Claude', input=responses_input(
            {'type': 'input_file', 'file_id': 'file-123'}))
    assert 'file_id' in refused.value.body['message'], refused.value.body


@pytest.mark.parametrize('model', ['Claude', 'Gemini'])
def test_json_schema_text_format_is_native_on_claude_and_gemini(gw, model):
    fmt = {'type': 'json_schema', 'name': 'order', 'schema': ORDER, 'strict': True}
    raw = gw.client().responses.with_raw_response.create(model=model, input='order A-17?', text={'format': fmt})
    body = json.loads(raw.text)
    check_response(body)
    jsonschema.validate(json.loads(body['output'][-1]['content'][0]['text']), ORDER)
    assert body['text']['format']['type'] == 'json_schema'
    sent = gw.fake.requests[-1]['body']
    assert ('output_config' in sent) if model == 'Claude' else ('responseJsonSchema' in sent['generationConfig'])
    text = chat(gw.client(), model=model, messages=[{'role': 'user', 'content': 'order A-17?'}],
                response_format={'type': 'json_schema', 'json_schema': {'name': 'order', 'schema': ORDER}})
    jsonschema.validate(json.loads(text), ORDER)


@pytest.mark.parametrize('model', ['Claude', 'Gemini'])
def test_json_object_is_still_refused_on_claude_and_gemini(gw, model):
    with pytest.raises(openai.BadRequestError) as refused:
        gw.client().responses.create(model=model, input='hi', text={'format': {'type': 'json_object'}})
    assert refused.value.body['param'] == 'text'


@pytest.mark.parametrize('model, said, code', [
    (model, said, 'structured_output_invalid') for model in ('Claude', 'Gemini')
    for said in ('answer: not json at all', 'answer: {"order_id": 5}')] + [
    ('Claude', 'refuse: not an order I can read', 'structured_output_refused')])   # Gemini has no refusal
def test_an_answer_outside_the_schema_is_a_clear_error(gw, model, said, code):
    fmt = {'type': 'json_schema', 'name': 'order', 'schema': ORDER, 'strict': True}
    with pytest.raises(openai.APIStatusError) as failed:
        gw.client().responses.create(model=model, input=said, text={'format': fmt})
    assert failed.value.status_code == 502 and failed.value.body['code'] == code, failed.value.body
    if code == 'structured_output_refused':
        assert 'not an order I can read' in failed.value.body['message']



@pytest.mark.parametrize('model', ['Claude', 'Gemini'])
def test_a_streamed_json_schema_answer_with_an_image_fits_the_schema(gw, model):
    fmt = {'type': 'json_schema', 'name': 'order', 'schema': ORDER, 'strict': True}
    answer = post(f'{gw.url()}/responses', KEYS['a'][0], {
        'model': model, 'stream': True, 'text': {'format': fmt}, 'input': [{'role': 'user', 'content': [
            {'type': 'input_text', 'text': 'read this order'}, {'type': 'input_image', 'image_url': PNG_URL}]}]})
    events = [json.loads(data) for data in sse_data(answer)]
    check_stream(events)
    final = events[-1]['response']
    assert final['status'] == 'completed', final
    jsonschema.validate(json.loads(final['output'][-1]['content'][0]['text']), ORDER)
