"""The usage ledger and the admin commands on a real Redis Cluster (3 masters + 3 replicas, started here)."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
import sys

import pytest
import redis
from redis.crc import key_slot

from llmconn import LLMError, Registry, StoreError
from llmconn.cli_admin import list_chats
from llmconn.store.keys import chat_keys
from llmconn.usage_keys import USAGE_PREFIX
from llmconn.usage_report import read_usage
from redis_topology import Cluster

CHATS = [f'user-{i}' for i in range(24)]


@pytest.fixture(scope='module')
def cluster(tmp_path_factory):
    cluster = Cluster(tmp_path_factory.mktemp('usage-cluster'))
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def _config(cluster, provider, name):
    return {'redis': {'url': cluster.url}, 'llm': [
        {'name': name, 'model': 'claude-sonnet-5-5', 'address': provider.url, 'secret': 'sk-cluster-secret'},
        {'name': name + '-bad', 'model': 'claude-sonnet-5-5', 'address': provider.url + '/nowhere',
         'secret': 'sk-cluster-secret', 'max_retries': 0}]}


def test_chat_calls_in_every_slot_are_counted_and_summed_over_every_master(cluster, provider, unique):
    registry = Registry.from_dict(_config(cluster, provider, unique))
    try:
        replies = [registry[unique].chat(f'hello {chat}', chat_id=chat) for chat in CHATS]
        replies += [registry[unique].invoke('one-shot') for _ in range(3)]
        with pytest.raises(LLMError):
            registry[unique + '-bad'].invoke('fails')
        # Saved chat calls were counted by their save scripts, each in its own slot.
        assert registry.usage.pending() == 4
        assert registry.usage.flush()
        rows = read_usage(registry.store, connection=unique)
        ids = list_chats(registry.store, unique)
        bad = read_usage(registry.store, connection=unique + '-bad')
    finally:
        registry.close()
    assert sum(r['calls'] for r in rows) == len(CHATS) + 3
    assert sum(r['input_tokens'] for r in rows) == sum(r['usage']['input_tokens'] for r in replies)
    assert sum(r['output_tokens'] for r in rows) == sum(r['usage']['output_tokens'] for r in replies)
    assert [(r['calls'], r['errors_by_status']) for r in bad] == [(1, {'404': 1})]
    assert ids == sorted(CHATS)

    # The counts really are spread over several masters, in the chats' own slots, each hash expiring.
    day = rows[0]['day']
    masters = set()
    for chat in CHATS:
        slot = key_slot(chat_keys(unique, chat).turns.encode())
        port = cluster.master_of(chat_keys(unique, chat).turns)
        masters.add(port)
        node = redis.Redis(port=port)
        tagged = [k for k in node.scan_iter(match=f'{USAGE_PREFIX}{{*}}:{day}') if key_slot(k) == slot]
        assert len(tagged) == 1 and 0 < node.ttl(tagged[0]) <= 400 * 86400
    assert len(masters) == 3


def test_the_usage_and_chats_commands_on_a_cluster(cluster, provider, unique, tmp_path):
    path = tmp_path / 'llm.yaml'
    path.write_text(json.dumps(_config(cluster, provider, unique)))      # JSON is YAML
    registry = Registry.from_file(path)
    try:
        for chat in CHATS[:6]:
            registry[unique].chat('hi', chat_id=chat)
    finally:
        registry.close()
    run = lambda *args: subprocess.run([sys.executable, '-m', 'llmconn', *args, '--config', str(path)],  # noqa: E731
                                       capture_output=True, text=True, timeout=60)
    usage = run('usage', '--connection', unique, '--json')
    assert usage.returncode == 0, usage.stderr
    assert sum(r['calls'] for r in json.loads(usage.stdout)) == 6
    chats = run('chats', unique)
    assert chats.stdout.split() == sorted(CHATS[:6])


def test_a_save_with_its_outcome_unknown_is_settled_in_the_chats_own_slot(cluster, provider, unique, monkeypatch):
    # The flush asks the chat's saved tokens and writes the slot's ledger hash in one script: on a
    # cluster all three keys must live in the chat's slot, for chats on every master.
    registry = Registry.from_dict(_config(cluster, provider, unique))
    try:
        store = registry.store
        finish = store.finish
        ran = {chat: i % 2 == 0 for i, chat in enumerate(CHATS[:8])}
        for chat, did_run in ran.items():
            def lost_reply(*args, did_run=did_run, **kwargs):
                if did_run:
                    finish(*args, **kwargs)
                raise StoreError('Chat store failed (reply lost, test)')
            monkeypatch.setattr(store, 'finish', lost_reply)
            with pytest.raises(StoreError):
                registry[unique].chat('hello', chat_id=chat)
            monkeypatch.undo()
        assert registry.usage.flush()
        rows = read_usage(registry.store, connection=unique)
        saved = {chat: bool(registry[unique].history(chat)) for chat in ran}
    finally:
        registry.close()
    assert saved == ran
    assert sum(r['calls'] for r in rows) == sum(r['errors'] for r in rows) == len(ran)
    assert sum((Counter(r['errors_by_status']) for r in rows), Counter()) == {'StoreError': len(ran)}
