"""What per-key limits cost the gateway: its server CPU per request with a limited key against an unlimited one.

One run starts its own redis-server (a free port, never the machine's), the
fake provider in a subprocess and one ``llmconn serve`` with two gateway keys
of one tenant: ``free`` (no limits) and ``limited`` (rpm, tpm and a budget,
all far above what the run spends, so nothing is refused). Both routes are
measured with both keys, side by side: each round runs, for each route, a
block of requests of each key back to back (the routes and the keys of a
pair in an order drawn anew each round), and the server's CPU time over each
block (the kernel's nanosecond count of every thread,
``/proc/PID/task/*/schedstat``; ``/proc/PID/stat`` counts in 10 ms ticks,
coarse for a block) divided by its requests is that block's CPU per
request. The clients are urllib3 connections (light, so the client takes
little of the machine's two cores from the server). The ratio per route is
limited / free of each round's pair; the figure is their geometric mean,
the tenth of the rounds at each end left out (a round the machine disturbed
is one of those), shown with its 95 % interval (twice its standard error)
and the ratio of the totals.

On a shared two-core machine a block's CPU per request moves by a tenth or
more between two blocks run back to back, whatever their length (an A/A run,
both keys unlimited, shows it), so the precision comes from the number of
pairs: many short blocks (120 rounds of 60 requests) pin the ratio down to
about ±2 % where 30 rounds of 240, the same requests, left ±5 %.

    target (SPEC §18): limits on ≤ 1.05 × limits off, on both routes

    .venv/bin/python bench/bench_limits.py [--quick] [--rounds N] [--clients N]
"""

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import urllib3  # noqa: E402

from bench_gateway import process_tree  # noqa: E402
from common import cpu_seconds, free_port, run_block, start_redis, trimmed_ratio  # noqa: E402
from llmconn.demo import start_server, stop  # noqa: E402
from llmconn.testing.fake_server import FakeProviderServer  # noqa: E402

KEYS = {'free': 'sk-bench-limits-free-key', 'limited': 'sk-bench-limits-limited-key'}
LIMITS = '{rpm: 100000000, tpm: 1000000000000, budget_usd: 1000000000, budget_period: month}'
TARGET = 1.05
ROUNDS, BLOCK, CLIENTS = 120, 60, 8
QUESTION = [{'role': 'user', 'content': 'hello gateway'}]


def write_config(tmp: Path, fake_url: str, redis_url: str) -> Path:
    config = tmp / 'llm.yaml'
    config.write_text(f'''
redis: {{url: "{redis_url}"}}
gateway:
  keys:
    - {{id: bench-free, secret: {KEYS['free']}, tenant: bench, models: ["*"]}}
    - {{id: bench-limited, secret: {KEYS['limited']}, tenant: bench, models: ["*"], limits: {LIMITS}}}
llm:
  - {{name: Chat, provider: openai, model: gpt-4.1, address: "{fake_url}/v1", max_retries: 0, pool_size: 600,
     pricing: {{input: 2, output: 8}}}}
''')
    return config


def ways(gateway: str) -> dict:
    """``'ROUTE KEY'`` -> (URL, body bytes, headers) of each route and key."""
    out = {}
    for route, path, body in (('chat', 'chat/completions', {'model': 'Chat', 'messages': QUESTION}),
                              ('responses', 'responses', {'model': 'Chat', 'input': 'hello gateway'})):
        for key, secret in KEYS.items():
            out[f'{route} {key}'] = (f'{gateway}/{path}', json.dumps(body).encode(),
                                     {'Authorization': f'Bearer {secret}', 'Content-Type': 'application/json'})
    return out


def measure(all_ways: dict, pids: list[int], rounds: int, block: int, clients: int) -> dict:
    """way -> [CPU seconds per request of each round].

    A round measures each route's two keys back to back, in an order drawn anew, so the two
    blocks of a pair see the same machine: a pair's ratio is about the code, not about the load
    of the moment (which moves a block's CPU per request by a tenth on a shared machine).
    """
    pools = [urllib3.PoolManager(maxsize=1) for _ in range(clients)]
    for way in all_ways.values():
        run_block(pools, *way, clients * 8)         # warm: pools, scripts, caches
    per_round: dict = {name: [] for name in all_ways}
    draw = random.Random(11)
    for _ in range(rounds):
        routes = ['chat', 'responses']
        draw.shuffle(routes)
        for route in routes:
            pair = [f'{route} free', f'{route} limited']
            draw.shuffle(pair)
            for name in pair:
                used = cpu_seconds(*pids)
                run_block(pools, *all_ways[name], block)
                per_round[name].append((cpu_seconds(*pids) - used) / block)
    for pool in pools:
        pool.clear()
    return per_round


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--quick', action='store_true', help='a third of the rounds')
    parser.add_argument('--rounds', type=int, default=ROUNDS)
    parser.add_argument('--block', type=int, default=BLOCK, help='requests per way and round')
    parser.add_argument('--clients', type=int, default=CLIENTS, help='concurrent clients')
    args = parser.parse_args()
    rounds = max(3, args.rounds // 3) if args.quick else args.rounds
    tmp = Path(tempfile.mkdtemp(prefix='bench-limits-'))
    (tmp / 'services').mkdir()
    redis_proc, redis_url = start_redis()
    fake = FakeProviderServer.spawn()
    server = None
    try:
        config = write_config(tmp, fake.url, redis_url)
        port = free_port()
        server = start_server(config, tmp / 'services', port, extra=['--log-level', 'WARNING'])
        per_round = measure(ways(f'http://127.0.0.1:{port}/v1'), process_tree(server.pid), rounds, args.block,
                            args.clients)
    finally:
        if server is not None:
            stop(server)
        fake.stop()
        redis_proc.kill()
        redis_proc.wait()
    print(f'Gateway CPU per request, limited key vs unlimited ({rounds} rounds of {args.block} requests per way, '
          f'{args.clients} clients)')
    print(f'{"route":>10} {"free ms":>9} {"limited ms":>11} {"ratio":>7} {"95 % interval":>14} {"of totals":>10}  '
          f'target')
    for route in ('chat', 'responses'):
        free, limited = per_round[f'{route} free'], per_round[f'{route} limited']
        ratio, low, high = trimmed_ratio([lim / off for lim, off in zip(limited, free) if off])
        totals = sum(limited) / sum(free)
        verdict = 'yes' if ratio <= TARGET else 'NO'
        print(f'{route:>10} {statistics.median(free) * 1000:9.3f} {statistics.median(limited) * 1000:11.3f} '
              f'{ratio:7.3f} {low:7.3f}-{high:.3f} {totals:10.3f}  limits on ≤ {TARGET} × off: {verdict}')
    return 0



if __name__ == '__main__':
    sys.exit(main())
