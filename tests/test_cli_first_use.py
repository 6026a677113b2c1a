"""What the command line tells a new user who got something slightly wrong: once, clearly, naming it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import free_port

ROOT = Path(__file__).resolve().parent.parent


def llmconn(*argv: str, cwd: Path | None = None, timeout: float = 90) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, '-m', 'llmconn', *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def write_config(path: Path, provider_url: str, redis_url: str = 'memory://') -> Path:
    path.write_text(f'redis:\n  url: {redis_url}\nllm:\n  - name: Support\n    provider: claude\n'
                    f'    model: claude-sonnet-5-5\n    address: {provider_url}\n    max_retries: 0\n')
    return path


def test_serve_with_a_services_directory_that_does_not_exist_says_so_and_exits(tmp_path):
    config = write_config(tmp_path / 'llm.yaml', 'http://127.0.0.1:9')
    missing = tmp_path / 'no' / 'such' / 'dir'
    done = llmconn('serve', '--config', str(config), '--services', str(missing), '--port', str(free_port()))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f'error: --services {missing} does not exist; create it, or point '
                                        f'--services at the directory that holds your *.py services']
    (tmp_path / 'file.py').write_text('')
    done = llmconn('serve', '--config', str(config), '--services', str(tmp_path / 'file.py'))
    assert done.returncode == 2 and 'is not a directory' in done.stderr


def test_one_call_whose_counts_cannot_be_written_says_they_are_lost_once(tmp_path, provider):
    dead_redis = f'redis://127.0.0.1:{free_port()}/0'        # nothing listens there
    config = write_config(tmp_path / 'llm.yaml', provider.url, redis_url=dead_redis)
    done = llmconn('invoke', 'Support', 'hello', '--config', str(config))
    assert done.returncode == 0 and done.stdout.startswith('echo: hello')
    assert done.stderr.count('could not be written before closing and are lost') == 1, done.stderr


@pytest.mark.parametrize('command', [('history', 'Support', 'ann'), ('chats', 'Support'),
                                     ('forget', 'Support', 'ann')])
def test_admin_commands_on_a_memory_store_say_they_cannot_see_a_servers_chats(tmp_path, command):
    config = write_config(tmp_path / 'llm.yaml', 'http://127.0.0.1:9')
    done = llmconn(*command, '--config', str(config))
    assert done.returncode == 0, done.stderr
    assert (f'note: {config} stores chats in memory://, inside each process, so this command sees only its own, '
            f'never those of a running llmconn serve') in done.stderr


def test_admin_commands_on_a_shared_store_add_no_note(tmp_path, redis_url):
    config = write_config(tmp_path / 'llm.yaml', 'http://127.0.0.1:9', redis_url=redis_url)
    done = llmconn('history', 'Support', 'ann', '--config', str(config))
    assert done.returncode == 0 and 'note:' not in done.stderr


def test_serve_without_services_and_no_services_directory_warns_and_serves(tmp_path):
    from llmconn.demo import stop, wait_until_up
    from llmconn.server import serve_command
    config, port, log = write_config(tmp_path / 'llm.yaml', 'http://127.0.0.1:9'), free_port(), tmp_path / 'log'
    with open(log, 'w') as err:
        proc = subprocess.Popen(serve_command(['--config', str(config), '--port', str(port)]), cwd=tmp_path,
                                env=dict(os.environ, PYTHONPATH=str(ROOT)), stderr=err)
        try:
            wait_until_up(f'http://127.0.0.1:{port}/health', proc)
        finally:
            stop(proc)
    assert f'No services directory {tmp_path / "services"}: serving no services' in log.read_text()
