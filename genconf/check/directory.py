"""`genconf check DIR`: every file of an artifacts directory, each by its own checker; files named relative to it."""

from __future__ import annotations

from pathlib import Path

from genconf.check.common import CheckResult, Problem
from genconf.check.deepspeed import check_ds_config
from genconf.check.megatron import check_megatron_args
from genconf.check.olmo import check_olmo
from genconf.check.plan import check_plan
from genconf.check.slurm import check_launch_env, check_sbatch, rendered_elsewhere, sbatch_test_only
from genconf.plan.errors import GenconfError
from genconf.render.fidelity import olmo_config_omitted
from genconf.render.files import artifact_names


def check_dir(path: Path, *, slurm: bool = False, rendered_for: Path | None = None,
              scripts: bool = True) -> CheckResult:
    """Every problem in an artifacts directory; files named relative to it. rendered_for: the directory the files
    are written for, where it is not `path` (genconf render checks a temporary copy before it moves it there).
    scripts=False leaves out the Slurm scripts and launch_env.sh (what a local launch does not run)."""
    path = Path(path)
    if not path.is_dir():
        raise GenconfError(f"{path} is not a directory")
    plan_file = path / "plan.json"
    if not plan_file.is_file():
        return CheckResult((), (Problem("plan.json", None, "missing: not a genconf artifacts directory"),))
    try:
        plan_text = plan_file.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        return CheckResult((), (Problem("plan.json", None, f"cannot read: {exc}"),))
    planned, problems = check_plan(plan_text)
    checked = ["plan.json"]
    if planned is None or problems:
        # Every other file derives from plan.json: with the plan itself broken there is nothing to hold them to.
        return CheckResult(tuple(checked), tuple(problems))
    names = artifact_names(planned.plan, planned.model)
    omitted = olmo_config_omitted(planned.model)
    if omitted and (path / "olmo_fsdp.yaml").exists():
        kind = "a dense model" if planned.model.is_moe else "a transformer without Mamba-2 layers"
        problems.append(Problem("olmo_fsdp.yaml", None, f"describes {kind}: {omitted.split(', so')[0]}; "
                                                        f"remove it (genconf does not write it for {planned.model.name})"))
    for name in names:
        if name in ("plan.json", "README.md") or (not scripts and (name.endswith(".sbatch") or name.endswith(".sh"))):
            continue
        file = path / name
        if not file.is_file():
            problems.append(Problem(name, None, "missing (re-render with genconf render)"))
            continue
        try:
            text = file.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(Problem(name, None, f"cannot read: {exc}"))
            continue
        checked.append(name)
        try:
            if name == "ds_config.json":
                problems += check_ds_config(text, planned)
            elif name == "megatron_args.txt":
                problems += check_megatron_args(text, planned)
            elif name == "olmo_fsdp.yaml":
                problems += check_olmo(text, planned)
            elif name == "launch_env.sh":
                problems += check_launch_env(text, planned)
            else:
                problems += check_sbatch(name, text, planned)
                elsewhere = rendered_elsewhere(name, text, rendered_for or path)
                problems += [elsewhere] if elsewhere else []
        except (ValueError, TypeError) as exc:
            problems.append(Problem(name, None, str(exc)))
        if slurm and name.endswith(".sbatch"):
            refusal = sbatch_test_only(file)
            if refusal is not None:
                problems.append(Problem(name, None, refusal))
    return CheckResult(tuple(checked), tuple(problems))
