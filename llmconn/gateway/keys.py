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


# The keys' digests of the configuration last asked (a reload brings a new one): (conf, digests).
_digests: tuple = (None, ())


def _key_digests(conf: GatewayConfig) -> tuple:
    global _digests
    cached = _digests
    if cached[0] is not conf:
        cached = _digests = (conf, tuple(_digest(key.secret.get_secret_value()) for key in conf.keys))
    return cached[1]


def find_key(conf: GatewayConfig, token: str) -> GatewayKey:
    """The key whose secret is ``token``; 401 (OpenAI's shape) when none is."""
    # Digests, so every comparison is of equal length (compare_digest leaks a length mismatch), and every
    # key is compared, found or not, so the time taken does not tell how far the search went.
    given = _digest(token)
    found = None
    for key, digest in zip(conf.keys, _key_digests(conf)):
        if hmac.compare_digest(given, digest) and found is None:
            found = key
    if found is None or not token:
        raise GatewayError('Incorrect API key provided. Send a gateway key as "Authorization: Bearer <key>".',
                           401, type='invalid_request_error', code='invalid_api_key')
    return found
