"""Every artifact of one plan, as file texts keyed by file name: what `genconf -o DIR` and `genconf render` write
(genconf.run.artifacts_dir writes them atomically)."""

from __future__ import annotations

import jinja2

from genconf import __version__
from genconf.plan import planfile
from genconf.plan.errors import GenconfError
from genconf.plan.specs import ParallelPlan
from genconf.render import deepspeed, megatron, olmo, readme, slurm
from genconf.render.templates import environment


def artifact_names(plan: ParallelPlan) -> tuple[str, ...]:
    """The files one plan renders to, plan.json first; launch_fsdp.sbatch only for FSDP plans."""
    names = ["plan.json", "ds_config.json", "megatron_args.txt", "olmo_fsdp.yaml", "launch_megatron.sbatch",
             "launch_deepspeed.sbatch"]
    if plan.framework == "fsdp":
        names.append("launch_fsdp.sbatch")
    return tuple(names + ["README.md"])


def render_all(run: dict, options: slurm.SlurmOptions) -> dict[str, str]:
    """Every artifact's text, keyed by file name, from one run dict."""
    pf = planfile.decode(run)
    model, cluster, plan, num_gpus, train = pf.model, pf.cluster, pf.plan, pf.num_gpus, pf.train
    try:
        settings = slurm.slurm_settings(cluster, plan, num_gpus, options)
        files = {
            "plan.json": planfile.dumps(run),
            "ds_config.json": planfile.dumps(deepspeed.deepspeed_config(model, plan, train)),
            "megatron_args.txt": megatron.megatron_args_text(megatron.megatron_args(model, plan, train)),
            "olmo_fsdp.yaml": olmo.olmo_yaml(olmo.olmo_config(model, plan, train, options.job_name), run["layout"]),
        }
    except ValueError as exc:
        raise GenconfError(str(exc)) from None
    env = environment()
    try:
        sbatch = env.get_template("launch.sbatch.j2")
        kinds = ["megatron", "deepspeed"] + (["fsdp"] if plan.framework == "fsdp" else [])
        for kind in kinds:
            files[f"launch_{kind}.sbatch"] = sbatch.render(
                title=f"{kind} launch script for {model.name} ({readme.match(plan, kind)})", version=__version__,
                layout=run["layout"], s=settings, kind=kind, entry=slurm.ENTRY_POINTS[kind], log_stem=kind,
                max_connections=kind == "megatron" and settings["megatron_max_connections"],
                literal_dollars=any(c in str(v) for v in settings.values() for c in "$`"))
        files["README.md"] = env.get_template("run_readme.md.j2").render(**readme.context(run, plan, options, files))
    except jinja2.TemplateError as exc:
        raise GenconfError(f"template error: {exc}") from None
    return files
