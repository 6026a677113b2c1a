"""What the operator's commands print can never drive the terminal they print on.

Chat ids and chat text are anyone's input: an ESC sequence, an OSC title
(``ESC ] 0 ; ... BEL``), an 8-bit CSI or a newline inside a chat id must
reach a terminal escaped - in listings, answers, errors and JSON alike.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from tests.test_cli_admin import Terminal, _write_config, llmconn_cli

OSC_TITLE = '\x1b]0;pwned\x07'


@pytest.fixture
def config(tmp_path, redis_url, provider, unique):
    return str(_write_config(tmp_path / 'llm.yaml', redis_url, provider, unique))


def on_terminal(*args: str) -> str:
    """Everything a command wrote to its terminal (stdout and stderr), once it exited."""
    term = Terminal([sys.executable, '-m', 'llmconn', *args])
    try:
        term.process.wait(timeout=60)
        chunks = []
        while True:
            try:
                chunk = os.read(term.master, 65536)
            except OSError:     # the terminal's other side is gone: all was read
                break
            if not chunk:
                break
            chunks.append(chunk)
        term.close()
        return b''.join(chunks).decode()
    finally:
        if term.process.poll() is None:
            term.process.kill()


def test_a_chat_id_with_a_newline_is_one_escaped_line_in_the_listing(config, unique):
    hostile = f'evil\nid{OSC_TITLE}'
    assert llmconn_cli('chat', unique, 'hi', '--chat-id', hostile, '--config', config).returncode == 0
    shown = on_terminal('chats', unique, '--config', config)
    assert '\x1b' not in shown and '\x07' not in shown
    assert 'evil\\nid\\x1b]0;pwned\\x07' in shown, shown


def test_a_provider_error_quoting_escapes_is_shown_inert(config, unique, provider):
    provider.fail(400, body={'type': 'error', 'error': {'type': 'invalid_request_error',
                                                         'message': f'bad {OSC_TITLE}\x1b[2J input'}})
    shown = on_terminal('chat', unique, 'hi', '--chat-id', 'err', '--config', config)
    assert 'error: ' in shown and '\x1b' not in shown, shown
    assert '\\x1b]0;pwned\\x07\\x1b[2J' in shown


def test_invoke_on_a_terminal_shows_the_answers_escapes_inert(config, unique):
    shown = on_terminal('invoke', unique, f'say {OSC_TITLE}', '--config', config)
    assert '\x1b' not in shown and '\\x1b]0;pwned\\x07' in shown, shown


def test_json_output_escapes_what_json_dumps_leaves_raw(config, unique):
    text = 'c1 \x9b2J bidi \u202egnp.exe del \x7f end'     # 8-bit CSI, a right-to-left override, DEL
    assert llmconn_cli('chat', unique, text, '--chat-id', 'j', '--config', config).returncode == 0
    done = llmconn_cli('history', unique, 'j', '--config', config, '--json')
    assert done.returncode == 0, done.stderr
    assert not any(c in done.stdout for c in '\x9b\u202e\x7f')
    assert '\\u009b' in done.stdout and '\\u202e' in done.stdout
    assert json.loads(done.stdout)[0]['content'] == text       # the same JSON value, only escaped
