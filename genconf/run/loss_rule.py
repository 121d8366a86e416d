"""Is a short training run healthy? The loss rule `genconf verify` applies when no golden curve exists.

A short run (tens of steps) of a large model falls little: the issue's healthy 1B run on an H100 went
10.71 -> 10.24 in 25 steps (4.4%), so a fixed "fell by 5%" rule fails it. Broken runs fall too, or seem to:
with the learning rate at 0 the loss wanders around its start; with labels that do not belong to their
inputs (shuffled, misaligned) a model still learns the labels' unigram distribution and its loss falls,
then stalls at that distribution's entropy. So the rule asks three questions, each with a number:

1. Every loss finite (NaN/inf fails at the first such step).
2. After the learning-rate warm-up (taken from the run's own lr column, so it scales with the run length),
   the loss has a decreasing trend: the one-sided Mann-Kendall test (Mann 1945, Kendall 1975) on the
   post-warm-up losses, p < 0.01. Why this test: it asks only whether later losses tend to be lower than
   earlier ones (the sign of every pair), so it needs no linear shape (loss curves bend), no Gaussian noise
   (loss spikes), and one spike cannot fake or hide a trend; its null distribution is exact for independent
   batches, which is what a synthetic or shuffled stream gives. The slope reported with it is Theil-Sen's
   (the median of the pairwise slopes, Sen 1968), the estimator that belongs to Kendall's statistic.
3. Where the entropy of the labels' unigram distribution is known (the run's data is genconf's synthetic
   stream or a token file it can read), the loss at the end is below it by more than two standard errors:
   a model that ignores its inputs cannot beat that entropy on fresh batches (cross-entropy >= entropy), so
   a run whose labels are shuffled fails here however much its loss fell.

Pure (standard library only), beside its one caller: genconf verify reads metrics.jsonl and computes the floor.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

ALPHA = 0.01
"""One-sided significance level of the trend test."""
MIN_TREND_POINTS = 6
"""The fewest post-warm-up steps that can reach p < 0.01 (with 5, a perfectly monotone fall gives p = 0.014)."""
FLOOR_SIGMAS = 2.0
"""How many standard errors below the unigram entropy the final losses must sit."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LossJudgement:
    status: str
    """pass | fail"""
    detail: str
    """One line: what was found, with the numbers."""
    first_loss: float | None = None
    """Mean loss of the first post-warm-up steps (nats)."""
    last_loss: float | None = None
    """Mean loss of the final steps (nats)."""
    slope_per_step: float | None = None
    """Theil-Sen slope of loss against step after warm-up (nats per step)."""
    p_value: float | None = None
    """One-sided Mann-Kendall p-value for a decreasing trend."""
    floor_nats: float | None = None
    """Entropy of the labels' unigram distribution, where known."""
    warmup_steps: int = 0
    """Steps skipped as warm-up."""


def theil_sen(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(slope, intercept): the median of pairwise slopes (Sen 1968) and the median of y - slope * x."""
    slopes = [(ys[j] - ys[i]) / (xs[j] - xs[i]) for i in range(len(xs)) for j in range(i + 1, len(xs))
              if xs[j] != xs[i]]
    if not slopes:
        raise ValueError("theil_sen needs at least two distinct x values")
    slope = statistics.median(slopes)
    return slope, statistics.median(y - slope * x for x, y in zip(xs, ys))


def mann_kendall_decreasing(ys: list[float]) -> tuple[int, float]:
    """(S, p): Kendall's S = sum over pairs i < j of sign(y_j - y_i), and the one-sided p-value of S this low
    or lower under "no trend" (normal approximation with the tie correction and the continuity correction,
    Kendall 1975; exact enough from n = 6 on for a 1% test)."""
    n = len(ys)
    if n < 3:
        raise ValueError(f"the Mann-Kendall test needs at least 3 values, got {n}")
    s = sum((ys[j] > ys[i]) - (ys[j] < ys[i]) for i in range(n) for j in range(i + 1, n))
    ties: dict[float, int] = {}
    for y in ys:
        ties[y] = ties.get(y, 0) + 1
    var = (n * (n - 1) * (2 * n + 5) - sum(t * (t - 1) * (2 * t + 5) for t in ties.values())) / 18.0
    if var <= 0:  # every value equal: no evidence of any trend
        return s, 1.0
    z = (s + 1) / math.sqrt(var) if s < 0 else (s - 1) / math.sqrt(var) if s > 0 else 0.0
    return s, 0.5 * math.erfc(-z / math.sqrt(2))  # P(Z <= z)


def warmup_end(steps: list[int], lrs: list[float | None] | None, warmup_steps: int | None) -> int:
    """Index of the first step after the learning-rate warm-up: where the lr column first reaches its peak
    (the schedule the run really used, warm-up scaled to its length), else the configured warm-up steps.
    Capped so that at least MIN_TREND_POINTS steps (or half the run) remain to judge."""
    n = len(steps)
    end = 0
    if lrs and all(lr is not None for lr in lrs):
        peak = max(lrs)
        end = next(i for i, lr in enumerate(lrs) if lr >= peak * (1 - 1e-9)) if peak > 0 else 0
    elif warmup_steps:
        end = sum(1 for s in steps if s - steps[0] < warmup_steps)
    return max(0, min(end, n - MIN_TREND_POINTS, n // 2))


def _at_lr(lrs: list[float | None] | None) -> str:
    """' at a peak lr of 3e-04' where the log has the learning rate, else ''."""
    return f" at a peak lr of {max(lrs):.0e}" if lrs and all(lr is not None for lr in lrs) else ""


def judge(steps: list[int], losses: list[float], *, lrs: list[float | None] | None = None,
          warmup_steps: int | None = None, floor_nats: float | None = None, alpha: float = ALPHA) -> LossJudgement:
    """The loss rule without a golden curve (see the module docstring). `steps` ascending, `losses` in nats,
    `lrs` the learning rate per step as logged (None where unknown), `floor_nats` the labels' unigram entropy."""
    if len(steps) != len(losses) or (lrs is not None and len(lrs) != len(steps)):
        raise ValueError("steps, losses and lrs must have the same length")
    for step, loss in zip(steps, losses):
        if not math.isfinite(loss):
            return LossJudgement(status="fail", detail=f"step {step}: loss is {loss} (diverged or overflowed)")
    if lrs and all(lr is not None for lr in lrs) and max(lrs) == 0:
        return LossJudgement(status="fail", detail=f"the learning rate was 0 at all {len(steps)} steps: nothing trained")
    skip = warmup_end(steps, lrs, warmup_steps)
    xs, ys = [float(s) for s in steps[skip:]], losses[skip:]
    if len(ys) < MIN_TREND_POINTS:
        return LossJudgement(status="fail", warmup_steps=skip,
                             detail=f"{len(ys)} steps after warm-up are too few to judge the trend (need "
                                    f"{MIN_TREND_POINTS}): run more steps or give a golden curve")
    slope, intercept = theil_sen(xs, ys)
    _, p = mann_kendall_decreasing(ys)
    k = max(3, len(ys) // 3)
    first, last = statistics.fmean(ys[:k]), statistics.fmean(ys[-k:])
    numbers = dict(first_loss=first, last_loss=last, slope_per_step=slope, p_value=p, floor_nats=floor_nats,
                   warmup_steps=skip)
    trend = (f"{first:.4f} -> {last:.4f} over steps {steps[skip]}..{steps[-1]} after {skip} warm-up steps, "
             f"Theil-Sen slope {slope:+.2e}/step, Mann-Kendall p = {p:.1e}")
    if not (slope < 0 and p < alpha):
        return LossJudgement(status="fail", detail=f"no falling trend: {trend} (need p < {alpha:g})", **numbers)
    if floor_nats is not None:
        # Spread of the losses around the trend line (robust: 1.4826 x MAD), as a standard error of the mean.
        residuals = [y - (intercept + slope * x) for x, y in zip(xs, ys)]
        sigma = 1.4826 * statistics.median(abs(r - statistics.median(residuals)) for r in residuals)
        margin = FLOOR_SIGMAS * sigma / math.sqrt(k)
        if not last < floor_nats - margin:
            return LossJudgement(status="fail", **numbers,
                                 detail=f"the loss fell ({trend}) but ended at {last:.4f}, not below {floor_nats:.4f} "
                                        f"(the labels' unigram entropy, less {margin:.1e} for noise): a model that "
                                        "ignores its inputs gets that far (labels shuffled or misaligned?), "
                                        f"or {len(steps)} steps{_at_lr(lrs)} are too few to learn more than "
                                        "the unigram counts: run more --steps, or a higher --lr (tiny smoke "
                                        "models want ~1e-2)")
        trend += f"; below the labels' unigram entropy {floor_nats:.4f}"
    return LossJudgement(status="pass", detail=f"falling: {trend}", **numbers)
