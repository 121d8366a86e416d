"""Every artifact of one plan, as file texts keyed by file name: what `genconf -o DIR` and `genconf render` write
(genconf.run.artifacts_dir writes them atomically)."""

from __future__ import annotations

import jinja2

from genconf import __version__
from genconf.plan import planfile
from genconf.plan.errors import GenconfError
from genconf.plan.specs import ModelSpec, ParallelPlan
from genconf.render import deepspeed, megatron, olmo, readme, slurm
from genconf.render.fidelity import olmo_config_omitted
from genconf.render.templates import environment


def artifact_names(plan: ParallelPlan, model: ModelSpec) -> tuple[str, ...]:
    """The files one plan renders to, plan.json first; launch_fsdp.sbatch only for FSDP plans; no olmo_fsdp.yaml (and
    so no launch_fsdp.sbatch) where the OLMo config cannot carry the model (fidelity.olmo_config_omitted); no
    launch_deepspeed.sbatch for a mixture of experts or a hybrid Mamba model (genconf's DeepSpeed runner builds dense
    GPT models only)."""
    olmo = olmo_config_omitted(model) is None
    names = ["plan.json", "ds_config.json", "megatron_args.txt"] + (["olmo_fsdp.yaml"] if olmo else [])
    names += ["launch_megatron.sbatch"] + ([] if model.is_moe or model.is_hybrid else ["launch_deepspeed.sbatch"])
    if plan.framework == "fsdp" and olmo:
        names.append("launch_fsdp.sbatch")
    return tuple(names + ["launch_env.sh", "README.md"])


def render_all(run: dict, options: slurm.SlurmOptions, source: str = "plan.json") -> dict[str, str]:
    """Every artifact's text, keyed by file name, from one run dict (`source`: the file it came from, for errors)."""
    pf = planfile.decode(run, source)
    # With what the file left out of the values genconf derives, as plan.json holds it (sorted keys): the README's
    # memory rows came in the estimate's order from -o DIR and in name order from `genconf render plan.json`.
    run = planfile.loads(planfile.dumps(pf.run), source)
    for key in PREDICTIONS:
        if not isinstance(run.get(key), dict):
            what = f"'{key}' is {type(run[key]).__name__}, not a JSON object" if key in run else f"is missing '{key}'"
            raise GenconfError(f"{source} {what}: the plan's predictions, which its README shows; render a plan "
                               f"genconf wrote (genconf ... --json, or -o DIR)")
    model, cluster, plan, num_gpus, train = pf.model, pf.cluster, pf.plan, pf.num_gpus, pf.train
    names = artifact_names(plan, model)
    try:
        settings = slurm.slurm_settings(cluster, plan, num_gpus, options)
        files = {
            "plan.json": planfile.dumps(run),
            "ds_config.json": planfile.dumps(deepspeed.deepspeed_config(model, plan, train)),
            "megatron_args.txt": megatron.megatron_args_text(megatron.megatron_args(model, plan, train)),
        }
        if "olmo_fsdp.yaml" in names:
            files["olmo_fsdp.yaml"] = olmo.olmo_yaml(olmo.olmo_config(model, plan, train, options.job_name), run["layout"])
    except ValueError as exc:
        raise GenconfError(str(exc)) from None
    env = environment()
    literal_dollars = any(c in str(v) for v in settings.values() for c in "$`")
    try:
        sbatch = env.get_template("launch.sbatch.j2")
        for kind in ("megatron", "deepspeed", "fsdp"):
            if f"launch_{kind}.sbatch" not in names:
                continue
            files[f"launch_{kind}.sbatch"] = sbatch.render(
                title=f"{kind} launch script for {model.name} ({readme.match(plan, kind)})", version=__version__,
                layout=run["layout"], s=settings, kind=kind, entry=slurm.ENTRY_POINTS[kind], log_stem=kind,
                max_connections=kind == "megatron" and settings["megatron_max_connections"],
                literal_dollars=literal_dollars)
        files["launch_env.sh"] = env.get_template("launch_env.sh.j2").render(
            version=__version__, layout=run["layout"], s=settings, plan_framework=plan.framework,
            literal_dollars=literal_dollars)
        files["README.md"] = env.get_template("run_readme.md.j2").render(
            **readme.context(run, plan, options, files, model=model, settings=settings))
    except jinja2.TemplateError as exc:
        raise GenconfError(f"template error: {exc}") from None
    except (TypeError, ValueError) as exc:  # a prediction of the wrong type, formatted by the README's template
        raise GenconfError(f"{source}'s {'/'.join(PREDICTIONS)} hold a value of the wrong type ({exc}): render a "
                           f"plan genconf wrote") from None
    return files


PREDICTIONS = ("memory", "perf", "training")
"""The run dict's predictions the run README's template reads (render_all checks them before rendering)."""
