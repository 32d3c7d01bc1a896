"""Fuzzing every command and input kind through ``parsearch.cli.main`` in-process.

Each property feeds malformed input of one kind (numeric options, layout
strings, model files, cluster files, storage URLs, plot paths, validation
CSVs, serve/sweep options, calibrate's measurement tables) into a small,
cheap command and checks what a user sees: exit code 0
or 2 (1 also for ``check``, whose answer is "invalid"), no exception
escaping ``main``, exactly one line on stderr for an error, and no NaN or
Infinity in the output (JSON parsed strictly).  Examples are bounded and
derandomized for CI time; the long campaign is ``benchmarks/fuzz_campaign.py``.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.fuzz_inputs import set_option
from parsearch.strict_json import strict_json
from tests.cli_helpers import CliResult, assert_one_line_error, run_cli

ROOT = Path(__file__).resolve().parents[1]
HF_CONFIG = ROOT / "tests" / "fixtures" / "hf_configs" / "qwen3-30b-a3b.json"
CLUSTER_FILE = ROOT / "topologies" / "dgx-h100.yaml"
RUNS_CSV = ROOT / "src" / "parsearch" / "data" / "published_runs.csv"
INDEPENDENT_CSV = ROOT / "src" / "parsearch" / "data" / "independent_runs.csv"

TINY_MODEL = {"num_layers": 4, "hidden_size": 256, "ffn_hidden_size": 512,
              "num_attention_heads": 4, "vocab_size": 1024}
SETUP = ("--global-batch", "16", "--seq-len", "512")
FUZZ = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

NUMBER_TEXT = st.one_of(
    st.sampled_from(["0", "-1", "nan", "-inf", "inf", "1e309", "", "abc", "1" * 5000,
                     "9223372036854775808", "1048576", "1e-320", "0x10", "١"]),
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(max_size=6),
)
BAD_VALUES = st.one_of(
    st.sampled_from([0, -1, 2**63, 10**12, 10**400, 1.5, 1e308, math.nan, math.inf, "x", None,
                     True, [], {}]),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
)
_NONFINITE_WORD = re.compile(r"(?<![\w.])-?(NaN|nan|Infinity|inf)(?!\w)")


def _reject(name: str) -> Any:
    raise AssertionError(f"bare {name} in JSON output")


def check_outcome(result: CliResult, *, check_cmd: bool = False, inputs: str = "") -> None:
    """The properties every run must have, whatever its input.

    In text output a word like ``nan`` counts unless ``inputs`` (the case's
    own file) holds it: a CSV cell echoed back is not a computed value.
    """
    allowed = {0, 1, 2} if check_cmd else {0, 2}
    assert result.code in allowed, result
    assert "Traceback" not in result.err
    if result.code == 2:
        assert len(result.err.strip().splitlines()) == 1, result.err
    text = result.out.strip()
    if text and text[0] in "{[":
        json.loads(text, parse_constant=_reject)  # strict JSON: no NaN/Infinity
    elif result.code == 0:
        for match in _NONFINITE_WORD.finditer(result.out):
            assert re.search(rf"(?<![\w.]){match.group(1)}(?!\w)", inputs), result.out


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("model") / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY_MODEL))
    return str(path)


def _command(name: str, model: str) -> list[str]:
    return {
        "search": ["search", "--model", model, "--cluster", "dgx-h100", "--gpus", "8", *SETUP,
                   "--format", "json", "--top", "2"],
        "explain": ["explain", "--model", model, "--cluster", "dgx-h100", "--gpus", "8",
                    "--layout", "tp=2", *SETUP, "--format", "json"],
        "check": ["check", "--model", model, "--gpus", "8", "--layout", "tp=2", *SETUP],
        "layouts": ["layouts", "--model", model, "--gpus", "8", *SETUP, "--limit", "3"],
        "placement": ["placement", "--model", model, "--cluster", "dgx-h100", "--gpus", "8",
                      "--layout", "tp=2"],
        "pareto": ["pareto", "--model", model, "--cluster", "dgx-h100", "--max-gpus", "16",
                   *SETUP, "--method", "exhaustive", "--format", "json"],
        "cluster": ["cluster", "show", "dgx-h100", "--gpus", "16", "--format", "json"],
    }[name]


NUMERIC = [
    ("search", "--gpus"), ("search", "--global-batch"), ("search", "--seq-len"),
    ("search", "--top"), ("search", "--micro-batch-sizes"), ("search", "--weight-bytes"),
    ("search", "--grad-bytes"), ("search", "--moe-imbalance"), ("search", "--memory-margin"),
    ("search", "--grad-reduce-bytes"), ("search", "--max-vpp"),
    ("explain", "--recompute-num-layers"), ("explain", "--activation-offload-layers"),
    ("explain", "--optimizer-bytes"), ("check", "--gpus"), ("layouts", "--limit"),
    ("placement", "--gpus"), ("pareto", "--max-gpus"), ("pareto", "--min-gpus"),
    ("pareto", "--gpu-step"), ("cluster", "--gpus"),
]


@FUZZ
@given(target=st.sampled_from(NUMERIC), value=NUMBER_TEXT)
def test_numeric_options(tiny_model: str, target: tuple[str, str], value: str) -> None:
    command, option = target
    argv = set_option(_command(command, tiny_model), option, value)
    check_outcome(run_cli(*argv), check_cmd=command == "check")


@settings(FUZZ, max_examples=25)
@given(option=st.sampled_from(["--seed", "--n-trials"]), value=NUMBER_TEXT)
def test_study_options(tiny_model: str, option: str, value: str) -> None:
    argv = set_option(set_option(_command("pareto", tiny_model), "--method", "optuna"),
                      "--n-trials", "3")
    check_outcome(run_cli(*set_option(argv, option, value)))


LAYOUT_TEXT = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["tp", "pp", "cp", "ep", "etp", "vpp", "mbs", "sp",
                                   "recompute", "dp", "x", ""]),
                  st.one_of(NUMBER_TEXT, st.sampled_from(["true", "no", "full", "none"])))
        .map(lambda kv: f"{kv[0]}={kv[1]}"),
        st.text(max_size=5),
    ),
    max_size=5,
).map(",".join)


@FUZZ
@given(command=st.sampled_from(["check", "explain", "placement"]), layout=LAYOUT_TEXT)
def test_layout_strings(tiny_model: str, command: str, layout: str) -> None:
    argv = set_option(_command(command, tiny_model), "--layout", layout)
    check_outcome(run_cli(*argv), check_cmd=command == "check")


def _mutated(base: dict[str, Any], data: st.DataObject, keys: list[str]) -> dict[str, Any]:
    out = dict(base)
    for key in data.draw(st.lists(st.sampled_from(keys), min_size=1, max_size=3)):
        if data.draw(st.booleans()) and key in out and data.draw(st.booleans()):
            del out[key]
        else:
            out[key] = data.draw(BAD_VALUES)
    return out


def _dump_json(document: Any) -> str:
    try:
        return json.dumps(document)
    except ValueError:  # an integer too long for str(): write what a user's file would hold
        return "{\"num_hidden_layers\": " + "9" * 5000 + "}"


RAW_FILES = st.one_of(
    st.binary(max_size=64),
    st.sampled_from([b"\xff\xfe\x80bad", b"[" * 5000 + b"]" * 5000, b"{\"a\":" * 3000 + b"1"
                     + b"}" * 3000, b"a: &a [1]\nb: [*a, *a]\n", b"null", b"- 1\n",
                     b"!!python/object/apply:os.system ['true']\n"]),
)


@FUZZ
@given(data=st.data(), command=st.sampled_from(["check", "explain", "search"]),
       raw=st.booleans(), suffix=st.sampled_from([".json", ".yaml"]))
def test_model_files(tmp_path: Path, data: st.DataObject, command: str, raw: bool,
                     suffix: str) -> None:
    config = json.loads(HF_CONFIG.read_text())
    path = tmp_path / f"config{suffix}"
    if raw:
        path.write_bytes(data.draw(RAW_FILES))
    elif suffix == ".json":
        keys = [k for k, v in config.items() if isinstance(v, int | float)] + ["model_type"]
        path.write_text(_dump_json(_mutated(config, data, keys)))
    else:
        path.write_text(json.dumps(_mutated(TINY_MODEL, data, [*TINY_MODEL, "head_dim",
                                                                "num_query_groups"])))
    argv = set_option(_command(command, str(path)), "--gpus", "8")
    check_outcome(run_cli(*argv), check_cmd=command == "check")


@FUZZ
@given(data=st.data(), command=st.sampled_from(["cluster", "explain", "placement"]),
       raw=st.booleans())
def test_cluster_files(tmp_path: Path, tiny_model: str, data: st.DataObject, command: str,
                       raw: bool) -> None:
    base = yaml.safe_load(CLUSTER_FILE.read_text())
    path = tmp_path / "cluster.yaml"
    if raw:
        path.write_bytes(data.draw(RAW_FILES))
    else:
        keys = [k for k in base if k not in ("sources", "description")] + ["gpus_per_pod"]
        text = json.dumps(_mutated(base, data, keys), default=str)  # JSON is YAML
        path.write_text(text.replace("NaN", ".nan").replace("-Infinity", "-.inf")
                        .replace("Infinity", ".inf"))
    argv = _command(command, tiny_model)
    argv = ["cluster", "show", str(path), *argv[3:]] if command == "cluster" else \
        set_option(argv, "--cluster", str(path))
    check_outcome(run_cli(*argv))


def _paths(tmp: Path) -> list[str]:
    (tmp / "folder.png").mkdir(exist_ok=True)
    (tmp / "file.txt").write_text("not a database\n")
    return [f"{tmp}/front.html", str(tmp), f"{tmp}/missing/f.png", "/proc/front.png",
            f"{tmp}/folder.png", f"{tmp}/file.txt/f.png", f"{tmp}/{'x' * 300}.png",
            f"{tmp}/front.txt", "", f"{tmp}/a\x00.png"]


@settings(FUZZ, max_examples=20)
@given(index=st.integers(0, 9))
def test_plot_paths(tmp_path: Path, tiny_model: str, index: int) -> None:
    plot = _paths(tmp_path)[index]
    check_outcome(run_cli(*_command("pareto", tiny_model), "--plot", plot))


@settings(FUZZ, max_examples=25)
@given(url=st.sampled_from([
    "sqlite:///{tmp}/missing/x.db", "sqlite:///{tmp}/file.txt", "sqlite:///{tmp}",
    "sqlite:////proc/x.db", "journal:", "journal:{tmp}", "journal:{tmp}/missing/x.log",
    "postgresql://user:s3cret@127.0.0.1:1/db", "foo://bar", "not a url", "",
    "sqlite:///{tmp}/" + "x" * 300 + ".db", "mysql://user:s3cret@127.0.0.1:1/db",
    "journal:{tmp}/ok.log",
]), name=st.sampled_from([None, "s", ""]))
def test_storage_urls(tmp_path: Path, tiny_model: str, url: str, name: str | None) -> None:
    _paths(tmp_path)
    argv = set_option(set_option(_command("pareto", tiny_model), "--method", "optuna"),
                      "--n-trials", "3")
    argv += ["--storage", url.replace("{tmp}", str(tmp_path))]
    if name is not None:
        argv += ["--study-name", name]
    result = run_cli(*argv)
    check_outcome(result)
    assert "s3cret" not in result.out + result.err


CELLS = st.sampled_from(["", "abc", "0", "-1", "nan", "inf", "1e400", "9" * 30, "1.5",
                         "yes", "no", "BF16", "é"])


@settings(FUZZ, max_examples=25)
@given(data=st.data(), fmt=st.sampled_from(["table", "json"]))
def test_validation_csvs(tmp_path: Path, data: st.DataObject, fmt: str) -> None:
    lines = RUNS_CSV.read_text().splitlines()
    header, rows = lines[0].split(","), lines[1:6]
    import csv
    import io

    table = list(csv.reader(io.StringIO("\n".join(rows))))
    for _ in range(data.draw(st.integers(1, 4))):
        row = data.draw(st.sampled_from(table))
        row[data.draw(st.integers(0, len(header) - 1))] = data.draw(CELLS)
    out = io.StringIO()
    csv.writer(out).writerows([header, *table])
    path = tmp_path / "runs.csv"
    path.write_text(out.getvalue())
    check_outcome(run_cli("validate", "--data", str(path), "--format", fmt),
                  inputs=path.read_text())


SERVE_OPTIONS = ["--gpus", "--isl", "--osl", "--ttft-ms", "--tpot-ms", "--concurrency",
                 "--request-rate", "--max-batch", "--top"]


@settings(FUZZ, max_examples=15)
@given(option=st.sampled_from(SERVE_OPTIONS), value=NUMBER_TEXT)
def test_serve_options(tiny_model: str, option: str, value: str) -> None:
    argv = ["serve", "--model", tiny_model, "--cluster", "dgx-h100", "--gpus", "8", "--isl",
            "128", "--osl", "64", "--top", "2", "--format", "json"]
    check_outcome(run_cli(*set_option(argv, option, value)))


@settings(FUZZ, max_examples=8)
@given(option=st.sampled_from(["--gpus", "--global-batch", "--seq-len", "--top"]),
       value=st.one_of(NUMBER_TEXT, st.lists(NUMBER_TEXT, min_size=2, max_size=3)
                       .map(",".join)))
def test_sweep_lists(tmp_path: Path, tiny_model: str, option: str, value: str) -> None:
    argv = ["sweep", "--models", tiny_model, "--clusters", "dgx-h100", "--gpus", "8",
            "--global-batch", "16", "--seq-len", "512", "--top", "2", "--format", "json",
            "--storage", f"sqlite:///{tmp_path}/sweep.db"]
    check_outcome(run_cli(*set_option(argv, option, value)))


@settings(FUZZ, max_examples=8)
@given(cells=st.lists(st.tuples(st.integers(0, 7), NUMBER_TEXT), min_size=1, max_size=3))
def test_calibrate_measurement_tables(tmp_path: Path, cells: list[tuple[int, str]]) -> None:
    rows = [["llama3-8b", "dgx-h100", "16", "128", "8192", "bf16", layout, tokens]
            for layout, tokens in (("tp=2", "9000"), ("tp=4", "8000"), ("tp=1", "9500"))]
    for column, value in cells:
        rows[column % 3][column] = value.replace('"', "")
    header = "model,cluster,num_gpus,global_batch,seq_len,precision,layout,tokens_per_s_per_gpu"
    path = tmp_path / "runs.csv"
    path.write_text("\n".join([header, *(",".join(f'"{c}"' for c in r) for r in rows)]) + "\n")
    result = run_cli("calibrate", "--measurements", str(path), "--out",
                     str(tmp_path / "mine.yaml"), "--format", "json")
    assert result.code in (0, 2, 3), result  # 3: a fitted factor ended on its bound
    if result.code in (0, 3):
        assert json.loads(result.out)["failed"] == (result.code == 3)
    assert "Traceback" not in result.err
    if result.code == 2:  # the error first; the reason of each input left out after it
        first, *detail = result.err.strip().splitlines()
        assert ": error:" in first and all(line.startswith("  ") for line in detail)
    if result.out.strip():
        json.loads(result.out, parse_constant=_reject)


# --------------------------------------------------------------------------- named cases


def test_names_too_long_for_a_file_name_are_unknown_names() -> None:
    """Found by test_calibrate_measurement_tables: a 5,000-character model cell made the
    file-existence check raise OSError (ENAMETOOLONG) from deep inside; cluster and
    efficiency-profile names went through the same kind of check."""
    long = "1" * 5000
    base = {"--model": "llama3-8b", "--cluster": "dgx-h100"}
    for option, expected in (("--model", "unknown model preset"),
                             ("--cluster", "unknown cluster"),
                             ("--efficiency", "unknown efficiency profile")):
        args = {**base, option: long}
        result = run_cli("explain", *(x for kv in args.items() for x in kv), "--gpus", "8",
                         "--global-batch", "8", "--seq-len", "1024", "--layout", "tp=1")
        assert_one_line_error(result, expected)
    assert len(run_cli("explain", "--model", long, "--cluster", "dgx-h100", "--gpus", "8",
                       "--global-batch", "8", "--seq-len", "1024").err) < 400


def test_float_options_refuse_nan_and_infinity(tiny_model: str) -> None:
    for value in ("nan", "inf", "1e400"):
        result = run_cli(*_command("search", tiny_model), "--weight-bytes", value)
        assert_one_line_error(result, "--weight-bytes", "finite")


def test_sizes_name_their_bound(tiny_model: str, tmp_path: Path) -> None:
    assert_one_line_error(run_cli(*set_option(_command("search", tiny_model), "--gpus", "1048576")),
                          "--gpus", "131,072")
    assert_one_line_error(run_cli(*_command("pareto", tiny_model), "--n-trials", "1000000000"),
                          "--n-trials", "100,000")
    config = json.loads(HF_CONFIG.read_text()) | {"num_hidden_layers": 10**12}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert_one_line_error(run_cli(*_command("check", str(path))), "num_hidden_layers", "256")


def test_seed_must_be_in_the_samplers_range(tiny_model: str) -> None:
    for seed in ("-1", str(2**32)):
        assert_one_line_error(run_cli(*_command("pareto", tiny_model), "--seed", seed),
                              "--seed", "4,294,967,295")


def test_output_path_checked_before_any_work(tiny_model: str, tmp_path: Path) -> None:
    # A folder where the file should go: refused at parse time, not after the scan.
    result = run_cli(*_command("pareto", tiny_model), "--plot", str(tmp_path))
    assert_one_line_error(result, "--plot", "folder")
    result = run_cli(*_command("pareto", tiny_model), "--plot", f"{tmp_path}/no/front.png")
    assert_one_line_error(result, "--plot", "does not exist")


def test_storage_errors_hide_the_password(tiny_model: str) -> None:
    result = run_cli(*_command("pareto", tiny_model), "--method", "optuna", "--storage",
                     "foo://user:s3cret@host/db")
    assert_one_line_error(result, "--storage", "user:***@host")
    assert "s3cret" not in result.err


def test_undecodable_and_deeply_nested_files(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(b"\xff\xfe{\x80}")
    assert_one_line_error(run_cli(*_command("check", str(path))), "UTF-8")
    path.write_text("[" * 100_000 + "]" * 100_000)
    assert_one_line_error(run_cli(*_command("check", str(path))), "nested deeper")
    cluster = tmp_path / "c.yaml"
    cluster.write_bytes(b"name: \xff\n")
    assert_one_line_error(run_cli("cluster", "show", str(cluster), "--gpus", "8"), "UTF-8")


def test_strict_json_turns_nan_into_null_with_a_reason() -> None:
    document = strict_json({"a": math.nan, "b": [1.0, math.inf], "c": {"d": 2.0}})
    assert document["a"] is None and document["b"] == [1.0, None]
    assert set(document["null_reasons"]) == {"a", "b[1]"}
    json.dumps(document, allow_nan=False)


def test_validate_skips_rows_with_blank_cells_with_a_reason() -> None:
    result = run_cli("validate", "--data", str(INDEPENDENT_CSV), "--format", "json")
    assert result.code == 0, result.err
    report = json.loads(result.out, parse_constant=_reject)
    blank = [s for s in report["skipped"] if "global_batch_size is blank" in s["reason"]]
    assert len(blank) == 4  # i0034-i0037 give no batch size
    assert report["summary"]["n"] >= 1
