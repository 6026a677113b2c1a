"""``python -m llmconn.demo`` (what ``make run`` runs): the host on embedded defaults.

Starts the fake provider and ``llmconn serve`` with ``etc/embedded.yaml``
(``memory://`` store) and the demo services, prints a copy-paste ``curl``
conversation, and waits; Ctrl-C stops both. Needs no Redis, no API key and
no network. Two environment variables switch to the real thing:
``REDIS_URL`` (a shared Redis) and ``ANTHROPIC_API_KEY`` (the real Claude
API instead of the fake provider).

The helpers that start a server or the fake provider as a subprocess and
wait for it are used by the tests as well.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time as mod_time
import urllib.error
import urllib.request

from llmconn import listener as mod_listener
from llmconn.redact import mask_url
from llmconn.server import DEFAULT_PORT, serve_command
from llmconn.testing.fake_control import READY_PREFIX as FAKE_READY_PREFIX

DEFAULT_PROVIDER_PORT = 17011
REAL_PROVIDER_ADDRESS = 'https://api.anthropic.com'
STARTUP_TIMEOUT = 60.0      # seconds a process gets to start answering HTTP (a loaded machine needs them)
STOP_TIMEOUT = 10.0         # seconds a process gets to exit after SIGTERM before it is killed


def start_fake_provider(port: int, host: str = '127.0.0.1', latency: float = 0.0,
                        env: dict | None = None) -> subprocess.Popen:
    """The fake provider as a subprocess; returns once it said it listens on ``port`` (its first line).

    Its own line, not an answer on the port: another server already there would answer too.
    """
    command = [sys.executable, '-m', 'llmconn', 'fake-provider', '--host', host, '--port', str(port),
               '--latency', str(latency)]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], STARTUP_TIMEOUT)
        line = proc.stdout.readline() if ready else ''
        if not line.startswith(FAKE_READY_PREFIX):
            if ready:
                proc.wait(STOP_TIMEOUT)     # it ended its output: it said why on stderr, and exits
            raise RuntimeError(f'the fake provider did not start on {host}:{port}'
                               + (f' (exit code {proc.returncode})' if proc.returncode is not None else ''))
    except BaseException:
        stop(proc)
        raise
    return proc


def start_server(config: str, services: str, port: int, host: str = '127.0.0.1', env: dict | None = None,
                 extra: list | tuple = (), wait: bool = True, listener: socket.socket | None = None,
                 **popen) -> subprocess.Popen:
    """One ``llmconn serve`` process; returns once it answers ``GET /health`` (any status).

    ``listener``: a socket already listening on ``host:port`` that the server accepts on (passed as
    ``--listen-fd``), so whatever answers the port is this process, never another server.
    """
    argv = ['--config', str(config), '--services', str(services), '--host', host, '--port', str(port), *extra]
    if listener is not None:
        argv += ['--listen-fd', str(listener.fileno())]
        popen['pass_fds'] = (*popen.get('pass_fds', ()), listener.fileno())
    proc = subprocess.Popen(serve_command(argv), env=env, **popen)
    if wait:
        _wait_or_stop(f'http://{_probe_host(host)}:{port}/health', proc)
    return proc


def _probe_host(host: str) -> str:
    """Where to reach a server listening on ``host`` from this machine, as a URL host."""
    host = {'0.0.0.0': '127.0.0.1', '::': '::1'}.get(host, host)
    return f'[{host}]' if ':' in host else host


def _wait_or_stop(url: str, proc: subprocess.Popen) -> None:
    # Interrupted or failed while waiting: the caller never gets the process, so stop it here.
    try:
        wait_until_up(url, proc)
    except BaseException:
        stop(proc)
        raise


def wait_until_up(url: str, proc: subprocess.Popen | None = None, timeout: float = STARTUP_TIMEOUT) -> None:
    """Poll ``url`` until it answers HTTP at all; fail early if ``proc`` exited."""
    deadline = mod_time.monotonic() + timeout
    while mod_time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f'{proc.args[0]} exited with {proc.returncode} before answering {url}')
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except urllib.error.HTTPError:
            return          # it answers; the status is the caller's business
        except OSError:
            mod_time.sleep(0.05)
    raise RuntimeError(f'nothing answered {url} within {timeout:g}s')


def stop(proc: subprocess.Popen | None) -> None:
    """SIGTERM, a graceful wait, then SIGKILL."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# The demo conversation; README.md shows exactly these commands (tests/test_server.py checks it).
DEMO_CALLS = (
    ('-s', 'demo.llm.support-chat', {'user_id': 'ann', 'text': 'My name is Ann'}),
    ('-s', 'demo.llm.support-chat', {'user_id': 'ann', 'text': 'What is my name?', 'skill': 'support-agent'}),
    ('-sN', 'demo.llm.support-chat-stream', {'user_id': 'ann', 'text': 'And again?'}),
)


def curl_commands(port: int = DEFAULT_PORT, host: str = '127.0.0.1', api_key: str = '') -> list[str]:
    """The copy-paste ``curl`` commands of the demo: two chat turns, a stream, the two GET routes."""
    base = f'{_display_host(host)}:{port}'
    auth = f" -H 'X-API-Key: {api_key}'" if api_key else ''
    calls = [f"curl {flags} {base}/{service}{auth} -d '{json.dumps(body)}'" for flags, service, body in DEMO_CALLS]
    return calls + [f'curl -s {base}/services{auth}', f'curl -s {base}/health']


def _display_host(host: str) -> str:
    # A server on every interface (or loopback) is reached as localhost from the same machine.
    return 'localhost' if host in ('0.0.0.0', '::', '127.0.0.1', '::1', 'localhost') else host


DEMO_GATEWAY_KEY = 'sk-llmconn-demo'        # etc/embedded.yaml's gateway key unless LLMCONN_GATEWAY_KEY is set


def conversation(port: int = DEFAULT_PORT, host: str = '127.0.0.1', api_key: str = '',
                 gateway_key: str = '') -> str:
    """What the demo prints: the commands, with a word on what each shows, and where the rest is."""
    chat1, chat2, stream, services, health = curl_commands(port, host, api_key)
    return '\n'.join([
        'Talk to it (the second answer shows the bot received the first turn and the skill):',
        '',
        f'  {chat1}',
        f'  {chat2}',
        '',
        'Streamed as Server-Sent Events:',
        '',
        f'  {stream}',
        '',
        f'What is deployed: {services}    Alive: {health}',
        'Edit or add a file in services/ and it is redeployed within a second.',
        '',
        *endpoints(port, host, api_key, gateway_key),
    ])


def endpoints(port: int = DEFAULT_PORT, host: str = '127.0.0.1', api_key: str = '', gateway_key: str = '') -> list:
    """The demo's other doors: the OpenAI-compatible gateway, the admin page, the metrics."""
    base = f'http://{_display_host(host)}:{port}'
    # A key the user chose is a secret: named, never printed. The demo's own default is public.
    key = 'the key in LLMCONN_GATEWAY_KEY' if gateway_key else f'api_key={DEMO_GATEWAY_KEY!r}'
    admin = 'log in with the key in LLMCONN_API_KEY' if api_key else 'set LLMCONN_API_KEY to open it'
    metrics = 'with the key in LLMCONN_API_KEY' if api_key else 'Prometheus text'
    return [f'OpenAI-compatible gateway: {base}/v1 ({key}; the openai SDK works, see README.md)',
            f'Admin page:                {base}/admin ({admin})',
            f'Metrics:                   {base}/metrics ({metrics})']


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    env = dict(os.environ)
    env.pop('PROMETHEUS_MULTIPROC_DIR', None)    # one server process: its metrics stay in memory
    # SIGTERM (from make or a supervisor) cleans up as Ctrl-C does.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)     # even when started in the background, where it is ignored
    provider = server = None
    try:
        # The host's port is bound here and handed to the server, so what answers it is that server.
        with _listen(args.host, args.port, 'PORT') as listener:
            provider = _provider(args, env)
            server = start_server(args.config, args.services, args.port, host=args.host, env=env,
                                  listener=listener)
        _banner(args, env)
        while server.poll() is None and (provider is None or provider.poll() is None):
            mod_time.sleep(0.5)
        print('A process exited; stopping.', file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    except RuntimeError as e:
        print(f'error: {e}', file=sys.stderr)
        return 1
    finally:
        stop(server)
        stop(provider)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog='python -m llmconn.demo', description=__doc__.split('\n')[0])
    parser.add_argument('--config', default='etc/embedded.yaml', help='the configuration (default etc/embedded.yaml)')
    parser.add_argument('--services', default='services', help='the services directory (default services)')
    parser.add_argument('--host', default='127.0.0.1', help='address the host listens on (default 127.0.0.1)')
    parser.add_argument('--port', type=int, default=DEFAULT_PORT, help=f'port of the host (default {DEFAULT_PORT})')
    parser.add_argument('--provider-port', type=int, default=DEFAULT_PROVIDER_PORT,
                        help=f'port of the fake provider (default {DEFAULT_PROVIDER_PORT})')
    return parser


def _listen(host: str, port: int, variable: str) -> socket.socket:
    """A socket listening on ``host:port``; a RuntimeError naming the port (and the make variable) if taken."""
    try:
        return mod_listener.bind(host, port)
    except OSError as e:
        raise RuntimeError(f'cannot listen on {host}:{port} ({os.strerror(e.errno) if e.errno else e}): '
                           f'another server is using that port. Stop it, or choose a free port: '
                           f'make run {variable}=<port>') from None


def _provider(args: argparse.Namespace, env: dict) -> subprocess.Popen | None:
    """The fake provider, unless a real one is configured; sets LLMCONN_PROVIDER_ADDRESS in ``env``."""
    if env.get('ANTHROPIC_API_KEY') and not env.get('LLMCONN_PROVIDER_ADDRESS'):
        env['LLMCONN_PROVIDER_ADDRESS'] = REAL_PROVIDER_ADDRESS
        print(f'ANTHROPIC_API_KEY is set: using {REAL_PROVIDER_ADDRESS}')
        return None
    if env.get('LLMCONN_PROVIDER_ADDRESS'):
        return None
    _listen('127.0.0.1', args.provider_port, 'PROVIDER_PORT').close()    # a clear error before it starts
    provider = start_fake_provider(args.provider_port, env=env)
    env['LLMCONN_PROVIDER_ADDRESS'] = f'http://127.0.0.1:{args.provider_port}'
    print(f'Fake provider on {env["LLMCONN_PROVIDER_ADDRESS"]}')
    return provider


def _banner(args: argparse.Namespace, env: dict) -> None:
    store = mask_url(env['REDIS_URL']) if env.get('REDIS_URL') else 'memory:// (this process only)'
    print(f'\nllmconn serve is up on http://{args.host}:{args.port}, chats stored in {store}\n')
    print(conversation(args.port, args.host, env.get('LLMCONN_API_KEY', ''), env.get('LLMCONN_GATEWAY_KEY', '')))
    print('\nCtrl-C to stop.', flush=True)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


if __name__ == '__main__':
    sys.exit(main())
