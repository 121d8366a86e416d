"""The host CPU that launches the kernels: Grace (GB200/GB300 NVL72) spends longer per PyTorch op than the x86 hosts of
HGX/DGX boards (TransformerEngine#2053), which shows where layers wait on the host (dropless MoE) and nowhere else."""

from __future__ import annotations

import dataclasses

import pytest

from conftest import run_genconf
from genconf.catalog.clusters import resolve_cluster
from genconf.catalog.hardware import calibration_for
from genconf.catalog.models import resolve_model
from genconf.plan import planfile
from genconf.plan.cost import host_factor, layer_time, step_cost
from genconf.plan.specs import ParallelPlan


def test_nvl72_racks_run_on_grace_and_hgx_boards_on_x86():
    assert resolve_cluster("gb200-nvl72").host_cpu == resolve_cluster("gb300-nvl72").host_cpu == "grace"
    for name in ("dgx-b200", "dgx-b300", "dgx-h100", "kempner-h100"):
        assert resolve_cluster(name).host_cpu == "x86_64"


def test_grace_prices_every_host_op_longer_by_the_factor():
    grace = resolve_cluster("gb200-nvl72")
    x86 = dataclasses.replace(grace, host_cpu="x86_64")
    cal = calibration_for("gb200")
    assert host_factor(grace, cal) == cal.grace_host_factor > 1 and host_factor(x86, cal) == 1.0
    model, _ = resolve_model("qwen3-30b-a3b")
    plan = ParallelPlan(framework="megatron", ep=8, dp=8, mbs=1, gbs=64, seq_length=4096, zero_stage=1)
    on_grace, on_x86 = layer_time(model, plan, grace, cal), layer_time(model, plan, x86, cal)
    assert on_grace.host_s == pytest.approx(cal.grace_host_factor * on_x86.host_s, rel=1e-12)
    assert (on_grace.fwd_s, on_grace.bwd_s) == (on_x86.fwd_s, on_x86.bwd_s)  # the GPU's work is the GPU's
    # A dropless MoE layer at micro-batch 1 waits on the host: slower on Grace.
    assert step_cost(model, plan, grace, cal).step_time_s > step_cost(model, plan, x86, cal).step_time_s


def test_a_gpu_bound_dense_layer_does_not_notice_the_host():
    grace = resolve_cluster("gb200-nvl72")
    x86 = dataclasses.replace(grace, host_cpu="x86_64")
    cal = calibration_for("gb200")
    model, _ = resolve_model("llama3-70b")
    plan = ParallelPlan(framework="megatron", tp=4, dp=16, mbs=1, gbs=128, seq_length=8192, zero_stage=1,
                        sequence_parallel=True)
    assert step_cost(model, plan, grace, cal).step_time_s == step_cost(model, plan, x86, cal).step_time_s


def test_plan_json_keeps_the_host_cpu():
    grace = resolve_cluster("gb300-nvl72")
    d = planfile.cluster_dict(grace, 64)
    assert d["host_cpu"] == "grace" and planfile.cluster_from_dict(d).host_cpu == "grace"
    del d["host_cpu"]  # a plan.json written before the field: x86, as every cluster was priced then
    assert planfile.cluster_from_dict(d).host_cpu == "x86_64"


def test_a_cluster_file_names_a_known_cpu(tmp_path):
    good = tmp_path / "gh.yaml"
    good.write_text("gpu: h100-sxm\ngpus_per_node: 4\nib_gbit_per_s_per_gpu: 400\nhost_cpu: grace\n")
    assert resolve_cluster(str(good)).host_cpu == "grace"
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpu: h100-sxm\ngpus_per_node: 4\nib_gbit_per_s_per_gpu: 400\nhost_cpu: power9\n")
    out = run_genconf("--model", "1b", "--gpus", "8", "--cluster", str(bad))
    assert out.returncode == 2 and "host_cpu" in out.stderr and "Traceback" not in out.stderr
