"""Accuracy benchmark: genconf's predicted throughput (and memory) against published runs.

    python benchmarks/accuracy.py            # table + summary, writes benchmarks/results/accuracy.{md,json}
    python benchmarks/accuracy.py --fit      # also grid-search the calibration that minimises the median error

For every usable row of benchmarks/data (see published.py) the published layout is evaluated with the rules
off (published runs use layouts genconf would not recommend). Knobs a source does not state (micro-batch,
virtual stages, recompute) are searched, and the fastest setting that fits in memory is taken, as the authors
tuned theirs. Error = predicted / measured - 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from published import Run, load_runs  # noqa: E402

from genconf.catalog.hardware import calibration_for  # noqa: E402
from genconf.plan.cost import Calibration  # noqa: E402
from genconf.plan.memory import GIB  # noqa: E402
from genconf.plan.search import _split_options, evaluate  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def _variants(run: Run):
    plan = run.plan
    mbss = [1, 2, 4, 8] if "mbs" in run.unknown else [plan.mbs]
    vps = [1, 2, 3, 4] if "vp" in run.unknown else [plan.vp]
    recomputes = ["none", "selective", "full"] if "recompute" in run.unknown else [plan.recompute]
    # DeepSpeed's pipeline (BLOOM) balances layers that do not divide evenly; use the nearest split
    # megatron can express (embedding/loss as layers, or lighter first/last stages).
    splits = [{}] if run.model.num_layers % plan.pp == 0 else _split_options(run.model.num_layers, plan.pp)
    for mbs, vp, rc, split in itertools.product(mbss, vps, recomputes, splits):
        if plan.gbs % (mbs * plan.dp) or (vp > 1 and (split or run.model.num_layers % (plan.pp * vp))):
            continue
        candidate = dataclasses.replace(plan, mbs=mbs, vp=vp, recompute=rc, **split)
        if vp > 1 and candidate.num_microbatches % plan.pp:
            continue
        yield candidate


def predict(run: Run, cal: Calibration):
    """(predicted tokens/s/GPU, predicted peak GiB, plan used) for one published run."""
    best = None
    for plan in _variants(run):
        try:
            ev = evaluate(run.model, run.cluster, plan, plan.world_size, cal, check_rules=False)
        except ValueError:
            continue
        fits = ev.memory.fits
        key = (fits, ev.cost.tokens_per_s_per_gpu)
        if best is None or key > best[0]:
            best = (key, ev)
    if best is None:
        return None
    ev = best[1]
    return ev.cost.tokens_per_s_per_gpu, ev.memory.peak.total_bytes / GIB, ev.plan


def evaluate_all(runs: list[Run], cals: dict[str, Calibration], skipped: list | None = None) -> list[dict]:
    rows = []
    for run in runs:
        got = predict(run, cals[run.cluster.gpu.name])
        if got is None:
            if skipped is not None:
                skipped.append((run.file, run.label, "no valid variant of the published layout"))
            continue
        tokens, mem, plan = got
        rows.append({
            "file": run.file, "label": run.label, "gpu": run.cluster.gpu.name, "layout":
                f"tp{plan.tp} pp{plan.pp} vp{plan.vp} cp{plan.cp} dp{plan.dp} mbs{plan.mbs} gbs{plan.gbs} "
                f"{plan.recompute} {plan.precision} {plan.framework}",
            "measured_tokens_per_s_per_gpu": round(run.measured_tokens_per_s_per_gpu, 2),
            "predicted_tokens_per_s_per_gpu": round(tokens, 2),
            "throughput_error": tokens / run.measured_tokens_per_s_per_gpu - 1,
            "measured_mem_gib": run.measured_mem_gib, "predicted_mem_gib": round(mem, 2),
            "memory_error": (mem / run.measured_mem_gib - 1) if run.measured_mem_gib else None,
            "unknown": list(run.unknown),
        })
    return rows


def summary(rows: list[dict]) -> dict:
    def med(values):
        return statistics.median(values) if values else None

    thr = [abs(r["throughput_error"]) for r in rows]
    mem = [abs(r["memory_error"]) for r in rows if r["memory_error"] is not None]
    per_file = {}
    for file in sorted({r["file"] for r in rows}):
        sub = [r for r in rows if r["file"] == file]
        m = [abs(r["memory_error"]) for r in sub if r["memory_error"] is not None]
        per_file[file] = {"rows": len(sub), "median_abs_throughput_error": med([abs(r["throughput_error"]) for r in sub]),
                          "median_signed_throughput_error": med([r["throughput_error"] for r in sub]),
                          "memory_rows": len(m), "median_abs_memory_error": med(m)}
    return {"rows": len(rows), "median_abs_throughput_error": med(thr),
            "within_10pct": sum(1 for e in thr if e <= 0.10) / max(1, len(thr)),
            "memory_rows": len(mem), "median_abs_memory_error": med(mem), "per_file": per_file}


FIT_GRID = {
    "gemm_efficiency": [0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85],
    "attention_fwd_efficiency": [0.3, 0.4, 0.5, 0.6],
    "microbatch_overhead_s": [0.0, 0.002, 0.005, 0.01, 0.02],
    "dp_overlap_efficiency": [0.5, 0.7, 0.9],
}
# Calibration sets: the GPUs whose rows fit each set, and the GPUs that share it.
FIT_GROUPS = {"ampere": (["a100-80gb"], ["a100-40gb", "a100-80gb"]),
              "hopper": (["h100-sxm"], ["h100-sxm", "h100-pcie", "h200"]),
              "h100-96gb-500w": (["h100-96gb-500w"], ["h100-96gb-500w"])}


def fit(runs: list[Run], cals: dict[str, Calibration], exclude_file: str | None = None) -> dict[str, Calibration]:
    """Coordinate search per calibration set, minimising the median |error| of its rows."""
    best = dict(cals)
    for group, (fit_on, applies_to) in FIT_GROUPS.items():
        subset = [r for r in runs if r.cluster.gpu.name in fit_on and r.file != exclude_file]
        if not subset:
            continue
        cal = best[fit_on[0]]
        err = None
        for _ in range(3):
            for name, grid in FIT_GRID.items():
                scored = []
                for value in grid:
                    changes = {name: value}
                    if name == "attention_fwd_efficiency":
                        changes["attention_bwd_efficiency"] = round(value * 0.8, 3)
                    trial_cal = dataclasses.replace(cal, **changes)
                    trial = dict(best, **{g: trial_cal for g in applies_to if g in best})
                    err = summary(evaluate_all(subset, trial))["median_abs_throughput_error"]
                    scored.append((err, value, trial_cal))
                err, _, cal = min(scored, key=lambda x: x[0])
        best.update({g: cal for g in applies_to if g in best})
        print(f"fit {group}: {cal} -> median |err| {err:.3f} over {len(subset)} rows", file=sys.stderr)
    return best


def markdown(rows: list[dict], summ: dict, skipped) -> str:
    lines = ["# Accuracy: predicted vs published throughput and memory", "",
             "Command: `python benchmarks/accuracy.py` (data: benchmarks/data, copied from shared/data).", "",
             f"- rows compared: **{summ['rows']}**; median |throughput error|: "
             f"**{summ['median_abs_throughput_error']:.1%}**; rows within 10%: {summ['within_10pct']:.0%}",
             f"- memory rows: {summ['memory_rows']}; median |memory error|: "
             + (f"**{summ['median_abs_memory_error']:.1%}**" if summ["median_abs_memory_error"] is not None else "n/a"), "",
             "| file | rows | median abs thr. err | median signed | mem rows | median abs mem err |",
             "|---|---:|---:|---:|---:|---:|"]
    for file, s in summ["per_file"].items():
        mem = f"{s['median_abs_memory_error']:.1%}" if s["median_abs_memory_error"] is not None else "-"
        lines.append(f"| {file} | {s['rows']} | {s['median_abs_throughput_error']:.1%} | "
                     f"{s['median_signed_throughput_error']:+.1%} | {s['memory_rows']} | {mem} |")
    lines += ["", "| row | gpu | layout used | measured tok/s/GPU | predicted | error | mem meas. | mem pred. |",
              "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        mm = f"{r['measured_mem_gib']:g}" if r["measured_mem_gib"] else "-"
        lines.append(f"| {r['label']} | {r['gpu']} | {r['layout']} | {r['measured_tokens_per_s_per_gpu']:,.1f} | "
                     f"{r['predicted_tokens_per_s_per_gpu']:,.1f} | {r['throughput_error']:+.1%} | {mm} | "
                     f"{r['predicted_mem_gib']:.1f} |")
    lines += ["", f"Skipped rows ({len(skipped)}):", ""]
    lines += [f"- {file}: {label}: {why}" for file, label, why in skipped]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", action="store_true", help="grid-search the calibration and report it")
    ap.add_argument("--loso", action="store_true",
                    help="leave-one-source-out: refit without each A100 source and score that source")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    runs, skipped = load_runs()
    cals = {name: calibration_for(name) for name in {r.cluster.gpu.name for r in runs}}
    if args.loso:
        out = {}
        for file in ("bigscience_bloom_sweep.csv", "megatron_narayanan2021.csv", "korthikanti2022.csv"):
            held = [r for r in runs if r.file == file]
            refit = fit(runs, dict(cals), exclude_file=file)
            out[file] = summary(evaluate_all(held, refit))["median_abs_throughput_error"]
            print(f"held out {file}: median |error| {out[file]:.1%} over {len(held)} rows")
        if not args.no_write:
            RESULTS.mkdir(exist_ok=True)
            (RESULTS / "accuracy_loso.json").write_text(json.dumps(out, indent=1))
        return 0
    if args.fit:
        cals = fit(runs, cals)
    rows = evaluate_all(runs, cals, skipped)
    summ = summary(rows)
    print(json.dumps(summ, indent=2))
    if not args.no_write:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "accuracy.md").write_text(markdown(rows, summ, skipped))
        (RESULTS / "accuracy.json").write_text(json.dumps({"summary": summ, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
