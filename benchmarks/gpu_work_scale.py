"""Is a model's GPU work mispriced by a constant factor? A what-if on the published rows of one model.

    python benchmarks/gpu_work_scale.py --model "GPT OSS" --factors 1 1.5 1.75 2 --write
    python benchmarks/gpu_work_scale.py --model "GPT OSS" --factors 1 2 2.2 --backward-only --write

Every layer's forward and backward GPU time (cost.LayerTime.fwd_s, bwd_s and its attention part; with
--backward-only the backward alone) is multiplied by each factor while everything else (host launch time,
TP/EP/CP/DP/PP communication, bubbles, the optimizer) stays as genconf prices it, and the model's rows are
re-predicted as benchmarks/accuracy.py predicts them (same plans, same calibration). If one factor brings a
model's rows on every GPU to within the model's usual error, its layer's GPU work is underpriced by about that
factor, and host time or communication is not what hides it; if the rows scatter, the miss is not one constant.
This is a diagnostic, not a calibration: nothing here is written to the calibration.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from accuracy import RESULTS, cals_for, predict  # noqa: E402
from published import Run, load_runs  # noqa: E402

import genconf.plan.cost as cost  # noqa: E402


def scaled_errors(runs: list[Run], factor: float, *, backward_only: bool = False) -> list[float | None]:
    """Each run's throughput error (predicted / measured - 1) with its layers' GPU work scaled by `factor`
    (None where genconf rejects the row)."""
    unscaled = cost._layer_time

    def scaled(*args, **kwargs) -> cost.LayerTime:
        lt = unscaled(*args, **kwargs)
        if backward_only:
            return dataclasses.replace(lt, bwd_s=lt.bwd_s * factor)
        return dataclasses.replace(lt, fwd_s=lt.fwd_s * factor, bwd_s=lt.bwd_s * factor,
                                   attn_fwd_s=lt.attn_fwd_s * factor, early_stop_skip_s=lt.early_stop_skip_s * factor,
                                   module_fwd_s=tuple((m, s * factor) for m, s in lt.module_fwd_s))

    cals = cals_for(runs)
    cost._layer_time = scaled
    try:
        errors = []
        for run in runs:
            p = predict(run, cals[run.cluster.gpu.name])
            errors.append(None if p.tokens_per_s_per_gpu is None
                          else p.tokens_per_s_per_gpu / run.measured_tokens_per_s_per_gpu - 1)
        return errors
    finally:
        cost._layer_time = unscaled


def _release(run: Run) -> str:
    """The row's group (for Megatron-Bridge: the container release)."""
    return run.group.split(" ")[-1] if run.group else ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="substring of the rows' labels (e.g. 'GPT OSS')")
    ap.add_argument("--factors", type=float, nargs="+", default=[1.0, 1.5, 2.0])
    ap.add_argument("--backward-only", action="store_true", help="scale the backward alone")
    ap.add_argument("--write", action="store_true",
                    help="write benchmarks/results/gpu_work_scale.md (gpu_work_scale_backward.md with --backward-only)")
    args = ap.parse_args(argv)
    if any(f <= 0 for f in args.factors):
        ap.error("factors must be positive")

    runs = [r for r in load_runs()[0] if args.model in r.label]
    if not runs:
        print(f"error: no published row's label contains {args.model!r}", file=sys.stderr)
        return 2
    table = {f: scaled_errors(runs, f, backward_only=args.backward_only) for f in args.factors}

    what = "backward" if args.backward_only else "forward and backward"
    command = " ".join(["python benchmarks/gpu_work_scale.py", "--model", repr(args.model), "--factors",
                        *(f"{f:g}" for f in args.factors)] + (["--backward-only"] if args.backward_only else []))
    lines = [f"# {args.model}: its layers' GPU work ({what}) scaled", "", f"Command: `{command}`", "",
             "Error = predicted / measured - 1 with every layer's GPU time multiplied by the factor; host time and "
             "communication as priced.", "",
             "| row | GPU | precision | group | " + " | ".join(f"x{f:g}" for f in args.factors) + " |",
             "|---|---|---|---|" + "---:|" * len(args.factors)]
    for i, run in enumerate(runs):
        cells = ["rejected" if table[f][i] is None else f"{100 * table[f][i]:+.1f}%" for f in args.factors]
        lines.append(f"| {run.label} | {run.cluster.gpu.name} | {run.precision_label} | {_release(run)} | "
                     + " | ".join(cells) + " |")
    lines += ["", "| factor | rows | median abs error | within 10% |", "|---:|---:|---:|---:|"]
    for f in args.factors:
        errs = [abs(e) for e in table[f] if e is not None]
        within = sum(e <= 0.10 for e in errs)
        lines.append(f"| x{f:g} | {len(errs)} | {100 * statistics.median(errs):.1f}% | {within} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.write:
        name = "gpu_work_scale_backward.md" if args.backward_only else "gpu_work_scale.md"
        (RESULTS / name).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
