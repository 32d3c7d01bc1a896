"""Issue 12 target: the vectorized cost model scores >= 1,000,000 layouts per second on one core.

Scores every valid layout of DeepSeek-V3 on 1,024 H100s (MoE: all unit prices, EP/ETP
traffic, memory) and of Llama 3 70B on 256 H100s, timing score_columns only (the median
CPU time of three calls: the machine is shared; run pinned, ``taskset -c 0``).
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(__file__))

import statistics
import time

from parsearch.cost.analytic import build_cost_model, score_columns
from parsearch.layout.space import enumerate_layouts
from parsearch.model.presets import get_preset
from parsearch.model.specs import TrainingSpec
from parsearch.topology.cluster import load_cluster
from parsearch.topology.fabric import build_fabric

TARGET_PER_S = 1_000_000


def measure(model_name: str, gpus: int, training: TrainingSpec) -> tuple[int, float]:
    model = get_preset(model_name)
    table = enumerate_layouts(model, training, gpus)
    cm = build_cost_model(model, training, build_fabric(load_cluster("dgx-h100"), gpus))
    score_columns(cm, table.columns)  # warm the per-fabric caches
    times = []
    for _ in range(3):
        start = time.process_time()
        score_columns(cm, table.columns)
        times.append(time.process_time() - start)
    return len(table), statistics.median(times)


def main() -> int:
    ok = True
    cases = [
        ("deepseek-v3", 1024, TrainingSpec(seq_len=4096, global_batch=8192,
                                           micro_batch_sizes=(1, 2))),
        ("llama3-70b", 256, TrainingSpec(seq_len=8192, global_batch=512)),
    ]
    for name, gpus, training in cases:
        count, seconds = measure(name, gpus, training)
        rate = count / seconds
        status = "PASS" if rate >= TARGET_PER_S else "FAIL"
        ok &= rate >= TARGET_PER_S
        print(f"{status} score {name} on {gpus} GPUs: {count:,} layouts in {seconds:.2f} s = "
              f"{rate:,.0f} layouts/s (target >= {TARGET_PER_S:,})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
