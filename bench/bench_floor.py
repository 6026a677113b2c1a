"""The gateway's server CPU per request against the floor: a minimal pass-through proxy on the same fake.

How much of the gateway's CPU is the work any proxy must do - read an HTTP
request, parse its JSON, send it on over a pooled connection, relay the
answer - and how much is ours? The floor does just that, in its own process,
with the gateway's own parts: gevent's pywsgi server (as ``llmconn serve``)
and one urllib3 connection pool (as :mod:`llmconn.transport`). It forwards
the body it parsed unchanged, to the path it was asked (no translation), and
relays the provider's bytes: whole, or as the provider's events arrive.

One run starts its own redis-server (a free port, never the machine's), the
fake provider, one ``llmconn serve`` with the gateway on and the floor, each
in its own process; this process is the client, ``--clients`` keep-alive
connections asking one after another. The ways:

    chat               gateway POST /v1/chat/completions, an openai (Chat Completions) backend
    floor-chat         floor   POST /v1/chat/completions
    responses          gateway POST /v1/responses, an openai-responses backend
    floor-responses    floor   POST /v1/responses (the fake's OpenAI Responses endpoint)
    responses-claude   gateway POST /v1/responses, a Claude backend (for information: no floor of its own)

each plain and streamed (``+sse``). A block is ``--requests`` requests of one
way; every round runs one block of each way, a gateway way's block right
before or after its floor's (groups and their order drawn anew each round),
so a ratio's two blocks see the same machine. A block's figure is the CPU
time (the scheduler's nanosecond count of every thread) the answering server
process used during it, divided by its requests; a way's figure is the
median of its rounds, and a ratio the geometric mean of the rounds' ratios
without the tenth at each end, with its 95 % interval
(:func:`common.trimmed_ratio`): many short rounds pin it down better than
a few long ones. The fake's CPU and the client's are not counted. Targets (plain): chat ≤ 1.5 × floor-chat,
responses ≤ 2 × floor-responses.

    .venv/bin/python bench/bench_floor.py [--quick] [--rounds R] [--requests N] [--clients C] [--ways W,...]
                                          [--baseline DIR ...]

``--baseline DIR`` also serves the gateway from another checkout (a ``git
worktree`` of an earlier commit), on the same Redis and fake, its ways named
``chat@DIR`` and so on, in the same rounds: the versions compare in one run.

``--floor-proxy PORT UPSTREAM`` runs the floor itself (how the benchmark starts it).
"""

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from urllib.parse import urlsplit  # noqa: E402

import urllib3  # noqa: E402

from common import cpu_seconds, free_port, run_block, start_redis, trimmed_ratio  # noqa: E402
from llmconn.demo import start_server, stop, wait_until_up  # noqa: E402
from llmconn.testing.fake_server import FakeProviderServer  # noqa: E402

KEY = 'sk-bench-floor-key'
ROUNDS = 28
REQUESTS = 100                  # per block
CLIENTS = 1
QUICK = {'rounds': 2, 'requests': 20}
SETTLE = 0.02                   # seconds after a block before its CPU is read: the last answer's tail
TARGETS = {'chat': ('floor-chat', 1.5), 'responses': ('floor-responses', 2.0)}
FLOOR_OF = {'chat': 'floor-chat', 'responses': 'floor-responses', 'responses-claude': 'floor-responses'}
QUESTION = 'hello gateway'
POOL_SIZE = 64                  # connections the floor keeps to the fake (at least --clients)

# The floor's forwarding headers: what the transport sends (JSON in and out, keep-alive).
_FLOOR_HEADERS = {'content-type': 'application/json', 'accept': 'application/json', 'connection': 'keep-alive'}


# ---- the floor: parse, forward with one pooled client, relay ------------------------------------

def floor_app(upstream: str):
    """The floor's WSGI application: each POST's JSON parsed, sent on to ``upstream`` + its path, relayed."""
    parts = urlsplit(upstream)
    pool = urllib3.HTTPConnectionPool(parts.hostname, parts.port, maxsize=POOL_SIZE, block=False, retries=False)

    def app(environ: dict, start_response):
        if environ['REQUEST_METHOD'] != 'POST':         # the start-up probe
            start_response('404 Not Found', [('Content-Length', '0')])
            return [b'']
        length = int(environ.get('CONTENT_LENGTH') or 0)
        body = json.loads(environ['wsgi.input'].read(length))
        answer = pool.urlopen('POST', environ['PATH_INFO'], body=json.dumps(body).encode(),
                              headers=_FLOOR_HEADERS, preload_content=False, release_conn=False,
                              redirect=False, assert_same_host=False)
        status = f'{answer.status} {answer.reason}'
        content_type = answer.headers.get('content-type', 'application/json')
        if body.get('stream'):
            start_response(status, [('Content-Type', content_type), ('Cache-Control', 'no-cache')])
            return _relay(answer)
        data = answer.read()
        answer.release_conn()
        start_response(status, [('Content-Type', content_type), ('Content-Length', str(len(data)))])
        return [data]

    return app


def _relay(answer):
    """The provider's stream, piece by piece as its bytes arrive."""
    try:
        pieces = answer.stream(None) if answer.chunked else iter(lambda: answer.read1(65536), b'')
        yield from pieces
    finally:
        answer.release_conn()


def run_floor(port: int, upstream: str) -> int:
    from gevent.pool import Pool
    from gevent.pywsgi import WSGIServer

    from llmconn.listener import bind       # the gateway's listening socket: TCP_NODELAY
    server = WSGIServer(bind('127.0.0.1', port), floor_app(upstream), spawn=Pool(), log=None)
    server.serve_forever()
    return 0


def start_floor(upstream: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, '--floor-proxy', str(port), upstream])
    try:
        wait_until_up(f'http://127.0.0.1:{port}/health', proc)
    except BaseException:
        stop(proc)
        raise
    return proc, f'http://127.0.0.1:{port}'


# ---- the gateway -----------------------------------------------------------------------------------

def write_config(tmp: Path, fake_url: str, redis_url: str) -> Path:
    """One gateway key; a Chat Completions, a Responses and a Claude connection, all on the fake."""
    config = tmp / 'llm.yaml'
    config.write_text(f'''
redis: {{url: "{redis_url}"}}
gateway:
  keys: [{{id: bench, secret: {KEY}, tenant: bench, models: ["*"]}}]
llm:
  - {{name: Chat, provider: openai, model: gpt-4.1, address: "{fake_url}/v1", max_retries: 0, pool_size: {POOL_SIZE}}}
  - {{name: Responses, provider: openai-responses, model: gpt-4.1, address: "{fake_url}/v1", max_retries: 0,
     pool_size: {POOL_SIZE}}}
  - {{name: Claude, provider: claude, model: claude-sonnet-5-5, address: "{fake_url}", max_retries: 0,
     pool_size: {POOL_SIZE}}}
''')
    return config


def ways(gateways: dict, floor: str) -> dict:
    """Each way: (server, URL, body, headers). ``gateways``: server name ('gateway', 'gateway@base') -> URL.

    A baseline's gateway ways carry its suffix (``chat@base``); the floor's are measured once.
    """
    auth = {'authorization': f'Bearer {KEY}', 'content-type': 'application/json'}
    plain = {'content-type': 'application/json'}
    chat = {'messages': [{'role': 'user', 'content': QUESTION}]}
    resp = {'input': QUESTION}
    found = {}
    for server, url in gateways.items():
        suffix = server[len('gateway'):]
        found['chat' + suffix] = (server, url, '/v1/chat/completions', {'model': 'Chat', **chat}, auth)
        if not suffix:
            found['floor-chat'] = ('floor', floor, '/v1/chat/completions', {'model': 'gpt-4.1', **chat}, plain)
        found['responses' + suffix] = (server, url, '/v1/responses', {'model': 'Responses', **resp}, auth)
        if not suffix:
            found['floor-responses'] = ('floor', floor, '/v1/responses', {'model': 'gpt-4.1', **resp}, plain)
        found['responses-claude' + suffix] = (server, url, '/v1/responses', {'model': 'Claude', **resp}, auth)
    table = {}
    for stream in (False, True):
        for name, (server, base, path, body, headers) in found.items():
            way, at, checkout = name.partition('@')
            name = way + ('+sse' if stream else '') + at + checkout
            table[name] = (server, base + path, json.dumps({**body, 'stream': True} if stream else body).encode(),
                           headers)
    return table


def serve(config: Path, services: Path, checkout: str | None) -> tuple[subprocess.Popen, str]:
    """One ``llmconn serve`` with the gateway, of this checkout or of ``checkout`` (its code first on the path)."""
    env, popen = None, {}
    if checkout:
        env, popen = dict(os.environ, PYTHONPATH=str(Path(checkout).resolve())), {'cwd': str(checkout)}
    port = free_port()
    proc = start_server(config, services, port, env=env, extra=['--log-level', 'WARNING'], **popen)
    return proc, f'http://127.0.0.1:{port}'


def chosen(table: dict, names: str) -> dict:
    """The ways ``names`` lists (comma-separated), or all of them; an unknown name is an error naming the known."""
    if not names:
        return table
    wanted = names.split(',')
    unknown = [name for name in wanted if name not in table]
    if unknown:
        sys.exit(f'--ways: no way {", ".join(unknown)}; choose among {", ".join(table)}')
    return {name: table[name] for name in wanted}


# ---- measuring -------------------------------------------------------------------------------------

def measure(table: dict, pids: dict, rounds: int, count: int, clients: int, seed: int = 7) -> tuple[dict, dict]:
    """Each way's server CPU seconds per request, one figure per round; and its wall seconds per request."""
    pools = [urllib3.PoolManager(maxsize=1) for _ in range(clients)]
    for server, url, body, headers in table.values():      # warm: pools, imports, caches
        run_block(pools, url, body, headers, max(clients, 20))
    samples: dict = {name: [] for name in table}
    walls: dict = {name: [] for name in table}
    groups: dict = {}
    for name in table:
        groups.setdefault(floor_of(name), []).append(name)
    order, shuffle = list(groups.values()), random.Random(seed).shuffle
    for _ in range(rounds):
        shuffle(order)
        for group in order:
            shuffle(group)
        for name in (name for group in order for name in group):
            server, url, body, headers = table[name]
            time.sleep(SETTLE)
            before, started = cpu_seconds(pids[server]), time.perf_counter()
            run_block(pools, url, body, headers, count)
            walls[name].append((time.perf_counter() - started) / count)
            time.sleep(SETTLE)
            samples[name].append((cpu_seconds(pids[server]) - before) / count)
    for pool in pools:
        pool.clear()
    return samples, walls


def idle_rate(pid: int, seconds: float = 2.0) -> float:
    """CPU seconds per second process ``pid`` uses with no request (its background loops)."""
    before = cpu_seconds(pid)
    time.sleep(seconds)
    return (cpu_seconds(pid) - before) / seconds


def floor_of(name: str) -> str:
    """The floor way a way is measured against (a floor way: itself), ``+sse`` and ``@DIR`` kept apart."""
    way = name.partition('@')[0]
    base, plus, sse = way.partition('+')
    return FLOOR_OF.get(base, base) + plus + sse


def round_ratio(samples: dict, way: str, other: str) -> tuple[float, str]:
    """``way``'s CPU per request over ``other``'s and its 95 % interval, from the rounds' ratios.

    The two ran in the same round, back to back when ``other`` is ``way``'s floor, so a
    round's ratio is about the code, while the machine's load (other processes make every
    process's CPU per request grow, by half on a busy machine) moves both.
    """
    ratios = [a / b for a, b in zip(samples[way], samples[other]) if b]
    if not ratios:
        return float('inf'), ''
    ratio, low, high = trimmed_ratio(ratios)
    return ratio, f'({low:.2f}-{high:.2f})'


def print_table(samples: dict, walls: dict, args: argparse.Namespace, idle: dict) -> dict:
    """The median CPU ms per request of each way, its spread, and the ratios against the targets."""
    median = {name: statistics.median(values) * 1000 for name, values in samples.items()}
    print(f'Server CPU per request, gateway against the floor ({args.rounds} rounds of {args.requests} '
          f'requests a way, {args.clients} client(s), {os.cpu_count()} cores)')
    print(f'{"way":>32} {"CPU ms":>8} {"min":>8} {"max":>8} {"wall ms":>8}')
    for name, values in samples.items():
        print(f'{name:>32} {median[name]:8.3f} {min(values) * 1000:8.3f} {max(values) * 1000:8.3f} '
              f'{statistics.median(walls[name]) * 1000:8.3f}')
    print('idle CPU ms per second (counted above): '
          + ', '.join(f'{server} {rate * 1000:.2f}' for server, rate in idle.items()))
    for way, (floor, target) in TARGETS.items():
        for suffix in ('', '+sse'):
            if way + suffix not in samples or floor + suffix not in samples:
                continue
            ratio, interval = round_ratio(samples, way + suffix, floor + suffix)
            verdict = ('yes' if ratio <= target else 'NO') if not suffix else 'reported'
            print(f'{way + suffix:>16} / {floor + suffix:<20} {ratio:5.2f} {interval:>11}  target ≤ {target:g}: '
                  f'{verdict}')
    for suffix in ('', '+sse'):
        claude, floor = 'responses-claude' + suffix, 'floor-responses' + suffix
        if claude in samples and floor in samples:
            ratio, interval = round_ratio(samples, claude, floor)
            print(f'{claude:>16} / {floor:<20} {ratio:5.2f} {interval:>11}  (information)')
    for name in samples:
        way, _, base = name.partition('@')
        if base and way in samples:
            ratio, interval = round_ratio(samples, way, name)
            print(f'{way:>16} this checkout / {base}: {ratio:5.2f} {interval}')
    return median


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--quick', action='store_true', help='a quick run: a few rounds of a few requests')
    parser.add_argument('--rounds', type=int, default=ROUNDS, help=f'rounds of every way (default {ROUNDS})')
    parser.add_argument('--requests', type=int, default=REQUESTS,
                        help=f'requests per block (default {REQUESTS})')
    parser.add_argument('--clients', type=int, default=CLIENTS,
                        help=f'concurrent client connections (default {CLIENTS}, at most {POOL_SIZE})')
    parser.add_argument('--ways', default='',
                        help='only these ways, comma-separated (default all; a ratio needs both its ways)')
    parser.add_argument('--baseline', metavar='DIR', action='append', default=[],
                        help='also serve the gateway from this checkout (e.g. a git worktree of an earlier '
                             'commit), its ways named WAY@DIR, to compare versions in one run (repeatable)')
    parser.add_argument('--floor-proxy', nargs=2, metavar=('PORT', 'UPSTREAM'), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.requests = QUICK['rounds'], QUICK['requests']
    if args.rounds < 1 or args.requests < 1 or not 1 <= args.clients <= POOL_SIZE:
        parser.error(f'--rounds and --requests must be at least 1, --clients from 1 to {POOL_SIZE}')
    return args


def main() -> int:
    args = parse_args()
    if args.floor_proxy:
        return run_floor(int(args.floor_proxy[0]), args.floor_proxy[1])
    tmp = Path(tempfile.mkdtemp(prefix='bench-floor-'))
    (tmp / 'services').mkdir()
    redis_proc, redis_url = start_redis()
    fake = FakeProviderServer.spawn()
    procs: dict = {}
    try:
        config = write_config(tmp, fake.url, redis_url)
        urls = {}
        for server, checkout in {'gateway': None, **{'gateway@' + Path(d).name: d for d in args.baseline}}.items():
            procs[server], urls[server] = serve(config, tmp / 'services', checkout)
        procs['floor'], floor_url = start_floor(fake.url)
        pids = {server: proc.pid for server, proc in procs.items()}
        samples, walls = measure(chosen(ways(urls, floor_url), args.ways), pids, args.rounds, args.requests,
                                 args.clients)
        idle = {server: idle_rate(pid, 0.5 if args.quick else 2.0) for server, pid in pids.items()}
    finally:
        for proc in procs.values():
            stop(proc)
        fake.stop()
        redis_proc.kill()
        redis_proc.wait()
    print_table(samples, walls, args, idle)
    return 0


if __name__ == '__main__':
    sys.exit(main())
