"""genconf calibrate: the fit recovers known terms from measurements the cost model generated, the file names
its terms and their provenance, and the bench's plumbing runs on CPU ranks with gloo."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from conftest import REPO, needs_torch
from genconf.catalog import calibration_file
from genconf.catalog.clusters import resolve_cluster
from genconf.catalog.hardware import calibration_for
from genconf.catalog.models import resolve_model
from genconf.plan import cost, fit, kernels
from genconf.plan.errors import GenconfError
from genconf.plan.specs import ParallelPlan
from genconf.run import calibrate

TINY_LLAMA = str(REPO / "tests" / "data" / "tiny-llama.yaml")
TRUTH = {"gemm_efficiency": 0.7, "fp8_gemm_efficiency": 0.55, "attention_fwd_efficiency": 0.45,
         "attention_bwd_efficiency": 0.35, "hbm_efficiency": 0.9, "nvlink_efficiency": 0.7,
         "collective_latency_s": 2e-5}


def h100():
    cluster = resolve_cluster(None, gpu="h100-sxm")
    return cluster, dict(calibrate.as_terms(calibration_for("h100-sxm")), **TRUTH)


def synthetic_bench_tables(truth: dict | None = None, floor_s: float = calibrate.BENCH_CALL_FLOOR_S) -> dict:
    """Bench tables whose times the cost model produced with `truth` (default TRUTH) on an H100 (olmo-1b's layer
    shapes), at the boost clock a few timed calls of one kernel run at (clock_factor 1), each call costing
    `floor_s` beyond its work."""
    cluster, t = h100()
    t.update(truth or {})
    gpu = cluster.gpu
    cal = calibrate._calibration({**t, "clock_factor": 1.0, "fp8_clock_ratio": 1.0}, calibration_for("h100-sxm"))
    model, _ = resolve_model("1b")
    gemm = []
    for tp in (1, 2, 4, 8):
        for m, n, k in {(m, n, k) for m in (256, 2048, 8192) for n, k in (((3 * model.hidden_size) // tp, model.hidden_size),
                                                                   (model.hidden_size, model.ffn_hidden_size // tp))
                        for m, n, k in ((m, n, k), (m, k, n), (k, n, m))}:
            for dtype in ("bf16", "fp8"):
                s = cost.gemm_s(gpu, cal, m, n, k, dtype) + floor_s
                gemm.append({"layer": "x", "pass": "fwd", "tp": tp, "dtype": dtype, "m": m, "n": n, "k": k, "seconds": s})
    attention = []
    for heads, seq in ((16, 2048), (8, 4096), (4, 8192)):
        shape = dict(batch_heads=4 * heads, seq_q=seq, seq_k=seq, head_dim=128, causal=True, sms=gpu.num_sms,
                     peak_tflops=gpu.peak_bf16_tflops)
        fwd = kernels.flash_attention_s(**shape, efficiency=t["attention_fwd_efficiency"],
                                        tile_overhead_s=t["attention_fwd_tile_s"])
        bwd = kernels.flash_attention_s(**shape, efficiency=t["attention_bwd_efficiency"],
                                        tile_overhead_s=t["attention_bwd_tile_s"], backward=True)
        attention.append({"kind": "flash", "batch": 4, "heads": heads, "seq": seq, "head_dim": 128,
                          "fwd_flops": 4.0 * 4 * heads * seq * seq * 128 / 2,
                          "fwd_s": fwd + floor_s, "fwd_bwd_s": fwd + bwd + floor_s})
    bandwidth = [{"op": "add", "mib_per_operand": mib, "bytes_moved": 3 * mib * 2**20,
                  "seconds": 3 * mib * 2**20 / (gpu.hbm_tbyte_per_s * 1e12 * t["hbm_efficiency"])
                  + floor_s} for mib in (64, 512, 2048)]
    collectives = []
    for op, factor in (("all_reduce", 2 * 7 / 8), ("all_gather", 7 / 8), ("reduce_scatter", 7 / 8)):
        for mib in (1, 16, 128, 512):
            b = mib * 2**20
            # genconf.plan.kernels' rings: bytes x the bus factor over the bus bandwidth, latency growing with log2 n
            s = (factor * b / (cluster.nvlink_gbyte_per_s_one_way * 1e9 * t["nvlink_efficiency"])
                 + t["collective_latency_s"] * (1 + math.log2(8)))
            collectives.append({"op": op, "ranks": 8, "bytes": b, "seconds": s, "algbw_gbyte_per_s": b / s / 1e9})
    return {"model": "olmo-1b", "environment": {"device": "NVIDIA H100 80GB HBM3", "nodes": 1, "world_size": 8},
            "gemm": gemm, "attention": attention, "bandwidth": bandwidth, "collectives": collectives}


def test_bench_fit_recovers_the_terms_that_generated_the_tables(tmp_path):
    content = calibrate.fit_bench(synthetic_bench_tables(), "h100-sxm")
    terms = {name: entry["value"] for name, entry in content["terms"].items()}
    for name, value in TRUTH.items():
        assert terms[name] == pytest.approx(value, rel=1e-3), name
    assert content["terms"]["gemm_efficiency"]["before"] == calibration_for("h100-sxm").gemm_efficiency
    assert "BF16 GEMMs at olmo-1b's layer shapes" in content["terms"]["gemm_efficiency"]["from"]
    assert all(summary["after_log_rmse"] < 1e-4 for summary in content["fit"].values())
    assert content["measurements"]["collectives"][0]["busbw_gbyte_per_s"] > 0
    # The file round-trips and overrides exactly those terms.
    path = tmp_path / "cal.yaml"
    calibration_file.write_file(path, content)
    cf = calibration_file.read_file(path)
    assert cf.gpu == "h100-sxm" and set(cf.terms) == set(TRUTH)
    cal = calibration_file.apply(calibration_for("h100-sxm"), cf, "h100-sxm")
    assert cal.gemm_efficiency == pytest.approx(0.7, rel=1e-3)
    assert cal.step_overhead_s == calibration_for("h100-sxm").step_overhead_s  # untouched
    with pytest.raises(GenconfError, match="is for h100-sxm but the plan's GPU is a100-80gb"):
        calibration_file.apply(calibration_for("a100-80gb"), cf, "a100-80gb")


@pytest.mark.parametrize("floor_s", [7e-6, 14e-6])
def test_the_bench_measures_its_own_per_call_floor(floor_s):
    """A timed call costs a fixed time beyond its work (7 us on the H200, 14 us in the H100 tables): the element-wise
    rows give it, and the fit then recovers the efficiencies instead of absorbing the floor into them."""
    tables = synthetic_bench_tables(floor_s=floor_s)
    assert calibrate.call_floor_s(tables) == pytest.approx(floor_s, rel=1e-6)
    content = calibrate.fit_bench(tables, "h100-sxm")
    assert content["measurements"]["timer_call_floor_s"] == pytest.approx(floor_s, rel=1e-6)
    for name, value in TRUTH.items():
        assert content["terms"][name]["value"] == pytest.approx(value, rel=1e-3), name


def test_the_h100_kernel_tables_floor():
    """benchmarks/data/h100_kernels' add rows (64, 512, 4096 MiB): 3.07 TB/s from the two largest, 14 us per call."""
    rows = [{"bytes_moved": 3 * mib * 2**20, "seconds": s} for mib, s in ((64, 7.945600e-05), (512, 5.421440e-04),
                                                                          (4096, 4.215968e-03))]
    assert calibrate.call_floor_s({"bandwidth": rows}) == pytest.approx(14.0e-6, abs=0.5e-6)
    assert calibrate.call_floor_s({"bandwidth": rows[:2]}) == calibrate.BENCH_CALL_FLOOR_S  # two sizes: no estimate


def test_a_bench_that_measures_the_built_in_kernel_terms_leaves_the_prediction_unchanged():
    """The bench times kernels at the boost clock; a training step runs at the sustained one (clock_factor, an
    end-to-end term the bench does not move). A GPU whose kernels run as the built-in terms say must get the
    built-in step time back, not the boost folded into the efficiencies (on an H200: x1.2-1.3 too fast)."""
    from genconf.plan.cost import step_cost

    built_in = calibrate.as_terms(calibration_for("h100-sxm"))
    content = calibrate.fit_bench(synthetic_bench_tables({n: built_in[n] for n in TRUTH}), "h100-sxm")
    for name, entry in content["terms"].items():
        assert entry["value"] == pytest.approx(built_in[name], rel=1e-3), name
    assert "clock_factor" not in content["terms"]
    model, _ = resolve_model("1b")
    cluster = resolve_cluster(None, gpu="h100-sxm", gpus_per_node=1)
    plan = ParallelPlan(framework="fsdp", dp=1, mbs=8, gbs=32, seq_length=2048, zero_stage=0)
    cal = calibrate._calibration({n: e["value"] for n, e in content["terms"].items()}, calibration_for("h100-sxm"))
    assert step_cost(model, plan, cluster, cal).step_time_s == pytest.approx(
        step_cost(model, plan, cluster, calibration_for("h100-sxm")).step_time_s, rel=1e-3)


def write_run(root: Path, name: str, model, plan, step_time_s: float, device: str = "NVIDIA H100 80GB HBM3") -> Path:
    import dataclasses

    run = root / name
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"model": dataclasses.asdict(model), "plan": dataclasses.asdict(plan)}))
    (run / "versions.json").write_text(json.dumps({"device": device, "torch": "2.13.0"}))
    rows = [{"step": i, "loss": 5.0, "step_time_s": step_time_s * (3 if i == 0 else 1)} for i in range(8)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_runs_fit_recovers_a_known_efficiency(tmp_path):
    """Runs whose step times the model generated with gemm_efficiency 0.5: the fit finds 0.5 and says which
    runs and which term."""
    cluster, _ = h100()
    base = calibrate.as_terms(calibration_for("h100-sxm"))
    truth = dict(base, gemm_efficiency=0.5)
    model, _ = resolve_model("1b")
    plans = {"fsdp-dp1": ParallelPlan(framework="fsdp", dp=1, mbs=4, gbs=32, seq_length=2048, zero_stage=0),
             "ds-dp1": ParallelPlan(framework="deepspeed", dp=1, mbs=2, gbs=32, seq_length=2048, zero_stage=1)}
    runs = [str(write_run(tmp_path, name, model, plan,
                          cost.step_cost(model, plan, cluster, calibrate._calibration(truth)).step_time_s))
            for name, plan in plans.items()]
    content = calibrate.fit_runs(runs)
    assert content["gpu"] == "h100-sxm" and content["source"] == "runs"
    assert list(content["terms"])[0] == "gemm_efficiency"
    assert content["terms"]["gemm_efficiency"]["value"] == pytest.approx(0.5, rel=1e-4)
    assert content["terms"]["gemm_efficiency"]["from"] == f"runs: {runs[0]}, {runs[1]}"
    for row in content["runs"]:
        assert row["predicted_step_time_s_after"] == pytest.approx(row["measured_step_time_s"], rel=1e-4)
        assert row["predicted_step_time_s_before"] < row["measured_step_time_s"]  # 0.6 predicted faster
    # Forcing a term works too; a term the model does not have is one line.
    forced = calibrate.fit_runs(runs[:1], terms=["gemm_efficiency"])
    assert list(forced["terms"]) == ["gemm_efficiency"]
    with pytest.raises(GenconfError, match="unknown term 'gemm_speed'"):
        calibrate.fit_runs(runs, terms=["gemm_speed"])


def test_a_cpu_run_calibrates_nothing(tmp_path):
    model, _ = resolve_model(TINY_LLAMA)
    run = write_run(tmp_path, "cpu", model, ParallelPlan(framework="fsdp", dp=1, mbs=1, gbs=1, seq_length=64), 0.1,
                    device="cpu")
    with pytest.raises(GenconfError, match="ran on 'cpu', not a catalog GPU"):
        calibrate.fit_runs([str(run)])


def test_informed_terms_never_exceed_the_observations():
    cluster, _ = h100()
    base = calibrate.as_terms(calibration_for("h100-sxm"))
    model, _ = resolve_model("1b")
    plan = ParallelPlan(framework="fsdp", dp=1, mbs=4, gbs=32, seq_length=2048, zero_stage=0)
    obs = [fit.Observation(label="one", measured_s=1.0,
                           predict_s=lambda t: cost.step_cost(model, plan, cluster, calibrate._calibration(t)).step_time_s)]
    names = fit.informed_terms(base, [n for n in base if n.endswith("_efficiency")], obs)
    assert names == ["gemm_efficiency"]  # one run, one number: the term that moves its step time most


@pytest.mark.parametrize("text,message", [
    ("format: other/1\n", "format is 'other/1'"),
    ("format: genconf-calibration/1\ngpu: h100-sxm\nterms: {gemm_speed: {value: 1}}\n", "unknown term 'gemm_speed'"),
    ("format: genconf-calibration/1\ngpu: h100-sxm\nextra: 1\n", "unknown key 'extra'"),
    ("format: genconf-calibration/1\ngpu: h100-sxm\nterms: {gemm_efficiency: {value: fast}}\n", "is not a number"),
    # out of range: a planned MFU of 131% (-0.5), a ZeroDivisionError (0), a traceback from a negative overhead
    ("format: genconf-calibration/1\ngpu: h100-sxm\nterms: {gemm_efficiency: {value: -0.5}}\n",
     r"gemm_efficiency: -0.5 is out of range \(\(0, 1\]\)"),
    ("format: genconf-calibration/1\ngpu: h100-sxm\nterms: {gemm_efficiency: {value: 0}}\n", "out of range"),
    ("format: genconf-calibration/1\ngpu: h100-sxm\nterms: {gemm_efficiency: {value: 1.5}}\n", "out of range"),
    ("format: genconf-calibration/1\ngpu: h100-sxm\nterms: {step_overhead_s: {value: -1.0}}\n",
     r"step_overhead_s: -1.0 is out of range \(0 or more\)"),
    ("format: genconf-calibration/1\ngpu: h100-sxm\nterms: {clock_factor: {value: .inf}}\n", "out of range"),
])
def test_bad_files_are_one_line(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(GenconfError, match=message):
        calibration_file.read_file(path)


@needs_torch
def test_bench_runs_on_cpu_ranks_with_gloo(tmp_path):
    """The real benchmark on 2 CPU ranks (gloo): every table is there, the collectives span both ranks, and
    without a GPU nothing is fitted."""
    tables = calibrate.run_bench(nproc=2, model=TINY_LLAMA, tokens=64, tp="1,2", timeout_s=300)
    assert tables["environment"]["backend"] == "gloo" and tables["environment"]["world_size"] == 2
    assert {r["dtype"] for r in tables["gemm"]} == {"bf16", "fp8"}
    assert {r["kind"] for r in tables["attention"]} == {"flash", "unfused"}
    assert {r["op"] for r in tables["collectives"]} == {"all_reduce", "all_gather", "reduce_scatter"}
    assert all(r["ranks"] == 2 and r["seconds"] > 0 for r in tables["collectives"])
    assert len(tables["gemm_median_tflops_per_rank"]) == 2
    # The model's shapes: tiny-llama's fc1 at TP 1 is 64 -> 2 x 128 (SwiGLU).
    assert any(r["layer"] == "fc1" and r["pass"] == "fwd" and (r["m"], r["n"], r["k"]) == (64, 256, 64)
               for r in tables["gemm"])
    content = calibrate.fit_bench(tables, None)
    assert content["terms"] == {} and "no term is fitted" in content["note"]
    path = tmp_path / "cpu.yaml"
    calibration_file.write_file(path, content)
    cf = calibration_file.read_file(path)
    with pytest.raises(GenconfError, match="measured on a CPU"):
        calibration_file.apply(calibration_for("h100-sxm"), cf, "h100-sxm")


def genconf(*args: str) -> "subprocess.CompletedProcess":
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "genconf", *args], capture_output=True, text=True, cwd=REPO, timeout=600)


def test_the_loop_closes_through_the_cli(tmp_path):
    """A run of the plan genconf predicts, measured slower than predicted: `genconf calibrate RUN` refits, and
    `genconf --calibration FILE` then predicts the measured step time for that plan and says which file it used."""
    pins = ["--model", "1b", "--gpus", "1", "--gpu", "h100-sxm", "--gpus-per-node", "1", "--framework", "fsdp",
            "--zero", "0", "--mbs", "4", "--global-batch", "32", "--recompute", "none"]
    before = genconf(*pins, "--json")
    assert before.returncode == 0, before.stderr
    planned = json.loads(before.stdout)
    assert "calibration" not in planned  # the built-in calibration: the output is what it always was
    from genconf.plan.planfile import decode

    pf = decode(planned)
    model, plan = pf.model, pf.plan
    measured = planned["perf"]["step_time_s"] * 1.25
    run = write_run(tmp_path, "run", model, plan, measured)
    out = genconf("calibrate", str(run), "-o", str(tmp_path / "cal.yaml"))
    assert out.returncode == 0, out.stderr
    assert "gemm_efficiency" in out.stdout and "wrote" in out.stdout
    after = genconf(*pins, "--json", "--calibration", str(tmp_path / "cal.yaml"))
    assert after.returncode == 0, after.stderr
    result = json.loads(after.stdout)
    assert result["perf"]["step_time_s"] == pytest.approx(measured, rel=1e-3)
    assert result["calibration"]["file"] == str(tmp_path / "cal.yaml") and "gemm_efficiency" in result["calibration"]["terms"]
    text = genconf(*pins, "--calibration", str(tmp_path / "cal.yaml")).stdout
    assert f"calibration  {tmp_path / 'cal.yaml'} (runs on NVIDIA H100 80GB HBM3): gemm_efficiency" in text
    wrong = genconf("--model", "1b", "--gpus", "8", "--gpu", "a100-80gb", "--calibration", str(tmp_path / "cal.yaml"))
    assert wrong.returncode == 2 and "is for h100-sxm but the plan's GPU is a100-80gb" in wrong.stderr
    assert len(wrong.stderr.strip().splitlines()) == 1


@needs_torch
def test_calibrate_bench_cli_on_cpu(tmp_path):
    out = genconf("calibrate", "--bench", "--nproc", "2", "--model", TINY_LLAMA, "--tokens", "64", "--tp", "1",
                  "-o", str(tmp_path / "cpu.yaml"))
    assert out.returncode == 0, out.stderr[-2000:]
    assert "gpu none): no terms fitted" in out.stdout
    cf = calibration_file.read_file(tmp_path / "cpu.yaml")
    assert cf.environment["backend"] == "gloo" and cf.environment["world_size"] == 2 and cf.terms == {}
    refused = genconf("--model", "1b", "--gpus", "8", "--calibration", str(tmp_path / "cpu.yaml"))
    assert refused.returncode == 2 and "measured on a CPU" in refused.stderr


@needs_torch
def test_calibrate_bench_without_a_gpu_needs_a_named_model(tmp_path):
    # On a CPU the bench fits no term, and the default 1B shapes took over ten CPU minutes: refused at once,
    # in one line that says how to test the plumbing anyway.
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here: the bench runs")
    out = genconf("calibrate", "--bench", "-o", str(tmp_path / "never.yaml"))
    assert out.returncode == 2 and "no CUDA GPU" in out.stderr and "--model" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and not (tmp_path / "never.yaml").exists()


def test_calibrate_checks_its_input_before_the_benchmark_and_keeps_an_existing_file(tmp_path):
    """An existing calibration file is not replaced unasked (as plan -o), and a bad --model or --gpu is one line
    before a benchmark that may take minutes (they failed after it, or as torchrun's footer)."""
    from conftest import one_line_error, run_genconf

    kept = tmp_path / "cal.yaml"
    kept.write_text("measured: true\n")
    one_line_error(run_genconf("calibrate", "--bench", "--model", "1b", "-o", str(kept)),
                   f"{kept} exists; use --force to replace it")
    assert kept.read_text() == "measured: true\n"
    one_line_error(run_genconf("calibrate", "--bench", "--model", "nosuch", "-o", str(tmp_path / "a.yaml")),
                   "unknown model 'nosuch'")
    one_line_error(run_genconf("calibrate", "--bench", "--gpu", "nosuch", "-o", str(tmp_path / "a.yaml")),
                   "unknown GPU 'nosuch'")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cal.yaml"]


def test_every_term_the_committed_calibration_sets_is_in_its_range():
    # The ranges refuse nothing genconf itself writes: the built-in calibration and the committed H200 file.
    import math

    from genconf.catalog.hardware import calibration_for

    for gpu in ("h100-sxm", "a100-80gb", "b200", "h200"):
        cal = calibration_for(gpu)
        for name in calibration_file.term_names():
            low, high, low_ok = calibration_file.term_range(name)
            value = getattr(cal, name)
            assert math.isfinite(value) and low <= value <= high and (low_ok or value > low), (gpu, name, value)
    committed = calibration_file.read_file(REPO / "benchmarks" / "results" / "gpu_runs" / "calibration.yaml")
    assert committed.terms
    for name, value in committed.terms.items():  # the H200 session's measured terms, each inside its range too
        low, high, low_ok = calibration_file.term_range(name)
        assert math.isfinite(value) and low <= value <= high and (low_ok or value > low), (name, value)



def test_a_term_the_predictions_do_not_depend_on_is_left_unfitted():
    # `calibrate RUN --terms gemm_efficiency` on a run whose step is its fixed overhead wrote gemm_efficiency 0.7 -> 1
    # ("at a bound", the error unchanged), which then moved every later plan (70B on 64 H100s: 49.5% -> 66.7% MFU).
    obs = [fit.Observation(label=f"r{i}", measured_s=m, predict_s=lambda t, i=i: t["overhead"] * (1 + i) + 1e-9 * t["eff"])
           for i, m in enumerate((0.5, 1.1))]
    result = fit.fit_terms({"overhead": 0.4, "eff": 0.7}, ["overhead", "eff"], obs, bounds={"eff": (0.1, 1.0)})
    assert result.fitted == ("overhead",) and result.uninformed == ("eff",)
    assert result.terms["eff"] == 0.7 and result.at_bound == ()
    with pytest.raises(GenconfError, match="do not depend on gemm_efficiency: nothing to fit"):
        calibrate.fit_runs([str(REPO / "tests" / "data" / "verify-run")], gpu="h100-sxm", terms=["gemm_efficiency"])
