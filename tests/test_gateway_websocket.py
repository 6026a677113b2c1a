"""WebSocket mode of ``/v1/responses``, driven by the ``openai`` SDK's ``client.responses.connect()``.

Two ``llmconn serve`` processes share one Redis and the fake provider; each
response's events are checked against Open Responses (strict) and the SDK's
types, as the SSE stream's are. The faults: a refused request is an
``error`` event on a socket that stays open, a message over the size limit
closes its socket only, idle sockets are closed at the idle timeout, a
client that leaves mid-response cancels it.
"""

from __future__ import annotations

import asyncio
import json
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest
import redis as redis_py
import requests
import websockets
from openai import AsyncOpenAI, OpenAI
from openai.types.responses.responses_server_event import ResponsesServerEvent, ResponseWsError
from pydantic import TypeAdapter
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect as ws_connect

from conformance_checks import check_stream
from conftest import RedisServer, free_port
from gateway_stack import ASK, ORDER_TOOL
from test_gateway_cancel import WORDS, SlowStream, wait_for
from llmconn.demo import start_server, stop
from llmconn.store.records import response_key
from llmconn.testing.fake_server import FakeProviderServer

IDLE_TIMEOUT = 3.0              # the stack's gateway.websocket.idle_timeout
MAX_MESSAGE = 64 * 1024         # and its max_message_bytes
IDLE_SOCKETS = 200
KEYS = {
    # name: (secret, tenant, retention, limits)
    'a': ('sk-gw-ws-tenant-a-secret', 'tenant-a', 'standard', '{}'),
    'b': ('sk-gw-ws-tenant-b-secret', 'tenant-b', 'standard', '{}'),
    'zero': ('sk-gw-ws-tenant-z-secret', 'tenant-z', 'zero', '{}'),
    'rpm': ('sk-gw-ws-limited-secret', 'tenant-r', 'standard', '{rpm: 2}'),
    'warm': ('sk-gw-ws-warm-up-secret', 'tenant-w', 'standard', '{rpm: 2}'),
}


def _config(fake_url: str, redis_url: str, slow_url: str) -> str:
    keys = ''.join(f'''
    - {{id: key-{name}, secret: {secret}, tenant: {tenant}, retention: {retention}, models: ["*"],
       limits: {limits}}}''' for name, (secret, tenant, retention, limits) in KEYS.items())
    return f'''
redis: {{url: "{redis_url}"}}
gateway:
  response_expiry: 300
  websocket: {{idle_timeout: {IDLE_TIMEOUT}, max_message_bytes: {MAX_MESSAGE}}}
  keys:{keys}
llm:
  - {{name: Chat, provider: openai, model: gpt-4.1, address: "{fake_url}/v1", max_retries: 0}}
  - {{name: Claude, provider: claude, model: claude-sonnet-5-5, address: "{fake_url}", max_tokens: 2048,
     thinking: {{type: enabled, budget_tokens: 1024}}, max_retries: 0}}
  - {{name: Slow, provider: openai, model: slow, address: "{slow_url}", max_retries: 0}}
'''


class Stack:
    def __init__(self, processes: int = 2) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix='gateway-ws-'))
        self.redis_server = RedisServer().start()
        self.fake = FakeProviderServer().start()
        self.slow = SlowStream()
        threading.Thread(target=self.slow.serve_forever, kwargs={'poll_interval': 0.01}, daemon=True).start()
        (self.tmp / 'services').mkdir()
        self.config = self.tmp / 'llm.yaml'
        self.config.write_text(_config(self.fake.url, self.redis_server.url, self.slow.url))
        self.ports = [free_port() for _ in range(processes)]
        self.procs = []
        try:
            for port in self.ports:
                self.procs.append(start_server(self.config, self.tmp / 'services', port))
        except BaseException:
            self.close()
            raise
        self.redis = redis_py.Redis.from_url(self.redis_server.url)

    def client(self, key: str = 'a', process: int = 0) -> OpenAI:
        return OpenAI(base_url=f'http://127.0.0.1:{self.ports[process]}/v1', api_key=KEYS[key][0] if key in KEYS
                      else key, max_retries=0, timeout=20)

    def ws_url(self, process: int = 0) -> str:
        return f'ws://127.0.0.1:{self.ports[process]}/v1/responses'

    def record(self, key: str, response_id: str) -> dict | None:
        raw = self.redis.get(response_key(KEYS[key][1], response_id))
        return json.loads(raw) if raw else None

    def close(self) -> None:
        for proc in self.procs:
            stop(proc)
        self.fake.stop()
        self.slow.shutdown()
        self.slow.server_close()
        self.redis_server.stop()


@pytest.fixture(scope='module')
def stack():
    s = Stack()
    yield s
    s.close()


SERVER_EVENT = TypeAdapter(ResponsesServerEvent)
ENDINGS = ('response.completed', 'response.incomplete', 'response.failed', 'error')


def response_events(conn) -> list[dict]:
    """One answer's events, raw as they came (not the SDK's lenient parse), through its ending or error.

    Each is also validated as the SDK's WebSocket server event (its ``parse_event`` does not validate).
    """
    events = []
    while True:
        event = json.loads(conn.recv_bytes())
        SERVER_EVENT.validate_python(event)
        events.append(event)
        if event['type'] in ENDINGS:
            return events


def completed(conn, **kw) -> dict:
    """Send one response.create; its events conform as the SSE stream's do; the completed Response."""
    conn.response.create(**kw)
    events = response_events(conn)
    check_stream(events)
    assert events[-1]['type'] == 'response.completed', events[-1]
    return events[-1]['response']


def refused(conn, **kw) -> dict:
    """Send one response.create the gateway refuses: its ``error`` event, as the SDK types it."""
    conn.response.create(**kw)
    event = json.loads(conn.recv_bytes())
    ResponseWsError.model_validate(event)
    assert event['type'] == 'error', event
    return event


def raw_socket(stack, key: str = 'a', process: int = 0, **kw):
    """A plain WebSocket client (not the SDK), for what the SDK would never send."""
    return ws_connect(stack.ws_url(process), additional_headers={'Authorization': f'Bearer {KEYS[key][0]}'},
                      open_timeout=20, **kw)


def one_key_config(tmp_path: Path, fake_url: str, redis_url: str = '') -> Path:
    """A server of its own's llm.yaml (and services directory): key ``a`` and one Chat connection at the fake;
    the embedded store unless ``redis_url``."""
    config = tmp_path / 'llm.yaml'
    redis = f'redis: {{url: "{redis_url}"}}\n' if redis_url else ''
    config.write_text(f'''{redis}
gateway:
  keys: [{{id: k, secret: {KEYS["a"][0]}, tenant: t, models: ["*"]}}]
llm:
  - {{name: Chat, provider: openai, model: gpt-4.1, address: "{fake_url}/v1", max_retries: 0}}
''')
    (tmp_path / 'services').mkdir()
    return config


def send_create(ws, **body) -> None:
    ws.send(json.dumps({'type': 'response.create', **body}))


def test_a_text_response_streams_the_sse_events_and_is_stored(stack):
    with stack.client().responses.connect() as conn:
        response = completed(conn, model='Chat', input='hello there')
    text = response['output'][0]['content'][0]['text']
    assert text and response['status'] == 'completed' and response['usage']['total_tokens'] > 0
    assert stack.client().responses.retrieve(response['id']).output_text == text      # recorded as over HTTP
    assert stack.record('a', response['id'])['status'] == 'completed'


def test_a_function_call_round_trip_continues_on_the_same_socket(stack):
    stack.fake.clear()
    with stack.client().responses.connect() as conn:
        first = completed(conn, model='Claude', input=ASK, tools=[ORDER_TOOL])
        call = next(i for i in first['output'] if i['type'] == 'function_call')
        assert call['name'] == 'get_order' and json.loads(call['arguments']) == {'order_id': 'A-17'}
        second = completed(conn, model='Claude', previous_response_id=first['id'], tools=[ORDER_TOOL],
                           input=[{'type': 'function_call_output', 'call_id': call['call_id'], 'output': 'shipped'}])
    assert second['previous_response_id'] == first['id']
    assert second['output'][-1]['content'][0]['text'] == 'tool said: shipped'
    assert stack.record('a', second['id'])['tool_outputs'] == [
        {'call_id': call['call_id'], 'name': 'get_order', 'response_id': first['id'], 'status': 'answered'}]
    # Claude's signed thinking went back with its tool use, as over HTTP.
    sent = [r for r in stack.fake.requests if r['path'].endswith('/messages')][-1]['body']
    assert sent['messages'][1]['content'][0]['type'] == 'thinking'
    assert stack.fake.violations == []


def test_three_responses_in_sequence_each_continuing_the_last(stack):
    stack.fake.clear()
    ids = []
    with stack.client().responses.connect() as conn:
        for n in range(3):
            kw = {'previous_response_id': ids[-1]} if ids else {}
            ids.append(completed(conn, model='Chat', input=f'turn {n}', **kw)['id'])
    assert len(set(ids)) == 3
    sent = [r['body']['messages'] for r in stack.fake.requests if r['path'].endswith('/chat/completions')]
    assert [m['content'] for m in sent[-1] if m['role'] == 'user'] == ['turn 0', 'turn 1', 'turn 2']


def test_a_response_continues_on_the_other_process_and_over_http(stack):
    with stack.client(process=0).responses.connect() as conn:
        first = completed(conn, model='Chat', input='remember the word kiwi')
    with stack.client(process=1).responses.connect() as conn:
        second = completed(conn, model='Chat', input='and now?', previous_response_id=first['id'])
    third = stack.client(process=0).responses.create(model='Chat', input='over http',
                                                     previous_response_id=second['id'])
    assert third.status == 'completed' and third.previous_response_id == second['id']


def test_the_async_client_speaks_it_too(stack):
    async def run() -> list[dict]:
        client = AsyncOpenAI(base_url=f'http://127.0.0.1:{stack.ports[1]}/v1', api_key=KEYS['a'][0], max_retries=0)
        async with client.responses.connect() as conn:
            await conn.response.create(model='Chat', input='hello async')
            events = []
            async for event in conn:
                events.append(event.model_dump(mode='json', exclude_unset=True, warnings=False))
                if event.type in ENDINGS:
                    return events
    events = asyncio.run(asyncio.wait_for(run(), 30))
    assert events[0]['type'] == 'response.created' and events[-1]['type'] == 'response.completed'


@pytest.mark.parametrize('secret', ['sk-not-a-key-of-this-gateway', ''])
def test_a_bad_key_is_a_401_before_the_upgrade(stack, secret):
    with pytest.raises(InvalidStatus) as failed:
        ws_connect(stack.ws_url(), additional_headers={'Authorization': f'Bearer {secret}'} if secret else {},
                   open_timeout=20)
    answer = failed.value.response
    assert answer.status_code == 401
    assert json.loads(answer.body)['error']['code'] == 'invalid_api_key'
    with pytest.raises(InvalidStatus):          # through the SDK alike
        stack.client('sk-not-a-key-of-this-gateway').responses.connect().enter()


def test_a_refused_request_is_an_error_event_and_the_socket_stays_open(stack):
    with stack.client().responses.connect() as conn:
        missing = refused(conn, model='NoSuchModel', input='hi')
        assert missing['status'] == 404 and missing['error']['code'] == 'model_not_found'
        bad = refused(conn, model='Chat', input='hi', temperature='hot')
        assert bad['status'] == 400 and bad['error']['param'] == 'temperature'
        unknown = refused(conn, model='Chat', input='hi', previous_response_id='resp_nope')
        assert unknown['status'] == 404 and unknown['error']['param'] == 'previous_response_id'
        lanes = refused(conn, model='Chat', input='hi', stream_id='lane-1')
        assert lanes['error']['param'] == 'stream_id'
        assert completed(conn, model='Chat', input='still here')['status'] == 'completed'


def test_messages_that_are_not_a_create_are_error_events(stack):
    with raw_socket(stack) as ws:
        for message, words in [('not json', 'not valid JSON'), ('[1, 2]', 'JSON object'),
                               (json.dumps({'type': 'response.steer', 'input': 'x'}), 'unsupported event type'),
                               (b'{"type": "response.create"}', 'text message'),
                               (json.dumps({'type': 'response.create', 'model': 'Chat', 'input': 'x',
                                            'stream': False}), 'every response is streamed')]:
            ws.send(message)
            event = json.loads(ws.recv(timeout=20))
            ResponseWsError.model_validate(event)
            assert event['type'] == 'error' and words in event['error']['message'], (message, event)
        send_create(ws, model='Chat', input='and a real one')
        assert json.loads(ws.recv(timeout=20))['type'] == 'response.created'


def test_a_tenant_cannot_continue_another_tenants_response(stack):
    with stack.client('a').responses.connect() as conn:
        first = completed(conn, model='Chat', input='tenant a only')
    with stack.client('b').responses.connect() as conn:
        assert refused(conn, model='Chat', input='hi', previous_response_id=first['id'])['status'] == 404


def test_zero_retention_keeps_no_text_over_the_socket_either(stack):
    with stack.client('zero').responses.connect() as conn:
        first = completed(conn, model='Chat', input='a secret sentence, not to be kept')
        again = refused(conn, model='Chat', input='more', previous_response_id=first['id'])
    assert again['status'] in (400, 404)
    record = stack.record('zero', first['id'])
    assert record['status'] == 'completed' and 'output' not in record and 'secret sentence' not in json.dumps(record)


def test_limits_refuse_in_band_with_429_and_the_rate_headers(stack):
    with stack.client('rpm').responses.connect() as conn:
        answered = 0
        for _ in range(2):
            conn.response.create(model='Chat', input='counted')
            answered += response_events(conn)[-1]['type'] == 'response.completed'
        limited = refused(conn, model='Chat', input='one too many')
    # The key's rpm of 2 is per minute: a minute boundary between the creates may admit one more.
    assert answered == 2 or limited['status'] == 200
    assert limited['status'] == 429 and limited['error']['code'] == 'rate_limit_exceeded'
    headers = limited['error']['headers']
    assert headers['x-ratelimit-limit-requests'] == '2' and int(headers['retry-after']) >= 1


def test_a_second_create_while_one_streams_is_refused_and_the_first_goes_on(stack):
    with raw_socket(stack) as ws:
        send_create(ws, model='Slow', input='go on for a while')
        seen = [json.loads(ws.recv(timeout=20))]
        assert seen[0]['type'] == 'response.created'
        send_create(ws, model='Chat', input='me too')
        while seen[-1]['type'] != 'error':
            seen.append(json.loads(ws.recv(timeout=20)))
        error = seen.pop()
        ResponseWsError.model_validate(error)
        assert error['error']['code'] == 'response_in_progress' and error['status'] == 400
        after = json.loads(ws.recv(timeout=20))        # the first response goes on where it was
        assert after['sequence_number'] == seen[-1]['sequence_number'] + 1


def test_a_client_that_closes_mid_response_cancels_it(stack):
    stack.slow.hung_up.clear()
    with raw_socket(stack) as ws:
        send_create(ws, model='Slow', input='go on forever')
        created = json.loads(ws.recv(timeout=20))
        for _ in range(8):
            ws.recv(timeout=20)
    response_id = created['response']['id']
    assert stack.slow.hung_up.wait(15), 'the gateway kept reading the provider after its client left'
    record = wait_for(lambda: (r := stack.record('a', response_id)) and r['status'] == 'cancelled' and r,
                      'the response to be recorded cancelled')
    assert record['usage']['estimated'] is True and 0 < record['usage']['output_tokens'] < WORDS


def test_an_idle_socket_is_closed_at_the_idle_timeout_pings_or_not(stack):
    started = time.monotonic()
    with raw_socket(stack, ping_interval=0.2) as ws:          # pings are answered, but are no message
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=IDLE_TIMEOUT + 30)
    waited = time.monotonic() - started
    assert closed.value.rcvd.code == 1000 and closed.value.rcvd.reason == 'idle timeout'
    assert IDLE_TIMEOUT - 0.5 < waited < IDLE_TIMEOUT + 20


def test_the_idle_clock_restarts_after_each_response(stack):
    with stack.client().responses.connect() as conn:
        for n in range(2):
            completed(conn, model='Chat', input=f'turn {n}')
            time.sleep(IDLE_TIMEOUT * 0.6)          # each wait alone is under the timeout
        assert completed(conn, model='Chat', input='still open')['status'] == 'completed'


def test_an_oversized_message_closes_that_socket_only(stack):
    with raw_socket(stack) as other, raw_socket(stack, max_size=None) as big:
        send_create(big, model='Chat', input='x' * (MAX_MESSAGE + 1))
        with pytest.raises(ConnectionClosed) as closed:
            big.recv(timeout=20)
        assert closed.value.rcvd.code == 1009
        send_create(other, model='Chat', input='unaffected')
        events = []
        while not events or events[-1]['type'] not in ENDINGS:
            events.append(json.loads(other.recv(timeout=20)))
        assert events[-1]['type'] == 'response.completed'
    # A message just under the limit is taken.
    with raw_socket(stack) as ws:
        send_create(ws, model='Chat', input='y' * (MAX_MESSAGE - 200))
        assert json.loads(ws.recv(timeout=20))['type'] == 'response.created'


def test_many_idle_sockets_are_closed_and_the_server_stays_responsive(stack):
    async def run() -> tuple[list, float]:
        headers = {'Authorization': f'Bearer {KEYS["a"][0]}'}
        sockets = await asyncio.gather(*[websockets.connect(stack.ws_url(), additional_headers=headers,
                                                            ping_interval=None, open_timeout=60)
                                         for _ in range(IDLE_SOCKETS)])
        opened = time.monotonic()
        health = await asyncio.to_thread(requests.get, f'http://127.0.0.1:{stack.ports[0]}/health', timeout=10)
        assert health.status_code == 200
        codes = await asyncio.gather(*[_closed_code(ws) for ws in sockets])
        return codes, time.monotonic() - opened

    codes, waited = asyncio.run(asyncio.wait_for(run(), 120))
    assert codes == [1000] * IDLE_SOCKETS and waited < IDLE_TIMEOUT + 60
    with stack.client().responses.connect() as conn:
        assert completed(conn, model='Chat', input='after the crowd')['status'] == 'completed'


async def _closed_code(ws) -> int:
    try:
        await ws.recv()
    except ConnectionClosed as e:
        return e.rcvd.code if e.rcvd else -1
    return 0


def test_a_websocket_elsewhere_under_v1_is_refused_before_the_upgrade(stack):
    with pytest.raises(InvalidStatus) as failed:
        ws_connect(f'ws://127.0.0.1:{stack.ports[0]}/v1/chat/completions',
                   additional_headers={'Authorization': f'Bearer {KEYS["a"][0]}'}, open_timeout=20)
    assert failed.value.response.status_code == 404




def test_the_documented_example_runs(stack, capsys):
    page = (Path(__file__).parent.parent / 'docs' / 'gateway.md').read_text()
    section = page.split('## WebSocket mode', 1)[1]
    snippet = section.split('```python\n', 1)[1].split('```', 1)[0]
    exec(snippet.replace('http://127.0.0.1:17010/v1', f'http://127.0.0.1:{stack.ports[0]}/v1')
         .replace('sk-...a gateway key...', KEYS['a'][0]).replace("'Support'", "'Chat'"), {})
    lines = capsys.readouterr().out.strip().splitlines()
    # The fake provider's answer tells what it was sent: the second turn had the first as its history.
    assert len(lines) == 2 and lines[0].startswith('echo: What is the capital of France?')
    assert 'previous: What is the capital of France?' in lines[1]


def test_the_documented_settings_load_and_bad_ones_name_the_field(tmp_path):
    from llmconn.config import load_file
    from llmconn.errors import ConfigError
    page = (Path(__file__).parent.parent / 'docs' / 'gateway.md').read_text()
    example = page.split('## WebSocket mode', 1)[1].split('```yaml\n', 1)[1].split('```', 1)[0]
    base = 'llm:\n  - {name: Chat, provider: openai, model: gpt-4.1, api_key: sk-x}\n'
    path = tmp_path / 'llm.yaml'
    path.write_text(example + '  keys: [{id: k, secret: sk-long-secret, tenant: t, models: ["*"]}]\n' + base)
    settings = load_file(path).gateway.websocket
    assert (settings.idle_timeout, settings.max_message_bytes) == (300, 10485760)
    path.write_text('gateway:\n  websocket: {idle_timeout: 0}\n' + base)
    with pytest.raises(ConfigError, match='idle_timeout'):
        load_file(path)


def test_at_the_connection_limit_a_waiting_socket_is_evicted_first(tmp_path):
    """A socket waiting for its next message is idle to --max-connections: a new connection closes it."""
    fake = FakeProviderServer().start()
    config = one_key_config(tmp_path, fake.url)
    port = free_port()
    proc = start_server(config, tmp_path / 'services', port, extra=['--max-connections', '3'])
    try:
        url = f'ws://127.0.0.1:{port}/v1/responses'
        headers = {'Authorization': f'Bearer {KEYS["a"][0]}'}
        sockets = [ws_connect(url, additional_headers=headers, open_timeout=20) for _ in range(3)]
        assert requests.get(f'http://127.0.0.1:{port}/health', timeout=10).status_code == 200
        with pytest.raises(ConnectionClosed) as closed:
            sockets[0].recv(timeout=20)         # the longest idle made room for /health
        assert closed.value.rcvd.code == 1001
        for ws in sockets:
            ws.close()
    finally:
        stop(proc)
        fake.stop()


def test_on_shutdown_a_waiting_socket_closes_at_once_and_a_streaming_one_after_its_response(tmp_path):
    """SIGTERM: the drain does not wait out its grace for sockets that only wait for their next message."""
    fake = FakeProviderServer().start()
    fake.latency = 2.0          # the provider is still thinking when the signal comes
    config = one_key_config(tmp_path, fake.url)
    port = free_port()
    grace = 60.0
    proc = start_server(config, tmp_path / 'services', port, extra=['--grace', str(grace)])
    try:
        url = f'ws://127.0.0.1:{port}/v1/responses'
        headers = {'Authorization': f'Bearer {KEYS["a"][0]}'}
        waiting = ws_connect(url, additional_headers=headers, open_timeout=20)
        streaming = ws_connect(url, additional_headers=headers, open_timeout=20)
        send_create(streaming, model='Chat', input='an answer in progress')
        wait_for(lambda: fake.requests, 'the provider to be asked')
        started = time.monotonic()
        proc.terminate()
        with pytest.raises(ConnectionClosed) as closed:
            waiting.recv(timeout=30)
        assert closed.value.rcvd.code == 1001
        types = []
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                types.append(json.loads(streaming.recv(timeout=30))['type'])
        assert types[0] == 'response.created' and types[-1] == 'response.completed'
        assert closed.value.rcvd.code == 1001
        proc.wait(timeout=grace)
        assert time.monotonic() - started < grace / 2
    finally:
        stop(proc)
        fake.stop()


def test_a_frame_announcing_a_gigabyte_is_refused_from_its_header(stack):
    """The size is refused as announced: the server closes at once, without waiting for the payload."""
    sock = socket.create_connection(('127.0.0.1', stack.ports[0]), timeout=20)
    try:
        head = _raw_handshake(sock)
        assert head.startswith(b'HTTP/1.1 101')
        started = time.monotonic()
        sock.sendall(b'\x81\xff' + (2 ** 30).to_bytes(8, 'big') + b'mask')     # a masked text frame's header
        assert _close_code(sock, head) == 1009
        assert time.monotonic() - started < 15
    finally:
        sock.close()


def test_a_key_a_reload_removed_is_refused_on_its_open_socket_which_then_closes(tmp_path):
    fake = FakeProviderServer().start()
    config = tmp_path / 'llm.yaml'

    def write(*names: str) -> None:
        keys = ', '.join(f'{{id: key-{n}, secret: {KEYS[n][0]}, tenant: t, models: ["*"]}}' for n in names)
        config.write_text(f'gateway:\n  keys: [{keys}]\nllm:\n  - {{name: Chat, provider: openai, model: gpt-4.1, '
                          f'address: "{fake.url}/v1", max_retries: 0}}\n')

    write('a', 'b')
    (tmp_path / 'services').mkdir()
    port = free_port()
    proc = start_server(config, tmp_path / 'services', port)
    try:
        client = OpenAI(base_url=f'http://127.0.0.1:{port}/v1', api_key=KEYS['b'][0], max_retries=0, timeout=20)
        with client.responses.connect() as conn:
            completed(conn, model='Chat', input='while the key is good')
            write('a')
            wait_for(lambda: requests.get(f'http://127.0.0.1:{port}/v1/models', timeout=10,
                                          headers={'Authorization': f'Bearer {KEYS["b"][0]}'}).status_code == 401,
                     'the reload to drop the key')
            event = refused(conn, model='Chat', input='after the reload')
            assert event['status'] == 401 and event['error']['code'] == 'invalid_api_key'
            with pytest.raises(ConnectionClosed) as closed:
                conn.recv_bytes()
            assert closed.value.rcvd.code == 1008
    finally:
        stop(proc)
        fake.stop()


def test_a_text_message_that_is_not_utf8_closes_its_socket_with_1007(stack):
    sock = socket.create_connection(('127.0.0.1', stack.ports[0]), timeout=20)
    try:
        head = _raw_handshake(sock)
        assert head.startswith(b'HTTP/1.1 101')
        sock.sendall(b'\x81\x86' + b'\x00' * 4 + b'\xff\xfe bad')       # a masked text frame, mask 0
        assert _close_code(sock, head) == 1007
    finally:
        sock.close()
    with stack.client().responses.connect() as conn:            # the process serves on, no traceback
        assert completed(conn, model='Chat', input='after it')['status'] == 'completed'


def _close_code(sock, head: bytes) -> int:
    """The code of the close frame the server sends next (what followed the handshake's head included)."""
    answer = head.split(b'\r\n\r\n', 1)[1]
    while len(answer) < 4:
        chunk = sock.recv(4096)
        assert chunk, answer
        answer += chunk
    assert answer[0] == 0x88, answer            # a close frame
    return int.from_bytes(answer[2:4], 'big')


def _raw_handshake(sock) -> bytes:
    sock.sendall(('GET /v1/responses HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n'
                  'Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n'
                  f'Authorization: Bearer {KEYS["a"][0]}\r\n\r\n').encode())
    head = b''
    while b'\r\n\r\n' not in head:
        chunk = sock.recv(4096)
        assert chunk, head
        head += chunk
    return head


FLOOD_SECONDS = 8.0


def test_a_ping_flood_does_not_starve_the_other_requests_of_its_process(tmp_path):
    """Pings are answered and not counted as messages; the flooding socket cannot monopolize the process."""
    config = tmp_path / 'llm.yaml'
    config.write_text(f'''
gateway:
  websocket: {{idle_timeout: 60}}
  keys: [{{id: k, secret: {KEYS["a"][0]}, tenant: t, models: ["*"]}}]
llm:
  - {{name: Chat, provider: openai, model: gpt-4.1, api_key: sk-unused}}
''')
    (tmp_path / 'services').mkdir()
    port = free_port()
    proc = start_server(config, tmp_path / 'services', port)
    sock = socket.create_connection(('127.0.0.1', port), timeout=20)
    stop_at = time.monotonic() + FLOOD_SECONDS

    def flood() -> None:
        burst = (b'\x89\x80' + b'\x00' * 4) * 20000         # masked empty pings
        try:
            while time.monotonic() < stop_at:
                sock.sendall(burst)
        except OSError:
            pass

    def drain() -> None:            # read the pongs, so the server's sends never wait on this client
        try:
            while sock.recv(1 << 20):
                pass
        except OSError:
            pass

    threads = [threading.Thread(target=flood, daemon=True), threading.Thread(target=drain, daemon=True)]
    try:
        _raw_handshake(sock)
        for thread in threads:
            thread.start()
        time.sleep(0.5)
        slowest = 0.0
        while time.monotonic() < stop_at - 1:
            started = time.monotonic()
            assert requests.get(f'http://127.0.0.1:{port}/health', timeout=30).status_code == 200
            slowest = max(slowest, time.monotonic() - started)
        # Starved, a probe waits for the flood to end (seconds); a generous bound for a loaded machine.
        assert slowest < FLOOD_SECONDS / 2, slowest
    finally:
        sock.close()
        stop(proc)


def test_a_message_in_many_fragments_is_assembled(stack):
    sock = socket.create_connection(('127.0.0.1', stack.ports[0]), timeout=20)
    try:
        _raw_handshake(sock)
        text = json.dumps({'type': 'response.create', 'model': 'Chat', 'input': 'in pieces'}).encode()
        frames = [bytes([0x01 if i == 0 else 0x00, 0x81]) + b'\x00' * 4 + text[i:i + 1] for i in range(len(text) - 1)]
        frames.append(bytes([0x80, 0x81]) + b'\x00' * 4 + text[-1:])      # the last one has FIN
        sock.sendall(b''.join(frames))
        answer = b''
        while b'response.created' not in answer:
            chunk = sock.recv(65536)
            assert chunk, answer
            answer += chunk
    finally:
        sock.close()


def test_a_warm_up_records_its_input_without_the_provider_and_the_next_response_continues_it(stack):
    # generate: false (as OpenClaw sends first on every socket): the request's state, no model output.
    stack.fake.clear()
    with stack.client().responses.connect() as conn:
        conn.response.create(model='Chat', input=[{'role': 'developer', 'content': 'the word is teal'}],
                             instructions='be brief', generate=False)
        events = response_events(conn)
        check_stream(events)
        assert [e['type'] for e in events] == ['response.created', 'response.in_progress', 'response.completed']
        warm = events[-1]['response']
        assert warm['output'] == [] and warm['usage']['total_tokens'] == 0
        assert stack.fake.requests == []                                  # the provider was not asked
        answer = completed(conn, model='Chat', input='which word?', previous_response_id=warm['id'])
    assert answer['previous_response_id'] == warm['id']
    sent = [r['body'] for r in stack.fake.requests if r['path'].endswith('/chat/completions')]
    assert len(sent) == 1
    # The warm-up's input goes first; its instructions, as any response's, do not carry over.
    assert [m['content'] for m in sent[0]['messages']] == ['the word is teal', 'which word?']
    assert stack.record('a', warm['id'])['status'] == 'completed'


def test_a_warm_up_counts_against_the_rpm_and_a_bad_generate_is_refused(stack):
    with raw_socket(stack) as ws:
        send_create(ws, model='Chat', input='hi', generate='no')
        event = json.loads(ws.recv(timeout=20))
        assert event['type'] == 'error' and event['error']['param'] == 'generate'
    with stack.client('warm').responses.connect() as conn:
        codes = []
        for _ in range(5):          # an rpm of 2: at most 4 across a minute's edge
            conn.response.create(model='Chat', input='hi', generate=False)
            codes.append(response_events(conn)[-1].get('status', 200))
    assert 429 in codes and set(codes) == {200, 429}, codes


def test_the_sdk_reconnects_after_a_restart_s_1001_and_continues_the_conversation(tmp_path):
    # A rolling restart: the old process closes its waiting socket with 1001 (going away), the SDK
    # reconnects to the new one on the same port, and the chain goes on from Redis.
    redis_server = RedisServer().start()
    fake = FakeProviderServer().start()
    config = one_key_config(tmp_path, fake.url, redis_server.url)
    port = free_port()
    proc = start_server(config, tmp_path / 'services', port)
    codes: list = []

    def reconnecting(event):
        codes.append(event.close_code)
        return None
    try:
        client = OpenAI(base_url=f'http://127.0.0.1:{port}/v1', api_key=KEYS['a'][0], max_retries=0, timeout=20)
        with client.responses.connect(on_reconnecting=reconnecting) as conn:
            first = completed(conn, model='Chat', input='turn 0')
            got: list = []

            def read():         # the SDK reconnects where it reads: iterating the connection
                for event in conn:
                    got.append(event)
                    if event.type in ENDINGS:
                        return
            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            stop(proc)
            proc = start_server(config, tmp_path / 'services', port)
            wait_for(lambda: codes, 'the SDK to reconnect')
            conn.response.create(model='Chat', input='turn 1', previous_response_id=first['id'])
            reader.join(30)
        assert codes[0] == 1001, codes
        assert got and got[-1].type == 'response.completed', got[-1:]
        assert got[-1].response.previous_response_id == first['id']
        sent = [r['body']['messages'] for r in fake.requests if r['path'].endswith('/chat/completions')]
        assert [m['content'] for m in sent[-1] if m['role'] == 'user'] == ['turn 0', 'turn 1']
    finally:
        stop(proc)
        fake.stop()
        redis_server.stop()
