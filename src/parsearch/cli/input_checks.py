"""Checks every command's options get at parse time, before any work starts.

:func:`check_parser_inputs` walks a built parser once and wraps the ``type``
of each option by its destination name, so a new command gets the same
rules as the old ones:

* integer sizes have an upper bound, named in the error (:data:`INT_BOUNDS`);
* every float option is finite, and the byte counts have an upper bound;
* ``--seed`` is in the range the samplers accept (0 .. 2**32 - 1);
* output files (``--plot``) can be created where they are asked for;
* ``--storage`` is a storage URL parsearch can open: a known scheme with its
  driver installed, a writable SQLite or journal file (the password never
  appears in a message).

Errors are ``argparse.ArgumentTypeError``, which the one-line parser prints
as ``parsearch CMD: error: argument --opt: ...`` with exit code 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from parsearch.files import is_dir, is_file, path_exists
from parsearch.model.specs import (
    MAX_BYTES_PER_PARAMETER,
    MAX_GLOBAL_BATCH,
    MAX_LAYERS,
    MAX_MICRO_BATCH,
    MAX_SEQ_LEN,
    short_repr,
)
from parsearch.topology.cluster import MAX_GPUS

#: Most trials one optuna study may be asked for (the default is 2,000).
MAX_TRIALS = 100_000
#: Most layouts a listing may be asked to print.
MAX_LISTED = 1_000_000
#: Largest seed numpy's and optuna's samplers accept.
MAX_SEED = 2**32 - 1
#: Largest value of an integer option that has no bound of its own.
MAX_OTHER_INT = 2**31 - 1

#: Upper bound of each integer option, by argparse ``dest``; the error names it.
INT_BOUNDS: dict[str, tuple[int, str]] = {
    "gpus": (MAX_GPUS, "GPUs"),
    "max_gpus": (MAX_GPUS, "GPUs"),
    "min_gpus": (MAX_GPUS, "GPUs"),
    "gpu_step": (MAX_GPUS, "GPUs"),
    "global_batch": (MAX_GLOBAL_BATCH, "sequences per step"),
    "seq_len": (MAX_SEQ_LEN, "tokens"),
    "micro_batch_sizes": (MAX_MICRO_BATCH, "sequences per micro-batch"),
    "max_vpp": (MAX_LAYERS, "model chunks per stage"),
    "recompute_num_layers": (MAX_LAYERS, "layers"),
    "activation_offload_layers": (MAX_LAYERS, "layers"),
    "n_trials": (MAX_TRIALS, "trials"),
    "stop_after": (MAX_TRIALS, "trials"),
    "top": (MAX_LISTED, "layouts"),
    "limit": (MAX_LISTED, "layouts"),
    "seed": (MAX_SEED, "the samplers' seed range"),
}
#: Lower bound of integer options whose type allows any integer.
INT_MINIMA: dict[str, int] = {"seed": 0}
#: Upper bound of float options, by ``dest`` (all float options must be finite).
FLOAT_BOUNDS: dict[str, float] = {
    "weight_bytes": MAX_BYTES_PER_PARAMETER,
    "grad_bytes": MAX_BYTES_PER_PARAMETER,
    "optimizer_bytes": MAX_BYTES_PER_PARAMETER,
    "grad_reduce_bytes": MAX_BYTES_PER_PARAMETER,
    "moe_imbalance": 1024.0,
}
#: Options that name a file parsearch writes.
OUTPUT_FILE_DESTS: frozenset[str] = frozenset({"plot", "output", "out"})
#: Options that name an optuna storage.
STORAGE_DESTS: frozenset[str] = frozenset({"storage"})

_SQLITE_MAGIC = b"SQLite format 3\x00"
_PASSWORD = re.compile(r"(://[^:/@\s]*:)[^@\s]*@")


def finite_float(text: str) -> float:
    """argparse type: a finite number (``nan``, ``inf`` and overflowing values refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{short_repr(text)} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{short_repr(text)} is not a finite number")
    return value


def check_parser_inputs(parser: argparse.ArgumentParser) -> None:
    """Wrap the option types of ``parser`` and every sub-parser with the checks above."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in set(action.choices.values()):
                check_parser_inputs(sub)
            continue
        wrapped = _checked_type(action)
        if wrapped is not None:
            action.type = wrapped


def _checked_type(action: argparse.Action) -> Callable[[str], Any] | None:
    dest, base = action.dest, action.type
    if dest in STORAGE_DESTS:
        return _chain(base, check_storage_url)
    if dest in OUTPUT_FILE_DESTS:
        return _chain(base, check_output_file)
    if dest in INT_BOUNDS and base is not None:
        bound, unit = INT_BOUNDS[dest]
        low = INT_MINIMA.get(dest)
        return _chain(base, lambda value: _within(value, low, bound, unit))
    if dest in FLOAT_BOUNDS:
        bound_f = FLOAT_BOUNDS[dest]
        return _chain(base or float, lambda value: _finite_within(value, bound_f))
    if base is not None:  # any other typed option: finite floats, ints within int32
        return _chain(base, _plain_number)
    if action.nargs == 0:  # flags take no value
        return None
    return _chain(None, _plain_number)  # text: no NUL character (no file name holds one)


def _plain_number(value: Any) -> Any:
    if isinstance(value, float):
        return _finite_within(value, float("inf"))
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_OTHER_INT:
        raise argparse.ArgumentTypeError(
            f"{short_repr(value)} is outside the supported range, +-{MAX_OTHER_INT:,}")
    return value


def _chain(base: Callable[[str], Any] | None,
           check: Callable[[Any], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        if "\x00" in text:
            raise argparse.ArgumentTypeError("contains a NUL character")
        value = base(text) if base is not None else text
        return check(value)

    parse.__name__ = getattr(base, "__name__", "value")  # argparse names it in errors
    return parse


def _within(value: Any, low: int | None, bound: int, unit: str) -> Any:
    values = value if isinstance(value, tuple) else (value,)
    for item in values:
        if isinstance(item, int) and item > bound:
            raise argparse.ArgumentTypeError(
                f"{short_repr(item)} exceeds the largest supported value, {bound:,} ({unit})")
        if isinstance(item, int) and low is not None and item < low:
            raise argparse.ArgumentTypeError(
                f"{short_repr(item)} must be between {low:,} and {bound:,} ({unit})")
    return value


def _finite_within(value: Any, bound: float) -> Any:
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise argparse.ArgumentTypeError(f"{value} is not a finite number")
        if value > bound:
            raise argparse.ArgumentTypeError(
                f"{value:g} exceeds the largest supported value, {bound:g}")
    return value


# --------------------------------------------------------------------------- output files


def check_output_file(text: str) -> str:
    """``text`` if a file can be written there (created and removed to find out), else an error.

    The probe is the write itself: a temporary file named like the final
    one, in the same folder, so that permissions, read-only or virtual file
    systems, over-long names and missing folders all show up now.
    """
    if not text.strip():
        raise argparse.ArgumentTypeError("give a file name")
    try:
        return _probe_output_file(text)
    except OSError as error:  # e.g. a name too long for the file system
        raise argparse.ArgumentTypeError(
            f"cannot write {short_repr(text)}: {error.strerror or error}") from None


def _probe_output_file(text: str) -> str:
    path = Path(text)
    if is_dir(path) or text.endswith(os.sep):
        raise argparse.ArgumentTypeError(f"{short_repr(text)} is a folder; give a file name")
    folder = path.parent
    if not is_dir(folder):
        what = "is not a folder" if path_exists(folder) else "does not exist"
        raise argparse.ArgumentTypeError(f"folder {short_repr(str(folder))} {what}")
    if path_exists(path) and not is_file(path):
        raise argparse.ArgumentTypeError(f"{short_repr(text)} exists and is not a regular file")
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=f".{path.name}.", suffix=".tmp"):
            pass
        if path_exists(path) and not os.access(path, os.W_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as error:
        raise argparse.ArgumentTypeError(
            f"cannot write {short_repr(text)}: {error.strerror or error}") from None
    return text


# --------------------------------------------------------------------------- storage URLs


def redact_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for messages and reports)."""
    return _PASSWORD.sub(r"\1***@", url)


def check_storage_url(url: str) -> str:
    """``url`` if it names an optuna storage parsearch can open, else an error saying why."""
    shown = short_repr(redact_url(url))
    if not url.strip():
        raise argparse.ArgumentTypeError("give a storage URL, e.g. sqlite:///study.db")
    if url.startswith("journal:") or ("://" not in url
                                      and url.endswith((".log", ".journal", ".jsonl"))):
        path = url.removeprefix("journal:").removeprefix("//")
        if not path:
            raise argparse.ArgumentTypeError(
                f"{shown}: give a journal file path, e.g. journal:study.log")
        _check_storage_file(path, shown, "journal file")
        return url
    if "://" not in url:
        raise argparse.ArgumentTypeError(
            f"{shown} is not a storage URL; use e.g. sqlite:///study.db, "
            "postgresql://user@host/db or journal:study.log")
    scheme = url.split("://", 1)[0].lower()
    if scheme == "sqlite":
        _check_sqlite(url, shown)
        return url
    _check_rdb_driver(url, scheme, shown)
    return url


def _check_sqlite(url: str, shown: str) -> None:
    path = url.split("://", 1)[1]
    if path in ("", "/", "/:memory:"):
        return  # an in-memory SQLite database
    if not path.startswith("/"):
        raise argparse.ArgumentTypeError(
            f"{shown}: write sqlite:/// and the file, e.g. sqlite:///study.db")
    path = path[1:].split("?", 1)[0]
    _check_storage_file(path, shown, "SQLite file")
    target = Path(path)
    if is_file(target) and target.stat().st_size:
        with target.open("rb") as handle:
            if handle.read(len(_SQLITE_MAGIC)) != _SQLITE_MAGIC:
                raise argparse.ArgumentTypeError(
                    f"{shown}: {short_repr(path)} exists and is not an SQLite database")


def _check_storage_file(path: str, shown: str, what: str) -> None:
    try:
        check_output_file(path)
    except argparse.ArgumentTypeError as error:
        raise argparse.ArgumentTypeError(f"{shown}: {what}: {error}") from None


#: Python drivers of the RDB schemes, and the extra that installs them.
_DRIVERS: dict[str, tuple[tuple[str, ...], str]] = {
    "postgresql": (("psycopg2", "psycopg"), 'pip install "parsearch[postgres]"'),
    "postgresql+psycopg2": (("psycopg2",), 'pip install "parsearch[postgres]"'),
    "postgresql+psycopg": (("psycopg",), 'pip install "psycopg[binary]"'),
    "mysql": (("MySQLdb", "pymysql"), "pip install pymysql"),
    "mysql+pymysql": (("pymysql",), "pip install pymysql"),
}


def _check_rdb_driver(url: str, scheme: str, shown: str) -> None:
    if scheme not in _DRIVERS:
        raise argparse.ArgumentTypeError(
            f"{shown}: unknown storage kind {short_repr(scheme)}; use sqlite:///FILE, "
            "postgresql://user@host/db or journal:FILE")
    modules, install = _DRIVERS[scheme]
    if not any(importlib.util.find_spec(name) is not None for name in modules):
        raise argparse.ArgumentTypeError(
            f"{shown}: the {scheme} driver ({' or '.join(modules)}) is not installed; "
            f"{install}")
    try:
        from sqlalchemy.engine import make_url

        make_url(url)
    except Exception as error:  # sqlalchemy's ArgumentError, ValueError from urllib
        message = " ".join(redact_url(str(error)).split())[:200]
        raise argparse.ArgumentTypeError(f"{shown}: not a valid URL ({message})") from None
