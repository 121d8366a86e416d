"""What a user who types only the published degrees now gets: the accuracy benchmark's rows planned with the
search free to add a pipeline layout (genconf.plan.cost.balanced_layout), against megatron's own split, which is
what the published runs used and what benchmarks/accuracy.py pins (pp_layout=default).

    python benchmarks/free_layouts.py        # writes benchmarks/results/free_layouts.md
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import accuracy  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def _summary(rows: list[dict]) -> tuple[float, float, float, float]:
    """(median, p90) of |error| over all rows and over the dense rows."""
    every = sorted(abs(r["throughput_error"]) for r in rows if r["throughput_error"] is not None)
    dense = sorted(abs(r["throughput_error"]) for r in rows if r["throughput_error"] is not None and r["kind"] == "dense")
    return (statistics.median(every), every[int(0.9 * (len(every) - 1))],
            statistics.median(dense), dense[int(0.9 * (len(dense) - 1))])


def main() -> int:
    runs, _ = accuracy.load_runs()
    cals = accuracy.cals_for(runs)
    pinned = accuracy.evaluate_all(runs, cals)
    published = accuracy.pins_for

    def free(run):
        pins = published(run)
        return None if pins is None else dataclasses.replace(pins, pp_layout=None)

    accuracy.pins_for = free
    try:
        searched = accuracy.evaluate_all(runs, cals)
    finally:
        accuracy.pins_for = published
    lines = ["# Published rows planned with pipeline layouts searched", "",
             "Command: `python benchmarks/free_layouts.py`. Same rows and calibration as `accuracy.py`; only the "
             "pipeline layout differs.", "",
             "| rows planned with | median abs err | p90 | dense median | dense p90 |", "|---|---:|---:|---:|---:|"]
    for name, rows in (("megatron's own split (as published, accuracy.py)", pinned), ("layouts searched", searched)):
        lines.append(f"| {name} | " + " | ".join(f"{x:.1%}" for x in _summary(rows)) + " |")
    lines += ["", "Rows whose prediction moved:", "", "| row | GPU | precision | error with the split | with layouts | layout |",
              "|---|---|---|---:|---:|---|"]
    for a, b in zip(pinned, searched):
        if a["throughput_error"] is not None and b["throughput_error"] is not None \
                and abs(a["throughput_error"] - b["throughput_error"]) > 1e-9:
            lines.append(f"| {a['label']} | {a['gpu']} | {a['precision']} | {a['throughput_error']:+.1%} | "
                         f"{b['throughput_error']:+.1%} | {b['layout']} |")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "free_layouts.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:8]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
