"""chat() end to end: a real Redis, the fake provider over HTTP, several OS processes.

The fake provider's answer says how many user messages it was sent and
which one came before the last, so each test can see exactly what history
reached the model.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis

from llmconn import ChatBusy, LLMError, LockLost, Registry, StoreError
from llmconn.store.keys import chat_keys
from llmconn.testing.fake_server import FakeProviderServer
from waiting import wait_until

WORKER = str(Path(__file__).with_name('chat_worker.py'))



def config(redis_url, provider_url, name, skills_dir='skills', **conn):
    return {'redis': {'url': redis_url}, 'skills_dir': str(skills_dir),
            'llm': [{'name': name, 'provider': 'openai', 'model': 'fake-model', 'address': provider_url + '/v1',
                     'max_retries': 0, **conn}]}


@pytest.fixture
def make(redis_url, provider, unique, skills_dir, open_registry):
    def make(url=None, **conn):
        return open_registry(config(url or redis_url, provider.url, unique, skills_dir, **conn))[unique]

    return make


def requests_for(provider, name_marker):
    """Bodies the provider received whose last user message starts with ``name_marker``."""
    return [r['body'] for r in provider.requests
            if r['body'] and r['body'].get('messages', [{}])[-1].get('content', '').startswith(name_marker)]


def test_chat_remembers_the_previous_turn(make):
    conn = make()
    conn.chat('my name is Ann', chat_id='u1')
    reply = conn.chat('what is my name?', chat_id='u1')
    assert reply['text'] == 'echo: what is my name? | users: 2 | previous: my name is Ann | system: no'
    assert reply['usage']['input_tokens'] > 0 and reply['usage']['output_tokens'] > 0
    assert conn.history('u1') == [
        {'role': 'user', 'content': 'my name is Ann'},
        {'role': 'assistant', 'content': 'echo: my name is Ann | users: 1 | previous: - | system: no'},
        {'role': 'user', 'content': 'what is my name?'},
        {'role': 'assistant', 'content': reply['text']}]


def test_window_sends_the_last_n_minus_1_turns_and_keeps_the_rest(make, provider):
    conn = make(max_history_turns=3)
    for i in range(5):
        reply = conn.chat(f'w{i}', chat_id='win')
    assert 'users: 3 | previous: w3' in reply['text']
    last_body = requests_for(provider, 'w4')[-1]
    assert [m['content'] for m in last_body['messages'] if m['role'] == 'user'] == ['w2', 'w3', 'w4']
    assert len(last_body['messages']) == 2 * 3 - 1
    assert [m['content'] for m in conn.history('win') if m['role'] == 'user'] == [f'w{i}' for i in range(5)]


def test_storage_cap_trims_the_oldest_turns(make):
    conn = make(max_history_turns=2, max_stored_turns=3)
    for i in range(6):
        conn.chat(f'c{i}', chat_id='cap')
    assert [m['content'] for m in conn.history('cap') if m['role'] == 'user'] == ['c3', 'c4', 'c5']


def test_skill_is_sent_every_call_and_never_stored(make, redis_client):
    conn = make()
    assert conn.chat('hello', chat_id='sk', skill='terse')['text'].endswith('system: yes')
    assert conn.chat('again', chat_id='sk', skill='terse')['text'].endswith('users: 2 | previous: hello | system: yes')
    assert all('SECRET-SAUCE' not in m['content'] for m in conn.history('sk'))
    stored = redis_client.lrange(chat_keys(conn.name, 'sk').turns, 0, -1)
    assert len(stored) == 2 and not any(b'SECRET-SAUCE' in turn for turn in stored)


def test_without_chat_id_nothing_is_read_written_or_locked(make):
    # A store nobody listens on: any access would raise StoreError.
    conn = make(url='redis://127.0.0.1:9/0')
    assert conn.chat('one-shot')['text'].startswith('echo: one-shot | users: 1')
    assert conn.chat('one-shot', chat_id='')['text'].startswith('echo: one-shot | users: 1')


def test_two_connections_never_share_a_chat(redis_url, provider, unique, skills_dir):
    conf = config(redis_url, provider.url, unique, skills_dir)
    conf['llm'].append(dict(conf['llm'][0], name=unique + '-other'))
    registry = Registry.from_dict(conf)
    registry[unique].chat('first', chat_id='same')
    assert 'users: 1' in registry[unique + '-other'].chat('second', chat_id='same')['text']
    registry.close()


def test_expiry_is_renewed_by_each_message_and_an_expired_chat_starts_afresh(make):
    conn = make(chat_expiry=1)
    conn.chat('e0', chat_id='exp')
    time.sleep(0.6)
    conn.chat('e1', chat_id='exp')          # renews the expiry: 1 s from now
    time.sleep(0.6)                          # 1.2 s after the first message, 0.6 s after the last
    assert 'users: 3' in conn.chat('e2', chat_id='exp')['text']
    time.sleep(1.3)
    assert 'users: 1' in conn.chat('e3', chat_id='exp')['text']
    assert [m['content'] for m in conn.history('exp') if m['role'] == 'user'] == ['e3']


def test_provider_failure_leaves_history_unchanged_and_frees_the_lock_at_once(make, provider):
    conn = make(lock_wait=0)
    conn.chat('kept', chat_id='pf')
    before = conn.history('pf')
    provider.fail(400, count=1)
    with pytest.raises(LLMError):
        conn.chat('lost', chat_id='pf')
    assert conn.history('pf') == before
    # lock_wait=0: this would be ChatBusy if the failed call had left its lock behind.
    assert 'users: 2 | previous: kept' in conn.chat('next', chat_id='pf')['text']


def test_redis_down_is_store_error_and_no_provider_request(make, provider, redis_server):
    conn = make(url=redis_server.url)
    conn.chat('before outage', chat_id='rd')
    redis_server.stop()
    count = len(provider.requests)
    with pytest.raises(StoreError):
        conn.chat('during outage', chat_id='rd')
    assert len(provider.requests) == count
    assert conn.invoke('invoke still works')['text'].startswith('echo: invoke still works')


def test_lock_wait_exceeded_is_chat_busy(make):
    conn = make(lock_wait=0.3)
    held = conn.store.begin(conn.name, 'busy', window=1, lock_ttl=10, lock_wait=0)
    try:
        started = time.monotonic()
        with pytest.raises(ChatBusy):
            conn.chat('waits', chat_id='busy')
        assert time.monotonic() - started > 0.25        # it waited its lock_wait first
    finally:
        held.release()
    assert 'users: 1' in conn.chat('now free', chat_id='busy')['text']


def test_a_lock_that_expired_mid_call_does_not_save(make, provider, redis_client):
    conn = make(lock_ttl=5)
    conn.chat('base', chat_id='lost')
    provider.latency = 0.5
    before = len(provider.requests)
    try:
        def steal():
            wait_until(lambda: len(provider.requests) > before, 'the call reached the provider')
            # As if the lock had expired while the provider was still answering (for its latency).
            redis_client.delete(chat_keys(conn.name, 'lost').lock)
        thief = threading.Thread(target=steal)
        thief.start()
        with pytest.raises(LockLost):
            conn.chat('must not be saved', chat_id='lost')
        thief.join()
    finally:
        provider.latency = 0
    assert [m['content'] for m in conn.history('lost') if m['role'] == 'user'] == ['base']


def test_different_chats_do_not_wait_for_each_other(redis_url, server, unique, skills_dir, open_registry):
    # Each provider answer waits until all six requests are in the provider at once: chats that
    # waited for each other (one lock, one connection) would never all get there, and break it.
    chats = 6
    together = threading.Barrier(chats, timeout=60)
    body = json.dumps({'id': 'c', 'object': 'chat.completion', 'created': 1, 'model': 'fake-model',
                       'choices': [{'index': 0, 'finish_reason': 'stop',
                                    'message': {'role': 'assistant', 'content': 'ok'}}],
                       'usage': {'prompt_tokens': 1, 'completion_tokens': 1, 'total_tokens': 2}}).encode()
    server.script = [(200, {'content-type': 'application/json'}, body, together.wait) for _ in range(chats)]
    conn = open_registry(config(redis_url, server.url, unique, skills_dir, timeout=120))[unique]
    replies, errors = [], []

    def chat(i):
        try:
            replies.append(conn.chat(f'p{i}', chat_id=f'par-{i}')['text'])
        except Exception as e:      # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=chat, args=(i,)) for i in range(chats)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and replies == ['ok'] * chats, errors
    assert not together.broken


def test_same_chat_from_threads_is_serialized(make):
    conn = make(max_history_turns=100, max_stored_turns=1000)
    results = []
    threads = [threading.Thread(target=lambda i=i: results.append(conn.chat(f'th{i}', chat_id='ser')['text']))
               for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Every call saw every turn saved before it: the users counts are exactly 1..12.
    counts = sorted(int(text.split('users: ')[1].split(' ')[0]) for text in results)
    assert counts == list(range(1, 13))


def test_round_trips_per_chat_call(make, monkeypatch):
    conn = make()
    conn.chat('warm up', chat_id='rt')       # loads the scripts and opens the connection
    sent = []
    original = redis.connection.Connection.send_packed_command

    caller = threading.current_thread()

    def counting(self, command, check_health=True):
        # Only what the calls send: the lock renewer's thread may renew meanwhile, and that is not a call's.
        if threading.current_thread() is caller:
            sent.append(command)
        return original(self, command, check_health)

    monkeypatch.setattr(redis.connection.Connection, 'send_packed_command', counting)
    for i in range(5):
        conn.chat(f'rt{i}', chat_id='rt')
    assert len(sent) <= 2 * 5, f'{len(sent)} round trips for 5 chat calls'


def run_worker(conf, chat_id, count, label):
    return subprocess.Popen([sys.executable, WORKER, json.dumps(conf), chat_id, str(count), label],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_one_chat_from_several_processes_is_strictly_serialized(redis_url, unique):
    with FakeProviderServer.spawn(latency=0.01) as provider:
        conf = config(redis_url, provider.url, unique, max_history_turns=100, lock_wait=60)
        workers = [run_worker(conf, 'multi', 10, f'proc{p}') for p in range(3)]
        outputs = [w.communicate(timeout=120) for w in workers]
        assert [w.returncode for w in workers] == [0, 0, 0], [o[1][-2000:] for o in outputs]
        received = [r['body'] for r in provider.requests() if r['path'].endswith('/chat/completions')]
    # Each request carried every turn saved before it, in order: strict serialization at the provider.
    users = [[m['content'] for m in body['messages'] if m['role'] == 'user'] for body in received]
    assert len(users) == 30
    for i, seen in enumerate(users):
        assert len(seen) == i + 1
        assert seen[:-1] == users[i - 1] if i else True
    registry = Registry.from_dict(conf)
    history = registry[unique].history('multi')
    registry.close()
    assert len(history) == 60
    for user, assistant in zip(history[::2], history[1::2]):
        assert assistant['content'].startswith(f'echo: {user["content"]} |')


def test_a_killed_lock_holder_blocks_the_chat_for_at_most_lock_ttl(redis_url, unique):
    with FakeProviderServer.spawn() as provider:
        conf = config(redis_url, provider.url, unique, lock_ttl=1, lock_wait=10)
        provider.set_latency(30)
        holder = run_worker(conf, 'killed', 1, 'doomed')
        deadline = time.monotonic() + 20
        while not provider.requests() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert provider.requests(), 'the holder never reached the provider'
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
        killed_at = time.monotonic()
        provider.set_latency(0)
        registry = Registry.from_dict(conf)
        conn = registry[unique]
        reply = conn.chat('survivor', chat_id='killed')
        waited = time.monotonic() - killed_at
        assert 'users: 1' in reply['text']
        assert [m['content'] for m in conn.history('killed') if m['role'] == 'user'] == ['survivor']
        registry.close()
    assert waited < 1 + 1.0, f'the chat stayed blocked {waited:.2f} s after its holder died (lock_ttl 1 s)'
