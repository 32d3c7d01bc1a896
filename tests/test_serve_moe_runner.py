"""SGLang's ``--moe-runner-backend flashinfer_trtllm``: TensorRT-LLM's MoE kernels, priced so."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from parsearch.model.presets import get_preset
from parsearch.serve.api import serve_layouts
from parsearch.serve.cost import expert_rate
from parsearch.serve.engines import MOE_KERNEL_EFFICIENCY, moe_kernel_efficiency
from parsearch.serve.spec import ServingWorkload
from tests.cli_helpers import assert_one_line_error, run_cli


@pytest.mark.parametrize("precision", ["bf16", "fp8", "fp4"])
def test_the_trtllm_runner_takes_tensorrt_llm_s_factor(precision: str) -> None:
    trtllm = MOE_KERNEL_EFFICIENCY["trtllm"]
    assert moe_kernel_efficiency("sglang", precision, trtllm_runner=True) == trtllm
    default = moe_kernel_efficiency("sglang", precision)
    # auto: DeepGEMM for 8- and 16-bit experts, TensorRT-LLM's kernels for FP4
    assert default == (trtllm if precision == "fp4" else MOE_KERNEL_EFFICIENCY["sglang"])
    # the flag is SGLang's: other engines keep their own factor
    for engine in ("vllm", "trtllm"):
        assert (moe_kernel_efficiency(engine, precision, trtllm_runner=True)
                == moe_kernel_efficiency(engine, precision))


def test_expert_rate_follows_the_runner() -> None:
    class _Rates:  # expert_rate reads only the FP4-with-FP8-activations scale
        w4a8_scale = 1.0

    w = ServingWorkload(isl=1000, osl=500, precision="fp8", kv_precision="fp8",
                        engine="sglang")
    deepgemm = expert_rate(w, _Rates())  # type: ignore[arg-type]
    runner = expert_rate(replace(w, fused_moe_runner=True), _Rates())  # type: ignore[arg-type]
    assert runner == pytest.approx(deepgemm * MOE_KERNEL_EFFICIENCY["trtllm"]
                                   / MOE_KERNEL_EFFICIENCY["sglang"])


def test_long_prefill_is_slower_on_the_trtllm_runner() -> None:
    """A 16k-token prefill of DeepSeek-V3 is expert-GEMM bound: at TensorRT-LLM's lower
    grouped-GEMM factor it takes longer, though the runner fuses the routing glue."""
    base = ServingWorkload(isl=16000, osl=100, precision="fp8", kv_precision="fp8",
                           engine="sglang", concurrency=1)

    def ttft(workload: ServingWorkload) -> float:
        result = serve_layouts(model=get_preset("deepseek-v3"), cluster="dgx-b200", num_gpus=8,
                               workload=workload, top=1)
        return result.best.estimate.ttft_ms

    assert ttft(replace(base, fused_moe_runner=True)) > ttft(base)


def test_cli_launches_what_it_priced_and_refuses_other_engines() -> None:
    args = ("serve", "--model", "deepseek-v3", "--cluster", "dgx-b200", "--gpus", "8",
            "--isl", "900", "--osl", "900", "--precision", "fp8", "--top", "2",
            "--format", "json")
    runner = json.loads(run_cli(*args, "--engine", "sglang", "--moe-runner-backend",
                                "flashinfer_trtllm").out)
    auto = json.loads(run_cli(*args, "--engine", "sglang").out)
    assert all("--moe-runner-backend flashinfer_trtllm" in e["launch"]["sglang"]
               for e in runner["results"])
    assert not any("--moe-runner-backend" in e["launch"]["sglang"] for e in auto["results"])
    assert runner["results"][0]["tokens_per_s"] != auto["results"][0]["tokens_per_s"]
    assert_one_line_error(run_cli(*args, "--engine", "vllm", "--moe-runner-backend",
                                  "flashinfer_trtllm"),
                          "--moe-runner-backend", "--engine sglang")
    dense = ("serve", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "1",
             "--isl", "500", "--osl", "500", "--engine", "sglang",
             "--moe-runner-backend", "flashinfer_trtllm")
    assert_one_line_error(run_cli(*dense), "--moe-runner-backend", "no MoE layers")
