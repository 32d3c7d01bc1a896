"""GPU microbenchmarks that ground the efficiency profiles' priors (run on a lent device).

    python benchmarks/gpu_microbench.py --out DIR [--quick] [--sustain-s 60]
    python benchmarks/gpu_microbench.py --out DIR --device cpu --quick   # smoke test

Measures, on the GPU it runs on, what ``cost_models/efficiency/*.yaml`` takes from
other people's tables:

* ``gemm.csv``: dense GEMM throughput by shape and precision (BF16 ``torch.matmul``;
  FP8 e4m3 ``torch._scaled_mm`` with per-tensor scales and a BF16 output, the
  per-tensor recipe's kernel), on the linear-layer shapes of Llama 3 8B/70B at
  1k-16k tokens; the share of the datasheet dense peak is the profiles'
  ``gemm_efficiency`` and the size curve's ``F_half``.
* ``sustained.csv``: one large BF16 and FP8 GEMM run back to back for ``--sustain-s``
  seconds, throughput per one-second window and the SM clock (NVML) beside it: does a
  training-length load run slower than a 100-iteration burst (power-limited clocks)?
* ``attention.csv``: causal fused attention (``scaled_dot_product_attention``) forward
  and forward+backward by sequence length and head dim, FLOPs counted causal
  (``2 b h s^2 d`` forward, 2.5x that backward; FlashAttention-2 §3.2).
* ``memory.csv``: copy and elementwise kernels, achieved GB/s and share of the
  datasheet HBM bandwidth (the profiles' ``hbm_efficiency``).
* ``decode_gemm.csv``: decode-sized BF16 GEMMs (1-64 rows against the projection weights
  of gpt-oss-120b at TP 1-8 and Llama 3 70B at TP 4), each call timed back to back and,
  on CUDA, replayed from a CUDA graph of 32 calls as the engines run decode: seconds per
  call against the weight bytes it streams.  A straight-line fit ``t = t_fixed + bytes /
  B`` over the rows grounds serving's per-call fixed time beside the weight stream
  (``serve/gemm_rooflines.py``, priced with the training size curve's ``t0`` until this
  table exists).

Every timing is CUDA-event based after warm-up (wall clock on the CPU smoke test).
Results go to ``--out`` with ``meta.json`` (device, versions, date); copy the tables,
dated, next to the profiles (``cost_models/references/``) and cite them there.
Tests never need this script.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

#: Dense datasheet peaks (TFLOP/s) and HBM bandwidth (TB/s) by device-name fragment,
#: as in cost_models/hardware/*.yaml.
DATASHEET: dict[str, dict[str, float]] = {
    "H200": {"bf16": 989.4, "fp8": 1978.9, "hbm": 4.8},
    "H100": {"bf16": 989.4, "fp8": 1978.9, "hbm": 3.35},
    "B200": {"bf16": 2250.0, "fp8": 4500.0, "hbm": 7.7},
    "B300": {"bf16": 2250.0, "fp8": 4500.0, "hbm": 8.0},
}
#: (N, K) of the linear layers of Llama 3 8B (h 4096, f 14336) and 70B at TP8
#: (h 8192, f 28672): QKV, output projection, FC1 (gate+up), FC2.
LINEAR_SHAPES: tuple[tuple[int, int], ...] = (
    (6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336),
    (1280, 8192), (8192, 1024), (7168, 8192), (8192, 3584),
)
TOKENS = (1024, 2048, 4096, 8192, 16384)
#: (N, K) of decode projections: gpt-oss-120b (h 2880; QKV 5120 wide, o_proj from 4096)
#: at TP 1, 2, 4, 8, and Llama 3 70B at TP 4 (QKV, o_proj, gate/up, down).
DECODE_SHAPES: tuple[tuple[int, int], ...] = (
    (5120, 2880), (2880, 4096), (2560, 2880), (2880, 2048), (1280, 2880), (2880, 1024),
    (640, 2880), (2880, 512), (2560, 8192), (8192, 2048), (14336, 8192), (8192, 7168),
)
DECODE_ROWS = (1, 4, 16, 64)
#: Calls captured in one CUDA graph for the replayed timing.
GRAPH_CALLS = 32
SEQ_LENS = (1024, 2048, 4096, 8192, 16384)
HEAD_DIMS = (64, 128)


def _peaks(device_name: str) -> dict[str, float]:
    for fragment, peaks in DATASHEET.items():
        if fragment in device_name:
            return peaks
    return {}


def _timer(torch: Any, device: str) -> Callable[[Callable[[], Any], int], float]:
    """Seconds per call of ``fn`` over ``iters`` calls, after ``iters // 4 + 2`` warm-ups."""
    def measure(fn: Callable[[], Any], iters: int) -> float:
        for _ in range(iters // 4 + 2):
            fn()
        if device == "cuda":
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / 1e3 / iters
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t0) / iters
    return measure


def _fp8_matmul(torch: Any, a: Any, b: Any) -> Callable[[], Any] | None:
    """A per-tensor-scaled e4m3 GEMM with a BF16 output, or None where unsupported."""
    if not hasattr(torch, "float8_e4m3fn") or a.device.type != "cuda":
        return None
    a8 = a.to(torch.float8_e4m3fn)
    b8 = b.t().contiguous().to(torch.float8_e4m3fn).t()  # column-major second operand
    one = torch.ones((), device=a.device, dtype=torch.float32)
    try:
        torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    except (RuntimeError, TypeError):
        return None
    return lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)


def bench_gemm(torch: Any, device: str, peaks: dict[str, float], quick: bool) -> list[dict]:
    measure = _timer(torch, device)
    rows = []
    tokens = TOKENS[:2] if quick else TOKENS
    shapes = LINEAR_SHAPES[:2] if quick else LINEAR_SHAPES
    shrink = 16 if device == "cpu" else 1  # the CPU smoke test runs 1/16 of each dim
    for tokens_m in tokens:
        for shape_n, shape_k in shapes:
            m, n, k = tokens_m // shrink, shape_n // shrink, shape_k // shrink
            a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
            b = torch.randn(k, n, device=device, dtype=torch.bfloat16)
            flops = 2.0 * m * n * k
            for precision, fn in (("bf16", lambda a=a, b=b: a @ b),
                                  ("fp8", _fp8_matmul(torch, a, b))):
                if fn is None:
                    continue
                seconds = measure(fn, 5 if quick else 50)
                tflops = flops / seconds / 1e12
                rows.append({"m": m, "n": n, "k": k, "precision": precision,
                             "gflop": flops / 1e9, "seconds": seconds, "tflops": tflops,
                             "fraction_of_peak": tflops / peaks[precision]
                             if precision in peaks else ""})
    return rows


def _sm_clock_mhz() -> float | str:
    try:
        import pynvml  # type: ignore[import-not-found]
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        return float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))
    except Exception:  # NVML is optional; the throughput is the measurement
        return ""


def bench_sustained(torch: Any, device: str, peaks: dict[str, float],
                    seconds: float) -> list[dict]:
    size = 8192 if device == "cuda" else 256
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    flops = 2.0 * size**3
    rows = []
    for precision, fn in (("bf16", lambda: a @ b), ("fp8", _fp8_matmul(torch, a, b))):
        if fn is None:
            continue
        t_start = time.perf_counter()
        window = 0
        while time.perf_counter() - t_start < seconds:
            calls, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < 1.0:
                for _ in range(10):
                    fn()
                calls += 10
                if device == "cuda":
                    torch.cuda.synchronize()
            elapsed = time.perf_counter() - t0
            tflops = calls * flops / elapsed / 1e12
            rows.append({"precision": precision, "window_s": window, "tflops": tflops,
                         "fraction_of_peak": tflops / peaks[precision]
                         if precision in peaks else "", "sm_clock_mhz": _sm_clock_mhz()})
            window += 1
    return rows


def bench_attention(torch: Any, device: str, peaks: dict[str, float],
                    quick: bool) -> list[dict]:
    functional = torch.nn.functional
    measure = _timer(torch, device)
    rows = []
    tokens_per_call = 65536 if device == "cuda" else 512
    for d in HEAD_DIMS:
        for seq_len in (SEQ_LENS[:2] if quick else SEQ_LENS):
            s = seq_len // 16 if device == "cpu" else seq_len
            batch, heads = max(1, tokens_per_call // s), 8 if device == "cpu" else 32
            q, k, v = (torch.randn(batch, heads, s, d, device=device, dtype=torch.bfloat16,
                                   requires_grad=True) for _ in range(3))
            fwd_flops = 2.0 * batch * heads * s * s * d  # causal: half of 4 b h s^2 d

            def forward(q=q, k=k, v=v) -> Any:
                return functional.scaled_dot_product_attention(q, k, v, is_causal=True)

            out = forward()
            grad = torch.randn_like(out)

            def forward_backward(q=q, k=k, v=v, grad=grad) -> Any:
                # autograd.grad returns the gradients without accumulating into .grad
                out = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
                return torch.autograd.grad(out, (q, k, v), grad)

            t_fwd = measure(forward, 3 if quick else 20)
            t_both = measure(forward_backward, 3 if quick else 20)
            for phase, seconds, flops in (("forward", t_fwd, fwd_flops),
                                          ("backward", max(t_both - t_fwd, 1e-12),
                                           2.5 * fwd_flops)):
                tflops = flops / seconds / 1e12
                rows.append({"head_dim": d, "seq_len": s, "batch": batch, "heads": heads,
                             "phase": phase, "seconds": seconds, "tflops": tflops,
                             "fraction_of_bf16_peak": tflops / peaks["bf16"]
                             if "bf16" in peaks else ""})
    return rows


def bench_memory(torch: Any, device: str, peaks: dict[str, float], quick: bool) -> list[dict]:
    measure = _timer(torch, device)
    elements = (1 << 28) if device == "cuda" else (1 << 20)
    x = torch.randn(elements, device=device, dtype=torch.bfloat16)
    y = torch.randn(elements, device=device, dtype=torch.bfloat16)
    out = torch.empty_like(x)
    kernels = (("copy", lambda: out.copy_(x), 4), ("add", lambda: torch.add(x, y, out=out), 6),
               ("mul_scalar", lambda: torch.mul(x, 1.5, out=out), 4))
    rows = []
    for name, fn, bytes_per_element in kernels:
        seconds = measure(fn, 5 if quick else 50)
        tbps = elements * bytes_per_element / seconds / 1e12
        rows.append({"kernel": name, "bytes": elements * bytes_per_element,
                     "seconds": seconds, "tb_per_s": tbps,
                     "fraction_of_hbm": tbps / peaks["hbm"] if "hbm" in peaks else ""})
    return rows


def _graph_seconds(torch: Any, fn: Callable[[], Any], iters: int) -> float | str:
    """Seconds per call of ``fn`` replayed from a CUDA graph of :data:`GRAPH_CALLS` calls
    (no launch gaps between them, as engines run decode); "" where capture fails."""
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(GRAPH_CALLS):
                fn()
    except RuntimeError:
        return ""
    seconds = _timer(torch, "cuda")(graph.replay, iters)
    return seconds / GRAPH_CALLS


def bench_decode_gemm(torch: Any, device: str, peaks: dict[str, float],
                      quick: bool) -> list[dict]:
    measure = _timer(torch, device)
    rows = []
    shrink = 16 if device == "cpu" else 1
    shapes = DECODE_SHAPES[:3] if quick else DECODE_SHAPES
    for m in (DECODE_ROWS[:2] if quick else DECODE_ROWS):
        for shape_n, shape_k in shapes:
            n, k = shape_n // shrink, shape_k // shrink
            a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
            b = torch.randn(k, n, device=device, dtype=torch.bfloat16)
            out = torch.empty(m, n, device=device, dtype=torch.bfloat16)

            def call(a: Any = a, b: Any = b, out: Any = out) -> Any:
                return torch.matmul(a, b, out=out)

            weight_bytes = 2.0 * n * k
            eager = measure(call, 10 if quick else 200)
            graphed = _graph_seconds(torch, call, 5 if quick else 50) if device == "cuda" else ""
            best = graphed if isinstance(graphed, float) else eager
            rows.append({"m": m, "n": n, "k": k, "weight_bytes": weight_bytes,
                         "seconds_eager": eager, "seconds_graph": graphed,
                         "tb_per_s": weight_bytes / best / 1e12,
                         "fraction_of_hbm": weight_bytes / best / 1e12 / peaks["hbm"]
                         if "hbm" in peaks else ""})
    return rows


def _write(path: Path, rows: list[dict]) -> None:
    if not rows:
        return
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the CSV tables")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--quick", action="store_true", help="a few shapes, few iterations")
    parser.add_argument("--sustain-s", type=float, default=60.0,
                        help="seconds of back-to-back GEMMs per precision (0: skip)")
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        print("gpu_microbench: PyTorch is not installed", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_microbench: no CUDA device; use --device cpu for a smoke test",
              file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    peaks = _peaks(name)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"device": name, "torch": torch.__version__,
            "cuda": getattr(torch.version, "cuda", None),
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "datasheet": peaks, "quick": args.quick}
    (args.out / "meta.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
    sections = (("gemm", lambda: bench_gemm(torch, args.device, peaks, args.quick)),
                ("attention", lambda: bench_attention(torch, args.device, peaks, args.quick)),
                ("memory", lambda: bench_memory(torch, args.device, peaks, args.quick)),
                ("decode_gemm", lambda: bench_decode_gemm(torch, args.device, peaks,
                                                          args.quick)),
                ("sustained", lambda: bench_sustained(torch, args.device, peaks,
                                                      args.sustain_s)))
    for section, run in sections:
        if section == "sustained" and args.sustain_s <= 0:
            continue
        t0 = time.perf_counter()
        rows = run()
        _write(args.out / f"{section}.csv", rows)  # each table saved as soon as it is done
        print(f"{section}: {len(rows)} rows in {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
