"""Optional: apply the emitted overrides to real Megatron-Bridge recipes and read back the layout.

Skipped unless Megatron-Bridge and its Megatron-LM are importable (run it with
``benchmarks/run_launch_integration.py``).  Each case starts from a recipe whose
own settings fight the layout (its VPP, its mixed-precision and
communication-overlap objects), applies the overrides with Bridge's own
``process_config_with_overrides`` — as the Hydra CLI list (what
``run_recipe.py`` does) and as the nested YAML file of ``search --export``
(``config_filepath``) — runs Bridge's mixed-precision setup the way
``ConfigContainer.validate`` does, and checks the resolved config is the
priced layout, with the features the cost model does not price turned off
(three recipes that turn one on: fine-grained activation offloading,
``external_cuda_graph``, deterministic mode).

Both model layouts are covered: Bridge v0.6.0 recipes hold a flat
``GPTModelProvider``; on Bridge main the Llama recipes hold a
``BridgeGPTModelConfig`` whose Transformer fields sit under
``model.transformer`` (``src/parsearch/launch/bridge.py`` says why ``++model.*``
resolves on both).  On the nested layout every Transformer field is read from
``model.transformer`` and must not be shadowed on the outer object.

Last runs (2026-12-06, CPU, Python 3.11, torch 2.13.0+cpu, hydra-core 1.3.2,
transformers 5.12.1, accelerate 1.16.0, triton 3.9.0), with ``git archive``
checkouts of NVIDIA-NeMo/Megatron-Bridge and NVIDIA/Megatron-LM::

    python benchmarks/run_launch_integration.py --megatron-lm MLM --bridge BRIDGE

    BRIDGE v0.6.0 (51885cf1), MLM cd4afffa (its pin)     55 passed (every recipe flat)
    BRIDGE main 067f987d, MLM 2a75ac12 (its pin)         55 passed (Llama nested,
                                                         DeepSeek-V3 and Qwen3 MoE flat)
    BRIDGE main 067f987d, MLM d98e8a64                   55 passed

(55 = 17 Megatron-LM cases + 16 Bridge cases x {cli, yaml} + 3 recipes that
turn on an unpriced feature + 2 recipes whose kernel switches and environment
differ from the priced ones (DeepSeek-V3 GB200: TE cross-entropy, router
fusion, NVTE_ALLOW_NONDETERMINISTIC_ALGO=0, its own HybridEP topology; Llama 3
8B H100 FP8: TE cross-entropy) + the layout check.  With the kernel pins left
out of the overrides (v0.6.0), 37 of them fail: every Bridge case and both of these.)
With plain ``model.X=v`` keys, Bridge main refused the CLI route of all 13
Llama cases ("Could not override 'model.tensor_model_parallel_size' ... not in
struct"); the YAML route passed, a merged file not being in struct mode.
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path
from typing import Any

import pytest
import yaml

from parsearch.launch.bridge import kernel_pins
from tests.launch_cases import LAUNCH_CASES, LaunchCase

#: model preset -> (module, recipe function) of a Bridge performance recipe
#: (the same names in v0.6.0 and main)
RECIPES: dict[str, tuple[str, str]] = {
    "llama3-70b": ("megatron.bridge.perf_recipes.llama.h100.llama3",
                   "llama3_70b_pretrain_64gpu_h100_bf16_config"),
    "llama3-8b": ("megatron.bridge.perf_recipes.llama.h100.llama3",
                  "llama3_8b_pretrain_8gpu_h100_fp8cs_config"),
    "deepseek-v3": ("megatron.bridge.perf_recipes.deepseek.gb200.deepseek_v3",
                    "deepseek_v3_pretrain_256gpu_gb200_fp8mx_config"),
    "qwen3-30b-a3b": ("megatron.bridge.perf_recipes.qwen.gb200.qwen3_moe",
                      "qwen3_30b_a3b_pretrain_8gpu_gb200_bf16_config"),
}
CASES = [c for c in LAUNCH_CASES if c.model_name in RECIPES]
#: launch case -> a recipe (same name in v0.6.0 and main) that turns on a feature the cost
#: model does not price, and that feature's model field
FEATURE_RECIPES: dict[str, tuple[str, str, str]] = {
    "moe-nvl72-flex": ("megatron.bridge.perf_recipes.deepseek.gb200.deepseek_v3",
                       "deepseek_v3_pretrain_256gpu_gb200_fp8mx_partial_cg_dev_config",
                       "fine_grained_activation_offloading"),
    "moe-mxfp8-fusions-gb300": ("megatron.bridge.perf_recipes.qwen.gb200.qwen3_moe",
                                "qwen3_30b_a3b_pretrain_16gpu_gb200_fp8mx_partial_cg_dev_config",
                                "external_cuda_graph"),
    "dense-interleaved": ("megatron.bridge.recipes.llama.h100.llama3",
                          "llama3_70b_pretrain_32gpu_h100_bf16_deterministic_config",
                          "deterministic_mode"),
}


def _bridge() -> Any:
    try:
        return importlib.import_module("megatron.bridge.training.utils.omegaconf_utils")
    except Exception as error:  # any import failure means: not available here
        pytest.skip(f"Megatron-Bridge is not importable: {error}")


def _recipe(module: str, function: str) -> Any:
    return getattr(importlib.import_module(module), function)()


def _is_nested(model: Any) -> bool:
    """Whether the model config keeps its Transformer fields under ``transformer``."""
    return dataclasses.is_dataclass(model) and any(
        f.name == "transformer" for f in dataclasses.fields(model))


class _Fields:
    """Reads a model field where its layout keeps it; refuses a shadowed copy."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.inner = model.transformer if _is_nested(model) else None

    def __getattr__(self, name: str) -> Any:
        if self.inner is not None and any(f.name == name
                                          for f in dataclasses.fields(self.inner)):
            assert name not in vars(self.model), f"model.{name} shadows model.transformer"
            return getattr(self.inner, name)
        return getattr(self.model, name)


def _apply(omegaconf_utils: Any, cfg: Any, launch: Any, route: str, tmp_path: Path) -> Any:
    if route == "cli":
        return omegaconf_utils.process_config_with_overrides(
            cfg, cli_overrides=list(launch.bridge_overrides))
    from parsearch.launch.bridge import bridge_fields, nested
    from parsearch.launch.names import bridge_groups

    path = tmp_path / "bridge_overrides.yaml"
    path.write_text(yaml.safe_dump(nested(bridge_fields(launch.plan, bridge_groups()))))
    return omegaconf_utils.process_config_with_overrides(cfg, config_filepath=str(path))


def _assert_priced(cfg: Any, case: LaunchCase, launch: Any) -> None:
    """The resolved config is the priced layout, with the unpriced features off."""
    if cfg.mixed_precision is not None:  # what ConfigContainer.validate would copy over
        cfg.mixed_precision.setup(cfg.model, cfg.optimizer, cfg.ddp)
    model, lay, plan = _Fields(cfg.model), case.layout, launch.plan
    assert cfg.mixed_precision is None and cfg.comm_overlap is None
    assert (model.tensor_model_parallel_size, model.pipeline_model_parallel_size,
            model.context_parallel_size) == (lay.tp, lay.pp, lay.cp)
    assert (model.virtual_pipeline_model_parallel_size or 1) == lay.vpp
    assert model.pipeline_model_parallel_layout == plan.pipeline_layout
    assert not model.account_for_embedding_in_pipeline_split
    assert model.sequence_parallel == lay.sp
    assert cfg.train.micro_batch_size == lay.mbs
    assert cfg.train.global_batch_size == case.training.global_batch
    assert cfg.dataset.seq_length == cfg.model.seq_length == case.training.seq_len
    assert (model.recompute_granularity, model.recompute_method, model.recompute_num_layers) \
        == (plan.recompute_granularity, plan.recompute_method, plan.recompute_num_layers)
    assert model.cpu_offloading_num_layers == plan.offload_layers
    assert model.tp_comm_overlap == plan.tp_comm_overlap
    assert cfg.ddp.use_megatron_fsdp == plan.fsdp
    assert cfg.ddp.use_distributed_optimizer == plan.distributed_optimizer
    assert cfg.ddp.fp8_param_gather == (plan.fp8_param_gather and plan.precision == "fp8")
    assert model.fp8 == ({"mxfp8": "e4m3"}.get(plan.fp8_recipe or "", "hybrid")
                         if plan.precision == "fp8" else None)
    assert model.fp4 == ("e2m1" if plan.precision == "fp4" else None)
    if plan.precision == "fp8":
        assert model.fp8_recipe == plan.fp8_recipe
    assert model.bf16 and not model.fp16
    assert str(model.params_dtype).endswith("bfloat16")
    assert model.cuda_graph_impl == (plan.cuda_graph_impl if plan.cuda_graphs else "none")
    if plan.cuda_graphs:
        assert model.use_te_rng_tracker
    if case.model.is_moe:
        assert model.expert_model_parallel_size == lay.ep
        assert model.moe_token_dispatcher_type == plan.moe_dispatcher
    # features no recipe may bring in unpriced
    assert (model.overlap_p2p_comm, model.batch_p2p_comm) == (lay.pp > 1 and lay.vpp > 1,
                                                              lay.pp > 1 and lay.vpp == 1)
    assert model.microbatch_group_size_per_vp_stage in (None, lay.pp)
    assert not (model.enable_cuda_graph or model.external_cuda_graph
                or model.fine_grained_activation_offloading or model.deterministic_mode)
    assert model.cp_comm_type == "p2p" and model.cross_entropy_loss_fusion
    assert not cfg.optimizer.optimizer_cpu_offload
    assert cfg.ddp.num_distributed_optimizer_instances == 1
    for name, value in launch.env:
        assert str(cfg.env_vars[name]) == value
    # kernel switches pinned to the priced kernels (fusions, SM counts, empty_cache)
    for key, value in kernel_pins(plan).items():
        group, field = key.split(".", 1)
        got = getattr(model if group == "model" else getattr(cfg, group), field)
        assert got == value, f"{key}: {got!r}, priced {value!r}"


def _recipe_value(cfg: Any, key: str) -> Any:
    group, field = key.split(".", 1)
    if group == "env_vars":
        return None if field not in cfg.env_vars else str(cfg.env_vars[field])
    return getattr(_Fields(cfg.model) if group == "model" else getattr(cfg, group), field)


#: recipe -> pinned fields its own settings differ on (checked before the overrides, so
#: the test fails if a recipe stops differing rather than passing vacuously)
DIFFERING: dict[str, tuple[str, ...]] = {
    # perf_recipes/_common.py: cross_entropy_fusion_impl="te"; deepseek/common.py:
    # moe_router_fusion=True; the GB200 env_vars: NVTE_ALLOW_NONDETERMINISTIC_ALGO=0,
    # HybridEP topology for its own EP
    "deepseek-v3": ("model.cross_entropy_fusion_impl", "model.moe_router_fusion",
                    "env_vars.NVTE_ALLOW_NONDETERMINISTIC_ALGO",
                    "env_vars.NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"),
    # perf_recipes/_common.py: cross_entropy_fusion_impl="te" (Llama 3 H100 FP8 recipe)
    "llama3-8b": ("model.cross_entropy_fusion_impl",),
}


@pytest.mark.parametrize("model_name", sorted(DIFFERING))
def test_recipe_kernel_settings_that_differ_are_pinned(model_name: str, tmp_path: Path) -> None:
    """A recipe whose fusions / SM counts / environment differ from the priced ones gets
    the priced values (both routes)."""
    omegaconf_utils = _bridge()
    case = next(c for c in CASES if c.model_name == model_name)
    launch = case.settings()
    wanted = {**kernel_pins(launch.plan),
              **{f"env_vars.{name}": value for name, value in launch.env}}
    for route in ("cli", "yaml"):
        recipe = _recipe(*RECIPES[model_name])
        differ = {k for k in wanted if _recipe_value(recipe, k) != wanted[k]}
        assert set(DIFFERING[model_name]) <= differ, (
            f"{RECIPES[model_name][1]} no longer differs on "
            f"{sorted(set(DIFFERING[model_name]) - differ)}")
        cfg = _apply(omegaconf_utils, recipe, launch, route, tmp_path)
        for key in sorted(differ):
            assert _recipe_value(cfg, key) == wanted[key], (route, key)


@pytest.mark.parametrize("route", ["cli", "yaml"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_bridge_overrides_yield_the_priced_layout(case: LaunchCase, route: str,
                                                  tmp_path: Path) -> None:
    omegaconf_utils = _bridge()
    launch = case.settings()
    cfg = _apply(omegaconf_utils, _recipe(*RECIPES[case.model_name]), launch, route, tmp_path)
    _assert_priced(cfg, case, launch)


@pytest.mark.parametrize("case_name", sorted(FEATURE_RECIPES))
def test_recipe_features_the_cost_model_does_not_price_are_reset(case_name: str,
                                                                 tmp_path: Path) -> None:
    omegaconf_utils = _bridge()
    case = next(c for c in LAUNCH_CASES if c.name == case_name)
    module, function, field = FEATURE_RECIPES[case_name]
    recipe = _recipe(module, function)
    assert getattr(recipe.model, field), f"{function} no longer sets {field}"
    launch = case.settings()
    _assert_priced(_apply(omegaconf_utils, recipe, launch, "cli", tmp_path), case, launch)


def test_both_model_layouts_are_exercised() -> None:
    """v0.6.0: every recipe is flat; a Bridge with ``BridgeGPTModelConfig``: Llama is nested."""
    _bridge()
    layouts = {name: _is_nested(_recipe(*where).model) for name, where in RECIPES.items()}
    try:
        importlib.import_module("megatron.bridge.models.gpt.model_config")
    except ImportError:  # v0.6.0 has no nested model config
        assert not any(layouts.values()), layouts
    else:
        assert layouts["llama3-70b"] and layouts["llama3-8b"], layouts
