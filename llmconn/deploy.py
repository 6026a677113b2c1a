"""Hot deployment: every ``*.py`` under the services directory, and the YAML configuration.

A background loop looks at the files every :data:`POLL_INTERVAL` seconds.
A file whose size or modification time changed is deployed once it has
looked the same on two looks in a row, so an editor's half-written file is
not imported (debouncing); a change is serving within about half a second.

Deploying a file imports it into a fresh module, collects its
:class:`~llmconn.service.Service` subclasses and, only if that all worked
and no name clashes with another file's service, swaps in a new name →
service dict with one assignment. A request looks the dict up once, so it
sees the old version or the new one, never half of a module. A file that
fails keeps its previous version serving and its error is kept for
``GET /services`` (and logged). A removed file undeploys its services.

Why polling and not watchdog: ``llmconn serve`` runs under gevent, where
watchdog's observer thread would become a greenlet blocked in a native
inotify read, stalling every request. A stat of a handful of files four
times a second costs nothing and behaves the same everywhere.

A helper module under the services directory (one that services import,
``from helpers import ...``) is deployed before the services importing it,
and a change to it redeploys them too, so they see the new version.

Imports run off the gevent hub (:func:`llmconn.hotload.off_hub`): a file
whose import takes seconds delays only its own deployment, not the requests
being served. Module-level code therefore runs on a threadpool thread: a
greenlet spawned there would belong to that thread's hub, so background
work starts from ``handle()``. (A CPU-bound ``handle()`` still blocks its worker; see the
README.)

The configuration file is watched the same way (:mod:`llmconn.host`).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time as mod_time
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmconn.hotload import imported_names, off_hub
from llmconn.service import Service, UnknownService

logger = logging.getLogger(__name__)

POLL_INTERVAL = 0.25        # seconds between two looks at the files; a change serves within ~2 of them


@dataclass(frozen=True)
class Deployed:
    """One deployed service: its class, the file it came from and when."""

    name: str
    cls: type
    path: Path
    deployed_at: float


@dataclass
class FileState:
    """What is known about one watched file."""

    signature: tuple = ()
    services: tuple = ()
    deployed_at: float = 0.0
    error: str = ''
    error_at: float = 0.0


def signature(path: Path) -> tuple:
    """What changes when a file is written: size, modification time and inode (editors replace files)."""
    try:
        st = path.stat()
    except OSError:
        return ()
    return st.st_size, st.st_mtime_ns, st.st_ino


class Deployer:
    """The services of one directory, deployed and kept up to date."""

    def __init__(self, services_dir: str | os.PathLike) -> None:
        self.dir = Path(services_dir).resolve()
        self.services: dict[str, Deployed] = {}     # replaced whole, never mutated
        self.files: dict[Path, FileState] = {}
        self._pending: dict[Path, tuple] = {}
        self._owned_modules: set[str] = set()
        self.imports: dict[Path, set[str]] = {}     # file → module names its source imports
        self._lock = threading.Lock()

    def get(self, name: str) -> type:
        deployed = self.services.get(name)
        if deployed is None:
            raise UnknownService(f'no service named {name!r} is deployed; GET /services lists the deployed ones')
        return deployed.cls

    def scan(self, settle: bool = True) -> None:
        """One look at the directory; ``settle=False`` deploys changes at once (used at startup)."""
        with self._lock:
            present = {path: signature(path) for path in self._py_files()}
            for path in [p for p in self.files if p not in present]:
                self._undeploy(path)
            changed = {}
            for path, sig in present.items():
                state = self.files.get(path)
                if state is not None and state.signature == sig:
                    self._pending.pop(path, None)
                elif not settle or self._pending.get(path) == sig:
                    self._pending.pop(path, None)
                    changed[path] = sig
                else:
                    self._pending[path] = sig
            self._deploy_in_order(changed, present)

    def _deploy_in_order(self, queue: dict, present: dict) -> None:
        """Deploy ``queue``, each file after the queued files it imports; then the files importing it."""
        done = set()
        while queue:
            path = self._next(queue)
            ok = self._deploy(path, queue.pop(path))
            done.add(path)
            if not ok:
                continue
            name = _module_name(self.dir, path)
            for other, sig in present.items():
                if other not in done and other not in queue and name in self.imports.get(other, ()):
                    queue[other] = sig      # it imports what just changed: refresh it

    def _next(self, queue: dict) -> Path:
        queued = {_module_name(self.dir, p) for p in queue}
        for path in sorted(queue):
            if not (self._imports_of(path) & (queued - {_module_name(self.dir, path)})):
                return path
        return min(queue)       # an import cycle: any order

    def _imports_of(self, path: Path) -> set[str]:
        try:
            return imported_names(path.read_bytes())
        except OSError:
            return set()

    def _py_files(self) -> list[Path]:
        if not self.dir.is_dir():
            return []
        found = []
        for path in self.dir.rglob('*.py'):
            parts = path.relative_to(self.dir).parts
            if not any(p.startswith('.') or p == '__pycache__' for p in parts):
                found.append(path)
        return sorted(found)

    def _deploy(self, path: Path, sig: tuple) -> bool:
        state = self.files.setdefault(path, FileState())
        state.signature = sig
        try:
            source = path.read_bytes()
            self.imports[path] = imported_names(source)
            classes = off_hub(self._import, path, source)
            names = self._check_names(path, classes)
        except (Exception, SystemExit) as e:        # a module calling sys.exit() must not end the watcher
            state.error, state.error_at = describe(e), mod_time.time()
            logger.error('Could not deploy %s, its previous version (if any) keeps serving: %s',
                         path, state.error, exc_info=not isinstance(e, (SyntaxError, _Clash)))
            return False
        now = mod_time.time()
        services = {n: d for n, d in self.services.items() if d.path != path}
        services.update({n: Deployed(n, c, path, now) for n, c in zip(names, classes)})
        self.services = services        # the one assignment requests can observe
        state.services, state.deployed_at, state.error = tuple(names), now, ''
        logger.info('Deployed %s: %s', path.name, ', '.join(names) or 'no services')
        return True

    def _undeploy(self, path: Path) -> None:
        state = self.files.pop(path)
        self._pending.pop(path, None)
        self.imports.pop(path, None)
        self.services = {n: d for n, d in self.services.items() if d.path != path}
        module_name = _module_name(self.dir, path)
        if module_name in self._owned_modules:
            self._owned_modules.discard(module_name)
            sys.modules.pop(module_name, None)
        logger.info('Undeployed %s (removed): %s', path.name, ', '.join(state.services) or 'no services')

    def _import(self, path: Path, source: bytes) -> list[type]:
        """Execute the file as a fresh module; the running version is untouched if this fails."""
        module_name = _module_name(self.dir, path)
        code = compile(source, str(path), 'exec')
        module = types.ModuleType(module_name)
        module.__file__ = str(path)
        # Registered while it runs (dataclasses and pickling look modules up by name), but never
        # over a module we did not deploy: a services/json.py must not replace the real json.
        owned = module_name not in sys.modules or module_name in self._owned_modules
        previous = sys.modules.get(module_name)
        if owned:
            sys.modules[module_name] = module
        try:
            exec(code, module.__dict__)
        except BaseException:
            if owned:
                _restore(module_name, previous)
            raise
        if owned:
            self._owned_modules.add(module_name)
        return [obj for obj in vars(module).values()
                if isinstance(obj, type) and issubclass(obj, Service) and obj.__module__ == module_name]

    def _check_names(self, path: Path, classes: list[type]) -> list[str]:
        names = [cls.get_name() for cls in classes]
        for name in names:
            if names.count(name) > 1:
                raise _Clash(f'the service name {name!r} is defined twice in this file; rename one')
            other = self.services.get(name)
            if other is not None and other.path != path:
                raise _Clash(f'the service name {name!r} is already deployed from {other.path.name}; '
                             f'rename one of them')
        return names

    def status(self) -> list[dict]:
        """One entry per file: its services, when deployed, and its last error if any."""
        return [{'file': path.name, 'services': list(state.services),
                 'deployed_at': iso(state.deployed_at), 'last_error': state.error or None,
                 'last_error_at': iso(state.error_at) if state.error else None}
                for path, state in sorted(self.files.items())]


class _Clash(Exception):
    """Two services would share one name."""


def _module_name(base: Path, path: Path) -> str:
    # As Zato does for hot-deployed files: the module is named after the file.
    return '.'.join(path.relative_to(base).with_suffix('').parts)


def _restore(module_name: str, previous: Any) -> None:
    if previous is None:
        sys.modules.pop(module_name, None)
    else:
        sys.modules[module_name] = previous


def describe(e: BaseException) -> str:
    if isinstance(e, _Clash):
        return str(e)           # the message says it all; the class is an internal name
    if isinstance(e, SyntaxError):
        return f'SyntaxError: {e.msg} (line {e.lineno})'
    return f'{type(e).__name__}: {e}'


def iso(ts: float) -> str | None:
    if not ts:
        return None
    return mod_time.strftime('%Y-%m-%dT%H:%M:%S', mod_time.gmtime(ts)) + f'.{int(ts % 1 * 1000):03d}Z'
