"""Subcommand implementations (the imperative shell around the pure planner)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from genconf.catalog import track_record
from genconf.catalog.clusters import default_cluster_name, list_clusters, node_size_error, resolve_cluster_noted
from genconf.catalog.hardware import calibration_for, list_gpus
from genconf.catalog.models import list_models, model_aliases, resolve_model, resolve_model_noted
from genconf.cli import text
from genconf.cli.text import print_json
from genconf.plan import rules
from genconf.plan.errors import GenconfError, NoFeasiblePlan
from genconf.plan.search import describe


def dispatch(args: argparse.Namespace) -> int:
    handler = HANDLERS.get(args.command)
    if handler is None:
        raise GenconfError(f"unknown command {args.command!r}")
    return handler(args)


# --- plan -----------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Planned:
    """Everything one planning run produced."""

    model: object
    alias: str | None
    cluster: object
    num_gpus: int
    best: object
    result: object
    run: dict


def pins_from_args(args: argparse.Namespace):
    from genconf.plan.precision import plan_precision_of
    from genconf.plan.search import DEFAULT_LAYOUT, Pins

    precision, fp8_recipe = plan_precision_of(args.precision)
    if args.recompute_layers and args.recompute not in (None, "full"):
        raise GenconfError("--recompute-layers recomputes whole layers: it needs --recompute full")
    modules = tuple(m.strip() for m in (getattr(args, "recompute_modules", None) or "").split(",") if m.strip())
    if modules:
        from genconf.plan.specs import RECOMPUTE_MODULES

        unknown = [m for m in modules if m not in RECOMPUTE_MODULES]
        if unknown or len(set(modules)) != len(modules):
            raise GenconfError(f"--recompute-modules takes distinct names from {', '.join(RECOMPUTE_MODULES)}, "
                               f"got {','.join(modules)}")
        if args.recompute not in (None, "selective") or args.recompute_layers:
            raise GenconfError("--recompute-modules chooses what selective recompute repeats: it needs --recompute "
                               "selective")
    if args.fused_kernels and args.layer_spec != "local":
        raise GenconfError("--fused-kernels describes the local spec's kernels: add --layer-spec local")
    framework = args.framework
    if args.offload and getattr(args, "lora_rank", 0):
        # Each one's own fix ("choose --framework megatron", "use --framework deepspeed") led back to the other.
        raise GenconfError("--lora-rank is priced as Megatron-Bridge/NeMo run LoRA (framework megatron), --offload is "
                           "DeepSpeed's ZeRO-Offload: drop --lora-rank or --offload")
    if args.offload:  # ZeRO-Offload: the search plans DeepSpeed only (it was dropped from other frameworks' plans)
        if framework not in (None, "deepspeed"):
            raise GenconfError(f"--offload is DeepSpeed's ZeRO-Offload (optimizer states in host memory, parameters "
                               f"too at ZeRO-3): genconf plans no CPU offload for --framework {framework}; use "
                               f"--framework deepspeed")
        framework = "deepspeed"
    layout = getattr(args, "pp_layout", None)
    if layout is not None and layout != DEFAULT_LAYOUT:
        from genconf.plan.pipeline import parse_layout

        try:
            stages = len(parse_layout(layout))
        except ValueError as exc:
            raise GenconfError(f"--pp-layout: {exc}") from None
        if args.framework not in (None, "megatron"):
            raise GenconfError("--pp-layout is a megatron pipeline layout: it needs --framework megatron")
        if args.first_stage_layers or args.last_stage_layers:
            raise GenconfError("--pp-layout places every layer itself: drop --first-stage-layers/--last-stage-layers")
        if args.pp is not None and (args.pp < 2 or stages % args.pp):
            raise GenconfError(f"--pp-layout has {stages} virtual stages: --pp must be a divisor of it above 1, "
                               f"got {args.pp}")
        if args.pp is not None and args.vp is not None and args.vp != stages // args.pp:
            raise GenconfError(f"--pp-layout has {stages} virtual stages = pp {args.pp} x vp {stages // args.pp}, "
                               f"not --vp {args.vp} (megatron derives vp from the layout)")
    kernel = getattr(args, "attention_kernel", "auto")
    lora_rank = getattr(args, "lora_rank", 0) or 0
    conflict = (rules.attention_kernel_conflict(kernel, args.framework)
                or rules.fused_loss_conflict(getattr(args, "fused_loss", None), args.framework)
                or rules.lora_conflict(lora_rank, args.framework, False, args.zero)
                or (rules.lora_artifacts_refusal(lora_rank) if getattr(args, "output", None) else None))
    if conflict:
        raise GenconfError(conflict)
    targets = _lora_targets(getattr(args, "lora_targets", None), lora_rank)
    first, last = getattr(args, "bf16_first_layers", None), getattr(args, "bf16_last_layers", None)
    bf16_layers = None  # the recipe's default, on the plans that can have it (search._bf16_edges)
    if first is not None or last is not None:
        from genconf.plan.precision import bf16_edge_default

        default = bf16_edge_default(precision, fp8_recipe)
        bf16_layers = (default if first is None else first, default if last is None else last)
        if any(bf16_layers) and precision not in ("fp8", "fp4"):
            raise GenconfError(f"--bf16-first-layers/--bf16-last-layers keep layers out of FP8/FP4: they need an FP8 "
                               f"or FP4 --precision, got {args.precision}")
        if any(bf16_layers) and fp8_recipe == "delayed":
            raise GenconfError("delayed scaling does not support first / last layers in BF16 (megatron-core); use "
                               "--precision fp8-current")
    scopes = list(getattr(args, "cuda_graph_scope", ()) or ())
    repeated = sorted({s for s in scopes if scopes.count(s) > 1})
    if repeated:
        raise GenconfError(f"--cuda-graph-scope names {', '.join(repeated)} more than once")
    return Pins(framework=framework, tp=args.tp, pp=args.pp, vp=args.vp, cp=args.cp, ep=args.ep, etp=args.etp,
                mbs=args.mbs, gbs=args.global_batch, seq_length=args.seq_len,
                packed_doc_tokens=getattr(args, "packed_doc_len", None), zero_stage=args.zero,
                recompute="full" if args.recompute_layers else "selective" if modules else args.recompute,
                recompute_layers=args.recompute_layers, recompute_modules=modules,
                offload_activation_layers=args.offload_activations,
                precision=precision, fp8_recipe=fp8_recipe, grad_dtype=args.grad_dtype,
                fp8_param_gather=args.fp8_param_gather, precision_aware_optimizer=args.precision_aware_optimizer,
                adam_moments_dtype=args.adam_moments_dtype,
                layer_spec=args.layer_spec, offload=args.offload or None, fused_kernels=args.fused_kernels,
                grad_accum_fusion=getattr(args, "grad_accum_fusion", True),
                expandable_segments=args.expandable_segments, fused_loss=getattr(args, "fused_loss", None),
                attention_kernel=kernel,
                pp_first_stage_layers=args.first_stage_layers, pp_last_stage_layers=args.last_stage_layers,
                tp_comm_overlap=args.tp_comm_overlap, megatron_fsdp=bool(getattr(args, "megatron_fsdp", False)),
                moe_ep_overlap=bool(getattr(args, "moe_ep_overlap", False)),
                moe_dispatcher=getattr(args, "moe_dispatcher", "alltoall"),
                cuda_graph_impl=getattr(args, "cuda_graph_impl", "none"),
                cuda_graph_scope=tuple(getattr(args, "cuda_graph_scope", ()) or ()),
                pp_layout=layout, lora_rank=lora_rank, lora_targets=targets, bf16_layers=bf16_layers)


def _lora_targets(text: str | None, lora_rank: int) -> tuple[str, ...]:
    """--lora-targets as a tuple of distinct LORA_TARGETS names (all of them when not given)."""
    from genconf.plan.specs import LORA_TARGETS

    if text is None:
        return LORA_TARGETS
    targets = tuple(t.strip() for t in text.split(",") if t.strip())
    if not lora_rank:
        raise GenconfError("--lora-targets chooses where LoRA's adapters go: it needs --lora-rank")
    if not targets or len(set(targets)) != len(targets) or any(t not in LORA_TARGETS for t in targets):
        raise GenconfError(f"--lora-targets takes distinct names from {', '.join(LORA_TARGETS)}, got {text!r}")
    return targets


def _own_node_size(cluster: str, gpu: str | None) -> int | None:
    """The GPUs per node of `cluster` with `gpu` in it, as it comes; None where that GPU never comes in the cluster's
    node (8 GB200s on dgx-h100): --gpus-per-node then gives the node, and only the GPU's own sizes are allowed."""
    try:
        return resolve_cluster_noted(cluster, gpu=gpu)[0].gpus_per_node
    except GenconfError:
        return None


def plan_from_args(args: argparse.Namespace) -> Planned:
    """Resolve the model and cluster, search (or evaluate the pinned plan) and build the run dict."""
    from genconf.plan import planfile, rules
    from genconf.plan.counting import chinchilla_tokens
    from genconf.plan.precision import plan_precision_of
    from genconf.plan.search import plan_or_explain
    from genconf.plan.specs import quant_recipe_of

    model, alias, import_notes = resolve_model_noted(args.model)
    cluster, cluster_note = resolve_cluster_noted(args.cluster, gpu=args.gpu, gpus_per_node=args.gpus_per_node)
    # The cluster's own node counts too: a cluster file's 16-GPU node (where the refusal sends other nodes) with
    # --gpus-per-node 16, or 8 of it, was refused.
    own = _own_node_size(args.cluster, args.gpu) if args.gpus_per_node and args.cluster else None
    node = args.gpus_per_node and node_size_error(args.gpus_per_node, cluster.gpu, own)
    if node:
        raise GenconfError(node)
    num_gpus = args.gpus or cluster.total_gpus
    if num_gpus is None:
        raise GenconfError(f"cluster {cluster.name} has no default size: give --gpus")
    if cluster.total_gpus and num_gpus > cluster.total_gpus:
        # Planned as asked (a cluster of the same kind, larger), and said: the preset has fewer.
        more = (f"{cluster.name} has {cluster.total_gpus:,} GPUs: this plans {num_gpus:,} of the same kind "
                f"(a larger cluster of its nodes and network)")
        cluster_note = f"{cluster_note}; {more}" if cluster_note else more
    whole = rules.whole_nodes_error(num_gpus, cluster.gpus_per_node)
    if whole:
        if not args.gpus:  # the cluster's size, not a number the user gave
            per = cluster.gpus_per_node
            whole = (f"cluster {cluster.name} has {num_gpus:,} GPUs (its total_gpus), not a whole number of {per}-GPU "
                     f"nodes: give --gpus {num_gpus // per * per} or --gpus {-(-num_gpus // per) * per}")
        raise GenconfError(whole)
    if args.tp and args.tp > cluster.nvlink_domain:
        raise GenconfError(f"--tp {args.tp} is larger than a node: tensor parallelism must stay inside the "
                           f"{cluster.nvlink_domain}-GPU NVLink domain of {cluster.name}")
    # A precision the GPU's tensor cores cannot run, whatever the layout: said before a search (FP8 on 1,024 A100s
    # searched 8,000 candidates for 4 s, then ended "Nothing tried makes it valid" beside its own fix).
    precision, fp8_recipe = plan_precision_of(args.precision)
    cores = rules.gpu_precision_refusal(precision, quant_recipe_of(precision, fp8_recipe), cluster.gpu)
    if cores:
        raise GenconfError(cores)
    seq = args.seq_len or model.seq_length
    if args.cp and args.cp > 1 and seq % (2 * args.cp):
        below = next((c for c in range(args.cp - 1, 0, -1) if seq % (2 * c) == 0), 1)
        above = next((c for c in range(args.cp + 1, seq // 2 + 1) if seq % (2 * c) == 0), None)
        nearest = f"--cp {below}" + (f" or {above}" if above else "")
        if model.window_binds(seq):  # every cp > 1 breaks rules._cp_window next
            raise GenconfError(f"--cp {args.cp} does not divide the sequence ({seq}) into 2 x cp chunks, and "
                               f"{model.name}'s sliding window ({model.sliding_window:,} keys back) runs with no "
                               f"context parallelism here (rule cp_window): plan with --cp 1")
        raise GenconfError(f"--cp {args.cp} does not divide the sequence ({seq}) into 2 x cp chunks; use {nearest}, "
                           f"or a --seq-len divisible by {2 * args.cp}")
    if getattr(args, "packed_doc_len", None) and args.packed_doc_len > seq:
        raise GenconfError(f"--packed-doc-len {args.packed_doc_len} is longer than the sequence ({seq}): documents "
                           f"packed into a sequence are at most that long")
    _model_refusals(args, model)
    pins = pins_from_args(args)
    _pinned_split_fits(args, model)
    lora = rules.lora_conflict(pins.lora_rank, pins.framework, model.is_moe, pins.zero_stage, model.mla,
                               model.is_hybrid)
    if lora:
        raise GenconfError(lora)
    cal = calibration_for(cluster.gpu.name)
    used = None
    if getattr(args, "calibration", None):
        from genconf.catalog import calibration_file

        cf = calibration_file.read_file(args.calibration)
        cal = calibration_file.apply(cal, cf, cluster.gpu.name)
        used = {"file": cf.path, "source": cf.source, "gpu": cf.gpu, "measured_on": cf.environment.get("device"),
                "terms": cf.terms, "provenance": cf.provenance}
    result = plan_or_explain(model, cluster, num_gpus, cal, pins, keep=args.top)
    best = result.best
    tokens = args.tokens or float(chinchilla_tokens(model))
    run = planfile.encode(model, alias, cluster, num_gpus, best, result, tokens, cal=cal,
                          batch_source="--global-batch" if args.global_batch else "default")
    run["alternatives"] = run["alternatives"][: max(0, args.top - 1)]
    if cluster_note:
        run["cluster"]["note"] = cluster_note
    if args.seq_len:  # the import's note on the sequence it chose does not apply
        from genconf.catalog.hf import SEQ_NOTE_TAIL

        import_notes = tuple(n for n in import_notes if not n.endswith(SEQ_NOTE_TAIL))
    if import_notes:  # plans of catalog models stay byte-identical
        run["model"]["import_notes"] = list(import_notes)
    if used:  # plans with the built-in calibration stay byte-identical
        run["calibration"] = used
    if not best.plan.lora_rank:
        # The model's published runs against genconf's numbers (LoRA is another workload than the runs recorded).
        run["track_record"] = track_record.record_for(model, cluster.gpu.arch)
    return Planned(model, alias, cluster, num_gpus, best, result, run)


def _model_refusals(args: argparse.Namespace, model) -> None:
    """What the model alone rules out of the flags typed, before the flags' own checks (pins_from_args): their
    fixes ("choose --framework megatron", "use --zero 1", "use --framework deepspeed") met the model's refusal next."""
    from genconf.plan import rules

    lora = rules.lora_conflict(getattr(args, "lora_rank", 0) or 0, None, model.is_moe, None, model.mla, model.is_hybrid)
    if lora:
        raise GenconfError(lora)
    if not model.is_moe:
        # Each candidate broke the expert rule after other rules, so the line's example was another rule's
        # ("e.g. pipeline_split ..." for --ep 8 --first-stage-layers 2) and its fix met this one next.
        typed = [flag for flag, on in (("--ep", (args.ep or 1) > 1), ("--etp", args.etp is not None),
                                       ("--moe-ep-overlap", getattr(args, "moe_ep_overlap", False)),
                                       ("--moe-dispatcher", getattr(args, "moe_dispatcher", "alltoall") != "alltoall"))
                 if on]
        if typed:
            flags = ", ".join(typed[:-1]) + " and " + typed[-1] if len(typed) > 1 else typed[0]
            raise GenconfError(f"{flags} {'are' if len(typed) > 1 else 'is'} for mixture-of-experts models, and "
                               f"{model.name} has no experts: drop {flags}")
    if getattr(args, "layer_spec", "te") == "local" and args.framework in (None, "megatron"):
        # megatron-core builds MLA and the Mamba stack with Transformer Engine's layers only: every candidate broke
        # that rule after a search, which ended "Nothing tried makes it valid".
        local = rules.architecture_conflict(model, "megatron", "local")
        if local:
            raise GenconfError(f"{local}: drop --layer-spec local")
    offload = args.offload and rules.architecture_conflict(model, "deepspeed")
    if offload:  # --offload plans DeepSpeed only (pins_from_args), which cannot build this model
        typed = f" and --framework {args.framework}" if args.framework not in (None, "megatron") else ""
        raise GenconfError(f"--offload is DeepSpeed's ZeRO-Offload: {offload}; drop --offload{typed}")


def _pinned_split_fits(args: argparse.Namespace, model) -> None:
    """A pinned pipeline split (or block recompute) with more layers than the model, as one line naming the model's
    count (the search's own reason could be another framework's, when --framework was not pinned)."""
    from genconf.plan.pipeline import parse_layout
    from genconf.plan.search import DEFAULT_LAYOUT

    layout = getattr(args, "pp_layout", None)
    if layout is not None and layout != DEFAULT_LAYOUT:
        placed = sum(parse_layout(layout))  # pins_from_args parsed it
        if placed != model.num_layers:
            raise GenconfError(f"--pp-layout places {placed} layers, {model.name} has {model.num_layers}: write a "
                               f"layout with {model.num_layers} t's, or drop --pp-layout")
    first, last = args.first_stage_layers or 0, args.last_stage_layers or 0
    if max(first, last) >= model.num_layers or first + last > model.num_layers:
        given = " ".join(f"{flag} {n}" for flag, n in (("--first-stage-layers", first), ("--last-stage-layers", last))
                         if n)
        raise GenconfError(f"{given} leaves no layers for the other pipeline stages: {model.name} has "
                           f"{model.num_layers} layers; pin fewer")
    blocks = getattr(args, "recompute_layers", None)
    if blocks and model.is_hybrid:
        # The rule's own fix (rules.hybrid_conflict: "use --recompute selective or none") met --recompute-layers'
        # "it needs --recompute full": name the flag that asked for full recompute.
        typed = " and --recompute full" if args.recompute == "full" else ""
        raise GenconfError(f"--recompute-layers {blocks} is block recompute, a full recompute of whole layers, and "
                           f"{model.name}'s MambaStack has none (megatron-core): drop --recompute-layers{typed}")
    if blocks and blocks > model.num_layers:  # finer: rules._recompute, against the plan's model chunks
        raise GenconfError(f"--recompute-layers {blocks} is more than {model.name}'s {model.num_layers} layers: block "
                           f"recompute repeats at most a model chunk's layers (num_layers / (pp x vp)); pin fewer")


def check_slurm_flags(args: argparse.Namespace) -> None:
    """The Slurm flags' own checks (SlurmOptions), before planning: GenconfError naming the bad one."""
    from genconf.render.slurm import SlurmOptions

    try:
        SlurmOptions(job_name=getattr(args, "job_name", None) or "genconf", run_dir="/", artifacts_dir="/",
                     launchers_dir="/", python="/", account=getattr(args, "account", None),
                     partition=getattr(args, "partition", None), time=getattr(args, "time", None) or "24:00:00")
    except ValueError as exc:
        raise GenconfError(str(exc)) from None


def explain_dict(result) -> dict:
    """--json --explain: the search's candidates, rejections by rule and nearest misses."""
    return {"considered": result.considered, "rejected": result.rejected,
            "nearest_misses": [{"layout": describe(ev.plan), "reason": str(ev.errors[0])}
                               for ev in result.nearest_misses]}


def refuse_artifact_flags_without_output(args: argparse.Namespace) -> None:
    """--force, --account, --partition, --time, --job-name, --run-dir and --python say how -o writes the artifacts:
    without -o they were ignored in silence (the plan printed, no file written)."""
    if args.output:
        return
    given = [flag for flag, name in (("--force", "force"), ("--account", "account"), ("--partition", "partition"),
                                     ("--time", "time"), ("--job-name", "job_name"), ("--run-dir", "run_dir"),
                                     ("--python", "python"))
             if getattr(args, name, None)]
    if given:
        raise GenconfError(f"{'/'.join(given)} {'says' if len(given) == 1 else 'say'} how the artifacts are written: "
                           f"add -o DIR, or leave {'it' if len(given) == 1 else 'them'} out")


def cmd_plan(args: argparse.Namespace) -> int:
    check_slurm_flags(args)  # a bad --time or --account is an error with or without -o
    refuse_artifact_flags_without_output(args)
    if args.plot:
        from genconf.run import plots

        plots.require_matplotlib()  # before anything is written
        plots.check_plot_dir(args.plot)
    try:
        planned = plan_from_args(args)
    except NoFeasiblePlan as exc:
        if not (args.explain and exc.result is not None):
            raise
        # Asked for: what the search rejected and its nearest misses, after the one-line error.
        print(f"genconf: error: {exc}", file=sys.stderr)
        if args.json:
            print_json({"error": str(exc), "explain": explain_dict(exc.result)})
        else:
            print("\n".join(text.explain_lines(exc.result)[1:]))
        return 2
    if args.output:
        from genconf.run import artifacts_dir

        artifacts_dir.write_from_run(planned.run, args)
    if args.plot:
        from genconf.run import plots

        written = plots.plan_plots(planned.model, planned.best.plan, planned.cluster, args.plot)
        print(f"genconf: wrote {', '.join(str(p) for p in written)}", file=sys.stderr)
    if args.json:
        out = dict(planned.run)
        if args.explain:
            out["explain"] = explain_dict(planned.result)
        print_json(out)
    else:
        print(text.render_text(planned.run, planned.best, explain=planned.result if args.explain else None,
                               top=args.top))
        if "calibration" in planned.run:
            print(text.calibration_line(planned.run["calibration"]))
    return 0


# --- artifacts ------------------------------------------------------------------------------------

def cmd_render(args: argparse.Namespace) -> int:
    from genconf.run import artifacts_dir

    artifacts_dir.render_plan_file(args)
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from genconf.check.directory import check_dir

    result = check_dir(args.dir, slurm=args.slurm)
    for problem in result.problems:
        print(problem)
    if result.problems:
        return 2
    print(f"ok: {len(result.files)} files")
    return 0


# --- catalogs -------------------------------------------------------------------------------------

def cmd_models(args: argparse.Namespace) -> int:
    from genconf.plan.counting import exact_param_count

    if args.from_hf:
        from genconf.catalog import hf

        if args.json:
            raise GenconfError("--from-hf writes the model's catalog YAML, not JSON: drop --json")
        if args.force and not args.output:
            raise GenconfError("--force replaces an existing -o file: add -o OUT.yaml, or drop --force")
        return hf.write_catalog_yaml(args.from_hf, output=args.output, name=args.name, force=args.force)
    if args.output or args.name or args.force:
        raise GenconfError("-o/--name/--force go with --from-hf FILE")
    models = list_models()
    aliases = model_aliases()
    by_model = {}
    for alias, name in aliases.items():
        by_model.setdefault(name, []).append(alias)
    if args.json:
        print_json([dict(dataclasses.asdict(m), params=exact_param_count(m), aliases=by_model.get(m.name, []))
                    for m in models])
        return 0
    print(text.models_table(models, by_model))
    return 0


def cmd_hardware(args: argparse.Namespace) -> int:

    gpus, clusters = list_gpus(), list_clusters()
    if args.json:
        print_json({"gpus": [dataclasses.asdict(g) for g in gpus],
                    "clusters": [{"name": c.name, "gpu": c.gpu.name, "gpus_per_node": c.gpus_per_node,
                                  "nvlink_domain_gpus": c.nvlink_domain, "ib_gbit_per_s_per_gpu": c.ib_gbit_per_s_per_gpu,
                                  "total_gpus": c.total_gpus, "description": c.description} for c in clusters],
                    "default_cluster": default_cluster_name()})
        return 0
    print(text.hardware_table(gpus, clusters, default_cluster_name()))
    return 0


# --- launch and verify ----------------------------------------------------------------------------

def _launch_flag_conflicts(args: argparse.Namespace) -> None:
    """Flags that would be ignored together: each pair is one line, before anything starts."""
    if args.wait and not args.submit:
        raise GenconfError("--wait waits for a submitted job: add --submit (a local launch runs in the foreground)")
    if args.submit and (args.run_dir or args.name):
        raise GenconfError(f"--submit trains in the RUN_DIR its sbatch script was rendered with: drop "
                           f"{'--run-dir' if args.run_dir else '--name'}, or render the plan with --run-dir")
    if args.submit and args.force:
        raise GenconfError("--force overrides a local launch's CPU checks; a submitted job has none: drop it")
    if args.data_dtype and not args.data:  # it was ignored: the run trained on its synthetic tokens
        raise GenconfError(f"--data-dtype {args.data_dtype} is the dtype of a --data file: add --data FILE, or drop it")
    if args.run_dir and args.name:
        raise GenconfError("--name names a run under the artifacts' runs directory and --run-dir gives its whole "
                           "path: use one")
    if args.name and (args.name in (".", "..") or "/" in args.name):
        raise GenconfError(f"--name {args.name!r}: a run's name is one directory under the runs directory (no '/', "
                           f"not . or ..); give a path elsewhere with --run-dir")


def _resumes_this_plan(saved, artifacts, run_dir) -> None:
    """A --resume of a run planned from another directory whose plan differs is refused: the saved run is what
    trains, and the DIR given would be silently ignored."""
    from pathlib import Path

    from genconf.plan import runconfig

    if not saved.artifacts or Path(saved.artifacts).resolve() == Path(artifacts).resolve():
        return
    try:
        here = runconfig.from_artifacts(Path(artifacts), saved.shrink).plan  # shrunk as the run was
    except GenconfError:
        here = None
    if here is not None and here == saved.plan:
        return  # the same plan, from a copied or moved directory
    raise GenconfError(f"--resume: {run_dir} is a run of {saved.artifacts}, whose plan is not {artifacts}'s: give "
                       f"that directory (the saved run is what trains)")


def _checks_clean(artifacts, *, submit: bool) -> None:
    """genconf check's first problem, refused: a local launch trains plan.json, so a config file that contradicts it
    (a hand edit) would not take effect; a submitted job also runs DIR's Slurm scripts, which are checked too."""
    from pathlib import Path

    from genconf.check.directory import check_dir
    from genconf.check.slurm import rerender_command

    if not (Path(artifacts) / "plan.json").is_file():
        return  # read_plan's own message
    problems = check_dir(Path(artifacts), scripts=submit).problems
    if problems:
        more = f" (and {len(problems) - 1} more: genconf check {artifacts})" if len(problems) > 1 else ""
        trains = "a submitted job runs these files" if submit else "a local launch trains plan.json"
        raise GenconfError(f"{artifacts} does not check: {problems[0]}{more}; {trains}, so re-render them from it "
                           f"({rerender_command(Path(artifacts))}) or re-plan")


def cmd_launch(args: argparse.Namespace) -> int:
    import dataclasses as dc
    import shlex
    import time
    from pathlib import Path

    from genconf.plan import runconfig
    from genconf.run import launch, rank_signal

    artifacts = Path(args.dir)
    _launch_flag_conflicts(args)
    flags = {"layers": args.layers, "hidden": args.hidden, "heads": args.heads, "vocab": args.vocab,
             "seq_len": args.seq_len, "global_batch": args.global_batch, "mbs": args.mbs, "steps": args.steps,
             "lr": args.lr, "checkpoint_every": args.checkpoint_every, "keep_checkpoints": args.keep_checkpoints,
             "precision": args.precision}
    data = ({"kind": "memmap", "path": str(Path(args.data).resolve()), "dtype": args.data_dtype or "uint16"}
            if args.data else None)
    if args.submit:
        plan = runconfig.read_plan(artifacts).plan
        script = launch.sbatch_script(artifacts, args.framework or plan.framework)
        moved = launch.moved_since_render(artifacts, script)
        if moved:
            raise GenconfError(moved)
        run_dir = launch.script_run_dir(script)
    else:
        # Local runs go beside the script's: under the RUN_DIR it was rendered with (--run-dir at render time;
        # DIR/runs by default), one directory per run.
        if args.run_dir:
            run_dir = Path(args.run_dir)
        else:
            runs = artifacts / "runs"
            script = artifacts / f"launch_{args.framework or runconfig.read_plan(artifacts).plan.framework}.sbatch"
            if script.is_file():
                moved = launch.moved_since_render(artifacts, script)
                if moved:
                    raise GenconfError(f"{moved}, or give --run-dir")
                runs = launch.script_run_dir(script)
            if args.resume and not args.name:  # a new run's timestamp has nothing to resume
                saved = sorted(p.parent.name for p in runs.glob("*/config.json")) if runs.is_dir() else []
                raise GenconfError(f"--resume continues a saved run: give its --name under {runs} or its --run-dir"
                                   + (f" ({', '.join(saved[-3:])})" if saved else f" (none under {runs} yet)"))
            run_dir = runs / (args.name or time.strftime("%Y%m%d-%H%M%S"))
        if run_dir.exists() and not run_dir.is_dir():
            raise GenconfError(f"--run-dir {run_dir} is a file, not a run directory")
    speed = {"attention": args.attention, "compile": args.compile, "fused_optimizer": not args.no_fused_optimizer}
    defaults = {"attention": "auto", "compile": False, "fused_optimizer": True}
    speed = {k: v for k, v in speed.items() if v != defaults[k]}
    if args.resume:
        # The saved run is the run: the flags may extend it (--steps) or change its checkpoint policy; any other
        # flag must agree with it, and the artifacts directory's plan is not read again.
        if not (run_dir / "config.json").is_file():
            raise GenconfError(f"--resume: {run_dir} has no config.json (give the --run-dir of the run to resume)")
        saved = runconfig.RunConfig.from_dict(json.loads((run_dir / "config.json").read_text()))
        _resumes_this_plan(saved, artifacts, run_dir)
        cfg, notes = runconfig.resumed(saved, flags, data, args.framework)
        if speed:  # how kernels run (attention, compile, fused optimizer), not what the run is: the flags win
            cfg = dc.replace(cfg, speed=speed)
        done_steps = launch.check_resumable(run_dir, cfg, args.steps)
        for note in notes:
            print(f"genconf: {note}", file=sys.stderr)
    else:
        done_steps = 0
        _checks_clean(artifacts, submit=args.submit)
        cfg = dc.replace(launch.run_config_from_artifacts(artifacts, flags, data), speed=speed)
        if args.framework and args.framework != cfg.plan.framework:
            raise GenconfError(f"--framework {args.framework}: this directory's plan is a {cfg.plan.framework} plan; "
                               f"re-plan with --framework {args.framework} to get an exact {args.framework} layout")
        if not args.submit and run_dir.exists() and any(run_dir.iterdir()):
            raise GenconfError(f"{run_dir} already holds a run; use --resume to continue it or another --run-dir/--name")
        held = launch.earlier_run(run_dir) if args.submit else None
        if held:
            # The script's RUN_DIR is fixed when it is rendered: a second submission would start over there.
            raise GenconfError(f"{run_dir} (the sbatch script's RUN_DIR) already holds a run ({held}); use --resume to "
                               f"continue it, or render the plan again with another --run-dir")
    launch.check_data(cfg)
    if args.submit:
        return launch.submit(cfg, artifacts, wait=args.wait, resume=args.resume)
    launch.refuse_unrunnable(cfg)
    note = None if args.resume else launch.shrunk_batch_note(artifacts, cfg)
    if note:
        print(f"genconf: {note}", file=sys.stderr, flush=True)
    if not launch.cuda_available():
        launch.cpu_step_estimate(cfg, force=args.force, done_steps=done_steps)
    since = time.time()
    interrupts = rank_signal.Interrupts()
    rc = launch.launch_local(cfg, run_dir, resume=args.resume, interrupts=interrupts)
    hint = f"genconf launch {shlex.quote(str(artifacts))} --run-dir {shlex.quote(str(run_dir))} --resume"
    return launch.report_end(run_dir, rc, since=since, resume_hint=hint, interrupts=interrupts)


def cmd_verify(args: argparse.Namespace) -> int:
    from pathlib import Path

    from genconf.run import verify

    if args.plot:
        from genconf.run import plots

        plots.require_matplotlib()
        plots.check_plot_dir(args.plot)  # before the run is read and judged
    if args.tolerance is not None and not 0 <= args.tolerance < float("inf"):
        raise GenconfError(f"--tolerance {args.tolerance:g}: an absolute loss difference, 0 or more (and finite)")
    if args.min_drop is not None and not 0 <= args.min_drop < 1:
        raise GenconfError(f"--min-drop {args.min_drop:g}: a fraction of the first loss, from 0 to below 1")
    golden, tolerance = (Path(args.golden) if args.golden else None), args.tolerance
    if golden is None:
        found = verify.recipe_golden(Path(args.run))  # a recipe's smoke run: its own golden curve
        if found is not None:
            golden = found[0]
            tolerance = found[1] if tolerance is None else tolerance
            print(f"genconf: comparing with the recipe's golden curve {golden} (tolerance {tolerance:g})",
                  file=sys.stderr)
    verdict = verify.verify(Path(args.run), golden=golden, tolerance=tolerance, min_drop=args.min_drop)
    if args.plot:
        from genconf.run import plots

        written = plots.verify_plots(args.run, args.plot, golden=golden)
        print(f"genconf: wrote {', '.join(str(p) for p in written)}", file=sys.stderr)
    if args.json:
        print_json(verdict.to_dict())
    else:
        print(text.verdict_text(verdict))
    return 0 if verdict.ok else 1


# --- recipes --------------------------------------------------------------------------------------

def cmd_recipe(args: argparse.Namespace) -> int:
    from genconf.catalog import recipes
    from genconf.plan import planfile

    if not args.name:
        given = [flag for flag, value in (("--smoke", args.smoke), ("--json", args.json), ("-o", args.output),
                                          ("--force", args.force)) if value]
        if given:
            raise GenconfError(f"{'/'.join(given)} {'goes' if len(given) == 1 else 'go'} with one recipe: name it "
                               f"(genconf recipe NAME; 'genconf recipe' alone lists them)")
        for name in recipes.list_recipes():
            r = recipes.load_recipe(name)
            print(f"{name:<22} v{r.version}  {r.data.get('description', '')}")
        return 0
    refuse_artifact_flags_without_output(args)
    recipe = recipes.load_recipe(args.name)
    run = recipes.smoke_run(recipe) if args.smoke else recipes.full_run(recipe)
    if args.output:
        from genconf.run import artifacts_dir

        artifacts_dir.write_from_run(run, args)
    if args.json:
        print_json(run)
    else:
        from genconf.plan.search import evaluate

        pf = planfile.decode(run)
        best = evaluate(pf.model, pf.cluster, pf.plan, pf.num_gpus, calibration_for(pf.cluster.gpu.name),
                        check_rules=False)
        print(f"recipe   {recipe.name} v{recipe.version} ({recipe.path.name}): {recipe.data.get('description', '')}")
        print(f"         precision {run['recipe']['precision_recipe']}, {run['train']['train_steps']:,} steps, "
              f"lr {run['train']['lr']:g}, seed {run['train']['seed']}")
        print(text.render_text(run, best, top=args.top))
    return 0


def cmd_ci(args: argparse.Namespace) -> int:
    import os

    from genconf.catalog import recipes
    from genconf.run import ci

    if args.recipes_dir:
        if not os.path.isdir(args.recipes_dir):
            raise GenconfError(f"--recipes-dir {args.recipes_dir} is not a directory")
        os.environ[recipes.RECIPES_DIR_ENV] = os.path.abspath(args.recipes_dir)
    for flag, path in (("--work-dir", args.work_dir), ("--plot", args.plot)):  # before anything runs
        if path and os.path.exists(path) and not os.path.isdir(path):
            raise GenconfError(f"{flag} {path} is a file, not a directory")
    if args.plot:
        from genconf.run import plots

        plots.require_matplotlib()
    rows = ci.run(args.names, update_golden=args.update_golden, work_dir=args.work_dir, plot_dir=args.plot)
    if args.plot:
        print(f"genconf: wrote {sum(len(r.plots) for r in rows)} files to {args.plot}", file=sys.stderr)
    if args.json:
        print(json.dumps([r.__dict__ | {"ok": r.ok} for r in rows], indent=1, sort_keys=True))
    else:
        print(text.ci_table(rows))
    return 0 if all(r.ok for r in rows) else 1


def cmd_calibrate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from genconf.catalog import calibration_file
    from genconf.catalog.hardware import resolve_gpu
    from genconf.run import calibrate

    if args.bench == bool(args.runs):
        raise GenconfError("calibrate: give either --bench or run directories")
    # Each applies to one of the two only: silently dropped on the other.
    bench_only = [flag for flag, value in (("--nproc", args.nproc), ("--model", args.model), ("--tokens", args.tokens),
                                           ("--tp", args.tp)) if value is not None]
    if bench_only and not args.bench:
        raise GenconfError(f"{'/'.join(bench_only)} {'sets' if len(bench_only) == 1 else 'set'} up --bench's "
                           f"measurements; fitting run directories reads what the runs measured: drop "
                           f"{'it' if len(bench_only) == 1 else 'them'}, or calibrate with --bench")
    if args.terms is not None and args.bench:
        raise GenconfError("--terms chooses what run directories refit; --bench fits every term it measures: drop "
                           "--terms, or give run directories")
    out = Path(args.output)
    if out.is_dir():  # before a benchmark that may take minutes
        raise GenconfError(f"-o {out} is a directory: give the calibration file's path, such as "
                           f"{out / 'calibration.yaml'}")
    above = next(a for a in out.absolute().parents if a.exists())
    if not above.is_dir():
        raise GenconfError(f"cannot write {out}: {above} is not a directory")
    if out.exists() and not args.force:  # a GPU-measured calibration is not replaced unasked (as plan -o)
        raise GenconfError(f"{out} exists; use --force to replace it, or -o another file")
    if args.gpu:
        resolve_gpu(args.gpu)  # before a benchmark that may take minutes
    if args.bench and args.model:
        resolve_model(args.model)
    if args.bench:
        from genconf.catalog.hardware import gpu_for_device_name

        nproc = args.nproc or calibrate.default_nproc()
        tables = calibrate.run_bench(nproc=nproc, model=args.model, tokens=args.tokens, tp=args.tp)
        device = tables.get("environment", {}).get("device", "cpu")
        gpu = args.gpu or (gpu_for_device_name(device) if device != "cpu" else None)
        content = calibrate.fit_bench(tables, gpu)
    else:
        terms = [t.strip() for t in args.terms.split(",") if t.strip()] if args.terms else None
        content = calibrate.fit_runs(list(args.runs), gpu=args.gpu, terms=terms)
    calibration_file.write_file(args.output, content)
    print(text.calibrate_text(args.output, content))
    return 0


HANDLERS = {"plan": cmd_plan, "models": cmd_models, "hardware": cmd_hardware, "render": cmd_render, "check": cmd_check,
            "launch": cmd_launch, "verify": cmd_verify, "recipe": cmd_recipe, "ci": cmd_ci, "calibrate": cmd_calibrate}
"""Subcommand -> its implementation (the parser's subcommands, genconf.cli.parser.SUBCOMMANDS)."""
