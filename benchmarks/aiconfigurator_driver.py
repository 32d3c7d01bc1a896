"""JSON-in/JSON-out driver of NVIDIA AIConfigurator, run in AIConfigurator's own Python.

``benchmarks/compare_aiconfigurator.py`` starts it with the interpreter given by
``--aic-python`` (or ``PARSEARCH_AIC_PYTHON``), so AIConfigurator never has to be installed
beside parsearch.  This file imports nothing from parsearch.

Usage::

    python aiconfigurator_driver.py --version          # {"aiconfigurator": "0.12.0", ...}
    python aiconfigurator_driver.py [--jobs N] < questions.json > answers.json

Input: ``{"questions": [Q, ...]}``, each ``Q`` a dict with ``id``, ``model_path`` (a
Hugging Face id AIConfigurator ships a config for), ``system`` (``h200_sxm``...),
``backend`` (``trtllm``), optional ``backend_version``, ``isl``, ``osl``, ``num_gpus``
(the whole group: replicas of one instance), ``layouts`` (candidates, each
``{"tp", "pp", "attention_dp", "moe_tp", "moe_ep"}``; the best is kept), optional
``gemm_quant`` / ``moe_quant`` / ``kv_quant`` (AIConfigurator's names; ``null`` lets it
infer them from the checkpoint), ``ctx_tokens`` (tokens per step budget), and either
``batch`` (a fixed batch per attention-DP rank, e.g. a benchmark's concurrency) or
``max_batch`` (max-throughput rows: batches 8, 16, 32... up to it are tried and the best
whose KV cache fits is kept, stopping at the first that does not); optional ``mode``
(``agg``, the default: in-flight batching; ``static_ctx`` / ``static_gen``: one prefill /
decode step, for prefill-only and decode-only measurements).

Output: ``{"aiconfigurator": version, "answers": [A, ...]}`` in input order, each ``A``
with ``id``, ``ok``, ``error`` (why it could not be priced), ``tokens_per_s`` (output
tokens/s of the whole group), ``tokens_per_s_per_gpu``, ``ttft_ms``, ``tpot_ms``,
``batch`` (per attention-DP rank), ``layout``, ``memory_gb``, ``backend_version``,
``calls`` (AIConfigurator estimates run) and ``wall_s``.  AIConfigurator's log goes to
stderr; stdout carries only the JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
from importlib import metadata
from typing import Any


def _version() -> str:
    for name in ("aiconfigurator", "aiconfigurator-core"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            return metadata.version(name)
    return "unknown"


def _batches(max_batch: int) -> list[int]:
    out, b = [], 8
    while b < max_batch:
        out.append(b)
        b *= 2
    out.append(max_batch)
    return out


def _estimate(q: dict[str, Any], layout: dict[str, Any], batch: int) -> Any:
    from aiconfigurator.cli.api import cli_estimate

    return cli_estimate(
        q["model_path"], q["system"], backend_name=q.get("backend", "trtllm"),
        backend_version=q.get("backend_version"), isl=int(q["isl"]), osl=int(q["osl"]),
        batch_size=int(batch), ctx_tokens=q.get("ctx_tokens"), tp_size=int(layout["tp"]),
        pp_size=int(layout.get("pp", 1)), attention_dp_size=int(layout.get("attention_dp", 1)),
        moe_tp_size=layout.get("moe_tp"), moe_ep_size=layout.get("moe_ep"),
        gemm_quant_mode=q.get("gemm_quant"), moe_quant_mode=q.get("moe_quant"),
        kvcache_quant_mode=q.get("kv_quant"), fmha_quant_mode=q.get("fmha_quant"),
        mode=q.get("mode", "agg"))


def answer(q: dict[str, Any]) -> dict[str, Any]:
    """Price one question: the best candidate layout at the given or the best fitting batch."""
    start = time.perf_counter()
    try:
        return _answer(q, start)
    except Exception as exc:
        return {"id": q.get("id"), "ok": False, "calls": 0,
                "wall_s": time.perf_counter() - start,
                "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}


def _answer(q: dict[str, Any], start: float) -> dict[str, Any]:
    best: dict[str, Any] | None = None
    errors: list[str] = []
    calls = 0
    for layout in q["layouts"]:
        gpus = int(layout["tp"]) * int(layout.get("pp", 1)) * int(layout.get("attention_dp", 1))
        replicas = int(q["num_gpus"]) // gpus
        batches = [int(q["batch"])] if q.get("batch") else _batches(int(q["max_batch"]))
        for batch in batches:
            calls += 1
            try:
                r = _estimate(q, layout, batch)
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
                break
            if r.kv_cache_warning and not q.get("batch"):
                break  # the engine would queue: a larger batch gives nothing more
            tps = float(r.tokens_per_second) * replicas
            if not math.isfinite(tps):
                errors.append(f"non-finite throughput at batch {batch}")
                break
            if best is None or tps > best["tokens_per_s"]:
                best = {"tokens_per_s": tps, "tokens_per_s_per_gpu": tps / int(q["num_gpus"]),
                        "ttft_ms": float(r.ttft), "tpot_ms": float(r.tpot), "batch": batch,
                        "layout": layout, "memory_gb": float(r.memory),
                        "backend_version": r.backend_version,
                        "kv_warning": r.kv_cache_warning}
    out: dict[str, Any] = {"id": q["id"], "ok": best is not None, "calls": calls,
                           "wall_s": time.perf_counter() - start}
    if best is None:
        out["error"] = "; ".join(dict.fromkeys(errors)) or "no batch fits the KV cache"
    else:
        out.update(best, error=None)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="store_true", help="print the versions as JSON")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    args = parser.parse_args(argv)
    if args.version:
        import aiconfigurator  # noqa: F401 - fails here when it is not importable

        print(json.dumps({"aiconfigurator": _version(), "python": sys.version.split()[0]}))
        return 0
    questions = json.load(sys.stdin)["questions"]
    real_stdout = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):  # AIConfigurator prints; keep stdout JSON
        if args.jobs > 1 and len(questions) > 1:
            import multiprocessing

            with multiprocessing.Pool(args.jobs) as pool:
                answers = pool.map(answer, questions, chunksize=1)
        else:
            answers = [answer(q) for q in questions]
    json.dump({"aiconfigurator": _version(), "answers": answers}, real_stdout)
    real_stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
