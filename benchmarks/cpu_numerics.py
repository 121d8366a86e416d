"""How much a recipe's CPU smoke curve moves with the instruction set: the measurement behind the golden tolerance.

    python benchmarks/cpu_numerics.py [RECIPE ...]     # writes benchmarks/results/cpu_numerics.{md,json}

Runs `genconf ci` on every recipe (or those named) once per capability setting below, on this one machine, and
compares each curve with the pinned run's (genconf.train.cpu_numerics: ATen AVX2, oneDNN AVX2, MKL COMPATIBLE, one
thread). The settings unpin one dispatch at a time and then all of them, which is what another CPU changes:
ATen's kernels at the native width (AVX-512 here) and at the scalar 'default' build, oneDNN up to AMX or down
to SSE4.1, MKL's automatic code path. The largest |loss difference| over every step, recipe and setting, times a
margin, is the tolerance `genconf ci` uses against the golden files (genconf.run.ci.SMOKE_LOSS_TOLERANCE). The
table also gives each curve's largest step-to-step rise: a curve that jumps up amplifies rounding differences.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT))


def native_capability() -> str:
    """ATen's capability on this CPU with nothing pinned (`avx512` on an AVX-512 machine)."""
    code = "import torch; print(torch.backends.cpu.get_cpu_capability().lower())"
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          check=True).stdout.strip()


def settings() -> dict[str, dict[str, str]]:
    native = native_capability()
    return {
        "pinned": {},
        f"aten-{native}": {"ATEN_CPU_CAPABILITY": native},
        "aten-default": {"ATEN_CPU_CAPABILITY": "default"},
        "onednn-all": {"ONEDNN_MAX_CPU_ISA": "ALL"},
        "onednn-sse41": {"ONEDNN_MAX_CPU_ISA": "SSE41"},
        "mkl-auto": {"MKL_CBWR": "AUTO"},
        "all-native": {"ATEN_CPU_CAPABILITY": native, "ONEDNN_MAX_CPU_ISA": "ALL", "MKL_CBWR": "AUTO"},
    }


def run_ci(names: list[str], env_over: dict[str, str], work: Path) -> dict[str, list[float]]:
    """{recipe: losses} of one `genconf ci` pass under `env_over` (the golden check is not what is measured)."""
    env = dict(os.environ, **env_over)
    out = subprocess.run([sys.executable, "-m", "genconf", "ci", *names, "--json", "--work-dir", str(work)],
                         capture_output=True, text=True, env=env, cwd=ROOT)
    rows = json.loads(out.stdout)
    curves = {}
    for row in rows:
        if not row["run_dir"]:
            raise SystemExit(f"{row['recipe']} did not train under {env_over}: {row['detail']}")
        metrics = Path(row["run_dir"]) / "metrics.jsonl"
        curves[row["recipe"]] = [json.loads(line)["loss"] for line in metrics.read_text().splitlines()]
    return curves


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipes", nargs="*")
    parser.add_argument("--margin", type=float, default=25.0, help="tolerance = margin x the largest spread")
    args = parser.parse_args()
    from genconf.catalog import recipes

    names = args.recipes or recipes.list_recipes()
    curves: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="genconf-numerics-") as tmp:
        for label, over in settings().items():
            print(f"cpu_numerics: {label} {over}", file=sys.stderr, flush=True)
            curves[label] = run_ci(names, over, Path(tmp) / label)
    ref = curves["pinned"]
    spread = {label: {n: max(abs(a - b) for a, b in zip(c[n], ref[n])) for n in names}
              for label, c in curves.items() if label != "pinned"}
    rise = {n: max(0.0, *(b - a for a, b in zip(ref[n], ref[n][1:]))) for n in names}
    worst = max(v for per in spread.values() for v in per.values())
    tolerance = args.margin * worst
    labels = [label for label in curves if label != "pinned"]
    lines = ["# CPU smoke numerics across capability settings (one machine)", "",
             f"Command: `python benchmarks/cpu_numerics.py`. CPU: {_cpu_model()}; native ATen capability: "
             f"{native_capability()}. Each cell: the largest |loss - pinned loss| over the 12 steps.", "",
             "| recipe | largest step-to-step rise (pinned) | " + " | ".join(labels) + " |",
             "|---|---:|" + "---:|" * len(labels)]
    for n in names:
        lines.append(f"| {n} | {rise[n]:.2e} | " + " | ".join(f"{spread[lb][n]:.1e}" for lb in labels) + " |")
    from genconf.run.ci import SMOKE_LOSS_TOLERANCE

    lines += ["", f"Largest spread: {worst:.2e}. Tolerance = {args.margin:g} x that = {tolerance:.2e}; genconf ci uses "
              f"{SMOKE_LOSS_TOLERANCE:g} (genconf.run.ci.SMOKE_LOSS_TOLERANCE{', too small!' if tolerance > SMOKE_LOSS_TOLERANCE else ''})."]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "cpu_numerics.md").write_text("\n".join(lines) + "\n")
    (RESULTS / "cpu_numerics.json").write_text(json.dumps(
        {"settings": settings(), "curves": curves, "spread": spread, "rise": rise, "largest_spread": worst,
         "margin": args.margin, "tolerance": tolerance}, indent=1, sort_keys=True))
    print("\n".join(lines))
    return 0


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


if __name__ == "__main__":
    raise SystemExit(main())
