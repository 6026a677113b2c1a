"""The suite keeps to the Redis servers it starts (SPEC §14), and never passes without them."""

import os
import subprocess
import sys
from pathlib import Path

import redis

from redis_topology import ALLOW_NO_REDIS_ENV

REDIS_TEST = f'{__file__}::test_the_suite_never_uses_a_redis_it_did_not_start'


def test_the_suite_never_uses_a_redis_it_did_not_start(redis_url):
    if os.environ.get('LLMCONN_TEST_REDIS_URL'):
        return                                  # the operator gave the tests that server to own
    port = redis.Redis.from_url(redis_url).connection_pool.connection_kwargs['port']
    assert port != 6379


def _pytest_without_redis_server(tmp_path, allow: bool) -> subprocess.CompletedProcess:
    """A Redis test in a pytest of its own, on a PATH that holds no redis-server."""
    empty = tmp_path / 'bin'
    empty.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ('LLMCONN_TEST_REDIS_URL', ALLOW_NO_REDIS_ENV, 'PYTEST_ADDOPTS')}
    env['PATH'] = str(empty)
    if allow:
        env[ALLOW_NO_REDIS_ENV] = '1'
    return subprocess.run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', '-p', 'no:xdist',
                           REDIS_TEST], env=env, cwd=Path(__file__).parent.parent,
                          capture_output=True, text=True, timeout=100)


def test_without_redis_server_the_redis_tests_fail_rather_than_skip(tmp_path):
    run = _pytest_without_redis_server(tmp_path, allow=False)
    assert run.returncode == 1, run.stdout
    assert '1 error' in run.stdout and 'skipped' not in run.stdout
    assert 'redis-server not found on PATH' in run.stdout and ALLOW_NO_REDIS_ENV in run.stdout


def test_a_machine_without_redis_may_skip_them_when_it_says_so(tmp_path):
    run = _pytest_without_redis_server(tmp_path, allow=True)
    assert run.returncode == 0, run.stdout
    assert '1 skipped' in run.stdout
