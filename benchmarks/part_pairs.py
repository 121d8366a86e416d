"""The same layout on two GPU parts: measured against predicted throughput ratios, from the stored rows.

    python benchmarks/part_pairs.py     # reads results/accuracy.json, refits twice, writes results/part_pairs.md

Pairs are rows of one container release with the model, precision, task, GPU count and published layout equal on
two parts. Only what the source published is compared: a
field it left out (accuracy.json's `unknown`: the recompute, the interleaving depth, the micro-batch), which genconf's
search fills in, is not part of the match. Their measured ratio isolates what differs between the parts (clock,
power, host CPU, NVLink domain) from everything the two runs share; the predicted ratio is what genconf's hardware
terms (datasheet peaks, TDP and the power-clock model: genconf.plan.cost.sustained_clock) make of it.

Then the hypothesis the GB200 / B200 pairs suggest, scored: GB200's power budget lowered (the TDP its sustained
clock follows) to what the pairs alone choose, the calibration refit with it (accuracy.fit), every row re-scored,
against the same refit at the datasheet's 1,200 W.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import json
import math
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from accuracy import ARCHS, RESULTS, cals_for, evaluate_all, fit, stats, write_markdown  # noqa: E402
from published import DATA, load_runs  # noqa: E402

PART_PAIRS = (("b200", "gb200"), ("b300", "gb300"), ("gb200", "gb300"), ("b200", "b300"), ("b200", "gb300"))
"""(reference, other) parts compared, among Blackwell's four: HGX (x86 host, 8-GPU NVLink) against NVL72 (Grace
host), and Blackwell against Blackwell Ultra."""
BRIDGE_FILE = "megatron_bridge_perf_summary.csv"
UNKNOWN_TOKENS = {"recompute": re.compile(r"^(none|selective|full|rc\d+|off\d+)$"), "vp": re.compile(r"^vp\d+$"),
                  "mbs": re.compile(r"^mbs\d+$")}
"""The layout string's words for each field a source may leave out (accuracy._layout): a recompute genconf chose
comes with the layers it recomputes or offloads."""


@functools.cache
def _bridge_releases() -> tuple[str, ...]:
    """Each Megatron-Bridge row's container release in full (26.04.01, not its group's 26.04), by row index."""
    with open(DATA / BRIDGE_FILE) as f:
        return tuple((re.match(r"(\d+\.\d+(?:\.\d+)?)", row["notes"]) or [""])[0] for row in csv.DictReader(f))


def release_of(row: dict) -> str:
    """The row's container release: its group, or for Megatron-Bridge the full release its notes name."""
    if row.get("file") == BRIDGE_FILE:
        return f"Megatron-Bridge {_bridge_releases()[int(row['label'].rsplit('#', 1)[1])]}"
    return row["group"]


def layout_key(row: dict) -> tuple:
    """What must be equal for two rows to be a pair: release, model, precision label, task and the published
    layout (without the fields the source left out)."""
    hidden = [UNKNOWN_TOKENS[u] for u in row.get("unknown", ()) if u in UNKNOWN_TOKENS]
    layout = " ".join(w for w in row["layout"].split() if not any(p.match(w) for p in hidden))
    return release_of(row), row["model"], row["precision"], row["task"], layout


def part_pairs(rows: list[dict], ref: str, other: str) -> list[tuple[dict, dict]]:
    """(ref row, other row) pairs among the scored rows. Two rows of one part under one key are a transcription
    error or a key too coarse: an error, not a silent choice."""
    by_key: dict = {}
    for r in rows:
        if r["gpu"] not in (ref, other) or r.get("throughput_error") is None:
            continue
        parts = by_key.setdefault(layout_key(r), {})
        if r["gpu"] in parts:
            raise ValueError(f"two {r['gpu']} rows under one key: {parts[r['gpu']]['label']} and {r['label']}")
        parts[r["gpu"]] = r
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


SUBSETS = {"all": lambda r: True, "NeMo 25.x (never fitted)": lambda r: r["source"] == "NeMo 25.x",
           "Megatron-Bridge": lambda r: r["source"].startswith("Megatron-Bridge"),
           "GB200": lambda r: r["gpu"] == "gb200", "B200": lambda r: r["gpu"] == "b200",
           "GB300": lambda r: r["gpu"] == "gb300"}


def power_experiment(stored: list[dict]) -> list[str]:
    """The pairs' choice of GB200's power budget (the committed calibration, the dense pairs of the stored rows,
    re-scored at each budget), then the refit at that budget and at the datasheet's, every row scored."""
    runs, _ = load_runs()
    pairs = [(a["file"], a["label"], b["file"], b["label"]) for a, b in part_pairs(stored, "b200", POWER_PART)
             if a["kind"] == "dense"]
    lines = ["", f"## {POWER_PART.upper()}'s power budget from its pairs with B200, refit and scored", "",
             f"Pairs only, committed calibration: the median |log(predicted / measured ratio)| over the {len(pairs)} "
             f"dense B200 / {POWER_PART.upper()} pairs above, re-scored at each budget.", "",
             "| budget (W) | pairs' error |", "|---:|---:|"]
    best = None
    for watts in POWER_GRID_W:
        trial = with_power(runs, POWER_PART, watts)
        by_label = {(r["file"], r["label"]): r for r in evaluate_all(trial, cals_for(trial))}
        err = statistics.median(abs(math.log(p / m)) for m, p in
                                (ratios((by_label[(fa, la)], by_label[(fb, lb)])) for fa, la, fb, lb in pairs))
        best = min(best or (err, watts), (err, watts))
        lines.append(f"| {watts:,} | {err:.3f} |")
    lines += ["", f"Refit (accuracy.fit) at the datasheet's 1,200 W and at the pairs' {best[1]:,} W, every row "
                  "scored in sample: median / p90 |error|, rows beyond 15%, median signed (accuracy.stats).", "",
              "| rows | 1,200 W (as committed) | " + f"{best[1]:,} W |", "|---|---|---|"]
    results, fits = [], []
    for watts in (1200, best[1]):
        trial = with_power(runs, POWER_PART, watts)
        override = fit(trial, quiet=True)
        fits.append(override)
        rows = evaluate_all(trial, cals_for(trial, override))
        cells = {}
        for name, keep in SUBSETS.items():
            chosen = [r for r in rows if keep(r)]
            st = stats(chosen)
            beyond = sum(1 for r in chosen if r["throughput_error"] is not None and abs(r["throughput_error"]) > 0.15)
            cells[name] = f"{st['median_abs']:.1%} / {st['p90_abs']:.1%} / {beyond} / {st['median_signed']:+.1%}"
        results.append(cells)
    for name in SUBSETS:
        lines.append(f"| {name} | {results[0][name]} | {results[1][name]} |")
    moved = [f"{a}.{k} {fits[0][a].get(k)} -> {v}" for a in ARCHS for k, v in sorted(fits[1][a].items())
             if fits[0][a].get(k) != v]
    lines += ["", f"Terms the refit at {best[1]:,} W moved: " + ("; ".join(moved) or "none") + "."]
    return lines


def main() -> int:
    rows = json.loads((RESULTS / "accuracy.json").read_text())["rows"]
    lines = ["# The same layout on two GPU parts: measured and predicted throughput ratios", "",
             "Command: `python benchmarks/part_pairs.py` (reads results/accuracy.json; the last section refits). "
             "A pair: one container release, the model, precision, task, GPU count and published layout equal (the "
             "fields the source left out apart), on two parts.", "",
             "| parts (second / first) | kind | pairs | measured ratio, median | predicted, median | "
             "predicted / measured, median |", "|---|---|---:|---:|---:|---:|"]
    detail = ["", "| parts | release | model | precision | layout compared | measured | predicted |",
              "|---|---|---|---|---|---:|---:|"]
    for ref, other in PART_PAIRS:
        pairs = part_pairs(rows, ref, other)
        for kind in ("dense", "MoE"):
            chosen = [p for p in pairs if p[0]["kind"] == kind]
            if not chosen:
                continue
            rs = [ratios(p) for p in chosen]
            measured, predicted = statistics.median(m for m, _ in rs), statistics.median(p for _, p in rs)
            lines.append(f"| {other} / {ref} | {kind} | {len(chosen)} | {measured:.3f} | {predicted:.3f} | "
                         f"{statistics.median(p / m for m, p in rs):.3f} |")
            for pair, (m, p) in zip(chosen, rs):
                release, model, precision, _, layout = layout_key(pair[0])
                detail.append(f"| {other} / {ref} | {release} | {model} | {precision} | {layout} | {m:.3f} | "
                              f"{p:.3f} |")
    return write_markdown("part_pairs", lines + detail + power_experiment(rows))


if __name__ == "__main__":
    sys.exit(main())
