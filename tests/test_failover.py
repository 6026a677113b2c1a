"""Failover across connections (``fallbacks:``): a real Redis, the fake provider over HTTP.

Every connection here talks to the one fake provider, each through its own
wire format (so the recorded paths tell who was asked), and the fake's
scripted faults make the first request(s) fail: 500, 429, a hang past the
connection's timeout; a closed port refuses connections.
"""

from __future__ import annotations

import json
import logging
import threading

import pytest

from llmconn import Attachment, ChatBusy, ConfigError, LLMError, observe
from llmconn.config import load_dict
from llmconn.store.keys import chat_keys
from llmconn.admin_page import usage_table
from llmconn.usage_report import format_table, read_usage
from conftest import free_port
from waiting import wait_until

CLAUDE, CHAT, RESPONSES, GEMINI = '/v1/messages', '/v1/chat/completions', '/v1/responses', '/v1beta/models'
THINKING = {'type': 'enabled', 'budget_tokens': 1024}


def conns(url, unique, primary='claude', **fields):
    """Primary (``<unique>-p``) with fallbacks Chat then Gemini, unless ``fields`` say otherwise."""
    first = {'name': f'{unique}-p', 'provider': primary, 'model': 'claude-sonnet-5-5' if primary == 'claude'
             else 'gpt-4.1', 'address': url if primary == 'claude' else url + '/v1', 'max_retries': 0,
             'fallbacks': [f'{unique}-chat', f'{unique}-gemini'], **fields}
    return [first,
            {'name': f'{unique}-chat', 'provider': 'openai', 'model': 'gpt-4.1', 'address': url + '/v1',
             'max_retries': 0},
            {'name': f'{unique}-gemini', 'provider': 'gemini', 'model': 'gemini-2.5-flash',
             'address': url + '/v1beta', 'max_retries': 0}]


@pytest.fixture
def make(redis_url, provider, unique, open_registry):
    def make(llm=None, **fields):
        return open_registry({'redis': {'url': redis_url}, 'llm': llm or conns(provider.url, unique, **fields)})

    return make


def paths(provider):
    return [r['path'].split(':')[0].rsplit('/', 1)[0] if r['path'].startswith(GEMINI) else r['path']
            for r in provider.requests]


# ---- what fails over, and what does not


@pytest.mark.parametrize('status', [500, 503, 529, 429])
def test_a_5xx_or_429_fails_over_and_the_result_names_who_answered(make, provider, unique, status):
    registry = make()
    provider.fail(status, count=1)
    result = registry[f'{unique}-p'].invoke('hello')
    assert result['connection'] == f'{unique}-chat'
    assert result['text'].startswith('echo: hello')
    assert paths(provider) == [CLAUDE, CHAT]


def test_the_connections_own_retries_come_first(make, provider, unique):
    registry = make(max_retries=1)
    provider.fail(429, count=2, headers={'retry-after-ms': '1'})
    assert registry[f'{unique}-p'].invoke('hello')['connection'] == f'{unique}-chat'
    assert paths(provider) == [CLAUDE, CLAUDE, CHAT]


def test_a_refused_connection_fails_over(make, provider, unique):
    registry = make(address=f'http://127.0.0.1:{free_port()}')
    assert registry[f'{unique}-p'].invoke('hello')['connection'] == f'{unique}-chat'
    assert paths(provider) == [CHAT]


def test_a_timeout_fails_over(make, provider, unique):
    registry = make(timeout=0.3)
    provider.hang(5.0, count=1)
    assert registry[f'{unique}-p'].invoke('hello')['connection'] == f'{unique}-chat'
    assert paths(provider) == [CLAUDE, CHAT]


@pytest.mark.parametrize('status', [400, 401, 404, 422])
def test_a_4xx_other_than_429_does_not_fail_over(make, provider, unique, status):
    registry = make()
    provider.fail(status, count=1)
    with pytest.raises(LLMError) as info:
        registry[f'{unique}-p'].invoke('hello')
    assert info.value.status == status and info.value.connection == f'{unique}-p'
    assert paths(provider) == [CLAUDE]


def test_each_fallback_is_tried_in_order_and_the_last_failure_is_raised(make, provider, unique):
    registry = make()
    provider.fail(500, count=2)
    assert registry[f'{unique}-p'].invoke('hello')['connection'] == f'{unique}-gemini'
    provider.clear()
    provider.fail(502, count=3)
    with pytest.raises(LLMError) as info:
        registry[f'{unique}-p'].invoke('hello')
    assert info.value.status == 502 and info.value.connection == f'{unique}-gemini'
    assert paths(provider) == [CLAUDE, CHAT, GEMINI]


def test_a_fallbacks_own_fallbacks_follow_it(make, provider, unique):
    llm = conns(provider.url, unique, fallbacks=[f'{unique}-chat'])
    llm[1]['fallbacks'] = [f'{unique}-gemini']
    registry = make(llm)
    provider.fail(500, count=2)
    assert registry[f'{unique}-p'].invoke('hello')['connection'] == f'{unique}-gemini'
    assert paths(provider) == [CLAUDE, CHAT, GEMINI]


def test_a_stream_fails_over_before_its_first_event(make, provider, unique):
    registry = make()
    provider.fail(500, count=1)
    events = list(registry[f'{unique}-p'].stream('hello there'))
    assert ''.join(e.text for e in events if e.type == 'text').startswith('echo: hello there')
    assert events[-1].type == 'done' and events[-1].result['connection'] == f'{unique}-chat'
    assert [r['body'].get('stream') for r in provider.requests] == [True, True]


def test_a_stream_that_breaks_after_its_first_event_does_not_fail_over(make, provider, unique):
    registry = make()
    provider.fail_stream('break', count=1)
    got = []
    with pytest.raises(LLMError):
        for event in registry[f'{unique}-p'].stream('hello there', chat_id='s'):
            got.append(event)
    assert got and got[0].type == 'text'      # part of the answer had reached the caller
    assert paths(provider) == [CLAUDE]
    assert registry[f'{unique}-p'].history('s') == []


def test_a_stream_left_after_a_failover_frees_the_chat_and_the_fallback(make, provider, unique, redis_client):
    registry = make()
    primary, fallback = registry[f'{unique}-p'], registry[f'{unique}-chat']
    provider.fail(500, count=1)
    events = primary.stream('a long answer please', chat_id='left')
    assert next(events).type == 'text'
    assert fallback.calls.count == 1 and primary.calls.count == 1
    events.close()
    assert fallback.calls.count == 0 and primary.calls.count == 0
    assert not redis_client.exists(chat_keys(primary.name, 'left').lock)
    assert primary.history('left') == []


def test_an_inactive_fallback_is_skipped(make, provider, unique):
    llm = conns(provider.url, unique)
    llm[1]['is_active'] = False
    registry = make(llm)
    provider.fail(500, count=1)
    assert registry[f'{unique}-p'].invoke('hello')['connection'] == f'{unique}-gemini'


def test_a_fallback_that_cannot_take_the_attachment_is_skipped(make, provider, unique):
    # Chat Completions takes only images by URL; Gemini takes a PDF by URL.
    registry = make()
    provider.fail(500, count=1)
    pdf = Attachment.from_url('https://example.com/invoice.pdf')
    result = registry[f'{unique}-p'].invoke('what is this?', attachments=[pdf])
    assert result['connection'] == f'{unique}-gemini'
    assert paths(provider) == [CLAUDE, GEMINI]


def test_a_fallback_without_tools_or_a_schema_is_skipped(make, provider, unique):
    template = {'name': f'{unique}-template', 'provider': 'template', 'model': 'agent', 'max_retries': 0,
                'address': provider.url + '/v1/chat/completions',
                'request_template': '{"model": {{ model_info.model_key | tojson }}, '
                                    '"messages": {{ input.messages | tojson }}}',
                'response_template': '{{ body }}'}
    llm = conns(provider.url, unique, fallbacks=[f'{unique}-template', f'{unique}-chat'])
    registry = make(llm + [template])

    def get_order(order_id: str) -> str:
        """Look an order up."""
        return 'shipped'

    provider.fail(500, count=1)
    assert registry[f'{unique}-p'].invoke('hello', tools=[get_order])['connection'] == f'{unique}-chat'
    provider.fail(500, count=1)
    schema = {'type': 'object', 'properties': {'answer': {'type': 'string'}}, 'required': ['answer'],
              'additionalProperties': False}
    assert registry[f'{unique}-p'].invoke('hello', schema=schema)['connection'] == f'{unique}-chat'
    assert paths(provider) == [CLAUDE, CHAT, CLAUDE, CHAT]


def test_a_tool_turn_whose_tools_ran_does_not_fail_over(make, provider, unique):
    runs = []

    def get_order(order_id: str) -> str:
        """Look an order up."""
        runs.append(order_id)
        return 'shipped'

    registry = make()
    original = registry[f'{unique}-p'].transport.post

    def fail_second_round(url, headers, body):
        if any(m['role'] == 'user' and isinstance(m['content'], list) and m['content'][0].get('type') ==
               'tool_result' for m in body['messages']):
            provider.fail(500, count=1)
        return original(url, headers, body)

    registry[f'{unique}-p'].transport.post = fail_second_round
    with pytest.raises(LLMError) as info:
        registry[f'{unique}-p'].invoke('call get_order {"order_id": "A-1"}', tools=[get_order])
    assert info.value.status == 500 and runs == ['A-1']
    assert paths(provider) == [CLAUDE, CLAUDE]


# ---- chats: one history, one lock, natives only to their own tag


def test_a_chat_goes_on_in_the_primarys_history(make, provider, unique):
    registry = make()
    primary, fallback = registry[f'{unique}-p'], registry[f'{unique}-chat']
    primary.chat('my name is Ann', chat_id='c')
    provider.fail(500, count=1)
    second = primary.chat('what is my name?', chat_id='c')
    assert second['connection'] == fallback.name
    assert second['text'] == 'echo: what is my name? | users: 2 | previous: my name is Ann | system: no'
    third = primary.chat('and now?', chat_id='c')
    assert third['connection'] == primary.name
    assert third['text'] == 'echo: and now? | users: 3 | previous: what is my name? | system: no'
    assert [m['content'] for m in primary.history('c')][3] == second['text']
    assert fallback.history('c') == []          # the chat is the primary's, whoever answered a turn


def test_the_fallback_answers_under_the_chats_one_lock(make, provider, unique, redis_client):
    registry = make(lock_wait=0)
    primary = registry[f'{unique}-p']
    lock_key = chat_keys(primary.name, 'c').lock
    seen = {}
    original = registry[f'{unique}-chat'].transport.post

    def while_answering(url, headers, body):
        seen['lock'] = redis_client.get(lock_key)
        with pytest.raises(ChatBusy):
            primary.chat('meanwhile', chat_id='c')          # the same chat is held throughout
        return original(url, headers, body)

    registry[f'{unique}-chat'].transport.post = while_answering
    provider.fail(500, count=1)
    assert primary.chat('hello', chat_id='c')['connection'] == f'{unique}-chat'
    assert seen['lock'] is not None
    assert not redis_client.exists(lock_key)
    assert not redis_client.exists(chat_keys(f'{unique}-chat', 'c').lock)
    assert len(primary.history('c')) == 2


def test_claude_thinking_goes_back_to_claude_only(make, provider, unique):
    llm = conns(provider.url, unique, thinking=THINKING, max_tokens=2048,
                fallbacks=[f'{unique}-responses'])
    llm.append({'name': f'{unique}-responses', 'provider': 'openai-responses', 'model': 'gpt-5',
                'address': provider.url + '/v1', 'max_retries': 0, 'params': {'reasoning': {'effort': 'low'}}})
    registry = make(llm)
    primary = registry[f'{unique}-p']
    first = primary.chat('think: one', chat_id='t')
    signature = first['raw']['content'][0]['signature']
    provider.fail(500, count=1)
    second = primary.chat('think: two', chat_id='t')
    assert second['connection'] == f'{unique}-responses' and second['raw']['output'][0]['type'] == 'reasoning'
    sent = next(r['body'] for r in provider.requests if r['path'] == RESPONSES)
    assert signature not in json.dumps(sent) and 'thinking' not in json.dumps(sent['input'])
    assert [i.get('role') for i in sent['input']] == ['user', 'assistant', 'user']
    assert first['text'] in json.dumps(sent['input'][1])
    # Back on Claude: its own block goes back signed (the fake refuses any other), the fallback's turn as text.
    third = primary.chat('three', chat_id='t')
    assert third['connection'] == primary.name and 'users: 3' in third['text']
    body = [r['body'] for r in provider.requests if r['path'] == CLAUDE][-1]
    said = [m['content'] for m in body['messages'] if m['role'] == 'assistant']
    assert said[0][0]['signature'] == signature
    assert said[1] == second['text']        # no Responses reasoning item in a Claude message


# ---- counted: metrics, the log, the ledger


class Recorder(observe.Observer):
    def __init__(self):
        self.failovers, self.done = [], []

    def failover(self, connection, fallback, reason):
        self.failovers.append((connection, fallback, reason))

    def call_done(self, connection, input_tokens, output_tokens, usage=None):
        self.done.append(connection)


@pytest.fixture
def recorder():
    recorder = Recorder()
    observe.install(recorder)
    yield recorder
    observe.install(None)


def test_metrics_and_the_log_count_each_failover_and_the_answering_connection(make, provider, unique, recorder,
                                                                              caplog):
    llm = conns(provider.url, unique)
    llm[1]['timeout'] = 0.3
    registry = make(llm)
    provider.fail(503, count=1)
    provider.hang(5.0, count=1)
    with caplog.at_level(logging.INFO, logger='llmconn.failover'):
        assert registry[f'{unique}-p'].invoke('hello')['connection'] == f'{unique}-gemini'
    assert recorder.failovers == [(f'{unique}-p', f'{unique}-chat', '503'),
                                  (f'{unique}-chat', f'{unique}-gemini', 'timeout')]
    assert recorder.done == [f'{unique}-gemini']
    lines = [r.getMessage() for r in caplog.records if r.name == 'llmconn.failover']
    assert lines == [f'Connection "{unique}-p" failed (HTTP 503) after its retries; the call fails over to '
                     f'"{unique}-chat"',
                     f'Connection "{unique}-chat" failed (timeout) after its retries; the call fails over to '
                     f'"{unique}-gemini"']


def _rows(registry, unique: str) -> dict:
    """The ledger's rows of this test's connections, by connection."""
    return {r['connection']: r for r in read_usage(registry.store) if r['connection'].startswith(unique)}


def test_the_ledger_counts_the_call_under_who_answered_and_the_failover_under_who_failed(make, provider, unique):
    registry = make()
    provider.fail(500, count=1)
    registry[f'{unique}-p'].chat('hello', chat_id='c')         # counted by the save script
    provider.fail(500, count=1)
    registry[f'{unique}-p'].invoke('hello')                    # counted by the flusher
    registry.usage.flush()

    wait_until(lambda: _rows(registry, unique).get(f'{unique}-p', {}).get('failovers') == 2,
               'both failovers in the ledger')
    by = _rows(registry, unique)
    assert by[f'{unique}-p']['failovers'] == 2 and by[f'{unique}-p']['calls'] == 0
    assert by[f'{unique}-chat']['calls'] == 2 and by[f'{unique}-chat']['errors'] == 0
    assert by[f'{unique}-chat']['input_tokens'] > 0
    table = format_table(list(by.values())).splitlines()
    header = table[0].split()
    assert header[header.index('ERRORS') + 1] == 'FAILOVERS'
    primary = next(line.split() for line in table if f'{unique}-p ' in line)
    assert primary[header.index('FAILOVERS')] == '2'
    assert 'FAILOVERS' not in format_table([by[f'{unique}-chat']])
    page = usage_table(list(by.values()))           # /admin's usage table, from the same rows
    assert '<th>Errors</th><th>Failovers</th>' in page and 'Failovers' not in usage_table([by[f'{unique}-chat']])


def test_a_call_no_fallback_answered_counts_as_a_failed_call_of_its_own_connection(make, provider, unique,
                                                                                   recorder):
    registry = make()
    provider.fail(502, count=3)
    with pytest.raises(LLMError):
        registry[f'{unique}-p'].invoke('hello')
    registry.usage.flush()

    wait_until(lambda: _rows(registry, unique).get(f'{unique}-p', {}).get('errors') == 1,
               'the failed call in the ledger')
    by = _rows(registry, unique)
    assert (by[f'{unique}-p']['calls'], by[f'{unique}-p']['failovers']) == (1, 1)
    assert by[f'{unique}-p']['errors_by_status'] == {'502': 1}
    assert (by[f'{unique}-chat']['calls'], by[f'{unique}-chat']['failovers']) == (0, 1)
    assert f'{unique}-gemini' not in by
    assert [f[:2] for f in recorder.failovers] == [(f'{unique}-p', f'{unique}-chat'), (f'{unique}-chat', f'{unique}-gemini')]


# ---- configuration


def conf(**primary):
    return {'llm': [{'name': 'A', 'model': 'gpt-4.1', **primary}, {'name': 'B', 'model': 'gpt-4.1'},
                    {'name': 'C', 'model': 'gpt-4.1', 'fallbacks': ['A']}]}


@pytest.mark.parametrize('fallbacks, words', [
    (['Nope'], "names 'Nope', which is not a connection"),
    (['A'], 'lists the connection itself'),
    (['C'], 'makes a cycle (A -> C -> A)'),
    ('B', 'must be a list of connection names'),
    ([['B']], 'must be a list of connection names'),
    (['B', 'B'], "names 'B' more than once"),
])
def test_bad_fallbacks_are_a_config_error_naming_connection_and_field(fallbacks, words):
    with pytest.raises(ConfigError) as info:
        load_dict(conf(fallbacks=fallbacks), source='llm.yaml')
    message = str(info.value)
    assert message.startswith('llm.yaml: connection "A": field "fallbacks"') and words in message


def test_a_ping_asks_only_its_own_provider(make, provider, unique):
    registry = make(address=f'http://127.0.0.1:{free_port()}')
    with pytest.raises(LLMError):
        registry[f'{unique}-p'].ping()
    assert paths(provider) == []


def test_a_reload_keeps_a_running_fallback_open(redis_url, provider, unique, tmp_path):
    import yaml
    from llmconn import Registry
    path = tmp_path / 'llm.yaml'
    llm = conns(provider.url, unique)
    path.write_text(yaml.safe_dump({'redis': {'url': redis_url}, 'llm': llm}))
    registry = Registry.from_file(path)
    try:
        fallback = registry[f'{unique}-chat']
        started, go = threading.Event(), threading.Event()
        original = fallback.transport.post

        def slow(url, headers, body):
            started.set()
            go.wait(10)
            return original(url, headers, body)

        fallback.transport.post = slow
        provider.fail(500, count=1)
        result = {}
        worker = threading.Thread(target=lambda: result.update(registry[f'{unique}-p'].invoke('hello')))
        worker.start()
        assert started.wait(10)
        llm[1]['timeout'] = 30              # the fallback is replaced by the reload
        path.write_text(yaml.safe_dump({'redis': {'url': redis_url}, 'llm': llm}))
        registry.reload()
        assert not fallback.closed          # its call is still running
        go.set()
        worker.join(10)
        assert result['connection'] == f'{unique}-chat' and fallback.closed
    finally:
        registry.close()


def test_a_provider_side_chain_is_not_continued_across_connections(make, provider, unique):
    # Both keep state at the provider; a turn the fallback answered has no chain the primary could continue.
    llm = [{'name': f'{unique}-p', 'provider': 'openai-responses', 'model': 'gpt-5', 'state': 'provider',
            'address': provider.url + '/v1', 'max_retries': 0, 'fallbacks': [f'{unique}-r2']},
           {'name': f'{unique}-r2', 'provider': 'openai-responses', 'model': 'gpt-5-mini', 'state': 'provider',
            'address': provider.url + '/v1', 'max_retries': 0}]
    registry = make(llm)
    primary = registry[f'{unique}-p']
    first = primary.chat('one', chat_id='c')
    provider.fail(500, count=1)
    second = primary.chat('two', chat_id='c')
    assert second['connection'] == f'{unique}-r2'
    third = primary.chat('three', chat_id='c')
    assert 'users: 3' in third['text']
    bodies = [r['body'] for r in provider.requests]
    assert bodies[1]['previous_response_id'] == first['response_id']        # the primary's own chain
    assert 'previous_response_id' not in bodies[2]          # the fallback is not handed the primary's
    # Back on the primary, the whole window goes again: not a chain through the fallback's response.
    assert 'previous_response_id' not in bodies[-1]
    assert [i['role'] for i in bodies[-1]['input'] if 'role' in i] == ['user', 'assistant'] * 2 + ['user']


def test_the_documented_failover_example_loads_and_fails_over(provider, redis_url, monkeypatch, open_registry):
    import yaml
    from pathlib import Path
    page = (Path(__file__).parent.parent / 'docs' / 'gateway.md').read_text()
    example = yaml.safe_load(page.split('## Failover', 1)[1].split('```yaml\n', 1)[1].split('```', 1)[0])
    for name in ('TEAM_A_GATEWAY_KEY', 'ANTHROPIC_API_KEY', 'OPENAI_API_KEY', 'GEMINI_API_KEY'):
        monkeypatch.setenv(name, f'sk-{name.lower()}-for-the-docs-test')
    addresses = {'claude': provider.url, 'openai': provider.url + '/v1', 'gemini': provider.url + '/v1beta'}
    for conn in example['llm']:             # the fake provider stands in for the three providers
        conn['address'] = addresses[load_dict({'llm': [dict(conn, fallbacks=[])]}).llm[0].provider]
    registry = open_registry(dict(example, redis={'url': redis_url}))
    support = registry['Support']
    assert support.conf.fallbacks == ('Support OpenAI', 'Support Gemini') and support.conf.max_retries == 2
    provider.fail(503, count=3, headers={'retry-after-ms': '1'})       # the retries first, then the fallback
    assert support.invoke('hello')['connection'] == 'Support OpenAI'
    provider.fail(503, count=6, headers={'retry-after-ms': '1'})     # and Support OpenAI's own
    assert support.invoke('hello')['connection'] == 'Support Gemini'
    assert support.invoke('hello')['connection'] == 'Support'
