"""`genconf calibrate`: close the loop between what the cost model assumes and what the GPUs at hand do.

- `genconf calibrate --bench [-o FILE]` runs genconf.train.bench under torchrun on this machine's GPUs
  (GEMMs at the model's layer shapes in BF16/FP8, fused and unfused attention, element-wise bandwidth, NCCL
  collectives over the ranks) and fits the kernel-level terms to it.
- `genconf calibrate RUN_DIR... [-o FILE]` reads measured runs (metrics.jsonl, config.json, versions.json)
  and refits the terms their step times inform (genconf.plan.fit.informed_terms).
- `genconf --calibration FILE ...` plans with the file's terms over the GPU's built-in calibration.

The file (YAML, genconf.catalog.calibration_file) names every term it sets, the value it replaces and where the
value came from (bench tables or run directories), with the fit's error before and after.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from genconf.catalog.calibration_file import FORMAT, _typed, term_names
from genconf.plan import fit
from genconf.plan.cost import Calibration
from genconf.plan.errors import GenconfError

EFFICIENCY_BOUNDS = (0.02, 1.0)
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n}
"""Bytes each rank moves per buffer byte (nccl-tests' bus bandwidth factors, its PERFORMANCE.md): the cost
model's ring all-reduce is 2(n-1)/n x bytes / bandwidth, all-gather and reduce-scatter (n-1)/n x bytes."""
SECONDS_BOUNDS = (1e-7, 10.0)


BENCH_CALL_FLOOR_S = 30e-6
"""Each bench row times one call with CUDA events, which costs a fixed time beyond the kernel's work. The cost model
leaves it out (a training step queues kernels back to back), so the bench's predictions add it to every timed
call. This is its upper bound and the value for tables without the sizes to measure it (the smallest GEMM of
benchmarks/data/h100_kernels takes 36 us; tests/plan/test_kernels.py fits the built-in terms with it)."""


def call_floor_s(tables: dict) -> float:
    """The bench timer's per-call cost on this machine, from its element-wise add rows: the two largest sizes are
    bandwidth-bound and give the bandwidth; what the smallest takes beyond its bytes at that bandwidth is the floor
    (within [0, BENCH_CALL_FLOOR_S]). On the H200 it is about 7 us: with 30 us assumed, every fitted efficiency
    absorbed the difference (GEMM 0.86, HBM at its bound 1.0) and the calibrated predictions came out 1.08-1.22x
    the measured runs (benchmarks/results/gpu.md; benchmarks/gpu_calibration.py refits without it)."""
    rows = sorted(tables.get("bandwidth") or [], key=lambda r: float(r["bytes_moved"]))
    if len({float(r["bytes_moved"]) for r in rows}) < 3:
        return BENCH_CALL_FLOOR_S
    (b0, t0), (b1, t1), (b2, t2) = [(float(r["bytes_moved"]), float(r["seconds"])) for r in (rows[0], rows[-2], rows[-1])]
    if b2 <= b1 or t2 <= t1:
        return BENCH_CALL_FLOOR_S
    return min(BENCH_CALL_FLOOR_S, max(0.0, t0 - b0 * (t2 - t1) / (b2 - b1)))


def as_terms(cal) -> dict[str, float]:
    """The calibration's scalar terms by name (what a fit may move)."""
    return {name: float(getattr(cal, name)) for name in term_names()}


def _bounds(name: str) -> tuple[float, float]:
    if name.endswith("_efficiency"):
        return EFFICIENCY_BOUNDS
    if name.endswith("_s"):
        return SECONDS_BOUNDS
    return (1e-3, 1e3)


def _calibration(terms: dict[str, float], base: Calibration | None = None) -> Calibration:
    """`base` (default: the cost model's defaults) with the scalar terms set."""
    if base is None:
        return Calibration(**_typed(terms))
    return dataclasses.replace(base, **_typed(terms))


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _term_entries(result: fit.FitResult, base: dict[str, float], source: str, count: int) -> dict:
    return {name: {"value": round(result.terms[name], 6), "before": round(base[name], 6), "from": source,
                   "observations": count} for name in result.fitted}


def _fit_summary(result: fit.FitResult) -> dict:
    summary = {"terms": list(result.fitted), "before_log_rmse": round(result.before_log_rmse, 6),
               "after_log_rmse": round(result.after_log_rmse, 6), "at_bound": list(result.at_bound)}
    if result.uninformed:
        summary["uninformed"] = list(result.uninformed)  # named, but no observation depends on them: not written
    return summary


# --- bench tables -> observations ------------------------------------------------------------------

def _at_boost(terms: dict[str, float], base: Calibration) -> Calibration:
    """The calibration a bench row is predicted with: clock_factor (and fp8_clock_ratio) 1. Each row times a few calls of one kernel,
    which run at the boost clock, as the H100 kernel tables behind the built-in kernel terms did; a training
    step's sustained clock (clock_factor, Hopper's measured under load, and fp8_clock_ratio) stays the file's. Fitting the GEMM efficiency
    at the sustained clock put the boost into it: on an H200 every calibrated prediction came out 1.2-1.3x
    the measured tokens/s while the built-in ones were within 7% (benchmarks/results/gpu_runs/README.md, call 2)."""
    return _calibration({**terms, "clock_factor": 1.0, "fp8_clock_ratio": 1.0}, base)


def bench_groups(tables: dict, gpu, cluster) -> dict[str, tuple[list[str], list[fit.Observation], str]]:
    """Per group of terms: (candidate terms, observations, what they are). Each group is fitted on its own:
    GEMM shape terms from the BF16 GEMMs, FP8 efficiency from the FP8 GEMMs (at the fitted k_half), the
    attention terms from the fused attention, HBM from the element-wise add, the link from the collectives."""
    from genconf.catalog.hardware import calibration_for
    from genconf.plan import cost, kernels

    base = calibration_for(gpu.name)  # the fields a fit does not move (bands, byte pairs)
    floor = call_floor_s(tables)
    groups: dict[str, tuple[list[str], list[fit.Observation], str]] = {}
    model = tables.get("model", "?")

    def gemm_obs(row: dict, fp8: bool) -> fit.Observation:
        m, n, k = int(row["m"]), int(row["n"]), int(row["k"])
        dtype = "fp8" if fp8 else "bf16"

        def predict(t, m=m, n=n, k=k):
            return cost.gemm_s(gpu, _at_boost(t, base), m, n, k, dtype) + floor
        return fit.Observation(label=f"gemm {row['dtype']} {m}x{n}x{k} ({row['layer']} {row['pass']} tp{row['tp']})",
                               measured_s=float(row["seconds"]), predict_s=predict)

    for dtype, terms in (("bf16", ["gemm_efficiency", "gemm_tile_overhead_s"]), ("fp8", ["fp8_gemm_efficiency"])):
        rows = [r for r in tables.get("gemm", []) if r["dtype"] == dtype]
        if rows and (dtype == "bf16" or gpu.peak_tflops("fp8")):
            groups[f"gemm_{dtype}"] = (terms, [gemm_obs(r, dtype == "fp8") for r in rows],
                                       f"bench: {len(rows)} {dtype.upper()} GEMMs at {model}'s layer shapes")
    flash = [r for r in tables.get("attention", []) if r["kind"] == "flash"]
    if flash:
        obs = []
        for r in flash:
            shape = dict(batch_heads=int(r["batch"]) * int(r["heads"]), seq_q=int(r["seq"]), seq_k=int(r["seq"]),
                         head_dim=int(r["head_dim"]), causal=True, sms=gpu.num_sms)

            def attention_s(t, backward: bool, shape=shape) -> float:
                # genconf.plan.kernels.flash_attention_s, at the terms' efficiencies and per-wave costs
                way = "bwd" if backward else "fwd"
                clock = cost.sustained_clock(gpu, _at_boost(t, base), gemm=False)
                return kernels.flash_attention_s(**shape, peak_tflops=gpu.peak_bf16_tflops * clock,
                                                 efficiency=t[f"attention_{way}_efficiency"],
                                                 tile_overhead_s=t[f"attention_{way}_tile_s"], backward=backward)
            obs.append(fit.Observation(
                label=f"flash attention fwd b{r['batch']} h{r['heads']} s{r['seq']} d{r['head_dim']}",
                measured_s=float(r["fwd_s"]), predict_s=lambda t, a=attention_s: a(t, False) + floor))
            obs.append(fit.Observation(
                label=f"flash attention fwd+bwd b{r['batch']} h{r['heads']} s{r['seq']} d{r['head_dim']}",
                measured_s=float(r["fwd_bwd_s"]),
                predict_s=lambda t, a=attention_s: a(t, False) + a(t, True) + floor))
        groups["attention"] = (["attention_fwd_efficiency", "attention_bwd_efficiency"], obs,
                               f"bench: {len(flash)} fused causal attention shapes of {model}, forward and backward")
    bw = tables.get("bandwidth", [])
    if bw:
        groups["hbm"] = (["hbm_efficiency"], [fit.Observation(
            label=f"add {r['mib_per_operand']} MiB", measured_s=float(r["seconds"]),
            predict_s=lambda t, b=float(r["bytes_moved"]): kernels.memory_bound_s(
                b, hbm_tbyte_per_s=gpu.hbm_tbyte_per_s, efficiency=t["hbm_efficiency"]) + floor)
            for r in bw], f"bench: element-wise add at {len(bw)} sizes")
    coll = tables.get("collectives", [])
    if coll:
        nodes = int(tables.get("environment", {}).get("nodes", 1))
        ranks = int(coll[0]["ranks"])
        nvlink = nodes == 1 and ranks <= cluster.nvlink_domain
        link_term = "nvlink_efficiency" if nvlink else "ib_efficiency"
        link = cluster.nvlink_gbyte_per_s_one_way if nvlink else cluster.ib_gbyte_per_s_per_gpu
        if not nvlink and nodes == 1 and cluster.pcie_inside_node:
            # Bridged pairs: one node's ring beyond a pair runs over PCIe, priced with ib_efficiency (cost.py).
            link = cluster.pcie_peer_gbyte_per_s_per_gpu
        ring = {"all_reduce": kernels.ring_all_reduce_s, "all_gather": kernels.ring_gather_s,
                "reduce_scatter": kernels.ring_gather_s}
        obs = [fit.Observation(
            label=f"{r['op']} {r['bytes']} B over {r['ranks']} ranks", measured_s=float(r["seconds"]),
            predict_s=lambda t, b=float(r["bytes"]), op=ring[r["op"]]: op(
                b, ranks, bus_gbyte_per_s=link * t[link_term], latency_s=t["collective_latency_s"])) for r in coll]
        groups["collectives"] = ([link_term, "collective_latency_s"], obs,
                                 f"bench: {len(coll)} collectives over {ranks} ranks on {nodes} node(s)")
    return groups


def fit_bench(tables: dict, gpu_name: str | None) -> dict:
    """The calibration file's content for a bench's tables: fitted terms per group (none without a GPU)."""
    env = dict(tables.get("environment") or {})
    content = {"format": FORMAT, "gpu": gpu_name, "source": "bench", "created_utc": _now(), "environment": env,
               "terms": {}, "fit": {}}
    if gpu_name is None:
        content["note"] = ("measured on a CPU or an unknown device: the tables are kept, no term is fitted "
                           "(give --gpu NAME to fit them against a catalog GPU)")
    else:
        from genconf.catalog.clusters import resolve_cluster
        from genconf.catalog.hardware import calibration_for

        # The collectives ran over world_size ranks on `nodes` nodes: a cluster of that shape says which link.
        nodes = max(1, int(env.get("nodes") or 1))
        per_node = max(1, int(env.get("world_size") or 1) // nodes)
        cluster = resolve_cluster(None, gpu=gpu_name, gpus_per_node=per_node)
        base = as_terms(calibration_for(gpu_name))
        current = dict(base)
        # HBM first: the GEMMs' memory-bound floor and split-K reductions run at the HBM term.
        groups = sorted(bench_groups(tables, cluster.gpu, cluster).items(), key=lambda g: g[0] != "hbm")
        for group, (candidates, obs, source) in groups:
            names = fit.informed_terms(current, candidates, obs)
            if not names:
                continue
            result = fit.fit_terms(current, names, obs, bounds={n: _bounds(n) for n in names})
            current.update({n: result.terms[n] for n in names})
            content["terms"].update(_term_entries(result, base, source, len(obs)))
            content["fit"][group] = _fit_summary(result)
    content["measurements"] = {k: tables.get(k, []) for k in ("gemm", "attention", "bandwidth", "collectives")}
    for row in content["measurements"]["collectives"]:
        row["busbw_gbyte_per_s"] = row["algbw_gbyte_per_s"] * BUS_FACTOR[row["op"]](int(row["ranks"]))
    content["measurements"]["gemm_median_tflops_per_rank"] = tables.get("gemm_median_tflops_per_rank")
    content["measurements"]["timer_call_floor_s"] = call_floor_s(tables)  # added to every timed call in the fits
    return content


# --- runs -> observations ---------------------------------------------------------------------------

@dataclass(frozen=True)
class RunCase:
    run: str
    model: object
    plan: object
    gpu: str
    measured_step_time_s: float
    steps: int


def steady_step_time_s(rows: list[dict]) -> float:
    """Median step time without the first steps (allocator warm-up, compilation): the same rows verify uses."""
    steady = rows[2:] if len(rows) > 4 else rows[1:] or rows
    return statistics.median(float(r["step_time_s"]) for r in steady)


def read_run(run_dir: str | Path, gpu: str | None = None) -> RunCase:
    from genconf.catalog.hardware import gpu_for_device_name
    from genconf.plan.planfile import model_from_dict, plan_from_dict
    from genconf.run import verify

    run = Path(run_dir)
    rows = verify.read_metrics(run)
    for name in ("config.json", "versions.json"):
        if not (run / name).is_file():
            raise GenconfError(f"{run} has no {name} (is it a genconf run directory?)")
    config, versions = verify.read_run_json(run, "config.json"), verify.read_run_json(run, "versions.json")
    device = versions.get("device") or "cpu"
    name = gpu or gpu_for_device_name(device)
    if name is None:
        raise GenconfError(f"{run} ran on {device!r}, not a catalog GPU: it calibrates nothing (give --gpu NAME to "
                           "fit it against one anyway)")
    for key in ("model", "plan"):
        if key not in config:
            raise GenconfError(f"{run}/config.json has no '{key}' (genconf launch writes it when the run starts)")
        if not isinstance(config[key], dict):  # a list was an AttributeError traceback
            raise GenconfError(f"{run}/config.json: '{key}' must be a JSON object, got {type(config[key]).__name__}")
    try:
        model, plan = model_from_dict(config["model"]), plan_from_dict(config["plan"])
    except (KeyError, TypeError, ValueError) as exc:
        raise GenconfError(f"{run}/config.json: {exc}") from None
    return RunCase(run=str(run), model=model, plan=plan, gpu=name, measured_step_time_s=steady_step_time_s(rows),
                   steps=len(rows))


def fit_runs(run_dirs: list[str], *, gpu: str | None = None, terms: list[str] | None = None) -> dict:
    """The calibration file's content for measured runs: the terms their step times inform, refitted."""
    from genconf.catalog.clusters import resolve_cluster
    from genconf.catalog.hardware import calibration_for
    from genconf.plan.cost import step_cost

    if not run_dirs:
        raise GenconfError("calibrate: give run directories, or --bench")
    cases = [read_run(r, gpu) for r in run_dirs]
    gpus = sorted({c.gpu for c in cases})
    if len(gpus) > 1:
        raise GenconfError(f"calibrate: the runs are on different GPUs ({', '.join(gpus)}): one file per GPU")
    gpu_name = gpus[0]
    cluster = resolve_cluster(None, gpu=gpu_name)
    base_cal = calibration_for(gpu_name)
    base = as_terms(base_cal)
    obs = []
    for c in cases:
        def predict(t, c=c):
            return step_cost(c.model, c.plan, cluster, _calibration(t, base_cal)).step_time_s
        obs.append(fit.Observation(label=c.run, measured_s=c.measured_step_time_s, predict_s=predict))
    if terms:
        unknown = [t for t in terms if t not in base]
        if unknown:
            raise GenconfError(f"calibrate: unknown term '{unknown[0]}' (the cost model's terms: {', '.join(base)})")
        names = list(terms)
    else:
        candidates = [n for n in base if n.endswith("_efficiency") or n in ("step_overhead_s", "microbatch_overhead_s")]
        names = fit.informed_terms(base, candidates, obs)
    if len(names) > len(obs):
        raise GenconfError(f"calibrate: {len(names)} terms cannot be fitted to {len(obs)} runs")
    result = fit.fit_terms(base, names, obs, bounds={n: _bounds(n) for n in names})
    if names and not result.fitted:
        raise GenconfError(f"calibrate: the runs' predicted step times do not depend on {', '.join(names)}: nothing to "
                           f"fit (without --terms, calibrate picks the terms the runs inform)")
    source = f"runs: {', '.join(c.run for c in cases)}"
    versions = json.loads((Path(cases[0].run) / "versions.json").read_text())
    env = {k: versions.get(k) for k in ("device", "cuda", "torch", "deepspeed", "megatron-core", "transformer-engine",
                                         "genconf") if k in versions}
    return {"format": FORMAT, "gpu": gpu_name, "source": "runs", "created_utc": _now(), "environment": env,
            "terms": _term_entries(result, base, source, len(obs)),
            "runs": [{"run": row["label"], "steps": c.steps, "measured_step_time_s": row["measured_s"],
                      "predicted_step_time_s_before": row["predicted_s_before"],
                      "predicted_step_time_s_after": row["predicted_s_after"]} for row, c in zip(result.rows, cases)],
            "fit": {"runs": _fit_summary(result)}}


# --- the bench under torchrun ---------------------------------------------------------------------

DEFAULT_BENCH_MODEL = "1b"


def run_bench(*, nproc: int, model: str | None, tokens: int | None, tp: str | None, extra_env: dict | None = None,
              python: str = sys.executable, timeout_s: float | None = None) -> dict:
    """Start genconf.train.bench on `nproc` ranks (or in this torchrun's ranks when already under one) and
    return its tables. Without a CUDA GPU the bench fits nothing (fit_bench) and a 1B model's shapes take CPU
    minutes, so there it runs only for a model the caller names (a plumbing test)."""
    cuda = _cuda()
    if not cuda and model is None:
        raise GenconfError("calibrate --bench: no CUDA GPU on this machine, and the bench fits GPU terms only; "
                           "to test the plumbing on the CPU anyway, name a small model (--model tests/data/tiny-llama.yaml)")
    with tempfile.TemporaryDirectory(prefix="genconf-bench-") as tmp:
        out = Path(tmp) / "bench.json"
        args = ["-m", "genconf.train.bench", "--out", str(out), "--model", model or DEFAULT_BENCH_MODEL]
        if tokens:
            args += ["--tokens", str(tokens)]
        if tp:
            args += ["--tp", tp]
        if not cuda:  # a CPU run tests the plumbing: tiny sizes
            args += ["--bandwidth-mib", "1", "--collective-mib", "1", "--tokens", str(tokens or 128)]
        cmd = [python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *args]
        env = dict(os.environ, PYTHONUNBUFFERED="1", **(extra_env or {}))
        env.setdefault("OMP_NUM_THREADS", "1")
        print(f"genconf: calibrate: {' '.join(cmd)}", file=sys.stderr, flush=True)
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        if done.returncode != 0 or not out.is_file():
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise GenconfError(f"calibrate --bench: the benchmark exited with code {done.returncode}: {' | '.join(tail)}")
        return json.loads(out.read_text())


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        raise GenconfError("calibrate --bench needs the train extra: pip install 'genconf[train]'") from None
    return torch.cuda.is_available()


def default_nproc() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 1
