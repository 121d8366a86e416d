"""What the command line prints: the plan as text ("why this plan", memory, performance, alternatives), the
catalogs, `genconf verify`'s and `genconf ci`'s tables, and JSON."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from genconf.plan.batch import describe_batch
from genconf.plan.counting import exact_param_count, human_count
from genconf.plan.cpu_time import format_seconds, format_training_time
from genconf.plan.memory import GIB, HEADROOM_FRACTION, StageMemory
from genconf.plan.pipeline import inflight_chunks
from genconf.plan.search import Evaluation, SearchResult, describe
from genconf.plan.specs import ClusterSpec, GPUSpec, ModelSpec, ParallelPlan

MFU_CONVENTION_SHARE = 0.2
"""Where the causal mask's skipped half is more than this share of the counted FLOPs (long sequences), the plan shows
MFU with causal attention halved too."""

if TYPE_CHECKING:  # the shell's result types, named in signatures only: text output imports no shell module
    from genconf.run.ci import Row
    from genconf.run.verify import Verdict


def print_json(obj: object) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True))


# --- the plan -------------------------------------------------------------------------------------

def _row(label: str, value: str, width: int = 44) -> str:
    return f"  {label:<{width}}{value}"


def _stage_memory_lines(stage: StageMemory, plan: ParallelPlan, capacity: int) -> list[str]:
    chunks = inflight_chunks(plan, stage.stage)
    shard = f", sharded over {plan.shard_size}" if plan.zero_stage else ""
    lines = [
        _row("parameters", f"{stage.params_bytes / GIB:8.2f}"),
        _row("gradients", f"{stage.grads_bytes / GIB:8.2f}"),
        _row(f"optimizer states{shard}", f"{stage.optimizer_bytes / GIB:8.2f}"),
        _row(f"activations ({chunks} chunk{'s' if chunks > 1 else ''} in flight)", f"{stage.activations_bytes / GIB:8.2f}"),
        _row("other", f"{stage.other_bytes / GIB:8.2f}"),
    ]
    lines += [_row(f"  {name}", f"{b / GIB:8.2f}") for name, b in stage.other if b >= 0.01 * GIB]
    lines.append(_row("total", f"{stage.total_bytes / GIB:8.2f}  of {capacity / GIB:.1f} GiB "
                               f"(plans keep {HEADROOM_FRACTION:.0%} free)"))
    allocator = ("expandable segments" if plan.expandable_segments else "classic caching allocator")
    lines.append(_row("  allocated / reserved / nvidia-smi", f"{stage.allocated_bytes / GIB:8.2f} / "
                      f"{stage.reserved_bytes / GIB:.2f} / {stage.device_bytes / GIB:.2f}  ({allocator})"))
    return lines


def _checkpoint_lines(ck: dict | None) -> list[str]:
    """One checkpoint's size and the disk keep-last-N takes (one more is written before the oldest goes)."""
    if not ck:
        return []
    def size(n: int) -> str:
        return f"{n / 2**30:,.1f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB"

    return [_row("checkpoint size / disk to keep", f"{size(ck['bytes'])} ({ck['holds']}) / {size(ck['disk_bytes'])} "
                 f"(newest {ck['keep_last']} + 1 being written)")]


def _hybrid_counts(pattern: str) -> str:
    """'24 Mamba-2, 4 attention, 24 MLP layers' for a hybrid pattern."""
    names = {"M": "Mamba-2", "*": "attention", "-": "MLP", "E": "MoE"}
    return "hybrid: " + ", ".join(f"{pattern.count(k)} {v}" for k, v in names.items() if pattern.count(k)) + " layers"


def _breakdown_name(key: str, plan: dict) -> str:
    """A step breakdown part's name; tp_comm holds the exposed EP all-to-all and CP ring traffic too (StepCost.tp_comm_s),
    so an expert- or context-parallel plan names them: DeepSeek-V3's 13.6 s of all-to-all read 'tp_comm 13.599'."""
    if key != "tp_comm":
        return key
    return "+".join([x for x in ("tp", "cp", "ep") if (plan.get(x) or 1) > 1] or ["tp"]) + "_comm"


def _training_time(tr: dict, num_gpus: int) -> str:
    """'38.2 days, 352,000 GPU-hours' (genconf.plan.cpu_time.format_training_time)."""
    return format_training_time(tr["time_s"], num_gpus)


def _track_record_lines(d: dict) -> list[str]:
    """The model's published runs against genconf's numbers (genconf.catalog.track_record), where the caller looked
    them up: no line when `d` has no "track_record" key."""
    if "track_record" not in d:
        return []
    rec = d["track_record"]
    label = "published runs of this model"
    if rec is None:
        kind = "MoE" if d["model"].get("num_experts") else "dense"
        return [_row(label, f"none in genconf's data: the 80% interval above is that of all {kind} models")]
    where = "all GPUs" if rec["scope"] == "all" else rec["scope"]
    spread = (f"{rec['p10']:.2f}-{rec['p90']:.2f} (10-90%)" if rec["rows"] >= 10
              else f"{rec['min']:.2f}-{rec['max']:.2f} (range)")
    others = ("" if d["plan"]["framework"] in rec["frameworks"] else
              f"; {' and '.join(rec['frameworks'])} runs, this plan {d['plan']['framework']}")
    return [_row(label, f"{rec['rows']} on {where} ({', '.join(rec['sources'])}{others})"),
            _row("  measured / predicted tokens/s", f"median {rec['median']:.2f}, {spread}")]


def _window(m: dict, seq: int) -> str:
    """', window: 4,096 keys back in 21 of 42 layers' for sliding-window attention, else nothing."""
    window = m.get("sliding_window")
    if not window:
        return ""
    if window + 1 >= seq:
        return f", window {window:,} (covers the sequence: full attention)"
    return f", window: {m.get('window_text', f'{window:,} keys back')}"


def render_text(d: dict, best: Evaluation, *, explain: SearchResult | None = None, top: int = 3) -> str:
    m, c, p, perf, tr = d["model"], d["cluster"], d["plan"], d["perf"], d["training"]
    alias = f"{m['alias']} -> " if m["alias"] else ""
    domain = c.get("nvlink_domain_gpus") or c["gpus_per_node"]
    nvlink = ("inside a node" if domain == c["gpus_per_node"]
              else f"across {domain} GPUs" if domain > c["gpus_per_node"]
              else f"in groups of {domain}, PCIe {c['pcie_peer_gbyte_per_s_per_gpu']:g} GB/s per GPU between them")
    lines = [
        f"model    {alias}{m['name']}: {m['params']:,} parameters ({_hybrid_counts(m['hybrid_pattern'])})"
        if m.get("hybrid_pattern") else
        # MoE: the workshop formula counts a dense GPT of the shape (DeepSeek-V3 read 'workshop formula: 39.5B' beside
        # its 683B, and nothing said it has experts)
        f"model    {alias}{m['name']}: {m['params']:,} parameters, {m['params_active']:,} active per token "
        f"({m['moe_top_k']} of {m['num_experts']} experts)" if m.get("num_experts") and "params_active" in m else
        f"model    {alias}{m['name']}: {m['params']:,} parameters (workshop formula: {m['params_workshop']:,})",
        f"         {m['num_layers']} layers, hidden {m['hidden_size']}, {m['num_attention_heads']} heads"
        f" ({m['num_query_groups']} KV), ffn {m['ffn_hidden_size']} {m['activation']}, vocab {m['vocab_size']}, "
        f"seq {p['seq_length']}" + _window(m, p["seq_length"]),
        *[f"         config.json: {note}" for note in m.get("import_notes", [])],
        f"cluster  {c['name']}: {c['num_gpus']} x {c['gpu_display_name']} ({c['num_nodes']} node{'s' * (c['num_nodes'] != 1)} "
        f"of {c['gpus_per_node']}, NVLink {nvlink}, {c['ib_gbit_per_s_per_gpu']:g} Gb/s IB per GPU)",
        *([f"         {c['note']}"] if c.get("note") else []),
        "",
        f"plan     {d['layout']}",
        f"         {p['num_microbatches']} micro-batches per step, {p['precision']}, layer spec {p['layer_spec']}, "
        f"layers per stage {p['stage_layers'] if p['pp'] <= 8 else str(p['stage_layers'][:8])[:-1] + ', ...]'}",
    ]
    if d.get("batch"):
        head, where = describe_batch(d["batch"])
        lines += [f"batch    {head}", f"         {where}"]
    lines += [
        "",
        f"memory per GPU, stage {best.memory.peak.stage} (the busiest)           GiB",
    ]
    lines += _stage_memory_lines(best.memory.peak, best.plan, best.memory.capacity_bytes)
    band = d.get("intervals_80")

    def within(key: str, fmt: str) -> str:
        if not band:
            return ""
        lo, hi = band[key]
        return f"  (80%: {format(lo, fmt)} - {format(hi, fmt)})"

    if band:
        lines.append(_row("80% interval of the peak", f"{band['peak_memory_gib'][0]:8.2f} - "
                                                      f"{band['peak_memory_gib'][1]:.2f}"))
    lines += [
        "",
        "performance (predicted)",
        _row("step time", f"{perf['step_time_s']:.3f} s{within('step_time_s', '.3f')}"),
        _row("MFU / model TFLOP/s per GPU", f"{perf['mfu']:.1%} / {perf['tflops_per_gpu']:.0f} "
             f"(peak {perf['peak_tflops_per_gpu']:g})"),
        *([_row("  causal attention halved", f"{perf['mfu_causal_halved']:.1%} MFU: the FLOPs the GPU runs (the line "
                "above counts the masked half too, as Megatron-LM does)")]
          if perf["mfu"] >= 0.1 and perf.get("mfu_causal_halved", perf["mfu"]) < perf["mfu"] * (1 - MFU_CONVENTION_SHARE)
          else []),
        _row("tokens/s per GPU / whole job", f"{perf['tokens_per_s_per_gpu']:,.0f} / {perf['tokens_per_s']:,.0f}"
                                              f"{within('tokens_per_s_per_gpu', ',.0f')}"),
        *_track_record_lines(d),
        _row("pipeline bubble", f"{perf['bubble_fraction']:.1%}"),
        _row("step breakdown (s)", "  ".join(f"{_breakdown_name(k, d['plan'])} {v:.3f}"
                                             for k, v in perf["breakdown_s"].items() if v > 0)),
        _row(f"train {human_count(tr['tokens'])} tokens", _training_time(tr, c["num_gpus"])),
        *_checkpoint_lines(d.get("checkpoint")),
        "",
        "why this plan",
    ]
    lines += [f"  - {reason}" for reason in d["why"]]
    for warning in d["warnings"]:
        lines.append(f"  ! {warning}")
    if d["alternatives"] and top > 1:
        lines += ["", f"alternatives (best {min(top, len(d['alternatives']) + 1) - 1})",
                  f"  {'layout':<72}{'GiB':>6}{'step s':>8}{'MFU':>7}{'tok/s/GPU':>11}"]
        for alt in d["alternatives"][: top - 1]:
            lines.append(f"  {alt['layout']:<72}{alt['memory']['total_gib']:>6.1f}{alt['perf']['step_time_s']:>8.2f}"
                         f"{alt['perf']['mfu']:>7.1%}{alt['perf']['tokens_per_s_per_gpu']:>11,.0f}")
    if explain is not None:
        lines += explain_lines(explain)
    return "\n".join(lines)


def explain_lines(result: SearchResult) -> list[str]:
    lines = ["", f"search: {result.considered} candidates, {len(result.ranked)} feasible layouts kept",
             "  rejected by rule (first rule broken):"]
    lines += [f"    {name:<28}{count:>7}" for name, count in result.rejected.items()] or ["    (none)"]
    if result.nearest_misses:
        lines.append("  nearest misses:")
        for ev in result.nearest_misses:
            lines.append(f"    {describe(ev.plan)}")
            lines.append(f"      {ev.errors[0]}")
    return lines


# --- catalogs -------------------------------------------------------------------------------------

def moe_arch(m: ModelSpec) -> str:
    """The arch column's experts: /moe<experts>x<top-k>, and where not every layer is MoE how the dense layers sit:
    ':1in<n>' (one MoE layer in every moe_layer_interval n, dense ones between: Llama 4 Maverick's 1in2, megatron
    --moe-layer-freq ([0,1]*24)) or ':first<k>dense' (first_k_dense_replace dense layers before the MoE ones:
    DeepSeek-V3's first3dense). A hybrid model's MoE layers sit in its Mamba pattern: no suffix."""
    if not m.is_moe:
        return ""
    placement = ""
    if not m.is_hybrid and m.moe_layer_interval > 1:
        placement = f":1in{m.moe_layer_interval}"
    elif not m.is_hybrid and m.first_k_dense_replace:
        placement = f":first{m.first_k_dense_replace}dense"
    return f"/moe{m.num_experts}x{m.moe_top_k}{placement}"


def models_table(models: list[ModelSpec], aliases_of: dict[str, list[str]]) -> str:
    """`genconf models`: one line per model, smallest first; the name and arch columns as wide as their longest
    entry, so that no two columns run together."""
    def arch(m: ModelSpec) -> str:
        # window<keys>[:<windowed>/<layers>]: sliding-window attention, and on how many layers where not on all
        window = (f"/window{m.sliding_window}" + (f":{m.windowed_layers}/{m.num_layers}" if m.window_attn_skip_freq
                                                  else "") if m.sliding_window else "")
        return (f"{m.activation}/{m.normalization}/{m.position_embedding}" + moe_arch(m) + window)

    name_w = max([len("name"), *(len(m.name) for m in models)]) + 2
    arch_w = max([len("arch"), *(len(arch(m)) for m in models)]) + 2
    lines = [f"{'name':<{name_w}}{'params':>8}{'layers':>8}{'hidden':>8}{'heads':>7}{'kv':>5}{'ffn':>8}{'vocab':>8}"
             f"{'seq':>8}  {'arch':<{arch_w}}aliases"]
    for m in sorted(models, key=exact_param_count):
        lines.append(f"{m.name:<{name_w}}{human_count(exact_param_count(m)):>8}{m.num_layers:>8}{m.hidden_size:>8}"
                     f"{m.num_attention_heads:>7}{m.num_query_groups:>5}{m.ffn_hidden_size:>8}{m.vocab_size:>8}"
                     f"{m.seq_length:>8}  {arch(m):<{arch_w}}{', '.join(aliases_of.get(m.name, []))}".rstrip())
    return "\n".join(lines)


def hardware_table(gpus: list[GPUSpec], clusters: list[ClusterSpec], default_cluster: str) -> str:
    """`genconf hardware`: the GPUs (dense peak TFLOP/s) and the cluster presets."""
    def fmt(v):
        return f"{v:g}" if v else "-"

    lines = ["GPUs (dense peak TFLOP/s)",
             f"  {'name':<16}{'fp32':>7}{'tf32':>7}{'bf16':>8}{'fp8':>8}{'fp4':>8}{'HBM GiB':>9}{'TB/s':>6}"
             f"{'NVLink GB/s':>12}  node sizes"]
    for g in gpus:
        lines.append(f"  {g.name:<16}{fmt(g.peak_fp32_tflops):>7}{fmt(g.peak_tf32_tflops):>7}{fmt(g.peak_bf16_tflops):>8}"
                     f"{fmt(g.peak_fp8_tflops):>8}{fmt(g.peak_fp4_tflops):>8}{g.hbm_gib:>9g}{g.hbm_tbyte_per_s:>6g}"
                     f"{g.nvlink_gbyte_per_s:>12g}  {'/'.join(map(str, g.node_sizes))}")
    lines += ["", f"clusters (default: {default_cluster})"]
    for c in clusters:
        size = f"{c.total_gpus} GPUs" if c.total_gpus else "any size"
        lines.append(f"  {c.name:<18}{c.gpu.name:<16}{c.gpus_per_node}/node  NVLink domain {c.nvlink_domain:<3} "
                     f"IB {c.ib_gbit_per_s_per_gpu:g} Gb/s/GPU  {size}")
    return "\n".join(lines)


# --- runs -----------------------------------------------------------------------------------------

def verdict_text(verdict: Verdict) -> str:
    """`genconf verify`'s table: one line per check."""
    lines = [f"run {verdict.run}: {'PASS' if verdict.ok else 'FAIL'}",
             f"  {'check':<14}{'status':<8}{'ratio':>8}  detail"]
    for c in verdict.checks:
        ratio = f"{c.ratio:.3f}" if c.ratio is not None else "-"
        lines.append(f"  {c.name:<14}{c.status:<8}{ratio:>8}  {c.detail}")
    return "\n".join(lines)


def ci_table(rows: list[Row]) -> str:
    """`genconf ci`'s table: one line per recipe, then what failed and the notes."""
    out = [f"{'recipe':<20}{'layout (smoke)':<66}{'steps':>6}{'final loss':>12}{'golden':>10}  {'verdict':<8}"
           f"{'time':>7}  tokens/s vs predicted"]
    for r in rows:
        final = f"{r.final_loss:.4f}" if r.final_loss is not None else "-"
        golden = f"{r.golden_final:.4f}" if r.golden_final is not None else "-"
        out.append(f"{r.recipe:<20}{r.layout[:65]:<66}{r.steps:>6}{final:>12}{golden:>10}  {r.verdict:<8}"
                   f"{r.seconds:>6.0f}s  {r.throughput}")
        if not r.ok:
            out.append(f"    {r.detail}")
        for note in r.notes:
            out.append(f"    note: {note}")
    passed = sum(r.ok for r in rows)
    out.append(f"{passed}/{len(rows)} recipes passed")
    return "\n".join(out)


def calibration_line(used: dict) -> str:
    """Which calibration file the prediction used, with the terms it set."""
    terms = ", ".join(f"{k} {v:.4g}" for k, v in sorted(used["terms"].items())) or "no terms"
    return f"calibration  {used['file']} ({used['source']} on {used.get('measured_on') or '?'}): {terms}"


def calibrate_text(path: str, content: dict) -> str:
    """What `genconf calibrate` wrote: the terms (before -> after), each fitted group's error, each run."""
    terms = content.get("terms") or {}
    changed = ", ".join(f"{k} {v['before']:.4g} -> {v['value']:.4g}" for k, v in terms.items()) or "no terms fitted"
    lines = [f"genconf: wrote {path} ({content['source']}, gpu {content.get('gpu') or 'none'}): {changed}"]
    for group, summary in (content.get("fit") or {}).items():
        edge = f"; at a bound: {', '.join(summary['at_bound'])}" if summary["at_bound"] else ""
        lines.append(f"  {group}: {', '.join(summary['terms'])}: RMS error of log time {summary['before_log_rmse']:.3f} "
                     f"-> {summary['after_log_rmse']:.3f}{edge}")
    for row in content.get("runs", []):
        lines.append(f"  {row['run']}: step time measured {row['measured_step_time_s']:.4f} s, predicted "
                     f"{row['predicted_step_time_s_before']:.4f} -> {row['predicted_step_time_s_after']:.4f} s")
    return "\n".join(lines)
