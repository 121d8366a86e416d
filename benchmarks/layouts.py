"""Search benchmark: does genconf find NVIDIA's hand-tuned layouts?

    python benchmarks/layouts.py            # writes benchmarks/results/layouts.{md,json}

For every dense-model layout in nemo_recommended_configs_configonly.csv and megatron_bridge_perf_summary.csv
(pre-training and full fine-tuning; the LoRA layouts are scored as throughput rows by accuracy.py, not here), with the model, GPU count, cluster,
precision, global batch and sequence length of the row:
- pinned: the layout typed as a user would (--tp --pp --vp --cp --ep --mbs --global-batch --precision), the rest
  searched: is it feasible (not rejected as invalid or out of memory)?
- unpinned: only model, GPUs, cluster, precision, batch and sequence given: is NVIDIA's (tp, pp, vp, cp) among
  the first 5 layouts genconf lists (the plan and its alternatives, one per layout apart from the pipeline
  schedule), among its first 5 distinct (tp, pp, vp, cp) candidates, and among its ranked candidates at all?
"""

from __future__ import annotations

import csv
import json
import re
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from published import (CATALOG_KEYS, DATA, SQUAD_DOC_TOKENS, _family_defaults, _int, _model_key,  # noqa: E402
                       _precision, bridge_dense_recipe, dense_recipe_fields)

from genconf.catalog.clusters import resolve_cluster  # noqa: E402
from genconf.catalog.hardware import calibration_for  # noqa: E402
from genconf.catalog.models import resolve_model  # noqa: E402
from genconf.plan.search import DEFAULT_LAYOUT, Pins, search  # noqa: E402
from genconf.plan.specs import ModelSpec  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
FILES = ("nemo_recommended_configs_configonly.csv", "megatron_bridge_perf_summary.csv")
CLUSTERS = {"H100": "dgx-h100", "B200": "dgx-b200", "B300": "dgx-b300", "GB200": "gb200-nvl72", "GB300": "gb300-nvl72"}


def _model(row: dict) -> ModelSpec | None:
    key = _model_key(row["model"])
    key = {"llama3_8b": "llama3_8b", "llama31_405b": "llama3.1_405b"}.get(key, key)
    seq = _int(row["seq_len"])
    if key in CATALOG_KEYS:
        model = resolve_model(CATALOG_KEYS[key])[0]
        return None if model.is_moe else replace(model, seq_length=seq)
    if not _int(row["layers"]) or "mixtral" in key or "nemotronh" in key:
        return None
    defaults = _family_defaults(row["model"].replace("_", "-"))
    if not defaults:
        return None
    vocab = defaults.pop("vocab_size")
    layers, h, heads = _int(row["layers"]), _int(row["hidden"]), _int(row["heads"])
    return ModelSpec(name=re.sub(r"[^a-z0-9.]+", "-", key).strip("-"), num_layers=layers, hidden_size=h,
                     num_attention_heads=heads, num_query_groups=_int(row["kv_heads"]) or heads,
                     ffn_hidden_size=_int(row["ffn_hidden"]), vocab_size=vocab, seq_length=seq, **defaults)


def cases() -> list[dict]:
    out = []
    for file in FILES:
        with open(DATA / file) as f:
            for i, row in enumerate(csv.DictReader(f)):
                task = "lora" if ("lora" in row["model"].lower() or "LoRA Perf" in row["notes"]) else (
                    "sft" if ("sft" in row["model"].lower() or "SFT Perf" in row["notes"]) else "pretrain")
                if task == "lora" or "finetune" in row["model"]:
                    continue
                model = _model(row)
                if model is None:
                    continue
                gpu_key = row["gpu"].split(" ")[0].split("-")[0]
                cluster = resolve_cluster(CLUSTERS[gpu_key])
                precision, recipe = _precision(row, file, cluster.gpu.arch)
                if file == FILES[0] and precision == "fp8":
                    recipe = "current"  # NeMo 2.0 performance recipes: per-tensor current scaling
                tp, pp, cp = _int(row["tp"]) or 1, _int(row["pp"]) or 1, _int(row["cp"]) or 1
                # A blank vp column: the table does not say (Megatron-Bridge leaves it out for pp = 1 and for
                # some pp > 1 rows): searched when pinned, and matched on (tp, pp, cp) alone.
                vp = _int(row["vp"]) or (1 if pp == 1 else None)
                gpus = _int(row["num_gpus"])
                fsdp = bool(re.search(r"(use_mcore_fsdp=1|FSDP=[1-9])", row["notes"]))
                ran = _as_configured(file, i, row, tp)
                out.append({"file": file, "label": f"{row['model']} #{i}", "gpu": cluster.gpu.name, "cluster": cluster,
                            "model": model, "gpus": gpus, "tp": tp, "pp": pp, "vp": vp, "cp": cp,
                            "mbs": _int(row["mbs"]) or 1, "gbs": _int(row["gbs"]), "precision": precision,
                            "fp8_recipe": recipe, "fsdp": fsdp, "task": task, "as_configured": ran})
    return out


def _as_configured(file: str, index: int, row: dict, tp: int) -> dict | None:
    """The memory and speed settings the row's configuration ran with, as Pins fields, where the data says them:
    NeMo's recommended configs list recompute, activation offload, Megatron-FSDP and CUDA graphs; a Megatron-Bridge
    row's preset is read at its release's ref (benchmarks/bridge_dense_recipes.csv, where its layout matches)."""
    if file == FILES[1]:
        recipe = bridge_dense_recipe(index)
        if recipe is None:
            return None
        fields = dense_recipe_fields(recipe)
        fields.pop("pp_embedding_as_layer", None)  # the search splits 126 layers over pp the same way
        fields.pop("pp_loss_as_layer", None)
        fields.pop("fp8_param_gather", None)  # the search's default for these recipes (on, as Bridge sets it)
        if tp == 1:
            fields["tp_comm_overlap"] = None
        return fields
    notes = dict(re.findall(r"(\w+)=([\w./]*)", row["notes"]))
    layers = re.search(r"recompute_layers=(\d+)", row["recompute"])
    if row["recompute"] != "none listed" and not (layers and int(layers.group(1)) > 0):
        return None  # recompute_modules: megatron's per-module selective recompute, not genconf's
    fields = dict(recompute="full" if layers else "none", recompute_layers=int(layers.group(1)) if layers else None,
                  offload_activation_layers=int(float(notes.get("activation_offload_layers") or 0)),
                  zero_stage=3 if notes.get("use_mcore_fsdp") == "1" else 1)
    if notes.get("cuda_graphs", "0").startswith("1"):
        fields.update(cuda_graph_impl="local", cuda_graph_scope=())  # NeMo's enable_cuda_graph: whole layers
    return fields


def _int_vp(layout: str) -> int | None:
    """The vp of a "tpX ppY vpZ cpW mbsV" layout string (None where the table left it out)."""
    vp = re.search(r"vp(\d+)", layout)
    return int(vp.group(1)) if vp else None


def _key(plan) -> tuple:
    return (plan.tp, plan.pp, plan.vp, plan.cp)


def ranking(free, key, target: tuple, schedule) -> tuple[list, int | None, int | None, dict, int | None]:
    """NVIDIA's place in an unpinned search: the distinct layouts in rank order ((key(plan), its first evaluation));
    NVIDIA's `target` rank among them; its rank in the list a user reads (`genconf --top 5`: the plan, then its
    alternatives, one entry per layout apart from its pipeline schedule, SearchResult.alternatives); the first
    evaluation of each layout apart from the schedule (`schedule` of a key), in rank order, and NVIDIA's rank there."""
    order, seen = [], set()
    for ev in free.ranked:
        k = key(ev.plan)
        if k not in seen:
            seen.add(k)
            order.append((k, ev))
    rank = next((i + 1 for i, (k, _) in enumerate(order) if k == target), None)
    listed = ((free.ranked[0],) + free.alternatives) if free.ranked else ()
    listed_rank = next((i + 1 for i, ev in enumerate(listed) if key(ev.plan) == target), None)
    firsts: dict[tuple, object] = {}
    for k, ev in order:
        firsts.setdefault(schedule(k), ev)
    schedule_rank = next((i + 1 for i, k in enumerate(firsts) if k == schedule(target)), None)
    return order, rank, listed_rank, firsts, schedule_rank


def run_case(c: dict, cal_override: dict | None = None) -> dict:
    """One layout, pinned and unpinned. `cal_override`: calibration fields replaced on top of the committed ones
    (benchmarks/variants.py scores a hypothesis this way)."""
    model, cluster = c["model"], c["cluster"]
    cal = replace(calibration_for(cluster.gpu.name), **(cal_override or {}))
    # Both files' performance recipes reduce gradients in bf16 (Megatron-Bridge set_basic_perf_overrides and
    # NeMo 2.0's performance optimisations: grad_reduce_in_fp32 = False): a recipe setting, typed for both searches.
    # Their FP8 current scaling runs every layer quantized (Megatron-Bridge perf_recipes/_common.py _perf_precision,
    # NeMo 2.0's scripts/performance: first_last_layers_bf16 = False), where fp8-current's default keeps one BF16
    # layer at each end: a recipe setting, typed for both searches too.
    # Their fine-tuning layouts train on SQuAD packed into each sequence (published.SQUAD_DOC_TOKENS).
    base = dict(gbs=c["gbs"], seq_length=model.seq_length, precision=c["precision"], fp8_recipe=c["fp8_recipe"],
                grad_dtype="bf16", bf16_layers=(0, 0),
                packed_doc_tokens=SQUAD_DOC_TOKENS if c["task"] == "sft" else None)
    pinned = Pins(framework="megatron", tp=c["tp"], pp=c["pp"], vp=c["vp"], cp=c["cp"], ep=1, mbs=c["mbs"],
                  pp_layout=DEFAULT_LAYOUT, **base)
    t0 = time.perf_counter()
    res = search(model, cluster, c["gpus"], cal, pinned, keep=1)
    feasible = bool(res.ranked)
    reason = "" if feasible else (str(res.nearest_misses[0].errors[0]) if res.nearest_misses else str(res.rejected))
    # As it ran: the configuration's own recompute, offload, sharding and graphs typed too (every degree pinned,
    # so the whole GPU is usable, as it was for the run).
    ran = c.get("as_configured")
    ran_ok, ran_reason = None, ""
    if ran is not None:
        as_ran = search(model, cluster, c["gpus"], cal,
                        replace(pinned, megatron_fsdp=ran["zero_stage"] >= 2, **ran), keep=1)
        ran_ok = bool(as_ran.ranked)
        ran_reason = "" if ran_ok else (str(as_ran.nearest_misses[0].errors[0]) if as_ran.nearest_misses
                                        else str(as_ran.rejected))
    # Megatron-FSDP is opt-in (genconf.plan.search.search): where NVIDIA's recipe turned it on
    # (use_mcore_fsdp / FSDP > 0), the user asks for it too (--megatron-fsdp), as the recipe's choice of sharding mode.
    free = search(model, cluster, c["gpus"], cal, Pins(**base, megatron_fsdp=c["fsdp"]), keep=400)
    t1 = time.perf_counter()
    target = (c["tp"], c["pp"], c["vp"], c["cp"])
    # Where the table left the vp out, any interleaving depth of NVIDIA's pipeline is its layout.
    key = _key if c["vp"] is not None else (lambda p: (p.tp, p.pp, None, p.cp))
    # Apart from the pipeline schedule: NVIDIA's (tp, pp, cp) among the first distinct (tp, pp, cp), as genconf lists
    # its alternatives (genconf.plan.search.SearchResult.alternatives), and the interleaving depth genconf ranks first
    # for that pipeline.
    order, rank, listed_rank, firsts, schedule_rank = ranking(free, key, target, lambda k: (k[0], k[1], k[3]))
    short = (c["tp"], c["pp"], c["cp"])
    best = order[0][1] if order else None
    nvidia = res.ranked[0] if feasible else None
    return {
        "label": c["label"], "file": c["file"], "gpu": c["gpu"], "gpus": c["gpus"], "task": c["task"],
        "precision": c["fp8_recipe"] or c["precision"], "nvidia": f"tp{c['tp']} pp{c['pp']} vp{c['vp']} cp{c['cp']} mbs{c['mbs']}",
        "pinned_feasible": feasible, "pinned_reason": reason[:200],
        "as_configured_feasible": ran_ok, "as_configured_reason": ran_reason[:200],
        "rank": rank, "in_top5": rank is not None and rank <= 5, "ranked_layouts": len(order),
        "listed_rank": listed_rank, "listed_in_top5": listed_rank is not None and listed_rank <= 5,
        "schedule_free_rank": schedule_rank,
        "schedule_free_in_top5": schedule_rank is not None and schedule_rank <= 5,
        "genconf_vp_for_nvidia_pipeline": firsts[short].plan.vp if short in firsts else None,
        "genconf_vp_tokens_per_s_per_gpu": round(firsts[short].cost.tokens_per_s_per_gpu, 1) if short in firsts else None,
        "genconf_best": (f"tp{best.plan.tp} pp{best.plan.pp} vp{best.plan.vp} cp{best.plan.cp} mbs{best.plan.mbs} "
                         f"z{best.plan.zero_stage} {best.plan.recompute}") if best else "-",
        "best_tokens_per_s_per_gpu": round(best.cost.tokens_per_s_per_gpu, 1) if best else None,
        "nvidia_tokens_per_s_per_gpu": round(nvidia.cost.tokens_per_s_per_gpu, 1) if nvidia else None,
        "seconds": round(t1 - t0, 3),
    }


def main() -> int:
    rows = [run_case(c) for c in cases()]
    n = len(rows)
    feasible = sum(r["pinned_feasible"] for r in rows)
    top5 = sum(r["in_top5"] for r in rows)
    top5_free = sum(r["schedule_free_in_top5"] for r in rows)
    listed5 = sum(r["listed_in_top5"] for r in rows)
    # NVIDIA's pipeline (tp, pp, cp) in the top 5 but its exact layout not: either genconf ranks another vp first for
    # that pipeline (its predicted gain over NVIDIA's layout as pinned, micro-batch and the rest searched), or it
    # ranks NVIDIA's vp first there and other pipelines' vp variants crowd the exact list.
    vp_rows = [r for r in rows if r["schedule_free_in_top5"] and not r["in_top5"]]
    other_vp = [r for r in vp_rows if r["genconf_vp_for_nvidia_pipeline"] != _int_vp(r["nvidia"])]
    vp_gaps = sorted(r["genconf_vp_tokens_per_s_per_gpu"] / r["nvidia_tokens_per_s_per_gpu"] - 1 for r in other_vp
                     if r["nvidia_tokens_per_s_per_gpu"])
    absent = sum(r["rank"] is None for r in rows)
    gaps = sorted(r["best_tokens_per_s_per_gpu"] / r["nvidia_tokens_per_s_per_gpu"] - 1 for r in rows
                  if r["best_tokens_per_s_per_gpu"] and r["nvidia_tokens_per_s_per_gpu"])
    within = {f"within_{p}pct": sum(g <= p / 100 for g in gaps) / len(gaps) for p in (3, 5, 10)} if gaps else {}
    known = [r for r in rows if r["as_configured_feasible"] is not None]
    ran_ok = sum(bool(r["as_configured_feasible"]) for r in known)
    summary = {"layouts": n, "pinned_feasible": feasible, "rejected": n - feasible,
               "as_configured": len(known), "as_configured_feasible": ran_ok, "in_top5": top5,
               "in_top5_fraction": top5 / n if n else None, "absent_from_ranked": absent,
               "listed_in_top5": listed5, "listed_in_top5_fraction": listed5 / n if n else None,
               "schedule_free_in_top5": top5_free, "pipeline_in_top5_layout_not": len(vp_rows),
               "vp_only_misses": len(vp_gaps),
               "vp_only_median_gain": vp_gaps[len(vp_gaps) // 2] if vp_gaps else None,
               "vp_only_max_gain": vp_gaps[-1] if vp_gaps else None,
               "median_gap_to_best": gaps[len(gaps) // 2] if gaps else None, **within}
    print(json.dumps(summary, indent=1))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "layouts.json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    lines = ["# Search: NVIDIA's hand-tuned dense layouts in genconf's ranking", "",
             "Command: `python benchmarks/layouts.py`. Each row: the model, GPUs, cluster, precision, global batch and",
             "sequence of a NeMo recommended config or a Megatron-Bridge performance-summary row (dense models, "
             "pre-training and SFT).", "",
             f"- layouts: **{n}**; feasible when pinned: **{feasible}** ({n - feasible} rejected)",
             f"- with the configuration's own recompute, activation offload, Megatron-FSDP and CUDA graphs typed "
             f"too (NeMo's recommended configs list them; a Megatron-Bridge row's preset from "
             f"benchmarks/bridge_dense_recipes.csv): **{ran_ok}** of {len(known)} feasible as they ran",
             f"- NVIDIA's exact layout (tp, pp, vp, cp) among the first 5 layouts genconf lists unpinned (the plan "
             f"and its alternatives: one entry per layout apart from its pipeline schedule, each at the vp genconf "
             f"ranks first for it, as `genconf --top 5` prints them): **{listed5}** ({listed5 / max(1, n):.0%})",
             f"- NVIDIA's (tp, pp, vp, cp) among genconf's first 5 distinct (tp, pp, vp, cp) candidates, where a "
             f"pipeline's vp variants each take a place: **{top5}** ({top5 / max(1, n):.0%}); "
             f"absent from the ranked candidates: {absent}",
             f"- apart from the pipeline schedule (one entry per tp x pp x cp, the interleaving depth genconf's own "
             f"pick), NVIDIA's (tp, pp, cp) in genconf's top 5: **{top5_free}** "
             f"({top5_free / max(1, n):.0%}); the first line counts the exact vp too. Of the "
             f"{len(vp_rows)} whose pipeline is in that top 5 and exact layout is not, genconf ranks another vp first "
             f"for NVIDIA's pipeline in {len(vp_gaps)} (predicted {summary['vp_only_median_gain'] or 0:.1%} faster than "
             f"NVIDIA's layout as pinned, median; max {summary['vp_only_max_gain'] or 0:.1%}) and NVIDIA's own vp first "
             f"in {len(vp_rows) - len(other_vp)}, where other pipelines' vp variants fill the exact top 5",
             f"- genconf's prediction for NVIDIA's layout against its own best: median gap "
             f"{summary['median_gap_to_best']:.1%}; within 3%: {summary.get('within_3pct', 0):.0%}, within 5%: "
             f"{summary.get('within_5pct', 0):.0%}, within 10%: {summary.get('within_10pct', 0):.0%} (the model's "
             f"median error on published runs is about 7%: below that, layouts are a tie to it)", "",
             "| row | GPU x n | precision | NVIDIA layout | pinned | listed | rank | genconf's best | tok/s/GPU best / NVIDIA's |",
             "|---|---|---|---|---|---:|---:|---|---|"]
    for r in rows:
        speeds = f"{r['best_tokens_per_s_per_gpu']} / {r['nvidia_tokens_per_s_per_gpu']}"
        lines.append(f"| {r['label']} | {r['gpu']} x {r['gpus']} | {r['precision']} | {r['nvidia']} | "
                     f"{'ok' if r['pinned_feasible'] else 'REJECTED: ' + r['pinned_reason'][:80]}"
                     f"{'' if r['as_configured_feasible'] in (None, True) else '; as configured REJECTED: ' + r['as_configured_reason'][:80]} | "
                     f"{r['listed_rank'] or '-'} | {r['rank'] or '-'} | {r['genconf_best']} | {speeds} |")
    (RESULTS / "layouts.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
