"""Fuzz campaign: thousands of malformed inputs through the CLI, each in its own process.

Every case is one ``parsearch ...`` command line built from a random base
command and one malformed input of one kind (model file, cluster file,
efficiency file, layout string, numeric option, storage URL, plot path,
validation CSV, or junk arguments).  Each runs in a child process under a
wall-clock timeout and an address-space limit (``resource.setrlimit``), and
is classified:

* ``traceback``: a Python traceback on stderr (an exception escaped);
* ``hang``: still running after ``--timeout`` seconds (killed);
* ``memory``: ``MemoryError`` or killed by a signal we did not send;
* ``nan``: ``NaN``/``Infinity`` (or ``nan``/``inf``) printed as a value;
* ``bad_exit``: an exit code other than 0, 2 (and 1 for ``check``);
* ``multiline_error``: exit 2 without exactly one ``error:`` line on stderr (one-line
  notes may come before it; only indented detail lines, such as the reason of each input
  ``calibrate`` left out, may follow it);
* ``zero``: exit 0 with a throughput of 0 in the JSON answer, not marked as a cell that
  could not be answered (a silent wrong answer: "nothing fits" must be said).

Besides the malformed values of :mod:`fuzz_inputs`, the kinds of :mod:`fuzz_extremes`
probe the edges an independent campaign found (issue 35): path lengths, size extremes
(65,536 GPUs, K = 30 of 1,000 candidates, 10,000 measurement rows), empty groups and
NaN fields.

The target (issues 12 and 35) is 0 of each over at least 3,000 cases::

    nice -n 10 python benchmarks/fuzz_campaign.py --cases 3000 --jobs 2

By default children are forked from this process after parsearch and its
dependencies are imported (``--mode fork``: fast, the same ``main`` as the
console script); ``--mode spawn`` runs ``python -m parsearch`` instead.
The summary (counts, the classification of every failing case and its
command line) goes to ``--summary`` as JSON and to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fuzz_extremes import KINDS as EXTREME_KINDS
from fuzz_inputs import KINDS as VALUE_KINDS
from fuzz_inputs import Case

KINDS = {**VALUE_KINDS, **EXTREME_KINDS}


def make_cases(count: int, seed: int, only: str | None = None) -> list[Case]:
    """``count`` cases drawn from every kind by weight (or from ``only``)."""
    import random

    rng = random.Random(seed)
    names = [only] if only else list(KINDS)
    weights = [KINDS[n][1] for n in names]
    return [KINDS[rng.choices(names, weights)[0]][0](rng) for _ in range(count)]

# --------------------------------------------------------------------------- running

_NONFINITE = re.compile(r"(?<![\w.])-?(NaN|nan|Infinity|inf)(?![\w])")


@dataclass
class Outcome:
    kind: str
    argv: list[str]
    code: int | None
    seconds: float
    out: str
    err: str
    timed_out: bool = False
    signal: int | None = None
    inputs: str = ""
    index: int = -1

    def problems(self) -> list[str]:
        found = []
        if self.timed_out:
            return ["hang"]
        if "MemoryError" in self.err or self.signal is not None:
            found.append("memory")
        elif "Traceback (most recent call last)" in self.err:
            found.append("traceback")
        # check: 1 = a finding; calibrate: 3 = a fitted factor ended on its bound
        allowed = {0, 2} | {"check": {1}, "calibrate": {3}}.get(
            self.argv[0] if self.argv else "", set())
        if self.code not in allowed and not found:
            found.append("bad_exit")
        if _prints_nonfinite(self.out, self.inputs) or (
                self.code == 0 and _prints_nonfinite(self.err, self.inputs)):
            found.append("nan")
        if self.code == 2 and not found and not _one_error_line(self.err):
            found.append("multiline_error")
        if self.code == 0 and _silent_zero(self.out):
            found.append("zero")
        return found


def _one_error_line(err: str) -> bool:
    """One ``error:`` line; notes may precede it, only indented detail may follow it."""
    lines = err.strip().splitlines()
    errors = [i for i, line in enumerate(lines) if ": error:" in line]
    return len(errors) == 1 and all(line.startswith((" ", "\t"))
                                    for line in lines[errors[0] + 1:])


_NOT_ANSWERED = {"infeasible", "invalid", "error", "nothing_fits", "no_fit", "failed"}


def _silent_zero(out: str) -> bool:
    """A JSON answer holding a throughput (``tokens_per_s...``) of 0 in an object not marked
    as unanswered (``status``/``feasible``)."""
    stripped = out.strip()
    if not stripped or stripped[0] not in "{[":
        return False
    try:
        documents = [json.loads(stripped)]
    except ValueError:
        try:
            documents = [json.loads(line) for line in stripped.splitlines() if line.strip()]
        except ValueError:
            return False
    stack: list[Any] = documents
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            marked = str(item.get("status", "")).lower() in _NOT_ANSWERED or \
                item.get("feasible") is False or item.get("fits") is False
            for key, value in item.items():
                if isinstance(value, dict | list):
                    if "reference" not in key:  # e.g. a hypervolume's reference point
                        stack.append(value)
                elif key.startswith("tokens_per_s") and isinstance(value, int | float) \
                        and not isinstance(value, bool) and value == 0 and not marked:
                    return True
    return False


def _reject_constant(name: str) -> Any:
    raise ValueError(f"bare {name} in JSON output")


def _prints_nonfinite(text: str, inputs: str) -> bool:
    """NaN/Infinity printed as a value: bare in JSON, or as a word in text output.

    JSON documents (and JSON lines) are parsed strictly; in text output a
    word such as ``nan`` counts unless the case's own input holds that word
    (a CSV cell or a name echoed back is not a computed value).
    """
    stripped = text.strip()
    if stripped and stripped[0] in "{[":
        try:
            for line in [stripped] if stripped[0] == "[" or "\n{" not in stripped \
                    else stripped.splitlines():
                json.loads(line, parse_constant=_reject_constant)
            return False
        except ValueError as error:
            if "bare" in str(error):
                return True
    for match in _NONFINITE.finditer(text):
        word = match.group(1)
        if not re.search(rf"(?<![\w.]){word}(?!\w)", inputs):
            return True
    return False


def _write_case(case: Case, folder: Path) -> list[str]:
    folder.mkdir(parents=True)
    for name in case.dirs:
        (folder / name).mkdir(exist_ok=True)
    for name, data in case.files.items():
        (folder / name).write_bytes(data)
    return [arg.replace("{tmp}", str(folder)) for arg in case.argv]


def _limit_memory(gib: float) -> None:
    limit = int(gib * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _child(argv: list[str], folder: Path, memory_gib: float) -> None:
    """In the forked child: run ``main(argv)`` like the console script, then exit."""
    code = 1
    try:
        os.chdir(folder)
        os.setsid()
        _limit_memory(memory_gib)
        out = os.open(folder / "stdout", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        err = os.open(folder / "stderr", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(out, 1)
        os.dup2(err, 2)
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
        from parsearch.cli import main

        try:
            code = int(main(argv) or 0)
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
            if stop.code is not None and not isinstance(stop.code, int):
                print(stop.code, file=sys.stderr)
    except BaseException:  # what the interpreter prints for an uncaught exception
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:  # the child must exit whatever happens
            pass
        os._exit(code)


def _read(path: Path) -> str:
    try:
        return path.read_bytes()[:200_000].decode("utf-8", "replace")
    except OSError:
        return ""


def run_cases(cases: list[Case], *, jobs: int, timeout: float, memory_gib: float,
              mode: str, workdir: Path, progress: bool,
              keep: Path | None = None) -> list[Outcome]:
    pending = list(enumerate(cases))
    running: dict[int, tuple[int, Case, list[str], Path, float, subprocess.Popen | None]] = {}
    outcomes: list[Outcome | None] = [None] * len(cases)
    done = 0
    while pending or running:
        while pending and len(running) < jobs:
            index, case = pending.pop(0)
            folder = workdir / f"case{index:05d}"
            argv = _write_case(case, folder)
            start = time.monotonic()
            if mode == "fork":
                pid = os.fork()
                if pid == 0:
                    _child(argv, folder, memory_gib)
                running[pid] = (index, case, argv, folder, start, None)
            else:
                with open(folder / "stdout", "wb") as out, open(folder / "stderr", "wb") as err:
                    proc = subprocess.Popen(
                        [sys.executable, "-m", "parsearch", *argv], cwd=folder, stdout=out,
                        stderr=err, start_new_session=True,
                        preexec_fn=lambda: _limit_memory(memory_gib))
                running[proc.pid] = (index, case, argv, folder, start, proc)
        time.sleep(0.01)
        for pid, (index, case, argv, folder, start, _proc) in list(running.items()):
            elapsed = time.monotonic() - start
            try:
                finished, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                finished, status = pid, 0
            timed_out = False
            if not finished:
                if elapsed <= timeout:
                    continue
                os.killpg(pid, signal.SIGKILL)
                _, status = os.waitpid(pid, 0)
                timed_out = True
            code = os.waitstatus_to_exitcode(status)
            killed = -code if code < 0 and not timed_out else None
            inputs = " ".join(argv) + " " + " ".join(
                data.decode("utf-8", "replace") for data in case.files.values())
            outcomes[index] = Outcome(case.kind, argv, None if code < 0 else code, elapsed,
                                      _read(folder / "stdout"), _read(folder / "stderr"),
                                      timed_out, killed, inputs, index)
            del running[pid]
            if keep is not None and outcomes[index].problems():  # type: ignore[union-attr]
                shutil.copytree(folder, keep / folder.name, dirs_exist_ok=True)
            shutil.rmtree(folder, ignore_errors=True)
            done += 1
            if progress and done % 100 == 0:
                print(f"  {done}/{len(cases)} cases", file=sys.stderr, flush=True)
    return [o for o in outcomes if o is not None]


def summarize(outcomes: list[Outcome], seconds: float) -> dict[str, Any]:
    counts: Counter[str] = Counter()
    by_kind: dict[str, Counter[str]] = {}
    failures = []
    for o in outcomes:
        kinds = by_kind.setdefault(o.kind, Counter())
        kinds["cases"] += 1
        for problem in o.problems():
            counts[problem] += 1
            kinds[problem] += 1
        if o.problems():
            failures.append({"problems": o.problems(), "kind": o.kind, "case": o.index,
                             "argv": o.argv,
                             "code": o.code, "seconds": round(o.seconds, 1),
                             "stderr_tail": o.err.strip().splitlines()[-3:],
                             "stdout_head": o.out[:300]})
    exits = Counter(str(o.code) for o in outcomes)
    return {
        "cases": len(outcomes),
        "seconds": round(seconds, 1),
        "tracebacks": counts["traceback"],
        "hangs": counts["hang"],
        "memory_kills": counts["memory"],
        "nan_or_inf_outputs": counts["nan"],
        "bad_exit_codes": counts["bad_exit"],
        "multiline_errors": counts["multiline_error"],
        "silent_zero_results": counts["zero"],
        "exit_codes": dict(sorted(exits.items())),
        "by_kind": {k: dict(v) for k, v in sorted(by_kind.items())},
        "slowest_s": round(max((o.seconds for o in outcomes), default=0.0), 1),
        "failures": failures,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds before a hang (default 120: the bound the docs state for "
                        "the largest plausible inputs, e.g. plan-profiling K = 30 of 1,000)")
    parser.add_argument("--memory-gib", type=float, default=4.0, help="address-space limit")
    parser.add_argument("--mode", choices=("fork", "spawn"), default="fork")
    parser.add_argument("--kind", choices=sorted(KINDS), default=None, help="one input kind")
    parser.add_argument("--summary", default="fuzz_campaign_summary.json")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--keep-failures", default=None, metavar="DIR",
                        help="copy each failing case's folder (its files, stdout, stderr) here")
    args = parser.parse_args(argv)
    if args.mode == "fork":  # import once, so every forked case starts warm
        import optuna  # noqa: F401

        import parsearch.cli

        parsearch.cli.command_modules()
        import parsearch.search.api
        import parsearch.validation.published.runs
    cases = make_cases(args.cases, args.seed, args.kind)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="parsearch-fuzz-") as tmp:
        outcomes = run_cases(cases, jobs=args.jobs, timeout=args.timeout,
                             memory_gib=args.memory_gib, mode=args.mode, workdir=Path(tmp),
                             progress=not args.quiet,
                             keep=Path(args.keep_failures) if args.keep_failures else None)
    summary = summarize(outcomes, time.monotonic() - start)
    Path(args.summary).write_text(json.dumps(summary, indent=2) + "\n")
    print(f"{summary['cases']} cases in {summary['seconds']} s: "
          f"{summary['tracebacks']} tracebacks, {summary['hangs']} hangs, "
          f"{summary['memory_kills']} memory kills, {summary['nan_or_inf_outputs']} with "
          f"NaN/Inf, {summary['bad_exit_codes']} bad exit codes, "
          f"{summary['multiline_errors']} multi-line errors, "
          f"{summary['silent_zero_results']} silent zero results; exit codes "
          f"{summary['exit_codes']}; slowest {summary['slowest_s']} s")
    for failure in summary["failures"][:40]:
        print(f"  {','.join(failure['problems'])} [{failure['kind']}] "
              f"{' '.join(map(repr, failure['argv']))[:300]}\n"
              f"     -> {' | '.join(failure['stderr_tail'])[:300]}")
    print(f"summary written to {args.summary}")
    bad = sum(summary[k] for k in ("tracebacks", "hangs", "memory_kills", "nan_or_inf_outputs",
                                   "bad_exit_codes", "multiline_errors", "silent_zero_results"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
