"""From a ``redis.url`` to a :class:`ChatStore`, without touching the network.

``redis://``, ``rediss://`` (TLS) and ``unix://`` URLs go to redis-py;
``memory://`` is an embedded store (fakeredis with Lua) living in this
process only. Nothing connects here: the registry loads while Redis is down,
and the first command connects.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable
from urllib.parse import urlsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from llmconn.errors import ConfigError
from llmconn.redact import mask_url
from llmconn.store.history import ChatStore

logger = logging.getLogger('llmconn.store')

MEMORY_SCHEME = 'memory'
REDIS_SCHEMES = ('redis', 'rediss', 'unix')

# The client for everything off the hot path (renewals, history, ping); chat
# calls use their own connections, see :mod:`llmconn.store.wire`.
MAX_CONNECTIONS = 100

# A Redis that does not accept a connection fails the call quickly.
CONNECT_TIMEOUT = 2.0

# Longer than a waiter's BLPOP (history.WAKE_WAIT_CAP), or waiting would time out.
SOCKET_TIMEOUT = 5.0

# One immediate retry on a broken connection (e.g. Redis restarted under a
# pooled socket); off the hot path, every command there is safe to repeat.
CONNECTION_RETRIES = 1

# memory:// stores by URL, so a registry reloaded in the same process keeps its history.
_memory_servers: dict[str, Any] = {}
_memory_lock = threading.Lock()
_memory_warned = False


def open_store(url: str, *, clock: Callable[[], float] | None = None) -> ChatStore:
    """A :class:`ChatStore` for ``url``; connects lazily, on the first command.

    ``clock`` (default ``time.monotonic``) measures ``lock_wait``, so tests
    can make a waiter give up without waiting in real time.
    """
    display = mask_url(url)
    scheme = url.partition('://')[0].lower() if '://' in url else ''
    if scheme == MEMORY_SCHEME:
        return ChatStore(_memory_client(url), url_for_display=display, shared=False, clock=clock)
    if scheme not in REDIS_SCHEMES:
        raise ConfigError(f'redis.url {display!r} is not supported: use redis://, rediss:// (TLS), unix:// '
                          f'or memory:// (one process only)')
    try:
        client = redis.Redis.from_url(
            url, max_connections=MAX_CONNECTIONS, socket_timeout=SOCKET_TIMEOUT,
            socket_connect_timeout=CONNECT_TIMEOUT, retry=Retry(NoBackoff(), CONNECTION_RETRIES))
    except ValueError as exc:
        raise ConfigError(f'redis.url {display!r} is invalid: {_without_secret(str(exc), url)}') from None
    return ChatStore(client, url_for_display=display, shared=True, clock=clock)




def _without_secret(message: str, url: str) -> str:
    try:
        password = urlsplit(url).password
    except ValueError:
        return 'unparseable URL'
    return message.replace(password, '***') if password else message


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
