"""``make bench``, second part: what the Prometheus metrics cost a chat call (target ≤ 1.05 ×).

The same chat calls are timed with the metrics observer installed and with
nobody listening, call by call in a shuffled order (``common.interleaved``:
each kind's median call), in one gevent-patched process as
``llmconn serve`` runs, against a throwaway ``redis-server`` this script
starts on a free port (and kills) and the fake provider in a subprocess.

The metrics are measured in their dearer mode, the one ``--workers N`` uses:
values in memory-mapped files under PROMETHEUS_MULTIPROC_DIR (a temporary
directory here). One process keeps plain in-memory values, which cost less.

    store cost          chat() − the same request without the store (19-turn window)
    whole chat call     chat() with a 19-turn window
    observer work       the hooks one served chat call runs, timed alone

Each is given in this process's CPU time first: the metrics cost nothing
but CPU here, and CPU time is what another process's load does not
inflate, so it is the steady figure on a shared machine (and the stricter
one: it leaves out the waits for Redis and the provider). Wall-clock time
follows.

    .venv/bin/python bench/bench_metrics.py [--quick]
"""

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402


METRICS_DIR = tempfile.mkdtemp(prefix='llmconn-bench-metrics-')
os.environ['PROMETHEUS_MULTIPROC_DIR'] = METRICS_DIR     # before prometheus_client is imported

from common import interleaved, start_redis  # noqa: E402
from llmconn import Registry, observe  # noqa: E402
from llmconn.metrics import Metrics  # noqa: E402
from llmconn.testing.fake_server import FakeProviderServer  # noqa: E402
from llmconn.types import Event, Request  # noqa: E402

TARGET = 1.05


def per_call(func, n: int) -> tuple[float, float]:
    """Seconds per call: wall-clock, and this process's CPU (which other processes' load does not inflate)."""
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(n):
        func(i)
    return (time.perf_counter() - wall) / n, (time.process_time() - cpu) / n


def hooks_of_one_chat(name: str):
    """What a served chat call makes the observer do, without the call: for the direct figure."""
    done = Event('done', result={'usage': {'input_tokens': 120, 'output_tokens': 17}})

    def run(i):
        tally = observe.start_request('cid', 'POST', '/demo.llm.support-chat')
        tally.service = 'demo.llm.support-chat'
        observe.lock_waited(name, 0.0)
        observe.provider_call(name, 200, time.perf_counter(), 0)
        for _ in observe.call(name, iter((done,))):
            pass
        tally.status = 200
        observe.finish_request(tally)
    return run


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument('--quick', action='store_true', help='fewer iterations, for a smoke run')
    args = parser.parse_args()
    # Many short blocks: on a shared machine a short block is more likely to run undisturbed.
    n, rounds = (30, 10) if args.quick else (40, 60)
    redis_proc, redis_url = start_redis()
    try:
        with FakeProviderServer.spawn() as provider:
            rows = measure(redis_url, provider, n, rounds)
    finally:
        redis_proc.kill()
        redis_proc.wait()
        shutil.rmtree(METRICS_DIR, ignore_errors=True)
    print_table(rows, n, rounds)
    return 0


def measure(redis_url: str, provider, n: int, rounds: int) -> list:
    name = 'bench-metrics'
    registry = Registry.from_dict({'redis': {'url': redis_url}, 'llm': [{
        'name': name, 'provider': 'openai', 'model': 'bench-model', 'address': provider.url + '/v1',
        'max_history_turns': 20, 'max_retries': 0}]})
    conn = registry[name]
    metrics = Metrics(METRICS_DIR)
    try:
        for i in range(40):          # a full window, warm pools and scripts, every label child created
            for observer in (None, metrics):
                observe.install(observer)
                conn.chat(f'warm {i}', chat_id='metrics')
        observe.install(None)
        window = tuple(conn.store.history(name, 'metrics')[-19:])
        def observed(observer, func):
            def call(i):
                observe.install(observer)
                func(i)
            return call

        kinds = {}
        for state, observer in (('off', None), ('on', metrics)):
            kinds[('chat', state)] = observed(observer, lambda i: conn.chat(f'message {i}', chat_id='metrics'))
            kinds[('no_store', state)] = observed(
                observer, lambda i: conn._answer(Request(f'message {i}', '', window)))
        times = {label: interleaved(kinds, n, rounds, clock=clock)
                 for label, clock in (('CPU', time.process_time), ('wall', time.perf_counter))}
        observe.install(metrics)
        hooks = min(per_call(hooks_of_one_chat(name), 200)[1] for _ in range(rounds))
        observe.install(None)
    finally:
        observe.install(None)
        registry.close()
    rows = []
    for label in ('CPU', 'wall'):
        rows += figures(times[label], label)
    return rows + [('observer work of one served chat call, alone (CPU)', f'{hooks * 1e6:.1f} µs', '', None)]


def figures(times: dict, clock: str) -> list:
    """The rows of one clock, from each kind's median call."""
    chat = {state: times[('chat', state)] for state in ('off', 'on')}
    store = {state: times[('chat', state)] - times[('no_store', state)] for state in ('off', 'on')}
    chat_ratio, store_ratio = chat['on'] / chat['off'], store['on'] / store['off']
    return [
        (f'chat(), 19-turn window, {clock}: metrics off → on',
         f'{chat["off"] * 1e6:.0f} → {chat["on"] * 1e6:.0f} µs = {chat_ratio:.3f} ×', f'≤ {TARGET} ×',
         chat_ratio <= TARGET),
        (f'store cost per chat call, {clock}: off → on',
         f'{store["off"] * 1e6:.0f} → {store["on"] * 1e6:.0f} µs = {store_ratio:.3f} ×', f'≤ {TARGET} ×',
         store_ratio <= TARGET),
    ]


def print_table(rows, n: int, rounds: int) -> None:
    print(f'\nllmconn metrics benchmark — own redis-server, fake provider on loopback, gevent-patched, '
          f'multiprocess values, {n * rounds} calls of each kind in shuffled order, {time.strftime("%Y-%m-%d")}\n')
    header = ('figure', 'llmconn', 'target', 'met')
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(3)]
    print('  '.join(h.ljust(w) for h, w in zip(header, widths + [3])))
    for figure, ours, target, met in rows:
        verdict = '' if met is None else ('yes' if met else 'NO')
        print('  '.join(str(v).ljust(w) for v, w in zip((figure, ours, target, verdict), widths + [3])))


if __name__ == '__main__':
    sys.exit(main())
