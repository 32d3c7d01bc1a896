"""Launch files for a shortlist: one folder per layout, ready to profile as is.

Each folder holds

* ``launch.sh`` — environment, per-node process count and both launch lines;
* ``megatron_lm_args.sh`` — a bash array ``MEGATRON_ARGS=(...)`` to source;
* ``bridge_overrides.yaml`` — the Megatron-Bridge fields as nested YAML (the
  form ``process_config_with_overrides(config_filepath=...)`` merges) and the
  same fields as a Hydra override list;
* ``estimate.json`` — what parsearch predicted, to compare with the measurement.

Files are written to a temporary name and renamed, so an interrupted export
never leaves a half-written file; the output folder is checked before any
work starts (:func:`check_export_dir`).
"""

from __future__ import annotations

import errno
import json
import os
import shlex
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from parsearch.errors import SpecError
from parsearch.files import is_dir, path_exists, write_atomically
from parsearch.launch.bridge import bridge_fields, nested
from parsearch.launch.names import bridge_groups, provenance
from parsearch.launch.settings import LaunchSettings
from parsearch.model.specs import short_repr
from parsearch.strict_json import strict_json


def check_export_dir(path: str | Path) -> Path:
    """The export folder, created if missing; a clear error if it cannot be written."""
    folder = Path(path)
    shown = short_repr(str(folder))
    if path_exists(folder) and not is_dir(folder):
        raise SpecError(f"--export {shown} is a file; give a folder for the launch files")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        writable = os.access(folder, os.W_OK | os.X_OK)
    except (OSError, ValueError) as error:  # ENAMETOOLONG, an embedded NUL ...
        raise SpecError(f"--export {shown}: cannot create the folder ({_why(error)}); "
                        "give a shorter or plainer folder name") from None
    if not writable:
        raise SpecError(f"--export {shown}: the folder is not writable")
    return folder


def _why(error: Exception) -> str:
    if isinstance(error, OSError) and error.errno == errno.ENAMETOOLONG:
        return "a name in the path is longer than the file system allows"
    if isinstance(error, OSError):
        return str(error.strerror or error)
    return str(error)


def _write(path: Path, text: str, *, executable: bool = False) -> None:
    write_atomically(path, text.encode("utf-8"), mode=0o777 if executable else 0o666)


def _header(title: str) -> str:
    names = provenance()
    return (f"# parsearch launch files: {title}\n"
            f"# names checked against Megatron-LM {names['megatron_lm']} and "
            f"Megatron-Bridge {names['megatron_bridge']}\n")


def write_layout(folder: Path, title: str, launch: LaunchSettings,
                 estimate: dict[str, Any]) -> list[Path]:
    """Write one layout's launch files into ``folder``; returns the paths written."""
    folder.mkdir(parents=True, exist_ok=True)
    head = _header(title)
    args = "MEGATRON_ARGS=(\n" + "".join(
        f"  {shlex.quote(a)}\n" for a in launch.megatron_lm_args) + ")\n"
    fields = bridge_fields(launch.plan, bridge_groups())
    bridge = {"recipe": launch.recipe, "config": nested(fields),
              "overrides": list(launch.bridge_overrides)}
    files = {
        "launch.sh": "#!/usr/bin/env bash\n" + head + "set -euo pipefail\n"
                     + launch.shell_snippet() + "\n",
        "megatron_lm_args.sh": head + args,
        "bridge_overrides.yaml": head + yaml.safe_dump(bridge, sort_keys=False, width=100),
        "estimate.json": json.dumps(strict_json(estimate), indent=1, allow_nan=False) + "\n",
    }
    written = []
    for name, text in files.items():
        path = folder / name
        _write(path, text, executable=name == "launch.sh")
        written.append(path)
    return written


def export_shortlist(folder: Path, items: Iterable[tuple[str, str, LaunchSettings,
                                                         dict[str, Any]]]) -> list[Path]:
    """Write ``(subfolder, title, launch, estimate)`` items; returns the folders written."""
    out = []
    for name, title, launch, estimate in items:
        try:
            write_layout(folder / name, title, launch, estimate)
        except OSError as error:  # e.g. folder + layout name beyond the path limit
            raise SpecError(f"--export {short_repr(str(folder))}: cannot write "
                            f"{short_repr(name)} ({_why(error)}); give a shorter folder "
                            "name") from None
        out.append(folder / name)
    return out


__all__ = ["check_export_dir", "export_shortlist", "write_layout"]
