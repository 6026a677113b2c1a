"""``llmconn serve``: the HTTP host of the deployed services.

    POST /<service-name>   JSON in; JSON, text or Server-Sent Events out
    GET  /health           liveness, no API key: the process serves and its configuration loaded
    GET  /ready            200 when the configuration is loaded and the chat store answers, else 503
    GET  /services         each service, its file, when deployed, its last deploy error

A gevent pywsgi server, one greenlet per request. gevent must monkey-patch
before ``requests`` and ``redis`` are imported; ``import llmconn`` imports
neither (its names load lazily), and this module imports nothing heavy at
the top, so :func:`run_serve` patches in the process it runs in, before the
first import of either. With ``--workers N`` a supervisor (never patched:
it only starts and watches processes) binds the port once and runs N
``llmconn serve`` processes accepting from that one socket (see
:mod:`llmconn.listener`); their command line is derived from the parsed
flags (:func:`worker_argv`). Each worker hot-deploys on its
own; they share the chat store. A worker that dies is restarted; one that
cannot start stops the supervisor.

The WSGI application itself lives in :mod:`llmconn.wsgi`, the client
connection limits in :mod:`llmconn.server_limits`; this module is the
process side: the listening socket, signals, graceful shutdown, workers.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time as mod_time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmconn.observe import Observer

# Every other llmconn module is imported inside the functions below, after gevent patched this
# process (patch_gevent): they import requests, urllib3 and redis, which must see the patched socket.

logger = logging.getLogger('llmconn.server')

DEFAULT_CONFIG = 'etc/llm.yaml'
DEFAULT_SERVICES = 'services'
DEFAULT_HOST = '127.0.0.1'        # never exposed beyond the machine unless asked
DEFAULT_PORT = 17010
SHUTDOWN_GRACE = 30.0             # seconds in-flight requests get to finish after SIGTERM
DRAIN_POLL = 0.05                 # how often shutdown looks whether in-flight requests are done
DEFAULT_IDLE_TIMEOUT = 30.0       # seconds a client connection may idle (SPEC §14)
DEFAULT_MAX_CONNECTIONS = 1000    # open client connections per worker, unless the fd limit is lower
# Modules that must not be imported before gevent patches (they keep unpatched sockets or locks).
_PATCH_SENSITIVE = ('requests', 'urllib3', 'redis')


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``llmconn serve``."""
    parser.add_argument('--config', default=DEFAULT_CONFIG, help=f'the YAML configuration (default {DEFAULT_CONFIG})')
    # None: not given, so a missing ./services is a warning (a gateway-only host); a given one must exist.
    parser.add_argument('--services', default=None,
                        help=f'directory of *.py services, hot-deployed (default {DEFAULT_SERVICES})')
    parser.add_argument('--host', default=DEFAULT_HOST, help=f'address to listen on (default {DEFAULT_HOST})')
    parser.add_argument('--port', type=int, default=DEFAULT_PORT, help=f'port (default {DEFAULT_PORT})')
    parser.add_argument('--workers', type=int, default=1,
                        help='processes serving the same port, sharing the chat store (default 1)')
    parser.add_argument('--grace', type=float, default=SHUTDOWN_GRACE,
                        help=f'seconds in-flight requests get to finish on SIGTERM (default {SHUTDOWN_GRACE:g})')
    parser.add_argument('--idle-timeout', type=float, default=DEFAULT_IDLE_TIMEOUT,
                        help='seconds a client connection may stay idle, take to send a request head or body, '
                             f'or take to accept each part of a response (default {DEFAULT_IDLE_TIMEOUT:g})')
    parser.add_argument('--max-connections', type=int, default=0,
                        help=f'open client connections per worker; at the limit the longest-idle one is closed '
                             f'(default {DEFAULT_MAX_CONNECTIONS}, fewer if the descriptor limit is lower)')
    parser.add_argument('--log-level', default='INFO', choices=['DEBUG', 'INFO', 'WARNING', 'ERROR'],
                        help='server log level (default INFO)')
    parser.add_argument('--log-format', default='text', choices=['text', 'json'],
                        help='text lines, or one JSON object per line (default text); see llmconn.logs')
    parser.add_argument('--metrics', default=True, action=argparse.BooleanOptionalAction,
                        help='count and serve Prometheus metrics at GET /metrics (default on); see llmconn.metrics')
    # Internal: the descriptor of a socket already bound, set on the workers of --workers N by their
    # supervisor, and by the demo (python -m llmconn.demo), which binds its port before starting the server.
    parser.add_argument('--listen-fd', type=int, default=None, help=argparse.SUPPRESS)


def serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog='llmconn serve')
    add_serve_arguments(parser)
    return parser


def run_serve(args: argparse.Namespace) -> int:
    """Run the host as the flags say; returns the exit code."""
    problem = _bad_flags(args)
    if problem:
        print(f'error: {problem}', file=sys.stderr)
        return 2
    if args.workers > 1:
        return _supervise(args)
    problem = patch_gevent()
    if problem:
        print(f'error: {problem}', file=sys.stderr)
        return 2
    return _serve(args)


def _bad_flags(args: argparse.Namespace) -> str:
    if args.workers < 1:
        return '--workers must be at least 1'
    if not 0 <= args.port <= 65535:
        return f'--port must be from 1 to 65535 (0: any free port), not {args.port}'
    if args.grace < 0:
        return '--grace must be 0 seconds or more'
    if args.idle_timeout <= 0:
        return '--idle-timeout must be more than 0 seconds'
    if args.max_connections < 0:
        return '--max-connections must be at least 1 (or 0 for the default)'
    if args.services is not None and not Path(args.services).is_dir():
        state = 'is not a directory' if Path(args.services).exists() else 'does not exist'
        return (f'--services {args.services} {state}; create it, or point --services at the directory that '
                f'holds your *.py services')
    if args.workers > 1:
        return _unshareable_store(args.config)
    return ''


def patch_gevent() -> str:
    """Monkey-patch this process for gevent; '' once done, else why it cannot be done safely."""
    from gevent import monkey
    if monkey.is_module_patched('socket'):
        return ''
    early = [name for name in _PATCH_SENSITIVE if name in sys.modules]
    if early:
        return (f'llmconn serve must patch gevent before {", ".join(early)} is imported, but this process '
                f'imported it already; start the server as its own process (llmconn serve, or '
                f'python -m llmconn serve)')
    monkey.patch_all()
    return ''


def _unshareable_store(config_path: str) -> str:
    """Why the configuration cannot serve several workers, or '' when it can."""
    from llmconn import config as mod_config
    from llmconn.errors import ConfigError
    try:
        conf = mod_config.load_file(config_path)
    except ConfigError as e:
        return str(e)
    if conf.redis.url.startswith('memory://'):
        return (f'--workers needs a chat store the workers share, but {config_path} uses memory:// (chats '
                f'inside one process, so each worker would have its own); set redis.url to a Redis, e.g. '
                f'REDIS_URL=redis://127.0.0.1:6379/0, or run one worker')
    return ''


def serve_command(argv: list[str]) -> list[str]:
    """The command line of one server process, e.g. for ``subprocess``."""
    return [sys.executable, '-m', 'llmconn', 'serve', *argv]


def main(argv: list[str] | None = None) -> int:
    """Entry point of a server process, as ``llmconn serve`` (patches gevent first)."""
    return run_serve(serve_parser().parse_args(argv))


def worker_argv(args: argparse.Namespace, listen_fd: int) -> list[str]:
    """The flags of one worker of ``--workers N`` accepting on descriptor ``listen_fd``: every flag given."""
    argv = []
    for action in serve_parser()._actions:
        if not action.option_strings or action.dest in ('help', 'workers', 'listen_fd'):
            continue
        value = getattr(args, action.dest, action.default)
        if value == action.default:
            continue
        argv += _flag(action, value)
    return argv + ['--listen-fd', str(listen_fd)]


def _flag(action: argparse.Action, value) -> list[str]:
    """The command-line words that give ``action`` the value ``value``."""
    longest = max(action.option_strings, key=len)
    if isinstance(action, argparse.BooleanOptionalAction):      # --metrics / --no-metrics
        return [min(action.option_strings, key=len) if value else longest]
    if isinstance(value, bool):                                 # store_true
        return [longest]
    return [longest, str(value)]


def _serve(args: argparse.Namespace) -> int:
    """One worker: load, deploy, listen, and stop gracefully on SIGTERM or SIGINT."""
    import gevent
    import gevent.event
    from gevent.pool import Pool
    from gevent.pywsgi import WSGIServer

    from llmconn import listener as mod_listener, logs, observe
    from llmconn.host import Host
    from llmconn.errors import ConfigError
    from llmconn.server_limits import Limits, default_max_connections, handler_class
    from llmconn.wsgi import App

    # Replaces what the CLI configured for its own use before the flags of serve were known.
    logs.configure(args.log_format, args.log_level)
    worker = args.listen_fd is not None
    observer = install_observer(metrics=args.metrics, shared=worker)
    services = args.services or DEFAULT_SERVICES
    if not Path(services).is_dir():
        logger.warning('No services directory %s: serving no services until it is created (give one with '
                       '--services)', Path(services).resolve())
    try:
        host = Host.from_paths(args.config, services)
        listener = mod_listener.adopt(args.listen_fd) if worker else listen(args.host, args.port)
    except (ConfigError, OSError) as e:
        print(f'error: {e}', file=sys.stderr)
        return 1
    logs.hide_secrets(host.registry)
    host.start()
    app = App(host)
    limits = Limits(args.idle_timeout, args.max_connections or default_max_connections(DEFAULT_MAX_CONNECTIONS))
    server = WSGIServer(listener, app, spawn=Pool(), log=None, error_log=logger, handler_class=handler_class(limits))
    stopped = gevent.event.Event()
    listening = gevent.event.Event()

    def stop(signum: int) -> None:
        if app.draining:
            return
        logger.info('Got signal %d: no new connections; in-flight requests get %gs to finish', signum, args.grace)
        app.draining = True
        if listening.is_set():
            close_and_drain()

    def close_and_drain() -> None:
        server.close()
        limits.close_idle()
        gevent.spawn(_drain, app, server.pool, args.grace).link(lambda _: stopped.set())

    gevent.signal_handler(signal.SIGTERM, stop, signal.SIGTERM)
    gevent.signal_handler(signal.SIGINT, stop, signal.SIGINT)
    # start() can yield to the hub (pywsgi looks the server's name up), so a signal may be handled
    # inside it: closing a server half started would break it, so that signal closes it right after.
    server.start()
    listening.set()
    logger.info('Serving %d service(s) from %s on http://%s:%d (config %s, at most %d connections)',
                len(host.deployer.services), host.deployer.dir, args.host, listener.getsockname()[1], args.config,
                limits.max_connections)
    if app.draining:
        close_and_drain()
    try:
        stopped.wait()
    finally:
        host.close()        # after the requests: their chat locks are released by now
        observer.close()    # and their counts are written
    logger.info('Stopped')
    return 0


def install_observer(metrics: bool, shared: bool) -> 'Observer':
    """The observer of one ``llmconn serve`` process: the metrics, or (off) one that only tallies requests.

    ``shared``: a worker of ``--workers N``, whose metrics go to the directory
    its supervisor named in PROMETHEUS_MULTIPROC_DIR. A lone server keeps
    them in memory, whatever that variable says (it is removed first, since
    ``prometheus_client`` reads it on import). Here, not in :mod:`llmconn.observe`, which
    :mod:`llmconn.metrics` builds on.
    """
    from llmconn import observe
    observer = observe.Observer()
    if metrics:
        if not shared:
            os.environ.pop('PROMETHEUS_MULTIPROC_DIR', None)
        from llmconn.metrics import MULTIPROC_ENV, Metrics
        observer = Metrics(os.environ.get(MULTIPROC_ENV, '') if shared else '')
    observe.install(observer)
    return observer


def _drain(app, pool, grace: float) -> None:
    """Wait for responses in progress; then close idle keep-alive connections (and any straggler)."""
    import gevent

    deadline = mod_time.monotonic() + grace
    while app.active > 0 and mod_time.monotonic() < deadline:
        gevent.sleep(DRAIN_POLL)
    if app.active > 0:
        logger.warning('%d request(s) still running after %gs; stopping them', app.active, grace)
    pool.kill(timeout=1)


def listen(host: str, port: int):
    """The listening socket of a lone server (see llmconn.listener)."""
    from llmconn import listener
    return listener.bind(host, port)


def _supervise(args: argparse.Namespace) -> int:
    from llmconn import logs
    from llmconn.supervisor import supervise
    logs.configure(args.log_format, args.log_level)
    from llmconn.listener import bind
    try:
        sock = bind(args.host, args.port)
    except OSError as e:
        print(f'error: {e}', file=sys.stderr)
        return 1
    shared = _metrics_dir(args)
    try:
        return supervise(serve_command(worker_argv(args, sock.fileno())), args.workers,
                         env=shared.env() if shared else None, on_exit=shared.worker_exited if shared else None,
                         listener=sock)
    finally:
        sock.close()
        if shared:
            shared.remove()


def _metrics_dir(args: argparse.Namespace):
    """The workers' shared metrics directory (see llmconn.metrics), or None with --no-metrics."""
    if not args.metrics:
        return None
    from llmconn.metrics import MultiprocessDir
    return MultiprocessDir()
