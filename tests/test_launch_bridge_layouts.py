"""The Bridge overrides resolve on both model layouts; no Megatron-Bridge needed.

Bridge applies CLI overrides to the recipe as a nested dict in struct mode
(``process_config_with_overrides``, ``training/utils/omegaconf_utils.py``) with
Hydra 1.3.2's ``ConfigLoaderImpl._apply_overrides_to_config``: ``key=v`` must
name a key the dict holds, ``+key=v`` one it does not, ``++key=v`` either.
On Bridge v0.6.0 the model dict is flat (``GPTModelProvider``); on Bridge main
(067f987d) a Llama recipe's is ``BridgeGPTModelConfig``: its own fields at
``model.*`` and the Transformer fields at ``model.transformer.*``.
:func:`_accepts` is that rule, and the two key sets below are the two layouts;
the real check is ``tests/test_launch_bridge_integration.py``.
"""

from __future__ import annotations

import re
import shlex

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.launch.bridge import (
    FORCE_ADD,
    bridge_fields,
    bridge_overrides,
    check_key,
    hydra_value,
    nested,
    override,
)
from parsearch.launch.names import bridge_groups, bridge_nested_model, bridge_top_level
from tests.launch_cases import LAUNCH_CASES, LaunchCase

NESTED = bridge_nested_model()  # recorded from Bridge main 067f987d + Megatron-LM 2a75ac12


def _keys(layout: str) -> set[str]:
    """Dotted keys of a recipe's config dict; ``env_vars`` holds none of ours yet."""
    keys = set(bridge_top_level())
    for group, fields in bridge_groups().items():
        if group == "model" and layout == "nested":
            keys |= {f"model.{f}" for f in NESTED["outer"]}
            keys |= {f"model.transformer.{f}" for f in NESTED["transformer"]}
        else:
            keys |= {f"{group}.{f}" for f in fields}
    return keys


LAYOUTS = {"flat": _keys("flat"), "nested": _keys("nested")}


def _accepts(item: str, keys: set[str]) -> bool:
    """Whether Hydra 1.3.2 applies ``item`` to a struct-mode config holding ``keys``."""
    key = item.lstrip("+").split("=", 1)[0]
    if item.startswith("++"):
        return True
    if item.startswith("+"):
        return key not in keys
    return key in keys


@pytest.mark.parametrize("case", LAUNCH_CASES, ids=lambda c: c.name)
def test_every_model_field_exists_on_the_nested_layout(case: LaunchCase) -> None:
    """A model field main lacks would be skipped there with a warning: none is."""
    fields = {k.removeprefix("++").split("=", 1)[0].removeprefix("model.")
              for k in case.settings().bridge_overrides if k.startswith("++model.")}
    missing = fields - NESTED["outer"] - NESTED["transformer"]
    assert not missing, f"not on Bridge main's nested model config: {sorted(missing)}"


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("case", LAUNCH_CASES, ids=lambda c: c.name)
def test_every_override_resolves_on_both_model_layouts(case: LaunchCase, layout: str) -> None:
    overrides = case.settings().bridge_overrides
    refused = [o for o in overrides if not _accepts(o, LAYOUTS[layout])]
    assert not refused, f"{layout} layout refuses {refused}"
    # the layout-free spelling: never a path only one layout has
    assert not any(".transformer." in o for o in overrides)


def test_the_rule_tells_the_layouts_apart() -> None:
    """Without ``++`` a Transformer field is refused on the nested layout only."""
    plain = "model.tensor_model_parallel_size=2"
    assert _accepts(plain, LAYOUTS["flat"]) and not _accepts(plain, LAYOUTS["nested"])
    assert _accepts("model.seq_length=4096", LAYOUTS["nested"])  # an outer field
    assert not _accepts("env_vars.NCCL_DEBUG=INFO", LAYOUTS["flat"])


@pytest.mark.parametrize("case", LAUNCH_CASES, ids=lambda c: c.name)
def test_force_add_is_used_exactly_on_model_and_env_vars(case: LaunchCase) -> None:
    for item in case.settings().bridge_overrides:
        head = item.removeprefix("++").split(".", 1)[0].split("=", 1)[0]
        assert item.startswith("++") == (head in FORCE_ADD), item
        assert not item.startswith("+++"), item


@pytest.mark.parametrize("case", LAUNCH_CASES, ids=lambda c: c.name)
def test_yaml_form_keeps_model_fields_flat(case: LaunchCase) -> None:
    """The YAML file (merged, not struct) holds the same flat ``model`` keys."""
    fields = bridge_fields(case.settings().plan, bridge_groups())
    model = nested(fields)["model"]
    assert "transformer" not in model
    assert {f"model.{k}" for k in model} == {k for k in fields if k.startswith("model.")}


@settings(max_examples=60, deadline=None)
@given(key=st.sampled_from(sorted(LAYOUTS["flat"] - set(bridge_top_level()))),
       value=st.one_of(st.none(), st.booleans(), st.integers(-3, 10**6),
                       st.text(alphabet="abcEt*|()L0123456789_-.", min_size=1, max_size=12)))
def test_override_form_survives_the_shell(key: str, value: object) -> None:
    item = override(key, value)
    assert item.startswith("++") == (key.split(".", 1)[0] in FORCE_ADD)
    assert item.removeprefix("++") == f"{key}={hydra_value(value)}"
    assert shlex.split(shlex.quote(item)) == [item]
    # a model key: ++ finds it wherever the layout keeps it
    assert _accepts(item, LAYOUTS["flat"]) and _accepts(item, LAYOUTS["nested"])


@settings(max_examples=60, deadline=None)
@given(key=st.sampled_from(sorted(LAYOUTS["flat"] - set(bridge_top_level()))),
       typo=st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=3),
       where=st.integers(0, 40))
def test_a_misspelled_field_is_refused_at_generation(key: str, typo: str, where: int) -> None:
    head, _, field = key.partition(".")
    cut = min(where, len(field))
    wrong = field[:cut] + typo + field[cut:]
    if wrong in bridge_groups()[head]:
        return
    with pytest.raises(ValueError, match=re.escape(f"{head}.{wrong} is not a field")):
        check_key(f"{head}.{wrong}", bridge_groups(), bridge_top_level())


def test_an_unrecorded_field_stops_the_overrides() -> None:
    """``bridge_overrides`` refuses a key the record lacks instead of emitting it."""
    case = LAUNCH_CASES[0]
    groups = bridge_groups()
    groups["model"] = groups["model"] - {"sequence_parallel"}
    with pytest.raises(ValueError, match=r"model\.sequence_parallel"):
        bridge_overrides(case.settings().plan, groups)
    with pytest.raises(ValueError, match="ConfigContainer"):
        bridge_overrides(case.settings().plan, bridge_groups(), top=set(bridge_top_level())
                         - {"ddp"})


@pytest.mark.parametrize("case", LAUNCH_CASES, ids=lambda c: c.name)
def test_unpriced_recipe_features_are_written_off(case: LaunchCase) -> None:
    """Features some recipe turns on and the cost model does not price are reset."""
    launch = case.settings()
    lay, fields = case.layout, bridge_fields(launch.plan, bridge_groups())
    assert {k: fields[k] for k in ("model.enable_cuda_graph", "model.external_cuda_graph",
                                   "model.fine_grained_activation_offloading",
                                   "model.deterministic_mode", "model.cp_comm_type",
                                   "model.cross_entropy_loss_fusion",
                                   "model.microbatch_group_size_per_vp_stage",
                                   "optimizer.optimizer_cpu_offload",
                                   "ddp.num_distributed_optimizer_instances")} == {
        "model.enable_cuda_graph": False, "model.external_cuda_graph": False,
        "model.fine_grained_activation_offloading": False, "model.deterministic_mode": False,
        "model.cp_comm_type": "p2p", "model.cross_entropy_loss_fusion": True,
        "model.microbatch_group_size_per_vp_stage": None,
        "optimizer.optimizer_cpu_offload": False, "ddp.num_distributed_optimizer_instances": 1}
    # the p2p overlap the interleaved schedule was priced with (CommOverlapConfig's rule)
    assert fields["model.overlap_p2p_comm"] == (lay.pp > 1 and lay.vpp > 1)
    assert not (fields["model.overlap_p2p_comm"] and fields["model.batch_p2p_comm"])
    if launch.plan.cuda_graphs:
        assert fields["model.use_te_rng_tracker"] is True
