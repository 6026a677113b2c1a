"""``tool_timeout``: a tool that hangs cannot hold its chat (and the chat's lock) for as long as it hangs.

An overrunning tool is abandoned: its output is an error the model reads,
as for a tool that raised, and the turn goes on. Plain threads and gevent
alike (there, the tool's thread is a greenlet).
"""

from __future__ import annotations

import contextvars
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from llmconn import Tool
from llmconn.config import DEFAULT_TOOL_TIMEOUT
from llmconn.errors import ConfigError
from llmconn.tools import run
from tests.tools_helpers import connection_config

ROOT = Path(__file__).resolve().parent.parent
released = threading.Event()


def hang(x: str) -> str:
    """Waits for an answer that never comes (until the test lets it go)."""
    released.wait(30)
    return 'too late'


@pytest.fixture(autouse=True)
def release_hung_tools():
    released.clear()
    yield
    released.set()      # the abandoned threads finish now, not 30 s later


@pytest.mark.parametrize('kind', ['openai', 'claude'])
def test_a_hung_tool_becomes_an_error_output_and_frees_the_chat(redis_url, provider, unique, open_registry, kind):
    conn = open_registry(connection_config(redis_url, provider.url, unique, kind, tool_timeout=0.5,
                                           lock_wait=0))[unique]
    started = time.monotonic()
    reply = conn.chat('call hang {"x": "1"}', chat_id=unique, tools=[hang])
    assert time.monotonic() - started < 10         # not 30 s: the tool was abandoned at 0.5 s
    call = reply['tool_calls'][0]
    assert call['is_error'] and 'tool_timeout' in call['output'] and '0.5 s' in call['output']
    assert reply['text'] == f'tool said: {call["output"]}'         # the model read the error and answered
    # The turn was saved and the lock is free: lock_wait 0 would raise ChatBusy at once otherwise.
    assert conn.chat('next', chat_id=unique)['text'].startswith('echo: next')
    assert provider.violations == []


def test_a_tool_that_returns_in_time_is_unchanged_and_its_errors_still_reach_the_model():
    def fails(x: str) -> str:
        raise KeyError('no such order')

    assert run(Tool.from_callable(hang), 'hang', {'x': '1'}, timeout=0.2)[1] is True
    released.set()
    assert run(Tool.from_callable(hang), 'hang', {'x': '1'}, timeout=5) == ('too late', False)
    assert run(Tool('fails', '', function=fails, parameters={'type': 'object', 'properties': {'x': {}}}),
               'fails', {'x': '1'}, timeout=5) == ("error: KeyError: 'no such order'", True)


def test_the_tool_sees_the_callers_context_variables():
    var = contextvars.ContextVar('request_id')
    var.set('cid-42')
    tool = Tool('ctx', '', {'type': 'object', 'properties': {}}, function=lambda: var.get())
    assert run(tool, 'ctx', {}, timeout=5) == ('cid-42', False)


def test_tool_timeout_defaults_to_a_minute_and_must_be_positive(open_registry):
    conf = open_registry({'llm': [{'name': 'x', 'model': 'gpt-4.1'}]})['x'].conf
    assert conf.tool_timeout == DEFAULT_TOOL_TIMEOUT == 60
    with pytest.raises(ConfigError, match='tool_timeout'):
        open_registry({'llm': [{'name': 'x', 'model': 'gpt-4.1', 'tool_timeout': 0}]})


GEVENT_SCRIPT = '''
from gevent import monkey; monkey.patch_all()
import sys, time, gevent
sys.path[:0] = {paths!r}
from llmconn.registry import Registry
from llmconn.testing.fake_server import FakeProviderServer

def nap(x: str) -> str:
    """Sleeps far longer than tool_timeout (a patched sleep: the greenlet yields)."""
    time.sleep(30)
    return 'late'

ticks = []
ticker = gevent.spawn(lambda: [ticks.append(gevent.sleep(0.05)) for _ in range(200)])
with FakeProviderServer() as fake:
    registry = Registry.from_dict({{'llm': [{{'name': 'g', 'provider': 'openai', 'model': 'gpt-4o-mini',
                                            'address': fake.url + '/v1', 'tool_timeout': 0.5, 'lock_wait': 0}}]}})
    started = time.monotonic()
    reply = registry['g'].chat('call nap {{"x": "1"}}', chat_id='c', tools=[nap])
    elapsed = time.monotonic() - started
    again = registry['g'].chat('next', chat_id='c')['text']
    print(round(elapsed, 1), reply['tool_calls'][0]['is_error'], len(ticks) > 5, again.startswith('echo: next'))
    registry.close()
'''


def test_the_tool_deadline_holds_under_gevent():
    script = GEVENT_SCRIPT.format(paths=[str(ROOT)])
    done = subprocess.run([sys.executable, '-c', textwrap.dedent(script)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    elapsed, is_error, others_ran, chat_free = done.stdout.split()
    assert float(elapsed) < 10 and is_error == 'True' and others_ran == 'True' and chat_free == 'True', done.stdout


def test_a_caller_waiting_on_a_chat_held_by_a_running_tool_is_told_why(redis_url, provider, unique, open_registry):
    from llmconn.errors import ChatBusy
    conn = open_registry(connection_config(redis_url, provider.url, unique, 'openai', tool_timeout=20,
                                           lock_wait=0.2))[unique]
    entered = threading.Event()

    def slow(x: str) -> str:
        """Holds the chat until the test has seen the waiter give up."""
        entered.set()
        released.wait(20)
        return 'done'

    first = threading.Thread(target=conn.chat, args=('call slow {"x": "1"}',), kwargs={
        'chat_id': unique, 'tools': [slow]})
    first.start()
    try:
        assert entered.wait(20)
        with pytest.raises(ChatBusy, match='tools the model asked for.*tool_timeout'):
            conn.chat('meanwhile', chat_id=unique)
    finally:
        released.set()
        first.join(20)
