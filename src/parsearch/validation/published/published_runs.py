"""Published training runs: the ground truth ``parsearch validate`` compares against.

The dataset (``parsearch/data/published_runs.csv``, provenance in
``PROVENANCE.md`` next to it) lists real runs with their parallel layout and
measured throughput.  :func:`load_published_runs` turns every CSV row into a
frozen :class:`PublishedRun`:

* the layout as a :class:`~parsearch.layout.Layout`, blank cells filled with
  documented defaults (each recorded in ``assumptions``);
* the precision normalised to ``bf16`` / ``fp8`` / ``fp4`` (the original
  string and the FP8 recipe are kept);
* the measurement as tokens/s/GPU.  When a source gives only TFLOP/s or MFU
  it is converted with *that source's own* FLOP count (``conversion`` names
  which one, :data:`~parsearch.validation.published.run_conventions.CONVERSIONS`
  describes it);
* a :class:`~parsearch.model.specs.ModelSpec` (a preset when one matches the
  model name, else built from the row's architecture columns) and the
  cluster preset to run it on;
* ``skip_reason``: why the row cannot be used as ground truth, or ``None``.

The cells are read by :mod:`~parsearch.validation.published.run_cells`, the layout by
:mod:`~parsearch.validation.published.run_layouts`, the model by
:mod:`~parsearch.validation.published.run_models` and the measurement by
:mod:`~parsearch.validation.published.run_conventions`; this module assembles the rows,
reads the file and selects among the runs.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from parsearch.errors import SpecError
from parsearch.layout import Layout
from parsearch.model.specs import TORCHTITAN_OP_SAC, ModelSpec, Precision, TrainingSpec
from parsearch.validation.published.run_cells import (
    Row,
    cell_float,
    cell_int,
    cell_text,
    required_int,
)
from parsearch.validation.published.run_conventions import (
    MBRIDGE_HELDOUT,
    MEGASCALE,
    TORCHTITAN,
    measurement,
    release_of,
    source_tag,
)
from parsearch.validation.published.run_corrections import corrected
from parsearch.validation.published.run_layouts import (
    TITAN_LAYER_SAC_NOTE,
    TITAN_OP_SAC_NOTE,
    build_layout,
    layout_problems,
    normalise_precision,
)
from parsearch.validation.published.run_models import (
    megascale_block,
    resolve_model,
    split_model_name,
)

DATA_PACKAGE = "parsearch.data"
DATA_FILE = "published_runs.csv"
#: The independent references (INDEPENDENT_RUNS.md): never fitted to.
INDEPENDENT_FILE = "independent_runs.csv"

CLUSTER_BY_GPU: dict[str, str] = {
    "A100-SXM-80GB": "dgx-a100",
    "A100-SXM-80GB (Jean Zay)": "jean-zay-a100-80gb",  # 4x Omni-Path 100G per node
    "H100-SXM-80GB": "dgx-h100",
    "H100-SXM-80GB (Eos)": "dgx-h100",
    "B200": "dgx-b200",
    "B300": "dgx-b300",
    "GB200": "gb200-nvl72",
    "GB300": "gb300-nvl72",
    "H200-SXM-141GB": "dgx-h200",
    "H800-SXM-80GB": "hgx-h800",
    # torchtitan's "HBM2e based lower TDP SXM H100(95GB)" at 500 W on Grand Teton hosts:
    # the shipped h100-sxm-94gb-500w part (94 GiB, 2.41 TB/s HBM2e, Ujeniya et al. arXiv
    # 2604.11391; the SXM die at 500 W by parsearch/topology/power.py) on Meta's RoCE
    # fabric.  A user picks this part with --cluster grand-teton-h100-94gb-500w, so its
    # rows are scored against it instead of being skipped.
    "H100-SXM-96GB (Grand Teton, 500W)": "grand-teton-h100-94gb-500w",
}

# GPU labels with no shipped hardware profile, and why none is made up (none at present).
NO_PROFILE_REASONS: dict[str, str] = {}


@dataclass(frozen=True)
class PublishedRun:
    """One published training run, normalised for validation.

    ``measured_tokens_per_s_per_gpu`` is the ground truth; ``conversion``
    says how it was obtained
    (:data:`~parsearch.validation.published.run_conventions.CONVERSIONS`).  ``skip_reason`` is
    ``None`` when the row is usable.  ``assumptions`` lists every default
    the loader filled in for a blank cell.
    """

    id: str
    source: str
    source_tag: str
    source_locator: str
    model: str
    gpu: str
    cluster: str | None
    num_gpus: int
    layout: Layout
    global_batch: int
    seq_len: int
    precision: Precision
    precision_raw: str
    fp8_recipe: str | None
    measured_tokens_per_s_per_gpu: float | None
    measured_tflops_per_gpu: float | None
    measured_mfu: float | None
    conversion: str | None
    verified: str
    notes: str
    model_spec: ModelSpec | None
    model_source: str | None
    release: tuple[int, ...] | None
    assumptions: tuple[str, ...]
    skip_reason: str | None

    @property
    def kept(self) -> bool:
        """True when the row can serve as ground truth."""
        return self.skip_reason is None

    @property
    def is_moe(self) -> bool:
        """True when the resolved model has routed experts."""
        return self.model_spec is not None and self.model_spec.is_moe

    @property
    def base_model(self) -> str:
        """The model name without its parenthesised variant (``"DeepSeekV3"``)."""
        return split_model_name(self.model)[0]

    @property
    def variant(self) -> str | None:
        """The parenthesised variant of the model name (``"tokendrop"``), if any."""
        return split_model_name(self.model)[1]


# --------------------------------------------------------------------------- loading


def parse_row(row: Row) -> PublishedRun:
    """Turn one CSV row (a ``csv.DictReader`` dict) into a :class:`PublishedRun`."""
    source = cell_text(row, "source")
    tag = source_tag(source)
    layout, assumptions = build_layout(row, tag, cell_text(row, "arch_kind") == "moe")
    seq_len = required_int(row, "seq_length")
    global_batch = required_int(row, "global_batch_size")
    model, model_source, model_problem = resolve_model(row)
    if model_source == "row columns":
        assumptions.append("model built from the row's architecture columns")
    if tag == MEGASCALE:
        model_problem = model_problem or megascale_block(row)
        assumptions += ["GPU memory not stated ('NVIDIA Ampere'): A100 80 GB",
                        "precision not stated: BF16"]
    precision, recipe = normalise_precision(cell_text(row, "precision"))
    tokens, conversion = measurement(row, tag, model, layout, seq_len)
    gpu = cell_text(row, "gpu")
    cluster = CLUSTER_BY_GPU.get(gpu)
    problems = layout_problems(layout, model, seq_len, global_batch, cell_int(row, "dp"))
    verified = cell_text(row, "verified")
    skip = _skip_reason(verified, gpu, cluster, model_problem, problems, tokens)
    if skip is None and tag == TORCHTITAN:
        skip = torchtitan_eager_reason(cell_text(row, "notes"))
    return PublishedRun(
        id=cell_text(row, "id"),
        source=source,
        source_tag=tag,
        source_locator=cell_text(row, "source_locator"),
        model=cell_text(row, "model"),
        gpu=gpu,
        cluster=cluster,
        num_gpus=layout.num_gpus,
        layout=layout,
        global_batch=global_batch,
        seq_len=seq_len,
        precision=precision,
        precision_raw=cell_text(row, "precision"),
        fp8_recipe=recipe,
        measured_tokens_per_s_per_gpu=tokens,
        measured_tflops_per_gpu=cell_float(row, "measured_tflops_per_gpu"),
        measured_mfu=cell_float(row, "measured_mfu"),
        conversion=conversion,
        verified=verified,
        notes=cell_text(row, "notes"),
        model_spec=model,
        model_source=model_source,
        release=release_of(source),
        assumptions=tuple(assumptions),
        skip_reason=skip,
    )


def _skip_reason(
    verified: str,
    gpu: str,
    cluster: str | None,
    model_problem: str | None,
    layout_issues: Sequence[str],
    tokens: float | None,
) -> str | None:
    """The first reason (in a fixed order) why a row is not usable, or ``None``."""
    if verified == "no":
        return "verified=no"
    if cluster is None:
        return NO_PROFILE_REASONS.get(gpu, f"unknown GPU {gpu!r}")
    if model_problem is not None:
        return model_problem
    if layout_issues:
        return "layout invalid: " + "; ".join(layout_issues)
    if tokens is None or tokens <= 0:
        return "no measurement"
    return None


def torchtitan_eager_reason(notes: str) -> str | None:
    """Why a torchtitan row that ran eager PyTorch is not scored, or None.

    torchtitan's benchmark tables list each setup's techniques ("techniques: FSDP",
    "FSDP + torch.compile", ...).  Without ``torch.compile`` every elementwise op of the
    block (RMSNorm, SwiGLU, RoPE, residual adds) is its own kernel, reading and writing
    HBM once each; parsearch prices the fused kernels of Transformer Engine (which
    torch.compile's Inductor also fuses), and has no eager-PyTorch stack.  The same
    table's torch.compile row of the same layout is scored instead.
    """
    marker = "techniques:"
    if marker not in notes:
        return None
    # the list ends at the next ";" or sentence end (". "; "torch.compile" keeps its dot)
    techniques = re.split(r";|\.\s", notes.split(marker, 1)[1], maxsplit=1)[0]
    if "compile" in techniques:
        return None
    return (f"eager PyTorch (techniques:{techniques}; no torch.compile): unfused "
            "elementwise kernels, which parsearch does not price; the table's torch.compile "
            "row of this layout is scored")


#: Largest runs file read (the bundled ones are under 1 MB).
MAX_FILE_BYTES = 64 * 2**20


def _read_text(path: str | Path | None) -> str:
    if path is None:
        return resources.files(DATA_PACKAGE).joinpath(DATA_FILE).read_text(encoding="utf-8")
    try:
        file = Path(path)
        if file.is_dir():
            raise SpecError(f"published runs {path}: is a folder, not a CSV file")
        if file.stat().st_size > MAX_FILE_BYTES:
            raise SpecError(f"published runs {path}: over {MAX_FILE_BYTES:,} bytes")
        return file.read_bytes().decode("utf-8-sig")
    except OSError as error:
        raise SpecError(f"published runs {path}: cannot read it ({error.strerror})") from None
    except UnicodeDecodeError as error:
        raise SpecError(f"published runs {path}: not UTF-8 text (byte {error.start}: "
                        f"{error.reason})") from None


def _same_text(a: str, b: str) -> bool:
    """Equal up to line endings (package resources read text with universal newlines)."""
    return a.replace("\r\n", "\n") == b.replace("\r\n", "\n")


@dataclass(frozen=True)
class PublishedRunsFile:
    """The rows of a runs file: the readable runs, and each unreadable row with why."""

    runs: list[PublishedRun]
    unreadable: tuple[tuple[str, str], ...]


def read_published_runs(path: str | Path | None = None) -> PublishedRunsFile:
    """Every row of the dataset (default: the packaged CSV), in file order.

    A row with a blank required cell or a malformed cell is not a run: it is
    listed in ``unreadable`` as ``(id, reason)`` (id ``line N`` when the id
    cell is blank) and the other rows are read.  A file that is not a runs
    CSV at all (unreadable, not UTF-8, required columns missing) raises
    :class:`SpecError`.
    """
    name = path or DATA_FILE
    text = _read_text(path)
    # the bundled rows (from the package or a copy of it) are read with their recorded
    # corrections (parsearch.validation.published.run_corrections)
    bundled = path is None or _same_text(text, _read_text(None))
    try:
        reader = csv.DictReader(io.StringIO(text))
        fieldnames = reader.fieldnames or []
    except csv.Error as error:
        raise SpecError(f"published runs {name}: not a CSV file ({error})") from None
    missing = [c for c in ("id", "model", "num_gpus", "tp", "pp", "global_batch_size",
                           "seq_length") if c not in fieldnames]
    if missing:
        raise SpecError(
            f"published runs {name}: missing column(s) {', '.join(missing)}; "
            "use the columns of the bundled published_runs.csv"
        )
    runs: list[PublishedRun] = []
    unreadable: list[tuple[str, str]] = []
    line = 1
    try:
        for line, row in enumerate(reader, start=2):
            try:
                runs.append(parse_row(corrected(row) if bundled else row))
            except (KeyError, ValueError, TypeError, ArithmeticError) as error:
                row_id = cell_text(row, "id") or f"line {line}"
                reason = str(error) if isinstance(error, SpecError) else repr(error)
                reason = reason.removeprefix(f"published run {row.get('id')}: ")
                unreadable.append((row_id, f"cannot read row: {' '.join(reason.split())[:300]}"))
    except csv.Error as error:
        raise SpecError(f"published runs {name} line {line + 1}: not CSV ({error})") from None
    return PublishedRunsFile(runs, tuple(unreadable))


def load_published_runs(path: str | Path | None = None) -> list[PublishedRun]:
    """The readable rows of the dataset (see :func:`read_published_runs` for the others)."""
    return read_published_runs(path).runs


def load_independent_runs() -> list[PublishedRun]:
    """Every packaged independent row (``independent_runs.csv``): never fitted to."""
    with resources.as_file(resources.files(DATA_PACKAGE).joinpath(INDEPENDENT_FILE)) as path:
        return read_published_runs(path).runs


def load_heldout_runs() -> list[PublishedRun]:
    """The packaged independent rows from Megatron-Bridge's performance tables of models no
    calibration run holds (tag ``MBRIDGE-HELDOUT``): never fitted to."""
    return [run for run in load_independent_runs() if run.source_tag == MBRIDGE_HELDOUT]


# --------------------------------------------------------------------------- selections


def dev_rows(runs: Iterable[PublishedRun]) -> list[PublishedRun]:
    """Rows fit for accuracy checks: verified=yes, not skipped, with a model and a measurement."""
    return [
        run
        for run in runs
        if run.verified == "yes"
        and run.skip_reason is None
        and run.model_spec is not None
        and run.measured_tokens_per_s_per_gpu is not None
    ]


def group_key(run: PublishedRun) -> tuple[str, str, int, int]:
    """Key of the ranking study: runs that competed for the same job."""
    return (run.model, run.gpu, run.num_gpus, run.global_batch)


def dedupe_key(run: PublishedRun) -> tuple[object, ...]:
    """Same model, GPU, precision (and FP8 recipe), layout, batch and sequence length."""
    return (
        run.model,
        run.gpu,
        run.precision,
        run.fp8_recipe,
        run.layout,
        run.global_batch,
        run.seq_len,
    )


def dedupe(runs: Iterable[PublishedRun]) -> list[PublishedRun]:
    """One run per :func:`dedupe_key`: the latest NeMo release wins (first row on ties).

    Rows without a release (papers) rank below any release. Order of the
    survivors follows the input.
    """
    ordered = list(runs)
    best: dict[tuple[object, ...], PublishedRun] = {}
    for run in ordered:
        key = dedupe_key(run)
        held = best.get(key)
        if held is None or (run.release or ()) > (held.release or ()):
            best[key] = run
    chosen = {id(run) for run in best.values()}
    return [run for run in ordered if id(run) in chosen]


def base_model(model: str) -> str:
    """The model a table row names, without its recipe variant: ``"DeepSeekV3 (w/ MTP)"``
    -> ``"DeepSeekV3"``."""
    return model.split(" (")[0]


def release_line(release: tuple[int, ...] | None) -> tuple[int, ...]:
    """A container's release line: year and month, point releases folded in (26.04.01 ->
    (26, 4)); ``()`` for a row without a release (a paper)."""
    return tuple(release[:2]) if release else ()


def supersede_key(run: PublishedRun) -> tuple[str, str, str, str]:
    """What a newer release re-measures: the same source's model on the same GPU in the
    same precision (a release line supersedes only its own table's rows: NeMo 24.09 in
    NVIDIA's DGX Cloud recipes is not an older line of Megatron-Bridge's tables)."""
    return (run.source_tag, base_model(run.model), run.gpu, run.precision)


def superseding_lines(runs: Iterable[PublishedRun]
                      ) -> dict[tuple[str, str, str, str], tuple[int, ...]]:
    """The newest release line that published each :func:`supersede_key`."""
    newest: dict[tuple[str, str, str, str], tuple[int, ...]] = {}
    for run in runs:
        key = supersede_key(run)
        newest[key] = max(newest.get(key, ()), release_line(run.release))
    return newest


def superseded_by(run: PublishedRun,
                  newest: dict[tuple[str, str, str, str], tuple[int, ...]]
                  ) -> tuple[int, ...] | None:
    """The newer release line that re-measured ``run``'s model, GPU and precision, or ``None``."""
    line = release_line(run.release)
    latest = newest.get(supersede_key(run), ())
    return latest if line and line < latest else None


def current_releases(runs: Iterable[PublishedRun]) -> list[PublishedRun]:
    """The runs no newer release line superseded; order kept.

    NVIDIA's performance tables re-measure a model on a GPU in each container release,
    and the software underneath moves: the GB300 Llama 3 70B FP8 row of NeMo 25.11 and
    of 26.04.01 ran one recorded recipe (same layout, FSDP, offload) and measured 2,030
    and 2,348 TFLOP/s; DeepSeek-V3 on B200 went from the all-to-all dispatcher at batch
    2,048 (25.09, 25.11) to HybridEP at 4,096 (26.02 on) and from 589 to 732 TFLOP/s.
    The cost model prices one software stack and has no release term, so where a newer
    release line published the same model, GPU and precision, the older line's rows
    (of any layout) describe software that no longer ships and are set aside: reported
    beside the fit (``parsearch validate``), never fitted.  Point releases (26.04 and
    26.04.01) are one line; rows without a release (papers) are never superseded.  The
    same (model, GPU, precision) always keeps its newest line's rows.
    """
    ordered = list(runs)
    newest = superseding_lines(ordered)
    return [run for run in ordered if superseded_by(run, newest) is None]


def training_spec(run: PublishedRun) -> TrainingSpec:
    """A :class:`TrainingSpec` for the run's job that admits its own choices.

    The micro-batch size, recompute mode and sequence-parallel setting are
    pinned to the run's; the other axes stay open (``max_vpp`` unbounded).
    """
    sp_mode = "on" if run.layout.sp or run.layout.tp == 1 else "off"
    # torchtitan's op-level checkpointing where the row ran it (run_layouts.py's note)
    titan_sac = any(a.startswith(TITAN_OP_SAC_NOTE) for a in run.assumptions)
    # torchtitan's per-layer checkpointing, every second block: half the layers in full
    titan_layers = any(a.startswith(TITAN_LAYER_SAC_NOTE) for a in run.assumptions)
    half_the_layers = (run.model_spec.num_layers // 2
                       if titan_layers and run.model_spec is not None else None)
    return TrainingSpec(
        seq_len=run.seq_len,
        global_batch=run.global_batch,
        micro_batch_sizes=(run.layout.mbs,),
        precision=run.precision,
        recompute_modes=(run.layout.recompute,),
        sequence_parallel=sp_mode,
        fsdp=uses_fsdp(run),
        fsdp_strategy=fsdp_strategy_of(run),
        recompute_modules=(TORCHTITAN_OP_SAC,) if titan_sac else ("core_attn",),
        recompute_num_layers=half_the_layers,
    )


def uses_fsdp(run: PublishedRun) -> bool:
    """Whether the source says the run used fully sharded data parallelism.

    "FSDP=..." in the notes (NVIDIA tables), a torchtitan row (torchtitan's data
    parallelism is FSDP2, ZeRO-3-style, in every benchmark it publishes), or notes that
    name a sharding strategy (:func:`fsdp_strategy_of`).
    """
    return ("FSDP=" in run.notes or run.source_tag == TORCHTITAN
            or "sharding strategy optim_grads" in run.notes)


def fsdp_strategy_of(run: PublishedRun) -> str:
    """The FSDP sharding strategy the source describes: ZeRO-2 (``optim_grads``) where the
    notes say so (Llama 3: weights not resharded after forward, §3.3.2), else ZeRO-3."""
    return "optim_grads" if "sharding strategy optim_grads" in run.notes else "optim_grads_params"
