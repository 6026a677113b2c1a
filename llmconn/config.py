"""Load and validate llm.yaml into frozen pydantic models.

Validation happens once, here: nothing deeper in the code reads raw config
dicts. Any problem becomes one :class:`ConfigError` naming the file, the
connection and the field. Secrets are expanded from the environment
(``${VAR}``, ``${VAR:-default}``, Zato's ``Zato_Enmasse_Env.VAR``) and kept
as ``SecretStr`` so they never show in a repr.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal, Mapping

from pydantic import (BaseModel, ConfigDict, Field, SecretStr, ValidationError, ValidationInfo, field_validator,
                      model_validator)

from llmconn import attachments as attachment_limits
from llmconn.errors import ConfigError
from llmconn.gateway_config import GatewayConfig
from llmconn.redact import mask_url
from llmconn.yamlfile import NoAliasLoader, expand_env, parse_yaml  # noqa: F401 - part of this module's API

# Zato's defaults, so a Zato author finds the same behaviour here.
DEFAULT_POOL_SIZE = 50
DEFAULT_TIMEOUT = 60
DEFAULT_MAX_TOKENS = 1024
DEFAULT_MAX_HISTORY_TURNS = 20
DEFAULT_CHAT_EXPIRY = 86400

# Our additions.
DEFAULT_MAX_RETRIES = 2
DEFAULT_LOCK_WAIT = 10.0        # as Zato's `block`: how long a chat call waits for the lock
DEFAULT_LOCK_TTL = 30.0         # the most a dead lock holder can block a chat
DEFAULT_MAX_TOOL_ROUNDS = 8
DEFAULT_TOOL_TIMEOUT = 60.0     # the longest one tool function may run while its chat is locked
# The lock is renewed every lock_ttl/3, each renewal a Redis round trip made by a background thread
# that must first get the GIL (switch interval 5 ms) or the gevent hub. Below 0.1 s renewals come
# every < 33 ms and one scheduling hiccup lets the lock expire mid-call: every chat call would fail.
MIN_LOCK_TTL = 0.1
DEFAULT_MAX_STORED_TURNS = 1000
DEFAULT_STREAM_TIMEOUT = 600.0  # the longest a whole stream may take (``timeout`` bounds each wait in it)
DEFAULT_REDIS_URL = 'memory://'
DEFAULT_REPLICA_TIMEOUT = 1.0   # seconds a save waits for redis.replicas acknowledgements
# Ten years: the longest duration any setting takes. Far more (1e12 s) overflows the waits of the
# deadline and lock-renewer threads (killing them: OverflowError) and Redis's expiry times.
MAX_SECONDS = 315_360_000
MAX_COUNT = 2 ** 31 - 1         # turns, tokens, pool sizes; far more overflows Redis's list indices
DEFAULT_COMPACTION_INSTRUCTIONS = ('Summarize the conversation below for the assistant who continues it: keep '
                                   'every fact, name, number, decision and open question; drop pleasantries. '
                                   'Answer with the summary only.')
MAX_PRICE = 1_000_000           # USD per million tokens; far more overflows a day's micro-USD counter

# Keys only provider: template reads; elsewhere they are refused rather than ignored.
TEMPLATE_KEYS = ('request_template', 'response_template', 'request_template_file', 'response_template_file',
                 'headers', 'method')


class _Frozen(BaseModel):
    model_config = ConfigDict(extra='forbid', frozen=True, allow_inf_nan=False)   # inf: OverflowError in every call


class ThinkingConfig(_Frozen):
    """Claude extended thinking, in Anthropic's own shape."""

    type: Literal['enabled', 'adaptive', 'disabled']
    budget_tokens: int | None = None

    @model_validator(mode='after')
    def _budget(self) -> 'ThinkingConfig':
        if self.type == 'enabled' and (self.budget_tokens is None or self.budget_tokens < 1024):
            raise ValueError('thinking type "enabled" needs budget_tokens of at least 1024')
        if self.type != 'enabled' and self.budget_tokens is not None:
            raise ValueError(f'budget_tokens only goes with thinking type "enabled", not "{self.type}"')
        return self

    def wire(self) -> dict:
        return self.model_dump(exclude_none=True)


class Pricing(_Frozen):
    """A connection's prices in USD per million tokens; the cache prices default to ``input``'s."""

    input: float = Field(ge=0, le=MAX_PRICE)
    output: float = Field(ge=0, le=MAX_PRICE)
    cache_read: float | None = Field(None, ge=0, le=MAX_PRICE)
    cache_write: float | None = Field(None, ge=0, le=MAX_PRICE)

    @property
    def read_price(self) -> float:
        return self.input if self.cache_read is None else self.cache_read

    @property
    def write_price(self) -> float:
        return self.input if self.cache_write is None else self.cache_write


class CompactionConfig(_Frozen):
    """Summarize the turns the window leaves behind with connection ``connection`` (SPEC §17)."""

    connection: str = Field(min_length=1)
    instructions: str = Field(DEFAULT_COMPACTION_INSTRUCTIONS, min_length=1)


class ConnectionConfig(_Frozen):
    """One entry of the ``llm`` list."""

    name: str = Field(min_length=1)
    is_active: bool = True
    provider: str = ''
    model: str = Field(min_length=1)
    address: str = ''
    secret: SecretStr | None = None
    pool_size: int = Field(DEFAULT_POOL_SIZE, ge=1, le=MAX_COUNT)
    timeout: float = Field(DEFAULT_TIMEOUT, gt=0, le=MAX_SECONDS)
    stream_timeout: float = Field(DEFAULT_STREAM_TIMEOUT, gt=0, le=MAX_SECONDS)
    max_tokens: int = Field(DEFAULT_MAX_TOKENS, ge=1, le=MAX_COUNT)
    max_history_turns: int = Field(DEFAULT_MAX_HISTORY_TURNS, ge=1, le=MAX_COUNT)
    chat_expiry: float = Field(DEFAULT_CHAT_EXPIRY, gt=0, le=MAX_SECONDS)
    max_retries: int = Field(DEFAULT_MAX_RETRIES, ge=0, le=10)
    lock_wait: float = Field(DEFAULT_LOCK_WAIT, ge=0, le=MAX_SECONDS)
    lock_ttl: float = Field(DEFAULT_LOCK_TTL, le=MAX_SECONDS)
    max_stored_turns: int = Field(DEFAULT_MAX_STORED_TURNS, ge=1, le=MAX_COUNT)
    thinking: ThinkingConfig | None = None
    state: Literal['local', 'provider'] = 'local'
    params: dict[str, Any] = Field(default_factory=dict)
    # Tools: provider calls one turn may make, and the hosted (provider-run) tools a call may use,
    # as the provider's own definitions.
    max_tool_rounds: int = Field(DEFAULT_MAX_TOOL_ROUNDS, ge=1, le=100)
    tool_timeout: float = Field(DEFAULT_TOOL_TIMEOUT, gt=0, le=MAX_SECONDS)
    hosted_tools: list[dict[str, Any]] = Field(default_factory=list)
    max_attachment_bytes: int = Field(attachment_limits.DEFAULT_MAX_BYTES, ge=1, le=attachment_limits.MAX_BYTES)
    # provider: template (SPEC §12). A *_file is read at load, relative to the configuration
    # file, into the inline key; the path stays so errors can name it.
    request_template: str = ''
    response_template: str = ''
    request_template_file: str = ''
    response_template_file: str = ''
    headers: dict[str, str] = Field(default_factory=dict)
    method: Literal['POST', 'PUT', 'PATCH'] = 'POST'
    # Cost (SPEC §17): the provider's prompt cache (Claude breakpoints, OpenAI prompt_cache_key), how
    # long Claude keeps what is written, and how many turns at a time the window's start moves.
    cache: Literal['auto', 'off'] = 'auto'
    cache_ttl: Literal['5m', '1h'] = '5m'
    window_step: int = Field(1, ge=1, le=MAX_COUNT)
    pricing: Pricing | None = None      # counted as ``cost`` (micro-USD) in the usage ledger
    compaction: CompactionConfig | None = None
    # Failover (SPEC §18, llmconn.failover): the connections a call moves on to, in order, when this
    # one's provider fails after its retries (connect error, timeout, 5xx, 429).
    fallbacks: tuple[str, ...] = ()

    @field_validator('fallbacks', mode='before')
    @classmethod
    def _fallback_list(cls, value: Any) -> Any:
        if not isinstance(value, (list, tuple)) or not all(isinstance(n, str) and n for n in value):
            raise ValueError(f'must be a list of connection names, e.g. fallbacks: [Backup], '
                             f'got {type(value).__name__} {str(value)[:80]!r}')
        twice = sorted({n for n in value if list(value).count(n) > 1})
        if twice:
            raise ValueError(f'names {", ".join(map(repr, twice))} more than once; list each once')
        return value

    @model_validator(mode='before')
    @classmethod
    def _aliases(cls, data: Any) -> Any:
        # Zato accepts api_key and password as names for the secret.
        if isinstance(data, dict):
            given = [k for k in ('secret', 'api_key', 'password') if k in data]
            if len(given) > 1:
                raise ValueError(f'give the secret once, not as {" and ".join(given)}')
            if given and given[0] != 'secret':
                data = dict(data)
                data['secret'] = data.pop(given[0])
        return data

    @model_validator(mode='before')
    @classmethod
    def _infer(cls, data: Any, info: ValidationInfo) -> Any:
        """``provider`` from the model name and ``address`` from the provider, when not given.

        Done in the model, so a ConnectionConfig built by hand is as complete as a loaded one.
        Files the provider's settings name are read here too, relative to ``base_dir`` in the
        validation context (the configuration file's directory).
        """
        from llmconn.providers import PROVIDERS  # the provider registry imports this module's types

        if not isinstance(data, dict) or not isinstance(data.get('model'), str):
            return data
        data = dict(data)
        provider = data.get('provider') or infer_provider(data['model'])
        if provider not in PROVIDERS:
            raise ValueError(f'field "provider": unknown provider {provider!r}; '
                             f'valid providers are {", ".join(sorted(PROVIDERS))}')
        data['provider'] = provider
        data['address'] = data.get('address') or PROVIDERS[provider].default_address
        base_dir = Path((info.context or {}).get('base_dir', '.'))
        return PROVIDERS[provider].read_files(data, base_dir)

    @field_validator('lock_ttl')
    @classmethod
    def _lock_ttl(cls, value: float) -> float:
        if not value >= MIN_LOCK_TTL:
            raise ValueError(f'lock_ttl must be at least {MIN_LOCK_TTL:g} s, got {value:g}: the chat lock is '
                             f'renewed every lock_ttl/3 by a background thread, which cannot keep up with less '
                             f'and every chat call would lose its lock; the default is {DEFAULT_LOCK_TTL:g}')
        return value

    @field_validator('address')
    @classmethod
    def _address(cls, value: str) -> str:
        if value and not value.startswith(('http://', 'https://')):
            raise ValueError(f'address must start with http:// or https://, got {mask_url(value)!r}')
        if value:
            _check_address_host(value)
        return value.rstrip('/')

    @field_validator('params')
    @classmethod
    def _params(cls, value: dict) -> dict:
        from llmconn.checks import params_problem

        problem = params_problem(value)
        if problem:
            raise ValueError(f'params must be JSON values: {problem}')
        return value

    @model_validator(mode='after')
    def _consistent(self) -> 'ConnectionConfig':
        from llmconn.providers import PROVIDERS

        given = [key for key in TEMPLATE_KEYS if key in self.model_fields_set]
        if self.provider != 'template' and given:
            raise ValueError(f'field "{given[0]}": only provider template reads it; remove it or set provider: template')
        PROVIDERS[self.provider].check_config(self)
        if self.max_stored_turns < self.max_history_turns:
            raise ValueError('max_stored_turns must be at least max_history_turns')
        if self.window_step > self.max_history_turns:
            raise ValueError(f'field "window_step": {self.window_step} is more than max_history_turns '
                             f'({self.max_history_turns}); the window moves at most its whole length at a time')
        if self.thinking and self.thinking.budget_tokens and self.thinking.budget_tokens >= self.max_tokens:
            raise ValueError(f'thinking.budget_tokens ({self.thinking.budget_tokens}) must be below '
                             f'max_tokens ({self.max_tokens})')
        return self

    @property
    def secret_value(self) -> str:
        return self.secret.get_secret_value() if self.secret else ''

    def __repr_args__(self):
        # The address may carry credentials (https://user:key@proxy): show it masked.
        for name, value in super().__repr_args__():
            yield name, mask_url(value) if name == 'address' and value else value


def _check_address_host(address: str) -> None:
    """Refuse at load an address every call would fail on (requests: InvalidURL): no host, a bad port."""
    from urllib.parse import urlsplit
    # The host is after the last "@": passwords are pasted unencoded (see redact.mask_url).
    authority = address.partition('://')[2].rpartition('@')[2]
    parts = urlsplit('http://' + authority.split('/')[0].split('?')[0].split('#')[0])
    try:
        parts.port
    except ValueError:
        raise ValueError(f'address {mask_url(address)!r} has a port that is not a number from 1 to 65535') from None
    if not parts.hostname:
        raise ValueError(f'address {mask_url(address)!r} names no host; write e.g. https://proxy.example.com')


class RedisConfig(_Frozen):
    """Where chat history lives (see :mod:`llmconn.store.urls` for the URL forms) and how durable a save is."""

    url: str = Field(DEFAULT_REDIS_URL, repr=False)
    # A chat call returns only once its turn reached this many replicas (WAIT, same round trip as the save).
    replicas: int = Field(0, ge=0, le=16)
    # How long the save waits for those replicas before it raises StoreError.
    replica_timeout: float = Field(DEFAULT_REPLICA_TIMEOUT, gt=0, le=60)

    @field_validator('url')
    @classmethod
    def _url(cls, value: str) -> str:
        # The same reading as open_store's, so `llmconn check` refuses what loading refuses.
        from llmconn.store.urls import parse_redis_url
        parse_redis_url(value)
        return value

    @model_validator(mode='after')
    def _replicas_need_redis(self) -> 'RedisConfig':
        if self.replicas and self.url.lower().startswith('memory:'):
            raise ValueError('replicas needs a Redis server with replicas; memory:// has none')
        return self

    def __repr_args__(self):
        # The URL may carry the Redis password: show it masked, as SecretStr does for secrets.
        yield 'url', mask_url(self.url)


class ServerConfig(_Frozen):
    """Settings of ``llmconn serve``; ``api_keys`` empty means no key is required."""

    api_keys: tuple[SecretStr, ...] = ()


class Config(_Frozen):
    """A whole llm.yaml file."""

    redis: RedisConfig = RedisConfig()
    skills_dir: str = 'skills'
    server: ServerConfig = ServerConfig()
    gateway: GatewayConfig = GatewayConfig()     # the OpenAI-compatible routes, see llmconn.gateway
    llm: tuple[ConnectionConfig, ...] = ()
    # Where the file lives; relative paths (skills_dir) resolve against it.
    base_dir: Path = Path('.')
    source: str = '<dict>'

    @model_validator(mode='after')
    def _gateway_models(self) -> 'Config':
        self.gateway.check_models({conn.name for conn in self.llm})
        return self

    @model_validator(mode='after')
    def _compaction_connections(self) -> 'Config':
        names = {conn.name for conn in self.llm}
        for conn in self.llm:
            if conn.compaction and conn.compaction.connection not in names:
                raise ValueError(f'connection "{conn.name}": field "compaction.connection" names '
                                 f'{conn.compaction.connection!r}, which is not a connection of this file; '
                                 f'known connections: {", ".join(sorted(names))}')
        return self

    @model_validator(mode='after')
    def _fallback_connections(self) -> 'Config':
        by_name = {conn.name: conn for conn in self.llm}
        for conn in self.llm:
            for name in conn.fallbacks:
                if name == conn.name:
                    raise ValueError(f'connection "{conn.name}": field "fallbacks" lists the connection itself; '
                                     f'a fallback is another connection')
                if name not in by_name:
                    raise ValueError(f'connection "{conn.name}": field "fallbacks" names {name!r}, which is not '
                                     f'a connection of this file; known connections: {", ".join(sorted(by_name))}')
        for conn in self.llm:
            cycle = _fallback_cycle(conn.name, by_name, [])
            if cycle:
                raise ValueError(f'connection "{conn.name}": field "fallbacks" makes a cycle '
                                 f'({" -> ".join(cycle)}); a call could fail over back to where it failed. '
                                 f'Remove one of these fallbacks')
        return self

    @property
    def skills_path(self) -> Path:
        return (self.base_dir / self.skills_dir).resolve()

    @property
    def files(self) -> tuple[Path, ...]:
        """The files this configuration read besides itself (template files), for a watcher."""
        return tuple((self.base_dir / name).resolve() for conn in self.llm
                     for name in (conn.request_template_file, conn.response_template_file) if name)


def _fallback_cycle(name: str, by_name: dict, path: list) -> list:
    """The names of a fallback cycle reachable from ``name`` (ending where it began), or []."""
    if name in path:
        return path[path.index(name):] + [name]
    for fallback in by_name[name].fallbacks:
        cycle = _fallback_cycle(fallback, by_name, path + [name])
        if cycle:
            return cycle
    return []


def infer_provider(model: str) -> str:
    """Zato's rule when ``provider`` is absent: by model-name prefix."""
    if model.startswith('claude'):
        return 'claude'
    if model.startswith('gemini'):
        return 'gemini'
    return 'openai'


def load_file(path: str | os.PathLike, environ: Mapping[str, str] | None = None) -> Config:
    """Read and validate one llm.yaml file."""
    path = Path(path)
    try:
        text = path.read_text(encoding='utf-8')
    except OSError as e:
        raise ConfigError(f'{path}: cannot read the configuration file ({e.strerror})') from None
    except UnicodeDecodeError as e:
        raise ConfigError(f'{path}: not UTF-8 text (byte {e.start}); save the file as UTF-8') from None
    data = parse_yaml(text, str(path))
    return load_dict(data, base_dir=path.parent, source=str(path), environ=environ)


def load_dict(data: Any, base_dir: str | os.PathLike = '.', source: str = '<dict>',
              environ: Mapping[str, str] | None = None) -> Config:
    """Validate an already-parsed configuration; ``source`` names it in errors."""
    environ = os.environ if environ is None else environ
    if not isinstance(data, dict):
        raise ConfigError(f'{source}: the top level must be a mapping with keys redis, skills_dir, llm')
    unknown = set(data) - {'redis', 'skills_dir', 'server', 'gateway', 'llm'}
    if unknown:
        raise ConfigError(f'{source}: unknown top-level key(s) {", ".join(sorted(map(str, unknown)))}; '
                          f'valid keys are redis, skills_dir, server, gateway, llm')
    raw_conns = data.get('llm') or []
    if not isinstance(raw_conns, list):
        raise ConfigError(f'{source}: "llm" must be a list of connections')
    conns = []
    seen: set[str] = set()
    for index, raw in enumerate(raw_conns):
        conn = _load_connection(raw, index, source, environ, Path(base_dir))
        if conn.name in seen:
            raise ConfigError(f'{source}: connection "{conn.name}": the name is used twice; names must be unique')
        seen.add(conn.name)
        conns.append(conn)
    top = {k: v for k, v in data.items() if k != 'llm'}
    try:
        top = expand_env(top, '', environ)
        return Config(llm=tuple(conns), base_dir=Path(base_dir), source=source, **top)
    except ConfigError as e:
        raise ConfigError(f'{source}: {e}') from None
    except ValidationError as e:
        raise ConfigError(f'{source}: {_describe(e)}') from None


def _load_connection(raw: Any, index: int, source: str, environ: Mapping[str, str],
                     base_dir: Path = Path('.')) -> ConnectionConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f'{source}: llm[{index}] must be a mapping with at least name and model')
    label = f'connection "{raw["name"]}"' if raw.get('name') else f'llm[{index}]'
    try:
        expanded = expand_env(raw, '', environ)
    except ConfigError as e:
        raise ConfigError(f'{source}: {label}: {e}') from None
    try:
        return ConnectionConfig.model_validate(expanded, context={'base_dir': base_dir})
    except ValidationError as e:
        raise ConfigError(f'{source}: {label}: {_describe(e)}') from None


def _describe(error: ValidationError) -> str:
    """One line per problem: the field's dotted path and what is wrong with it."""
    parts = []
    for item in error.errors():
        loc = '.'.join(str(p) for p in item['loc'])
        message = item['msg']
        if item['type'] == 'extra_forbidden':
            message = 'unknown key (check its spelling)'
        elif item['type'] == 'missing':
            message = 'required key is missing'
        message = message.removeprefix('Value error, ')
        parts.append(f'field "{loc}": {message}' if loc else message)
    return '; '.join(parts)
