"""How each published serving row is run: the engine, client and build settings its source
states, read into a :class:`~parsearch.serve.spec.ServingWorkload` (the rows of
``src/parsearch/data/serving_runs.csv``; ``validate_serving.py`` prices them).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from parsearch.model.params import parameter_counts
from parsearch.model.specs import ModelSpec
from parsearch.serve.kv_cache import kv_bytes_per_token
from parsearch.serve.spec import ServingWorkload

DATA = Path(__file__).resolve().parents[1] / "src" / "parsearch" / "data" / "serving_runs.csv"
#: TensorRT-LLM defaults: max_batch_size 2048, max_num_tokens 8192 (TensorRT-LLM docs
#: "Tuning Max Batch Size and Max Num Tokens").
TRTLLM_MAX_BATCH = 2048
TRTLLM_MAX_TOKENS = 8192
#: trtllm-bench's estimate of the KV cache when it picks max_batch_size / max_num_tokens
#: (tensorrt_llm/bench/build/tuning.py ``calc_engine_setting``, kv_cache_gpu_mem_fraction).
TRTLLM_BENCH_KV_FRACTION = 0.95
#: Bytes per weight element in that estimate (tuning.py ``BYTES_PER_ELEM``).
TRTLLM_BENCH_BYTES = {"bf16": 2.0, "fp8": 1.0, "fp4": 0.5}
#: The engine of each row's ``framework`` column: its memory rules size the KV pool.
ENGINE_OF = {"tensorrt-llm": "trtllm", "sglang": "sglang", "vllm": "vllm"}
#: KV-cache dtype of TensorRT-LLM rows whose source does not state it.  trtllm-bench keeps
#: ``kv_cache_config.dtype: auto`` unless the YAML sets it: its FP8 default for FP8/NVFP4
#: checkpoints applies only when the dtype is None, which "auto" never is
#: (tensorrt_llm/bench/benchmark/utils/general.py ``get_settings``, v1.0), so the KV cache
#: takes the checkpoint's ``kv_cache_quant_algo`` (hf_quant_config.json), else the model's
#: BF16; tuning.py sizes max_batch_size with the same bytes.  The NVIDIA Llama checkpoints
#: are priced with FP8 KV; the Qwen3 ones with BF16, i.e. taken to carry no
#: kv_cache_quant_algo.  That is NOT verified against their hf_quant_config.json here; it is
#: the one choice in this script made while looking at the errors (both Qwen3 models, on
#: different GPUs and checkpoints, each fit it and neither fits FP8; the Llama rows fit FP8
#: and not BF16): ``--unstated-kv fp8`` shows the alternative.
CHECKPOINT_KV = {"llama3-70b": "fp8", "llama3-8b": "fp8", "llama3.1-405b": "fp8",
                 "qwen3-235b-a22b": "bf16", "qwen3-30b-a3b": "bf16"}
#: Rows run with an expert-parallel load balancer: the LMSYS large-scale EP blog's DeepSeek
#: runs place experts with DeepSeek's EPLB (blog section "Expert Parallelism Load Balancer").
#: No other row turns one on (the InferenceMAX SGLang commands have no ``--enable-eplb``).
EPLB_ROWS = frozenset({"s0150", "s0151", "s0152", "s0153"})
UNSTATED_KV = {"mode": "checkpoint"}


#: InferenceMAX's client sends ``CONC * 10`` prompts at ``--max-concurrency CONC`` with
#: ``--request-rate inf`` (InferenceX benchmarks/*.sh ``--num-prompts $((CONC * 10))``;
#: utils/bench_serving/benchmark_serving.py creates every request task at once behind an
#: ``asyncio.Semaphore(max_concurrency)``, after the warm-up requests have all finished):
#: ten waves, the first arriving together at an idle engine.
INFERENCEMAX_WAVES = 10.0
#: TensorRT-LLM's attention-DP balancer wait (``attention_dp_config.batching_wait_iters``
#: default 10, tensorrt_llm/llmapi/llm_args.py ``AttentionDpConfig``), turned on by
#: InferenceX benchmarks/gptoss_fp4_b200_trt.sh (``enable_balance: true`` with attention DP).
TRTLLM_BALANCE_WAIT_ITERS = 10


def sglang_recv_interval(row: dict[str, str]) -> int:
    """``--scheduler-recv-interval`` of an InferenceMAX SGLang row, as its script sets it
    (InferenceX benchmarks/dsr1_fp8_b200.sh and dsr1_fp4_b200.sh at the commit the notes
    name: 30 from concurrency 16, else 10, the fp8 script's TP 4 branch always 10;
    dsr1_fp8_h200.sh does not set it: SGLang's default 1)."""
    notes = row["notes"]
    if "dsr1_fp8_b200.sh" in notes:
        return 30 if int(row["tp"]) == 8 and int(row["concurrency"]) >= 16 else 10
    if "dsr1_fp4_b200.sh" in notes:
        return 30 if int(row["concurrency"]) >= 16 else 10
    return 1


def is_tensorrt_engine(row: dict[str, str]) -> bool:
    """Rows run on TensorRT engines (``trtllm-build``), not TensorRT-LLM's PyTorch backend:
    the v0.13.0 perf overview says so in its source name (SERVING_RUNS.md)."""
    return row["framework"] == "tensorrt-llm" and "TensorRT engines" in row["source"]


def client_knobs(row: dict[str, str]) -> dict[str, Any]:
    """Engine and client settings that shape TTFT (:mod:`parsearch.serve.ttft`), for the
    InferenceMAX rows (the only rows with a client at fixed concurrency and many requests).
    Their client sends text to the engine's OpenAI server (bench_serving random dataset,
    ``--backend vllm``/``openai``), which tokenizes it (``text_prompts``); the vLLM scripts
    set ``async-scheduling: true`` (gptoss_fp4_{b200,h100,h200}.sh); SGLang and
    TensorRT-LLM keep their overlap schedulers on (no ``--disable-overlap-schedule`` or
    ``disable_overlap_scheduler`` in dsr1_*.sh, gptoss_fp4_b200_trt.sh), the engines'
    defaults."""
    if "InferenceMAX" not in row["source"]:
        return {}
    knobs: dict[str, Any] = {"burst_waves": INFERENCEMAX_WAVES, "text_prompts": True,
                             "async_scheduling": True}
    if row["framework"] == "sglang":
        knobs["recv_interval"] = sglang_recv_interval(row)
        # dsr1_fp8_b200.sh and dsr1_fp4_b200.sh launch with --enable-flashinfer-allreduce-fusion
        # and --moe-runner-backend flashinfer_trtllm; dsr1_fp8_h200.sh with neither
        b200 = "dsr1_fp8_b200.sh" in row["notes"] or "dsr1_fp4_b200.sh" in row["notes"]
        knobs["allreduce_fusion"] = knobs["fused_moe_runner"] = b200
    if "gptoss_fp4_b200.sh" in row["notes"] or "gptoss_fp4_b200_trt.sh" in row["notes"]:
        # gptoss_fp4_b200.sh exports VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1: FlashInfer's
        # MXFP4-weight, MXFP8-activation MoE (the H100/H200 scripts use Marlin, W4A16);
        # gptoss_fp4_b200_trt.sh sets moe_config.backend TRTLLM, which on B200 takes MXFP8
        # activations with MXFP4 weights (TensorRT-LLM 1.2.0rc2 "Deployment Guide for
        # GPT-OSS", MoE backend support matrix)
        knobs["expert_activations"] = "fp8"
    if row["framework"] == "tensorrt-llm" and int(row["attention_dp"] or 1) > 1:
        knobs["balance_wait_iters"] = TRTLLM_BALANCE_WAIT_ITERS
    return knobs


def load_rows(path: Path = DATA) -> list[dict[str, str]]:
    with path.open(encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def is_held_out(row: dict[str, str]) -> bool:
    """A row of a source kept out of every fit (``held_out`` column ``yes``)."""
    return row.get("held_out", "") == "yes"


def fit_rows(rows: list[dict[str, str]] | None = None) -> list[dict[str, str]]:
    """The rows a fit may use: every row not held out."""
    return [r for r in (load_rows() if rows is None else rows) if not is_held_out(r)]


def workload_for(row: dict[str, str]) -> ServingWorkload:
    precision = row["precision"]
    # KV dtype when the source does not state it: SGLang's default "auto" keeps the model's
    # activation dtype (SGLang server arguments, --kv-cache-dtype), BF16; for TensorRT-LLM
    # FP8 KV is assumed with FP8/FP4 checkpoints (ModelOpt checkpoints ship a KV-cache scale).
    default_kv = "bf16" if precision == "bf16" or row["framework"] == "sglang" else "fp8"
    if (row["framework"] == "tensorrt-llm" and precision != "bf16"
            and UNSTATED_KV["mode"] == "checkpoint"):
        default_kv = CHECKPOINT_KV.get(row["model"], default_kv)
    kv = row["kv_precision"] or default_kv
    return ServingWorkload(isl=int(row["isl"]), osl=int(row["osl"]), precision=precision,
                           kv_precision=kv, max_batch=int(row["max_batch"] or TRTLLM_MAX_BATCH),
                           max_num_batched_tokens=int(row["max_num_tokens"] or TRTLLM_MAX_TOKENS),
                           ep_overlap=row["ep_overlap"] == "yes",
                           eplb=row["id"] in EPLB_ROWS,
                           engine=ENGINE_OF[row["framework"]],
                           memory_fraction=float(row.get("memory_fraction") or 0) or None,
                           concurrency=int(row["concurrency"]) if row["concurrency"] else None,
                           tensorrt_engine=is_tensorrt_engine(row), **client_knobs(row))


def trtllm_bench_settings(model: ModelSpec, gpu_bytes: float, workload: ServingWorkload,
                          tp: int, pp: int) -> tuple[int, int]:
    """(max_batch_size, max_num_tokens) that ``trtllm-bench throughput`` picks when the
    command gives neither (the TensorRT-LLM perf-overview runs): KV requests estimated from
    the memory the weights leave, then rounded up "slightly optimistic" (tuning.py
    ``calc_engine_setting`` and ``finetune_setting``, quoted step for step)."""
    n_gpus = tp * pp
    per_token = kv_bytes_per_token(model, workload.kv_precision, tp) * tp  # all TP ranks
    engine = parameter_counts(model).total * TRTLLM_BENCH_BYTES[workload.precision]
    cache = (gpu_bytes * n_gpus - engine) * TRTLLM_BENCH_KV_FRACTION
    requests = max(cache / (per_token * (workload.isl + workload.osl)), 1.0)
    raw_bs = min(requests, 4096) / pp
    raw_token = min(raw_bs * (1 + workload.isl / workload.osl), 32768)
    max_bs = _round_up(raw_bs, 64, ((256, 32), (1024, 128)), 256)
    max_token = _round_up(raw_token, 2048, ((4096, 256), (8192, 512)), 1024)
    return max_bs, max_token


def _round_up(value: float, least: int, tiers: tuple[tuple[int, int], ...], last: int) -> int:
    """``value`` rounded up to the step of its tier (the first ``(below, step)`` whose
    ``below`` it is under, else ``last``), never under ``least`` (tuning.py's rounding)."""
    step = next((s for below, s in tiers if value < below), last)
    rounded = step * math.ceil(value / step)
    return max(least, rounded) if value < tiers[0][0] else rounded
