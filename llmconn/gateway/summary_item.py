"""The ``compaction`` item of ``POST /v1/responses/compact``: a summary, encoded (not encrypted).

:mod:`llmconn.gateway.compact` makes it; :mod:`llmconn.gateway.items` reads it
back as a developer message. Kept apart so that reading an item needs
nothing of the route that makes one.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from llmconn import compaction
from llmconn.errors import GatewayError
from llmconn.gateway.echo import shown

CONTENT_PREFIX = 'llmconn-summary-v1:'


def encode(summary: str) -> str:
    return CONTENT_PREFIX + base64.urlsafe_b64encode(json.dumps({'summary': summary}).encode()).decode()


def decode(content: Any, where: str) -> str:
    """The summary text of a compaction item this gateway made, or a 400 saying what it needs."""
    try:
        if not isinstance(content, str) or not content.startswith(CONTENT_PREFIX):
            raise ValueError(content)
        summary = json.loads(base64.urlsafe_b64decode(content[len(CONTENT_PREFIX):]))['summary']
        if not isinstance(summary, str):
            raise ValueError(summary)
    except (ValueError, KeyError, TypeError):
        raise GatewayError(f'{where}.encrypted_content is not a compaction this gateway made '
                           f'(POST /v1/responses/compact): got {shown(content)}; send its output items as they came',
                           param=f'{where}.encrypted_content') from None
    return f'{compaction.SUMMARY_HEADER}\n{summary}'
