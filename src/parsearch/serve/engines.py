"""Per-engine kernel efficiencies the datasheet and the efficiency profile do not carry, and
the engine defaults that depend on its release (scheduling ahead, TensorRT engines).

Fused MoE grouped GEMMs.  The efficiency profile's GEMM rate is that of large dense GEMMs
(MAMF sweeps) times its grouped-GEMM factor (Megatron grouped GEMMs in training).  Serving
engines run the routed experts as fused grouped kernels over a few hundred rows per expert
or fewer, whose achieved rate depends on the kernel library and spans a wide measured
range: the CUTLASS NVFP4 grouped MoE GEMM of FlashInfer/TensorRT-LLM at ~147 rows per
expert keeps the tensor pipe 28% busy (flashinfer-ai/flashinfer issue #4990, ncu profile);
SGLang's Marlin W4A16 MoE GEMM reaches 25.7% of H100 BF16 peak in a 16k-token prefill
(sgl-project/sglang PR #38884, nsys capture); DeepGEMM's grouped FP8 GEMMs reach up to 1550
TFLOPS on H800, 78% of peak (deepseek-ai/DeepGEMM README, 2025.04.18).  Against a dense
large-GEMM rate of ~50-60% of peak, that is a factor of about 0.2 to 1.3; the factor of
each engine is fitted on its published serving rows inside ``[MIN, 1]``
(benchmarks/fit_serving_moe.py, which reports it in and out of sample).

* ``trtllm``: fitted on the 47 TensorRT-LLM Qwen3 MoE throughput rows of
  data/serving_runs.csv (TensorRT-LLM v1.0 perf overview, CUTLASS MoE backend).
* ``vllm``: no vLLM MoE row in the serving set; vLLM's fused MoE kernels (Triton
  ``fused_moe`` and CUTLASS grouped GEMMs, within 5% of each other in vLLM PR #19983's
  blocked-FP8 benchmark) are of the kind TensorRT-LLM runs, so it takes TensorRT-LLM's value.
* ``sglang``: 1.0, the profile's rate, for 8-bit and 16-bit experts: they run DeepGEMM
  (LMSYS large-scale EP blog), whose grouped GEMMs reach dense-GEMM rates (above).  FP4
  experts are not DeepGEMM's (it has FP8 kernels only): SGLang runs them with FlashInfer's
  CUTLASS / TensorRT-LLM-generated MoE kernels (``--moe-runner-backend flashinfer_trtllm``
  in the InferenceX DeepSeek-R1 FP4 B200 script of its held-out rows,
  SemiAnalysisAI/InferenceX@1fc5d73c ``benchmarks/dsr1_fp4_b200.sh``), the kernel family
  of TensorRT-LLM, so they take TensorRT-LLM's factor (2026-12-07; held out, SGLang
  throughput 8.6% -> 8.3%, TTFT 45.7% -> 43.9%).  So do 8-bit experts launched with that
  runner (the InferenceX B200 FP8 script: ``--moe-runner-backend flashinfer_trtllm`` with
  DeepGEMM's JIT off, ``benchmarks/dsr1_fp8_b200.sh``; ``fused_moe_runner`` of the
  workload, the CLI's ``--moe-runner-backend``); until 2026-12-07 they took DeepGEMM's
  1.0 (held out, SGLang B200 FP8 17 rows: throughput MAPE 16.4% -> 13.9%, TTFT
  49.3% -> 45.0%).

>>> moe_kernel_efficiency("sglang"), moe_kernel_efficiency("sglang", "fp4")
(1.0, 0.45)
"""

from __future__ import annotations

import re

#: Lower end of the fitted range: 0.2 of the dense large-GEMM rate, ~10% of peak (the
#: FlashInfer CUTLASS grouped MoE GEMM above).
MIN_MOE_KERNEL_EFFICIENCY = 0.2
#: Fused MoE grouped-GEMM rate over the profile's (dense large-GEMM x grouped) rate.
#: It multiplies the per-expert tile-shape efficiency (:func:`parsearch.serve.moe.
#: tile_shape_efficiency`: N tile quantization and each tile's fixed cost against its depth
#: K), so it is the kernel's rate on a well-shaped expert GEMM, the same for 8 large experts
#: and 128 small ones.  Fitted 2026-12-06 on the 47 in-sample TensorRT-LLM MoE rows
#: (benchmarks/fit_serving_moe.py: 0.45, MAPE 15.6%; leave one model out 16.3%); before the
#: tile shape was priced the fit gave 0.3.
MOE_KERNEL_EFFICIENCY: dict[str, float] = {"trtllm": 0.45, "vllm": 0.45, "sglang": 1.0}


def moe_kernel_efficiency(engine: str, precision: str = "bf16",
                          trtllm_runner: bool = False) -> float:
    """The fused-MoE grouped-GEMM factor of ``engine`` for experts in ``precision`` (1 for an
    engine without one).  SGLang runs TensorRT-LLM's kernel family for FP4 experts (above)
    and for any experts when launched with ``--moe-runner-backend flashinfer_trtllm``
    (``trtllm_runner``; the InferenceX B200 DeepSeek scripts also set
    ``SGL_ENABLE_JIT_DEEPGEMM=false``, SemiAnalysisAI/InferenceX@1fc5d73c
    ``benchmarks/dsr1_fp8_b200.sh``), so those take TensorRT-LLM's factor, not DeepGEMM's.

    >>> moe_kernel_efficiency("sglang", "fp8"), moe_kernel_efficiency("sglang", "fp8", True)
    (1.0, 0.45)
    """
    if engine == "sglang" and (precision == "fp4" or trtllm_runner):
        return MOE_KERNEL_EFFICIENCY["trtllm"]
    return MOE_KERNEL_EFFICIENCY.get(engine, 1.0)


#: Whether each engine, left at its defaults, forms the next batch while the current one
#: runs (a new request then joins one step later, :func:`parsearch.serve.ttft.pickup_wait_s`):
#: vLLM's ``SchedulerConfig.async_scheduling`` defaults to None, which VllmConfig turns on
#: unless an incompatible option is set (vllm/config/vllm.py, recent releases; older ones
#: need ``--async-scheduling``); SGLang's overlap scheduler is on unless
#: ``--disable-overlap-schedule`` (server_args ``disable_overlap_schedule`` False);
#: TensorRT-LLM's PyTorch backend runs the overlap scheduler unless
#: ``disable_overlap_scheduler`` (llm_args.py, default False; docs "Overlap Scheduler").
SCHEDULES_AHEAD: dict[str, bool] = {"vllm": True, "sglang": True, "trtllm": True}


def schedules_ahead(engine: str, setting: bool | None = None,
                    tensorrt_engine: bool = False) -> bool:
    """Whether ``engine`` schedules one step ahead: ``setting`` when given, else its default
    (TensorRT-LLM's overlap scheduler is its PyTorch backend's, so not with
    ``tensorrt_engine``)."""
    if setting is not None:
        return setting
    return SCHEDULES_AHEAD.get(engine, False) and not (engine == "trtllm" and tensorrt_engine)


#: First TensorRT-LLM release whose default backend is PyTorch; before it ``trtllm-build``
#: TensorRT engines were the workflow (the PyTorch backend is "available in version 0.17
#: and later" as an opt-in, TensorRT-LLM docs "PyTorch Backend"; 1.0's docs import the
#: TensorRT engine path from ``tensorrt_llm._tensorrt_engine``, the default ``LLM`` is
#: PyTorch's).
TRTLLM_PYTORCH_DEFAULT = (1, 0)


def release_tuple(release: str) -> tuple[int, ...]:
    """``"0.13.0"`` -> ``(0, 13, 0)``; a :class:`ValueError` naming the release when it is
    not dotted numbers (a suffix such as ``rc2`` is dropped from the last part)."""
    match = re.fullmatch(r"v?(\d+(?:\.\d+)*)(?:[a-z]+\d*)?", release.strip())
    if match is None:
        raise ValueError(f"release {release!r} is not a version like 0.13 or 1.2.0rc2")
    return tuple(int(part) for part in match.group(1).split("."))


def tensorrt_engine_release(engine: str, release: str) -> bool:
    """Whether ``release`` of ``engine`` serves through TensorRT engines by default:
    TensorRT-LLM before 1.0 (:data:`TRTLLM_PYTORCH_DEFAULT`); a :class:`ValueError` for an
    engine without release-specific pricing."""
    if engine != "trtllm":
        raise ValueError(f"no release-specific pricing for {engine}: leave the release out "
                         "(priced as the releases of its held-out rows, docs/serving.md)")
    return release_tuple(release) < TRTLLM_PYTORCH_DEFAULT
