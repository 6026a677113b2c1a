"""``bench/bench_floor.py`` runs end to end: the gateway and the floor proxy answer every way, and it says so.

Timing is ``make bench``'s business; here the benchmark runs in ``--quick``
mode as its own process (it monkey-patches gevent) and its table must list
every way and every ratio against its target.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WAYS = ('chat', 'floor-chat', 'responses', 'floor-responses', 'responses-claude')
QUICK_TIMEOUT = 240         # seconds: four processes started and 600 requests, on a machine that may be loaded


def test_the_floor_benchmark_answers_every_way_and_prints_its_ratios():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get('PYTHONPATH')])))
    done = subprocess.run([sys.executable, str(ROOT / 'bench' / 'bench_floor.py'), '--quick'], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=QUICK_TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    # A way's row: its name, then CPU ms (median, min, max) and wall ms per request.
    rows = {words[0]: [float(w) for w in words[1:]] for words in map(str.split, lines)
            if len(words) == 5 and words[1].replace('.', '', 1).isdigit()}
    assert list(rows) == [*WAYS, *(way + '+sse' for way in WAYS)], done.stdout
    for name, (median, low, high, wall) in rows.items():
        assert low <= median <= high and wall > 0, f'{name}: {done.stdout}'
    ratios = [line.split() for line in lines if 'target ≤' in line]
    assert [(r[0], r[2]) for r in ratios] == [('chat', 'floor-chat'), ('chat+sse', 'floor-chat+sse'),
                                              ('responses', 'floor-responses'),
                                              ('responses+sse', 'floor-responses+sse')], done.stdout
    assert [r[-1] for r in ratios] == [ratios[0][-1], 'reported', ratios[2][-1], 'reported']
    assert {ratios[0][-1], ratios[2][-1]} <= {'yes', 'NO'}
