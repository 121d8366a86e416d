"""Activation benchmark: bytes megatron-core's local spec saves for backward vs the planner's `--layer-spec local`.

    python benchmarks/activations.py        # writes benchmarks/results/activations.md (needs the `train` extra)

Each case runs `python -m genconf.train.activations` in a fresh process: it builds the launcher's megatron-core
GPTModel on the CPU and counts what `torch.autograd.graph.saved_tensors_hooks` sees (each storage once,
parameters excluded, CUDA-kernel sizes for dropout masks and norm statistics). Target (issue: launch and
verify): within 10% for no, selective and full recompute.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
TARGET_RATIO_ERROR = 0.10
CASES = [  # (model, mbs, seq)
    ("tests/data/tiny-gpt.yaml", 2, 64),
    ("tests/data/tiny-llama.yaml", 2, 64),
    ("tests/data/tiny-odd.yaml", 2, 64),
    ("olmo-1b", 1, 128),
]


def run(model: str, recompute: str, mbs: int, seq: int) -> dict:
    out = subprocess.run([sys.executable, "-m", "genconf.train.activations", "--model", model, "--recompute",
                          recompute, "--mbs", str(mbs), "--seq", str(seq), "--json"],
                         capture_output=True, text=True, cwd=REPO, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    rows = [run(model, recompute, mbs, seq) for model, mbs, seq in CASES for recompute in ("none", "selective", "full")]
    lines = ["# Activations: saved-for-backward bytes, measured vs planned (local spec, BF16)", "",
             f"Command: `python benchmarks/activations.py` (Python {platform.python_version()}, {platform.machine()}, "
             "cpu; megatron-core local spec, counted with saved_tensors_hooks).", "",
             "| model | recompute | mbs | seq | measured B | planned B | planned - measured B | ratio | verdict |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    ok = True
    for r in rows:
        good = abs(r["ratio"] - 1) <= TARGET_RATIO_ERROR
        ok &= good
        lines.append(f"| {r['model']} | {r['recompute']} | {r['mbs']} | {r['seq']} | {r['measured_bytes']:,} | "
                     f"{r['planned_bytes']:,} | {r['planned_bytes'] - r['measured_bytes']:+,} | {r['ratio']:.4f} | "
                     f"{'pass' if good else 'FAIL'} |")
        print(lines[-1])
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "activations.md").write_text("\n".join(lines) + "\n")
    (RESULTS / "activations.json").write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
