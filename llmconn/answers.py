"""What an HTTP answer from a provider says: when to retry, and the human message of an error.

Pure functions of headers and parsed bodies, shared by the transport and its tests.
"""

from __future__ import annotations

import email.utils
import time as mod_time
from typing import Any


def parse_retry_after(headers) -> float | None:
    """Seconds from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date), if given."""
    value = headers.get('retry-after-ms')
    if value:
        try:
            return max(0.0, float(value) / 1000)
        except ValueError:
            pass
    value = headers.get('retry-after')
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - mod_time.time())


def provider_message(body: Any) -> str:
    """The human message inside any provider's error body, with its kind (``overloaded_error``, ...)."""
    if isinstance(body, list) and body:
        body = body[0]      # Gemini's streaming endpoint wraps its error in an array
    if isinstance(body, dict):
        error = body.get('error', body)
        if isinstance(error, dict):
            message = str(error.get('message') or '')[:500]
            kind = error.get('type') or error.get('status') or error.get('code')
            return f'{message} ({kind})' if message and isinstance(kind, str) and kind else message
        if isinstance(error, str):
            return error[:500]
    if isinstance(body, str):
        return ' '.join(body.split())[:200]
    return ''


