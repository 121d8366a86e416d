"""benchmarks/accuracy.py: the 80% bands. Weighted quantiles agree with the unweighted ones when every weight is
equal, the dense band weights every source alike and the memory band every model alike, so a large source or a
model measured many times cannot set them alone, and each band's tail level is the largest (the narrowest band) at
which 80% of the rows fall inside the band built without their own group (known answers on residuals built here)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from accuracy import TAILS, _calibrated_tail, _model_band, _source_band, _unselected_coverage, _wq, intervals  # noqa: E402


def test_equal_weights_give_the_middle_of_each_value():
    values = [(float(v), 1.0) for v in range(10)]     # 0..9, each value's weight centred at (v + 0.5) / 10
    assert _wq(values, 0.05) == 0.0
    assert _wq(values, 0.45) == 4.0
    assert _wq(values, 0.5) == 5.0                   # a tie goes to the upper value
    assert _wq(values, 0.95) == 9.0
    assert _wq(list(reversed(values)), 0.45) == 4.0  # order of the input does not matter


def _rows(source: str, errors: list[float]) -> list[dict]:
    return [{"source": source, "throughput_error": e} for e in errors]


def _memory_rows(model: str, errors: list[float]) -> list[dict]:
    return [{"memory_error": e, "model": model} for e in errors]


@pytest.mark.parametrize("band_of,rows_of", [(_source_band, _rows), (_model_band, _memory_rows)],
                         ids=["throughput by source", "memory by model"])
def test_a_large_group_does_not_set_the_band_alone(band_of, rows_of):
    # 100 rows of one source (or model) exactly right; five others of one row each, 20% fast (predicted / measured
    # = 1.2).
    rows = rows_of("big", [0.0] * 100) + [r for i in range(5) for r in rows_of(f"s{i}", [0.2])]
    band = band_of(rows, 0.10, 0.90)
    # Pooled, 95% of the rows are exact and the band would be [1.0, 1.0]; weighted, the big group is one of six
    # (17%): it still holds the band's top, and the small ones set its bottom at 1 / 1.2.
    assert math.isclose(band["low"], 1 / 1.2)
    assert band["high"] == 1.0
    assert band["rows"] == 105


def test_unscored_rows_are_left_out():
    rows = _rows("a", [0.1] * 12) + _rows("b", [None] * 5)
    band = _source_band(rows, 0.10, 0.90)
    assert band["rows"] == 12 and math.isclose(band["low"], 1 / 1.1) and math.isclose(band["high"], 1 / 1.1)


def _twenty_sources() -> list[dict]:
    # Twenty sources of one row each, log residuals 0.00, 0.01, ..., 0.19 (x0 < x1 < ... < x19).
    return [r for i in range(20) for r in _rows(f"s{i:02d}", [math.exp(i / 100) - 1])]


def _dense_band(rows, tail):
    return _source_band(rows, tail, 1 - tail)


def test_the_tail_widens_until_a_left_out_source_is_covered():
    rows = _twenty_sources()
    tail, coverage, by_source = _calibrated_tail(rows, "throughput_error", lambda r: r["source"], _dense_band)
    # Built from the 19 others, the 10%-8% tails run from their third smallest to their second largest value, so
    # x0, x1, x2, x18 and x19 fall outside: 75%. At 7.5% (the cumulative weight to a value's middle, (k + 0.5) / 19,
    # reaches 0.075 at k = 1 and 0.925 at k = 18) the band runs from the second smallest to the largest of the others:
    # only x0, x1 and x19 fall outside, 85%.
    assert tail == 0.075
    assert math.isclose(coverage, 0.85)
    assert [s for s, hit in by_source.items() if not hit] == ["s00", "s01", "s19"]


def test_the_unselected_coverage_chooses_the_tail_without_the_source_it_checks():
    rows = _twenty_sources()
    # Without source g, the tail is chosen on 19 rows (each band from 18): 8% is the largest tail at which 80% of
    # them (16 of 19) fall inside, and the band of the 19 at 8% runs from their third smallest to their second largest value, so
    # x0, x1, x2, x18 and x19 fall outside it: 75%, below the 85% the tail chosen on every source reports.
    coverage = _unselected_coverage(rows, "throughput_error", lambda r: r["source"], _dense_band)
    assert math.isclose(coverage, 0.75)


def test_a_group_no_tail_can_cover_falls_back_to_the_widest_and_says_so():
    # Two sources a world apart: each band built without one is the other's value alone, which never holds it.
    rows = _rows("a", [0.0] * 10) + _rows("b", [0.5] * 10)
    tail, coverage, _ = _calibrated_tail(rows, "throughput_error", lambda r: r["source"], _dense_band)
    assert tail == TAILS[-1] == 0.03 and coverage == 0.0


def test_intervals_groups_moe_and_memory_rows_by_model():
    # Dense: the twenty one-row sources above (tail 7.5%). MoE: twenty one-row models, the same residuals, but its band
    # takes pooled quantiles interpolated between ranks (_q: position t x 18 among the 19 others), so at 8% x2 sits
    # above x1 + 0.44 (x3 - x1) and x17 below x16 + 0.56 (x18 - x16): only x0, x1, x18 and x19 fall outside, 80%;
    # at 8.5% x2 falls outside too. Memory: twenty one-row models, every residual 0.0 (the first tail tried, 10%).
    dense = [dict(r, kind="dense", generation="hopper", model="d") for r in _twenty_sources()]
    moe = [{"source": "Megatron-Bridge", "kind": "MoE", "model": f"m{i:02d}", "throughput_error": math.exp(i / 100) - 1}
           for i in range(20)]
    memory = [{"source": "BLOOM sweep", "kind": "dense", "generation": "ampere", "model": f"b{i:02d}",
               "throughput_error": None, "memory_error": 0.0} for i in range(20)]
    bands = intervals(dense + moe + memory)
    assert bands["coverage"]["tails"] == {"dense": 0.075, "moe": 0.08, "memory": 0.10}
    assert math.isclose(bands["coverage"]["dense_nested"], 0.85) and math.isclose(bands["coverage"]["moe_nested"], 0.80)
    assert math.isclose(bands["coverage"]["dense_unselected"], 0.75)
    assert bands["memory"]["low"] == bands["memory"]["high"] == 1.0 and bands["memory"]["coverage_held_out_model"] == 1.0
    assert bands["coverage"]["target_missed"] == {}
