"""genconf verify's speed and memory checks: against the prediction's own interval where the plan carries one,
else the fixed band."""

from __future__ import annotations

from genconf.run import verify

H100 = {"device": "NVIDIA H100 80GB HBM3"}
ROWS = [{"step": i, "loss": 5.0, "tokens_per_s_per_gpu": 60_000.0, "peak_mem_gib": 30.0} for i in range(8)]


def checks(predicted: dict) -> dict:
    return {c.name: c for c in verify.check_speed_and_memory(ROWS, {"prediction": {"gpu": "h100-sxm"}, "plan": {}}, H100, predicted)}


def test_inside_the_interval_passes_and_says_so():
    c = checks({"tokens_per_s_per_gpu": 70_000.0, "peak_mem_gib": 32.0, "tokens_band": (55_000.0, 80_000.0),
                "memory_band": (28.0, 33.0)})
    assert c["throughput"].status == "pass" and "interval 55,000-80,000" in c["throughput"].detail
    assert c["peak memory"].status == "pass" and "interval up to 33.00 GiB" in c["peak memory"].detail


def test_below_the_interval_fails_even_inside_the_old_band():
    # 60,000 vs 70,000 is x0.86: inside the fixed 0.80-1.25 band, below a tight interval.
    c = checks({"tokens_per_s_per_gpu": 70_000.0, "peak_mem_gib": 32.0, "tokens_band": (65_000.0, 75_000.0),
                "memory_band": (28.0, 29.5)})
    assert c["throughput"].status == "fail" and "slower than predicted" in c["throughput"].detail
    assert c["peak memory"].status == "fail"  # 30.0 > the interval's 29.5, though within 10% of 32.0
    fixed = checks({"tokens_per_s_per_gpu": 70_000.0, "peak_mem_gib": 32.0})
    assert fixed["throughput"].status == "pass" and "within band" in fixed["throughput"].detail
    assert fixed["peak memory"].status == "pass" and "limit 35.20 GiB" in fixed["peak memory"].detail


def test_model_states_fail_where_one_stage_differs_from_its_own_plan():
    # The maxima over ranks agree (the busiest stage matches), but another pipeline stage's bytes differ from its
    # own plan: the per-stage difference carries it.
    row = {"measured_param_bytes": 1000, "planned_param_bytes": 1000, "measured_optimizer_bytes": 600,
           "planned_optimizer_bytes": 600, "param_bytes_off_by": 0, "optimizer_bytes_off_by": 48}
    check = verify.check_model_states([row])
    assert check.status == "fail" and "optimizer" in check.detail and "48" in check.detail
    assert verify.check_model_states([{**row, "optimizer_bytes_off_by": 0}]).status == "pass"


def test_a_golden_curve_of_another_length_is_said_to_be_likely_another_runs():
    # verify --golden with another recipe's file (12 steps against the run's 15) named only a step's difference.
    rows = [{"step": i, "loss": 5.0 - 0.1 * i} for i in range(15)]
    other = {i: 6.0 - 0.1 * i for i in range(12)}
    check = verify.check_loss(rows, other, 1e-4)
    assert check.status == "fail" and "the golden curve has 12 steps, the run 15: is it this run's?" in check.detail
    same_length = verify.check_loss(rows[:12], other, 1e-4)
    assert same_length.status == "fail" and "is it this run's" not in same_length.detail


def test_a_nan_loss_fails_the_golden_comparison():
    # |nan - golden| > tolerance is False: a run that diverged to NaN at one step passed against its golden curve.
    rows = [{"step": i, "loss": 5.0 - 0.1 * i} for i in range(12)]
    golden = {r["step"]: r["loss"] for r in rows}
    assert verify.check_loss(rows, golden, 1e-4).status == "pass"
    rows[5] = {"step": 5, "loss": float("nan")}
    check = verify.check_loss(rows, golden, 1e-4)
    assert check.status == "fail" and "step 5: loss nan" in check.detail


def test_a_golden_file_with_a_nan_loss_is_refused(tmp_path):
    import pytest

    from genconf.plan.errors import GenconfError

    golden = tmp_path / "golden.txt"
    golden.write_text("0 5.0\n1 nan\n")
    with pytest.raises(GenconfError, match=r"golden.txt:2: the golden loss must be a finite number, got 'nan'"):
        verify.read_golden(golden)
