"""What an HTTP answer from a provider says: when to retry, and the human message of an error.

Pure functions of headers and parsed bodies, shared by the transport and its tests.
"""

from __future__ import annotations

import email.utils
import re
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


_DURATION = re.compile(r'(\d+(?:\.\d+)?)(ms|h|m|s)')
_UNIT = {'h': 3600.0, 'm': 60.0, 's': 1.0, 'ms': 0.001}


def parse_duration(value: str) -> float | None:
    """Seconds from OpenAI's ``x-ratelimit-reset-*`` form (``20ms``, ``1s``, ``6m0s``, ``1h2m3.5s``), if it is one."""
    value = value.strip()
    parts = _DURATION.findall(value)
    if not parts or ''.join(number + unit for number, unit in parts) != value:
        return None
    return sum(float(number) * _UNIT[unit] for number, unit in parts)


def rate_limit_wait(headers) -> float | None:
    """Seconds a rate-limited answer asks its caller to wait, if it says.

    ``retry-after-ms`` or ``Retry-After`` first (what the retries use, see
    :func:`parse_retry_after`); else OpenAI's ``x-ratelimit-reset-requests`` /
    ``-tokens`` of the counters it reports as spent (remaining 0), the later
    of them, since the request needs both.
    """
    wait = parse_retry_after(headers)
    if wait is not None:
        return wait
    resets = [parse_duration(headers.get(f'x-ratelimit-reset-{kind}') or '')
              for kind in ('requests', 'tokens') if (headers.get(f'x-ratelimit-remaining-{kind}') or '').strip() == '0']
    resets = [r for r in resets if r is not None]
    return max(resets) if resets else None


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


