"""A gateway call is observed like a library call: metrics, the access log, ``llmconn usage``, reloads.

One ``llmconn serve`` (its own redis-server, the fake provider, ``--log-format
json``) answers the same question asked three ways - the ``demo.llm.ask``
service (``Connection.invoke``), ``/v1/chat/completions`` and
``/v1/responses`` - and each must show up the same: in ``/metrics`` tokens
and error counters, in the access log with its connection and tokens, and
in the usage ledger ``llmconn usage`` prints. All three go through
``Connection.run``; the in-process tests check what a reload relies on
(a gateway stream counts as in flight) and that a stream whose backend
fails before its first event is recorded failed and counted.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import openai
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from conftest import RedisServer, free_port
from gateway_stack import quiet_usage, settled_usage
from waiting import wait_until
from llmconn.demo import start_server, stop
from llmconn.testing.fake_server import FakeProviderServer

ROOT = Path(__file__).resolve().parent.parent
KEY_SECRET = 'sk-observe-gateway-key-5d1e'
QUESTION = 'how many words are in this question'
WAIT = 10.0


def _config(fake_url: str, redis_url: str) -> str:
    return f'''
redis: {{url: "{redis_url}"}}
gateway:
  keys:
    - {{id: key-o, secret: {KEY_SECRET}, tenant: tenant-o, models: ["*"]}}
llm:
  - {{name: Support, provider: claude, model: claude-sonnet-5-5, address: "{fake_url}", secret: sk-observe,
     max_retries: 0}}
'''


class Stack:
    def __init__(self, tmp: Path) -> None:
        self.redis_server = RedisServer().start()
        self.fake = FakeProviderServer().start()
        services = tmp / 'services'
        services.mkdir()
        (services / 'demo_llm.py').write_text((ROOT / 'services' / 'demo_llm.py').read_text())
        self.config = tmp / 'llm.yaml'
        self.config.write_text(_config(self.fake.url, self.redis_server.url))
        self.log_path = tmp / 'server.log'
        self.log = self.log_path.open('wb')
        port = free_port()
        self.url = f'http://127.0.0.1:{port}'
        self.proc = start_server(self.config, services, port, extra=['--log-format', 'json'], stderr=self.log)
        import redis
        self.redis = redis.Redis.from_url(self.redis_server.url)

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + '/v1', api_key=KEY_SECRET, max_retries=0, timeout=20)

    def access_lines(self, path: str) -> list[dict]:
        lines = [json.loads(line) for line in self.log_path.read_text().splitlines() if line.startswith('{')]
        return [line for line in lines if line.get('path') == path and 'tokens' in line and line.get('status')]

    def metrics(self) -> dict:
        text = requests.get(self.url + '/metrics', timeout=10).text
        return {(s.name, frozenset(s.labels.items())): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    def close(self) -> None:
        stop(self.proc)
        self.log.close()
        self.fake.stop()
        self.redis_server.stop()


@pytest.fixture(scope='module')
def stack(tmp_path_factory):
    s = Stack(tmp_path_factory.mktemp('observe'))
    yield s
    s.close()


def _metric(samples: dict, name: str, **labels) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def _usage_rows(config: Path) -> list[dict]:
    out = subprocess.run([sys.executable, '-m', 'llmconn', 'usage', '--config', str(config), '--json'],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_gateway_call_is_counted_everywhere_a_library_call_of_the_same_size_is(stack):
    before = stack.metrics()
    library = requests.post(stack.url + '/demo.llm.ask', json={'text': QUESTION}, timeout=10).json()['usage']
    client = stack.client()
    chat = client.chat.completions.create(model='Support', messages=[{'role': 'user', 'content': QUESTION}])
    response = client.responses.create(model='Support', input=QUESTION)
    chunks = list(client.chat.completions.create(model='Support', messages=[{'role': 'user', 'content': QUESTION}],
                                                 stream=True, stream_options={'include_usage': True}))
    with client.responses.stream(model='Support', input=QUESTION) as events:
        streamed = events.get_final_response()
    same = (library['input_tokens'], library['output_tokens'])
    assert same[0] > 0 and same[1] > 0
    assert (chat.usage.prompt_tokens, chat.usage.completion_tokens) == same
    assert (response.usage.input_tokens, response.usage.output_tokens) == same
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == same
    assert (streamed.usage.input_tokens, streamed.usage.output_tokens) == same

    # /metrics: five calls of one size, the four gateway ones among them.
    after = stack.metrics()
    for name, n in (('llmconn_input_tokens_total', same[0]), ('llmconn_output_tokens_total', same[1])):
        assert _metric(after, name, connection='Support') - _metric(before, name, connection='Support') == 5 * n

    # The access log: each gateway request with its connection and its tokens, as the service's line.
    ask = wait_until(lambda: stack.access_lines('/demo.llm.ask'), 'the service call\'s access line', WAIT)[-1]
    assert ask['connection'] == 'Support' and ask['tokens'] == {'input': same[0], 'output': same[1]}
    for path in ('/v1/chat/completions', '/v1/responses'):
        lines = wait_until(lambda: len(stack.access_lines(path)) >= 2 and stack.access_lines(path), path, WAIT)
        for line in lines[-2:]:         # plain and streamed
            assert line['connection'] == 'Support', line
            assert line['tokens'] == ask['tokens'], line

    # llmconn usage: the gateway key's row holds four calls of the library call's size.
    def rows():
        found = {r['key']: r for r in _usage_rows(stack.config) if r['connection'] == 'Support'}
        return found if found.get('key-o', {}).get('calls', 0) >= 4 and found.get('', {}).get('calls') else None

    found = wait_until(rows, 'the usage ledger to hold the calls', WAIT, interval=0.2)
    assert (found['']['calls'], found['']['input_tokens'], found['']['output_tokens']) == (1, *same)
    assert (found['key-o']['calls'], found['key-o']['input_tokens'], found['key-o']['output_tokens']) == \
        (4, 4 * same[0], 4 * same[1])


def test_a_failed_gateway_call_counts_in_the_error_metrics(stack):
    before = stack.metrics()
    stack.fake.fail(500, count=2)
    client = stack.client()
    with pytest.raises(openai.APIStatusError):
        client.chat.completions.create(model='Support', messages=[{'role': 'user', 'content': 'fail'}])
    with pytest.raises(openai.APIStatusError):
        client.responses.create(model='Support', input='fail too')
    after = stack.metrics()
    errors = ('llmconn_call_errors_total', {'connection': 'Support', 'error': 'LLMError'})
    assert _metric(after, errors[0], **errors[1]) - _metric(before, errors[0], **errors[1]) == 2


def test_a_stream_whose_backend_fails_before_its_first_event_is_recorded_failed_and_counted(stack):
    stack.fake.clear()
    errors_before = quiet_usage(stack, ('key-o', 'Support')).get('errors', 0)
    stack.fake.fail(500, count=1)
    with pytest.raises(openai.APIStatusError):
        with stack.client().responses.stream(model='Support', input='refused at once') as events:
            list(events)
    records = [json.loads(stack.redis.get(k)) for k in stack.redis.scan_iter('llmconn:gw:resp:*')]
    assert records and not [r for r in records if r['status'] == 'in_progress']
    assert any(r['status'] == 'failed' for r in records)
    counts = settled_usage(stack, ('key-o', 'Support'),
                           lambda u: u.get('errors', 0) > errors_before)
    assert counts.get('errors', 0) == errors_before + 1


# ---- in process: the connection a reload retires waits for the gateway's streams

def _environ(body: dict) -> dict:
    raw = json.dumps(body).encode()
    return {'REQUEST_METHOD': 'POST', 'PATH_INFO': '', 'wsgi.input': io.BytesIO(raw),
            'CONTENT_LENGTH': str(len(raw)), 'CONTENT_TYPE': 'application/json',
            'HTTP_AUTHORIZATION': f'Bearer {KEY_SECRET}'}


@pytest.mark.parametrize('path, body', [
    ('/v1/chat/completions', {'model': 'Support', 'stream': True, 'messages': [{'role': 'user', 'content': 'hi'}]}),
    ('/v1/responses', {'model': 'Support', 'stream': True, 'input': 'hi'}),
])
def test_a_gateway_stream_counts_as_in_flight_until_it_ends(provider, redis_url, path, body):
    import llmconn
    from llmconn.gateway import routes

    registry = llmconn.Registry.from_dict({
        'redis': {'url': redis_url},
        'gateway': {'keys': [{'id': 'key-o', 'secret': KEY_SECRET, 'tenant': 'tenant-o', 'models': ['*']}]},
        'llm': [{'name': 'Support', 'provider': 'claude', 'model': 'claude-sonnet-5-5', 'address': provider.url,
                 'max_retries': 0}]})
    try:
        conn = registry['Support']
        status, _, chunks = routes.handle(registry, _environ(body), 'POST', path, 'cid-1')
        assert status == 200
        assert conn.calls.count == 1        # the provider's stream is open: a reload must not close it
        retired = []
        conn.retire(lambda: retired.append(True))
        assert not conn.closed and retired == []
        first = next(iter(chunks))
        assert first and conn.calls.count == 1
        chunks.close()                      # the client left
        assert conn.calls.count == 0 and conn.closed and retired == [True]
    finally:
        registry.close()
