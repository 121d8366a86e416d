"""benchmarks/weak_scaling.py: rows of one release and layout that differ in the data-parallel degree alone, at the
same micro-batches per rank, form a series, and its slope is log(predicted / measured) on log(GPUs)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from weak_scaling import series, slope  # noqa: E402


def _row(dp, gbs, measured, predicted, group="DGXC NeMo 24.09", label="Nemotron4-15B #1", tp=4):
    return {"source": "DGXC benchmarking", "group": group, "label": label, "gpu": "h100-sxm", "precision": "BF16",
            "layout": f"tp{tp} pp1 vp1 cp1 ep1 dp{dp} mbs4 gbs{gbs} z1 none bf16 megatron gbf16",
            "measured_tokens_per_s_per_gpu": measured, "predicted_tokens_per_s_per_gpu": predicted}


def test_a_series_is_one_release_and_layout_at_the_same_work_per_rank():
    rows = [_row(4, 64, 100.0, 100.0, label="Nemotron4-15B #1"), _row(8, 128, 99.0, 100.0, label="Nemotron4-15B #2"),
            _row(16, 256, 98.0, 100.0, label="Nemotron4-15B #3"),
            _row(32, 256, 97.0, 100.0),                           # half the micro-batches per rank: strong scaling
            _row(16, 256, 97.0, 100.0, group="DGXC NeMo 24.12"),  # another release, alone: no series
            _row(16, 256, 97.0, 100.0, tp=2)]                     # another layout, alone: no series
    found = series(rows)
    assert list(found) == [("DGXC benchmarking", "DGXC NeMo 24.09", "Nemotron4-15B", "h100-sxm", "BF16",
                            "tp4 pp1 vp1 cp1 ep1 mbs4 z1 none bf16 megatron gbf16", 16)]
    # (GPUs, measured, predicted) sorted by GPUs: tp 4 x dp.
    assert next(iter(found.values())) == [(16, 100.0, 100.0), (32, 99.0, 100.0), (64, 98.0, 100.0)]


def test_a_gpu_count_published_twice_is_not_a_series():
    assert series([_row(4, 64, 100.0, 100.0), _row(4, 64, 110.0, 100.0), _row(8, 128, 99.0, 100.0)]) == {}


def test_the_slope_is_the_least_squares_one_per_log_gpu():
    # measured falls as GPUs^-0.01 against a flat prediction: log(p/m) = 0.01 ln(GPUs) + c, exactly.
    points = [(g, 100.0 * g ** -0.01, 100.0) for g in (16, 64, 512, 2048)]
    b, sxx = slope(points)
    assert b == pytest.approx(0.01, rel=1e-12)
    logs = [math.log(g) for g, _, _ in points]
    mean = sum(logs) / len(logs)
    assert sxx == pytest.approx(sum((x - mean) ** 2 for x in logs), rel=1e-12)
