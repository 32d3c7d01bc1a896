"""Event-based waiting for tests that watch other processes (no wall-clock assertions)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], what: str, timeout_s: float = 300.0,
               poll_s: float = 0.2) -> T:
    """Poll ``condition`` until it returns a true value and return it; the timeout only
    guards against a hang (generous: loaded machines)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(poll_s)
