"""Serving search targets (wall clock, best of N):

1. ``serve`` llama3-70b on 64 H100s (1000/1000 tokens, FP8) < 3 s;
2. ``serve`` deepseek-v3 on 64 GB200s (2000/500 tokens, FP8; ~11k layouts) < 30 s;
3. ``serve --mode disaggregated`` llama3-70b on 16 H100s (4000/500 tokens, FP8) < 10 s.

Usage: ``python benchmarks/bench_serve.py [--repeats N]``.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(__file__))

from _timing import best_of, report

from parsearch.model.files import resolve_model
from parsearch.query import Query
from parsearch.serve import ServingWorkload, serve_layouts

CASES = (
    ("llama3-70b on 64 H100", "llama3-70b", "dgx-h100", 64,
     ServingWorkload(isl=1000, osl=1000, precision="fp8", kv_precision="fp8"), 3.0),
    ("deepseek-v3 on 64 GB200", "deepseek-v3", "gb200-nvl72", 64,
     ServingWorkload(isl=2000, osl=500, precision="fp8", kv_precision="fp8"), 30.0),
    ("llama3-70b disaggregated on 16 H100", "llama3-70b", "dgx-h100", 16,
     ServingWorkload(isl=4000, osl=500, precision="fp8", kv_precision="fp8",
                     mode="disaggregated"), 10.0),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    ok = True
    for label, model, cluster, gpus, workload, target in CASES:
        spec = resolve_model(model)
        seconds, result = best_of(args.repeats, lambda s=spec, c=cluster, g=gpus, w=workload:
                                  serve_layouts(Query(s, clusters=c), num_gpus=g,
                                                workload=w))
        best = result.best.estimate
        ok &= report(label, seconds, target,
                     f"({result.considered} layouts; best {best.layout.label()}, "
                     f"{best.tokens_per_s:,.0f} tok/s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
