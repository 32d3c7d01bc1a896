"""Hypothesis strategies shared by the tests: small random models and setups."""

from __future__ import annotations

from hypothesis import HealthCheck
from hypothesis import strategies as st

from parsearch.cost.memory import MemoryOptions
from parsearch.model.specs import ModelSpec, MoeSpec, TrainingSpec


@st.composite
def small_models(draw: st.DrawFn, moe: bool | None = None) -> ModelSpec:
    """A small dense or MoE model whose sizes have varied divisors."""
    heads = draw(st.sampled_from([1, 2, 3, 4, 6, 8, 12]))
    groups = draw(st.sampled_from([g for g in (1, 2, 3, 4, 6, 8, 12) if heads % g == 0]))
    head_dim = draw(st.sampled_from([16, 32]))
    hidden = heads * head_dim
    layers = draw(st.integers(1, 8))
    ffn = draw(st.sampled_from([hidden * 2, hidden * 3, hidden * 4, 96, 120]))
    use_moe = draw(st.booleans()) if moe is None else moe
    moe_spec = None
    if use_moe:
        experts = draw(st.sampled_from([2, 3, 4, 6, 8]))
        moe_spec = MoeSpec(
            num_experts=experts,
            top_k=draw(st.integers(1, experts)),
            expert_ffn_hidden_size=draw(st.sampled_from([32, 48, 64, 96])),
            first_k_dense=draw(st.integers(0, max(0, layers - 1))),
            layer_freq=draw(st.integers(1, 2)),
        )
    return ModelSpec(
        name="random",
        num_layers=layers,
        hidden_size=hidden,
        ffn_hidden_size=ffn,
        num_attention_heads=heads,
        num_query_groups=groups,
        head_dim=head_dim,
        vocab_size=draw(st.sampled_from([1000, 1024])),
        moe=moe_spec,
    )


@st.composite
def small_trainings(draw: st.DrawFn) -> TrainingSpec:
    """A training setup with small batch and sequence sizes."""
    return TrainingSpec(
        seq_len=draw(st.sampled_from([6, 8, 12, 16, 24, 32, 48])),
        global_batch=draw(st.integers(1, 24)),
        micro_batch_sizes=tuple(sorted(draw(st.sets(st.integers(1, 4), min_size=1)))),
        recompute_modes=tuple(
            sorted(draw(st.sets(st.sampled_from(["none", "selective", "full"]), min_size=1)))
        ),
        pipeline_split=draw(st.sampled_from(["even", "uneven"])),
        sequence_parallel=draw(st.sampled_from(["both", "on", "off"])),
        max_vpp=draw(st.one_of(st.none(), st.integers(1, 4))),
    )


#: Health checks the memory-feature searches' property tests relax (each example builds
#: and scores a layout table).
SLOW = [HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large]
#: Memory options without the framework's fixed overhead, so only the priced terms count.
NO_OVERHEAD = MemoryOptions(framework_overhead_bytes=0.0)
