"""parsearch serve beside NVIDIA AIConfigurator on the serving rows (issue 34).

For every row of ``src/parsearch/data/serving_runs.csv`` (provenance in SERVING_RUNS.md)
this prints the measured throughput, parsearch's prediction (computed exactly as
``benchmarks/validate_serving.py`` does: :func:`validate_serving.evaluate_row` and
:func:`validate_serving.evaluate_phase_row`) and AIConfigurator's estimate of the same
published configuration, with both APEs; then MAPE, median APE and the share within ±25%
of each tool on the rows both price, dense and MoE apart, the published latencies, and
the wall time per question of each tool.  Rows AIConfigurator cannot price are listed
with its reason.

AIConfigurator is optional and never imported here: it runs in its own interpreter
(``--aic-python``, else ``PARSEARCH_AIC_PYTHON``) through ``aiconfigurator_driver.py``
(JSON in, JSON out), e.g.::

    python -m venv /tmp/aicvenv && /tmp/aicvenv/bin/pip install aiconfigurator==0.12.0
    python benchmarks/compare_aiconfigurator.py --aic-python /tmp/aicvenv/bin/python

Without one it prints parsearch's figures, says why AIConfigurator could not run and
exits 0.

How each row is asked of AIConfigurator (its ``cli_estimate``, the programmatic form of
``aiconfigurator cli estimate``: one given configuration, no search):

* model: its shipped Hugging Face config of the same architecture (Llama 3.3 70B and
  Llama 3 8B as the Llama 3.1 ones; the NVIDIA FP8 Llama 3.1 70B and Qwen's FP8 Qwen3
  checkpoints where the row is FP8, so it reads their quantization); FP4 rows set NVFP4
  GEMMs and MoE, BF16 rows BF16, other FP8 rows FP8 GEMMs; the KV-cache dtype is the one
  validate_serving prices the row with (:func:`validate_serving.workload_for`);
* GPU system and engine: ``h100_sxm``, ``h200_sxm``, ``b200_sxm``, ``gb200``; TensorRT-LLM
  rows with the ``trtllm`` database, SGLang rows with ``sglang``, each at AIConfigurator's
  default (latest) database version;
* layout: the published one (TP, PP; MoE rows: attention TP = width / attention DP and
  the experts spread over the width, EP = width, MoE TP = 1, where the source states no EP),
  replicated over the row's GPUs;
* batch: a stated concurrency as is (per attention-DP rank); max-throughput rows try
  batches 8, 16, 32... up to the ``max_batch_size`` the engine had (the row's, else
  trtllm-bench's own, :func:`validate_serving.trtllm_bench_settings`) and keep the best
  whose KV cache fits (parsearch likewise takes the best batch that fits); the tokens per
  step are the row's ``max_num_tokens`` or trtllm-bench's (at least the ISL);
* a row run one request at a time (concurrency 1, the latency row): its ``static`` mode,
  one request's prefill and decode (its in-flight-batching mode gives that request a TTFT
  of 978 ms against 138 ms static and 148 ms measured, 2026-12-06);
* prefill-only / decode-only rows: AIConfigurator's ``static_ctx`` / ``static_gen`` step at
  the published batch (decode: batch / TPOT; prefill: ``max_num_tokens`` per rank / TTFT).

Measured 2026-12-06 on the 2-core development machine (``--jobs 2``), AIConfigurator 0.12.0
(aiconfigurator-core 0.12.0; its default databases, trtllm 1.3.0rc20 and sglang 0.5.14),
parsearch at commit 057e668.  AIConfigurator priced 149 of the 153 rows; both tools on
the 148 throughput rows (all TensorRT-LLM)::

                                MAPE   median   within ±25%
    all (148)   parsearch       11.5%   9.3%    95%
                AIConfigurator  15.0%  10.3%    79%
    dense (101) parsearch        9.3%   8.6%   100%
                AIConfigurator   9.3%   8.2%    96%
    MoE (47)    parsearch       16.0%  10.1%    83%   (in sample: its one fitted factor)
                AIConfigurator  27.2%  25.9%    43%

Per model (parsearch / AIConfigurator MAPE): Llama 3 70B 7.9% / 10.5%, Llama 3.1 405B
10.0% / 8.9%, Llama 3 8B 10.9% / 7.6%, Qwen3-235B-A22B 9.8% / 24.6% (AIConfigurator
0.5-0.75x the measured on H100/H200), Qwen3-30B-A3B 24.4% / 30.8% (both 2.2-2.5x on the
GB200 128/128 row).  parsearch's MoE figure is in sample: TensorRT-LLM's fused-MoE factor
is fitted on these 47 rows (out of sample, leaving the model out: 16.7%, docs/serving.md);
nothing of AIConfigurator is fitted to them.  The latency row s0148 (concurrency 1):
TTFT measured 147.6 ms, parsearch 169.6 (15%), AIConfigurator 137.6 (7%); TPOT 14.7 ms,
parsearch 17.2 (17%), AIConfigurator 15.7 (7%).  Not priced by AIConfigurator: the four
SGLang DeepSeek-V3 phase rows (s0150-s0153, EP 32 and 72 on H100), "Cross-node EP requires
DeepEP A2A data" (its sglang database has none for H100 across nodes).  Wall time per
question (median): parsearch 0.10 s (every layout on the row's GPUs enumerated and
ranked), AIConfigurator 9.7 s (0.8-25 s; its batch sweep of 1-10 estimates, about 1-1.5 s
each once its database is loaded); 30 s and 1,536 s for all rows.

Usage: ``python benchmarks/compare_aiconfigurator.py [--aic-python PY] [--jobs N]
[--rows s0001,s0002] [--json] [--save FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import validate_serving as vs

from parsearch.model.presets import get_preset
from parsearch.topology.cluster import load_cluster
from parsearch.topology.hardware import load_gpu_profile

DRIVER = Path(__file__).resolve().parent / "aiconfigurator_driver.py"
#: parsearch preset -> AIConfigurator's shipped config (same architecture), by precision.
AIC_MODEL = {
    "llama3-70b": {"fp8": "nvidia/Llama-3.1-70B-Instruct-FP8",
                   "default": "meta-llama/Meta-Llama-3.1-70B"},
    "llama3-8b": {"default": "meta-llama/Meta-Llama-3.1-8B"},
    "llama3.1-405b": {"default": "meta-llama/Meta-Llama-3.1-405B"},
    "qwen3-235b-a22b": {"fp8": "Qwen/Qwen3-235B-A22B-FP8", "default": "Qwen/Qwen3-235B-A22B"},
    "qwen3-30b-a3b": {"fp8": "Qwen/Qwen3-30B-A3B-FP8", "default": "Qwen/Qwen3-30B-A3B"},
    "deepseek-v3": {"default": "deepseek-ai/DeepSeek-V3"},
}
AIC_SYSTEM = {"h100-sxm": "h100_sxm", "h200-sxm": "h200_sxm", "b200": "b200_sxm",
              "gb200": "gb200"}
AIC_BACKEND = {"tensorrt-llm": "trtllm", "sglang": "sglang", "vllm": "vllm"}
#: Quantization AIConfigurator is told where the checkpoint does not say it (None: infer).
AIC_QUANT = {"fp4": "nvfp4", "bf16": "bfloat16", "fp8": "fp8"}
AIC_KV = {"fp8": "fp8", "bf16": "bfloat16"}
BAND = 0.25


def find_aic_python(given: str | None) -> tuple[str | None, str]:
    """(interpreter, reason): the python that can import aiconfigurator, or why none."""
    candidate = given or os.environ.get("PARSEARCH_AIC_PYTHON")
    if not candidate:
        return None, ("no AIConfigurator python given (--aic-python or PARSEARCH_AIC_PYTHON; "
                      "e.g. python -m venv /tmp/aicvenv && /tmp/aicvenv/bin/pip install "
                      "aiconfigurator)")
    exe = shutil.which(candidate) or candidate
    if not Path(exe).exists():
        return None, f"{candidate} does not exist"
    try:
        done = subprocess.run([exe, str(DRIVER), "--version"], capture_output=True, text=True,
                              timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{candidate} could not run: {exc}"
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"{candidate} cannot import aiconfigurator: {tail}"
    return exe, json.loads(done.stdout.strip().splitlines()[-1])["aiconfigurator"]


def question(row: dict[str, str]) -> tuple[dict[str, Any] | None, str | None]:
    """AIConfigurator's question for one row, or the reason there is none."""
    if row["model"] not in AIC_MODEL:
        return None, f"no AIConfigurator config for {row['model']}"
    if row["gpu"] not in AIC_SYSTEM:
        return None, f"no AIConfigurator system for {row['gpu']}"
    names = AIC_MODEL[row["model"]]
    precision = row["precision"]
    path = names.get(precision, names["default"])
    reads_quant = path != names["default"]  # an FP8 checkpoint: AIConfigurator reads it
    model = get_preset(row["model"])
    moe = model.moe is not None
    workload = vs.workload_for(row)
    pp, adp = int(row["pp"]), int(row["attention_dp"] or 1)
    # The ``tp`` column is the stage width of an end-to-end MoE row (TensorRT-LLM's --tp)
    # and the attention TP of a phase row (validate_serving's two readings).
    width = int(row["tp"]) * adp if row["phase"] else int(row["tp"])
    if moe:
        ep = int(row["ep"] or width)
        layout = {"tp": width // adp, "pp": pp, "attention_dp": adp, "moe_tp": width // ep,
                  "moe_ep": ep}
    else:
        layout = {"tp": width, "pp": pp, "attention_dp": 1}
    q: dict[str, Any] = {
        "id": row["id"], "model_path": path, "system": AIC_SYSTEM[row["gpu"]],
        "backend": AIC_BACKEND[row["framework"]], "isl": workload.isl, "osl": workload.osl,
        "num_gpus": int(row["num_gpus"]), "layouts": [layout],
        "gemm_quant": None if reads_quant else AIC_QUANT[precision],
        "moe_quant": None if reads_quant or not moe else AIC_QUANT[precision],
        "kv_quant": AIC_KV.get(workload.kv_precision),
    }
    max_batch, tokens = workload.max_batch, workload.max_num_batched_tokens
    if row["framework"] == "tensorrt-llm" and not row["max_batch"] and not row["max_num_tokens"]:
        gpu_bytes = load_gpu_profile(load_cluster(row["cluster"]).gpu).hbm_bytes
        max_batch, tokens = vs.trtllm_bench_settings(model, gpu_bytes, workload, width, pp)
    q["ctx_tokens"] = max(tokens, workload.isl)
    if row["phase"]:
        q["mode"] = "static_gen" if row["phase"] == "decode" else "static_ctx"
        if row["phase"] == "decode":
            q["batch"] = max(int(row["concurrency"]) // adp, 1)
            q["osl"] = max(workload.osl, 2)
        else:
            q["batch"] = max(tokens // workload.isl, 1)
    elif row["concurrency"]:
        q["batch"] = max(int(row["concurrency"]) // adp, 1)
        if q["batch"] == 1:  # one request at a time: its static pass, no in-flight batching
            q["mode"] = "static"
    else:
        q["max_batch"] = max_batch
    return q, None


def aic_measure(row: dict[str, str], q: dict[str, Any], a: dict[str, Any]) -> float | None:
    """AIConfigurator's figure in the row's measured unit (output, or input, tokens/s)."""
    if not a["ok"]:
        return None
    if row["phase"] == "decode":
        return int(row["concurrency"]) / (a["tpot_ms"] / 1e3)
    if row["phase"] == "prefill":
        lay = a["layout"]
        ranks = q["num_gpus"] // (lay["tp"] * lay["pp"])  # attention-DP ranks over the group
        return ranks * a["batch"] * q["isl"] / (a["ttft_ms"] / 1e3)
    if not row["output_tokens_per_s"]:
        return None
    return a["tokens_per_s"]


def run_aic(exe: str, questions: list[dict[str, Any]], jobs: int) -> dict[str, Any]:
    done = subprocess.run([exe, str(DRIVER), "--jobs", str(jobs)],
                          input=json.dumps({"questions": questions}), capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"AIConfigurator driver failed: {tail}")
    return json.loads(done.stdout)


def parsearch_rows(rows: list[dict[str, str]]) -> dict[str, dict[str, Any]]:
    out = {}
    for row in rows:
        start = time.perf_counter()
        if row["phase"]:
            r = vs.evaluate_phase_row(row)
        else:
            r = vs.evaluate_row(row)
            r["measured"] = float(row["output_tokens_per_s"] or 0) or None
        r["wall_s"] = time.perf_counter() - start
        out[row["id"]] = r
    return out


def _layout(row: dict[str, str]) -> str:
    text = f"tp{row['tp']}pp{row['pp']}"
    gpus = int(row["tp"]) * int(row["pp"])
    if row["attention_dp"]:
        text += f"adp{row['attention_dp']}"
        gpus *= int(row["attention_dp"]) if row["phase"] else 1
    if row["ep"]:
        text += f"ep{row['ep']}"
    return f"{text}x{int(row['num_gpus']) // gpus}"


def _stats(apes: list[float]) -> dict[str, Any]:
    if not apes:
        return {"rows": 0}
    return {"rows": len(apes), "mape": statistics.fmean(apes),
            "median": statistics.median(apes),
            "within_25": sum(a <= BAND for a in apes) / len(apes)}


def _fmt(s: dict[str, Any]) -> str:
    if not s["rows"]:
        return "no rows"
    return (f"MAPE {s['mape']:.1%}, median {s['median']:.1%}, within ±25% "
            f"{s['within_25']:.0%} ({s['rows']} rows)")


def compare(rows: list[dict[str, str]], ours: dict[str, dict[str, Any]],
            answers: dict[str, dict[str, Any]], questions: dict[str, dict[str, Any]],
            skipped: dict[str, str]) -> dict[str, Any]:
    table, missing, latency = [], [], []
    for row in rows:
        p = ours[row["id"]]
        moe = get_preset(row["model"]).moe is not None
        a = answers.get(row["id"])
        aic = aic_measure(row, questions[row["id"]], a) if a else None
        measured = p.get("measured")
        entry = {"id": row["id"], "model": row["model"], "gpu": row["gpu"],
                 "engine": vs.ENGINE_OF[row["framework"]], "layout": _layout(row),
                 "isl": int(row["isl"]), "osl": int(row["osl"]), "phase": row["phase"] or "",
                 "moe": moe, "measured": measured, "parsearch": p.get("predicted"),
                 "aic": aic, "parsearch_s": p["wall_s"],
                 "aic_s": a["wall_s"] if a else None, "aic_batch": a.get("batch") if a else None}
        for key, value in (("parsearch_ape", entry["parsearch"]), ("aic_ape", aic)):
            entry[key] = abs(value - measured) / measured if value and measured else None
        if a is None or not a["ok"]:
            missing.append({"id": row["id"], "model": row["model"], "gpu": row["gpu"],
                            "layout": entry["layout"],
                            "reason": skipped.get(row["id"])
                            or (a["error"] if a else "not run")})
        for name in ("ttft_ms", "tpot_ms"):
            if row[name] and name in p:
                value = float(row[name])
                got = a.get(name) if a and a["ok"] else None
                latency.append({"id": row["id"], "metric": name, "measured": value,
                                "parsearch": p[name]["predicted"], "aic": got,
                                "parsearch_ape": p[name]["ape"],
                                "aic_ape": abs(got - value) / value if got else None})
        table.append(entry)
    common = [e for e in table if e["parsearch_ape"] is not None and e["aic_ape"] is not None]
    summary: dict[str, Any] = {"rows": len(table), "common": len(common),
                               "aic_priced": sum(e["aic"] is not None for e in table)}
    for group, sel in (("all", common), ("dense", [e for e in common if not e["moe"]]),
                       ("moe", [e for e in common if e["moe"]])):
        summary[group] = {tool: _stats([e[f"{tool}_ape"] for e in sel])
                          for tool in ("parsearch", "aic")}
    by_engine = {}
    for engine in sorted({e["engine"] for e in common}):
        sel = [e for e in common if e["engine"] == engine]
        by_engine[engine] = {tool: _stats([e[f"{tool}_ape"] for e in sel])
                             for tool in ("parsearch", "aic")}
    summary["by_engine"] = by_engine
    summary["wall_s"] = {
        "parsearch": statistics.median(e["parsearch_s"] for e in table),
        "aic": (statistics.median(e["aic_s"] for e in table if e["aic_s"] is not None)
                if any(e["aic_s"] is not None for e in table) else None)}
    summary["wall_s_total"] = {
        "parsearch": sum(e["parsearch_s"] for e in table),
        "aic": sum(e["aic_s"] for e in table if e["aic_s"] is not None)}
    return {"summary": summary, "rows": table, "missing": missing, "latency": latency}


def _num(value: float | None) -> str:
    return f"{value:,.0f}" if value is not None else "-"


def _pct(value: float | None) -> str:
    return f"{value:.0%}" if value is not None else "-"


def print_report(result: dict[str, Any], version: str | None, reason: str | None) -> None:
    print(f"{'id':6} {'model':16} {'gpu':9} {'layout':16} {'isl/osl':11} {'measured':>9} "
          f"{'parsearch':>9} {'APE':>5} {'AIC':>9} {'APE':>5} {'AIC bs':>6}")
    for e in result["rows"]:
        io = f"{e['isl']}/{e['osl']}" + (f" {e['phase'][:3]}" if e["phase"] else "")
        print(f"{e['id']:6} {e['model']:16} {e['gpu']:9} {e['layout']:16} {io:11} "
              f"{_num(e['measured']):>9} {_num(e['parsearch']):>9} {_pct(e['parsearch_ape']):>5} "
              f"{_num(e['aic']):>9} {_pct(e['aic_ape']):>5} {e['aic_batch'] or '-':>6}")
    s = result["summary"]
    if reason:
        print(f"AIConfigurator not installable here: {reason}")
        ps = _stats([e["parsearch_ape"] for e in result["rows"]
                     if e["parsearch_ape"] is not None])
        print(f"parsearch alone: {_fmt(ps)}")
        return
    print(f"AIConfigurator {version}: priced {s['aic_priced']} of {s['rows']} rows; "
          f"both tools on {s['common']} throughput rows")
    for group in ("all", "dense", "moe"):
        for tool, name in (("parsearch", "parsearch"), ("aic", "AIConfigurator")):
            print(f"  {group:5} {name:14} {_fmt(s[group][tool])}")
    for engine, tools in s["by_engine"].items():
        print(f"  engine {engine}: parsearch {_fmt(tools['parsearch'])}; "
              f"AIConfigurator {_fmt(tools['aic'])}")
    for item in result["latency"]:
        print(f"  {item['id']} {item['metric']}: measured {item['measured']:.1f}, parsearch "
              f"{item['parsearch']:.1f} ({_pct(item['parsearch_ape'])}), AIConfigurator "
              f"{item['aic'] if item['aic'] is None else round(item['aic'], 1)} "
              f"({_pct(item['aic_ape'])})")
    w = s["wall_s"]
    aic_w = f"{w['aic']:.1f} s" if w["aic"] is not None else "-"
    print(f"  wall time per question (median): parsearch {w['parsearch']:.2f} s, "
          f"AIConfigurator {aic_w} (its batch sweep included); totals "
          f"{s['wall_s_total']['parsearch']:.0f} s and {s['wall_s_total']['aic']:.0f} s")
    if result["missing"]:
        print("rows AIConfigurator could not price:")
        for m in result["missing"]:
            print(f"  {m['id']} {m['model']} {m['gpu']} {m['layout']}: {m['reason']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--aic-python", help="a python that can import aiconfigurator "
                        "(default: $PARSEARCH_AIC_PYTHON)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="AIConfigurator worker processes")
    parser.add_argument("--rows", help="comma-separated row ids (default: all not held out)")
    parser.add_argument("--held-out", action="store_true",
                        help="also compare the held-out rows (SERVING_RUNS.md)")
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")
    parser.add_argument("--save", help="also write the comparison as JSON to this file")
    args = parser.parse_args(argv)
    rows = vs.load_rows() if args.held_out else vs.fit_rows()
    if args.rows:
        wanted = set(args.rows.split(","))
        rows = [r for r in rows if r["id"] in wanted]
    ours = parsearch_rows(rows)
    exe, info = find_aic_python(args.aic_python)
    questions, skipped = {}, {}
    for row in rows:
        q, why = question(row)
        if q is None:
            skipped[row["id"]] = why
        else:
            questions[row["id"]] = q
    answers: dict[str, dict[str, Any]] = {}
    version, reason = (info, None) if exe else (None, info)
    if exe and questions:
        try:
            got = run_aic(exe, list(questions.values()), args.jobs)
            answers = {a["id"]: a for a in got["answers"]}
        except (RuntimeError, json.JSONDecodeError) as exc:
            reason = str(exc)
    result = compare(rows, ours, answers, {r["id"]: questions.get(r["id"], {}) for r in rows},
                     skipped)
    result["aiconfigurator"] = version
    result["unavailable"] = reason
    if args.save:
        Path(args.save).write_text(json.dumps(result, indent=2, default=str) + "\n",
                                   encoding="utf-8")
    if args.json:
        json.dump(result, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        print_report(result, version, reason)
    return 0


if __name__ == "__main__":
    sys.exit(main())
