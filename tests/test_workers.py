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
        # Handshakes the kernel had hashed to the dead worker's SO_REUSEPORT socket are reset as it
        # closes (Linux, without net.ipv4.tcp_migrate_req); under load that window lasts a few
        # connections past the death. After it, the survivor must answer every request.
        streak, resets = 0, 0
        deadline = time.monotonic() + 15
        while streak < 10 and time.monotonic() < deadline:
            try:
                response = requests.post(f'http://127.0.0.1:{port}/test.pid', headers={'Connection': 'close'},
                                         timeout=5)
                assert response.status_code == 200
                streak += 1
            except requests.ConnectionError:
                streak, resets = 0, resets + 1
        assert streak == 10 and resets <= 3, (streak, resets)
        # A replacement appears (a pid never seen before), and the supervisor is still there.
        deadline = time.monotonic() + 30
        fresh = set()
        while not fresh and time.monotonic() < deadline:
            fresh = pids_answering(port, 2, deadline=1.0) - first
        assert fresh and proc.poll() is None
    finally:
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
