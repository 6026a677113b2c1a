"""The listening socket of ``llmconn serve``, bound by a lone server or by the supervisor of its workers.

With ``--workers N`` the supervisor binds the one socket and every worker
accepts from it (its descriptor passed on, as gunicorn does). A worker
killed with connections waiting leaves them queued on the shared socket
for the others, where N sockets sharing the port through ``SO_REUSEPORT``
would have the kernel reset every connection queued on the dead one's.

Only the standard library: the supervisor, never gevent-patched, imports
this; in a patched worker ``socket.socket`` is gevent's by the time these
functions run.
"""

from __future__ import annotations

import socket

LISTEN_BACKLOG = 1024


def bind(host: str, port: int):
    """A socket listening on ``host:port``; an OSError saying what to do when the port is taken."""
    family = socket.AF_INET6 if ':' in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Accepted sockets inherit it from the listener on Linux and the BSDs (else ~40 ms per
        # keep-alive response).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
    except OSError as e:
        sock.close()
        raise OSError(e.errno, f'cannot listen on {host}:{port} ({e.strerror}); '
                               f'is another server using the port? Choose one with --port') from None
    return sock


def adopt(fd: int):
    """The listening socket a supervisor passed as descriptor ``fd``."""
    sock = socket.socket(fileno=fd)
    if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) != 1:
        sock.detach()
        raise OSError(f'descriptor {fd} is not a listening socket; --listen-fd is set by llmconn serve '
                      f'--workers for its workers, not by hand')
    return sock
