"""Write a plan's artifacts directory atomically (the imperative shell around genconf.render).

`genconf.render.files.render_all` turns one run dict (what `--json` prints) into file texts; `write_artifacts`
writes them into a temporary directory next to the target, checks it with `genconf.check`, and only then
moves it into place.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from genconf.catalog.files import resource_dir
from genconf.plan import planfile
from genconf.plan.errors import GenconfError
from genconf.render.files import render_all
from genconf.render.slurm import SlurmOptions
from genconf.run import leftovers


def default_options(run: dict, out_dir: Path, *, job_name: str | None = None, run_dir: str | None = None,
                    python: str | None = None, account: str | None = None, partition: str | None = None,
                    time: str | None = None) -> SlurmOptions:
    """SlurmOptions with genconf's defaults: job name genconf-<model>, run dir <DIR>/runs, this interpreter."""
    out_dir = Path(os.path.abspath(out_dir))
    run_path = os.path.abspath(run_dir) if run_dir else str(out_dir / "runs")
    try:
        return SlurmOptions(
            job_name=job_name or f"genconf-{run['model']['name']}", run_dir=run_path, artifacts_dir=str(out_dir),
            launchers_dir=str(resource_dir("launchers").resolve()),
            python=os.path.abspath(python) if python else sys.executable, account=account, partition=partition,
            time=time or "24:00:00")
    except (KeyError, TypeError) as exc:
        raise GenconfError(f"plan.json is missing {exc}") from None
    except ValueError as exc:
        raise GenconfError(str(exc)) from None


# --- writing --------------------------------------------------------------------------------------

def _is_artifacts_dir(path: Path) -> bool:
    return (path / "plan.json").is_file() or not any(path.iterdir())


def write_artifacts(out_dir: Path, files: dict[str, str], force: bool, *, run_dir: str | None = None) -> None:
    """Write `files` into `out_dir` all at once: render into a temporary sibling directory, check it, then
    rename it into place. With `force` the old directory is renamed aside first and deleted last; the
    directories in it (runs/, with logs and checkpoints) move over to the new one. On any error nothing is
    left behind and an old directory is back in place."""
    from genconf.check.directory import check_dir

    out_dir = Path(os.path.abspath(out_dir))
    # A SIGKILL mid-write leaves .NAME.tmp-* (and with --force .NAME.old-*) beside DIR: remove the ones older
    # than this process, name the ones that hold run data (issue 15 item 7).
    note = leftovers.clean(out_dir).note()
    if note:
        print(f"genconf: note: {note}", file=sys.stderr)
    if out_dir.exists() or out_dir.is_symlink():
        if not out_dir.is_dir() or out_dir.is_symlink():
            raise GenconfError(f"{out_dir} exists and is not a directory")
        if not force:
            raise GenconfError(f"{out_dir} exists; use --force to replace it")
        if not _is_artifacts_dir(out_dir):
            raise GenconfError(f"{out_dir} is not a genconf artifacts directory (no plan.json); not replacing it "
                               f"even with --force")
    parent = out_dir.parent
    created: list[Path] = []
    moved: list[str] = []
    tmp: Path | None = None
    old: Path | None = None
    try:
        for ancestor in reversed([parent, *parent.parents]):
            if not ancestor.exists():
                ancestor.mkdir()
                created.append(ancestor)
            elif not ancestor.is_dir():
                raise GenconfError(f"cannot write {out_dir}: {ancestor} is not a directory")
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-{leftovers.writer_tag()}-", dir=parent))
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp makes it private; the artifacts directory is an ordinary one
        for name, text in files.items():
            (tmp / name).write_text(text)
            if name.endswith(".sbatch"):
                (tmp / name).chmod(0o777 & ~umask)
        inside = _inside(run_dir, out_dir)
        if inside is not None:
            (tmp / inside / "logs").mkdir(parents=True, exist_ok=True)  # Slurm opens --output before the job runs
        problems = check_dir(tmp, rendered_for=out_dir).problems
        if problems:
            raise GenconfError(f"the rendered artifacts fail their own check: {problems[0]}")
        if out_dir.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-{leftovers.writer_tag()}-", dir=parent))
            old.rmdir()
            os.rename(out_dir, old)
            for child in sorted(old.iterdir()):
                if child.is_dir() and not child.is_symlink():
                    if (tmp / child.name).exists():
                        shutil.rmtree(tmp / child.name)  # only the empty runs/logs skeleton made above
                    os.rename(child, tmp / child.name)
                    moved.append(child.name)
        os.rename(tmp, out_dir)
        tmp = None
    except BaseException as exc:
        if old is not None and not out_dir.exists():
            for name in moved:
                os.rename(tmp / name, old / name)
            os.rename(old, out_dir)
            old = None
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        for path in reversed(created):
            try:
                path.rmdir()
            except OSError:
                pass
        if isinstance(exc, OSError):
            raise GenconfError(f"cannot write {out_dir}: {exc.strerror or exc}"
                               + (f" ({exc.filename})" if exc.filename else "")) from None
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _inside(run_dir: str | None, out_dir: Path) -> Path | None:
    """run_dir relative to out_dir when it lies inside it (then it is created with the artifacts)."""
    if run_dir is None:
        return None
    try:
        rel = Path(os.path.abspath(run_dir)).relative_to(out_dir)
    except ValueError:
        return None
    return rel if rel.parts else None


def write_from_run(run: dict, args: argparse.Namespace, source: str = "plan.json") -> Path:
    """Render and write a run dict's artifacts to args.output with the Slurm options from the command line
    (`source`: the file the run dict came from, for errors)."""
    from genconf.plan import rules

    refusal = rules.lora_artifacts_refusal(int(run.get("plan", {}).get("lora_rank") or 0))
    if refusal:
        raise GenconfError(refusal)  # before anything is written
    out_dir = Path(os.path.abspath(args.output))
    options = default_options(run, out_dir, job_name=args.job_name, run_dir=args.run_dir, python=args.python,
                              account=args.account, partition=args.partition, time=args.time)
    files = render_all(run, options, source)
    write_artifacts(out_dir, files, args.force, run_dir=options.run_dir)
    print(f"genconf: wrote {len(files)} files to {out_dir}", file=sys.stderr)
    return out_dir


def render_plan_file(args: argparse.Namespace) -> Path:
    """`genconf render PLAN.json -o DIR`: re-check the plan against the rule book, then write its artifacts."""
    from genconf.plan import rules
    from genconf.plan.memory import estimate

    run = planfile.load(args.plan)
    pf = planfile.decode(run, str(args.plan))
    model, cluster, plan = pf.model, pf.cluster, pf.plan
    ctx = rules.Context(model, cluster, plan, pf.num_gpus)
    errors = [v for v in rules.check(ctx) if v.severity == rules.ERROR]
    if not errors:
        too_big = rules.memory_violation(ctx, estimate(model, plan, cluster))
        errors += [too_big] if too_big is not None else []
    if errors:
        raise GenconfError(f"{args.plan}: {errors[0]}")
    return write_from_run(run, args, str(args.plan))
