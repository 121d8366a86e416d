"""benchmarks/part_pairs.py: rows that differ in the GPU part alone are paired (the data-parallel degree apart),
and their throughput ratios are measured over predicted of the second part over the first."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from part_pairs import part_pairs, ratios  # noqa: E402


def _row(gpu, layout, measured, predicted, group="Megatron-Bridge 25.11", precision="FP8-CS"):
    return {"gpu": gpu, "group": group, "model": "llama3-8b", "precision": precision, "task": "pretrain",
            "layout": layout, "kind": "dense", "measured_tokens_per_s_per_gpu": measured,
            "predicted_tokens_per_s_per_gpu": predicted, "throughput_error": predicted / measured - 1}


def test_rows_that_differ_in_the_part_and_dp_alone_pair_and_their_ratios_are_second_over_first():
    rows = [_row("b200", "tp1 pp1 dp8 mbs2", 30000.0, 28000.0),
            _row("gb200", "tp1 pp1 dp16 mbs2", 31000.0, 32000.0),          # more GPUs: still a pair
            _row("gb200", "tp1 pp1 dp8 mbs4", 33000.0, 33000.0),           # another micro-batch: not
            _row("gb200", "tp1 pp1 dp8 mbs2", 31000.0, 32000.0, group="Megatron-Bridge 25.09"),  # another release
            _row("gb200", "tp1 pp1 dp8 mbs2", 31000.0, 32000.0, precision="FP8-MX")]           # another recipe
    pairs = part_pairs(rows, "b200", "gb200")
    assert [(a["gpu"], b["layout"]) for a, b in pairs] == [("b200", "tp1 pp1 dp16 mbs2")]
    measured, predicted = ratios(pairs[0])
    assert measured == pytest.approx(31000 / 30000) and predicted == pytest.approx(32000 / 28000)
    assert part_pairs(rows, "b300", "gb300") == []
