"""benchmarks/published.py: published rows carry the allocator setting their launcher used.

The known answers are NVIDIA-NeMo/Megatron-Bridge's performance scripts at each container release:
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True set per model until May 2026 (setup_experiment.py cac49dcd7,
perf_plugins.py 47ff48829 / 92161fc0b / f69d4dd59), then for every run (executors.py PERF_ENV_VARS, 6f24c71f3)
except Llama with Megatron-FSDP or NCCL user buffers.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from published import load_runs  # noqa: E402


@pytest.fixture(scope="module")
def runs():
    return {(r.group, r.label): r for r in load_runs()[0]}


@pytest.mark.parametrize("release, label, expandable", [
    # 25.09: Llama 3.1 405B pre-training on GB200 in FP8-CS only (here with Megatron-FSDP: no exclusion yet).
    ("25.09", "LLAMA3.1_405B #269", True),
    ("25.09", "LLAMA3.1_405B #270", False),   # GB200 MXFP8: added 2025-10-14
    ("25.09", "LLAMA3.1_405B #279", False),   # B200
    # 25.11 and 26.02: GB200 FP8-CS and MXFP8; GB300 not yet.
    ("25.11", "LLAMA3.1_405B #245", True),
    ("25.11", "LLAMA3.1_405B #236", False),
    ("26.02", "LLAMA3.1_405B #174", True),
    ("26.02", "LLAMA3.1_405B #173", False),
    ("26.02", "LLAMA3.1_405B #172", False),   # NVFP4
    # 26.04: GB200 and GB300, FP8-CS and MXFP8; NVFP4 and H100 still without.
    ("26.04", "LLAMA3.1_405B #80", True),
    ("26.04", "LLAMA3.1_405B #130", True),
    ("26.04", "LLAMA3.1_405B #82", False),
    ("26.04", "LLAMA3.1_405B #86", False),
    ("26.04", "LLAMA3_70B #73", False),       # 70B pre-training with Megatron-FSDP
    # 26.06 and later: every run of these (no Llama with Megatron-FSDP among them).
    ("26.06", "LLAMA3.1_405B #34", True),
    ("26.06", "LLAMA3.1_405B #38", True),
    ("26.06", "Qwen3_30B_a3B #49", True),
    ("26.08", "GPT OSS 120B #4", True),
])
def test_megatron_bridge_rows_follow_the_release_scripts(runs, release, label, expandable):
    run = next(r for (group, lab), r in runs.items() if lab == label and group.startswith(f"Megatron-Bridge {release}"))
    assert run.plan.expandable_segments is expandable


def test_other_sources_ran_the_classic_allocator(runs):
    others = [r for r in runs.values() if not r.group.startswith("Megatron-Bridge")]
    assert others and not any(r.plan.expandable_segments for r in others)
