"""Pictures: the numbers beside each PNG (plan --plot, verify --plot) equal the plan's and the run's, and the
schedule's pass times add up to the cost model's compute (the schedule itself: tests/plan/test_pipeline.py)."""

import csv
import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, genconf_cmd, has_module
from genconf.cli.main import main

needs_matplotlib = pytest.mark.skipif(not has_module("matplotlib"), reason="matplotlib not installed "
                                      "(pip install -e '.[plot]')")
RUN = REPO / "tests" / "data" / "verify-run"  # a real CPU run: `genconf ci olmo-1b-ddp` (12 steps, FSDP dp=2)
GOLDEN = REPO / "recipes" / "golden" / "olmo-1b-ddp.smoke.txt"


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the PNG signature and IHDR chunk."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


def read_csv(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


@needs_matplotlib
@pytest.mark.parametrize("args", [
    ["--model", "70b", "--gpus", "384"],  # interleaved: tp4 pp4 vp4, 44 micro-batches
    ["--model", "llama3-70b", "--gpus", "256", "--tp", "4", "--pp", "8", "--vp", "1", "--global-batch", "128",
     "--mbs", "1"],  # 1F1B over 8 stages
    ["--model", "gpt3-125m", "--gpus", "8"],  # no pipeline
])
def test_plan_plot_numbers_equal_the_plan(tmp_path, args, capsys):
    from genconf.run import plots

    out = tmp_path / "plots"
    assert main(["plan", *args, "--json", "--plot", str(out)]) == 0
    plan_json = json.loads(capsys.readouterr().out)
    p = plan_json["plan"]
    memory = read_csv(out / "memory.csv")
    assert [int(r["stage"]) for r in memory] == list(range(p["pp"]))
    assert [int(r["layers"]) for r in memory] == p["stage_layers"]
    by_stage = {int(r["stage"]): r for r in memory}
    for stage in plan_json["memory"]["stages"]:  # the stages plan.json reports
        row = by_stage[stage["stage"]]
        for key in ("total_gib", "params_gib", "activations_gib"):
            assert float(row[key]) == stage[key], (stage["stage"], key)
    peak = max(memory, key=lambda r: int(r["total_bytes"]))
    assert int(peak["peak"]) == 1 and int(peak["stage"]) == plan_json["memory"]["peak_stage"]
    for key in ("params_gib", "grads_gib", "optimizer_gib", "activations_gib", "other_gib", "total_gib"):
        assert float(peak[key]) == plan_json["memory"][key], key
    assert float(peak["capacity_gib"]) == plan_json["memory"]["capacity_gib"]
    assert float(peak["usable_gib"]) == plan_json["memory"]["usable_gib"]
    for r in memory:
        parts = sum(int(r[f"{k}_bytes"]) for k in ("params", "grads", "optimizer", "activations", "other"))
        assert parts == int(r["total_bytes"])

    blocks = read_csv(out / "schedule.csv")
    assert len(blocks) == p["pp"] * p["num_microbatches"] * p["vp"] * 2
    assert {(b["pass"], int(b["chunk"])) for b in blocks} == {(x, c) for x in "FB" for c in range(p["vp"])}
    span = max(float(b["end_s"]) for b in blocks)
    busy = max(sum(float(b["end_s"]) - float(b["start_s"]) for b in blocks if int(b["stage"]) == s)
               for s in range(p["pp"]))
    # The schedule's bubble is the cost model's (p-1)/(v m) to within the last stage's extra logits work.
    assert span / busy - 1 == pytest.approx(plan_json["perf"]["bubble_fraction"], abs=0.025)
    assert png_size(out / "memory.png") == (1000, 600) == plots.expected_px(plots.MEMORY_SIZE_IN)
    assert png_size(out / "schedule.png") == (1400, 600) == plots.expected_px(plots.SCHEDULE_SIZE_IN)


def _run_copy(tmp_path: Path, interval: bool) -> Path:
    """The stored run under artifacts/runs/ci, with a plan.json beside it (its perf and memory from the run's
    own prediction), optionally carrying an interval."""
    artifacts = tmp_path / "artifacts"
    run = artifacts / "runs" / "ci"
    shutil.copytree(RUN, run)
    config = json.loads((run / "config.json").read_text())
    config["artifacts"] = str(artifacts)
    (run / "config.json").write_text(json.dumps(config))
    pred = config["prediction"]
    plan = {"perf": {"tokens_per_s_per_gpu": pred["tokens_per_s_per_gpu"]}, "memory": {"total_gib": pred["peak_mem_gib"]}}
    if interval:
        plan["perf"]["tokens_per_s_per_gpu_interval"] = [0.8 * pred["tokens_per_s_per_gpu"], 1.2 * pred["tokens_per_s_per_gpu"]]
        plan["memory"]["intervals"] = {"total_gib": {"low": 0.9 * pred["peak_mem_gib"], "high": 1.1 * pred["peak_mem_gib"]}}
    (artifacts / "plan.json").write_text(json.dumps(plan))
    return run


@needs_matplotlib
@pytest.mark.parametrize("interval", [False, True])
def test_verify_plot_numbers(tmp_path, interval, capsys):
    from genconf.run import plots, verify

    run = _run_copy(tmp_path, interval)
    out = tmp_path / "plots"
    assert main(["verify", str(run), "--golden", str(GOLDEN), "--tolerance", "5e-3", "--plot", str(out)]) == 0
    assert "verify.png" in capsys.readouterr().err
    table = read_csv(out / "verify.csv")
    metrics = verify.read_metrics(run)
    golden = verify.read_golden(GOLDEN)
    assert [int(r["step"]) for r in table] == [m["step"] for m in metrics] == sorted(golden)
    for row, m in zip(table, metrics):
        assert float(row["loss"]) == pytest.approx(m["loss"], rel=1e-5)
        assert float(row["golden_loss"]) == pytest.approx(golden[m["step"]], rel=1e-5)
        assert float(row["tokens_per_s_per_gpu"]) == pytest.approx(m["tokens_per_s_per_gpu"], rel=1e-5)
        assert float(row["peak_mem_gib"]) == pytest.approx(m["peak_mem_gib"], rel=1e-5)
        assert row["measured_on"] == "cpu" and row["predicted_for"] == "h100-sxm"
    # A CPU run is drawn against the planner's numbers for the same (smoke) run on the plan's GPU.
    config = json.loads((run / "config.json").read_text())
    expected = verify.predict_run(config, "h100-sxm")
    first = table[0]
    assert float(first["predicted_tokens_per_s_per_gpu"]) == pytest.approx(expected["tokens_per_s_per_gpu"], rel=1e-5)
    assert float(first["predicted_peak_mem_gib"]) == pytest.approx(expected["peak_mem_gib"], rel=1e-5)
    if interval:
        # plan.json's interval, relative to its prediction, around the run's prediction
        assert float(first["predicted_tokens_low"]) == pytest.approx(0.8 * expected["tokens_per_s_per_gpu"], rel=1e-5)
        assert float(first["predicted_tokens_high"]) == pytest.approx(1.2 * expected["tokens_per_s_per_gpu"], rel=1e-5)
        assert float(first["predicted_mem_low"]) == pytest.approx(0.9 * expected["peak_mem_gib"], rel=1e-5)
        assert float(first["predicted_mem_high"]) == pytest.approx(1.1 * expected["peak_mem_gib"], rel=1e-5)
    else:
        assert first["predicted_tokens_low"] == first["predicted_mem_high"] == ""
    assert png_size(out / "verify.png") == (1000, 1000) == plots.expected_px(plots.VERIFY_SIZE_IN)


@needs_matplotlib
def test_verify_plot_without_a_prediction_or_golden(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    (run / "config.json").unlink()
    out = tmp_path / "plots"
    assert main(["verify", str(run), "--plot", str(out)]) == 0
    table = read_csv(out / "verify.csv")
    assert len(table) == 12 and all(r["golden_loss"] == r["predicted_tokens_per_s_per_gpu"] == "" for r in table)
    assert png_size(out / "verify.png") == (1000, 1000)


def test_without_matplotlib_plot_is_one_line(tmp_path):
    code = ("import sys; sys.modules['matplotlib'] = None; from genconf.cli.main import main; "
            f"sys.exit(main(['--model', '1b', '--gpus', '8', '--plot', {str(tmp_path / 'p')!r}]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip() == "genconf: error: --plot needs matplotlib: pip install 'genconf[plot]'"
    assert not (tmp_path / "p").exists()


@needs_matplotlib
def test_plot_flag_on_the_plain_command(tmp_path):
    out = subprocess.run(genconf_cmd() + ["--model", "7b", "--gpus", "16", "--plot", str(tmp_path / "p")],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == ["memory.csv", "memory.png", "schedule.csv",
                                                                   "schedule.png"]


@pytest.mark.parametrize("args", [dict(model="70b", gpus=384), dict(model="llama3-70b", gpus=256),
                                  dict(model="mixtral-8x7b", gpus=64), dict(model="1b", gpus=8)])
def test_schedule_pass_times_add_up_to_the_cost_models_compute(args):
    """The schedule's passes are the cost model's: the slowest stage's forward + backward over every chunk and
    micro-batch is step_cost's compute time."""
    from genconf.catalog.clusters import resolve_cluster
    from genconf.catalog.hardware import calibration_for
    from genconf.catalog.models import resolve_model
    from genconf.plan.cost import step_cost
    from genconf.plan.search import Pins, plan_or_explain
    from genconf.run import plots

    model, _ = resolve_model(args["model"])
    cluster = resolve_cluster(None)
    cal = calibration_for(cluster.gpu.name)
    best = plan_or_explain(model, cluster, args["gpus"], cal, Pins(), keep=1).best
    plan = best.plan
    times = plots.pass_times(model, plan, cluster)
    slowest = max(f + b for f, b in zip(times.forward_s, times.backward_s)) * plan.vp
    assert plan.num_microbatches * slowest == pytest.approx(step_cost(model, plan, cluster, cal).compute_s, rel=1e-9)


def test_a_bad_plot_path_is_refused_before_anything_is_written(tmp_path):
    """-o wrote the whole artifacts directory, then --plot failed (and a re-run then met 'exists')."""
    from conftest import one_line_error, run_genconf

    blocker = tmp_path / "plfile"
    blocker.write_text("")
    out = run_genconf("--model", "1b", "--gpus", "8", "-o", str(tmp_path / "o6"), "--plot", str(blocker))
    one_line_error(out, f"--plot {blocker}: exists and is not a directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plfile"]
