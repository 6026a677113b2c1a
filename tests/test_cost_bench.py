"""The cost benchmark's billing targets (SPEC §17), checked on every test run.

``bench/bench_cost.py`` runs one 60-call chat four ways on the fake
provider, whose caching model bills as Claude's does; its billed input is
exact (the fake's tokens are words), so the targets are asserted here too.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / 'bench'))

import bench_cost  # noqa: E402


def test_placed_breakpoints_and_a_stepped_window_meet_the_billing_targets(redis_url, tmp_path):
    skill = tmp_path / 'bench' / 'SKILL.md'
    skill.parent.mkdir()
    skill.write_text(f'---\nname: bench\ndescription: a long skill\n---\n{bench_cost.words(2000, "s")}\n')
    billed = bench_cost.bench_billing(redis_url, str(tmp_path))
    a = billed['a']['billed']
    assert a <= 0.35 * billed['b']['billed']
    assert a <= 0.6 * billed['c']['billed']
    assert a <= 0.95 * billed['d']['billed']
    # Every way sent the same chat: (b) pays each input token once, at the full price.
    assert billed['b']['billed'] == billed['b']['input'] == billed['a']['input'] == billed['d']['input']
