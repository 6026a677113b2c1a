"""Keeping secrets out of sight: masked URLs and values scrubbed of a known secret.

Every place that shows a Redis URL or a provider's answer to a person (reprs,
errors, logs, ``llmconn check``, ``/health``) goes through these.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlencode

MASK = '***'


def mask_url(url: str) -> str:
    """``url`` with its userinfo (password, or a lone user that may be a token) and any query field
    named like a password (``password=``, ``sentinel_password=``) shown as ``***``.

    Passwords are often pasted unencoded, holding ``/``, ``#``, ``?`` or ``@``,
    which a URL parser then reads as path, fragment or query, printing the rest
    of the password. So the userinfo is taken as everything between ``://`` and
    the last ``@`` before the query, whatever it holds; showing too little of a
    URL is the safe way to be wrong.
    """
    scheme, sep, rest = url.partition('://')
    if not sep:
        return url if '@' not in url else MASK
    head, qmark, query = rest.partition('?')
    user_info, at, host_and_path = head.rpartition('@')
    if '@' in query:
        # An unencoded "?" inside the password (which may hold "@" too): the userinfo ends at the last "@".
        user_info, at, host_and_path = rest.rpartition('@')
        qmark, query = '', ''
        host_and_path, qmark, query = host_and_path.partition('?')
    if at:
        user, colon, _ = user_info.partition(':')
        head = (f'{user}:{MASK}' if colon else MASK) + '@' + host_and_path
    else:
        head = host_and_path
    if qmark:
        try:
            fields = [(k, MASK if k.lower().endswith('password') else v)
                      for k, v in parse_qsl(query, keep_blank_values=True)]
            query = urlencode(fields, safe='*/:')
        except ValueError:
            query = MASK
    return f'{scheme}://{head}' + (f'?{query}' if qmark else '')


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
