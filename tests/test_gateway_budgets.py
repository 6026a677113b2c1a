"""One request cannot freeze a worker: budgets on its items and tools, schema checks cached and off the hub.

Checking a JSON Schema costs about 10 µs per byte, and a gateway process
serves every request on one gevent hub. So a request's tool schemas are
bounded in total (:data:`MAX_TOOL_SCHEMA_BYTES`), each schema is checked
once per process whatever tool name carries it, and the check runs in
gevent's thread pool, where ``/health`` keeps answering while it runs. Too
many input items or tools are a 400 before any of that work starts.
"""

from __future__ import annotations

import json
import threading
import time
import uuid

import jsonschema
import pytest
import requests

from gateway_stack import KEYS, GatewayStack
from llmconn.gateway import offload, shapes
from llmconn.gateway.tools import MAX_TOOL_SCHEMA_BYTES
from llmconn import tools as mod_tools

SECRET = KEYS['a'][0]
HEADERS = {'Authorization': f'Bearer {SECRET}'}


def heavy_schema(tag: str, properties: int) -> dict:
    """A schema that takes jsonschema long to check (nested objects of arrays), unique to ``tag``."""
    inner = {f'q{j}': {'type': 'array', 'items': {'type': 'integer', 'minimum': 0}} for j in range(10)}
    return {'type': 'object', 'description': tag,
            'properties': {f'{tag}_{i}': {'type': 'object', 'properties': inner} for i in range(properties)}}


def test_a_schema_is_checked_once_whatever_tool_carries_it(monkeypatch):
    checks = []
    real = jsonschema.Draft202012Validator.check_schema
    monkeypatch.setattr(jsonschema.Draft202012Validator, 'check_schema',
                        classmethod(lambda cls, schema, **kw: checks.append(1) or real(schema, **kw)))
    schema = heavy_schema(uuid.uuid4().hex, 3)
    for name in ('first', 'second', 'third'):
        mod_tools.prepare([mod_tools.Tool(name=name, parameters=json.loads(json.dumps(schema)))])
    assert len(checks) == 1


def test_an_invalid_schema_is_refused_under_each_name_it_comes_with():
    schema = {'type': 'object', 'properties': {'x': {'type': 'no-such-type'}}, 'description': uuid.uuid4().hex}
    for name in ('one', 'two'):
        with pytest.raises(mod_tools.InvalidInput, match=f'tool "{name}": parameters is not a valid JSON Schema'):
            mod_tools.prepare([mod_tools.Tool(name=name, parameters=schema)])


def test_outside_a_gevent_server_the_work_runs_in_place():
    assert offload.run(lambda a, b: (a, b, threading.current_thread()), 1, 2) == (1, 2, threading.current_thread())
    with pytest.raises(ZeroDivisionError):
        offload.run(lambda: 1 / 0)


@pytest.fixture(scope='module')
def gw():
    stack = GatewayStack(processes=1)
    yield stack
    stack.close()


def _tools(tag: str, count: int, properties: int) -> list[dict]:
    return [{'type': 'function', 'name': f'tool_{i}', 'parameters': heavy_schema(f'{tag}{i}', properties)}
            for i in range(count)]


def _health_while(gw, work) -> tuple[int, float, float]:
    """(how many /health answers came while ``work`` ran, the slowest of them, how long ``work`` took)."""
    done = threading.Event()
    took = []

    def run():
        started = time.monotonic()
        work()
        took.append(time.monotonic() - started)
        done.set()

    thread = threading.Thread(target=run)
    thread.start()
    slowest, answered = 0.0, 0
    while not done.is_set():
        started = time.monotonic()
        requests.get(gw.url().removesuffix('/v1') + '/health', timeout=30)
        slowest, answered = max(slowest, time.monotonic() - started), answered + 1
        done.wait(0.05)
    thread.join()
    return answered, slowest, took[0]


def test_health_answers_while_large_tool_schemas_are_checked(gw):
    tools = _tools(uuid.uuid4().hex[:8], 2, 45)       # about 2 x 33 KB, never seen by this process
    assert len(json.dumps(tools)) < MAX_TOOL_SCHEMA_BYTES
    answers = []
    answered, slowest, took = _health_while(gw, lambda: answers.append(requests.post(
        f'{gw.url()}/responses', json={'model': 'Chat', 'input': 'hi', 'tools': tools}, headers=HEADERS,
        timeout=120)))
    assert answers[0].status_code == 200, answers[0].text
    # The check holds the request for seconds. On the hub it held /health as long: one answer at most
    # while it ran. Off the hub /health keeps answering, each time in a slice of it (the bounds are
    # relative, so a loaded machine, which slows both, does not fail them).
    # About 0.6 s on a quiet machine, seconds on a loaded one: long enough to poll /health several times.
    assert took > 0.25, f'the schemas took only {took:.2f} s to check: too light to tell anything'
    assert answered >= 3 and slowest < took / 2, f'/health answered {answered} times while the request took ' \
        f'{took:.2f} s, the slowest in {slowest:.2f} s'
    started = time.monotonic()
    again = requests.post(f'{gw.url()}/responses', json={'model': 'Chat', 'input': 'hi', 'tools': tools},
                          headers=HEADERS, timeout=120)
    assert again.status_code == 200 and time.monotonic() - started < took / 3      # checked once per process


def test_tool_schemas_past_the_budget_are_refused_before_they_are_checked(gw):
    tools = _tools(uuid.uuid4().hex[:8], 5, 80)       # each under the per-tool limit, together over budget
    before = len(gw.fake.requests)
    started = time.monotonic()
    answer = requests.post(f'{gw.url()}/chat/completions', headers=HEADERS, timeout=60, json={
        'model': 'Chat', 'messages': [{'role': 'user', 'content': 'hi'}],
        'tools': [{'type': 'function', 'function': {k: v for k, v in t.items() if k != 'type'}} for t in tools]})
    assert answer.status_code == 400 and answer.json()['error']['code'] == 'tools_too_large', answer.text
    assert time.monotonic() - started < 1.0         # no schema was checked: that alone would take seconds
    assert len(gw.fake.requests) == before


def test_more_tools_than_the_limit_are_refused(gw):
    tools = [{'type': 'function', 'name': f't{i}'} for i in range(shapes.MAX_TOOLS + 1)]
    answer = requests.post(f'{gw.url()}/responses', headers=HEADERS, timeout=30,
                           json={'model': 'Chat', 'input': 'hi', 'tools': tools})
    assert answer.status_code == 400 and answer.json()['error']['param'] == 'tools'


@pytest.mark.parametrize('route, field', [('responses', 'input'), ('chat/completions', 'messages')])
def test_three_hundred_thousand_tiny_items_are_refused_fast(gw, route, field):
    body = json.dumps({'model': 'Chat', field: [{'role': 'user', 'content': 'a'}] * 300_000})
    before, answers = len(gw.fake.requests), []
    _, _, took = _health_while(gw, lambda: answers.append(requests.post(
        f'{gw.url()}/{route}', data=body, headers=dict(HEADERS, **{'Content-Type': 'application/json'}),
        timeout=60)))
    answer = answers[0]
    assert answer.status_code == 400, answer.text
    error = answer.json()['error']
    assert error['param'] == field and error['code'] == 'too_many_items' and '300000' in error['message']
    # Parsing the body is all the work left (about 0.3 s on a quiet machine; the items cost 10 s before).
    assert took < 8.0 and len(gw.fake.requests) == before

