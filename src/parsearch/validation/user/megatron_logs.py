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
are counted as garbage and otherwise ignored.  The forms users paste beside
these (colour codes, Primus's ``elapsed ... (ms): a/b``, NeMo 2's
``train_step_timing in s:`` lines, argument lines without their header) are
read line by line in :mod:`parsearch.validation.user.log_lines`; a checkpoint load
(``successfully loaded checkpoint from ... at iteration N``) tells where the
run's warm-up starts.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from parsearch.errors import ParsearchError
from parsearch.validation.user.log_lines import (
    IterationLine,
    is_redraw,
    iteration_line,
    looks_like_iteration,
    loose_argument,
    plain,
    progress_draws,
)

#: Iterations discarded at the start of a run and after a change of batch size: the first
#: iterations include CUDA/NCCL initialisation, allocator growth and autotuning.
WARMUP_ITERATIONS = 10
#: Logged lines needed after warm-up for a steady-state reading.
MIN_STEADY_LINES = 3

_ARGS_HEADER = re.compile(r"-{3,} arguments -{3,}")
_ARGS_FOOTER = re.compile(r"-{3,} end of arguments -{3,}")
_ARG_LINE = re.compile(r"^(?:.*?:\s)?\s*([A-Za-z_][A-Za-z0-9_]*) \.*\s*(.*?)\s*$")
#: Megatron-LM's end of training, and PyTorch Lightning's (NeMo 2: ``Trainer.fit`` stopped:
#: ``max_steps=N`` reached.).
_DONE = re.compile(r"after training is done|`Trainer\.fit` stopped")
#: Megatron-LM ``checkpointing.py`` ``load_checkpoint`` (and Megatron-Bridge's): ``successfully
#: loaded checkpoint from {load_dir} [ t .., p .. ] at iteration {iteration}``.
_RESUMED = re.compile(r"successfully loaded checkpoint from .*\bat iteration\s+(\d+)")
#: ``key: value`` lines of a Megatron-Bridge ConfigContainer YAML dump that we read.
_YAML_KEYS = frozenset({
    "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
    "expert_model_parallel_size", "expert_tensor_parallel_size",
    "virtual_pipeline_model_parallel_size", "sequence_parallel", "micro_batch_size",
    "global_batch_size", "seq_length", "recompute_granularity", "num_layers", "hidden_size",
    "moe_token_dispatcher_type", "train_iters", "bf16", "fp16", "fp8", "fp4",
})
_YAML_LINE = re.compile(r"^\s+([a-z_][a-z0-9_]*):\s+(\S.*?)\s*$")
#: Where a stretch's CSV alternative is spelled out (the other route into ``calibrate``).
CSV_ROUTE = ("or give the step times as a CSV with columns model, cluster, num_gpus, "
             "global_batch, seq_len, precision, layout, step_time_s")


class LogError(ParsearchError):
    """A log (or one run in it) that yields no measurement; the message is one line."""


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
    #: The iteration the run started from: 0 (a fresh start, or an excerpt that shows no
    #: resume), the checkpoint's iteration when the log says it loaded one, ``None`` when
    #: the counter went back (a restart) with no such line: unknown.
    start_iteration: int | None = 0
    #: Lines read as arguments without an arguments-block header around them.
    loose_arguments: tuple[int, ...] = ()

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
    start_iteration: int | None = 0
    loose: list[int] = field(default_factory=list)

    def build(self) -> LogRun:
        return LogRun(self.path, self.index, self.start_line, dict(self.arguments),
                      tuple(self.iterations), self.finished, tuple(self.malformed),
                      self.start_iteration, tuple(self.loose))

    @property
    def empty(self) -> bool:
        return not (self.arguments or self.iterations)


def parse_megatron_log(text: str, path: str = "<log>") -> list[LogRun]:
    """Every run in the log text, in order.

    A new run starts at each arguments block (or, without its header, at the first
    argument line after iterations), and where the iteration counter goes backwards
    (a restart whose arguments block is missing from the log); a restart inherits the
    arguments seen before it.  Colour codes are removed from every line first
    (:func:`~parsearch.validation.user.log_lines.plain`).

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
    resumed: int | None = None  # a checkpoint load seen before the run's first iteration
    for line_no, raw in enumerate(text.splitlines(), start=1):
        line = plain(raw)
        if _ARGS_HEADER.search(line) and not _ARGS_FOOTER.search(line):
            # Lines before the first arguments block that happened to look like config
            # (no iterations yet) are not a run of their own.
            if current.iterations or (current.from_header and not current.empty):
                runs.append(current)
            current = _Builder(path, len(runs) + 1, line_no, from_header=True)
            in_args, resumed = True, None
            continue
        if in_args:
            if _ARGS_FOOTER.search(line):
                in_args = False
                continue
            match = _ARG_LINE.match(line)
            if match and match.group(1) not in current.arguments:
                current.arguments[match.group(1)] = match.group(2)
            continue
        if looks_like_iteration(line):
            for draw in progress_draws(line):
                parsed = iteration_line(draw, line_no)
                if parsed is None:
                    if looks_like_iteration(draw):
                        current.malformed.append(line_no)
                    continue
                last = current.iterations[-1] if current.iterations else None
                if last is not None and parsed.iteration == last.iteration and is_redraw(draw):
                    current.iterations[-1] = parsed  # a progress bar redrew the same step
                    continue
                if last is not None and parsed.iteration <= last.iteration:
                    runs.append(current)  # restarted: a new run with the same arguments
                    current = _Builder(path, len(runs) + 1, line_no, dict(current.arguments),
                                       start_iteration=resumed)
                elif last is None and resumed is not None:
                    current.start_iteration = resumed
                resumed = None
                current.iterations.append(parsed)
            continue
        if _DONE.search(line):
            current.finished = True
            continue
        loaded = _RESUMED.search(line)
        if loaded is not None:
            resumed = int(loaded.group(1))
            continue
        argument = loose_argument(line)
        if argument is not None:
            if current.iterations:  # another run's arguments, pasted without the header
                runs.append(current)
                current = _Builder(path, len(runs) + 1, line_no)
            current.arguments.setdefault(*argument)
            current.loose.append(line_no)
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
                       "('iteration N/M | ... elapsed time per iteration (ms): ...', or "
                       "NeMo 2's 'iteration N/M | ... train_step_timing in s: ...', or "
                       "NeMo 1's progress bar 'N/M [..., train_step_timing in s=...]'); is this "
                       f"a Megatron-LM / Megatron-Bridge / NeMo training log? {CSV_ROUTE} "
                       "(a .csv file)")
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

    Warm-up is counted in the run's own iteration numbers: the first stretch drops
    iterations up to ``warmup_iterations`` after the iteration the run started from
    (0, or the checkpoint it loaded), so an excerpt that starts at iteration 29 is past
    its warm-up; a restart without a checkpoint line, and every stretch after a change
    of batch size (whose first line also averages over iterations of the old size),
    count from their first logged line.  The step time is the median of the remaining
    lines' per-iteration times.  A stretch with fewer than :data:`MIN_STEADY_LINES`
    remaining lines gives a note, not a reading.
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
    if run.loose_arguments:
        notes.append(f"{run.name}: read {len(run.loose_arguments)} argument line(s) found "
                     "without the '--- arguments ---' header (from line "
                     f"{run.loose_arguments[0]}); paste the whole block to be sure none is "
                     "missing")
    readings = []
    for number, segment in enumerate(segments):
        start = _warmup_start(run, segment, first=number == 0)
        if number == 0 and run.start_iteration == 0 and segment[0].iteration > \
                warmup_iterations + 1 and warmup_iterations:
            notes.append(f"{run.name}: the log starts at iteration {segment[0].iteration}, "
                         f"past the run's {warmup_iterations} warm-up iterations: all its lines "
                         "are used (pass --warmup-iterations N to drop N more if the run was "
                         "resumed from a checkpoint at that point)")
        steady = [x for x in segment if x.iteration > start + warmup_iterations]
        batch = segment[0].global_batch
        where = (f"{run.name}: iterations {segment[0].iteration}-{segment[-1].iteration}"
                 + (f" (batch {batch})" if batch else ""))
        if len(steady) < MIN_STEADY_LINES:
            notes.append(f"{where}: only {len(steady)} logged line(s) after warm-up "
                         f"(iterations {start + 1}-{start + warmup_iterations}), need "
                         f"{MIN_STEADY_LINES}; not used (log more iterations or lower "
                         "--log-interval, or pass --warmup-iterations 0 if these iterations "
                         "were already past warm-up)")
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


def _warmup_start(run: LogRun, segment: list[IterationLine], first: bool) -> int:
    """The iteration warm-up counts from in ``segment``.

    The run's first stretch: the iteration the run started from (0, or the checkpoint it
    loaded).  A restart without a checkpoint line, and a stretch after a change of batch
    size: its first logged line averages over the iterations since the line before it
    (start-up, or the old batch size), so warm-up counts from that line.
    """
    if first and run.start_iteration is not None:
        return min(run.start_iteration, segment[0].iteration - 1)
    return segment[0].iteration - 1
