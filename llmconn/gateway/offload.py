"""CPU-heavy work of one request, run off the gevent hub so the others (and ``/health``) keep answering.

``llmconn serve`` runs every request as a greenlet on one hub: a request that
computes for seconds (jsonschema's ``check_schema`` of large tool schemas
costs about 10 µs per byte) would hold all of them. :func:`run` hands such
work to gevent's thread pool: the calling greenlet waits, the hub goes on,
and the interpreter switches between the worker thread and the hub every
few milliseconds. Outside a gevent server (the library, tests calling
functions directly) the work simply runs where it is called.

Only pure computation belongs here: nothing that touches a socket, Redis or
a greenlet's state.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, TypeVar

T = TypeVar('T')


def run(work: Callable[..., T], *args: Any) -> T:
    """``work(*args)``, in gevent's thread pool when this process serves under gevent; its exception re-raised."""
    if not _serving_under_gevent():
        return work(*args)
    from gevent import get_hub
    return get_hub().threadpool.apply(work, args)


def _serving_under_gevent() -> bool:
    # The server entry point monkey-patches before anything else; a library import never does (STYLE rule 8).
    monkey = sys.modules.get('gevent.monkey')
    return monkey is not None and monkey.is_module_patched('socket')
