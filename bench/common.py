"""What the benchmarks share: a throwaway redis-server of their own and side-by-side timing.

A benchmark never writes to a Redis it was not given, so each starts its own
on a free loopback port. Import this after gevent's monkey-patching, where a
benchmark patches.
"""

from __future__ import annotations

import math
import random
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import redis
from gevent.pool import Pool


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def start_redis() -> tuple[subprocess.Popen, str]:
    """A redis-server on a free port, without persistence; its process and URL once it answers."""
    exe = shutil.which('redis-server')
    if not exe:
        sys.exit('redis-server is not on PATH; install it (apt-get install redis-server) to run the benchmark')
    port = free_port()
    proc = subprocess.Popen([exe, '--port', str(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port, socket_connect_timeout=0.2)
    for _ in range(200):
        try:
            client.ping()
            return proc, f'redis://127.0.0.1:{port}/0'
        except redis.ConnectionError:
            time.sleep(0.025)
    proc.kill()
    sys.exit(f'redis-server did not start on port {port}')


def cpu_seconds(*pids: int) -> float:
    """CPU time the processes ``pids`` (every thread of each) have used so far, to the nanosecond.

    The scheduler's own count (``/proc/PID/task/*/schedstat``): ``/proc/PID/stat``
    counts in 10 ms ticks, coarse for a block of a few hundred requests.
    """
    total = 0
    for pid in pids:
        for task in Path(f'/proc/{pid}/task').iterdir():
            try:
                total += int((task / 'schedstat').read_text().split()[0])
            except (OSError, ValueError):
                continue        # a thread that just ended
    return total / 1e9


def per_call(func, n: int) -> float:
    started = time.perf_counter()
    for i in range(n):
        func(i)
    return (time.perf_counter() - started) / n


def interleaved(funcs: dict, n: int, rounds: int, seed: int = 7, clock=time.perf_counter) -> dict:
    """Seconds per call of each function: the median of its ``n × rounds`` calls, run call by call.

    The functions take turns call by call in an order shuffled anew each
    time, so every kind of call runs under the same conditions - the same
    drift of the machine, and after every other kind as often (a fixed order
    would let one kind always follow, say, the replica work another left).
    Each call is timed on its own and the median kept: the figures are
    differences of these, and a median of thousands of calls moves by a few
    µs between runs on a shared machine, where the fastest of a few blocks
    of calls moved by a hundred. ``clock``: ``time.process_time`` times this
    process's CPU instead of the wall clock.
    """
    samples: dict = {name: [] for name in funcs}
    order, shuffle = list(funcs), random.Random(seed).shuffle
    for i in range(n * rounds):
        shuffle(order)
        for name in order:
            func = funcs[name]
            started = clock()
            func(i)
            samples[name].append(clock() - started)
    return {name: statistics.median(values) for name, values in samples.items()}


def write_gateway_config(tmp: Path, fake_url: str, redis_url: str, *, key: str, name: str = 'Chat',
                         model: str = 'gpt-4.1') -> Path:
    """An llm.yaml with one OpenAI connection at the fake provider and one gateway key for it."""
    config = tmp / 'llm.yaml'
    config.write_text(f'''
redis: {{url: "{redis_url}"}}
gateway:
  keys: [{{id: bench, secret: {key}, tenant: bench, models: ["*"]}}]
llm:
  - {{name: {name}, provider: openai, model: {model}, address: "{fake_url}/v1", max_retries: 0, pool_size: 600}}
''')
    return config


def run_block(pools: list, url: str, body: bytes, headers: dict, count: int) -> None:
    """``count`` POSTs over ``pools`` (urllib3 pools, one client each, side by side), each read to its end;
    any non-200 stops the run."""
    def client(pool, n: int) -> None:
        for _ in range(n):
            answer = pool.urlopen('POST', url, body=body, headers=headers, retries=False)
            if answer.status != 200:
                raise RuntimeError(f'{url}: HTTP {answer.status} {answer.data[:300]!r}')

    group = Pool(len(pools))
    share, extra = divmod(count, len(pools))
    for index, pool in enumerate(pools):
        group.spawn(client, pool, share + (index < extra))
    group.join(raise_error=True)


TRIM = 0.1              # of the rounds' ratios, left out at each end by trimmed_ratio


def trimmed_ratio(ratios: list[float]) -> tuple[float, float, float]:
    """The geometric mean of ``ratios`` without the tenth at each end, and its 95 % interval.

    On a shared two-core machine a block's CPU per request moves by a tenth or more between two
    blocks run back to back, and a round the machine disturbed lies far out: left out, the rest
    averaged (their logarithms), the interval twice the mean's standard error.
    """
    logs = sorted(math.log(r) for r in ratios)
    cut = int(len(logs) * TRIM)
    kept = logs[cut:len(logs) - cut] or logs
    mean = statistics.fmean(kept)
    error = 2 * statistics.stdev(kept) / math.sqrt(len(kept)) if len(kept) > 1 else 0.0
    return math.exp(mean), math.exp(mean - error), math.exp(mean + error)
