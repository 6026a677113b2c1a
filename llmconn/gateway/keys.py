"""Gateway keys: finding a request's key among the ``gateway:`` section's (:mod:`llmconn.gateway_config`).

A token is compared with every key's secret, always all of them, by their
SHA-256 digests with ``hmac.compare_digest``: the time taken says nothing
about which key was close, nor about the secrets' lengths. Secrets are ``SecretStr`` and never appear in a repr or a log.
"""

from __future__ import annotations

import hashlib
import hmac

from llmconn.errors import GatewayError
from llmconn.gateway_config import (ALL_MODELS, DEFAULT_RESPONSE_EXPIRY, GatewayConfig, GatewayKey,  # noqa: F401
                                    Retention)


def bearer_token(authorization: str) -> str:
    """The token of an ``Authorization: Bearer <token>`` header, or ''."""
    scheme, _, token = authorization.strip().partition(' ')
    return token.strip() if scheme.lower() == 'bearer' else ''


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode('utf-8', 'surrogatepass')).digest()


class _KeyTable:
    """The keys of one ``gateway:`` section: their digests, and the tokens already found to be one of them.

    Made again for each new configuration (a reload brings a new, frozen one), so a removed or changed
    key is never found from here. Only tokens that matched are kept, at most :data:`FOUND_MAX`: a wrong
    token is compared with every digest each time, and a hit tells no more than the answer does.
    """

    __slots__ = ('conf', 'digests', 'found')

    def __init__(self, conf: GatewayConfig) -> None:
        self.conf = conf
        self.digests = tuple(_digest(key.secret.get_secret_value()) for key in conf.keys)
        self.found: dict[str, GatewayKey] = {}


FOUND_MAX = 1024        # tokens remembered per configuration (a key each: a handful in practice)
_table: _KeyTable | None = None     # of the configuration last asked


def _table_of(conf: GatewayConfig) -> _KeyTable:
    global _table
    table = _table
    if table is None or table.conf is not conf:
        table = _table = _KeyTable(conf)
    return table


def find_key(conf: GatewayConfig, token: str) -> GatewayKey:
    """The key whose secret is ``token``; 401 (OpenAI's shape) when none is."""
    table = _table_of(conf)
    known = table.found.get(token)
    if known is not None:
        return known
    # Digests, so every comparison is of equal length (compare_digest leaks a length mismatch), and every
    # key is compared, found or not, so the time taken does not tell how far the search went.
    given = _digest(token)
    found = None
    for key, digest in zip(conf.keys, table.digests):
        if hmac.compare_digest(given, digest) and found is None:
            found = key
    if found is None or not token:
        raise GatewayError('Incorrect API key provided. Send a gateway key as "Authorization: Bearer <key>".',
                           401, type='invalid_request_error', code='invalid_api_key')
    if len(table.found) < FOUND_MAX:
        table.found[token] = found
    return found
