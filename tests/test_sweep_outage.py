"""Sweep workers ride out a PostgreSQL outage (issue 35).

A throwaway server is started here (never the shared CI server: this test stops it), from
the installed PostgreSQL binaries (``initdb``/``pg_ctl``, as the ``postgres`` user when
running as root).  Without them the test is skipped with the reason, unless
``PARSEARCH_TEST_POSTGRES_REQUIRED=1`` (CI), where it fails.  Every wait is for an event,
with a generous overall timeout (loaded machines).

* Stopped and restarted under two running workers: each says on one line what it waits
  for, resumes, and the sweep finishes with every cell answered exactly once.
* Stopped for longer than ``--db-retry-seconds``: the worker ends with one line and exit 3,
  no traceback.
* The retry rule itself (:class:`parsearch.sweep.outage.Retrier`) on a simulated clock.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from optuna.trial import TrialState

from parsearch.search import storage as storage_mod
from parsearch.sweep.outage import DatabaseOutageError, Retrier, is_outage
from tests.pg_server import LocalServer, controlled_server, fresh_database, unavailable
from tests.pg_server import with_password as add_password
from tests.polling import wait_until

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO / "src")}
SECRET = "Pg-0utage-S3cret"
TIMEOUT_S = 900
GRID = ["--models", "gpt-1.7b,gpt-3.6b", "--clusters", "dgx-h100", "--gpus", "8,16,32",
        "--global-batch", "64", "--seq-len", "2048,4096"]  # 12 cells of about a second
OUTAGE_S = 5.0  # longer than a restart; inside the retry window


@pytest.fixture()
def server() -> Iterator[LocalServer]:
    try:
        import psycopg  # noqa: F401
    except ImportError:
        unavailable('the psycopg driver is not installed (pip install "parsearch[postgres]")')
    root = Path("/tmp") / f"parsearch-pgo-{uuid.uuid4().hex[:8]}"  # socket paths are short
    try:
        with controlled_server(root) as started:
            yield started
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _worker(url: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "parsearch", "sweep", *GRID, "--storage", url, "--worker",
         "--heartbeat", "1", *extra], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)


def _complete(url: str) -> list[optuna.trial.FrozenTrial]:
    storage = storage_mod.make_storage(url, heartbeat_s=None)
    try:
        studies = storage.get_all_studies()
        if not studies:
            return []
        study = optuna.load_study(study_name=studies[0].study_name, storage=storage)
        return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    finally:
        storage.engine.dispose()


def _done_at_least(url: str, count: int) -> bool:
    try:
        return len(_complete(url)) >= count
    except Exception:  # tables not created yet
        return False


def test_workers_wait_out_a_restart_and_finish_with_nothing_lost(server: LocalServer) -> None:
    url, secret = add_password(fresh_database(server.url), SECRET)
    workers = [_worker(url, "--hold", "0.5", "--db-retry-seconds", "120") for _ in range(2)]
    wait_until(lambda: _done_at_least(url, 2), "two cells answered", TIMEOUT_S, 0.2)
    stopped = server.stop("fast")  # every connection dropped, as in a restart or failover
    assert stopped.returncode == 0, stopped.stderr
    time.sleep(OUTAGE_S)
    assert all(w.poll() is None for w in workers), "a worker died during the outage"
    restarted = server.start()
    assert restarted.returncode == 0, restarted.stderr
    outputs = [w.communicate(timeout=TIMEOUT_S) for w in workers]
    waited = 0
    for w, (out, err) in zip(workers, outputs, strict=True):
        print(err)
        assert w.returncode == 0, err
        assert "Traceback" not in err and secret not in out + err
        assert "12 of 12 cells done" in err, err
        waits = [line for line in err.splitlines() if "waiting for the database" in line]
        assert len(waits) <= 1, err  # one line per outage, not one per attempt
        if waits:
            waited += 1
            assert "postgresql://postgres:***@127.0.0.1" in waits[0]
            assert "--db-retry-seconds" in waits[0] and " to " in waits[0]
            assert "the database is back" in err
    assert waited >= 1  # the outage was seen (a worker idle through it need not see it)
    complete = _complete(url)
    assert Counter(t.params["cell"] for t in complete) == dict.fromkeys(range(12), 1)
    assert all(t.user_attrs["result"]["status"] == "ok" for t in complete)


def test_an_outage_beyond_the_retry_window_ends_with_one_line(server: LocalServer) -> None:
    url, secret = add_password(fresh_database(server.url), SECRET)
    worker = _worker(url, "--hold", "0.5", "--db-retry-seconds", "3")
    wait_until(lambda: _done_at_least(url, 1), "a cell answered", TIMEOUT_S, 0.2)
    stopped = server.stop("fast")
    assert stopped.returncode == 0, stopped.stderr
    out, err = worker.communicate(timeout=TIMEOUT_S)
    print(err)
    assert worker.returncode == 3, err
    assert "Traceback" not in err and secret not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 2, err  # what it waited for, then why it gave up
    assert "waiting for the database" in lines[0]
    assert lines[1].startswith("parsearch sweep: error: the database postgresql://")
    assert "beyond --db-retry-seconds 3" in lines[1] and "rerun" in lines[1]


# --- the retry rule, without a server --------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.now += seconds


def _dropped() -> Exception:
    import sqlalchemy.exc

    try:
        try:
            raise ConnectionRefusedError("connection refused (password Pg-0utage-S3cret)")
        except ConnectionRefusedError as inner:
            raise sqlalchemy.exc.OperationalError("SELECT 1", {}, inner) from inner
    except sqlalchemy.exc.OperationalError as outer:
        try:
            raise optuna.exceptions.StorageInternalError("commit failed") from outer
        except optuna.exceptions.StorageInternalError as wrapped:
            return wrapped


@settings(max_examples=80, deadline=None, derandomize=True)
@given(failures=st.integers(0, 40), window=st.integers(0, 120))
def test_retrier_waits_while_the_window_lasts_then_gives_up_in_one_line(failures: int,
                                                                        window: int) -> None:
    clock, lines, attempts = _Clock(), [], [0]
    db = Retrier(f"postgresql://u:{SECRET}@db/x", window, say=lines.append,
                 sleep=clock.sleep, clock=clock)

    def step() -> str:
        attempts[0] += 1
        if attempts[0] <= failures:
            raise _dropped()
        return "done"

    try:
        assert db.call("claim a cell", step) == "done"
    except DatabaseOutageError as error:
        assert clock.now >= window  # gave up only once the window was spent
        assert "beyond --db-retry-seconds" in str(error) and "\n" not in str(error)
        assert SECRET not in str(error) and len(lines) == 1
        assert attempts[0] <= failures
    else:
        assert attempts[0] == failures + 1
        assert len(lines) == (2 if failures else 0)  # waiting, back: never one per attempt
        if failures:
            assert "claim a cell" in lines[0] and "connection refused" in lines[0]
            assert db.settling(1.0) and not db.settling(0.0)
    assert all(SECRET not in line for line in lines)


def test_retrier_passes_other_errors_through_at_once() -> None:
    clock, lines = _Clock(), []
    db = Retrier("postgresql://db/x", 60, say=lines.append, sleep=clock.sleep, clock=clock)

    def step() -> None:
        raise ValueError("a bad value, not an outage")

    with pytest.raises(ValueError, match="bad value"):
        db.call("claim a cell", step)
    assert lines == [] and clock.now == 0.0
    assert is_outage(_dropped()) and not is_outage(ValueError("x"))
