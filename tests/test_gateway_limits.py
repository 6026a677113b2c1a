"""Per-key limits on the gateway (SPEC §18): rpm, tpm and budgets, shared by every process on one Redis.

Real ``llmconn serve`` processes, a real redis-server, the fake provider;
the client is the ``openai`` SDK, which raises its own RateLimitError on a 429.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import urllib.request
from base64 import b64encode
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
import requests as mod_requests
from openai import OpenAI
from websockets.sync.client import connect

from conftest import RedisServer, free_port
from llmconn.config import load_file
from llmconn.demo import start_server, stop
from llmconn.errors import ConfigError, LimitExceeded
from llmconn.gateway import limits
from llmconn.gateway_config import GatewayKey
from llmconn.testing.fake_server import FakeProviderServer

ROOT = Path(__file__).resolve().parent.parent
ADMIN_KEY = 'sk-limits-admin-key'

# name: (secret, limits)
KEYS = {
    'rpm': ('sk-gw-limits-rpm-secret', '{rpm: 2}'),
    'burst': ('sk-gw-limits-burst-secret', '{rpm: 10}'),
    'crowd': ('sk-gw-limits-crowd-secret', '{rpm: 120}'),
    'handoff': ('sk-gw-limits-handoff-secret', '{rpm: 120}'),
    'tpm': ('sk-gw-limits-tpm-secret', '{tpm: 1}'),
    'budget': ('sk-gw-limits-budget-secret', '{budget_usd: 0.001, budget_period: month}'),
    'roomy': ('sk-gw-limits-roomy-secret', '{rpm: 100, tpm: 1000000}'),
    'shown': ('sk-gw-limits-shown-secret', '{rpm: 50, tpm: 1000000, budget_usd: 5, budget_period: month}'),
    'free': ('sk-gw-limits-free-secret', '{}'),
    'spree': ('sk-gw-limits-spree-secret', '{budget_usd: 0.1, budget_period: day}'),
    'paused': ('sk-gw-limits-paused-secret', '{rpm: 100000}'),
    'daily': ('sk-gw-limits-daily-secret', '{budget_usd: 0.1}'),
}


def _config(fake_url: str, redis_url: str) -> str:
    keys = ''.join(f'''
    - {{id: key-{name}, secret: {secret}, tenant: t-{name}, models: ["*"], limits: {limits}}}'''
                   for name, (secret, limits) in KEYS.items())
    # $1,000 per million tokens: every call's cost (>= 1 token) is at least 1,000 micro-USD, the whole budget.
    return f'''
redis: {{url: "{redis_url}"}}
server: {{api_keys: [{ADMIN_KEY}]}}
gateway:
  keys:{keys}
llm:
  - {{name: Chat, provider: openai, model: gpt-4.1, address: "{fake_url}/v1", max_retries: 0,
     pricing: {{input: 1000, output: 1000}}}}
'''


class Stack:
    """A redis-server, the fake provider and ``processes`` gateway processes reading one llm.yaml."""

    def __init__(self, processes: int) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix='gateway-limits-'))
        self.redis = RedisServer().start()
        self.fake = FakeProviderServer().start()
        (self.tmp / 'services').mkdir()
        self.config = self.tmp / 'llm.yaml'
        self.config.write_text(_config(self.fake.url, self.redis.url))
        self.ports = [free_port() for _ in range(processes)]
        self.procs = []
        try:
            for port in self.ports:
                self.procs.append(start_server(self.config, self.tmp / 'services', port))
        except BaseException:
            self.close()
            raise

    def client(self, key: str, process: int = 0) -> OpenAI:
        return OpenAI(base_url=f'http://127.0.0.1:{self.ports[process]}/v1', api_key=KEYS[key][0],
                      max_retries=0, timeout=20)

    def close(self) -> None:
        for proc in self.procs:
            stop(proc)
        self.fake.stop()
        self.redis.stop()


@pytest.fixture(scope='module')
def stack():
    s = Stack(2)
    yield s
    s.close()


def admin_page(url: str) -> str:
    auth = b64encode(f'admin:{ADMIN_KEY}'.encode()).decode()
    with urllib.request.urlopen(urllib.request.Request(url, headers={'Authorization': f'Basic {auth}'}),
                                timeout=20) as answer:
        return answer.read().decode()


def _chat(client: OpenAI, **kw):
    return client.chat.completions.with_raw_response.create(
        model='Chat', messages=[{'role': 'user', 'content': 'hello there'}], **kw)


def test_rpm_refuses_with_openai_429_and_headers(stack):
    client = stack.client('rpm')
    seen = []
    with pytest.raises(openai.RateLimitError) as refused:
        for _ in range(5):          # 2 a minute: a minute that ends mid-test admits 2 more at most
            raw = client.responses.with_raw_response.create(model='Chat', input='hello')
            seen.append(raw.headers)
    assert 2 <= len(seen) <= 4
    assert seen[0]['x-ratelimit-limit-requests'] == '2'
    assert [int(h['x-ratelimit-remaining-requests']) for h in seen[:2]] in ([1, 0], [0, 1], [1, 1])
    assert seen[0]['x-ratelimit-reset-requests'].endswith('s')
    e = refused.value
    assert e.status_code == 429 and e.code == 'rate_limit_exceeded' and e.type == 'requests'
    assert 'requests per minute' in e.message and 'key-rpm' in e.message
    assert 1 <= int(e.response.headers['Retry-After']) <= 61
    assert e.response.headers['x-ratelimit-remaining-requests'] == '0'


def test_a_key_without_limits_is_not_limited_and_has_no_headers(stack):
    raw = _chat(stack.client('free'))
    assert raw.status_code == 200 and 'x-ratelimit-limit-requests' not in raw.headers


def test_a_refusal_after_admission_carries_the_headers_too(stack):
    with pytest.raises(openai.NotFoundError) as missing:
        stack.client('roomy').responses.create(model='NoSuchModel', input='hello')
    headers = missing.value.response.headers
    assert headers['x-ratelimit-limit-requests'] == '100' and int(headers['x-ratelimit-remaining-requests']) < 100
    assert headers['x-ratelimit-limit-tokens'] == '1000000' and 'x-ratelimit-remaining-tokens' in headers


@pytest.mark.parametrize('route, body', [
    ('responses', b'{"model": "Chat", "input": "hi", "temperature": "hot"}'),     # a field of the wrong type
    ('chat/completions', b'{"model": "Chat", "messages": [], "n": 3}'),
    ('responses', b'{"model": "Chat", "input": '),                                 # not JSON
    ('chat/completions', b'not json at all'),
])
def test_a_request_refused_by_its_shape_carries_the_headers_too(stack, route, body):
    answer = mod_requests.post(f'http://127.0.0.1:{stack.ports[0]}/v1/{route}', data=body, timeout=20,
                               headers={'Authorization': f'Bearer {KEYS["roomy"][0]}'})
    assert answer.status_code == 400, answer.text
    assert answer.headers.get('x-ratelimit-limit-requests') == '100', dict(answer.headers)
    assert 'x-ratelimit-remaining-tokens' in answer.headers


def test_a_websocket_request_refused_by_its_shape_has_the_headers_in_its_error(stack):
    with connect(f'ws://127.0.0.1:{stack.ports[1]}/v1/responses', open_timeout=20,
                 additional_headers={'Authorization': f'Bearer {KEYS["roomy"][0]}'}) as ws:
        for message in ('{"type": "response.create", "model": "Chat", "input": "hi", "top_p": 7}', '{"type": '):
            ws.send(message)
            event = json.loads(ws.recv(timeout=20))
            assert event['type'] == 'error' and event['status'] == 400, event
            assert event['error']['headers']['x-ratelimit-limit-requests'] == '100', event


def test_two_processes_share_one_rpm_under_a_burst(stack):
    clients = [stack.client('burst', process) for process in (0, 1)] * 15

    def one(client):
        try:
            _chat(client)
            return 'ok'
        except openai.RateLimitError as e:
            return e.code

    start = int(time.time() // 60)
    with ThreadPoolExecutor(12) as pool:
        outcomes = list(pool.map(one, clients))
    minutes = int(time.time() // 60) - start + 1
    admitted = outcomes.count('ok')
    assert set(outcomes) <= {'ok', 'rate_limit_exceeded'}
    # 10 a minute across both processes: exactly 10 when the burst stayed in one minute.
    assert admitted == 10 if minutes == 1 else 10 <= admitted <= 20


def test_two_processes_with_reserves_admit_exactly_the_rpm_under_a_burst(stack):
    # 120 a minute leaves room for reserves (each keeps 16 times itself free), so both processes take
    # some while the burst starts; within reach of the limit every request asks Redis again.
    clients = [stack.client('crowd', process) for process in (0, 1)] * 180

    def one(item):
        index, client = item
        try:
            if index % 3:
                _chat(client)
            else:
                client.responses.create(model='Chat', input='hello there')
            return 'ok'
        except openai.RateLimitError as e:
            return e.code

    start = int(time.time() // 60)
    with ThreadPoolExecutor(16) as pool:
        outcomes = list(pool.map(one, enumerate(clients)))
    minutes = int(time.time() // 60) - start + 1
    admitted = outcomes.count('ok')
    assert set(outcomes) <= {'ok', 'rate_limit_exceeded'}
    assert admitted == 120 if minutes == 1 else 120 <= admitted <= 240, admitted


def test_a_reserve_a_process_no_longer_uses_goes_back_to_the_others(stack):
    # Process 0 is busy for a moment (so it holds a reserve), then every request goes to process 1:
    # what process 0 held comes back to the minute within its 0.2 s, and process 1 serves it.
    first, second = stack.client('handoff', 0), stack.client('handoff', 1)
    start = int(time.time() // 60)
    served = 0
    for _ in range(4):
        _chat(first)
        served += 1

    def one(_):
        try:
            _chat(second)
            return 1
        except openai.RateLimitError as e:
            assert e.code == 'rate_limit_exceeded'
            return 0
    with ThreadPoolExecutor(4) as pool:
        served += sum(pool.map(one, range(180)))
    if int(time.time() // 60) == start:         # a burst over a minute's end counts in two
        assert served == 120


def test_tpm_counts_a_streamed_answers_tokens(stack):
    client = stack.client('tpm')
    chunks = list(client.chat.completions.create(model='Chat', messages=[{'role': 'user', 'content': 'hi'}],
                                                 stream=True, stream_options={'include_usage': True}))
    assert chunks[-1].usage.total_tokens >= 1
    deadline = time.time() + 5
    # Admitted anyway only when the stream's spend had not landed yet (the minute ended just now, or
    # the flush thread had taken it off the list and not written it): the next one refuses once it
    # counted. An admitted answer's headers count its own tokens, which leave none of the one.
    while True:
        try:
            raw = _chat(client)
        except openai.RateLimitError as e:
            assert e.code == 'rate_limit_exceeded' and 'tokens per minute' in e.message
            assert e.type == 'tokens'       # as OpenAI types a TPM refusal ('requests' is RPM's)
            break
        assert time.time() < deadline, 'tpm never refused'
        assert int(raw.headers['x-ratelimit-remaining-tokens']) == 0


def test_spent_budget_is_insufficient_quota_on_either_process(stack):
    first = stack.client('budget', 0)
    first.responses.create(model='Chat', input='hello')        # costs the whole budget
    for process in (0, 1):
        with pytest.raises(openai.RateLimitError) as refused:
            _chat(stack.client('budget', process))
        e = refused.value
        assert e.code == 'insufficient_quota' and 'budget' in e.message
        assert int(e.response.headers['Retry-After']) > 0


@pytest.mark.parametrize('period, word', [('day', 'daily'), ('month', 'monthly')])
def test_a_budget_refusal_names_its_period_and_a_sub_cent_spend(period, word):
    key = GatewayKey(id='k', secret='sk-unit-budget-secret', tenant='t', models=['*'],
                     limits={'budget_usd': 0.001, 'budget_period': period})
    with pytest.raises(LimitExceeded) as refused:      # 1,900 micro-USD spent of a 1,000 budget
        limits.verdict(limits.Plan(key), b'3 19 266 1900 30000 72000 0')
    assert f"spent its {word} budget of $0.001 ($0.0019);" in str(refused.value), str(refused.value)


def test_a_daily_budgets_refusal_says_daily(stack):
    client = stack.client('daily', 0)
    with pytest.raises(openai.RateLimitError) as refused:
        for _ in range(100):
            client.chat.completions.create(model='Chat', messages=[{'role': 'user', 'content': 'hi'}])
    assert 'spent its daily budget of $0.1 ' in refused.value.message, refused.value.message


def test_two_processes_overspend_a_budget_by_at_most_the_requests_in_flight(stack):
    # $1,000 per million tokens: a call of ~10 tokens costs ~1 cent, so the 10-cent budget takes ~10 of them.
    threads = 8                         # at most this many requests in flight at once, over both processes
    clients = [stack.client('spree', i % 2) for i in range(threads)]
    admitted: list[int] = []            # each admitted call's tokens

    def loop(client):
        for _ in range(100):
            try:
                answer = client.chat.completions.create(model='Chat', messages=[{'role': 'user', 'content': 'hi'}])
            except openai.RateLimitError as e:
                assert e.code == 'insufficient_quota'
                return
            admitted.append(answer.usage.total_tokens)
        raise AssertionError('the budget never refused')

    stack.fake.latency = 0.2            # calls overlap, so several are in flight when the budget is reached
    try:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(loop, clients))
    finally:
        stack.fake.latency = 0
    costs = [tokens * 1000 for tokens in admitted]      # micro-USD
    budget = 100_000
    # Admitted while the spend was below the budget, plus those in flight then: each client's request
    # under way and, at most, the one it just finished whose spend waits for its process's next
    # admission (or the flush within SETTLE_INTERVAL).
    below = next(i for i in range(len(costs) + 1) if sum(costs[:i]) >= budget)
    assert below <= len(costs) <= below + 2 * threads, (len(costs), below)
    deadline = time.time() + 20
    while True:                         # what each process kept is written within its interval
        lines = subprocess.run([sys.executable, '-m', 'llmconn', 'usage', '--config', str(stack.config)],
                               capture_output=True, text=True, timeout=60,
                               env=dict(os.environ, PYTHONPATH=str(ROOT))).stdout.splitlines()
        line = next(line for line in lines if line.startswith('key-spree '))
        if f'{sum(costs) / 1e6:.4f} / 0.1000' in line or time.time() > deadline:
            break
        time.sleep(0.2)
    assert f'{sum(costs) / 1e6:.4f} / 0.1000' in line, line      # every admitted call counted, once


def test_redis_paused_mid_burst_is_503_within_the_store_timeout_never_a_hang():
    s = Stack(1)
    try:
        client = OpenAI(base_url=f'http://127.0.0.1:{s.ports[0]}/v1', api_key=KEYS['paused'][0], max_retries=0,
                        timeout=60)

        def one(_):
            started = time.monotonic()
            try:
                _chat(client)
                outcome = 200
            except openai.APIStatusError as e:
                outcome = e.status_code
            return outcome, time.monotonic() - started

        _chat(client)
        s.fake.latency = 0.3            # the burst is still going when Redis stops answering
        with ThreadPoolExecutor(6) as pool:
            burst = pool.map(one, range(12))
            time.sleep(0.15)
            os.kill(s.redis.process.pid, signal.SIGSTOP)
            try:
                outcomes = list(burst)
            finally:
                os.kill(s.redis.process.pid, signal.SIGCONT)
        codes = {code for code, _ in outcomes}
        assert codes <= {200, 503} and 503 in codes, outcomes
        # Twice the store's socket timeout (5 s, retried once) at most: well short of the client's 60 s.
        assert max(seconds for _, seconds in outcomes) < 25, outcomes
        assert _chat(client).status_code == 200          # Redis back: served again
    finally:
        s.close()


def test_redis_down_with_limits_is_503_never_unlimited():
    s = Stack(1)
    try:
        client = s.client('rpm')
        _chat(client)
        s.redis.stop()
        with pytest.raises(openai.InternalServerError) as failed:
            _chat(client)
        assert failed.value.status_code == 503
        assert len(s.fake.requests) == 1           # the refused request never reached the provider
    finally:
        s.close()


@pytest.mark.parametrize('limits, field', [
    ('{rpm: 0}', 'limits.rpm'), ('{tpm: -5}', 'limits.tpm'), ('{budget_usd: ten}', 'limits.budget_usd'),
    ('{rpm: 1.5}', 'limits.rpm'), ('{budget_usd: .nan}', 'limits.budget_usd'), ('{budget_usd: 0}', 'limits.budget_usd'),
    ('{budget_usd: 0.0000004}', 'limits.budget_usd'),      # under the micro-dollar spend is counted in: no budget
])
def test_bad_limits_are_a_config_error_naming_key_and_field(tmp_path, limits, field):
    path = tmp_path / 'llm.yaml'
    path.write_text(f'''
gateway:
  keys:
    - {{id: team-x, secret: sk-some-long-secret, tenant: x, models: ["*"], limits: {limits}}}
llm:
  - {{name: Chat, provider: openai, model: gpt-4.1}}
''')
    with pytest.raises(ConfigError) as e:
        load_file(path)
    assert "'team-x'" in str(e.value) and field in str(e.value) and 'sk-some-long-secret' not in str(e.value)


def test_the_documented_limits_example_loads(tmp_path):
    page = (Path(__file__).parent.parent / 'docs' / 'gateway.md').read_text()
    section = page.split('## Limits and budgets', 1)[1]
    example = section.split('```yaml\n', 1)[1].split('```', 1)[0]
    path = tmp_path / 'llm.yaml'
    path.write_text(example)
    conf = load_file(path, environ={'TEAM_A_GATEWAY_KEY': 'sk-team-a-long-secret'})
    limits = conf.gateway.keys[0].limits
    assert (limits.rpm, limits.tpm, limits.budget_usd, limits.budget_period) == (60, 200000, 25, 'month')


def test_llmconn_usage_and_admin_show_each_keys_use_against_its_limits(stack):
    # A key of its own, so the other tests' requests do not move its counts.
    client = stack.client('shown')
    client.chat.completions.create(model='Chat', messages=[{'role': 'user', 'content': 'hello'}])
    out = subprocess.run([sys.executable, '-m', 'llmconn', 'usage', '--config', str(stack.config)],
                         capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stderr
    line = next(line for line in out.stdout.splitlines() if line.startswith('key-shown '))
    minute_ended = line.split()[1] == '0'      # the minute may have ended between the call and the report
    assert re.search(r'\b[01] / 50\b', line) and '/ 1000000' in line and '/ 5.0000' in line
    assert time.strftime('%Y-%m', time.gmtime()) in line
    assert minute_ended or re.search(r'\b1 / 50\b', line)
    page = admin_page(f'http://127.0.0.1:{stack.ports[1]}/admin')
    assert 'id="limits-table"' in page and 'key-shown' in page and '/ 50' in page


REQUESTS_HEADERS = ['x-ratelimit-limit-requests', 'x-ratelimit-remaining-requests', 'x-ratelimit-reset-requests']
TOKENS_HEADERS = ['x-ratelimit-limit-tokens', 'x-ratelimit-remaining-tokens', 'x-ratelimit-reset-tokens']


@pytest.mark.parametrize('given, names', [
    ({'rpm': 5}, REQUESTS_HEADERS),
    ({'tpm': 900}, TOKENS_HEADERS),
    ({'rpm': 5, 'tpm': 900, 'budget_usd': 1}, REQUESTS_HEADERS + TOKENS_HEADERS),
    ({'budget_usd': 1}, []),
    ({'tpm': 900, 'budget_usd': 1}, TOKENS_HEADERS),
])
def test_a_limited_key_gets_the_headers_of_the_limits_it_has_and_no_invented_one(given, names):
    """A counter's headers go with its limit (as OpenAI's do): a key without rpm is told no requests limit."""
    key = GatewayKey(id='k', secret='sk-unit-headers-secret', tenant='t', models=['*'], limits=given)
    grant = limits.verdict(limits.Plan(key), b'0 3 200 10 12500 72000 0')      # 3 requests, 200 tokens
    headers = dict(grant.headers())
    assert list(headers) == names
    if 'rpm' in given:
        assert headers['x-ratelimit-limit-requests'] == '5' and headers['x-ratelimit-remaining-requests'] == '2'
        assert headers['x-ratelimit-reset-requests'] == '13s'
    if 'tpm' in given:
        assert headers['x-ratelimit-limit-tokens'] == '900' and headers['x-ratelimit-remaining-tokens'] == '700'
