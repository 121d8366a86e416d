"""The artifacts directory's README.md: which file matches the plan exactly and which is the nearest equivalent
(and how), why this plan, the memory and speed it promises, and the commands to check and launch it."""

from __future__ import annotations

import dataclasses

from genconf import __version__
from genconf.plan.batch import describe_batch
from genconf.plan.equivalent import equivalent_plan
from genconf.plan.runconfig import unbuildable
from genconf.plan.specs import ModelSpec
from genconf.render.fidelity import FRAMEWORK_FILES
from genconf.render.fidelity import differences as differences_of
from genconf.render.slurm import ENTRY_POINTS, SlurmOptions, sbatch_job_name
from genconf.render.templates import comment, shquote

FILE_DESCRIPTIONS = {
    "plan.json": "the plan as `genconf --json` prints it; everything here is rendered from it",
    "ds_config.json": "DeepSpeed config (ZeRO, precision, optimizer, scheduler, clipping, profiling switches)",
    "megatron_args.txt": "Megatron-LM / megatron-core arguments, one `--flag value` per line",
    "olmo_fsdp.yaml": "OLMo trainer config (model shape, distributed strategy, FSDP sharding and wrapping)",
    "launch_megatron.sbatch": "Slurm script: torchrun on every node, Megatron entry point",
    "launch_deepspeed.sbatch": "Slurm script: torchrun on every node, DeepSpeed entry point",
    "launch_fsdp.sbatch": "Slurm script: torchrun on every node, OLMo-style FSDP entry point",
    "launch_env.sh": "the environment the Slurm scripts set, to source for a launch by hand (`. ./launch_env.sh megatron`)",
}
FRAMEWORK_OF = {"ds_config.json": "deepspeed", "megatron_args.txt": "megatron", "olmo_fsdp.yaml": "fsdp",
                "launch_megatron.sbatch": "megatron", "launch_deepspeed.sbatch": "deepspeed",
                "launch_fsdp.sbatch": "fsdp"}




def match(plan, framework: str) -> str:
    """How a framework's artifact relates to the plan, in a few words."""
    _, notes = equivalent_plan(plan, framework)
    if framework == plan.framework:
        return "the plan exactly"
    return f"the same layout in {framework}" if not notes else f"nearest {framework} equivalent"


def hand_launch(plan, options: SlurmOptions, settings: dict) -> dict:
    """What a launch without Slurm needs: the environment the sbatch scripts set (one row per variable) and the
    torchrun line each node runs after sourcing launch_env.sh."""
    env = [{"name": "GENCONF_JOB_NAME", "value": settings["job_name_given"],
            "why": "the job name as given (the #SBATCH line carries a plain-token copy)"}]
    env += [{"name": name, "value": value, "why": f"NCCL / InfiniBand setting of cluster {settings['cluster_name']}"}
            for name, value in settings["nccl_env"]]
    if settings["megatron_max_connections"]:
        env.append({"name": "CUDA_DEVICE_MAX_CONNECTIONS", "value": "1",
                    "why": "Megatron with tensor or context parallelism only: Megatron-LM's arguments.py asserts it "
                           "before Blackwell"})
    artifacts = shquote(options.artifacts_dir)
    torchrun = (f"{shquote(options.python)} -m torch.distributed.run --nnodes={settings['nodes']} "
                f"--nproc-per-node={settings['nproc_per_node']} --rdzv-backend=c10d "
                f'--rdzv-endpoint="$MASTER_ADDR:{settings["master_port"]}" --rdzv-id=genconf')
    entry = shquote(options.launchers_dir + "/" + ENTRY_POINTS[plan.framework])
    target = (f"--config {shquote(options.artifacts_dir + '/olmo_fsdp.yaml')}" if plan.framework == "fsdp"
              else f"--artifacts {artifacts}")
    commands = [f". {shquote(options.artifacts_dir + '/launch_env.sh')} {plan.framework}",
                f"{torchrun} \\\n    {entry} {target} --run-dir {shquote(options.run_dir)}"]
    return {"env": env, "commands": commands, "framework": plan.framework}


def context(run: dict, plan, options: SlurmOptions, files: dict[str, str], *, model: ModelSpec,
            settings: dict) -> dict:
    """The values templates/run_readme.md.j2 renders."""
    frameworks = ("megatron", "deepspeed", "fsdp")
    differences = differences_of(model, plan, frameworks)
    differing = {d.file for d in differences}
    rows = [{"name": "plan.json", "what": FILE_DESCRIPTIONS["plan.json"], "match": "-"}]
    for name in files:
        if name in FRAMEWORK_OF:
            framework = FRAMEWORK_OF[name]
            how = match(plan, framework)
            if FRAMEWORK_FILES[framework] in differing:
                how = ("the plan's layout exactly; the model as the format allows (see what differs)"
                       if framework == plan.framework else how + " (see what differs)")
            rows.append({"name": name, "what": FILE_DESCRIPTIONS[name], "match": how})
        elif name == "launch_env.sh":
            rows.append({"name": name, "what": FILE_DESCRIPTIONS[name], "match": "-"})
    if "olmo_fsdp.yaml" not in files:
        rows.append({"name": "olmo_fsdp.yaml", "what": FILE_DESCRIPTIONS["olmo_fsdp.yaml"],
                     "match": "not written (see what differs)"})
    log_dir = options.run_dir.rstrip("/") + "/logs"
    scripts = [n for n in files if n.endswith(".sbatch")]
    first = f"launch_{plan.framework}.sbatch"
    scripts.sort(key=lambda n: n != first)  # the plan's own framework first
    artifacts = shquote(options.artifacts_dir)
    commands = [f"mkdir -p {shquote(log_dir)}"]
    commands += [f"sbatch {shquote(options.artifacts_dir + '/' + name)}" + ("" if name == first else "   # alternative")
                 for name in scripts]
    job_note = ""
    if sbatch_job_name(options.job_name) != options.job_name:
        job_note = (f"The job name `{comment(options.job_name)}` was made a plain Slurm token for the `#SBATCH` line: "
                    f"`{sbatch_job_name(options.job_name)}`; the scripts export the original, quoted, "
                    f"as `GENCONF_JOB_NAME`.")
    batch = run.get("batch")
    return {
        "version": __version__, "model": run["model"], "cluster": run["cluster"], "plan": run["plan"],
        "layout": run["layout"], "why": run.get("why", []), "warnings": run.get("warnings", []), "files": rows,
        "memory": run["memory"], "perf": run["perf"], "train": run["train"], "training": run["training"],
        "batch_lines": describe_batch(batch) if batch else None,
        "differences": [dataclasses.asdict(d) for d in differences],
        "hand": hand_launch(plan, options, settings),
        "log_dir": log_dir, "launch_commands": commands,
        "check_command": f"genconf check {artifacts} --slurm",
        "render_command": f"genconf render {shquote(options.artifacts_dir + '/plan.json')} -o {artifacts} --force",
        "job_name_note": job_note,
        "pretrain_script": "pretrain_mamba.py" if model.is_hybrid else "pretrain_gpt.py",
        "runner_refusal": unbuildable(model, plan),
    }
