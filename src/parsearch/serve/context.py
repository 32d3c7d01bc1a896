"""The longest request a model can be served with: its context window.

Engines derive their maximum model length from the checkpoint's ``config.json``
``max_position_embeddings`` and refuse a longer one (vLLM ``ModelConfig``: "User-specified
max_model_len ... is greater than the derived max_model_len", unless
``VLLM_ALLOW_LONG_MAX_MODEL_LEN``; SGLang ``--context-length`` likewise unless
``SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN``; TensorRT-LLM's ``max_seq_len`` defaults to
it).  A request longer than the window is therefore not servable at all, whatever the layout.

Only presets whose cited config states one window are listed: the Llama presets stand for
families whose releases differ (Llama 3: 8,192; Llama 3.1/3.3: 131,072), so they get no
check, nor do model files (the model spec carries no window).

>>> from parsearch.model.presets import get_preset
>>> context_window(get_preset("deepseek-v3"))
163840
>>> context_window(get_preset("llama3-70b")) is None
True
"""

from __future__ import annotations

from parsearch.model.presets import PRESETS
from parsearch.model.specs import ModelSpec

#: ``max_position_embeddings`` of each preset's source config.json (Hugging Face model repos).
CONTEXT_WINDOWS: dict[str, int] = {
    "deepseek-v3": 163_840,       # deepseek-ai/DeepSeek-V3 config.json (YaRN-extended 128K)
    "kimi-k2": 131_072,           # moonshotai/Kimi-K2-Instruct config.json
    "qwen3-30b-a3b": 40_960,      # Qwen/Qwen3-30B-A3B config.json
    "qwen3-235b-a22b": 40_960,    # Qwen/Qwen3-235B-A22B config.json
    "gpt-oss-120b": 131_072,      # openai/gpt-oss-120b config.json
    "mixtral-8x7b": 32_768,       # mistralai/Mixtral-8x7B-v0.1 config.json
    "mixtral-8x22b": 65_536,      # mistralai/Mixtral-8x22B-v0.1 config.json
}


def context_window(model: ModelSpec) -> int | None:
    """The model's context window in tokens, or None when unknown (no check)."""
    window = CONTEXT_WINDOWS.get(model.name)
    if window is None or PRESETS.get(model.name) != model:
        return None
    return window
