"""GEMM throughput of the local GPU for the shapes of real transformer layers, against the cost model.

    python benchmarks/gemm.py                 # BF16 (and FP8 where torch._scaled_mm runs: Hopper/Blackwell)
    python benchmarks/gemm.py --quick         # a small sweep (what the gpu-marked test runs)

For hidden sizes 2k-16k split by TP 1-8 and 2k-16k tokens per micro-batch, times the four GEMMs of a layer
(QKV, output projection, MLP up, MLP down) with CUDA events and compares measured TFLOP/s with what
genconf.plan.cost.gemm_s predicts for that GPU's calibration. Writes benchmarks/results/gemm_<gpu>.{json,md}
and prints the gemm_efficiency that would fit the measurements best, to calibrate with.
Needs a CUDA GPU; exits 2 with one line elsewhere.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RESULTS = Path(__file__).resolve().parent / "results"


def layer_gemms(hidden: int, tp: int, tokens: int) -> list[tuple[str, int, int, int]]:
    """(name, m, n, k) of one layer's forward GEMMs on a TP rank (GPT-style MLP of 4h)."""
    return [("qkv", tokens, 3 * hidden // tp, hidden), ("proj", tokens, hidden, hidden // tp),
            ("fc1", tokens, 4 * hidden // tp, hidden), ("fc2", tokens, hidden, 4 * hidden // tp)]


def time_gemm(m: int, n: int, k: int, dtype: str, repeats: int = 20) -> float:
    import torch

    dev = torch.device("cuda")
    if dtype == "fp8":
        a = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=dev)

        def run():
            return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    else:
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=dev, dtype=torch.bfloat16)

        def run():
            return a @ b
    for _ in range(3):
        run()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(repeats):
        run()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / repeats


def predicted_s(gpu, cal, m: int, n: int, k: int, dtype: str) -> float:
    """The cost model's time for one GEMM (genconf.plan.cost.gemm_s: tiles in waves over the SMs, the HBM bound);
    back-to-back calls hide the launch, as a training step's queued kernels do."""
    from genconf.plan.cost import gemm_s

    return gemm_s(gpu, cal, m, n, k, dtype)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dtypes", default="bf16,fp8")
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("benchmarks/gemm.py: needs a CUDA GPU", file=sys.stderr)
        return 2
    from genconf.catalog.hardware import calibration_for, gpu_for_device_name, resolve_gpu

    name = gpu_for_device_name(torch.cuda.get_device_name()) or "h100-sxm"
    # Timed calls of one kernel run at the boost clock, as the kernel tables behind the built-in terms did: both clock
    # terms at 1 (genconf.run.calibrate._at_boost), else the suggested efficiency would absorb 1 / the sustained clock.
    gpu = resolve_gpu(name)
    cal = dataclasses.replace(calibration_for(name), clock_factor=1.0, fp8_clock_ratio=1.0)
    hiddens = (2048, 8192) if args.quick else (2048, 4096, 8192, 16384)
    tps = (1, 4) if args.quick else (1, 2, 4, 8)
    tokens = (4096,) if args.quick else (2048, 4096, 8192, 16384)
    rows = []
    for dtype in args.dtypes.split(","):
        if dtype == "fp8" and not gpu.supports_fp8:
            continue
        for h, tp, t in itertools.product(hiddens, tps, tokens):
            for kind, m, n, k in layer_gemms(h, tp, t):
                try:
                    measured = time_gemm(m, n, k, dtype)
                except (RuntimeError, AttributeError) as exc:  # no _scaled_mm for this dtype/device
                    print(f"skip {dtype}: {exc}", file=sys.stderr)
                    break
                flops = 2.0 * m * n * k
                rows.append({"dtype": dtype, "hidden": h, "tp": tp, "tokens": t, "gemm": kind, "m": m, "n": n, "k": k,
                             "measured_tflops": flops / measured / 1e12,
                             "predicted_tflops": flops / predicted_s(gpu, cal, m, n, k, dtype) / 1e12})
    ratios = [r["measured_tflops"] / r["predicted_tflops"] for r in rows]
    summary = {"gpu": torch.cuda.get_device_name(), "catalog_gpu": name, "rows": len(rows),
               "median_measured_over_predicted": statistics.median(ratios) if ratios else None,
               "best_bf16_tflops": max((r["measured_tflops"] for r in rows if r["dtype"] == "bf16"), default=None),
               "best_fp8_tflops": max((r["measured_tflops"] for r in rows if r["dtype"] == "fp8"), default=None),
               "suggested_gemm_efficiency": None}
    bf16 = [r for r in rows if r["dtype"] == "bf16"]
    if bf16:
        # The efficiency that makes the median ratio 1 for BF16.
        med = statistics.median(r["measured_tflops"] / r["predicted_tflops"] for r in bf16)
        summary["suggested_gemm_efficiency"] = round(cal.gemm_efficiency * med, 3)
    RESULTS.mkdir(exist_ok=True)
    stem = RESULTS / f"gemm_{name}"
    stem.with_suffix(".json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    lines = [f"# GEMM throughput on {summary['gpu']}", "", "Command: `python benchmarks/gemm.py`", "",
             "| dtype | hidden | tp | tokens | gemm | m x n x k | measured TFLOP/s | predicted | ratio |",
             "|---|---:|---:|---:|---|---|---:|---:|---:|"]
    lines += [f"| {r['dtype']} | {r['hidden']} | {r['tp']} | {r['tokens']} | {r['gemm']} | {r['m']}x{r['n']}x{r['k']} | "
              f"{r['measured_tflops']:.0f} | {r['predicted_tflops']:.0f} | {r['measured_tflops'] / r['predicted_tflops']:.2f} |"
              for r in rows]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
