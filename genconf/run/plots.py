"""Pictures of a plan and of a run, as PNG (matplotlib, Agg: no display) with the numbers beside them in CSV.

`genconf plan ... --plot DIR` writes memory.png/.csv (what each pipeline stage holds, stacked, against the HBM
and the plan's limit) and schedule.png/.csv (every forward and backward pass of one step, per stage, from
genconf.pipeline.simulate_schedule with the cost model's pass times). `genconf verify RUN --plot DIR` writes
verify.png/.csv (loss against the golden curve, tokens/s and peak memory per step against the prediction and its
interval when plan.json carries one).

The numbers (memory_rows, schedule_rows, verify_rows) need only the standard library; matplotlib is imported
when drawing, and its absence is one line (`pip install 'genconf[plot]'`).
"""

from __future__ import annotations

import csv
import statistics
from dataclasses import dataclass
from pathlib import Path

from genconf.plan.errors import GenconfError
from genconf.plan.memory import GIB, HEADROOM_FRACTION, stage_memory
from genconf.plan.pipeline import PipelineBlock, bubble_fraction, simulate_schedule
from genconf.plan.specs import ClusterSpec, ModelSpec, ParallelPlan
from genconf.run.verify import Prediction, prediction_for

DPI = 100
MEMORY_SIZE_IN = (10.0, 6.0)
"""memory.png is 1000 x 600 pixels."""
SCHEDULE_SIZE_IN = (14.0, 6.0)
"""schedule.png is 1400 x 600 pixels."""
VERIFY_SIZE_IN = (10.0, 10.0)
"""verify.png is 1000 x 1000 pixels."""
PARTS = ("params", "grads", "optimizer", "activations", "other")
COLORS = {"params": "#4c72b0", "grads": "#55a868", "optimizer": "#c44e52", "activations": "#dd8452",
          "other": "#8c8c8c"}


def require_matplotlib() -> None:
    """One line (GenconfError) when the plot extra is not installed; call before writing anything."""
    _pyplot()


def _pyplot():
    """matplotlib.pyplot on the Agg backend, or one line saying how to get it."""
    try:
        import matplotlib
    except ImportError:
        raise GenconfError("--plot needs matplotlib: pip install 'genconf[plot]'") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def check_plot_dir(path: str | Path) -> None:
    """Before anything is written (-o, a run): --plot names a directory that exists or can be made (GenconfError)."""
    import os

    out = Path(path)
    if out.exists():
        if not out.is_dir():
            raise GenconfError(f"--plot {out}: exists and is not a directory")
        return
    parent = out.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise GenconfError(f"--plot {out}: cannot create the directory under {parent}")


def _out_dir(path: str | Path) -> Path:
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise GenconfError(f"--plot {out}: cannot create the directory: {exc.strerror}") from None
    if not out.is_dir():
        raise GenconfError(f"--plot {out}: not a directory")
    return out


def _write_csv(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else [])
        writer.writeheader()
        writer.writerows(rows)


def _gib(n: float) -> float:
    return round(n / GIB, 3)


# --- the numbers ----------------------------------------------------------------------------------

def memory_rows(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec) -> list[dict]:
    """Every pipeline stage's memory per GPU (genconf.memory.stage_memory), in bytes and in GiB as plan.json
    rounds them, with the GPU's capacity and the plan's limit (capacity less the 5% headroom)."""
    capacity = int(cluster.gpu.hbm_gib * GIB)
    usable = int(capacity * (1 - HEADROOM_FRACTION))
    stages = [stage_memory(model, plan, i, fp8_any_layout=cluster.gpu.fp8_gemm_any_layout) for i in range(plan.pp)]
    peak = max(stages, key=lambda s: s.total_bytes).stage
    rows = []
    for s in stages:
        parts = {"params": s.params_bytes, "grads": s.grads_bytes, "optimizer": s.optimizer_bytes,
                 "activations": s.activations_bytes, "other": s.other_bytes}
        row = {"stage": s.stage, "layers": s.layers}
        row.update({f"{k}_bytes": v for k, v in parts.items()})
        row["total_bytes"] = s.total_bytes
        row.update({f"{k}_gib": _gib(v) for k, v in parts.items()})
        row.update(total_gib=_gib(s.total_bytes), capacity_gib=_gib(capacity), usable_gib=_gib(usable),
                   headroom_gib=_gib(capacity - s.total_bytes), peak=int(s.stage == peak))
        rows.append(row)
    return rows


@dataclass(frozen=True)
class PassTimes:
    """One model chunk's forward and backward for one micro-batch, per pipeline rank, from the cost model."""

    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]


def pass_times(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec) -> PassTimes:
    """genconf.plan.cost.stage_times per pipeline rank, split into forward and backward as the cost model splits
    it, over the rank's vp model chunks: the passes step_cost adds up."""
    from genconf.catalog.hardware import calibration_for
    from genconf.plan.cost import stage_times

    stages = stage_times(model, plan, cluster, calibration_for(cluster.gpu.name))
    return PassTimes(tuple(st.forward_s / plan.vp for st in stages),
                     tuple((st.total_s - st.forward_s) / plan.vp for st in stages))


def schedule_blocks(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec) -> tuple[PipelineBlock, ...]:
    times = pass_times(model, plan, cluster)
    return simulate_schedule(plan, times.forward_s, times.backward_s)


def schedule_rows(blocks: tuple[PipelineBlock, ...]) -> list[dict]:
    """One row per pass: stage, micro-batch, chunk, F/B, start and end (seconds from the step's start)."""
    return [{"stage": b.stage, "microbatch": b.microbatch, "chunk": b.chunk, "pass": "F" if b.forward else "B",
             "start_s": f"{b.start_s:.9f}", "end_s": f"{b.end_s:.9f}"} for b in blocks]


def idle_fraction(blocks: tuple[PipelineBlock, ...], pp: int) -> float:
    """Idle time of the busiest-to-finish stage relative to its busy time: the schedule's bubble."""
    span = max(b.end_s for b in blocks)
    busy = [sum(b.end_s - b.start_s for b in blocks if b.stage == r) for r in range(pp)]
    return (span - max(busy)) / max(busy)


# --- drawing: plan --------------------------------------------------------------------------------

def plan_plots(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec, out_dir: str | Path,
               title: str = "") -> list[Path]:
    """memory.png/.csv and schedule.png/.csv for one plan; returns the files written."""
    plt = _pyplot()
    out = _out_dir(out_dir)
    title = title or f"{model.name} on {plan.world_size} x {cluster.gpu.name}"
    mem = memory_rows(model, plan, cluster)
    blocks = schedule_blocks(model, plan, cluster)
    _write_csv(out / "memory.csv", mem)
    _write_csv(out / "schedule.csv", schedule_rows(blocks))
    _draw_memory(plt, mem, out / "memory.png", title)
    _draw_schedule(plt, blocks, plan, out / "schedule.png", title)
    return [out / name for name in ("memory.png", "memory.csv", "schedule.png", "schedule.csv")]


def _draw_memory(plt, rows: list[dict], path: Path, title: str) -> None:
    fig, ax = plt.subplots(figsize=MEMORY_SIZE_IN, dpi=DPI)
    x = list(range(len(rows)))
    bottom = [0.0] * len(rows)
    for part in PARTS:
        values = [r[f"{part}_gib"] for r in rows]
        ax.bar(x, values, bottom=bottom, color=COLORS[part], label=part, width=0.7)
        bottom = [b + v for b, v in zip(bottom, values)]
    capacity, usable = rows[0]["capacity_gib"], rows[0]["usable_gib"]
    ax.axhline(capacity, color="black", linewidth=1.5)
    ax.axhline(usable, color="black", linewidth=1, linestyle="--")
    ax.text(len(rows) - 0.5, capacity, f" HBM {capacity:.1f} GiB", va="bottom", ha="right", fontsize=9)
    ax.text(len(rows) - 0.5, usable, f" plan limit {usable:.1f} GiB ({HEADROOM_FRACTION:.0%} kept free)",
            va="top", ha="right", fontsize=9)
    peak = next(r for r in rows if r["peak"])
    px = peak["stage"]
    ax.bar([px], [peak["total_gib"]], width=0.7, fill=False, edgecolor="black", linewidth=2.5)
    ax.annotate("", xy=(px, capacity), xytext=(px, peak["total_gib"]),
                arrowprops={"arrowstyle": "<->", "color": "black"})
    ax.text(px + 0.38, (capacity + peak["total_gib"]) / 2,
            f"peak: stage {px}, {peak['total_gib']:.1f} GiB\nheadroom {peak['headroom_gib']:.1f} GiB",
            va="center", ha="left", fontsize=9, bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "none"})
    step = max(1, len(rows) // 16)
    ax.set_xticks(x[::step])
    names = ([f"{r['stage']}\n({r['layers']} layers)" for r in rows] if len(rows) <= 12
             else [str(r["stage"]) for r in rows])
    ax.set_xticklabels(names[::step], fontsize=8)
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel("GiB per GPU")
    ax.set_ylim(0, max(capacity, max(r["total_gib"] for r in rows)) * 1.12)
    ax.set_xlim(-0.6, len(rows) - 0.4 + (1.2 if len(rows) < 4 else 0.5))
    ax.set_title(f"{title}\nmemory per GPU by pipeline stage", fontsize=10)
    ax.legend(loc="upper left", fontsize=8, ncol=5)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def _draw_schedule(plt, blocks: tuple[PipelineBlock, ...], plan: ParallelPlan, path: Path, title: str) -> None:
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=SCHEDULE_SIZE_IN, dpi=DPI)
    span = max(b.end_s for b in blocks)
    scale, unit = (1e3, "ms") if span < 2 else (1.0, "s")
    cmap = plt.get_cmap("tab10")
    per_row = len(blocks) / plan.pp
    label = per_row <= 96  # micro-batch numbers only where a block is wide enough to read
    edges = {"edgecolor": "white", "linewidth": 0.3} if per_row <= 200 else {"linewidth": 0}
    for r in range(plan.pp):
        row = [b for b in blocks if b.stage == r]
        for forward in (True, False):
            for chunk in range(plan.vp):
                spans = [(b.start_s * scale, (b.end_s - b.start_s) * scale) for b in row
                         if b.forward == forward and b.chunk == chunk]
                ax.broken_barh(spans, (r - 0.4, 0.8), facecolors=cmap(chunk % 10), alpha=0.45 if forward else 1.0,
                               **edges)
        # Idle time (the bubble) filled red; gaps wider than 0.3% of the step also hatched and outlined.
        t, gaps = 0.0, []
        for b in row:
            if b.start_s > t + 1e-12:
                gaps.append((t * scale, (b.start_s - t) * scale))
            t = max(t, b.end_s)
        if span > t + 1e-12:
            gaps.append((t * scale, (span - t) * scale))
        wide = [g for g in gaps if g[1] >= 0.003 * span * scale]
        ax.broken_barh([g for g in gaps if g not in wide], (r - 0.4, 0.8), facecolors="#f2a6a6", linewidth=0)
        ax.broken_barh(wide, (r - 0.4, 0.8), facecolors="#fbe3e3", edgecolor="#d62728", hatch="////",
                       linewidth=0.8)
        if label:
            for b in row:
                ax.text((b.start_s + b.end_s) / 2 * scale, r, str(b.microbatch), ha="center", va="center",
                        fontsize=6 if per_row > 48 else 7, color="black" if b.forward else "white")
    bubble = idle_fraction(blocks, plan.pp)
    handles = [Patch(facecolor=cmap(c % 10), alpha=0.45, label=f"forward, chunk {c}") for c in range(plan.vp)]
    handles += [Patch(facecolor=cmap(c % 10), label=f"backward, chunk {c}") for c in range(plan.vp)]
    handles.append(Patch(facecolor="#fbe3e3", edgecolor="#d62728", hatch="////", label="idle (bubble)"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=min(len(handles), 5), fontsize=8)
    ax.set_yticks(range(plan.pp))
    ax.set_yticklabels([f"stage {r}" for r in range(plan.pp)])
    ax.set_ylim(plan.pp - 0.5, -0.5)
    ax.set_xlim(0, span * scale)
    ax.set_xlabel(f"time in one step ({unit})")
    kind = "interleaved 1F1B" if plan.vp > 1 and plan.pp > 1 else "1F1B" if plan.pp > 1 else "no pipeline"
    ax.set_title(f"{title}\n{kind} schedule, pp={plan.pp} vp={plan.vp}, {plan.num_microbatches} micro-batches; "
                 f"bubble {bubble:.1%} ((p-1)/(v m) = {bubble_fraction(plan):.1%})", fontsize=10)
    fig.subplots_adjust(bottom=0.22, left=0.07, right=0.98)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


# --- verify ---------------------------------------------------------------------------------------

def verify_rows(rows: list[dict], golden: dict[int, float] | None, pred: Prediction | None, device: str) -> list[dict]:
    """One row per logged step: measured loss, tokens/s/GPU and peak memory beside the golden loss and the
    prediction (empty where there is none)."""
    def fmt(value) -> str:
        return "" if value is None else f"{value:.6g}"

    out = []
    for r in rows:
        step = int(r["step"])
        out.append({
            "step": step, "loss": fmt(r.get("loss")), "golden_loss": fmt((golden or {}).get(step)),
            "tokens_per_s_per_gpu": fmt(r.get("tokens_per_s_per_gpu")),
            "predicted_tokens_per_s_per_gpu": fmt(pred and pred.tokens_per_s_per_gpu),
            "predicted_tokens_low": fmt(pred and pred.tokens_band and pred.tokens_band[0]),
            "predicted_tokens_high": fmt(pred and pred.tokens_band and pred.tokens_band[1]),
            "peak_mem_gib": fmt(r.get("peak_mem_gib")), "peak_mem_kind": r.get("peak_mem_kind", ""),
            "predicted_peak_mem_gib": fmt(pred and pred.peak_mem_gib),
            "predicted_mem_low": fmt(pred and pred.memory_band and pred.memory_band[0]),
            "predicted_mem_high": fmt(pred and pred.memory_band and pred.memory_band[1]),
            "predicted_for": pred.gpu if pred else "", "measured_on": device,
        })
    return out


def verify_plots(run: str | Path, out_dir: str | Path, golden: str | Path | None = None) -> list[Path]:
    """verify.png/.csv for a run directory; returns the files written."""
    from genconf.run import verify

    plt = _pyplot()
    run = Path(run)
    rows = verify.read_metrics(run)
    config, versions = verify.read_run_json(run, "config.json"), verify.read_run_json(run, "versions.json")
    device = versions.get("device") or "cpu"
    curve = verify.read_golden(Path(golden)) if golden else None
    pred = prediction_for(run, config, versions)
    table = verify_rows(rows, curve, pred, device)
    out = _out_dir(out_dir)
    _write_csv(out / "verify.csv", table)
    _draw_verify(plt, rows, curve, pred, device, out / "verify.png", "/".join(run.resolve().parts[-3:]))
    return [out / "verify.png", out / "verify.csv"]


def _draw_verify(plt, rows: list[dict], golden: dict[int, float] | None, pred: Prediction | None, device: str,
                 path: Path, name: str) -> None:
    fig, (loss_ax, speed_ax, mem_ax) = plt.subplots(3, 1, figsize=VERIFY_SIZE_IN, dpi=DPI, sharex=True)
    steps = [int(r["step"]) for r in rows]
    loss_ax.plot(steps, [r["loss"] for r in rows], "o-", color="#4c72b0", label="measured", markersize=4)
    if golden:
        gs = sorted(golden)
        loss_ax.plot(gs, [golden[s] for s in gs], "x--", color="black", label="golden", markersize=6)
        common = [s for s in steps if s in golden]
        if common:
            worst = max(common, key=lambda s: abs(rows[steps.index(s)]["loss"] - golden[s]))
            loss_ax.set_title(f"loss: largest |measured - golden| {abs(rows[steps.index(worst)]['loss'] - golden[worst]):.2e}"
                              f" at step {worst}", fontsize=10)
    else:
        loss_ax.set_title("loss (no golden curve given)", fontsize=10)
    loss_ax.set_ylabel("loss")
    loss_ax.legend(fontsize=8)

    where = "" if pred is None else (f" for {pred.gpu}" + ("" if pred.comparable else
                                                           f" (measured on {device}: not comparable)"))
    steady = rows[2:] if len(rows) > 4 else rows[1:] or rows
    for ax, key, predicted, band, label in (
            (speed_ax, "tokens_per_s_per_gpu", pred and pred.tokens_per_s_per_gpu, pred and pred.tokens_band,
             "tokens/s per GPU"),
            (mem_ax, "peak_mem_gib", pred and pred.peak_mem_gib, pred and pred.memory_band, "peak memory (GiB)")):
        measured = [r.get(key) for r in rows]
        kind = rows[-1].get("peak_mem_kind", "") if key == "peak_mem_gib" else ""
        ax.plot(steps, measured, "o-", color="#dd8452", markersize=4,
                label=f"measured on {device}" + (f" ({kind})" if kind else ""))
        title = label
        if predicted:
            ax.axhline(predicted, color="black", linestyle="--" if pred.comparable else ":",
                       label=f"predicted{where}")
            if band:
                ax.axhspan(band[0], band[1], color="#999999", alpha=0.3, label="prediction interval")
            typical = statistics.median(r[key] for r in steady if r.get(key) is not None)
            title += f": measured / predicted = {typical / predicted:.2f} (median of steps {steady[0]['step']}+)"
            if not pred.comparable:
                title += f"; predicted for {pred.gpu}, ran on {device}"
            elif not band:
                title += "; plan.json has no interval"
        else:
            title += ": no prediction for this run"
        values = [v for v in measured if v is not None] + ([predicted] if predicted else [])
        values += list(band) if band else []
        if values and min(values) > 0 and max(values) / min(values) > 20:
            ax.set_yscale("log")
        elif values:
            ax.set_ylim(0, max(values) * 1.15)  # from zero: the gap reads true to scale
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    mem_ax.set_xlabel("step")
    fig.suptitle(f"run {name}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def expected_px(size_in: tuple[float, float]) -> tuple[int, int]:
    """Pixels of a figure of `size_in` inches saved at DPI."""
    return round(size_in[0] * DPI), round(size_in[1] * DPI)
