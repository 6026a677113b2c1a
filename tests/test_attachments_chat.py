"""Attachments in chat memory (SPEC §16), on a real Redis: stored once per chat, replayed, freed, shared.

The fake provider's echo says how many files the whole conversation it was
sent carries (``files: N``), so a reply proves what the window replayed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest
import redis

from llmconn import Attachment, InvalidInput
from llmconn.store.keys import chat_keys
from test_attachments import PDF, PNG
from tests.tools_helpers import PROVIDERS, connection_config
from waiting import wait_until

WORKER = os.path.join(os.path.dirname(__file__), 'chat_worker.py')
# A 1 MB scan: a PNG header and filler, which is all the checks read.
SCAN = PNG + b'\0' * (1024 * 1024 - len(PNG))


@pytest.fixture
def make(redis_url, provider, unique, open_registry):
    def make(kind='claude', **conn):
        return open_registry(connection_config(redis_url, provider.url, unique, kind, **conn))[unique]
    return make


def files_key(conn, chat_id: str) -> str:
    return chat_keys(conn.name, chat_id).beside('files')


@pytest.mark.parametrize('kind', PROVIDERS)
def test_five_turns_showing_the_same_scan_store_it_once_and_each_sends_the_window_with_it(
        make, provider, redis_client, kind):
    conn = make(kind)
    scan = Attachment.from_bytes(SCAN, 'image/png', 'scan.png')
    for n in range(1, 6):
        reply = conn.chat(f'look {n}', chat_id='s', attachments=[scan])
        assert reply['text'].endswith(f'| attached: image/png | files: {n}')     # every turn's scan went back
    key = files_key(conn, 's')
    assert redis_client.hkeys(key) == [scan.sha256.encode()]
    assert redis_client.hstrlen(key, scan.sha256) == len(scan.base64)          # the bytes, once
    turns = redis_client.lrange(chat_keys(conn.name, 's').turns, 0, -1)
    assert all(len(t) < 1000 for t in turns)                                     # turns hold only its hash
    assert conn.history('s')[0] == {'role': 'user', 'content': 'look 1', 'attachments': [
        {'media_type': 'image/png', 'name': 'scan.png', 'size': len(SCAN), 'sha256': scan.sha256}]}
    assert 'attachments' not in conn.history('s')[1]
    assert provider.violations == []


def test_the_attachments_expire_with_the_chat(make, redis_client):
    conn = make(chat_expiry=50)
    conn.chat('one', chat_id='e', attachments=[Attachment.from_bytes(PNG, 'image/png')])
    conn.chat('two', chat_id='e')       # a save without attachments keeps them alive as long as the turns
    turns_ttl = redis_client.pttl(chat_keys(conn.name, 'e').turns)
    assert 45_000 < redis_client.pttl(files_key(conn, 'e')) <= turns_ttl <= 50_000
    assert 45_000 < redis_client.pttl(chat_keys(conn.name, 'e').beside('filerefs')) <= 50_000


def test_trimmed_turns_free_their_attachments(make, redis_client):
    conn = make(max_history_turns=2, max_stored_turns=2)
    png, pdf = Attachment.from_bytes(PNG, 'image/png'), Attachment.from_bytes(PDF, 'application/pdf')
    conn.chat('one', chat_id='t', attachments=[png])
    conn.chat('two', chat_id='t', attachments=[png, pdf])
    conn.chat('three', chat_id='t')             # trims "one": the PNG is still named by "two"
    assert sorted(redis_client.hkeys(files_key(conn, 't'))) == sorted([png.sha256.encode(), pdf.sha256.encode()])
    assert conn.chat('three b', chat_id='t', attachments=[pdf])['text'].endswith('files: 1')   # "three" has none
    conn.chat('four', chat_id='t')              # trims "three": "three b" still names the PDF
    assert redis_client.hkeys(files_key(conn, 't')) == [pdf.sha256.encode()]
    conn.chat('five', chat_id='t')
    conn.chat('six', chat_id='t')               # nothing names either any more
    assert redis_client.exists(files_key(conn, 't')) == 0
    assert redis_client.exists(chat_keys(conn.name, 't').beside('filerefs')) == 0


def test_a_chat_call_with_attachments_in_its_window_makes_two_round_trips(make, monkeypatch):
    conn = make()
    scan = Attachment.from_bytes(SCAN, 'image/png')
    conn.chat('warm up', chat_id='rt', attachments=[scan])
    sent = []
    original = redis.connection.Connection.send_packed_command
    caller = threading.current_thread()

    def counting(self, command, check_health=True):
        if threading.current_thread() is caller:
            sent.append(command)
        return original(self, command, check_health)

    monkeypatch.setattr(redis.connection.Connection, 'send_packed_command', counting)
    for i in range(3):
        reply = conn.chat(f'rt{i}', chat_id='rt', attachments=[scan] if i == 1 else None)
    assert reply['text'].endswith('files: 2')
    assert len(sent) <= 2 * 3, f'{len(sent)} round trips for 3 chat calls'
    # The scan the window already holds is not sent to Redis again.
    assert all(len(b''.join(c) if isinstance(c, list) else c) < 100_000 for c in sent)


def test_another_process_sharing_the_redis_continues_the_chat_with_its_attachments(make, redis_url, provider,
                                                                                   unique):
    conn = make()
    conn.chat('here is the scan', chat_id='p', attachments=[Attachment.from_bytes(SCAN, 'image/png', 'scan.png')])
    config = connection_config(redis_url, provider.url, unique, 'claude')
    done = subprocess.run([sys.executable, WORKER, json.dumps(config), 'p', '1', 'other'], capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == ('echo: other-0 | users: 2 | previous: here is the scan | system: no '
                                           '| attached: - | files: 1')


def test_a_pending_tool_turn_keeps_its_attachments_until_answered(make, redis_client):
    import llmconn
    conn = make()
    refund = llmconn.Tool('refund', 'Refund.', {'type': 'object', 'properties': {'amount': {'type': 'integer'}}})
    pdf = Attachment.from_bytes(PDF, 'application/pdf', 'receipt.pdf')
    waiting = conn.chat('call refund {"amount": 10}', chat_id='m', tools=[refund], attachments=[pdf])
    with pytest.raises(InvalidInput, match='not with tool_outputs'):
        conn.chat(chat_id='m', tool_outputs={waiting['tool_calls'][0]['call_id']: 'ok'}, tools=[refund],
                  attachments=[pdf])
    conn.chat(chat_id='m', tool_outputs={waiting['tool_calls'][0]['call_id']: 'ok'}, tools=[refund])
    assert conn.history('m')[0]['attachments'][0]['name'] == 'receipt.pdf'
    assert redis_client.hgetall(chat_keys(conn.name, 'm').beside('filerefs')) == {pdf.sha256.encode(): b'1'}
    assert conn.chat('and?', chat_id='m')['text'].endswith('files: 1')


def test_deleting_a_chat_deletes_its_attachments_and_bad_input_stores_none(make, redis_client):
    conn = make(max_attachment_bytes=len(PDF))
    conn.chat('one', chat_id='d', attachments=[Attachment.from_bytes(PDF, 'application/pdf')])
    conn.delete_history('d')
    assert redis_client.exists(files_key(conn, 'd'), chat_keys(conn.name, 'd').beside('filerefs')) == 0
    with pytest.raises(InvalidInput, match='max_attachment_bytes'):
        conn.chat('big', chat_id='b', attachments=[Attachment.from_bytes(SCAN, 'image/png')])
    assert redis_client.exists(files_key(conn, 'b'), chat_keys(conn.name, 'b').turns) == 0


def test_a_call_handed_the_lock_by_a_waiting_line_gets_the_attachments_of_its_window(make, provider):
    conn = make(lock_wait=30)
    scan = Attachment.from_bytes(PNG, 'image/png')
    conn.chat('first', chat_id='h', attachments=[scan])
    provider.latency = 0.3          # the first call holds the chat while the second queues behind it
    replies = {}
    first = threading.Thread(target=lambda: replies.setdefault('a', conn.chat('a', chat_id='h', attachments=[scan])))
    first.start()
    wait_until(lambda: len(provider.requests) == 2, 'the first call reached the provider')     # chat locked
    replies['b'] = conn.chat('b', chat_id='h')
    first.join()
    assert replies['a']['text'].endswith('files: 2')
    assert replies['b']['text'].endswith('files: 2')     # its window came in the hand-over, bytes and all


@pytest.fixture(scope='module')
def cluster(tmp_path_factory):
    from redis_topology import Cluster
    cluster = Cluster(tmp_path_factory.mktemp('cluster'))
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def test_on_a_redis_cluster_the_attachments_live_in_their_chats_slot_and_come_back(cluster, unique):
    from llmconn.store import open_store
    from llmconn.types import Turn
    store = open_store(cluster.url)
    scan = Attachment.from_bytes(PNG, 'image/png', 'scan.png')
    try:
        with store.begin(unique, 'c', window=10, lock_ttl=5, lock_wait=5) as lock:
            lock.save(Turn('look', 'seen', attachments=(scan,)), expiry=60, max_turns=1000)
        with store.begin(unique, 'c', window=10, lock_ttl=5, lock_wait=5) as lock:
            [turn] = lock.turns
        assert turn.attachments[0].base64 == scan.base64 and turn.attachments[0].name == 'scan.png'
    finally:
        store.close()
    keys = chat_keys(unique, 'c')
    node = redis.Redis(port=cluster.master_of(keys.turns))
    assert node.hkeys(keys.beside('files')) == [scan.sha256.encode()]
    assert {node.cluster('keyslot', k) for k in (keys.turns, keys.beside('files'), keys.beside('filerefs'))} == {
        node.cluster('keyslot', keys.turns)}


def test_attachments_lapsed_while_no_window_named_them_are_counted_again_when_named(make, redis_client):
    # Only a save whose window (or turn) names attachments keeps them alive, so they may lapse
    # while older turns still name them; a turn naming one again counts those turns first, or
    # trimming the oldest would free the bytes the newest turn still needs.
    conn = make(max_history_turns=3, max_stored_turns=4)
    png = Attachment.from_bytes(PNG, 'image/png')
    conn.chat('one', chat_id='l', attachments=[png])
    for text in ('two', 'three', 'four'):
        conn.chat(text, chat_id='l')            # "four"'s window (two, three) names nothing
    keys = chat_keys(conn.name, 'l')
    redis_client.delete(keys.beside('files'), keys.beside('filerefs'))     # as if they had lapsed
    conn.chat('five', chat_id='l', attachments=[png])       # trims "one", which names the PNG too
    assert redis_client.hgetall(keys.beside('filerefs')) == {png.sha256.encode(): b'1'}
    assert conn.chat('six', chat_id='l')['text'].endswith('files: 1')         # "five" still has its PNG
