"""``llmconn serve``: the HTTP host of the deployed services.

    POST /<service-name>   JSON in; JSON, text or Server-Sent Events out
    GET  /health           store reachable, connections loaded, services deployed
    GET  /services         each service, its file, when deployed, its last deploy error

A gevent pywsgi server, one greenlet per request. This module is imported by
the CLI only to add its arguments, so it imports nothing heavy at the top:
gevent must monkey-patch before ``requests`` and ``redis`` are imported,
and the ``llmconn`` package has already imported them by the time a
subcommand runs. So :func:`run_serve` starts the server in a fresh
interpreter whose very first statement is the monkey-patch (``exec`` with
one worker, child processes sharing the port through ``SO_REUSEPORT`` with
several). Each worker hot-deploys on its own; they share the chat store.

The WSGI application itself lives in :mod:`llmconn.wsgi`; this module is
the process side: the listening socket, signals, graceful shutdown, workers.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time as mod_time

logger = logging.getLogger('llmconn.server')

DEFAULT_CONFIG = 'etc/llm.yaml'
DEFAULT_SERVICES = 'services'
DEFAULT_HOST = '127.0.0.1'        # never exposed beyond the machine unless asked
DEFAULT_PORT = 17010
SHUTDOWN_GRACE = 30.0             # seconds in-flight requests get to finish after SIGTERM
LISTEN_BACKLOG = 1024
DRAIN_POLL = 0.05                 # how often shutdown looks whether in-flight requests are done
RESPAWN_DELAY = 1.0               # a worker that died is restarted after this long...
STARTUP_WINDOW = 5.0              # ...unless it died this soon after starting: then it cannot start at all

# The first statement of every server process: patch before anything imports sockets.
_BOOT = ('from gevent import monkey; monkey.patch_all()\n'
         'import sys\n'
         'from llmconn.server import main\n'
         'sys.exit(main(sys.argv[1:]))\n')


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``llmconn serve``."""
    parser.add_argument('--config', default=DEFAULT_CONFIG, help=f'the YAML configuration (default {DEFAULT_CONFIG})')
    parser.add_argument('--services', default=DEFAULT_SERVICES,
                        help=f'directory of *.py services, hot-deployed (default {DEFAULT_SERVICES})')
    parser.add_argument('--host', default=DEFAULT_HOST, help=f'address to listen on (default {DEFAULT_HOST})')
    parser.add_argument('--port', type=int, default=DEFAULT_PORT, help=f'port (default {DEFAULT_PORT})')
    parser.add_argument('--workers', type=int, default=1,
                        help='processes serving the same port, sharing the chat store (default 1)')
    parser.add_argument('--grace', type=float, default=SHUTDOWN_GRACE,
                        help=f'seconds in-flight requests get to finish on SIGTERM (default {SHUTDOWN_GRACE:g})')
    parser.add_argument('--log-level', default='INFO', choices=['DEBUG', 'INFO', 'WARNING', 'ERROR'])
    parser.add_argument('--log-format', default='text', choices=['text', 'json'],
                        help='text lines, or one JSON object per line (default text); see llmconn.logs')
    parser.add_argument('--metrics', default=True, action=argparse.BooleanOptionalAction,
                        help='count and serve Prometheus metrics at GET /metrics (default on); see llmconn.metrics')
    # Internal: set on the workers of --workers N so they can share one port.
    parser.add_argument('--reuse-port', action='store_true', help=argparse.SUPPRESS)


def run_serve(args: argparse.Namespace) -> int:
    """Run the host as the flags say; returns the exit code."""
    if args.workers < 1:
        print('error: --workers must be at least 1', file=sys.stderr)
        return 2
    if args.workers > 1:
        problem = _unshareable_store(args.config)
        if problem:
            print(f'error: {problem}', file=sys.stderr)
            return 2
        return _supervise(args)
    from gevent import monkey
    if monkey.is_module_patched('socket'):
        return _serve(args)
    # Not patched yet, and requests/redis are already imported: start over in a clean interpreter.
    sys.stdout.flush()
    sys.stderr.flush()
    command = serve_command(_argv(args, reuse_port=args.reuse_port))
    os.execv(command[0], command)
    return 1    # not reached


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
    """The command line of one server process (gevent patched first), e.g. for ``subprocess``."""
    return [sys.executable, '-c', _BOOT, *argv]


def main(argv: list[str] | None = None) -> int:
    """Entry point of a server process (``python -c`` with the patch first, see ``_BOOT``)."""
    parser = argparse.ArgumentParser(prog='llmconn serve')
    add_serve_arguments(parser)
    return run_serve(parser.parse_args(argv))


def _argv(args: argparse.Namespace, reuse_port: bool) -> list[str]:
    argv = ['--config', args.config, '--services', args.services, '--host', args.host, '--port', str(args.port),
            '--grace', str(args.grace), '--log-level', args.log_level, '--log-format', args.log_format,
            '--metrics' if args.metrics else '--no-metrics']
    return argv + (['--reuse-port'] if reuse_port else [])


def _serve(args: argparse.Namespace) -> int:
    """One worker: load, deploy, listen, and stop gracefully on SIGTERM or SIGINT."""
    import gevent
    import gevent.event
    from gevent.pool import Pool
    from gevent.pywsgi import WSGIServer

    from llmconn import logs, observe
    from llmconn.deploy import Host
    from llmconn.errors import ConfigError
    from llmconn.wsgi import App

    logs.configure(args.log_format, args.log_level)
    observe.install_server(metrics=args.metrics, shared=args.reuse_port)
    try:
        host = Host.from_paths(args.config, args.services)
        listener = listen(args.host, args.port, reuse_port=args.reuse_port)
    except (ConfigError, OSError) as e:
        print(f'error: {e}', file=sys.stderr)
        return 1
    logs.hide_secrets(host.registry)
    host.start()
    app = App(host)
    server = WSGIServer(listener, app, spawn=Pool(), log=None, error_log=logger)
    stopped = gevent.event.Event()

    def stop(signum: int) -> None:
        if app.draining:
            return
        logger.info('Got signal %d: no new connections; in-flight requests get %gs to finish', signum, args.grace)
        app.draining = True
        server.close()
        gevent.spawn(_drain, app, server.pool, args.grace).link(lambda _: stopped.set())

    gevent.signal_handler(signal.SIGTERM, stop, signal.SIGTERM)
    gevent.signal_handler(signal.SIGINT, stop, signal.SIGINT)
    server.start()
    logger.info('Serving %d service(s) from %s on http://%s:%d (config %s)', len(host.deployer.services),
                host.deployer.dir, args.host, args.port, args.config)
    try:
        stopped.wait()
    finally:
        host.close()        # after the requests: their chat locks are released by now
    logger.info('Stopped')
    return 0


def _drain(app, pool, grace: float) -> None:
    """Wait for responses in progress; then close idle keep-alive connections (and any straggler)."""
    import gevent

    deadline = mod_time.monotonic() + grace
    while app.active > 0 and mod_time.monotonic() < deadline:
        gevent.sleep(DRAIN_POLL)
    if app.active > 0:
        logger.warning('%d request(s) still running after %gs; stopping them', app.active, grace)
    pool.kill(timeout=1)


def listen(host: str, port: int, reuse_port: bool = False):
    """The listening socket: TCP_NODELAY (else ~40 ms per keep-alive response), SO_REUSEPORT for workers."""
    from gevent import socket

    family = socket.AF_INET6 if ':' in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        # Accepted sockets inherit it from the listener on Linux and the BSDs.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
    except OSError as e:
        sock.close()
        raise OSError(e.errno, f'cannot listen on {host}:{port} ({e.strerror}); '
                               f'is another server using the port? Choose one with --port') from None
    return sock


def _supervise(args: argparse.Namespace) -> int:
    """N worker processes on one port; SIGTERM/SIGINT are passed on, a dead worker is restarted."""
    from llmconn import logs
    logs.configure(args.log_format, args.log_level)
    argv = serve_command(_argv(args, reuse_port=True))
    shared = _metrics_dir(args)
    env = shared.env() if shared else None
    workers = [(subprocess.Popen(argv, env=env), mod_time.monotonic()) for _ in range(args.workers)]
    stopping = False

    def stop_all(signum=None, frame=None) -> None:
        nonlocal stopping
        stopping = True
        for proc, _ in workers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop_all)
    signal.signal(signal.SIGINT, stop_all)
    failed = 0
    while not stopping or any(p.poll() is None for p, _ in workers):
        mod_time.sleep(0.2)
        for index, (proc, started) in enumerate(workers):
            if proc.poll() is None or stopping:
                continue
            if mod_time.monotonic() - started < STARTUP_WINDOW:
                logger.error('worker %d could not start (exit code %s)', proc.pid, proc.returncode)
                failed = proc.returncode or 1
                stop_all()
                break
            logger.warning('worker %d exited with %s; restarting it', proc.pid, proc.returncode)
            if shared:
                shared.worker_exited(proc.pid)
            mod_time.sleep(RESPAWN_DELAY)
            workers[index] = (subprocess.Popen(argv, env=env), mod_time.monotonic())
    if shared:
        shared.remove()
    return failed


def _metrics_dir(args: argparse.Namespace):
    """The workers' shared metrics directory (see llmconn.metrics), or None with --no-metrics."""
    if not args.metrics:
        return None
    from llmconn.metrics import MultiprocessDir
    return MultiprocessDir()
