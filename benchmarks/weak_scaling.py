"""Weak scaling: how measured and predicted tokens/s/GPU move as a published layout is given more data parallelism.

    python benchmarks/weak_scaling.py    # reads results/accuracy.json, writes results/weak_scaling.md

A series is the published rows of one release (accuracy.json's `group`) with the model, GPU, precision and layout
equal apart from the data-parallel degree, and the same micro-batches per data-parallel rank (global batch / dp):
each GPU does the same work at every scale, so what changes is only how many GPUs synchronise. Within each series
the slope of log(predicted / measured) against log(GPUs) (least squares) says how much faster than measured genconf
becomes per doubling of the GPUs; the pooled slope weighs each series by its spread of log(GPUs).
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections import defaultdict
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def _world(layout: str) -> tuple[int, int, int, str]:
    """(GPUs, dp, micro-batches' samples per dp rank, the layout without dp and gbs) of an accuracy.json layout."""
    tp, pp, cp, dp, gbs = (int(re.search(rf"\b{k}(\d+)", layout)[1]) for k in ("tp", "pp", "cp", "dp", "gbs"))
    rest = re.sub(r" (dp|gbs)\d+", "", layout)
    return tp * pp * cp * dp, dp, gbs // dp, rest


def series(rows: list[dict]) -> dict[tuple, list[tuple[int, float, float]]]:
    """Weak-scaling series with two or more GPU counts: key -> [(GPUs, measured, predicted tokens/s/GPU)]."""
    out: dict[tuple, list] = defaultdict(list)
    for r in rows:
        if r.get("predicted_tokens_per_s_per_gpu") is None:
            continue
        gpus, _, per_rank, rest = _world(r["layout"])
        name = re.sub(r" #\d+$", "", r["label"])
        out[(r["source"], r["group"], name, r["gpu"], r["precision"], rest, per_rank)].append(
            (gpus, r["measured_tokens_per_s_per_gpu"], r["predicted_tokens_per_s_per_gpu"]))
    # A GPU count published twice in one series is two configurations the layout string does not tell apart
    # (torchtitan's compiled and eager runs): not a series.
    return {k: sorted(v) for k, v in out.items() if len({g for g, _, _ in v}) == len(v) >= 2}


def slope(points: list[tuple[int, float, float]]) -> tuple[float, float]:
    """(least-squares slope of log(predicted / measured) on log(GPUs), sum of squared log(GPUs) deviations)."""
    xs = [math.log(g) for g, _, _ in points]
    ys = [math.log(p / m) for _, m, p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx, sxx


def _within(points: list[tuple[int, float, float]], column: int, tolerance: float = 0.01) -> bool:
    """Every run's tokens/s/GPU (column 1 measured, 2 predicted) within `tolerance` of the smallest run's."""
    return all(abs(p[column] / points[0][column] - 1) <= tolerance for p in points)


def main() -> int:
    rows = json.loads((RESULTS / "accuracy.json").read_text())["rows"]
    found = series(rows)
    fits = {k: slope(v) for k, v in found.items()}
    pooled = sum(b * sxx for b, sxx in fits.values()) / sum(sxx for _, sxx in fits.values())
    rising = sum(1 for b, _ in fits.values() if b > 0)
    flat = sum(1 for v in found.values() if _within(v, 2))
    by_source: dict[str, list[float]] = defaultdict(list)
    for k, (b, _) in fits.items():
        by_source[k[0]].append(b)
    lines = [
        "# Weak scaling: measured and predicted tokens/s/GPU as data parallelism grows",
        "",
        "Command: `python benchmarks/weak_scaling.py` (reads `accuracy.json`). A series: one release, model, GPU,",
        "precision and layout, the same micro-batches per data-parallel rank, two or more GPU counts. Slope: of",
        "log(predicted / measured) on log(GPUs), per doubling of the GPUs (positive: genconf prices the larger runs",
        "faster, relative to the smaller ones, than they measured).",
        "",
        f"- series: **{len(found)}**; slope positive in **{rising}**",
        f"- pooled slope: **{pooled * math.log(2) * 100:+.2f}%** per doubling of the GPUs",
        f"- predicted tokens/s/GPU within 1% of the series' smallest run at every scale: **{flat}** of {len(found)};"
        f" measured: **{sum(1 for v in found.values() if _within(v, 1))}**",
        "",
        "| source | series | median slope per doubling |",
        "|---|---:|---:|",
    ]
    for src, bs in sorted(by_source.items()):
        lines.append(f"| {src} | {len(bs)} | {statistics.median(bs) * math.log(2) * 100:+.2f}% |")
    lines += ["", "| group | model | GPU | precision | layout | GPUs | measured, relative to the smallest | "
              "predicted, relative | slope per doubling |", "|---|---|---|---|---|---|---|---|---:|"]
    for k, pts in sorted(found.items(), key=lambda kv: -fits[kv[0]][0]):
        g0, m0, p0 = pts[0]
        lines.append(f"| {k[1]} | {k[2]} | {k[3]} | {k[4]} | {k[5]} | {' / '.join(str(g) for g, _, _ in pts)} | "
                     f"{' / '.join(f'{m / m0:.3f}' for _, m, _ in pts)} | "
                     f"{' / '.join(f'{p / p0:.3f}' for _, _, p in pts)} | {fits[k][0] * math.log(2) * 100:+.2f}% |")
    (RESULTS / "weak_scaling.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[7:10]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
