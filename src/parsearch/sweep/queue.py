"""The cells of a sweep as a work queue in an optuna RDB storage, shared by any number of workers.

A sweep is one optuna study.  Each cell is one trial with a single
parameter, ``cell`` (its index in the grid); the grid itself is a study
attribute, so a worker on another machine needs only the storage URL and
the sweep name.

* Claim: a worker takes a waiting trial (a cell given back or retried), or
  else creates the trial of the next cell (a counter in the study), records
  a heartbeat for it, then moves it to ``RUNNING``; it keeps recording a
  heartbeat every few seconds while it works on the cell.  Cells are not
  enqueued up front, so claiming stays cheap however large the grid: the
  storage reads back only the unfinished trials.  A worker killed between
  two of these steps leaves a cell that the next claim finds (a counter
  ahead of its trials, or a waiting trial).
* Finish: the answer is written to the trial (``result``) and the trial
  completed; a trial that is no longer running (its worker was presumed
  dead) refuses the write, so every cell is written exactly once.
* Dead workers: a running trial whose heartbeat is older than the grace
  period is failed and a copy queued again (at most ``MAX_RETRY`` times).
* Claim, finish and the dead-worker check run under the storage lock
  (:func:`parsearch.search.storage.storage_lock`): on SQLite, which has no
  row locks, two workers can never both move the same trial.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from parsearch.errors import SpecError
from parsearch.search import storage as storage_mod
from parsearch.sweep.grid import Cell, SweepGrid, grid_from
from parsearch.sweep.outage import is_outage

SWEEP_PREFIX = "parsearch-sweep-"
CELL_PARAM = "cell"
_GRID_ATTR = "parsearch_sweep_grid"
_NEXT_ATTR = "parsearch_sweep_next"
DEFAULT_STORAGE = "sqlite:///parsearch-sweep.db"


@dataclass(frozen=True)
class Claim:
    """A cell a worker holds: its trial and its index in the grid."""

    trial_id: int
    number: int
    cell: int


@dataclass(frozen=True)
class Progress:
    """Where the sweep stands: cells done, in flight, waiting, and given up on."""

    cells: int
    done: int
    running: int
    waiting: int
    failed: tuple[int, ...]

    @property
    def finished(self) -> bool:
        """Nothing left to run or to wait for (every cell done, or given up on)."""
        return self.running == 0 and self.waiting == 0


def _sweep_storage(url: str | None, heartbeat_s: int) -> Any:
    if url is None or storage_mod.journal_path(url) is not None or "://" not in url:
        shown = storage_mod.redact(url)
        raise SpecError(f"--storage {shown!r}: a sweep needs a database, e.g. "
                        f"{DEFAULT_STORAGE} (one machine) or postgresql://user@host/db "
                        "(several machines)")
    return storage_mod.make_storage(url, heartbeat_s=heartbeat_s)


class CellQueue:
    """The cells of one sweep in a shared storage (see the module notes)."""

    def __init__(self, url: str, storage: Any, study: optuna.Study, grid: SweepGrid) -> None:
        self.url = url
        self.storage = storage
        self.study = study
        self.grid = grid
        self.cells: tuple[Cell, ...] = grid.cells()

    @property
    def name(self) -> str:
        return self.study.study_name

    @property
    def _study_id(self) -> int:
        return int(self.storage.get_study_id_from_name(self.name))

    # --- opening -----------------------------------------------------------------------------

    @classmethod
    def open(cls, url: str, *, grid: SweepGrid | None, name: str | None = None,
             heartbeat_s: int = storage_mod.DEFAULT_HEARTBEAT_S) -> CellQueue:
        """Create the sweep of ``grid`` (or join it), or join sweep ``name`` without a grid."""
        storage = _sweep_storage(url, heartbeat_s)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        if grid is None:
            name = name or _only_sweep(storage, url)
            try:
                study = optuna.load_study(study_name=name, storage=storage)
            except KeyError:
                raise SpecError(f"no sweep {name!r} in {storage_mod.redact(url)}; give the grid "
                                "(--grid or the axis lists) to create it") from None
            stored = study.user_attrs.get(_GRID_ATTR)
            if stored is None:
                raise SpecError(f"study {name!r} in {storage_mod.redact(url)} is not a sweep")
            queue = cls(url, storage, study, grid_from(stored, where=f"sweep {name!r}"))
        else:
            name = name or SWEEP_PREFIX + grid.fingerprint()
            study = optuna.create_study(storage=storage, study_name=name,
                                        direction="maximize", load_if_exists=True)
            queue = cls(url, storage, study, grid)
        queue._record_grid()
        return queue

    def _lock(self) -> contextlib.AbstractContextManager[None]:
        return storage_mod.storage_lock(self.storage, self.url, f"{self.name}:queue")

    def _record_grid(self) -> None:
        """Store the grid with the sweep (once); refuse a sweep that holds another grid."""
        wanted = self.grid.to_dict()
        with self._lock():
            stored = self.study.user_attrs.get(_GRID_ATTR)
            if stored is None:
                self.study.set_user_attr(_GRID_ATTR, wanted)
            elif stored != wanted:
                raise SpecError(f"sweep {self.name!r} in {storage_mod.redact(self.url)} holds "
                                "another grid; give another --name or the original grid")

    # --- the work ----------------------------------------------------------------------------

    def worker_number(self) -> int:
        return storage_mod.claim_worker_number(self.study, self.storage, self.url)

    def reap(self) -> None:
        """Fail the cells of dead workers (stale heartbeat) and queue them again."""
        with self._lock(), warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(self.study)

    def claim(self, worker: str) -> Claim | None:
        """Take a cell: a waiting trial, else a cell without a trial (None when none is left)."""
        with self._lock():
            trials = self.trials()
            for trial in trials:
                if trial.state == TrialState.WAITING:
                    claim = self._take(trial._trial_id, trial.number,
                                       int(trial.params[CELL_PARAM]), worker)
                    if claim is not None:
                        return claim
            cell = self._next_cell(trials)
            if cell is None:
                return None
            trial_id = self.storage.create_new_trial(self._study_id, optuna.trial.create_trial(
                state=TrialState.WAITING, params={CELL_PARAM: cell},
                distributions={CELL_PARAM: optuna.distributions.IntDistribution(
                    0, len(self.cells) - 1)},
                user_attrs={"cell_key": self.cells[cell].key()}))
            number = self.storage.get_trial(trial_id).number
            return self._take(trial_id, number, cell, worker)

    def _next_cell(self, trials: list[optuna.trial.FrozenTrial]) -> int | None:
        """A cell below the counter left without a trial (its worker died), else the next one."""
        counter = int(self.study.user_attrs.get(_NEXT_ATTR, 0))
        seen = {int(t.params[CELL_PARAM]) for t in trials if CELL_PARAM in t.params}
        orphan = next((i for i in range(counter) if i not in seen), None)
        if orphan is not None:
            return orphan
        if counter >= len(self.cells):
            return None
        self.study.set_user_attr(_NEXT_ATTR, counter + 1)
        return counter

    def _take(self, trial_id: int, number: int, cell: int, worker: str) -> Claim | None:
        """Heartbeat first, then RUNNING: a running cell always has a heartbeat to go stale."""
        self.storage.record_heartbeat(trial_id)
        try:
            if not self.storage.set_trial_state_values(trial_id, TrialState.RUNNING):
                return None
        except optuna.exceptions.UpdateFinishedTrialError:
            return None
        self.storage.set_trial_user_attr(trial_id, "worker", worker)
        return Claim(trial_id, number, cell)

    def finish(self, claim: Claim, result: dict[str, Any]) -> bool:
        """Write the answer of a held cell; False when the cell was taken away meanwhile."""
        value = float(result.get("tokens_per_s") or 0.0)
        with self._lock():
            try:
                self.storage.set_trial_user_attr(claim.trial_id, "result", result)
                return bool(self.storage.set_trial_state_values(
                    claim.trial_id, TrialState.COMPLETE, values=[value]))
            except optuna.exceptions.UpdateFinishedTrialError:
                return False

    def release(self, claim: Claim) -> None:
        """Give a held cell back (an interrupted worker): fail it and queue it again."""
        with self._lock(), contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
            if self.storage.set_trial_state_values(claim.trial_id, TrialState.FAIL):
                storage_mod.requeue(self.study, self.storage.get_trial(claim.trial_id))

    # --- reading -------------------------------------------------------------------------------

    def trials(self) -> list[optuna.trial.FrozenTrial]:
        return self.study.get_trials(deepcopy=False)

    def progress(self) -> Progress:
        done: set[int] = set()
        live: set[int] = set()
        seen: set[int] = set()
        running = waiting = 0
        for trial in self.trials():
            if CELL_PARAM not in trial.params:
                continue
            cell = int(trial.params[CELL_PARAM])
            seen.add(cell)
            if trial.state == TrialState.COMPLETE:
                done.add(cell)
            elif trial.state == TrialState.RUNNING:
                running += 1
                live.add(cell)
            elif trial.state == TrialState.WAITING:
                waiting += 1
                live.add(cell)
        unstarted = len(self.cells) - len(seen)  # no trial yet: waiting for a first claim
        failed = tuple(sorted(seen - done - live))  # given up on after the last retry
        return Progress(len(self.cells), len(done), running, waiting + unstarted, failed)

    def results(self) -> dict[int, dict[str, Any]]:
        """The answer of every finished cell, by cell index."""
        out: dict[int, dict[str, Any]] = {}
        for trial in self.trials():
            if trial.state == TrialState.COMPLETE and CELL_PARAM in trial.params:
                out[int(trial.params[CELL_PARAM])] = dict(trial.user_attrs.get("result", {}))
        return out

    def retried(self) -> int:
        """How many cells were queued again after their worker died or stopped."""
        return sum(1 for t in self.trials() if "failed_trial" in t.system_attrs)


def _only_sweep(storage: Any, url: str) -> str:
    names = [s.study_name for s in storage.get_all_studies()
             if s.user_attrs.get(_GRID_ATTR) is not None]
    if len(names) == 1:
        return names[0]
    shown = storage_mod.redact(url)
    if not names:
        raise SpecError(f"no sweep in {shown}; give the grid (--grid or the axis lists) to "
                        "create one")
    raise SpecError(f"{shown} holds {len(names)} sweeps ({', '.join(names[:5])}); "
                    "choose one with --name")


@contextlib.contextmanager
def holding(queue: CellQueue, claim: Claim) -> Iterator[None]:
    """Keep a claimed cell's heartbeat while the block runs; give it back if the block fails."""
    try:
        with storage_mod.Heartbeat(queue.storage, [claim.trial_id]):
            yield
    except BaseException:
        try:
            queue.release(claim)
        except Exception as error:  # the database is away: its heartbeat goes stale instead
            if not is_outage(error):
                raise
        raise


__all__ = ["CELL_PARAM", "DEFAULT_STORAGE", "CellQueue", "Claim", "Progress", "holding"]
