"""Record the Megatron-LM argument names and Megatron-Bridge config fields the launch output uses.

Developer script; writes ``src/parsearch/data/launch_names.json``, which
``tests/test_launch_names.py`` checks every emitted flag and override against.

* Megatron-LM: builds the real ``argparse`` parser of
  ``megatron/training/arguments.py`` (``add_megatron_arguments``) from a
  checkout and records every option string with its ``nargs`` and choices.
  Needs ``torch``, ``triton`` and ``einops`` importable; on Python < 3.12
  ``typing.override`` is shimmed (the checkout targets 3.12).
* Megatron-Bridge: reads the dataclass fields of ``ConfigContainer`` and of the
  config classes behind each group (``model`` = ``GPTModelProvider`` and its
  Megatron-Core bases, ``ddp``, ``optimizer``, ...) from the source with
  ``ast`` (following base classes into the Megatron-LM checkout Bridge pins),
  the registered mixed-precision recipe names and the recipe function names.
* The nested model layout (``--nested-bridge``): a later Bridge whose Llama
  recipes hold a ``BridgeGPTModelConfig`` — its own fields and those of the
  ``TransformerConfig`` it keeps under ``model.transformer`` — read the same
  way from that Bridge and the Megatron-LM it pins.  The tests check every
  emitted ``model.*`` override against both layouts.

Usage::

    python benchmarks/record_launch_names.py --megatron-lm DIR --megatron-lm-commit SHA \\
        --bridge DIR --bridge-commit SHA --bridge-tag v0.6.0 \\
        --nested-bridge DIR --nested-bridge-commit SHA \\
        --nested-megatron-lm DIR --nested-megatron-lm-commit SHA
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import typing
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "src" / "parsearch" / "data" / "launch_names.json"

#: ConfigContainer group -> (module, class) of the config object behind it.
BRIDGE_GROUPS: dict[str, tuple[str, str]] = {
    "model": ("megatron.bridge.models.gpt_provider", "GPTModelProvider"),
    "train": ("megatron.bridge.training.config", "TrainingConfig"),
    "dataset": ("megatron.bridge.training.config", "GPTDatasetConfig"),
    "ddp": ("megatron.bridge.training.config", "DistributedDataParallelConfig"),
    "optimizer": ("megatron.bridge.training.config", "OptimizerConfig"),
    "checkpoint": ("megatron.bridge.training.config", "CheckpointConfig"),
    "dist": ("megatron.bridge.training.config", "DistributedInitConfig"),
    "comm_overlap": ("megatron.bridge.training.comm_overlap", "CommOverlapConfig"),
    "mixed_precision": ("megatron.bridge.training.mixed_precision", "MixedPrecisionConfig"),
}


def megatron_lm_args(checkout: Path) -> dict[str, dict[str, object]]:
    sys.path.insert(0, str(checkout))
    if not hasattr(typing, "override"):
        typing.override = lambda f: f  # type: ignore[attr-defined]
    import warnings

    warnings.filterwarnings("ignore")
    from megatron.training.arguments import add_megatron_arguments

    parser = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    out: dict[str, dict[str, object]] = {}
    for action in parser._actions:
        for option in action.option_strings:
            if not option.startswith("--"):
                continue
            entry: dict[str, object] = {"nargs": action.nargs}
            if action.choices:
                entry["choices"] = sorted(str(c).split(".")[-1] for c in action.choices)
            out[option] = entry
    return dict(sorted(out.items()))


class SourceIndex:
    """Dataclass fields by (module, class), following imports and base classes."""

    def __init__(self, roots: list[Path]) -> None:
        self.roots = roots
        self.cache: dict[str, ast.Module | None] = {}

    def module(self, name: str) -> ast.Module | None:
        if name not in self.cache:
            rel = Path(*name.split("."))
            tree = None
            for root in self.roots:
                for path in (root / f"{rel}.py", root / rel / "__init__.py"):
                    if path.is_file():
                        tree = ast.parse(path.read_text(encoding="utf-8"))
                        break
                if tree is not None:
                    break
            self.cache[name] = tree
        return self.cache[name]

    def resolve(self, module: str, name: str) -> tuple[str, ast.ClassDef] | None:
        tree = self.module(module)
        if tree is None:
            return None
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return module, node
        for node in tree.body:  # re-exported or imported under an alias
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        return self.resolve(self.absolute(module, node), alias.name)
        return None

    def absolute(self, module: str, node: ast.ImportFrom) -> str:
        """The absolute module an ``from X import`` in ``module`` names (relative too)."""
        if not node.level:
            return node.module or ""
        package = module.split(".")
        tree_is_package = self.is_package(module)
        base = package if tree_is_package else package[:-1]
        base = base[: len(base) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))

    def is_package(self, module: str) -> bool:
        rel = Path(*module.split("."))
        return any((root / rel / "__init__.py").is_file() for root in self.roots)

    def fields(self, module: str, name: str) -> set[str]:
        found = self.resolve(module, name)
        if found is None:
            return set()
        where, node = found
        names = {stmt.target.id for stmt in node.body
                 if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                 and not stmt.target.id.startswith("_")}
        for base in node.bases:
            base_name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
            if base_name:
                names |= self.fields(where, base_name)
        return names


#: the nested model layout: (module, class) of the model config and of its ``transformer``
NESTED_MODEL: dict[str, tuple[str, str]] = {
    "outer": ("megatron.bridge.models.gpt.model_config", "BridgeGPTModelConfig"),
    "transformer": ("megatron.bridge.models.transformer_config", "TransformerConfig"),
}


def nested_model(bridge: Path, bridge_commit: str, megatron_lm: Path,
                 megatron_lm_commit: str) -> dict[str, object]:
    index = SourceIndex([bridge / "src", megatron_lm])
    fields = {part: sorted(index.fields(*where)) for part, where in NESTED_MODEL.items()}
    assert all(fields.values()), f"no nested model config in {bridge}"
    return {"commit": bridge_commit, "megatron_lm_commit": megatron_lm_commit,
            "source": "src/megatron/bridge/models/gpt/model_config.py BridgeGPTModelConfig "
                      "(outer) and models/transformer_config.py TransformerConfig (under "
                      "model.transformer), with base classes",
            **fields}


def registered_precision_recipes(index: SourceIndex) -> list[str]:
    tree = index.module("megatron.bridge.training.mixed_precision")
    assert tree is not None
    return sorted(node.name for node in tree.body if isinstance(node, ast.FunctionDef)
                  and any(isinstance(d, ast.Name) and d.id == "register"
                          for d in node.decorator_list))


def recipe_names(bridge_src: Path) -> list[str]:
    names: set[str] = set()
    for folder in ("recipes", "perf_recipes"):
        for path in (bridge_src / "megatron" / "bridge" / folder).rglob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            names |= {node.name for node in tree.body if isinstance(node, ast.FunctionDef)
                      and node.name.endswith("_config") and not node.name.startswith("_")}
    return sorted(names)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megatron-lm", type=Path, required=True)
    parser.add_argument("--megatron-lm-commit", required=True)
    parser.add_argument("--bridge", type=Path, required=True, help="Bridge checkout root")
    parser.add_argument("--bridge-commit", required=True)
    parser.add_argument("--bridge-tag", required=True)
    parser.add_argument("--nested-bridge", type=Path, required=True,
                        help="checkout of a Bridge with the nested model layout")
    parser.add_argument("--nested-bridge-commit", required=True)
    parser.add_argument("--nested-megatron-lm", type=Path, required=True,
                        help="the Megatron-LM checkout that Bridge pins")
    parser.add_argument("--nested-megatron-lm-commit", required=True)
    args = parser.parse_args()
    bridge_src = args.bridge / "src"
    index = SourceIndex([bridge_src, args.megatron_lm])
    groups = {group: sorted(index.fields(*where)) for group, where in BRIDGE_GROUPS.items()}
    record = {
        "megatron_lm": {"repo": "NVIDIA/Megatron-LM", "commit": args.megatron_lm_commit,
                        "source": "megatron/training/arguments.py add_megatron_arguments",
                        "args": megatron_lm_args(args.megatron_lm)},
        "megatron_bridge": {
            "repo": "NVIDIA-NeMo/Megatron-Bridge", "tag": args.bridge_tag,
            "commit": args.bridge_commit, "megatron_lm_commit": args.megatron_lm_commit,
            "source": "src/megatron/bridge/training/config.py ConfigContainer and the config "
                      "classes behind each group (dataclass fields, with base classes)",
            "top_level": sorted(index.fields("megatron.bridge.training.config",
                                             "ConfigContainer")),
            "groups": groups,
            "mixed_precision_recipes": registered_precision_recipes(index),
            "recipes": recipe_names(bridge_src),
            "nested_model": nested_model(args.nested_bridge, args.nested_bridge_commit,
                                         args.nested_megatron_lm,
                                         args.nested_megatron_lm_commit),
        },
    }
    OUT.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {OUT}: {len(record['megatron_lm']['args'])} Megatron-LM options, "
          + ", ".join(f"{g} {len(f)}" for g, f in groups.items()))


if __name__ == "__main__":
    main()
