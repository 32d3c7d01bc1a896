"""Writing output files so that an interrupted run never leaves a half-written one."""

from __future__ import annotations

import os
import tempfile
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


__all__ = ["write_atomically"]
