"""From a ``redis.url`` to a :class:`ChatStore`, without touching the network.

The URL is read by :mod:`llmconn.store.urls` (the same reading ``llmconn
check`` does); this module turns it into redis-py clients behind the
runner of its deployment (:mod:`llmconn.store.runner`). ``memory://`` is an
embedded store (fakeredis with Lua) living in this process only. Nothing
connects here: the registry loads while Redis is down, and the first
command connects.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable

from llmconn.errors import ConfigError
from llmconn.store.history import ChatStore
from llmconn.store.limits import ADMIT as LIMITS_ADMIT
from llmconn.store.lock import ACQUIRE, FINISH, RENEW
from llmconn.store.cluster import ClusterRunner
from llmconn.store.runner import PooledRunner, RedisRunner, SentinelRunner
from llmconn.store.urls import CLUSTER, MEMORY, SENTINEL, RedisTarget, parse_redis_url

logger = logging.getLogger('llmconn.store')

SCRIPTS = {'acquire': ACQUIRE, 'finish': FINISH, 'renew': RENEW, 'limits': LIMITS_ADMIT}

# Connections per node for everything but blocked waiters.
MAX_CONNECTIONS = 1000

# A Redis that does not accept a connection fails the call quickly.
CONNECT_TIMEOUT = 2.0

# A command that gets no answer for this long fails (waiters block on their own client).
SOCKET_TIMEOUT = 5.0

# One immediate retry on a broken connection (Redis restarted under a pooled
# socket, a Sentinel failover): every store script is safe to send twice - a
# re-sent ACQUIRE finds its own token, a re-sent FINISH its saved token.
CONNECTION_RETRIES = 1

# memory:// stores by URL, so a registry reloaded in the same process keeps its history.
_memory_servers: dict[str, Any] = {}
_memory_lock = threading.Lock()
_memory_warned = False


def open_store(url: str, *, clock: Callable[[], float] | None = None, replicas: int = 0,
               replica_timeout: float = 1.0) -> ChatStore:
    """A :class:`ChatStore` for ``url``; connects lazily, on the first command.

    ``clock`` (default ``time.monotonic``) measures ``lock_wait``, so tests
    can make a waiter give up without waiting in real time. ``replicas``: a
    save returns only once that many replicas acknowledged it.
    """
    try:
        target = parse_redis_url(url)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if target.kind == MEMORY:
        client = _memory_client(url)
        runner = RedisRunner(lambda timeout: client, SCRIPTS, SOCKET_TIMEOUT)
        return ChatStore(runner, target, shared=False, clock=clock)
    make = {CLUSTER: _cluster_maker, SENTINEL: _sentinel_maker}.get(target.kind, _redis_maker)(target)
    kind = {CLUSTER: ClusterRunner, SENTINEL: SentinelRunner}.get(target.kind, PooledRunner)
    try:
        runner = kind(make, SCRIPTS, target.options.get('socket_timeout', SOCKET_TIMEOUT))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f'redis.url {target.display!r} is invalid: {_without_secret(str(exc), target)}') from None
    return ChatStore(runner, target, shared=True, clock=clock, replicas=replicas,
                     replica_timeout=replica_timeout)


def _common(target: RedisTarget) -> dict:
    """Connection settings every deployment shares: credentials, TLS, timeouts, retries."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    kwargs = dict(username=target.username, password=target.password, socket_connect_timeout=CONNECT_TIMEOUT,
                  retry=Retry(NoBackoff(), CONNECTION_RETRIES), max_connections=MAX_CONNECTIONS)
    # socket_timeout is the runner's to give: waiters block on a client with a longer one.
    kwargs.update({k: v for k, v in target.options.items() if not k.startswith('sentinel_') and k != 'socket_timeout'})
    if target.tls:
        kwargs['ssl'] = True
    return kwargs


def _redis_maker(target: RedisTarget) -> Callable[[float], Any]:
    import redis

    kwargs = _common(target)
    if target.path:
        kwargs.pop('ssl', None)
        kwargs.update(unix_socket_path=target.path, db=target.db)
    else:
        (host, port), = target.hosts
        kwargs.update(host=host, port=port, db=target.db)
    return lambda timeout: redis.Redis(socket_timeout=timeout, **kwargs)


def _sentinel_maker(target: RedisTarget) -> Callable[[float], Any]:
    from redis.backoff import NoBackoff
    from redis.retry import Retry
    from redis.sentinel import Sentinel

    kwargs = _common(target)
    max_connections = kwargs.pop('max_connections')
    sentinel_kwargs = {k.removeprefix('sentinel_'): v for k, v in target.options.items() if k.startswith('sentinel_')}
    # A sentinel that does not answer is skipped for the next one in the list, at once (redis-py's
    # default would retry each one three times with backoff before asking the next).
    sentinel_kwargs.update(socket_connect_timeout=CONNECT_TIMEOUT, socket_timeout=SOCKET_TIMEOUT,
                           retry=Retry(NoBackoff(), 0))
    if target.tls:
        sentinel_kwargs['ssl'] = True
    sentinel = Sentinel(list(target.hosts), sentinel_kwargs=sentinel_kwargs, **kwargs)
    return lambda timeout: sentinel.master_for(target.master, socket_timeout=timeout, db=target.db,
                                               max_connections=max_connections)


def _cluster_maker(target: RedisTarget) -> Callable[[float], Any]:
    from redis.cluster import ClusterNode, RedisCluster

    kwargs = _common(target)
    nodes = [ClusterNode(host, port) for host, port in target.hosts]
    return lambda timeout: RedisCluster(startup_nodes=nodes, socket_timeout=timeout, **kwargs)


def _without_secret(message: str, target: RedisTarget) -> str:
    return message.replace(target.password, '***') if target.password else message


def _memory_client(url: str) -> Any:
    """A client of this process's embedded store for ``url``, warning once that it is not shared."""
    global _memory_warned

    import fakeredis      # only memory:// needs it

    with _memory_lock:
        server = _memory_servers.get(url)
        if server is None:
            server = _memory_servers[url] = fakeredis.FakeServer()
        if not _memory_warned:
            _memory_warned = True
            logger.warning('Chat history is kept in this process only (redis.url is %s): other processes and '
                           'servers do not see it and it is lost on restart. Set redis.url to a Redis server '
                           'to share it.', url)
    return fakeredis.FakeRedis(server=server)
