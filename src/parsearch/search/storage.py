"""Optuna storages that several workers share: open, lock, heartbeat, seeds, redaction.

* :func:`make_storage` opens an in-memory, journal-file or RDB storage
  (``sqlite:///file.db``, ``postgresql://user@host/db``).  Workers started at
  the same moment on an empty database race to create optuna's tables; the
  loser's ``UniqueViolation`` / "already exists" is retried, so every worker
  opens the storage.  RDB storages record a heartbeat per running trial; a
  trial whose heartbeat is older than the grace period belongs to a dead
  worker and is failed and queued again (:func:`reap_stale_trials`).
* :func:`storage_lock` is a mutex shared by every process on the storage:
  a PostgreSQL advisory lock (or MySQL ``GET_LOCK``), an ``flock`` on a file
  next to an SQLite database or journal file.  The lock dies with its
  holder, so a killed worker never leaves it taken.
* Journal files are written under an ``flock`` of the file itself, so a
  killed writer never leaves a stale lock behind (optuna's default symlink
  lock makes the next writer wait 30 s).
* :func:`redact` hides the password of a URL; every message and report uses
  it, and :func:`scrub` removes the password from third-party error text.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib
import os
import random
import re
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import optuna
from optuna.trial import FrozenTrial, TrialState

from parsearch.errors import SpecError

#: Seconds between the heartbeats of a running trial (RDB storages).
DEFAULT_HEARTBEAT_S = 10
#: A running trial without a heartbeat for this many heartbeats is a dead worker's.
GRACE_HEARTBEATS = 6
#: A trial of a dead worker is queued again at most this many times.
MAX_RETRY = 3
_SCHEMA_ATTEMPTS = 8
_RACE_WORDS = ("already exists", "duplicate", "unique", "locked")
#: PostgreSQL drivers SQLAlchemy knows, in order of preference (module, dialect suffix).
_PG_DRIVERS: tuple[tuple[str, str], ...] = (("psycopg", "psycopg"), ("psycopg2", "psycopg2"))
POSTGRES_HINT = 'pip install "parsearch[postgres]"'


# --- redaction --------------------------------------------------------------------------------


def redact(url: str | None) -> str:
    """``url`` with its password replaced by ``***`` (``"memory"`` for ``None``)."""
    if url is None:
        return "memory"
    text = url
    if "://" in text:
        scheme, rest = text.split("://", 1)
        head, sep, tail = rest.partition("/")
        if "@" in head:
            creds, host = head.rsplit("@", 1)
            if ":" in creds:
                creds = creds.split(":", 1)[0] + ":***"
            text = f"{scheme}://{creds}@{host}{sep}{tail}"
        elif "@" in rest:  # a password holding '/' unescaped: hide everything up to the '@'
            creds, host = rest.rsplit("@", 1)
            text = f"{scheme}://{creds.split(':', 1)[0]}:***@{host}"
    return re.sub(r"(?i)(password=)[^&;\s]*", r"\1***", text)


def _secrets(url: str | None) -> list[str]:
    """The password of ``url`` as written and decoded (longest first), for scrubbing."""
    if not url or "://" not in url:
        return []
    found: list[str] = []
    rest = url.split("://", 1)[1]
    if "@" in rest:
        creds = rest.rsplit("@", 1)[0]
        if ":" in creds:
            found.append(creds.split(":", 1)[1])
    found += re.findall(r"(?i)password=([^&;\s]*)", url)
    found += [unquote(s) for s in found]
    return sorted({s for s in found if s}, key=len, reverse=True)


def scrub(text: str, url: str | None) -> str:
    """``text`` with ``url`` redacted and its password removed wherever it appears."""
    if url:
        text = text.replace(url, redact(url))
    for secret in _secrets(url):
        text = text.replace(secret, "***")
    return text


# --- opening -----------------------------------------------------------------------------------


def journal_path(url: str) -> str | None:
    """The journal file of ``url`` (``journal:PATH`` or a ``.log``/``.journal`` path), or None."""
    if url.startswith("journal:"):
        return url.removeprefix("journal:").removeprefix("//")
    if "://" not in url and url.endswith((".log", ".journal", ".jsonl")):
        return url
    return None


class FlockLock:
    """A journal-file lock: ``flock`` on the journal itself, released when its holder dies."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._fd: int | None = None

    def acquire(self) -> bool:
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def make_storage(url: str | None, *, heartbeat_s: int | None = DEFAULT_HEARTBEAT_S) -> Any:
    """An optuna storage for ``url``: ``None`` in memory, a journal file, or an RDB URL.

    RDB storages get a heartbeat every ``heartbeat_s`` seconds per running
    trial (``None``: no heartbeat) and re-queue a dead worker's trials.
    """
    if url is None:
        return optuna.storages.InMemoryStorage()
    shown = redact(url)
    path = journal_path(url)
    if path is not None:
        if not path:
            raise SpecError(f"--storage {shown!r}: give a journal file path, "
                            "e.g. journal:study.log")
        _check_file_target(shown, Path(path))
        try:
            backend = optuna.storages.journal.JournalFileBackend(
                str(Path(path)), lock_obj=FlockLock(str(Path(path))))  # type: ignore[arg-type]
        except OSError as error:
            raise SpecError(f"--storage {shown!r}: cannot open the journal file: "
                            f"{error.strerror or error}") from None
        return optuna.storages.JournalStorage(backend)
    if "://" not in url:
        raise SpecError(f"--storage {shown!r} is not a storage URL; use e.g. "
                        "sqlite:///study.db, postgresql://user@host/db or journal:study.log")
    rdb_url, engine_kwargs = _rdb_url(url)
    kwargs: dict[str, Any] = {"engine_kwargs": engine_kwargs}
    if heartbeat_s is not None:
        kwargs.update(heartbeat_interval=int(heartbeat_s),
                      grace_period=int(heartbeat_s) * GRACE_HEARTBEATS,
                      heartbeat_stale_trial_callback=_retry_callback())
    return _open_rdb(url, rdb_url, kwargs)


def _check_file_target(shown: str, path: Path) -> None:
    if path.is_dir():
        raise SpecError(f"--storage {shown!r}: {str(path)!r} is a folder; give a file name")
    parent = path.parent
    if not parent.is_dir():
        raise SpecError(f"--storage {shown!r}: folder {str(parent)!r} does not exist")


def _rdb_url(url: str) -> tuple[str, dict[str, Any]]:
    """The URL SQLAlchemy opens (PostgreSQL with an installed driver) and engine options."""
    import sqlalchemy

    shown = redact(url)
    try:
        parsed = sqlalchemy.engine.make_url(url)
    except Exception:  # sqlalchemy.exc.ArgumentError, ValueError on a bad port ...
        raise SpecError(f"--storage {shown!r} is not a valid database URL; use e.g. "
                        "sqlite:///study.db or postgresql://user:password@host:5432/db"
                        ) from None
    dialect, _, driver = parsed.drivername.partition("+")
    if dialect == "postgres":  # the scheme libpq and many hosting services print
        dialect = "postgresql"
    if dialect == "postgresql":
        choices = [(m, d) for m, d in _PG_DRIVERS if not driver or d == driver] or \
            [(driver, driver)]
        usable = next((d for m, d in choices if _importable(m)), None)
        if usable is None:
            raise SpecError(f"--storage {shown!r}: PostgreSQL needs a database driver; "
                            f"install it with: {POSTGRES_HINT}")
        parsed = parsed.set(drivername=f"postgresql+{usable}")
        return parsed.render_as_string(hide_password=False), {}
    if dialect == "sqlite":
        database = parsed.database
        if database and database != ":memory:" and not database.startswith("file:"):
            _check_file_target(shown, Path(database))
        # several workers on one file: wait for the write lock instead of failing at once
        return url, {"connect_args": {"timeout": 60}}
    return url, {}


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def _retry_callback() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRY)


def _fast_sqlite(engine: Any) -> None:
    """Write-ahead logging for SQLite files: a commit appends to the log instead of
    rewriting and syncing the database each time (optuna commits several times per
    trial), and readers no longer block the writer.  ``synchronous=NORMAL`` is the
    setting SQLite documents as safe against application crashes in WAL mode
    (https://www.sqlite.org/wal.html, https://www.sqlite.org/pragma.html#pragma_synchronous).
    """
    import sqlalchemy

    database = engine.url.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return

    def on_connect(connection: Any, record: Any) -> None:
        cursor = connection.cursor()
        with contextlib.suppress(Exception):  # e.g. a read-only file: keep its mode
            cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    sqlalchemy.event.listen(engine, "connect", on_connect)
    engine.dispose()  # connections opened before the listener reconnect with it


def _open_rdb(url: str, rdb_url: str, kwargs: dict[str, Any]) -> Any:
    """Open an RDB storage, retrying the races of workers that create the schema together."""
    last = ""
    for attempt in range(_SCHEMA_ATTEMPTS):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                storage = optuna.storages.RDBStorage(rdb_url, **kwargs)
            if storage.engine.dialect.name == "sqlite":
                _fast_sqlite(storage.engine)
            return storage
        except ImportError:
            dialect = rdb_url.split(":", 1)[0]
            hint = POSTGRES_HINT if dialect.startswith("postgres") else \
                f"install the database driver for {dialect.split('+')[0]!r}"
            raise SpecError(f"--storage {redact(url)!r}: the database driver is not "
                            f"installed; {hint}") from None
        except Exception as error:  # sqlalchemy raises many kinds
            first = str(error).splitlines()[0] if str(error) else type(error).__name__
            last = scrub(scrub(first, rdb_url), url)
            if not any(word in first.lower() for word in _RACE_WORDS):
                break
            # another worker is creating the same tables: wait a little and look again
            time.sleep(random.uniform(0.05, 0.2) * (attempt + 1))
    raise SpecError(f"--storage {redact(url)!r}: cannot open the storage: {last}")


# --- a mutex for every process on the storage -----------------------------------------------


def _lock_key(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


@contextlib.contextmanager
def _flock(path: str) -> Iterator[None]:
    lock = FlockLock(path)
    lock.acquire()
    try:
        yield
    finally:
        lock.release()


@contextlib.contextmanager
def storage_lock(storage: Any, url: str | None, name: str) -> Iterator[None]:
    """Hold the mutex ``name`` of the storage at ``url`` (shared by every process on it).

    In memory there is one process, so there is nothing to lock.
    """
    if isinstance(storage, optuna.storages.RDBStorage):
        engine = storage.engine
        dialect = engine.dialect.name
        if dialect == "sqlite":
            database = engine.url.database
            if not database or database == ":memory:" or database.startswith("file:"):
                yield
                return
            with _flock(f"{database}.parsearch-lock"):
                yield
            return
        import sqlalchemy

        if dialect == "postgresql":
            take, drop = "SELECT pg_advisory_lock(:k)", "SELECT pg_advisory_unlock(:k)"
            params: dict[str, Any] = {"k": _lock_key(name)}
        elif dialect in ("mysql", "mariadb"):
            take, drop = "SELECT GET_LOCK(:k, -1)", "SELECT RELEASE_LOCK(:k)"
            params = {"k": hashlib.sha256(name.encode()).hexdigest()[:60]}
        else:
            raise SpecError(f"--storage {redact(url)!r}: several workers need PostgreSQL, "
                            f"MySQL or SQLite; {dialect} has no lock parsearch can use")
        with engine.connect() as connection:
            connection.execute(sqlalchemy.text(take), params)
            connection.commit()
            try:
                yield
            finally:
                connection.execute(sqlalchemy.text(drop), params)
                connection.commit()
        return
    path = journal_path(url) if url else None
    if path:
        with _flock(f"{path}.parsearch-lock"):
            yield
        return
    yield


# --- workers: numbers, seeds, heartbeats, dead workers ------------------------------------------


def claim_worker_number(study: optuna.Study, storage: Any, url: str | None,
                        attr: str = "parsearch_workers") -> int:
    """The next worker number of ``study`` (0 for the first process that joins it)."""
    with storage_lock(storage, url, f"{study.study_name}:workers"):
        number = int(study.user_attrs.get(attr, 0))
        study.set_user_attr(attr, number + 1)
    return number


def worker_seed(seed: int | None, worker: int) -> int | None:
    """Worker ``worker``'s sampler seed: ``seed`` itself for worker 0, a distinct stream else.

    The same ``--seed`` in every worker would make them propose the same
    trials; a hash of (seed, worker) gives each its own reproducible stream.
    """
    if seed is None:
        return None
    if worker == 0:
        return seed
    digest = hashlib.sha256(f"parsearch-seed:{seed}:{worker}".encode()).digest()
    return int.from_bytes(digest[:4], "big")  # numpy seeds are below 2**32


def heartbeat_interval(storage: Any) -> int | None:
    """Seconds between heartbeats, or None when the storage keeps none."""
    getter = getattr(storage, "get_heartbeat_interval", None)
    return getter() if getter is not None else None


class Heartbeat:
    """Record a heartbeat for the block's trials when each is added and every interval after.

    A heartbeat that cannot be written (a busy SQLite file) is skipped: the
    next one follows an interval later, well inside the grace period.
    """

    def __init__(self, storage: Any, trial_ids: Sequence[int] = ()) -> None:
        self._storage = storage
        self._ids: list[int] = []
        self._interval = heartbeat_interval(storage)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        for trial_id in trial_ids:
            self.add(trial_id)

    def add(self, trial_id: int) -> None:
        """Keep ``trial_id`` alive from now on (its first heartbeat is written at once)."""
        self._ids.append(trial_id)
        if self._interval is not None:
            with contextlib.suppress(Exception):
                self._storage.record_heartbeat(trial_id)

    def _run(self) -> None:
        assert self._interval is not None
        while not self._stop.wait(self._interval):
            for trial_id in list(self._ids):
                with contextlib.suppress(Exception):
                    self._storage.record_heartbeat(trial_id)

    def __enter__(self) -> Heartbeat:
        if self._interval is not None:
            self._thread = threading.Thread(target=self._run, name="parsearch-heartbeat",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def reap_stale_trials(study: optuna.Study, storage: Any, url: str | None) -> None:
    """Fail the running trials of dead workers and queue them again (RDB storages).

    Under the storage lock, so two workers never fail and re-queue the same trial.
    """
    if heartbeat_interval(storage) is None:
        return
    with storage_lock(storage, url, f"{study.study_name}:reap"), warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


def ask(study: optuna.Study, distributions: dict[str, Any]) -> optuna.Trial:
    """``study.ask`` without optuna's warning about heartbeats outside ``Study.optimize``."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Heartbeat of storage")
        return study.ask(distributions)


def requeue(study: optuna.Study, trial: FrozenTrial) -> None:
    """Queue ``trial`` again (an interrupted worker gives its unfinished trial back).

    Giving back is not a failure: it does not count against ``MAX_RETRY``.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=None)(study, trial)


def give_back(study: optuna.Study, trials: Sequence[Any]) -> None:
    """Fail the unfinished ``trials`` (optuna Trials) of an interrupted run and queue them again."""
    for trial in trials:
        with contextlib.suppress(Exception):
            study.tell(trial, state=TrialState.FAIL)
            frozen = study._storage.get_trial(trial._trial_id)
            requeue(study, frozen)


__all__ = [
    "DEFAULT_HEARTBEAT_S",
    "POSTGRES_HINT",
    "FlockLock",
    "Heartbeat",
    "ask",
    "claim_worker_number",
    "give_back",
    "journal_path",
    "make_storage",
    "reap_stale_trials",
    "redact",
    "requeue",
    "scrub",
    "storage_lock",
    "worker_seed",
]
