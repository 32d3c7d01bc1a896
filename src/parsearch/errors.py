"""Error types and the violation record shared by all modules.

Three outcomes are kept apart (see the design notes):

* malformed input raises :class:`SpecError` (or :class:`TopologyError`) when
  it is loaded; the CLI turns it into one line on stderr and exit code 2;
* an invalid layout is described by :class:`Violation` values that the
  enumerator prunes and ``parsearch check`` prints;
* an infeasible layout (does not fit in memory) is a cost-model output.
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml


class ParsearchError(Exception):
    """Base class of every error parsearch raises on purpose."""


class SpecError(ParsearchError, ValueError):
    """A model, training or layout description is malformed."""


class TopologyError(ParsearchError, ValueError):
    """A cluster description or topology graph is malformed."""


class NoValidLayoutError(ParsearchError):
    """A query admits no valid layout at all."""


def yaml_problem(error: Exception) -> tuple[str, str]:
    """``(" at line L, column C" or "", problem on one line)`` of a PyYAML error.

    >>> import yaml
    >>> try:
    ...     yaml.safe_load("a: [1, 2")
    ... except yaml.YAMLError as exc:
    ...     yaml_problem(exc)[0]
    ' at line 1, column 9'
    """
    mark = getattr(error, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    problem = getattr(error, "problem", None) or str(error)
    return where, " ".join(str(problem).split())


def parse_yaml_text(text: str, where: str,
                    error: type[ParsearchError] = SpecError) -> object:
    """``yaml.safe_load(text)``; a parse failure becomes one ``error`` line naming ``where``,
    the line and column and the problem (model files and cluster files alike).

    >>> parse_yaml_text("a: 1", "x.yaml")
    {'a': 1}
    >>> try:
    ...     parse_yaml_text("a: [1, 2", "x.yaml")
    ... except SpecError as exc:
    ...     str(exc)[:31]
    'x.yaml: invalid YAML at line 1,'
    """
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        line, problem = yaml_problem(exc)
        raise error(f"{where}: invalid YAML{line}: {problem[:200]}") from None
    except (ValueError, RecursionError) as exc:  # e.g. an integer of 5,000 digits
        raise error(f"{where}: invalid YAML: {' '.join(str(exc).split())[:200]}") from None


@dataclass(frozen=True)
class Violation:
    """One broken layout rule, with the values that break it.

    ``rule`` is the rule's identifier in ``shared/spec/layout-space.md``
    (``"R4"`` ...), ``name`` a short slug and ``message`` a sentence that
    names the values and, where possible, the fix.
    """

    rule: str
    name: str
    message: str

    def __str__(self) -> str:
        return f"{self.rule} {self.name}: {self.message}"
