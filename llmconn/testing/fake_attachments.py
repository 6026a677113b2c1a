"""How the fake provider APIs take attachments: each API's image and file parts, checked as it checks them.

A user message may carry images, PDFs and text documents in the API's own
parts (Claude ``image`` / ``document`` blocks; Chat ``image_url`` / ``file``
parts; Responses ``input_image`` / ``input_file``; Gemini ``inlineData`` /
``fileData``). Each function here reads one message's parts, refuses what
the real API refuses - an unknown part type, bytes that are not base64, an
image whose bytes are not the type it is said to be, a URL that is not http
or https - with that API's 400, and returns the media types the message
carried, in order, so the echo can say what the model saw (see
:func:`llmconn.testing.fake_common.reply_text`). A fetched URL is not
fetched: the fake says it saw it by its type.

The bytes are identified by their signatures with a table of this module's
own, not the library's, so the fake stays a second opinion.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Callable
from urllib.parse import urlsplit

_SIGNATURES = (('image/png', 0, b'\x89PNG\r\n\x1a\n'), ('image/jpeg', 0, b'\xff\xd8\xff'),
               ('image/gif', 0, b'GIF8'), ('image/webp', 8, b'WEBP'), ('application/pdf', 0, b'%PDF'))
IMAGE_TYPES = ('image/png', 'image/jpeg', 'image/gif', 'image/webp')
URL_TYPE = 'url'        # what the echo says for a file the model was given by URL, its type unknown

Error = Callable[..., Exception]


def what_bytes(data: bytes) -> str:
    for media_type, offset, signature in _SIGNATURES:
        if data[offset:offset + len(signature)] == signature:
            return media_type
    return ''


def _decoded(data: Any) -> bytes | None:
    if not isinstance(data, str) or not data:
        return None
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return None


def _data_url(url: str) -> tuple[str, bytes | None]:
    """``(media_type, bytes)`` of a ``data:<type>;base64,<data>`` URL; bytes None when it is not one."""
    head, _, data = url.partition(',')
    if not head.startswith('data:') or not head.endswith(';base64'):
        return '', None
    return head[5:-7], _decoded(data)


def _web_url(url: Any) -> bool:
    parts = urlsplit(url) if isinstance(url, str) else None
    return parts is not None and parts.scheme in ('http', 'https') and bool(parts.netloc)


# -- Claude ---------------------------------------------------------------------------------------------

def claude_attached(content: Any, where: str, error: Error) -> list[str]:
    """The media types of one Claude user message's ``image`` / ``document`` blocks."""
    seen = []
    for j, block in enumerate(content if isinstance(content, list) else ()):
        kind = block.get('type') if isinstance(block, dict) else None
        at = f'{where}.content.{j}'
        if kind == 'image':
            seen.append(_claude_source(block.get('source'), f'{at}.image.source', IMAGE_TYPES, error))
        elif kind == 'document':
            seen.append(_claude_source(block.get('source'), f'{at}.document.source',
                                       ('application/pdf', 'text/plain'), error))
        elif kind not in ('text', 'tool_result', None):
            raise error(400, f"{at}.type: Input tag '{kind}' found using 'type' does not match any of the expected "
                             f"tags: 'text', 'image', 'document', 'tool_result'")
    return seen


def _claude_source(source: Any, at: str, types: tuple, error: Error) -> str:
    kind = source.get('type') if isinstance(source, dict) else None
    if kind == 'url':
        if not _web_url(source.get('url')):
            raise error(400, f'{at}.url: Only HTTP and HTTPS URLs are supported')
        return URL_TYPE
    if kind == 'text' and 'text/plain' in types:
        if not isinstance(source.get('data'), str) or source.get('media_type') != 'text/plain':
            raise error(400, f'{at}.text: data must be a string and media_type text/plain')
        return 'text/plain'
    if kind != 'base64':
        raise error(400, f"{at}: Input tag '{kind}' found using 'type' does not match any of the expected tags")
    said = source.get('media_type')
    if said not in types or said == 'text/plain':
        raise error(400, f"{at}.base64.media_type: Input should be {' or '.join(repr(t) for t in types)}")
    data = _decoded(source.get('data'))
    if data is None:
        raise error(400, f'{at}.base64.data: The {said} data is not valid base64')
    found = what_bytes(data)
    if found != said:
        raise error(400, f'{at}.base64.data: The data was specified using the {said} media type, but it does not '
                         f'appear to be a valid {said} ({found or "unknown"})')
    return said


# -- OpenAI Chat Completions ----------------------------------------------------------------------------

def chat_attached(content: Any, where: str, error: Error) -> list[str]:
    """The media types of one Chat user message's ``image_url`` / ``file`` parts."""
    seen = []
    for j, part in enumerate(content if isinstance(content, list) else ()):
        kind = part.get('type') if isinstance(part, dict) else None
        at = f'{where}.content[{j}]'
        if kind == 'image_url':
            seen.append(_openai_image((part.get('image_url') or {}).get('url'), f'{at}.image_url.url', error))
        elif kind == 'file':
            spec = part.get('file') or {}
            seen.append(_openai_file(spec.get('file_data'), spec.get('filename'), f'{at}.file', error))
        elif kind not in ('text', 'input_audio'):
            raise error(400, f"Invalid value: '{kind}'. Supported values are: 'text', 'image_url', 'input_audio', "
                             f"'refusal', 'audio', and 'file'.", f'{at}.type', 'invalid_value')
    return seen


def _openai_image(url: Any, at: str, error: Error) -> str:
    if _web_url(url):
        return URL_TYPE
    said, data = _data_url(url) if isinstance(url, str) else ('', None)
    if data is None or said not in IMAGE_TYPES:
        raise error(400, f"Invalid '{at}'. Expected a base64-encoded data URL with an image MIME type (e.g. "
                         f"'data:image/png;base64,aW1nIGJ5dGVzIGhlcmU='), but got an invalid value.", at,
                    'invalid_value')
    if what_bytes(data) != said:
        raise error(400, 'You uploaded an unsupported image. Please make sure your image is valid.', at,
                    'invalid_image_format')
    return said


def _openai_file(file_data: Any, filename: Any, at: str, error: Error) -> str:
    said, data = _data_url(file_data) if isinstance(file_data, str) else ('', None)
    if data is None:
        raise error(400, f"Invalid '{at}.file_data'. Expected a base64-encoded data URL.", f'{at}.file_data',
                    'invalid_value')
    if not isinstance(filename, str) or not filename:
        raise error(400, f"Missing required parameter: '{at}.filename'.", f'{at}.filename',
                    'missing_required_parameter')
    if said != 'application/pdf' or what_bytes(data) != said:
        raise error(400, f"Invalid file data: '{at}.file_data'. Expected a PDF file, but the data does not look "
                         f"like one.", f'{at}.file_data', 'invalid_value')
    return said


# -- OpenAI Responses -----------------------------------------------------------------------------------

def responses_attached(content: Any, where: str, error: Error) -> list[str]:
    """The media types of one Responses input message's ``input_image`` / ``input_file`` parts."""
    seen = []
    for j, part in enumerate(content if isinstance(content, list) else ()):
        kind = part.get('type') if isinstance(part, dict) else None
        at = f'{where}.content[{j}]'
        if kind == 'input_image':
            if part.get('detail') not in ('low', 'high', 'auto', 'original'):
                raise error(400, f"Missing required parameter: '{at}.detail'.", f'{at}.detail',
                            'missing_required_parameter')
            seen.append(_openai_image(part.get('image_url'), f'{at}.image_url', error))
        elif kind == 'input_file':
            if part.get('file_url') is not None:
                if not _web_url(part['file_url']):
                    raise error(400, f"Invalid '{at}.file_url': expected an http or https URL.", f'{at}.file_url',
                                'invalid_value')
                seen.append(URL_TYPE)
            else:
                seen.append(_openai_file(part.get('file_data'), part.get('filename'), at, error))
        elif kind not in ('input_text', 'output_text', 'refusal'):
            raise error(400, f"Invalid value: '{kind}'. Supported values are: 'input_text', 'input_image', "
                             f"'input_file', and 'input_audio'.", f'{at}.type', 'invalid_value')
    return seen


# -- Gemini ---------------------------------------------------------------------------------------------

GEMINI_TYPES = IMAGE_TYPES + ('application/pdf', 'text/plain')


def gemini_attached(parts: Any, error: Error) -> list[str]:
    """The media types of one Gemini user content's ``inlineData`` / ``fileData`` parts."""
    seen = []
    for part in parts if isinstance(parts, list) else ():
        if not isinstance(part, dict):
            continue
        if 'inlineData' in part:
            blob = part['inlineData'] if isinstance(part['inlineData'], dict) else {}
            said, data = blob.get('mimeType'), _decoded(blob.get('data'))
            if said not in GEMINI_TYPES or data is None:
                raise error(400, f'* GenerateContentRequest.contents.parts.inline_data: unsupported MIME type '
                                 f'{said!r} or data that is not base64.\n')
            if said != 'text/plain' and what_bytes(data) != said:
                raise error(400, 'Unable to process input image. Please retry or report in '
                                 'https://developers.generativeai.google/guide/troubleshooting' if said in IMAGE_TYPES
                            else 'The document has no pages.')
            seen.append(said)
        elif 'fileData' in part:
            spec = part['fileData'] if isinstance(part['fileData'], dict) else {}
            if not _web_url(spec.get('fileUri')):
                raise error(400, '* GenerateContentRequest.contents.parts.file_data.file_uri: Invalid or '
                                 'unsupported file uri.\n')
            seen.append(spec.get('mimeType') or URL_TYPE)
    return seen
