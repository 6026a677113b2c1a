"""What the fake provider APIs share: the echo reply, word counts, signatures, answers.

Every fake API answers with the same deterministic text, so a test can read
from the reply alone what the model was sent::

    echo: <last user text> | users: <n> | previous: <user text before the last, or -> | system: <yes|no>

and a last user text starting with ``recall:`` adds `` | first: <the first user text>``, so a memory
test can ask for what only the whole conversation holds. When user messages carried attachments
(:mod:`llmconn.testing.fake_attachments`), `` | attached: <media types of the last one's, or ->
| files: <how many in all user messages>`` follows.

Token counts are whitespace-separated words: input = every input text
(system + messages), output = the reply text. A handler returns a
:class:`JSONAnswer` or a :class:`StreamAnswer`, or raises :class:`ApiError`
carrying the body in its provider's own error shape.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

# Prefixes of the last user text that ask a fake for reasoning output.
THINK_PREFIX = 'think:'
REDACT_PREFIX = 'redact:'
# A last user text starting with this asks the fake to repeat the conversation's first user text.
RECALL_PREFIX = 'recall:'

NO_PREVIOUS = '-'
_WORD_CHUNK = re.compile(r'\S+\s*')
# Words per streamed delta: small, so even a short reply streams as several deltas.
WORDS_PER_DELTA = 2


def reply_text(user_texts: list[str], has_system: bool, attached: list[list[str]] | None = None) -> str:
    """The deterministic answer to a conversation whose user messages are ``user_texts``
    (``attached``: each one's attachments' media types)."""
    last = user_texts[-1] if user_texts else ''
    previous = user_texts[-2] if len(user_texts) > 1 else NO_PREVIOUS
    system = 'yes' if has_system else 'no'
    text = f'echo: {last} | users: {len(user_texts)} | previous: {previous} | system: {system}'
    if last.startswith(RECALL_PREFIX):
        text += f' | first: {user_texts[0]}'
    if attached and any(attached):
        text += f' | attached: {", ".join(attached[-1]) or NO_PREVIOUS} | files: {sum(map(len, attached))}'
    return text


def count_words(*texts: str) -> int:
    return sum(len(text.split()) for text in texts if text)


def text_chunks(text: str) -> list[str]:
    """Split ``text`` into stream deltas that join back into exactly ``text``."""
    words = _WORD_CHUNK.findall(text)
    lead = text[:len(text) - len(text.lstrip())]
    chunks = [''.join(words[i:i + WORDS_PER_DELTA]) for i in range(0, len(words), WORDS_PER_DELTA)]
    if lead:
        chunks = [lead + chunks[0]] + chunks[1:] if chunks else [lead]
    return chunks or ['']


def new_id(prefix: str) -> str:
    return f'{prefix}{uuid.uuid4().hex}'


def now() -> int:
    return int(time.time())


class Signer:
    """Signs what the fake hands out opaquely, so altered replays can be refused.

    The secret lives only in this process, so a signature made by another
    server (or by a test) never verifies - as with the real APIs.
    """

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret or os.urandom(32)

    def _mac(self, data: bytes) -> bytes:
        return hmac.new(self._secret, data, hashlib.sha256).digest()

    def sign(self, text: str) -> str:
        return base64.b64encode(self._mac(text.encode('utf8'))).decode('ascii')

    def verify(self, text: Any, signature: Any) -> bool:
        if not isinstance(text, str) or not isinstance(signature, str):
            return False
        return hmac.compare_digest(self.sign(text), signature)

    def seal(self, text: str) -> str:
        """An opaque blob carrying ``text``, like redacted thinking or encrypted reasoning."""
        data = text.encode('utf8')
        return base64.b64encode(self._mac(data) + data).decode('ascii')

    def unseal(self, blob: Any) -> str | None:
        """The text inside a blob this signer sealed, or None when it was altered or foreign."""
        try:
            raw = base64.b64decode(blob, validate=True)
        except (TypeError, ValueError):
            return None
        mac, data = raw[:32], raw[32:]
        if len(mac) < 32 or not hmac.compare_digest(self._mac(data), mac):
            return None
        return data.decode('utf8', 'replace')


class ApiError(Exception):
    """A request the fake API refuses; ``body`` is already in the provider's error shape."""

    def __init__(self, status: int, body: Any, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(status)
        self.status = status
        self.body = body
        self.headers = dict(headers or {})


@dataclass
class JSONAnswer:
    status: int
    body: Any
    headers: dict = field(default_factory=dict)


@dataclass
class StreamAnswer:
    """A complete event sequence, plus what a broken stream sends instead.

    ``events`` are ``(event_name, data)`` pairs (``event_name`` '' when the API
    names none; ``data`` a dict or a literal string such as ``[DONE]``).
    ``first_delta`` is the index of the first content delta: a broken stream
    stops right after it. ``failure`` is what the API sends when it fails
    after that delta (already numbered to follow it).
    """

    events: list
    first_delta: int
    failure: list = field(default_factory=list)


def sse(event: str, data: Any) -> bytes:
    """One server-sent event as the provider writes it."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(',', ':'))
    head = f'event: {event}\n' if event else ''
    return f'{head}data: {payload}\n\n'.encode('utf8')


@dataclass
class Call:
    """One provider request, as a handler sees it."""

    method: str
    path: str
    headers: dict
    query: dict
    body: Any
    # Set by the router from the path (Gemini's model and method, a response id).
    params: dict = field(default_factory=dict)
    state: Any = None


def numbered(events: Iterable[tuple[str, dict]], start: int = 0) -> list[tuple[str, dict]]:
    """Give each Responses stream event its ``sequence_number``, counting from ``start``."""
    out = []
    for seq, (name, data) in enumerate(events, start):
        out.append((name, dict(data, sequence_number=seq)))
    return out


def require_json_object(call: Call, error: Callable[[int, str], ApiError]) -> dict:
    if not isinstance(call.body, dict):
        raise error(400, 'The request body is not a valid JSON object; send a JSON object.')
    return call.body
