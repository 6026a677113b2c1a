"""The registry: every configured connection, looked up by name.

A registry is built from one configuration (a file or a dict) and can be
reloaded from the same file. Reloading builds the whole new set first and
swaps it in with one assignment, so a lookup sees either the old set or the
new one, never a mix; a call already running keeps the connection it
started with. A connection whose settings (and skills directory) did not
change is carried over, HTTP pool and all; no live connection is ever
changed. A replaced connection closes once its running calls finish, and a
replaced chat store once every connection using it has closed, so a running
call keeps its HTTP pool and its lock renewal (see :mod:`llmconn.lifetime`).
A bad file raises and leaves the old set serving.

Loading never talks to Redis: the store connects on first use, so
``invoke`` works while Redis is down.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any, Iterator

from llmconn import config as mod_config
from llmconn.config import Config
from llmconn.connection import Connection
from llmconn.errors import ConfigError, UnknownConnection
from llmconn.lifetime import CloseAfter
from llmconn.skills import SkillCache
from llmconn.store import open_store
from llmconn.usage import UsageLedger

logger = logging.getLogger(__name__)


class Registry:
    """Connections by name, plus the chat store and skills they share."""

    def __init__(self, conf: Config, path: Path | None = None) -> None:
        self.path = path
        self._reload_lock = threading.Lock()
        self._state = self._build(conf, previous=None)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> 'Registry':
        path = Path(path)
        return cls(mod_config.load_file(path), path=path)

    @classmethod
    def from_dict(cls, data: dict, base_dir: str | os.PathLike = '.') -> 'Registry':
        return cls(mod_config.load_dict(data, base_dir=base_dir))

    # -- lookups ---------------------------------------------------------------------------------

    def __getitem__(self, name: str) -> Connection:
        try:
            return self._state.connections[name]
        except KeyError:
            known = ', '.join(f'"{n}"' for n in self._state.connections) or 'none are configured'
            raise UnknownConnection(f'no LLM connection named {name!r}; known connections: {known}') from None

    def __contains__(self, name: object) -> bool:
        return name in self._state.connections

    def __len__(self) -> int:
        return len(self._state.connections)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._state.connections))

    def __repr__(self) -> str:
        return f'<Registry {list(self._state.connections)} store={self.store.url_for_display}>'

    @property
    def config(self) -> Config:
        return self._state.config

    @property
    def store(self):
        return self._state.store

    @property
    def usage(self) -> UsageLedger:
        """The usage ledger every connection of this registry counts into."""
        return self._state.usage

    @property
    def skills(self) -> SkillCache:
        return self._state.skills

    # -- lifecycle -------------------------------------------------------------------------------

    def reload(self, conf: Config | None = None) -> None:
        """Re-read the file this registry came from and swap the whole set of connections.

        ``conf``: that file, already loaded (the host parses it off its event loop).
        """
        if self.path is None:
            raise ConfigError('this registry was built from a dict; there is no file to reload')
        with self._reload_lock:
            new = self._build(conf or mod_config.load_file(self.path), previous=self._state)
            old, self._state = self._state, new
        kept = {id(conn) for conn in new.connections.values()}
        replaced = [conn for conn in old.connections.values() if id(conn) not in kept]
        if old.store is not new.store:
            # Every connection of the old store is replaced (none is carried over to another store).
            store_done = CloseAfter(len(replaced), old.close_store)
            for conn in replaced:
                conn.retire(then=store_done.done)
        else:
            for conn in replaced:
                conn.retire()
        logger.info('Reloaded %s: %d connection(s)', self.path, len(new.connections))

    def __enter__(self) -> 'Registry':
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        """Close every connection, write the usage counted in this process, close the store."""
        state = self._state
        for conn in state.connections.values():
            conn.close()
        state.usage.close()      # writes the usage counted in this process
        state.store.close()

    @staticmethod
    def _build(conf: Config, previous: '_State | None') -> '_State':
        if previous is not None and previous.config.redis == conf.redis:
            store, usage = previous.store, previous.usage
        else:
            store = open_store(conf.redis.url, replicas=conf.redis.replicas,
                               replica_timeout=conf.redis.replica_timeout)
            usage = UsageLedger(store)
        if previous is not None and previous.skills.directory == conf.skills_path:
            skills = previous.skills     # it notices edited skill files by itself
        else:
            skills = SkillCache(conf.skills_path)
        connections = {}
        for conn_conf in conf.llm:
            old = previous.connections.get(conn_conf.name) if previous else None
            if old is not None and old.conf == conn_conf and old.store is store and old.skills is skills:
                connections[conn_conf.name] = old
            else:
                connections[conn_conf.name] = Connection(conn_conf, store, skills, usage=usage)
        for conn in connections.values():
            conn.peers = connections    # a compaction's summarizer is looked up among these
        return _State(conf, store, skills, connections, usage)


class _State:
    """One consistent generation of a registry; replaced whole on reload."""

    __slots__ = ('config', 'store', 'skills', 'connections', 'usage')

    def __init__(self, config: Config, store: Any, skills: SkillCache, connections: dict,
                 usage: Any = None) -> None:
        self.usage = usage
        self.config = config
        self.store = store
        self.skills = skills
        self.connections = connections

    def close_store(self) -> None:
        """Write what this generation's calls counted, then close its store (once its last call ended)."""
        self.usage.close()
        self.store.close()
