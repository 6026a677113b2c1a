"""Keeping secrets out of sight: masked URLs and values scrubbed of a known secret.

Every place that shows a Redis URL or a provider's answer to a person (reprs,
errors, logs, ``llmconn check``, ``/health``) goes through these.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

MASK = '***'


def mask_url(url: str) -> str:
    """``url`` with its password (in the authority or a ``password=`` query field) shown as ``***``."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if parts.password is not None:
            user_info, _, host = netloc.rpartition('@')
            user = user_info.partition(':')[0]
            netloc = f'{user}:{MASK}@{host}'
        query = parts.query
        if query:
            fields = [(k, MASK if k.lower() == 'password' else v) for k, v in parse_qsl(query, keep_blank_values=True)]
            query = urlencode(fields, safe='*')
        # Not urlunsplit: it turns unix:///path into unix:/path.
        shown = f'{parts.scheme}://{netloc}{parts.path}'
        return shown + (f'?{query}' if query else '') + (f'#{parts.fragment}' if parts.fragment else '')
    except ValueError:
        # Unparseable: show only the scheme rather than risk showing a password.
        return url.partition('://')[0] + '://' + MASK


def scrub(value: Any, secret: str) -> Any:
    """``value`` (a str, or JSON made of dicts and lists) with every occurrence of ``secret`` masked."""
    if not secret:
        return value
    if isinstance(value, str):
        return value.replace(secret, MASK)
    if isinstance(value, dict):
        return {k: scrub(v, secret) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v, secret) for v in value]
    return value
