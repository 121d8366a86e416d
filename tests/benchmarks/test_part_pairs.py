"""benchmarks/part_pairs.py: rows that differ in the GPU part alone are paired (on what the source published only),
and their throughput ratios are measured over predicted of the second part over the first."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from part_pairs import layout_key, part_pairs, ratios  # noqa: E402


def _row(gpu, layout, measured, predicted, group="NeMo 25.04", precision="FP8-CS", unknown=(), label="x #0"):
    return {"gpu": gpu, "group": group, "file": "nemo.csv", "label": label, "model": "llama3-8b",
            "precision": precision, "task": "pretrain", "layout": layout, "kind": "dense", "unknown": list(unknown),
            "measured_tokens_per_s_per_gpu": measured, "predicted_tokens_per_s_per_gpu": predicted,
            "throughput_error": predicted / measured - 1}


def test_rows_that_differ_in_the_part_alone_pair_and_their_ratios_are_second_over_first():
    rows = [_row("b200", "tp1 pp1 dp8 mbs2 none", 30000.0, 28000.0),
            _row("gb200", "tp1 pp1 dp8 mbs2 none", 31000.0, 32000.0),
            _row("gb200", "tp1 pp1 dp16 mbs2 none", 31000.0, 32000.0),          # more GPUs: not a pair
            _row("gb200", "tp1 pp1 dp8 mbs4 none", 33000.0, 33000.0),           # another micro-batch: not
            _row("gb200", "tp1 pp1 dp8 mbs2 none", 31000.0, 32000.0, group="NeMo 25.07"),  # another release
            _row("gb200", "tp1 pp1 dp8 mbs2 none", 31000.0, 32000.0, precision="FP8-MX")]  # another recipe
    pairs = part_pairs(rows, "b200", "gb200")
    assert [(a["gpu"], b["layout"]) for a, b in pairs] == [("b200", "tp1 pp1 dp8 mbs2 none")]
    measured, predicted = ratios(pairs[0])
    assert measured == pytest.approx(31000 / 30000) and predicted == pytest.approx(32000 / 28000)
    assert part_pairs(rows, "b300", "gb300") == []


def test_only_what_the_source_published_is_matched():
    """A recompute genconf's search chose (the source left it out) is not part of the match; a published one is."""
    searched = _row("b200", "tp1 pp1 dp8 mbs2 full rc2", 30000.0, 28000.0, unknown=["recompute"])
    assert layout_key(searched)[-1] == "tp1 pp1 dp8 mbs2"
    other = _row("gb200", "tp1 pp1 dp8 mbs2 none", 31000.0, 32000.0, unknown=["recompute"])
    published = _row("gb200", "tp1 pp1 dp8 mbs2 none", 31000.0, 32000.0, group="NeMo 25.07")
    assert len(part_pairs([searched, other], "b200", "gb200")) == 1
    assert part_pairs([dict(searched, group="NeMo 25.07"), published], "b200", "gb200") == []


def test_two_rows_of_one_part_under_one_key_are_an_error_not_a_silent_choice():
    rows = [_row("b200", "tp1 pp1 dp8 mbs2 none", 30000.0, 28000.0, label="a #1"),
            _row("b200", "tp1 pp1 dp8 mbs2 none", 29000.0, 28000.0, label="a #2")]
    with pytest.raises(ValueError, match="a #1 and a #2"):
        part_pairs(rows, "b200", "gb200")
