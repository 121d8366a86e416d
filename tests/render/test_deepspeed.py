"""ds_config.json, read by DeepSpeed's own DeepSpeedConfig with the plan's world size: every ZeRO stage, offload and
precision; ZeRO-3 bucket thresholds from the hidden size."""

from __future__ import annotations

import json

import pytest

from conftest import DS_PLANS, PlanMPU, needs_deepspeed, plan_of, report_plan
from genconf.plan.equivalent import equivalent_plan


def test_zero3_thresholds_come_from_the_hidden_size(rendered):
    from genconf.plan.memory import deepspeed_zero_buckets

    for name in ("ds_z3", "ds_z3_offload"):
        d = rendered[name]
        h = plan_of(d)["model"]["hidden_size"]
        zero = json.loads((d / "ds_config.json").read_text())["zero_optimization"]
        buckets = deepspeed_zero_buckets(h)
        # HF's 'auto' values (0.9 h^2, 10 h, h^2), rounded up to even element counts (DeepSpeed asserts it).
        even = lambda n: n + n % 2  # noqa: E731
        assert zero["stage3_prefetch_bucket_size"] == even(int(0.9 * h * h)) == buckets["stage3_prefetch_bucket_size"]
        assert zero["stage3_param_persistence_threshold"] == 10 * h
        assert zero["reduce_bucket_size"] == even(h * h)
    hsdp = json.loads((rendered["hsdp7b"] / "ds_config.json").read_text())
    assert hsdp["zero_optimization"]["zero_hpz_partition_size"] == 4  # ZeRO++ hpZ inside the node


@pytest.fixture
def deepspeed_config_cls(deepspeed_rank0):
    from deepspeed.runtime.config import DeepSpeedConfig

    # DeepSpeedConfig reads the mpu's world size only after dist.get_rank() succeeds: deepspeed_rank0 is a real
    # one-process gloo group (conftest), so the plan's world size is the one it checks against.
    return DeepSpeedConfig

@needs_deepspeed
@pytest.mark.parametrize("name", DS_PLANS)
def test_deepspeed_accepts_every_ds_config_with_the_plans_world_size(rendered, deepspeed_config_cls, name):
    import torch
    from deepspeed.runtime import lr_schedules

    d = rendered[name]
    run_ = plan_of(d)
    world = run_["cluster"]["num_gpus"]
    raw = json.loads((d / "ds_config.json").read_text())
    cfg = deepspeed_config_cls(raw, mpu=PlanMPU(world))
    assert cfg.world_size == world
    assert cfg.train_batch_size == cfg.train_micro_batch_size_per_gpu * cfg.gradient_accumulation_steps * world
    ds_plan, _ = equivalent_plan(report_plan(run_), "deepspeed")
    assert cfg.zero_optimization_stage == ds_plan.zero_stage
    assert cfg.float16_config.enabled == (ds_plan.precision == "fp16")
    assert cfg.bfloat16_config.enabled == (ds_plan.precision != "fp16")
    assert (cfg.zero_config.offload_optimizer is not None) == ds_plan.offload_optimizer
    assert (cfg.zero_config.offload_param is not None) == ds_plan.offload_params
    if ds_plan.precision == "fp16":
        assert cfg.float16_config.initial_scale_power == 16 and raw["fp16"]["loss_scale"] == 0  # dynamic
    with pytest.raises(AssertionError, match="train_batch_size is not equal"):
        deepspeed_config_cls(raw, mpu=PlanMPU(world * 2))  # the world size really is checked
    # optimizer and scheduler are real DeepSpeed / torch names and parameters
    params = [torch.nn.Parameter(torch.zeros(2))]
    opt = torch.optim.AdamW(params, **{k: tuple(v) if k == "betas" else v for k, v in raw["optimizer"]["params"].items()})
    sched = getattr(lr_schedules, raw["scheduler"]["type"])(opt, **raw["scheduler"]["params"])
    assert raw["scheduler"]["type"] in lr_schedules.VALID_LR_SCHEDULES
    sched.step()

def test_ds_config_covers_every_stage_offload_and_precision(rendered):
    seen = set()
    for name in DS_PLANS:
        ds = json.loads((rendered[name] / "ds_config.json").read_text())
        zero = ds["zero_optimization"]
        seen.add(f"zero{zero['stage']}")
        seen.update(k for k in ("offload_optimizer", "offload_param") if k in zero)
        seen.update(k for k in ("bf16", "fp16") if ds.get(k, {}).get("enabled"))
    assert {"zero0", "zero1", "zero2", "zero3", "offload_optimizer", "offload_param", "bf16", "fp16"} <= seen


def test_gradient_dtype_reaches_ds_config(rendered):
    ds = json.loads((rendered["ds_z1_fp32_grads"] / "ds_config.json").read_text())
    assert ds["data_types"] == {"grad_accum_dtype": "fp32"} and ds["communication_data_type"] == "fp32"
