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
import signal
import subprocess
import sys
import time as mod_time
import urllib.error
import urllib.request

from llmconn.redact import mask_url
from llmconn.server import DEFAULT_PORT, serve_command

DEFAULT_PROVIDER_PORT = 17011
REAL_PROVIDER_ADDRESS = 'https://api.anthropic.com'
STARTUP_TIMEOUT = 20.0      # seconds a process gets to start answering HTTP
STOP_TIMEOUT = 10.0         # seconds a process gets to exit after SIGTERM before it is killed


def start_fake_provider(port: int, host: str = '127.0.0.1', latency: float = 0.0,
                        env: dict | None = None) -> subprocess.Popen:
    command = [sys.executable, '-m', 'llmconn', 'fake-provider', '--host', host, '--port', str(port),
               '--latency', str(latency)]
    proc = subprocess.Popen(command, env=env)
    _wait_or_stop(f'http://{host}:{port}/v1/models', proc)
    return proc


def start_server(config: str, services: str, port: int, host: str = '127.0.0.1', env: dict | None = None,
                 extra: list | tuple = (), wait: bool = True, **popen) -> subprocess.Popen:
    """One ``llmconn serve`` process; returns once it answers ``GET /health`` (any status)."""
    argv = ['--config', str(config), '--services', str(services), '--host', host, '--port', str(port), *extra]
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


def conversation(port: int = DEFAULT_PORT, host: str = '127.0.0.1', api_key: str = '') -> str:
    """What the demo prints: the commands, with a word on what each shows."""
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
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog='python -m llmconn.demo', description=__doc__.split('\n')[0])
    parser.add_argument('--config', default='etc/embedded.yaml', help='the configuration (default etc/embedded.yaml)')
    parser.add_argument('--services', default='services', help='the services directory (default services)')
    parser.add_argument('--host', default='127.0.0.1', help='address the host listens on (default 127.0.0.1)')
    parser.add_argument('--port', type=int, default=DEFAULT_PORT, help=f'port of the host (default {DEFAULT_PORT})')
    parser.add_argument('--provider-port', type=int, default=DEFAULT_PROVIDER_PORT,
                        help=f'port of the fake provider (default {DEFAULT_PROVIDER_PORT})')
    args = parser.parse_args(argv)
    env = dict(os.environ)
    # SIGTERM (from make or a supervisor) cleans up as Ctrl-C does.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)     # even when started in the background, where it is ignored
    provider = server = None
    try:
        if env.get('ANTHROPIC_API_KEY') and not env.get('LLMCONN_PROVIDER_ADDRESS'):
            env['LLMCONN_PROVIDER_ADDRESS'] = REAL_PROVIDER_ADDRESS
            print(f'ANTHROPIC_API_KEY is set: using {REAL_PROVIDER_ADDRESS}')
        elif not env.get('LLMCONN_PROVIDER_ADDRESS'):
            provider = start_fake_provider(args.provider_port, env=env)
            env['LLMCONN_PROVIDER_ADDRESS'] = f'http://127.0.0.1:{args.provider_port}'
            print(f'Fake provider on {env["LLMCONN_PROVIDER_ADDRESS"]}')
        server = start_server(args.config, args.services, args.port, host=args.host, env=env)
        store = mask_url(env['REDIS_URL']) if env.get('REDIS_URL') else 'memory:// (this process only)'
        print(f'\nllmconn serve is up on http://{args.host}:{args.port}, chats stored in {store}\n')
        print(conversation(args.port, args.host, env.get('LLMCONN_API_KEY', '')))
        print('\nCtrl-C to stop.')
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


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


if __name__ == '__main__':
    sys.exit(main())
