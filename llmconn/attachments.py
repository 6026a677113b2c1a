"""Attachments: images, PDFs and text files sent with a user message (SPEC §16).

An :class:`Attachment` holds its bytes (:meth:`~Attachment.from_path`,
:meth:`~Attachment.from_bytes`) or a URL the provider fetches itself
(:meth:`~Attachment.from_url`), and its media type, one of
:data:`MEDIA_TYPES`. Everything that can be known about it is checked when
it is made, before any call: the file exists and is not empty, the bytes are
what the media type says (their signature: a ``.png`` that is not a PNG is
refused), a URL is http or https. What depends on the connection - the size
limit (``max_attachment_bytes``) and whether its provider takes the type
from bytes or by URL - is checked by the connection, still before any request
(:func:`check`). Each provider mapping renders them in its own parts.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import os
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from llmconn.errors import InvalidInput

PNG, JPEG, GIF, WEBP = 'image/png', 'image/jpeg', 'image/gif', 'image/webp'
PDF, TEXT = 'application/pdf', 'text/plain'
IMAGES = frozenset({PNG, JPEG, GIF, WEBP})
MEDIA_TYPES = IMAGES | {PDF, TEXT}
EXTENSIONS = {'.png': PNG, '.jpg': JPEG, '.jpeg': JPEG, '.gif': GIF, '.webp': WEBP, '.pdf': PDF, '.txt': TEXT}
DATA, URL = 'data', 'url'       # where a provider takes an attachment from (its bytes, or a URL)
URL_SCHEMES = ('http', 'https')
MAX_URL_CHARS = 8192
DEFAULT_MAX_BYTES = 20 * 1024 * 1024    # each attachment of a call (max_attachment_bytes), as the APIs bound them
MAX_BYTES = 512 * 1024 * 1024           # no limit may let one call hold more in memory
PDF_SIGNATURE_WITHIN = 1024     # readers accept a PDF whose %PDF- header comes after some junk, up to here
_NAMES = {PNG: 'PNG image', JPEG: 'JPEG image', GIF: 'GIF image', WEBP: 'WebP image', PDF: 'PDF document',
          TEXT: 'UTF-8 text file'}


def sniff(data: bytes) -> str:
    """The media type ``data``'s signature says, or '' when it is none of :data:`MEDIA_TYPES` (or text)."""
    if data.startswith(b'\x89PNG\r\n\x1a\n'):
        return PNG
    if data.startswith(b'\xff\xd8\xff'):
        return JPEG
    if data[:6] in (b'GIF87a', b'GIF89a'):
        return GIF
    if data[:4] == b'RIFF' and data[8:12] == b'WEBP':
        return WEBP
    if b'%PDF-' in data[:PDF_SIGNATURE_WITHIN]:
        return PDF
    return TEXT if _is_text(data) else ''


def _is_text(data: bytes) -> bool:
    if b'\x00' in data:
        return False
    try:
        data.decode('utf-8')
    except UnicodeDecodeError:
        return False
    return True


@dataclass(frozen=True)
class Attachment:
    """A file sent with a user message: its bytes (``data``) or a ``url``, its media type and name."""

    media_type: str
    data: bytes = field(default=b'', repr=False)
    url: str = ''
    name: str = ''
    sha256: str = field(default='', compare=False)      # of the bytes, hex ('' for a URL)

    def __repr__(self) -> str:
        where = self.url if self.url else f'{len(self.data)} bytes'
        return f'<Attachment {self.media_type} {self.name or where!r}>'

    @classmethod
    def from_path(cls, path: str | os.PathLike) -> 'Attachment':
        """The file at ``path``; its media type from its extension, checked against its bytes."""
        name = os.path.basename(os.fspath(path))
        media_type = EXTENSIONS.get(os.path.splitext(name)[1].lower())
        if media_type is None:
            raise InvalidInput(f'attachment {name!r}: cannot tell its media type from the extension; use '
                               f'{", ".join(sorted(EXTENSIONS))}, or Attachment.from_bytes(data, media_type)')
        try:
            size = os.path.getsize(path)
            if size > MAX_BYTES:       # not read into memory at all; a connection's limit is checked per call
                raise InvalidInput(f'attachment {name!r} is {size} bytes, more than any connection takes')
            with open(path, 'rb') as f:
                data = f.read()
        except OSError as e:
            raise InvalidInput(f'attachment {name!r} cannot be read ({e.strerror or e}); check the path') from None
        return cls.from_bytes(data, media_type, name)

    @classmethod
    def from_bytes(cls, data: bytes, media_type: str, name: str | None = None) -> 'Attachment':
        """``data`` of ``media_type``; the bytes must be what the type says."""
        label = f'attachment {name!r}' if name else 'attachment'
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidInput(f'{label}: data must be bytes, got {type(data).__name__}')
        data = bytes(data)
        _check_type(label, media_type)
        if not data:
            raise InvalidInput(f'{label} is empty; attach a file with something in it')
        found = sniff(data)
        if found != media_type:
            said = f'it looks like {_NAMES[found]} ({found})' if found else 'it is none of the types llmconn takes'
            raise InvalidInput(f'{label} is said to be {media_type}, but its bytes are not a {_NAMES[media_type]}: '
                               f'{said}; give its real media type or check the file')
        return cls(media_type, data, name=name or '', sha256=hashlib.sha256(data).hexdigest())

    @classmethod
    def from_url(cls, url: str, media_type: str | None = None) -> 'Attachment':
        """A file the provider fetches from ``url`` (http or https); the type from its extension if not given."""
        if not isinstance(url, str) or len(url) > MAX_URL_CHARS:
            raise InvalidInput(f'attachment URL must be a str of at most {MAX_URL_CHARS} characters')
        parts = urlsplit(url)
        if parts.scheme.lower() not in URL_SCHEMES or not parts.netloc:
            raise InvalidInput(f'attachment URL {_short(url)} is not an http or https URL; providers fetch only '
                               f'those (send a local file with Attachment.from_path)')
        name = parts.path.rsplit('/', 1)[-1]
        if media_type is None:
            media_type = EXTENSIONS.get(os.path.splitext(name)[1].lower())
            if media_type is None:
                raise InvalidInput(f'attachment URL {_short(url)}: cannot tell its media type from the path; '
                                   f'give media_type=, one of {", ".join(sorted(MEDIA_TYPES))}')
        _check_type(f'attachment URL {_short(url)}', media_type)
        return cls(media_type, url=url, name=name)

    @classmethod
    def stored(cls, meta: dict, base64_data: str = '') -> 'Attachment':
        """An attachment as a chat stored it (:meth:`meta`); its bytes, in base64, when the store gave them."""
        if meta.get('url'):
            return cls(meta['media_type'], url=meta['url'], name=meta.get('name', ''))
        attachment = cls(meta['media_type'], name=meta.get('name', ''), sha256=meta.get('sha256', ''))
        object.__setattr__(attachment, '_size', meta.get('size', 0))
        if base64_data:
            attachment.__dict__['base64'] = base64_data       # what the providers send: never decoded here
        return attachment

    def meta(self) -> dict:
        """What a chat stores of it beside its turn (the bytes go once per chat, by ``sha256``)."""
        if self.url:
            return {'media_type': self.media_type, 'name': self.name, 'url': self.url}
        return {'media_type': self.media_type, 'name': self.name, 'size': self.size, 'sha256': self.sha256}

    @property
    def present(self) -> bool:
        """True when it can be sent: a URL, or bytes (a stored one's may have expired apart from its turn)."""
        return bool(self.url or self.data or 'base64' in self.__dict__)

    @property
    def size(self) -> int:
        return len(self.data) or self.__dict__.get('_size', 0)

    @functools.cached_property
    def base64(self) -> str:
        """The bytes in base64, made once (every tool round of a turn sends them again)."""
        return base64.b64encode(self.data).decode('ascii')

    @property
    def data_url(self) -> str:
        return f'data:{self.media_type};base64,{self.base64}'

    @property
    def text(self) -> str:
        """A text/plain attachment's text."""
        return (self.data or base64.b64decode(self.base64)).decode('utf-8')

    @property
    def source(self) -> str:
        return URL if self.url else DATA


def check(attachments: Any, connection: str, max_bytes: int, accepts: dict) -> tuple:
    """``attachments=`` of a call on ``connection``: Attachments within its limit, of types its provider
    takes (``accepts``: :data:`DATA` / :data:`URL` -> media types)."""
    if attachments is None:
        return ()
    if not isinstance(attachments, (list, tuple)) or not all(isinstance(a, Attachment) for a in attachments):
        raise InvalidInput('attachments must be a list of llmconn.Attachment, e.g. '
                           'attachments=[Attachment.from_path("invoice.pdf")]')
    for item in attachments:
        label = f'attachment {item.name!r}' if item.name else 'an attachment'
        if item.size > max_bytes:
            raise InvalidInput(f'{connection}: {label} is {item.size} bytes, more than this connection\'s '
                               f'max_attachment_bytes ({max_bytes}); send a smaller file or raise the limit')
        if item.media_type not in accepts.get(item.source, ()):
            how = 'by URL' if item.url else 'as bytes'
            others = ', '.join(sorted(accepts.get(item.source, ()))) or 'none'
            raise InvalidInput(f'{connection}: its provider cannot take a {item.media_type} attachment {how} '
                               f'({label}); it takes {others} {how}')
    return tuple(attachments)


def _check_type(label: str, media_type: Any) -> None:
    if media_type not in MEDIA_TYPES:
        raise InvalidInput(f'{label}: media type {media_type!r} is not one llmconn takes; use one of '
                           f'{", ".join(sorted(MEDIA_TYPES))}')


def _short(url: str) -> str:
    """A URL as errors quote it: without credentials or a query (either may carry a secret), not too long."""
    try:
        parts = urlsplit(url)
        base = f'{parts.scheme}://{parts.hostname or ""}{parts.path}' if parts.scheme else parts.path
    except ValueError:
        base = ''
    return repr(base[:120] + ('…' if len(base) > 120 else ''))
