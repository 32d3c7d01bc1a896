"""Kernel switches a Bridge recipe may set (fusions, SM counts, empty_cache, environment)
are written to the values the cost model prices, on both model layouts; no Bridge needed.

The real check against Bridge v0.6.0 and main recipes is
``test_recipe_kernel_settings_that_differ_are_pinned`` in
``tests/test_launch_bridge_integration.py``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.cost.communication import FLEX_DISPATCH_SMS
from parsearch.launch.bridge import bridge_fields, bridge_overrides, kernel_pins, override
from parsearch.launch.names import bridge_groups, bridge_nested_model
from parsearch.launch.plan import PINNED_ENV, LaunchPlan, hybridep_topology
from tests.launch_cases import LAUNCH_CASES, LaunchCase

NESTED = bridge_nested_model()
GROUPS = bridge_groups()
PLANS = {c.name: c.settings().plan for c in LAUNCH_CASES}
#: pins every launch writes, whatever the plan
ALWAYS = {"model.bias_dropout_fusion": True, "model.gradient_accumulation_fusion": True,
          "model.cross_entropy_fusion_impl": "native", "train.empty_unused_memory_level": 0,
          "model.tp_comm_overlap_cfg": None}


def _variant(base: str, gated: bool, mla: bool, flash: bool, moe: bool,
             flex: str | None) -> LaunchPlan:
    return dataclasses.replace(PLANS[base], gated_mlp=gated, mla=mla, flash_attention=flash,
                               is_moe=moe, flex_backend=flex if moe else None,
                               moe_dispatcher=("flex" if flex else "alltoall") if moe else None)


PLAN_VARIANTS = st.builds(_variant, st.sampled_from(sorted(PLANS)), st.booleans(),
                          st.booleans(), st.booleans(), st.booleans(),
                          st.sampled_from([None, *sorted(FLEX_DISPATCH_SMS)]))


@settings(max_examples=80, deadline=None)
@given(plan=PLAN_VARIANTS)
def test_the_pin_table(plan: LaunchPlan) -> None:
    """Which kernel switches are pinned, and to what, follows what the plan priced."""
    pins = kernel_pins(plan)
    assert {k: pins[k] for k in ALWAYS} == ALWAYS
    assert pins["model.bias_activation_fusion"] is plan.gated_mlp
    assert pins.get("model.use_te_activation_func", "absent") == (
        False if plan.gated_mlp else "absent")
    assert pins.get("model.apply_rope_fusion", "absent") == ("absent" if plan.mla else True)
    assert pins.get("model.masked_softmax_fusion", "absent") == (
        "absent" if plan.flash_attention else True)
    moe = {"model.moe_permute_fusion": True, "model.moe_router_fusion": False,
           "model.moe_router_padding_for_quantization": False,
           "model.moe_router_padding_for_fp8": False}
    assert {k: pins[k] for k in moe if k in pins} == (moe if plan.is_moe else {})
    flex = {k: pins[k] for k in pins if "num_sms" in k}
    assert flex == ({"model.moe_flex_dispatcher_num_sms": FLEX_DISPATCH_SMS[plan.flex_backend],
                     "model.moe_deepep_num_sms": None, "model.moe_hybridep_num_sms": None}
                    if plan.flex_backend else {})
    # every pin reaches the overrides, once, as written, and names a recorded field on the
    # flat layout and on the nested one (outer or under model.transformer)
    overrides = bridge_overrides(plan, GROUPS)
    for key, value in pins.items():
        assert overrides.count(override(key, value)) == 1, key
        group, field = key.split(".", 1)
        assert field in GROUPS[group], key
        if group == "model":
            assert field in NESTED["outer"] | NESTED["transformer"], key


def _parse(value: str) -> Any:
    """A Hydra override value back to Python (our values: null, bools, numbers, strings)."""
    return yaml.safe_load(value)


def _apply(overrides: tuple[str, ...], recipe: dict[str, Any], layout: str) -> dict[str, Any]:
    """Apply ``++model.X=v`` / ``group.X=v`` the way Bridge resolves them on ``layout``.

    Flat: the model dict holds every field.  Nested: Hydra's ``++`` adds ``X`` to the
    outer ``model`` dict and Bridge's ``_apply_overrides`` sets it with ``setattr``, which
    ``BridgeGPTModelConfig`` forwards to ``model.transformer`` for a Transformer field.
    """
    cfg = {group: dict(fields) for group, fields in recipe.items()}
    if layout == "nested":
        cfg["model"] = {"transformer": {k: v for k, v in recipe["model"].items()
                                        if k in NESTED["transformer"]},
                        **{k: v for k, v in recipe["model"].items()
                           if k not in NESTED["transformer"]}}
    for item in overrides:
        key, _, text = item.removeprefix("++").partition("=")
        group, _, field = key.partition(".")
        if not field or group not in cfg:
            continue
        node = cfg[group]
        if group == "model" and layout == "nested" and field in NESTED["transformer"]:
            node = node["transformer"]
        node[field] = _parse(text)
    return cfg


def _read(cfg: dict[str, Any], key: str, layout: str) -> Any:
    group, field = key.split(".", 1)
    node = cfg[group]
    if group == "model" and layout == "nested" and field in NESTED["transformer"]:
        node = node["transformer"]
    return node[field]


def _otherwise(value: Any) -> Any:
    """A value a recipe may hold instead of the pin."""
    if isinstance(value, bool):
        return not value
    return {None: 7, 0: 2, "native": "te"}.get(value)


@settings(max_examples=60, deadline=None)
@given(plan=PLAN_VARIANTS, layout=st.sampled_from(["flat", "nested"]), data=st.data())
def test_a_recipe_that_sets_a_field_otherwise_gets_the_pin(plan: LaunchPlan, layout: str,
                                                          data: st.DataObject) -> None:
    """Recipe values other than the priced ones (each pinned field set otherwise, or to a
    value hypothesis draws) resolve to the pin on both model layouts."""
    pins = kernel_pins(plan)
    recipe: dict[str, dict[str, Any]] = {"model": {}, "train": {}}
    for key, value in pins.items():
        group, field = key.split(".", 1)
        other = data.draw(st.sampled_from([_otherwise(value), 16, 32, None, "te"]),
                          label=key)
        recipe[group][field] = other
    resolved = _apply(bridge_overrides(plan, GROUPS), recipe, layout)
    got = {k: _read(resolved, k, layout) for k in pins}
    assert got == pins
    assert all(type(got[k]) is type(pins[k]) for k in pins)  # 0 is not False


@pytest.mark.parametrize("case", LAUNCH_CASES, ids=lambda c: c.name)
def test_the_environment_is_pinned_for_every_launch(case: LaunchCase) -> None:
    """Both launchers get the priced environment; Bridge's env_vars hold the same values."""
    launch = case.settings()
    env, plan = dict(launch.env), launch.plan
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"] in ("1", "8", "32")
    assert {k: env[k] for k, _ in PINNED_ENV} == dict(PINNED_ENV)
    assert ("NVTE_CUTEDSL_FUSED_GROUPED_MLP" in env) == plan.fused_expert_mlp
    assert ("NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN" in env) == (plan.flex_backend
                                                                   == "hybridep")
    fields = bridge_fields(plan, GROUPS)
    assert {k.removeprefix("env_vars."): str(v) for k, v in fields.items()
            if k.startswith("env_vars.")} == env
    args = launch.megatron_lm_args
    assert ("--moe-permute-fusion" in args) == plan.is_moe
    if plan.flex_backend:
        i = args.index("--moe-flex-dispatcher-num-sms")
        assert args[i + 1] == str(FLEX_DISPATCH_SMS[plan.flex_backend])


def test_the_fused_expert_mlp_case_sets_the_cute_dsl_switch() -> None:
    """Megatron-Core takes the op-fuser grouped MLP for a gated MLP only with
    NVTE_CUTEDSL_FUSED_GROUPED_MLP=1: without it the priced fusion silently does not run."""
    env = dict(next(c for c in LAUNCH_CASES
                    if c.name == "moe-mxfp8-fusions-gb300").settings().env)
    assert env["NVTE_CUTEDSL_FUSED_GROUPED_MLP"] == "1"
    # the DeepSeek-V3 NVL72 case: EP 32 of a 72-GPU domain over 4-GPU nodes
    env = dict(next(c for c in LAUNCH_CASES if c.name == "moe-nvl72-flex").settings().env)
    assert (env["NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"], env["NVLINK_DOMAIN_SIZE"],
            env["USE_MNNVL"]) == ("32", "72", "1")


@settings(max_examples=200, deadline=None)
@given(ep=st.integers(1, 512), domain=st.sampled_from([4, 8, 16, 36, 72, 144]),
       node=st.sampled_from([4, 8]))
def test_hybridep_topology(ep: int, domain: int, node: int) -> None:
    topo = dict(hybridep_topology(ep, domain, node))
    ranks = int(topo["NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"])
    assert ep % ranks == 0 and ranks <= domain
    if ep <= domain:
        assert ranks == ep  # Bridge's rule: min(ep, 8) on 8-GPU domains, ep on NVL72
    assert not any(ep % r == 0 for r in range(ranks + 1, min(ep, domain) + 1))
    assert topo["NVLINK_DOMAIN_SIZE"] == str(domain)
    assert topo["USE_MNNVL"] == ("1" if domain > node else "0")
