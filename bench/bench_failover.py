"""What a failover costs (SPEC §18): the time it adds beyond the failing call's own and the fallback's answer.

Three connections on loopback: ``failing`` and ``primary`` talk to a fake
provider that answers every request with a 500; ``primary`` lists
``fallback`` (a fake provider that answers) in ``fallbacks``. Timed side by
side, call by call, interleaved (``common.interleaved``): the failing call
alone (``failing``, its LLMError caught), the fallback's answer alone
(``fallback``), and the call that fails over (``primary``). What failing
over adds is ``primary - failing - fallback``: the fallback looked up and
checked, the failover logged, counted and handed on. Target: <= 1 ms. The
same for ``stream`` (a failover before the first event).

    .venv/bin/python bench/bench_failover.py [--quick]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from common import interleaved
from llmconn import LLMError, Registry
from llmconn.testing.fake_server import FakeProviderServer

ADDED_TARGET_S = 1e-3
ALWAYS = 10 ** 9            # faults queued on the failing provider: every request it gets


def connections(failing_url: str, answering_url: str) -> list:
    def conn(name: str, url: str, **fields) -> dict:
        return {'name': name, 'provider': 'openai', 'model': 'gpt-4o-mini', 'address': url + '/v1',
                'max_retries': 0, **fields}
    return [conn('failing', failing_url), conn('primary', failing_url, fallbacks=['fallback']),
            conn('fallback', answering_url)]


def bench(registry: Registry, scale: float, stream: bool) -> tuple:
    def call(name: str):
        if stream:
            return list(registry[name].stream('how long is a failover'))[-1].result
        return registry[name].invoke('how long is a failover')

    def failing(i):
        try:
            call('failing')
        except LLMError:
            return
        raise AssertionError('the failing provider answered')

    def primary(i):
        assert call('primary')['connection'] == 'fallback'

    n, rounds = int(400 * scale) or 20, 5
    for func in (failing, primary, lambda i: call('fallback')):
        func(0)         # warm: pools opened, first-call caches filled
    times = interleaved({'failing': failing, 'primary': primary, 'fallback': lambda i: call('fallback')}, n, rounds)
    added = times['primary'] - times['failing'] - times['fallback']
    what = 'stream() failing over before its first event' if stream else 'invoke() failing over'
    return (f'{what}: added beyond the failing call and the fallback\'s answer',
            f'{added * 1e6:.0f} µs', f'failover {times["primary"] * 1e3:.2f} ms, failing call alone '
            f'{times["failing"] * 1e3:.2f} ms, fallback alone {times["fallback"] * 1e3:.2f} ms',
            '≤ 1 ms', added <= ADDED_TARGET_S)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--quick', action='store_true', help='fewer calls: a smoke run, not a measurement')
    scale = 0.1 if parser.parse_args().quick else 1.0
    # Each failover's log line is written, as a server writes it (formatted, to a stream), but to nowhere.
    log = logging.getLogger('llmconn.failover')
    log.addHandler(logging.StreamHandler(open(os.devnull, 'w')))
    log.propagate = False
    logging.getLogger('llmconn.store').setLevel(logging.ERROR)      # memory:// is enough: no chat here
    with FakeProviderServer() as broken, FakeProviderServer() as answering:
        broken.fail(500, count=ALWAYS)
        registry = Registry.from_dict({'llm': connections(broken.url, answering.url)})
        try:
            rows = [bench(registry, scale, stream=False), bench(registry, scale, stream=True)]
        finally:
            registry.close()
    print('\nllmconn failover — fake providers on loopback\n')
    for figure, ours, theirs, target, met in rows:
        print(f'{figure}: {ours} ({theirs}); target {target}: {"yes" if met else "NO"}')
    return 0 if all(row[-1] for row in rows) else 1


if __name__ == '__main__':
    sys.exit(main())
