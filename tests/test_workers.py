"""Several server processes sharing one real Redis: any of them continues any conversation."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import requests

from llmconn.demo import start_server, stop
from llmconn.testing.fake_server import FakeProviderServer

ROOT = Path(__file__).resolve().parent.parent

PID_SERVICE = '''
import os
import sys

from llmconn.service import Service


class Pid(Service):
    name = 'test.pid'

    def handle(self):
        self.response.payload = {'pid': os.getpid()}


class Hold(Service):
    name = 'test.hold'

    def handle(self):
        # Busy until the test creates the file (bounded, so a failed test leaves no request behind).
        import gevent
        from pathlib import Path
        Path(self.request.payload['started']).touch()
        for _ in range(3000):
            if Path(self.request.payload['release']).exists():
                break
            gevent.sleep(0.01)
        self.response.payload = {'held': True}


class Exit(Service):
    name = 'test.exit'

    def handle(self):
        sys.exit(1)
'''


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


@pytest.fixture(scope='module')
def setup(tmp_path_factory, redis_url):
    tmp = tmp_path_factory.mktemp('workers')
    services = tmp / 'services'
    services.mkdir()
    shutil.copy(ROOT / 'services' / 'demo_llm.py', services / 'demo_llm.py')
    (services / 'pid.py').write_text(PID_SERVICE)
    with FakeProviderServer() as fake:
        config = tmp / 'llm.yaml'
        config.write_text(f'''
redis: {{url: "{redis_url}"}}
skills_dir: {ROOT / 'etc' / 'skills'}
llm:
  - name: Support
    model: claude-sonnet-5-5
    address: {fake.url}
    chat_expiry: 60             # test chats clean themselves up
''')
        yield config, services


def test_one_chat_alternating_between_two_servers_keeps_its_history(setup):
    config, services = setup
    ports = [free_port(), free_port()]
    procs = [start_server(config, services, port) for port in ports]
    who = f'worker-test-{uuid.uuid4().hex}'
    try:
        replies = []
        for turn in range(4):
            port = ports[turn % 2]
            response = requests.post(f'http://127.0.0.1:{port}/demo.llm.support-chat',
                                     json={'user_id': who, 'text': f'message {turn}'}, timeout=10)
            assert response.status_code == 200, response.text
            replies.append(response.json()['reply'])
        pids = {requests.post(f'http://127.0.0.1:{p}/test.pid', timeout=5).json()['pid'] for p in ports}
    finally:
        for proc in procs:
            stop(proc)
    assert len(pids) == 2
    for turn, reply in enumerate(replies):
        previous = f'message {turn - 1}' if turn else '-'
        assert f'echo: message {turn} | users: {turn + 1} | previous: {previous}' in reply


def test_workers_share_one_port_and_stop_together(setup):
    config, services = setup
    port = free_port()
    proc = start_server(config, services, port, extra=['--workers', '2'])
    try:
        pids = set()
        # The second worker may still be starting when the first answers (slow under load): keep
        # asking until both have answered, within a deadline rather than a number of tries.
        deadline = time.monotonic() + 20
        while len(pids) < 2 and time.monotonic() < deadline:
            # A fresh connection each time: the kernel spreads new connections over the workers.
            response = requests.post(f'http://127.0.0.1:{port}/test.pid', headers={'Connection': 'close'},
                                     timeout=5)
            pids.add(response.json()['pid'])
            if len(pids) < 2:
                time.sleep(0.02)
        assert len(pids) == 2 and proc.pid not in pids
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    with pytest.raises(requests.ConnectionError):
        requests.get(f'http://127.0.0.1:{port}/health', timeout=2)


def test_workers_refuse_a_store_they_cannot_share():
    done = subprocess.run([sys.executable, '-m', 'llmconn', 'serve', '--config', str(ROOT / 'etc' / 'embedded.yaml'),
                           '--workers', '2'], capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != 'REDIS_URL'})
    assert done.returncode == 2
    assert 'memory://' in done.stderr and 'redis.url' in done.stderr


def pids_answering(port, want, deadline=20.0):
    """The worker pids seen over fresh connections, until ``want`` of them answered (or the deadline)."""
    pids = set()
    end = time.monotonic() + deadline
    while len(pids) < want and time.monotonic() < end:
        response = requests.post(f'http://127.0.0.1:{port}/test.pid', headers={'Connection': 'close'}, timeout=5)
        pids.add(response.json()['pid'])
    return pids


def wait_until_dead(pid: int, timeout: float = 10) -> None:
    """Until the kernel has closed ``pid``'s sockets: it is gone, or a zombie awaiting its parent."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[1].split()[0]
        except FileNotFoundError:
            return
        if state in ('Z', 'X'):
            return
        time.sleep(0.01)
    raise AssertionError(f'worker {pid} did not die')


def test_a_killed_worker_is_restarted_while_the_others_keep_serving(setup):
    config, services = setup
    port = free_port()
    proc = start_server(config, services, port, extra=['--workers', '2'])
    try:
        first = pids_answering(port, 2)
        assert len(first) == 2
        victim = sorted(first)[0]
        os.kill(victim, signal.SIGKILL)
        wait_until_dead(victim)
        # The workers accept from one socket the supervisor holds: from the instant the victim is
        # dead, every connection is the survivor's, none reset.
        for _ in range(10):
            response = requests.post(f'http://127.0.0.1:{port}/test.pid', headers={'Connection': 'close'},
                                     timeout=10)
            assert response.status_code == 200
        # A replacement appears (a pid never seen before), and the supervisor is still there.
        deadline = time.monotonic() + 30
        fresh = set()
        while not fresh and time.monotonic() < deadline:
            fresh = pids_answering(port, 2, deadline=1.0) - first
        assert fresh and proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0


def raw_request(port: int) -> socket.socket:
    """A connection with a whole request sent, its answer not yet read."""
    sock = socket.create_connection(('127.0.0.1', port), timeout=10)
    sock.sendall(b'POST /test.pid HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n')
    return sock


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    sock.close()
    return b''.join(chunks)


def test_connections_waiting_when_a_worker_is_killed_are_served_by_the_others(setup):
    # One socket per worker (SO_REUSEPORT) queues each new connection on one worker's socket: those
    # queued on a stopped worker wait for it, and are reset when it is killed.
    config, services = setup
    port = free_port()
    proc = start_server(config, services, port, extra=['--workers', '2'])
    victim = None
    try:
        first = pids_answering(port, 2)
        assert len(first) == 2
        victim = sorted(first)[0]
        os.kill(victim, signal.SIGSTOP)          # accepts nothing from now on, like a worker about to die
        waiting = [raw_request(port) for _ in range(8)]
        os.kill(victim, signal.SIGKILL)
        wait_until_dead(victim)
        answers = [read_all(sock) for sock in waiting]
        assert all(a.startswith(b'HTTP/1.1 200') and f'"pid": {victim}'.encode() not in a for a in answers), answers
    finally:
        if victim is not None:
            os.kill(victim, signal.SIGKILL) if Path(f'/proc/{victim}').exists() else None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0


def test_system_exit_in_a_service_takes_down_neither_a_worker_nor_the_supervisor(setup):
    config, services = setup
    port = free_port()
    proc = start_server(config, services, port, extra=['--workers', '2'])
    try:
        first = pids_answering(port, 2)
        for _ in range(6):
            response = requests.post(f'http://127.0.0.1:{port}/test.exit', headers={'Connection': 'close'},
                                     timeout=5)
            assert response.status_code == 500
        assert proc.poll() is None
        assert pids_answering(port, 2) == first         # the same two workers, none restarted
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0


def test_while_workers_drain_on_sigterm_new_clients_are_refused_not_queued(setup, tmp_path):
    # The supervisor's copy of the listening socket kept it open after every worker closed its own:
    # new connections queued on it, unanswered, until the last worker finished.
    import threading
    config, services = setup
    port = free_port()
    release, started = tmp_path / 'release', tmp_path / 'started'
    proc = start_server(config, services, port, extra=['--workers', '2', '--grace', '30'])
    answers = []
    held = threading.Thread(target=lambda: answers.append(requests.post(
        f'http://127.0.0.1:{port}/test.hold', json={'release': str(release), 'started': str(started)},
        timeout=30).status_code))
    try:
        assert len(pids_answering(port, 2)) == 2
        held.start()
        deadline = time.monotonic() + 20
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        refused = False
        while not refused and time.monotonic() < deadline:
            try:
                with socket.create_connection(('127.0.0.1', port), timeout=2) as sock:
                    sock.sendall(b'GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n')
                    sock.recv(1)    # a worker still serving answers; a queued connection times out here
            except ConnectionRefusedError:
                refused = True
            except ConnectionResetError:
                pass        # queued in the instant the last copy of the socket closed: reset, and asked again
            time.sleep(0.01)
        assert refused, 'new connections were still taken while the workers drained'
        assert proc.poll() is None and held.is_alive()      # the held request is still being finished
    finally:
        release.touch()
        if held.ident:
            held.join(30)
        assert proc.wait(30) == 0
    assert answers == [200]
