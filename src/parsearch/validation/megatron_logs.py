"""Read Megatron-LM and Megatron-Bridge training logs into steady-state step times.

Formats, as printed by the code (checked against NVIDIA/Megatron-LM commit
``d98e8a64ddf34856e74b24714e3bedb2f5a39553`` and NVIDIA-NeMo/Megatron-Bridge
commit ``067f987df03b8355b03192d88d70f1709fedf51a``):

* the arguments block (Megatron-LM ``megatron/training/arguments.py``
  ``_print_args``): a ``------------------------ arguments ------------------------``
  header, one line per argument ``'  {} {} {}'.format(arg, '.' * (48 - len(arg)), value)``
  and a ``-------------------- end of arguments ---------------------`` footer;
* the per-iteration line (``megatron/training/training.py`` ``training_log``;
  Megatron-Bridge ``training/utils/train_utils.py`` ``training_log``, same fields):
  ``" [%Y-%m-%d %H:%M:%S] iteration {:8d}/{:8d} | consumed samples: {:12d} |
  elapsed time per iteration (ms): {:.1f} | throughput per GPU (TFLOP/s/GPU): {:.1f} |
  learning rate: ... | global batch size: {:5d} | ... | number of skipped iterations: {:3d} |
  number of nan iterations: {:3d} |"`` (Megatron-LM adds microseconds to the
  timestamp since January 2026; the throughput field needs ``--log-throughput``);
  the elapsed time is the mean over the iterations since the previous line
  (``--log-interval``);
* ``print_datetime('after training is done')`` once training ends normally.

Megatron-Bridge prints no arguments block; when its ``ConfigContainer`` was
dumped to the log as YAML (``print_yaml``), the parallelism fields are read
from the ``key: value`` lines.

Launchers prefix lines (``srun --label`` writes ``0: ``, ``torchrun --tee``
``[default0]:``); lines are matched anywhere, and lines that match nothing
are counted as garbage and otherwise ignored.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from parsearch.errors import ParsearchError

#: Iterations discarded at the start of a run and after a change of batch size: the first
#: iterations include CUDA/NCCL initialisation, allocator growth and autotuning.
WARMUP_ITERATIONS = 10
#: Logged lines needed after warm-up for a steady-state reading.
MIN_STEADY_LINES = 3

_ARGS_HEADER = re.compile(r"-{3,} arguments -{3,}")
_ARGS_FOOTER = re.compile(r"-{3,} end of arguments -{3,}")
_ARG_LINE = re.compile(r"^(?:.*?:\s)?\s*([A-Za-z_][A-Za-z0-9_]*) \.*\s*(.*?)\s*$")
_ITERATION = re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)\s*\|")
_FIELDS = {
    "consumed": re.compile(r"consumed samples:\s*(\d+)\s*\|"),
    "elapsed_ms": re.compile(r"elapsed time per iteration \(ms\):\s*([0-9.eE+-]+)\s*\|"),
    "tflops": re.compile(r"throughput per GPU \(TFLOP/s/GPU\):\s*([0-9.eE+-]+)\s*\|"),
    "batch": re.compile(r"global batch size:\s*(\d+)\s*\|"),
    "skipped": re.compile(r"number of skipped iterations:\s*(\d+)\s*\|"),
    "nan": re.compile(r"number of nan iterations:\s*(\d+)\s*\|"),
}
_DONE = re.compile(r"after training is done")
#: ``key: value`` lines of a Megatron-Bridge ConfigContainer YAML dump that we read.
_YAML_KEYS = frozenset({
    "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
    "expert_model_parallel_size", "expert_tensor_parallel_size",
    "virtual_pipeline_model_parallel_size", "sequence_parallel", "micro_batch_size",
    "global_batch_size", "seq_length", "recompute_granularity", "num_layers", "hidden_size",
    "moe_token_dispatcher_type", "train_iters", "bf16", "fp16", "fp8", "fp4",
})
_YAML_LINE = re.compile(r"^\s+([a-z_][a-z0-9_]*):\s+(\S.*?)\s*$")


class LogError(ParsearchError):
    """A log (or one run in it) that yields no measurement; the message is one line."""


@dataclass(frozen=True)
class IterationLine:
    """One per-iteration line of the log."""

    line_no: int
    iteration: int
    train_iters: int
    elapsed_ms: float
    global_batch: int | None
    tflops_per_gpu: float | None
    skipped: int
    nan: int


@dataclass(frozen=True)
class LogRun:
    """One training run found in a log: its arguments and its iteration lines."""

    path: str
    index: int
    start_line: int
    arguments: dict[str, str]
    iterations: tuple[IterationLine, ...]
    finished: bool
    malformed_lines: tuple[int, ...] = ()

    @property
    def name(self) -> str:
        """``file`` or ``file run 2`` (when the file holds several runs)."""
        return f"{self.path} run {self.index}"

    @property
    def train_iters(self) -> int | None:
        if self.iterations:
            return self.iterations[-1].train_iters
        return _int_or_none(self.arguments.get("train_iters"))

    @property
    def died(self) -> bool:
        """Stopped before ``train_iters`` without the end-of-training line."""
        if self.finished:
            return False
        if not self.iterations:
            return True
        last = self.iterations[-1]
        return last.iteration < last.train_iters


@dataclass(frozen=True)
class SteadyState:
    """Steady-state timing of one constant-batch stretch of a run."""

    run: LogRun
    global_batch: int
    step_time_s: float
    spread: float
    first_iteration: int
    last_iteration: int
    lines_used: int
    tflops_per_gpu: float | None
    notes: tuple[str, ...] = field(default=())

    @property
    def name(self) -> str:
        return f"{self.run.name} (iterations {self.first_iteration}-{self.last_iteration}, " \
               f"batch {self.global_batch})"


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(str(text).strip())
    except (TypeError, ValueError):
        return None


def _iteration_line(text: str, line_no: int) -> IterationLine | None:
    """The iteration line's fields, or ``None`` when a field the reading needs is missing."""
    head = _ITERATION.search(text)
    elapsed = _FIELDS["elapsed_ms"].search(text)
    if head is None or elapsed is None:
        return None
    try:
        ms = float(elapsed.group(1))
    except ValueError:
        return None
    if not ms > 0 or ms != ms or ms == float("inf"):
        return None
    values = {k: rx.search(text) for k, rx in _FIELDS.items()}

    def number(key: str) -> str | None:
        match = values[key]
        return match.group(1) if match else None

    tflops = number("tflops")
    try:
        tflops_value = float(tflops) if tflops is not None else None
    except ValueError:
        tflops_value = None
    return IterationLine(
        line_no=line_no, iteration=int(head.group(1)), train_iters=int(head.group(2)),
        elapsed_ms=ms, global_batch=_int_or_none(number("batch")), tflops_per_gpu=tflops_value,
        skipped=_int_or_none(number("skipped")) or 0, nan=_int_or_none(number("nan")) or 0)


@dataclass
class _Builder:
    path: str
    index: int
    start_line: int
    arguments: dict[str, str] = field(default_factory=dict)
    iterations: list[IterationLine] = field(default_factory=list)
    malformed: list[int] = field(default_factory=list)
    finished: bool = False
    from_header: bool = False

    def build(self) -> LogRun:
        return LogRun(self.path, self.index, self.start_line, dict(self.arguments),
                      tuple(self.iterations), self.finished, tuple(self.malformed))

    @property
    def empty(self) -> bool:
        return not (self.arguments or self.iterations)


def parse_megatron_log(text: str, path: str = "<log>") -> list[LogRun]:
    """Every run in the log text, in order.

    A new run starts at each arguments block, and where the iteration counter
    goes backwards (a restart whose arguments block is missing from the log);
    a restart inherits the arguments seen before it.

    >>> line = (" [2024-05-01 10:00:00] iteration {:8d}/{:8d} | consumed samples: {:12d} |"
    ...         " elapsed time per iteration (ms): {:.1f} | global batch size: {:5d} |")
    >>> text = "\\n".join(["------------------------ arguments ------------------------",
    ...                   "  tensor_model_parallel_size " + "." * 22 + " 2",
    ...                   "-------------------- end of arguments ---------------------"]
    ...                  + [line.format(i, 100, 64 * i, 900.0, 64) for i in range(1, 15)])
    >>> (run,) = parse_megatron_log(text)
    >>> run.arguments["tensor_model_parallel_size"], len(run.iterations), run.died
    ('2', 14, True)
    >>> readings, _ = steady_states(run)
    >>> readings[0].step_time_s, readings[0].first_iteration
    (0.9, 11)
    """
    runs: list[_Builder] = []
    current = _Builder(path, 1, 1)
    in_args = False
    for line_no, line in enumerate(text.splitlines(), start=1):
        if _ARGS_HEADER.search(line) and not _ARGS_FOOTER.search(line):
            # Lines before the first arguments block that happened to look like config
            # (no iterations yet) are not a run of their own.
            if current.iterations or (current.from_header and not current.empty):
                runs.append(current)
            current = _Builder(path, len(runs) + 1, line_no, from_header=True)
            in_args = True
            continue
        if in_args:
            if _ARGS_FOOTER.search(line):
                in_args = False
                continue
            match = _ARG_LINE.match(line)
            if match and match.group(1) not in current.arguments:
                current.arguments[match.group(1)] = match.group(2)
            continue
        if "iteration" in line and "elapsed time per iteration" in line:
            parsed = _iteration_line(line, line_no)
            if parsed is None:
                current.malformed.append(line_no)
                continue
            if current.iterations and parsed.iteration <= current.iterations[-1].iteration:
                runs.append(current)  # restarted: a new run with the same arguments
                current = _Builder(path, len(runs) + 1, line_no, dict(current.arguments))
            current.iterations.append(parsed)
            continue
        if _DONE.search(line):
            current.finished = True
            continue
        yaml_line = _YAML_LINE.match(line)
        if yaml_line and yaml_line.group(1) in _YAML_KEYS:
            current.arguments.setdefault(yaml_line.group(1), yaml_line.group(2))
    if not current.empty:
        runs.append(current)
    return [r.build() for r in runs]


def read_megatron_log(path: str | Path) -> list[LogRun]:
    """The runs of a log file; an unreadable file raises :class:`LogError`."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as error:
        raise LogError(f"{path}: cannot read it: {error.strerror or error}") from None
    runs = parse_megatron_log(text, str(path))
    if not runs:
        raise LogError(f"{path}: no Megatron arguments block and no iteration lines "
                       "('iteration N/M | ... elapsed time per iteration (ms): ...'); "
                       "is this a Megatron-LM / Megatron-Bridge training log?")
    return runs


def _segments(lines: tuple[IterationLine, ...]) -> list[list[IterationLine]]:
    """Stretches of constant global batch size (a line without the field joins the last)."""
    out: list[list[IterationLine]] = []
    for line in lines:
        batch = line.global_batch
        if out and (batch is None or out[-1][-1].global_batch in (None, batch)):
            out[-1].append(line)
        else:
            out.append([line])
    return out


def steady_states(run: LogRun, warmup_iterations: int = WARMUP_ITERATIONS,
                  ) -> tuple[list[SteadyState], list[str]]:
    """Steady-state readings of a run, one per constant-batch stretch, and notes.

    In each stretch the iterations up to ``warmup_iterations`` after its first
    iteration are dropped (after a change of batch size the first line also
    averages over iterations of the old size), then the step time is the
    median of the remaining lines' per-iteration times.  A stretch with fewer
    than :data:`MIN_STEADY_LINES` remaining lines gives a note, not a reading.
    """
    notes: list[str] = []
    if run.malformed_lines:
        shown = ", ".join(str(n) for n in run.malformed_lines[:3])
        more = "" if len(run.malformed_lines) <= 3 else f" and {len(run.malformed_lines) - 3} more"
        notes.append(f"{run.name}: ignored {len(run.malformed_lines)} truncated or malformed "
                     f"iteration line(s) (line {shown}{more})")
    if run.died and run.iterations:
        last = run.iterations[-1]
        notes.append(f"{run.name}: stopped at iteration {last.iteration} of "
                     f"{last.train_iters} without 'after training is done' (died or was "
                     "killed); its iterations so far are used")
    segments = _segments(run.iterations)
    if len(segments) > 1:
        sizes = " -> ".join(str(s[0].global_batch) for s in segments)
        notes.append(f"{run.name}: global batch size changed ({sizes}); each batch size "
                     "is read separately")
    readings = []
    for segment in segments:
        # The first logged line of a stretch averages over the iterations since the line
        # before it (other batch size, or start-up), so warm-up counts from that line.
        start = segment[0].iteration - 1
        steady = [x for x in segment if x.iteration > start + warmup_iterations]
        batch = segment[0].global_batch
        where = (f"{run.name}: iterations {segment[0].iteration}-{segment[-1].iteration}"
                 + (f" (batch {batch})" if batch else ""))
        if len(steady) < MIN_STEADY_LINES:
            notes.append(f"{where}: only {len(steady)} logged line(s) after the "
                         f"{warmup_iterations} warm-up iterations, need {MIN_STEADY_LINES}; "
                         "not used (log more iterations or lower --log-interval)")
            continue
        times = [x.elapsed_ms / 1000.0 for x in steady]
        median = statistics.median(times)
        quartiles = statistics.quantiles(times, n=4) if len(times) >= 2 else [median] * 3
        tflops = [x.tflops_per_gpu for x in steady if x.tflops_per_gpu is not None]
        own: list[str] = []
        if any(x.skipped or x.nan for x in steady):
            own.append("some iterations were skipped (loss-scale overflow) or NaN")
        readings.append(SteadyState(
            run=run, global_batch=batch or 0, step_time_s=median,
            spread=(quartiles[2] - quartiles[0]) / median if median > 0 else 0.0,
            first_iteration=steady[0].iteration, last_iteration=steady[-1].iteration,
            lines_used=len(steady),
            tflops_per_gpu=statistics.median(tflops) if tflops else None, notes=tuple(own)))
    return readings, notes
