"""Subcommand implementations (the imperative shell around the pure planner)."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from genconf import catalog
from genconf.errors import GenconfError


def register(sub: argparse._SubParsersAction) -> None:
    """Subcommands beyond plan/models/hardware register here as they are built."""
    from genconf.cli import add_artifact_arguments

    render = sub.add_parser("render", help="write a plan.json's artifacts (configs, Slurm scripts) to a directory")
    render.add_argument("plan", metavar="PLAN.json", help="a plan as `genconf --json` prints it")
    add_artifact_arguments(render, output_required=True)
    render.set_defaults(handler=cmd_render)
    check = sub.add_parser("check", help="re-validate an artifacts directory and name the offending lines")
    check.add_argument("dir", metavar="DIR", help="a directory written by genconf -o or genconf render")
    check.add_argument("--slurm", action="store_true", help="also ask Slurm (sbatch --test-only) about each script")
    check.set_defaults(handler=cmd_check)

    launch = sub.add_parser("launch", help="train the plan in an artifacts directory (torchrun, or Slurm with --submit)")
    launch.add_argument("dir", metavar="DIR", help="a directory written by genconf -o")
    launch.add_argument("--run-dir", help="where metrics, checkpoints and logs go (default: DIR/runs/<name>)")
    launch.add_argument("--name", help="run name under DIR/runs (default: a timestamp)")
    launch.add_argument("--framework", choices=("megatron", "deepspeed", "fsdp"),
                        help="run this framework's artifact (default: the plan's)")
    launch.add_argument("--submit", action="store_true", help="submit the generated sbatch script instead")
    launch.add_argument("--wait", action="store_true", help="with --submit: wait for the job and report its end")
    launch.add_argument("--resume", action="store_true", help="continue from the last checkpoint in the run directory")
    g = launch.add_argument_group("smoke test: shrink the model, keep the parallel layout")
    for flag, text in (("--layers", "transformer layers"), ("--hidden", "hidden size (MLP scaled alike)"),
                       ("--heads", "attention heads"), ("--vocab", "vocabulary size"), ("--seq-len", "sequence length"),
                       ("--global-batch", "global batch in sequences"), ("--mbs", "micro-batch size"),
                       ("--steps", "optimizer steps")):
        g.add_argument(flag, type=_positive, help=text)
    g.add_argument("--checkpoint-every", type=_positive, help="save a checkpoint every N steps")
    g.add_argument("--precision", choices=("bf16", "fp16", "fp8", "fp32"), help="run with another precision recipe")
    g.add_argument("--lr", type=float, help="peak learning rate (smoke tests of tiny models want ~1e-2)")
    g.add_argument("--data", help="a tokenized binary file (uint16 tokens; uint32 with --data-dtype)")
    g.add_argument("--data-dtype", choices=("uint16", "uint32"), default="uint16")
    g = launch.add_argument_group("speed on a GPU (FSDP and DeepSpeed runners; genconf.train.speed)")
    g.add_argument("--attention", choices=("auto", "flash", "cudnn", "efficient", "math"), default="auto",
                   help="scaled_dot_product_attention backend (default auto: torch picks flash/cuDNN on a GPU)")
    g.add_argument("--compile", action="store_true", help="torch.compile each decoder block (DDP and ZeRO 0-2)")
    g.add_argument("--no-fused-optimizer", action="store_true", help="plain torch AdamW instead of the fused one")
    launch.set_defaults(handler=cmd_launch)

    verify = sub.add_parser("verify", help="compare a run's loss, speed and memory with its expectations")
    verify.add_argument("run", metavar="RUN", help="a run directory (with metrics.jsonl)")
    verify.add_argument("--golden", help="golden loss file: 'step loss' per line")
    verify.add_argument("--tolerance", type=float, help="absolute loss tolerance against the golden file (default 1e-4)")
    verify.add_argument("--min-drop", type=float, help="without a golden file: also require the loss to fall by this "
                        "fraction (default: the statistical trend rule alone)")
    verify.add_argument("--json", action="store_true")
    verify.add_argument("--plot", metavar="DIR", help="draw verify.png (loss against the golden curve, tokens/s and peak "
                        "memory per step against the prediction) with its numbers in verify.csv (needs the plot extra)")
    verify.set_defaults(handler=cmd_verify)

    recipe = sub.add_parser("recipe", help="plan (and with -o render) a recipe from recipes/")
    recipe.add_argument("name", metavar="NAME", nargs="?", help="recipe name (omit to list them)")
    recipe.add_argument("--smoke", action="store_true", help="the recipe's CPU smoke variant instead of the full run")
    recipe.add_argument("--json", action="store_true")
    recipe.add_argument("--top", type=_positive, default=3)
    add_artifact_arguments(recipe, output_required=False)
    recipe.set_defaults(handler=cmd_recipe)

    ci = sub.add_parser("ci", help="run the recipes' smoke variants and verify them against their golden files")
    ci.add_argument("names", metavar="NAME", nargs="*", help="recipes to run (default: every recipe with a smoke variant)")
    ci.add_argument("--update-golden", metavar="NAME", help="rewrite NAME's golden file from a fresh run (shows the diff)")
    ci.add_argument("--work-dir", help="where the artifacts and runs go (default: a new temporary directory)")
    ci.add_argument("--recipes-dir", help="run the recipes of another folder (default: genconf's recipes/)")
    ci.add_argument("--json", action="store_true")
    ci.set_defaults(handler=cmd_ci)

    cal = sub.add_parser("calibrate", help="fit the cost model's terms to this machine's GPUs (--bench) or to measured runs")
    cal.add_argument("runs", metavar="RUN_DIR", nargs="*", help="run directories (metrics.jsonl, config.json, versions.json)")
    cal.add_argument("--bench", action="store_true", help="measure GEMMs, attention, bandwidth and collectives here")
    cal.add_argument("--nproc", type=_positive, help="ranks for --bench (default: every visible GPU, 1 on a CPU)")
    cal.add_argument("--model", default="1b", help="--bench: the model whose layer shapes to time (default 1b)")
    cal.add_argument("--tokens", type=_positive, help="--bench: tokens per micro-batch (default 8192; 128 on a CPU)")
    cal.add_argument("--tp", help="--bench: TP splits of the shapes, comma-separated (default 1,2,4,8)")
    cal.add_argument("--gpu", help="the catalog GPU to fit against (default: the device the bench or runs ran on)")
    cal.add_argument("--terms", help="runs: the terms to refit, comma-separated (default: those the runs inform)")
    cal.add_argument("-o", "--output", default="calibration.yaml", help="the calibration file (default calibration.yaml)")
    cal.set_defaults(handler=cmd_calibrate)


def _positive(text: str) -> int:
    from genconf.cli import _positive_int

    return _positive_int(text)


def dispatch(args: argparse.Namespace) -> int:
    handler = {"plan": cmd_plan, "models": cmd_models, "hardware": cmd_hardware}.get(args.command)
    if handler is None:
        handler = getattr(args, "handler", None)
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
    from genconf.search import Pins

    return Pins(framework=args.framework, tp=args.tp, pp=args.pp, vp=args.vp, cp=args.cp, ep=args.ep, mbs=args.mbs,
                gbs=args.global_batch, seq_length=args.seq_len, zero_stage=args.zero, recompute=args.recompute,
                precision=args.precision, layer_spec=args.layer_spec, offload=args.offload or None,
                pp_first_stage_layers=args.first_stage_layers, pp_last_stage_layers=args.last_stage_layers,
                tp_comm_overlap=args.tp_comm_overlap)


def plan_from_args(args: argparse.Namespace) -> Planned:
    """Resolve the model and cluster, search (or evaluate the pinned plan) and build the run dict."""
    from genconf import report, rules
    from genconf.counting import chinchilla_tokens
    from genconf.search import plan_or_explain

    model, alias = catalog.resolve_model(args.model)
    cluster = catalog.resolve_cluster(args.cluster, gpu=args.gpu, gpus_per_node=args.gpus_per_node)
    num_gpus = args.gpus or cluster.total_gpus
    if num_gpus is None:
        raise GenconfError(f"cluster {cluster.name} has no default size: give --gpus")
    whole = rules.whole_nodes_error(num_gpus, cluster.gpus_per_node)
    if whole:
        raise GenconfError(whole)
    if args.tp and args.tp > cluster.nvlink_domain:
        raise GenconfError(f"--tp {args.tp} is larger than a node: tensor parallelism must stay inside the "
                           f"{cluster.nvlink_domain}-GPU NVLink domain of {cluster.name}")
    seq = args.seq_len or model.seq_length
    if args.cp and seq % (2 * args.cp):
        raise GenconfError(f"--cp {args.cp} does not divide the sequence ({seq}) into 2 x cp chunks")
    pins = pins_from_args(args)
    cal = catalog.calibration_for(cluster.gpu.name)
    used = {"file": None, "terms": {}}
    if getattr(args, "calibration", None):
        from genconf import calibrate

        cf = calibrate.read_file(args.calibration)
        cal = calibrate.apply(cal, cf, cluster.gpu.name)
        used = {"file": cf.path, "source": cf.source, "gpu": cf.gpu, "measured_on": cf.environment.get("device"),
                "terms": cf.terms, "provenance": cf.provenance}
    result = plan_or_explain(model, cluster, num_gpus, cal, pins, keep=max(args.top, 10))
    best = result.best
    tokens = args.tokens or float(chinchilla_tokens(model))
    run = report.run_dict(model, alias, cluster, num_gpus, best, result, tokens)
    run["alternatives"] = run["alternatives"][: max(0, args.top - 1)]
    if used["file"]:  # plans with the built-in calibration stay byte-identical
        run["calibration"] = used
    return Planned(model, alias, cluster, num_gpus, best, result, run)


def cmd_plan(args: argparse.Namespace) -> int:
    from genconf import report
    from genconf.cli import print_json

    if args.plot:
        from genconf import plots

        plots.require_matplotlib()  # before anything is written
    planned = plan_from_args(args)
    if args.output:
        from genconf import artifacts

        artifacts.write_from_run(planned.run, args)
    if args.plot:
        from genconf import plots

        written = plots.plan_plots(planned.model, planned.best.plan, planned.cluster, args.plot)
        print(f"genconf: wrote {', '.join(str(p) for p in written)}", file=sys.stderr)
    if args.json:
        out = dict(planned.run)
        if args.explain:
            out["explain"] = {"considered": planned.result.considered, "rejected": planned.result.rejected,
                              "nearest_misses": [{"layout": report.describe(ev.plan), "reason": str(ev.errors[0])}
                                                 for ev in planned.result.nearest_misses]}
        print_json(out)
    else:
        print(report.render_text(planned.run, planned.best, explain=planned.result if args.explain else None,
                                 top=args.top))
        if "calibration" in planned.run:
            print(calibration_line(planned.run["calibration"], planned.cluster.gpu.name))
    return 0


def calibration_line(used: dict, gpu_name: str) -> str:
    """Which calibration the prediction used: the file's terms, or the built-in fractions for the GPU."""
    if not used.get("file"):
        return f"calibration  built-in (genconf/calibration.yaml, {gpu_name}); genconf calibrate fits one to your GPUs"
    terms = ", ".join(f"{k} {v:.4g}" for k, v in sorted(used["terms"].items())) or "no terms"
    return f"calibration  {used['file']} ({used['source']} on {used.get('measured_on') or '?'}): {terms}"


def cmd_calibrate(args: argparse.Namespace) -> int:
    from genconf import calibrate

    if args.bench == bool(args.runs):
        raise GenconfError("calibrate: give either --bench or run directories")
    if args.bench:
        from genconf.catalog import gpu_for_device_name

        nproc = args.nproc or calibrate.default_nproc()
        tables = calibrate.run_bench(nproc=nproc, model=args.model, tokens=args.tokens, tp=args.tp)
        device = tables.get("environment", {}).get("device", "cpu")
        gpu = args.gpu or (gpu_for_device_name(device) if device != "cpu" else None)
        content = calibrate.fit_bench(tables, gpu)
    else:
        terms = [t.strip() for t in args.terms.split(",") if t.strip()] if args.terms else None
        content = calibrate.fit_runs(list(args.runs), gpu=args.gpu, terms=terms)
    calibrate.write_file(args.output, content)
    terms = content.get("terms") or {}
    changed = ", ".join(f"{k} {v['before']:.4g} -> {v['value']:.4g}" for k, v in terms.items()) or "no terms fitted"
    print(f"genconf: wrote {args.output} ({content['source']}, gpu {content.get('gpu') or 'none'}): {changed}")
    for group, summary in (content.get("fit") or {}).items():
        edge = f"; at a bound: {', '.join(summary['at_bound'])}" if summary["at_bound"] else ""
        print(f"  {group}: {', '.join(summary['terms'])}: RMS error of log time {summary['before_log_rmse']:.3f} -> "
              f"{summary['after_log_rmse']:.3f}{edge}")
    for row in content.get("runs", []):
        print(f"  {row['run']}: step time measured {row['measured_step_time_s']:.4f} s, predicted "
              f"{row['predicted_step_time_s_before']:.4f} -> {row['predicted_step_time_s_after']:.4f} s")
    return 0


# --- artifacts ------------------------------------------------------------------------------------

def cmd_render(args: argparse.Namespace) -> int:
    from genconf import artifacts

    artifacts.render_plan_file(args)
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from genconf import check

    result = check.check_dir(args.dir, slurm=args.slurm)
    for problem in result.problems:
        print(problem)
    if result.problems:
        return 2
    print(f"ok: {len(result.files)} files")
    return 0


# --- catalogs -------------------------------------------------------------------------------------

def cmd_models(args: argparse.Namespace) -> int:
    from genconf.cli import print_json
    from genconf.counting import exact_param_count, human_count

    if args.from_hf:
        from genconf import hf

        return hf.write_catalog_yaml(args.from_hf, output=args.output, name=args.name, force=args.force)
    if args.output or args.name:
        raise GenconfError("-o/--name go with --from-hf FILE")
    models = catalog.list_models()
    aliases = catalog.model_aliases()
    by_model = {}
    for alias, name in aliases.items():
        by_model.setdefault(name, []).append(alias)
    if args.json:
        print_json([dict(dataclasses.asdict(m), params=exact_param_count(m), aliases=by_model.get(m.name, []))
                    for m in models])
        return 0
    print(f"{'name':<18}{'params':>10}{'layers':>8}{'hidden':>8}{'heads':>7}{'kv':>5}{'ffn':>8}{'vocab':>8}{'seq':>8}  "
          f"{'arch':<28}aliases")
    for m in sorted(models, key=exact_param_count):
        arch = f"{m.activation}/{m.normalization}/{m.position_embedding}" + (f"/moe{m.num_experts}x{m.moe_top_k}" if m.is_moe else "")
        print(f"{m.name:<18}{human_count(exact_param_count(m)):>10}{m.num_layers:>8}{m.hidden_size:>8}"
              f"{m.num_attention_heads:>7}{m.num_query_groups:>5}{m.ffn_hidden_size:>8}{m.vocab_size:>8}{m.seq_length:>8}  "
              f"{arch:<28}{', '.join(by_model.get(m.name, []))}")
    return 0


def cmd_hardware(args: argparse.Namespace) -> int:
    from genconf.cli import print_json

    gpus, clusters = catalog.list_gpus(), catalog.list_clusters()
    if args.json:
        print_json({"gpus": [dataclasses.asdict(g) for g in gpus],
                    "clusters": [{"name": c.name, "gpu": c.gpu.name, "gpus_per_node": c.gpus_per_node,
                                  "nvlink_domain_gpus": c.nvlink_domain, "ib_gbit_per_s_per_gpu": c.ib_gbit_per_s_per_gpu,
                                  "total_gpus": c.total_gpus, "description": c.description} for c in clusters],
                    "default_cluster": catalog.default_cluster_name()})
        return 0
    print("GPUs (dense peak TFLOP/s)")
    print(f"  {'name':<16}{'fp32':>7}{'tf32':>7}{'bf16':>8}{'fp8':>8}{'fp4':>8}{'HBM GiB':>9}{'TB/s':>6}{'NVLink GB/s':>12}  node sizes")
    for g in gpus:
        def fmt(v):
            return f"{v:g}" if v else "-"
        print(f"  {g.name:<16}{fmt(g.peak_fp32_tflops):>7}{fmt(g.peak_tf32_tflops):>7}{fmt(g.peak_bf16_tflops):>8}"
              f"{fmt(g.peak_fp8_tflops):>8}{fmt(g.peak_fp4_tflops):>8}{g.hbm_gib:>9g}{g.hbm_tbyte_per_s:>6g}"
              f"{g.nvlink_gbyte_per_s:>12g}  {'/'.join(map(str, g.node_sizes))}")
    print("\nclusters" + f" (default: {catalog.default_cluster_name()})")
    for c in clusters:
        size = f"{c.total_gpus} GPUs" if c.total_gpus else "any size"
        print(f"  {c.name:<18}{c.gpu.name:<16}{c.gpus_per_node}/node  NVLink domain {c.nvlink_domain:<3} "
              f"IB {c.ib_gbit_per_s_per_gpu:g} Gb/s/GPU  {size}")
    return 0


# --- launch and verify ----------------------------------------------------------------------------

def cmd_launch(args: argparse.Namespace) -> int:
    import dataclasses as dc
    import time
    from pathlib import Path

    from genconf import launch

    artifacts = Path(args.dir)
    shrink = {"layers": args.layers, "hidden": args.hidden, "heads": args.heads, "vocab": args.vocab,
              "seq_len": args.seq_len, "global_batch": args.global_batch, "mbs": args.mbs, "steps": args.steps,
              "lr": args.lr, "checkpoint_every": args.checkpoint_every, "precision": args.precision}
    data = {"kind": "memmap", "path": str(Path(args.data).resolve()), "dtype": args.data_dtype} if args.data else None
    cfg = launch.run_config_from_artifacts(artifacts, shrink, data)
    speed = {"attention": args.attention, "compile": args.compile, "fused_optimizer": not args.no_fused_optimizer}
    cfg = dc.replace(cfg, speed={k: v for k, v in speed.items() if v != {"attention": "auto", "compile": False,
                                                                           "fused_optimizer": True}[k]})
    if args.framework and args.framework != cfg.plan.framework:
        raise GenconfError(f"--framework {args.framework}: this directory's plan is a {cfg.plan.framework} plan; "
                           f"re-plan with --framework {args.framework} to get an exact {args.framework} layout")
    if args.submit:
        return launch.submit(cfg, artifacts, wait=args.wait)
    launch.refuse_unrunnable(cfg)
    run_dir = Path(args.run_dir) if args.run_dir else artifacts / "runs" / (args.name or time.strftime("%Y%m%d-%H%M%S"))
    if args.resume and not (run_dir / "config.json").is_file():
        raise GenconfError(f"--resume: {run_dir} has no config.json (give the --run-dir of the run to resume)")
    if args.resume:
        from genconf.train.runtime import RunConfig

        cfg = RunConfig.from_dict(__import__("json").loads((run_dir / "config.json").read_text()))
    elif run_dir.exists() and any(run_dir.iterdir()):
        raise GenconfError(f"{run_dir} already holds a run; use --resume to continue it or another --run-dir/--name")
    del dc
    rc = launch.launch_local(cfg, run_dir, resume=args.resume)
    if rc != 0:
        killed = " (a rank was killed: out of memory?)" if rc in (-9, 137) else ""
        raise GenconfError(f"training exited with code {rc}{killed}; see the output above (run directory {run_dir})")
    print(f"genconf: run finished: {run_dir}  (genconf verify {run_dir})")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from pathlib import Path

    from genconf import verify
    from genconf.cli import print_json

    if args.plot:
        from genconf import plots

        plots.require_matplotlib()
    verdict = verify.verify(Path(args.run), golden=Path(args.golden) if args.golden else None,
                            tolerance=args.tolerance, min_drop=args.min_drop)
    if args.plot:
        from genconf import plots

        written = plots.verify_plots(args.run, args.plot, golden=args.golden)
        print(f"genconf: wrote {', '.join(str(p) for p in written)}", file=sys.stderr)
    if args.json:
        print_json(verdict.to_dict())
    else:
        print(verify.render(verdict))
    return 0 if verdict.ok else 1


# --- recipes --------------------------------------------------------------------------------------

def cmd_recipe(args: argparse.Namespace) -> int:
    from genconf import recipes, report
    from genconf.cli import print_json

    if not args.name:
        for name in recipes.list_recipes():
            r = recipes.load_recipe(name)
            print(f"{name:<22} v{r.version}  {r.data.get('description', '')}")
        return 0
    recipe = recipes.load_recipe(args.name)
    run = recipes.smoke_run(recipe) if args.smoke else recipes.full_run(recipe)
    if args.output:
        from genconf import artifacts

        artifacts.write_from_run(run, args)
    if args.json:
        print_json(run)
    else:
        from genconf.search import evaluate
        from genconf.catalog import calibration_for

        model, cluster, plan, gpus = report.specs_from_dict(run)
        best = evaluate(model, cluster, plan, gpus, calibration_for(cluster.gpu.name), check_rules=False)
        print(f"recipe   {recipe.name} v{recipe.version} ({recipe.path.name}): {recipe.data.get('description', '')}")
        print(f"         precision {run['recipe']['precision_recipe']}, {run['train']['train_steps']:,} steps, "
              f"lr {run['train']['lr']:g}, seed {run['train']['seed']}")
        print(report.render_text(run, best, top=args.top))
    return 0


def cmd_ci(args: argparse.Namespace) -> int:
    import os

    from genconf import ci, recipes

    if args.recipes_dir:
        os.environ[recipes.RECIPES_DIR_ENV] = os.path.abspath(args.recipes_dir)
    return ci.main(args.names, update_golden=args.update_golden, as_json=args.json, work_dir=args.work_dir)
