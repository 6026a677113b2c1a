"""``llmconn serve`` over real HTTP: a server subprocess, the fake provider, the demo services.

Error mapping (and that no traceback or secret leaks), API keys, the store
being down, graceful SIGTERM, the listening socket's TCP_NODELAY, and
Server-Sent Events read incrementally by a real HTTP client.
"""

import json
import shutil
import signal
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest
import requests

from llmconn.demo import start_server, stop
from llmconn.server import listen
from llmconn.testing.fake_server import FakeProviderServer
from waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent
SECRET = 'sk-test-secret-must-never-leak'
API_KEY = 'host-key-123'

TEST_SERVICES = '''
from llmconn.service import Service, ServiceError


class Boom(Service):
    name = 'test.boom'

    def handle(self):
        raise RuntimeError('kaboom with ' + SECRET)


class Echo(Service):
    name = 'test.echo'
    input = 'a', '-b'
    output = 'a', '-b'

    def handle(self):
        self.response.payload = {'a': self.request.input.a, 'b': self.request.input.b, 'dropped': 1}


class Text(Service):
    name = 'test.text'

    def handle(self):
        self.response.payload = 'plain words'
        self.response.status_code = 201
        self.response.headers['X-Extra'] = 'yes'


class Teapot(Service):
    name = 'test.teapot'

    def handle(self):
        raise ServiceError('short and stout', status=418)


class Nested(Service):
    name = 'test.nested'

    def handle(self):
        inner = self.invoke('test.echo', {'a': self.cid})
        self.response.payload = {'outer_cid': self.cid, 'inner': inner}
'''.replace('SECRET', repr(SECRET))


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def write_config(path, provider_url, redis_url='memory://', api_keys=(), extra=''):
    keys = ''.join(f'\n    - {k}' for k in api_keys) or ' []'
    path.write_text(f'''
redis:
  url: {redis_url}
skills_dir: {ROOT / 'etc' / 'skills'}
server:
  api_keys:{keys}
llm:
  - name: Support
    provider: claude
    model: claude-sonnet-5-5
    address: {provider_url}
    secret: {SECRET}
    max_retries: 0
    lock_wait: 0.3
{extra}''')
    return path


def make_services(directory):
    directory.mkdir(exist_ok=True)
    for name in ('demo_llm.py', 'demo_admin.py'):
        shutil.copy(ROOT / 'services' / name, directory / name)
    (directory / 'test_services.py').write_text(TEST_SERVICES)
    return directory


class Host:
    """A running server subprocess and its base URL."""

    def __init__(self, tmp, provider_url, **config):
        self.port = free_port()
        self.url = f'http://127.0.0.1:{self.port}'
        self.config = write_config(tmp / 'llm.yaml', provider_url, **config)
        self.services = make_services(tmp / 'services')
        self.proc = start_server(self.config, self.services, self.port)
        self.session = requests.Session()

    def post(self, service, json=None, **kw):
        return self.session.post(f'{self.url}/{service}', json=json, timeout=10, **kw)

    def close(self):
        self.session.close()
        stop(self.proc)


@pytest.fixture(scope='module')
def fake():
    with FakeProviderServer() as server:
        yield server


@pytest.fixture(autouse=True)
def calm_fake(fake):
    fake.clear_faults()
    fake.latency = 0.0
    yield


@pytest.fixture(scope='module')
def host(tmp_path_factory, fake):
    h = Host(tmp_path_factory.mktemp('host'), fake.url)
    yield h
    h.close()


@pytest.fixture(scope='module')
def keyed(tmp_path_factory, fake):
    h = Host(tmp_path_factory.mktemp('keyed'), fake.url, api_keys=['other-key', API_KEY])
    yield h
    h.close()


def user():
    return f'user-{uuid.uuid4().hex[:8]}'


def assert_safe_error(response, status):
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {'error', 'cid'} and body['error']
    assert body['cid'] == response.headers['X-Cid']
    assert SECRET not in response.text and 'Traceback' not in response.text


# -- the happy paths ---------------------------------------------------------------------------

def test_health_is_a_bare_liveness_answer(host):
    response = host.session.get(f'{host.url}/health', timeout=5)
    assert response.status_code == 200 and response.json() == {'status': 'ok'}


def test_ready_when_the_config_is_loaded_and_the_store_answers(host):
    response = host.session.get(f'{host.url}/ready', timeout=5)
    assert response.status_code == 200 and response.json() == {'status': 'ready'}


def test_services_lists_connections_and_services(host):
    listing = host.session.get(f'{host.url}/services', timeout=5).json()
    assert listing['connections'] == ['Support']
    assert {'demo.llm.support-chat', 'demo.llm.ask', 'test.echo'} <= {s['name'] for s in listing['services']}


def test_services_lists_each_service_with_its_file_and_deploy_time(host):
    listing = host.session.get(f'{host.url}/services', timeout=5).json()
    by_name = {s['name']: s for s in listing['services']}
    assert by_name['demo.llm.support-chat']['file'].endswith('demo_llm.py')
    assert by_name['test.echo']['deployed_at'].endswith('Z')
    assert all(f['last_error'] is None for f in listing['files'])
    # Clients get file names, never where the server keeps its files.
    assert '/' not in json.dumps([s['file'] for s in listing['services']] + [f['file'] for f in listing['files']]
                                 + [(listing['config'] or {}).get('file', '')])


def test_support_chat_remembers_the_first_turn(host):
    who = user()
    first = host.post('demo.llm.support-chat', {'user_id': who, 'text': 'Hi, my name is Ann'})
    assert first.status_code == 200, first.text
    second = host.post('demo.llm.support-chat', {'user_id': who, 'text': 'What is my name?'}).json()
    assert 'echo: What is my name? | users: 2 | previous: Hi, my name is Ann' in second['reply']
    assert second['usage']['input_tokens'] > 0 and second['usage']['output_tokens'] > 0


def test_chat_ids_come_from_user_ids_so_users_do_not_share(host):
    host.post('demo.llm.support-chat', {'user_id': user(), 'text': 'I am user one'})
    reply = host.post('demo.llm.support-chat', {'user_id': user(), 'text': 'Who am I?'}).json()['reply']
    assert 'users: 1 | previous: -' in reply


def test_skill_is_sent_as_the_system_prompt(host):
    reply = host.post('demo.llm.support-chat', {'user_id': user(), 'text': 'hello', 'skill': 'support-agent'})
    assert 'system: yes' in reply.json()['reply']


def test_ask_is_one_shot(host):
    host.post('demo.llm.ask', {'text': 'first question'})
    reply = host.post('demo.llm.ask', {'text': 'second question'}).json()['reply']
    assert 'users: 1 | previous: -' in reply


def test_declared_output_drops_undeclared_fields(host):
    assert host.post('test.echo', {'a': 1}).json() == {'a': 1, 'b': None}


def test_text_payload_status_and_headers_set_by_the_service(host):
    response = host.post('test.text')
    assert response.status_code == 201 and response.text == 'plain words'
    assert response.headers['Content-Type'].startswith('text/plain') and response.headers['X-Extra'] == 'yes'


def test_invoke_runs_another_service_under_the_same_cid(host):
    response = host.post('test.nested')
    body = response.json()
    assert body['outer_cid'] == response.headers['X-Cid'] == body['inner']['a']


# -- error mapping -----------------------------------------------------------------------------

def test_unknown_service_is_404(host):
    assert_safe_error(host.post('no.such.service', {}), 404)


def test_body_that_is_not_json_is_400(host):
    assert_safe_error(host.session.post(f'{host.url}/test.echo', data=b'{not json', timeout=5), 400)


def test_missing_input_field_is_400_naming_it(host):
    response = host.post('demo.llm.support-chat', {'user_id': 'u'})
    assert_safe_error(response, 400)
    assert 'text' in response.json()['error']


def test_invalid_input_from_the_connection_is_400(host):
    response = host.post('demo.llm.support-chat', {'user_id': 'x' * 300, 'text': 'hi'})
    assert_safe_error(response, 400)
    assert 'chat_id' in response.json()['error']


def test_get_on_a_service_is_405(host):
    assert host.session.get(f'{host.url}/test.echo', timeout=5).status_code == 405


def test_service_error_carries_its_own_status(host):
    response = host.post('test.teapot')
    assert_safe_error(response, 418)
    assert response.json()['error'] == 'short and stout'


def test_unexpected_exception_is_500_without_traceback_or_secret(host):
    response = host.post('test.boom')
    assert_safe_error(response, 500)
    assert 'kaboom' not in response.text


def test_provider_failure_is_502_without_the_secret(host, fake):
    fake.fail(500, body={'error': {'type': 'api_error', 'message': f'upstream saw {SECRET}'}})
    response = host.post('demo.llm.support-chat', {'user_id': user(), 'text': 'hi'})
    assert_safe_error(response, 502)


def test_busy_chat_is_429_with_retry_after(host, fake):
    who = user()
    fake.hang(1.5)
    first, before = {}, len(fake.requests)
    thread = threading.Thread(target=lambda: first.update(
        r=requests.post(f'{host.url}/demo.llm.support-chat', json={'user_id': who, 'text': 'slow'}, timeout=10)))
    thread.start()
    wait_until(lambda: len(fake.requests) > before, 'the first call reached the provider (holding the chat)')
    response = host.post('demo.llm.support-chat', {'user_id': who, 'text': 'impatient'})
    thread.join()
    assert_safe_error(response, 429)
    assert int(response.headers['Retry-After']) >= 1
    assert first['r'].status_code == 200


def test_admin_service_is_refused_when_no_api_key_is_configured(host):
    assert_safe_error(host.post('demo.llm.admin.get-history', {'user_id': 'u'}), 403)


# -- API keys ----------------------------------------------------------------------------------

def test_requests_without_a_valid_api_key_are_401(keyed):
    assert_safe_error(keyed.post('test.echo', {'a': 1}), 401)
    assert_safe_error(keyed.post('test.echo', {'a': 1}, headers={'X-API-Key': 'wrong'}), 401)
    assert_safe_error(keyed.session.get(f'{keyed.url}/services', timeout=5), 401)


def test_health_and_ready_answer_without_the_api_key(keyed):
    # A load balancer or orchestrator probes them without credentials.
    assert keyed.session.get(f'{keyed.url}/health', timeout=5).status_code == 200
    assert keyed.session.get(f'{keyed.url}/ready', timeout=5).status_code == 200


def test_either_header_carries_the_api_key(keyed):
    assert keyed.post('test.echo', {'a': 1}, headers={'X-API-Key': API_KEY}).status_code == 200
    assert keyed.post('test.echo', {'a': 1}, headers={'Authorization': f'Bearer {API_KEY}'}).status_code == 200


def test_admin_services_read_and_delete_history_with_the_key(keyed):
    auth = {'X-API-Key': API_KEY}
    who = user()
    keyed.post('demo.llm.support-chat', {'user_id': who, 'text': 'remember me'}, headers=auth)
    history = keyed.post('demo.llm.admin.get-history', {'user_id': who}, headers=auth).json()
    assert [m['role'] for m in history['messages']] == ['user', 'assistant']
    assert history['messages'][0]['content'] == 'remember me'
    assert keyed.post('demo.llm.admin.delete-history', {'user_id': who}, headers=auth).json()['deleted']
    assert keyed.post('demo.llm.admin.get-history', {'user_id': who}, headers=auth).json()['messages'] == []


# -- the store down, shutdown, the socket --------------------------------------------------------

def test_store_down_is_503_for_chat_while_one_shot_calls_work(tmp_path, fake):
    dead = f'redis://127.0.0.1:{free_port()}/0'
    h = Host(tmp_path, fake.url, redis_url=dead)
    try:
        assert_safe_error(h.post('demo.llm.support-chat', {'user_id': user(), 'text': 'hi'}), 503)
        assert h.post('demo.llm.ask', {'text': 'hi'}).status_code == 200
        assert h.session.get(f'{h.url}/health', timeout=5).status_code == 200     # alive, though
        ready = h.session.get(f'{h.url}/ready', timeout=5)
        assert ready.status_code == 503 and ready.json()['reason'] == 'the chat store does not answer'
        assert dead.rsplit(':', 1)[1].split('/')[0] not in ready.text     # no host:port of the store
    finally:
        h.close()


def test_sigterm_lets_the_in_flight_request_finish(tmp_path, fake):
    h = Host(tmp_path, fake.url)
    fake.hang(1.0)
    result, before = {}, len(fake.requests)
    thread = threading.Thread(target=lambda: result.update(
        r=requests.post(f'{h.url}/demo.llm.ask', json={'text': 'slow one'}, timeout=10)))
    thread.start()
    wait_until(lambda: len(fake.requests) > before, 'the request reached the provider (in flight)')
    h.proc.send_signal(signal.SIGTERM)
    thread.join()
    assert result['r'].status_code == 200 and 'slow one' in result['r'].json()['reply']
    assert h.proc.wait(10) == 0
    with pytest.raises(requests.ConnectionError):
        requests.get(f'{h.url}/health', timeout=2)
    h.close()


def test_listening_socket_sets_tcp_nodelay():
    sock = listen('127.0.0.1', 0)
    try:
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        sock.close()


def test_port_in_use_is_a_clear_error():
    sock = listen('127.0.0.1', 0)
    try:
        with pytest.raises(OSError, match='--port'):
            listen('127.0.0.1', sock.getsockname()[1])
    finally:
        sock.close()


# -- Server-Sent Events ------------------------------------------------------------------------

class GatedClaude:
    """A Claude Messages provider whose stream pauses after its first text delta until ``gate`` opens.

    It proves events reach the HTTP client while the provider is still answering,
    which a provider that sends everything at once cannot show.
    """

    DELTAS_AFTER_GATE = ['second ', 'third ', 'fourth ', 'fifth']

    def __init__(self):
        import http.server
        self.gate = threading.Event()
        self.finished = threading.Event()
        self.bodies = []
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = 'HTTP/1.1'

            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers['Content-Length'])))
                stub.bodies.append(body)
                try:
                    stub.stream(self, body) if body.get('stream') else stub.reply(self, body)
                except OSError:
                    pass        # the host went away mid-stream, which some tests do on purpose
                finally:
                    stub.finished.set()

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def server_bind(self):
                self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                super().server_bind()

        self.server = Server(('127.0.0.1', 0), Handler)
        self.url = f'http://127.0.0.1:{self.server.server_address[1]}'
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @staticmethod
    def users(body):
        return sum(1 for m in body['messages'] if m['role'] == 'user')

    def reply(self, handler, body):
        data = json.dumps({'id': 'msg_1', 'type': 'message', 'role': 'assistant', 'model': body['model'],
                           'content': [{'type': 'text', 'text': f'users: {self.users(body)}'}],
                           'stop_reason': 'end_turn', 'stop_sequence': None,
                           'usage': {'input_tokens': 3, 'output_tokens': 2}}).encode()
        handler.send_response(200)
        handler.send_header('Content-Type', 'application/json')
        handler.send_header('Content-Length', str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def stream(self, handler, body):
        handler.send_response(200)
        handler.send_header('Content-Type', 'text/event-stream')
        handler.send_header('Transfer-Encoding', 'chunked')
        handler.end_headers()

        def send(kind, data):
            chunk = f'event: {kind}\ndata: {json.dumps(dict(data, type=kind))}\n\n'.encode()
            handler.wfile.write(b'%x\r\n%s\r\n' % (len(chunk), chunk))
            handler.wfile.flush()

        send('message_start', {'message': {'id': 'msg_1', 'type': 'message', 'role': 'assistant', 'content': [],
                                           'model': body['model'], 'stop_reason': None, 'stop_sequence': None,
                                           'usage': {'input_tokens': 3, 'output_tokens': 1}}})
        send('content_block_start', {'index': 0, 'content_block': {'type': 'text', 'text': ''}})
        send('content_block_delta', {'index': 0, 'delta': {'type': 'text_delta', 'text': 'first '}})
        self.gate.wait(10)
        for text in self.DELTAS_AFTER_GATE:
            send('content_block_delta', {'index': 0, 'delta': {'type': 'text_delta', 'text': text}})
            time.sleep(0.02)
        send('content_block_stop', {'index': 0})
        send('message_delta', {'delta': {'stop_reason': 'end_turn', 'stop_sequence': None},
                               'usage': {'output_tokens': 5}})
        send('message_stop', {})
        handler.wfile.write(b'0\r\n\r\n')

    def close(self):
        self.gate.set()
        self.server.shutdown()
        self.server.server_close()


def read_events(response):
    """Yield (event, data) pairs from an SSE response as they arrive."""
    kind = None
    for line in response.iter_lines(chunk_size=1, decode_unicode=True):
        if line.startswith('event: '):
            kind = line[7:]
        elif line.startswith('data: '):
            yield kind, json.loads(line[6:])


@pytest.fixture()
def gated(tmp_path):
    stub = GatedClaude()
    h = Host(tmp_path, stub.url)
    yield stub, h
    h.close()
    stub.close()


def test_sse_events_reach_the_client_while_the_provider_is_still_answering(gated):
    stub, h = gated
    with requests.post(f'{h.url}/demo.llm.support-chat-stream', json={'user_id': user(), 'text': 'hi'},
                       stream=True, timeout=10) as response:
        assert response.headers['Content-Type'].startswith('text/event-stream')
        events = read_events(response)
        assert next(events) == ('text', {'text': 'first '})
        assert not stub.finished.is_set()       # the provider is still held at its first delta
        stub.gate.set()
        rest = list(events)
    assert ''.join(d['text'] for k, d in rest if k == 'text') == ''.join(GatedClaude.DELTAS_AFTER_GATE)
    assert [k for k, _ in rest][-1] == 'done' and [k for k, _ in rest].count('done') == 1
    done = rest[-1][1]
    assert done['text'] == 'first ' + ''.join(GatedClaude.DELTAS_AFTER_GATE)
    assert done['usage'] == {'input_tokens': 3, 'output_tokens': 5, 'cache_read_tokens': 0, 'cache_write_tokens': 0, 'reasoning_tokens': 0} and 'raw' not in done


def test_sse_client_disconnect_saves_nothing_and_frees_the_chat(gated):
    stub, h = gated
    who = user()
    response = requests.post(f'{h.url}/demo.llm.support-chat-stream', json={'user_id': who, 'text': 'hi'},
                             stream=True, timeout=10)
    assert next(read_events(response))[0] == 'text'
    response.close()                            # the client leaves mid-answer
    stub.gate.set()
    assert stub.finished.wait(5)
    # Sent at once: it waits in line until the host notices the client left (on its next write).
    follow_up = h.post('demo.llm.support-chat', {'user_id': who, 'text': 'are you there?'})
    assert follow_up.status_code == 200, follow_up.text     # not 429 after lock_wait: the lock was released
    assert follow_up.json()['reply'] == 'users: 1'          # the broken turn was not saved
    assert GatedClaude.users(stub.bodies[-1]) == 1


def test_sse_stream_saves_the_turn_when_done(host):
    who = user()
    with requests.post(f'{host.url}/demo.llm.support-chat-stream', json={'user_id': who, 'text': 'I am Ann'},
                       stream=True, timeout=10) as response:
        first = list(read_events(response))
    assert first[-1][0] == 'done'
    with requests.post(f'{host.url}/demo.llm.support-chat-stream', json={'user_id': who, 'text': 'Who am I?'},
                       stream=True, timeout=10) as response:
        second = list(read_events(response))
    streamed = ''.join(d['text'] for k, d in second if k == 'text')
    assert streamed == second[-1][1]['text']
    assert 'users: 2 | previous: I am Ann' in streamed


def test_sse_failure_before_the_first_event_gets_a_plain_status(host, fake):
    fake.fail(500)
    response = host.post('demo.llm.support-chat-stream', {'user_id': user(), 'text': 'hi'})
    assert_safe_error(response, 502)


# -- make run ----------------------------------------------------------------------------------

def test_demo_launcher_serves_a_conversation_offline_and_cleans_up(tmp_path):
    import os
    import subprocess
    import sys
    port, provider_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items()
           if k not in ('REDIS_URL', 'ANTHROPIC_API_KEY', 'LLMCONN_PROVIDER_ADDRESS', 'LLMCONN_API_KEY')}
    demo = subprocess.Popen([sys.executable, '-m', 'llmconn.demo', '--port', str(port),
                             '--provider-port', str(provider_port)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        lines = []
        for line in demo.stdout:
            lines.append(line)
            if line.startswith('Ctrl-C'):
                break
        commands = [line.strip() for line in lines if line.strip().startswith('curl -s ')]
        assert len(commands) >= 2
        # Run the printed commands as a user would paste them.
        answers = [subprocess.run(c, shell=True, capture_output=True, text=True, timeout=10).stdout
                   for c in commands[:2]]
        assert 'users: 2 | previous: My name is Ann' in json.loads(answers[1])['reply']
    finally:
        demo.send_signal(signal.SIGTERM)
        assert demo.wait(15) == 0
    for p in (port, provider_port):
        with pytest.raises(requests.ConnectionError):
            requests.get(f'http://127.0.0.1:{p}/health', timeout=2)


def test_the_readme_shows_exactly_the_commands_the_demo_prints():
    from llmconn.demo import conversation, curl_commands
    readme = (ROOT / 'README.md').read_text()
    section = readme[readme.index('## Talking to the demo'):readme.index('To use a real Redis')]
    shown = [line for line in section.splitlines() if line.startswith('curl ')]
    assert shown == curl_commands()
    printed = [line.strip() for line in conversation().splitlines() if line.strip().startswith('curl ')]
    assert all(command in conversation() for command in curl_commands()) and len(printed) >= 3


def test_make_run_takes_port_and_host():
    import subprocess
    # --no-print-directory: under `make test` this make is nested and would print "Leaving directory".
    done = subprocess.run(['make', '--no-print-directory', '-n', 'run', 'PORT=17999', 'HOST=0.0.0.0',
                           'PROVIDER_PORT=17998'], cwd=ROOT, capture_output=True, text=True, timeout=30)
    command = [line for line in done.stdout.splitlines() if 'llmconn.demo' in line][-1]
    assert 'llmconn.demo' in command and '--port 17999' in command and '--host 0.0.0.0' in command
    assert '--provider-port 17998' in command


def test_chunked_request_body_is_read(host):
    response = host.session.post(f'{host.url}/test.echo', data=iter([b'{"a": ', b'"chunked"}']), timeout=5)
    assert response.status_code == 200 and response.json()['a'] == 'chunked'
