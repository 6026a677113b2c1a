"""Shared fixtures: a real Redis (the machine's, or a throwaway one) and throwaway servers.

Tests that are about locks, expiry or concurrency use a real Redis: a
``redis-server`` this session starts on a free port and kills at the end,
or the server ``LLMCONN_TEST_REDIS_URL`` names (the tests then own it).
Without ``redis-server`` on ``PATH`` those tests fail, so a green run
always means they ran; ``LLMCONN_TEST_ALLOW_NO_REDIS=1`` skips them instead,
for a machine that cannot have one. Under ``pytest -n`` (xdist) each worker
is its own session, with its own throwaway servers. No
test ever writes to, flushes or script-flushes a server it was not given:
the machine's own Redis on 6379 is never touched. Every test gets unique
connection names, so tests never see each other's keys.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import uuid

import pytest
import redis

from llmconn import Registry
from llmconn.testing.fake_server import FakeProviderServer
from redis_topology import require_programs
from scripted_server import ScriptedServer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


class RedisServer:
    """A throwaway redis-server on a free port, for tests that kill or restart Redis."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f'redis://127.0.0.1:{self.port}/0'
        self.process: subprocess.Popen | None = None

    def start(self) -> 'RedisServer':
        exe, = require_programs('redis-server')
        self.process = subprocess.Popen(
            [exe, '--port', str(self.port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        for _ in range(100):
            try:
                client.ping()
                return self
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError(f'redis-server did not start on port {self.port}')

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def _answers(url: str) -> bool:
    try:
        return redis.Redis.from_url(url, socket_connect_timeout=0.5).ping()
    except redis.RedisError:
        return False


@pytest.fixture(scope='session')
def redis_url():
    url = os.environ.get('LLMCONN_TEST_REDIS_URL')
    if url:
        if not _answers(url):
            pytest.exit(f'LLMCONN_TEST_REDIS_URL={url} does not answer', returncode=2)
        yield url
        return
    server = RedisServer().start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def redis_client(redis_url):
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def redis_server():
    """A throwaway Redis this test may kill and restart."""
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture
def unique():
    """A fresh name, so a test's keys never meet another test's."""
    return f't-{uuid.uuid4().hex[:12]}'


@pytest.fixture(scope='session')
def fake_provider_server():
    with FakeProviderServer() as server:
        yield server


@pytest.fixture
def provider(fake_provider_server):
    """The shared fake provider, with no faults, no latency and an empty record for each test."""
    server = fake_provider_server
    server.clear()
    yield server
    server.clear_faults()
    server.latency = 0


@pytest.fixture
def skills_dir(tmp_path):
    """A skills directory with one skill, "terse", whose text is easy to look for."""
    skill = tmp_path / 'skills' / 'terse' / 'SKILL.md'
    skill.parent.mkdir(parents=True)
    skill.write_text('---\nname: terse\ndescription: short answers\n---\nSECRET-SAUCE answer tersely.\n')
    return tmp_path / 'skills'


@pytest.fixture
def server():
    """A scripted HTTP server (see scripted_server.py) for tests of the transport."""
    srv = ScriptedServer().start()
    yield srv
    srv.stop()


@pytest.fixture
def open_registry():
    """``Registry.from_dict`` for one test; every registry it opened is closed afterwards."""
    opened = []

    def open_(config: dict):
        registry = Registry.from_dict(config)
        opened.append(registry)
        return registry

    yield open_
    for registry in opened:
        registry.close()
