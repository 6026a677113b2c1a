"""Function calls counted per response, per tenant and per key, exactly once, after real round trips.

Each round trip is a response that makes one call and a response that
answers it; the first must count one function call in its record's
``counts``, in the gateway's daily counters of its tenant, key and model,
and in the usage ledger ``llmconn usage --json`` reads, and the second none.
The stack is this module's own, so its Redis holds only these counts.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gateway_stack import GatewayStack

ROOT = Path(__file__).resolve().parent.parent
TOOL = {'type': 'function', 'name': 'get_order', 'parameters': {'type': 'object', 'properties': {}}}
CHAT_TOOL = {'type': 'function', 'function': {'name': 'get_order', 'parameters': TOOL['parameters']}}
ASK = 'call get_order {"order_id": "A-17"}'
FLUSH_WAIT = 15         # seconds; the server flushes its usage tally about every second


@pytest.fixture(scope='module')
def gw():
    stack = GatewayStack(processes=1)
    yield stack
    stack.close()


def usage_rows(gw, connection: str, key_id: str, calls: int) -> list[dict]:
    """``llmconn usage --json`` rows of one connection and key, once the server flushed ``calls`` calls."""
    deadline = time.monotonic() + FLUSH_WAIT
    while True:
        answer = subprocess.run([sys.executable, '-m', 'llmconn', 'usage', '--json', '--connection', connection,
                                 '--config', str(gw.config)], capture_output=True, text=True, timeout=60,
                                env=dict(os.environ, PYTHONPATH=str(ROOT)))
        assert answer.returncode == 0, answer.stderr
        rows = [r for r in json.loads(answer.stdout) if r['key'] == key_id]
        if sum(r['calls'] for r in rows) >= calls or time.monotonic() > deadline:
            return rows
        time.sleep(0.2)


def round_trip(client, model: str, stream: bool) -> tuple[str, str]:
    """A response making one call, then the one answering it: their ids."""
    def create(**kw):
        if not stream:
            return client.responses.create(**kw)
        with client.responses.stream(**kw) as events:
            return events.get_final_response()
    first = create(model=model, input=ASK, tools=[TOOL])
    call = next(i for i in first.output if i.type == 'function_call')
    second = create(model=model, previous_response_id=first.id, tools=[TOOL], input=[
        {'type': 'function_call_output', 'call_id': call.call_id, 'output': 'shipped'}])
    assert second.output_text == 'tool said: shipped'
    return first.id, second.id


@pytest.mark.parametrize('model, key, stream', [('Chat', 'a', False), ('Claude', 'b', True)])
def test_a_round_trip_counts_its_one_function_call_once_everywhere(gw, model, key, stream):
    first, second = round_trip(gw.client(key), model, stream)
    assert gw.record(key, first)['counts']['function_calls'] == 1
    assert gw.record(key, second)['counts']['function_calls'] == 0
    rows = usage_rows(gw, model, f'key-{key}', calls=2)
    assert sum(r['calls'] for r in rows) == 2
    assert sum(r['tool_calls'] for r in rows) == 1


def test_chat_completions_count_their_tool_calls_too(gw):
    client = gw.client('b')
    messages = [{'role': 'user', 'content': ASK}]
    completion = client.chat.completions.create(model='Chat', messages=messages, tools=[CHAT_TOOL])
    (call,) = completion.choices[0].message.tool_calls
    client.chat.completions.create(model='Chat', tools=[CHAT_TOOL], messages=messages + [
        completion.choices[0].message.model_dump(exclude_none=True),
        {'role': 'tool', 'tool_call_id': call.id, 'content': 'shipped'}])
    rows = usage_rows(gw, 'Chat', 'key-b', calls=2)
    assert sum(r['tool_calls'] for r in rows) == 1
