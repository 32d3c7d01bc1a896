"""What a sliding-window layer's fused attention costs beyond the scores it keeps.

:func:`parsearch.cost.token_flops.core_attention_forward_flops` counts the scores a
windowed layer keeps (query ``i`` sees ``min(i, w)`` keys) and
:func:`parsearch.cost.compute.unit_compute` prices them at the sequence's fused-attention
rate.  A fused kernel (FlashAttention-2, arXiv 2307.08691 §3.1; cuDNN's SDPA) walks, per
tile of query rows, the key tiles the mask touches, so a window prices differently:

* **Whole key tiles.**  A tile of ``T`` query rows with a window of ``w`` keys spans
  ``w + T - 1`` keys, i.e. ``ceil((w + T - 1) / T)`` key tiles, computed in full and then
  masked: 252 keys per query for GPT-OSS's 128-token window at ``T = 128`` and s = 4,096
  against the 126 kept (:func:`window_keys_processed`).
* **A short key loop.**  The fixed work of a query tile (loading Q, the softmax epilogue,
  writing O and the statistics) is spread over those few key tiles only: the profile's
  ``attention_half_block`` (the causal block length at which a kernel reaches half its
  rate) applies to a causal block whose mean key loop equals the window's, ``2 x`` the
  keys processed (:func:`window_size_factor`).
* **FP8 backward without the band.**  cuDNN's FP8 SDPA backward with a sliding window
  runs in the time of the whole causal triangle: it grows with ``s^2`` (GB200, 128 heads,
  head dim 64, window 128: 1.73 ms at s = 4,096, 90.3 ms at 32,768, 52x for 8x the
  length), while BF16 grows with ``s`` (0.465 ms, 3.69 ms); its forward runs at the BF16
  kernel's speed (0.195 against 0.210 ms), so a windowed layer under FP8 attention is
  priced at the BF16 rate forward and as a causal layer backward.

Check (cudnn-frontend@3929da2e ``benchmark/sdpa_benchmark_training/results/gpt_oss``,
cuDNN 9.22, batch 2 x 128 heads, head dim 64, window 128, s = 4,096, the GPT-OSS shape
of one micro-batch of 4 x 64 heads): BF16 forward 161 TFLOP/s on GB200, 167 on GB300,
backward 182 and 191 (counting the kept scores); ``tests/test_window_attention.py`` holds
the prices to these within 35%.  Before, a windowed layer was priced at the full layer's
rate, about 1 PFLOP/s forward.
"""

from __future__ import annotations

import math
from typing import Any

from parsearch.cost.token_flops import attended_keys
from parsearch.model.specs import ModelSpec

#: Keys per step of the fused kernels' key loop: 128-row tiles, as FlashAttention-2/3
#: and cuDNN's Hopper and Blackwell SDPA kernels step it at head dims 64-128 (our
#: reading; the check above holds it to cuDNN's measured window kernels).
KV_TILE = 128


def window_keys_processed(window: int, seq_len: int, tile: int = KV_TILE) -> float:
    """Mean keys a query row's tile computes under a causal window of ``window`` keys: the
    whole key tiles its band touches, ``m = ceil((window + tile - 1) / tile)`` of them, or
    fewer for the first ``m`` query tiles, which start nearer the sequence's start.

    >>> window_keys_processed(128, 4096), window_keys_processed(1024, 4096)
    (252.0, 1008.0)
    >>> window_keys_processed(4096, 4096) == 128 * 33 / 2
    True
    """
    tiles = max(1, math.ceil(seq_len / tile))
    band = min(math.ceil((window + tile - 1) / tile), tiles)
    # query tile i computes min(i + 1, band) key tiles
    computed = band * (band + 1) / 2.0 + (tiles - band) * band
    return float(tile * computed / tiles)


def window_size_factor(keys: float, half_block: float) -> float:
    """The short-loop factor of a key loop of ``keys`` keys: the causal size factor
    ``b / (b + half_block)`` at the causal block ``b = 2 keys`` with the same mean loop.

    >>> window_size_factor(256.0, 768.0)
    0.4
    """
    block = 2.0 * keys
    return block / (block + half_block)


def window_time_factors(model: ModelSpec, seq_len: int, causal: bool, block: Any,
                        half_block: float, *, fp8_attention: bool = False,
                        fp8_speedup: float = 1.0) -> tuple[Any, Any]:
    """Forward and backward attention time over what the layer-averaged kept scores cost
    at the sequence's size factor (1.0, 1.0 without windowed layers).

    ``block`` is the kernel's causal block (the sequence, or its CP chunk; a number or an
    array over layouts) and
    ``fp8_speedup`` the FP8 attention rate over the BF16 one on this GPU (with
    ``fp8_attention``: windowed forward at the BF16 rate, backward over the causal triangle).

    >>> from parsearch.model.presets import get_preset
    >>> oss = get_preset("gpt-oss-120b")
    >>> [round(float(f), 3) for f in window_time_factors(oss, 4096, True, 4096.0, 768.0)]
    [1.188, 1.188]
    >>> [round(float(f), 3) for f in window_time_factors(get_preset("llama3-8b"), 4096, True,
    ...                                                    4096.0, 768.0)]
    [1.0, 1.0]
    """
    window = model.sliding_window
    if window <= 0 or not model.sliding_window_layers or window >= seq_len:
        return 1.0, 1.0
    share = model.sliding_window_layers / model.num_layers
    full_keys = attended_keys(seq_len, causal)
    kept = attended_keys(seq_len, causal, window)
    processed = window_keys_processed(window, seq_len)
    full_factor = block / (block + half_block)
    counted = (1.0 - share) * full_keys + share * kept  # what the FLOPs count, per layer
    full_part = (1.0 - share) * full_keys
    window_part = share * processed * full_factor / window_size_factor(processed, half_block)
    forward = (full_part + window_part * (fp8_speedup if fp8_attention else 1.0)) / counted
    backward_window = share * full_keys if fp8_attention else window_part
    backward = (full_part + backward_window) / counted
    return forward, backward
