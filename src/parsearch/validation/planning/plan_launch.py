"""How a planned measurement is launched: a short logged run and its shell script.

The plan (:mod:`parsearch.validation.planning.plan_profiling`) picks the layouts, each a
:class:`PlannedRun` (defined here, so this module needs nothing from the plan); this module
turns one into the launch settings it was priced with, for enough iterations that the
log gives a steady step time, and into a script that runs it with Megatron-LM.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from parsearch.cost.analytic import CostModel, estimate
from parsearch.launch import LaunchSettings, launch_for_cluster
from parsearch.layout import Layout
from parsearch.validation.user.megatron_logs import MIN_STEADY_LINES, WARMUP_ITERATIONS

#: Iterations measured after warm-up: the median of 20 per-iteration times is within about
#: 1 % of the mean for the 2-3 % iteration-to-iteration spread of steady training.
MEASURED_ITERATIONS = max(20, MIN_STEADY_LINES)


@dataclass(frozen=True)
class PlannedRun:
    """One layout to measure."""

    order: int
    layout: Layout
    predicted_rank: int
    tokens_per_s_per_gpu: float
    step_time_s: float
    reasons: tuple[str, ...]
    launch: LaunchSettings

    @property
    def iterations(self) -> int:
        return WARMUP_ITERATIONS + MEASURED_ITERATIONS

    @property
    def minutes(self) -> float:
        """Training time of the planned iterations (start-up not counted)."""
        return self.iterations * self.step_time_s / 60.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "order": self.order, "layout": self.layout.to_dict(), "key": self.layout.key(),
            "num_gpus": self.layout.num_gpus, "predicted_rank": self.predicted_rank,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu, "step_time_s": self.step_time_s,
            "iterations": self.iterations, "warmup_iterations": WARMUP_ITERATIONS,
            "minutes": self.minutes, "reasons": list(self.reasons),
            "launch": self.launch.to_dict(),
        }


def short_run_launch(cm: CostModel, layout: Layout) -> LaunchSettings:
    """Launch settings of ``layout`` with the features it was priced with, for a short run.

    Megatron-LM ``--train-iters/--log-interval/--log-throughput`` and the Megatron-Bridge
    fields they mirror (``train.train_iters``, ``logger.log_interval``,
    ``logger.log_throughput``: ``megatron/training/config/training_config.py``), so every
    iteration is logged with its throughput.
    """
    # with features searched per layout, the ones this layout was priced with
    priced = estimate(cm, layout).options if cm.variants else cm.options
    settings = launch_for_cluster(cm.model, cm.training, layout, cm.fabric.cluster,
                                  options=priced or cm.options)
    iterations = WARMUP_ITERATIONS + MEASURED_ITERATIONS
    return replace(
        settings,
        megatron_lm_args=(*settings.megatron_lm_args, "--train-iters", str(iterations),
                          "--log-interval", "1", "--log-throughput"),
        bridge_overrides=(*settings.bridge_overrides, f"train.train_iters={iterations}",
                          "logger.log_interval=1", "logger.log_throughput=true"))


def launch_script(run: PlannedRun, model_name: str) -> str:
    """A shell script that runs one planned measurement with Megatron-LM (Bridge: commented)."""
    return (
        "#!/usr/bin/env bash\n"
        f"# parsearch plan-profiling, measurement {run.order}: {model_name}, layout "
        f"{run.layout.key()} on {run.launch.num_gpus} GPUs ({run.launch.nodes} node(s)).\n"
        f"# {run.iterations} iterations ({WARMUP_ITERATIONS} warm-up); predicted "
        f"{run.step_time_s:.2f} s per step, about {run.minutes:.1f} min after start-up.\n"
        "# Pass the data and tokenizer arguments of your setup to this script; set\n"
        "# MASTER_ADDR/MASTER_PORT (torchrun rendezvous) and run it on every node;\n"
        "# then feed the log to "
        "`parsearch calibrate --measurements LOG --model ... --cluster ...`.\n"
        "set -euo pipefail\n"
        + "\n".join(_megatron_lm_only(run.launch.shell_snippet().splitlines())) + "\n"
    )


def _megatron_lm_only(lines: list[str]) -> list[str]:
    """The launch snippet with its Megatron-Bridge alternative commented out (one run),
    and the script's own arguments (data, tokenizer) passed on to Megatron-LM."""
    out: list[str] = []
    bridge = False
    for line in lines:
        if line.startswith("# Megatron-Bridge") and not bridge:
            bridge = True
            out[-1] += ' "$@"'
        out.append(line if not bridge or line.startswith("#") else "# " + line)
    return out
