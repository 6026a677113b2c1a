"""The quick benchmarks of ``make bench`` run to their end and print each figure with its verdict.

A change to a call path or a store value once left ``make bench`` failing
half way (a benchmark that reaches into the library unpacked the old type):
each of these runs in ``--quick`` mode as its own process, as ``make bench``
runs it, and must exit 0 and print its figures against their targets with
a verdict (``yes`` or ``NO``: the figures themselves are ``make bench``'s
business).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
QUICK_TIMEOUT = 180         # seconds, on a machine that may be loaded
BENCHMARKS = ('usage_bench', 'bench_metrics', 'bench_rich', 'bench_failover', 'bench_limits')


@pytest.mark.parametrize('name', BENCHMARKS)
def test_a_quick_benchmark_runs_to_its_end_with_a_verdict_per_target(name):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get('PYTHONPATH')])))
    done = subprocess.run([sys.executable, str(ROOT / 'bench' / f'{name}.py'), '--quick'], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=QUICK_TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    verdicts = [line for line in done.stdout.splitlines()
                if ('≤' in line or '<=' in line) and re.search(r'\b(yes|NO|met)\b', line)]
    assert verdicts, done.stdout
