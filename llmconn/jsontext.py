"""JSON as every request writes and reads it, with the encoder and decoder made once.

``json.dumps(value, ensure_ascii=False)`` builds a new ``JSONEncoder`` on
every call (only the all-defaults call reuses one), and ``json.loads`` of
bytes runs its encoding detection in Python; on a gateway request (a body
in, a provider body out and back, an answer out) they were about a tenth
of the Python it ran. These give the same results:

- :func:`dumps` is ``json.dumps(value, ensure_ascii=False)``;
- :func:`loads` is ``json.loads(raw)``, with :class:`StrictDecoder`
  ``json.loads(raw, parse_constant=..., parse_float=...)``: UTF-8, -16 or
  -32 detected from the first bytes as ``json.loads`` does (a body that
  opens with ``{`` or ``[`` and no NUL is UTF-8), lone surrogates passed
  through as ``json.loads`` passes them (:mod:`llmconn.text` cleans them).
"""

from __future__ import annotations

import json
from typing import Any, Callable

_encode = json.JSONEncoder(ensure_ascii=False).encode
_default = json.JSONDecoder()
_JSON_OPENERS = (b'{'[0], b'['[0])


def dumps(value: Any) -> str:
    """``value`` as JSON text, non-ASCII characters as themselves."""
    return _encode(value)


def text_of(raw: bytes | bytearray | str) -> str:
    """The JSON text of a body, decoded as ``json.loads`` decodes bytes."""
    if isinstance(raw, str):
        return raw
    if len(raw) > 1 and raw[0] in _JSON_OPENERS and raw[1]:
        return raw.decode('utf-8', 'surrogatepass')     # what detect_encoding answers for such a start
    return raw.decode(json.detect_encoding(raw), 'surrogatepass')


def loads(raw: bytes | bytearray | str) -> Any:
    """The value of a JSON body; ValueError (``json.JSONDecodeError``) when it is not JSON."""
    text = text_of(raw)
    if text.startswith('\ufeff'):       # json.loads refuses a str that starts with a BOM
        return json.loads(text)
    return _default.decode(text)


class StrictDecoder:
    """``json.loads(raw, parse_constant=..., parse_float=...)`` with one decoder for every call."""

    def __init__(self, parse_constant: Callable[[str], Any], parse_float: Callable[[str], Any]) -> None:
        self._decoder = json.JSONDecoder(parse_constant=parse_constant, parse_float=parse_float)

    def loads(self, raw: bytes | bytearray | str) -> Any:
        text = text_of(raw)
        if text.startswith('\ufeff'):
            return json.loads(text)
        return self._decoder.decode(text)
