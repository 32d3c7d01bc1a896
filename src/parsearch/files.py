"""File-system helpers: writing output files so that an interrupted run never leaves a
half-written one, and existence tests that treat a name the file system refuses (too long,
a NUL byte) as "no such file" instead of raising from deep inside."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def write_atomically(target: Path, data: bytes, *, mode: int = 0o666) -> None:
    """Write ``data`` to a temporary file beside ``target``, then rename it over ``target``.

    The file gets ``mode`` less the umask, as a plain ``open()`` would give it
    (``mkstemp`` creates files 0600).
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp",
                               dir=str(target.parent if str(target.parent) else Path(".")))
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, mode & ~umask)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _holds(test: Callable[[Path], bool], path: str | Path) -> bool:
    """``test(Path(path))``, False for a name the file system cannot hold."""
    try:
        return test(Path(path))
    except (OSError, ValueError):  # ENAMETOOLONG, embedded NUL
        return False


def path_exists(path: str | Path) -> bool:
    """``Path(path).exists()``, False for a name the file system cannot hold.

    >>> path_exists("1" * 5000), path_exists(".")
    (False, True)
    """
    return _holds(Path.exists, path)


def is_file(path: str | Path) -> bool:
    """``Path(path).is_file()``, False for a name the file system cannot hold."""
    return _holds(Path.is_file, path)


def is_dir(path: str | Path) -> bool:
    """``Path(path).is_dir()``, False for a name the file system cannot hold."""
    return _holds(Path.is_dir, path)


__all__ = ["is_dir", "is_file", "path_exists", "write_atomically"]
