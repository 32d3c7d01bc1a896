"""Read a model file (JSON or YAML) safely: size, encoding and nesting checked first.

Every problem is a :class:`SpecError` with one line of text that names the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from parsearch.errors import SpecError, parse_yaml_text
from parsearch.files import is_file, path_exists


def one_line(text: object) -> str:
    """``text`` with its whitespace runs (newlines included) collapsed to single spaces."""
    return " ".join(str(text).split())


#: Largest model file read (a config.json is a few kB; this keeps a stray large file out).
MAX_FILE_BYTES = 16 * 2**20
#: Deepest nesting of lists/mappings accepted in a model file (real configs nest 3 deep).
MAX_NESTING = 64


def read_text(path: Path) -> str:
    """The UTF-8 text of a model file, refused when missing, too large or not text."""
    if not path_exists(path):
        raise SpecError(f"model file not found: {path}")
    if not is_file(path):
        raise SpecError(f"model file {path} is not a regular file")
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise SpecError(f"model file {path} is {size:,} bytes, over the largest accepted "
                            f"size of {MAX_FILE_BYTES:,} bytes; is it a config.json?")
        data = path.read_bytes()
    except OSError as exc:
        raise SpecError(f"cannot read model file {path}: {one_line(exc.strerror or exc)}") \
            from exc
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SpecError(f"model file {path} is not UTF-8 text (byte {exc.start}: "
                        f"{exc.reason}); save it as UTF-8 JSON or YAML") from None


def nesting(text: str) -> int:
    """Deepest bracket nesting of ``text`` (an upper bound for JSON and flow-style YAML)."""
    depth = deepest = 0
    for char in text:
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth = max(0, depth - 1)
    return deepest


def parse_mapping_file(path: Path) -> dict[str, Any]:
    """Parse ``path`` as JSON (``.json``) or YAML (otherwise); the top level must be a mapping."""
    text = read_text(path)
    if nesting(text) > MAX_NESTING:
        raise SpecError(f"{path}: lists or mappings nested deeper than {MAX_NESTING} levels; "
                        "a model config is a flat mapping")
    data: object
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecError(
                f"{path}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
            ) from exc
        except (ValueError, RecursionError) as exc:  # e.g. an integer of 5,000 digits
            raise SpecError(f"{path}: invalid JSON: {one_line(str(exc))[:200]}") from None
    else:
        data = parse_yaml_text(text, str(path))
    if not isinstance(data, dict):
        raise SpecError(
            f"{path}: expected a mapping of keys to values at the top level, "
            f"got {type(data).__name__}"
        )
    return data


