"""What ``--cpu-offloading`` leaves in HBM: the tensors Transformer Engine's offload does not
move (``activations.offload_kept_bytes``).

Before TE 2.10, Megatron-Core's offload moves only the saved tensors marked for Transformer
Engine's offload context.  The MLP activation function's input (the FC1 output) is marked in
the dense MLP from Megatron-Core 0.13 on, never in the experts: an offloaded MoE layer keeps
its experts' SwiGLU inputs in HBM, and on Megatron-Core <= 0.12 a dense layer keeps its own.
From TE 2.10 (the current stack) every saved tensor of at least 256k elements moves.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.cost.analytic import build_cost_model, estimate
from parsearch.cost.memory import MemoryOptions
from parsearch.cost.memory.activations import ActDegrees, layer_bytes, offload_kept_bytes
from parsearch.cost.memory.options import ACTIVATION_BYTES, TE_OFFLOAD_MIN_ELEMENTS
from parsearch.cost.options import CostOptions
from parsearch.cost.stacks import get_stack, stack_options
from parsearch.layout import parse_layout_string
from parsearch.model.presets import get_preset
from parsearch.model.specs import RECOMPUTE_CODES, TrainingSpec
from parsearch.topology.cluster import load_cluster
from parsearch.topology.fabric import build_fabric
from tests.cli_helpers import run_cli

MIXTRAL = get_preset("mixtral-8x22b")
LLAMA = get_preset("llama3-70b")
DEEPSEEK = get_preset("deepseek-v3")
NONE = RECOMPUTE_CODES["none"]
#: Transformer Engine before 2.10: only the tensors marked for offload move
MARKED_ONLY = MemoryOptions(offload_moves_every_saved_tensor=False)


def _deg(tp: int = 4, cp: int = 2, ep: int = 8, mbs: int = 1) -> ActDegrees:
    return ActDegrees(tp=float(tp), cp=float(cp), ep=float(ep), etp=1.0, mbs=float(mbs),
                      sp_div=float(tp))


def _training(k: int = 0, seq: int = 16384) -> TrainingSpec:
    return TrainingSpec(seq_len=seq, global_batch=64, micro_batch_sizes=(1,),
                        activation_offload_layers=k)


def test_dense_swiglu_input_moves_from_mcore_013_and_stays_before() -> None:
    training, deg = _training(), _deg()
    assert offload_kept_bytes(LLAMA, training, False, deg, MARKED_ONLY) == 0.0
    old = replace(MARKED_ONLY, offload_moves_mlp_activation_input=False)
    tokens = 16384 / 2  # mbs x seq / cp
    # the FC1 output a SwiGLU saves: gate and up, 2 x ffn / tp elements per token, BF16
    expected = tokens * 2 * LLAMA.ffn_hidden_size / 4 * ACTIVATION_BYTES
    assert offload_kept_bytes(LLAMA, training, False, deg, old) == pytest.approx(expected)


def test_expert_swiglu_input_and_router_logits_always_stay() -> None:
    """Before TE 2.10: the experts' SwiGLU input is never marked (Megatron-Core 0.11 through
    current), nor are the router's fp32 logits: top_k copies of 2 x expert ffn per token per
    TP rank, plus 4 x experts bytes per token per TP rank, under either stack flag."""
    training, deg = _training(), _deg()
    moe = MIXTRAL.moe
    assert moe is not None
    tokens = 16384 / 2
    routed = tokens / 4 * moe.top_k * 2 * moe.expert_ffn_hidden_size * ACTIVATION_BYTES
    router = tokens * 4 * moe.num_experts / 4
    for flag in (True, False):
        kept = offload_kept_bytes(MIXTRAL, training, True, deg,
                                  replace(MARKED_ONLY, offload_moves_mlp_activation_input=flag))
        # balanced routing by default: imbalance 1
        assert kept == pytest.approx(routed + router)


def test_from_te_2_10_only_tensors_under_256k_elements_stay() -> None:
    """TE's rewritten offload moves every saved tensor of at least 256k elements: the
    experts' SwiGLU inputs move; the router's fp32 logits stay only where they are smaller
    (Mixtral: 8 experts; DeepSeek-V3's 256 experts over 8,192 tokens are 2M elements)."""
    training, deg = _training(), _deg(tp=4, cp=2)
    every = MemoryOptions()
    assert every.offload_moves_every_saved_tensor
    tokens = 16384 / 2
    mixtral_logits = tokens * MIXTRAL.moe.num_experts / 4  # elements per TP rank
    assert mixtral_logits < TE_OFFLOAD_MIN_ELEMENTS
    assert offload_kept_bytes(MIXTRAL, training, True, deg, every) == pytest.approx(
        mixtral_logits * 4)
    deep = _deg(tp=1, cp=2, ep=8)
    assert tokens * DEEPSEEK.moe.num_experts >= TE_OFFLOAD_MIN_ELEMENTS
    assert offload_kept_bytes(DEEPSEEK, training, True, deep, every) == 0.0
    # and a dense layer keeps nothing, whatever its MLP
    assert offload_kept_bytes(LLAMA, training, False, deg, every) == 0.0
    assert offload_kept_bytes(LLAMA, training, False, deg, replace(
        every, offload_moves_mlp_activation_input=False)) == 0.0


@settings(max_examples=30, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), cp=st.sampled_from([1, 2, 4]),
       mbs=st.sampled_from([1, 2, 4]), seq=st.sampled_from([4096, 8192, 32768]),
       moe=st.booleans(), moves=st.booleans())
def test_what_stays_is_part_of_what_the_layer_saves(tp: int, cp: int, mbs: int, seq: int,
                                                     moe: bool, moves: bool) -> None:
    """What stays is part of what the layer saves, and TE >= 2.10 keeps no more than the
    marking offload did."""
    training = _training(seq=seq)
    deg = _deg(tp=tp, cp=cp, mbs=mbs)
    marked = replace(MARKED_ONLY, offload_moves_mlp_activation_input=moves)
    every = replace(marked, offload_moves_every_saved_tensor=True)
    kept = offload_kept_bytes(MIXTRAL, training, moe, deg, marked)
    saved = layer_bytes(MIXTRAL, training, moe, deg, marked).of(np.asarray(NONE))
    assert 0.0 <= kept < saved
    assert 0.0 <= offload_kept_bytes(MIXTRAL, training, moe, deg, every) <= kept


def _options(stack: str | None) -> CostOptions:
    # no per-layer CUDA graphs: Megatron runs none beside CPU offloading
    options = CostOptions(cuda_graphs=False)
    return options if stack is None else stack_options(get_stack(stack), options)


def _activations(k: int, stack: str | None = None) -> float:
    training = _training(k)
    fabric = build_fabric(load_cluster("dgx-h100"), 64)
    cm = build_cost_model(MIXTRAL, training, fabric, options=_options(stack))
    layout = parse_layout_string("tp=4,pp=1,cp=2,ep=8,sp=true,mbs=1,recompute=none", 64)
    return float(estimate(cm, layout).memory_bytes["activations"])


@pytest.mark.parametrize("stack", ["mcore-0.11", "mcore-current"])
def test_each_offloaded_moe_layer_frees_what_it_moves_not_what_it_saves(stack: str) -> None:
    """From the second offloaded layer on (the first is the one in flight), each further
    offloaded layer frees its saved activations less what stays in HBM."""
    training, deg = _training(), _deg()
    options = _options(stack).memory
    saved = float(layer_bytes(MIXTRAL, training, True, deg, options).of(np.asarray(NONE)))
    kept = float(offload_kept_bytes(MIXTRAL, training, True, deg, options))
    freed = _activations(10, stack) - _activations(11, stack)
    assert freed == pytest.approx(saved - kept, rel=1e-9)
    if stack == "mcore-0.11":
        assert freed < 0.5 * saved  # the experts' SwiGLU inputs are most of a Mixtral layer
    else:
        assert freed > 0.999 * saved  # only the router's 64 KiB of logits stay


def test_the_stack_sets_whether_the_dense_swiglu_input_moves() -> None:
    old = stack_options(get_stack("mcore-0.11"), CostOptions())
    new = stack_options(get_stack("mcore-current"), CostOptions())
    assert not old.memory.offload_moves_mlp_activation_input
    assert new.memory.offload_moves_mlp_activation_input
    assert not old.memory.offload_moves_every_saved_tensor
    assert new.memory.offload_moves_every_saved_tensor
    # and back: the newer stack restores what the older one turned off
    again = stack_options(get_stack("mcore-current"), replace(old, search_features=()))
    assert again.memory.offload_moves_mlp_activation_input
    assert again.memory.offload_moves_every_saved_tensor


def test_without_offload_nothing_changes_with_the_stack_flag() -> None:
    assert _activations(0, "mcore-0.11") == _activations(0, "mcore-current")
    # with offload, the current stack's TE moves the experts' SwiGLU inputs too
    assert _activations(20, "mcore-0.11") > _activations(20, "mcore-current")


def test_explain_says_what_the_offloaded_layers_keep() -> None:
    common = ("explain", "--cluster", "dgx-h100", "--gpus", "64", "--global-batch", "64",
              "--seq-len", "16384", "--format", "json", "--activation-offload-layers", "40")
    moe_layout = ("--model", "mixtral-8x22b",
                  "--layout", "tp=4,pp=1,cp=2,ep=8,sp=true,mbs=1,recompute=none")
    moe = run_cli(*common, *moe_layout, "--stack", "mcore-0.14")
    assert moe.code == 0, moe.err
    flags = json.loads(moe.out)["flags"]
    kept = [f for f in flags if "keeps part of its activations in HBM" in f]
    assert len(kept) == 1 and "MoE" in kept[0] and "40 offloaded layers" in kept[0]
    # the current stack's TE (>= 2.10) moves them: nothing to say
    current = run_cli(*common, *moe_layout)
    assert current.code == 0, current.err
    assert not [f for f in json.loads(current.out)["flags"] if "keeps part" in f]
    # a dense SwiGLU model on the current stack moves its whole MLP: nothing to say
    dense = run_cli(*common, "--model", "llama3-70b",
                    "--layout", "tp=8,pp=1,sp=true,mbs=1,recompute=none")
    assert dense.code == 0, dense.err
    assert not [f for f in json.loads(dense.out)["flags"] if "keeps part" in f]


@pytest.mark.parametrize(("container", "moves_every"),
                         [("25.09", False), ("25.11", False), ("26.02", True), ("26.08", True)])
def test_published_runs_are_read_with_their_containers_offload(container: str,
                                                               moves_every: bool) -> None:
    """Megatron-Bridge 0.2.0 (NeMo 25.11) pinned TE 2.9, 0.3.0 (NeMo 26.02) TE 2.12: a
    published run is read with the offload its container ran, not only its stack's."""
    from parsearch.validation.published.run_conventions import offload_of_source
    source = f"Megatron-Bridge perf summary (NeMo {container} container)"
    assert offload_of_source(source) == (True, moves_every)
