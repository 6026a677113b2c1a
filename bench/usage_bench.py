"""The usage ledger's cost on the hot path: a chat call's store work with the ledger on and off.

Starts its own throwaway ``redis-server`` on a free port (never the
machine's) and, for the whole-call figure, the fake provider in a
subprocess. The two kinds of call run one at a time in an order
shuffled anew each time (``common.interleaved``); each figure is the
median of every call timed alone.

    .venv/bin/python bench/usage_bench.py [--quick]

Target (SPEC §11): store cost per chat call with the ledger ≤ 1.05 × without.
What the ledger adds to a save: a hash key and one argument carrying the expiry
and three field/increment pairs (redis-py's packer costs about 1 µs per
argument, so they travel as one string the script splits, filled into a
format made once per set of fields), and three HINCRBY inside the script; no
round trip.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid

from common import interleaved, start_redis
from llmconn import Registry
from llmconn.store import open_store
from llmconn.testing.fake_server import FakeProviderServer
from llmconn.types import Turn
from llmconn.usage import NO_LEDGER, UsageLedger

TARGET = 1.05
RESULT = {'text': 'an answer of a few words', 'usage': {'input_tokens': 120, 'output_tokens': 30}}


def bench_store(url: str, n: int, rounds: int) -> tuple[float, float]:
    """begin + save of one chat (window 19, 20 stored turns), without and with the ledger's block."""
    store = open_store(url)
    ledger = UsageLedger(store)
    name = f'bench-{uuid.uuid4().hex[:6]}'
    prefix = ledger.prefix(name, 'bench-model')
    turn = Turn(user='a question of a few words', assistant='an answer of a few words', ts=time.time())

    def call(chat_id: str, with_usage: bool) -> None:
        lock = store.begin(name, chat_id, window=19, lock_ttl=30, lock_wait=10)
        usage = ledger.save_entry(name, chat_id, prefix, RESULT) if with_usage else None
        lock.save(turn, expiry=3600, max_turns=20, counters=usage)

    for i in range(40):         # both chats full, scripts loaded
        call('off', False)
        call('on', True)
    times = interleaved({'off': lambda i: call('off', False), 'on': lambda i: call('on', True)}, n, rounds)
    store.close()
    return times['off'], times['on']


def bench_chat(url: str, n: int, rounds: int) -> tuple[float, float]:
    """A whole chat() at zero provider latency: a connection counting into the ledger, one that does not."""
    with FakeProviderServer.spawn() as provider:
        base = {'provider': 'openai', 'model': 'bench-model', 'address': provider.url + '/v1', 'max_retries': 0,
                'max_history_turns': 20, 'max_stored_turns': 20}
        name = f'bench-{uuid.uuid4().hex[:6]}'
        registry = Registry.from_dict({'redis': {'url': url}, 'llm': [dict(base, name=name + '-off'),
                                                                      dict(base, name=name + '-on')]})
        off, on = registry[name + '-off'], registry[name + '-on']
        off.usage = NO_LEDGER
        for i in range(40):
            off.chat('a question of a few words', chat_id='c')
            on.chat('a question of a few words', chat_id='c')
        times = interleaved({'off': lambda i: off.chat('a question of a few words', chat_id='c'),
                             'on': lambda i: on.chat('a question of a few words', chat_id='c')}, n, rounds)
        registry.close()
    return times['off'], times['on']


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument('--quick', action='store_true', help='fewer iterations, for a smoke run')
    args = parser.parse_args()
    n, rounds = (200, 5) if args.quick else (500, 21)
    proc, url = start_redis()
    try:
        store_off, store_on = bench_store(url, n, rounds)
        chat_off, chat_on = bench_chat(url, n // 4, rounds)
    finally:
        proc.kill()
        proc.wait()
    print(f'usage ledger benchmark — throwaway Redis {url}, {time.strftime("%Y-%m-%d")}')
    print(f'{"figure":<52} {"ledger off":>11} {"ledger on":>11} {"ratio":>8}  target   met')
    for label, off, on, target in (('store cost per chat call (begin + save)', store_off, store_on, TARGET),
                                   ('whole chat() at zero provider latency', chat_off, chat_on, None)):
        ratio = on / off
        met = ('yes' if ratio <= target else 'NO') if target else ''
        goal = f'≤ {target} ×' if target else ''
        print(f'{label:<52} {off * 1e6:>8.0f} µs {on * 1e6:>8.0f} µs {ratio:>6.3f} ×  {goal:<8} {met}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
