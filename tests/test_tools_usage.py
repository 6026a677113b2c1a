"""A tool turn's usage is the exact sum of its provider rounds: in the result, the ledger and over HTTP.

The provider is a scripted server answering Claude's wire format with
usage figures this module chose, so every expected number is known here
and not derived from the code under test: a turn that kept only its last
round's tokens (``=`` for ``+=``) reads 23/5 where the contract says 34/12.
The gateway answers each round as a response of its own (the client runs
the function), so there each response carries its round and the usage
ledger the sum over the round trip.
"""

from __future__ import annotations

import json
import re

import pytest
import requests

from conftest import free_port
from llmconn.demo import start_server, stop
from llmconn.usage_report import read_usage
from tools_helpers import get_order

ROUNDS = ((11, 7), (23, 5))         # (input, output) tokens of round one (the call) and round two (the answer)
SUM = {'input_tokens': 34, 'output_tokens': 12}


def claude_message(content: list, stop: str, tokens: tuple) -> bytes:
    return json.dumps({'id': 'msg_1', 'type': 'message', 'role': 'assistant', 'model': 'claude-sonnet-5-5',
                       'content': content, 'stop_reason': stop, 'stop_sequence': None,
                       'usage': {'input_tokens': tokens[0], 'output_tokens': tokens[1]}}).encode()


def tool_turn_script() -> list:
    """Round one asks for get_order, round two answers with its output."""
    call = {'type': 'tool_use', 'id': 'toolu_1', 'name': 'get_order', 'input': {'order_id': '123'}}
    headers = {'Content-Type': 'application/json'}
    return [(200, headers, claude_message([call], 'tool_use', ROUNDS[0])),
            (200, headers, claude_message([{'type': 'text', 'text': 'it shipped'}], 'end_turn', ROUNDS[1]))]


def claude_stream(content_text: str, tokens: tuple, call: dict | None = None) -> list:
    """The same answers as Server-Sent Events, in pieces."""
    def event(name, data):
        return f'event: {name}\ndata: {json.dumps(data)}\n\n'.encode()
    start = {'type': 'message_start', 'message': {'id': 'msg_1', 'type': 'message', 'role': 'assistant',
                                                  'model': 'claude-sonnet-5-5', 'content': [], 'stop_reason': None,
                                                  'usage': {'input_tokens': tokens[0], 'output_tokens': 1}}}
    if call:
        block = {'type': 'tool_use', 'id': call['id'], 'name': call['name'], 'input': {}}
        delta = {'type': 'input_json_delta', 'partial_json': json.dumps(call['input'])}
    else:
        block, delta = {'type': 'text', 'text': ''}, {'type': 'text_delta', 'text': content_text}
    return [event('message_start', start),
            event('content_block_start', {'type': 'content_block_start', 'index': 0, 'content_block': block}),
            event('content_block_delta', {'type': 'content_block_delta', 'index': 0, 'delta': delta}),
            event('content_block_stop', {'type': 'content_block_stop', 'index': 0}),
            event('message_delta', {'type': 'message_delta', 'delta': {'stop_reason': 'tool_use' if call else
                                                                       'end_turn', 'stop_sequence': None},
                                    'usage': {'output_tokens': tokens[1]}}),
            event('message_stop', {'type': 'message_stop'})]


@pytest.fixture
def conn(server, redis_url, unique, open_registry):
    registry = open_registry({'redis': {'url': redis_url}, 'llm': [
        {'name': unique, 'provider': 'claude', 'model': 'claude-sonnet-5-5', 'address': server.url,
         'max_retries': 0}]})
    return registry[unique], registry


@pytest.mark.parametrize('method', ['chat', 'invoke'])
def test_a_two_round_tool_turn_reports_the_sum_of_both_rounds(server, conn, unique, method):
    conn, registry = conn
    server.script = tool_turn_script()
    call = conn.chat if method == 'chat' else conn.invoke
    reply = call('where is order 123?', tools=[get_order], **({'chat_id': 'ann'} if method == 'chat' else {}))
    assert reply['rounds'] == 2 and reply['text'] == 'it shipped'
    assert {k: reply['usage'][k] for k in SUM} == SUM
    registry.usage.flush()
    rows = read_usage(registry.store, connection=unique)
    assert [(r['calls'], r['input_tokens'], r['output_tokens'], r['tool_calls']) for r in rows] == [(1, 34, 12, 1)]


def test_a_streamed_tool_turn_reports_the_sum_of_both_rounds(server, conn):
    conn, _ = conn
    call = {'id': 'toolu_1', 'name': 'get_order', 'input': {'order_id': '123'}}
    sse = {'Content-Type': 'text/event-stream'}
    server.script = [(200, sse, claude_stream('', ROUNDS[0], call)),
                     (200, sse, claude_stream('it shipped', ROUNDS[1]))]
    done = [e for e in conn.stream('where is order 123?', chat_id='ann', tools=[get_order]) if e.type == 'done']
    assert {k: done[0].result['usage'][k] for k in SUM} == SUM


SERVICE = '''
from llmconn.service import Service


def get_order(order_id: str) -> str:
    """Look up an order by its id."""
    return {'123': 'shipped'}[order_id]


class Orders(Service):
    name = 'test.orders'

    def handle(self):
        reply = self.llm['Support'].chat('where is order 123?', chat_id='ann', tools=[get_order])
        self.response.payload = {'usage': reply['usage'], 'rounds': reply['rounds']}
'''


def test_a_served_tool_turn_answers_and_logs_the_sum_of_both_rounds(server, tmp_path):
    services = tmp_path / 'services'
    services.mkdir()
    (services / 'orders.py').write_text(SERVICE)
    config = tmp_path / 'llm.yaml'
    config.write_text(f'redis:\n  url: memory://\nllm:\n  - name: Support\n    provider: claude\n'
                      f'    model: claude-sonnet-5-5\n    address: {server.url}\n    max_retries: 0\n')
    server.script = tool_turn_script()
    port, log = free_port(), tmp_path / 'server.log'
    with open(log, 'w') as err:
        proc = start_server(config, services, port, stderr=err)
        try:
            answer = requests.post(f'http://127.0.0.1:{port}/test.orders', json={}, timeout=30).json()
        finally:
            stop(proc)
    assert answer['rounds'] == 2 and {k: answer['usage'][k] for k in SUM} == SUM
    assert re.search(r'POST /test.orders 200 .* tokens=34/12$', log.read_text(), re.M)


GATEWAY_TOOL = {'type': 'function', 'name': 'get_order', 'description': 'Look up an order by its id.',
                'parameters': {'type': 'object', 'properties': {'order_id': {'type': 'string'}}}}


def test_a_gateway_tool_round_trip_bills_each_round_and_the_ledger_their_sum(server, tmp_path, redis_url, unique):
    from openai import OpenAI

    from llmconn.store import open_store
    from waiting import wait_until
    services = tmp_path / 'services'
    services.mkdir()
    config = tmp_path / 'llm.yaml'
    config.write_text(f'redis:\n  url: {redis_url}\ngateway:\n  keys:\n    - {{id: {unique}, secret: sk-{unique}, '
                      f'tenant: t, models: ["*"]}}\nllm:\n  - name: {unique}\n    provider: claude\n'
                      f'    model: claude-sonnet-5-5\n    address: {server.url}\n    max_retries: 0\n')
    server.script = tool_turn_script()
    port = free_port()
    proc = start_server(config, services, port)
    store = open_store(redis_url)
    try:
        client = OpenAI(base_url=f'http://127.0.0.1:{port}/v1', api_key=f'sk-{unique}', max_retries=0)
        first = client.responses.create(model=unique, input='where is order 123?', tools=[GATEWAY_TOOL])
        call = next(item for item in first.output if item.type == 'function_call')
        second = client.responses.create(model=unique, previous_response_id=first.id, tools=[GATEWAY_TOOL], input=[
            {'type': 'function_call_output', 'call_id': call.call_id, 'output': 'shipped'}])
        assert second.output_text == 'it shipped'
        assert [(r.usage.input_tokens, r.usage.output_tokens) for r in (first, second)] == list(ROUNDS)

        def counted():
            rows = [r for r in read_usage(store, connection=unique) if r['key'] == unique]
            return rows if sum(r['calls'] for r in rows) >= 2 else None
        rows = wait_until(counted, 'the server wrote both calls to the ledger')
        assert (sum(r['input_tokens'] for r in rows), sum(r['output_tokens'] for r in rows)) == (34, 12)
    finally:
        store.close()
        stop(proc)
