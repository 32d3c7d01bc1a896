"""Sweeps and shared storages without a PostgreSQL server: grids, the cell queue on SQLite,
dead workers, seeds, journal locks, redaction and the missing-driver message."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import optuna
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from optuna.trial import TrialState

from parsearch.errors import SpecError
from parsearch.model.specs import ModelSpec, TrainingSpec
from parsearch.search import optuna_search
from parsearch.search import storage as storage_mod
from parsearch.search.optuna_search import run_study
from parsearch.search.study_space import candidate_sets
from parsearch.sweep.cells import CellSolver
from parsearch.sweep.grid import MAX_CELLS, grid_from, load_grid_file
from parsearch.sweep.queue import CELL_PARAM, CellQueue
from parsearch.sweep.worker import run_worker
from parsearch.topology.cluster import load_cluster
from tests.cli_helpers import assert_one_line_error, run_cli
from tests.polling import wait_until

REPO = Path(__file__).resolve().parents[1]
TINY = {"models": ["gpt-1.7b"], "clusters": ["dgx-h100"], "gpus": [8, 16],
        "global_batch": [64], "seq_len": [2048, 4096]}
TOY = ModelSpec("toy-1b", 16, 2048, 8192, 16, 8, 128, 32000)
SETUP = TrainingSpec(seq_len=4096, global_batch=64, micro_batch_sizes=(1, 2),
                     recompute_modes=("none", "full"))
SECRET = "Sup3r-S3cret-pw"


# --- grids -----------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 4096), min_size=1, max_size=4, unique=True),
       st.lists(st.integers(1, 512), min_size=1, max_size=3, unique=True),
       st.lists(st.sampled_from([1024, 2048, 4096, 8192]), min_size=1, max_size=3, unique=True))
def test_grid_cells_are_the_product_of_the_axes(gpus, batches, seqs) -> None:  # type: ignore[no-untyped-def]
    grid = grid_from({**TINY, "clusters": ["dgx-h100", "dgx-a100"], "gpus": gpus,
                      "global_batch": batches, "seq_len": seqs})
    cells = grid.cells()
    assert len(cells) == 2 * len(gpus) * len(batches) * len(seqs)
    assert len({c.key() for c in cells}) == len(cells)
    assert {c.gpus for c in cells} == set(gpus)
    assert grid_from(grid.to_dict()) == grid  # the grid stored in a sweep reads back the same


def test_grid_files_and_command_line_lists(tmp_path: Path) -> None:
    (tmp_path / "g.yaml").write_text("models: [gpt-1.7b]\nclusters: [dgx-h100]\ngpus: [8, 16]\n"
                                     "global_batch: [64]\nseq_len: [2048]\nprecision: fp8\n")
    (tmp_path / "g.toml").write_text('models = ["gpt-1.7b"]\nclusters = ["dgx-h100"]\n'
                                     "gpus = [8, 16]\nglobal_batch = [64]\nseq_len = [2048]\n"
                                     'precision = "fp8"\n')
    (tmp_path / "g.json").write_text(json.dumps({**TINY, "seq_len": [2048], "gpus": [8, 16],
                                                 "precision": "fp8"}))
    grids = [grid_from(load_grid_file(tmp_path / f"g.{s}")) for s in ("yaml", "toml", "json")]
    assert grids[0] == grids[1] == grids[2]
    assert grids[0].precision == "fp8" and len(grids[0].cells()) == 2
    wider = grid_from(load_grid_file(tmp_path / "g.yaml"), {"gpus": (8, 16, 32)})
    assert wider.gpus == (8, 16, 32) and wider.precision == "fp8"


@pytest.mark.parametrize(("document", "fragment"), [
    ({**TINY, "gpu": [8]}, "unknown field 'gpu'"),
    ({**TINY, "gpus": [0]}, "gpus values must be integers from 1"),
    ({**TINY, "gpus": [8, 8]}, "gpus lists 8 twice"),
    ({**TINY, "gpus": [True]}, "gpus values must be integers"),
    ({**TINY, "seq_len": []}, "seq_len must be a non-empty list"),
    ({**TINY, "precision": "fp3"}, "precision 'fp3' must be one of"),
    ({k: v for k, v in TINY.items() if k != "models"}, "give models"),
    ({**TINY, "gpus": list(range(1, 400)), "global_batch": list(range(1, 400))},
     f"more than the {MAX_CELLS:,}"),
])
def test_bad_grids_name_the_field(document, fragment) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SpecError, match=fragment.replace("(", r"\(")):
        grid_from(document)


def test_bad_grid_files_are_one_line_errors(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("models: [a\n")
    (tmp_path / "bin.yaml").write_bytes(b"\xff\xfe models")
    (tmp_path / "list.json").write_text("[1, 2]")
    for name, fragment in (("bad.yaml", "cannot parse it"), ("bin.yaml", "not UTF-8"),
                           ("list.json", "expected a mapping"), ("none.yaml", "no such file")):
        assert_one_line_error(run_cli("sweep", "--grid", str(tmp_path / name),
                                      "--storage", f"sqlite:///{tmp_path / 's.db'}"), fragment)


# --- the sweep command on SQLite (the zero-setup default) ----------------------------------------


def _grid_args(**axes: str) -> list[str]:
    values = {"models": "gpt-1.7b", "clusters": "dgx-h100", "gpus": "8,16",
              "global-batch": "64", "seq-len": "2048,4096", **axes}
    return [x for k, v in values.items() for x in (f"--{k}", v)]


def test_sweep_answers_every_cell_and_resumes_without_repeating(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'sweep.db'}"
    first = run_cli("sweep", *_grid_args(), "--storage", db, "--format", "json",
                    "--plot", str(tmp_path / "grid.png"), "--no-progress")
    assert first.code == 0, first.err
    report = json.loads(first.out)
    assert report["cells"] == report["done"] == 4 and report["failed"] == 0
    assert [r["status"] for r in report["rows"]] == ["ok"] * 4
    by_cell = {(r["gpus"], r["seq_len"]): r for r in report["rows"]}
    # the answer of a cell is the search command's best layout on those GPUs
    search = run_cli("search", "--model", "gpt-1.7b", "--cluster", "dgx-h100", "--gpus", "16",
                     "--global-batch", "64", "--seq-len", "4096", "--top", "1",
                     "--format", "json", "--no-progress")
    best = json.loads(search.out)["results"][0]
    assert by_cell[(16, 4096)]["layout"] == best["key"]
    assert by_cell[(16, 4096)]["tokens_per_s"] == pytest.approx(best["tokens_per_s"])
    assert (tmp_path / "grid.png").read_bytes()[:4] == b"\x89PNG"
    # rerun: nothing left to answer; the report comes from the storage
    again = run_cli("sweep", *_grid_args(), "--storage", db, "--format", "csv")
    assert again.code == 0 and "this process answered 0" in again.err
    assert again.out.count("\n") == 5 and again.out.startswith("model,cluster,gpus")
    # another worker joins by storage URL alone: the grid is stored with the sweep
    joined = run_cli("sweep", "--storage", db, "--report-only", "--format", "json")
    assert json.loads(joined.out)["rows"] == report["rows"]
    other = run_cli("sweep", *_grid_args(gpus="8"), "--storage", db, "--name",
                    json.loads(joined.out)["sweep"])
    assert_one_line_error(other, "holds another grid")


def test_cells_that_cannot_run_are_answered_with_the_reason(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'sweep.db'}"
    result = run_cli("sweep", *_grid_args(models="llama3-70b", gpus="8", **{"seq-len": "8192"}),
                     "--recompute", "none", "--micro-batch-sizes", "8",
                     "--storage", db, "--format", "json")
    rows = json.loads(result.out)["rows"]
    assert result.code == 0 and rows[0]["status"] in ("no-fit", "invalid")
    assert rows[0]["reason"] and rows[0]["tokens_per_s"] is None


def test_a_sweep_needs_a_database(tmp_path: Path) -> None:
    assert_one_line_error(run_cli("sweep", *_grid_args(), "--storage",
                                  f"journal:{tmp_path / 'j.log'}"), "a sweep needs a database")
    assert_one_line_error(run_cli("sweep", "--storage", f"sqlite:///{tmp_path / 'e.db'}",
                                  "--report-only"), "no sweep in")


def _sweep_proc(db: str, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.Popen([sys.executable, "-m", "parsearch", "sweep", *_grid_args(
        gpus="8,16,24,32"), "--storage", db, "--worker", "--heartbeat", "1", *extra],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_workers_started_together_on_an_empty_sqlite_file_share_the_cells(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'sweep.db'}"
    procs = [_sweep_proc(db) for _ in range(3)]
    outputs = [p.communicate(timeout=900) for p in procs]
    for p, (_, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err
        assert "8 of 8 cells done" in err
    study = optuna.load_study(study_name=_only_study(db), storage=db)
    trials = study.get_trials()
    assert len(trials) == 8  # every cell enqueued once, however many workers created it
    assert Counter(t.state for t in trials) == {TrialState.COMPLETE: 8}
    assert sorted(t.params[CELL_PARAM] for t in trials) == list(range(8))
    assert study.user_attrs["parsearch_workers"] == 3


def _only_study(db: str) -> str:
    (name,) = optuna.get_all_study_names(storage=db)
    return name


# --- the queue: a dead worker's cell comes back, a late answer is refused -----------------------


def test_a_dead_workers_cell_is_queued_again_and_written_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    grid = grid_from(TINY)
    queue = CellQueue.open(url, grid=grid, heartbeat_s=1)
    dead = queue.claim("dead-worker")
    assert dead is not None
    # the dead worker beat once and then never again
    queue.storage.record_heartbeat(dead.trial_id)

    def requeued() -> bool:
        queue.reap()
        return any(t.system_attrs.get("failed_trial") == dead.number for t in queue.trials())

    wait_until(requeued, "the dead worker's cell to be queued again")
    stats = run_worker(queue, CellSolver(grid), name="live", poll_s=0.2)
    assert stats.answered == len(grid.cells()) and stats.lost == 0
    # the presumed-dead worker wakes up with an answer: refused, the cell stays written once
    assert queue.finish(dead, {"status": "ok", "tokens_per_s": 1.0}) is False
    done = [t for t in queue.trials() if t.state == TrialState.COMPLETE]
    assert Counter(t.params[CELL_PARAM] for t in done) == dict.fromkeys(range(4), 1)
    assert queue.storage.get_trial(dead.trial_id).state == TrialState.FAIL
    assert queue.progress().finished and queue.retried() == 1


# --- optuna studies shared by several workers ------------------------------------------------


def test_each_worker_on_a_study_gets_its_own_seed_and_enqueues_nothing_twice(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seeds: list[int | None] = []
    real = optuna_search._sampler

    def spy(name: str, seed: int | None, population_size: int):  # type: ignore[no-untyped-def]
        seeds.append(seed)
        return real(name, seed, population_size)

    monkeypatch.setattr(optuna_search, "_sampler", spy)
    url = f"sqlite:///{tmp_path / 'study.db'}"
    common = {"model": TOY, "training": SETUP, "cluster": load_cluster("dgx-h100"),
              "gpu_counts": (8, 16, 24, 32), "seed": 7, "storage": url, "study_name": "s"}
    first = run_study(n_trials=24, **common)
    second = run_study(n_trials=48, **common)
    assert first.enqueued > 0 and second.enqueued == 0
    assert seeds[0] == 7 and seeds[-1] == storage_mod.worker_seed(7, 1) != 7
    study = optuna.load_study(study_name="s", storage=url)
    assert study.user_attrs["parsearch_workers"] == 2
    fixed = [t for t in study.get_trials() if "fixed_params" in t.system_attrs]
    assert len(fixed) == first.enqueued


@given(st.integers(0, 2**32 - 1), st.integers(1, 10_000))
def test_worker_seeds_are_valid_and_distinct(seed: int, worker: int) -> None:
    derived = storage_mod.worker_seed(seed, worker)
    assert derived is not None and 0 <= derived < 2**32
    assert derived != storage_mod.worker_seed(seed, worker + 1)
    assert storage_mod.worker_seed(seed, 0) == seed and storage_mod.worker_seed(None, 3) is None


def test_trials_of_a_dead_study_worker_are_retried(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    common = {"model": TOY, "training": SETUP, "cluster": load_cluster("dgx-h100"),
              "gpu_counts": (8, 16), "seed": 1, "storage": url, "study_name": "s",
              "heartbeat_s": 1}
    run_study(n_trials=8, **common)
    study = optuna.load_study(study_name="s", storage=storage_mod.make_storage(url,
                                                                                heartbeat_s=1))
    storage = storage_mod.make_storage(url, heartbeat_s=1)
    # a worker asked three trials, beat once and died
    dists = {a: optuna.distributions.CategoricalDistribution(v)
             for a, v in candidate_sets(TOY, SETUP, (8, 16)).items()}
    dead = [storage_mod.ask(study, dists) for _ in range(3)]
    for trial in dead:
        storage.record_heartbeat(trial._trial_id)

    def stale() -> bool:
        return len(storage._get_stale_trial_ids(study._study_id)) == 3

    wait_until(stale, "the dead worker's heartbeats to go stale")
    run_study(n_trials=16, **common)
    by_number = {t.number: t for t in study.get_trials()}
    assert all(by_number[t.number].state == TrialState.FAIL for t in dead)
    retried = [t for t in by_number.values() if t.system_attrs.get("failed_trial") is not None]
    assert sorted(t.system_attrs["failed_trial"] for t in retried) == [t.number for t in dead]
    assert all(t.state == TrialState.COMPLETE for t in retried)
    assert not [t for t in by_number.values() if t.state == TrialState.RUNNING]


# --- journal files: no stale lock ----------------------------------------------------------------


def test_a_killed_journal_writer_leaves_no_lock_behind(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "study.log"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\n"
         "from parsearch.search.storage import FlockLock\n"
         f"FlockLock({str(log)!r}).acquire(); print('locked', flush=True); time.sleep(600)"],
        env={**os.environ, "PYTHONPATH": str(REPO / "src")}, stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    holder.kill()
    holder.wait(timeout=60)
    # an old-style symlink lock left by a killed optuna writer is not waited on either
    (tmp_path / "study.log.lock").symlink_to(log)

    def no_waiting(seconds: float) -> None:
        raise AssertionError("waited on a journal lock")

    monkeypatch.setattr("optuna.storages.journal._file.time.sleep", no_waiting)
    outcome = run_study(model=TOY, training=SETUP, cluster=load_cluster("dgx-h100"),
                        gpu_counts=(8, 16), n_trials=8, seed=0, storage=f"journal:{log}",
                        study_name="j")
    assert outcome.trials_completed == 8


# --- passwords and drivers -------------------------------------------------------------------


@given(st.text(st.characters(min_codepoint=33, max_codepoint=126, exclude_characters="/@:?#&;%"),
               max_size=30).map(lambda s: "Zq9!" + s))
def test_redaction_hides_any_password(password: str) -> None:
    for url in (f"postgresql://alice:{password}@db.example:5432/sweeps",
                f"postgresql+psycopg://alice:{password}@db/x?sslmode=require",
                f"mysql://bob:{password}@h/db", f"postgresql://h/db?password={password}"):
        shown = storage_mod.redact(url)
        assert password not in shown and "***" in shown
        assert password not in storage_mod.scrub(f"failed for {url}: {password}", url)


def test_postgres_without_a_driver_is_one_line_naming_the_extra(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for module in ("psycopg", "psycopg2"):
        monkeypatch.setitem(sys.modules, module, None)  # importing it now fails
    url = f"postgresql://alice:{SECRET}@127.0.0.1:1/sweeps"
    with pytest.raises(SpecError) as caught:
        storage_mod.make_storage(url)
    message = str(caught.value)
    assert 'pip install "parsearch[postgres]"' in message and SECRET not in message
    result = run_cli("sweep", *_grid_args(), "--storage", url)
    assert result.code == 2 and SECRET not in result.err + result.out
    assert len(result.err.strip().splitlines()) == 1 and "Traceback" not in result.err


def test_storage_errors_never_show_the_password(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/missing-folder/x.db?password={SECRET}"
    result = run_cli("sweep", *_grid_args(), "--storage", url)
    assert result.code == 2 and SECRET not in result.err + result.out


def test_a_misspelt_model_fails_before_the_sweep_is_stored(tmp_path: Path) -> None:
    db = tmp_path / "sweep.db"
    result = run_cli("sweep", *_grid_args(models="gpt-1.7b,no-such-model"),
                     "--storage", f"sqlite:///{db}")
    assert_one_line_error(result, "no-such-model")
    assert not db.exists() or not optuna.get_all_study_names(storage=f"sqlite:///{db}")


def test_a_stopped_worker_gives_its_cell_back_at_once(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'sweep.db'}"
    worker = _sweep_proc(db, "--hold", "600")  # holds its first cell until stopped

    def held() -> list[optuna.trial.FrozenTrial]:
        try:
            study = optuna.load_study(study_name=_only_study(db), storage=db)
        except (KeyError, ValueError, RuntimeError):
            return []
        return study.get_trials(states=(TrialState.RUNNING,))

    (trial,) = wait_until(held, "the worker to hold a cell")
    worker.send_signal(signal.SIGTERM)
    _, err = worker.communicate(timeout=300)
    assert worker.returncode == 130 and "went back to the queue" in err
    study = optuna.load_study(study_name=_only_study(db), storage=db)
    states = {t.number: t.state for t in study.get_trials()}
    assert states[trial.number] == TrialState.FAIL
    (back,) = [t for t in study.get_trials() if t.system_attrs.get("failed_trial") == trial.number]
    assert back.state == TrialState.WAITING and back.params == trial.params
    finish = run_cli("sweep", "--storage", db, "--format", "json")
    assert finish.code == 0 and json.loads(finish.out)["done"] == 8
