"""Refit named cost-model terms to measured times: the pure half of `genconf calibrate`.

An observation is one measured time (a run's step time, a GEMM's time, a collective's time) with the cost
model's prediction of it as a function of the term values. `fit_terms` moves the chosen terms so the
predictions meet the measurements in the least-squares sense on log time (errors are relative: a 10% miss
on a 0.1 ms GEMM weighs what a 10% miss on a 10 s step weighs). `informed_terms` says which terms a set of
observations can pin down at all: one run's step time informs one number, and two terms that move every
prediction in proportion (BF16 GEMM and attention efficiency on runs of one model) cannot be told apart.

Standard library only: Levenberg-Marquardt (Marquardt 1963) on log parameters with finite-difference
derivatives, for the handful of terms a calibration fits.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

Terms = Mapping[str, float]


@dataclass(frozen=True, kw_only=True, slots=True)
class Observation:
    """One measured time and the model's prediction of it."""

    label: str
    """What was measured (a run directory, 'gemm bf16 4096x6144x2048', ...)."""
    measured_s: float
    """The measured time, seconds."""
    predict_s: Callable[[Terms], float]
    """Predicted seconds as a function of the term values (every term of the model, by name)."""

    def __post_init__(self) -> None:
        if not self.measured_s > 0 or not math.isfinite(self.measured_s):
            raise ValueError(f"observation {self.label!r}: measured_s must be a positive finite time, got {self.measured_s}")


@dataclass(frozen=True, kw_only=True, slots=True)
class FitResult:
    terms: dict[str, float]
    """Every term: the fitted ones at their new values, the others as given."""
    fitted: tuple[str, ...]
    """The names of the terms that were fitted."""
    before_log_rmse: float
    """Root-mean-square of log(predicted / measured) with the starting terms."""
    after_log_rmse: float
    """The same with the fitted terms."""
    rows: list[dict] = field(default_factory=list)
    """Per observation: label, measured_s, predicted_s_before, predicted_s_after."""
    at_bound: tuple[str, ...] = ()
    """Fitted terms that ended on a bound (the data wanted them further out: treat with suspicion)."""
    uninformed: tuple[str, ...] = ()
    """Named terms the predictions depend on less than MIN_ELASTICITY, kept at their starting values (not in
    `fitted`)."""


def _log_residuals(obs: Sequence[Observation], terms: Terms) -> list[float]:
    out = []
    for o in obs:
        predicted = o.predict_s(terms)
        if not predicted > 0 or not math.isfinite(predicted):
            raise ValueError(f"observation {o.label!r}: the model predicts {predicted} s with {dict(terms)}")
        out.append(math.log(predicted / o.measured_s))
    return out


def _rmse(residuals: Sequence[float]) -> float:
    return math.sqrt(sum(r * r for r in residuals) / len(residuals)) if residuals else 0.0


def sensitivities(base: Terms, names: Sequence[str], obs: Sequence[Observation], rel_step: float = 1e-3) -> dict[str, list[float]]:
    """d log(prediction) / d log(term) per observation, by central differences."""
    out = {}
    for name in names:
        up, down = dict(base), dict(base)
        up[name] = base[name] * (1 + rel_step)
        down[name] = base[name] / (1 + rel_step)
        hi, lo = _log_residuals(obs, up), _log_residuals(obs, down)
        out[name] = [(a - b) / (2 * math.log1p(rel_step)) for a, b in zip(hi, lo)]
    return out


def informed_terms(base: Terms, candidates: Sequence[str], obs: Sequence[Observation], *, max_terms: int | None = None,
                   min_evidence: float = 0.25) -> list[str]:
    """The candidate terms these observations can determine, most informative first: greedily the term whose
    sensitivity vector (d log prediction / d log term over the observations) has the largest part not
    explained by the terms already chosen (Gram-Schmidt), while that part's length is at least
    `min_evidence`. Why a length: with measurement noise sigma on log time, a term's fitted log value has a
    standard error of sigma / length, so 0.25 keeps it within 8% at 2% timing noise. Never more terms than
    observations."""
    usable = [c for c in candidates if base.get(c, 0) > 0]
    vectors = sensitivities(base, usable, obs)
    limit = min(len(obs), max_terms if max_terms is not None else len(usable))
    chosen: list[str] = []
    basis: list[list[float]] = []
    while len(chosen) < limit:
        best, best_norm, best_residual = None, 0.0, None
        for name in usable:
            if name in chosen:
                continue
            v = list(vectors[name])
            for b in basis:
                dot = sum(x * y for x, y in zip(v, b))
                v = [x - dot * y for x, y in zip(v, b)]
            norm = math.sqrt(sum(x * x for x in v))
            if norm > best_norm:
                best, best_norm, best_residual = name, norm, v
        if best is None or best_norm < min_evidence:
            break
        chosen.append(best)
        basis.append([x / best_norm for x in best_residual])
    return chosen


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (the systems here are a few terms wide)."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-300:
            raise ZeroDivisionError("singular system")
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            for c in range(col, n + 1):
                m[r][c] -= f * m[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][c] * x[c] for c in range(r + 1, n))) / m[r][r]
    return x


MIN_ELASTICITY = 0.01
"""A fitted term must move some observation's prediction by at least this share of its own change (10% of the term:
0.1% of the time), or the observations do not inform it and it is left unfitted."""


def fit_terms(base: Terms, names: Sequence[str], obs: Sequence[Observation], *,
              bounds: Mapping[str, tuple[float, float]] | None = None, iterations: int = 100) -> FitResult:
    """Least squares on log(predicted / measured) over the named terms (each kept positive and inside its
    bounds, default (1e-6, 1e6) x its starting value), the other terms held at `base`."""
    if not obs:
        raise ValueError("fit_terms needs at least one observation")
    for name in names:
        if name not in base:
            raise ValueError(f"unknown term {name!r} (known: {', '.join(sorted(base))})")
        if not base[name] > 0:
            raise ValueError(f"term {name} starts at {base[name]}: only positive terms can be fitted")
    if len(names) > len(obs):
        raise ValueError(f"{len(names)} terms cannot be fitted to {len(obs)} observations")
    bounds = dict(bounds or {})
    lo = [math.log(bounds.get(n, (base[n] * 1e-6, base[n] * 1e6))[0]) for n in names]
    hi = [math.log(bounds.get(n, (base[n] * 1e-6, base[n] * 1e6))[1]) for n in names]
    x = [min(max(math.log(base[n]), a), b) for n, a, b in zip(names, lo, hi)]

    def terms_at(point: Sequence[float]) -> dict[str, float]:
        t = dict(base)
        t.update({n: math.exp(v) for n, v in zip(names, point)})
        return t

    def cost(point: Sequence[float]) -> tuple[float, list[float]]:
        r = _log_residuals(obs, terms_at(point))
        return sum(v * v for v in r), r

    start_residuals = _log_residuals(obs, base)
    current, r = cost(x)
    damping = 1e-3
    h = 1e-5
    for _ in range(iterations if names else 0):
        jac = []  # jac[i][j] = d r_i / d x_j (forward differences, stepping inwards at an upper bound)
        for j in range(len(names)):
            step = h if x[j] + h <= hi[j] else -h
            shifted = list(x)
            shifted[j] += step
            _, r2 = cost(shifted)
            jac.append([(b - a) / step for a, b in zip(r, r2)])
        jtj = [[sum(jac[a][i] * jac[b][i] for i in range(len(obs))) for b in range(len(names))] for a in range(len(names))]
        jtr = [sum(jac[a][i] * r[i] for i in range(len(obs))) for a in range(len(names))]
        improved = False
        while damping < 1e12:
            a = [[jtj[i][j] + (damping * (jtj[i][i] or 1.0) if i == j else 0.0) for j in range(len(names))]
                 for i in range(len(names))]
            try:
                delta = _solve(a, [-v for v in jtr])
            except ZeroDivisionError:
                damping *= 10
                continue
            trial = [min(max(v + d, l_), u) for v, d, l_, u in zip(x, delta, lo, hi)]
            trial_cost, trial_r = cost(trial)
            if trial_cost < current:
                converged = current - trial_cost < 1e-15 * max(1.0, current)
                x, current, r = trial, trial_cost, trial_r
                damping = max(damping / 10, 1e-12)
                improved = not converged
                break
            damping *= 10
        if not improved:
            break
    final = terms_at(x)
    # A term the predictions barely depend on drifts wherever the solver leaves it (to a bound) and would move every
    # later plan for nothing: it is not fitted, and keeps its starting value.
    def elasticity(o: Observation, n: str) -> float:  # d log(predicted) / d log(term), at the fitted point
        return abs(math.log(o.predict_s({**final, n: final[n] * 1.1}) / o.predict_s(final))) / math.log(1.1)

    uninformed = tuple(n for n in names if max(elasticity(o, n) for o in obs) < MIN_ELASTICITY)
    final.update({n: base[n] for n in uninformed})
    predicted_before = [o.predict_s(base) for o in obs]
    predicted_after = [o.predict_s(final) for o in obs]
    rows = [{"label": o.label, "measured_s": o.measured_s, "predicted_s_before": b, "predicted_s_after": a}
            for o, b, a in zip(obs, predicted_before, predicted_after)]
    edge = tuple(n for n, v, l_, u in zip(names, x, lo, hi)
                 if n not in uninformed and (abs(v - l_) < 1e-9 or abs(v - u) < 1e-9))
    return FitResult(terms=final, fitted=tuple(n for n in names if n not in uninformed),
                     before_log_rmse=_rmse(start_residuals), after_log_rmse=_rmse(_log_residuals(obs, final)),
                     rows=rows, at_bound=edge, uninformed=uninformed)
