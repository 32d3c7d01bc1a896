"""Riding out a database outage: a sweep worker waits for its database instead of dying.

A PostgreSQL restart or failover drops every connection; the next statement
fails with a connection error (SQLAlchemy ``OperationalError`` /
``InterfaceError``, wrapped by optuna in ``StorageInternalError``).  Every
step of the worker's loop (reap, claim, finish, progress, the report) is
retried through :class:`Retrier`: with backoff (0.5 s doubling to 10 s), one
line on stderr when the wait starts (what it waits for and for how long) and
one when the database is back, until the retry window (``--db-retry-seconds``)
is spent; then :class:`DatabaseOutageError`, which the command turns into one line
and exit status 3.  Nothing is lost either way: a step is either done or
redone (claims and answers are written so that a half-done step is found and
completed by the next claim, see :mod:`parsearch.sweep.queue`).

Errors that are not about reaching the database (a constraint, a bad value)
are not retried.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from parsearch.errors import ParsearchError
from parsearch.search.storage import redact, scrub

T = TypeVar("T")

#: Default of ``--db-retry-seconds``: long enough for a restart or a managed failover.
DEFAULT_RETRY_S = 300
#: Longest retry window accepted (a week).
MAX_RETRY_S = 7 * 24 * 3600
#: First wait between attempts, doubled after each failure up to :data:`MAX_BACKOFF_S`.
FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 10.0
#: Exception class names (psycopg, psycopg2, sqlite3, SQLAlchemy) that mean "cannot reach
#: the database" rather than "the database refused this statement".
_CONNECTION_ERRORS = frozenset({"OperationalError", "InterfaceError", "DisconnectionError",
                                "ConnectionTimeout", "ConnectionFailure"})


class DatabaseOutageError(ParsearchError):
    """The database stayed unreachable for longer than the retry window."""


def _chain(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def is_outage(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it) says the database cannot be reached."""
    for item in _chain(error):
        if isinstance(item, ConnectionError | TimeoutError):
            return True
        if any(cls.__name__ in _CONNECTION_ERRORS for cls in type(item).__mro__):
            return True  # e.g. psycopg's AdminShutdown is an OperationalError
        if getattr(item, "connection_invalidated", False):  # sqlalchemy DBAPIError
            return True
    return False


def _reason(error: BaseException, url: str) -> str:
    """The innermost error's first line, password removed, shortened."""
    innermost = list(_chain(error))[-1]
    text = str(innermost).strip().splitlines()
    line = " ".join(text[0].split()) if text else type(innermost).__name__
    line = scrub(line, url)
    return line if len(line) <= 160 else line[:157] + "..."


class Retrier:
    """Run database steps, waiting out an outage for up to ``window_s`` seconds.

    ``say`` prints a line (stderr by default); ``sleep`` and ``clock`` are
    injectable for tests.  ``last_outage_end`` is the clock time the last
    outage ended (None: none yet), so the worker can hold back from judging
    other workers' heartbeats, which could not be written meanwhile either.
    """

    def __init__(self, url: str, window_s: float, *, command: str = "sweep",
                 say: Callable[[str], None] | None = None,
                 sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.url = url
        self.window_s = float(window_s)
        self.command = command
        self._say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        self._sleep = sleep
        self._clock = clock
        self.last_outage_end: float | None = None
        self.outages = 0

    def call(self, what: str, step: Callable[[], T]) -> T:
        """``step()``; on a connection error, wait and retry until the window is spent."""
        started: float | None = None
        backoff = FIRST_BACKOFF_S
        while True:
            try:
                result = step()
            except Exception as error:
                if not is_outage(error):
                    raise
                now = self._clock()
                reason = _reason(error, self.url)
                if started is None:
                    started = now
                    self.outages += 1
                    self._say(f"parsearch {self.command}: waiting for the database "
                              f"{redact(self.url)} to {what} ({reason}); retrying for up to "
                              f"{self.window_s:g} s (--db-retry-seconds)")
                waited = now - started
                if waited >= self.window_s:
                    raise DatabaseOutageError(
                        f"the database {redact(self.url)} stayed unreachable for {waited:.0f} s, "
                        f"beyond --db-retry-seconds {self.window_s:g} ({reason}); nothing "
                        "done is lost: rerun the same command to resume") from None
                self._sleep(max(0.0, min(backoff, self.window_s - waited)))
                backoff = min(2.0 * backoff, MAX_BACKOFF_S)
                continue
            if started is not None:
                self.last_outage_end = self._clock()
                self._say(f"parsearch {self.command}: the database is back after "
                          f"{self.last_outage_end - started:.0f} s; resuming")
            return result

    def settling(self, grace_s: float) -> bool:
        """Whether an outage ended less than ``grace_s`` ago (heartbeats still catching up)."""
        return self.last_outage_end is not None and \
            self._clock() - self.last_outage_end < grace_s


__all__ = ["DEFAULT_RETRY_S", "MAX_RETRY_S", "DatabaseOutageError", "Retrier", "is_outage"]
