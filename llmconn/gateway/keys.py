"""Gateway keys and tenants: the ``gateway:`` section of llm.yaml, and finding a request's key.

    gateway:
      response_expiry: 2592000          # seconds a stored response (and its state) is kept
      keys:
        - id: team-a-prod               # shown in usage records and logs; never the secret
          secret: ${TEAM_A_KEY}         # the bearer token; ${VAR} as everywhere in llm.yaml
          tenant: team-a                # responses are visible only within their tenant
          retention: standard           # or zero: only ids, times, status and counts are kept
          models: [Support, Coder]      # connection names this key may use; ["*"] for all
          hosted_tools: []              # provider-run tools (web_search, ...) it may ask for

A token is compared with every key's secret, always all of them, by their
SHA-256 digests with ``hmac.compare_digest``: the time taken says nothing
about which key was close, nor about the secrets' lengths. Secrets are ``SecretStr`` and never appear in a repr or a log.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from llmconn.errors import GatewayError

DEFAULT_RESPONSE_EXPIRY = 30 * 86400   # OpenAI keeps stored responses 30 days
ALL_MODELS = '*'


class _Frozen(BaseModel):
    model_config = ConfigDict(extra='forbid', frozen=True)


class GatewayKey(_Frozen):
    """One client key: who it belongs to and what it may use."""

    id: str = Field(min_length=1, max_length=128)
    secret: SecretStr
    tenant: str = Field(min_length=1, max_length=256)
    retention: Literal['standard', 'zero'] = 'standard'
    models: tuple[str, ...] = Field(min_length=1)
    hosted_tools: tuple[str, ...] = ()

    @field_validator('secret')
    @classmethod
    def _secret(cls, value: SecretStr) -> SecretStr:
        # ${KEY:-} left unset must not become "the empty key", which any client could send.
        if len(value.get_secret_value()) < 8:
            raise ValueError('the secret must have at least 8 characters (is its ${VARIABLE} set?)')
        return value

    def may_use(self, model: str) -> bool:
        return ALL_MODELS in self.models or model in self.models


class GatewayConfig(_Frozen):
    """The ``gateway:`` section; no keys means the gateway routes answer 404."""

    keys: tuple[GatewayKey, ...] = ()
    response_expiry: float = Field(DEFAULT_RESPONSE_EXPIRY, gt=0)

    @model_validator(mode='after')
    def _unique(self) -> 'GatewayConfig':
        ids = [k.id for k in self.keys]
        if len(set(ids)) != len(ids):
            raise ValueError('gateway key ids must be unique')
        secrets = [k.secret.get_secret_value() for k in self.keys]
        if len(set(secrets)) != len(secrets):
            raise ValueError('two gateway keys have the same secret; give each key its own')
        return self

    def check_models(self, connections: set) -> None:
        """Refuse (at load) a key naming a connection that does not exist: a typo would hide a model."""
        for key in self.keys:
            unknown = sorted(set(key.models) - connections - {ALL_MODELS})
            if unknown:
                raise ValueError(f'gateway key {key.id!r}: models {", ".join(unknown)} name no connection; '
                                 f'known connections are {", ".join(sorted(connections)) or "none"}')

    @property
    def enabled(self) -> bool:
        return bool(self.keys)


def bearer_token(authorization: str) -> str:
    """The token of an ``Authorization: Bearer <token>`` header, or ''."""
    scheme, _, token = authorization.strip().partition(' ')
    return token.strip() if scheme.lower() == 'bearer' else ''


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode('utf-8', 'surrogatepass')).digest()


def find_key(conf: GatewayConfig, token: str) -> GatewayKey:
    """The key whose secret is ``token``; 401 (OpenAI's shape) when none is."""
    # Digests, so every comparison is of equal length (compare_digest leaks a length mismatch), and every
    # key is compared, found or not, so the time taken does not tell how far the search went.
    given = _digest(token)
    found = None
    for key in conf.keys:
        if hmac.compare_digest(given, _digest(key.secret.get_secret_value())) and found is None:
            found = key
    if found is None or not token:
        raise GatewayError('Incorrect API key provided. Send a gateway key as "Authorization: Bearer <key>".',
                           401, type='invalid_request_error', code='invalid_api_key')
    return found
