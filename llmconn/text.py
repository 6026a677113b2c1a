"""Text is valid Unicode everywhere: surrogate pairs joined, lone surrogates replaced.

JSON escapes text outside the Basic Multilingual Plane as a UTF-16 pair
(``"\\ud83d\\ude00"`` is 😀), and a provider streaming deltas may cut
between the two halves: one event ends with ``\\ud83d``, the next starts with
``\\ude00``. ``json.loads`` turns each half into a lone surrogate, which
Python keeps in a ``str`` but cannot encode as UTF-8; stored, it made every
later call on the chat raise ``UnicodeEncodeError``.

So text is cleaned where it leaves a provider mapping: :class:`Joiner`
holds back a delta's trailing high surrogate until the next delta brings
its low half, and :func:`clean` joins any pair and replaces whatever is
still lone with U+FFFD. Input text holding a lone surrogate is refused
before any network call (see :mod:`llmconn.checks`).
"""

from __future__ import annotations

import re
from typing import Any

REPLACEMENT = '\ufffd'
_surrogate = re.compile('[\ud800-\udfff]')


def has_surrogate(text: str) -> bool:
    """True when ``text`` holds a surrogate code point, which no UTF-8 encoder accepts.

    ASCII text, most of what passes, is told by a flag CPython keeps on every string,
    without a scan; only other text is searched.
    """
    return not text.isascii() and _surrogate.search(text) is not None


def clean(text: str) -> str:
    """``text`` with surrogate pairs joined into their character and lone surrogates as U+FFFD."""
    if not has_surrogate(text):
        return text
    return text.encode('utf-16-le', 'surrogatepass').decode('utf-16-le', 'replace')


def clean_value(value: Any) -> Any:
    """Every string in a JSON-like value cleaned (dicts, lists and tuples walked)."""
    if isinstance(value, str):
        return clean(value)
    if isinstance(value, dict):
        return {clean_value(k): clean_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(clean_value(v) for v in value)
    return value


class Joiner:
    """Cleans a stream of deltas, joining a surrogate pair split between two of them."""

    def __init__(self) -> None:
        self._pending = ''

    def feed(self, delta: str) -> str:
        """What of ``delta`` can be handed on now (a trailing high surrogate waits for its pair)."""
        text = self._pending + delta
        self._pending = ''
        if text and '\ud800' <= text[-1] <= '\udbff':
            text, self._pending = text[:-1], text[-1]
        return clean(text)

    def flush(self) -> str:
        """The held-back half, as U+FFFD, when the stream ended before its pair came."""
        pending, self._pending = self._pending, ''
        return clean(pending)
