"""The verify loss rule without a golden curve (genconf.run.loss_rule) on real CPU runs' curves and the issue's run.

tests/data/loss-curves/ holds metrics of real `genconf launch` runs (tiny-llama, one CPU rank, 25 steps, the
launch's own 2-step warm-up): healthy at three learning rates, lr 0, labels that do not belong to their inputs
(a token file of the synthetic stream shuffled, so only the unigram distribution is learnable), a diverged
run (lr 30) and one that went NaN (lr 1e25). Each file says how it was made.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from conftest import REPO, has_module
from genconf.run import loss_rule

CURVES = REPO / "tests" / "data" / "loss-curves"
TINY_FLOOR = 5.396772177928632  # unigram entropy of the labels of tiny-llama's synthetic stream (vocab 256, seq 64)


def curve(name: str) -> dict:
    return json.loads((CURVES / f"{name}.json").read_text())


def judge(name: str, floor: float | None = TINY_FLOOR, **kw) -> loss_rule.LossJudgement:
    c = curve(name)
    return loss_rule.judge(c["steps"], c["loss"], lrs=c["lr"], floor_nats=floor, **kw)


@pytest.mark.parametrize("name", ["healthy-lr3e-4", "healthy-lr1e-3", "healthy-lr3e-3"])
def test_healthy_runs_pass(name):
    j = judge(name)
    assert j.status == "pass", j.detail
    assert j.p_value < 1e-6 and j.slope_per_step < 0 and j.last_loss < TINY_FLOOR
    assert j.warmup_steps == 1  # the lr column peaks at step 1: the launch's 2-step warm-up


def test_the_slowest_healthy_run_fell_less_than_the_old_rule_asked():
    # The 5% rule failed it: 5.567 -> 5.369 is a 3.6% fall.
    c = curve("healthy-lr3e-4")
    assert 1 - c["loss"][-1] / c["loss"][0] < 0.05
    assert judge("healthy-lr3e-4").status == "pass"


def test_learning_rate_zero_fails_with_and_without_the_lr_column():
    assert judge("lr0").status == "fail" and "learning rate was 0" in judge("lr0").detail
    c = curve("lr0")
    blind = loss_rule.judge(c["steps"], c["loss"])  # no lr column: the trend test alone must catch it
    assert blind.status == "fail" and "no falling trend" in blind.detail and blind.p_value > 0.5


@pytest.mark.parametrize("name", ["shuffled-lr3e-4", "shuffled-lr3e-3"])
def test_shuffled_labels_fall_but_stay_above_the_unigram_entropy(name):
    without_floor = judge(name, floor=None)
    assert without_floor.status == "pass"  # their loss does fall: a trend test alone cannot tell
    j = judge(name)
    assert j.status == "fail" and "unigram entropy" in j.detail and j.last_loss > TINY_FLOOR
    # The message names what else gets there: this many steps at this lr, and what to change.
    lr = max(curve(name)["lr"])
    assert f"{len(curve(name)['steps'])} steps at a peak lr of {lr:.0e}" in j.detail and "--lr" in j.detail


def test_nan_and_divergence_fail():
    j = judge("nan-lr1e25")
    assert j.status == "fail" and j.detail.startswith("step 2: loss is nan")
    assert judge("diverged-lr30").status == "fail"
    assert loss_rule.judge([0, 1, 2], [3.0, math.inf, 2.0]).detail.startswith("step 1: loss is inf")


def test_the_issues_healthy_h100_run_passes():
    """The issue: a 1B run on one H100, 10.71 -> 10.24 in 25 steps with lr warm-up, failed "did not fall by 5%".
    Only its first and last losses are published; the steps between take the shape of the measured CPU curve
    (healthy-lr3e-4, the same 25 steps and 2-step warm-up), mapped onto those two numbers. The floor is the
    unigram entropy of the 1B synthetic stream (vocab 50,304, seq 2,048), 10.652 nats."""
    c = curve("healthy-lr3e-4")
    a, b = c["loss"][0], c["loss"][-1]
    losses = [10.71 + (y - a) * (10.24 - 10.71) / (b - a) for y in c["loss"]]
    assert losses[0] == pytest.approx(10.71) and losses[-1] == pytest.approx(10.24)
    j = loss_rule.judge(c["steps"], losses, lrs=c["lr"], floor_nats=10.652239598500765)
    assert j.status == "pass", j.detail


def test_too_few_steps_to_judge():
    j = loss_rule.judge(list(range(5)), [5.0, 4.9, 4.8, 4.7, 4.6])
    assert j.status == "fail" and "too few" in j.detail


def test_mann_kendall_and_theil_sen_known_answers():
    # A strictly decreasing series of n: S = -n(n-1)/2; var = n(n-1)(2n+5)/18.
    s, p = loss_rule.mann_kendall_decreasing([6.0, 5.0, 4.0, 3.0, 2.0, 1.0])
    assert s == -15
    z = (s + 1) / math.sqrt(6 * 5 * 17 / 18)
    assert p == pytest.approx(0.5 * math.erfc(-z / math.sqrt(2)))
    assert p == pytest.approx(0.0042, abs=1e-4)
    assert loss_rule.mann_kendall_decreasing([1.0] * 6) == (0, 1.0)
    slope, intercept = loss_rule.theil_sen([0, 1, 2, 3, 4], [1.0, 3.0, 5.0, 7.0, 100.0])  # one outlier
    assert slope == 2.0 and intercept == 1.0


@pytest.mark.skipif(not has_module("torch"), reason="the floor is computed with the train extra's data module")
def test_unigram_entropy_of_the_synthetic_stream():
    from genconf.train.label_entropy import label_entropy_nats

    config = {"data": {"kind": "synthetic"}, "model": {"vocab_size": 256}, "plan": {"seq_length": 64, "gbs": 8},
              "train": {"seed": 1234, "train_steps": 25}}
    exact = label_entropy_nats(config)
    assert exact == pytest.approx(TINY_FLOOR, abs=1e-12)
    assert exact < math.log(256)
    # The same from a long stretch of the stream itself (plug-in estimate over 64,000 labels).
    import numpy as np

    from genconf.train.data import SyntheticTokens

    source = SyntheticTokens(vocab_size=256, seed=1234)
    labels = np.concatenate([source.sample(i, 65)[1:] for i in range(1000)])
    p = np.bincount(labels, minlength=256) / labels.size
    assert float(-(p[p > 0] * np.log(p[p > 0])).sum()) == pytest.approx(exact, abs=0.01)


@pytest.mark.skipif(not has_module("torch"), reason="needs the train extra's data module")
def test_unigram_entropy_of_a_token_file(tmp_path):
    import numpy as np

    from genconf.train.label_entropy import label_entropy_nats

    # 16 tokens equally likely: ln 16 (within the estimator's small-sample error).
    rng = np.random.default_rng(0)
    path = Path(tmp_path) / "tokens.bin"
    rng.integers(0, 16, size=200_000).astype(np.uint16).tofile(path)
    config = {"data": {"kind": "memmap", "path": str(path), "dtype": "uint16"}, "model": {"vocab_size": 256},
              "plan": {"seq_length": 64, "gbs": 8}, "train": {"seed": 1, "train_steps": 100}}
    assert label_entropy_nats(config) == pytest.approx(math.log(16), abs=2e-3)
    config["data"]["path"] = str(tmp_path / "gone.bin")
    assert label_entropy_nats(config) is None
