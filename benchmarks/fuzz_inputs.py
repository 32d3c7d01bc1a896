"""Malformed inputs for the fuzz campaign: one generator per input kind.

Each generator takes a ``random.Random`` and returns a :class:`Case`: a
``parsearch`` command line built from a valid, cheap base command (small
model, few GPUs) with one input made malformed, and the files it needs.
Placeholders ``{tmp}`` in arguments stand for the case's own folder.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HF_CONFIGS = ROOT / "tests" / "fixtures" / "hf_configs"
TOPOLOGIES = ROOT / "topologies"
EFFICIENCY = ROOT / "cost_models" / "efficiency"
RUNS_CSV = ROOT / "src" / "parsearch" / "data" / "published_runs.csv"
INDEPENDENT_CSV = ROOT / "src" / "parsearch" / "data" / "independent_runs.csv"

# --------------------------------------------------------------------------- value pools

#: Text values for numeric options: malformed, out of range, non-finite, huge.
BAD_NUMBERS: tuple[str, ...] = (
    "0", "-1", "-0", "1", "2", "3", "7", "nan", "NaN", "inf", "-inf", "Infinity", "1e309",
    "-1e309", "1e-320", "0.5", "1.5", "2.0", "abc", "", " ", "0x10", "1_000", "١", "1e3",
    "9223372036854775807", "9223372036854775808", "18446744073709551616", "4294967296",
    "1048576", "1000000000", "1000000000000", "9" * 40, "-9" + "9" * 40, "1" * 5000,
    "4294967296",
)
#: JSON/YAML values for numeric fields of model and cluster files.
BAD_FIELD_VALUES: tuple[Any, ...] = (
    0, -1, 1, 2, 3, 7, 10**12, 2**63, 2**64, 10**30, 10**400, 1.5, 0.0, -0.0, 1e308,
    float("nan"), float("inf"), float("-inf"), "abc", "", None, True, False, [], {}, [1, 2],
    {"a": 1}, "1e3", 257, 262145, 1048577, 16385, 16777217, 65537,  # just over a bound
)
LAYOUT_KEYS = ("tp", "pp", "cp", "ep", "etp", "vpp", "dp", "mbs", "sp", "recompute", "gpus",
               "num_gpus", "xx", "TP", "")
LAYOUT_VALUES = ("1", "2", "4", "8", "0", "-1", "nan", "inf", "true", "false", "yes", "full",
                 "none", "selective", "9" * 30, "1.5", "", "=", ",", "tp", "2**63",
                 "9223372036854775808")
STORAGE_URLS = (
    "sqlite:///{tmp}/ok.db", "sqlite:///{tmp}/no/such/dir/x.db", "sqlite:////proc/x.db",
    "sqlite:///{tmp}", "sqlite:///{tmp}/file.txt", "sqlite://", "sqlite:///",
    "journal:{tmp}/ok.log", "journal:", "journal:{tmp}", "journal:/proc/x.log",
    "journal:{tmp}/no/such/x.log", "{tmp}/study.log", "postgresql://user:s3cret@127.0.0.1:1/db",
    "postgresql://127.0.0.1:1/db", "mysql://user:s3cret@127.0.0.1:1/db", "foo://bar",
    "http://example.com/db", "not a url", "", "::::", "sqlite:///{tmp}/\x00x.db",
    "postgresql://user:pa%ss@[::1/db", "sqlite:///" + "x" * 5000 + ".db",
)
PLOT_PATHS = (
    "{tmp}/front.png", "{tmp}/front.html", "{tmp}", "{tmp}/", "{tmp}/no/such/dir/f.png",
    "/proc/front.png", "/proc/self/front.html", "{tmp}/dir.png", "{tmp}/front.txt",
    "{tmp}/front", "", ".png", "{tmp}/file.txt/f.png", "/dev/null.png", "/sys/front.html",
    "{tmp}/" + "x" * 300 + ".png", "{tmp}/a\x00b.png", "{tmp}/FRONT.PNG",
)

# --------------------------------------------------------------------------- base commands

MODELS = ("llama3-8b", "qwen3-30b-a3b", "mixtral-8x7b", "gpt-1.7b")
CLUSTERS = ("dgx-h100", "dgx-a100", "gb200-nvl72", "h100-roce")


@dataclass
class Case:
    """One command line and the files it needs (written under the case's folder)."""

    kind: str
    argv: list[str]
    files: dict[str, bytes] = field(default_factory=dict)
    dirs: tuple[str, ...] = ()


def _setup(rng: random.Random, gpus: int) -> list[str]:
    batch = rng.choice((64, 128, 256, 512))
    return ["--global-batch", str(batch), "--seq-len", str(rng.choice((2048, 4096, 8192)))]


def base_command(rng: random.Random, model: str | None = None,
                 cluster: str | None = None) -> tuple[str, list[str]]:
    """A valid, cheap command line (small model, few GPUs)."""
    model = model or rng.choice(MODELS)
    cluster = cluster or rng.choice(CLUSTERS)
    gpus = rng.choice((8, 16, 32, 64))
    command = rng.choice(("search", "search", "explain", "check", "layouts", "placement",
                          "pareto", "pareto", "cluster", "models", "clusters", "serve",
                          "sweep"))
    layout = rng.choice(("tp=2,pp=2", "tp=4,pp=1,sp=true", "tp=1,pp=2,mbs=2", "tp=8",
                         "tp=2,pp=1,ep=2" if "qwen" in model or "mixtral" in model else "tp=2"))
    fmt = ["--format", rng.choice(("table", "json"))]
    if command == "search":
        return command, ["search", "--model", model, "--cluster", cluster, "--gpus", str(gpus),
                         *_setup(rng, gpus), *fmt, "--top", "3"]
    if command == "explain":
        return command, ["explain", "--model", model, "--cluster", cluster, "--gpus", str(gpus),
                         "--layout", layout, *_setup(rng, gpus), *fmt]
    if command == "check":
        return command, ["check", "--model", model, "--gpus", str(gpus), "--layout", layout,
                         *_setup(rng, gpus), "--format", rng.choice(("text", "json"))]
    if command == "layouts":
        return command, ["layouts", "--model", model, "--gpus", str(gpus), *_setup(rng, gpus),
                         "--limit", "20", "--format", rng.choice(("table", "jsonl", "csv"))]
    if command == "placement":
        return command, ["placement", "--model", model, "--cluster", cluster, "--gpus",
                         str(gpus), "--layout", layout, *fmt]
    if command == "pareto":
        method = rng.choice(("exhaustive", "exhaustive", "optuna"))
        argv = ["pareto", "--model", model, "--cluster", cluster, "--max-gpus", str(gpus),
                *_setup(rng, gpus), *fmt, "--method", method]
        if method == "optuna":
            argv += ["--n-trials", "16", "--seed", "1"]
        return command, argv
    if command == "cluster":
        return command, ["cluster", "show", cluster, "--gpus", str(gpus), *fmt]
    if command == "serve":
        return command, ["serve", "--model", model, "--cluster", cluster, "--gpus", str(gpus),
                         "--isl", rng.choice(("128", "1024")), "--osl", "128", "--top", "3",
                         *fmt]
    if command == "sweep":
        return command, ["sweep", "--models", model, "--clusters", cluster, "--gpus",
                         f"8,{gpus}", "--global-batch", "128", "--seq-len", "2048",
                         "--storage", "sqlite:///{tmp}/sweep.db", "--top", "2",
                         "--format", rng.choice(("table", "json", "csv"))]
    return command, [command, *fmt]


def set_option(argv: list[str], option: str, value: str) -> list[str]:
    """``argv`` with ``option`` set to ``value`` (replaced when present, else appended)."""
    out = list(argv)
    if option in out:
        out[out.index(option) + 1] = value
    else:
        out += [option, value]
    return out


# --------------------------------------------------------------------------- input kinds

NUMERIC_OPTIONS: dict[str, tuple[str, ...]] = {
    "search": ("--gpus", "--global-batch", "--seq-len", "--top", "--micro-batch-sizes",
               "--max-vpp", "--weight-bytes", "--grad-bytes", "--optimizer-bytes",
               "--moe-imbalance", "--grad-reduce-bytes", "--memory-margin",
               "--recompute-num-layers", "--activation-offload-layers"),
    "explain": ("--gpus", "--global-batch", "--seq-len", "--weight-bytes", "--moe-imbalance",
                "--memory-margin", "--grad-reduce-bytes", "--micro-batch-sizes",
                "--recompute-num-layers", "--activation-offload-layers", "--optimizer-bytes"),
    "check": ("--gpus", "--global-batch", "--seq-len", "--micro-batch-sizes", "--max-vpp"),
    "layouts": ("--gpus", "--global-batch", "--seq-len", "--limit", "--micro-batch-sizes",
                "--max-vpp"),
    "placement": ("--gpus",),
    "pareto": ("--max-gpus", "--min-gpus", "--gpu-step", "--n-trials", "--seed",
               "--global-batch", "--seq-len", "--weight-bytes", "--moe-imbalance",
               "--memory-margin", "--grad-bytes"),
    "cluster": ("--gpus",),
    "serve": ("--gpus", "--isl", "--osl", "--ttft-ms", "--tpot-ms", "--concurrency",
              "--request-rate", "--max-batch", "--sliding-window", "--windowed-layers", "--top"),
    "sweep": ("--gpus", "--global-batch", "--seq-len", "--micro-batch-sizes", "--top",
              "--heartbeat", "--db-retry-seconds"),
}


def just_over_bound(option: str) -> str | None:
    """One more than the largest value ``option`` accepts (``None``: no named bound).

    Values at a bound are valid and may be expensive (a pareto to 131,072
    GPUs takes minutes): the campaign probes malformed input, so it sends
    the first refused value, not the last accepted one.
    """
    from parsearch.cli.input_checks import INT_BOUNDS

    bound = INT_BOUNDS.get(option.removeprefix("--").replace("-", "_"))
    return None if bound is None else str(bound[0] + 1)


def numeric_case(rng: random.Random) -> Case:
    command, argv = base_command(rng)
    while command not in NUMERIC_OPTIONS:
        command, argv = base_command(rng)
    option = rng.choice(NUMERIC_OPTIONS[command])
    value = rng.choice(BAD_NUMBERS)
    bound = just_over_bound(option)
    if bound is not None and rng.random() < 0.15:
        value = bound
    if option == "--micro-batch-sizes" and rng.random() < 0.5:
        value = ",".join(rng.choice(BAD_NUMBERS) for _ in range(rng.randint(1, 3)))
    if option in ("--seed", "--n-trials", "--min-gpus", "--gpu-step") and "--method" in argv:
        argv = set_option(argv, "--method", "optuna")
        argv = set_option(argv, "--n-trials", "16")
    argv = set_option(argv, option, value)
    return Case("numeric", argv)


def layout_case(rng: random.Random) -> Case:
    command, argv = base_command(rng)
    while command not in ("explain", "check", "placement"):
        command, argv = base_command(rng)
    parts = []
    for _ in range(rng.randint(0, 6)):
        key, value = rng.choice(LAYOUT_KEYS), rng.choice(LAYOUT_VALUES)
        parts.append(rng.choice((f"{key}={value}", f"{key}:{value}", key, f"{key}={value}=")))
    text = rng.choice((",", ";", " ", ",,")).join(parts)
    if rng.random() < 0.1:
        text = rng.choice(("", " ", "\x00", "tp=8" * 2000, "{}", "é=1", "tp=1,tp=2"))
    return Case("layout", set_option(argv, "--layout", text))


def _mutate_mapping(rng: random.Random, data: dict[str, Any], keys: list[str]) -> dict[str, Any]:
    data = dict(data)
    for _ in range(rng.randint(1, 3)):
        key = rng.choice(keys)
        action = rng.random()
        if action < 0.12:
            data.pop(key, None)
        elif action < 0.2:
            data["unknown_" + key] = 1
        else:
            data[key] = rng.choice(BAD_FIELD_VALUES)
    return data


def _json_bytes(data: Any) -> bytes:
    try:
        return json.dumps(data).encode()
    except ValueError:  # 10**400 and friends: write the digits by hand
        return repr(data).encode()


def _raw_file(rng: random.Random, suffix: str) -> bytes:
    """Bytes that are not a usable file at all."""
    depth = rng.choice((50, 2000, 100_000))
    return rng.choice((
        b"", b"\xff\xfe\x00garbage\x80\x81", "{\"model_type\": \"llama\"}".encode("utf-16"),
        b"[" * depth + b"]" * depth, b"{\"a\":" * depth + b"1" + b"}" * depth,
        b"a: &a [1]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
        b"d: [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n",
        b"{\"num_hidden_layers\": " + b"9" * 5000 + b"}", b"- 1\n- 2\n", b"null", b"42",
        b"\x00" * 64, b"{" + b"\"k\": 1," * 10 + b"}", b"key: [unclosed\n",
        b"!!python/object/apply:os.system ['true']\n",
    ))


def model_file_case(rng: random.Random) -> Case:
    _, argv = base_command(rng)
    while "--model" not in argv:
        _, argv = base_command(rng)
    base = rng.choice(("llama3-8b", "mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3",
                       "gpt-oss-120b", "qwen2-7b"))
    config = json.loads((HF_CONFIGS / f"{base}.json").read_text())
    numeric = [k for k, v in config.items() if isinstance(v, int | float)
               and not isinstance(v, bool)] + ["model_type", "architectures", "hidden_act"]
    roll = rng.random()
    if roll < 0.15:
        name, data = f"config{rng.choice(('.json', '.yaml', ''))}", _raw_file(rng, ".json")
    elif roll < 0.3:  # parsearch's own model file (YAML)
        own = {"num_layers": 4, "hidden_size": 256, "ffn_hidden_size": 512,
               "num_attention_heads": 4, "vocab_size": 1000,
               "moe": {"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 128}}
        own = _mutate_mapping(rng, own, [*own, "head_dim", "num_query_groups", "mtp_layers",
                                         "norm"])
        if rng.random() < 0.3 and isinstance(own.get("moe"), dict):
            own["moe"] = _mutate_mapping(rng, own["moe"], ["num_experts", "top_k",
                                                           "expert_ffn_hidden_size",
                                                           "first_k_dense", "layer_freq"])
        name, data = "model.json", _json_bytes(own)
    else:
        name, data = "config.json", _json_bytes(_mutate_mapping(rng, config, numeric))
    argv = set_option(argv, "--model", name)
    dirs: tuple[str, ...] = ()
    if rng.random() < 0.05:  # a folder where the file should be
        argv, dirs, data = set_option(argv, "--model", "adir.json"), ("adir.json",), b""
    return Case("model_file", argv, {name: data} if not dirs else {}, dirs)


def cluster_file_case(rng: random.Random) -> Case:
    _, argv = base_command(rng)
    while "--cluster" not in argv and argv[0] != "cluster":
        _, argv = base_command(rng)
    import yaml

    data = yaml.safe_load((TOPOLOGIES / f"{rng.choice(CLUSTERS)}.yaml").read_text())
    keys = [k for k in data if k not in ("sources", "description")] + ["gpus_per_pod",
                                                                     "usable_domain_size",
                                                                     "max_gpus"]
    if rng.random() < 0.15:
        body = _raw_file(rng, ".yaml")
    else:
        body = yaml.safe_dump(_mutate_mapping(rng, data, keys), allow_unicode=True).encode()
    name = rng.choice(("cluster.yaml", "cluster.yml"))
    if argv[0] == "cluster":
        argv = ["cluster", "show", name, *argv[3:]]
    else:
        argv = set_option(argv, "--cluster", name)
    return Case("cluster_file", argv, {name: body})


def efficiency_file_case(rng: random.Random) -> Case:
    command, argv = base_command(rng)
    while command not in ("search", "explain", "pareto"):
        command, argv = base_command(rng, cluster="dgx-h100")
    argv = set_option(argv, "--cluster", "dgx-h100")
    import yaml

    data = yaml.safe_load((EFFICIENCY / "hopper.yaml").read_text())
    if rng.random() < 0.2:
        body = _raw_file(rng, ".yaml")
    else:
        keys = list(data) if isinstance(data, dict) else []
        body = yaml.safe_dump(_mutate_mapping(rng, data, keys) if keys else data).encode()
        if rng.random() < 0.5:  # mutate a nested number
            text = body.decode()
            numbers = list(re.finditer(r"(?<=: )\d+(\.\d+)?(?=\n)", text))
            if numbers:
                hit = rng.choice(numbers)
                text = text[:hit.start()] + rng.choice((".nan", ".inf", "-1", "0", "1e400",
                                                        "abc", "99999999999999999999")) \
                    + text[hit.end():]
            body = text.encode()
    return Case("efficiency_file", set_option(argv, "--efficiency", "eff.yaml"),
                {"eff.yaml": body})


def storage_case(rng: random.Random) -> Case:
    _, argv = base_command(rng)
    while argv[0] not in ("pareto", "sweep"):
        _, argv = base_command(rng)
    if argv[0] == "pareto":
        argv = set_option(set_option(argv, "--method", "optuna"), "--n-trials", "12")
    elif rng.random() < 0.3:  # a worker naming only the storage
        argv = ["sweep", "--worker", "--storage", ""]
    url = rng.choice(STORAGE_URLS)
    argv = set_option(argv, "--storage", url)
    if rng.random() < 0.3:
        argv = set_option(argv, "--study-name" if argv[0] == "pareto" else "--name",
                           rng.choice(("s", "", "x" * 2000, "é", "\x00")))
    return Case("storage", argv, {"file.txt": b"not a database\n"}, ("dir.png",))


def plot_case(rng: random.Random) -> Case:
    _, argv = base_command(rng)
    while argv[0] not in ("pareto", "sweep"):
        _, argv = base_command(rng)
    argv = set_option(argv, "--plot", rng.choice(PLOT_PATHS))
    return Case("plot", argv, {"file.txt": b"x\n"}, ("dir.png",))


def _csv_mutation(rng: random.Random, text: str) -> str:
    import csv
    import io

    rows = list(csv.reader(io.StringIO(text)))
    # 30 rows keep a case to seconds (the whole bundled file takes 10-20 s to validate).
    header, body = rows[0], rng.sample(rows[1:], min(30, len(rows) - 1))
    for _ in range(rng.randint(1, 6)):
        row = rng.choice(body)
        column = rng.randrange(len(header))
        row[column] = rng.choice(("", "abc", "0", "-1", "nan", "inf", "1e400", "9" * 30,
                                  "1.5", "yes", "no", "partial", "BF16", "FP8", "H100",
                                  "\x00", "é"))
    if rng.random() < 0.1:
        header = header[: rng.randrange(1, len(header))]
    if rng.random() < 0.1:
        body = body[: rng.randint(0, 2)]
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(header)
    writer.writerows(body)
    return out.getvalue()


def validation_csv_case(rng: random.Random) -> Case:
    source = rng.choice((RUNS_CSV, INDEPENDENT_CSV))
    roll = rng.random()
    if roll < 0.15:
        data = _raw_file(rng, ".csv")
    elif roll < 0.25:  # unchanged rows
        lines = source.read_text().splitlines(keepends=True)
        data = "".join(lines[:1] + lines[1:31]).encode()
    else:
        data = _csv_mutation(rng, source.read_text()).encode()
    argv = ["validate", "--data", "runs.csv", "--format", rng.choice(("table", "json"))]
    if rng.random() < 0.3:
        argv.append(rng.choice(("--all-releases", "--include-partial")))
    if rng.random() < 0.05:
        argv = ["validate", "--data", rng.choice(("dir.png", "missing.csv", "/proc/x.csv"))]
    return Case("validation_csv", argv, {"runs.csv": data}, ("dir.png",))


MEASUREMENT_COLUMNS = ("model", "cluster", "num_gpus", "global_batch", "seq_len", "precision",
                       "layout", "tokens_per_s_per_gpu", "step_time_s")
LOGS = ROOT / "tests" / "fixtures" / "megatron_logs"


def measurement_case(rng: random.Random) -> Case:
    """``calibrate`` on a malformed measurements table or training log."""
    roll = rng.random()
    if roll < 0.5:
        rows = [["llama3-8b", "dgx-h100", "16", "128", "8192", "bf16", layout, str(tokens), ""]
                for layout, tokens in (("tp=2,sp=true", 9000), ("tp=4,sp=true", 8000),
                                       ("tp=1", 9500))]
        for _ in range(rng.randint(1, 4)):
            row = rng.choice(rows)
            row[rng.randrange(len(row))] = rng.choice(
                (*BAD_NUMBERS[:30], "tp=0", "tp=2,pp=3", "bf17", "nope"))
        header = list(MEASUREMENT_COLUMNS)
        if rng.random() < 0.1:
            header[rng.randrange(len(header))] = "colour"
        text = "\n".join(",".join(f'"{c}"' for c in row) for row in [header, *rows]) + "\n"
        name, data = "runs.csv", text.encode()
    elif roll < 0.8:
        log = rng.choice(sorted(LOGS.iterdir())).read_bytes()
        cut = rng.randrange(len(log) + 1)
        noise = rng.choice((b"", b"\xff\xfe", b"nan", b"iteration 5/ 10 | elapsed time per "
                            b"iteration (ms): inf | ", b"\x00" * 8, b"9" * 400))
        name, data = "train.out", log[:cut] + noise + log[cut:][: rng.randrange(len(log) + 1)]
    else:
        name, data = rng.choice(("runs.csv", "runs.yaml", "x.out")), _raw_file(rng, ".csv")
    argv = ["calibrate", "--measurements", name, "--out", "{tmp}/mine.yaml", "--format",
            rng.choice(("table", "json"))]
    if rng.random() < 0.6:
        argv += ["--model", "llama3-8b", "--cluster", "dgx-h100"]
    return Case("measurements", argv, {name: data})


def junk_case(rng: random.Random) -> Case:
    _, argv = base_command(rng)
    tokens = [*argv, "--", "-", "--gpus", "--help=x", "--format", "xml", "\x00", "é", "-h"]
    out = [argv[0], *(rng.choice(tokens) for _ in range(rng.randint(0, 8)))]
    if rng.random() < 0.2:
        out = [rng.choice(("", "-", "--", "nope", "search", "cluster", "models"))]
    return Case("junk", out)


KINDS = {
    "numeric": (numeric_case, 0.22),
    "layout": (layout_case, 0.10),
    "model_file": (model_file_case, 0.17),
    "cluster_file": (cluster_file_case, 0.14),
    "efficiency_file": (efficiency_file_case, 0.05),
    "storage": (storage_case, 0.08),
    "plot": (plot_case, 0.07),
    "validation_csv": (validation_csv_case, 0.08),
    "measurements": (measurement_case, 0.05),
    "junk": (junk_case, 0.04),
}


def make_cases(count: int, seed: int, only: str | None = None) -> list[Case]:
    rng = random.Random(seed)
    names = [only] if only else list(KINDS)
    weights = [KINDS[n][1] for n in names]
    return [KINDS[rng.choices(names, weights)[0]][0](rng) for _ in range(count)]
