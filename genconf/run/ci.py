"""`genconf ci`: run every recipe's smoke variant (or those named) and verify each against its golden loss file
(genconf.cli.text.ci_table prints the table). `--update-golden NAME` rewrites a golden file on purpose and shows
the diff."""

from __future__ import annotations

import difflib
import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from genconf.catalog import recipes
from genconf.plan.errors import GenconfError
from genconf.run import launch, rank_signal, verify
from genconf.train import cpu_numerics

VERSION_KEYS = ("torch", "deepspeed", "megatron-core", "genconf")
SMOKE_LOSS_TOLERANCE = verify.SMOKE_LOSS_TOLERANCE  # defined beside the loss check (verify uses it for recipe runs)


@dataclass
class Row:
    recipe: str
    layout: str = "-"
    steps: int = 0
    final_loss: float | None = None
    golden_final: float | None = None
    throughput: str = "n/a"
    verdict: str = "FAIL"
    detail: str = ""
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    run_dir: str = ""
    plots: list[str] = field(default_factory=list)
    """With --plot: memory.png and schedule.png of the recipe's full-size plan, verify.png of its smoke run."""

    @property
    def ok(self) -> bool:
        return self.verdict == "PASS"


def golden_versions(path: Path) -> dict[str, str]:
    """The `# versions: torch=... deepspeed=...` header of a golden file."""
    for line in path.read_text().splitlines():
        if line.startswith("# versions:"):
            return dict(item.split("=", 1) for item in line.split(":", 1)[1].split())
    return {}


def version_mismatch(golden: Path, run: Path) -> list[str]:
    """Library versions that differ between the golden file and this run: reported, never hidden."""
    recorded = golden_versions(golden)
    current = json.loads((run / "versions.json").read_text()) if (run / "versions.json").is_file() else {}
    return [f"{k} {recorded.get(k)} (golden) vs {current.get(k)} (now)" for k in VERSION_KEYS
            if recorded.get(k) != str(current.get(k))]


def golden_cpu(path: Path) -> dict[str, str]:
    """The `# cpu: capability=AVX2 pins: A=x B=y; model: ...` header of a golden file (pins and capability)."""
    for line in path.read_text().splitlines():
        if line.startswith("# cpu:"):
            fields = line.split(":", 1)[1].split(";", 1)[0].split()
            return dict(item.split("=", 1) for item in fields if "=" in item)
    return {}


def cpu_mismatch(golden: Path, run: Path) -> list[str]:
    """CPU pins (genconf.train.cpu_numerics) that differ between the golden file and this run: reported, not failed
    (the curve is still held to the tolerance, which was measured across exactly such settings)."""
    recorded = golden_cpu(golden)
    versions = json.loads((run / "versions.json").read_text()) if (run / "versions.json").is_file() else {}
    now = dict(versions.get("cpu_pins") or {}, capability=versions.get("cpu_capability"))
    if not recorded or versions.get("device") != "cpu":
        return []
    return [f"cpu {k}={recorded[k]} (golden) vs {now.get(k)} (now)" for k in sorted(recorded)
            if str(now.get(k)) != recorded[k]]


def golden_text(recipe: recipes.Recipe, run: Path, layout: str) -> str:
    rows = verify.read_metrics(run)
    versions = json.loads((run / "versions.json").read_text())
    config = json.loads((run / "config.json").read_text())
    header = [f"golden loss curve of recipe {recipe.name} v{recipe.version}, smoke variant ({layout})",
              "versions: " + " ".join(f"{k}={versions.get(k)}" for k in VERSION_KEYS),
              f"device: {versions.get('device')}; precision: {config.get('precision_recipe')}; "
              f"written by: genconf ci --update-golden {recipe.name}"]
    if versions.get("device") == "cpu":
        header.append(f"cpu: capability={versions.get('cpu_capability')} "
                      f"{cpu_numerics.describe(versions.get('cpu_pins') or {})}; model: {versions.get('cpu_model')}")
    header.append("format: step loss")
    return "".join(f"# {h}\n" for h in header) + "".join(f"{r['step']} {r['loss']:.6f}\n" for r in rows)


def draw(recipe: recipes.Recipe, run_dir: Path, golden: Path | None, out: Path) -> list[str]:
    """The three pictures of a recipe: memory per stage and the pipeline schedule of its full-size plan (the peak
    stage and the bubble at scale), and its smoke run's loss, tokens/s and memory against the golden curve and the
    prediction (genconf.run.plots); with their CSVs."""
    from genconf.plan import planfile
    from genconf.run import plots

    full = recipes.full_run(recipe)
    pf = planfile.decode(full)
    written = plots.plan_plots(pf.model, pf.plan, pf.cluster, out, title=f"{recipe.name}: {full['layout']}")
    written += plots.verify_plots(run_dir, out, golden=golden)
    return [str(p) for p in written]


def run_one(name: str, work: Path, *, update_golden: bool = False, plot_dir: Path | None = None) -> Row:
    from genconf.render.files import render_all
    from genconf.run.artifacts_dir import default_options, write_artifacts

    start = time.monotonic()
    row = Row(recipe=name)
    try:
        recipe = recipes.load_recipe(name)  # a broken recipe is its own FAIL row, not the end of the run
        run = recipes.smoke_run(recipe)
        row.layout = run["layout"]
        artifacts = work / name
        options = default_options(run, artifacts)
        write_artifacts(artifacts, render_all(run, options), True, run_dir=options.run_dir)
        cfg = launch.run_config_from_artifacts(artifacts, {}, data=run["recipe"]["data"])
        launch.refuse_unrunnable(cfg)
        if not launch.cuda_available():
            launch.cpu_step_estimate(cfg, force=False)
        run_dir = artifacts / "runs" / "ci"
        if run_dir.exists():
            shutil.rmtree(run_dir)
        interrupts = rank_signal.Interrupts(at_once=True)
        rc = launch.launch_local(cfg, run_dir, resume=False, stdout=sys.stderr,  # stdout keeps the table/JSON
                                 interrupts=interrupts)
        if interrupts.terminated:
            print("genconf: terminated", file=sys.stderr, flush=True)
            raise SystemExit(launch.EXIT_TERMINATED)  # the ranks are gone
        if interrupts.any:
            raise KeyboardInterrupt  # the ranks are gone; genconf's main says so (exit 130)
        if rc != 0:
            raise GenconfError(f"training exited with code {rc} (log above; run directory {run_dir})")
        row.run_dir = str(run_dir)
        rows = verify.read_metrics(run_dir)
        row.steps, row.final_loss = len(rows), rows[-1]["loss"]
        expect = recipe.section("expect")
        golden = recipe.golden_path
        if update_golden:
            if golden is None:
                raise GenconfError(f"{recipe.path}: expect.golden names no file to update")
            new = golden_text(recipe, run_dir, row.layout)
            old = golden.read_text() if golden.is_file() else ""
            golden.parent.mkdir(parents=True, exist_ok=True)
            golden.write_text(new)
            diff = list(difflib.unified_diff(old.splitlines(), new.splitlines(), f"{golden.name} (old)",
                                             f"{golden.name} (new)", lineterm=""))
            print("\n".join(diff) if diff else f"{golden.name}: unchanged", flush=True)
        has_golden = golden is not None and golden.is_file()
        if has_golden:
            row.notes += version_mismatch(golden, run_dir) + cpu_mismatch(golden, run_dir)
            curve = verify.read_golden(golden)
            row.golden_final = curve[max(curve)]
        band = tuple(expect.get("throughput_band", verify.THROUGHPUT_BAND))
        verdict = verify.verify(run_dir, golden=golden if has_golden else None,
                                tolerance=float(expect.get("loss_tolerance", SMOKE_LOSS_TOLERANCE)),
                                min_drop=(float(expect["min_loss_drop"]) if "min_loss_drop" in expect else None), band=band,
                                peak_memory_gib=expect.get("peak_memory_gib"))
        speed = next(c for c in verdict.checks if c.name == "throughput")
        row.throughput = speed.detail if speed.status != "n/a" else f"n/a ({speed.detail})"
        failed = [c for c in verdict.checks if c.status == "fail"]
        row.verdict = "PASS" if not failed else "FAIL"
        row.detail = f"{failed[0].name}: {failed[0].detail}" if failed else \
            next(c.detail for c in verdict.checks if c.name == "loss")
        if not has_golden:
            row.notes.append("no golden file: checked that the loss falls")
        if plot_dir is not None:
            row.plots = draw(recipe, run_dir, golden if has_golden else None, plot_dir / name)
        if run["recipe"].get("note"):
            row.notes.append(run["recipe"]["note"])
    except GenconfError as exc:
        row.verdict, row.detail = "FAIL", str(exc)
    row.seconds = time.monotonic() - start
    return row


def _has_smoke(name: str) -> bool:
    """The recipe has a smoke variant; one that does not load counts (run_one reports why, as a FAIL row)."""
    try:
        return bool(recipes.load_recipe(name).section("smoke"))
    except GenconfError:
        return True


def _not_a_recipe_name(name: str, available: list[str]) -> str:
    """Why `name` is not one of the recipes ci runs: ci takes the recipes folder's names, so a recipe file that is there
    is not refused as missing (recipes.unknown_recipe read 'recipe file recipes/olmo-1b-ddp.yaml is not a file')."""
    if name.endswith((".yaml", ".yml")) and Path(name).is_file():
        stem = Path(name).stem
        hint = f": give {stem}" if stem in available else ""
        return (f"{name}: genconf ci runs the recipes of {recipes.recipe_dir()} by name (one of: "
                f"{', '.join(available) or 'none'}){hint}")
    return recipes.unknown_recipe(name)


def run(names: list[str], *, update_golden: str | None, work_dir: str | None,
        plot_dir: str | None = None) -> list[Row]:
    """Run the named recipes' smoke variants (default: every recipe that has one) and verify each; with `plot_dir`,
    draw each recipe's three pictures into plot_dir/<recipe>/."""
    available = recipes.list_recipes()
    if update_golden:
        if update_golden not in available:
            raise GenconfError("--update-golden: " + _not_a_recipe_name(update_golden, available))
        names = [update_golden]
    names = names or [n for n in available if _has_smoke(n)]
    if not names:  # a CI gate pointed at the wrong folder must not pass
        raise GenconfError(f"no recipe with a smoke variant in {recipes.recipe_dir()}")
    for name in names:
        if name not in available:
            raise GenconfError(_not_a_recipe_name(name, available))
    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="genconf-ci-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in names:
        print(f"genconf ci: {name}", file=sys.stderr, flush=True)
        rows.append(run_one(name, work, update_golden=name == update_golden,
                            plot_dir=Path(plot_dir) if plot_dir else None))
    return rows
