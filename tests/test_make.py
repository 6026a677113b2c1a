"""What a new user runs first: ``make run`` (the demo launcher), ``make test`` and ``.ci/run``.

The launcher runs for real (a subprocess, as ``make run`` starts it); a port
already taken is held by a real HTTP server that answers everything, as a
forgotten ``make run`` would.
"""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import requests

from conftest import free_port
from llmconn.demo import DEMO_GATEWAY_KEY, conversation, endpoints

ROOT = Path(__file__).resolve().parent.parent
DEMO_TIMEOUT = 90         # seconds: a subprocess starting two more, on a machine that may be loaded


class _AnswersEverything(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header('Content-Length', '2')
        self.end_headers()
        self.wfile.write(b'{}')

    def log_message(self, *args):
        pass


@pytest.fixture
def other_server():
    """Another HTTP server, answering 200 on every path of its port."""
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), _AnswersEverything)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def demo_env() -> dict:
    return {k: v for k, v in os.environ.items()
            if k not in ('REDIS_URL', 'ANTHROPIC_API_KEY', 'LLMCONN_PROVIDER_ADDRESS', 'LLMCONN_API_KEY',
                         'LLMCONN_GATEWAY_KEY')}


def run_demo(port: int, provider_port: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, '-m', 'llmconn.demo', '--port', str(port),
                           '--provider-port', str(provider_port)], cwd=ROOT, env=demo_env(),
                          capture_output=True, text=True, timeout=DEMO_TIMEOUT)


def test_make_run_on_a_taken_port_fails_naming_it_without_claiming_to_be_up(other_server):
    done = run_demo(other_server, free_port())
    assert done.returncode == 1
    assert 'is up' not in done.stdout and 'curl' not in done.stdout
    assert done.stderr.strip().splitlines() == [
        f'error: cannot listen on 127.0.0.1:{other_server} (Address already in use): another server is using '
        f'that port. Stop it, or choose a free port: make run PORT=<port>']


def test_make_run_with_the_fake_providers_port_taken_fails_naming_it(other_server):
    done = run_demo(free_port(), other_server)
    assert done.returncode == 1
    assert 'is up' not in done.stdout and 'Fake provider on' not in done.stdout
    assert done.stderr.strip().splitlines() == [
        f'error: cannot listen on 127.0.0.1:{other_server} (Address already in use): another server is using '
        f'that port. Stop it, or choose a free port: make run PROVIDER_PORT=<port>']


def test_fake_provider_on_a_busy_port_says_so_in_one_line(other_server):
    done = subprocess.run([sys.executable, '-m', 'llmconn', 'fake-provider', '--port', str(other_server)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f'error: cannot listen on 127.0.0.1:{other_server} (Address already in use); is another server using '
        f'the port? Choose one with --port']


def test_the_banner_shows_the_gateway_admin_and_metrics():
    shown = conversation(17010)
    for line in endpoints(17010):
        assert line in shown
    assert f'http://localhost:17010/v1 (api_key={DEMO_GATEWAY_KEY!r}' in shown
    assert 'http://localhost:17010/admin' in shown and 'http://localhost:17010/metrics' in shown
    chosen = conversation(17010, gateway_key='sk-mine-123')
    assert 'sk-mine-123' not in chosen and 'the key in LLMCONN_GATEWAY_KEY' in chosen     # the user's secret


def test_the_doors_the_banner_names_open_as_it_says(tmp_path):
    port, provider_port = free_port(), free_port()
    demo = subprocess.Popen([sys.executable, '-m', 'llmconn.demo', '--port', str(port),
                             '--provider-port', str(provider_port)], cwd=ROOT, env=demo_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        lines = []
        for line in demo.stdout:
            lines.append(line)
            if line.startswith('Ctrl-C'):
                break
        banner = ''.join(lines)
        base = f'http://localhost:{port}'
        assert f'{base}/v1 (api_key={DEMO_GATEWAY_KEY!r}' in banner
        models = requests.get(f'{base}/v1/models', headers={'Authorization': f'Bearer {DEMO_GATEWAY_KEY}'},
                              timeout=30)
        assert models.status_code == 200 and [m['id'] for m in models.json()['data']] == ['Support']
        assert f'{base}/metrics' in banner
        assert 'llmconn_requests_total' in requests.get(f'{base}/metrics', timeout=30).text
        assert f'{base}/admin (set LLMCONN_API_KEY to open it)' in banner
        assert requests.get(f'{base}/admin', timeout=30).status_code == 403     # no key configured, as it says
    finally:
        demo.terminate()
        assert demo.wait(15) == 0


def test_make_test_runs_in_parallel_and_lists_the_slowest():
    done = subprocess.run(['make', '--no-print-directory', '-n', 'test'], cwd=ROOT, capture_output=True,
                          text=True, timeout=30)
    command = [line for line in done.stdout.splitlines() if ' -m pytest' in line][-1]
    assert '-n auto' in command and '--dist loadgroup' in command and '--durations=15' in command
    assert 'pytest-xdist' in (ROOT / 'setup.cfg').read_text()


def test_ci_runs_make_test_last_so_its_exit_is_the_scripts():
    script = (ROOT / '.ci' / 'run').read_text()
    assert 'set -euo pipefail' in script
    assert script.rstrip().splitlines()[-1] == 'make test'


def test_the_readme_python_api_talks_to_the_make_run_demo_as_written():
    import re

    from llmconn import config as mod_config
    from llmconn.demo import DEFAULT_PROVIDER_PORT
    readme = (ROOT / 'README.md').read_text()
    section = readme[readme.index('## Python API'):]
    block = section[section.index('```python'):section.index('```\n', section.index('```python') + 3)]
    path, = re.findall(r"Registry\.from_file\('([^']+)'\)", block)
    # As in a user's shell: none of the variables set that tests/test_readme.py sets to run it.
    conf = mod_config.load_file(ROOT / path, environ={})
    assert conf.llm[0].name == 'Support' and conf.llm[0].address == f'http://127.0.0.1:{DEFAULT_PROVIDER_PORT}'
    assert f'PROVIDER_PORT ?= {DEFAULT_PROVIDER_PORT}' in (ROOT / 'Makefile').read_text()
