"""What a long chat costs on Claude, billed by the fake provider's caching model (SPEC §17).

One 60-call chat (a 2,000-token skill, ~300-token turns, ``max_history_turns:
20``) is run four ways against the fake provider, whose prompt cache bills as
Claude's does (``llmconn.testing.fake_cache``: breakpoints, 20-block lookback,
1,024-token minimum, 5-minute lifetime), on a throwaway ``redis-server``:

    (a) window_step 5, cache auto          what llmconn does with the shipped settings
    (b) window_step 5, cache off           no caching at all
    (c) window_step 1, one automatic breakpoint on the last block
                                           what a client or proxy adding cache_control gets today
    (d) window_step 5, one top-level breakpoint (Claude's automatic caching) instead of llmconn's

Billed input = uncached + 1.25 x written + 0.1 x read (Claude's prices for a
5-minute cache, in input-token units). Targets: (a) <= 0.35 x (b), <= 0.6 x
(c), <= 0.95 x (d). Tokens are the fake's (whitespace words), so the figures
are exact and the same on every run. What a stepped window costs a chat call
(one LLEN inside the acquire script, no round trip) is timed too; the store's
cost against two PINGs is bench.py's figure.

    .venv/bin/python bench/bench_cost.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid

from common import interleaved, start_redis
from llmconn import Registry
from llmconn.testing.fake_server import FakeProviderServer

CALLS = 60
SKILL_TOKENS = 2000
USER_TOKENS = 100               # the fake's reply repeats the last two user texts: ~310-token turns
READ_PRICE, WRITE_PRICE = 0.1, 1.25
AUTOMATIC = {'cache_control': {'type': 'ephemeral'}}     # Claude's top-level breakpoint, on the last block
SCENARIOS = (
    ('a', 'window_step 5, cache auto (llmconn)', {'window_step': 5}),
    ('b', 'window_step 5, cache off', {'window_step': 5, 'cache': 'off'}),
    ('c', 'window_step 1, one breakpoint on the last block', {'cache': 'off', 'params': AUTOMATIC}),
    ('d', 'window_step 5, one top-level breakpoint', {'window_step': 5, 'cache': 'off', 'params': AUTOMATIC}),
)
TARGETS = (('b', 0.35), ('c', 0.6), ('d', 0.95))      # (a) at most this share of each
STEP_COST = 1.05        # a stepped window may cost the chat call no more than this (one LLEN in a script)


def words(n: int, tag: str) -> str:
    return ' '.join(f'{tag}{i}' for i in range(n))


def run_chat(registry, name: str, provider) -> dict:
    """The chat's summed counts: input, read, written, uncached and billed."""
    provider.state.cache.clear()        # each way starts cold, as a new chat would
    conn = registry[name]
    totals = dict.fromkeys(('input', 'read', 'written'), 0)
    for i in range(CALLS):
        usage = conn.chat(words(USER_TOKENS, f't{i}-'), chat_id='bench', skill='bench')['usage']
        totals['input'] += usage['input_tokens']
        totals['read'] += usage['cache_read_tokens']
        totals['written'] += usage['cache_write_tokens']
    totals['uncached'] = totals['input'] - totals['read'] - totals['written']
    totals['billed'] = totals['uncached'] + WRITE_PRICE * totals['written'] + READ_PRICE * totals['read']
    return totals


def bench_billing(url: str, skills_dir: str) -> dict:
    with FakeProviderServer() as provider:
        base = {'provider': 'claude', 'model': 'claude-sonnet-5-5', 'address': provider.url, 'max_retries': 0,
                'max_history_turns': 20}
        run = uuid.uuid4().hex[:6]
        conns = [dict(base, name=f'cost-{key}-{run}', **conf) for key, _, conf in SCENARIOS]
        with Registry.from_dict({'redis': {'url': url}, 'skills_dir': skills_dir, 'llm': conns}) as registry:
            return {key: run_chat(registry, f'cost-{key}-{run}', provider) for key, _, _ in SCENARIOS}


def bench_store(url: str, n: int, rounds: int) -> dict:
    """Whole chat() calls of a full 20-turn window, with window_step 5 and 1, each call timed alone
    (against the fake in a subprocess): what the stepped window costs the store's two scripts."""
    with FakeProviderServer.spawn() as provider:
        base = {'provider': 'openai', 'model': 'bench-model', 'address': provider.url + '/v1', 'max_retries': 0,
                'max_history_turns': 20}
        conns = [dict(base, name='step5', window_step=5), dict(base, name='step1')]
        with Registry.from_dict({'redis': {'url': url}, 'llm': conns}) as registry:
            step5, step1 = registry['step5'], registry['step1']
            for i in range(40):         # past the window, scripts loaded
                step5.chat(f'warm {i}', chat_id='c')
                step1.chat(f'warm {i}', chat_id='c')
            return interleaved({'step5': lambda i: step5.chat(f'message {i}', chat_id='c'),
                                'step1': lambda i: step1.chat(f'message {i}', chat_id='c')}, n, rounds)


def report(billed: dict, store: dict) -> bool:
    print(f'cost benchmark - {CALLS}-call chat on Claude (fake caching model), {SKILL_TOKENS}-token skill, '
          f'~{3 * USER_TOKENS + 8}-token turns, max_history_turns 20, {time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}')
    print(f'{"":3} {"way":<48} {"input":>8} {"uncached":>9} {"written":>8} {"read":>8} {"billed":>10} {"(a) / it":>9}')
    a = billed['a']['billed']
    for key, label, _ in SCENARIOS:
        t = billed[key]
        share = f'{a / t["billed"]:.3f}' if key != 'a' else ''
        print(f'({key}) {label:<48} {t["input"]:>8} {t["uncached"]:>9} {t["written"]:>8} {t["read"]:>8} '
              f'{t["billed"]:>10.0f} {share:>9}')
    ok = True
    for key, target in TARGETS:
        share = a / billed[key]['billed']
        ok &= share <= target
        print(f'target: (a) <= {target} x ({key}): {share:.3f} x  {"met" if share <= target else "NOT MET"}')
    ratio = store['step5'] / store['step1']
    met = ratio <= STEP_COST
    print(f'whole chat() at zero provider latency, 20-turn window: window_step 5 {store["step5"] * 1e6:.0f} us, '
          f'window_step 1 {store["step1"] * 1e6:.0f} us = {ratio:.3f} x  target <= {STEP_COST} x: '
          f'{"met" if met else "NOT MET"}')
    return ok and met


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument('--quick', action='store_true', help='fewer store timings, for a smoke run')
    args = parser.parse_args()
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as tmp:
        skill = Path(tmp) / 'bench' / 'SKILL.md'
        skill.parent.mkdir()
        skill.write_text(f'---\nname: bench\ndescription: a long skill\n---\n{words(SKILL_TOKENS, "s")}\n')
        proc, url = start_redis()
        try:
            billed = bench_billing(url, tmp)
            store = bench_store(url, *((60, 5) if args.quick else (300, 9)))
        finally:
            proc.kill()
            proc.wait()
    return 0 if report(billed, store) else 1


if __name__ == '__main__':
    sys.exit(main())
