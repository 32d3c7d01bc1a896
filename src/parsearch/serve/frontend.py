"""Host work on a request's way in: the server tokenizes its prompt before the engine sees it.

An OpenAI-compatible server receives the prompt as text and turns it into token ids on the
host before the engine can schedule it, one request at a time:

* vLLM's API server runs every prompt's tokenization on one worker thread
  (``serving_engine.py``: ``ThreadPoolExecutor(max_workers=1)`` behind the async tokenize
  calls; vllm-project/vllm issue #25301 reports the resulting serialized queue under load);
* SGLang's TokenizerManager tokenizes in its one asyncio process before sending to the
  scheduler (``tokenizer_manager.py``);
* ``trtllm-serve`` tokenizes in the OpenAI server process (``LLM.generate_async`` encodes the
  prompt there) and only the detokenization moves to ``num_postprocess_workers``.

An offline benchmark that sends token ids (``trtllm-bench`` reads a pre-tokenized dataset)
skips this step, so it is a workload knob (``ServingWorkload.text_prompts``).

Magnitude (cited, not fitted): the Hugging Face ``tokenizers`` Rust BPE encodes 1.3-4.2 MB of
text per second on one thread (Llama 3.1 tokenizer on XNLI, huggingface/tokenizers PRs #1582
and #1584, 2024); English text runs about 4 bytes per token (OpenAI's "one token is roughly
4 characters" rule of thumb, help.openai.com "What are tokens").  At the middle of that range,
2 MB/s, a prompt costs 2 us per token: 1.8 ms for 922 tokens, 15 ms for 7,373.
"""

from __future__ import annotations

#: Single-thread BPE encode rate, bytes of text per second (middle of 1.3-4.2 MB/s above).
TOKENIZER_BYTES_PER_S = 2.0e6
#: Bytes of prompt text per token (English, OpenAI rule of thumb above).
TEXT_BYTES_PER_TOKEN = 4.0


def tokenize_s(prompt_tokens: float, bytes_per_token: float = TEXT_BYTES_PER_TOKEN,
               rate_Bps: float = TOKENIZER_BYTES_PER_S) -> float:
    """Host seconds to tokenize one prompt of ``prompt_tokens`` tokens (text bytes over the
    single-thread encode rate)."""
    return max(0.0, prompt_tokens) * bytes_per_token / rate_Bps


def burst_stage_s(engine_s: float, tokenizer_s: float) -> float:
    """Per-request service time of a burst going through the tokenizer and then the engine:
    requests that arrive together leave a two-stage tandem line at the pace of its slower
    stage (a deterministic flow line's throughput is its bottleneck's, Hopp and Spearman,
    Factory Physics, 3rd ed., §7.2)."""
    return max(engine_s, tokenizer_s)
