"""The recorded Megatron-LM argument names and Megatron-Bridge config fields.

``data/launch_names.json`` is written by ``benchmarks/record_launch_names.py``
from the real parsers at pinned commits (Megatron-LM's ``argparse`` parser;
Megatron-Bridge's ``ConfigContainer`` dataclasses, v0.6.0; the nested model
layout of Bridge main).  The launch
writers use it to place precision fields, and to check a recipe name the user
gives; the tests check every emitted name and value form against it.
"""

from __future__ import annotations

import difflib
import json
from functools import lru_cache
from importlib import resources
from typing import Any

from parsearch.errors import SpecError


@lru_cache(maxsize=1)
def launch_names() -> dict[str, Any]:
    """The whole record (cached; read once per process)."""
    text = resources.files("parsearch.data").joinpath("launch_names.json").read_text("utf-8")
    return json.loads(text)


def megatron_lm_options() -> dict[str, dict[str, Any]]:
    """``--option`` -> ``{"nargs": ..., "choices": [...]}`` of Megatron-LM's parser."""
    return launch_names()["megatron_lm"]["args"]


def bridge_groups() -> dict[str, set[str]]:
    """ConfigContainer group -> the field names of the config object behind it."""
    return {group: set(fields)
            for group, fields in launch_names()["megatron_bridge"]["groups"].items()}


def bridge_top_level() -> set[str]:
    return set(launch_names()["megatron_bridge"]["top_level"])


def bridge_nested_model() -> dict[str, set[str]]:
    """The nested model layout of a later Bridge (Llama recipes on main).

    ``"outer"``: the ``BridgeGPTModelConfig`` fields at ``model.*``;
    ``"transformer"``: the ``TransformerConfig`` fields at ``model.transformer.*``.
    """
    record = launch_names()["megatron_bridge"]["nested_model"]
    return {"outer": set(record["outer"]), "transformer": set(record["transformer"])}


def check_recipe(name: str) -> str:
    """``name`` if it is a Megatron-Bridge recipe function of the recorded release."""
    record = launch_names()["megatron_bridge"]
    recipes = record["recipes"]
    if name in recipes:
        return name
    close = difflib.get_close_matches(name, recipes, n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise SpecError(f"--recipe {name!r} is not a Megatron-Bridge {record['tag']} recipe "
                    f"function (e.g. llama3_70b_pretrain_32gpu_gb200_bf16_config){hint}")


def provenance() -> dict[str, str]:
    """Which commits the names come from (shown in exported launch files)."""
    record = launch_names()
    return {"megatron_lm": record["megatron_lm"]["commit"],
            "megatron_bridge": f"{record['megatron_bridge']['tag']} "
                               f"({record['megatron_bridge']['commit']})"}


__all__ = ["bridge_groups", "bridge_nested_model", "bridge_top_level", "check_recipe",
           "launch_names", "megatron_lm_options", "provenance"]
