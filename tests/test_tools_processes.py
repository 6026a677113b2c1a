"""Tool loops across OS processes: one chat stays serialized for whole turns; a crash saves nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from llmconn import Registry
from llmconn.testing.fake_server import FakeProviderServer
from tests.tools_helpers import connection_config

WORKER = str(Path(__file__).with_name('tool_worker.py'))


def run_worker(conf, chat_id, count, label, *extra):
    return subprocess.Popen([sys.executable, WORKER, json.dumps(conf), chat_id, str(count), label, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def last_user(body) -> str:
    return [m['content'] for m in body['messages'] if m['role'] == 'user'][-1]


def test_two_processes_on_one_chat_never_interleave_their_tool_loops(redis_url, unique):
    with FakeProviderServer.spawn(latency=0.01) as provider:
        conf = connection_config(redis_url, provider.url, unique, 'openai', max_history_turns=100, lock_wait=60)
        workers = [run_worker(conf, 'multi', 4, f'p{p}') for p in range(2)]
        outputs = [w.communicate(timeout=120) for w in workers]
        assert [w.returncode for w in workers] == [0, 0], [o[1][-2000:] for o in outputs]
        bodies = [r['body'] for r in provider.requests()]
        assert provider.violations == []
    # Every turn is three provider calls, and no other call on the chat comes between them.
    assert len(bodies) == 8 * 3
    for start in range(0, len(bodies), 3):
        turn = bodies[start:start + 3]
        users = [[m['content'] for m in b['messages'] if m['role'] == 'user'] for b in turn]
        assert users[0] == users[1] == users[2] and len(users[0]) == start // 3 + 1
    registry = Registry.from_dict(conf)
    history = registry[unique].history('multi')
    registry.close()
    assert len(history) == 16
    for assistant in history[1::2]:
        assert [c['name'] for c in assistant['tool_calls']] == ['first', 'second']
        assert assistant['content'].startswith('tool said: p') and assistant['content'].endswith('finished')


def test_a_process_killed_mid_loop_saves_nothing_and_frees_the_chat(redis_url, unique):
    with FakeProviderServer.spawn() as provider:
        conf = connection_config(redis_url, provider.url, unique, 'openai', lock_ttl=1, lock_wait=10)
        registry = Registry.from_dict(conf)
        conn = registry[unique]
        conn.chat('before', chat_id='crash')
        doomed = run_worker(conf, 'crash', 1, 'doomed', 'crash')
        out, err = doomed.communicate(timeout=60)
        assert 'crashing' in out and doomed.returncode != 0, err[-2000:]
        assert len(provider.requests()) == 1 + 2        # the turn reached its second round
        reply = conn.chat('after', chat_id='crash')     # waits out the dead holder's lock
        assert 'users: 2 | previous: before' in reply['text']
        assert [m['content'] for m in conn.history('crash')][0::2] == ['before', 'after']
        registry.close()
