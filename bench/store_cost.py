"""The chat store's cost per call, today against the first version (622aa60), side by side in one run.

The figure: chat() − invoke() at zero provider latency on an empty window
(``max_history_turns: 1``), divided by the cost of two Redis PINGs made
where chat() makes its two round trips (one before the provider call, one
after it). Each version runs in a subprocess of its own (this file, with
``--worker``) importing its own ``llmconn`` tree, against the same Redis
and the same fake provider; the first version's tree is a ``git worktree``
of 622aa60 made in a temporary directory. Workers take turns several
times, so both see the same drift of the machine, and the median of their
runs is kept. Today's run has the usage ledger and the metrics observer on,
as ``llmconn serve`` has them.

    .venv/bin/python bench/store_cost.py [--quick]     (make bench runs it from bench.py)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

FIRST_VERSION = '622aa60'
ROOT = Path(__file__).resolve().parent.parent
TARGET = 1.05           # today's store cost at most this many times the first version's
TURNS = 5               # runs of each version, alternating


def worker(args: argparse.Namespace) -> dict:
    """One version's figures: µs of each kind of call (medians), measured call by call, interleaved."""
    from gevent import monkey
    monkey.patch_all()
    import redis

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import interleaved

    import llmconn
    from llmconn import Registry
    if args.observer:
        from llmconn import observe
        from llmconn.metrics import Metrics
        observe.install(Metrics(''))
    name = f'store-cost-{uuid.uuid4().hex[:8]}'
    registry = Registry.from_dict({'redis': {'url': args.redis}, 'llm': [{
        'name': name, 'provider': 'openai', 'model': 'bench-model', 'address': args.provider + '/v1',
        'max_retries': 0, 'max_history_turns': 1}]})
    conn, ping = registry[name], redis.Redis.from_url(args.redis).ping
    for i in range(50):                 # pools, scripts, caches
        conn.chat(f'warm {i}', chat_id='cost')
        conn.invoke('warm')

    def pings_around_invoke(i):
        ping()
        conn.invoke(f'message {i}')
        ping()

    calls = {'invoke': lambda i: conn.invoke(f'message {i}'), 'pings_around': pings_around_invoke,
             'chat': lambda i: conn.chat(f'message {i}', chat_id='cost')}
    figures = {'llmconn': llmconn.__file__}
    # Wall clock (what a caller waits) and this process's CPU (what the code costs: on a loaded
    # machine the wall clock mostly measures the scheduler).
    for clock_name, clock in (('wall', time.perf_counter), ('cpu', time.process_time)):
        times = interleaved(calls, args.n, 5, clock=clock)
        store, pings = times['chat'] - times['invoke'], times['pings_around'] - times['invoke']
        figures[clock_name] = {'store_us': store * 1e6, 'pings_us': pings * 1e6, 'invoke_us': times['invoke'] * 1e6,
                               'ratio': store / pings}
    registry.close()
    return figures


def run_worker(root: Path, redis_url: str, provider_url: str, n: int, observer: bool) -> dict:
    env = dict(os.environ, PYTHONPATH=str(root))
    command = [sys.executable, str(Path(__file__).resolve()), '--worker', '--redis', redis_url,
               '--provider', provider_url, '--n', str(n)] + (['--observer'] if observer else [])
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f'the store-cost worker of {root} failed:\n{done.stderr[-3000:]}')
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    if not figures['llmconn'].startswith(str(root)):
        raise RuntimeError(f'the worker of {root} imported {figures["llmconn"]}')
    return figures


def first_version_tree(tmp: Path) -> Path:
    """A worktree of the first version, made by git in ``tmp`` (removed by :func:`drop_tree`)."""
    tree = tmp / f'llmconn-{FIRST_VERSION}'
    subprocess.run(['git', '-C', str(ROOT), 'worktree', 'add', '--detach', '--quiet', str(tree), FIRST_VERSION],
                   check=True, capture_output=True, text=True)
    return tree


def drop_tree(tree: Path) -> None:
    subprocess.run(['git', '-C', str(ROOT), 'worktree', 'remove', '--force', str(tree)], capture_output=True)


def compare(redis_url: str, provider_url: str, scale: float = 1.0) -> list:
    """bench.py's rows: each version's store cost and its ratio to PINGs in place, and today vs first."""
    n = max(20, int(300 * scale))
    runs: dict[str, list[dict]] = {'first': [], 'today': []}
    with tempfile.TemporaryDirectory(prefix='llmconn-first-') as tmp:
        try:
            tree = first_version_tree(Path(tmp))
        except (OSError, subprocess.CalledProcessError) as e:
            why = getattr(e, 'stderr', '') or str(e)
            return [(f'store cost vs the first version ({FIRST_VERSION})', 'not measured', f'no worktree of '
                     f'{FIRST_VERSION} ({why.strip()[:80]}): run make bench in a git clone', f'≤ {TARGET} ×', False)]
        try:
            for _ in range(TURNS if scale >= 1 else 2):
                runs['first'].append(run_worker(tree, redis_url, provider_url, n, observer=False))
                runs['today'].append(run_worker(ROOT, redis_url, provider_url, n, observer=True))
        finally:
            drop_tree(tree)
    rows = []
    for clock, what in (('wall', 'wall clock'), ('cpu', 'CPU of the calling process')):
        med = {version: {k: statistics.median(r[clock][k] for r in rs) for k in ('store_us', 'pings_us', 'ratio')}
               for version, rs in runs.items()}
        first, today = med['first'], med['today']
        against = today['ratio'] / first['ratio']
        spread = ', '.join(f'{r[clock]["ratio"]:.2f}' for r in runs['today'])
        first_spread = ', '.join(f'{r[clock]["ratio"]:.2f}' for r in runs['first'])
        rows += [
            (f'store cost per chat call vs two PINGs in place ({what})',
             f'{today["store_us"]:.0f}/{today["pings_us"]:.0f} µs = {today["ratio"]:.2f} ×',
             f'first version {first["store_us"]:.0f}/{first["pings_us"]:.0f} µs = {first["ratio"]:.2f} ×', '', None),
            (f'  today / first version ({FIRST_VERSION}), ledger and metrics on', f'{against:.2f} ×',
             f'runs: today {spread}; first {first_spread}', f'≤ {TARGET} ×', against <= TARGET),
        ]
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--quick', action='store_true')
    parser.add_argument('--worker', action='store_true', help=argparse.SUPPRESS)
    parser.add_argument('--observer', action='store_true', help=argparse.SUPPRESS)
    parser.add_argument('--redis', help=argparse.SUPPRESS)
    parser.add_argument('--provider', help=argparse.SUPPRESS)
    parser.add_argument('--n', type=int, default=300, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    sys.path.insert(0, str(ROOT / 'tests'))
    sys.path.insert(0, str(ROOT))
    from common import start_redis
    from llmconn.testing.fake_server import FakeProviderServer
    proc, redis_url = start_redis()
    try:
        with FakeProviderServer.spawn() as provider:
            rows = compare(redis_url, provider.url, 0.2 if args.quick else 1.0)
    finally:
        proc.kill()
    for name, ours, theirs, target, ok in rows:
        print(f'{name:<75} {ours:>22}  {theirs}  {target} {"" if ok is None else "PASS" if ok else "FAIL"}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
