"""Several workers on a real PostgreSQL server: a sweep survives a worker killed mid-cell, and
optuna studies opened by workers started together on an empty database all succeed.

The server comes from ``PARSEARCH_TEST_POSTGRES_URL`` (``.ci/run`` starts one) or is started
here; without one the tests are skipped with the reason (see ``tests/pg_server.py``).
Every wait is for an event, with a generous overall timeout (loaded machines).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from parsearch.search import storage as storage_mod
from tests.pg_server import fresh_database, postgres_server, with_password
from tests.polling import wait_until

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO / "src")}
SECRET = "Pg-T3st-S3cret"
TIMEOUT_S = 900  # overall bound of one wait; the work itself takes about a minute


@pytest.fixture(scope="module")
def pg_admin() -> Iterator[str]:
    # a short path: the server's socket path is limited to about 100 characters
    root = Path("/tmp") / f"parsearch-pg-{uuid.uuid4().hex[:8]}"
    try:
        with postgres_server(root) as url:
            yield url
    finally:
        shutil.rmtree(root, ignore_errors=True)


GRID = ["--models", "gpt-1.7b,gpt-3.6b", "--clusters", "dgx-h100", "--gpus", "8,16,32",
        "--global-batch", "64", "--seq-len", "2048,4096"]  # 12 cells of about a second


def _worker(url: str, hold: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "parsearch", "sweep", *GRID, "--storage", url, "--worker",
         "--heartbeat", "1", "--hold", str(hold)],
        env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _study(url: str) -> optuna.Study:
    storage = storage_mod.make_storage(url, heartbeat_s=None)
    (summary,) = storage.get_all_studies()
    return optuna.load_study(study_name=summary.study_name, storage=storage)


def test_three_workers_share_a_sweep_and_survive_one_killed_mid_cell(pg_admin: str) -> None:
    url, secret = with_password(fresh_database(pg_admin), SECRET)
    started = time.monotonic()
    # all three start at the same moment on an empty database (no tables yet)
    victim = _worker(url, hold=600.0)  # holds its first cell until it is killed
    others = [_worker(url, hold=0.5) for _ in range(2)]

    def victim_cell() -> optuna.trial.FrozenTrial | None:
        try:
            study = _study(url)
        except Exception:  # tables or study not created yet
            return None
        for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if str(trial.user_attrs.get("worker", "")).endswith(f":{victim.pid}"):
                return trial
        return None

    held = wait_until(victim_cell, "the victim worker to hold a cell", TIMEOUT_S, 0.1)
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=60)
    outputs = [p.communicate(timeout=TIMEOUT_S) for p in others]
    elapsed = time.monotonic() - started
    for p, (out, err) in zip(others, outputs, strict=True):
        assert p.returncode == 0, err
        assert "12 of 12 cells done" in err, err
        assert secret not in out + err
    study = _study(url)
    trials = study.get_trials()
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    # no cell lost, none done twice
    assert Counter(t.params["cell"] for t in complete) == dict.fromkeys(range(12), 1)
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    # the killed worker's cell was failed by its stale heartbeat and answered by another
    by_number = {t.number: t for t in trials}
    assert by_number[held.number].state == TrialState.FAIL
    (retry,) = [t for t in complete if t.system_attrs.get("failed_trial") == held.number]
    assert retry.params["cell"] == held.params["cell"]
    assert not str(retry.user_attrs["worker"]).endswith(f":{victim.pid}")
    assert all(t.user_attrs["result"]["status"] == "ok" for t in complete)
    # the report, read by a process that names only the storage, covers the whole grid
    report = subprocess.run([sys.executable, "-m", "parsearch", "sweep", "--storage", url,
                             "--report-only", "--format", "json"], env=ENV,
                            capture_output=True, text=True, timeout=TIMEOUT_S)
    assert report.returncode == 0, report.stderr
    assert secret not in report.stdout + report.stderr
    document = json.loads(report.stdout)
    assert document["done"] == 12 and document["retried"] == 1
    assert "***" in document["storage"]
    print(f"3 workers, 12 cells, one killed mid-cell: retried once, done in {elapsed:.1f} s")


STUDY_WORKER = textwrap.dedent("""
    import json, sys
    from parsearch.search.optuna_search import run_study
    from parsearch.topology.cluster import load_cluster
    from parsearch.model.specs import ModelSpec, TrainingSpec
    toy = ModelSpec("toy-1b", 16, 2048, 8192, 16, 8, 128, 32000)
    setup = TrainingSpec(seq_len=4096, global_batch=64, micro_batch_sizes=(1, 2),
                         recompute_modes=("none", "full"))
    out = run_study(model=toy, training=setup, cluster=load_cluster("dgx-h100"),
                    gpu_counts=(8, 16, 24, 32), n_trials=16, seed=3, storage=sys.argv[1],
                    study_name="shared")
    print(json.dumps({"enqueued": out.enqueued, "run": out.trials_run}))
""")


def test_study_workers_started_together_on_an_empty_database_all_succeed(pg_admin: str) -> None:
    url, secret = with_password(fresh_database(pg_admin), SECRET)
    procs = [subprocess.Popen([sys.executable, "-c", STUDY_WORKER, url], env=ENV,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    outputs = [p.communicate(timeout=TIMEOUT_S) for p in procs]
    for p, (out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err
        assert secret not in out + err
    reports = [json.loads(out) for out, _ in outputs]
    study = optuna.load_study(study_name="shared",
                              storage=storage_mod.make_storage(url, heartbeat_s=None))
    enqueued = [t for t in study.get_trials() if "fixed_params" in t.system_attrs]
    # the starting layouts exist once, enqueued by exactly one worker
    assert sorted(r["enqueued"] for r in reports)[:2] == [0, 0]
    assert len(enqueued) == sum(r["enqueued"] for r in reports) > 0
    assert study.user_attrs["parsearch_workers"] == 3
    assert not [t for t in study.get_trials() if t.state == TrialState.RUNNING]


def test_connection_errors_never_show_the_password(pg_admin: str) -> None:
    base, secret = with_password(fresh_database(pg_admin), SECRET)
    missing = base.rsplit("/", 1)[0] + "/no_such_database"
    result = subprocess.run([sys.executable, "-m", "parsearch", "sweep", *GRID,
                             "--storage", missing], env=ENV, capture_output=True, text=True,
                            timeout=TIMEOUT_S)
    assert result.returncode == 2
    assert secret not in result.stdout + result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert "no_such_database" in result.stderr
