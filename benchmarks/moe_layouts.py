"""Search benchmark for mixture-of-experts models: are NeMo's recommended MoE layouts feasible, and where does genconf
rank them?

    python benchmarks/moe_layouts.py        # writes benchmarks/results/moe_layouts.{md,json}

benchmarks/layouts.py checks the dense rows of nemo_recommended_configs_configonly.csv; this checks its MoE rows (NeMo
2.0's scripts/performance/recommended_model_configs at NVIDIA/NeMo@8cfedd72, configurations only, nothing measured)
whose model is in genconf's catalog, each with the model, GPU count, cluster, precision, global batch and sequence of
the row, three ways:
- pinned: the layout as NVIDIA typed it (tp, pp, vp, cp, ep, etp, mbs, and the pipeline split the row's recipe
  builds), the memory settings searched: is it feasible?
- as configured: also the recompute, activation offload and Megatron-FSDP the row lists, and the memory settings its
  NeMo 2.0 performance script sets (the precision-aware optimizer, TP communication overlap); feasible?
- unpinned: only model, GPUs, cluster, precision, batch and sequence given: where is NVIDIA's (tp, pp, vp, cp, ep)
  among genconf's ranked layouts?
All three are typed with the recipe's opt-in choices, which genconf never searches and a user reproducing the recipe
types: its token dispatcher, Adam's moment dtype and CUDA graphs (per-layer graphs roughly triple genconf's prediction
for Qwen3-30B-A3B at micro-batch 1, whose MoE layers are host-bound without them).
Rows of models genconf does not plan (vision-language and diffusion models, Llama 4's VLM among them) are listed with
the reason, not evaluated. Each recipe fact below is cited at NVIDIA/NeMo@8cfedd72 (the CSV's commit).
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

from layouts import CLUSTERS, ranking  # noqa: E402
from published import CATALOG_KEYS, DATA, SQUAD_DOC_TOKENS, _int, _model_key  # noqa: E402

from genconf.catalog.clusters import resolve_cluster  # noqa: E402
from genconf.catalog.hardware import calibration_for  # noqa: E402
from genconf.catalog.models import resolve_model  # noqa: E402
from genconf.plan.search import DEFAULT_LAYOUT, Pins, search  # noqa: E402
from genconf.plan.specs import RECOMPUTE_MODULES, ModelSpec  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
FILE = "nemo_recommended_configs_configonly.csv"
NEMO = "NVIDIA/NeMo@8cfedd72"
NOT_LLM = ("vlm_", "neva_", "flux_", "qwen25vl_")
"""Rows of vision-language (Llama 4 VLM, NeVA, Qwen2.5-VL) and diffusion (FLUX) models: genconf plans language models."""
MODELS = {"deepseek_v3": "deepseek-v3", "llama4_e16": "llama4-scout", "llama4_e128": "llama4-maverick"}
"""NeMo's model names beside published.CATALOG_KEYS (which spells DeepSeek-V3 as the Megatron-Bridge tables do).
Llama 4: recipes/llama4_e16.py:58 / llama4_e128.py:58 build gpt/model/llama.py:417 Llama4Experts16Config (Scout) and
:429 Llama4Experts128Config (Maverick), the catalog's two text decoders: 48 layers, vocab_size 25256 * 8 (:388; NeMo
keeps a preset vocabulary whatever the tokenizer, gpt/model/base.py:372-373, so the scripts' 200,000-token
NullTokenizer does not change it), 16 / 128 experts (:422, :434), Maverick's MoE every second layer (:436), sequence
8192 (:383) for pre-training and 4096 for the SFT (finetune_recipe's packed default, llama4_e128.py:309-310, :344)."""

DEEPSEEK_LAYOUTS = {
    # scripts/performance/llm/pretrain_deepseek_v3.py:97-105 map_pp_vp_to_layout, as genconf layout strings. The
    # recipe's one MTP layer (recipes/deepseek_v3.py:67 use_mtp True, :54 mtp_num_layers 1) is not in NeMo's lists:
    # megatron-core 0.13 builds it on the last pipeline stage (multi_token_prediction.py:247-253 at core_v0.13.0),
    # beside the loss ('m' before 'L' here). From 0.14 a layout must list it (pipeline_parallel_layer_layout.py:108-110
    # at core_v0.14.0), which these lists would fail.
    (4, 1): "Et*16|t*16|t*16|t*13mL",
    (8, 1): "Et*8|(t*8|)*6t*5mL", (4, 2): "Et*8|(t*8|)*6t*5mL",
    (16, 1): "Et*4|(t*4|)*14tmL", (8, 2): "Et*4|(t*4|)*14tmL", (4, 4): "Et*4|(t*4|)*14tmL",
}


def _model(row: dict) -> tuple[ModelSpec | None, str]:
    """The row's model as its recipe builds it, or None and why it is not evaluated ("" for a dense model, which
    benchmarks/layouts.py checks)."""
    key = _model_key(row["model"])
    if key.startswith(NOT_LLM):
        return None, "not a language model (vision-language or diffusion): genconf plans LLMs"
    name = MODELS.get(key) or CATALOG_KEYS.get(key)
    if name is None:
        return None, ""  # a dense model named by its architecture columns (benchmarks/layouts.py)
    model = resolve_model(name)[0]
    if not model.is_moe:
        return None, ""
    model = replace(model, seq_length=_int(row["seq_len"]))
    if key == "deepseek_v3" and "(sft)" in row["model"]:
        # finetune_deepseek_v3.py:61 finetune_recipe(...), whose model() has no MTP (recipes/deepseek_v3.py:38, :53)
        model = replace(model, mtp_num_layers=0)
    return model, ""


def _pp_layout(key: str, task: str, model: ModelSpec, pp: int, vp: int) -> str:
    """The pipeline split the row's recipe builds, as a layout string (DEFAULT_LAYOUT: megatron's own even split)."""
    if pp == 1:
        return DEFAULT_LAYOUT
    if key == "deepseek_v3" and task == "pretrain":
        return DEEPSEEK_LAYOUTS[(pp, vp)]
    stages = pp * vp
    if key == "deepseek_v3":
        # finetune_deepseek_v3.py:132-133: the loss counts as a layer, the embedding not: 61 + 1 over pp x vp stages.
        per, rest = divmod(model.num_layers + 1, stages)
        assert rest == 0 and per == 1, (pp, vp)
        return f"Et|(t|)*{stages - 2}L"
    if key == "qwen3_235b_a22b":
        # recipes/qwen3_235b_a22b.py:151-152: the embedding and the loss each count as a layer (94 + 2 = 96 slots).
        per, rest = divmod(model.num_layers + 2, stages)
        assert rest == 0, (pp, vp)
        edge = "t" * (per - 1)
        return f"E{edge}|" + f"{'t' * per}|" * (stages - 2) + f"{edge}L"
    # Llama 4 too: its recipes set no account_for_embedding / account_for_loss (recipes/llama4_e16.py:107-130,
    # llama4_e128.py:107-130), so megatron's even split: B200 Scout pp 2 x vp 24, 1 layer a chunk; Maverick
    # pp 2 x vp 12, 2 a chunk (one dense, one MoE).
    return DEFAULT_LAYOUT


def _recipe(key: str, task: str, row: dict, gpu: str, precision: str, tp: int) -> dict:
    """What the row's NeMo 2.0 performance script sets beyond the CSV's layout: `opt_in` (choices genconf never
    searches, typed in every search as a user reproducing the recipe would), `configured` (Pins fields of the memory
    and speed settings it ran with) and `unmodelled` (settings genconf has no field for, said in the output)."""
    notes = dict(re.findall(r"(\w+)=([\w./]*)", row["notes"]))
    opt_in: dict = {}
    unmodelled: list[str] = []
    # helpers.py:217-218 set_precision_configs: BF16 runs the precision-aware optimizer (TE FusedAdam); the Mixtral
    # recipes' own use_precision_aware_optimizer = False (mixtral_8x7b.py:237, mixtral_8x22b_64k.py:238) stays for FP8.
    pao = precision == "bf16"
    if key == "deepseek_v3" and task == "pretrain":
        # recipes/deepseek_v3.py:133-137: precision-aware optimizer with BF16 Adam moments (BF16 and FP8 alike)
        opt_in["adam_moments_dtype"] = "bf16"
        pao = True
    if key == "deepseek_v3" and gpu == "H100":
        # pretrain_deepseek_v3.py:78-83 / finetune_deepseek_v3.py:72-75: megatron's flex dispatcher with DeepEP on H100
        opt_in["moe_dispatcher"] = "deepep"
    elif key in ("deepseek_v3", "mixtral_8x7b", "mixtral_8x22b", "qwen3_30b_a3b", "qwen3_235b_a22b"):
        # alltoall (pretrain_deepseek_v3.py:85; gpt/model/mixtral.py:63; gpt/model/qwen3.py:64) with
        # MegatronTokenDropCallback: capacity factor 1.0, each expert's input padded to capacity
        # (callbacks/moe_token_drop.py defaults; pretrain_deepseek_v3.py:88-89, mixtral_8x7b.py:226,
        # mixtral_8x22b_64k.py:225, pretrain_qwen3_*.py:84/85). genconf prices dropless MoE with balanced routing:
        # every expert its balanced share, the padded capacity's work.
        unmodelled.append("token drop (capacity 1.0, padded): priced as balanced dropless routing")
    elif key.startswith("llama4") and task == "pretrain":
        # alltoall (gpt/model/llama.py:404) with MegatronTokenDropCallback in the pre-training performance recipes
        # (recipes/llama4_e16.py:240-249, llama4_e128.py:240-249: pretrain_llama4_e*.py:54 performance_mode). The SFT
        # recipe's performance mode adds no token drop (llama4_e128.py:397-410): dropless alltoall, as genconf prices.
        unmodelled.append("token drop (capacity 1.0, padded): priced as balanced dropless routing")
    if key.startswith("llama4"):
        # gpt/model/llama.py:407 moe_shared_expert_overlap True: megatron runs the shared expert while the routed
        # tokens are dispatched; genconf has no such overlap and prices the shared expert's GEMMs in the layer's time.
        unmodelled.append("shared-expert overlap with the token dispatch (moe_shared_expert_overlap): the shared "
                          "expert priced serially")
        if task == "sft":
            # finetune_llama4_e128.py:32-41 imports set_primary_perf_configs, get_user_configs and slurm_executor from
            # ..utils, which defines none of them at 8cfedd72: the script fails on import as committed. Typed as its
            # override_recipe_configs (:56-130) reads with helpers.py's set_primary_perf_configs.
            # recipes/llama4_e128.py:346-348: SQuAD packed into 4096-token sequences, each document attending within
            # itself: SQuAD's mean document (published.SQUAD_DOC_TOKENS), as benchmarks/layouts.py types NeMo's
            # dense SFT rows and accuracy.py NVIDIA's fine-tuning rows.
            opt_in["packed_doc_tokens"] = SQUAD_DOC_TOKENS
    layers = re.search(r"recompute_layers=(\d+)", row["recompute"])
    layers = int(layers.group(1)) if layers else 0
    modules = re.search(r"recompute_modules=([\w/]+)", row["recompute"])
    fields: dict = dict(zero_stage=3 if notes.get("use_mcore_fsdp") == "1" else 1,
                        offload_activation_layers=int(float(notes.get("activation_offload_layers") or 0)),
                        precision_aware_optimizer=pao,
                        # MegatronCommOverlapCallback's TP overlap: off unless asked for (megatron_comm_overlap.py:135);
                        # the Qwen3 scripts ask (pretrain_qwen3_*.py:85/86), and Llama 4's pre-training recipes
                        # (recipes/llama4_e16.py:236-239, llama4_e128.py:236-239); DeepSeek's sets False
                        # (deepseek_v3.py:146), and so does Llama 4's SFT (llama4_e128.py:397-402)
                        tp_comm_overlap=(key.startswith("qwen3") or (key.startswith("llama4") and task == "pretrain"))
                        if tp > 1 else None)
    if layers:
        fields.update(recompute="full", recompute_layers=layers)  # helpers.py:259-262: block, N layers
    elif key == "deepseek_v3" and task == "sft":
        fields.update(recompute="full", recompute_layers=None)  # finetune_deepseek_v3.py:128-130: uniform, 1 layer
    elif modules:
        # helpers.py:271-272 recompute_modules from the CSV (H100 DeepSeek-V3: mla_up_proj/mlp/moe). megatron's 'moe'
        # (the whole MoE layer) is not a module genconf prices: the others are typed, which keeps more memory.
        names = modules.group(1).split("/")
        kept = tuple(m for m in names if m in RECOMPUTE_MODULES)
        unmodelled += [f"recompute module {m!r} (not priced: genconf keeps its activations)" for m in names
                       if m not in RECOMPUTE_MODULES]
        fields.update(recompute="selective", recompute_modules=kept)
    else:
        # the perf scripts reset the recipes' recompute (pretrain_deepseek_v3.py:66-70, pretrain_qwen3_*.py:95/96);
        # the Mixtral and Llama 4 recipes set none, and Llama 4's scripts pass none (pretrain_llama4_e*.py:55-78) or
        # the CSV's, none listed for its rows (finetune_llama4_e128.py:99-100)
        fields.update(recompute="none")
    if str(notes.get("cuda_graphs", "0")).startswith("1"):
        # helpers.py:287 enable_cuda_graph: megatron-core's per-layer graphs (as benchmarks/layouts.py types them)
        opt_in.update(cuda_graph_impl="local", cuda_graph_scope=())
    return {"opt_in": opt_in, "configured": fields, "unmodelled": unmodelled}


def cases() -> tuple[list[dict], list[dict]]:
    """(MoE rows to evaluate, rows skipped with the reason)."""
    out, skipped = [], []
    with open(DATA / FILE) as f:
        for i, row in enumerate(csv.DictReader(f)):
            label = f"{row['model']} #{i}"
            model, why = _model(row)
            if model is None:
                if why:
                    skipped.append({"label": label, "gpu": row["gpu"], "reason": why})
                continue
            key = _model_key(row["model"])
            task = "sft" if "(sft)" in row["model"] else "pretrain"
            cluster = resolve_cluster(CLUSTERS[row["gpu"]])
            # benchmarks/layouts.py's reading of the same file: FP8 as per-tensor current scaling, as NeMo 25.04/25.07's
            # performance summaries ran it (the script's own default is delayed scaling: argument_parser.py:102-110),
            # with no BF16 end layers (helpers.py:226-228).
            precision = "fp8" if row["precision"] == "FP8" else "bf16"
            tp, pp, cp, ep = (_int(row[k]) or 1 for k in ("tp", "pp", "cp", "ep"))
            vp = _int(row["vp"]) or 1
            etp = re.search(r"etp=([\d.]*)", row["notes"]).group(1)
            recipe = _recipe(key, task, row, row["gpu"], precision, tp)
            out.append({"label": label, "key": key, "task": task, "gpu": cluster.gpu.name, "cluster": cluster,
                        "model": model, "gpus": _int(row["num_gpus"]), "tp": tp, "pp": pp, "vp": vp, "cp": cp, "ep": ep,
                        # a blank etp: megatron's default, the tensor-parallel degree
                        "etp": int(float(etp)) if etp else tp, "mbs": _int(row["mbs"]) or 1, "gbs": _int(row["gbs"]),
                        "precision": precision, "fp8_recipe": "current" if precision == "fp8" else None,
                        "pp_layout": _pp_layout(key, task, model, pp, vp), **recipe})
    return out, skipped


def _why(result) -> str:
    if result.ranked:
        return ""
    miss = result.nearest_misses[0] if result.nearest_misses else None
    return str(miss.errors[0]) if miss is not None and miss.errors else f"rejected: {result.rejected}"


def _key(plan) -> tuple:
    return (plan.tp, plan.pp, plan.vp, plan.cp, plan.ep)


def _describe(ev) -> str:
    p = ev.plan
    return (f"tp{p.tp} pp{p.pp} vp{p.vp} cp{p.cp} ep{p.ep} etp{p.expert_tp} mbs{p.mbs} z{p.zero_stage} {p.recompute}"
            + (f" {'+'.join(p.recompute_modules)}" if p.recompute_modules else "")
            + (f" offload{p.offload_activation_layers}" if p.offload_activation_layers else ""))


def _memory(ev) -> str:
    peak = ev.memory.peak
    return (f"stage {peak.stage}: {peak.total_bytes / 2**30:.1f} of {ev.memory.capacity_bytes / 2**30:.1f} GiB (params "
            f"{peak.params_bytes / 2**30:.1f} + grads {peak.grads_bytes / 2**30:.1f} + optimizer "
            f"{peak.optimizer_bytes / 2**30:.1f} + activations {peak.activations_bytes / 2**30:.1f} + other "
            f"{peak.other_bytes / 2**30:.1f})")


def free_pins(c: dict) -> Pins:
    """What every search is given: the row's batch, sequence and precision, the recipe's opt-in choices, and its
    gradients reduced in BF16 (helpers.py:234 grad_reduce_in_fp32 False)."""
    return Pins(gbs=c["gbs"], seq_length=c["model"].seq_length, precision=c["precision"], fp8_recipe=c["fp8_recipe"],
                grad_dtype="bf16", bf16_layers=(0, 0), **c["opt_in"])


def pinned_pins(c: dict) -> Pins:
    """The layout as NVIDIA typed it; memory settings left to the search."""
    return replace(free_pins(c), framework="megatron", tp=c["tp"], pp=c["pp"], vp=c["vp"], cp=c["cp"], ep=c["ep"],
                   etp=c["etp"], mbs=c["mbs"], pp_layout=c["pp_layout"])


def configured_pins(c: dict) -> Pins:
    """pinned_pins with the memory and speed settings the row ran with."""
    fields = dict(c["configured"])
    return replace(pinned_pins(c), megatron_fsdp=fields["zero_stage"] >= 2, **fields)


def run_case(c: dict, *, unpinned: bool = True) -> dict:
    model, cluster = c["model"], c["cluster"]
    cal = calibration_for(cluster.gpu.name)
    t0 = time.perf_counter()
    pinned = search(model, cluster, c["gpus"], cal, pinned_pins(c), keep=1)
    ran = search(model, cluster, c["gpus"], cal, configured_pins(c), keep=1)
    out = {"label": c["label"], "gpu": c["gpu"], "gpus": c["gpus"], "task": c["task"],
           "precision": c["fp8_recipe"] or c["precision"],
           "nvidia": f"tp{c['tp']} pp{c['pp']} vp{c['vp']} cp{c['cp']} ep{c['ep']} etp{c['etp']} mbs{c['mbs']}",
           "pp_layout": c["pp_layout"], "opt_in": {k: list(v) if isinstance(v, tuple) else v
                                                   for k, v in c["opt_in"].items()},
           "configured": {k: list(v) if isinstance(v, tuple) else v for k, v in c["configured"].items()},
           "unmodelled": c["unmodelled"],
           "pinned_feasible": bool(pinned.ranked), "pinned_reason": _why(pinned)[:300],
           "pinned_plan": _describe(pinned.ranked[0]) if pinned.ranked else None,
           "pinned_memory": _memory(pinned.ranked[0]) if pinned.ranked else None,
           "as_configured_feasible": bool(ran.ranked), "as_configured_reason": _why(ran)[:300],
           "as_configured_memory": _memory(ran.ranked[0]) if ran.ranked else None,
           "as_configured_tokens_per_s_per_gpu": round(ran.ranked[0].cost.tokens_per_s_per_gpu, 1) if ran.ranked else None}
    if unpinned:
        free = search(model, cluster, c["gpus"], cal, free_pins(c), keep=400)
        target = (c["tp"], c["pp"], c["vp"], c["cp"], c["ep"])
        # Apart from the schedule: NVIDIA's (tp, pp, cp, ep) among the first distinct (tp, pp, cp, ep).
        order, rank, listed_rank, _, schedule_rank = ranking(free, _key, target, lambda k: (k[0], k[1], k[3], k[4]))
        best = order[0][1] if order else None
        nvidia = pinned.ranked[0] if pinned.ranked else None
        own = next((ev for k, ev in order if k == target), None)
        out.update({
            # NVIDIA's degrees as the unpinned search ranks them: its own pipeline split and memory settings
            "unpinned_nvidia_degrees_tokens_per_s_per_gpu": round(own.cost.tokens_per_s_per_gpu, 1) if own else None,
            "unpinned_nvidia_degrees_layout": (own.plan.pp_layout or "megatron's split") if own else None,
            "rank": rank, "in_top5": rank is not None and rank <= 5, "ranked_layouts": len(order),
            "listed_rank": listed_rank, "listed_in_top5": listed_rank is not None and listed_rank <= 5,
            "schedule_free_rank": schedule_rank,
            "genconf_best": _describe(best) if best else "-",
            "best_tokens_per_s_per_gpu": round(best.cost.tokens_per_s_per_gpu, 1) if best else None,
            "nvidia_tokens_per_s_per_gpu": round(nvidia.cost.tokens_per_s_per_gpu, 1) if nvidia else None})
    out["seconds"] = round(time.perf_counter() - t0, 3)
    return out


def main() -> int:
    t0 = time.perf_counter()
    todo, skipped = cases()
    rows = [run_case(c) for c in todo]
    seconds = time.perf_counter() - t0
    n = len(rows)
    feasible = sum(r["pinned_feasible"] for r in rows)
    ran_ok = sum(r["as_configured_feasible"] for r in rows)
    listed5 = sum(r["listed_in_top5"] for r in rows)
    top5 = sum(r["in_top5"] for r in rows)
    free5 = sum(r["schedule_free_rank"] is not None and r["schedule_free_rank"] <= 5 for r in rows)
    absent = sum(r["rank"] is None for r in rows)
    gaps = sorted(r["best_tokens_per_s_per_gpu"] / r["nvidia_tokens_per_s_per_gpu"] - 1 for r in rows
                  if r["best_tokens_per_s_per_gpu"] and r["nvidia_tokens_per_s_per_gpu"])
    split_rows = [r for r in rows if r["unpinned_nvidia_degrees_tokens_per_s_per_gpu"] and r["nvidia_tokens_per_s_per_gpu"]
                  and r["unpinned_nvidia_degrees_tokens_per_s_per_gpu"] < 0.95 * r["nvidia_tokens_per_s_per_gpu"]]
    summary = {"moe_rows": n, "pinned_feasible": feasible, "pinned_rejected": n - feasible,
               "as_configured_feasible": ran_ok, "as_configured_rejected": n - ran_ok,
               "listed_in_top5": listed5, "in_top5": top5, "schedule_free_in_top5": free5,
               "absent_from_ranked": absent, "median_gap_to_best": gaps[len(gaps) // 2] if gaps else None,
               "skipped": len(skipped), "seconds": round(seconds, 1)}
    print(json.dumps(summary, indent=1))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "moe_layouts.json").write_text(json.dumps({"summary": summary, "rows": rows, "skipped": skipped},
                                                         indent=1) + "\n")
    lines = ["# Search: NVIDIA's recommended mixture-of-experts layouts in genconf", "",
             "Command: `python benchmarks/moe_layouts.py`. Each row: a MoE row of "
             "benchmarks/data/nemo_recommended_configs_configonly.csv (NeMo 2.0's recommended configs at "
             f"{NEMO}; configurations only, nothing measured) whose model is in genconf's catalog, with its model, "
             "GPUs, cluster, precision, global batch and sequence. The dense rows of the same file: "
             "benchmarks/results/layouts.md.", "",
             f"- MoE rows evaluated: **{n}**; feasible with the layout pinned (tp, pp, vp, cp, ep, etp, mbs and the "
             f"recipe's pipeline split; recompute and the rest searched): **{feasible}** ({n - feasible} rejected)",
             f"- feasible as configured (also the row's recompute, offload and Megatron-FSDP, and its script's "
             f"precision-aware optimizer and TP overlap): **{ran_ok}** ({n - ran_ok} rejected)",
             f"- NVIDIA's (tp, pp, vp, cp, ep) among the first 5 layouts genconf lists unpinned (`genconf --top 5`: the "
             f"plan and its alternatives): **{listed5}** of {n}; among the first 5 distinct (tp, pp, vp, cp, ep) "
             f"candidates: **{top5}**; NVIDIA's (tp, pp, cp, ep) among the first 5 apart from the pipeline schedule: "
             f"**{free5}**; absent from the ranked candidates: {absent}",
             f"- genconf's best against its prediction for NVIDIA's layout as pinned: median gap "
             f"{summary['median_gap_to_best'] or 0:.1%}",
             f"- run time: {seconds:.1f} s (all {n} rows, pinned and unpinned)",
             "- typed from each row's NeMo 2.0 performance script (cited in benchmarks/moe_layouts.py). In all three "
             "searches: CUDA graphs where the row lists them (megatron-core's per-layer graphs, as "
             "benchmarks/layouts.py types them), DeepSeek-V3's BF16 Adam moments and DeepEP on H100, no MTP layer for "
             "the DeepSeek-V3 SFT, Llama 4 e16 / e128 as the catalog's llama4-scout / llama4-maverick (its SFT at "
             "4,096 tokens), BF16 gradient reduction, FP8 as per-tensor current scaling with no BF16 end layers "
             "(as benchmarks/layouts.py; the script's own default is delayed scaling). Pinned and as configured: "
             "the recipe's pipeline split (DeepSeek-V3's layout map with its MTP layer beside the loss; the SFT "
             "script's loss counted as a layer; Qwen3-235B's embedding and loss counted as layers). As configured: "
             "the DeepSeek-V3 SFT's full recompute and H100 DeepSeek-V3's recompute modules; TP overlap on for the "
             "Qwen3 and Llama 4 pre-training scripts, off for Llama 4's SFT; Llama 4's SFT on SQuAD packed to 4,096 "
             "tokens, each document attending within itself (as benchmarks/layouts.py). Not modelled: the token-drop "
             "callback (capacity 1.0, padded) of the Mixtral, Qwen3, Llama 4 pre-training and Blackwell DeepSeek-V3 "
             "scripts (priced as balanced dropless routing), megatron's 'moe' recompute module (H100 DeepSeek-V3; "
             "its activations are kept) and Llama 4's shared-expert overlap with the token dispatch (priced serially); "
             "finetune_llama4_e128.py fails on import at that commit and is typed as its recipe overrides read",
             f"- NVIDIA's degrees predicted more than 5% slower with the pipeline split the unpinned search gives "
             f"them than with the recipe's: {len(split_rows)} rows"
             + "".join(f"; {r['label']} {r['unpinned_nvidia_degrees_tokens_per_s_per_gpu']} "
                       f"({r['unpinned_nvidia_degrees_layout']}) vs {r['nvidia_tokens_per_s_per_gpu']}"
                       for r in split_rows), "",
             "| row | GPU x n | precision | NVIDIA layout | pinned | as configured | listed | rank | genconf's best | "
             "tok/s/GPU: best / NVIDIA's pinned / as configured |",
             "|---|---|---|---|---|---|---:|---:|---|---|"]
    for r in rows:
        pinned = "ok" if r["pinned_feasible"] else "REJECTED: " + r["pinned_reason"][:120]
        ran = "ok" if r["as_configured_feasible"] else "REJECTED: " + r["as_configured_reason"][:120]
        lines.append(f"| {r['label']} | {r['gpu']} x {r['gpus']} | {r['precision']} | {r['nvidia']} | {pinned} | {ran} | "
                     f"{r['listed_rank'] or '-'} | {r['rank'] or '-'} | {r['genconf_best']} | "
                     f"{r['best_tokens_per_s_per_gpu']} / {r['nvidia_tokens_per_s_per_gpu']} / "
                     f"{r['as_configured_tokens_per_s_per_gpu']} |")
    lines += ["", "Peak memory of NVIDIA's layout as configured:", ""]
    lines += [f"- {r['label']} ({r['gpu']} x {r['gpus']}): {r['as_configured_memory'] or r['as_configured_reason']}"
              for r in rows]
    lines += ["", "Not evaluated:", ""]
    lines += [f"- {s['label']} ({s['gpu']}): {s['reason']}" for s in skipped]
    (RESULTS / "moe_layouts.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
