"""Launch settings of a serving layout for vLLM and SGLang.

Flag names: vLLM engine arguments (``vllm serve --help``: ``--tensor-parallel-size``,
``--pipeline-parallel-size``, ``--data-parallel-size``, ``--enable-expert-parallel``,
``--max-num-seqs``, ``--kv-cache-dtype``, ``--max-model-len``); SGLang server arguments
(docs.sglang.io "Server Arguments": ``--tp-size``, ``--dp-size``, ``--ep-size``,
``--enable-dp-attention``, ``--pp-size``, ``--max-running-requests``, ``--kv-cache-dtype``,
``--context-length``, ``--disaggregation-mode``, ``--enable-two-batch-overlap``).  With
DP attention SGLang's ``--tp-size`` is the whole stage width and ``--dp-size`` the
attention-DP ranks; vLLM runs ``--data-parallel-size`` engines of
``--tensor-parallel-size`` each and, with ``--enable-expert-parallel``, spreads the
experts over all of them (EP = TP * DP).  Speculative decoding: vLLM
``--speculative-config`` (JSON: ``method``, ``num_speculative_tokens``; docs.vllm.ai
"Speculative Decoding"), SGLang ``--speculative-algorithm EAGLE`` with
``--speculative-num-steps`` and ``--speculative-num-draft-tokens`` (the EAGLE path also
runs DeepSeek MTP); prefix caching: vLLM ``--enable-prefix-caching``, SGLang's radix cache
is on by default.  TensorRT-LLM's ``trtllm-serve`` line: :mod:`parsearch.serve.launch_trtllm`.

>>> from parsearch.serve.spec import ServingLayout, ServingWorkload
>>> w = ServingWorkload(isl=1000, osl=1000, precision="fp8", kv_precision="fp8")
>>> s = launch_settings("meta-llama/Llama-3.3-70B-Instruct", ServingLayout(4, 1, 1, 1, 64, 2), w)
>>> " ".join(s.vllm)
'vllm serve meta-llama/Llama-3.3-70B-Instruct --tensor-parallel-size 4 --max-num-seqs 64 \
--max-model-len 2000 --kv-cache-dtype fp8'
>>> s.replicas, s.notes[0]
(2, 'run 2 independent replicas behind a load balancer (data parallel over whole instances)')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from parsearch.serve.launch_trtllm import EXTRA_OPTIONS_FILE, trtllm_launch
from parsearch.serve.spec import ServingLayout, ServingWorkload
from parsearch.serve.speculative import draft_tokens

_VLLM_KV = {"bf16": "auto", "fp8": "fp8", "fp4": None}
_SGLANG_KV = {"bf16": "auto", "fp8": "fp8_e4m3", "fp4": None}


@dataclass(frozen=True)
class ServingLaunch:
    """Command lines of one instance, and how many to run."""

    vllm: tuple[str, ...]
    sglang: tuple[str, ...]
    replicas: int
    prefill_vllm: tuple[str, ...] = ()
    prefill_sglang: tuple[str, ...] = ()
    prefill_replicas: int = 0
    notes: tuple[str, ...] = field(default=())
    trtllm: tuple[str, ...] = ()
    trtllm_options: tuple[str, ...] = ()  # lines of the --extra_llm_api_options YAML file
    prefill_trtllm: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"vllm": " ".join(self.vllm), "sglang": " ".join(self.sglang),
                               "trtllm": " ".join(self.trtllm),
                               "trtllm_options": "\n".join(self.trtllm_options),
                               "replicas": self.replicas, "notes": list(self.notes)}
        if self.prefill_replicas:
            out["prefill"] = {"vllm": " ".join(self.prefill_vllm),
                              "sglang": " ".join(self.prefill_sglang),
                              "trtllm": " ".join(self.prefill_trtllm),
                              "replicas": self.prefill_replicas}
        return out


def _vllm(model: str, layout: ServingLayout, workload: ServingWorkload) -> list[str]:
    args = ["vllm", "serve", model]
    if layout.tp > 1:
        args += ["--tensor-parallel-size", str(layout.tp)]
    if layout.pp > 1:
        args += ["--pipeline-parallel-size", str(layout.pp)]
    if layout.attention_dp > 1:
        args += ["--data-parallel-size", str(layout.attention_dp)]
    if layout.ep > 1:
        args += ["--enable-expert-parallel"]
    per_engine = -(-layout.batch // layout.attention_dp)  # --max-num-seqs is per DP engine
    args += ["--max-num-seqs", str(per_engine), "--max-model-len", str(workload.max_context)]
    kv = _VLLM_KV[workload.kv_precision]
    if kv and kv != "auto":
        args += ["--kv-cache-dtype", kv]
    if workload.engine == "vllm" and workload.memory_fraction is not None:
        args += ["--gpu-memory-utilization", f"{workload.memory_fraction:g}"]
    if workload.spec_decode != "none":
        method = {"mtp": "mtp", "eagle": "eagle", "draft": "draft_model"}[workload.spec_decode]
        tokens = draft_tokens(workload)
        args += ["--speculative-config",
                 f"'{{\"method\": \"{method}\", \"num_speculative_tokens\": {tokens}}}'"]
    if workload.prefix_cache_hit > 0:
        args += ["--enable-prefix-caching"]
    if workload.eplb and layout.ep > 1:
        args += ["--enable-eplb"]
    return args


def _sglang(model: str, layout: ServingLayout, workload: ServingWorkload,
            disaggregation: str | None) -> list[str]:
    args = ["python", "-m", "sglang.launch_server", "--model-path", model]
    if layout.stage_width > 1:
        args += ["--tp-size", str(layout.stage_width)]
    if layout.attention_dp > 1:
        args += ["--dp-size", str(layout.attention_dp), "--enable-dp-attention"]
    if layout.ep > 1:
        args += ["--ep-size", str(layout.ep)]
    if layout.pp > 1:
        args += ["--pp-size", str(layout.pp)]
    args += ["--max-running-requests", str(layout.batch),
             "--context-length", str(workload.max_context)]
    kv = _SGLANG_KV[workload.kv_precision]
    if kv and kv != "auto":
        args += ["--kv-cache-dtype", kv]
    if workload.engine == "sglang" and workload.memory_fraction is not None:
        args += ["--mem-fraction-static", f"{workload.memory_fraction:g}"]
    if workload.engine == "sglang" and workload.fused_moe_runner:
        args += ["--moe-runner-backend", "flashinfer_trtllm"]
    if workload.ep_overlap and layout.ep > 1:
        args += ["--enable-two-batch-overlap"]
    if workload.eplb and layout.ep > 1:
        args += ["--enable-eplb"]
    if workload.spec_decode in ("mtp", "eagle"):
        tokens = draft_tokens(workload)
        args += ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", str(tokens),
                 "--speculative-num-draft-tokens", str(tokens + 1)]
    if disaggregation:
        args += ["--disaggregation-mode", disaggregation]
    return args


def _notes(layout: ServingLayout, workload: ServingWorkload) -> list[str]:
    notes = []
    if layout.replicas > 1:
        notes.append(f"run {layout.replicas} independent replicas behind a load balancer "
                     "(data parallel over whole instances)")
    if 1 < layout.ep < layout.stage_width:
        notes.append(f"ep={layout.ep} with expert TP {layout.expert_tp}: vLLM's expert parallel "
                     "is all-or-nothing (EP = TP * DP); SGLang --ep-size expresses it")
    if workload.engine == "trtllm" and workload.tensorrt_engine:
        notes.append("TensorRT-LLM before 1.0 serves TensorRT engines: build one with "
                      f"trtllm-build --tp_size {layout.tp} --pp_size {layout.pp} "
                      f"--max_batch_size {layout.batch} and serve it; the trtllm-serve line "
                      "is the PyTorch backend's (1.0 and later)")
    if _VLLM_KV[workload.kv_precision] is None:
        notes.append("FP4 KV cache: neither vLLM nor SGLang flag above sets it; "
                     "TensorRT-LLM supports NVFP4 KV on Blackwell")
    if workload.spec_decode == "draft":
        notes.append("draft-model speculation: name the draft checkpoint in vLLM's "
                     "--speculative-config (\"model\") and TensorRT-LLM's "
                     "speculative_model_dir; SGLang takes --speculative-draft-model-path")
    if workload.precision != "bf16":
        notes.append(f"weights in {workload.precision}: load a pre-quantized checkpoint "
                     "(e.g. NVIDIA ModelOpt FP8/NVFP4); both engines read the quantization "
                     "from its config")
    return notes


def launch_settings(model: str, layout: ServingLayout, workload: ServingWorkload,
                    prefill: ServingLayout | None = None) -> ServingLaunch:
    """vLLM and SGLang command lines for ``layout`` (the decode side when ``prefill`` is given:
    disaggregated serving, SGLang ``--disaggregation-mode prefill|decode``)."""
    notes = _notes(layout, workload)
    trtllm, options = trtllm_launch(model, layout, workload)
    if options:
        notes.append(f"TensorRT-LLM: write the YAML lines under the trtllm-serve line to "
                     f"{EXTRA_OPTIONS_FILE}")
    if prefill is None:
        return ServingLaunch(vllm=tuple(_vllm(model, layout, workload)),
                             sglang=tuple(_sglang(model, layout, workload, None)),
                             replicas=layout.replicas, notes=tuple(notes), trtllm=trtllm,
                             trtllm_options=options)
    notes.append("disaggregated: vLLM needs a --kv-transfer-config connector (e.g. NIXL) on "
                 "both sides; SGLang pairs the instances through its router")
    return ServingLaunch(
        vllm=tuple(_vllm(model, layout, workload)),
        sglang=tuple(_sglang(model, layout, workload, "decode")),
        replicas=layout.replicas,
        prefill_vllm=tuple(_vllm(model, prefill, workload)),
        prefill_sglang=tuple(_sglang(model, prefill, workload, "prefill")),
        prefill_replicas=prefill.replicas, notes=tuple(notes), trtllm=trtllm,
        trtllm_options=options, prefill_trtllm=trtllm_launch(model, prefill, workload)[0])
