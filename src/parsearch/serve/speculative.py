"""Speculative decoding and multi-token prediction: tokens per target forward and its cost.

A speculative step drafts ``k`` tokens (with an MTP module, an EAGLE head or a small draft
model), then one target forward verifies all ``k + 1`` positions of every sequence.  With
each draft token accepted with probability ``alpha`` (independently, and the first rejection
ending the step), a step emits ``(1 - alpha^(k+1)) / (1 - alpha)`` tokens on average
(Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding", arXiv
2211.17192, eq. 1: the expected number of tokens per run of the target).  Its time is one
verify pass over ``k + 1`` tokens per sequence (:func:`parsearch.serve.cost.decode_step`
with ``query_tokens``: weights and KV read once, GEMM and attention work ``k + 1`` times)
plus ``k`` draft forwards of ``draft_cost`` decode steps each.  So TPOT is

    (verify step + k * draft_cost * decode step) / expected tokens per step,

which gains most where a decode step is bound by reading weights (small batches) and
little or nothing once the verify pass is compute bound (large batches).

Cited defaults:

* ``mtp``: one MTP module predicting one extra token (DeepSeek-V3 technical report, arXiv
  2412.19437, §2.2 uses depth D = 1), accepted 85-90% of the time (§5.4.3 "the acceptance
  rate of the second token prediction ranges between 85% and 90%"); 0.85 is taken, the low
  end.  The module is one transformer block plus the shared output head (§2.2).
* ``eagle``: a draft head of one decoder layer on the target's features, sharing its
  embedding and LM head (Li et al. 2024, EAGLE, arXiv 2401.15077, §4), chained ``k`` = 3
  deep; per-position acceptance 0.75, inside the 0.6-0.8 range EAGLE reports for its chain
  drafts on MT-bench (ibid. §5, the "n-alpha" acceptance rates).  Real acceptance depends on
  the model, the data and the sampling temperature: give ``--acceptance-rate`` measured on
  your traffic.
* ``draft``: a separate draft model.  Its acceptance rate and relative cost depend on the
  pair (Leviathan et al. §3.5, the cost coefficient ``c``), so both must be given.

The draft forward of ``mtp``/``eagle`` costs one layer's plus the output layer's share of the
target's parameters (decode reads weights, so a pass costs in proportion to the parameters
it reads): ``(active / L + output) / active`` with ``L`` layers, computed from the preset.

>>> round(expected_tokens_per_step(0.85, 1), 3)    # DeepSeek-V3 MTP: 1.85 tokens per step
1.85
>>> expected_tokens_per_step(1.0, 3), expected_tokens_per_step(0.0, 3)
(4.0, 1.0)
"""

from __future__ import annotations

from dataclasses import dataclass

from parsearch.errors import SpecError
from parsearch.model.params import ParameterCounts
from parsearch.model.specs import ModelSpec
from parsearch.serve.spec import ServingWorkload

#: (draft tokens, acceptance rate) defaults per method, cited in the module docstring.
METHOD_DEFAULTS: dict[str, tuple[int, float | None]] = {
    "mtp": (1, 0.85),
    "eagle": (3, 0.75),
    "draft": (4, None),
}


@dataclass(frozen=True)
class Speculation:
    """What one speculative step does: ``draft_tokens`` drafted, each accepted with
    ``acceptance``; a draft forward costs ``draft_cost`` target decode steps."""

    method: str
    draft_tokens: int
    acceptance: float
    draft_cost: float

    @property
    def query_tokens(self) -> int:
        """Tokens per sequence in the verify pass: the drafts plus the target's own."""
        return self.draft_tokens + 1

    @property
    def tokens_per_step(self) -> float:
        return expected_tokens_per_step(self.acceptance, self.draft_tokens)

    def to_dict(self) -> dict[str, float | int | str]:
        return {"method": self.method, "draft_tokens": self.draft_tokens,
                "acceptance_rate": self.acceptance, "draft_cost": round(self.draft_cost, 5),
                "tokens_per_step": round(self.tokens_per_step, 4)}


def draft_tokens(workload: ServingWorkload) -> int:
    """Draft tokens per step: the workload's, else the method's default."""
    return workload.spec_tokens or METHOD_DEFAULTS[workload.spec_decode][0]


def expected_tokens_per_step(alpha: float, draft_tokens: int) -> float:
    """Tokens a verify step emits on average: ``sum_{i=0..k} alpha^i = (1 - alpha^(k+1)) /
    (1 - alpha)`` (Leviathan et al. 2023, eq. 1); ``k + 1`` when every draft is accepted."""
    if alpha >= 1.0:
        return float(draft_tokens + 1)
    return (1.0 - alpha ** (draft_tokens + 1)) / (1.0 - alpha)


def head_draft_cost(model: ModelSpec, counts: ParameterCounts) -> float:
    """One MTP/EAGLE draft forward as a share of a target decode pass: one layer's active
    parameters plus the output layer over the target's active parameters."""
    active = float(counts.active)
    per_layer = max(active - counts.embedding - counts.output, 0.0) / model.num_layers
    return min(1.0, (per_layer + float(counts.output or counts.embedding)) / active)


def speculation_for(model: ModelSpec, workload: ServingWorkload,
                    counts: ParameterCounts) -> Speculation | None:
    """The workload's speculative decoding with defaults filled in (None when off)."""
    method = workload.spec_decode
    if method == "none":
        return None
    if method == "mtp" and model.mtp_layers == 0:
        raise SpecError(f"--spec-decode mtp: {model.name} has no multi-token-prediction module "
                        "(mtp_layers 0 in its config); use --spec-decode eagle or draft")
    alpha = METHOD_DEFAULTS[method][1]
    cost = workload.draft_cost
    if cost is None:
        cost = head_draft_cost(model, counts)
    acceptance = workload.acceptance_rate if workload.acceptance_rate is not None else alpha
    if acceptance is None:  # spec.py refuses a draft model without one; kept for type checks
        raise ValueError("draft speculation needs an acceptance rate")
    return Speculation(method=method, draft_tokens=draft_tokens(workload),
                       acceptance=float(acceptance), draft_cost=float(cost))


def speculative_tpot_s(spec: Speculation, verify_tpot_s: float, plain_tpot_s: float) -> float:
    """Time per output token with speculation: a verify pass (``verify_tpot_s``, the
    ``k + 1``-token decode round) plus ``k`` draft forwards of ``draft_cost`` plain decode
    rounds each, over the tokens a step emits."""
    step = verify_tpot_s + spec.draft_tokens * spec.draft_cost * plain_tpot_s
    return step / spec.tokens_per_step
