"""Attachments (SPEC §16): images, PDFs and text files, checked before any request and sent natively.

Against the fake provider, which reads each API's own image and file parts
as the real one does (base64 that decodes, bytes that are the type they are
said to be, http(s) URLs) and whose echo says what the model saw:
``attached: <types of the last user message's attachments> | files: <n>``.
Bodies validate against the SDK request types.
"""

from __future__ import annotations

import base64
import struct
import zlib

import anthropic
import openai
import pytest
from anthropic.types import MessageParam
from openai.types.chat import ChatCompletionMessageParam
from openai.types.responses import ResponseInputItemParam

from llmconn import Attachment, InvalidInput
from llmconn.attachments import sniff
from provider_helpers import assert_valid
from test_structured import check_body
from tests.tools_helpers import PROVIDERS, connection_config, get_order


def png_bytes() -> bytes:
    """A real 1x1 PNG."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data))
    return (b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 1, 1, 8, 2, 0, 0, 0))
            + chunk(b'IDAT', zlib.compress(b'\x00\xff\x00\x00')) + chunk(b'IEND', b''))


PNG = png_bytes()
JPEG = b'\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00\xff\xd9'
GIF = b'GIF89a\x01\x00\x01\x00\x00\x00\x00;'
WEBP = b'RIFF\x1a\x00\x00\x00WEBPVP8L\x0d\x00\x00\x00/\x00\x00\x00\x10\x07\x10\x11\x11\x88\x88\xfe\x07\x00'
PDF = b'%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\ntrailer << /Root 1 0 R >>\n%%EOF\n'


@pytest.fixture
def make(redis_url, provider, unique, open_registry):
    def make(kind, **conn):
        return open_registry(connection_config(redis_url, provider.url, unique, kind, **conn))[unique]
    return make


@pytest.fixture
def files(tmp_path):
    for name, data in (('scan.png', PNG), ('photo.jpg', JPEG), ('invoice.pdf', PDF), ('notes.txt', b'Total: 42 EUR'),
                       ('anim.gif', GIF), ('pic.webp', WEBP)):
        (tmp_path / name).write_bytes(data)
    return tmp_path


def user_message(kind: str, body: dict):
    """The request's last user message (its parts), in the provider's own form."""
    if kind == 'openai-responses':
        return [i for i in body['input'] if i.get('role') == 'user'][-1]
    if kind == 'gemini':
        return body['contents'][-1]
    return [m for m in body['messages'] if m['role'] == 'user'][-1]


def check_messages(kind: str, body: dict) -> None:
    check_body(kind, body)
    if kind == 'claude':
        for message in body['messages']:
            assert_valid(MessageParam, message)
    elif kind == 'openai':
        for message in body['messages']:
            assert_valid(ChatCompletionMessageParam, message)
    elif kind == 'openai-responses':
        for item in body['input']:
            assert_valid(ResponseInputItemParam, item)


NATIVE = {  # the parts an image and a PDF (as bytes) become, before the text
    'claude': lambda c: [(b['type'], b['source']['type'], b['source'].get('media_type')) for b in c['content'][:2]]
    == [('image', 'base64', 'image/png'), ('document', 'base64', 'application/pdf')],
    'openai': lambda c: [p['type'] for p in c['content']] == ['image_url', 'file', 'text']
    and c['content'][0]['image_url']['url'].startswith('data:image/png;base64,')
    and c['content'][1]['file']['filename'] == 'invoice.pdf',
    'openai-responses': lambda c: [p['type'] for p in c['content']] == ['input_image', 'input_file', 'input_text']
    and c['content'][1]['file_data'].startswith('data:application/pdf;base64,'),
    'gemini': lambda c: [p['inlineData']['mimeType'] for p in c['parts'][:2]] == ['image/png', 'application/pdf']
    and c['parts'][2] == {'text': 'What is this?'},
}


@pytest.mark.parametrize('kind', PROVIDERS)
def test_an_image_and_a_pdf_are_sent_in_the_providers_own_parts(make, provider, files, kind):
    attached = [Attachment.from_path(files / 'scan.png'), Attachment.from_path(files / 'invoice.pdf')]
    reply = make(kind).invoke('What is this?', attachments=attached)
    assert reply['text'].endswith('| attached: image/png, application/pdf | files: 2')
    [request] = provider.requests
    check_messages(kind, request['body'])
    assert NATIVE[kind](user_message(kind, request['body']))
    assert provider.violations == []


@pytest.mark.parametrize('kind', PROVIDERS)
def test_every_image_type_streams_and_the_done_result_says_what_was_seen(make, files, kind):
    attached = [Attachment.from_path(files / n) for n in ('scan.png', 'photo.jpg', 'anim.gif', 'pic.webp')]
    events = list(make(kind).stream('Look', chat_id='s', attachments=attached))
    assert events[-1].type == 'done'
    assert events[-1].result['text'].endswith('attached: image/png, image/jpeg, image/gif, image/webp | files: 4')


TEXT_PART = {
    'claude': lambda c: c['content'][0] == {'type': 'document', 'title': 'notes.txt', 'source': {
        'type': 'text', 'media_type': 'text/plain', 'data': 'Total: 42 EUR'}},
    'openai': lambda c: c['content'][0] == {'type': 'text', 'text': 'Total: 42 EUR'},
    'openai-responses': lambda c: c['content'][0] == {'type': 'input_text', 'text': 'Total: 42 EUR'},
    'gemini': lambda c: c['parts'][0]['inlineData']['mimeType'] == 'text/plain',
}


@pytest.mark.parametrize('kind', PROVIDERS)
def test_a_text_file_goes_in_as_the_apis_text_document(make, provider, files, kind):
    make(kind).invoke('Sum it', attachments=[Attachment.from_path(files / 'notes.txt')])
    body = provider.requests[0]['body']
    check_messages(kind, body)
    assert TEXT_PART[kind](user_message(kind, body))


URL_PARTS = {
    'claude': lambda c: [b['source'] for b in c['content'][:2]] == [
        {'type': 'url', 'url': 'https://example.com/a.png'}, {'type': 'url', 'url': 'https://example.com/b.pdf'}],
    'openai-responses': lambda c: c['content'][:2] == [
        {'type': 'input_image', 'image_url': 'https://example.com/a.png', 'detail': 'auto'},
        {'type': 'input_file', 'file_url': 'https://example.com/b.pdf'}],
    'gemini': lambda c: c['parts'][:2] == [
        {'fileData': {'mimeType': 'image/png', 'fileUri': 'https://example.com/a.png'}},
        {'fileData': {'mimeType': 'application/pdf', 'fileUri': 'https://example.com/b.pdf'}}],
}


@pytest.mark.parametrize('kind', sorted(URL_PARTS))
def test_urls_are_sent_for_the_provider_to_fetch(make, provider, kind):
    urls = [Attachment.from_url('https://example.com/a.png'), Attachment.from_url('https://example.com/b.pdf')]
    make(kind).invoke('Compare', attachments=urls)
    body = provider.requests[0]['body']
    check_messages(kind, body)
    assert URL_PARTS[kind](user_message(kind, body))


def test_chat_completions_takes_an_image_url_but_refuses_a_pdf_url_naming_type_and_connection(make, provider):
    conn = make('openai')
    conn.invoke('See', attachments=[Attachment.from_url('http://example.com/x?id=1', media_type='image/jpeg')])
    assert user_message('openai', provider.requests[0]['body'])['content'][0] == {
        'type': 'image_url', 'image_url': {'url': 'http://example.com/x?id=1'}}
    with pytest.raises(InvalidInput) as caught:
        conn.invoke('Read', attachments=[Attachment.from_url('https://example.com/b.pdf')])
    assert conn.name in str(caught.value) and 'application/pdf' in str(caught.value) and 'URL' in str(caught.value)
    assert len(provider.requests) == 1


@pytest.mark.parametrize('kind', PROVIDERS)
def test_with_tools_every_round_carries_the_attachments(make, provider, files, kind):
    reply = make(kind).chat('call get_order {"order_id": "123"}', chat_id='t', tools=[get_order],
                            attachments=[Attachment.from_path(files / 'scan.png')])
    assert reply['rounds'] == 2
    for request in provider.requests:
        check_messages(kind, request['body'])
        assert base64.b64encode(PNG).decode() in str(request['body'])
    assert provider.violations == []


def test_claude_cache_breakpoints_and_attachments_stay_within_the_limit(redis_url, provider, files, tmp_path,
                                                                      open_registry, unique):
    skill = tmp_path / 'skills' / 'long' / 'SKILL.md'
    skill.parent.mkdir(parents=True)
    skill.write_text('---\nname: long\ndescription: long\n---\n' + 'Read carefully. ' * 200)
    config = connection_config(redis_url, provider.url, unique, 'claude')
    config['skills_dir'] = str(tmp_path / 'skills')
    conn = open_registry(config)[unique]
    attached = [Attachment.from_path(files / 'invoice.pdf'), Attachment.from_path(files / 'scan.png')]
    conn.chat('First', chat_id='k', skill='long', attachments=attached)
    conn.chat('Second', chat_id='k', skill='long', attachments=attached)
    for request in provider.requests:
        body = request['body']
        check_messages('claude', body)
        assert 1 <= str(body).count("'cache_control'") <= 4
    assert provider.violations == []


# -- bad input: each refused before any request, nothing stored ---------------------------------------

def test_the_media_type_must_match_the_bytes(files):
    (files / 'fake.png').write_bytes(JPEG)
    with pytest.raises(InvalidInput, match=r'image/png.*looks like JPEG image \(image/jpeg\)'):
        Attachment.from_path(files / 'fake.png')
    (files / 'noise.png').write_bytes(b'\x00\x01\x02garbage')
    with pytest.raises(InvalidInput, match='none of the types'):
        Attachment.from_path(files / 'noise.png')
    with pytest.raises(InvalidInput, match='not a PDF document'):
        Attachment.from_bytes(PNG, 'application/pdf', 'x.pdf')
    with pytest.raises(InvalidInput, match='not a UTF-8 text file'):
        Attachment.from_bytes(b'\xff\xfe\x00bad', 'text/plain')
    assert [sniff(d) for d in (PNG, JPEG, GIF, WEBP, PDF, b'plain')] == [
        'image/png', 'image/jpeg', 'image/gif', 'image/webp', 'application/pdf', 'text/plain']


@pytest.mark.parametrize('make_it, message', [
    (lambda d: Attachment.from_path(d / 'missing.png'), 'cannot be read'),
    (lambda d: Attachment.from_path(d / 'archive.zip'), 'media type from the extension'),
    (lambda d: (d / 'empty.pdf').write_bytes(b'') or Attachment.from_path(d / 'empty.pdf'), 'is empty'),
    (lambda d: Attachment.from_bytes(b'', 'image/png'), 'is empty'),
    (lambda d: Attachment.from_bytes('text', 'text/plain'), 'must be bytes'),
    (lambda d: Attachment.from_bytes(PNG, 'image/bmp'), "'image/bmp' is not one llmconn takes"),
    (lambda d: Attachment.from_url('ftp://example.com/a.png'), 'not an http or https URL'),
    (lambda d: Attachment.from_url('file:///etc/passwd.txt'), 'not an http or https URL'),
    (lambda d: Attachment.from_url('https://example.com/download?id=7'), 'give media_type='),
    (lambda d: Attachment.from_url('https://example.com/a.svg', media_type='image/svg+xml'), 'not one llmconn takes'),
], ids=['missing', 'unknown extension', 'empty file', 'empty bytes', 'not bytes', 'unknown type', 'ftp', 'file',
        'no type', 'svg'])
def test_bad_attachments_are_refused_when_made(files, make_it, message):
    with pytest.raises(InvalidInput, match=message):
        make_it(files)


def test_an_error_about_a_url_never_quotes_its_credentials_or_query():
    with pytest.raises(InvalidInput) as caught:
        Attachment.from_url('https://user:hunter2@example.com/get?token=s3cret')
    assert 'hunter2' not in str(caught.value) and 's3cret' not in str(caught.value)


@pytest.mark.parametrize('kind', PROVIDERS)
def test_calls_refuse_bad_attachments_before_any_request_and_store_nothing(make, provider, files, kind):
    conn = make(kind, max_attachment_bytes=len(PDF) - 1)
    pdf = Attachment.from_path(files / 'invoice.pdf')
    for attachments, message in (([pdf], f'max_attachment_bytes \\({len(PDF) - 1}\\)'),
                                 (['invoice.pdf'], 'list of llmconn.Attachment'),
                                 (Attachment.from_bytes(PNG, 'image/png'), 'list of llmconn.Attachment')):
        with pytest.raises(InvalidInput, match=message):
            conn.chat('Read', chat_id='bad', attachments=attachments)
        with pytest.raises(InvalidInput, match=message):
            conn.stream('Read', chat_id='bad', attachments=attachments)
    assert provider.requests == [] and conn.history('bad') == []


def test_a_provider_without_attachments_refuses_them(provider, open_registry, unique, files):
    conn = open_registry({'llm': [{'name': unique, 'provider': 'template', 'model': 'm', 'address': provider.url,
                                   'request_template': '{}', 'response_template': '{{ body }}'}]})[unique]
    with pytest.raises(InvalidInput, match=f'{unique}: its provider cannot take a image/png attachment'):
        conn.invoke('x', attachments=[Attachment.from_path(files / 'scan.png')])
    assert provider.requests == []


# -- the fake refuses what the real APIs refuse -------------------------------------------------------

def test_the_fake_refuses_an_image_whose_bytes_are_not_its_type(provider):
    jpeg_as_png = base64.b64encode(JPEG).decode()
    claude = anthropic.Anthropic(base_url=provider.url, api_key='x', max_retries=0)
    with pytest.raises(anthropic.BadRequestError, match='image/png media type'):
        claude.messages.create(model='claude-sonnet-5-5', max_tokens=10, messages=[{'role': 'user', 'content': [
            {'type': 'image', 'source': {'type': 'base64', 'media_type': 'image/png', 'data': jpeg_as_png}},
            {'type': 'text', 'text': 'x'}]}])
    client = openai.OpenAI(base_url=provider.url + '/v1', api_key='x', max_retries=0)
    with pytest.raises(openai.BadRequestError, match='unsupported image'):
        client.chat.completions.create(model='gpt-4o-mini', messages=[{'role': 'user', 'content': [
            {'type': 'image_url', 'image_url': {'url': f'data:image/png;base64,{jpeg_as_png}'}}]}])
    with pytest.raises(openai.BadRequestError, match='filename'):
        client.chat.completions.create(model='gpt-4o-mini', messages=[{'role': 'user', 'content': [
            {'type': 'file', 'file': {'file_data': 'data:application/pdf;base64,' + base64.b64encode(PDF).decode()}}]}])
    with pytest.raises(openai.BadRequestError, match='detail'):
        client.responses.create(model='gpt-5', input=[{'role': 'user', 'content': [
            {'type': 'input_image', 'image_url': 'https://example.com/a.png'}]}])
