"""Hot deployment: services and the configuration, in-process and through a running server."""

import itertools
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import requests

from llmconn.demo import start_server, stop
from llmconn.deploy import Deployer
from llmconn.host import ConfigWatch
from llmconn.errors import ConfigError
from llmconn.service import UnknownService
from llmconn.testing.fake_server import FakeProviderServer

DEPLOY_DEADLINE = 2.0       # seconds; the target is ~1 s, the margin absorbs a loaded CI machine


def service_source(name, answer):
    return f'''
from llmconn.service import Service


class Answer(Service):
    name = {name!r}

    def handle(self):
        self.response.payload = {{'answer': {answer!r}}}
'''


_writes = itertools.count(1)


def write(path, text):
    # Distinct mtimes even for two same-size writes within one filesystem clock tick.
    path.write_text(text)
    stamp = time.time_ns() + next(_writes) * 1_000_000
    os.utime(path, ns=(stamp, stamp))


def eventually(check, deadline=DEPLOY_DEADLINE):
    """Poll ``check`` until it returns true; return the seconds it took (fails after ``deadline``)."""
    started = time.monotonic()
    while True:
        if check():
            return time.monotonic() - started
        if time.monotonic() - started > deadline:
            pytest.fail(f'not within {deadline}s')
        time.sleep(0.05)


# -- the deployer, in-process ------------------------------------------------------------------

def test_derived_names_use_the_file_as_module_name(tmp_path):
    (tmp_path / 'my_tools.py').write_text(
        'from llmconn.service import Service\n\nclass GetUser(Service):\n    def handle(self): pass\n')
    deployer = Deployer(tmp_path)
    deployer.scan(settle=False)
    assert list(deployer.services) == ['my-tools.get-user']


def test_a_change_waits_for_the_file_to_settle(tmp_path):
    deployer = Deployer(tmp_path)
    write(tmp_path / 'a.py', service_source('a', 1))
    deployer.scan()
    assert 'a' not in deployer.services        # seen once: maybe still being written
    deployer.scan()
    assert deployer.get('a')                   # unchanged on the second look: deployed


def test_broken_file_keeps_the_previous_version_and_records_the_error(tmp_path):
    deployer = Deployer(tmp_path)
    path = tmp_path / 'a.py'
    write(path, service_source('a', 1))
    deployer.scan(settle=False)
    old = deployer.get('a')
    write(path, 'def broken(:\n')
    deployer.scan(settle=False)
    assert deployer.get('a') is old
    [status] = deployer.status()
    assert 'SyntaxError' in status['last_error'] and status['services'] == ['a']


def test_import_error_is_recorded_and_a_fix_clears_it(tmp_path):
    deployer = Deployer(tmp_path)
    path = tmp_path / 'a.py'
    write(path, 'import no_such_module_anywhere\n')
    deployer.scan(settle=False)
    assert 'ModuleNotFoundError' in deployer.status()[0]['last_error']
    write(path, service_source('a', 2))
    deployer.scan(settle=False)
    assert deployer.status()[0]['last_error'] is None and deployer.get('a')


def test_clashing_name_keeps_the_first_file_serving(tmp_path):
    deployer = Deployer(tmp_path)
    write(tmp_path / 'first.py', service_source('same.name', 'first'))
    deployer.scan(settle=False)
    write(tmp_path / 'second.py', service_source('same.name', 'second'))
    deployer.scan(settle=False)
    assert deployer.services['same.name'].path.name == 'first.py'
    errors = {Path(s['file']).name: s['last_error'] for s in deployer.status()}
    assert 'already deployed from first.py' in errors['second.py'] and errors['first.py'] is None


def test_removed_file_undeploys_its_services(tmp_path):
    deployer = Deployer(tmp_path)
    write(tmp_path / 'a.py', service_source('a', 1))
    deployer.scan(settle=False)
    (tmp_path / 'a.py').unlink()
    deployer.scan()
    with pytest.raises(UnknownService):
        deployer.get('a')
    assert deployer.status() == []


def test_a_file_named_like_a_stdlib_module_does_not_replace_it(tmp_path):
    write(tmp_path / 'json.py', service_source('not.json', 1))
    deployer = Deployer(tmp_path)
    deployer.scan(settle=False)
    assert sys.modules['json'] is json and deployer.get('not.json')


def test_clash_error_does_not_leak_an_internal_class_name(tmp_path):
    deployer = Deployer(tmp_path)
    write(tmp_path / 'first.py', service_source('same.name', 'first'))
    write(tmp_path / 'second.py', service_source('same.name', 'second'))
    deployer.scan(settle=False)
    errors = [s['last_error'] for s in deployer.status() if s['last_error']]
    assert errors and all('_Clash' not in e and 'Clash:' not in e for e in errors), errors


def test_editing_a_helper_module_redeploys_the_services_that_import_it(tmp_path):
    helper = f'helpers_{uuid.uuid4().hex[:8]}'     # its own name in sys.modules for this test
    write(tmp_path / 'a_greet.py', f'''
from llmconn.service import Service
from {helper} import GREETING


class Greet(Service):
    name = 'greet'
    answer = GREETING

    def handle(self):
        self.response.payload = self.answer
''')
    write(tmp_path / f'{helper}.py', 'GREETING = "one"\n')
    deployer = Deployer(tmp_path)
    try:
        deployer.scan(settle=False)             # a_greet sorts first, yet its helper is deployed before it
        assert deployer.get('greet').answer == 'one', deployer.status()
        write(tmp_path / f'{helper}.py', 'GREETING = "two"\n')
        deployer.scan()
        deployer.scan()
        assert deployer.get('greet').answer == 'two'
    finally:
        sys.modules.pop(helper, None)
        sys.modules.pop('a_greet', None)


class StandInRegistry:
    def __init__(self):
        self.reloads = 0
        self.fail_with = None

    def reload(self, conf=None):
        if self.fail_with:
            raise self.fail_with
        self.reloads += 1
        self.conf = conf


def test_config_watch_reloads_on_change_and_keeps_the_old_on_error(tmp_path):
    path = tmp_path / 'llm.yaml'
    write(path, 'llm: []\n')
    registry = StandInRegistry()
    watch = ConfigWatch(registry, path)
    write(path, 'llm: [] # edited\n')
    watch.scan()
    watch.scan()
    assert registry.reloads == 1 and watch.status()['last_error'] is None
    assert registry.conf.llm == ()          # parsed by the watch (off the hub), not again by the registry
    registry.fail_with = ConfigError('llm.yaml: connection "X": field "model": required key is missing')
    write(path, 'llm: [{name: X}]\n')
    watch.scan()
    watch.scan()
    assert 'field "model"' in watch.status()['last_error'] and registry.reloads == 1


def test_off_hub_work_runs_in_another_os_thread_under_gevent():
    code = ('from gevent import monkey; monkey.patch_all()\n'
            'import threading, gevent\n'
            'from llmconn.hotload import off_hub\n'
            'ticks = []\n'
            'ticker = gevent.spawn(lambda: [ticks.append(1) or gevent.sleep(0.01) for _ in range(1000)])\n'
            'def busy():\n'
            '    import time\n'
            '    end = time.perf_counter() + 0.5\n'
            '    while time.perf_counter() < end: pass\n'
            '    return threading.get_native_id()\n'
            'assert off_hub(busy) != threading.get_native_id()\n'
            'assert len(ticks) > 5, ticks     # the hub kept running greenlets meanwhile\n'
            'try:\n'
            '    off_hub(lambda: exit(3))\n'
            'except SystemExit:\n'
            '    print("ok")\n')
    done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == 'ok', done.stderr


# -- through a running server ------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


CONFIG = '''
redis: {{url: "memory://"}}
llm:
  - name: First
    model: claude-sonnet-5-5
    address: {url}
{more}'''

LIST_CONNECTIONS = '''
from llmconn.service import Service


class Connections(Service):
    name = 'test.connections'

    def handle(self):
        self.response.payload = sorted(self.llm)
'''


@pytest.fixture(scope='module')
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('deploy')
    services = tmp / 'services'
    services.mkdir()
    write(services / 'connections.py', LIST_CONNECTIONS)
    with FakeProviderServer() as fake:
        config = tmp / 'llm.yaml'
        write(config, CONFIG.format(url=fake.url, more=''))
        port = free_port()
        proc = start_server(config, services, port)
        yield f'http://127.0.0.1:{port}', services, config, fake.url
        stop(proc)


def call(url, name):
    response = requests.post(f'{url}/{name}', json={}, timeout=5)
    return response.status_code, (response.json() if response.status_code == 200 else None)


def file_error(url, filename):
    files = requests.get(f'{url}/services', timeout=5).json()['files']
    return next((f['last_error'] for f in files if f['file'].endswith(filename)), 'missing')


def test_new_changed_broken_and_removed_files_through_the_server(served):
    url, services, _, _ = served
    path = services / 'hot.py'
    write(path, service_source('test.hot', 'v1'))
    eventually(lambda: call(url, 'test.hot') == (200, {'answer': 'v1'}))
    write(path, service_source('test.hot', 'v2'))
    eventually(lambda: call(url, 'test.hot') == (200, {'answer': 'v2'}))
    write(path, 'def broken(:\n')
    eventually(lambda: (file_error(url, 'hot.py') or '').startswith('SyntaxError'))
    assert call(url, 'test.hot') == (200, {'answer': 'v2'})     # the previous version keeps serving
    path.unlink()
    eventually(lambda: call(url, 'test.hot')[0] == 404)


def test_requests_during_redeploys_always_see_a_whole_version(served):
    url, services, _, _ = served
    path = services / 'steady.py'
    write(path, service_source('test.steady', 0))
    eventually(lambda: call(url, 'test.steady')[0] == 200)
    seen, stop_flag = [], threading.Event()

    def hammer():
        with requests.Session() as session:
            while not stop_flag.is_set():
                response = session.post(f'{url}/test.steady', json={}, timeout=5)
                seen.append((response.status_code, response.json()))

    thread = threading.Thread(target=hammer)
    thread.start()
    for version in range(1, 5):
        write(path, service_source('test.steady', version))
        eventually(lambda: seen and seen[-1][1] == {'answer': version})
    stop_flag.set()
    thread.join()
    assert all(status == 200 and set(body) == {'answer'} for status, body in seen)
    path.unlink()


def test_config_edit_reloads_and_a_bad_edit_keeps_the_old_registry(served):
    url, _, config, fake_url = served
    write(config, CONFIG.format(url=fake_url, more=f'''  - name: Second
    model: gpt-4o-mini
    address: {fake_url}/v1
'''))
    eventually(lambda: call(url, 'test.connections') == (200, ['First', 'Second']))
    write(config, CONFIG.format(url=fake_url, more='  - name: Third\n    modle: typo\n'))
    eventually(lambda: requests.get(f'{url}/health', timeout=5).json()['status'] == 'config-error')
    error = requests.get(f'{url}/services', timeout=5).json()['config']['last_error']
    assert 'Third' in error and 'modle' in error
    assert call(url, 'test.connections') == (200, ['First', 'Second'])


SLOW_IMPORT = '''
import os
import time

from llmconn.service import Service

open({started!r}, 'w').close()
while not os.path.exists({release!r}):      # CPU-bound, as a heavy import is: never yields to gevent
    time.perf_counter()


class Slow(Service):
    name = 'test.slow-import'

    def handle(self):
        self.response.payload = {{'answer': 'imported'}}
'''


def test_a_slow_import_during_hot_deploy_does_not_freeze_requests(served, tmp_path):
    url, services, _, _ = served
    started, release = tmp_path / 'started', tmp_path / 'release'
    write(services / 'slow.py', SLOW_IMPORT.format(started=str(started), release=str(release)))
    try:
        eventually(started.exists, deadline=10)
        # The import is still running (it waits for `release`): the server must answer meanwhile.
        assert requests.get(f'{url}/health', timeout=5).status_code == 200
        assert call(url, 'test.connections')[0] == 200
    finally:
        release.touch()
    eventually(lambda: call(url, 'test.slow-import') == (200, {'answer': 'imported'}), deadline=10)
    (services / 'slow.py').unlink()
