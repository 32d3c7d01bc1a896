"""Measured runs of the user's own cluster: CSV/YAML tables and Megatron logs.

A table row (CSV column or YAML key) gives ``model, cluster, num_gpus,
global_batch, seq_len, precision, layout`` (the ``--layout`` string, e.g.
``"tp=4,pp=2,sp=true,mbs=1,recompute=selective"``) and the measurement,
``tokens_per_s_per_gpu`` or ``step_time_s`` (seconds per optimizer step),
plus optional columns for the features the run turned on
(:data:`OPTION_COLUMNS`, :data:`TRAINING_COLUMNS`).  A blank cell means "not
stated" and takes the default.  ``model`` and ``cluster`` may be left out when
the command line gives them.

Megatron logs (:mod:`parsearch.validation.user.megatron_logs`) give one
measurement per constant-batch stretch of each run; the layout, batch,
sequence length, precision and features come from the arguments block, and
what the log does not say from the command line.

Every row or run that cannot be read gives one line in ``problems`` (the
others are still used): file, row or run, field, value and rule.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from parsearch.cost.kernels import CUDA_GRAPH_SCOPES
from parsearch.cost.options import FLEX_BACKENDS, MOE_DISPATCHERS
from parsearch.cost.quantization import FP8_RECIPE_CHOICES
from parsearch.errors import ParsearchError, SpecError
from parsearch.files import is_dir, is_file
from parsearch.layout import Layout, parse_layout_string
from parsearch.model.offload_modules import OFFLOAD_MODULES
from parsearch.model.specs import FSDP_STRATEGIES, PRECISIONS, RECOMPUTE_MODULES
from parsearch.validation.published.recipes import graph_scope, priced_fp8_recipe
from parsearch.validation.user.megatron_logs import (
    CSV_ROUTE,
    WARMUP_ITERATIONS,
    LogError,
    LogRun,
    read_megatron_log,
    steady_states,
)

REQUIRED_COLUMNS: tuple[str, ...] = ("num_gpus", "global_batch", "seq_len", "precision",
                                     "layout")
MEASURE_COLUMNS: tuple[str, ...] = ("tokens_per_s_per_gpu", "step_time_s")
#: The range of step times a measurement may imply: a kernel launch at least, a week at
#: most (beyond either the number is in the wrong unit, and its logarithm overflows the fit).
MIN_STEP_S, MAX_STEP_S = 1e-6, 7 * 24 * 3600.0
#: Most measurements one command reads: every fit prices each run, and leave-one-run-out
#: refits once per run, so calibrate's time grows with the square of the count (50 runs:
#: minutes).  More is refused before any work (repeats of one layout belong in one row).
MAX_MEASUREMENTS = 50
#: Optional columns that set :class:`~parsearch.cost.options.CostOptions` fields.
OPTION_COLUMNS: tuple[str, ...] = ("moe_dispatcher", "moe_flex_backend", "tp_comm_overlap",
                                   "moe_a2a_overlap", "moe_shared_expert_overlap",
                                   "overlap_grad_reduce", "overlap_param_gather", "cuda_graphs",
                                   "cuda_graph_scope", "fp8_recipe", "grad_reduce_bytes",
                                   "param_gather_bytes", "moe_imbalance", "fused_expert_mlp")
#: Optional columns that set :class:`~parsearch.model.specs.TrainingSpec` fields.
TRAINING_COLUMNS: tuple[str, ...] = ("fsdp", "fsdp_strategy", "distributed_optimizer",
                                     "recompute_num_layers",
                                     "recompute_modules", "pipeline_layout", "grad_bytes",
                                     "activation_offload_layers", "offload_modules")
OTHER_COLUMNS: tuple[str, ...] = ("id", "model", "cluster", "notes")
KNOWN_COLUMNS = frozenset((*REQUIRED_COLUMNS, *MEASURE_COLUMNS, *OPTION_COLUMNS,
                           *TRAINING_COLUMNS, *OTHER_COLUMNS))
_BOOL_COLUMNS = frozenset({"tp_comm_overlap", "moe_a2a_overlap", "moe_shared_expert_overlap",
                           "overlap_grad_reduce",
                           "overlap_param_gather", "cuda_graphs", "fsdp",
                           "distributed_optimizer", "fused_expert_mlp"})
#: Columns that take one of a fixed set of words (case-insensitive).
_CHOICE_COLUMNS: dict[str, tuple[str, ...]] = {"moe_dispatcher": MOE_DISPATCHERS,
                                              "moe_flex_backend": FLEX_BACKENDS,
                                              "fp8_recipe": FP8_RECIPE_CHOICES,
                                              "fsdp_strategy": FSDP_STRATEGIES}
_FLOAT_COLUMNS = frozenset({"grad_reduce_bytes", "param_gather_bytes", "moe_imbalance",
                            "grad_bytes"})
_INT_COLUMNS = frozenset({"recompute_num_layers", "activation_offload_layers"})
#: Columns that list module names, and the names each takes.
_MODULE_COLUMNS: dict[str, tuple[str, ...]] = {"recompute_modules": RECOMPUTE_MODULES,
                                               "offload_modules": OFFLOAD_MODULES}
TABLE_SUFFIXES = frozenset({".csv", ".yaml", ".yml"})


@dataclass(frozen=True)
class Measurement:
    """One measured run: what ran and its throughput."""

    source: str
    model: str | None
    cluster: str | None
    layout: Layout
    global_batch: int
    seq_len: int
    precision: str
    tokens_per_s_per_gpu: float
    options: dict[str, Any] = field(default_factory=dict)
    training: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    #: What a log states about the model (``num_layers``, ``hidden_size``), to check ``--model``.
    model_facts: dict[str, int] = field(default_factory=dict)

    @property
    def step_time_s(self) -> float:
        return self.global_batch * self.seq_len / (self.tokens_per_s_per_gpu
                                                   * self.layout.num_gpus)


@dataclass(frozen=True)
class Defaults:
    """What the command line supplies where a measurement does not say."""

    model: str | None = None
    cluster: str | None = None
    layout: str | None = None
    num_gpus: int | None = None
    seq_len: int | None = None
    precision: str | None = None
    warmup_iterations: int = WARMUP_ITERATIONS


@dataclass(frozen=True)
class Loaded:
    """Measurements read, one line per input that gave none, and notes."""

    measurements: tuple[Measurement, ...]
    problems: tuple[str, ...]
    notes: tuple[str, ...] = ()


def _flag(where: str, name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise SpecError(f"{where}: {name}={value!r} is not a boolean; use true or false")


def _positive(where: str, name: str, value: Any, kind: type = int) -> Any:
    try:
        number = kind(str(value).strip()) if kind is int else float(value)
    except (TypeError, ValueError):
        what = "an integer" if kind is int else "a number"
        raise SpecError(f"{where}: {name}={value!r} is not {what}") from None
    if not (math.isfinite(number) and number > 0):
        raise SpecError(f"{where}: {name}={value!r} must be positive")
    return number


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _module_list(where: str, name: str, value: Any, known: tuple[str, ...]) -> tuple[str, ...]:
    """A blank- or comma-separated list of module names, each one of ``known``."""
    names = tuple(m for m in str(value).replace(",", " ").split() if m)
    bad = [m for m in names if m not in known]
    if bad:
        raise SpecError(f"{where}: {name} has unknown module(s) {', '.join(bad)}; known: "
                        f"{', '.join(known)}")
    return names


def _extras(where: str, row: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    options: dict[str, Any] = {}
    training: dict[str, Any] = {}
    for name in (*OPTION_COLUMNS, *TRAINING_COLUMNS):
        value = row.get(name)
        if _blank(value):
            continue
        target = options if name in OPTION_COLUMNS else training
        if name in _BOOL_COLUMNS:
            target[name] = _flag(where, name, value)
        elif name in _FLOAT_COLUMNS:
            target[name] = _positive(where, name, value, float)
        elif name in _INT_COLUMNS:
            target[name] = _positive(where, name, value)
        elif name in _CHOICE_COLUMNS:
            text = str(value).strip().lower()
            if text not in _CHOICE_COLUMNS[name]:
                raise SpecError(f"{where}: {name}={value!r} is not one of "
                                f"{', '.join(_CHOICE_COLUMNS[name])}")
            target[name] = text
        elif name == "cuda_graph_scope":
            scopes = tuple(s for s in str(value).replace(",", " ").split() if s)
            bad = [s for s in scopes if s not in CUDA_GRAPH_SCOPES]
            if bad:
                raise SpecError(f"{where}: cuda_graph_scope has unknown scope(s) "
                                f"{', '.join(bad)}; known: {', '.join(CUDA_GRAPH_SCOPES)} "
                                "(blank: the whole layer)")
            target[name] = scopes
        elif name in _MODULE_COLUMNS:  # recompute / fine-grained offload module lists
            target[name] = _module_list(where, name, value, _MODULE_COLUMNS[name])
        else:
            target[name] = str(value).strip()
    if options.get("cuda_graph_scope") and not options.get("cuda_graphs"):
        raise SpecError(f"{where}: cuda_graph_scope is set but cuda_graphs is not true; set "
                        "cuda_graphs=true or leave the scope blank")
    return options, training


def measurement_from_row(row: Mapping[str, Any], where: str, defaults: Defaults) -> Measurement:
    """One table row; raises :class:`SpecError` naming the field, value and rule."""
    unknown = sorted(str(k) for k in row if str(k) not in KNOWN_COLUMNS)
    if unknown:
        raise SpecError(f"{where}: unknown column(s) {', '.join(unknown)}; known: "
                        f"{', '.join(sorted(KNOWN_COLUMNS))}")
    missing = [c for c in REQUIRED_COLUMNS if _blank(row.get(c))]
    if missing:
        raise SpecError(f"{where}: missing {', '.join(missing)}")
    num_gpus = _positive(where, "num_gpus", row["num_gpus"])
    precision = str(row["precision"]).strip().lower()
    if precision not in PRECISIONS:
        raise SpecError(f"{where}: precision={row['precision']!r} is not one of "
                        f"{', '.join(PRECISIONS)}")
    layout = parse_layout_string(str(row["layout"]), num_gpus=num_gpus)
    global_batch = _positive(where, "global_batch", row["global_batch"])
    seq_len = _positive(where, "seq_len", row["seq_len"])
    given = [c for c in MEASURE_COLUMNS if not _blank(row.get(c))]
    if len(given) != 1:
        raise SpecError(f"{where}: give exactly one of tokens_per_s_per_gpu or step_time_s "
                        f"(got {', '.join(given) or 'neither'})")
    if given[0] == "tokens_per_s_per_gpu":
        tokens = _positive(where, "tokens_per_s_per_gpu", row["tokens_per_s_per_gpu"], float)
        step_s = global_batch * seq_len / (tokens * num_gpus)
    else:  # the step is checked as given: a huge one would make the tokens underflow to 0
        step_s = _positive(where, "step_time_s", row["step_time_s"], float)
        tokens = global_batch * seq_len / (step_s * num_gpus)
    if not (math.isfinite(step_s) and MIN_STEP_S <= step_s <= MAX_STEP_S):
        implied = f"{step_s:.3g} s" if math.isfinite(step_s) else "more seconds than a float holds"
        raise SpecError(
            f"{where}: {given[0]}={row[given[0]]!r} means a step of {implied}; a measured "
            f"step takes between {MIN_STEP_S:g} s and {MAX_STEP_S:g} s (a week): check the "
            "unit (tokens per second per GPU, or seconds per optimizer step)")
    options, training = _extras(where, row)
    model = None if _blank(row.get("model")) else str(row["model"]).strip()
    cluster = None if _blank(row.get("cluster")) else str(row["cluster"]).strip()
    name = where if _blank(row.get("id")) else f"{where} ({str(row['id']).strip()})"
    return Measurement(name, model or defaults.model, cluster or defaults.cluster, layout,
                       global_batch, seq_len, precision, tokens, options, training)


def _table_rows(path: Path) -> list[tuple[str, Mapping[str, Any]]]:
    try:
        text = path.read_text(encoding="utf-8-sig")  # a spreadsheet's byte-order mark
    except (OSError, UnicodeDecodeError) as error:
        raise SpecError(f"{path}: cannot read it: {error}") from None
    if path.suffix.lower() == ".csv":
        lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
        reader = csv.DictReader(lines)
        try:
            header = reader.fieldnames
        except csv.Error as error:
            raise SpecError(f"{path}: not a readable CSV: {error}") from None
        unknown = sorted(repr(c.strip()) for c in header or () if c.strip() not in KNOWN_COLUMNS)
        if unknown:
            raise SpecError(f"{path}: unknown column(s) {', '.join(unknown)}; known: "
                            f"{', '.join(sorted(KNOWN_COLUMNS))}")
        rows = []
        try:
            for number, row in enumerate(reader, start=2):
                if None in row:
                    raise SpecError(f"{path} row {number}: more cells than header columns")
                rows.append((f"{path} row {number}", {k.strip(): v for k, v in row.items()
                                                      if k is not None}))
        except csv.Error as error:
            raise SpecError(f"{path}: not a readable CSV: {error}") from None
        return rows
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise SpecError(f"{path}: not valid YAML: {str(error).splitlines()[0]}") from None
    except (ValueError, RecursionError) as error:  # e.g. nesting deeper than Python's stack
        raise SpecError(f"{path}: not valid YAML: {type(error).__name__}") from None
    if isinstance(data, dict) and "measurements" in data:
        data = data["measurements"]
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise SpecError(f"{path}: expected a list of measurements (mappings), or a mapping "
                        "with a `measurements` list")
    return [(f"{path} item {i}", r) for i, r in enumerate(data, start=1)]


# --- Megatron logs ---------------------------------------------------------------------------

def _arg(run: LogRun, name: str) -> str | None:
    value = run.arguments.get(name)
    if value is None or value.strip() in ("", "None", "null", "~"):
        return None
    return value.strip()


def _arg_int(run: LogRun, name: str, default: int | None = None) -> int | None:
    value = _arg(run, name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise SpecError(f"{run.name}: argument {name}={value!r} is not an integer") from None


def _arg_flag(run: LogRun, name: str) -> bool | None:
    value = _arg(run, name)
    return None if value is None else value.lower() in ("true", "1", "yes")


def _log_precision(run: LogRun, notes: list[str]) -> str | None:
    if _arg(run, "fp4") is not None:
        return "fp4"
    if _arg(run, "fp8") is not None:
        return "fp8"
    if _arg_flag(run, "bf16"):
        return "bf16"
    if _arg_flag(run, "fp16"):
        notes.append("fp16 priced as bf16 (same tensor-core peak)")
        return "bf16"
    return None


def _missing(run: LogRun, defaults: Defaults, precision: str | None) -> list[tuple[str, str]]:
    """(what the log does not state, the option that supplies it)."""
    out = []
    if _arg(run, "world_size") is None and defaults.num_gpus is None:
        out.append(("world_size", "--gpus"))
    if _arg(run, "tensor_model_parallel_size") is None and defaults.layout is None:
        out.append(("the parallel layout", "--layout"))
    if _arg(run, "seq_length") is None and defaults.seq_len is None:
        out.append(("seq_length", "--seq-len"))
    if precision is None and defaults.precision is None:
        out.append(("the precision", "--precision"))
    return out


def _log_layout(run: LogRun, num_gpus: int, defaults: Defaults) -> Layout:
    tp = _arg_int(run, "tensor_model_parallel_size")
    if tp is None:
        if defaults.layout is None:
            raise SpecError(f"{run.name}: the log has no arguments block "
                            "(tensor_model_parallel_size ...); pass --layout and --gpus")
        return parse_layout_string(defaults.layout, num_gpus=num_gpus)
    recompute = (_arg(run, "recompute_granularity") or "none").lower()
    if recompute not in ("none", "selective", "full"):
        raise SpecError(f"{run.name}: recompute_granularity={recompute!r} is not "
                        "selective or full")
    etp = _arg_int(run, "expert_tensor_parallel_size")
    return Layout(
        num_gpus=num_gpus, tp=tp, pp=_arg_int(run, "pipeline_model_parallel_size", 1) or 1,
        cp=_arg_int(run, "context_parallel_size", 1) or 1,
        ep=_arg_int(run, "expert_model_parallel_size", 1) or 1,
        # Megatron-Core: expert_tensor_parallel_size defaults to tensor_model_parallel_size.
        etp=etp if etp is not None else (tp if _arg_int(run, "num_experts") else 1),
        vpp=_arg_int(run, "virtual_pipeline_model_parallel_size", 1) or 1,
        mbs=_arg_int(run, "micro_batch_size", 1) or 1,
        sp=bool(_arg_flag(run, "sequence_parallel")), recompute=recompute,  # type: ignore[arg-type]
    )


def _log_options(run: LogRun) -> tuple[dict[str, Any], dict[str, Any]]:
    options: dict[str, Any] = {}
    training: dict[str, Any] = {}
    dispatcher = _arg(run, "moe_token_dispatcher_type")
    if dispatcher in MOE_DISPATCHERS:
        options["moe_dispatcher"] = dispatcher
    backend = (_arg(run, "moe_flex_dispatcher_backend") or "").lower()
    if dispatcher == "flex" and backend in FLEX_BACKENDS:
        options["moe_flex_backend"] = backend
    for arg, name in (("tp_comm_overlap", "tp_comm_overlap"),
                      ("overlap_grad_reduce", "overlap_grad_reduce"),
                      ("overlap_param_gather", "overlap_param_gather"),
                      ("overlap_moe_expert_parallel_comm", "moe_a2a_overlap"),
                      ("moe_shared_expert_overlap", "moe_shared_expert_overlap"),
                      # the fused expert MLP (parsearch.cost.fused_mlp)
                      ("use_transformer_engine_op_fuser", "fused_expert_mlp")):
        flag = _arg_flag(run, arg)
        if flag is not None:
            options[name] = flag
    graphs = _arg(run, "cuda_graph_impl")
    if graphs is not None:
        options["cuda_graphs"] = graphs.lower() != "none"
        if graphs.lower() in ("local", "full_iteration"):  # else transformer_engine
            options["cuda_graph_impl"] = graphs.lower()
    elif _arg_flag(run, "enable_cuda_graph") is not None:
        options["cuda_graphs"] = bool(_arg_flag(run, "enable_cuda_graph"))
        options["cuda_graph_impl"] = "local"  # --enable-cuda-graph: the local implementation
    if "full_iteration" in (_arg(run, "cuda_graph_scope") or "") and options.get("cuda_graphs"):
        # the deprecated local scope full_iteration is the full-iteration graph (Megatron-LM
        # docs/user-guide/features/cuda_graph.md migration table)
        options["cuda_graph_impl"] = "full_iteration"
    recipe = priced_fp8_recipe(_arg(run, "fp8_recipe")) if _arg(run, "fp8") else None
    if recipe is not None:  # Megatron --fp8-recipe (only read when --fp8-format is set)
        options["fp8_recipe"] = recipe
    scope = graph_scope(_arg(run, "cuda_graph_modules") or _arg(run, "cuda_graph_scope") or "")
    if options.get("cuda_graphs") and scope:
        options["cuda_graph_scope"] = scope
    distributed = _arg_flag(run, "use_distributed_optimizer")
    if distributed is not None:
        training["distributed_optimizer"] = distributed
    if (_arg(run, "recompute_method") or "").lower() == "block":
        layers = _arg_int(run, "recompute_num_layers")
        if layers:
            training["recompute_num_layers"] = layers
    layout = _arg(run, "pipeline_model_parallel_layout")
    if layout:
        training["pipeline_layout"] = layout.strip("'\"")
    return options, training


def measurements_from_log(path: Path, defaults: Defaults) -> Loaded:
    """One measurement per usable constant-batch stretch of every run in the log."""
    try:
        runs = read_megatron_log(path)
    except LogError as error:
        return Loaded((), (str(error),))
    found: list[Measurement] = []
    problems: list[str] = []
    notes: list[str] = []
    for run in runs:
        readings, run_notes = steady_states(run, defaults.warmup_iterations)
        notes.extend(run_notes)
        if not run.iterations:
            problems.append(f"{run.name}: arguments but no iteration lines (the run died "
                            f"before its first logged iteration); {CSV_ROUTE}")
            continue
        if not readings:
            problems.append(f"{run.name}: no steady-state iterations to measure "
                            f"({len(run.iterations)} logged line(s), the first "
                            f"{defaults.warmup_iterations} iterations are warm-up; pass "
                            "--warmup-iterations 0 if they were already past it)")
            continue
        own: list[str] = []
        precision = _log_precision(run, own)
        missing = _missing(run, defaults, precision)
        if missing:
            problems.append(f"{run.name}: the log does not state "
                            f"{', '.join(w for w, _ in missing)}; pass "
                            f"{' '.join(o for _, o in missing)}")
            continue
        try:
            num_gpus = int(_arg_int(run, "world_size") or defaults.num_gpus or 0)
            layout = _log_layout(run, num_gpus, defaults)
            seq_len = int(_arg_int(run, "seq_length") or defaults.seq_len or 0)
            options, training = _log_options(run)
            facts = {name: value for name in ("num_layers", "hidden_size")
                     if (value := _arg_int(run, name)) is not None}
        except ParsearchError as error:
            problems.append(str(error))
            continue
        precision = precision or defaults.precision or "bf16"
        for reading in readings:
            batch = reading.global_batch or _arg_int(run, "global_batch_size") or 0
            if not batch:
                problems.append(f"{reading.name}: no global batch size in the log")
                continue
            step = reading.step_time_s
            if not (math.isfinite(step) and MIN_STEP_S <= step <= MAX_STEP_S):
                problems.append(f"{reading.name}: a median step of {step:.3g} s is not a "
                                f"measured step ({MIN_STEP_S:g} s to {MAX_STEP_S:g} s); "
                                "check the log's elapsed-time field")
                continue
            tokens = batch * seq_len / (step * num_gpus)
            found.append(Measurement(
                reading.name, defaults.model, defaults.cluster, layout, batch, seq_len,
                precision, tokens, options, dict(training),
                tuple(own) + reading.notes
                + (f"median of {reading.lines_used} lines, interquartile spread "
                   f"{reading.spread:.1%}",), facts))
    return Loaded(tuple(found), tuple(problems), tuple(notes))


def one_line(text: str) -> str:
    """``text`` with line breaks (from a file's own content) turned into spaces."""
    return " ".join(text.splitlines())


def short_path(path: Path) -> str:
    """``path`` as text, shortened to 120 characters (an over-long name is not worth printing
    whole)."""
    text = str(path)
    return text if len(text) <= 120 else text[:117] + "..."


def load_measurements(paths: Iterable[str | Path], defaults: Defaults | None = None) -> Loaded:
    """Every measurement in ``paths``: ``.csv``/``.yaml`` tables, anything else a log."""
    defaults = defaults or Defaults()
    found: list[Measurement] = []
    problems: list[str] = []
    notes: list[str] = []
    for raw in paths:
        path = Path(raw)
        if not is_file(path):
            problems.append(f"{short_path(path)}: " + ("a folder, not a file" if is_dir(path)
                                                       else "no such file"))
            continue
        if path.suffix.lower() not in TABLE_SUFFIXES:
            loaded = measurements_from_log(path, defaults)
            found += loaded.measurements
            problems += loaded.problems
            notes += loaded.notes
            continue
        try:
            rows = _table_rows(path)
        except ParsearchError as error:
            problems.append(str(error))
            continue
        if not rows:
            problems.append(f"{path}: no measurements in it")
        for where, row in rows:
            try:
                found.append(measurement_from_row(row, where, defaults))
            except ParsearchError as error:
                problems.append(str(error))
    if len(found) > MAX_MEASUREMENTS:
        raise SpecError(f"{len(found):,} measurements read; at most {MAX_MEASUREMENTS} are "
                        "used (calibrate's time grows with the square of the count): average "
                        "the repeated runs of each layout into one row (tokens_per_s_per_gpu "
                        "or step_time_s), or pass fewer files")
    return Loaded(tuple(found), tuple(one_line(p) for p in problems),
                  tuple(one_line(n) for n in notes))

