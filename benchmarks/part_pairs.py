"""The same layout on two GPU parts: measured against predicted throughput ratios, from the stored rows.

    python benchmarks/part_pairs.py     # reads results/accuracy.json, refits twice, writes results/part_pairs.md

Pairs are rows of one source release (their group) with the model, precision, task and published layout equal
(the data-parallel degree apart: the GPU count may differ) on two parts. Their measured ratio isolates what differs
between the parts (clock, power, host CPU, NVLink domain) from everything the two runs share; the predicted ratio
is what genconf's hardware terms (datasheet peaks, TDP and the power-clock model: genconf.plan.cost.sustained_clock)
make of it.

Then the hypothesis the GB200 / B200 pairs suggest, scored: GB200's power budget lowered (the TDP its sustained
clock follows) to what the pairs alone choose, the calibration refit with it (accuracy.fit), every row re-scored,
against the same refit at the datasheet's 1,200 W.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from accuracy import RESULTS, cals_for, evaluate_all, fit, write_markdown  # noqa: E402
from published import load_runs  # noqa: E402

PART_PAIRS = (("b200", "gb200"), ("b300", "gb300"), ("gb200", "gb300"), ("b200", "b300"), ("b200", "gb300"))
"""(reference, other) parts compared, Blackwell's four: HGX (x86 host, 8-GPU NVLink) against NVL72 (Grace host),
and Blackwell against Blackwell Ultra."""


def layout_key(row: dict) -> tuple:
    """What must be equal for two rows to be a pair: release, model, precision label, task, layout without dp."""
    layout = " ".join(w for w in row["layout"].split() if not w.startswith("dp"))
    return row["group"], row["model"], row["precision"], row["task"], layout


def part_pairs(rows: list[dict], ref: str, other: str) -> list[tuple[dict, dict]]:
    """(ref row, other row) pairs among the scored rows."""
    by_key: dict = {}
    for r in rows:
        if r.get("throughput_error") is None or r.get("predicted_tokens_per_s_per_gpu") is None:
            continue
        by_key.setdefault(layout_key(r), {})[r["gpu"]] = r
    return [(v[ref], v[other]) for v in by_key.values() if ref in v and other in v]


def ratios(pair: tuple[dict, dict]) -> tuple[float, float]:
    """(measured, predicted) throughput of the second row over the first."""
    a, b = pair
    return (b["measured_tokens_per_s_per_gpu"] / a["measured_tokens_per_s_per_gpu"],
            b["predicted_tokens_per_s_per_gpu"] / a["predicted_tokens_per_s_per_gpu"])


POWER_PART = "gb200"
POWER_GRID_W = (1200, 1150, 1100, 1050, 1000, 950, 900)
"""GB200's power budget tried on its pairs with B200 (1,200 W: its datasheet TDP in genconf's catalog)."""


def with_power(runs: list, part: str, watts: int) -> list:
    """The runs with `part`'s power budget (the TDP genconf.plan.cost.sustained_clock follows) set to `watts`."""
    out = []
    for run in runs:
        if run.cluster.gpu.name == part:
            gpu = dataclasses.replace(run.cluster.gpu, tdp_w=watts)
            run = dataclasses.replace(run, cluster=dataclasses.replace(run.cluster, gpu=gpu))
        out.append(run)
    return out


def _scores(rows: list[dict]) -> dict:
    """Median and p90 |error|, rows beyond 15%, and the median signed error, over all rows and some subsets."""
    subsets = {"all": lambda r: True, "NeMo 25.x (never fitted)": lambda r: r["source"] == "NeMo 25.x",
               "Megatron-Bridge": lambda r: r["source"].startswith("Megatron-Bridge"),
               "GB200": lambda r: r["gpu"] == "gb200", "B200": lambda r: r["gpu"] == "b200",
               "GB300": lambda r: r["gpu"] == "gb300"}
    out = {}
    for name, keep in subsets.items():
        errs = [r["throughput_error"] for r in rows if r["throughput_error"] is not None and keep(r)]
        size = sorted(abs(e) for e in errs)
        out[name] = (statistics.median(size), size[int(0.9 * (len(size) - 1))], sum(e > 0.15 for e in size),
                     statistics.median(errs))
    return out


def power_experiment() -> list[str]:
    """The pairs' choice of GB200's power budget (committed calibration, pairs only), then both refits scored."""
    runs, _ = load_runs()
    lines = ["", f"## {POWER_PART.upper()}'s power budget from its pairs with B200, refit and scored", "",
             "Pairs only, committed calibration: the median |log(predicted / measured ratio)| over the dense "
             f"B200 / {POWER_PART.upper()} pairs at each budget.", "", "| budget (W) | pairs' error |", "|---:|---:|"]
    best = None
    for watts in POWER_GRID_W:
        trial = with_power(runs, POWER_PART, watts)
        rows = evaluate_all(trial, cals_for(trial))
        dense = [abs(math.log(p / m)) for pair in part_pairs(rows, "b200", POWER_PART) if pair[0]["kind"] == "dense"
                 for m, p in [ratios(pair)]]
        err = statistics.median(dense)
        best = min(best or (err, watts), (err, watts))
        lines.append(f"| {watts:,} | {err:.3f} |")
    lines += ["", f"Refit (accuracy.fit) at the datasheet's 1,200 W and at the pairs' {best[1]:,} W, every row "
                  "scored in sample: median / p90 |error|, rows beyond 15%, median signed.", "",
              "| rows | 1,200 W (as committed) | " + f"{best[1]:,} W |", "|---|---|---|"]
    results = []
    for watts in (1200, best[1]):
        trial = with_power(runs, POWER_PART, watts)
        results.append(_scores(evaluate_all(trial, cals_for(trial, fit(trial, quiet=True)))))
    for name in results[0]:
        cells = [f"{m:.1%} / {p:.1%} / {n} / {s:+.1%}" for m, p, n, s in (r[name] for r in results)]
        lines.append(f"| {name} | {cells[0]} | {cells[1]} |")
    return lines


def main() -> int:
    rows = json.loads((RESULTS / "accuracy.json").read_text())["rows"]
    lines = ["# The same layout on two GPU parts: measured and predicted throughput ratios", "",
             "Command: `python benchmarks/part_pairs.py` (reads results/accuracy.json; the last section refits). "
             "A pair: one source release, "
             "the model, precision, task and published layout equal (dp apart), on two parts.", "",
             "| parts (second / first) | kind | pairs | measured ratio, median | predicted, median | "
             "predicted / measured, median |", "|---|---|---:|---:|---:|---:|"]
    detail = ["", "| parts | release | model | precision | layout | measured | predicted |",
              "|---|---|---|---|---|---:|---:|"]
    for ref, other in PART_PAIRS:
        pairs = part_pairs(rows, ref, other)
        for kind in ("dense", "MoE"):
            chosen = [p for p in pairs if p[0]["kind"] == kind]
            if not chosen:
                continue
            rs = [ratios(p) for p in chosen]
            lines.append(f"| {other} / {ref} | {kind} | {len(chosen)} | {statistics.median(m for m, _ in rs):.3f} | "
                         f"{statistics.median(p for _, p in rs):.3f} | {statistics.median(p / m for m, p in rs):.3f} |")
            for pair, (m, p) in zip(chosen, rs):
                group, model, precision, _, layout = layout_key(pair[0])
                detail.append(f"| {other} / {ref} | {group} | {model} | {precision} | {layout} | {m:.3f} | {p:.3f} |")
    return write_markdown("part_pairs", lines + detail + power_experiment())


if __name__ == "__main__":
    sys.exit(main())
