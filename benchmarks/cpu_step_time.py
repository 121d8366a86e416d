"""CPU step time of real launches against genconf.cpu_time's estimate: the measurement behind its three rates.

    python benchmarks/cpu_step_time.py            # writes benchmarks/results/cpu_step_time.{md,json}
    python benchmarks/cpu_step_time.py --fit      # also fits the rates and prints them (copy into genconf/cpu_time.py)

Each case plans a layout, shrinks it with `genconf launch --layers --hidden ...` and trains a few steps through the
real runner (megatron-core, DeepSpeed, FSDP) with the CPU pins, then compares the median step time (steps after the
first) with cpu_step_time(). The gloo bandwidth is measured with a 64 MiB all-reduce between two processes. With
--fit, the per-core FLOP rate and the per-pass cost are fitted (least squares on the relative error) on the cases
and the gloo bandwidth taken from the measurement.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT))

TINY = ["--layers", "4", "--hidden", "64", "--heads", "4", "--vocab", "128", "--seq-len", "64", "--precision", "fp32"]
MID = ["--layers", "4", "--hidden", "256", "--heads", "8", "--vocab", "2048", "--seq-len", "256", "--precision", "fp32"]
MID_BF16 = MID[:-1] + ["bf16"]
PLAN = ["--model", "1b", "--gpus", "2", "--gpus-per-node", "2"]
# name -> (plan flags, launch flags): overhead-bound (many tiny passes) and compute-bound (few wide ones) per runner.
CASES = {
    "fsdp-ddp tiny, 32 passes": (PLAN + ["--framework", "fsdp", "--zero", "0"], TINY + ["--global-batch", "64", "--mbs", "1"]),
    "fsdp-ddp mid, 2 passes": (PLAN + ["--framework", "fsdp", "--zero", "0"], MID + ["--global-batch", "8", "--mbs", "2"]),
    "fsdp-full mid, 4 passes": (PLAN + ["--framework", "fsdp", "--zero", "3"], MID + ["--global-batch", "8", "--mbs", "1"]),
    # DeepSpeed runs BF16 (genconf refuses FP32 there: its verification runs are Megatron's and FSDP's)
    "deepspeed-z1 mid bf16, 1 pass": (PLAN + ["--framework", "deepspeed", "--zero", "1"],
                                      MID_BF16 + ["--global-batch", "4", "--mbs", "2"]),
    "megatron tp2 mid, 8 passes": (PLAN + ["--framework", "megatron", "--tp", "2", "--pp", "1", "--zero", "0",
                                           "--layer-spec", "local"], MID + ["--global-batch", "8", "--mbs", "1"]),
    "megatron pp2 vp2 tiny, 32 passes": (PLAN + ["--framework", "megatron", "--tp", "1", "--pp", "2", "--vp", "2",
                                                 "--zero", "0", "--layer-spec", "local"],
                                         TINY + ["--global-batch", "16", "--mbs", "1"]),
    "fsdp-ddp mid bf16, 1 pass": (PLAN + ["--framework", "fsdp", "--zero", "0"],
                                  MID_BF16 + ["--global-batch", "4", "--mbs", "2"]),
    "fsdp-ddp x4 ranks mid, 1 pass": (["--model", "1b", "--gpus", "4", "--gpus-per-node", "4", "--framework", "fsdp",
                                       "--zero", "0"], MID + ["--global-batch", "8", "--mbs", "2"]),
}
STEPS = 4


def genconf(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "genconf", *args], capture_output=True, text=True, cwd=ROOT, **kw)


def measure_case(name: str, plan_flags: list[str], launch_flags: list[str], work: Path) -> dict:
    art = work / name.replace(" ", "_").replace(",", "")
    out = genconf(*plan_flags, "--layer-spec", "local", "-o", str(art)) if "--layer-spec" not in plan_flags \
        else genconf(*plan_flags, "-o", str(art))
    if out.returncode:
        raise SystemExit(f"{name}: plan failed: {out.stderr.strip()}")
    run_dir = art / "runs" / "bench"
    start = time.monotonic()
    out = genconf("launch", str(art), *launch_flags, "--steps", str(STEPS), "--lr", "1e-3", "--run-dir", str(run_dir))
    wall = time.monotonic() - start
    if out.returncode:
        raise SystemExit(f"{name}: launch failed: {out.stderr.strip()[-2000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    times = [r["step_time_s"] for r in rows[1:]]
    return {"name": name, "run_dir": str(run_dir), "measured_s": statistics.median(times), "steps_s": times,
            "wall_s": round(wall, 1)}


@functools.lru_cache(maxsize=None)
def _config(run_dir: str):
    from genconf.train.runtime import RunConfig

    return RunConfig.from_dict(json.loads((Path(run_dir) / "config.json").read_text()))


def estimate_for(run_dir: str, cores: int, **rates) -> dict:
    from genconf.cpu_time import cpu_step_time

    cfg = _config(run_dir)
    est = cpu_step_time(cfg.model, cfg.plan, cores=cores, **rates)
    return {"config": {"model": dataclasses.asdict(cfg.model), "plan": dataclasses.asdict(cfg.plan)},
            "estimate_s": est.step_time_s, "flops": est.flops_per_step, "passes": est.passes_per_rank,
            "ranks": est.ranks, "compute_s": est.compute_s, "passes_s": est.passes_s, "comm_s": est.comm_s}


GLOO_SCRIPT = r"""
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
x = torch.ones(16 * 2**20)  # 64 MiB of FP32
for _ in range(2):
    dist.all_reduce(x)
t = time.perf_counter()
for _ in range(5):
    dist.all_reduce(x)
dt = (time.perf_counter() - t) / 5
if dist.get_rank() == 0:
    # ring all-reduce moves 2 (n-1)/n of the bytes
    print(2 * (dist.get_world_size() - 1) / dist.get_world_size() * x.numel() * 4 / dt)
dist.destroy_process_group()
"""


def gloo_bandwidth(work: Path) -> float:
    from genconf import cpu_numerics

    script = work / "gloo_bw.py"
    script.write_text(GLOO_SCRIPT)
    env = dict(os.environ, **cpu_numerics.pinned_env(os.environ))
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                          str(script)], capture_output=True, text=True, env=env)
    if out.returncode:
        raise SystemExit(f"gloo benchmark failed: {out.stderr[-2000:]}")
    return float(out.stdout.strip().splitlines()[-1])


def fit(rows: list[dict], cores: int, gloo: float) -> tuple[float, float, float]:
    """(FP32 FLOP/s per core, seconds per pass, BF16 slowdown) minimising the squared log error over the cases (a grid
    search: FP32 cases fix the first two, then the BF16 cases the third)."""
    def err(cases, **rates):
        return sum(math.log(estimate_for(r["run_dir"], cores, gloo_bytes_per_s=gloo, **rates)["estimate_s"]
                            / r["measured_s"]) ** 2 for r in cases)

    fp32 = [r for r in rows if _config(r["run_dir"]).plan.precision == "fp32"]
    bf16 = [r for r in rows if r not in fp32]
    _, rate, per_pass = min((err(fp32, flop_per_s_per_core=rate, seconds_per_pass=per_pass), rate, per_pass)
                            for rate in [x * 0.5e9 for x in range(2, 81)] for per_pass in [x / 1000 for x in range(1, 101)])
    slowdown = 1.0
    if bf16:
        _, slowdown = min((err(bf16, flop_per_s_per_core=rate, seconds_per_pass=per_pass, bf16_slowdown=s), s)
                          for s in [x / 4 for x in range(4, 161)])
    return rate, per_pass, slowdown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true", help="fit the rates and print them")
    parser.add_argument("--refit", action="store_true", help="re-estimate (and with --fit refit) the runs recorded in "
                        "benchmarks/results/cpu_step_time.json, without launching again (their run directories must exist)")
    parser.add_argument("cases", nargs="*", help="case names (default: all)")
    args = parser.parse_args()
    from genconf import cpu_time

    cores = len(os.sched_getaffinity(0))
    if args.refit:
        recorded = json.loads((RESULTS / "cpu_step_time.json").read_text())
        gloo, load = recorded["gloo_bytes_per_s"], recorded["load_average"]
        rows = [{k: r[k] for k in ("name", "run_dir", "measured_s", "steps_s", "wall_s")} for r in recorded["rows"]]
    else:
        work = Path(tempfile.mkdtemp(prefix="genconf-cpu-step-"))
        gloo = gloo_bandwidth(work)
        rows = []
        for name, (plan_flags, launch_flags) in CASES.items():
            if args.cases and name not in args.cases:
                continue
            print(f"{name} ...", file=sys.stderr, flush=True)
            rows.append(measure_case(name, plan_flags, launch_flags, work))
        load = os.getloadavg()[0]
    rates = {"flop_per_s_per_core": cpu_time.CPU_FLOP_PER_S_PER_CORE, "seconds_per_pass": cpu_time.CPU_SECONDS_PER_PASS,
             "gloo_bytes_per_s": cpu_time.GLOO_BYTES_PER_S, "bf16_slowdown": cpu_time.CPU_BF16_SLOWDOWN}
    if args.fit:
        rate, per_pass, slowdown = fit(rows, cores, gloo)
        print(f"fitted: CPU_FLOP_PER_S_PER_CORE = {rate:.3g}, CPU_SECONDS_PER_PASS = {per_pass:g}, "
              f"CPU_BF16_SLOWDOWN = {slowdown:g}, GLOO_BYTES_PER_S = {gloo:.3g}")
    for row in rows:
        row.update(estimate_for(row["run_dir"], cores, **rates))
        row["ratio"] = row["estimate_s"] / row["measured_s"]
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "?")
    lines = ["# CPU step time: estimate (genconf.cpu_time) against real launches", "",
             f"`python benchmarks/cpu_step_time.py` on {cores} cores ({cpu}), load average {load:.1f} at the end; "
             f"gloo all-reduce measured at {gloo / 1e9:.2f} GB/s. Rates in genconf/cpu_time.py: "
             f"{rates['flop_per_s_per_core'] / 1e9:g} GFLOP/s per core, {rates['seconds_per_pass'] * 1e3:g} ms per "
             f"micro-batch pass, BF16 {rates['bf16_slowdown']:g}x slower, {rates['gloo_bytes_per_s'] / 1e9:g} GB/s gloo. Median step time of steps 2-{STEPS}.",
             "", "| case | ranks | FLOPs/step | passes/rank | measured s | estimate s | estimate / measured |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['ranks']} | {r['flops']:.3g} | {r['passes']} | {r['measured_s']:.3f} | "
                     f"{r['estimate_s']:.3f} | {r['ratio']:.2f} |")
    worst = max(max(r["ratio"], 1 / r["ratio"]) for r in rows)
    lines += ["", f"Largest factor between estimate and measurement: {worst:.2f}x."]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "cpu_step_time.md").write_text("\n".join(lines) + "\n")
    (RESULTS / "cpu_step_time.json").write_text(json.dumps({"cores": cores, "cpu": cpu, "gloo_bytes_per_s": gloo, "load_average": load,
                                                            "rates": rates, "rows": rows}, indent=1, sort_keys=True))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
