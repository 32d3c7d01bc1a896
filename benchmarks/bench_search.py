"""Search targets (issue 12): exact answers, on one core, in bounded time and memory.

Cases (each run in a fresh process, ``--repeats`` times; the median is judged):

* ``search-dsv3``: ``search`` DeepSeek-V3 on 1,024 H100s (batch 8192, seq 4096) < 3 s, < 250 MB;
* ``search-dsv3-offload``: the same with fine-grained offload modules searched too
  (``--offload-modules auto``) < 3 s, < 250 MB;
* ``search-llama``: ``search`` Llama 3 70B on 256 H100s (batch 512, seq 8192) < 5 s;
* ``pareto-llama``: ``pareto`` Llama 3 70B, 8..16,384 GPUs (whole nodes, exact) < 20 s;
* ``pareto-dsv3``: ``pareto`` DeepSeek-V3, 64..16,384 GPUs (whole nodes, exact) < 60 s;
* ``gb200``: ``pareto`` DeepSeek-V3 on GB200-NVL72, 256..1,024 GPUs, batch 4096, seq 4096,
  FP8, method ``auto`` (must be the exact scan) < 60 s;
* ``optuna``: on a space small enough to scan (llama3-8b, 8..256 GPUs) the optuna front
  reaches >= 99% of the exact hypervolume (several seeds).

MoE cases choose the dispatcher and overlaps per layout, as the CLI does by default.

Times are the process's CPU time (``time.process_time``): the machine these run on is
shared, and CPU time is what one core spends whatever else runs; wall time is printed
beside it.  Run pinned to one core: ``taskset -c 0 python benchmarks/bench_search.py``.

Usage: ``python benchmarks/bench_search.py [--cases a,b] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

TARGETS: dict[str, tuple[float, float | None]] = {  # seconds, MB
    "search-dsv3": (3.0, 250.0),
    "search-dsv3-offload": (3.0, 250.0),
    "search-llama": (5.0, None),
    "pareto-llama": (20.0, None),
    "pareto-dsv3": (60.0, None),
    "gb200": (60.0, None),
}


def run_case(name: str) -> dict[str, Any]:
    """One case in this process: its answer and what it cost."""
    from parsearch.cost.options import DEFAULT_SEARCHED_FEATURES, CostOptions
    from parsearch.model.specs import TrainingSpec
    from parsearch.query import Query
    from parsearch.search import pareto_front, search_layouts

    # as the CLI runs them: MoE features chosen with each layout (no effect on dense models)
    features = CostOptions(search_features=DEFAULT_SEARCHED_FEATURES)
    wall, cpu = time.perf_counter(), time.process_time()
    if name in ("search-dsv3", "search-dsv3-offload"):
        if name == "search-dsv3-offload":
            features = CostOptions(search_features=(*DEFAULT_SEARCHED_FEATURES,
                                                    "offload_modules"))
        r = search_layouts(Query("deepseek-v3", TrainingSpec(seq_len=4096, global_batch=8192),
                                 "dgx-h100", options=features), num_gpus=1024, top=10)
        detail = f"{r.valid:,} valid, {r.examined:,} examined; best {r.best.layout.key()}"
    elif name == "search-llama":
        r = search_layouts(Query("llama3-70b", TrainingSpec(seq_len=8192, global_batch=512),
                                 "dgx-h100"), num_gpus=256, top=10)
        detail = f"{r.valid:,} valid, {r.examined:,} examined; best {r.best.layout.key()}"
    else:
        query, knobs = {
            "pareto-llama": (Query("llama3-70b", TrainingSpec(seq_len=8192, global_batch=512),
                                   "dgx-h100", options=features),
                             dict(min_gpus=8, max_gpus=16384, method="exhaustive")),
            "pareto-dsv3": (Query("deepseek-v3", TrainingSpec(seq_len=4096, global_batch=8192),
                                  "dgx-h100", options=features),
                            dict(min_gpus=64, max_gpus=16384, method="exhaustive")),
            "gb200": (Query("deepseek-v3", TrainingSpec(seq_len=4096, global_batch=4096,
                                                        precision="fp8"),
                            "gb200-nvl72", options=features),
                      dict(min_gpus=256, max_gpus=1024, method="auto")),
        }[name]
        p = pareto_front(query, **knobs)
        top = max(p.points, key=lambda q: q.tokens_per_s)
        detail = (f"method {p.method}, exact {p.exact}; {len(p.gpu_counts)} GPU counts, "
                  f"{p.valid:,} valid, {p.examined:,} examined; best {top.tokens_per_s:,.0f} "
                  f"tokens/s at {top.num_gpus} GPUs ({top.layout.key()})")
    return {"cpu_s": time.process_time() - cpu, "wall_s": time.perf_counter() - wall,
            "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "detail": detail}


def measure(name: str, repeats: int) -> bool:
    runs = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, __file__, "--one", name], capture_output=True,
                             text=True, check=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    cpu = statistics.median(r["cpu_s"] for r in runs)
    wall = statistics.median(r["wall_s"] for r in runs)
    rss = max(r["rss_mb"] for r in runs)
    target_s, target_mb = TARGETS[name]
    ok = cpu < target_s and (target_mb is None or rss < target_mb)
    mem = f", peak {rss:.0f} MB" + (f" (target < {target_mb:.0f} MB)" if target_mb else "")
    print(f"{'PASS' if ok else 'FAIL'} {name}: cpu {cpu:.2f} s (median of {repeats}; "
          f"target < {target_s:.0f} s), wall {wall:.2f} s{mem}; {runs[-1]['detail']}",
          flush=True)
    return ok


def optuna_target(seeds: list[int], n_trials: int) -> bool:
    from parsearch.model.specs import TrainingSpec
    from parsearch.query import Query
    from parsearch.search import pareto_front

    query = Query("llama3-8b", TrainingSpec(seq_len=8192, global_batch=256), "dgx-h100")
    exact = pareto_front(query, max_gpus=256, method="exhaustive")
    ok = True
    for seed in seeds:
        res = pareto_front(query, max_gpus=256, method="optuna", n_trials=n_trials, seed=seed)
        ratio = res.hypervolume / exact.hypervolume
        ok &= ratio >= 0.99
        print(f"{'PASS' if ratio >= 0.99 else 'FAIL'} optuna seed {seed}: hypervolume "
              f"{100 * ratio:.2f}% of exact (target >= 99%), coverage "
              f"{100 * (res.coverage or 0):.1f}% of {exact.valid:,} valid layouts", flush=True)
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join([*TARGETS, "optuna"]))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--n-trials", type=int, default=500)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_case(args.one)))
        return 0
    print(f"load average {os.getloadavg()}", flush=True)
    ok = True
    for name in args.cases.split(","):
        if name == "optuna":
            ok &= optuna_target([int(s) for s in args.seeds.split(",")], args.n_trials)
        else:
            ok &= measure(name, args.repeats)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
