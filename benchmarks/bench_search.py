"""Search targets: three timings and optuna's hypervolume against the exact front.

1. ``search`` llama3-70b on 256 GPUs of dgx-h100 (global batch 512, seq 8192) < 5 s;
2. ``search`` deepseek-v3 on 1,024 H100s (global batch 8192, seq 4096) < 30 s;
3. ``pareto`` llama3-70b from 8 to 2,048 GPUs (whole nodes, exhaustive) < 60 s;
4. optuna on a space small enough to scan (llama3-8b, 8..256 GPUs): over several seeds
   the front reaches >= 98% of the exact hypervolume with <= 10% of the evaluations
   (trials, and distinct layouts scored, against the valid layouts the exact scan scores).

Usage: ``python benchmarks/bench_search.py [--skip-optuna] [--seeds 0,1,2]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(__file__))

from _timing import report

from parsearch.search import pareto_front, search_layouts
from parsearch.workload import TrainingSpec


def _timed(fn):  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def timing_targets() -> bool:
    ok = True
    seconds, r = _timed(lambda: search_layouts(
        model="llama3-70b", training=TrainingSpec(seq_len=8192, global_batch=512),
        cluster="dgx-h100", num_gpus=256, top=10))
    ok &= report("search llama3-70b on 256 GPUs", seconds, 5.0,
                 f"({r.valid:,} valid, {r.feasible:,} feasible; best "
                 f"{r.best.layout.key()} {r.best.estimate.tokens_per_s:,.0f} tokens/s)")
    seconds, r = _timed(lambda: search_layouts(
        model="deepseek-v3", training=TrainingSpec(seq_len=4096, global_batch=8192),
        cluster="dgx-h100", num_gpus=1024, top=10))
    ok &= report("search deepseek-v3 on 1024 GPUs", seconds, 30.0,
                 f"({r.valid:,} valid, {r.feasible:,} feasible; best "
                 f"{r.best.layout.key()} {r.best.estimate.tokens_per_s:,.0f} tokens/s)")
    seconds, p = _timed(lambda: pareto_front(
        model="llama3-70b", training=TrainingSpec(seq_len=8192, global_batch=512),
        cluster="dgx-h100", min_gpus=8, max_gpus=2048, method="exhaustive"))
    ok &= report("pareto llama3-70b 8..2048 GPUs", seconds, 60.0,
                 f"({len(p.gpu_counts)} GPU counts, {p.valid:,} valid layouts, "
                 f"{len(p.front)} front points)")
    return ok


def optuna_target(seeds: list[int], n_trials: int) -> bool:
    training = TrainingSpec(seq_len=8192, global_batch=256)
    query = {"model": "llama3-8b", "training": training, "cluster": "dgx-h100",
             "max_gpus": 256}
    seconds, exact = _timed(lambda: pareto_front(**query, method="exhaustive"))
    print(f"exact front: {exact.valid:,} valid layouts scored in {seconds:.1f} s, "
          f"hypervolume {exact.hypervolume:.4g}")
    ok = True
    for seed in seeds:
        seconds, res = _timed(lambda s=seed: pareto_front(**query, method="optuna",
                                                          n_trials=n_trials, seed=s))
        ratio = res.hypervolume / exact.hypervolume
        trials = res.study["trials_completed"] if res.study else n_trials
        good = ratio >= 0.98 and trials <= 0.10 * exact.valid
        ok &= good
        print(f"{'PASS' if good else 'FAIL'} optuna seed {seed}: hypervolume "
              f"{100 * ratio:.2f}% of exact with {trials} trials "
              f"({100 * trials / exact.valid:.1f}% of {exact.valid:,}), "
              f"{res.evaluations} distinct layouts scored "
              f"({100 * res.evaluations / exact.valid:.1f}%), {seconds:.1f} s")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-optuna", action="store_true")
    parser.add_argument("--skip-timing", action="store_true")
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--n-trials", type=int, default=2000)
    args = parser.parse_args()
    ok = True
    if not args.skip_timing:
        ok &= timing_targets()
    if not args.skip_optuna:
        ok &= optuna_target([int(s) for s in args.seeds.split(",")], args.n_trials)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
