"""Optional: feed the emitted Megatron-LM arguments to Megatron-LM's own parse_args + validate_args.

Skipped unless a Megatron-LM checkout is importable: set ``MEGATRON_LM_PATH`` to
a checkout (the recorded commit is in ``src/parsearch/data/launch_names.json``)
with ``torch``, ``triton`` and ``einops`` installed.  The GPU queries
``validate_args`` makes (device architecture, Transformer Engine version) are
answered for the cluster's GPU, since this runs on a machine without one.
"""

from __future__ import annotations

import os
import sys
import typing
from typing import Any

import pytest

from tests.launch_cases import LAUNCH_CASES, LaunchCase

MEGATRON = os.environ.get("MEGATRON_LM_PATH")


def _megatron_arguments() -> Any:
    if not MEGATRON:
        pytest.skip("set MEGATRON_LM_PATH to a Megatron-LM checkout to run this check")
    sys.path.insert(0, MEGATRON)
    if not hasattr(typing, "override"):  # the checkout targets Python 3.12
        typing.override = lambda f: f  # type: ignore[attr-defined]
    try:
        import megatron.training.arguments as arguments
    except Exception as error:
        pytest.skip(f"Megatron-LM at {MEGATRON} is not importable: {error}")
    return arguments


@pytest.mark.parametrize("case", LAUNCH_CASES, ids=lambda c: c.name)
def test_megatron_lm_validate_args_accepts_the_launch(case: LaunchCase,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    arguments = _megatron_arguments()
    launch = case.settings()
    capability = case.compute_capability
    monkeypatch.setattr(arguments, "get_device_arch_version", lambda: int(capability))
    monkeypatch.setattr(arguments, "is_te_min_version", lambda *a, **k: True)
    import torch

    monkeypatch.setattr(torch.cuda, "get_device_capability",
                        lambda *a, **k: (int(capability), round(capability % 1 * 10)))
    for name, value in launch.env:
        monkeypatch.setenv(name, value)
    if not launch.env:
        monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    monkeypatch.setenv("WORLD_SIZE", str(launch.num_gpus))
    monkeypatch.setenv("RANK", "0")
    argv = ["pretrain_gpt.py", *launch.megatron_lm_args, "--train-iters", "10",
            "--lr", "1e-4", "--mock-data", "--tokenizer-type", "NullTokenizer"]
    monkeypatch.setattr(sys, "argv", argv)
    args = arguments.parse_args()
    arguments.validate_args(args, {})
    lay = case.layout
    assert args.tensor_model_parallel_size == lay.tp
    assert args.pipeline_model_parallel_size == lay.pp
    assert args.context_parallel_size == lay.cp
    assert args.data_parallel_size == lay.dp
    assert (args.virtual_pipeline_model_parallel_size or 1) == lay.vpp
    assert args.micro_batch_size == lay.mbs
    if case.model.is_moe:
        assert args.expert_model_parallel_size == lay.ep
