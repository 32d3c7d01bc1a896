"""Inputs at the edges, for the fuzz campaign (issue 35): what an independent campaign found
that the malformed-value generators of :mod:`fuzz_inputs` did not.

* ``path``: output and input paths at and past the file system's limits (a component of
  255/256/300 bytes, a path of 4,096+ bytes, nested long components, a NUL) for
  ``search --export``, ``plan-profiling --launch-dir``, ``calibrate --out`` and
  ``--measurements``, ``pareto``/``sweep --plot``, ``--model`` and sqlite storages;
* ``size``: size extremes a user can plausibly give (65,536 GPUs with a global batch of 1,
  ``plan-profiling --k 30 --candidates 1000``, measurement tables of 51 to 10,000 rows,
  serving mixes of 4 M-token prompts under loose latency targets);
* ``empty``: empty groups (a table with a header only, every row for another cluster,
  empty grid lists, an empty mix);
* ``nan_field``: NaN, infinite, empty and huge fields beside each other in measurement
  tables (CSV and YAML) and in serving mixes.

Every case names a valid, cheap base command with one such input.
"""

from __future__ import annotations

import random

from fuzz_inputs import Case, set_option

#: Path lengths around the limits of Linux file systems (NAME_MAX 255, PATH_MAX 4096).
NAME_LENGTHS = (1, 254, 255, 256, 300, 1000)
SMALL = ("--global-batch", "64", "--seq-len", "2048")
MEASURED_HEADER = ("model,cluster,num_gpus,global_batch,seq_len,precision,layout,"
                   "tokens_per_s_per_gpu,step_time_s")
GOOD_ROWS = ('llama3-8b,dgx-h100,16,128,8192,bf16,"tp=2,sp=true",9000,',
             'llama3-8b,dgx-h100,16,128,8192,bf16,"tp=4,sp=true",8000,',
             'llama3-8b,dgx-h100,16,128,8192,bf16,"tp=1",,7.5')
ODD_CELLS = ("", " ", "nan", "NaN", "inf", "-inf", "1e308", "1e-320", "5e-324", "0", "-0",
             "1e400", "9" * 40)


def _long_path(rng: random.Random, suffix: str = "") -> str:
    """A path under the case folder with one over-long component or many long ones."""
    roll = rng.random()
    if roll < 0.5:
        return "{tmp}/" + "p" * rng.choice(NAME_LENGTHS) + suffix
    if roll < 0.8:  # long in total, each component legal
        return "{tmp}/" + "/".join(["q" * 250] * rng.choice((4, 16, 17, 20))) + suffix
    return rng.choice(("{tmp}/a\x00b" + suffix, "{tmp}/" + "é" * 200 + suffix,
                       "{tmp}/file.txt/x" + suffix, "/proc/x" + suffix))


def path_case(rng: random.Random) -> Case:
    files = {"file.txt": b"x\n", "runs.csv": ("\n".join([MEASURED_HEADER, *GOOD_ROWS]) +
                                              "\n").encode()}
    target = rng.choice(("export", "launch_dir", "out", "measurements", "plot", "model",
                         "storage"))
    if target == "export":
        argv = ["search", "--model", "gpt-1.7b", "--cluster", "dgx-h100", "--gpus", "8", *SMALL,
                "--top", "1", "--export", _long_path(rng)]
    elif target == "launch_dir":
        argv = ["plan-profiling", "--model", "gpt-1.7b", "--cluster", "dgx-h100", "--gpus", "8",
                *SMALL, "--k", "1", "--candidates", "2", "--launch-dir", _long_path(rng)]
    elif target in ("out", "measurements"):
        argv = ["calibrate", "--measurements", "runs.csv", "--out", "{tmp}/p.yaml",
                "--no-leave-one-out", "--format", "json"]
        option = "--out" if target == "out" else "--measurements"
        argv = set_option(argv, option, _long_path(rng, ".yaml" if target == "out" else ".csv"))
    elif target == "plot":
        argv = rng.choice((
            ["pareto", "--model", "gpt-1.7b", "--cluster", "dgx-h100", "--max-gpus", "16",
             *SMALL],
            ["sweep", "--models", "gpt-1.7b", "--clusters", "dgx-h100", "--gpus", "8", *SMALL,
             "--storage", "sqlite:///{tmp}/s.db"]))
        argv = set_option(argv, "--plot", _long_path(rng, rng.choice((".png", ".svg"))))
    elif target == "model":
        argv = ["explain", "--model", _long_path(rng, ".json"), "--cluster", "dgx-h100",
                "--gpus", "8", "--layout", "tp=1", *SMALL]
    else:
        argv = ["sweep", "--models", "gpt-1.7b", "--clusters", "dgx-h100", "--gpus", "8", *SMALL,
                "--storage", "sqlite:///" + _long_path(rng, ".db")]
    return Case("path", argv, files)


def _table(rows: list[str]) -> bytes:
    return ("\n".join([MEASURED_HEADER, *rows]) + "\n").encode()


def size_case(rng: random.Random) -> Case:
    roll = rng.random()
    if roll < 0.3:  # planning at the edges (K, candidates, GPUs)
        model, cluster, gpus = rng.choice((("llama3-70b", "gb300-nvl72", "65536"),
                                           ("llama3-8b", "dgx-h100", "16"),
                                           ("llama3-70b", "dgx-h100", "512"),
                                           ("gpt-1.7b", "dgx-h100", "131072")))
        argv = ["plan-profiling", "--model", model, "--cluster", cluster, "--gpus", gpus,
                "--global-batch", rng.choice(("1", "512", "16777216")),
                "--seq-len", rng.choice(("2048", "32768")),
                "--k", rng.choice(("1", "5", "30", "1000")),
                "--candidates", rng.choice(("1", "30", "1000", "1000000")),
                "--recompute", rng.choice(("full", "none,selective,full")), "--format", "json"]
        files: dict[str, bytes] = {}
        if rng.random() < 0.3:  # measurements of another cluster, or of this one
            other = rng.choice(("dgx-a100", cluster))
            rows = [f'{model},{other},{gpus},512,8192,bf16,"tp=8,pp=4,sp=true",900,']
            files["runs.csv"] = _table(rows * rng.choice((1, 3)))
            argv += ["--measurements", "runs.csv"]
        return Case("size", argv, files)
    if roll < 0.55:  # measurement tables of many rows
        count = rng.choice((51, 200, 1000, 10_000))
        rows = [rng.choice(GOOD_ROWS) for _ in range(count)]
        if rng.random() < 0.3:
            rows = [r.replace(",9000,", ",1e308,") for r in rows]
        argv = ["calibrate", "--measurements", "runs.csv", "--out", "{tmp}/p.yaml",
                "--format", rng.choice(("table", "json"))]
        return Case("size", argv, {"runs.csv": _table(rows)})
    if roll < 0.8:  # serving at the edges: huge prompts, loose targets, low precision
        isl = rng.choice(("1", "131072", "4194304", "16777216"))
        argv = ["serve", "--model", rng.choice(("llama3-8b", "deepseek-v3", "qwen3-30b-a3b")),
                "--cluster", rng.choice(("gb300-nvl72", "dgx-h100")),
                "--gpus", rng.choice(("8", "32", "72")),
                "--mix", f"{isl}:{rng.choice(('1', '128'))}",
                "--ttft-ms", rng.choice(("1e9", "1", "100")),
                "--tpot-ms", rng.choice(("1e9", "1", "50")),
                "--precision", rng.choice(("fp4", "fp8", "bf16")), "--format", "json"]
        return Case("size", argv)
    argv = ["search", "--model", rng.choice(("llama3-70b", "gpt-1.7b", "deepseek-v3")),
            "--cluster", rng.choice(("gb300-nvl72", "dgx-h100")),
            "--gpus", rng.choice(("1", "8", "65536")),
            "--global-batch", rng.choice(("1", "16777216")),
            "--seq-len", rng.choice(("1", "32768", "1048576")), "--top", "1", "--format", "json"]
    return Case("size", argv)


def empty_case(rng: random.Random) -> Case:
    roll = rng.random()
    if roll < 0.4:
        rows = rng.choice(([], [""], ["#"], [r.replace("dgx-h100", "dgx-a100")
                                            for r in GOOD_ROWS]))
        command = rng.choice(("calibrate", "plan-profiling"))
        if command == "calibrate":
            argv = ["calibrate", "--measurements", "runs.csv", "--out", "{tmp}/p.yaml",
                    "--cluster", "dgx-h100"]
        else:
            argv = ["plan-profiling", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus",
                    "16", "--global-batch", "128", "--seq-len", "8192", "--k", "2",
                    "--measurements", "runs.csv"]
        data = b"" if rng.random() < 0.2 else _table(rows)
        return Case("empty", argv, {"runs.csv": data})
    if roll < 0.7:
        option = rng.choice(("--models", "--clusters", "--gpus", "--global-batch", "--seq-len",
                             "--micro-batch-sizes", "--recompute"))
        argv = ["sweep", "--models", "gpt-1.7b", "--clusters", "dgx-h100", "--gpus", "8",
                *SMALL, "--storage", "sqlite:///{tmp}/s.db", "--format", "json"]
        return Case("empty", set_option(argv, option, rng.choice(("", ",", ",,", " , "))))
    argv = ["serve", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8",
            "--mix", rng.choice(("", ",", "128:128:0", "128:128:0,256:64:0", ":", "0:0")),
            "--format", "json"]
    return Case("empty", argv)


def nan_field_case(rng: random.Random) -> Case:
    if rng.random() < 0.25:
        argv = ["serve", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8",
                "--mix", rng.choice(("nan:128", "128:nan", "128:128:nan", "inf:1", "1e400:1",
                                     "128:128:1e308")), "--format", "json"]
        return Case("nan_field", argv)
    names = MEASURED_HEADER.split(",")
    records = []
    for _ in range(rng.randint(1, 6)):
        record: dict[str, object] = dict(zip(names, ["llama3-8b", "dgx-h100", "16", "128", "8192",
                                                      "bf16", "tp=2,sp=true", "9000", ""],
                                               strict=True))
        for _ in range(rng.randint(1, 3)):
            key = rng.choice(("num_gpus", "global_batch", "seq_len", "tokens_per_s_per_gpu",
                              "step_time_s"))
            record[key] = rng.choice(ODD_CELLS)
        records.append(record)
    if rng.random() < 0.3:
        import yaml

        for record in records:  # YAML's own non-finite and null values
            key = rng.choice(("global_batch", "step_time_s", "tokens_per_s_per_gpu"))
            record[key] = rng.choice((float("nan"), float("inf"), None, 1e308, ""))
        name, data = "runs.yaml", yaml.safe_dump(records).encode()
    else:
        import csv
        import io

        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=names)
        writer.writeheader()
        writer.writerows(records)
        name, data = "runs.csv", out.getvalue().encode()
    argv = ["calibrate", "--measurements", name, "--out", "{tmp}/p.yaml", "--format",
            rng.choice(("table", "json")), "--no-leave-one-out"]
    return Case("nan_field", argv, {name: data})


KINDS = {
    "path": (path_case, 0.10),
    "size": (size_case, 0.08),
    "empty": (empty_case, 0.06),
    "nan_field": (nan_field_case, 0.06),
}

__all__ = ["KINDS", "empty_case", "nan_field_case", "path_case", "size_case"]
