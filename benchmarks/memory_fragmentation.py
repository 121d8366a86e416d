"""Could the caching allocator's slack be priced better than one fraction of the live bytes?

    python benchmarks/memory_fragmentation.py     # writes benchmarks/results/memory_fragmentation.md

genconf.plan.memory prices what PyTorch's caching allocator reserves beyond the live tensors at the peak as
FRAGMENTATION_FRACTION of all of them, plus the optimizer step's own segment (StageMemory.step_segment_bytes: the
classic allocator cannot put the step's fp32 gradient buffer in the activations' cached segments). Physically the
split, cached blocks come from what is freed and reallocated (activations, transient buffers), less from the model
states allocated once (parameters, gradients, optimizer). This scores, on every published row with a measured peak
(planned as benchmarks/accuracy.py plans them), measured ~ runtime + live x (1 + f) + the step's segment over a grid
of f, without the segment as genconf priced it before, and the split form runtime + live + a x states + b x the
rest + the segment over a grid of (a, b); it reports the best points by rows within 10%, then median |error|.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from accuracy import cals_for, predict, write_markdown  # noqa: E402
from published import load_runs  # noqa: E402

from genconf.plan.memory import FRAGMENTATION_FRACTION, GIB  # noqa: E402
from genconf.plan.search import evaluate  # noqa: E402

FRACTION_GRID = [i / 100 for i in range(10, 36)]
STATES_GRID = [i / 100 for i in range(0, 51, 2)]
REST_GRID = [i / 100 for i in range(0, 101, 5)]


def _rows() -> list[dict]:
    """Per row with a measured peak: the measured GiB and the predicted peak stage's runtime, states and other
    live bytes (GiB), in the quantity the source measured (accuracy._measured_kind: nvidia-smi or reserved)."""
    runs, _ = load_runs()
    cals = cals_for(runs)
    out = []
    for run in runs:
        if not run.measured_mem_gib:
            continue
        cal = cals[run.cluster.gpu.name]
        got = predict(run, cal)
        if got.plan is None:
            continue
        peak = evaluate(run.model, run.cluster, got.plan, got.plan.world_size, cal, check_rules=False).memory.peak
        states = (peak.params_bytes + peak.grads_bytes + peak.optimizer_bytes) / GIB
        # torchtitan reports torch.cuda.max_memory_reserved: no CUDA context or NCCL buffers in it.
        runtime = 0.0 if run.file == "torchtitan.csv" else peak.runtime_bytes / GIB
        out.append({"label": run.label, "measured": run.measured_mem_gib, "runtime": runtime, "states": states,
                    "rest": peak.allocated_bytes / GIB - states, "segment": peak.step_segment_bytes / GIB})
    return out


def _score(rows: list[dict], a: float, b: float, segment: bool = True) -> tuple[int, float]:
    """(rows within 10%, median |error|) of measured ~ runtime + states x (1 + a) + rest x (1 + b) (+ the step's
    segment)."""
    errs = sorted(abs((r["runtime"] + r["states"] * (1 + a) + r["rest"] * (1 + b) + segment * r["segment"])
                      / r["measured"] - 1) for r in rows)
    return sum(e <= 0.10 for e in errs), errs[len(errs) // 2]


def main() -> int:
    rows = _rows()
    f = FRAGMENTATION_FRACTION
    rank = lambda t: (-t[0], t[1])  # noqa: E731
    single = sorted(((*_score(rows, x, x), x) for x in FRACTION_GRID), key=rank)
    unsegmented = sorted(((*_score(rows, x, x, segment=False), x) for x in FRACTION_GRID), key=rank)
    trials = sorted(((*_score(rows, a, b), a, b) for a in STATES_GRID for b in REST_GRID), key=rank)
    within, median = _score(rows, f, f)
    lines = ["# The allocator's slack: one fraction or two", "",
             f"Command: `python benchmarks/memory_fragmentation.py` ({len(rows)} published rows with a measured peak).",
             "", "| allowance | rows within 10% | median abs error |", "|---|---:|---:|",
             f"| committed: {f:g} of all live bytes, plus the optimizer step's segment | {within} | {median:.1%} |"]
    lines += [f"| {x:g} of all live bytes, plus the step's segment | {w} | {m:.1%} |" for w, m, x in single[:4]]
    lines += [f"| {x:g} of all live bytes, no segment of the step's own | {w} | {m:.1%} |" for w, m, x in unsegmented[:3]]
    lines += [f"| {a:g} of states, {b:g} of the rest, plus the step's segment | {w} | {m:.1%} |"
              for w, m, a, b in trials[:6]]
    lines += ["", "Rows beyond 10% with the committed allowance (measured / predicted GiB):", ""]
    for r in rows:
        predicted = r["runtime"] + (r["states"] + r["rest"]) * (1 + f) + r["segment"]
        if abs(predicted / r["measured"] - 1) > 0.10:
            lines.append(f"- {r['label']}: {r['measured']:g} / {predicted:.1f}")
    return write_markdown("memory_fragmentation", lines)


if __name__ == "__main__":
    raise SystemExit(main())
