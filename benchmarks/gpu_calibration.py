"""`genconf calibrate --bench` on the H200's own tables, refitted here, against the runs measured on that H200.

    python benchmarks/gpu_calibration.py    # reads results/gpu_runs/ (tables and runs), writes results/gpu_calibration.md

It also lists every kept run's measured tokens/s and MFU (genconf's FLOP count: the plan's MFU scaled by measured
over predicted tokens/s), the launched-speed figures the README and the issue quote.

The GPU suite (tests/train/test_gpu.py) ran `genconf calibrate --bench` on an H200 at 8793d0e and kept the file
(results/gpu_runs/calibration.yaml: the fitted terms and every measured row), and each run's plan.json and
metrics.jsonl. This refits the file's measurements with the current calibrate code and predicts each run with the
built-in terms and with the refitted ones: the check of a calibrate change without a GPU at hand. A run launched
with --compile is priced compiled, as verify prices it.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from accuracy import write_markdown  # noqa: E402

from genconf.catalog.clusters import resolve_cluster  # noqa: E402
from genconf.catalog.hardware import calibration_for  # noqa: E402
from genconf.plan.cost import step_cost  # noqa: E402
from genconf.plan.planfile import model_from_dict, plan_from_dict  # noqa: E402
from genconf.run import calibrate  # noqa: E402

RUNS = Path(__file__).resolve().parent / "results" / "gpu_runs"
CASES = ("megatron-bf16", "deepspeed-bf16", "fsdp-bf16", "fsdp-fp8")
"""The runs of the suite's calibrated check, all from the same commit as the tables (8793d0e)."""


def measured_tokens_per_s(case: Path) -> float:
    rows = [json.loads(line) for line in (case / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return statistics.median(r["tokens_per_s_per_gpu"] for r in rows[2:])  # verify's steady rows


def main() -> int:
    saved = yaml.safe_load((RUNS / "calibration.yaml").read_text())
    tables = {**saved["measurements"], "environment": saved["environment"], "model": "kempner-olmo-1b"}
    gpu = saved["gpu"]
    content = calibrate.fit_bench(tables, gpu)
    base = calibration_for(gpu)
    refit = calibrate._calibration({k: v["value"] for k, v in content["terms"].items()}, base)
    as_saved = calibrate._calibration({k: v["value"] for k, v in saved["terms"].items()}, base)
    cluster = resolve_cluster(None, gpu=gpu, gpus_per_node=1)
    lines = ["# calibrate --bench on the H200, refitted, against the H200 runs", "",
             "Command: `python benchmarks/gpu_calibration.py` (tables and runs: `benchmarks/results/gpu_runs/`, "
             "measured by `benchmarks/gpu_suite.sh` at 8793d0e).", "",
             f"Timer floor per call from the add rows: {content['measurements']['timer_call_floor_s'] * 1e6:.1f} us "
             f"(the file at 8793d0e assumed {calibrate.BENCH_CALL_FLOOR_S * 1e6:.0f} us).", "",
             "| term | built-in | fitted at 8793d0e | refitted now | fit log-RMSE now |", "|---|---:|---:|---:|---:|"]
    groups = {t: g for g, summary in content["fit"].items() for t in summary["terms"]}
    for name, entry in content["terms"].items():
        lines.append(f"| {name} | {entry['before']:.3f} | {saved['terms'].get(name, {}).get('value', float('nan')):.3f} | "
                     f"{entry['value']:.3f} | {content['fit'][groups[name]]['after_log_rmse']:.3f} |")
    lines += ["", "| run | measured tok/s/GPU | built-in | x | calibrated at 8793d0e | x | refitted now | x |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name in CASES:
        case = RUNS / name
        plan_json = json.loads((case / "plan.json").read_text())
        model, plan = model_from_dict(plan_json["model"]), plan_from_dict(plan_json["plan"])
        if "genconf: torch.compile" in (case / "launch.out").read_text():  # the runner compiled its blocks
            plan = dataclasses.replace(plan, torch_compile=True)
        measured = measured_tokens_per_s(case)
        cells = []
        for cal in (base, as_saved, refit):
            predicted = step_cost(model, plan, cluster, cal).tokens_per_s_per_gpu
            cells += [f"{predicted:,.0f}", f"{measured / predicted:.2f}"]
        label = name + (" (--compile)" if plan.torch_compile else "")
        lines.append(f"| {label} | {measured:,.0f} | " + " | ".join(cells) + " |")
    lines += ["", "Every kept run (the commit each ran at: results/gpu_runs/README.md):", "",
              "| run | measured tok/s/GPU | plan's prediction | plan's MFU | measured MFU |", "|---|---:|---:|---:|---:|"]
    for case in sorted(p for p in RUNS.iterdir() if (p / "metrics.jsonl").is_file()):
        perf = json.loads((case / "plan.json").read_text())["perf"]
        measured = measured_tokens_per_s(case)
        lines.append(f"| {case.name} | {measured:,.0f} | {perf['tokens_per_s_per_gpu']:,.0f} | {perf['mfu']:.1%} | "
                     f"{perf['mfu'] * measured / perf['tokens_per_s_per_gpu']:.1%} |")
    return write_markdown("gpu_calibration", lines)


if __name__ == "__main__":
    raise SystemExit(main())
