"""The llmconn command, run as a user runs it: a separate process."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


def llmconn(*args, env=None):
    return subprocess.run([sys.executable, '-m', 'llmconn', *args], capture_output=True, text=True, timeout=60,
                          env=env)


@pytest.fixture
def config(tmp_path, provider):
    path = tmp_path / 'llm.yaml'
    path.write_text(textwrap.dedent(f'''
        llm:
          - name: Fake Claude
            model: claude-sonnet-5-5
            address: {provider.url}
            secret: sk-cli-secret-never-printed
          - name: Fake OpenAI
            provider: openai
            model: gpt-4o-mini
            address: {provider.url}/v1
    '''))
    return path


def test_check_lists_connections_without_secrets(config):
    done = llmconn('check', str(config))
    assert done.returncode == 0, done.stderr
    assert 'Fake Claude: provider=claude model=claude-sonnet-5-5' in done.stdout
    assert 'Fake OpenAI: provider=openai' in done.stdout
    assert 'sk-cli-secret' not in done.stdout + done.stderr


def test_check_of_a_bad_file_exits_1_with_the_error(tmp_path):
    path = tmp_path / 'bad.yaml'
    path.write_text('llm:\n  - name: x\n    model: m\n    provider: nope\n')
    done = llmconn('check', str(path))
    assert done.returncode == 1
    assert 'unknown provider' in done.stderr and str(path) in done.stderr


def test_invoke_chat_and_ping(config):
    done = llmconn('invoke', 'Fake OpenAI', 'hello from the shell', '--config', str(config))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == 'echo: hello from the shell | users: 1 | previous: - | system: no'
    assert llmconn('ping', 'Fake Claude', '--config', str(config)).stdout.strip() == 'Fake Claude: OK'
    missing = llmconn('invoke', 'Nope', 'x', '--config', str(config))
    assert missing.returncode == 1 and '"Fake Claude", "Fake OpenAI"' in missing.stderr
