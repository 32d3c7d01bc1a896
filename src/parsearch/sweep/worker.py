"""A sweep worker: take cells from the queue and answer them until the sweep is done.

A worker stops when no cell waits and none is in flight anywhere: while
another worker holds a cell it keeps looking, so that if that worker dies
(its heartbeat stops) the cell is failed, queued again and answered here.
"""

from __future__ import annotations

import functools
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from parsearch.search.storage import GRACE_HEARTBEATS, heartbeat_interval
from parsearch.sweep.cells import CellSolver
from parsearch.sweep.outage import Retrier
from parsearch.sweep.queue import CellQueue, Progress, holding

T = TypeVar("T")


@dataclass
class WorkerStats:
    """What one worker did."""

    worker: str
    answered: int = 0
    lost: int = 0  # answered, but the cell had been taken away (presumed dead) meanwhile
    cells: list[int] = field(default_factory=list)
    elapsed_s: float = 0.0


def worker_name(number: int) -> str:
    return f"{number}@{socket.gethostname()}:{os.getpid()}"


def _safe_solve(solver: CellSolver, queue: CellQueue, index: int) -> dict[str, Any]:
    try:
        return solver.solve(queue.cells[index])
    except Exception as error:  # a defect, not bad input: record it instead of dying
        return {"status": "error", "reason": f"{type(error).__name__}: {error}"[:500]}


def _direct(what: str, step: Callable[[], T]) -> T:
    return step()


def run_worker(queue: CellQueue, solver: CellSolver, *, name: str,
               poll_s: float | None = None, hold_s: float = 0.0,
               max_cells: int | None = None, stop: threading.Event | None = None,
               on_progress: Callable[[Progress], None] | None = None,
               db: Retrier | None = None) -> WorkerStats:
    """Answer cells until the sweep is finished (or ``max_cells``, or ``stop`` is set).

    ``hold_s`` keeps each claimed cell that long before answering it (a
    controlled slowdown, so tests can stop a worker in the middle of a cell).
    ``db`` waits out a database outage (:mod:`parsearch.sweep.outage`); without
    it the first connection error ends the worker.
    """
    start = time.monotonic()
    stats = WorkerStats(name)
    beat = heartbeat_interval(queue.storage)
    wait = poll_s if poll_s is not None else float(beat or 1)
    grace = float(beat or 0) * GRACE_HEARTBEATS
    call = db.call if db is not None else _direct
    stop = stop or threading.Event()
    while not stop.is_set():
        if max_cells is not None and stats.answered + stats.lost >= max_cells:
            break
        # Right after an outage no worker could write a heartbeat: judge none stale until
        # they have had a grace period to catch up.
        if db is None or not db.settling(grace):
            call("look for cells of dead workers", queue.reap)
        claim = call("claim a cell", lambda: queue.claim(name))
        if claim is None:
            progress = call("read the sweep's progress", queue.progress)
            if on_progress is not None:
                on_progress(progress)
            if progress.finished:
                break
            stop.wait(wait)  # others hold cells; one may die and come back to the queue
            continue
        with holding(queue, claim):
            if hold_s > 0:
                stop.wait(hold_s)
            result = _safe_solve(solver, queue, claim.cell)
        finish = functools.partial(queue.finish, claim, result)
        if call(f"write the answer of cell {claim.cell}", finish):
            stats.answered += 1
            stats.cells.append(claim.cell)
        else:
            stats.lost += 1
        if on_progress is not None:
            on_progress(call("read the sweep's progress", queue.progress))
    stats.elapsed_s = time.monotonic() - start
    return stats


__all__ = ["WorkerStats", "run_worker", "worker_name"]
