"""``window_step`` (SPEC §17): the window's start moves K turns at a time, read in the store's begin.

Real Redis, a real connection and the fake provider: what each call sent is
read from the provider's record, so the tests see the window the model saw.
"""

from __future__ import annotations

import json
import threading

import pytest

from llmconn.config import load_dict
from llmconn.errors import ConfigError

MAX_HISTORY_TURNS = 6           # 5 stored turns go with each call at most


@pytest.fixture
def chat(redis_url, provider, unique, open_registry):
    def make(url: str = redis_url, **conn):
        conf = {'name': unique, 'provider': 'claude', 'model': 'claude-sonnet-5-5', 'address': provider.url,
                'max_retries': 0, 'max_history_turns': MAX_HISTORY_TURNS, **conn}
        return open_registry({'redis': {'url': url}, 'llm': [conf]})[unique]
    return make


def sent(provider) -> list[list[dict]]:
    """Each recorded Claude request's messages, cache marks left out (they are not the prompt's text)."""
    out = []
    for request in provider.requests:
        if request['path'] == '/v1/messages':
            text = json.dumps(request['body']['messages'])
            out.append(json.loads(text.replace(', "cache_control": {"type": "ephemeral"}', '')))
    return out


def first_users(provider) -> list[str]:
    """The first user message of each call: where its window starts ('q<i>' is turn i)."""
    return [_text(messages[0]['content']) for messages in sent(provider)]


def _text(content) -> str:
    return content if isinstance(content, str) else ''.join(b.get('text', '') for b in content)


@pytest.mark.parametrize('store', ['redis', 'memory'])
def test_window_start_moves_k_turns_at_a_time(chat, provider, store, redis_url, unique):
    conn = chat(redis_url if store == 'redis' else f'memory://{unique}', window_step=3)
    for i in range(14):
        conn.chat(f'q{i}', chat_id='c')
    # Calls 0-5 send every turn; then the start jumps 3 turns and stays for 3 calls: 3-5 turns go.
    assert first_users(provider) == ['q0'] * 6 + ['q3'] * 3 + ['q6'] * 3 + ['q9'] * 2
    assert [(len(m) - 1) // 2 for m in sent(provider)] == [0, 1, 2, 3, 4, 5, 3, 4, 5, 3, 4, 5, 3, 4]


def test_the_prompt_prefix_stays_byte_identical_while_the_start_holds(chat, provider):
    conn = chat(window_step=3)
    for i in range(12):
        conn.chat(f'q{i}', chat_id='c')
    bodies = sent(provider)
    for before, after in zip(bodies[6:8], bodies[7:9]):         # calls 6, 7, 8 share their start
        assert after[:len(before)] == before
    assert bodies[9][0] != bodies[8][0]                          # call 9 moved it


def test_default_step_keeps_the_exact_window(chat, provider):
    conn = chat()
    for i in range(9):
        conn.chat(f'q{i}', chat_id='c')
    assert first_users(provider) == ['q0'] * 6 + ['q1', 'q2', 'q3']
    assert [(len(m) - 1) // 2 for m in sent(provider)] == [0, 1, 2, 3, 4, 5, 5, 5, 5]


def test_a_waiter_handed_the_lock_gets_the_stepped_window(chat, provider):
    conn = chat(window_step=3)
    for i in range(6):
        conn.chat(f'q{i}', chat_id='c')
    provider.clear()
    provider.latency = 0.3          # the first call holds the chat while the second queues behind it
    first = threading.Thread(target=conn.chat, args=('q6',), kwargs={'chat_id': 'c'})
    first.start()
    while not provider.requests:
        threading.Event().wait(0.01)
    conn.chat('q7', chat_id='c')        # woken by q6's save, with the window FINISH read for it
    first.join()
    assert first_users(provider) == ['q3', 'q3']
    assert [(len(m) - 1) // 2 for m in sent(provider)] == [3, 4]


@pytest.mark.parametrize('step, message', [(0, 'window_step'), (7, 'window_step')])
def test_window_step_is_checked_at_load(step, message):
    with pytest.raises(ConfigError, match=message):
        load_dict({'llm': [{'name': 'c', 'model': 'claude-sonnet-5-5', 'max_history_turns': 6,
                            'window_step': step}]})
    assert load_dict({'llm': [{'name': 'c', 'model': 'claude-sonnet-5-5', 'max_history_turns': 6,
                               'window_step': 6}]}).llm[0].window_step == 6
