"""The registry: lookups, inactive connections, and reload that swaps the whole set at once."""

from __future__ import annotations

import textwrap
import threading
import time

import pytest

from llmconn import ConfigError, InactiveConnection, Registry, UnknownConnection


def write(path, conns, redis_url='memory://'):
    body = ''.join(f'''
      - name: {name}
        provider: openai
        model: {model}
        address: {address}
        is_active: {str(active).lower()}
        max_retries: 0''' for name, model, address, active in conns)
    path.write_text(textwrap.dedent(f'''
    redis:
      url: {redis_url}
    llm:''') + textwrap.indent(textwrap.dedent(body), ''))


@pytest.fixture
def config_file(tmp_path, provider):
    path = tmp_path / 'llm.yaml'
    write(path, [('A', 'model-a', provider.url + '/v1', True), ('B', 'model-b', provider.url + '/v1', False)])
    return path


def test_lookups(config_file):
    registry = Registry.from_file(config_file)
    assert 'A' in registry and 'C' not in registry and len(registry) == 2 and list(registry) == ['A', 'B']
    with pytest.raises(UnknownConnection) as e:
        registry['C']
    assert isinstance(e.value, KeyError)
    assert str(e.value) == 'no LLM connection named \'C\'; known connections: "A", "B"'
    registry.close()


def test_inactive_connection_is_known_but_refuses_calls(config_file, provider):
    registry = Registry.from_file(config_file)
    with pytest.raises(InactiveConnection, match='is_active: true'):
        registry['B'].invoke('hello')
    with pytest.raises(InactiveConnection):
        registry['B'].chat('hello', chat_id='x')
    assert provider.requests == []
    registry.close()


def test_reload_swaps_the_set_and_keeps_unchanged_connections(config_file, provider):
    registry = Registry.from_file(config_file)
    a_before = registry['A']
    write(config_file, [('A', 'model-a', provider.url + '/v1', True), ('C', 'model-c', provider.url + '/v1', True)])
    registry.reload()
    assert list(registry) == ['A', 'C'] and registry['A'] is a_before
    assert registry['C'].invoke('hi')['model'] == 'model-c'


def test_a_bad_file_leaves_the_old_set_serving(config_file):
    registry = Registry.from_file(config_file)
    config_file.write_text('llm:\n  - name: A\n    model: m\n    timout: 3\n')
    with pytest.raises(ConfigError, match='timout'):
        registry.reload()
    assert list(registry) == ['A', 'B']
    assert registry['A'].invoke('still here')['text'].startswith('echo: still here')
    registry.close()


def test_a_call_running_during_reload_finishes_on_its_connection(config_file, provider):
    registry = Registry.from_file(config_file)
    provider.latency = 0.3
    results = []
    call = threading.Thread(target=lambda: results.append(registry['A'].invoke('slow')))
    call.start()
    write(config_file, [('A', 'model-new', provider.url + '/v1', True)])
    registry.reload()
    call.join()
    assert results[0]['model'] == 'model-a'
    assert registry['A'].invoke('fast')['model'] == 'model-new'
    registry.close()


def test_loading_does_not_need_redis(tmp_path, provider):
    path = tmp_path / 'llm.yaml'
    write(path, [('A', 'model-a', provider.url + '/v1', True)], redis_url='redis://127.0.0.1:9/0')
    registry = Registry.from_file(path)
    assert registry['A'].invoke('no redis needed')['text'].startswith('echo: no redis needed')
    registry.close()


def test_from_dict_has_no_file_to_reload(provider):
    registry = Registry.from_dict({'llm': [{'name': 'A', 'model': 'm', 'address': provider.url + '/v1'}]})
    with pytest.raises(ConfigError, match='no file to reload'):
        registry.reload()


def wait_for(condition, what, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f'timed out waiting for {what}'
        time.sleep(0.005)


def chat_config(path, provider, redis_url, model='model-a', skills_dir='skills'):
    path.write_text(textwrap.dedent(f'''
    redis: {{url: "{redis_url}"}}
    skills_dir: {skills_dir}
    llm:
      - {{name: A, provider: openai, model: {model}, address: "{provider.url}/v1", max_retries: 0,
          lock_ttl: 0.3, lock_wait: 5}}
    '''))


def test_a_replaced_connection_and_store_close_only_after_the_call_in_flight(tmp_path, provider, redis_url,
                                                                           redis_client, unique):
    path = tmp_path / 'llm.yaml'
    chat_config(path, provider, redis_url)
    registry = Registry.from_file(path)
    old_conn, old_store = registry['A'], registry.store
    provider.latency = 1.2                      # four lock_ttl: only renewal keeps the chat locked
    results, errors = [], []

    def call():
        try:
            results.append(old_conn.chat('slow', chat_id=unique))
        except Exception as e:          # noqa: BLE001 - reported below
            errors.append(e)

    worker = threading.Thread(target=call)
    worker.start()
    wait_for(lambda: provider.requests, 'the call to reach the provider')
    other_db = redis_url.rsplit('/', 1)[0] + '/3'
    chat_config(path, provider, other_db, model='model-b')
    registry.reload()                           # new store and connection while the call is in flight
    assert registry['A'] is not old_conn and registry.store is not old_store
    assert not old_conn.closed and not old_store._closed
    worker.join(10)
    assert errors == [] and results[0]['model'] == 'model-a'   # LockLost if renewal had stopped
    assert old_conn.closed and old_store._closed
    assert [m['content'] for m in Registry.from_dict({'redis': {'url': redis_url}, 'llm': [
        {'name': 'A', 'model': 'x'}]})['A'].history(unique)] == ['slow', results[0]['text']]
    provider.latency = 0
    assert registry['A'].invoke('fast')['model'] == 'model-b'
    registry.close()


def test_a_reload_never_changes_a_live_connection(tmp_path, provider, redis_url):
    path = tmp_path / 'llm.yaml'
    chat_config(path, provider, redis_url, skills_dir='skills-one')
    registry = Registry.from_file(path)
    before = registry['A']
    skills_before = before.skills
    chat_config(path, provider, redis_url, skills_dir='skills-two')
    registry.reload()
    assert before.skills is skills_before and registry['A'] is not before
    assert registry['A'].skills.directory.name == 'skills-two'
    assert before.closed                        # nothing was running on it
    chat_config(path, provider, redis_url, skills_dir='skills-two')
    kept = registry['A']
    registry.reload()
    assert registry['A'] is kept and not kept.closed
    registry.close()


def test_a_stream_created_before_reload_keeps_its_connection_until_it_ends(tmp_path, provider, redis_url):
    path = tmp_path / 'llm.yaml'
    chat_config(path, provider, redis_url)
    registry = Registry.from_file(path)
    old = registry['A']
    events = old.stream('streamed')
    unused = old.stream('never read')
    chat_config(path, provider, redis_url, model='model-b')
    registry.reload()
    assert not old.closed
    assert list(events)[-1].result['model'] == 'model-a'
    assert not old.closed                       # the unread stream still counts
    del unused
    assert old.closed
    registry.close()
