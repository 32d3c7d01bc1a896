"""A real PostgreSQL server on 127.0.0.1 for the multi-worker tests.

``PARSEARCH_TEST_POSTGRES_URL`` names one (``.ci/run`` starts it); otherwise
a throwaway server is started here from the installed PostgreSQL binaries
(``initdb``/``pg_ctl``, as the ``postgres`` user when running as root).  When
neither works the tests are skipped with the reason, unless
``PARSEARCH_TEST_POSTGRES_REQUIRED=1`` (CI), where they fail instead.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ENV_URL = "PARSEARCH_TEST_POSTGRES_URL"
ENV_REQUIRED = "PARSEARCH_TEST_POSTGRES_REQUIRED"
#: A throwaway server need not survive a power cut: no fsync per commit.
FAST = "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"


def unavailable(reason: str) -> None:
    """Skip (or, in CI, fail) the PostgreSQL tests with ``reason``."""
    message = f"PostgreSQL tests need a server: {reason}"
    if os.environ.get(ENV_REQUIRED) == "1":
        pytest.fail(message)
    pytest.skip(message + f" (set {ENV_URL}=postgresql://user@127.0.0.1:PORT/DB, or install "
                "PostgreSQL; .ci/run does both)")


def _pg_bin() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return str(Path(found[-1]).parent)
    initdb = shutil.which("initdb")
    return str(Path(initdb).parent) if initdb and shutil.which("pg_ctl") else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalServer:
    """A throwaway server under ``root``: its admin URL, and stop/start for outage tests."""

    def __init__(self, root: Path) -> None:
        pg_bin = _pg_bin()
        if pg_bin is None:
            unavailable("no initdb/pg_ctl found")
        assert pg_bin is not None
        self.pg_bin = pg_bin
        self.prefix: list[str] = []
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root
            if shutil.which("runuser") is None or subprocess.run(
                    ["id", "postgres"], capture_output=True).returncode != 0:
                unavailable("running as root without a postgres user to start the server")
            self.prefix = ["runuser", "-u", "postgres", "--"]
        self.root = root
        self.data = root / "data"
        self.port = _free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def create(self) -> None:
        root = self.root
        root.mkdir(parents=True, exist_ok=True)
        if self.prefix:
            shutil.chown(root, user="postgres")
            root.chmod(0o700)
            for parent in root.parents:  # the postgres user must reach the folder
                if parent.stat().st_mode & 0o001 == 0:
                    unavailable(f"{parent} is not reachable by the postgres user")
        init = subprocess.run([*self.prefix, f"{self.pg_bin}/initdb", "-D", str(self.data),
                               "-A", "trust", "-U", "postgres"], capture_output=True, text=True)
        if init.returncode != 0:
            unavailable(f"initdb failed: {init.stderr.strip()[:300]}")
        started = self.start()
        if started.returncode != 0:
            unavailable(f"pg_ctl start failed: {started.stderr.strip()[:300]}")

    def start(self) -> subprocess.CompletedProcess[str]:
        """Start the server (again) on the same port; waits until it accepts connections."""
        return subprocess.run([*self.prefix, f"{self.pg_bin}/pg_ctl", "-D", str(self.data),
                               "-l", str(self.root / "server.log"), "-w", "-o",
                               f"-h 127.0.0.1 -p {self.port} -k {self.root} {FAST}", "start"],
                              capture_output=True, text=True)

    def stop(self, mode: str = "fast") -> subprocess.CompletedProcess[str]:
        """Stop the server (``fast``: every connection dropped, as a restart or failover)."""
        return subprocess.run([*self.prefix, f"{self.pg_bin}/pg_ctl", "-D", str(self.data),
                               "-m", mode, "-w", "stop"], capture_output=True, text=True)


@contextmanager
def local_server(root: Path) -> Iterator[str]:
    """Start a throwaway server under ``root``; yields its admin URL; stops it afterwards."""
    with controlled_server(root) as server:
        yield server.url


@contextmanager
def controlled_server(root: Path) -> Iterator[LocalServer]:
    """A throwaway server the test may stop and start (never the shared CI server)."""
    server = LocalServer(root)
    server.create()
    try:
        yield server
    finally:
        server.stop("immediate")


@contextmanager
def postgres_server(root: Path) -> Iterator[str]:
    """The admin URL of a server: ``PARSEARCH_TEST_POSTGRES_URL``, or one started here."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        unavailable('the psycopg driver is not installed (pip install "parsearch[postgres]")')
    url = os.environ.get(ENV_URL)
    if url:
        yield url
        return
    with local_server(root) as started:
        yield started


def fresh_database(admin_url: str) -> str:
    """Create an empty database on the server of ``admin_url``; its URL."""
    import psycopg
    from sqlalchemy.engine import make_url

    name = f"parsearch_{uuid.uuid4().hex[:12]}"
    parsed = make_url(admin_url)
    conninfo = parsed.set(drivername="postgresql").render_as_string(hide_password=False)
    try:
        with psycopg.connect(conninfo, autocommit=True, connect_timeout=30) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
    except psycopg.Error as error:
        unavailable(f"cannot create a database: {str(error).splitlines()[0]}")
    return parsed.set(database=name).render_as_string(hide_password=False)


def with_password(url: str, password: str) -> tuple[str, str]:
    """``url`` with a password, and that password (the secret no output may show).

    A URL that has one keeps it; else ``password`` is added (the test server
    trusts 127.0.0.1, so any password is accepted).
    """
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.password:
        return url, str(parsed.password)
    return parsed.set(username=parsed.username or "postgres",
                      password=password).render_as_string(hide_password=False), password
