"""The operator's commands end to end, as separate processes against a real Redis and the fake provider."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import llmconn

ROOT = Path(__file__).resolve().parent.parent
SECRET = 'sk-admin-cli-secret-never-printed'
HOSTILE_ID = 'user:{1}* "quoted" <b>ünï</b>'


def llmconn_cli(*args, input=None, cwd=None):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, '-m', 'llmconn', *args], capture_output=True, text=True, timeout=60,
                          input=input, cwd=cwd, env=env)


def _write_config(path: Path, redis_url: str, provider, name: str) -> Path:
    path.write_text(textwrap.dedent(f'''
        redis:
          url: {redis_url}
        llm:
          - name: {name}
            model: claude-sonnet-5-5
            address: {provider.url}
            secret: {SECRET}
          - name: {name}-other
            provider: openai
            model: gpt-4o-mini
            address: {provider.url}/v1
            secret: {SECRET}
    '''))
    return path


@pytest.fixture
def config(tmp_path, redis_url, provider, unique):
    return str(_write_config(tmp_path / 'llm.yaml', redis_url, provider, unique))


def test_version_prints_the_package_version():
    done = llmconn_cli('--version')
    assert done.returncode == 0 and done.stdout.strip() == f'llmconn {llmconn.__version__}'


def test_chats_history_and_forget_round_trip_any_chat_id(config, unique):
    for chat_id, text in (('user-1', 'first'), ('user-1', 'second'), ('user-2', 'hi'), (HOSTILE_ID, 'odd')):
        done = llmconn_cli('chat', unique, text, '--chat-id', chat_id, '--config', config)
        assert done.returncode == 0, done.stderr
    # Another connection's chats are never listed.
    assert llmconn_cli('chat', unique + '-other', 'x', '--chat-id', 'user-9', '--config', config).returncode == 0

    listed = llmconn_cli('chats', unique, '--config', config, '--json')
    assert json.loads(listed.stdout) == sorted(['user-1', 'user-2', HOSTILE_ID])
    matched = llmconn_cli('chats', unique, '--match', 'user-*', '--config', config)
    assert matched.stdout.split('\n')[:-1] == ['user-1', 'user-2']

    history = llmconn_cli('history', unique, 'user-1', '--config', config)
    assert history.returncode == 0
    lines = history.stdout.splitlines()
    assert lines[0] == 'user: first' and lines[2] == 'user: second' and lines[3].startswith('assistant: echo: second')
    as_json = json.loads(llmconn_cli('history', unique, HOSTILE_ID, '--config', config, '--json').stdout)
    assert [m['role'] for m in as_json] == ['user', 'assistant'] and as_json[0]['content'] == 'odd'

    forgot = llmconn_cli('forget', unique, 'user-1', '--config', config)
    assert forgot.returncode == 0 and 'forgot' in forgot.stdout and '(4 messages)' in forgot.stdout
    again = llmconn_cli('forget', unique, 'user-1', '--config', config)
    assert again.returncode == 0 and 'nothing to forget' in again.stdout
    assert llmconn_cli('history', unique, 'user-1', '--config', config, '--json').stdout.strip() == '[]'
    assert 'user-1' not in llmconn_cli('chats', unique, '--config', config).stdout.split('\n')
    for done in (listed, matched, history, forgot):
        assert SECRET not in done.stdout + done.stderr


def test_admin_commands_name_the_known_connections_for_an_unknown_one(config, unique):
    for args in (('history', 'Nope', 'c'), ('forget', 'Nope', 'c'), ('chats', 'Nope'), ('chat', 'Nope', 'x'),
                 ('usage', '--connection', 'Nope')):
        done = llmconn_cli(*args, '--config', config)
        assert done.returncode == 1 and f'"{unique}"' in done.stderr, args


def test_usage_prints_a_table_and_json_since_a_day(config, unique):
    assert llmconn_cli('chat', unique, 'hello', '--chat-id', 'c1', '--config', config).returncode == 0
    assert llmconn_cli('invoke', unique, 'hello', '--config', config).returncode == 0
    table = llmconn_cli('usage', '--connection', unique, '--config', config)
    assert table.returncode == 0, table.stderr
    header, row, total = table.stdout.splitlines()
    assert header.split()[:4] == ['DAY', 'CONNECTION', 'MODEL', 'CALLS'] and row.split()[1:4] == [
        unique, 'claude-sonnet-5-5', '2']
    rows = json.loads(llmconn_cli('usage', '--connection', unique, '--config', config, '--json').stdout)
    assert [(r['calls'], r['errors']) for r in rows] == [(2, 0)] and rows[0]['input_tokens'] > 0
    later = llmconn_cli('usage', '--since', '2999-01-01', '--connection', unique, '--config', config)
    assert later.stdout.strip() == 'no usage recorded'
    for since in ('last week', '20261201', '2026-W48-1'):       # only YYYY-MM-DD, as the error says
        bad = llmconn_cli('usage', '--since', since, '--config', config)
        assert bad.returncode == 1 and 'YYYY-MM-DD' in bad.stderr, since


def test_usage_of_a_connection_no_longer_configured_is_still_reported(tmp_path, redis_url, provider, unique):
    # A connection renamed or removed keeps its past usage: --connection finds it in the ledger.
    old = _write_config(tmp_path / 'old.yaml', redis_url, provider, unique + '-gone')
    assert llmconn_cli('invoke', unique + '-gone', 'hello', '--config', str(old)).returncode == 0
    config = str(_write_config(tmp_path / 'llm.yaml', redis_url, provider, unique))
    done = llmconn_cli('usage', '--connection', unique + '-gone', '--config', config, '--json')
    assert done.returncode == 0, done.stderr
    assert [(r['connection'], r['calls']) for r in json.loads(done.stdout)] == [(unique + '-gone', 1)]


def test_every_admin_command_reads_etc_llm_yaml_by_default(tmp_path, redis_url, provider, unique):
    (tmp_path / 'etc').mkdir()
    _write_config(tmp_path / 'etc' / 'llm.yaml', redis_url, provider, unique)
    assert llmconn_cli('chat', unique, 'hello', '--chat-id', 'c1', cwd=tmp_path).returncode == 0
    assert llmconn_cli('chats', unique, cwd=tmp_path).stdout.strip() == 'c1'
    assert llmconn_cli('history', unique, 'c1', cwd=tmp_path).stdout.startswith('user: hello')
    assert unique in llmconn_cli('usage', cwd=tmp_path).stdout
    assert llmconn_cli('check', '--connect', cwd=tmp_path).returncode == 0


def test_check_connect_reaches_the_store_and_each_provider(config, unique):
    done = llmconn_cli('check', '--connect', '--config', config)
    assert done.returncode == 0, done.stdout + done.stderr
    assert 'store redis://' in done.stdout and f'{unique}: OK' in done.stdout and f'{unique}-other: OK' in done.stdout


def test_check_connect_fails_naming_what_is_unreachable(tmp_path, provider, unique):
    from conftest import free_port
    dead = f'http://127.0.0.1:{free_port()}'
    path = tmp_path / 'llm.yaml'
    path.write_text(textwrap.dedent(f'''
        redis:
          url: redis://:pw-never-shown@127.0.0.1:{free_port()}/0
        llm:
          - name: {unique}
            model: claude-sonnet-5-5
            address: {dead}
            secret: {SECRET}
            max_retries: 0
    '''))
    done = llmconn_cli('check', str(path), '--connect')
    assert done.returncode == 1
    assert 'store: FAILED' in done.stdout and f'{unique}: FAILED' in done.stdout
    assert 'pw-never-shown' not in done.stdout + done.stderr and SECRET not in done.stdout + done.stderr


def test_chat_reads_stdin_line_by_line_when_it_is_not_a_terminal(config, unique):
    done = llmconn_cli('chat', unique, '--chat-id', 'piped', '--config', config,
                       input='My name is Ann\n\nWhat is my name?\n')
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ['echo: My name is Ann | users: 1 | previous: - | system: no',
                                        'echo: What is my name? | users: 2 | previous: My name is Ann | system: no']
    assert 'chat id: piped' in done.stderr and 'you>' not in done.stdout


def test_a_failed_line_is_reported_and_the_next_lines_still_run(config, unique, provider):
    provider.fail(400, count=1)
    done = llmconn_cli('chat', unique, '--chat-id', 'p2', '--config', config, input='first\nsecond\n')
    assert done.returncode == 1 and 'error:' in done.stderr
    assert done.stdout.splitlines() == ['echo: second | users: 1 | previous: - | system: no']


def test_chat_without_an_id_starts_a_new_conversation_and_says_its_id(config, unique):
    done = llmconn_cli('chat', unique, '--config', config, input='hello\n')
    chat_id = done.stderr.split('chat id: ')[1].split()[0]
    assert chat_id.startswith('cli-')
    assert llmconn_cli('history', unique, chat_id, '--config', config).stdout.startswith('user: hello')


class Terminal:
    """A process on a pseudo-terminal, read until an expected text shows up."""

    def __init__(self, args: list[str]) -> None:
        self.master, slave = pty.openpty()
        env = dict(os.environ, PYTHONPATH=str(ROOT), TERM='dumb')
        self.process = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
        os.close(slave)
        self.seen = b''

    def expect(self, text: str, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        wanted = text.encode()
        while wanted not in self.seen:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f'{text!r} never appeared; the terminal shows {self.seen.decode()!r}')
            ready, _, _ = select.select([self.master], [], [], remaining)
            if ready:
                try:
                    chunk = os.read(self.master, 4096)
                except OSError:
                    chunk = b''
                if not chunk:
                    raise AssertionError(f'{text!r} never appeared before exit; got {self.seen.decode()!r}')
                self.seen += chunk
        before, _, self.seen = self.seen.partition(wanted)
        return before.decode()

    def send(self, text: str) -> None:
        os.write(self.master, text.encode())

    def close(self) -> int:
        code = self.process.wait(timeout=30)
        os.close(self.master)
        return code


def test_chat_on_a_terminal_prompts_and_streams_the_answer(config, unique):
    term = Terminal([sys.executable, '-m', 'llmconn', 'chat', unique, '--chat-id', 'tty', '--config', config])
    try:
        banner = term.expect('you> ')
        assert f'Chatting with {unique}' in banner and 'chat id tty' in banner and '/quit' in banner
        term.send('My name is Ann\n')
        answer = term.expect('you> ')
        assert f'{unique}> echo: My name is Ann | users: 1' in answer
        term.send('What is my name?\n')
        assert 'previous: My name is Ann' in term.expect('you> ')
        term.send('/history\n')
        shown = term.expect('you> ')
        assert 'user: My name is Ann' in shown and 'user: What is my name?' in shown
        term.send('\x04')       # Ctrl-D
        assert term.close() == 0
    finally:
        if term.process.poll() is None:
            term.process.kill()
    assert [m['content'] for m in json.loads(llmconn_cli('history', unique, 'tty', '--config', config,
                                                         '--json').stdout)][::2] == ['My name is Ann',
                                                                                     'What is my name?']


def test_a_failed_turn_on_a_terminal_is_shown_and_leaving_afterwards_is_status_0(config, unique, provider):
    term = Terminal([sys.executable, '-m', 'llmconn', 'chat', unique, '--chat-id', 'tty-fail', '--config', config])
    try:
        term.expect('you> ')
        provider.fail(400, count=1)
        term.send('this one fails\n')
        assert 'error: ' in term.expect('you> ')
        term.send('\x04')       # Ctrl-D: the person saw the error and left
        assert term.close() == 0
    finally:
        if term.process.poll() is None:
            term.process.kill()


def test_quit_on_a_terminal_leaves_with_status_0(config, unique):
    term = Terminal([sys.executable, '-m', 'llmconn', 'chat', unique, '--config', config])
    try:
        term.expect('you> ')
        term.send('/quit\n')
        assert term.close() == 0
    finally:
        if term.process.poll() is None:
            term.process.kill()


def test_chat_text_cannot_drive_the_operators_terminal(config, unique):
    hostile = 'hi \x1b]0;pwned\x07 \x1b[2J there'
    assert llmconn_cli('chat', unique, hostile, '--chat-id', 'esc', '--config', config).returncode == 0
    term = Terminal([sys.executable, '-m', 'llmconn', 'history', unique, 'esc', '--config', config])
    try:
        shown = term.expect('assistant: ')
        assert '\x1b' not in shown and '\\x1b]0;pwned\\x07' in shown
        assert term.close() == 0
    finally:
        if term.process.poll() is None:
            term.process.kill()
    piped = llmconn_cli('history', unique, 'esc', '--config', config)     # not a terminal: the text as stored
    assert hostile in piped.stdout
