"""``make bench``: the performance figures of SPEC §7, measured side by side in one run.

Everything runs in one gevent-patched process (as ``llmconn serve`` does)
against Redis servers this script starts on free loopback ports (one node, a
Cluster of 3 masters + 3 replicas, a Sentinel group with one replica; never
the machine's 6379) and the fake provider in a subprocess. Each figure is printed next to its target and next
to the same figure for a Zato-style baseline (redis-py Lock + GET/SET of one
JSON blob, see ``zato_baseline.py``). Ratios, not absolute times, are the
targets, because absolute times depend on the machine.

    .venv/bin/python bench/bench.py [--quick]
"""

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import copy  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import tempfile  # noqa: E402
import uuid  # noqa: E402
from pathlib import Path  # noqa: E402

import gevent  # noqa: E402
import redis  # noqa: E402
import requests  # noqa: E402
import urllib3  # noqa: E402
from requests.adapters import HTTPAdapter  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
# The throwaway deployments the tests use (tests/redis_topology.py).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'tests'))

from redis_topology import Cluster, SentinelGroup, Servers, free_ports  # noqa: E402
from common import interleaved, per_call  # noqa: E402
import store_cost  # noqa: E402
from zato_baseline import ZatoStyleChat  # noqa: E402

from llmconn import Registry  # noqa: E402
from llmconn.store.keys import chat_keys  # noqa: E402
from llmconn.store.lock import _increments as increments_arg  # noqa: E402
from llmconn.store.runner import RedisRunner  # noqa: E402
from llmconn.store import open_store  # noqa: E402
from llmconn.testing.fake_server import FakeProviderServer  # noqa: E402
from llmconn.types import Request, Turn  # noqa: E402


class RoundTrips:
    """Counts what redis-py sends to the server: one packed send is one round trip."""

    def __init__(self) -> None:
        self.count = 0
        self._original = redis.connection.Connection.send_packed_command

    def __enter__(self):
        original, counter = self._original, self

        caller = threading.current_thread()

        def counting(conn, command, check_health=True):
            # The lock renewer's own round trips (another thread) are not a chat call's.
            if threading.current_thread() is caller:
                counter.count += 1
            return original(conn, command, check_health)

        redis.connection.Connection.send_packed_command = counting
        return self

    def __exit__(self, *exc):
        redis.connection.Connection.send_packed_command = self._original


class WindowOnly:
    """A chat store that hands every call the same window and saves nothing: chat() without Redis.

    A connection copied with this store runs the whole chat pipeline - input
    checks, usage, the window's rendering, the provider call - so the
    difference to the real chat() is the store's own cost.
    """

    def __init__(self, turns) -> None:
        self.turns = list(turns)

    def begin(self, conn_name: str, chat_id: str, **_) -> 'WindowOnly':
        return self

    def save(self, turn, **_) -> None:
        pass

    def __enter__(self) -> 'WindowOnly':
        return self

    def __exit__(self, *exc) -> None:
        pass


def without_store(conn, turns):
    """``conn`` as it would run if every chat's window were ``turns`` and nothing were stored."""
    unstored = copy.copy(conn)
    unstored.store = WindowOnly(turns)
    return unstored


def seed_llmconn(client, conn, chat_id: str, turns: int) -> None:
    key = chat_keys(conn.name, chat_id).turns
    client.delete(key)
    pipe = client.pipeline(transaction=False)
    for i in range(turns):
        turn = Turn(user=f'seed message {i}', assistant=f'seed answer {i} with a few more words', ts=time.time())
        pipe.rpush(key, json.dumps(turn.to_dict(), separators=(',', ':')))
    pipe.expire(key, int(conn.conf.chat_expiry))
    pipe.execute()


def together(n: int, func) -> float:
    started = time.perf_counter()
    gevent.joinall([gevent.spawn(func, i) for i in range(n)], raise_error=True)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument('--quick', action='store_true', help='fewer iterations, for a smoke run')
    args = parser.parse_args()
    scale = 0.2 if args.quick else 1.0
    with tempfile.TemporaryDirectory(prefix='llmconn-bench-') as tmp:
        single = Servers(Path(tmp))
        cluster = Cluster(Path(tmp) / 'cluster')
        bare = Cluster(Path(tmp) / 'bare', replicas=0)      # what the replicas' own work costs, side by side
        group = SentinelGroup(Path(tmp) / 'sentinel')
        for sub in ('cluster', 'bare', 'sentinel'):
            (Path(tmp) / sub).mkdir()
        try:
            port, = free_ports(1)
            single.start(port)
            cluster.start()
            bare.start()
            group.start()
            urls = {'one node': f'redis://127.0.0.1:{port}/0', 'cluster': cluster.url, 'sentinel': group.url,
                    'cluster without replicas': bare.url}
            rows = run(urls, scale)
        finally:
            for deployment in (group, bare, cluster, single):
                deployment.stop()
    print_table(rows, ', '.join(f'{k} {v}' for k, v in urls.items()))
    return 0


def run(urls: dict, scale: float) -> list:
    name = f'bench-{uuid.uuid4().hex[:8]}'
    rows = []
    with FakeProviderServer.spawn() as provider:
        base = {'provider': 'openai', 'model': 'bench-model', 'address': provider.url + '/v1',
                'pool_size': 600, 'max_stored_turns': 20000, 'max_retries': 0, 'lock_wait': 60}
        # Three connections that differ only in their window, so that a comparison can keep the
        # request the provider receives the same size on both sides.
        names = {window: f'{name}-w{window}' for window in (1, 10, 20)}
        registries = {kind: Registry.from_dict({'redis': {'url': url}, 'llm': [
            dict(base, name=n, max_history_turns=window) for window, n in names.items()]})
            for kind, url in urls.items()}
        durable = Registry.from_dict({'redis': {'url': urls['sentinel'], 'replicas': 1},
                                      'llm': [dict(base, name=names[1], max_history_turns=1)]})
        conns = {window: registries['one node'][n] for window, n in names.items()}
        client = redis.Redis.from_url(urls['one node'])
        zato = ZatoStyleChat(conns[20], client)
        try:
            rows += bench_overhead(conns, zato, client.ping, scale)
            # The same store cost, today against the first version, each in its own process.
            rows += store_cost.compare(urls['one node'], provider.url, scale)
            rows += bench_runner(conns[20], scale)
            for kind in ('cluster', 'sentinel', 'cluster without replicas'):
                rows += bench_deployment(kind, registries[kind][names[1]], conns[1], scale)
            rows += bench_replicas(registries['sentinel'][names[1]], durable[names[1]], scale)
            rows += bench_round_trips(conns[20], zato)
            rows += bench_long_history(conns[10], conns[20], zato, client, scale)
            rows += bench_handoff(conns[20], zato, provider)
            rows += bench_lock_handoff(urls['one node'])
            rows += bench_many_chats(conns[20], provider, scale)
            rows += bench_many_chats_cluster(conns[20], registries['cluster'][names[20]], scale)
            rows += bench_tool_turn(conns[1], client, provider, scale)
        finally:
            for registry in (*registries.values(), durable):
                registry.close()
    return rows


def chat_pings(conn, chat_id: str):
    """Two PINGs through the store's own client, to the node that holds ``chat_id``."""
    client = conn.store._runner.client
    if hasattr(client, 'get_node_from_key'):             # RedisCluster: the chat's slot's master
        node = client.get_node_from_key(chat_keys(conn.name, chat_id).lock)
        return lambda: client.ping(target_nodes=node)
    return client.ping


def bench_runner(conn, scale) -> list:
    """A chat call's two scripts through the pooled fast path and through redis-py's Redis.evalsha."""
    n, rounds = int(500 * scale) or 20, 9
    runner = conn.store._runner
    keys = chat_keys(conn.name, 'runner')
    acquire_keys, finish_keys = (keys.lock, keys.turns, keys.queue, keys.seq), (keys.lock, keys.turns, keys.queue,
                                                                                keys.saved)

    def two_scripts(send):
        def call(i):
            token = f'{i:032x}'
            send('acquire', acquire_keys, (token, 30000, 19, 0, b''))
            send('finish', finish_keys, (token, b'{"u":"bench","a":"bench"}', 100, 60000, b'0', b''))
        return call

    times = interleaved({'fast': two_scripts(runner.script),
                         'redis-py': two_scripts(lambda *args: RedisRunner.script(runner, *args))}, n, rounds)
    fast, slow = times['fast'], times['redis-py']
    return [('a chat call\'s two scripts, fast runner vs redis-py\'s path', f'{fast * 1e6:.0f} µs',
             f'redis-py path {slow * 1e6:.0f} µs', '', None)]


def bench_deployment(kind: str, conn, invoker, scale) -> list:
    """chat() − invoke() on a deployment, against two PINGs in chat's places on the same client.

    A PING writes nothing; on a deployment with replicas each of chat's writes
    is also fed to a replica, which wakes and takes a core. So the same
    overhead is also set against two one-key writes (SET, same slot, same
    client) in chat's places: the floor of two replicated round trips.
    """
    n, rounds = int(400 * scale) or 20, 9
    ping = chat_pings(conn, 'overhead')
    client = conn.store._runner.client
    beside = chat_keys(conn.name, 'overhead').lock + ':bench-write'       # the chat's slot
    for i in range(30):
        conn.chat(f'warm {i}', chat_id='overhead')
        ping()

    def pings_around_invoke(i):
        ping()
        invoker.invoke(f'message {i}')
        ping()

    def writes_around_invoke(i):
        client.set(beside, i)
        invoker.invoke(f'message {i}')
        client.set(beside, i)

    times = interleaved({
        'invoke': lambda i: invoker.invoke(f'message {i}'),
        'pings_around': pings_around_invoke,
        'writes_around': writes_around_invoke,
        'chat': lambda i: conn.chat(f'message {i}', chat_id='overhead'),
    }, n, rounds)
    client.delete(beside)
    in_place, cost = times['pings_around'] - times['invoke'], times['chat'] - times['invoke']
    writes = times['writes_around'] - times['invoke']
    if in_place <= 0 or writes <= 0:    # the difference drowned in noise (a loaded machine): no ratio to give
        return [(f'{kind}: chat() − invoke() vs two PINGs in place', f'{cost * 1e6:.0f} µs',
                 'PINGs unmeasurable (noise)', '≤ 1.5 ×', None)]
    return [(f'{kind}: chat() − invoke() vs two PINGs in place', f'{cost * 1e6:.0f} µs = {cost / in_place:.2f} ×',
             f'PINGs {in_place * 1e6:.0f} µs', '≤ 1.5 ×', cost / in_place <= 1.5),
            ('  the same vs two one-key writes in place', f'{cost / writes:.2f} ×', f'SETs {writes * 1e6:.0f} µs',
             '', None)]


def bench_replicas(plain, durable, scale) -> list:
    """What replicas: 1 adds to a chat call, against one replica acknowledgement measured alone.

    The acknowledgement alone is that of a chat's own save: its two scripts
    sent back to back on the store's runner, the save (its turn and usage
    counters) with and without ``WAIT 1`` packed behind it (as chat sends
    it), so the replica applies the same write in both. Each figure is a difference of calls that differ
    by tens of µs, so the four kinds run call by call in a shuffled order (a
    fixed order lets one kind always follow the replica's work of another)
    and each kind's median call is kept. A WAIT after a one-key SET is
    printed too: the replica applies less there.
    """
    n = int(5000 * scale) or 100
    runner = plain.store._runner
    for i in range(30):
        plain.chat(f'warm {i}', chat_id='replicas')
        durable.chat(f'warm {i}', chat_id='replicas-durable')
    keys = chat_keys(plain.name, 'replicas-alone')
    acquire_keys, finish_keys = (keys.lock, keys.turns, keys.queue, keys.seq), (keys.lock, keys.turns, keys.queue,
                                                                                keys.saved)
    turn = json.dumps(Turn(user='m 1', assistant='bench-model says hello', ts=time.time()).to_dict()).encode()
    # The usage ledger's counters, as a chat's save carries them (the replica applies those too).
    saved = plain.usage.call(plain.name, plain.conf.model).save_entry(
        plain.name, 'replicas-alone', {'usage': {'input_tokens': 12, 'output_tokens': 7}}, None)
    ledger_key, counters = saved.key, increments_arg(saved.counts, saved.expiry)

    def save(wait: bool):
        def call(i):
            token = uuid.uuid4().hex
            runner.script('acquire', acquire_keys, (token, 30000, 0, 0, b''))
            args = (token, turn, 100, 60000, b'0', b'', counters)
            if wait:
                runner.script_and_wait('finish', finish_keys + (ledger_key,), args, 1, 1000)
            else:
                runner.script('finish', finish_keys + (ledger_key,), args)
        return call

    def send(*commands):
        pool = runner.client.connection_pool
        conn = pool.get_connection()
        try:
            conn.send_packed_command(conn.pack_commands(commands))
            for _ in commands:
                conn.read_response()
        finally:
            pool.release(conn)

    funcs = {
        'plain': lambda i: plain.chat(f'm {i}', chat_id='replicas'),
        'durable': lambda i: durable.chat(f'm {i}', chat_id='replicas-durable'),
        'save': save(False),
        'save_wait': save(True),
        'write': lambda i: send(('SET', 'bench-ack', i)),
        'write_wait': lambda i: send(('SET', 'bench-ack', i), ('WAIT', 1, 1000)),
    }
    times = interleaved(funcs, n, 1)
    extra = times['durable'] - times['plain']
    ack, small = times['save_wait'] - times['save'], times['write_wait'] - times['write']
    return [('replicas: 1, extra cost of a chat call vs its save\'s WAIT measured alone',
             f'{extra * 1e6:.0f} µs = {extra / ack:.2f} ×', f'WAIT {ack * 1e6:.0f} µs', '≤ 1.1 ×',
             extra / ack <= 1.1),
            ('  the same vs one WAIT after a SET', f'{extra / small:.2f} ×', f'WAIT {small * 1e6:.0f} µs', '', None)]


def bench_many_chats_cluster(single, clustered, scale) -> list:
    concurrency, total = 500, int(5000 * scale) or 500

    def worker(conn):
        def chat(w):
            for i in range(total // concurrency):
                conn.chat(f'many {i}', chat_id=f'many-{w}')
        return chat

    together(concurrency, worker(clustered))       # warm both
    together(concurrency, worker(single))
    rates = {}
    for _ in range(2):                              # alternate, keep the best of each
        for label, conn in (('single', single), ('cluster', clustered)):
            rates[label] = max(rates.get(label, 0), total / together(concurrency, worker(conn)))
    ratio = rates['cluster'] / rates['single']
    return [('500 concurrent chats, cluster vs one node', f'{rates["cluster"]:.0f}/s = {ratio:.2f} ×',
             f'one node {rates["single"]:.0f}/s', '≥ 0.9 ×', ratio >= 0.9)]


def bench_overhead(conns, zato, ping, scale) -> list:
    n, rounds = int(400 * scale) or 20, 9
    one, full = conns[1], conns[20]
    for i in range(30):                     # warm up pools, scripts, a full window
        for conn in (one, full):
            conn.chat(f'warm {i}', chat_id='overhead')
        zato.chat(f'warm {i}', chat_id='overhead')
        one.invoke('warm')
    unstored = without_store(full, full.store.history(full.name, 'overhead')[-19:])

    def pings_around_invoke(i):
        # Two PINGs where chat() makes its round trips: one before the provider call, one after.
        ping()
        one.invoke(f'message {i}')
        ping()

    times = interleaved({
        'pings': lambda i: (ping(), ping()),
        'invoke': lambda i: one.invoke(f'message {i}'),
        'pings_around': pings_around_invoke,
        'chat1': lambda i: one.chat(f'message {i}', chat_id='overhead'),
        # The same chat with its 19-turn window handed over in memory and nothing saved: no Redis.
        'window': lambda i: unstored.chat(f'message {i}', chat_id='overhead'),
        'chat20': lambda i: full.chat(f'message {i}', chat_id='overhead'),
    }, n, rounds)
    tight, in_place = times['pings'], times['pings_around'] - times['invoke']
    same = times['chat1'] - times['invoke']
    store = times['chat20'] - times['window']
    return [
        ('two Redis PINGs, back to back', f'{tight * 1e6:.0f} µs', '', '', None),
        ('two Redis PINGs around an invoke() (chat\'s places)', f'{in_place * 1e6:.0f} µs', '', '', None),
        ('invoke() at zero provider latency', f'{times["invoke"] * 1e6:.0f} µs', '', '', None),
        ('chat() − invoke(), same request, vs PINGs in place', f'{same * 1e6:.0f} µs = {same / in_place:.2f} ×',
         '', '≤ 1.5 ×', same / in_place <= 1.5),
        ('  the same vs PINGs back to back', f'{same / tight:.2f} ×', '', '≤ 1.5 ×', same / tight <= 1.5),
        ('chat() − the same chat without Redis, 19-turn window', f'{store * 1e6:.0f} µs = {store / in_place:.2f} ×',
         '', '≤ 1.5 ×', store / in_place <= 1.5),
    ]


def bench_round_trips(conn, zato) -> list:
    calls = 50
    with RoundTrips() as ours:
        for i in range(calls):
            conn.chat(f'counted {i}', chat_id='overhead')
    with RoundTrips() as theirs:
        for i in range(calls):
            zato.chat(f'counted {i}', chat_id='overhead')
    per, zper = ours.count / calls, theirs.count / calls
    return [('Redis round trips per chat call', f'{per:.2f}', f'{zper:.2f}', '≤ 2', per <= 2)]


def bench_long_history(conn10, conn, zato, client, scale) -> list:
    n, rounds = int(200 * scale) or 10, 5
    # A window of 9 turns on both sides, so only the number of stored turns differs. Each block
    # starts from freshly seeded chats, so "10 stored turns" stays (nearly) true while it runs.
    samples = {'short': [], 'long': []}
    for _ in range(rounds):
        seed_llmconn(client, conn10, 'short', 10)
        seed_llmconn(client, conn10, 'long', 10_000)
        for chat_id in samples:
            samples[chat_id].append(per_call(lambda i: conn10.chat(f'm {i}', chat_id=chat_id), n // 4 or 5))
    times = {chat_id: statistics.median(values) for chat_id, values in samples.items()}
    # Zato's blob grows by one turn per call; re-seed between blocks so both stay at ~1000 turns.
    at_1000 = {'ours': [], 'zato': []}
    for _ in range(rounds):
        seed_llmconn(client, conn, 'thousand', 1000)
        zato.seed('thousand', 1000)
        at_1000['ours'].append(per_call(lambda i: conn.chat(f'm {i}', chat_id='thousand'), n))
        at_1000['zato'].append(per_call(lambda i: zato.chat(f'm {i}', chat_id='thousand'), n))
    ours, theirs = statistics.median(at_1000['ours']), statistics.median(at_1000['zato'])
    long_ratio = times['long'] / times['short']
    return [
        ('chat() with 10,000 stored turns vs 10', f'{long_ratio:.2f} ×', '', '≤ 1.1 ×', long_ratio <= 1.1),
        ('chat() at 1,000 stored turns', f'{ours * 1e6:.0f} µs', f'{theirs * 1e6:.0f} µs',
         '≥ 2 × faster', theirs / ours >= 2),
        ('  speed-up over the baseline at 1,000 turns', f'{theirs / ours:.1f} ×', '', '', None),
    ]


def bench_handoff(conn, zato, provider) -> list:
    """20 concurrent calls on one chat whose provider calls each take 50 ms.

    The fake provider sleeps for its latency, but a call that idles the
    processes for 50 ms takes 1-3 ms more (waking the idle client and
    provider); so the fake's latency is set such that one invoke() takes
    50 ms, as a provider answering in 50 ms would. Against 20 single calls
    at that latency, the figure is the lock handoff's share.
    """
    def one_call() -> float:
        return statistics.median(per_call(lambda i: conn.invoke('one call'), 1) for _ in range(15))

    nominal = 0.05
    latency = nominal
    try:
        provider.set_latency(latency)
        # Open the Redis connections a burst of 20 needs first: the figure is about handoff, not connecting.
        together(20, lambda i: conn.chat(f'warm {i}', chat_id=f'handoff-warm-{i}'))
        for _ in range(2):
            latency = max(0.0, latency - (one_call() - nominal))
            provider.set_latency(latency)
        single = one_call()
        ours = together(20, lambda i: conn.chat(f'h {i}', chat_id='handoff'))
        theirs = together(20, lambda i: zato.chat(f'h {i}', chat_id='handoff'))
    finally:
        provider.set_latency(0)
    total, serial = 20 * nominal, 20 * single
    return [
        ('one invoke() at 50 ms (the fake sleeps ' f'{latency * 1e3:.1f} ms)', f'{single * 1e3:.1f} ms', '', '', None),
        ('20 concurrent calls on one chat, 50 ms provider', f'{ours:.3f} s = {ours / total:.3f} × 1.0 s',
         f'{theirs:.3f} s = {theirs / total:.3f} ×', '≤ 1.05 × 1.0 s', ours / total <= 1.05),
        ('  the same vs 20 × one invoke() (handoff alone)', f'{ours / serial:.3f} ×',
         f'{theirs / serial:.3f} ×', '', None),
    ]


def bench_lock_handoff(url: str) -> list:
    """How soon a caller queued on a chat's lock has it once the holder releases or saves (median of 20).

    The wake-up is a push to the waiter's own key, which its BLPOP was blocked
    on; polling would cost its interval, a missed wake-up the waiter's cap.
    (tests/test_store_lock.py proves the single wake-up; this is its latency.)
    """
    holder_store, waiter_store = open_store(url), open_store(url)
    client = redis.Redis.from_url(url)
    chat, delays = f'handoff-{uuid.uuid4().hex[:8]}', []
    try:
        for i in range(20):
            holder = holder_store.begin('bench-handoff', chat, window=5, lock_ttl=30, lock_wait=30)
            acquired = []

            def wait_for_the_lock():
                lock = waiter_store.begin('bench-handoff', chat, window=5, lock_ttl=30, lock_wait=30)
                acquired.append(time.perf_counter())
                lock.release()

            waiter = gevent.spawn(wait_for_the_lock)
            while not client.llen(chat_keys('bench-handoff', chat).queue):
                gevent.sleep(0.001)
            gevent.sleep(0.005)                 # let it settle in BLPOP: the figure is the wake-up alone
            released = time.perf_counter()
            if i % 2:
                holder.release()
            else:
                holder.save(Turn(user='m', assistant='ok', ts=time.time()), expiry=60, max_turns=100)
            waiter.join(5)
            delays.append(acquired[0] - released)
    finally:
        holder_store.close()
        waiter_store.close()
        client.close()
    median = statistics.median(delays)
    return [('lock handoff to a queued caller (median of 20)', f'{median * 1e3:.2f} ms',
             'Zato-style: its 100 ms poll', '≤ 5 ms', median <= 0.005)]


def bench_many_chats(conn, provider, scale) -> list:
    """500 chats at once against the same number of raw POSTs of the same size, two ways.

    Every chat here holds a full window (19 turns) once warm, so the raw sides
    post the body such a chat sends (its window rendered by the provider
    mapping), not a one-message body: all make the same requests, and the
    difference is llmconn's own work and the store's. llmconn's transport
    drives urllib3's pools itself, so a ``requests.Session`` baseline is
    slower by requests' own layers, which would be credited to llmconn: the
    raw urllib3 pool is the floor, ``requests`` the familiar comparison.
    """
    concurrency, total = 500, int(5000 * scale) or 500
    session = requests.Session()
    session.mount('http://', HTTPAdapter(pool_connections=1, pool_maxsize=concurrency))
    pool = urllib3.PoolManager(num_pools=1, maxsize=concurrency, block=True)

    def chat_worker(w):
        for i in range(total // concurrency):
            conn.chat(f'many {i}', chat_id=f'many-{w}')

    for _ in range(2):                       # warm the pool; fill every chat's window
        together(concurrency, chat_worker)
    window = tuple(conn.store.history(conn.name, 'many-0')[-(conn.conf.max_history_turns - 1):])
    url, headers = conn.provider.url(), conn._headers
    data = json.dumps(conn.provider.build_request(Request('many 0', '', window)))

    def requests_worker(w):
        for _ in range(total // concurrency):
            session.post(url, data=data, headers=headers).json()

    def urllib3_worker(w):
        for _ in range(total // concurrency):
            json.loads(pool.request('POST', url, body=data, headers=headers).data)

    rates = {'chat': 0.0, 'requests': 0.0, 'urllib3': 0.0}
    workers = {'requests': requests_worker, 'urllib3': urllib3_worker, 'chat': chat_worker}
    together(concurrency, requests_worker)   # warm their pools
    together(concurrency, urllib3_worker)
    for _ in range(3):                       # alternate, keep the best of each: noise only slows a block
        for side, worker in workers.items():
            rates[side] = max(rates[side], total / together(concurrency, worker))
    pool.clear()
    session.close()
    vs_requests, vs_urllib3 = rates['chat'] / rates['requests'], rates['chat'] / rates['urllib3']
    return [(f'500 concurrent distinct chats ({len(window)}-turn windows), throughput',
             f'{rates["chat"]:.0f}/s = {vs_requests:.2f} × raw requests', f'raw requests {rates["requests"]:.0f}/s',
             '≥ 0.8 ×', vs_requests >= 0.8),
            ('  the same vs raw urllib3 (what llmconn\'s transport drives)',
             f'{vs_urllib3:.2f} × raw urllib3', f'raw urllib3 {rates["urllib3"]:.0f}/s', '', None)]


def bench_tool_turn(conn, client, provider, scale) -> list:
    """A two-round tool turn against a plain chat() whose one request is replaced by the turn's two.

    The floor is what the turn cannot avoid: its two provider requests, each
    rendered, sent and parsed as any call does (``Connection._call``), plus
    what a plain chat() costs beyond its own request - the store's two round
    trips and the call pipeline, which a tool turn runs once. What is left
    over is the loop's own: no Redis round trip, the tool run and its
    bookkeeping. A window of one turn keeps both requests the same on every call.
    """
    n, rounds = int(200 * scale) or 10, 9

    def noop() -> str:
        """Does nothing."""
        return 'ok'

    tools = [noop]
    for _ in range(20):
        conn.chat('call noop {}', chat_id='tools', tools=tools)
    made = []                       # the Request of each round, as the pipeline makes it
    original = conn._call
    conn._call = lambda request: (made.append(request), original(request))[1]
    try:
        conn.chat('call noop {}', chat_id='tools', tools=tools)
    finally:
        del conn._call
    assert len(made) == 2, f'the tool turn made {len(made)} provider calls, not 2'
    plain = Request('plain request')

    def drain(events) -> None:
        for _ in events:
            pass

    def two_requests(i):
        for request in made:
            drain(conn._call(request))

    times = interleaved({'tool': lambda i: conn.chat('call noop {}', chat_id='tools', tools=tools),
                         'requests': two_requests,
                         'chat': lambda i: conn.chat(f'plain {i}', chat_id='plain'),
                         'request': lambda i: drain(conn._call(plain))}, n, rounds)
    beyond = times['chat'] - times['request']       # store round trips + pipeline, once
    floor = times['requests'] + beyond
    ratio = times['tool'] / floor
    return [('two-round tool turn vs its two requests + what a plain chat() adds to its one',
             f'{times["tool"] * 1e6:.0f} µs = {ratio:.2f} ×',
             f'requests {times["requests"] * 1e6:.0f} µs + chat {beyond * 1e6:.0f} µs', '≤ 1.05 ×', ratio <= 1.05)]


def print_table(rows, redis_url) -> None:
    print(f'\nllmconn benchmark — Redis: {redis_url}; fake provider on loopback, gevent-patched, '
          f'{time.strftime("%Y-%m-%d")}\n')
    widths = [max(len(str(r[i])) for r in rows + [('figure', 'llmconn', 'Zato-style baseline', 'target')])
              for i in range(4)]
    header = ('figure', 'llmconn', 'Zato-style baseline', 'target', 'met')
    print('  '.join(h.ljust(w) for h, w in zip(header, widths + [3])))
    for figure, ours, theirs, target, met in rows:
        verdict = '' if met is None else ('yes' if met else 'NO')
        print('  '.join(str(v).ljust(w) for v, w in zip((figure, ours, theirs, target, verdict), widths + [3])))


if __name__ == '__main__':
    sys.exit(main())
