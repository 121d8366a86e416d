"""What each stack knob does to MosaicML's 216 MPT runs (the validation source, never fitted).

    python benchmarks/stack_knobs.py        # writes benchmarks/results/stack_knobs.md

The rows are planned as benchmarks/accuracy.py plans them (published degrees pinned, the committed calibration),
three ways: as a user types them without the stack's knobs (F.cross_entropy's fp32 loss, the default attention
kernel), with the fused cross entropy the benchmark ran (ParallelPlan.fused_loss), and as they ran (also its Triton
flash attention, ParallelPlan.attention_kernel). Each line: rows rejected as out of memory, median and p90 of
|tokens/s error|, median signed error, and the median signed error of the rows at LONG_SEQUENCE tokens or more,
where attention is most of the step and the kernel is what the prediction turns on.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from accuracy import RESULTS, cals_for, evaluate_all, stats  # noqa: E402
from published import MOSAIC_FILE, load_runs  # noqa: E402

LONG_SEQUENCE = 16384
"""Sequences from here up (MosaicML ran 16K-65K on 8 GPUs): attention is most of their step time."""

VARIANTS = {
    "typed without the stack's knobs": dict(fused_loss=False, attention_kernel="auto"),
    "with the fused cross entropy": dict(fused_loss=True, attention_kernel="auto"),
    "as they ran (fused cross entropy, Triton attention)": dict(fused_loss=True, attention_kernel="triton"),
}


def score(runs, knobs: dict) -> dict:
    """accuracy.stats() of the runs re-planned with `knobs` (rejected, median and p90 of |error|, median signed), and
    under "long" the same for the rows at LONG_SEQUENCE tokens or more."""
    runs = [dataclasses.replace(r, plan=dataclasses.replace(r.plan, **knobs)) for r in runs]
    rows = evaluate_all(runs, cals_for(runs))
    return stats(rows) | {"long": stats([r for r in rows if r["_run"].plan.seq_length >= LONG_SEQUENCE])}


def main() -> int:
    runs = [r for r in load_runs()[0] if r.file == MOSAIC_FILE]
    lines = ["# MosaicML's MPT runs under each stack knob", "",
             "Command: `python benchmarks/stack_knobs.py` (the committed calibration; MosaicML is never fitted).", "",
             f"| planned | rows | rejected | median \\|error\\| | p90 | median signed | median signed, {LONG_SEQUENCE:,}+ "
             "tokens (rows) |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, knobs in VARIANTS.items():
        s = score(runs, knobs)
        long = s["long"]
        print(f"{name}: {s['rejected']} of {s['rows']} rejected, median {s['median_abs']:.1%}, "
              f"p90 {s['p90_abs']:.1%}, signed {s['median_signed']:+.1%}; {LONG_SEQUENCE:,}+ tokens: signed "
              f"{long['median_signed']:+.1%} ({long['scored']} rows)")
        lines.append(f"| {name} | {s['rows']} | {s['rejected']} | {s['median_abs']:.1%} | {s['p90_abs']:.1%} | "
                     f"{s['median_signed']:+.1%} | {long['median_signed']:+.1%} ({long['scored']}) |")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "stack_knobs.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
