"""Issue 2 target: every layout of DeepSeek-V3 on 1,024 GPUs (uneven split, mbs 1 and 2) < 0.5 s."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")

sys.path.insert(0, os.path.dirname(__file__))

from _timing import best_of, report

from parsearch.layout.space import enumerate_layouts
from parsearch.model.presets import get_preset
from parsearch.model.specs import TrainingSpec


def main() -> int:
    model = get_preset("deepseek-v3")
    training = TrainingSpec(seq_len=4096, global_batch=8192, micro_batch_sizes=(1, 2),
                            pipeline_split="uneven")
    seconds, table = best_of(5, lambda: enumerate_layouts(model, training, 1024))
    ok = report("enumerate deepseek-v3 on 1024 GPUs", seconds, 0.5,
                f"({len(table):,} valid layouts, global batch 8192, seq 4096)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
