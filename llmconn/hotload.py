"""Helpers of hot deployment: run slow work off the gevent hub; which deployed files import which.

Under ``llmconn serve`` every greenlet shares one OS thread, so a service
file whose import computes for seconds (or a configuration that takes long
to parse) would freeze every request of that worker. :func:`off_hub` runs
such work in a real OS thread of gevent's threadpool: the calling greenlet
waits, the hub keeps serving, and the result is swapped in afterwards by
the caller. Outside gevent (tests, a plain Python process) it just calls.

:func:`imported_names` reads a file's ``import`` statements (without
running it), so the deployer can deploy a helper module before the
services that import it, and redeploy those services when it changes.
"""

from __future__ import annotations

import ast
import sys
from typing import Any, Callable


def off_hub(func: Callable[..., Any], *args: Any) -> Any:
    """``func(*args)`` in an OS thread when this process is gevent-patched; here otherwise."""
    gevent_monkey = sys.modules.get('gevent.monkey')
    if gevent_monkey is None or not gevent_monkey.is_module_patched('threading'):
        return func(*args)
    import gevent

    def call() -> tuple[bool, Any]:
        # Everything, SystemExit included, comes back to the caller as a value and is raised there.
        try:
            return True, func(*args)
        except BaseException as e:      # noqa: B902
            return False, e

    ok, value = gevent.get_hub().threadpool.apply(call)
    if not ok:
        raise value
    return value


def imported_names(source: bytes) -> set[str]:
    """Every module name ``source`` imports, with its parent packages: ``from a.b import c`` → a, a.b, a.b.c."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return set()        # the import itself will report it
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f'{node.module}.{alias.name}' for alias in node.names)
    return {part for name in names for part in _split(name)}


def _split(name: str) -> list[str]:
    parts = name.split('.')
    return ['.'.join(parts[:i]) for i in range(1, len(parts) + 1)]
