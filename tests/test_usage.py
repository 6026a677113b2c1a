"""The usage ledger: counted once per call whatever path it took, across processes and outages."""

from __future__ import annotations

import json
import os
import threading
import time
import subprocess
import sys
from pathlib import Path

import pytest
from redis.crc import key_slot

from llmconn import ChatBusy, LLMError, LockLost, Registry, StoreError, ToolLoopLimit
from llmconn.store.keys import chat_keys
from llmconn.usage import UsageLedger
from llmconn.store.usage import Batch, UsageStore
from llmconn.usage_keys import RETENTION_TTL, ledger_key, slot_tags
from llmconn.usage_report import format_table, parse_day, read_usage

HERE = Path(__file__).resolve().parent
SECRET = 'sk-usage-secret-never-stored'


def _config(url: str, provider, name: str) -> dict:
    return {'redis': {'url': url}, 'llm': [
        {'name': name, 'model': 'claude-sonnet-5-5', 'address': provider.url, 'secret': SECRET},
        {'name': name + '-bad', 'model': 'gpt-4o-mini', 'provider': 'openai', 'address': provider.url + '/nowhere',
         'secret': SECRET, 'max_retries': 0}]}


def _totals(store, connection: str) -> dict:
    rows = read_usage(store, connection=connection)
    return {c: sum(r[c] for r in rows) for c in ('calls', 'errors', 'input_tokens', 'output_tokens')}


def _sum(results: list[dict]) -> dict:
    return {'input_tokens': sum(r['usage']['input_tokens'] for r in results),
            'output_tokens': sum(r['usage']['output_tokens'] for r in results)}


def test_ledger_totals_equal_the_replies_usage_after_mixed_calls_from_several_processes(redis_url, provider, unique):
    config = _config(redis_url, provider, unique)
    workers = [subprocess.Popen([sys.executable, str(HERE / 'usage_worker.py'), json.dumps(config), f'w{i}', '6'],
                                stdout=subprocess.PIPE, text=True) for i in range(3)]
    sums = []
    for worker in workers:
        out, _ = worker.communicate(timeout=90)
        assert worker.returncode == 0
        sums.append(json.loads(out.strip().splitlines()[-1]))
    expected = {c: sum(s[c] for s in sums) for c in ('calls', 'errors', 'input_tokens', 'output_tokens')}
    assert expected['calls'] == 3 * 6 * 5 and expected['errors'] == 3 * 6

    registry = Registry.from_dict(config)
    try:
        good, bad = _totals(registry.store, unique), _totals(registry.store, unique + '-bad')
        assert {c: good[c] + bad[c] for c in good} == expected
        assert bad['errors'] == bad['calls'] == 18 and good['errors'] == 0
        rows = read_usage(registry.store, connection=unique + '-bad')
        assert [r['errors_by_status'] for r in rows] == [{'404': 18}]
        assert rows[0]['model'] == 'gpt-4o-mini'
    finally:
        registry.close()


@pytest.mark.parametrize('ending', ['return', 'exit'])
def test_a_program_that_ends_without_closing_its_registry_still_writes_its_counts(redis_url, provider, unique,
                                                                                   ending):
    # Invokes, streams without a chat id and failed calls are tallied in process: a script that
    # returns (or calls sys.exit) without Registry.close() must not lose them.
    config = _config(redis_url, provider, unique)
    worker = subprocess.run([sys.executable, str(HERE / 'usage_worker.py'), json.dumps(config), 'w', '2', ending],
                            capture_output=True, text=True, timeout=90)
    assert worker.returncode == 0, worker.stderr
    sent = json.loads(worker.stdout.strip().splitlines()[-1])
    registry = Registry.from_dict(config)
    try:
        good, bad = _totals(registry.store, unique), _totals(registry.store, unique + '-bad')
        assert {c: good[c] + bad[c] for c in good} == sent
        assert sent['calls'] == 2 * 5 and sent['errors'] == 2
    finally:
        registry.close()


def test_a_registry_is_a_context_manager_that_writes_its_counts_on_the_way_out(redis_url, provider, unique):
    with Registry.from_dict(_config(redis_url, provider, unique)) as registry:
        result = registry[unique].invoke('counted on the way out')
        assert registry.usage.pending() == 1 or _totals(registry.store, unique)['calls'] == 1
    assert registry.usage.pending() == 0
    assert _totals(registry.store, unique) == {'calls': 1, 'errors': 0, **_sum([result])}


def test_a_saved_chat_call_is_counted_by_its_save_script_not_by_the_flusher(open_registry, redis_url, provider,
                                                                            unique):
    registry = open_registry(_config(redis_url, provider, unique))
    results = [registry[unique].chat(f'hello {i}', chat_id='c1') for i in range(3)]
    # Counted at once, in Redis, and nothing was left to the in-process tally.
    assert registry.usage.pending() == 0 and registry.usage._thread is None
    assert _totals(registry.store, unique) == {'calls': 3, 'errors': 0, **_sum(results)}


def test_a_redis_outage_during_invokes_loses_no_counts_once_it_is_back(open_registry, redis_server, provider, unique):
    registry = open_registry(_config(redis_server.url, provider, unique))
    conn = registry[unique]
    results = [conn.invoke(f'before {i}') for i in range(3)]
    assert registry.usage.flush()
    redis_server.stop()
    results += [conn.invoke(f'during {i}') for i in range(4)]
    assert registry.usage.flush() is False        # kept, not dropped
    assert registry.usage.pending() == 4
    redis_server.start()                          # same port, empty: only the outage's counts are there now
    results += [conn.invoke('after')]
    registry.close()
    store = Registry.from_dict(_config(redis_server.url, provider, unique)).store
    assert _totals(store, unique) == {'calls': 5, 'errors': 0, **_sum(results[3:])}


def test_the_background_flusher_writes_invokes_without_being_asked(open_registry, redis_url, provider, unique):
    registry = open_registry(_config(redis_url, provider, unique))
    registry.usage.flush_interval = 0.01
    result = registry[unique].invoke('hello')
    deadline = time.monotonic() + 10
    # The flusher writes the batch, then forgets it: wait for both, polling with a deadline.
    while ((_totals(registry.store, unique)['calls'] == 0 or registry.usage.pending())
           and time.monotonic() < deadline):
        threading.Event().wait(0.01)
    assert registry.usage.pending() == 0
    assert _totals(registry.store, unique) == {'calls': 1, 'errors': 0, **_sum([result])}


def test_a_batch_sent_again_after_a_lost_reply_is_counted_once(open_registry, redis_url, provider, unique):
    registry = open_registry(_config(redis_url, provider, unique))
    ledger = registry.usage
    prefix = ledger.prefix(unique, 'm')
    fields = {prefix + 'calls': 2, prefix + 'input_tokens': 7}
    batch = Batch('batch-1' + unique, ledger_key('2026-01-02'), RETENTION_TTL, fields)
    assert UsageStore(registry.store).write(batch) == 1
    assert UsageStore(registry.store).write(batch) == 0     # the same batch, as after a lost reply
    rows = read_usage(registry.store, connection=unique)
    assert [(r['day'], r['calls'], r['input_tokens']) for r in rows] == [('2026-01-02', 2, 7)]


def test_a_turn_whose_save_failed_is_still_counted_once(open_registry, redis_url, provider, unique, monkeypatch):
    registry = open_registry(_config(redis_url, provider, unique))
    store = registry.store
    monkeypatch.setattr(store, 'finish', lambda *args, **kwargs: 0)     # the lock was lost meanwhile
    with pytest.raises(LockLost):
        result = registry[unique].invoke('hello')       # what the chat's provider call answers
        registry[unique].chat('hello', chat_id='c1')
    monkeypatch.undo()
    registry.close()
    [row] = read_usage(store, connection=unique)
    # Two calls; the failed one counts as an error, with the tokens its provider answer spent.
    assert (row['calls'], row['errors'], row['errors_by_status']) == (2, 1, {'LockLost': 1})
    assert row['input_tokens'] == 2 * result['usage']['input_tokens']


@pytest.mark.parametrize('ran', [True, False], ids=['save-ran', 'save-never-ran'])
def test_a_save_that_failed_with_its_outcome_unknown_is_counted_once(open_registry, redis_url, provider, unique,
                                                                     monkeypatch, ran):
    # The save's reply is lost and its retry fails too: the caller gets StoreError whether or not the
    # script ran. The ledger asks the chat (its saved tokens) and counts the call once either way.
    registry = open_registry(_config(redis_url, provider, unique))
    store = registry.store
    finish = store.finish

    def lost_reply(*args, **kwargs):
        if ran:
            finish(*args, **kwargs)
        raise StoreError('Chat store failed (reply lost, test)')
    monkeypatch.setattr(store, 'finish', lost_reply)
    with pytest.raises(StoreError):
        registry[unique].chat('hello', chat_id='c1')
    monkeypatch.undo()
    result = registry[unique].invoke('hello')               # what the chat's provider call answered
    assert registry.usage.flush()
    [row] = read_usage(store, connection=unique)
    assert (row['calls'], row['errors'], row['errors_by_status']) == (2, 1, {'StoreError': 1})
    assert row['input_tokens'] == 2 * result['usage']['input_tokens']
    assert [t.user for t in store.history(unique, 'c1')] == (['hello'] if ran else [])


def test_a_save_still_in_flight_when_the_call_is_settled_cannot_land_afterwards(open_registry, redis_url, provider,
                                                                                 unique, monkeypatch):
    # The save is held up in the network: the caller gets StoreError, the flusher settles the call
    # (all of it counted), and then the held save arrives. The flusher's fence released the lock
    # first, so the late save finds it taken and writes nothing: no turn, no second count.
    registry = open_registry(_config(redis_url, provider, unique))
    store = registry.store
    finish, held = store.finish, []

    def held_up(keys, args, **kwargs):
        if args[1]:                                     # the save (a release has no turn)
            held.append((keys, args, kwargs))
            raise StoreError('Chat store failed (timed out, test)')
        return finish(keys, args, **kwargs)
    monkeypatch.setattr(store, 'finish', held_up)
    with pytest.raises(StoreError):
        registry[unique].chat('hello', chat_id='c1')
    monkeypatch.undo()
    # The call's release did reach Redis here; play the worst case, a release lost too: the lock
    # still holds the call's token when the held save arrives.
    keys, args, kwargs = held[0]
    store._runner.client.set(keys.lock, args[0], px=30000)
    assert registry.usage.flush()
    assert finish(keys, args, **kwargs) == 0                # the late save: not ours any more
    assert store.history(unique, 'c1') == []
    [row] = read_usage(store, connection=unique)
    assert (row['calls'], row['errors'], row['errors_by_status']) == (1, 1, {'StoreError': 1})


def test_a_call_stopped_while_its_save_ran_is_counted_once(open_registry, redis_url, provider, unique, monkeypatch):
    # Ctrl-C (or a killed greenlet) while the save's reply is on its way: the save ran and counted
    # the call; the flush finds its token and adds only the stop.
    registry = open_registry(_config(redis_url, provider, unique))
    store = registry.store
    finish = store.finish

    def interrupted(keys, args, **kwargs):
        result = finish(keys, args, **kwargs)
        if args[1]:
            raise KeyboardInterrupt
        return result
    monkeypatch.setattr(store, 'finish', interrupted)
    with pytest.raises(KeyboardInterrupt):
        registry[unique].chat('hello', chat_id='c1')
    monkeypatch.undo()
    result = registry[unique].invoke('hello')
    assert registry.usage.flush()
    [row] = read_usage(store, connection=unique)
    assert (row['calls'], row['errors'], row['errors_by_status']) == (2, 1, {'cancelled': 1})
    assert row['input_tokens'] == 2 * result['usage']['input_tokens']
    assert [t.user for t in store.history(unique, 'c1')] == ['hello']


def test_the_rounds_a_failed_tool_turn_was_answered_keep_their_tokens(open_registry, redis_url, provider, unique):
    def again() -> str:
        """Asks for itself again."""
        return 'call again {}'

    config = _config(redis_url, provider, unique)
    config['llm'][0]['max_tool_rounds'] = 2
    registry = open_registry(config)
    with pytest.raises(ToolLoopLimit):
        registry[unique].chat('call again {}', chat_id='loop', tools=[again])
    assert registry.usage.flush()
    [row] = read_usage(registry.store, connection=unique)
    assert (row['calls'], row['errors_by_status']) == (1, {'ToolLoopLimit': 1})
    assert row['input_tokens'] > 0 and row['output_tokens'] > 0 and row['tool_calls'] == 2


def test_an_uncertain_save_written_twice_is_counted_once(open_registry, redis_url, provider, unique, monkeypatch):
    registry = open_registry(_config(redis_url, provider, unique))
    ledger = registry.usage
    monkeypatch.setattr(ledger, '_wake_flusher', lambda: None)     # this test writes by hand
    lock = registry.store.begin(unique, 'c1', window=5, lock_ttl=5, lock_wait=1)
    counters = ledger.save_entry(unique, 'c1', ledger.prefix(unique, 'm'), {'usage': {'input_tokens': 5}})
    lock.release()
    ledger.add_unless_saved(counters, lock.saved_marker(), ledger.prefix(unique, 'm'),
                            {'calls': 1, 'input_tokens': 5, 'errors': 1, 'error:StoreError': 1},
                            if_saved={'errors': 1, 'error:StoreError': 1})
    ledger._cut_batches()
    [batch] = ledger._unsent
    assert UsageStore(registry.store).write(batch) == 1             # not saved: all of it
    assert UsageStore(registry.store).write(batch) == 0             # sent again after a lost reply
    [row] = read_usage(registry.store, connection=unique)
    assert (row['calls'], row['input_tokens'], row['errors']) == (1, 5, 1)


def test_calls_that_fail_without_the_provider_count_as_errors_by_their_error(open_registry, redis_url, provider,
                                                                             unique, monkeypatch):
    config = _config(redis_url, provider, unique)
    config['llm'][0]['lock_wait'] = 0.2
    registry = open_registry(config)
    conn = registry[unique]
    lock = registry.store.begin(unique, 'busy', window=5, lock_ttl=5, lock_wait=0)
    with pytest.raises(ChatBusy):
        conn.chat('hello', chat_id='busy')             # another call holds the chat
    lock.release()

    def refuse(*args, **kwargs):
        raise StoreError('Chat store down (test)')
    monkeypatch.setattr(registry.store, 'begin', refuse)
    with pytest.raises(StoreError):
        conn.chat('hello', chat_id='c1')
    monkeypatch.undo()

    def interrupted(call, tally):                       # Ctrl-C while the provider is thinking
        raise KeyboardInterrupt
        yield
    monkeypatch.setattr(conn, '_pipeline', interrupted)
    with pytest.raises(KeyboardInterrupt):
        conn.chat('hello', chat_id='c2')
    monkeypatch.undo()

    events = conn.stream('answered in full')            # a consumer that stops once it has its answer
    done = next(e for e in events if e.type == 'done')
    events.close()
    registry.close()
    [row] = read_usage(registry.store, connection=unique)
    assert row['errors_by_status'] == {'ChatBusy': 1, 'StoreError': 1, 'cancelled': 1}
    assert (row['calls'], row['errors']) == (4, 3)
    assert row['output_tokens'] == done.result['usage']['output_tokens']


def test_failed_and_abandoned_calls_count_as_errors_by_status(open_registry, redis_url, provider, unique):
    registry = open_registry(_config(redis_url, provider, unique))
    conn = registry[unique]
    provider.fail(429, count=10)
    with pytest.raises(LLMError):
        conn.chat('hello', chat_id='c1')
    provider.clear_faults()
    events = conn.stream('a long one', chat_id='c2')
    next(events)
    events.close()                                  # the client went away mid-stream
    conn.stream('never started', chat_id='c3').close()      # no provider call at all: not counted
    registry.close()
    [row] = read_usage(registry.store, connection=unique)
    assert (row['calls'], row['errors'], row['errors_by_status']) == (2, 2, {'429': 1, 'cancelled': 1})


def test_no_message_text_or_secret_reaches_the_ledger(open_registry, redis_url, redis_client, provider, unique):
    registry = open_registry(_config(redis_url, provider, unique))
    registry[unique].chat('TOP-SECRET-TEXT', chat_id='c1')
    registry[unique].invoke('TOP-SECRET-TEXT')
    registry.close()
    for key in redis_client.scan_iter(match='llmconn:usage:*'):
        if redis_client.type(key) == b'hash':
            dump = repr(redis_client.hgetall(key))
            assert 'TOP-SECRET' not in dump and SECRET not in dump


def test_each_utc_day_has_its_own_hash(redis_url, provider, unique):
    registry = Registry.from_dict(_config(redis_url, provider, unique))
    now = [1767225599.0]        # 2025-12-31 23:59:59 UTC
    registry.usage.clock = lambda: now[0]
    registry[unique].chat('hello', chat_id='c1')
    registry[unique].invoke('hello')
    now[0] += 1
    registry[unique].chat('hello', chat_id='c1')
    registry.close()
    rows = read_usage(registry.store, connection=unique)
    assert [(r['day'], r['calls']) for r in rows] == [('2025-12-31', 2), ('2026-01-01', 1)]
    assert [r['day'] for r in read_usage(registry.store, since='2026-01-01', connection=unique)] == ['2026-01-01']


def test_on_a_cluster_the_ledger_hash_a_save_writes_lives_in_the_chats_slot(open_registry, provider, unique):
    registry = open_registry(_config('memory://', provider, unique))
    ledger = registry.usage
    ledger._cluster = True
    for i in range(200):
        chat_key = chat_keys(unique, f'user-{i}').turns
        key = ledger.save_entry(unique, f'user-{i}', ledger.prefix(unique, 'm'), {'usage': {}}).key
        assert key_slot(key.encode()) == key_slot(chat_key.encode())
    tags = slot_tags()
    assert len(tags) == 16384 and all(key_slot(ledger_key('2026-01-01', s).encode()) == s for s in (0, 9999, 16383))
    assert len(set(tags)) == 16384


def test_the_table_and_the_since_check(open_registry, provider, unique):
    registry = open_registry(_config('memory://', provider, unique))
    registry[unique].invoke('hello')
    registry.usage.flush()
    table = format_table(read_usage(registry.store, connection=unique))
    assert 'CONNECTION' in table and unique in table and 'TOTAL' in table
    assert parse_day('2026-01-31') == '2026-01-31'
    with pytest.raises(ValueError, match='YYYY-MM-DD'):
        parse_day('yesterday')


def test_a_forked_child_does_not_write_its_parents_counts_again(redis_url, provider, unique):
    ledger_registry = Registry.from_dict(_config(redis_url, provider, unique))
    ledger_registry[unique].invoke('hello')
    ledger: UsageLedger = ledger_registry.usage
    pid = os.fork()
    if pid == 0:
        ledger.close()
        os._exit(0)
    os.waitpid(pid, 0)
    ledger_registry.close()
    assert _totals(ledger_registry.store, unique)['calls'] == 1


def test_tool_calls_are_counted_in_the_save_script_and_in_process(open_registry, redis_url, provider, unique):
    from llmconn.types import Turn
    registry = open_registry(_config(redis_url, provider, unique))
    ledger, store = registry.usage, registry.store
    result = {'usage': {'input_tokens': 5, 'output_tokens': 6}, 'tool_calls': [{'call_id': 'a'}, {'call_id': 'b'}]}
    lock = store.begin(unique, 'c1', window=5, lock_ttl=5, lock_wait=1)
    lock.save(Turn(user='u', assistant='a'), expiry=60, max_turns=10,
              counters=ledger.save_entry(unique, 'c1', ledger.prefix(unique, 'm'), result))
    tally = ledger.call(unique, 'm')
    list(tally.track(iter([type('Done', (), {'type': 'done', 'result': result})()])))
    assert ledger.flush()
    [row] = read_usage(store, connection=unique)
    assert (row['calls'], row['tool_calls'], row['input_tokens'], row['output_tokens']) == (2, 4, 10, 12)


def test_a_served_invoke_is_written_when_the_server_stops_gracefully(tmp_path, redis_url, provider, unique):
    """Invokes counted in `llmconn serve` workers reach the ledger on SIGTERM, however soon it comes."""
    import shutil as mod_shutil

    import requests

    from conftest import free_port
    from llmconn.demo import start_server, stop
    config = tmp_path / 'llm.yaml'
    config.write_text(f'redis:\n  url: {redis_url}\nllm:\n  - name: Support\n    model: claude-sonnet-5-5\n'
                      f'    address: {provider.url}\n    secret: {SECRET}\n')
    services = tmp_path / 'services'
    services.mkdir()
    mod_shutil.copy(HERE.parent / 'services' / 'demo_llm.py', services)
    store = Registry.from_file(config).store
    before = _totals(store, 'Support')
    port = free_port()
    server = start_server(config, services, port, extra=['--workers', '2'])
    try:
        replies = [requests.post(f'http://127.0.0.1:{port}/demo.llm.ask', json={'text': f'q {i}'}, timeout=10).json()
                   for i in range(12)]
    finally:
        stop(server)
    assert server.returncode == 0
    after = _totals(store, 'Support')
    assert after['calls'] - before['calls'] == 12
    assert after['input_tokens'] - before['input_tokens'] == sum(r['usage']['input_tokens'] for r in replies)


def test_a_long_outage_keeps_one_batch_per_day_not_one_per_flush(open_registry, redis_server, provider, unique):
    registry = open_registry(_config(redis_server.url, provider, unique))
    redis_server.stop()
    for i in range(5):
        registry[unique].invoke(f'during {i}')
        assert registry.usage.flush() is False
    assert len(registry.usage._unsent) == 1 and registry.usage.pending() == 5
    redis_server.start()
    assert registry.usage.flush() and registry.usage.pending() == 0
    assert _totals(registry.store, unique)['calls'] == 5


@pytest.mark.parametrize('flusher_ran', [False, True], ids=['flusher-never-started', 'flusher-had-run'])
def test_a_call_finishing_after_its_registry_closed_is_still_written(redis_url, provider, unique, flusher_ran):
    registry = Registry.from_dict(_config(redis_url, provider, unique))
    if flusher_ran:
        registry[unique].invoke('starts the flusher')
    events = registry[unique].stream('slow one')
    next(events)
    registry.close()
    list(events)
    assert registry.usage.pending() == 0
    assert _totals(registry.store, unique)['calls'] == 1 + flusher_ran


CHILD = '''
import json, multiprocessing, sys
from llmconn import Registry

def work(config):
    registry = Registry.from_dict(config)       # never closed: the child's exit must write its counts
    for i in range(3):
        registry[config['llm'][0]['name']].invoke(f'child {i}')

if __name__ == '__main__':
    context = multiprocessing.get_context(sys.argv[2])
    child = context.Process(target=work, args=(json.loads(sys.argv[1]),))
    child.start()
    child.join()
    sys.exit(child.exitcode)
'''


@pytest.mark.parametrize('method', ['fork', 'forkserver', 'spawn'])
def test_a_multiprocessing_child_that_returns_writes_its_counts(tmp_path, redis_url, provider, unique, method):
    # fork and forkserver children end with os._exit, past atexit: their exit runs finalizers.
    script = tmp_path / 'child.py'
    script.write_text(CHILD)
    done = subprocess.run([sys.executable, str(script), json.dumps(_config(redis_url, provider, unique)), method],
                          capture_output=True, text=True, timeout=90, env=dict(os.environ, PYTHONPATH=str(HERE.parent)))
    assert done.returncode == 0, done.stderr
    registry = Registry.from_dict(_config(redis_url, provider, unique))
    try:
        assert _totals(registry.store, unique)['calls'] == 3
    finally:
        registry.close()
