"""A running gateway for tests: its own redis-server, the fake provider, two ``llmconn serve`` processes.

Both processes read the same llm.yaml and share the Redis, so a test can
create a response on one and continue it on the other. Clients are the
official ``openai`` SDK. The Redis is this stack's alone, so a test may scan
all of it (zero retention leaves no prompt text anywhere).
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import redis
from openai import OpenAI
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from conftest import RedisServer, free_port
from llmconn.demo import start_server, stop
from llmconn.store import open_store
from llmconn.store.records import response_key
from llmconn.usage_keys import COUNTERS, ERROR_PREFIX
from llmconn.usage_report import read_usage
from llmconn.testing.fake_server import FakeProviderServer

KEYS = {
    # name: (secret, tenant, retention, models, hosted_tools)
    'a': ('sk-gw-tenant-a-secret', 'tenant-a', 'standard', ['*'], []),
    'a_claude_only': ('sk-gw-tenant-a-claude', 'tenant-a', 'standard', ['Claude'], []),
    'a_search': ('sk-gw-tenant-a-search', 'tenant-a', 'standard', ['*'], ['web_search']),
    'b': ('sk-gw-tenant-b-secret', 'tenant-b', 'standard', ['*'], []),
    'zero': ('sk-gw-tenant-z-secret', 'tenant-z', 'zero', ['*'], []),
}
# Connection name -> provider kind; every kind the gateway maps, Responses in both state modes.
BACKENDS = {'Claude': 'claude', 'Chat': 'openai', 'Responses': 'openai-responses',
            'ResponsesLocal': 'openai-responses', 'Gemini': 'gemini'}


def _config(fake_url: str, redis_url: str, extra_llm: str = '') -> str:
    """The stack's llm.yaml; ``extra_llm`` adds connections (FAKE_URL in it: the fake provider's address)."""
    keys = ''.join(f'''
    - {{id: key-{name}, secret: {secret}, tenant: {tenant}, retention: {retention},
       models: {json.dumps(models)}, hosted_tools: {json.dumps(tools)}}}'''
                   for name, (secret, tenant, retention, models, tools) in KEYS.items())
    return f'''
redis: {{url: "{redis_url}"}}
gateway:
  response_expiry: 300
  keys:{keys}
llm:
  - {{name: Claude, provider: claude, model: claude-sonnet-5-5, address: "{fake_url}", max_tokens: 2048,
     thinking: {{type: enabled, budget_tokens: 1024}}, max_retries: 0}}
  - {{name: Chat, provider: openai, model: gpt-4.1, address: "{fake_url}/v1", max_retries: 0}}
  - {{name: Responses, provider: openai-responses, model: gpt-5, address: "{fake_url}/v1", state: provider,
     max_retries: 0}}
  - {{name: ResponsesLocal, provider: openai-responses, model: gpt-5, address: "{fake_url}/v1", max_retries: 0}}
  - {{name: Gemini, provider: gemini, model: gemini-2.5-flash, address: "{fake_url}/v1beta", max_retries: 0}}
{extra_llm.replace('FAKE_URL', fake_url)}'''


STREAM_EVENT = TypeAdapter(ResponseStreamEvent)

# A function tool in the Responses shape, and a message that makes the fake provider call it.
ORDER_TOOL = {'type': 'function', 'name': 'get_order', 'description': 'Look an order up',
              'parameters': {'type': 'object', 'properties': {'order_id': {'type': 'string'}},
                             'required': ['order_id']}}
ASK = 'call get_order {"order_id": "A-17"}'


def reasoning_params(model: str) -> dict:
    """The request's reasoning for a Responses backend; Claude's thinking is its connection's."""
    return {'reasoning': {'effort': 'low', 'summary': 'auto'}} if model.startswith('Responses') else {}


def create(client, **kw) -> Response:
    """A Response, validated by the SDK's own type from the raw body (not the SDK's lenient parse)."""
    raw = client.responses.with_raw_response.create(**kw)
    return Response.model_validate(raw.http_response.json())


def streamed(client, **kw) -> tuple[list[dict], Response]:
    """A streamed response's events, each validated as an SDK stream event, and its final Response.

    The SDK's own accumulation of the events must give the same output as the completed event.
    """
    events = []
    with client.responses.stream(**kw) as stream:
        for event in stream:
            data = event.model_dump(mode='json', warnings=False)
            STREAM_EVENT.validate_python(data)
            events.append(data)
        accumulated = stream.get_final_response()
    assert accumulated.model_dump(mode='json', warnings=False)['output'] == events[-1]['response']['output']
    return events, Response.model_validate(events[-1]['response'])


USAGE_WAIT = 10.0       # the servers write their usage counts in batches, about once a second


def gateway_usage(stack, pair: tuple) -> dict:
    """What the usage ledger holds for (gateway key id, connection): its counters and ``error:<status>``."""
    key_id, connection = pair
    store = open_store(stack.redis_server.url)
    try:
        rows = [r for r in read_usage(store, connection=connection) if r['key'] == key_id]
    finally:
        store.close()
    counts = {c: sum(r[c] for r in rows) for c in COUNTERS}
    for row in rows:
        for status, n in row['errors_by_status'].items():
            counts[ERROR_PREFIX + status] = counts.get(ERROR_PREFIX + status, 0) + n
    return {name: n for name, n in counts.items() if n}


def quiet_usage(stack, pair: tuple) -> dict:
    """The usage of (key id, connection) once no batch of an earlier request is still on its way."""
    counts = gateway_usage(stack, pair)
    while True:
        time.sleep(1.5)         # longer than a server's flush interval
        again = gateway_usage(stack, pair)
        if again == counts:
            return counts
        counts = again


def settled_usage(stack, pair: tuple, ready) -> dict:
    """The usage of (key id, connection), once ``ready(counts)`` holds (or what it is at the wait's end)."""
    deadline = time.monotonic() + USAGE_WAIT
    while True:
        counts = gateway_usage(stack, pair)
        if ready(counts) or time.monotonic() > deadline:
            return counts
        time.sleep(0.05)


class GatewayStack:
    def __init__(self, processes: int = 2, extra_llm: str = '') -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix='gateway-'))
        self.redis_server = RedisServer().start()
        self.fake = FakeProviderServer().start()
        (self.tmp / 'services').mkdir()
        self.config = self.tmp / 'llm.yaml'
        self.config.write_text(_config(self.fake.url, self.redis_server.url, extra_llm))
        self.ports = [free_port() for _ in range(processes)]
        self.procs = []
        try:
            for port in self.ports:
                self.procs.append(start_server(self.config, self.tmp / 'services', port))
        except BaseException:
            self.close()
            raise
        self.redis = redis.Redis.from_url(self.redis_server.url)

    def url(self, process: int = 0) -> str:
        return f'http://127.0.0.1:{self.ports[process]}/v1'

    def client(self, key: str = 'a', process: int = 0) -> OpenAI:
        secret = KEYS[key][0] if key in KEYS else key
        return OpenAI(base_url=self.url(process), api_key=secret, max_retries=0, timeout=20)

    def record(self, key: str, response_id: str) -> dict | None:
        raw = self.redis.get(response_key(KEYS[key][1], response_id))
        return json.loads(raw) if raw else None

    def redis_text(self) -> str:
        """Every key and value in the stack's Redis, as one string to search."""
        parts = []
        for name in self.redis.scan_iter(count=1000):
            kind = self.redis.type(name).decode()
            parts.append(name.decode('utf-8', 'replace'))
            if kind == 'string':
                parts.append(self.redis.get(name).decode('utf-8', 'replace'))
            elif kind == 'hash':
                parts += [x.decode('utf-8', 'replace') for kv in self.redis.hgetall(name).items() for x in kv]
            elif kind == 'list':
                parts += [x.decode('utf-8', 'replace') for x in self.redis.lrange(name, 0, -1)]
            elif kind in ('set', 'zset'):
                members = self.redis.smembers(name) if kind == 'set' else self.redis.zrange(name, 0, -1)
                parts += [x.decode('utf-8', 'replace') for x in members]
            else:
                parts.append(repr(self.redis.dump(name)))
        return '\n'.join(parts)

    def close(self) -> None:
        for proc in self.procs:
            stop(proc)
        self.fake.stop()
        self.redis_server.stop()
