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


@contextmanager
def local_server(root: Path) -> Iterator[str]:
    """Start a throwaway server under ``root``; yields its admin URL; stops it afterwards."""
    pg_bin = _pg_bin()
    if pg_bin is None:
        unavailable("no initdb/pg_ctl found")
    assert pg_bin is not None
    prefix: list[str] = []
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        if shutil.which("runuser") is None or subprocess.run(
                ["id", "postgres"], capture_output=True).returncode != 0:
            unavailable("running as root without a postgres user to start the server")
        prefix = ["runuser", "-u", "postgres", "--"]
    root.mkdir(parents=True, exist_ok=True)
    if prefix:
        shutil.chown(root, user="postgres")
        root.chmod(0o700)
        for parent in root.parents:  # the postgres user must reach the folder
            if parent.stat().st_mode & 0o001 == 0:
                unavailable(f"{parent} is not reachable by the postgres user")
    data, port = root / "data", _free_port()
    init = subprocess.run([*prefix, f"{pg_bin}/initdb", "-D", str(data), "-A", "trust",
                           "-U", "postgres"], capture_output=True, text=True)
    if init.returncode != 0:
        unavailable(f"initdb failed: {init.stderr.strip()[:300]}")
    start = subprocess.run([*prefix, f"{pg_bin}/pg_ctl", "-D", str(data), "-l",
                            str(root / "server.log"), "-w", "-o",
                            f"-h 127.0.0.1 -p {port} -k {root} {FAST}", "start"],
                           capture_output=True, text=True)
    if start.returncode != 0:
        unavailable(f"pg_ctl start failed: {start.stderr.strip()[:300]}")
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*prefix, f"{pg_bin}/pg_ctl", "-D", str(data), "-m", "immediate",
                        "stop"], capture_output=True)


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
