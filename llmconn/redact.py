"""Keeping secrets out of sight: masked URLs and values scrubbed of a known secret.

Every place that shows a Redis URL or a provider's answer to a person (reprs,
errors, logs, ``llmconn check``, ``/health``) goes through these.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlencode

MASK = '***'


def mask_url(url: str) -> str:
    """``url`` with its password (in the user information or a ``*password=`` query field) shown as ``***``.

    The user information runs to the *last* ``@``, as :mod:`llmconn.store.urls` reads it, so a
    password holding ``/``, ``#``, ``?`` or ``@`` unencoded is masked whole.
    """
    scheme, sep, rest = url.partition('://')
    if not sep:
        return url if '@' not in url else MASK
    userinfo, at, rest = rest.rpartition('@')
    if at:
        user, colon, _ = userinfo.partition(':')
        rest = f'{user}:{MASK}@{rest}' if colon else f'{user}@{rest}'
    head, qmark, query = rest.partition('?')
    if qmark:
        query, hash_, fragment = query.partition('#')
        fields = [(k, MASK if 'password' in k.lower() else v) for k, v in parse_qsl(query, keep_blank_values=True)]
        rest = f'{head}?{urlencode(fields, safe="*/:")}' + (f'#{fragment}' if hash_ else '')
    return f'{scheme}://{rest}'


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
