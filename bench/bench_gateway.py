"""The gateway's overhead: the same question asked of the fake provider directly and through the gateway.

One run starts its own redis-server (a free port, never the machine's), the
fake provider in a subprocess and one ``llmconn serve`` process with the
gateway on; the client is this gevent-patched process, one ``requests``
session per simulated client. At each concurrency level the three ways are
measured in alternating blocks, so a noisy neighbour hits them alike:

    direct     POST {fake}/v1/chat/completions            (what the gateway itself sends)
    chat       POST {gateway}/v1/chat/completions          (stateless; one usage-count pipeline)
    responses  POST {gateway}/v1/responses                 (one ledger write per response)

Added latency is the gateway's p50 / p99 minus the direct call's at the
same concurrency. Per core: the machine's cores are shared by every process
of the run (client, gateway, provider, Redis).

``--baseline DIR`` (repeatable) also serves the gateway from another
checkout (e.g. a ``git worktree`` of an earlier commit), on the same Redis
and fake, and measures its two routes (``chat@<dir name>``,
``responses@<dir name>``) in the same alternating blocks, so the versions'
CPU per request compare in one run.

    .venv/bin/python bench/bench_gateway.py [--quick] [--levels 1,50] [--baseline DIR ...]
"""

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import requests  # noqa: E402
from gevent.pool import Pool  # noqa: E402

from common import free_port, start_redis, write_gateway_config  # noqa: E402
from llmconn.demo import start_server, stop  # noqa: E402
from llmconn.testing.fake_server import FakeProviderServer  # noqa: E402

KEY = 'sk-bench-gateway-key'
LEVELS = (1, 50, 500)
REQUESTS = {1: 600, 50: 3000, 500: 6000}     # per way and level, split over the blocks
BLOCKS = 3
QUESTION = [{'role': 'user', 'content': 'hello gateway'}]


def write_config(tmp: Path, fake_url: str, redis_url: str) -> Path:
    return write_gateway_config(tmp, fake_url, redis_url, key=KEY)


def run_block(ways: dict, way: str, clients: int, count: int) -> list[float]:
    """``count`` requests by ``clients`` concurrent clients; each request's latency in seconds."""
    url, body, headers, _ = ways[way]
    sessions = [requests.Session() for _ in range(clients)]
    latencies: list[float] = []

    def client(index: int) -> None:
        session = sessions[index]
        for _ in range(max(1, count // clients)):
            started = time.perf_counter()
            answer = session.post(url, json=body, headers=headers, timeout=60)
            latencies.append(time.perf_counter() - started)
            if answer.status_code != 200:
                raise RuntimeError(f'{way}: {answer.status_code} {answer.text[:200]}')

    pool = Pool(clients)
    for index in range(clients):
        pool.spawn(client, index)
    pool.join(raise_error=True)
    for session in sessions:
        session.close()
    return latencies


def cpu_seconds(pids: list[int]) -> float:
    """CPU time (user + system) the processes ``pids`` have used so far, from /proc."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')
    return total


def process_tree(pid: int) -> list[int]:
    """``pid`` and its children (the workers of ``llmconn serve --workers``)."""
    children = Path(f'/proc/{pid}/task/{pid}/children')
    return [pid, *(int(c) for c in children.read_text().split())] if children.exists() else [pid]


def measure(ways: dict, clients: int, total: int) -> dict:
    """Each way's latencies, throughput and the CPU per request of the server that answers it."""
    results: dict = {way: [] for way in ways}
    elapsed: dict = {way: 0.0 for way in ways}
    cpu: dict = {way: 0.0 for way in ways}
    for way in ways:
        run_block(ways, way, clients, min(total, clients * 4))     # warm the pools
    for _ in range(BLOCKS):
        for way in ways:
            pids = ways[way][3]
            started, used = time.perf_counter(), cpu_seconds(pids)
            results[way] += run_block(ways, way, clients, total // BLOCKS)
            elapsed[way] += time.perf_counter() - started
            cpu[way] += cpu_seconds(pids) - used
    return {way: {'p50': percentile(lat, 50), 'p99': percentile(lat, 99), 'rps': len(lat) / elapsed[way],
                  'cpu': cpu[way] / len(lat)} for way, lat in results.items()}


def serve(config: Path, services: Path, checkout: str | None) -> tuple:
    """One ``llmconn serve`` of this checkout, or of ``checkout`` (its own code first on the path)."""
    env, popen = None, {}
    if checkout:
        env, popen = dict(os.environ, PYTHONPATH=str(checkout)), {'cwd': str(checkout)}
    port = free_port()
    server = start_server(config, services, port, env=env, extra=['--log-level', 'WARNING'], **popen)
    return server, f'http://127.0.0.1:{port}/v1'


def gateway_ways(gateway: str, suffix: str, pids: list[int]) -> dict:
    auth = {'Authorization': f'Bearer {KEY}'}
    return {'chat' + suffix: (f'{gateway}/chat/completions', {'model': 'Chat', 'messages': QUESTION}, auth, pids),
            'responses' + suffix: (f'{gateway}/responses', {'model': 'Chat', 'input': 'hello gateway'}, auth, pids)}


def percentile(values: list[float], pct: int) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * pct / 100))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--quick', action='store_true', help='a fifth of the requests')
    parser.add_argument('--baseline', metavar='DIR', action='append', default=[],
                        help='also serve the gateway from this checkout (repeatable)')
    parser.add_argument('--levels', default=','.join(map(str, LEVELS)),
                        help=f'concurrency levels, comma-separated, among {",".join(map(str, LEVELS))}')
    args = parser.parse_args()
    levels = [int(n) for n in args.levels.split(',')]
    if not set(levels) <= set(LEVELS):
        parser.error(f'--levels: choose among {",".join(map(str, LEVELS))}')
    scale = 5 if args.quick else 1
    tmp = Path(tempfile.mkdtemp(prefix='bench-gateway-'))
    (tmp / 'services').mkdir()
    redis_proc, redis_url = start_redis()
    fake = FakeProviderServer.spawn()
    servers = []
    try:
        config = write_config(tmp, fake.url, redis_url)
        ways = {'direct': (f'{fake.url}/v1/chat/completions',      # no gateway: no server CPU to count
                           {'model': 'gpt-4.1', 'messages': QUESTION, 'max_tokens': 1024}, {}, [])}
        checkouts = {'': None, **{'@' + Path(d).name: d for d in args.baseline}}
        for suffix, checkout in checkouts.items():
            server, gateway = serve(config, tmp / 'services', checkout)
            servers.append(server)
            ways.update(gateway_ways(gateway, suffix, process_tree(server.pid)))
        rows = [(clients, measure(ways, clients, REQUESTS[clients] // scale)) for clients in levels]
    finally:
        for server in servers:
            stop(server)
        fake.stop()
        redis_proc.kill()
        redis_proc.wait()
    print_table(rows)
    return 0


def print_table(rows: list) -> None:
    """Latency added by the gateway, its CPU per request, and the part of the added latency that is queueing.

    Every client waits for its answer before it asks again (a closed loop), so once the machine's
    cores are busy a request's latency is clients / throughput: ``queue ms`` is the latency the
    gateway adds through its lower throughput alone, clients × (1/rps − 1/rps direct). Where it
    is close to +p50, the added latency is waiting for a core, and it falls only with the
    gateway's CPU per request (``gw CPU ms``, the ``llmconn serve`` processes' CPU time per request).
    """
    cores = os.cpu_count() or 1
    print(f'Gateway overhead against the fake provider ({cores} cores shared by client, gateway, provider, Redis)')
    print(f'{"clients":>7} {"way":>10} {"p50 ms":>8} {"p99 ms":>8} {"req/s":>8} {"+p50 ms":>8} {"+p99 ms":>8} '
          f'{"queue ms":>8} {"gw CPU ms":>9}  target')
    for clients, result in rows:
        direct = result['direct']
        for way, figures in result.items():
            added = ''
            if way != 'direct':
                plus50, plus99 = (figures["p50"] - direct["p50"]) * 1000, (figures["p99"] - direct["p99"]) * 1000
                queue = clients * (1 / figures['rps'] - 1 / direct['rps']) * 1000
                added = f'{plus50:8.2f} {plus99:8.2f} {queue:8.2f} {figures["cpu"] * 1000:9.2f}'
                if clients == 50:
                    added += f'  +p50 ≤ 1, +p99 ≤ 5: {"yes" if plus50 <= 1 and plus99 <= 5 else "NO"}'
            print(f'{clients:>7} {way:>10} {figures["p50"] * 1000:8.2f} {figures["p99"] * 1000:8.2f} '
                  f'{figures["rps"]:8.0f} {added}')
    print(f'per core: divide req/s by {cores}')
    for clients, result in rows:
        for base in sorted({way.partition('@')[2] for way in result if '@' in way}):
            ratios = [f'{way} {result[way]["cpu"] / result[f"{way}@{base}"]["cpu"]:.2f}'
                      for way in ('chat', 'responses') if result[f'{way}@{base}']['cpu']]
            print(f'{clients:>7} clients: gw CPU per request, this checkout / {base}: {", ".join(ratios)}')


if __name__ == '__main__':
    sys.exit(main())
