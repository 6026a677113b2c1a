"""Reading provider answers from their bytes: JSON bodies and server-sent event streams.

Answers are read as the real APIs and the servers that imitate them send
them: JSON is decoded from its bytes (UTF-8 unless a charset says
otherwise, whatever the content type claims); server-sent events may end
their lines with LF, CRLF or CR, start with a byte order mark, and end
without a final blank line.

A stream request's answer is typed: :class:`EventStream` or, from a server
that ignored ``stream``, :class:`JSONBody`.
"""

from __future__ import annotations

import codecs
import itertools
import json
import re

from llmconn import jsontext
from typing import Any, Iterable, Iterator, NamedTuple



class SSE(tuple):
    """One server-sent event as ``(event, data)``; ``event`` is '' when the stream names none."""

    __slots__ = ()

    @property
    def event(self) -> str:
        return self[0]

    @property
    def data(self) -> str:
        return self[1]


class JSONBody(NamedTuple):
    """A stream request answered with one plain JSON body (the server ignored ``stream``)."""

    body: Any


class EventStream(NamedTuple):
    """A stream request answered with server-sent events, read as they arrive."""

    events: Iterator[SSE]


_line_end = re.compile(rb'\r\n|\r|\n')
_charset = re.compile(r'charset\s*=\s*"?([\w.:-]+)', re.IGNORECASE)


def decode_json(raw: bytes, content_type: str = '') -> Any:
    """JSON from a body's bytes: UTF-8 (or -16/-32, detected) unless the content type names a charset.

    ``requests`` would decode a ``text/*`` body without a charset as
    ISO-8859-1 and garble every non-ASCII character; JSON is UTF-8 by default.
    """
    match = _charset.search(content_type)
    if match and match.group(1).lower().replace('_', '-') not in ('utf-8', 'utf8'):
        try:
            return json.loads(raw.decode(match.group(1)))
        except (LookupError, UnicodeDecodeError):
            pass    # a charset we cannot honour: the bytes may still be UTF-8
    return jsontext.loads(raw)


def sniff(chunks: Iterable[bytes]) -> tuple[bytes, Iterator[bytes]]:
    """The first meaningful byte of a body, and all of its chunks (none lost to the peek)."""
    chunks = iter(chunks)
    seen: list[bytes] = []
    for chunk in chunks:
        seen.append(chunk)
        head = b''.join(seen).removeprefix(codecs.BOM_UTF8).lstrip()
        if head:
            return head[:1], itertools.chain(seen, chunks)
    return b'', iter(seen)


def _lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Lines ended by LF, CRLF or CR (a CRLF may be split between chunks); the last one even unended.

    Only each new chunk is scanned, so a long line arriving in many pieces costs linear time.
    """
    pending = bytearray()
    after_cr = False
    for chunk in chunks:
        if not chunk:
            continue
        start = 1 if after_cr and chunk[:1] == b'\n' else 0
        for match in _line_end.finditer(chunk, start):
            pending += chunk[start:match.start()]
            yield bytes(pending)
            pending.clear()
            start = match.end()
        pending += chunk[start:]
        after_cr = chunk.endswith(b'\r')
    if pending:
        yield bytes(pending)


def iter_sse(chunks: Iterable[bytes]) -> Iterator[SSE]:
    """Parse a server-sent event stream from byte chunks as they arrive, by the WHATWG rules.

    Beyond them, an event whose data is blank (a keep-alive) is skipped, and the
    last event counts even when the stream ends without its blank line.
    """
    event, data = '', []
    lines = _lines(chunks)
    first = next(lines, None)
    if first is None:
        return
    for raw in itertools.chain((first.removeprefix(codecs.BOM_UTF8),), lines):
        line = raw.decode('utf-8', errors='replace')
        if not line:
            if data:
                joined = '\n'.join(data)
                if joined.strip():
                    yield SSE((event, joined))
            event, data = '', []
        elif line[0] != ':':
            field, _, value = line.partition(':')
            if value[:1] == ' ':
                value = value[1:]
            if field == 'data':
                data.append(value)
            elif field == 'event':
                event = value
    if data:
        joined = '\n'.join(data)
        if joined.strip():
            yield SSE((event, joined))
