"""Image and file content parts of a user message, as :class:`llmconn.Attachment` objects (SPEC §16).

The gateway takes the parts both routes define and hands them to the
library as the turn's attachments, so every backend gets its own native
parts and the library's checks (media type, the bytes' signature, size,
what the provider takes)::

    Responses  {"type": "input_image", "image_url": "data:image/png;base64,..." | "https://..."}
               {"type": "input_file", "file_data": "data:application/pdf;base64,...", "filename": "a.pdf"}
               {"type": "input_file", "file_url": "https://..."}
    Chat       {"type": "image_url", "image_url": {"url": "data:...;base64,..." | "https://..."}}
               {"type": "file", "file": {"file_data": "data:...;base64,...", "filename": "a.pdf"}}

An item keeps an attachment in its stored form (:func:`stored`, JSON: the
bytes in base64 beside the meta) so a response's context can be replayed by
``previous_response_id``; :func:`attachment` makes the object again. Files
uploaded to a provider (``file_id``) are not the gateway's to read: a 400.
A bad part is a 400 naming its field, before any network call.
"""

from __future__ import annotations

import base64
import binascii
import os
from typing import Any

from llmconn.attachments import EXTENSIONS, Attachment
from llmconn.errors import GatewayError, InvalidInput

IMAGE_PARTS = ('input_image', 'image_url')
FILE_PARTS = ('input_file', 'file')
PARTS = IMAGE_PARTS + FILE_PARTS
_BASE64_MARK = ';base64'


def is_part(part: Any) -> bool:
    """Whether ``part`` is an image or file content part (of either route)."""
    return isinstance(part, dict) and part.get('type') in PARTS


def read(part: dict, where: str) -> dict:
    """An image or file part as a checked attachment, in its stored form."""
    kind = part['type']
    if kind == 'input_image':
        return _source(part.get('image_url'), f'{where}.image_url', '', part.get('file_id'))
    if kind == 'image_url':
        inner = part.get('image_url')
        url = inner.get('url') if isinstance(inner, dict) else None
        return _source(url, f'{where}.image_url.url', '')
    inner = part if kind == 'input_file' else part.get('file')
    here = where if kind == 'input_file' else f'{where}.file'
    if not isinstance(inner, dict):
        raise GatewayError(f'{here} must be an object with file_data and filename', param=here)
    name = inner.get('filename') if isinstance(inner.get('filename'), str) else ''
    if inner.get('file_data') is not None:
        return _source(inner['file_data'], f'{here}.file_data', name, inner.get('file_id'), raw_ok=True)
    if kind == 'input_file' and inner.get('file_url') is not None:
        return _source(inner['file_url'], f'{here}.file_url', name, inner.get('file_id'))
    return _source(None, f'{here}.file_data', name, inner.get('file_id'))


def _source(value: Any, field: str, name: str, file_id: Any = None, raw_ok: bool = False) -> dict:
    if file_id is not None:
        raise GatewayError(f'{field.rpartition(".")[0]}.file_id: files uploaded to a provider cannot be read '
                           f'through the gateway; send the bytes as a data: URL instead', param=field,
                           code='unsupported_field')
    if not isinstance(value, str) or not value:
        raise GatewayError(f'{field} is required: a data: URL (data:<media type>;base64,<bytes>) or an http(s) '
                           f'URL', param=field)
    try:
        if value.startswith('data:'):
            return stored(_from_data_url(value, field, name))
        if raw_ok:          # file_data as bare base64, its type from the file name
            return stored(_from_base64(value, _type_of(name, field), field, name))
        return stored(Attachment.from_url(value))
    except InvalidInput as e:
        raise GatewayError(f'{field}: {e}', param=field, code='invalid_attachment') from None


def _from_data_url(value: str, field: str, name: str) -> Attachment:
    header, comma, payload = value[5:].partition(',')
    if not comma or not header.endswith(_BASE64_MARK):
        raise GatewayError(f'{field} must be a base64 data: URL (data:<media type>;base64,<bytes>)', param=field)
    media_type = header[:-len(_BASE64_MARK)].strip().lower() or _type_of(name, field)
    return _from_base64(payload, media_type, field, name)


def _from_base64(payload: str, media_type: str, field: str, name: str) -> Attachment:
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise GatewayError(f'{field}: the bytes are not valid base64', param=field) from None
    return Attachment.from_bytes(data, media_type, name or None)


def _type_of(name: str, field: str) -> str:
    media_type = EXTENSIONS.get(os.path.splitext(name)[1].lower()) if name else None
    if media_type is None:
        raise GatewayError(f'{field}: give the media type in a data: URL (data:application/pdf;base64,...) or a '
                           f'filename ending in one of {", ".join(sorted(EXTENSIONS))}', param=field)
    return media_type


def stored(item: Attachment) -> dict:
    """An attachment as an item keeps it (JSON): its meta, and its bytes in base64."""
    return dict(item.meta(), data=item.base64) if not item.url else item.meta()


def attachment(kept: dict) -> Attachment:
    """The attachment an item keeps, ready to send (checked when it was read)."""
    return Attachment.stored(kept, kept.get('data', ''))


def listed(kept: dict) -> dict:
    """An attachment as ``input_items`` lists it: the Responses part it came as."""
    source = kept.get('url') or f'data:{kept["media_type"]};base64,{kept.get("data", "")}'
    if kept['media_type'].startswith('image/'):
        return {'type': 'input_image', 'image_url': source, 'detail': 'auto'}
    part = {'type': 'input_file', 'filename': kept.get('name') or None}
    return dict(part, file_url=source) if kept.get('url') else dict(part, file_data=source)
