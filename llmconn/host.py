"""What ``llmconn serve`` serves: a registry, its configuration watch, and the deployed services.

The configuration file is watched as the services are (see
:mod:`llmconn.deploy`: polled, debounced): a change is parsed and validated
off the gevent hub, then ``registry.reload(conf)`` swaps the connections
atomically; an invalid edit keeps the old registry and its error is
reported (``GET /services``, and ``/health`` and ``/ready`` say so).
"""

from __future__ import annotations

import logging
import os
import threading
import time as mod_time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmconn import config as mod_config
from llmconn.deploy import POLL_INTERVAL, Deployer, describe, iso, signature
from llmconn.hotload import off_hub

logger = logging.getLogger('llmconn.deploy')


class ConfigWatch:
    """Reloads the registry when its YAML file changes; a bad edit keeps the old one."""

    def __init__(self, registry: Any, path: str | os.PathLike) -> None:
        self.registry = registry
        self.path = Path(path).resolve()
        self.signature = self._signature()
        self.loaded_at = mod_time.time()
        self.error = ''
        self.error_at = 0.0
        self._pending: tuple | None = None

    def _signature(self) -> tuple:
        # The files the configuration names (templates) are part of it: an edit of one reloads too.
        files = getattr(getattr(self.registry, 'config', None), 'files', ())
        return tuple(signature(path) for path in (self.path, *files))

    def scan(self) -> None:
        sig = self._signature()
        if sig == self.signature:
            self._pending = None
        elif self._pending != sig:
            self._pending = sig             # look again next time: the editor may not be done
        else:
            self._pending, self.signature = None, sig
            self._reload()

    def _reload(self) -> None:
        try:
            # Parsed and validated off the hub: a large or hostile file takes its time there without
            # stalling requests; the swap itself is quick.
            conf = off_hub(mod_config.load_file, self.path)
            self.registry.reload(conf)
        except Exception as e:
            self.error, self.error_at = describe(e), mod_time.time()
            logger.error('The configuration %s was not reloaded, the previous one keeps serving: %s',
                         self.path, self.error)
            return
        self.loaded_at, self.error = mod_time.time(), ''
        logger.info('Reloaded the configuration %s', self.path)

    def status(self) -> dict:
        return {'file': self.path.name, 'loaded_at': iso(self.loaded_at), 'last_error': self.error or None,
                'last_error_at': iso(self.error_at) if self.error else None}


@dataclass
class Host:
    """What the HTTP server serves: a registry, its config watch, and the deployed services."""

    registry: Any
    deployer: Deployer
    config: ConfigWatch | None = None
    poll_interval: float = POLL_INTERVAL
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @classmethod
    def from_paths(cls, config_path: str | os.PathLike, services_dir: str | os.PathLike,
                   poll_interval: float = POLL_INTERVAL) -> 'Host':
        from llmconn.registry import Registry
        registry = Registry.from_file(config_path)
        return cls(registry, Deployer(services_dir), ConfigWatch(registry, config_path), poll_interval)

    def get_service(self, name: str) -> type:
        return self.deployer.get(name)

    def start(self) -> None:
        """Deploy everything now, then keep watching in the background."""
        self.deployer.scan(settle=False)
        self._thread = threading.Thread(target=self._watch, name='llmconn-deploy', daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_interval):
            try:
                self.deployer.scan()
                if self.config is not None:
                    self.config.scan()
            except Exception:
                logger.exception('Hot deployment failed to look at %s; will try again', self.deployer.dir)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def close(self) -> None:
        self.stop()
        self.registry.close()
