"""``GET /metrics`` of ``llmconn serve``, parsed with prometheus_client's own parser.

Each test sends a known mix (chats, a one-shot call, a stream, a retried
call, a provider error, a ChatBusy, an unknown service) to a real server
subprocess and checks every counter against exactly what it sent, with one
process and with ``--workers 2`` (whose workers' counts must be summed).
"""

import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections import Counter as Tally
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from llmconn import observe
from llmconn.demo import start_server, stop

ROOT = Path(__file__).resolve().parent.parent
API_KEY = 'metrics-test-api-key-7f3a'
METRICS_KEY = 'metrics-only-key-91c2'

PID_SERVICE = '''
import os

from llmconn.service import Service


class Pid(Service):
    name = 'test.pid'

    def handle(self):
        self.response.payload = {'pid': os.getpid()}
'''


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def write_setup(tmp, provider_url, redis_url, api_keys=()):
    services = tmp / 'services'
    services.mkdir(exist_ok=True)
    (services / 'demo_llm.py').write_text((ROOT / 'services' / 'demo_llm.py').read_text())
    (services / 'pid.py').write_text(PID_SERVICE)
    keys = ''.join(f'\n    - {k}' for k in api_keys) or ' []'
    config = tmp / 'llm.yaml'
    config.write_text(f'''
redis: {{url: "{redis_url}"}}
skills_dir: {ROOT / 'etc' / 'skills'}
server:
  api_keys:{keys}
llm:
  - name: Support
    provider: claude
    model: claude-sonnet-5-5
    address: {provider_url}
    secret: sk-metrics-test
    max_retries: 1
    lock_wait: 0.3
    chat_expiry: 60
''')
    return config, services


def scrape(url, **headers):
    response = requests.get(f'{url}/metrics', headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers['Content-Type'].startswith('text/plain')
    return parse(response.text)


def parse(text):
    """{(sample name, frozenset of labels): value} of every sample."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples, name, **labels):
    return samples.get((name, frozenset(labels.items())), 0.0)


def post(url, service, payload, **kw):
    # A new connection each time, so that the kernel spreads requests over the workers.
    return requests.post(f'{url}/{service}', json=payload, headers={'Connection': 'close'}, timeout=10, **kw)


def exercise(url, fake):
    """The known mix; returns what the metrics must say (requests by (service, status), tokens, ...)."""
    sent = {'requests': Tally(), 'input': 0, 'output': 0}

    def count(service, response, usage=None):
        sent['requests'][(service, str(response.status_code))] += 1
        if usage:
            sent['input'] += usage['input_tokens']
            sent['output'] += usage['output_tokens']

    run = uuid.uuid4().hex[:8]
    for i in range(3):
        r = post(url, 'demo.llm.support-chat', {'user_id': f'{run}-{i}', 'text': f'hello {i}'})
        count('demo.llm.support-chat', r, r.json()['usage'])
    r = post(url, 'demo.llm.ask', {'text': 'one shot'})
    count('demo.llm.ask', r, r.json()['usage'])
    with requests.post(f'{url}/demo.llm.support-chat-stream', json={'user_id': f'{run}-s', 'text': 'stream it'},
                       stream=True, timeout=10) as r:
        done = [line for line in r.iter_lines() if line.startswith(b'data: ') and b'"usage"' in line]
        count('demo.llm.support-chat-stream', r, json.loads(done[-1][6:])['usage'])
    fake.fail(503, count=1, headers={'retry-after': '0'})           # one retry, then a 200
    r = post(url, 'demo.llm.ask', {'text': 'retried'})
    assert r.status_code == 200, r.text
    count('demo.llm.ask', r, r.json()['usage'])
    fake.fail(400, count=1)                                        # not retried: a 502 and an LLMError
    r = post(url, 'demo.llm.ask', {'text': 'refused'})
    assert r.status_code == 502, r.text
    count('demo.llm.ask', r)
    busy(url, fake, f'{run}-busy', count)
    r = post(url, 'no.such.service', {})
    count('other', r)
    return sent


def busy(url, fake, user, count):
    """One call holds the chat for 1 s; a second on the same chat waits 0.3 s and gets 429."""
    fake.clear()
    fake.latency = 1.0
    holder = {}
    thread = threading.Thread(target=lambda: holder.update(r=post(url, 'demo.llm.support-chat',
                                                                  {'user_id': user, 'text': 'hold it'})))
    thread.start()
    try:
        wait_for(lambda: len(fake.requests) == 1)                   # the holder has the lock now
        r = post(url, 'demo.llm.support-chat', {'user_id': user, 'text': 'too soon'})
        assert r.status_code == 429, r.text
        count('demo.llm.support-chat', r)
    finally:
        thread.join()
        fake.latency = 0
    count('demo.llm.support-chat', holder['r'], holder['r'].json()['usage'])


def wait_for(condition, timeout=10.0):
    event = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        event.wait(0.01)
    raise AssertionError('condition not met in time')


def check(samples, sent):
    """Every counter equals what ``exercise`` sent."""
    for (service, status), n in sent['requests'].items():
        assert value(samples, 'llmconn_requests_total', service=service, status=status) == n, (service, status)
    assert value(samples, 'llmconn_request_duration_seconds_count', service='demo.llm.support-chat') == 5
    # Provider attempts: 3 chats, 1 ask, 1 stream, the retried ask twice, the refused ask, the busy holder.
    assert value(samples, 'llmconn_provider_calls_total', connection='Support', status='200') == 7
    assert value(samples, 'llmconn_provider_calls_total', connection='Support', status='503') == 1
    assert value(samples, 'llmconn_provider_calls_total', connection='Support', status='400') == 1
    assert value(samples, 'llmconn_provider_call_duration_seconds_count', connection='Support') == 9
    assert value(samples, 'llmconn_provider_retries_total', connection='Support') == 1
    assert value(samples, 'llmconn_call_errors_total', connection='Support', error='LLMError') == 1
    assert value(samples, 'llmconn_call_errors_total', connection='Support', error='ChatBusy') == 1
    assert value(samples, 'llmconn_chat_busy_total', connection='Support') == 1
    # Chat calls that asked for their lock: 3 chats, the stream, the holder, and the busy one, which
    # waited its whole lock_wait (0.3 s) before giving up.
    assert value(samples, 'llmconn_lock_wait_seconds_count', connection='Support') == 6
    assert 0.3 <= value(samples, 'llmconn_lock_wait_seconds_sum', connection='Support') < 1.0
    assert value(samples, 'llmconn_lock_wait_seconds_bucket', connection='Support', le='0.25') == 5
    assert value(samples, 'llmconn_input_tokens_total', connection='Support') == sent['input'] > 0
    assert value(samples, 'llmconn_output_tokens_total', connection='Support') == sent['output'] > 0
    assert value(samples, 'llmconn_services_deployed') == 4
    assert not any(name == 'llmconn_store_errors_total' and v for (name, _), v in samples.items())


@pytest.fixture
def setup(tmp_path, provider, redis_url):
    return write_setup(tmp_path, provider.url, redis_url)


def test_metrics_count_exactly_what_one_server_was_sent(setup, provider):
    config, services = setup
    port = free_port()
    proc = start_server(config, services, port)
    try:
        url = f'http://127.0.0.1:{port}'
        sent = exercise(url, provider)
        samples = scrape(url)
    finally:
        stop(proc)
    check(samples, sent)
    # The scrape itself is counted once it is answered, so a second scrape would show it; not the first.
    assert value(samples, 'llmconn_requests_total', service='metrics', status='200') == 0


def test_metrics_of_two_workers_are_summed_and_their_directory_removed(setup, provider, tmp_path):
    config, services = setup
    port = free_port()
    url = f'http://127.0.0.1:{port}'
    shared_parent = tmp_path / 'multiproc'
    shared_parent.mkdir()
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(shared_parent))
    proc = start_server(config, services, port, extra=['--workers', '2'], env=env)
    try:
        pids = Tally()
        # Until both workers listen (the server answered /health once one did), then 20 more calls.
        wait_for(lambda: pids.update([post(url, 'test.pid', {}).json()['pid']]) or len(pids) == 2, timeout=30)
        pids.update(post(url, 'test.pid', {}).json()['pid'] for _ in range(20))
        sent = exercise(url, provider)
        sent['requests'][('test.pid', '200')] += sum(pids.values())
        # Each worker counts a request just after its last byte is sent; the scrape may reach the other
        # worker a moment before that.
        settled = {}
        try:
            wait_for(lambda: settled.update(s=scrape(url)) or all(
                value(settled['s'], 'llmconn_requests_total', service=k[0], status=k[1]) == n
                for k, n in sent['requests'].items()))
        except AssertionError:
            pass                                # check() below says which count is off
        samples = settled['s']
        assert list(shared_parent.iterdir()), 'the workers write their values under the operator\'s directory'
    finally:
        stop(proc)
    check(samples, sent)
    assert not list(shared_parent.iterdir()), 'the supervisor removes the directory it created'


def test_metrics_of_a_worker_that_died_are_kept(setup, provider):
    """A killed worker's counts happened: they stay in the sum after the supervisor restarts it."""
    config, services = setup
    port = free_port()
    url = f'http://127.0.0.1:{port}'
    proc = start_server(config, services, port, extra=['--workers', '2'])
    answered = []

    def pids():
        seen = set()
        for _ in range(20):
            try:
                seen.add(post(url, 'test.pid', {}).json()['pid'])
                answered.append(1)
            except requests.ConnectionError:
                pass
        return seen

    try:
        victim = next(iter(pids()))
        # A worker counts a request just after its last byte is sent: let the victim finish counting.
        wait_for(lambda: value(scrape(url), 'llmconn_requests_total', service='test.pid', status='200')
                 == len(answered))
        os.kill(victim, signal.SIGKILL)         # killed by a signal: the supervisor restarts it
        wait_for(lambda: (lambda seen: victim not in seen and len(seen) == 2)(pids()), timeout=30)
        # The last request is counted just after its answer went out, too: wait for the count to settle.
        counted = []
        try:
            wait_for(lambda: counted.append(value(scrape(url), 'llmconn_requests_total', service='test.pid',
                                                  status='200')) or counted[-1] == len(answered))
        except AssertionError:
            raise AssertionError(f'{len(answered)} answered, {counted[-1]} counted') from None
    finally:
        stop(proc)


def test_metrics_need_a_key_when_the_server_has_keys_and_accept_the_metrics_only_key(tmp_path, provider,
                                                                                       redis_url):
    config, services = write_setup(tmp_path, provider.url, redis_url, api_keys=[API_KEY])
    port = free_port()
    url = f'http://127.0.0.1:{port}'
    proc = start_server(config, services, port, env=dict(os.environ, LLMCONN_METRICS_KEY=METRICS_KEY))
    try:
        assert requests.get(f'{url}/metrics', timeout=5).status_code == 401
        assert requests.get(f'{url}/metrics', headers={'X-API-Key': 'wrong'}, timeout=5).status_code == 401
        scrape(url, Authorization=f'Bearer {METRICS_KEY}')          # what a Prometheus scrape_config sends
        scrape(url, **{'X-API-Key': API_KEY})
        # The metrics key opens /metrics and nothing else.
        r = requests.post(f'{url}/demo.llm.ask', json={'text': 'hi'}, headers={'X-API-Key': METRICS_KEY}, timeout=5)
        assert r.status_code == 401
        assert METRICS_KEY not in requests.get(f'{url}/metrics', timeout=5).text
    finally:
        stop(proc)


def test_metrics_off_serves_404_and_counts_nothing(setup):
    config, services = setup
    port = free_port()
    proc = start_server(config, services, port, extra=['--no-metrics'])
    try:
        r = requests.get(f'http://127.0.0.1:{port}/metrics', timeout=5)
        assert r.status_code == 404 and '--no-metrics' in r.json()['error']
    finally:
        stop(proc)


def test_store_errors_are_counted_by_redis_exception(tmp_path, provider, redis_server):
    config, services = write_setup(tmp_path, provider.url, redis_server.url)
    port = free_port()
    proc = start_server(config, services, port)
    url = f'http://127.0.0.1:{port}'
    try:
        redis_server.stop()
        for i in range(2):
            assert post(url, 'demo.llm.support-chat', {'user_id': 'u', 'text': 'x'}).status_code == 503
        samples = scrape(url)
    finally:
        stop(proc)
    assert value(samples, 'llmconn_store_errors_total', error='ConnectionError') == 2
    assert value(samples, 'llmconn_call_errors_total', connection='Support', error='StoreError') == 2
    assert value(samples, 'llmconn_requests_total', service='demo.llm.support-chat', status='503') == 2


def test_the_library_never_imports_prometheus_client_and_adds_no_wrapper_when_unobserved():
    script = '''
import sys
import llmconn
from llmconn import observe
from llmconn.testing.fake_server import FakeProviderServer
with FakeProviderServer() as fake:
    registry = llmconn.Registry.from_dict({'redis': {'url': 'memory://'}, 'llm': [
        {'name': 'C', 'provider': 'claude', 'model': 'claude-sonnet-5-5', 'address': fake.url, 'secret': 'x'}]})
    conn = registry['C']
    conn.chat('hello', chat_id='one')
    events = iter(())
    assert observe.call('C', events) is events, 'an unobserved call is wrapped'
    list(conn.stream('hello', chat_id='one'))
    registry.close()
assert observe.installed() is None
assert 'prometheus_client' not in sys.modules, 'the library imported prometheus_client'
print('ok')
'''
    result = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == 'ok', result.stderr


def test_observer_hooks_see_a_stream_closed_early_and_close_the_pipeline():
    closed = []

    def pipeline():
        try:
            yield type('E', (), {'type': 'text', 'result': None})()
            yield type('E', (), {'type': 'text', 'result': None})()
        finally:
            closed.append(True)

    observe.install(observe.Observer())
    try:
        events = observe.call('C', pipeline())
        next(events)
        events.close()
    finally:
        observe.install(None)
    assert closed == [True]


def test_a_dead_workers_live_gauges_go_and_its_counters_stay(tmp_path, monkeypatch):
    from llmconn.metrics import MultiprocessDir
    monkeypatch.setenv('PROMETHEUS_MULTIPROC_DIR', str(tmp_path))
    shared = MultiprocessDir()
    assert Path(shared.path).parent == tmp_path and shared.env()['PROMETHEUS_MULTIPROC_DIR'] == shared.path
    for name in ('counter_123.db', 'histogram_123.db', 'gauge_livemostrecent_123.db', 'gauge_livemostrecent_456.db'):
        (Path(shared.path) / name).write_bytes(b'')
    shared.worker_exited(123)
    assert sorted(p.name for p in Path(shared.path).iterdir()) == [
        'counter_123.db', 'gauge_livemostrecent_456.db', 'histogram_123.db']
    shared.remove()
    assert not list(tmp_path.iterdir())


def test_an_unusable_multiprocess_directory_is_a_clear_error(tmp_path, monkeypatch):
    from llmconn.errors import ConfigError
    from llmconn.metrics import MultiprocessDir
    monkeypatch.setenv('PROMETHEUS_MULTIPROC_DIR', str(tmp_path / 'missing'))
    with pytest.raises(ConfigError, match='create that directory.*--no-metrics'):
        MultiprocessDir()


def test_request_labels_are_bounded_whatever_the_path():
    from types import SimpleNamespace

    from llmconn.wsgi import App
    app = App(SimpleNamespace(deployer=SimpleNamespace(services={'demo.llm.ask': object()})))
    labels = {path: app._label(path) for path in (
        '/demo.llm.ask', '/metrics', '/ready', '/no-such-service', '/x' * 50, '/v1/chat/completions',
        '/v1/responses', '/v1/responses/resp_123abc', '/v1/models/Support', '/v1/anything')}
    assert labels == {
        '/demo.llm.ask': 'demo.llm.ask', '/metrics': 'metrics', '/ready': 'ready', '/no-such-service': '',
        '/x' * 50: '', '/v1/chat/completions': 'v1/chat/completions', '/v1/responses': 'v1/responses',
        '/v1/responses/resp_123abc': 'v1/responses/{id}', '/v1/models/Support': 'v1/models/{id}',
        '/v1/anything': ''}


# -- the values are written in batches -------------------------------------------------------------

def _exposition(registry) -> dict:
    """{(name, labels): value} of every sample in ``registry``."""
    from prometheus_client.exposition import generate_latest
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(generate_latest(registry).decode())
            for s in family.samples}


def _feed(observer):
    """A mix of every hook, with durations on, just below and just above bucket bounds."""
    from types import SimpleNamespace
    for seconds in (0.0, 0.001, 0.01, 0.0100001, 0.3, 120, 121, 5e3):
        observer.provider_call('C', '200', seconds, retry=False)
        observer.lock_waited('C', seconds)
        observer.request_done(SimpleNamespace(service='demo.llm.ask', status=200, duration=seconds))
    observer.provider_call('C', 'timeout', 2.5, retry=True)
    observer.call_done('C', 120, 17)
    observer.call_done('D', 0, 5)
    observer.call_failed('C', 'ChatBusy')
    observer.chat_busy('C')
    observer.store_error('ConnectionError')
    observer.request_done(SimpleNamespace(service='', status=404, duration=0.002))


def test_batched_values_equal_what_prometheus_client_records_call_by_call():
    from llmconn.metrics import Metrics

    class Direct(Metrics):
        """The same metrics, each hook writing straight to prometheus_client (its own observe/inc)."""

        def _inc(self, metric, labels, amount=1):
            metric.labels(*labels).inc(amount)

        def _observe(self, metric, labels, amount):
            metric.labels(*labels).observe(amount)

    batched, direct = Metrics(), Direct()
    _feed(batched)
    _feed(batched)
    batched.flush()
    _feed(batched)              # some flushed, some pending: the scrape flushes the rest
    for _ in range(3):
        _feed(direct)
    batched.render(3)
    direct.render(3)
    got, want = _exposition(batched.registry), _exposition(direct.registry)
    assert got == pytest.approx(want, rel=1e-12)         # sums added in another order differ in the last bit
    assert want[('llmconn_provider_call_duration_seconds_bucket', (('connection', 'C'), ('le', '0.01')))] == 9


def test_values_reach_the_storage_within_the_flush_interval_without_a_scrape():
    import gevent
    from llmconn.metrics import Metrics

    metrics = Metrics(flush_interval=0.05)
    metrics.call_done('C', 7, 3)
    sample = lambda: metrics.registry.get_sample_value('llmconn_input_tokens_total', {'connection': 'C'})  # noqa: E731
    assert sample() is None, 'written at once: the hot path would pay every write'
    for _ in range(40):
        gevent.sleep(0.025)
        if sample() == 7:
            break
    assert sample() == 7
    metrics.close()
    metrics.call_done('C', 1, 0)
    gevent.sleep(0.1)
    assert sample() == 7, 'a closed observer flushes no more'


def test_close_flushes_what_is_pending():
    from llmconn.metrics import Metrics

    metrics = Metrics(flush_interval=3600)
    metrics.call_done('C', 7, 3)
    metrics.close()
    assert metrics.registry.get_sample_value('llmconn_output_tokens_total', {'connection': 'C'}) == 3
