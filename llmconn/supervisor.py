"""The supervisor of ``llmconn serve --workers N``: N worker processes, restarted when they die.

It is never gevent-patched and imports nothing of the host: it only starts
processes, passes SIGTERM/SIGINT on to them and watches them. A worker
killed by a signal (the OOM killer, ``kill -9``) or exiting on its own is
restarted after :data:`RESPAWN_DELAY`, doubled while it keeps dying soon
after starting; the others keep serving meanwhile. A worker that exits with
an error within :data:`STARTUP_WINDOW` of starting (a bad configuration, a
port in use) would fail again on every restart, so the supervisor stops
all workers and exits with its code.

The workers accept from one listening socket the caller bound and passes
in as ``listener`` (see :mod:`llmconn.listener`): it stays open here while
workers come and go, so connections queued when one dies wait for the
others instead of being reset with the dead one's socket. On SIGTERM the
supervisor closes its copy as the workers close theirs, so new clients are
refused at once while the workers finish what they have, rather than
queued on a socket nobody accepts from.
"""

from __future__ import annotations

import logging
import signal
import socket
import subprocess
import time as mod_time
from typing import Callable

logger = logging.getLogger('llmconn.server')

SUPERVISE_POLL = 0.2              # how often the supervisor looks at its workers
RESPAWN_DELAY = 1.0               # a worker that died is restarted after this long, doubled while it
RESPAWN_DELAY_MAX = 30.0          # keeps dying soon after starting, up to this
STARTUP_WINDOW = 5.0              # a worker exiting with an error this soon after starting cannot start


def supervise(command: list[str], count: int, env: dict | None = None,
              on_exit: Callable[[int], None] | None = None, listener: socket.socket | None = None) -> int:
    """Run ``count`` workers of ``command`` until SIGTERM/SIGINT, which they are sent; the exit code.

    ``env``: the workers' environment; ``on_exit(pid)``: told of each worker that died (the metrics);
    ``listener``: the listening socket every worker inherits, closed here on SIGTERM.
    """
    pass_fds = (listener.fileno(),) if listener is not None else ()
    workers = [_Worker(command, env, on_exit, pass_fds) for _ in range(count)]
    stopping = False

    def stop_all(signum=None, frame=None) -> None:
        nonlocal stopping
        stopping = True
        if listener is not None:
            listener.close()
        for worker in workers:
            worker.terminate()

    signal.signal(signal.SIGTERM, stop_all)
    signal.signal(signal.SIGINT, stop_all)
    failed = 0
    while not stopping or any(w.running for w in workers):
        mod_time.sleep(SUPERVISE_POLL)
        for worker in workers if not stopping else ():
            if worker.cannot_start():
                logger.error('worker %d could not start (exit code %s)', worker.proc.pid, worker.proc.returncode)
                failed = worker.proc.returncode or 1
                stop_all()
                break
            worker.restart_if_dead()
    return failed


class _Worker:
    """One worker process of the supervisor, restarted when it dies (later and later while it keeps dying)."""

    def __init__(self, command: list[str], env: dict | None = None,
                 on_exit: Callable[[int], None] | None = None, pass_fds: tuple[int, ...] = ()) -> None:
        self.command = command
        self.env = env
        self.pass_fds = pass_fds
        self.on_exit = on_exit
        self.delay = RESPAWN_DELAY / 2     # doubled on the first quick death
        self.respawn_at = 0.0
        self._start()

    def _start(self) -> None:
        self.proc = subprocess.Popen(self.command, env=self.env, pass_fds=self.pass_fds)
        self.started = mod_time.monotonic()

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def terminate(self) -> None:
        if self.running:
            self.proc.send_signal(signal.SIGTERM)

    def cannot_start(self) -> bool:
        # An error exit right after starting (bad config, port taken) repeats on every restart: give up.
        # A worker killed by a signal (OOM killer, kill -9) is restarted instead.
        code = self.proc.poll()
        return code is not None and code > 0 and mod_time.monotonic() - self.started < STARTUP_WINDOW

    def restart_if_dead(self) -> None:
        if self.running:
            return
        now = mod_time.monotonic()
        if not self.respawn_at:
            quick = now - self.started < STARTUP_WINDOW
            self.delay = min(self.delay * 2, RESPAWN_DELAY_MAX) if quick else RESPAWN_DELAY
            self.respawn_at = now + self.delay
            logger.warning('worker %d exited with %s; restarting it in %gs', self.proc.pid, self.proc.returncode,
                           self.delay)
            if self.on_exit is not None:
                self.on_exit(self.proc.pid)
        elif now >= self.respawn_at:
            self.respawn_at = 0.0
            self._start()
