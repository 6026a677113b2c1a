"""The ``gateway:`` section of llm.yaml, validated at load with the rest of the configuration.

    gateway:
      response_expiry: 2592000          # seconds a stored response (and its state) is kept
      keys:
        - id: team-a-prod               # shown in usage records and logs; never the secret
          secret: ${TEAM_A_KEY}         # the bearer token; ${VAR} as everywhere in llm.yaml
          tenant: team-a                # responses are visible only within their tenant
          retention: standard           # or zero: only ids, times, status and counts are kept
          models: [Support, Coder]      # connection names this key may use; ["*"] for all
          hosted_tools: []              # provider-run tools (web_search, ...) it may ask for
          limits: {rpm: 60, tpm: 100000, budget_usd: 25, budget_period: month}   # each optional
      websocket:                        # WebSocket mode of /v1/responses (client.responses.connect())
        idle_timeout: 300               # seconds a socket may wait for its next message
        max_message_bytes: 10485760     # a larger message closes that socket (close code 1009)

Here, not in :mod:`llmconn.gateway`, so that the core configuration
(:mod:`llmconn.config`) needs nothing of the gateway's code; finding a
request's key is :mod:`llmconn.gateway.keys`. Secrets are ``SecretStr`` and
never appear in a repr or a log.
"""

from __future__ import annotations

from enum import Enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationInfo, field_validator, model_validator

DEFAULT_RESPONSE_EXPIRY = 30 * 86400   # OpenAI keeps stored responses 30 days
# An agent's socket waits while its client runs tools between two responses: minutes, not the 30 s an
# idle HTTP connection gets.
DEFAULT_WS_IDLE_TIMEOUT = 300.0
DEFAULT_WS_MAX_MESSAGE_BYTES = 10 * 1024 * 1024     # the HTTP route's body limit (server_limits.MAX_BODY_BYTES)
ALL_MODELS = '*'


class Retention(str, Enum):
    """What a key's responses keep: everything (``standard``), or only ids, times, status and counts."""

    STANDARD = 'standard'
    ZERO = 'zero'

    def __str__(self) -> str:       # the value in logs and f-strings, as enum.StrEnum (3.11+) would
        return self.value

    __format__ = str.__format__


class _Frozen(BaseModel):
    model_config = ConfigDict(extra='forbid', frozen=True, allow_inf_nan=False)


class KeyLimits(_Frozen):
    """A key's limits (SPEC §18); an absent one is no limit. Enforced by :mod:`llmconn.gateway.limits`."""

    rpm: int | None = None                  # requests per minute
    tpm: int | None = None                  # tokens (input + output) per minute
    budget_usd: float | None = None         # spend per period, at the connections' pricing
    budget_period: Literal['day', 'month'] = 'day'

    @property
    def enabled(self) -> bool:
        return self.rpm is not None or self.tpm is not None or self.budget_usd is not None


_WHOLE = {'rpm': 'requests per minute', 'tpm': 'tokens per minute'}
MIN_BUDGET_USD = 0.000001       # one micro-dollar, the unit the limits script counts spend in


def _check_limits(key_id: str, value: object) -> object:
    """Refuse a limit that is zero, negative or not a number, naming the key and the field."""
    if not isinstance(value, dict):
        return value            # the model's own error says what a mapping needs
    for name in ('rpm', 'tpm', 'budget_usd'):
        if value.get(name) is None:
            continue
        n = value[name]
        whole = name in _WHOLE
        # YAML's true is an int to Python, and 1.5 requests a minute is no count: both refused.
        ok = (isinstance(n, int) if whole else isinstance(n, (int, float))) and not isinstance(n, bool)
        if not ok or not n > 0 or n == float('inf'):        # NaN fails n > 0
            what = f'a whole number of {_WHOLE[name]}' if whole else 'a number of US dollars'
            raise ValueError(f'gateway key {key_id!r}: limits.{name} must be {what} above 0, got {n!r}; '
                             f'leave it out for no limit')
        if not whole and n < MIN_BUDGET_USD:        # it would round to a budget of 0: none at all
            raise ValueError(f'gateway key {key_id!r}: limits.budget_usd must be at least {MIN_BUDGET_USD:f} '
                             f'(spend is counted in micro-dollars), got {n!r}; leave it out for no limit')
    return value


class GatewayKey(_Frozen):
    """One client key: who it belongs to and what it may use."""

    id: str = Field(min_length=1, max_length=128)
    secret: SecretStr
    tenant: str = Field(min_length=1, max_length=256)
    retention: Retention = Retention.STANDARD
    models: tuple[str, ...] = Field(min_length=1)
    hosted_tools: tuple[str, ...] = ()
    limits: KeyLimits = KeyLimits()

    @field_validator('limits', mode='before')
    @classmethod
    def _limits(cls, value: object, info: ValidationInfo) -> object:
        return _check_limits(str(info.data.get('id', '?')), value)

    @field_validator('secret')
    @classmethod
    def _secret(cls, value: SecretStr) -> SecretStr:
        # ${KEY:-} left unset must not become "the empty key", which any client could send.
        if len(value.get_secret_value()) < 8:
            raise ValueError('the secret must have at least 8 characters (is its ${VARIABLE} set?)')
        return value

    def may_use(self, model: str) -> bool:
        return ALL_MODELS in self.models or model in self.models


class WebSocketSettings(_Frozen):
    """``gateway.websocket``: how long a WebSocket of ``/v1/responses`` may idle, how large a message may be."""

    idle_timeout: float = Field(DEFAULT_WS_IDLE_TIMEOUT, gt=0, le=86400)
    max_message_bytes: int = Field(DEFAULT_WS_MAX_MESSAGE_BYTES, ge=1024, le=1024 ** 3)


class GatewayConfig(_Frozen):
    """The ``gateway:`` section; no keys means the gateway routes answer 404."""

    keys: tuple[GatewayKey, ...] = ()
    response_expiry: float = Field(DEFAULT_RESPONSE_EXPIRY, gt=0, le=315_360_000)     # ten years at most
    websocket: WebSocketSettings = WebSocketSettings()

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
