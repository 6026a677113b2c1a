"""Throwaway Redis deployments for tests: a Cluster (3 masters + 3 replicas), a Sentinel group, a TCP proxy.

Every server listens on a free loopback port, in a temporary directory, and
is killed by :meth:`stop` (the fixtures call it in their finalizers, also
when starting failed half-way). Every wait is bounded and polls a condition.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
import redis

START_TIMEOUT = 20.0
ALLOW_NO_REDIS_ENV = 'LLMCONN_TEST_ALLOW_NO_REDIS'


def require_programs(*names: str) -> list[str]:
    """The paths of ``names`` on PATH; fails the test when one is missing (skips only if allowed)."""
    paths = [shutil.which(name) for name in names]
    missing = [name for name, path in zip(names, paths) if not path]
    if missing:
        message = (f'{" and ".join(missing)} not found on PATH: install Redis (apt-get install redis-server '
                   f'redis-tools; .ci/run does), or set {ALLOW_NO_REDIS_ENV}=1 to skip the tests that need it')
        if os.environ.get(ALLOW_NO_REDIS_ENV):
            pytest.skip(message)
        pytest.fail(message, pytrace=False)
    return paths


def port_pair_free(port: int) -> bool:
    """``port`` and ``port + 10000`` (a cluster node's bus) are both free on loopback."""
    for p in (port, port + 10000):
        with socket.socket() as s:
            try:
                s.bind(('127.0.0.1', p))
            except OSError:
                return False
    return True


def _port_range() -> range:
    """Where this process looks for ports: a slice of 20000-30000 of its own under ``pytest -n``,
    so two workers checking the same port at once cannot both take it."""
    worker = os.environ.get('PYTEST_XDIST_WORKER', 'gw0')      # gw0, gw1, ...
    count = int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', '1'))
    size = 10000 // max(count, 1)
    start = 20000 + int(worker.removeprefix('gw') or 0) % max(count, 1) * size
    return range(start, start + size)


def free_ports(count: int) -> list[int]:
    ports: list[int] = []
    candidates = _port_range()
    while len(ports) < count:
        port = random.choice(candidates)
        if port not in ports and port_pair_free(port):
            ports.append(port)
    return ports


def wait_for(condition, what: str, timeout: float = START_TIMEOUT, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            result = condition()
            if result:
                return result
        except (redis.RedisError, OSError):
            pass
        time.sleep(interval)
    raise AssertionError(f'{what} did not happen within {timeout:g} s')


def replica_online(master_port: int) -> bool:
    """The master on ``master_port`` has a replica that finished its initial sync (WAIT counts it)."""
    info = redis.Redis(port=master_port, socket_timeout=0.5).info('replication')
    return any(isinstance(v, dict) and v.get('state') == 'online' for k, v in info.items() if k.startswith('slave'))


class Servers:
    """redis-server processes started by one fixture; ``stop`` kills every one of them."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.processes: dict[int, subprocess.Popen] = {}
        self.argv: dict[int, list[str]] = {}
        self.exe, _ = require_programs('redis-server', 'redis-cli')

    def start(self, port: int, *args: str, config: str | None = None) -> None:
        argv = [self.exe]
        if config is not None:
            path = self.dir / f'{port}.conf'
            path.write_text(config)
            argv += [str(path), '--sentinel']
        argv += ['--port', str(port), '--bind', '127.0.0.1', '--dir', str(self.dir)]
        if config is None:
            # No 5 s pause before a replica's first sync (Redis's default), so replicas are online at once.
            argv += ['--save', '', '--appendonly', 'no', '--repl-diskless-sync-delay', '0', *args]
        self.argv[port] = argv
        self.restart(port)

    def restart(self, port: int) -> None:
        self.processes[port] = subprocess.Popen(self.argv[port], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: redis.Redis(port=port, socket_timeout=0.5).ping(), f'redis-server on {port} answering')

    def kill(self, port: int) -> None:
        process = self.processes.get(port)
        if process and process.poll() is None:
            process.kill()
            process.wait(5)

    def stop(self) -> None:
        for port in list(self.processes):
            self.kill(port)


class Cluster:
    """A Redis Cluster of 3 masters, each with ``replicas`` replicas (one), cluster-node-timeout 1 s."""

    def __init__(self, directory: Path, replicas: int = 1) -> None:
        self.servers = Servers(directory)
        self.replicas = replicas
        self.ports = free_ports(3 * (1 + replicas))

    @property
    def url(self) -> str:
        return 'redis+cluster://' + ','.join(f'127.0.0.1:{p}' for p in self.ports[:3])

    def start(self) -> 'Cluster':
        for port in self.ports:
            self.servers.start(port, '--cluster-enabled', 'yes', '--cluster-config-file', f'nodes-{port}.conf',
                               '--cluster-node-timeout', '1000')
        subprocess.run(['redis-cli', '--cluster', 'create', *(f'127.0.0.1:{p}' for p in self.ports),
                        '--cluster-replicas', str(self.replicas), '--cluster-yes'], check=True, timeout=START_TIMEOUT,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self._ready, 'the cluster becoming ready')
        return self

    def _ready(self) -> bool:
        for port in self.ports:
            node = redis.Redis(port=port, socket_timeout=0.5)
            if node.cluster('info').get('cluster_state') != 'ok':
                return False
        # Every replica has synced, so WAIT 1 can succeed.
        masters = self.masters()
        return len(masters) == 3 and (not self.replicas or all(replica_online(p) for p in masters))

    def masters(self) -> list[int]:
        return [p for p in self.ports if self.servers.processes[p].poll() is None
                and redis.Redis(port=p, socket_timeout=0.5).info('replication')['role'] == 'master']

    def master_of(self, key: str) -> int:
        client = redis.Redis(port=self.masters()[0], socket_timeout=0.5)
        slot = client.cluster('keyslot', key)
        for start, end, master, *replicas in client.cluster('slots'):
            if start <= slot <= end:
                return master[1]
        raise AssertionError(f'no node serves slot {slot}')

    def stop(self) -> None:
        self.servers.stop()


class SentinelGroup:
    """A master, one replica and three sentinels watching them as ``mymaster`` (down after 1 s)."""

    MASTER = 'mymaster'

    def __init__(self, directory: Path) -> None:
        self.servers = Servers(directory)
        self.master_port, self.replica_port, *self.sentinel_ports = free_ports(5)

    @property
    def url(self) -> str:
        return 'redis+sentinel://' + ','.join(f'127.0.0.1:{p}' for p in self.sentinel_ports) + f'/{self.MASTER}/0'

    def start(self) -> 'SentinelGroup':
        self.servers.start(self.master_port)
        self.servers.start(self.replica_port, '--replicaof', '127.0.0.1', str(self.master_port))
        config = (f'sentinel monitor {self.MASTER} 127.0.0.1 {self.master_port} 2\n'
                  f'sentinel down-after-milliseconds {self.MASTER} 1000\n'
                  f'sentinel failover-timeout {self.MASTER} 5000\n')
        for port in self.sentinel_ports:
            self.servers.start(port, config=config)
        wait_for(lambda: replica_online(self.master_port)
                 and all(self.sentinel(p).sentinel_master(self.MASTER)['num-other-sentinels'] >= 2
                         and self.sentinel(p).sentinel_master(self.MASTER)['num-slaves'] >= 1
                         for p in self.sentinel_ports), 'the sentinels seeing the master, replica and each other')
        return self

    def sentinel(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, socket_timeout=1, decode_responses=True)

    def current_master(self) -> int:
        host, port = self.sentinel(self.sentinel_ports[0]).sentinel_get_master_addr_by_name(self.MASTER)
        return int(port)

    def failover(self) -> int:
        """SENTINEL FAILOVER; returns the new master's port once every sentinel agrees and it accepts writes."""
        old = self.current_master()
        self.sentinel(self.sentinel_ports[0]).sentinel_failover(self.MASTER)
        wait_for(lambda: all(int(self.sentinel(p).sentinel_get_master_addr_by_name(self.MASTER)[1]) != old
                             for p in self.sentinel_ports), 'the sentinels electing a new master')
        new = self.current_master()
        wait_for(lambda: redis.Redis(port=new).info('replication')['role'] == 'master', 'the new master promoted')
        return new

    def stop(self) -> None:
        self.servers.stop()


class DroppingProxy:
    """A TCP proxy to Redis that can lose the reply of a command carrying a marker, after Redis ran it."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream = upstream_port
        self.listener = socket.create_server(('127.0.0.1', 0))
        self.port = self.listener.getsockname()[1]
        self.marker: bytes | None = None
        self.drops_left = 0
        self.dropped = 0
        self.frozen = False             # server -> client data is thrown away (never arrives)
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def drop_reply_to(self, marker: bytes, times: int = 1) -> None:
        """Lose the reply to the next ``times`` commands carrying ``marker`` (each on its connection)."""
        self.drops_left = times
        self.marker = marker

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(('127.0.0.1', self.upstream))
            except OSError:
                client.close()
                continue
            self._sockets += [client, server]
            state = {'drop': False}
            threading.Thread(target=self._pump, args=(client, server, state, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, state, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, state: dict, upstream: bool) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if upstream and self.marker and self.marker in data:
                    self.drops_left -= 1
                    if self.drops_left <= 0:
                        self.marker = None
                    state['drop'] = True
                elif not upstream and state['drop']:
                    # Redis ran the command and answered: the answer is lost with the connection.
                    self.dropped += 1
                    break
                if not upstream and self.frozen:
                    continue
                sink.sendall(data)
        except OSError:
            pass
        for sock in (source, sink):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def cut(self) -> None:
        """Close every open connection (new ones go to ``upstream``, which may have changed)."""
        sockets, self._sockets = self._sockets, []
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def close(self) -> None:
        self.listener.close()
        for sock in self._sockets:
            sock.close()
