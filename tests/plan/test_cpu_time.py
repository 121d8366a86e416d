"""genconf.cpu_time: the expected CPU step time against real launches (benchmarks/results/cpu_step_time.json and the
recorded verify run), and the issue's minutes-per-step smoke plan."""

import dataclasses
import json
import statistics

import pytest

from conftest import REPO
from genconf.catalog.models import resolve_model
from genconf.plan.cpu_time import CPU_STEP_LIMIT_S, cpu_step_time, format_seconds
from genconf.plan.planfile import plan_from_dict
from genconf.plan.specs import ModelSpec, ParallelPlan

MEASURED = json.loads((REPO / "benchmarks" / "results" / "cpu_step_time.json").read_text())


def specs(config: dict) -> tuple[ModelSpec, ParallelPlan]:
    return ModelSpec(**config["model"]), plan_from_dict(config["plan"])  # the plan.json codec reads older plans too


@pytest.mark.parametrize("row", MEASURED["rows"], ids=[r["name"] for r in MEASURED["rows"]])
def test_estimate_is_within_2x_of_every_measured_launch(row):
    model, plan = specs(row["config"])
    est = cpu_step_time(model, plan, cores=MEASURED["cores"])
    assert 0.5 < est.step_time_s / row["measured_s"] < 2.0, (est.describe(), row["measured_s"])


def test_estimate_is_within_2x_of_the_recorded_verify_run():
    # tests/data/verify-run: the olmo-1b-ddp smoke variant (FSDP NO_SHARD, 2 ranks, FP32), recorded on another machine
    run = REPO / "tests" / "data" / "verify-run"
    config = json.loads((run / "config.json").read_text())
    fields = {f.name for f in dataclasses.fields(ModelSpec)}
    model = ModelSpec(**{k: v for k, v in config["model"].items() if k in fields})
    plan = plan_from_dict(config["plan"])
    measured = statistics.median(json.loads(line)["step_time_s"] for line in (run / "metrics.jsonl").read_text().splitlines())
    est = cpu_step_time(model, plan, cores=2)
    assert 0.5 < est.step_time_s / measured < 2.0, (est.describe(), measured)


def test_the_issue_smoke_plan_takes_minutes_a_step():
    # issue 14: a 174K-parameter model at seq 128 on 2 ranks was given 32,768 sequences, 2,048 micro-batches a step
    model = dataclasses.replace(resolve_model("llama3-8b")[0], name="tiny", num_layers=2, hidden_size=64,
                                num_attention_heads=4, num_query_groups=4, ffn_hidden_size=224, vocab_size=512,
                                seq_length=128, kv_channels=None)
    plan = ParallelPlan(framework="fsdp", dp=2, mbs=8, gbs=32768, seq_length=128, zero_stage=0, recompute="full",
                        precision="fp32")
    est = cpu_step_time(model, plan, cores=2)
    assert est.passes_per_rank == 2048 and 60 < est.step_time_s < CPU_STEP_LIMIT_S
    smoke = dataclasses.replace(plan, gbs=56, mbs=1)  # what genconf.batch gives it now
    assert cpu_step_time(model, smoke, cores=2).step_time_s < 1


def test_a_full_size_plan_is_far_over_the_limit():
    model, _ = resolve_model("olmo-1b")
    plan = ParallelPlan(framework="fsdp", dp=8, mbs=8, gbs=2048, seq_length=2048, zero_stage=0, recompute="none",
                        precision="bf16")
    est = cpu_step_time(model, plan, cores=2)
    # 6 x 1.18B params x 4.2M tokens = 3e16 FLOPs: days at CPU rates
    assert est.flops_per_step > 2.9e16 and est.step_time_s > 100 * CPU_STEP_LIMIT_S
    assert "per step on 2 CPU cores (8 ranks)" in est.describe()


def test_bf16_is_slower_than_fp32_and_oversubscribed_ranks_share_cores():
    model, _ = resolve_model("gpt3-125m")
    fp32 = ParallelPlan(framework="fsdp", dp=2, mbs=1, gbs=2, seq_length=256, zero_stage=0, recompute="none",
                        precision="fp32")
    assert cpu_step_time(model, dataclasses.replace(fp32, precision="bf16"), cores=2).compute_s > \
        5 * cpu_step_time(model, fp32, cores=2).compute_s
    one, two = cpu_step_time(model, fp32, cores=1), cpu_step_time(model, fp32, cores=2)
    assert one.compute_s == pytest.approx(2 * two.compute_s) and one.passes_s == pytest.approx(2 * two.passes_s)


def test_format_seconds_and_bad_input():
    assert [format_seconds(s) for s in (0.0123, 75, 600, 7300)] == ["12 ms", "75 s", "10.0 min", "2.0 h"]
    with pytest.raises(ValueError, match="cores must be positive"):
        cpu_step_time(resolve_model("gpt3-125m")[0], ParallelPlan(framework="fsdp", dp=1, mbs=1, gbs=1,
                                                                   seq_length=64, zero_stage=0), cores=0)
