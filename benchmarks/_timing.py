"""Best-of-N wall-clock timing shared by the benchmark scripts."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def best_of(repeats: int, fn: Callable[[], Any]) -> tuple[float, Any]:
    """Run ``fn`` ``repeats`` times; return the fastest wall time and the last result."""
    best = float("inf")
    result = None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def report(name: str, seconds: float, target_s: float, detail: str = "") -> bool:
    ok = seconds <= target_s
    status = "PASS" if ok else "FAIL"
    suffix = f" {detail}" if detail else ""
    print(f"{status} {name}: {seconds:.3f} s (target < {target_s} s){suffix}")
    return ok
