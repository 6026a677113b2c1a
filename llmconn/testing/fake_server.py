"""A fake LLM provider speaking the real wire formats, for tests and benchmarks.

One gevent pywsgi server answers as Claude Messages (``POST /v1/messages``),
OpenAI Chat Completions (``POST /v1/chat/completions``), OpenAI Responses
(``POST /v1/responses``) and Gemini (``POST /v1beta/models/{model}:generateContent``
and ``:streamGenerateContent?alt=sse``), plus ``GET /v1/models`` and
``GET /v1beta/models``. Replies are deterministic (see
:mod:`llmconn.testing.fake_common`), and a control API under ``/_fake/``
records requests and injects faults and latency.

Tests run in plain threads, so the server never relies on monkey-patching:
in-process it runs its own gevent hub in a dedicated OS thread (hubs are per
thread), and :meth:`FakeProviderServer.spawn` runs it in a subprocess that
several test processes can share. Either way each request sleeps its
latency in its own greenlet, so concurrent requests overlap.

Control API (what the in-process methods do, for other processes)::

    GET    /_fake/requests      recorded requests, oldest first
    DELETE /_fake/requests      forget them (and the replay violations)
    GET    /_fake/violations    requests refused for breaking a replay rule (see fake_tools)
    POST   /_fake/faults        {"status": 429, "count": 1, "headers": {...}, "body": {...}}
                                {"hang": 2.0} | {"garbage": true} | {"stream_break": true} | {"stream_error": true}
    DELETE /_fake/faults        drop queued faults
    POST   /_fake/latency       {"seconds": 0.05}
    GET    /_fake/health        {"ok": true}
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
from typing import Any

import gevent
import gevent.event
from gevent.pywsgi import WSGIServer

from llmconn.listener import bind
from llmconn.testing.fake_app import STREAM_FAULTS, FakeApp, FakeState
from llmconn.testing.fake_control import FakeProviderProcess

DEFAULT_HOST = '127.0.0.1'
# How long start() waits for the server thread, and stop() for it to finish.
START_TIMEOUT = 10.0
STOP_TIMEOUT = 10.0
# Open keep-alive connections would hold stop() for gevent's whole default second.
STOP_GRACE = 0.1
API_KEY_ENV = 'LLMCONN_FAKE_API_KEY'
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def listening_socket(host: str, port: int) -> socket.socket:
    """The host's own listening socket (TCP_NODELAY: see :mod:`llmconn.listener`), non-blocking.

    gevent accepts in a loop once the socket is readable; blocking, the last accept would hang the hub.
    """
    sock = bind(host, port)
    sock.setblocking(False)
    return sock


class FakeProviderServer:
    """The fake provider in this process; a context manager.

    ``requests`` lists the recorded provider requests (dicts with ``method``,
    ``path``, ``headers`` (lowercase keys), ``body``, ``query``, ``time``).
    """

    def __init__(self, host: str = DEFAULT_HOST, port: int = 0, latency: float = 0.0,
                 api_key: str | None = None) -> None:
        self.host = host
        self.port = port
        self.state = FakeState(latency, api_key)
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._wakeup: Any = None
        self._startup_error: BaseException | None = None

    def __repr__(self) -> str:
        return f'<FakeProviderServer {self.url} running={self.running}>'

    @property
    def url(self) -> str:
        host = f'[{self.host}]' if ':' in self.host else self.host
        return f'http://{host}:{self.port}'

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # Lifecycle

    def start(self) -> 'FakeProviderServer':
        """Listen and serve in a background thread; returns once connections are accepted."""
        if self._thread is not None:
            return self
        sock = listening_socket(self.host, self.port)
        self.port = sock.getsockname()[1]
        self._ready.clear()
        self._thread = threading.Thread(target=self._serve, args=(sock,), daemon=True,
                                        name=f'fake-provider-{self.port}')
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT) or self._startup_error is not None:
            self._thread = None
            sock.close()
            raise RuntimeError(f'fake provider on {self.url} did not start: {self._startup_error!r}')
        return self

    def stop(self) -> None:
        """Stop serving, drop open connections and wait for the server thread to end."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._wakeup.send()   # the one thread-safe way into another thread's hub
        thread.join(STOP_TIMEOUT)

    def wait(self, timeout: float | None = None) -> None:
        """Block until the server stops (or ``timeout`` passes)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _serve(self, sock: socket.socket) -> None:
        hub = gevent.get_hub()
        stopped = gevent.event.Event()
        wakeup = hub.loop.async_()
        wakeup.start(stopped.set)
        try:
            # Built here: a server binds to the hub of the thread that creates it.
            server = WSGIServer(sock, FakeApp(self.state), log=None)
            server.start()
        except BaseException as exc:
            self._startup_error = exc
            self._ready.set()
            return
        self._wakeup = wakeup
        self._ready.set()
        try:
            stopped.wait()
        finally:
            server.stop(timeout=STOP_GRACE)
            wakeup.stop()
            if not _green_threads():
                hub.destroy(destroy_loop=True)

    def __enter__(self) -> 'FakeProviderServer':
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # Recording

    @property
    def requests(self) -> list[dict]:
        return self.state.snapshot()

    @property
    def violations(self) -> list[dict]:
        """Requests refused for breaking a provider's replay rules (cleared with the requests)."""
        with self.state.lock:
            return list(self.state.violations)

    def clear(self) -> None:
        """Forget the recorded requests and violations."""
        self.state.clear()

    # Faults and latency

    @property
    def latency(self) -> float:
        return self.state.latency

    @latency.setter
    def latency(self, seconds: float) -> None:
        self.state.latency = float(seconds)

    def fail(self, status: int, count: int = 1, body: Any = None, headers: dict | None = None) -> None:
        """Answer the next ``count`` requests with ``status`` (body in the provider's error shape by default)."""
        self.state.add_fault({'status': int(status), 'body': body, 'headers': headers}, count)

    def hang(self, seconds: float, count: int = 1) -> None:
        """Sleep ``seconds`` before answering the next ``count`` requests."""
        self.state.add_fault({'hang': float(seconds)}, count)

    def garbage(self, count: int = 1) -> None:
        """Answer the next ``count`` requests with a 200 whose body is not JSON."""
        self.state.add_fault({'garbage': True}, count)

    def fail_stream(self, kind: str, count: int = 1) -> None:
        """Break the next ``count`` streams after their first delta: ``break`` or ``error``."""
        kind = kind.replace('stream_', '')
        if kind not in STREAM_FAULTS:
            raise ValueError(f'stream fault must be one of {STREAM_FAULTS}, got {kind!r}')
        self.state.add_fault({'stream': kind}, count)

    def clear_faults(self) -> None:
        self.state.clear_faults()

    @classmethod
    def spawn(cls, port: int = 0, latency: float = 0.0, host: str = DEFAULT_HOST,
              api_key: str | None = None) -> FakeProviderProcess:
        """Run a fake provider in a subprocess; stop it with ``.stop()`` (or use ``with``)."""
        env = dict(os.environ)
        env.pop(API_KEY_ENV, None)
        if api_key is not None:
            env[API_KEY_ENV] = api_key   # not argv: other processes can read a command line
        # The child imports this very llmconn, wherever the test runs from.
        env['PYTHONPATH'] = os.pathsep.join(filter(None, [_PACKAGE_ROOT, env.get('PYTHONPATH')]))
        argv = [sys.executable, '-m', 'llmconn.testing.fake_server', '--host', host,
                '--port', str(port), '--latency', str(latency)]
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, env=env, text=True)
        return FakeProviderProcess.from_process(process)


def _green_threads() -> bool:
    """True when threads are greenlets sharing the main hub, which must then survive."""
    from gevent import monkey
    return monkey.is_module_patched('threading')


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog='llmconn fake-provider',
                                     description='Run a fake LLM provider speaking the real wire formats.')
    parser.add_argument('--host', default=DEFAULT_HOST)
    parser.add_argument('--port', type=int, default=0, help='0 picks a free port (printed at start)')
    parser.add_argument('--latency', type=float, default=0.0, help='seconds added to every request')
    parser.add_argument('--api-key', default=None,
                        help=f'accept only this key (default: ${API_KEY_ENV}, else any key)')
    return parser


def main(argv: list[str] | None = None) -> int:
    """Serve until interrupted; the first line printed is ``fake provider listening on <url>``."""
    args = _parser().parse_args(argv)
    api_key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV)
    try:
        server = FakeProviderServer(args.host, args.port, args.latency, api_key=api_key).start()
    except OSError as e:        # the port is taken: the message says which and what to do
        print(f'error: {e.strerror or e}', file=sys.stderr)
        return 1
    print(f'fake provider listening on {server.url}', flush=True)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while server.running:
            server.wait(1.0)
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        server.stop()
    return 0


if __name__ == '__main__':
    sys.exit(main())
