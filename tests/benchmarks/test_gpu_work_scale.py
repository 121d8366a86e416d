"""benchmarks/gpu_work_scale.py: the what-if scales the layers' GPU work and nothing else, and restores it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import gpu_work_scale  # noqa: E402
from accuracy import cals_for, predict  # noqa: E402
from published import load_runs  # noqa: E402

import genconf.plan.cost as cost  # noqa: E402


@pytest.fixture(scope="module")
def lightning():
    runs = [r for r in load_runs()[0] if "Lightning" in r.label]
    assert len(runs) == 1
    return runs


def test_factor_one_is_accuracy_py_and_the_pricing_is_restored(lightning):
    run = lightning[0]
    before = cost._layer_time
    (err,) = gpu_work_scale.scaled_errors(lightning, 1.0)
    assert cost._layer_time is before
    want = predict(run, cals_for(lightning)[run.cluster.gpu.name]).tokens_per_s_per_gpu
    assert err == pytest.approx(want / run.measured_tokens_per_s_per_gpu - 1, rel=1e-12)


def test_more_gpu_work_is_slower_and_backward_only_sits_between(lightning):
    (one,) = gpu_work_scale.scaled_errors(lightning, 1.0)
    (both,) = gpu_work_scale.scaled_errors(lightning, 2.0)
    (bwd,) = gpu_work_scale.scaled_errors(lightning, 2.0, backward_only=True)
    assert both < bwd < one
    # Host time and communication are not scaled: twice the GPU work is less than half the throughput.
    assert (1 + both) > (1 + one) / 2


def test_an_unknown_model_is_a_one_line_error(capsys):
    assert gpu_work_scale.main(["--model", "no such model"]) == 2
    assert capsys.readouterr().err.strip() == "error: no published row's label contains 'no such model'"
