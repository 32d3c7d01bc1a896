"""Validate the serving cost model against published serving measurements.

For every row of ``src/parsearch/data/serving_runs.csv`` (provenance in SERVING_RUNS.md):

* predicted throughput of the published layout: the best batch that fits (max-throughput
  rows have no concurrency; the engine fills its batch up to the KV capacity and its
  ``max_batch_size``), compared with the measured output tokens/s of the whole group.
  Each row's engine (``framework``) sizes the KV pool with its own rule; TensorRT-LLM rows
  whose command gave no limits get the ``max_batch_size``/``max_num_tokens`` trtllm-bench
  picks for each mapping (:func:`trtllm_bench_settings`);
* rank of the published layout among all instance shapes on the same GPU budget (each
  shape at its best batch, ranked by whole-group throughput): is it in the top 5?

One parameter of the serving model is fitted to these rows: TensorRT-LLM's fused-MoE
grouped-GEMM factor (:data:`parsearch.serve.engines.MOE_KERNEL_EFFICIENCY`, inside a cited
range), on its 47 MoE rows; ``benchmarks/fit_serving_moe.py`` gives its in-sample and
leave-one-model/GPU-generation-out errors.  The dense rows and the SGLang rows fit nothing,
so their errors are out of sample.  One choice was made while looking at the errors: the
KV-cache dtype of the Qwen3 checkpoints, which their sources do not state
(:data:`CHECKPOINT_KV`); ``--unstated-kv fp8`` prices every unstated TensorRT-LLM row with
FP8 KV instead, for comparison.
Held-out rows (``held_out`` = ``yes``: sources added after the model and its one fitted
factor were set; SERVING_RUNS.md) are kept out of every fit (:func:`fit_rows`; the MoE fit
script reads only those) and reported apart, per engine and source: throughput MAPE (dense,
MoE), published layout in the top 5, TTFT and TPOT MAPE where published.  The sweep
sources publish every layout, including ones their own measurements show are beaten by
copies of a smaller layout on the same GPUs (:func:`dominated_by`); the top-5 share over the
rows not so beaten is reported beside the raw one.  ``--held-out only`` skips the in-sample
rows, ``--held-out no`` the held-out ones.
Usage: ``python benchmarks/validate_serving.py [--json] [--unstated-kv checkpoint|fp8]
[--held-out both|only|no]``.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import sys
from collections import defaultdict
from dataclasses import replace
from typing import Any

from serving_rows import (
    ENGINE_OF,
    UNSTATED_KV,
    fit_rows,
    is_held_out,
    load_rows,
    trtllm_bench_settings,
    workload_for,
)

from parsearch.model.presets import get_preset
from parsearch.model.specs import ModelSpec
from parsearch.serve.api import _context
from parsearch.serve.confidence import gap_of, load_order_confidence
from parsearch.serve.evaluate import ServingEstimate, evaluate_aggregated, instance_times
from parsearch.serve.front import instance_shape
from parsearch.serve.space import enumerate_serving_layouts
from parsearch.serve.spec import ServingLayout, ServingWorkload
from parsearch.topology.cluster import ClusterSpec, load_cluster
from parsearch.topology.hardware import load_gpu_profile


@functools.cache
def shipped_tie_band() -> float:
    """The shipped serving order confidence's tie band (read once, when first needed)."""
    return load_order_confidence().tie_band


def _published_match(row: dict[str, str], e: ServingEstimate, moe: bool) -> bool:
    """Same layout as published.  TensorRT-LLM's ``--tp`` of an MoE run is the stage width;
    with attention DP (``attention_dp`` column) the attention TP is width / attention_dp;
    an unstated EP matches any ep."""
    lay = e.layout
    if lay.pp != int(row["pp"]) or lay.replicas * lay.gpus_per_replica != int(row["num_gpus"]):
        return False
    if moe:
        adp = int(row["attention_dp"] or 1)
        ep_ok = not row["ep"] or lay.ep == int(row["ep"])
        return lay.stage_width == int(row["tp"]) and lay.attention_dp == adp and ep_ok
    return lay.tp == int(row["tp"])


def evaluate_phase_row(row: dict[str, str]) -> dict[str, Any]:
    """A prefill-only or decode-only measurement: the published instance at its batch.

    Decode: output tokens/s = batch / TPOT of decode alone.  Prefill: input tokens/s =
    isl / (instance time one prompt occupies), prompts packed ``max_num_tokens`` per step.
    """
    model = get_preset(row["model"])
    workload = workload_for(row)
    ctx = _context(model, load_cluster(row["cluster"]), workload, None, None)
    n = int(row["num_gpus"])
    tp, pp, adp = int(row["tp"]), int(row["pp"]), int(row["attention_dp"] or 1)
    batch = int(row["concurrency"] or adp)
    g = tp * pp * adp
    layout = ServingLayout(tp=tp, pp=pp, ep=int(row["ep"] or 1), attention_dp=adp,
                           batch=batch, replicas=n // g)
    times = instance_times(ctx, layout)
    if row["phase"] == "decode":
        predicted = layout.replicas * batch / times.tpot_decode_s
        measured = float(row["output_tokens_per_s"])
    else:
        predicted = layout.replicas * workload.isl / times.prefill_busy_s
        measured = float(row["input_tokens_per_s"])
    return {"id": row["id"], "model": row["model"], "gpu": row["gpu"], "phase": row["phase"],
            "engine": ENGINE_OF[row["framework"]], "moe": model.moe is not None,
            "layout": layout.label(), "isl": workload.isl, "measured": measured,
            "predicted": round(predicted, 1), "ape": abs(predicted - measured) / measured,
            "log_ratio": math.log(predicted / measured)}


def _estimates(row: dict[str, str], model: ModelSpec, cluster: ClusterSpec,
               workload: ServingWorkload, n: int) -> list[ServingEstimate]:
    """Every layout on ``n`` GPUs, scored.  TensorRT-LLM rows that state no engine limits
    get trtllm-bench's own per mapping (:func:`trtllm_bench_settings`)."""
    layouts = enumerate_serving_layouts(model, workload, n, cluster.job_domain_size,
                                        cluster.gpus_per_node)
    auto = row["framework"] == "tensorrt-llm" and not row["max_batch"] and not row[
        "max_num_tokens"]
    gpu_bytes = load_gpu_profile(cluster.gpu).hbm_bytes
    contexts: dict[tuple[int, int], Any] = {}
    out = []
    for layout in layouts:
        key = (layout.stage_width, layout.pp) if auto else (0, 0)
        if key not in contexts:
            work = workload
            if auto:
                bs, tokens = trtllm_bench_settings(model, gpu_bytes, workload, *key)
                work = replace(workload, max_batch=bs, max_num_batched_tokens=tokens)
            contexts[key] = _context(model, cluster, work, None, None)
        out.append(evaluate_aggregated(contexts[key], layout, n))
    return out


def evaluate_row(row: dict[str, str], tie_band: float | None = None) -> dict[str, Any]:
    """One row's prediction, rank and tie (``tie_band``: default the shipped one; the
    benchmark that measures the band passes its own, so a stale file cannot stop it)."""
    model = get_preset(row["model"])
    cluster = load_cluster(row["cluster"])
    workload = workload_for(row)
    n = int(row["num_gpus"])
    estimates = _estimates(row, model, cluster, workload, n)
    best: dict[tuple[int, ...], ServingEstimate] = {}
    for e in estimates:
        shape = instance_shape(e)
        if e.fits and (shape not in best or e.tokens_per_s > best[shape].tokens_per_s):
            best[shape] = e
    ranked = sorted(best.values(), key=lambda e: -e.tokens_per_s)
    moe = model.moe is not None
    matches = [i for i, e in enumerate(ranked) if _published_match(row, e, moe)]
    out: dict[str, Any] = {"id": row["id"], "model": row["model"], "gpu": row["gpu"],
                           "engine": ENGINE_OF[row["framework"]], "source": row["source"],
                           "layout": f"tp{row['tp']}pp{row['pp']}", "isl": int(row["isl"]),
                           "osl": int(row["osl"]), "precision": row["precision"],
                           "shapes": len(ranked), "moe": moe,
                           "throughput": bool(row["output_tokens_per_s"]), "gpus": n,
                           "concurrency": row["concurrency"], "stall": row.get("stall", "")}
    if not matches:
        out.update(predicted=None, ape=None, rank=None, top5=False)
        return out
    pick = ranked[matches[0]]
    for name in ("ttft_ms", "tpot_ms"):  # latency rows: compare the published latencies
        if row[name]:
            value = float(row[name])
            got = getattr(pick, name)
            out[name] = {"measured": value, "predicted": round(got, 3),
                         "ape": abs(got - value) / value}
    if not row["output_tokens_per_s"]:
        out.update(predicted=None, ape=None, rank=matches[0] + 1, top5=matches[0] < 5)
        return out
    measured = float(row["output_tokens_per_s"])
    out["measured"] = measured
    # inside the measured tie band of the best (parsearch serve marks it "~")
    band = shipped_tie_band() if tie_band is None else tie_band
    out["tied"] = gap_of(ranked[0].tokens_per_s, pick.tokens_per_s) < band
    out.update(predicted=round(pick.tokens_per_s, 1), batch=pick.layout.batch,
               ape=abs(pick.tokens_per_s - measured) / measured,
               log_ratio=math.log(pick.tokens_per_s / measured),
               rank=matches[0] + 1, top5=matches[0] < 5, best=ranked[0].layout.label())
    return out


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def summarize(results: list[dict[str, Any]],
              phases: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    scored = [r for r in results if r["ape"] is not None]
    latency = {name: [r[name] for r in results if name in r] for name in ("ttft_ms", "tpot_ms")}
    by: dict[str, dict[str, list[float]]] = {"gpu": defaultdict(list), "model": defaultdict(list)}
    for r in scored:
        by["gpu"][r["gpu"]].append(r["ape"])
        by["model"][r["model"]].append(r["ape"])
    contested = [r for r in scored if r["shapes"] > 5]
    worst = sorted(scored, key=lambda r: -r["ape"])[:8]
    return {
        "rows": len(results), "scored": len(scored),
        "unscored": [r["id"] for r in results if r["ape"] is None and r["rank"] is None],
        "latency": latency,
        "phase_rows": phases or [],
        "mape": statistics.fmean(r["ape"] for r in scored) if scored else None,
        "median_ape": statistics.median(r["ape"] for r in scored) if scored else None,
        "mean_log_ratio": statistics.fmean(r["log_ratio"] for r in scored) if scored else None,
        "top5_share": sum(r["top5"] for r in scored) / len(scored) if scored else None,
        "top5_share_contested": (sum(r["top5"] for r in contested) / len(contested)
                                 if contested else None),
        "contested_rows": len(contested),
        "mape_dense": _mean([r["ape"] for r in scored if not r["moe"]]),
        "mape_moe": _mean([r["ape"] for r in scored if r["moe"]]),
        "top5_share_dense": _mean([float(r["top5"]) for r in scored if not r["moe"]]),
        "top5_share_moe": _mean([float(r["top5"]) for r in scored if r["moe"]]),
        "mape_by_gpu": {k: statistics.fmean(v) for k, v in sorted(by["gpu"].items())},
        "by_engine": by_engine(results, phases or []),
        "mape_by_model": {k: statistics.fmean(v) for k, v in sorted(by["model"].items())},
        "largest_errors": [{k: r[k] for k in ("id", "model", "gpu", "layout", "isl", "osl",
                                              "measured", "predicted", "ape")} for r in worst],
    }


def by_engine(results: list[dict[str, Any]],
              phases: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per engine: throughput MAPE (end-to-end rows), dense and MoE, and the phase rows'."""
    out: dict[str, dict[str, Any]] = {}
    for engine in sorted({r["engine"] for r in results} | {p["engine"] for p in phases}):
        rows = [r for r in results if r["engine"] == engine and r["ape"] is not None]
        ph = [p for p in phases if p["engine"] == engine]
        out[engine] = {
            "rows": len(rows), "mape": _mean([r["ape"] for r in rows]),
            "mape_dense": _mean([r["ape"] for r in rows if not r["moe"]]),
            "mape_moe": _mean([r["ape"] for r in rows if r["moe"]]),
            "phase_rows": len(ph), "phase_mape": _mean([p["ape"] for p in ph]),
        }
    return out


def _latency_mape(rows: list[dict[str, Any]], name: str) -> tuple[int, float | None]:
    items = [r[name]["ape"] for r in rows if name in r]
    return len(items), _mean(items)


#: Summary groups of the held-out rows besides "all", engines and sources: the rows whose
#: every InferenceMAX repeat had a cold-start stall (``stall`` column; reported apart, out
#: of "all"), and all rows with those included.
STALLED = "first-wave stall (every repeat), reported apart"
ALL_STALLS_IN = "all, stall rows included"


def _group_order(key: str) -> tuple[int, str]:
    rank = {"all": 0, ALL_STALLS_IN: 1, STALLED: 2}
    return (rank.get(key, 3 if key.startswith("engine") else 4), key)


def held_out_summary(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Held-out rows, per engine and per source (and all together): throughput MAPE (dense,
    MoE), share of rows whose published layout is in the top 5 (a layout that does not fit
    counts as a miss), TTFT and TPOT MAPE where published, and the rows nothing priced."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in results:
        groups[ALL_STALLS_IN].append(r)
        if r["stall"]:  # a cold-start stall in every repeat (inferencemax_repeats.py)
            groups[STALLED].append(r)
            continue
        groups["all"].append(r)
        groups[f"engine {r['engine']}"].append(r)
        groups[f"source {r['source']}"].append(r)
    out: dict[str, dict[str, Any]] = {}
    for key in sorted(groups, key=_group_order):
        rows = groups[key]
        scored = [r for r in rows if r["ape"] is not None]
        ranked = [r for r in rows if r["throughput"]]
        n_ttft, ttft = _latency_mape(rows, "ttft_ms")
        n_tpot, tpot = _latency_mape(rows, "tpot_ms")
        out[key] = {
            "rows": len(rows), "throughput_rows": len(scored),
            "mape": _mean([r["ape"] for r in scored]),
            "median_ape": statistics.median(r["ape"] for r in scored) if scored else None,
            "mean_log_ratio": _mean([r["log_ratio"] for r in scored]),
            "dense_rows": sum(not r["moe"] for r in scored),
            "mape_dense": _mean([r["ape"] for r in scored if not r["moe"]]),
            "moe_rows": sum(r["moe"] for r in scored),
            "mape_moe": _mean([r["ape"] for r in scored if r["moe"]]),
            "top5_share": _mean([float(bool(r["top5"])) for r in ranked]),
            "top5_or_tied_share": _mean([float(bool(r["top5"] or r.get("tied")))
                                         for r in ranked]),
            "ttft_rows": n_ttft, "ttft_mape": ttft, "tpot_rows": n_tpot, "tpot_mape": tpot,
            "unpriced": [r["id"] for r in rows if r["rank"] is None],
        }
    return out


def sweep_choice(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Layout choice inside the sweeps (held-out sources that run every TP/EP/attention-DP
    shape of a question): rows of one question (source, engine, model, GPU, precision,
    lengths, concurrency) on different layouts, ranked by output tokens/s per GPU.  Share
    of questions whose measured best layout is parsearch's best too, the measured
    tokens/s per GPU of parsearch's pick over the measured best (1 = no loss), and the share
    whose measured best is in the top 5 of parsearch's whole search for that question (a
    sweep has no publisher's pick, so its measured best stands in for one)."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in results:
        if r["ape"] is not None:
            groups[question(r)].append(r)
    hits, ratios, in_top5 = [], [], []
    for rows in groups.values():
        if len(rows) < 2:
            continue
        best = max(rows, key=lambda r: r["measured"] / r["gpus"])
        pick = max(rows, key=lambda r: r["predicted"] / r["gpus"])
        hits.append(float(pick is best))
        in_top5.append(float(bool(best["top5"])))
        ratios.append((pick["measured"] / pick["gpus"]) / (best["measured"] / best["gpus"]))
    return {"questions": len(hits), "best_agrees": _mean(hits),
            "pick_over_best": _mean(ratios),
            "worst_pick_over_best": min(ratios) if ratios else None,
            "best_in_top5": _mean(in_top5)}


def _same_question(r: dict[str, Any]) -> tuple[Any, ...]:
    return (r["source"], r["engine"], r["model"], r["gpu"], r["precision"], r["isl"], r["osl"])


def question(r: dict[str, Any]) -> tuple[Any, ...]:
    """One serving question: :func:`_same_question` at one concurrency."""
    return (*_same_question(r), r["concurrency"])


def dominated_by(row: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A measured row of the same source and question whose replicas beat ``row`` on its
    own GPU budget: a layout on ``m`` GPUs, ``m`` dividing ``row``'s ``N`` and smaller, whose
    ``N / m`` copies deliver more output tokens/s than ``row`` measured.  Offline
    (maximum-throughput) rows compare offline rows; a row at concurrency ``C`` compares the
    smaller layout measured at ``C m / N`` (each copy gets its share of the requests).  None
    when no such row was measured.  A sweep point beaten so is one the source itself shows
    is not worth picking, so its rank outside parsearch's top 5 is not a ranking miss."""
    n = row["gpus"]
    conc = int(row["concurrency"]) if row["concurrency"] else None
    for x in rows:
        m = x["gpus"]
        if x is row or x["measured"] is None or m >= n or n % m or _same_question(
                x) != _same_question(row):
            continue
        xc = int(x["concurrency"]) if x["concurrency"] else None
        if (xc is None) != (conc is None) or (conc is not None and xc * n != conc * m):
            continue
        if x["measured"] * n / m > row["measured"]:
            return x
    return None


def top5_undominated(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Published layout in the top 5 over the rows no replicated measured layout of the
    same source beats (:func:`dominated_by`): the share a publisher's pick would see."""
    scored = [r for r in results if r["ape"] is not None and r["throughput"]]
    kept = [r for r in scored if dominated_by(r, scored) is None]
    return {"rows": len(kept), "dominated": len(scored) - len(kept),
            "top5_share": _mean([float(bool(r["top5"])) for r in kept])}


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def print_held_out(summary: dict[str, dict[str, Any]]) -> None:
    print("HELD-OUT rows (kept out of every fit):")
    for key, e in summary.items():
        print(f"  {key}: {e['rows']} rows; throughput {e['throughput_rows']} rows MAPE "
              f"{_pct(e['mape'])} (median {_pct(e['median_ape'])}, mean log(pred/meas) "
              f"{e['mean_log_ratio'] or 0:+.3f}), dense {e['dense_rows']} "
              f"{_pct(e['mape_dense'])}, MoE {e['moe_rows']} {_pct(e['mape_moe'])}; "
              f"published layout in top 5 {_pct(e['top5_share'])} (or tied with the best "
              f"{_pct(e['top5_or_tied_share'])}); TTFT {e['ttft_rows']} rows "
              f"{_pct(e['ttft_mape'])}, TPOT {e['tpot_rows']} rows {_pct(e['tpot_mape'])}; "
              f"unpriced {len(e['unpriced'])}")


def print_in_sample(summary: dict[str, Any]) -> None:
    print(f"IN-SAMPLE rows: {summary['rows']}, throughput rows scored {summary['scored']}, "
          f"unscored {summary['unscored']}")
    print(f"MAPE {summary['mape']:.3f}  median APE {summary['median_ape']:.3f}  "
          f"mean log(pred/meas) {summary['mean_log_ratio']:+.3f}")
    print(f"dense: MAPE {summary['mape_dense']:.3f}, top 5 {summary['top5_share_dense']:.3f}; "
          f"MoE: MAPE {summary['mape_moe']:.3f}, top 5 {summary['top5_share_moe']:.3f}")
    print(f"published layout in top 5: {summary['top5_share']:.3f} of rows; "
          f"{summary['top5_share_contested']} of the {summary['contested_rows']} rows with more "
          "than 5 candidate shapes")
    for name, items in summary["latency"].items():
        for item in items:
            print(f"{name}: measured {item['measured']}, predicted {item['predicted']} "
                  f"(APE {item['ape']:.2f})")
    for r in summary["phase_rows"]:
        print(f"{r['phase']} only, {r['id']} {r['model']} {r['gpu']} {r['layout']} isl {r['isl']}: "
              f"measured {r['measured']:,.0f} tok/s, predicted {r['predicted']:,.0f} "
              f"(APE {r['ape']:.2f})")
    for engine, e in summary["by_engine"].items():
        parts = [f"{e['rows']} throughput rows"]
        for key in ("mape", "mape_dense", "mape_moe"):
            if e[key] is not None:
                parts.append(f"{key} {e[key]:.3f}")
        if e["phase_rows"]:
            parts.append(f"{e['phase_rows']} phase rows MAPE {e['phase_mape']:.3f}")
        print(f"engine {engine}: " + ", ".join(parts))
    for kind in ("gpu", "model"):
        items = summary[f"mape_by_{kind}"].items()
        print(f"MAPE by {kind}: " + ", ".join(f"{k} {v:.3f}" for k, v in items))
    print("largest errors:")
    for r in summary["largest_errors"]:
        print(f"  {r['id']} {r['model']} {r['gpu']} {r['layout']} {r['isl']}/{r['osl']}: "
              f"measured {r['measured']:.0f}, predicted {r['predicted']:.0f} "
              f"(APE {r['ape']:.2f})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--unstated-kv", choices=("checkpoint", "fp8"), default="checkpoint",
                        help="KV dtype of TensorRT-LLM rows that do not state it: the "
                        "checkpoint's (CHECKPOINT_KV, default) or FP8 for all")
    parser.add_argument("--held-out", choices=("both", "only", "no"), default="both",
                        help="report the in-sample rows, the held-out rows (SERVING_RUNS.md), "
                        "or both (default)")
    args = parser.parse_args(argv)
    UNSTATED_KV["mode"] = args.unstated_kv
    rows = load_rows()
    doc: dict[str, Any] = {}
    if args.held_out != "only":
        fit = fit_rows(rows)
        results = [evaluate_row(row) for row in fit if not row["phase"]]
        phases = [evaluate_phase_row(row) for row in fit if row["phase"]]
        doc.update(summary=summarize(results, phases), rows=results)
    if args.held_out != "no":
        held = [evaluate_row(row) for row in rows if is_held_out(row) and not row["phase"]]
        steady = [r for r in held if not r["stall"]]  # stall rows: reported apart
        doc.update(held_out=held_out_summary(held), held_out_sweeps=sweep_choice(steady),
                   held_out_top5_undominated=top5_undominated(steady), held_out_rows=held)
    if args.json:
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    if "summary" in doc:
        print_in_sample(doc["summary"])
    if "held_out" in doc:
        print_held_out(doc["held_out"])
        c = doc["held_out_sweeps"]
        print(f"  layout choice in the sweeps: {c['questions']} questions, measured best is "
              f"parsearch's best in {_pct(c['best_agrees'])}; parsearch's pick reaches "
              f"{_pct(c['pick_over_best'])} of the best measured tokens/s per GPU on average "
              f"(worst {_pct(c['worst_pick_over_best'])}); measured best in parsearch's top 5 "
              f"in {_pct(c['best_in_top5'])}")
        u = doc["held_out_top5_undominated"]
        print(f"  published layout in top 5 over the {u['rows']} rows no replicated measured "
              f"layout of their source beats: {_pct(u['top5_share'])} ({u['dominated']} "
              "sweep points are so beaten)")
    return 0

if __name__ == "__main__":
    sys.exit(main())
