"""Named model presets, each copied from a public config or a paper table.

Every entry is a literal :class:`ModelSpec` whose ``source`` names where its
numbers come from (a Hugging Face ``config.json`` or a paper table).  The
published parameter totals used to check them live in ``tests/test_presets.py``.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType

from parsearch.errors import SpecError
from parsearch.model.specs import MlaSpec, ModelSpec, MoeSpec

_NAR21 = "Narayanan et al. 2021 (arXiv 2104.04473) Table 1"


def _megatron_gpt(name: str, layers: int, hidden: int, heads: int, source: str) -> ModelSpec:
    """A Megatron-LM GPT: GeLU FFN of 4h, LayerNorm, MHA, padded vocab 51200, tied embeddings."""
    return ModelSpec(
        name=name,
        num_layers=layers,
        hidden_size=hidden,
        ffn_hidden_size=4 * hidden,
        num_attention_heads=heads,
        num_query_groups=heads,
        head_dim=hidden // heads,
        vocab_size=51200,
        tied_embeddings=True,
        mlp_activation="gelu",
        norm="layernorm",
        qkv_bias=True,
        source=source,
    )


def _top2_of_8(name: str, layers: int, hidden: int, heads: int, ffn: int, vocab: int,
               source: str) -> ModelSpec:
    """Every layer an MoE of 8 SwiGLU experts of width ``ffn``, top-2 routing, 8 KV heads of
    128 (Mixtral's and Grok-1's block)."""
    return ModelSpec(
        name=name,
        num_layers=layers,
        hidden_size=hidden,
        ffn_hidden_size=ffn,
        num_attention_heads=heads,
        num_query_groups=8,
        head_dim=128,
        vocab_size=vocab,
        moe=MoeSpec(num_experts=8, top_k=2, expert_ffn_hidden_size=ffn),
        source=source,
    )


def _nemotron4(name: str, layers: int, hidden: int, heads: int, source: str) -> ModelSpec:
    """A Nemotron-4: a Megatron GPT block (FFN 4h, LayerNorm, heads of h/heads) with a
    squared-ReLU FFN, no biases, 8 KV heads, untied embeddings and a 256,000-token
    vocabulary (NeMo NemotronConfig; Nemotron-4 15B report, arXiv 2402.16819 §2)."""
    return replace(_megatron_gpt(name, layers, hidden, heads, source), num_query_groups=8,
                   vocab_size=256000, tied_embeddings=False, mlp_activation="squared_relu",
                   qkv_bias=False)


_MEGATRON_GPT: tuple[ModelSpec, ...] = (
    _megatron_gpt("gpt-1.7b", 24, 2304, 24, f"{_NAR21}, 1.7B row"),
    _megatron_gpt("gpt-3.6b", 30, 3072, 32, f"{_NAR21}, 3.6B row"),
    _megatron_gpt("gpt-7.5b", 36, 4096, 32, f"{_NAR21}, 7.5B row"),
    _megatron_gpt("gpt-18.4b", 40, 6144, 48, f"{_NAR21}, 18.4B row"),
    _megatron_gpt("gpt-39.1b", 48, 8192, 64, f"{_NAR21}, 39.1B row"),
    _megatron_gpt("gpt-76.1b", 60, 10240, 80, f"{_NAR21}, 76.1B row"),
    _megatron_gpt("gpt-145.6b", 80, 12288, 96, f"{_NAR21}, 145.6B row"),
    _megatron_gpt("gpt-310.1b", 96, 16384, 128, f"{_NAR21}, 310.1B row"),
    _megatron_gpt("gpt-529.6b", 105, 20480, 128, f"{_NAR21}, 529.6B row"),
    _megatron_gpt("gpt-1t", 128, 25600, 160, f"{_NAR21}, 1008B row"),
    _megatron_gpt(
        "gpt3-175b",
        96,
        12288,
        96,
        "Brown et al. 2020 (arXiv 2005.14165) Table 2.1, GPT-3 175B; vocab padded "
        "50257 -> 51200 as in Megatron-LM runs (Narayanan et al. 2021, Korthikanti et al. 2022)",
    ),
    _megatron_gpt(
        "kor22-22b",
        48,
        6144,
        64,
        "Korthikanti et al. 2022 (arXiv 2205.05198) Table 3, 22B model",
    ),
    _megatron_gpt(
        "mt-nlg-530b",
        105,
        20480,
        128,
        "Korthikanti et al. 2022 (arXiv 2205.05198) Table 3, 530B model "
        "(MT-NLG, Smith et al. 2022 arXiv 2201.11990)",
    ),
)

_HF_PRESETS: tuple[ModelSpec, ...] = (
    ModelSpec(
        name="llama3-8b",
        num_layers=32,
        hidden_size=4096,
        ffn_hidden_size=14336,
        num_attention_heads=32,
        num_query_groups=8,
        head_dim=128,
        vocab_size=128256,
        source="meta-llama/Meta-Llama-3-8B config.json",
    ),
    ModelSpec(
        name="llama3-70b",
        num_layers=80,
        hidden_size=8192,
        ffn_hidden_size=28672,
        num_attention_heads=64,
        num_query_groups=8,
        head_dim=128,
        vocab_size=128256,
        source="meta-llama/Meta-Llama-3-70B config.json",
    ),
    ModelSpec(
        name="llama3.1-405b",
        num_layers=126,
        hidden_size=16384,
        ffn_hidden_size=53248,
        num_attention_heads=128,
        num_query_groups=8,
        head_dim=128,
        vocab_size=128256,
        source="meta-llama/Llama-3.1-405B config.json",
    ),
    # Nemotron-4 (NVIDIA NeMo nemo/collections/llm/gpt/model/nemotron.py: NemotronConfig and
    # Nemotron4Config15B / Nemotron4Config340B).
    _nemotron4("nemotron4-15b", 32, 6144, 48, "NeMo Nemotron4Config15B "
               "(nemo/collections/llm/gpt/model/nemotron.py); arXiv 2402.16819"),
    _nemotron4("nemotron4-340b", 96, 18432, 96, "NeMo Nemotron4Config340B "
               "(nemo/collections/llm/gpt/model/nemotron.py); Nemotron-4 340B report, "
               "arXiv 2406.11704"),
    _top2_of_8("mixtral-8x7b", 32, 4096, 32, 14336, 32000,
               "mistralai/Mixtral-8x7B-v0.1 config.json"),
    _top2_of_8("mixtral-8x22b", 56, 6144, 48, 16384, 32000,
               "mistralai/Mixtral-8x22B-v0.1 config.json"),
    # Grok-1 (xai-org/grok-1 run.py: 64 layers, emb_size 48 x 128 = 6144, 48 query and 8 KV
    # heads of 128, 8 experts top-2, widening_factor 8 -> FFN int(8 x 6144) x 2/3 = 32,768
    # (model.py ffn_size), vocabulary 128 x 1024 = 131,072); NeMo's grok1_314b.yaml
    # (NVIDIA/dgxc-benchmarking) trains it with these sizes, a gated GELU MLP and RoPE.
    _top2_of_8("grok-1", 64, 6144, 48, 32768, 131072,
               "xai-org/grok-1 run.py / model.py; NeMo grok1_314b.yaml (dgxc-benchmarking)"),
    ModelSpec(
        name="qwen2-57b-a14b",
        num_layers=28,
        hidden_size=3584,
        ffn_hidden_size=18944,
        num_attention_heads=28,
        num_query_groups=4,
        head_dim=128,
        vocab_size=151936,
        qkv_bias=True,
        moe=MoeSpec(
            num_experts=64,
            top_k=8,
            expert_ffn_hidden_size=2560,
            shared_expert_ffn_hidden_size=20480,
        ),
        source="Qwen/Qwen2-57B-A14B config.json",
    ),
    ModelSpec(
        name="qwen3-30b-a3b",
        num_layers=48,
        hidden_size=2048,
        ffn_hidden_size=6144,
        num_attention_heads=32,
        num_query_groups=4,
        head_dim=128,
        vocab_size=151936,
        moe=MoeSpec(num_experts=128, top_k=8, expert_ffn_hidden_size=768),
        source="Qwen/Qwen3-30B-A3B config.json",
    ),
    ModelSpec(
        name="qwen3-235b-a22b",
        num_layers=94,
        hidden_size=4096,
        ffn_hidden_size=12288,
        num_attention_heads=64,
        num_query_groups=4,
        head_dim=128,
        vocab_size=151936,
        moe=MoeSpec(num_experts=128, top_k=8, expert_ffn_hidden_size=1536),
        source="Qwen/Qwen3-235B-A22B config.json",
    ),
    ModelSpec(
        name="deepseek-v3",
        num_layers=61,
        hidden_size=7168,
        ffn_hidden_size=18432,
        num_attention_heads=128,
        num_query_groups=128,
        head_dim=128,
        vocab_size=129280,
        moe=MoeSpec(
            num_experts=256,
            top_k=8,
            expert_ffn_hidden_size=2048,
            shared_expert_ffn_hidden_size=2048,
            first_k_dense=3,
            router_num_groups=8,  # config.json n_group / topk_group: node-limited routing
            router_group_topk=4,
        ),
        mla=MlaSpec(
            kv_lora_rank=512,
            qk_nope_head_dim=128,
            qk_rope_head_dim=64,
            v_head_dim=128,
            q_lora_rank=1536,
        ),
        mtp_layers=1,
        source="deepseek-ai/DeepSeek-V3 config.json",
    ),
    ModelSpec(
        name="kimi-k2",
        num_layers=61,
        hidden_size=7168,
        ffn_hidden_size=18432,
        num_attention_heads=64,
        num_query_groups=64,
        head_dim=128,
        vocab_size=163840,
        moe=MoeSpec(
            num_experts=384,
            top_k=8,
            expert_ffn_hidden_size=2048,
            shared_expert_ffn_hidden_size=2048,
            first_k_dense=1,
        ),
        mla=MlaSpec(
            kv_lora_rank=512,
            qk_nope_head_dim=128,
            qk_rope_head_dim=64,
            v_head_dim=128,
            q_lora_rank=1536,
        ),
        source="moonshotai/Kimi-K2-Instruct config.json",
    ),
    # zai-org/GLM-4.5 config.json: hidden_size 5120, num_hidden_layers 92, num_attention_heads
    # 96, num_key_value_heads 8, head_dim 128, intermediate_size 12288 (the first_k_dense_replace
    # 3 dense layers), moe_intermediate_size 1536, n_routed_experts 160, n_shared_experts 1,
    # num_experts_per_tok 8, n_group / topk_group 1, vocab_size 151552, attention_bias true,
    # tie_word_embeddings false, num_nextn_predict_layers 1 (MTP).  Its QK norm (use_qk_norm)
    # and partial RoPE (partial_rotary_factor 0.5) have no field here (QK norm: 2·128 weights
    # per layer).
    ModelSpec(
        name="glm-4.5",
        num_layers=92,
        hidden_size=5120,
        ffn_hidden_size=12288,
        num_attention_heads=96,
        num_query_groups=8,
        head_dim=128,
        vocab_size=151552,
        qkv_bias=True,
        moe=MoeSpec(
            num_experts=160,
            top_k=8,
            expert_ffn_hidden_size=1536,
            shared_expert_ffn_hidden_size=1536,
            first_k_dense=3,
        ),
        mtp_layers=1,
        source="zai-org/GLM-4.5 config.json",
    ),
    ModelSpec(
        name="gpt-oss-120b",
        num_layers=36,
        hidden_size=2880,
        ffn_hidden_size=2880,
        num_attention_heads=64,
        num_query_groups=8,
        head_dim=64,
        vocab_size=201088,
        qkv_bias=True,
        moe=MoeSpec(num_experts=128, top_k=4, expert_ffn_hidden_size=2880),
        sliding_window=128,
        sliding_window_layers=18,
        # config.json swiglu_limit 7.0 and rope_scaling yarn; transformers'
        # GptOssExperts carries gate_up_proj_bias and down_proj_bias.
        glu_limit=7.0,
        expert_bias=True,
        yarn_rope=True,
        # config.json quantization_config: MXFP4 experts, modules_to_not_convert self_attn
        attention_unquantized=True,
        source="openai/gpt-oss-120b config.json",
    ),
)

PRESETS: Mapping[str, ModelSpec] = MappingProxyType(
    {spec.name: spec for spec in (*_MEGATRON_GPT, *_HF_PRESETS)}
)


def list_presets() -> list[str]:
    """Preset names, sorted."""
    return sorted(PRESETS)


def closest_presets(name: str, n: int = 3) -> list[str]:
    """Up to ``n`` preset names that look like ``name`` (difflib ratio >= 0.5)."""
    return difflib.get_close_matches(name.strip().lower(), list(PRESETS), n=n, cutoff=0.5)


def get_preset(name: str) -> ModelSpec:
    """The preset called ``name`` (case-insensitive); :class:`SpecError` naming close ones."""
    spec = PRESETS.get(name.strip().lower())
    if spec is not None:
        return spec
    close = closest_presets(name)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    shown = name if len(name) <= 80 else name[:77] + "..."
    raise SpecError(f"unknown model preset {shown!r}{hint} (`parsearch models` lists the presets)")
