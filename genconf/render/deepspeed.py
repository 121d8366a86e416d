"""ds_config.json: the plan (or its nearest DeepSpeed equivalent) as DeepSpeed's config, names and parameters as
deepspeed/runtime reads them."""

from __future__ import annotations

from genconf.plan.equivalent import equivalent_plan
from genconf.plan.memory import deepspeed_zero_buckets
from genconf.plan.precision import FP16_LOSS_SCALING
from genconf.plan.specs import ModelSpec, ParallelPlan, TrainSpec


def deepspeed_scheduler(train: TrainSpec) -> dict:
    """TrainSpec's schedule as a DeepSpeed scheduler (deepspeed/runtime/lr_schedules.py names and parameters).

    WarmupCosineLR works in ratios of the optimizer's lr: warm-up from 0, cosine down to min_lr / lr.
    WarmupDecayLR warms up from warmup_min_lr and decays linearly back to it, so it starts at min_lr, not 0.
    """
    warmup = max(1, min(train.warmup_steps, train.train_steps))  # DeepSpeed refuses warmup_num_steps <= 0
    if train.lr_decay == "cosine":
        return {"type": "WarmupCosineLR", "params": {
            "total_num_steps": train.train_steps, "warmup_num_steps": warmup, "warmup_min_ratio": 0.0,
            "cos_min_ratio": train.min_lr / train.lr if train.lr else 0.0, "warmup_type": "linear"}}
    if train.lr_decay == "linear":
        return {"type": "WarmupDecayLR", "params": {
            "total_num_steps": train.train_steps, "warmup_num_steps": warmup, "warmup_min_lr": train.min_lr,
            "warmup_max_lr": train.lr, "warmup_type": "linear"}}
    return {"type": "WarmupLR", "params": {
        "warmup_num_steps": warmup, "warmup_min_lr": 0.0, "warmup_max_lr": train.lr, "warmup_type": "linear"}}


def deepspeed_zero(model: ModelSpec, plan: ParallelPlan) -> dict:
    """zero_optimization for the plan's stage, buckets sized from the hidden size like the memory model's."""
    stage = plan.zero_stage
    if stage == 0:
        return {"stage": 0}
    buckets = deepspeed_zero_buckets(model.hidden_size)
    zero: dict = {"stage": stage, "overlap_comm": True, "contiguous_gradients": True,
                  "reduce_bucket_size": buckets["reduce_bucket_size"]}
    if stage <= 2:
        zero.update(allgather_partitions=True, allgather_bucket_size=buckets["allgather_bucket_size"],
                    reduce_scatter=True)
    else:
        zero.update({key: buckets[key] for key in ("stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
                                                   "stage3_max_live_parameters", "stage3_max_reuse_distance")})
        zero["stage3_gather_16bit_weights_on_model_save"] = True
        if plan.shard_group_size:
            # ZeRO++ hpZ: a secondary copy of the parameters sharded inside groups of this size (the node),
            # so the forward/backward all-gathers stay on NVLink (Wang et al. 2023, ZeRO++ Sec. 3.2).
            zero["zero_hpz_partition_size"] = plan.shard_group_size
    if plan.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if plan.offload_params and stage == 3:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return zero


def deepspeed_config(model: ModelSpec, plan: ParallelPlan, train: TrainSpec) -> dict:
    """ds_config.json for the plan (or its nearest DeepSpeed equivalent), with the plan's world size as dp."""
    plan, _ = equivalent_plan(plan, "deepspeed")
    accum = plan.gbs // (plan.mbs * plan.dp)
    config: dict = {
        # train_batch_size = micro x accumulation x dp, e.g. 2 x 256 x 4 = 2048 sequences per step
        "train_batch_size": plan.gbs,
        "train_micro_batch_size_per_gpu": plan.mbs,
        "gradient_accumulation_steps": accum,
        "gradient_clipping": train.grad_clip,
        "steps_per_print": 10,
        "zero_optimization": deepspeed_zero(model, plan),
        "optimizer": {"type": "AdamW", "params": {"lr": train.lr, "betas": [train.beta1, train.beta2],
                                                  "eps": train.eps, "weight_decay": train.weight_decay}},
        "scheduler": deepspeed_scheduler(train),
        # Verification switches: turn on for a few steps to compare measured time and FLOP/s with the plan.
        "wall_clock_breakdown": False,
        "flops_profiler": {"enabled": False, "profile_step": min(10, train.train_steps), "module_depth": -1,
                           "top_modules": 1, "detailed": False, "output_file": None},
    }
    if plan.precision == "fp16":
        # Dynamic loss scaling: start at 2^16, halve on overflow after 2 bad steps, double after 1000 good ones.
        ls = FP16_LOSS_SCALING
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": ls.initial_power,
                          "loss_scale_window": ls.window_steps, "hysteresis": ls.hysteresis, "min_loss_scale": ls.min_scale}
    elif plan.precision != "fp32":
        config["bf16"] = {"enabled": True}
        if plan.grad_accum_fp32:
            config["data_types"] = {"grad_accum_dtype": "fp32"}
    if plan.recompute != "none":
        config["activation_checkpointing"] = {
            "partition_activations": False, "contiguous_memory_optimization": False, "cpu_checkpointing": False,
            "number_checkpoints": model.num_layers, "synchronize_checkpoint_boundary": False, "profile": False}
    return config
