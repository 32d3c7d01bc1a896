"""Equivalence check for code-structure refactors: every command's output before and after.

A fixed set of CLI questions (search, pareto over a small GPU range and over two clusters,
explain, check, placement, serve, plan-profiling, validate, show-model, layouts, a small
sweep, calibrate on a bundled log) runs as ``python -m parsearch ...`` in fresh
processes.  ``--save FILE`` writes each question's exit code, stdout and stderr to a JSON
file; ``--compare FILE`` runs them again and reports every question whose output differs
(with the first differing line).  Exit 1 when any differs.  Run the save with the old
code first, e.g. from a worktree of the previous commit::

    git worktree add /tmp/before <sha>
    PYTHONPATH=/tmp/before/src python benchmarks/check_command_equivalence.py \\
        --save /tmp/commands.json
    PYTHONPATH=src python benchmarks/check_command_equivalence.py --compare /tmp/commands.json

The interpreter's ``PYTHONPATH`` decides which code runs (``parsearch`` is imported in each
child process).  Outputs that name a temporary path (the sweep's storage, calibrate's
output file) have it replaced by ``<TMP>``, and the elapsed times the CLI prints on
stderr (``(0.2 s)``) and in JSON (``"elapsed_s"``) are replaced by ``<T>``; nothing else
is normalised.
``--only NAME`` runs the named questions; ``--list`` names them.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOG = ROOT / "tests" / "fixtures" / "megatron_logs"

#: A time the CLI prints on stderr, e.g. ``(0.2 s)`` or ``evaluated (0.2 s)``.
_TIMING = re.compile(r"\(([^()]*?)\d+(?:\.\d+)? s\)")
#: The elapsed time a JSON output reports (``"elapsed_s": 0.25``).
_ELAPSED = re.compile(r'"elapsed_s": [0-9.e+-]+')

#: ``(name, arguments)``; ``{tmp}`` is a fresh temporary folder of the run.
QUESTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("search-dense-json", ("search", "--model", "llama3-8b", "--cluster", "dgx-h100",
                           "--gpus", "64", "--global-batch", "512", "--seq-len", "8192",
                           "--top", "5", "--format", "json")),
    ("search-moe-table", ("search", "--model", "mixtral-8x7b", "--cluster", "dgx-h100",
                          "--gpus", "64", "--global-batch", "256", "--seq-len", "4096",
                          "--top", "5")),
    ("search-launch-json", ("search", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100",
                            "--gpus", "32", "--global-batch", "256", "--seq-len", "4096",
                            "--top", "2", "--launch", "--format", "json")),
    ("pareto-small-json", ("pareto", "--model", "llama3-8b", "--cluster", "dgx-h100",
                           "--min-gpus", "8", "--max-gpus", "64", "--global-batch", "512",
                           "--seq-len", "4096", "--format", "json")),
    ("pareto-two-clusters", ("pareto", "--model", "llama3-8b", "--cluster",
                             "dgx-h100,dgx-a100", "--min-gpus", "8", "--max-gpus", "32",
                             "--global-batch", "256", "--seq-len", "4096")),
    ("explain-json", ("explain", "--model", "llama3-70b", "--cluster", "dgx-h100",
                      "--gpus", "64", "--global-batch", "512", "--seq-len", "8192",
                      "--layout", "tp=8,pp=4,mbs=1,sp=true", "--format", "json")),
    ("explain-moe-table", ("explain", "--model", "mixtral-8x7b", "--cluster", "dgx-h100",
                           "--gpus", "64", "--global-batch", "256", "--seq-len", "4096",
                           "--layout", "tp=2,pp=2,ep=8,mbs=1,sp=true")),
    ("check-json", ("check", "--model", "llama3-70b", "--gpus", "64", "--global-batch",
                    "512", "--seq-len", "8192", "--layout", "tp=8,pp=3,mbs=1",
                    "--format", "json")),
    ("placement-json", ("placement", "--model", "mixtral-8x7b", "--cluster", "dgx-h100",
                        "--gpus", "64", "--layout", "tp=2,pp=2,ep=8,mbs=1,sp=true",
                        "--format", "json")),
    ("placement-order", ("placement", "--model", "llama3-70b", "--cluster", "dgx-h100",
                         "--gpus", "64", "--layout", "tp=4,pp=4,cp=2,mbs=1",
                         "--rank-order", "tp-cp-dp-ep-pp")),
    ("serve-json", ("serve", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8",
                    "--isl", "2048", "--osl", "256", "--top", "3", "--format", "json")),
    ("serve-moe-table", ("serve", "--model", "mixtral-8x7b", "--cluster", "dgx-h100",
                         "--gpus", "16", "--mix", "1024:128,4096:512:0.5", "--tpot-ms",
                         "50", "--top", "3")),
    ("plan-profiling", ("plan-profiling", "--model", "llama3-8b", "--cluster", "dgx-h100",
                        "--gpus", "32", "--global-batch", "256", "--seq-len", "4096",
                        "--k", "3")),
    ("validate-json", ("validate", "--format", "json")),
    ("show-model-json", ("show-model", "deepseek-v3", "--format", "json")),
    ("show-model-table", ("show-model", "qwen3-30b-a3b")),
    ("layouts-count-csv", ("layouts", "--model", "mixtral-8x7b", "--gpus", "64",
                           "--global-batch", "256", "--seq-len", "4096", "--format", "csv",
                           "--limit", "20")),
    ("models-json", ("models", "--format", "json")),
    ("cluster-show", ("cluster", "show", "gb200-nvl72", "--gpus", "144")),
    ("sweep-json", ("sweep", "--models", "llama3-8b,mixtral-8x7b", "--clusters", "dgx-h100",
                    "--gpus", "16,32", "--global-batch", "256", "--seq-len", "4096",
                    "--top", "2", "--storage", "sqlite:///{tmp}/sweep.db", "--no-progress",
                    "--format", "json")),
)


def _calibrate_question() -> tuple[str, tuple[str, ...]] | None:
    """``calibrate`` on a bundled Megatron-LM log, when the test fixtures are there."""
    log = LOG / "llama3_8b_tp2_pp2_complete.out"
    if not log.is_file():
        return None
    return ("calibrate-log", ("calibrate", "--measurements", str(log), "--model",
                              "llama3-8b", "--cluster", "dgx-h100", "--out",
                              "{tmp}/profile.yaml", "--format", "json"))


def questions() -> list[tuple[str, tuple[str, ...]]]:
    out = list(QUESTIONS)
    extra = _calibrate_question()
    if extra is not None:
        out.append(extra)
    return out


def run_question(args: tuple[str, ...], timeout: float) -> dict[str, object]:
    """Exit code, stdout and stderr of ``python -m parsearch *args`` in a fresh process."""
    with tempfile.TemporaryDirectory(prefix="parsearch-eq-") as tmp:
        argv = [a.replace("{tmp}", tmp) for a in args]
        env = dict(os.environ, OMP_NUM_THREADS="1", COLUMNS="120", NO_COLOR="1")
        start = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "parsearch", *argv], capture_output=True,
                              text=True, timeout=timeout, env=env, cwd=tmp)
        seconds = time.monotonic() - start

        return {"argv": list(args), "rc": done.returncode,
                "stdout": _ELAPSED.sub('"elapsed_s": "<T>"', done.stdout.replace(tmp, "<TMP>")),
                "stderr": _TIMING.sub(r"(\1<T> s)", done.stderr.replace(tmp, "<TMP>")),
                "seconds": round(seconds, 2)}


def first_difference(before: str, after: str) -> str:
    """The first differing lines of two outputs, as a short unified diff."""
    diff = list(difflib.unified_diff(before.splitlines(), after.splitlines(), "before",
                                     "after", n=0, lineterm=""))
    return "\n".join(diff[2:8])


def compare(saved: dict[str, dict[str, object]], now: dict[str, dict[str, object]]) -> int:
    """Print one line per question; return the number that differ."""
    bad = 0
    for name, after in now.items():
        before = saved.get(name)
        if before is None:
            print(f"{name}: not in the baseline")
            bad += 1
            continue
        problems = [f"{field} {before[field]!r} -> {after[field]!r}" for field in ("argv", "rc")
                    if before[field] != after[field]]
        for field in ("stdout", "stderr"):
            if before[field] != after[field]:
                lines = first_difference(str(before[field]), str(after[field]))
                problems.append(f"{field} differs:\n{lines}")
        if problems:
            bad += 1
            print(f"{name}: DIFFERS ({after['seconds']} s)\n  " + "\n  ".join(problems))
        else:
            print(f"{name}: identical (rc {after['rc']}, {len(str(after['stdout']))} "
                  f"chars of stdout, {after['seconds']} s)")
    return bad


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--save", metavar="FILE", help="write the outputs to FILE (JSON)")
    mode.add_argument("--compare", metavar="FILE", help="compare the outputs with FILE")
    mode.add_argument("--list", action="store_true", help="name the questions")
    parser.add_argument("--only", nargs="+", metavar="NAME", default=None)
    parser.add_argument("--timeout", type=float, default=600.0, metavar="S")
    args = parser.parse_args(argv)
    chosen = [(n, a) for n, a in questions() if args.only is None or n in args.only]
    if args.list:
        for name, question in chosen:
            print(f"{name}: parsearch {' '.join(question)}")
        return 0
    results = {}
    for name, question in chosen:
        results[name] = run_question(question, args.timeout)
        if args.save:
            print(f"{name}: rc {results[name]['rc']}, {results[name]['seconds']} s",
                  flush=True)
    if args.save:
        Path(args.save).write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
        print(f"saved {len(results)} questions to {args.save}")
        return 0
    saved = json.loads(Path(args.compare).read_text())
    bad = compare(saved, results)
    print(f"{'FAIL' if bad else 'PASS'}: {len(results) - bad} of {len(results)} questions "
          f"identical")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
