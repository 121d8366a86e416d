"""benchmarks/misaligned_gemm.py: the slowdown of a misaligned shape is its time per FLOP over its aligned twin's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from misaligned_gemm import ATTENTION, slowdowns  # noqa: E402


def test_slowdown_is_time_per_flop_over_the_aligned_twins():
    rows = [
        {"kind": "attention", "label": "x", "dim": 108, "aligned": False, "fwd_ms": 3.0, "fwd_bwd_ms": 9.0,
         "fwd_flops": 108.0},
        {"kind": "attention", "label": "x", "dim": 112, "aligned": True, "fwd_ms": 1.0, "fwd_bwd_ms": 3.0,
         "fwd_flops": 112.0},
    ]
    (s,) = slowdowns(rows)
    assert s["aligned_dim"] == 112
    assert s["fwd"] == pytest.approx(3.0 / (108 / 112))
    assert s["fwd_bwd"] == pytest.approx(3.0 / (108 / 112))


def test_the_shapes_are_bloom_head_dims_beside_aligned_ones():
    for _, dim, aligned, _, _ in ATTENTION:
        assert (dim * 2) % 16 and not (aligned * 2) % 16  # bf16: 16-byte vectors need multiples of 8 elements
