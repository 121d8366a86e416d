"""Megatron's gradient-accumulation fusion: the weight-gradient GEMM adds into main_grad itself, or a hook adds a
separate bf16 gradient into it each micro-batch (the bytes genconf prices, and the flag the artifacts carry)."""

import dataclasses

import pytest

from genconf.catalog.clusters import resolve_cluster
from genconf.catalog.hardware import calibration_for
from genconf.catalog.models import resolve_model
from genconf.plan.cost import _mem_s, param_bytes_per_microbatch, step_cost
from genconf.plan.memory import rank_params
from genconf.plan.specs import ParallelPlan, TrainSpec
from genconf.render.megatron import arg_values, megatron_args, megatron_plan


def test_the_unfused_hook_reads_the_gradient_and_reads_and_writes_main_grad():
    te = ParallelPlan(framework="megatron", tp=8, pp=8, dp=1, mbs=1, gbs=64, seq_length=2048)
    assert te.wgrad_fused_into_main_grad and param_bytes_per_microbatch(te) == 0.0
    unfused = dataclasses.replace(te, grad_accum_fusion=False)
    assert not unfused.wgrad_fused_into_main_grad
    assert param_bytes_per_microbatch(unfused) == 2 + 4 + 4  # bf16 gradient in, fp32 main_grad in and out
    assert param_bytes_per_microbatch(dataclasses.replace(unfused, grad_dtype="bf16")) == 2 + 2 + 2
    # The local spec fuses only where apex's kernel was built (fused_kernels).
    local = dataclasses.replace(te, layer_spec="local")
    assert not local.wgrad_fused_into_main_grad and param_bytes_per_microbatch(local) == 10
    assert dataclasses.replace(local, fused_kernels=True).wgrad_fused_into_main_grad


def test_each_micro_batch_of_an_unfused_stage_pays_one_pass_over_its_parameters():
    # GPT-3 175B on 64 A100s as Korthikanti 2022 ran it (tp8 pp8 vp3, Megatron-LM with apex, after the fusion
    # landed) against the same plan as Megatron-LM ran before February 2022 (Narayanan 2021).
    model, _ = resolve_model("gpt3-175b")
    cluster = resolve_cluster("dgx-a100")
    cal = calibration_for(cluster.gpu.name)
    fused = ParallelPlan(framework="megatron", tp=8, pp=8, vp=3, dp=1, mbs=1, gbs=64, seq_length=2048,
                         layer_spec="local", fused_kernels=True, sequence_parallel=True)
    unfused = dataclasses.replace(fused, grad_accum_fusion=False)
    extra = step_cost(model, unfused, cluster, cal).compute_s - step_cost(model, fused, cluster, cal).compute_s
    slowest_params = max(rank_params(model, fused, i).total for i in range(fused.pp))
    per_mb = _mem_s(cluster.gpu, cal, 10.0 * slowest_params)
    assert extra == pytest.approx(fused.num_microbatches * per_mb, rel=0.02)  # the slowest stage pays it


@pytest.mark.parametrize("spec, fused_kernels, fusion, flag", [
    ("te", False, True, False), ("te", False, False, True),
    ("local", True, True, False), ("local", True, False, True),
    ("local", False, True, True),  # megatron-core raises without apex's kernel: the arguments turn it off
])
def test_megatron_args_turn_the_fusion_off_where_the_plan_does_not_fuse(spec, fused_kernels, fusion, flag):
    model, _ = resolve_model("1b")
    plan = ParallelPlan(framework="megatron", tp=1, dp=8, mbs=1, gbs=8, seq_length=2048, layer_spec=spec,
                        fused_kernels=fused_kernels, grad_accum_fusion=fusion)
    values = arg_values(megatron_args(model, plan, TrainSpec(train_steps=10)))
    assert ("--no-gradient-accumulation-fusion" in values) == flag
    parsed = megatron_plan(values, model, 8)[1]
    # Read back: what the arguments say (the local spec's flag says nothing about the plan: apex is not an argument).
    assert parsed.grad_accum_fusion == (fusion if spec == "te" else True)


def test_megatron_core_config_takes_megatron_lm_s_default_and_the_flag():
    from genconf.render.megatron import megatron_config_kwargs

    model, _ = resolve_model("1b")
    te = ParallelPlan(framework="megatron", tp=1, dp=8, mbs=1, gbs=8, seq_length=2048)
    for plan, fused in ((te, True), (dataclasses.replace(te, grad_accum_fusion=False), False),
                        (dataclasses.replace(te, layer_spec="local"), False)):
        kw = megatron_config_kwargs(arg_values(megatron_args(model, plan, TrainSpec(train_steps=10))))
        assert kw["gradient_accumulation_fusion"] is fused


def test_check_names_a_missing_fusion_flag(tmp_path, capsys):
    # The local spec without apex: megatron-core raises at the first ColumnParallelLinear unless the flag is there.
    from genconf.cli.main import main

    out = tmp_path / "art"
    assert main(["--model", "1b", "--gpus", "8", "--framework", "megatron", "--layer-spec", "local", "-o", str(out)]) == 0
    args = out / "megatron_args.txt"
    assert "--no-gradient-accumulation-fusion\n" in args.read_text()
    args.write_text(args.read_text().replace("--no-gradient-accumulation-fusion\n", ""))
    capsys.readouterr()
    assert main(["check", str(out)]) != 0
    assert "--no-gradient-accumulation-fusion" in capsys.readouterr().out


def test_under_lora_only_the_adapters_gradients_are_accumulated():
    from genconf.plan.memory import lora_rank_params

    model, _ = resolve_model("llama3-70b")
    cluster = resolve_cluster("dgx-h100")
    cal = calibration_for(cluster.gpu.name)
    fused = ParallelPlan(framework="megatron", tp=4, pp=4, dp=2, mbs=1, gbs=16, seq_length=4096, lora_rank=16,
                         sequence_parallel=True)
    unfused = dataclasses.replace(fused, grad_accum_fusion=False)
    extra = step_cost(model, unfused, cluster, cal).compute_s - step_cost(model, fused, cluster, cal).compute_s
    per_mb = _mem_s(cluster.gpu, cal, 10.0 * lora_rank_params(model, fused, 20))  # 20 layers on each of 4 stages
    assert extra == pytest.approx(fused.num_microbatches * per_mb, rel=0.02)
    full = dataclasses.replace(unfused, lora_rank=0)
    assert extra < 0.01 * (step_cost(model, full, cluster, cal).compute_s
                           - step_cost(model, dataclasses.replace(full, grad_accum_fusion=True), cluster, cal).compute_s)
