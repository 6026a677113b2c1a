"""``redis.url`` read once, offline, into a :class:`RedisTarget`: what to connect to and how.

Four forms (plus ``memory://``, the embedded one-process store)::

    redis://[user:password@]host[:port][/db][?options]      one node (rediss:// for TLS)
    unix://[user:password@]/path/to/socket[?db=N&options]   one node on a unix socket
    redis+cluster://[user:password@]h1:p1,h2:p2[?options]   Redis Cluster (rediss+cluster:// for TLS)
    redis+sentinel://[user:password@]h1:p1,h2:p2/master[/db][?options]
                                                            Sentinel-managed master (rediss+sentinel://)

Loading the configuration and ``llmconn check`` both call :func:`parse_redis_url`,
so a URL that one accepts the other accepts too. The user information is
everything up to the *last* ``@``, so a password holding ``/``, ``#`` or ``?``
unencoded is still read whole (and masked whole, see :func:`llmconn.redact.mask_url`).
Nothing here imports redis or touches the network.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from urllib.parse import parse_qsl, unquote

from llmconn.redact import mask_url



class Deployment(str, Enum):
    """What ``redis.url`` names: the embedded store, one node, a Cluster, or a Sentinel-managed master."""

    MEMORY = 'memory'
    SINGLE = 'single'
    CLUSTER = 'cluster'
    SENTINEL = 'sentinel'

    def __str__(self) -> str:       # the value in messages, as enum.StrEnum (3.11+) would
        return self.value

    __format__ = str.__format__


MEMORY, SINGLE, CLUSTER, SENTINEL = Deployment.MEMORY, Deployment.SINGLE, Deployment.CLUSTER, Deployment.SENTINEL

# scheme -> (deployment kind, TLS)
SCHEMES = {
    'memory': (MEMORY, False),
    'redis': (SINGLE, False), 'rediss': (SINGLE, True), 'unix': (SINGLE, False),
    'redis+cluster': (CLUSTER, False), 'rediss+cluster': (CLUSTER, True),
    'redis+sentinel': (SENTINEL, False), 'rediss+sentinel': (SENTINEL, True),
}

DEFAULT_PORT = 6379
DEFAULT_SENTINEL_PORT = 26379

# Query options passed on to redis-py's connections, with their types (the
# subset of redis-py's own URL options that makes sense for a chat store).
OPTIONS = {
    'socket_timeout': float, 'socket_connect_timeout': float, 'socket_keepalive': bool,
    'health_check_interval': int, 'max_connections': int, 'protocol': int,
    'ssl_cert_reqs': str, 'ssl_ca_certs': str, 'ssl_ca_path': str, 'ssl_certfile': str,
    'ssl_keyfile': str, 'ssl_check_hostname': bool,
}
# Only for Sentinel: how to authenticate to the sentinels themselves (often none).
SENTINEL_OPTIONS = {'sentinel_username': str, 'sentinel_password': str}


@dataclass(frozen=True)
class RedisTarget:
    """Where a chat store lives; ``display`` is the URL with its password masked."""

    kind: Deployment
    tls: bool = False
    hosts: tuple[tuple[str, int], ...] = ()
    path: str = ''                      # unix socket
    db: int = 0
    master: str = ''                    # Sentinel service name
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    options: dict = field(default_factory=dict, repr=False)     # may hold sentinel_password
    display: str = ''


def parse_redis_url(url: str) -> RedisTarget:
    """Read ``url``; a ``ValueError`` (with the password masked) says what is wrong and what to write."""
    display = mask_url(url)
    scheme, sep, rest = url.partition('://')
    if not sep or scheme.lower() not in SCHEMES:
        raise ValueError(f'redis.url {display!r} is not supported: use redis://, rediss:// (TLS), unix://, '
                         f'redis+cluster://, redis+sentinel:// (rediss+... for TLS) or memory:// (one process only)')
    kind, tls = SCHEMES[scheme.lower()]
    if kind == MEMORY:
        return RedisTarget(MEMORY, display=display)
    userinfo, at, rest = rest.rpartition('@')
    username, password = _credentials(userinfo) if at else (None, None)
    rest, _, query = rest.partition('?')
    rest = rest.partition('#')[0]
    options = _options(query, kind, display)
    common = dict(tls=tls, username=username, password=password, display=display)
    if scheme.lower() == 'unix':
        if not rest.startswith('/'):
            raise ValueError(f'redis.url {display!r}: a unix:// URL needs the socket path, e.g. unix:///run/redis.sock')
        db = options.pop('db', 0)
        return RedisTarget(SINGLE, path=unquote(rest), db=db, options=options, **common)
    hostlist, _, path = rest.partition('/')
    hosts = _hosts(hostlist, kind, display)
    segments = [unquote(s) for s in path.split('/')] if path else []
    if kind == SINGLE:
        if len(hosts) != 1:
            raise ValueError(f'redis.url {display!r}: one host:port only; for several nodes use '
                             f'redis+cluster:// or redis+sentinel://')
        db = options.pop('db', None)
        return RedisTarget(SINGLE, hosts=hosts, db=_db(segments, display) if db is None else db,
                           options=options, **common)
    if kind == CLUSTER:
        if any(segments) or 'db' in options:
            raise ValueError(f'redis.url {display!r}: a Redis Cluster has only database 0; remove the /db part')
        return RedisTarget(CLUSTER, hosts=hosts, options=options, **common)
    if not segments or not segments[0]:
        raise ValueError(f'redis.url {display!r}: name the Sentinel master, e.g. redis+sentinel://h1:26379,'
                         f'h2:26379/mymaster/0')
    return RedisTarget(SENTINEL, hosts=hosts, master=segments[0], db=_db(segments[1:], display),
                       options=options, **common)


def _credentials(userinfo: str) -> tuple[str | None, str | None]:
    user, colon, password = userinfo.partition(':')
    return (unquote(user) or None), (unquote(password) if colon else None)


def _hosts(hostlist: str, kind: Deployment, display: str) -> tuple[tuple[str, int], ...]:
    default = DEFAULT_SENTINEL_PORT if kind == SENTINEL else DEFAULT_PORT
    hosts = []
    for item in hostlist.split(','):
        item = item.strip()
        if item.startswith('['):                       # [IPv6]:port
            host, _, port = item[1:].partition(']')
            port = port.removeprefix(':')
        else:
            host, _, port = item.rpartition(':') if ':' in item else (item, '', '')
        if not host:
            raise ValueError(f'redis.url {display!r}: a host is missing (write host:port, several separated by ",")')
        if port and not (port.isdigit() and 0 < int(port) < 65536):
            raise ValueError(f'redis.url {display!r}: port {port!r} of {host!r} is not a number from 1 to 65535')
        hosts.append((host, int(port) if port else default))
    return tuple(hosts)


def _db(segments: list[str], display: str) -> int:
    segments = [s for s in segments if s]
    if not segments:
        return 0
    if len(segments) > 1 or not segments[0].isdigit():
        raise ValueError(f'redis.url {display!r}: the database must be a number, e.g. /0')
    return int(segments[0])


def _options(query: str, kind: Deployment, display: str) -> dict:
    allowed = dict(OPTIONS, db=int) if kind != CLUSTER else dict(OPTIONS)
    if kind == SENTINEL:
        allowed.update(SENTINEL_OPTIONS)
    options = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name not in allowed:
            raise ValueError(f'redis.url {display!r}: unknown option {name!r}; valid options are '
                             f'{", ".join(sorted(allowed))}')
        options[name] = _typed(name, value, allowed[name], display)
    return options


def _typed(name: str, value: str, kind: type, display: str):
    try:
        if kind is bool:
            if value.lower() not in ('1', '0', 'true', 'false', 'yes', 'no'):
                raise ValueError
            return value.lower() in ('1', 'true', 'yes')
        return kind(value)
    except ValueError:
        raise ValueError(f'redis.url {display!r}: option {name!r} must be a {kind.__name__}') from None
