"""Equivalence check for cost-model refactors: every output column of ``score_columns``
(and of ``memory_arrays`` without row grouping) before and after a change.

``--save FILE`` scores every case and writes the columns to an ``.npz``; ``--compare FILE``
scores them again and reports, per case and column, the largest relative difference
(``|a - b| / max(|a|, |b|, tiny)``; integer columns must match exactly).  Exit 1 when any
exceeds ``--tolerance`` (default 1e-12).  Run the save with the old code first, e.g.
from an exported copy of the previous commit: ``PYTHONPATH=<copy>/src python
benchmarks/check_score_equivalence.py --save /tmp/before.npz``.

The cases are the two of ``bench_score.py`` plus ones that reach the memory model's
other branches: uneven and even splits, a Megatron pipeline-layout string, MoE with CP
and interleaved dense/MoE layers, partial (block) recompute, activation offload, several
selective-recompute modules, micro-batch sizes 1/2/4, FP8 with FSDP, the KOR22
activation model without fp32 logits.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

from parsearch.cost.analytic import build_cost_model, score_columns
from parsearch.cost.memory import memory_arrays
from parsearch.cost.memory.options import MemoryOptions
from parsearch.cost.options import CostOptions
from parsearch.layout.space import enumerate_layouts
from parsearch.model.presets import get_preset
from parsearch.model.specs import ModelSpec, TrainingSpec
from parsearch.topology.cluster import load_cluster
from parsearch.topology.fabric import build_fabric

MEMORY_FIELDS = ("weights", "gradients", "optimizer", "activations", "other", "total",
                 "peak_stage", "offloaded_bytes")


def _interleaved_moe() -> ModelSpec:
    """Mixtral 8x7B with every other layer MoE after one dense layer (MoE layer frequency)."""
    base = get_preset("mixtral-8x7b")
    assert base.moe is not None
    return replace(base, name="mixtral-interleaved",
                   moe=replace(base.moe, first_k_dense=1, layer_freq=2))


def cases() -> list[tuple[str, ModelSpec, int, TrainingSpec, CostOptions]]:
    """``(label, model, gpus, training, options)`` of every case."""
    plain = CostOptions()
    mbs124 = (1, 2, 4)
    return [
        ("bench-deepseek-v3", get_preset("deepseek-v3"), 1024,
         TrainingSpec(seq_len=4096, global_batch=8192, micro_batch_sizes=(1, 2)), plain),
        ("bench-llama3-70b", get_preset("llama3-70b"), 256,
         TrainingSpec(seq_len=8192, global_batch=512), plain),
        ("llama405b-layout-string", get_preset("llama3.1-405b"), 512,
         TrainingSpec(seq_len=8192, global_batch=512, micro_batch_sizes=(1,),
                      pipeline_layout="E|(t|)*126L"), plain),
        ("llama70b-even-mbs124", get_preset("llama3-70b"), 128,
         TrainingSpec(seq_len=4096, global_batch=1024, micro_batch_sizes=mbs124,
                      pipeline_split="even"), plain),
        ("mixtral-cp-modules", get_preset("mixtral-8x7b"), 128,
         TrainingSpec(seq_len=16384, global_batch=256, micro_batch_sizes=mbs124,
                      recompute_modules=("core_attn", "layernorm", "moe_act", "mlp")), plain),
        ("moe-interleaved-block-offload", _interleaved_moe(), 64,
         TrainingSpec(seq_len=4096, global_batch=512, micro_batch_sizes=mbs124,
                      recompute_num_layers=2, activation_offload_layers=1), plain),
        ("qwen3-30b-block-moe", get_preset("qwen3-30b-a3b"), 64,
         TrainingSpec(seq_len=8192, global_batch=256, micro_batch_sizes=(1, 2),
                      recompute_num_layers=1, recompute_modules=("moe", "shared_experts")),
         plain),
        ("deepseek-fp8-fsdp-mtp", get_preset("deepseek-v3"), 256,
         TrainingSpec(seq_len=4096, global_batch=1024, micro_batch_sizes=(1,), precision="fp8",
                      fsdp=True, activation_offload_layers=2,
                      recompute_modules=("mla_up_proj", "core_attn")),
         CostOptions(moe_imbalance=1.3, memory=MemoryOptions(fp8_param_gather=True))),
        ("gpt3-korthikanti-no-logits", get_preset("gpt3-175b"), 256,
         TrainingSpec(seq_len=2048, global_batch=1536, micro_batch_sizes=mbs124),
         CostOptions(memory=MemoryOptions(activation_model="korthikanti", fp32_logits=False))),
    ]


def score_case(model: ModelSpec, gpus: int, training: TrainingSpec,
               options: CostOptions) -> dict[str, np.ndarray]:
    """Every ``score_columns`` column, and ``memory_arrays`` (no row grouping) as ``raw_*``."""
    table = enumerate_layouts(model, training, gpus)
    cm = build_cost_model(model, training, build_fabric(load_cluster("dgx-h100"), gpus),
                          options=options)
    out = {k: np.asarray(v) for k, v in score_columns(cm, table.columns).items()}
    c = table.columns
    mem = memory_arrays(model, training, c["tp"], c["cp"], c["pp"], c["ep"], c["etp"], c["vpp"],
                        c["mbs"], c["dp"], c["edp"], c["recompute"], c["sp"], cm.options.memory)
    out.update({f"raw_{f}": np.asarray(getattr(mem, f)) for f in MEMORY_FIELDS})
    return out


def max_rel_diff(a: np.ndarray, b: np.ndarray) -> float:
    """Largest ``|a - b| / max(|a|, |b|)`` (NaN equal to NaN; inf if shapes differ)."""
    if a.shape != b.shape:
        return float("inf")
    if a.dtype.kind in "biu" or b.dtype.kind in "biu":
        return 0.0 if np.array_equal(a, b) else float("inf")
    a, b = a.astype(np.float64), b.astype(np.float64)
    both_nan = np.isnan(a) & np.isnan(b)
    scale = np.maximum(np.maximum(np.abs(a), np.abs(b)), np.finfo(np.float64).tiny)
    rel = np.where(both_nan | (a == b), 0.0, np.abs(a - b) / scale)
    return float(np.nanmax(rel, initial=0.0)) if rel.size else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--save", metavar="FILE")
    group.add_argument("--compare", metavar="FILE")
    parser.add_argument("--tolerance", type=float, default=1e-12)
    args = parser.parse_args(argv)
    results = {}
    for label, model, gpus, training, options in cases():
        for key, values in score_case(model, gpus, training, options).items():
            results[f"{label}/{key}"] = values
        print(f"scored {label}: {len(values):,} layouts", flush=True)
    if args.save:
        np.savez_compressed(args.save, **results)
        print(f"saved {len(results)} columns to {args.save}")
        return 0
    before = np.load(args.compare)
    worst: dict[str, float] = {}
    ok = True
    for key in sorted(set(before.files) | set(results)):
        diff = (max_rel_diff(before[key], results[key])
                if key in before.files and key in results else float("inf"))
        column = key.split("/", 1)[1]
        worst[column] = max(worst.get(column, 0.0), diff)
        if diff > args.tolerance:
            ok = False
            print(f"DIFF {key}: max rel diff {diff:.3g}")
    for column, diff in sorted(worst.items()):
        print(f"{column:28s} max rel diff {diff:.3g}")
    print("PASS" if ok else "FAIL", f"(tolerance {args.tolerance:g})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
