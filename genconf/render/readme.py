"""The artifacts directory's README.md: which file matches the plan exactly and which is the nearest equivalent
(and how), why this plan, the memory and speed it promises, and the commands to check and launch it."""

from __future__ import annotations

from genconf import __version__
from genconf.plan.equivalent import equivalent_plan
from genconf.render.slurm import SlurmOptions, sbatch_job_name
from genconf.render.templates import comment, shquote

FILE_DESCRIPTIONS = {
    "plan.json": "the plan as `genconf --json` prints it; everything here is rendered from it",
    "ds_config.json": "DeepSpeed config (ZeRO, precision, optimizer, scheduler, clipping, profiling switches)",
    "megatron_args.txt": "Megatron-LM / megatron-core arguments, one `--flag value` per line",
    "olmo_fsdp.yaml": "OLMo trainer config (model shape, distributed strategy, FSDP sharding and wrapping)",
    "launch_megatron.sbatch": "Slurm script: torchrun on every node, Megatron entry point",
    "launch_deepspeed.sbatch": "Slurm script: torchrun on every node, DeepSpeed entry point",
    "launch_fsdp.sbatch": "Slurm script: torchrun on every node, OLMo-style FSDP entry point",
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


def context(run: dict, plan, options: SlurmOptions, files: dict[str, str]) -> dict:
    """The values templates/run_readme.md.j2 renders."""
    rows = [{"name": "plan.json", "what": FILE_DESCRIPTIONS["plan.json"], "match": "-"}]
    for name in files:
        if name in FRAMEWORK_OF:
            _, notes = equivalent_plan(plan, FRAMEWORK_OF[name])
            how = match(plan, FRAMEWORK_OF[name]) + (": " + "; ".join(notes) if notes else "")
            rows.append({"name": name, "what": FILE_DESCRIPTIONS[name], "match": how})
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
    return {
        "version": __version__, "model": run["model"], "cluster": run["cluster"], "plan": run["plan"],
        "layout": run["layout"], "why": run.get("why", []), "warnings": run.get("warnings", []), "files": rows,
        "memory": run["memory"], "perf": run["perf"], "train": run["train"], "training": run["training"],
        "log_dir": log_dir, "launch_commands": commands,
        "check_command": f"genconf check {artifacts} --slurm",
        "render_command": f"genconf render {shquote(options.artifacts_dir + '/plan.json')} -o {artifacts} --force",
        "job_name_note": job_note,
    }
