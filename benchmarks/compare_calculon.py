"""Side by side with a peer: genconf and the public Calculon predict the same published runs.

    git clone https://github.com/calculon-ai/calculon ~/src/calculon
    pip install numpy pandas psutil          # what Calculon imports
    python benchmarks/compare_calculon.py --calculon ~/src/calculon     # or CALCULON_DIR=~/src/calculon

Calculon (Isaev et al., SC'23, "Calculon: a methodology and tool for high-level co-design of systems and large
language models") is an analytic model of Megatron-style training. This script imports it from the user's
checkout (the copy in benchmarks/data/calculon_sources is what the tests run), turns every published run that
benchmarks/published.py loads into Calculon's three inputs (application, execution, system), runs it, and prints
beside it genconf's prediction for the same run (benchmarks/accuracy.py's predict()). Error = predicted / measured
tokens/s/GPU - 1. Writes benchmarks/results/compare_calculon.{md,json}.

"Both run" = genconf gives a prediction and Calculon computes one without saying the layout exceeds its memory
limit (as Calculon's own `llm` command reports such a layout as an error). Calculon's step time for the rows it
calls over memory is still printed, and summarised apart.

How a published run becomes Calculon's input (every choice):
- Rows Calculon cannot represent are listed with the reason: GPUs without a Calculon system file (it ships
  A100 80GB and H100 80GB SXM only), ZeRO-3 / FSDP parameter sharding (Calculon shards optimizer state and
  gradients only), context parallelism, mixture-of-experts, grouped-query attention (Calculon has multi-head and
  multi-query only; --gqa-as-mha prices it as multi-head, over-counting the K/V projections), optimizer or
  parameter offload (Calculon's offload streams blocks to a second memory tier; DeepSpeed runs Adam on the CPU),
  precisions other than BF16, FP16 and (on H100) FP8, LoRA fine-tuning (Calculon trains every weight).
- Application: hidden = h, attn_heads = a, attn_size = head dim d, num_blocks = layers, seq_size = sequence
  length, feedforward = f (GeLU) or 3f/2 (SwiGLU: fc1 h->2f plus fc2 f->h is 3hf weights and FLOPs, what
  Calculon's two-matrix MLP h->3f/2->h has). Calculon models the transformer blocks only: no embedding, output
  layer or loss, LayerNorm with biases and dropout always present; nothing is added for them.
- System: Calculon's own systems/a100_80g.json (the file its Korthikanti 2022 Table 5 validation uses) and
  systems/h100_80g_nvl8.json, unchanged except two facts of the row's cluster that those files state for a
  DGX: tier 0 (NVLink) size = GPUs per NVLink domain, tier 1 bandwidth = the cluster's inter-node Gb/s per GPU
  / 8 (DGX A100 25 GB/s and DGX H100 50 GB/s equal the files; Jean Zay's 4 x 100 Gb/s Omni-Path per 8 GPUs
  gives 6.25 GB/s).
- Network tiers: ranks are laid out TP innermost, then DP, then PP (Megatron's and Megatron-DeepSpeed's
  order); a dimension goes on tier 0 when it and every dimension inside it fit in one NVLink domain, else on
  tier 1. A dimension of size 1 takes the tier of Calculon's examples (TP 0, PP 1, DP 1).
- Execution: num_procs, tensor_par, pipeline_par, data_par, batch_size (global, sequences), microbatch_size,
  pipeline_interleaving = the published layout. datatype: BF16 and FP16 -> "float16" (the system files define
  only float16; both are 2 bytes at the same peak), FP8 -> "float8" (H100; Calculon then keeps every tensor in
  1 byte). optimizer_sharding = ZeRO-1/2 or Megatron's distributed optimizer (and DP > 1).
  tensor_par_comm_type = "rs_ag" with sequence parallelism, else "ar"; seq_par_ag_redo = sequence
  parallelism without full recompute (Megatron and Transformer Engine save the sharded input and all-gather it
  again for the weight gradient). activation_recompute: full -> "full", selective -> "attn_only" (Korthikanti
  2022's selective recompute, as Calculon's validation inputs do), none -> "none", except that on the
  Transformer Engine stack (layer_spec te: flash attention) none is "attn_only" too, because flash attention
  keeps no s x s scores and recomputes them in the backward pass, which is what "attn_only" prices.
  fused_activation, data_par_overlap = the te stack (TE's fused bias-GeLU; megatron-core's
  --overlap-grad-reduce); the older local-spec rows get neither, as in Calculon's own validation inputs.
  tensor_par_overlap = "ring" where the row overlaps TP communication (TE userbuffers' default ring-exchange),
  else "none". No offload, training = true.
- Knobs the source does not state (micro-batch, virtual stages, recompute; published.Run.unknown) are searched
  as benchmarks/accuracy.py searches them for genconf: micro-batch 1, 2, 4, 8; interleaving 1-4; none /
  selective / full; the fastest setting Calculon says fits in memory wins, else the fastest.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import logging
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
CLONE_HINT = "git clone https://github.com/calculon-ai/calculon"

# Calculon's system file per genconf GPU name (files in the checkout's systems/ folder).
SYSTEM_FILES = {"a100-80gb": "a100_80g.json", "h100-sxm": "h100_80g_nvl8.json"}
# Tiers of Calculon's examples for a dimension of size 1 (examples/3072_t4_p64_d12_mbs4_full.json).
DEFAULT_TIER = {"tp": 0, "pp": 1, "dp": 1}
RECOMPUTE = {"none": "none", "selective": "attn_only", "full": "full"}
# Calculon datatypes (the system files' keys) for genconf precisions; float8 only in the H100 file.
DATATYPE = {"bf16": "float16", "fp16": "float16", "fp8": "float8"}


class Unrepresentable(ValueError):
    """The run uses something Calculon has no input for."""


def unrepresentable_reasons(run, gqa_as_mha: bool = False) -> list[str]:
    """Why Calculon cannot be given this run (empty: it can)."""
    model, plan, gpu = run.model, run.plan, run.cluster.gpu.name
    why = []
    if gpu not in SYSTEM_FILES:
        why.append(f"no Calculon system file for {gpu} (it has A100 80GB and H100 80GB SXM)")
    if plan.zero_stage == 3:
        why.append(f"{plan.framework} ZeRO-3 parameter sharding (Calculon shards optimizer state and gradients only)")
    if plan.cp > 1:
        why.append(f"context parallelism cp={plan.cp}")
    if model.is_moe or plan.ep > 1:
        why.append("mixture-of-experts")
    g, a = model.num_query_groups, model.num_attention_heads
    if g not in (a, 1) and not gqa_as_mha:
        why.append(f"grouped-query attention ({g} KV heads of {a}; Calculon has multi-head or multi-query)")
    if plan.offload_optimizer or plan.offload_params:
        why.append("optimizer/parameter offload to the CPU")
    if plan.precision not in DATATYPE:
        why.append(f"precision {plan.precision} (Calculon's system files have float16 and, for H100, float8)")
    elif DATATYPE[plan.precision] == "float8" and gpu != "h100-sxm":
        why.append(f"FP8 on {gpu}")
    if plan.recompute not in RECOMPUTE:
        why.append(f"recompute {plan.recompute!r}")
    if plan.lora_rank:
        why.append("LoRA fine-tuning (Calculon trains every weight: no frozen base, no adapters)")
    return why


def application(model) -> dict:
    """Calculon's application JSON (its models/*.json keys) for a genconf ModelSpec."""
    ffn = model.ffn_hidden_size * 3 // 2 if model.gated else model.ffn_hidden_size
    return {"hidden": model.hidden_size, "feedforward": ffn, "seq_size": model.seq_length,
            "attn_heads": model.num_attention_heads, "attn_size": model.kv_channels, "num_blocks": model.num_layers}


def nvlink_domain(cluster) -> int:
    return cluster.nvlink_domain_gpus or cluster.gpus_per_node


def network_tiers(tp: int, pp: int, dp: int, domain_gpus: int) -> dict[str, int]:
    """Calculon network tier (0 NVLink, 1 inter-node) for each dimension, TP innermost, then DP, then PP."""
    tiers, inner = {}, 1
    for name, size in (("tp", tp), ("dp", dp), ("pp", pp)):
        inner *= size
        tiers[name] = DEFAULT_TIER[name] if size == 1 else 0 if inner <= domain_gpus else 1
    return tiers


def execution(run, mbs: int | None = None, vp: int | None = None, recompute: str | None = None) -> dict:
    """Calculon's execution JSON for a published run (knobs the run leaves unknown may be overridden)."""
    plan = run.plan
    mbs = plan.mbs if mbs is None else mbs
    vp = plan.vp if vp is None else vp
    recompute = plan.recompute if recompute is None else recompute
    te = plan.layer_spec == "te"
    calc_recompute = RECOMPUTE[recompute]
    if te and calc_recompute == "none":
        calc_recompute = "attn_only"  # flash attention: no s^2 scores kept, recomputed in backward
    sp = plan.sequence_parallel and plan.tp > 1
    tiers = network_tiers(plan.tp, plan.pp, plan.dp, nvlink_domain(run.cluster))
    return {
        "num_procs": plan.tp * plan.pp * plan.dp, "tensor_par": plan.tp, "pipeline_par": plan.pp,
        "data_par": plan.dp, "tensor_par_net": tiers["tp"], "pipeline_par_net": tiers["pp"],
        "data_par_net": tiers["dp"], "batch_size": plan.gbs, "microbatch_size": mbs,
        "datatype": DATATYPE[plan.precision],
        "fused_activation": te, "attention_type": "multiquery" if run.model.num_query_groups == 1 else "multihead",
        "activation_recompute": calc_recompute, "pipeline_interleaving": vp,
        "optimizer_sharding": plan.zero_stage in (1, 2) and plan.dp > 1,
        "tensor_par_comm_type": "rs_ag" if sp else "ar",
        "tensor_par_overlap": "ring" if plan.tp_comm_overlap and plan.tp > 1 else "none",
        "seq_par_ag_redo": sp and calc_recompute != "full",
        "data_par_overlap": te and plan.dp > 1,
        "weight_offload": False, "activations_offload": False, "optimizer_offload": False, "training": True,
    }


def system(run, calculon_dir: Path) -> dict:
    """Calculon's system JSON for the run's GPU, with the cluster's NVLink domain and inter-node bandwidth."""
    sys_json = json.loads((calculon_dir / "systems" / SYSTEM_FILES[run.cluster.gpu.name]).read_text())
    return with_cluster_network(sys_json, run.cluster)


def with_cluster_network(sys_json: dict, cluster) -> dict:
    out = copy.deepcopy(sys_json)
    out["networks"][0]["size"] = nvlink_domain(cluster)
    out["networks"][1]["bandwidth"] = cluster.ib_gbit_per_s_per_gpu / 8  # Gb/s -> GB/s per GPU
    return out


def variants(run):
    """(mbs, vp, recompute) settings to try: the published ones, and a search over what the source leaves out."""
    plan = run.plan
    mbss = [1, 2, 4, 8] if "mbs" in run.unknown else [plan.mbs]
    vps = [1, 2, 3, 4] if "vp" in run.unknown and plan.pp > 1 else [plan.vp]
    recomputes = ["none", "selective", "full"] if "recompute" in run.unknown else [plan.recompute]
    for mbs, vp, rc in itertools.product(mbss, vps, recomputes):
        if plan.gbs % (mbs * plan.dp):
            continue
        # Megatron's interleaved schedule needs the micro-batch count divisible by pp (as accuracy.py requires).
        if vp > 1 and (plan.gbs // (mbs * plan.dp)) % plan.pp:
            continue
        yield mbs, vp, rc


# --- the imperative part: Calculon, genconf, printing ---------------------------------------------------------


def load_calculon(path: str | None):
    """(calculon module, checkout dir, commit) or exit 2 with one line."""
    if not path:
        _die(f"no Calculon checkout given; get one with `{CLONE_HINT}` and pass --calculon DIR (or set CALCULON_DIR)")
    root = Path(path).expanduser().resolve()
    if not (root / "calculon" / "llm" / "llm.py").is_file() or not (root / "systems").is_dir():
        _die(f"{root} is not a Calculon checkout (no calculon/llm/llm.py or systems/); get one with `{CLONE_HINT}`")
    sys.path.insert(0, str(root))
    try:
        import calculon  # the user's checkout; its package imports calculon.llm
    except ImportError as exc:
        _die(f"Calculon at {root} could not be imported ({exc}); install what it imports: pip install numpy pandas psutil")
    if not hasattr(calculon, "Llm") or not hasattr(calculon, "System"):
        _die(f"Calculon at {root} has no calculon.Llm / calculon.System; use a checkout of {CLONE_HINT.split()[-1]}")
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown (not a git checkout)"
    return calculon, root, commit


def _die(message: str):
    print(f"compare_calculon: {message}", file=sys.stderr)
    raise SystemExit(2)


def run_calculon(calculon, app: dict, exe: dict, sys_json: dict) -> dict:
    """Calculon's step time, tokens/s/GPU and memory for one input set; raises ValueError if it rejects them."""
    Llm = calculon.Llm
    log = logging.getLogger("calculon")
    try:
        model = Llm(Llm.Application(app), log)
        syst = calculon.System(sys_json)
        model.compile(syst, Llm.Execution.from_json(exe))
    except (AssertionError, Llm.Error) as exc:
        raise ValueError(f"Calculon rejects the layout: {exc or 'assertion failed'}") from None
    over_memory = False
    try:
        model.run(syst)
    except Llm.Error as exc:
        # run() prices the step, then checks capacity; only the capacity check raises Llm.Error.
        if not str(exc).startswith("Mem tier1"):
            raise ValueError(f"Calculon: {exc}") from None
        over_memory = True
    except AssertionError as exc:
        raise ValueError(f"Calculon sanity check failed: {exc or 'assertion'}") from None
    step_time_s = model.get_total_time()
    tokens = exe["batch_size"] * app["seq_size"] / step_time_s / exe["num_procs"]
    return {"step_time_s": step_time_s, "tokens_per_s_per_gpu": tokens,
            "mem_gib": model.get_mem_tier1_cap_req() / 2**30, "over_memory": over_memory}


def calculon_predict(calculon, root: Path, run) -> dict:
    """Best of the variants (fits first, then fastest), with the execution used."""
    app, sys_json = application(run.model), system(run, root)
    best, last_error = None, None
    for mbs, vp, rc in variants(run):
        exe = execution(run, mbs=mbs, vp=vp, recompute=rc)
        try:
            got = run_calculon(calculon, app, exe, sys_json)
        except ValueError as exc:
            last_error = str(exc)
            continue
        got["execution"] = exe
        key = (not got["over_memory"], got["tokens_per_s_per_gpu"])
        if best is None or key > best[0]:
            best = (key, got)
    if best is None:
        raise ValueError(last_error or "no valid variant")
    return best[1]


def genconf_predict(accuracy, run):
    """accuracy.predict for one run -> (tokens/s/GPU, peak GiB as the source measured it, plan) or None."""
    from genconf.catalog.hardware import calibration_for

    got = accuracy.predict(run, calibration_for(run.cluster.gpu.name))
    if got.tokens_per_s_per_gpu is None:
        return None
    return got.tokens_per_s_per_gpu, got.mem_gib, got.plan


def _med(values):
    return statistics.median(values) if values else None


def summarise(rows: list[dict]) -> dict:
    both = [r for r in rows if r["genconf_error"] is not None and not r["calculon_over_memory"]]
    ran = [r for r in rows if r["genconf_error"] is not None]
    out = {
        "rows_mapped": len(rows),
        "rows_both_run": len(both),
        "calculon_over_memory": sum(r["calculon_over_memory"] for r in rows),
        "genconf_no_prediction": sum(r["genconf_error"] is None for r in rows),
        "genconf_median_abs_error": _med([abs(r["genconf_error"]) for r in both]),
        "genconf_median_signed_error": _med([r["genconf_error"] for r in both]),
        "calculon_median_abs_error": _med([abs(r["calculon_error"]) for r in both]),
        "calculon_median_signed_error": _med([r["calculon_error"] for r in both]),
        # Calculon's step time where it says the layout does not fit, for what it is worth.
        "incl_over_memory_rows": len(ran),
        "incl_over_memory_genconf_median_abs_error": _med([abs(r["genconf_error"]) for r in ran]),
        "incl_over_memory_calculon_median_abs_error": _med([abs(r["calculon_error"]) for r in ran]),
        "per_file": {},
    }
    mem = [r for r in both if r["measured_mem_gib"] and r["genconf_mem_gib"] is not None]
    out["memory_rows"] = len(mem)
    out["genconf_median_abs_memory_error"] = _med([abs(r["genconf_mem_gib"] / r["measured_mem_gib"] - 1) for r in mem])
    out["calculon_median_abs_memory_error"] = _med([abs(r["calculon_mem_gib"] / r["measured_mem_gib"] - 1) for r in mem])
    for file in sorted({r["file"] for r in both}):
        sub = [r for r in both if r["file"] == file]
        out["per_file"][file] = {
            "rows": len(sub), "genconf_median_abs_error": _med([abs(r["genconf_error"]) for r in sub]),
            "calculon_median_abs_error": _med([abs(r["calculon_error"]) for r in sub])}
    g, c = out["genconf_median_abs_error"], out["calculon_median_abs_error"]
    out["gate_genconf_at_most_half_of_calculon"] = None if g is None or c is None else g <= 0.5 * c
    return out


def _pct(x, signed=True):
    return "-" if x is None else f"{x:+.1%}" if signed else f"{x:.1%}"


def _layout(exe: dict) -> str:
    return (f"tp{exe['tensor_par']} pp{exe['pipeline_par']} vp{exe['pipeline_interleaving']} dp{exe['data_par']} "
            f"mbs{exe['microbatch_size']} gbs{exe['batch_size']} {exe['activation_recompute']} "
            f"{exe['tensor_par_comm_type']}{' shard' if exe['optimizer_sharding'] else ''}")


def markdown(rows: list[dict], summ: dict, skipped: list[dict], commit: str) -> str:
    gate = summ["gate_genconf_at_most_half_of_calculon"]
    lines = [
        "# genconf vs Calculon on the shared published runs", "",
        "Command: `python benchmarks/compare_calculon.py --calculon DIR` with DIR a clone of "
        f"https://github.com/calculon-ai/calculon at commit `{commit}`. "
        "Error = predicted / measured tokens/s/GPU - 1. The input mapping is in the script's docstring. "
        "genconf's calibration (genconf/catalog/calibration.yaml) was fitted on these same published runs "
        "(`benchmarks/accuracy.py --fit`) and Calculon's system files were not, so genconf's figures here are "
        "in-sample; the issue's gate is measured on runs genconf has not seen.", "",
        f"- runs mapped to Calculon: {summ['rows_mapped']}; Calculon says over its memory limit: "
        f"{summ['calculon_over_memory']}; no genconf prediction: {summ['genconf_no_prediction']}; "
        f"skipped (Calculon cannot represent): {len(skipped)}",
        f"- **rows both run: {summ['rows_both_run']}**: median |error| genconf "
        f"**{_pct(summ['genconf_median_abs_error'], False)}**, Calculon **{_pct(summ['calculon_median_abs_error'], False)}**;"
        f" median signed error genconf {_pct(summ['genconf_median_signed_error'])}, Calculon "
        f"{_pct(summ['calculon_median_signed_error'])}",
        f"- gate (genconf's median |error| at most half of Calculon's): **{'PASS' if gate else 'FAIL' if gate is not None else 'n/a'}**",
        f"- including the rows Calculon calls over memory ({summ['incl_over_memory_rows']}): median |error| genconf "
        f"{_pct(summ['incl_over_memory_genconf_median_abs_error'], False)}, Calculon "
        f"{_pct(summ['incl_over_memory_calculon_median_abs_error'], False)}",
        f"- peak memory where the source measured it ({summ['memory_rows']} rows both run): median |error| genconf "
        f"{_pct(summ['genconf_median_abs_memory_error'], False)}, Calculon "
        f"{_pct(summ['calculon_median_abs_memory_error'], False)}", "",
        "| file | rows both run | genconf median abs err | Calculon median abs err |", "|---|---:|---:|---:|"]
    for file, s in summ["per_file"].items():
        lines.append(f"| {file} | {s['rows']} | {_pct(s['genconf_median_abs_error'], False)} | "
                     f"{_pct(s['calculon_median_abs_error'], False)} |")
    lines += ["", "| run | gpu | Calculon layout | measured tok/s/GPU | Calculon | err | genconf | err | "
              "Calculon GiB | over mem | measured GiB | genconf GiB |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
    for r in rows:
        gp = "-" if r["genconf_tokens_per_s_per_gpu"] is None else f"{r['genconf_tokens_per_s_per_gpu']:,.1f}"
        gm = "-" if r["genconf_mem_gib"] is None else f"{r['genconf_mem_gib']:.1f}"
        mm = "-" if r["measured_mem_gib"] is None else f"{r['measured_mem_gib']:g}"
        lines.append(
            f"| {r['run']} | {r['gpu']} | {r['calculon_layout']} | {r['measured_tokens_per_s_per_gpu']:,.1f} | "
            f"{r['calculon_tokens_per_s_per_gpu']:,.1f} | {_pct(r['calculon_error'])} | {gp} | "
            f"{_pct(r['genconf_error'])} | {r['calculon_mem_gib']:.1f} | {'yes' if r['calculon_over_memory'] else 'no'} | "
            f"{mm} | {gm} |")
    lines += ["", f"Runs Calculon is not given ({len(skipped)}):", ""]
    lines += [f"- {s['run']}: {s['reason']}" for s in skipped]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calculon", metavar="DIR", default=os.environ.get("CALCULON_DIR"),
                    help=f"a Calculon checkout ({CLONE_HINT}); default $CALCULON_DIR")
    ap.add_argument("--gqa-as-mha", action="store_true",
                    help="give Calculon grouped-query attention runs as multi-head (over-counts K/V projections)")
    ap.add_argument("--no-write", action="store_true", help="print only; do not write benchmarks/results")
    args = ap.parse_args(argv)
    calculon, root, commit = load_calculon(args.calculon)
    logging.getLogger("calculon").setLevel(logging.WARNING)

    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(HERE.parent))
    import accuracy
    from published import load_runs

    runs, _ = load_runs()
    rows, skipped = [], []
    for run in runs:
        name = f"{run.file.removesuffix('.csv')}: {run.label}"
        why = unrepresentable_reasons(run, args.gqa_as_mha)
        if why:
            skipped.append({"run": name, "reason": "; ".join(why)})
            continue
        try:
            calc = calculon_predict(calculon, root, run)
        except ValueError as exc:
            skipped.append({"run": name, "reason": str(exc)})
            continue
        got = genconf_predict(accuracy, run)
        measured = run.measured_tokens_per_s_per_gpu
        rows.append({
            "run": name, "file": run.file, "gpu": run.cluster.gpu.name,
            "calculon_layout": _layout(calc["execution"]), "calculon_execution": calc["execution"],
            "measured_tokens_per_s_per_gpu": round(measured, 2),
            "calculon_tokens_per_s_per_gpu": round(calc["tokens_per_s_per_gpu"], 2),
            "calculon_error": calc["tokens_per_s_per_gpu"] / measured - 1,
            "calculon_mem_gib": round(calc["mem_gib"], 2), "calculon_over_memory": calc["over_memory"],
            "genconf_tokens_per_s_per_gpu": None if got is None else round(got[0], 2),
            "genconf_error": None if got is None else got[0] / measured - 1,
            "genconf_mem_gib": None if got is None else round(got[1], 2),
            "genconf_layout": None if got is None else
            f"tp{got[2].tp} pp{got[2].pp} vp{got[2].vp} dp{got[2].dp} mbs{got[2].mbs} {got[2].recompute}",
            "measured_mem_gib": run.measured_mem_gib,
        })
    summ = summarise(rows)

    print(f"{'run':58s} {'measured':>9s} {'Calculon':>9s} {'err':>7s} {'genconf':>9s} {'err':>7s} {'Calc GiB':>8s} over-mem")
    for r in rows:
        gp = "-" if r["genconf_tokens_per_s_per_gpu"] is None else f"{r['genconf_tokens_per_s_per_gpu']:.1f}"
        print(f"{r['run'][:58]:58s} {r['measured_tokens_per_s_per_gpu']:9.1f} {r['calculon_tokens_per_s_per_gpu']:9.1f} "
              f"{_pct(r['calculon_error']):>7s} {gp:>9s} {_pct(r['genconf_error']):>7s} {r['calculon_mem_gib']:8.1f} "
              f"{'yes' if r['calculon_over_memory'] else 'no'}")
    for s in skipped:
        print(f"skipped {s['run']}: {s['reason']}")
    print(f"Calculon commit {commit}")
    print(f"rows both run: {summ['rows_both_run']} (mapped {summ['rows_mapped']}, Calculon over memory "
          f"{summ['calculon_over_memory']}, no genconf prediction {summ['genconf_no_prediction']}, "
          f"skipped {len(skipped)})")
    print(f"median |error|: genconf {_pct(summ['genconf_median_abs_error'], False)}, Calculon "
          f"{_pct(summ['calculon_median_abs_error'], False)}; median signed: genconf "
          f"{_pct(summ['genconf_median_signed_error'])}, Calculon {_pct(summ['calculon_median_signed_error'])}")
    print(f"peak memory, {summ['memory_rows']} measured rows: median |error| genconf "
          f"{_pct(summ['genconf_median_abs_memory_error'], False)}, Calculon "
          f"{_pct(summ['calculon_median_abs_memory_error'], False)}")
    gate = summ["gate_genconf_at_most_half_of_calculon"]
    print(f"gate genconf <= half of Calculon: {'PASS' if gate else 'FAIL' if gate is not None else 'n/a'}")
    if not args.no_write:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "compare_calculon.md").write_text(markdown(rows, summ, skipped, commit))
        (RESULTS / "compare_calculon.json").write_text(json.dumps(
            {"calculon_commit": commit, "gqa_as_mha": args.gqa_as_mha, "summary": summ, "rows": rows,
             "skipped": skipped}, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
