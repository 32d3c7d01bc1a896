"""TensorRT-LLM launch line of a serving layout (``trtllm-serve``), beside vLLM and SGLang.

Flag names, checked against the trtllm-serve command reference:
https://nvidia.github.io/TensorRT-LLM/0.18.2/commands/trtllm-serve.html (``--backend
pytorch``, ``--tp_size``, ``--pp_size``, ``--max_batch_size``, ``--max_num_tokens``,
``--max_seq_len``, ``--kv_cache_free_gpu_memory_fraction``) and
https://nvidia.github.io/TensorRT-LLM/1.0.0rc6/commands/trtllm-serve/trtllm-serve.html
(``--ep_size``).  Options without a flag go in the YAML file passed with
``--extra_llm_api_options`` (https://nvidia.github.io/TensorRT-LLM/1.0.0/commands/
trtllm-serve/run-benchmark-with-trtllm-serve.html, "Using extra_llm_api_options"):
``enable_attention_dp``, ``kv_cache_config.dtype`` (``auto`` or ``fp8``, TensorRT-LLM
docs/source/performance/perf-benchmarking.md), ``kv_cache_config.enable_block_reuse``
(prefix reuse) and ``speculative_config`` (``decoding_type: MTP`` with
``num_nextn_predict_layers``, ``Eagle``/``DraftTarget`` with ``max_draft_len``).

As in TensorRT-LLM's MoE benchmarks (perf-overview.md: ``--tp 8 --ep 8`` with
``enable_attention_dp``), ``--tp_size`` is the whole stage width when attention is data
parallel, and ``--max_batch_size`` / ``--max_num_tokens`` are per attention-DP rank.

>>> from parsearch.serve.spec import ServingLayout, ServingWorkload
>>> w = ServingWorkload(isl=1000, osl=1000, precision="fp8", kv_precision="fp8")
>>> cmd, yaml = trtllm_launch("nvidia/Llama-3.3-70B-Instruct-FP8",
...                           ServingLayout(4, 1, 1, 1, 64, 2), w)
>>> " ".join(cmd)
'trtllm-serve nvidia/Llama-3.3-70B-Instruct-FP8 --backend pytorch --tp_size 4 \
--max_batch_size 64 --max_num_tokens 8192 --max_seq_len 2000 --extra_llm_api_options extra.yaml'
>>> yaml
('kv_cache_config:', '  dtype: fp8')
"""

from __future__ import annotations

from parsearch.serve.spec import ServingLayout, ServingWorkload
from parsearch.serve.speculative import draft_tokens

#: File name the command line gives for the YAML options (written beside it by the user).
EXTRA_OPTIONS_FILE = "extra.yaml"
_SPEC_YAML = {"mtp": ("MTP", "num_nextn_predict_layers"), "eagle": ("Eagle", "max_draft_len"),
              "draft": ("DraftTarget", "max_draft_len")}


def trtllm_options(layout: ServingLayout, workload: ServingWorkload) -> tuple[str, ...]:
    """Lines of the ``--extra_llm_api_options`` YAML file (empty when nothing is needed)."""
    lines: list[str] = []
    if layout.attention_dp > 1:
        lines.append("enable_attention_dp: true")
    kv: list[str] = []
    if workload.kv_precision == "fp8":
        kv.append("  dtype: fp8")
    if workload.prefix_cache_hit > 0:
        kv.append("  enable_block_reuse: true")
    if kv:
        lines += ["kv_cache_config:", *kv]
    if workload.eplb and layout.ep > 1:
        # TensorRT-LLM's online EPLB (moe_config.load_balancer, MoeLoadBalancerConfig)
        lines += ["moe_config:", "  load_balancer:",
                  "    num_slots: <experts plus redundant slots, a multiple of ep_size>"]
    if workload.spec_decode != "none":
        kind, key = _SPEC_YAML[workload.spec_decode]
        tokens = draft_tokens(workload)
        lines += ["speculative_config:", f"  decoding_type: {kind}", f"  {key}: {tokens}"]
        if workload.spec_decode != "mtp":
            lines.append("  speculative_model_dir: <draft model path>")
    return tuple(lines)


def trtllm_launch(model: str, layout: ServingLayout,
                  workload: ServingWorkload) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(``trtllm-serve`` command line, YAML option lines) of one instance of ``layout``."""
    args = ["trtllm-serve", model, "--backend", "pytorch"]
    if layout.stage_width > 1:
        args += ["--tp_size", str(layout.stage_width)]
    if layout.pp > 1:
        args += ["--pp_size", str(layout.pp)]
    if layout.ep > 1:
        args += ["--ep_size", str(layout.ep)]
    per_rank = -(-layout.batch // layout.attention_dp)
    args += ["--max_batch_size", str(per_rank),
             "--max_num_tokens", str(workload.max_num_batched_tokens),
             "--max_seq_len", str(workload.max_context)]
    if workload.engine == "trtllm" and workload.memory_fraction is not None:
        args += ["--kv_cache_free_gpu_memory_fraction", f"{workload.memory_fraction:g}"]
    options = trtllm_options(layout, workload)
    if options:
        args += ["--extra_llm_api_options", EXTRA_OPTIONS_FILE]
    return tuple(args), options
