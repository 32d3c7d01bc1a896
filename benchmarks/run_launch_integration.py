"""One-off check: the emitted launch settings against real Megatron-LM and Megatron-Bridge code.

Runs ``tests/test_launch_megatron_integration.py`` (Megatron-LM ``parse_args`` +
``validate_args``) and ``tests/test_launch_bridge_integration.py`` (Bridge
recipes + ``process_config_with_overrides``) on a CPU machine.  Needs checkouts
of Megatron-Bridge and of the Megatron-LM it pins (v0.6.0: the commit in
``src/parsearch/data/launch_names.json``; main: its ``3rdparty/Megatron-LM``
submodule), ``torch`` (the CPU wheel), ``triton``, ``einops``,
``hydra-core==1.3.2``, ``transformers==5.12.1``, ``accelerate``, and an offline
Hugging Face cache holding the recipes' ``config.json`` files (``--hf-cache``;
built from ``tests/fixtures/hf_configs``).  Run it once per Bridge: v0.6.0
(flat model configs) and main (Llama recipes with the model's Transformer
fields under ``model.transformer``); the Bridge test module's docstring has the
last runs.

GPU-only packages (Transformer Engine, DeepEP, ...) are replaced by import
stubs, and ``torch.cuda.get_device_properties`` answers for a GB200: only
configuration code runs.  Usage::

    python benchmarks/run_launch_integration.py --megatron-lm DIR --bridge DIR
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import json
import os
import shutil
import sys
import types
import typing
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
STUB_ROOTS = {"transformer_engine", "flash_attn", "apex", "nvidia_resiliency_ext", "flashinfer",
              "fast_hadamard_transform", "mamba_ssm", "causal_conv1d", "fla", "deep_ep",
              "qwen_vl_utils", "open_clip", "timm", "diffusers", "mistral_common", "peft",
              "wandb", "mlflow", "comet_ml", "datasets", "tensorboard", "modelopt",
              "nvidia_modelopt", "grouped_gemm", "tensorstore", "zarr", "transformer_engine_torch",
              "emerging_optimizers", "hybrid_ep", "nvshmem", "google"}
STUB_PREFIXES = ("megatron.energon",)
#: model preset -> Hugging Face repo (and the revisions the recipes pin)
HF_REPOS = {"llama3-70b": ("meta-llama/Meta-Llama-3-70B", ()),
            "llama3-8b": ("meta-llama/Meta-Llama-3-8B", ()),
            "deepseek-v3": ("deepseek-ai/DeepSeek-V3", ()),
            "qwen3-30b-a3b": ("Qwen/Qwen3-30B-A3B", ("ad44e777bcd18fa416d9da3bd8f70d33ebb85d39",))}


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> object:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value: object
        if name[:1].isupper():  # a class: subclassable, accepts anything
            value = type(name, (), {"__init__": lambda self, *a, **k: None,
                                    "__getattr__": lambda self, n: mock.MagicMock()})
        else:
            value = mock.MagicMock(name=f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: object, target: object = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] in STUB_ROOTS or fullname.startswith(STUB_PREFIXES):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []
        module.__version__ = "2.9.0"  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def build_hf_cache(cache: Path) -> None:
    zero = "0" * 40
    for preset, (repo, revisions) in HF_REPOS.items():
        base = cache / "hub" / f"models--{repo.replace('/', '--')}"
        for revision in (zero, *revisions):
            snap = base / "snapshots" / revision
            snap.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / "tests" / "fixtures" / "hf_configs" / f"{preset}.json",
                        snap / "config.json")
        (base / "refs").mkdir(exist_ok=True)
        (base / "refs" / "main").write_text(zero)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megatron-lm", type=Path, required=True)
    parser.add_argument("--bridge", type=Path, required=True, help="Bridge checkout root")
    parser.add_argument("--hf-cache", type=Path, default=Path("/tmp/parsearch-hf-cache"))
    args = parser.parse_args()
    build_hf_cache(args.hf_cache)
    os.environ.update(HF_HOME=str(args.hf_cache), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                      MEGATRON_LM_PATH=str(args.megatron_lm))
    sys.path[:0] = [str(args.bridge / "src"), str(args.megatron_lm)]
    sys.meta_path.insert(0, _StubFinder())
    if not hasattr(typing, "override"):  # the checkouts target Python 3.12
        typing.override = lambda f: f  # type: ignore[attr-defined]
    import pytest
    import torch

    torch.cuda.get_device_properties = lambda *a, **k: types.SimpleNamespace(  # type: ignore
        major=10, minor=0, name="NVIDIA GB200", multi_processor_count=148,
        total_memory=186 * 2**30)
    names = json.loads((ROOT / "src/parsearch/data/launch_names.json").read_text())
    import megatron.bridge.package_info as bridge_info

    print(f"Megatron-LM {args.megatron_lm}, Megatron-Bridge {bridge_info.__version__} "
          f"{args.bridge} (names recorded from Megatron-Bridge "
          f"{names['megatron_bridge']['tag']})", flush=True)
    return pytest.main(["-q", "-rs", "-p", "no:cacheprovider", "-W", "ignore", "--tb=short",
                        str(ROOT / "tests/test_launch_megatron_integration.py"),
                        str(ROOT / "tests/test_launch_bridge_integration.py")])


if __name__ == "__main__":
    sys.exit(main())
