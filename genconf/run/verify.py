"""`genconf verify RUN`: does a run's loss, speed and memory match what was promised?

Loss: against a golden file (`step loss` per line) within a stated tolerance; without one, genconf.run.loss_rule
(finite, a significant falling trend after the run's own warm-up, below the labels' unigram entropy). Speed and memory: against the planner's prediction for the run as it ran, where
the run used the hardware the prediction is for.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from genconf.plan import runconfig
from genconf.plan.errors import GenconfError

DEFAULT_MIN_DROP = None
"""An optional extra requirement without a golden file: the final loss this fraction below the first (None: the
statistical rule alone decides; a fixed 5% failed healthy 25-step runs of a 1B model)."""
THROUGHPUT_BAND = (0.80, 1.25)
"""Measured / predicted tokens/s inside this band is 'within band'."""
MEMORY_TOLERANCE = 0.10


@dataclass
class Check:
    name: str
    status: str
    """pass | fail | n/a"""
    detail: str
    measured: float | None = None
    expected: float | None = None

    @property
    def ratio(self) -> float | None:
        if self.measured is None or not self.expected:
            return None
        return self.measured / self.expected


@dataclass
class Verdict:
    run: str
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.status != "fail" for c in self.checks)

    def to_dict(self) -> dict:
        return {"run": self.run, "ok": self.ok,
                "checks": [dict(asdict(c), ratio=c.ratio) for c in self.checks]}


def read_golden(path: Path) -> dict[int, float]:
    """`step loss` per line; '#' starts a comment. Errors name the line."""
    if not path.is_file():
        raise GenconfError(f"golden file {path} does not exist")
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise GenconfError(f"golden file {path} cannot be read as text: {exc}") from None
    out: dict[int, float] = {}
    for number, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        parts = text.split()
        try:
            step, loss = int(parts[0]), float(parts[1])
            if len(parts) != 2:
                raise ValueError
        except (ValueError, IndexError):
            raise GenconfError(f"{path}:{number}: expected 'step loss', got {line!r}") from None
        if not math.isfinite(loss):
            raise GenconfError(f"{path}:{number}: the golden loss must be a finite number, got {parts[1]!r}")
        out[step] = loss
    if not out:
        raise GenconfError(f"golden file {path} has no 'step loss' lines")
    return out


def write_golden(path: Path, losses: dict[int, float], header: str = "") -> None:
    lines = [f"# {line}" for line in header.splitlines()] + [f"{step} {loss:.6f}" for step, loss in sorted(losses.items())]
    path.write_text("\n".join(lines) + "\n")


def read_metrics(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    if not path.is_file():
        runs = run / "runs"
        if (run / "plan.json").is_file() and runs.is_dir():
            names = sorted(p.name for p in runs.iterdir() if (p / "metrics.jsonl").is_file())
            raise GenconfError(f"{run} is an artifacts directory: give one of its runs"
                               + (f" ({', '.join(str(runs / n) for n in names[-3:])})" if names else
                                  " (none under runs/ yet)"))
        if not run.exists() or run.is_file():  # it read 'has no metrics.jsonl' for a typo or a file
            raise GenconfError(f"{run} {'does not exist' if not run.exists() else 'is a file'}: give a run directory "
                               f"(DIR/runs/<name>, with metrics.jsonl)")
        raise GenconfError(f"{run} has no metrics.jsonl (is it a genconf run directory?)")
    rows = []
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise GenconfError(f"{path} cannot be read as text: {exc}") from None
    lines = text.splitlines()
    for number, line in enumerate(lines, 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                if number == len(lines) and not text.endswith("\n"):
                    break  # a run killed while writing its last line: the steps before it are the run's
                raise GenconfError(f"{path}:{number}: not a JSON line") from None
    if not rows:
        raise GenconfError(f"{path} is empty: the run logged no step")
    return rows


def check_loss(rows: list[dict], golden: dict[int, float] | None, tolerance: float,
               min_drop: float | None = DEFAULT_MIN_DROP, floor_nats: float | None = None) -> Check:
    losses = {int(r["step"]): float(r["loss"]) for r in rows}
    if golden:
        missing = sorted(set(golden) - set(losses))
        if missing:
            return Check("loss", "fail", f"the run has no step {missing[0]} of the golden curve "
                                         f"(ran steps {min(losses)}..{max(losses)})")
        def gap(step: int) -> float:
            diff = abs(losses[step] - golden[step])
            return diff if math.isfinite(diff) else math.inf  # a NaN loss is as far as can be, not within tolerance

        worst = max(golden, key=gap)
        diff = gap(worst)
        if diff > tolerance:
            # A golden of another length is likely another run's (another recipe, another --steps): say so.
            other = (f"; the golden curve has {len(golden)} steps, the run {len(losses)}: is it this run's?"
                     if len(golden) != len(losses) else "")
            return Check("loss", "fail", f"step {worst}: loss {losses[worst]:.6f} vs golden {golden[worst]:.6f} "
                                         f"(|diff| {diff:.2e} > tolerance {tolerance:g}){other}", losses[worst],
                         golden[worst])
        return Check("loss", "pass", f"{len(golden)} steps within {tolerance:g} of the golden curve "
                                     f"(largest |diff| {diff:.2e} at step {worst})", losses[worst], golden[worst])
    from genconf.run import loss_rule

    by_step = {int(r["step"]): r for r in rows}
    steps = sorted(by_step)
    lrs = [by_step[s].get("lr") for s in steps]
    j = loss_rule.judge(steps, [losses[s] for s in steps], lrs=lrs if all(v is not None for v in lrs) else None,
                        floor_nats=floor_nats)
    if j.status == "pass" and min_drop is not None and not j.last_loss <= j.first_loss * (1 - min_drop):
        return Check("loss", "fail", f"loss did not fall by {min_drop:.0%} (--min-drop): {j.first_loss:.4f} -> "
                                     f"{j.last_loss:.4f}", j.last_loss, j.first_loss)
    return Check("loss", j.status, f"{j.detail} (no golden file)", j.last_loss, j.first_loss)


def loss_floor_nats(config: dict) -> float | None:
    """The labels' unigram entropy for the run's data (genconf.train.label_entropy), None where it cannot be
    computed (no config, no train extra, an unreadable token file)."""
    if not config.get("model") or not config.get("plan") or not config.get("train"):
        return None
    try:
        from genconf.train.label_entropy import label_entropy_nats
    except ImportError:
        return None
    try:
        return label_entropy_nats(config)
    except (KeyError, TypeError, ValueError, OSError):
        return None


def check_model_states(rows: list[dict]) -> Check:
    first = rows[0]
    if "measured_param_bytes" not in first:
        return Check("model states", "n/a", "the run did not record parameter/optimizer bytes")
    pairs = [("params", first["measured_param_bytes"], first["planned_param_bytes"]),
             ("optimizer", first["measured_optimizer_bytes"], first["planned_optimizer_bytes"])]
    bad = [(n, m, p) for n, m, p in pairs if m != p]
    if bad:
        n, m, p = bad[0]
        return Check("model states", "fail", f"{n}: measured {m:,} bytes vs planned {p:,}", m, p)
    # Each pipeline stage against its own plan (runs before this field kept only the maxima over ranks).
    off = [(n, first.get(key, 0)) for n, key in (("params", "param_bytes_off_by"),
                                                 ("optimizer", "optimizer_bytes_off_by"))]
    off = [(n, b) for n, b in off if b]
    if off:
        n, b = off[0]
        return Check("model states", "fail", f"{n}: a pipeline stage's measured bytes differ from its own plan by "
                                             f"{b:,} bytes (the maxima over ranks agree)", b, 0)
    return Check("model states", "pass", f"params {pairs[0][1]:,} and optimizer {pairs[1][1]:,} bytes per GPU: "
                                         "equal to the memory model", pairs[0][1], pairs[0][2])


def _likely_cause(config: dict, versions: dict, ratio: float) -> str:
    plan = config["plan"]
    if plan.get("layer_spec") == "te" and not versions.get("transformer-engine"):
        return "Transformer Engine is not installed, so the local (unfused) layers ran instead of TE's"
    if ratio < 0.5:
        return "far off: check that every rank got its own GPU and that NCCL uses NVLink/InfiniBand (NCCL_DEBUG=INFO)"
    if plan.get("pp", 1) > 1:
        return "pipeline bubble or p2p stalls larger than modelled (more micro-batches or virtual stages help)"
    if plan.get("dp", 1) > 1:
        return "data-parallel communication not hidden behind backward (check --overlap-grad-reduce, bucket sizes)"
    return "kernel efficiency below the calibration for this GPU (first steps include warm-up: run more steps)"


def check_speed_and_memory(rows: list[dict], config: dict, versions: dict, predicted: dict | None,
                           band: tuple[float, float] = THROUGHPUT_BAND,
                           peak_memory_gib: float | None = None) -> list[Check]:
    """Throughput and peak memory against the prediction for the run as it ran. Where `predicted` carries the
    prediction's own interval (`tokens_band`, `memory_band`: plan.json's interval, scaled to this run), the run is
    judged against it; otherwise against `band` (throughput) and MEMORY_TOLERANCE (memory)."""
    device = (versions.get("device") or "cpu").lower()
    gpu = (config.get("prediction") or {}).get("gpu", "?")
    if device == "cpu" or predicted is None:
        why = (f"ran on the CPU; the plan predicts {gpu}" if device == "cpu"
               else f"no prediction for this device ({device})")
        return [Check("throughput", "n/a", why), Check("peak memory", "n/a", why)]
    steady = rows[2:] if len(rows) > 4 else rows[1:] or rows
    measured = statistics.median(r["tokens_per_s_per_gpu"] for r in steady)
    expected = predicted["tokens_per_s_per_gpu"]
    ratio = measured / expected
    low, high = band
    interval = predicted.get("tokens_band")
    if interval:
        low, high = interval[0] / expected, interval[1] / expected
    within = (f"within the prediction's interval {interval[0]:,.0f}-{interval[1]:,.0f}" if interval
              else "within band")
    if low <= ratio <= high:
        speed = Check("throughput", "pass", f"{measured:,.0f} tokens/s/GPU vs predicted {expected:,.0f} "
                                            f"(x{ratio:.2f}, {within})", measured, expected)
    elif ratio < low:
        speed = Check("throughput", "fail", f"{measured:,.0f} tokens/s/GPU vs predicted {expected:,.0f} (x{ratio:.2f}): "
                                            f"slower than predicted; likely: {_likely_cause(config, versions, ratio)}",
                      measured, expected)
    else:
        speed = Check("throughput", "pass", f"{measured:,.0f} tokens/s/GPU vs predicted {expected:,.0f} "
                                            f"(x{ratio:.2f}, faster than predicted)", measured, expected)
    peak = max(r.get("peak_mem_gib", 0.0) for r in rows)
    planned = min(predicted["peak_mem_gib"], peak_memory_gib) if peak_memory_gib else predicted["peak_mem_gib"]
    memory_band = predicted.get("memory_band")
    limit = memory_band[1] if memory_band and not peak_memory_gib else planned * (1 + MEMORY_TOLERANCE)
    status = "pass" if peak <= limit else "fail"
    against = (f", interval up to {memory_band[1]:.2f} GiB" if memory_band and not peak_memory_gib
               else f", limit {limit:.2f} GiB")
    mem = Check("peak memory", status, f"{peak:.2f} GiB allocated at peak vs planned {planned:.2f} GiB "
                                       f"(x{peak / planned:.2f}{against})", peak, planned)
    return [speed, mem]


def predict_run(config: dict, gpu_name: str) -> dict | None:
    """The planner's numbers for the run exactly as it ran (shrunk model and all) on `gpu_name`."""
    from genconf.catalog.clusters import resolve_cluster
    from genconf.catalog.hardware import calibration_for
    from genconf.plan.cost import step_cost
    from genconf.plan.memory import GIB, estimate
    from genconf.plan.planfile import model_from_dict, plan_from_dict

    try:
        model, plan = model_from_dict(config["model"]), plan_from_dict(config["plan"])
        if (config.get("speed") or {}).get("compile") and runconfig.compile_supported(plan):
            plan = replace(plan, torch_compile=True)  # the runner compiled its blocks: priced so
        cluster = resolve_cluster(None, gpu=gpu_name)
        cal = calibration_for(cluster.gpu.name)
        cost = step_cost(model, plan, cluster, cal)
        mem = estimate(model, plan, cluster)
    except (GenconfError, ValueError):
        return None
    return {"tokens_per_s_per_gpu": cost.tokens_per_s_per_gpu, "peak_mem_gib": mem.peak.total_bytes / GIB}


# --- the prediction for the run as it ran, with plan.json's interval (also what verify --plot draws) ----

def _interval(sections: list[dict], key: str) -> tuple[float, float] | None:
    """An interval [low, high] for `key` where plan.json carries one: `<key>_interval` ([low, high] or
    {low, high}), `intervals: {<key>: ...}`, or `<key>_low` with `<key>_high`, in any of the given sections."""
    def pair(value) -> tuple[float, float] | None:
        if isinstance(value, (list, tuple)) and len(value) == 2:
            return float(value[0]), float(value[1])
        if isinstance(value, dict):
            low = value.get("low", value.get("lo"))
            high = value.get("high", value.get("hi"))
            if low is not None and high is not None:
                return float(low), float(high)
        return None

    for section in sections:
        if not isinstance(section, dict):
            continue
        for candidate in (section.get(f"{key}_interval"), (section.get("intervals") or {}).get(key),
                          (section.get("interval") or {}).get(key)):
            found = pair(candidate)
            if found:
                return found
        if f"{key}_low" in section and f"{key}_high" in section:
            return float(section[f"{key}_low"]), float(section[f"{key}_high"])
    return None


def _plan_json(run: Path, config: dict) -> dict | None:
    for artifacts in (config.get("artifacts"), run.parent.parent):
        if artifacts and (Path(artifacts) / "plan.json").is_file():
            try:
                return json.loads((Path(artifacts) / "plan.json").read_text())
            except (OSError, json.JSONDecodeError):
                return None
    return None


@dataclass(frozen=True)
class Prediction:
    gpu: str
    """The GPU the numbers are for."""
    comparable: bool
    """The run ran on that GPU (a CPU run is compared with nothing; `genconf verify` says n/a)."""
    tokens_per_s_per_gpu: float | None
    peak_mem_gib: float | None
    tokens_band: tuple[float, float] | None
    memory_band: tuple[float, float] | None


def prediction_for(run: Path, config: dict, versions: dict) -> Prediction | None:
    """The planner's numbers for the run as it ran: on its own GPU, or on the plan's GPU for a CPU run. Where
    plan.json carries an interval, the same relative interval around this prediction."""
    from genconf.catalog.hardware import gpu_for_device_name

    device = (versions.get("device") or "cpu").lower()
    own = gpu_for_device_name(device) if device != "cpu" else None
    gpu = own or (config.get("prediction") or {}).get("gpu")
    if not gpu or not config.get("model"):
        return None
    numbers = predict_run(config, gpu)
    if numbers is None:
        return None
    plan = _plan_json(run, config) or {}
    perf, memory = plan.get("perf") or {}, plan.get("memory") or {}
    sections = [perf, memory, plan]

    def relative(key: str, full: float | None, value: float) -> tuple[float, float] | None:
        band = _interval(sections, key)
        if band is None or not full:
            return None
        return band[0] / full * value, band[1] / full * value

    tokens = numbers["tokens_per_s_per_gpu"]
    mem = numbers["peak_mem_gib"]
    mem_band = (relative("total_gib", memory.get("total_gib"), mem)
                or relative("peak_mem_gib", memory.get("total_gib"), mem))
    return Prediction(gpu=gpu, comparable=own is not None, tokens_per_s_per_gpu=tokens, peak_mem_gib=mem,
                      tokens_band=relative("tokens_per_s_per_gpu", perf.get("tokens_per_s_per_gpu"), tokens),
                      memory_band=mem_band)


SMOKE_LOSS_TOLERANCE = 5e-5
"""|loss - golden| allowed at every step of a CPU smoke run (genconf ci, and verify of a recipe's smoke run). Measured,
not guessed: across ATen/oneDNN/MKL capability settings on one machine the FP32 smoke curves move by at most 1.9e-6
(benchmarks/results/cpu_numerics.md); 25x that, rounded up, leaves room for CPUs we have not seen (oneDNN also
blocks by cache size), and a real change to the model, the data or the optimizer moves the curve by 1e-3 or more."""


def check_completed(rows: list[dict], config: dict, run: Path) -> Check:
    """The run trained through its configured steps (its `finished` marker, genconf.train.preempt): a run preempted or
    killed part-way is no pass, whatever its loss so far."""
    from genconf.train import preempt

    steps = (config.get("train") or {}).get("train_steps")
    done = (rows[-1]["step"] + 1) if rows else 0
    if preempt.read_finished(run) is not None or not steps or done >= steps:
        return Check("completed", "pass", f"{done} of {steps or done} steps", measured=done, expected=steps)
    marker = preempt.read_marker(run)
    why = (f"preempted after step {marker.get('step')}; continue it with genconf launch ... --resume" if marker
           else "no finished marker: stopped or killed part-way")
    return Check("completed", "fail", f"stopped at {done} of {steps} steps ({why})", measured=done, expected=steps)


def read_run_json(run: Path, name: str) -> dict:
    """A run directory's config.json or versions.json ({} where it has none); a damaged one is one line naming it (a
    truncated config.json was a JSONDecodeError traceback)."""
    path = run / name
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise GenconfError(f"{path} cannot be read as text: {exc}") from None
    except json.JSONDecodeError as exc:
        raise GenconfError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg}); genconf launch writes it when "
                           f"the run starts") from None
    if not isinstance(data, dict):
        raise GenconfError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def recipe_golden(run: Path) -> tuple[Path, float] | None:
    """The golden curve and tolerance of the recipe smoke variant this run is (plan.json's recipe: name, version,
    smoke), where that recipe is still at that version and the run trained the plan's model, layout and schedule
    unchanged (no launch flag altered them); None otherwise."""
    from genconf.catalog import recipes

    config = read_run_json(run, "config.json")
    plan = _plan_json(run, config) or {}
    tag = plan.get("recipe") or {}
    if not tag.get("smoke") or not config:
        return None
    try:
        recipe = recipes.load_recipe(str(tag.get("name")))
    except GenconfError:
        return None
    golden = recipe.golden_path
    if recipe.version != tag.get("version") or golden is None or not golden.is_file():
        return None
    for key in ("model", "plan", "train"):
        ran, planned = config.get(key) or {}, plan.get(key) or {}
        if any(k in planned and planned[k] != v for k, v in ran.items()):
            return None
    return golden, float(recipe.section("expect").get("loss_tolerance", SMOKE_LOSS_TOLERANCE))


def verify(run: Path, *, golden: Path | None = None, tolerance: float | None = None,
           min_drop: float | None = DEFAULT_MIN_DROP, band: tuple[float, float] = THROUGHPUT_BAND,
           peak_memory_gib: float | None = None) -> Verdict:
    rows = read_metrics(run)
    config = read_run_json(run, "config.json")
    versions = read_run_json(run, "versions.json")
    verdict = Verdict(str(run))
    golden_curve = read_golden(golden) if golden else None
    floor = None if golden_curve else loss_floor_nats(config)
    verdict.checks.append(check_loss(rows, golden_curve, tolerance if tolerance is not None else 1e-4, min_drop, floor))
    verdict.checks.append(check_completed(rows, config, run))
    verdict.checks.append(check_model_states(rows))
    predicted = None
    device = (versions.get("device") or "cpu").lower()
    if device != "cpu" and config:
        from genconf.catalog.hardware import gpu_for_device_name

        name = gpu_for_device_name(device)
        predicted = predict_run(config, name) if name else None
        if predicted is not None:
            own = prediction_for(run, config, versions)  # plan.json's intervals, scaled to this run
            if own is not None and own.comparable:
                predicted = dict(predicted, tokens_band=own.tokens_band, memory_band=own.memory_band)
    verdict.checks += check_speed_and_memory(rows, config, versions, predicted, band, peak_memory_gib)
    return verdict
