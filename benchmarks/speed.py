"""Speed benchmark: the planner must answer on a login node in well under a second.

    python benchmarks/speed.py        # writes benchmarks/results/speed.md

Targets (issue: the planner): `genconf --model 70b --gpus 384 --json` under 1 s wall including interpreter
start; a 1T-parameter model on 16,384 GPUs searched in under 5 s.
"""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
CASES = [
    ("70b on the seed cluster (384 x H100, 4/node)", ["--model", "70b", "--gpus", "384", "--json"], 1.0),
    ("gpt-1t (1.0T params) on 16,384 x H100 (8/node)", ["--model", "gpt-1t", "--gpus", "16384", "--cluster", "dgx-h100", "--json"], 5.0),
    ("llama3.1-405b on 16,384 x H100 (8/node)", ["--model", "llama3.1-405b", "--gpus", "16384", "--cluster", "dgx-h100", "--json"], 5.0),
    ("mixtral-8x7b on 1,024 x H100 (8/node)", ["--model", "mixtral-8x7b", "--gpus", "1024", "--cluster", "dgx-h100", "--json"], 5.0),
]


def wall(args: list[str], repeats: int = 7) -> tuple[list[float], dict]:
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "genconf", *args], capture_output=True, text=True, cwd=REPO)
        times.append(time.perf_counter() - start)
        if proc.returncode != 0:
            raise SystemExit(f"genconf {' '.join(args)} failed: {proc.stderr.strip()}")
        out = json.loads(proc.stdout)
    return times, out


def main() -> int:
    lines = ["# Speed: planner wall time", "", "Command: `python benchmarks/speed.py` "
             f"(Python {platform.python_version()}, {platform.machine()}, {platform.processor() or 'cpu'}; "
             "each case run 7 times as a fresh process, interpreter start included).", "",
             "| case | candidates | median s | max s | target s | verdict |", "|---|---:|---:|---:|---:|---|"]
    ok = True
    for label, args, target in CASES:
        times, out = wall(args)
        med = statistics.median(times)
        verdict = "pass" if med < target else "FAIL"
        ok &= med < target
        lines.append(f"| {label} | {out['search']['considered']} | {med:.3f} | {max(times):.3f} | {target:g} | {verdict} |")
        print(f"{label}: median {med:.3f} s (max {max(times):.3f}), {out['search']['considered']} candidates -> "
              f"{out['layout']}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "speed.md").write_text("\n".join(lines) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
