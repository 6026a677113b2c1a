"""``llmconn serve`` against hostile services and clients: real server subprocesses (SPEC §14).

A service raising SystemExit, setting headers HTTP cannot carry; clients
that hold connections idle, send truncated or ambiguous bodies, deeply
nested JSON; the store's Redis stopped and started under /ready; the
process serving without having re-executed itself.
"""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
import requests

from llmconn.demo import start_server, stop
from llmconn.testing.fake_server import FakeProviderServer
from test_server import ROOT, free_port, make_services, write_config

HOSTILE = '''
import gevent.monkey
import sys

from llmconn.service import Service


class Exit(Service):
    name = 'hostile.exit'

    def handle(self):
        sys.exit(3)


class Interrupt(Service):
    name = 'hostile.interrupt'

    def handle(self):
        raise KeyboardInterrupt


class Header(Service):
    name = 'hostile.header'

    def handle(self):
        kind = self.request.payload['kind']
        if kind == 'crlf':
            self.response.headers['X-Evil'] = 'a\\r\\nSet-Cookie: stolen=1'
        elif kind == 'nul':
            self.response.headers['X-Evil'] = 'a\\x00b'
        elif kind == 'name':
            self.response.headers['Bad Name'] = 'x'
        elif kind == 'hop':
            self.response.headers['Transfer-Encoding'] = 'chunked'
        else:
            self.response.status_code = self.request.payload['status']
        self.response.payload = {'ok': True}


class StreamExit(Service):
    name = 'hostile.stream-exit'

    def handle(self):
        def events():
            yield 'first'
            sys.exit(4)
        self.response.stream(events())


class Hold(Service):
    name = 'hostile.hold'

    def handle(self):
        import gevent
        self.logger.info('holding cid=%s', self.cid)
        gevent.sleep(float(self.request.payload['seconds']))
        self.response.payload = {'held': True}


class HoldUntil(Service):
    name = 'hostile.hold-until'

    def handle(self):
        # Busy until the test creates the file (bounded, so a failed test leaves no request behind).
        import gevent
        from pathlib import Path
        self.logger.info('holding cid=%s', self.cid)
        release = Path(self.request.payload['release'])
        for _ in range(6000):
            if release.exists():
                break
            gevent.sleep(0.01)
        self.response.payload = {'held': True}


class Patched(Service):
    name = 'hostile.patched'

    def handle(self):
        self.response.payload = {'socket': gevent.monkey.is_module_patched('socket'),
                                 'ssl': gevent.monkey.is_module_patched('ssl')}


class Busy(Service):
    name = 'hostile.busy'

    def handle(self):
        from llmconn.errors import ChatBusy, LockLost, StoreError
        if self.request.payload['kind'] == 'busy':
            raise ChatBusy('Chat x is busy: another call held it. Try again later, or raise lock_wait')
        if self.request.payload['kind'] == 'lost':
            raise LockLost('The lock of chat x on redis://127.0.0.1:6390/0 expired (GC pause longer than '
                           'lock_ttl?). Retry the call; raise lock_ttl if this repeats.')
        raise StoreError('The chat store redis://127.0.0.1:6390/0 does not answer: Connection refused')
'''


class Server:
    """One ``llmconn serve`` subprocess with the hostile services; its stderr is kept in a file."""

    def __init__(self, tmp: Path, provider_url: str, extra=(), redis_url='memory://'):
        self.port = free_port()
        self.url = f'http://127.0.0.1:{self.port}'
        self.log = tmp / 'server.log'
        services = make_services(tmp / 'services')
        (services / 'hostile.py').write_text(HOSTILE)
        config = write_config(tmp / 'llm.yaml', provider_url, redis_url=redis_url)
        self._log_file = open(self.log, 'w')
        self.proc = start_server(config, services, self.port, extra=list(extra), stderr=self._log_file)

    def post(self, service, payload=None, **kw):
        return requests.post(f'{self.url}/{service}', json=payload, timeout=10, **kw)

    def get(self, path):
        return requests.get(f'{self.url}/{path}', timeout=10)

    def log_text(self):
        self._log_file.flush()
        return self.log.read_text()

    def close(self):
        stop(self.proc)
        self._log_file.close()


@pytest.fixture(scope='module')
def fake():
    with FakeProviderServer() as server:
        yield server


@pytest.fixture(scope='module')
def server(tmp_path_factory, fake):
    """One server for the tests that leave it running."""
    s = Server(tmp_path_factory.mktemp('shared'), fake.url)
    yield s
    s.close()


@pytest.fixture
def own_server(tmp_path, fake):
    """A server this test may stop; its 20 s grace shows whether a request was left counted."""
    s = Server(tmp_path, fake.url, extra=['--grace', '20'])
    yield s
    s.close()


def raw_request(port, data: bytes, timeout=10.0) -> bytes:
    """Send ``data`` as is, half-close, and read the whole answer."""
    with socket.create_connection(('127.0.0.1', port), timeout=timeout) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return b''.join(chunks)
            chunks.append(chunk)


def assert_prompt_sigterm(server):
    """No request is counted as in flight: SIGTERM exits at once, not after the 20 s grace."""
    started = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(15) == 0
    assert time.monotonic() - started < 10


# -- item 1: anything a service raises is a 500 for that request ------------------------------------

@pytest.mark.parametrize('service', ['hostile.exit', 'hostile.interrupt'])
def test_system_exit_or_keyboard_interrupt_in_handle_is_a_500_and_the_server_keeps_serving(server, service):
    for _ in range(3):
        response = server.post(service)
        assert response.status_code == 500
        assert set(response.json()) == {'error', 'cid'}
    assert server.proc.poll() is None
    assert server.post('test.echo', {'a': 1}).status_code == 200
    cid = response.headers['X-Cid']
    assert f'cid={cid}' in server.log_text()


# -- item 3: statuses and headers a service sets are validated ----------------------------------

BAD_RESPONSES = [{'kind': 'crlf'}, {'kind': 'nul'}, {'kind': 'name'}, {'kind': 'hop'},
                 {'kind': 'status', 'status': 0}, {'kind': 'status', 'status': 99999},
                 {'kind': 'status', 'status': 101}, {'kind': 'status', 'status': '200'}]


@pytest.mark.parametrize('payload', BAD_RESPONSES)
def test_invalid_status_or_header_from_a_service_is_a_500_with_a_log_line(server, payload):
    response = server.post('hostile.header', payload)
    assert response.status_code == 500, response.text
    assert 'X-Evil' not in response.headers and 'stolen' not in response.headers.get('Set-Cookie', '')
    assert response.json()['cid'] == response.headers['X-Cid']
    assert 'service hostile.header set' in server.log_text() and f'cid={response.headers["X-Cid"]}' in server.log_text()


def test_invalid_responses_do_not_leak_the_in_flight_count(own_server):
    for payload in BAD_RESPONSES:
        assert own_server.post('hostile.header', payload).status_code == 500
    assert_prompt_sigterm(own_server)


# -- item 4: malformed request bodies are 400, without a traceback -------------------------------

def test_deeply_nested_json_is_400_not_500(server):
    response = requests.post(f'{server.url}/test.echo', data=b'[' * 100_000 + b']' * 100_000, timeout=10)
    assert response.status_code == 400 and 'nested' in response.json()['error']


@pytest.mark.parametrize('head', [
    b'POST /test.echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"a": 1',          # truncated
    b'POST /test.echo HTTP/1.1\r\nHost: x\r\nContent-Length: 8\r\nContent-Length: 8\r\n\r\n{"a": 1}',
    b'POST /test.echo HTTP/1.1\r\nHost: x\r\nContent-Length: 8\r\nContent-Length: 3\r\n\r\n{"a": 1}',
    b'POST /test.echo HTTP/1.1\r\nHost: x\r\nContent-Length: 8, 8\r\n\r\n{"a": 1}',
    b'POST /test.echo HTTP/1.1\r\nHost: x\r\nContent-Length: 8\r\nTransfer-Encoding: chunked\r\n\r\n'
    b'8\r\n{"a": 1}\r\n0\r\n\r\n',
])
def test_truncated_body_or_ambiguous_length_is_400_without_a_traceback(server, head):
    before = len(server.log_text())
    answer = raw_request(server.port, head)
    assert answer.startswith(b'HTTP/1.1 400'), answer[:200]
    assert server.post('test.echo', {'a': 1}).status_code == 200     # logged after the 400's lines
    assert 'Traceback' not in server.log_text()[before:]


CHUNKED = b'POST /test.echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n'


def test_a_chunk_without_a_size_is_a_400_without_a_traceback(server):
    before = len(server.log_text())
    answer = raw_request(server.port, CHUNKED + b'\r\n{"a": 1}\r\n0\r\n\r\n')
    assert answer.startswith(b'HTTP/1.1 400'), answer[:200]
    assert server.post('test.echo', {'a': 1}).status_code == 200     # logged after the 400's lines
    assert 'Traceback' not in server.log_text()[before:]


@pytest.mark.parametrize('body', [b'zz\r\n', b'\r\n', b'100\r\n{"a": 1}\r\n'])
def test_a_request_after_a_malformed_chunked_body_is_not_served(server, body):
    # Whatever follows a body read in part is not a request boundary: serving it would let a client
    # smuggle a request past anything in front of the server that parsed the stream differently.
    smuggled = b'POST /test.echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}'
    answer = raw_request(server.port, CHUNKED + body + smuggled)
    assert answer.startswith(b'HTTP/1.1 400') and answer.count(b'HTTP/1.1 ') == 1, answer


# -- item 24: 429 and 503 bodies are short; the advice and the address go to the log --------------

def test_busy_and_store_errors_tell_the_client_little_and_the_log_everything(server):
    busy = server.post('hostile.busy', {'kind': 'busy'})
    down = server.post('hostile.busy', {'kind': 'store'})
    lost = server.post('hostile.busy', {'kind': 'lost'})
    assert busy.status_code == 429 and down.status_code == 503 and lost.status_code == 503
    assert 'retry' in lost.json()['error']
    for response in (busy, down, lost):
        assert set(response.json()) == {'error', 'cid'}
        for operator_detail in ('lock_wait', 'lock_ttl', '6390', '127.0.0.1'):
            assert operator_detail not in response.text
    log = server.log_text()
    assert f'cid={busy.headers["X-Cid"]}' in log and 'raise lock_wait' in log
    assert f'cid={down.headers["X-Cid"]}' in log and '6390' in log


# -- item 28: the server patches gevent in its own process ---------------------------------------

def test_serve_patches_gevent_without_re_executing_itself(server):
    assert server.post('hostile.patched').json() == {'socket': True, 'ssl': True}
    cmdline = Path(f'/proc/{server.proc.pid}/cmdline').read_bytes().split(b'\0')
    assert b'-m' in cmdline and b'llmconn' in cmdline and b'serve' in cmdline, cmdline


# -- item 2: idle and slow clients cannot hold connections ----------------------------------------

def client_connections(pid, port):
    """How many open TCP connections to ``port`` the process ``pid`` holds (not its other descriptors)."""
    inodes = set()
    for fd in os.listdir(f'/proc/{pid}/fd'):
        try:
            target = os.readlink(f'/proc/{pid}/fd/{fd}')
        except FileNotFoundError:
            continue
        if target.startswith('socket:['):
            inodes.add(target[8:-1])
    held = 0
    for table in ('/proc/net/tcp', '/proc/net/tcp6'):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local_port, state, inode = int(fields[1].rsplit(':', 1)[1], 16), fields[3], fields[9]
            held += local_port == port and state != '0A' and inode in inodes      # 0A: the listener
    return held


def wait_for(check, deadline=15.0, poll=0.05):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(poll)
    return False


@pytest.fixture
def short_idle(tmp_path, fake):
    s = Server(tmp_path, fake.url, extra=['--idle-timeout', '1'])
    yield s
    s.close()


@pytest.mark.parametrize('first_bytes', [b'', b'GET /health HTTP/1.1\r\nHost: x\r\n'])
def test_idle_or_half_sent_connection_is_closed_after_the_idle_timeout(short_idle, first_bytes):
    with socket.create_connection(('127.0.0.1', short_idle.port)) as sock:
        sock.sendall(first_bytes)
        sock.settimeout(15)         # the server must close it long before this
        assert sock.recv(1024) == b''


def test_client_trickling_its_request_head_is_cut_off(short_idle):
    with socket.create_connection(('127.0.0.1', short_idle.port)) as sock:
        sock.settimeout(0.2)
        head = b'GET /health HTTP/1.1\r\n' + b''.join(b'X-Pad-%d: y\r\n' % i for i in range(200))
        closed = False
        for byte in head:           # one byte every 0.2 s: each read is quick, the whole head is not
            try:
                sock.sendall(bytes([byte]))
                if sock.recv(1024) == b'':
                    closed = True
                    break
            except socket.timeout:
                continue
            except OSError:
                closed = True
                break
        assert closed


def test_many_idle_connections_neither_exhaust_the_limit_nor_starve_health(tmp_path, fake):
    s = Server(tmp_path, fake.url, extra=['--max-connections', '20'])
    idle = []
    try:
        idle = [socket.create_connection(('127.0.0.1', s.port)) for _ in range(60)]
        response = requests.get(f'{s.url}/health', timeout=10, headers={'Connection': 'close'})
        assert response.status_code == 200
        # The server holds at most its limit: the longest-idle connections were closed to make room.
        assert wait_for(lambda: client_connections(s.proc.pid, s.port) <= 20), client_connections(s.proc.pid, s.port)
    finally:
        for sock in idle:
            sock.close()
        s.close()


# -- item 5: /ready follows the store ------------------------------------------------------------

def test_ready_flips_when_the_stores_redis_stops_and_starts(tmp_path, fake, redis_server):
    s = Server(tmp_path, fake.url, redis_url=redis_server.url)
    try:
        assert s.get('ready').status_code == 200
        redis_server.stop()
        assert wait_for(lambda: s.get('ready').status_code == 503)
        ready = s.get('ready')
        assert ready.json() == {'status': 'not-ready', 'reason': 'the chat store does not answer'}
        assert s.get('health').json() == {'status': 'ok'}       # alive: restarting would not help
        redis_server.start()
        assert wait_for(lambda: s.get('ready').status_code == 200)
    finally:
        s.close()


def test_ready_says_the_store_refused_its_credentials_without_showing_them(tmp_path, fake, redis_server):
    redis.Redis(port=redis_server.port).config_set('requirepass', 'the-right-pass-Qx7')
    wrong = f'redis://:the-wrong-pass-Hm4@127.0.0.1:{redis_server.port}/0'
    s = Server(tmp_path, fake.url, redis_url=wrong)
    try:
        ready = s.get('ready')
        assert ready.status_code == 503
        assert ready.json() == {'status': 'not-ready', 'reason': 'the chat store refused its credentials '
                                                                 '(the user name and password in redis.url)'}
        assert 'pass-' not in ready.text
    finally:
        s.close()


def test_health_and_ready_report_a_config_that_failed_to_reload(tmp_path, fake):
    s = Server(tmp_path, fake.url)
    try:
        assert s.get('health').json() == {'status': 'ok'}
        config = tmp_path / 'llm.yaml'
        config.write_text(config.read_text() + '\n  - name: broken\n    provider: nope\n')
        assert wait_for(lambda: s.get('health').json()['status'] == 'config-error')
        health = s.get('health').json()
        assert health['error'] == 'ConfigError: llm.yaml: connection "broken": field "model": required key is missing'
        assert str(tmp_path) not in health['error']                 # public: the file's name, not its place
        # One typo must not take the fleet out of its balancer: still ready, on the last good config.
        ready = s.get('ready')
        assert ready.status_code == 200 and ready.json()['status'] == 'degraded'
        assert ready.json()['reason'].startswith('serving the last good configuration')
        assert s.post('test.echo', {'a': 1}).status_code == 200     # the previous config keeps serving
        config.write_text(config.read_text().replace('provider: nope', 'provider: claude\n    model: m'))
        assert wait_for(lambda: s.get('ready').json() == {'status': 'ready'})
        assert s.get('health').json() == {'status': 'ok'}
        # A file the configuration names is shown relative to it too: /health answers anyone.
        config.write_text(config.read_text() + '  - name: t\n    provider: template\n    model: m\n'
                          '    request_template_file: gone.j2\n    response_template_file: gone.j2\n')
        assert wait_for(lambda: s.get('health').json()['status'] == 'config-error')
        error = s.get('health').json()['error']
        assert 'cannot read gone.j2' in error and str(tmp_path) not in error
    finally:
        s.close()


def test_idle_connections_beyond_a_low_descriptor_limit_do_not_starve_health(tmp_path, fake):
    import resource

    def low_fd_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    port = free_port()
    services = make_services(tmp_path / 'services')
    config = write_config(tmp_path / 'llm.yaml', fake.url)
    proc = start_server(config, services, port, preexec_fn=low_fd_limit, stderr=open(tmp_path / 'log', 'w'))
    idle = []
    try:
        idle = [socket.create_connection(('127.0.0.1', port)) for _ in range(300)]
        assert requests.get(f'http://127.0.0.1:{port}/health', timeout=10).status_code == 200
    finally:
        for sock in idle:
            sock.close()
        stop(proc)


def test_system_exit_in_a_stream_ends_it_with_an_error_event_and_the_server_keeps_serving(server):
    with requests.post(f'{server.url}/hostile.stream-exit', timeout=10, stream=True) as response:
        assert response.status_code == 200
        text = response.text
    assert 'event: text' in text and 'event: error' in text and '"status": 500' in text
    assert server.proc.poll() is None and server.post('test.echo', {'a': 1}).status_code == 200


def test_a_request_body_trickling_in_is_cut_off_with_408(short_idle):
    with socket.create_connection(('127.0.0.1', short_idle.port)) as sock:
        sock.sendall(b'POST /test.echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n')
        sock.settimeout(0.2)
        answer = b''
        for _ in range(100):        # a byte every 0.2 s, for up to 20 s: each read is quick, the body is not
            try:
                sock.sendall(b' ')
                answer += sock.recv(4096)
                if answer:
                    break
            except socket.timeout:
                continue
        assert answer.startswith(b'HTTP/1.1 408'), answer


def test_at_the_connection_limit_with_every_connection_busy_a_new_one_gets_503(tmp_path, fake):
    s = Server(tmp_path, fake.url, extra=['--max-connections', '2'])
    release = tmp_path / 'release'
    answers = []
    try:
        import threading
        held = [threading.Thread(target=lambda: answers.append(s.post('hostile.hold-until',
                                                                      {'release': str(release)}).status_code))
                for _ in range(2)]
        for thread in held:
            thread.start()
        assert wait_for(lambda: s.log_text().count('holding cid=') == 2)
        # Both connections are busy until the test releases them: a third one is refused.
        refused = requests.get(f'{s.url}/health', timeout=10)
        assert refused.status_code == 503
        release.touch()
        for thread in held:
            thread.join()
        assert answers == [200, 200]
        assert s.get('health').status_code == 200       # room again once they are answered
    finally:
        release.touch()
        s.close()


def test_ready_is_503_while_the_server_drains_on_sigterm(own_server):
    import threading
    session = requests.Session()
    assert session.get(f'{own_server.url}/ready', timeout=5).status_code == 200     # a kept-alive connection
    held = threading.Thread(target=own_server.post, args=('hostile.hold', {'seconds': 2}))
    held.start()
    assert wait_for(lambda: 'holding' in own_server.log_text())
    own_server.proc.send_signal(signal.SIGTERM)
    assert wait_for(lambda: 'Got signal' in own_server.log_text())
    ready = session.get(f'{own_server.url}/ready', timeout=5)
    assert ready.status_code == 503 and ready.json()['reason'] == 'the server is shutting down'
    held.join()
    session.close()


def test_a_request_with_too_many_headers_is_a_400_without_a_traceback(server):
    before = len(server.log_text())
    head = b'GET /health HTTP/1.1\r\n' + b''.join(b'X-%d: y\r\n' % i for i in range(500)) + b'\r\n'
    answer = raw_request(server.port, head)
    assert answer.startswith(b'HTTP/1.1 400'), answer[:200]
    assert server.post('test.echo', {'a': 1}).status_code == 200     # logged after the 400's lines
    assert 'Traceback' not in server.log_text()[before:]



@pytest.mark.parametrize('line', [b'X-Folded: a\r\n  continued\r\n', b'No colon here\r\n', b'Bad Name: x\r\n',
                                  b'X-Long: ' + b'a' * 70000 + b'\r\n'])
def test_a_malformed_header_line_is_a_400_without_a_traceback(server, line):
    before = len(server.log_text())
    answer = raw_request(server.port, b'GET /health HTTP/1.1\r\nHost: x\r\n' + line + b'\r\n')
    assert answer.startswith(b'HTTP/1.1 400'), answer[:200]
    assert server.post('test.echo', {'a': 1}).status_code == 200
    assert 'Traceback' not in server.log_text()[before:]


def test_header_values_are_read_without_their_surrounding_whitespace(server):
    body = b'{"a": 1}'
    answer = raw_request(server.port, b'POST /test.echo HTTP/1.1\r\nHost: x\r\ncontent-length: \t%d  \r\n'
                         b'Content-Type:application/json\r\nConnection: close\r\n\r\n' % len(body) + body)
    assert answer.startswith(b'HTTP/1.1 200'), answer[:200]
    assert b'"a": 1' in answer or b'"a":1' in answer

SLOW_NAME_LOOKUP = '''
import sys
from gevent import monkey
monkey.patch_all()
import socket
import time
from pathlib import Path

def slow_getfqdn(name=''):
    Path(sys.argv[1]).touch()       # the server is inside its start(), looking its name up
    time.sleep(3)                   # gevent's sleep: the hub runs, and with it a signal handler
    return 'localhost'

import gevent.socket
socket.getfqdn = gevent.socket.getfqdn = slow_getfqdn      # pywsgi calls gevent.socket's
from llmconn.server import main
sys.exit(main(sys.argv[2:]))
'''


def test_sigterm_while_the_server_starts_listening_stops_it_cleanly(tmp_path, fake):
    """pywsgi looks its name up inside start(); a signal handled then must not break the half-started server."""
    services = make_services(tmp_path / 'services')
    config = tmp_path / 'llm.yaml'
    write_config(config, fake.url)
    script, marker = tmp_path / 'slow_start.py', tmp_path / 'in-start'
    script.write_text(SLOW_NAME_LOOKUP)
    proc = subprocess.Popen([sys.executable, str(script), str(marker), '--config', str(config), '--services',
                             str(services), '--port', str(free_port())], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, cwd=ROOT)
    try:
        assert wait_for(marker.exists), 'the server never reached its start()'
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        stop(proc)
    assert b'Traceback' not in err, err.decode()[-3000:]
    assert proc.returncode == 0 and b'Stopped' in err, err.decode()[-3000:]
