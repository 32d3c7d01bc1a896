"""The optuna search against the exhaustive oracle, and resuming an interrupted study."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import optuna
import pytest

from parsearch.errors import SpecError
from parsearch.layout.rules import check_layout
from parsearch.layout.space import enumerate_layouts
from parsearch.model.specs import RECOMPUTE_MODES, ModelSpec, TrainingSpec
from parsearch.search import pareto_front
from parsearch.search.optuna_search import run_study
from parsearch.search.study_space import candidate_sets
from parsearch.topology.cluster import load_cluster

# A small model and setup that keep the search fast.
TOY = ModelSpec("toy-1b", 16, 2048, 8192, 16, 8, 128, 32000)
SETUP = TrainingSpec(seq_len=4096, global_batch=64, micro_batch_sizes=(1, 2),
                     recompute_modes=("none", "full"))
CLUSTER = "dgx-h100"
COUNTS = (8, 16, 24, 32, 40, 48)
REPO = Path(__file__).resolve().parents[1]


def test_candidate_sets_cover_the_exhaustive_space() -> None:
    sets = candidate_sets(TOY, SETUP, COUNTS)
    assert sets["num_gpus"] == COUNTS
    for n in COUNTS:
        cols = enumerate_layouts(TOY, SETUP, n).columns
        for axis in ("tp", "pp", "cp", "ep", "etp", "vpp", "mbs"):
            assert set(np.unique(cols[axis]).tolist()) <= set(sets[axis]), axis
        assert {RECOMPUTE_MODES[c] for c in np.unique(cols["recompute"])} <= set(
            sets["recompute"])
    assert sets["ep"] == (1,) and sets["etp"] == (1,)  # dense model: R5 prunes them


@pytest.fixture(scope="module")
def exact():  # type: ignore[no-untyped-def]
    return pareto_front(model=TOY, training=SETUP, cluster=CLUSTER, max_gpus=48,
                        method="exhaustive")


def test_optuna_front_is_valid_and_close_to_exact(exact) -> None:  # type: ignore[no-untyped-def]
    result = pareto_front(model=TOY, training=SETUP, cluster=CLUSTER, max_gpus=48,
                          method="optuna", n_trials=300, seed=0)
    best = {p.num_gpus: p.tokens_per_s for p in exact.points}
    for p in result.points:
        assert check_layout(TOY, SETUP, p.layout) == []
        assert p.estimate.fits
        assert p.tokens_per_s <= best[p.num_gpus] * (1 + 1e-9)
    assert result.hypervolume >= 0.95 * exact.hypervolume
    assert result.study is not None and result.study["trials_completed"] == 300
    again = pareto_front(model=TOY, training=SETUP, cluster=CLUSTER, max_gpus=48,
                         method="optuna", n_trials=300, seed=0)
    assert [(p.num_gpus, p.layout) for p in again.points] == \
        [(p.num_gpus, p.layout) for p in result.points]


def test_constraints_cache_and_journal_resume(tmp_path: Path) -> None:
    storage = f"journal:{tmp_path / 'study.log'}"
    cluster = load_cluster(CLUSTER)
    first = run_study(model=TOY, training=SETUP, cluster=cluster, gpu_counts=COUNTS,
                      n_trials=80, seed=1, storage=storage, study_name="s", stop_after=40)
    assert first.trials_completed == 40 and first.enqueued > 0
    second = run_study(model=TOY, training=SETUP, cluster=cluster, gpu_counts=COUNTS,
                       n_trials=80, seed=1, storage=storage, study_name="s")
    assert second.trials_before == 40 and second.trials_run == 40
    assert second.trials_completed == 80
    study = optuna.load_study(study_name="s", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "study.log"))))
    for trial in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)):
        constraints = trial.constraints
        ok = trial.user_attrs["valid"] and trial.user_attrs["fits"]
        assert (max(constraints.values()) <= 0) == ok
        if not ok:
            assert trial.values[0] == 0.0
    # the query is part of the study: another setup cannot resume it
    with pytest.raises(SpecError, match="created for another query"):
        run_study(model=TOY, training=TrainingSpec(seq_len=2048, global_batch=64),
                  cluster=cluster, gpu_counts=COUNTS, n_trials=80, storage=storage,
                  study_name="s")
    with pytest.raises(SpecError, match="not a storage URL"):
        run_study(model=TOY, training=SETUP, cluster=cluster, gpu_counts=COUNTS, n_trials=5,
                  storage="nowhere")


def _cli(db: Path, model_file: Path, n_trials: int) -> list[str]:
    return [sys.executable, "-m", "parsearch", "pareto", "--model", str(model_file),
            "--cluster", CLUSTER, "--max-gpus", "48", "--global-batch", "64",
            "--seq-len", "4096", "--micro-batch-sizes", "1,2", "--recompute", "none,full",
            "--method", "optuna", "--n-trials", str(n_trials), "--seed", "3",
            "--storage", f"sqlite:///{db}", "--study-name", "resume", "--format", "json",
            "--no-progress"]


def _completed(db: Path) -> list[optuna.trial.FrozenTrial]:
    try:
        study = optuna.load_study(study_name="resume", storage=f"sqlite:///{db}")
    except Exception:  # not created yet
        return []
    return study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))


def test_killed_study_resumes_without_losing_or_repeating_trials(tmp_path: Path) -> None:
    model_file = tmp_path / "toy.json"
    model_file.write_text(json.dumps({
        "name": "toy-1b", "num_layers": 16, "hidden_size": 2048, "ffn_hidden_size": 8192,
        "num_attention_heads": 16, "num_query_groups": 8, "head_dim": 128,
        "vocab_size": 32000}))
    db = tmp_path / "study.db"
    budget = 96
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.Popen(_cli(db, model_file, budget), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    # event-based: kill once 32 trials are stored (the deadline only guards a hung run)
    deadline = time.monotonic() + 600
    while len(_completed(db)) < 32 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    before = {t.number: (t.params, t.values) for t in _completed(db)}
    assert 0 < len(before) < budget, "the run must be killed midway"
    done = subprocess.run(_cli(db, model_file, budget), env=env, capture_output=True,
                          text=True, timeout=900)  # a hang guard, not a speed check
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)["study"]
    after = _completed(db)
    assert len(after) == budget == report["trials_completed"]
    assert report["trials_before"] == len(before)
    assert report["trials_run"] == budget - len(before)
    by_number = {t.number: (t.params, t.values) for t in after}
    assert len(by_number) == len(after)
    for number, stored in before.items():  # nothing completed was lost or changed
        assert by_number[number] == stored
    # repeated layouts are cache hits: the resumed run scored only layouts new to the study
    keys_before = {t.user_attrs["cache_key"] for t in after if t.number in before}
    keys_new = {t.user_attrs["cache_key"] for t in after if t.number not in before}
    assert report["evaluations"] == len(keys_new - keys_before)
