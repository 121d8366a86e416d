"""benchmarks/accuracy.py: the 80% bands. Weighted quantiles agree with the unweighted ones when every weight is
equal, the dense band weights every source alike and the memory band every model alike, so a large source or a
model measured many times cannot set them alone (known answers on residuals built here)."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from accuracy import _model_band, _source_band, _wq  # noqa: E402


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
    return [{"memory_error": e, "_run": SimpleNamespace(model=SimpleNamespace(name=model))} for e in errors]


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
