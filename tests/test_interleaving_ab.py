"""Interleaving A/B from published runs (issue 32 item 3: deep interleaving wins only where
the pricing says so).

NVIDIA's Megatron-Bridge performance tables (held-out rows of ``independent_runs.csv``,
never fitted) list Llama 3.1 405B FP8 on 256 GB200 with TP4 PP16 at virtual pipeline size 4
and 8 in the same container release, everything else equal.  With 126 layers over 16 stages,
VPP 8 is one layer per model chunk.  Measured, VPP 4 is faster in every release (by 1-8%):
halving the bubble does not pay for twice the chunk boundaries.  The priced order must agree.
"""

from __future__ import annotations

import warnings

import pytest

from parsearch.validation.published.published_runs import load_heldout_runs
from parsearch.validation.published.run_conventions import release_of
from parsearch.validation.published.runs import validate_runs

#: (release, VPP 4 row, VPP 8 row): the same-release pairs of the table.
SAME_RELEASE_PAIRS = [
    ((26, 2), "i0212", "i0210"),
    ((26, 2, 1), "i0206", "i0204"),
    ((26, 4), "i0200", "i0198"),
    ((26, 4, 1), "i0191", "i0192"),
    ((26, 6), "i0184", "i0185"),
]


@pytest.fixture(scope="module")
def runs() -> dict[str, object]:
    return {run.id: run for run in load_heldout_runs()}


@pytest.mark.parametrize(("release", "vpp4_id", "vpp8_id"), SAME_RELEASE_PAIRS)
def test_shallower_interleaving_is_priced_faster_as_measured(runs, release, vpp4_id,
                                                             vpp8_id) -> None:
    shallow, deep = runs[vpp4_id], runs[vpp8_id]
    # the pair differs in VPP only
    assert release_of(shallow.source) == release_of(deep.source) == release
    assert (shallow.layout.vpp, deep.layout.vpp) == (4, 8)
    assert shallow.layout.key().replace("vpp4", "vpp8") == deep.layout.key()
    assert shallow.measured_tokens_per_s_per_gpu >= deep.measured_tokens_per_s_per_gpu
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows = {row.id: row for row in validate_runs([shallow, deep]).rows}
    assert set(rows) == {vpp4_id, vpp8_id}, "both rows must be scored"
    predicted = (rows[vpp8_id].predicted_tokens_per_s_per_gpu
                 / rows[vpp4_id].predicted_tokens_per_s_per_gpu)
    assert predicted < 1.0, f"VPP 8 priced {predicted:.3f}x of VPP 4; measured slower"
