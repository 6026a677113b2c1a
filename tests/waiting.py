"""Waiting in tests without sleeping a fixed time: poll a condition until it holds, within a bound.

A fixed sleep is either too short on a loaded machine (the test flakes) or
too long everywhere else (the suite crawls); :func:`wait_until` returns as
soon as the condition holds and fails, saying what never happened, only
after ``timeout``, which is a bound on a broken run, never a measurement.
"""

from __future__ import annotations

import time
from typing import Any, Callable

DEFAULT_TIMEOUT = 30.0      # seconds: generous (a loaded machine is slow), since only a broken run waits this long
POLL_INTERVAL = 0.01


def wait_until(condition: Callable[[], Any], what: str, timeout: float = DEFAULT_TIMEOUT,
               interval: float = POLL_INTERVAL) -> Any:
    """``condition()``'s first truthy value; AssertionError naming ``what`` if none came within ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f'{what}: did not happen within {timeout:g} s')
        time.sleep(interval)
