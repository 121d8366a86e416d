"""One plan, three frameworks: a plan runs exactly in its own framework; the others get the nearest equivalent on
the same GPUs, and notes say what differs (the artifacts README prints them)."""

from __future__ import annotations

from genconf.plan.precision import framework_precision
from genconf.plan.specs import ParallelPlan


def _round_batch(gbs: int, unit: int) -> int:
    """The multiple of `unit` nearest to `gbs` (at least one unit)."""
    return max(unit, round(gbs / unit) * unit)


def equivalent_plan(plan: ParallelPlan, framework: str) -> tuple[ParallelPlan, tuple[str, ...]]:
    """The plan itself when `framework` is its own, else the nearest `framework` plan on the same GPUs with
    the same micro-batch, sequence and (where it divides) global batch; the notes say what differs."""
    if framework == plan.framework:
        return plan, ()
    world = plan.world_size
    notes: list[str] = []
    model_parallel = {name: value for name, value in (("tp", plan.tp), ("pp", plan.pp), ("cp", plan.cp), ("ep", plan.ep))
                      if value > 1}
    if framework == "megatron":
        zero = 1 if plan.zero_stage >= 1 else 0
        if plan.zero_stage >= 2:
            notes.append(f"zero={plan.zero_stage} becomes Megatron's distributed optimizer, which shards optimizer "
                         f"states only (gradients and parameters stay replicated)")
        recompute = plan.recompute
    else:
        if plan.framework == "megatron":
            # Megatron-FSDP (zero 2/3) maps onto the same sharding stage.
            zero = 3 if model_parallel else {0: 0, 1: 1 if framework == "deepspeed" else 2, 2: 2, 3: 3}[plan.zero_stage]
        else:
            zero = {0: 0, 1: 1 if framework == "deepspeed" else 2, 2: 2, 3: 3}[plan.zero_stage]
        if model_parallel:
            degrees = ", ".join(f"{k}={v}" for k, v in model_parallel.items())
            notes.append(f"{degrees} becomes data parallelism over {world} GPUs; zero={zero} shards parameters in place "
                         f"of model parallelism")
        elif zero != plan.zero_stage:
            notes.append(f"zero={plan.zero_stage} has no {framework} counterpart; zero={zero} is the nearest")
        recompute = "full" if plan.recompute != "none" else "none"
        if plan.recompute == "selective":
            notes.append("selective recompute is Megatron's; full (whole-layer) checkpointing instead")
    precision, why = framework_precision(plan.precision, framework, plan_framework=plan.framework)
    if why:
        notes.append(why)
    gbs = _round_batch(plan.gbs, plan.mbs * world)
    if gbs != plan.gbs:
        notes.append(f"global batch {plan.gbs} is not a multiple of mbs x GPUs ({plan.mbs} x {world}); {gbs} instead")
    if (plan.offload_optimizer or plan.offload_params) and framework != "deepspeed":
        notes.append("CPU offload is DeepSpeed's; states stay on the GPU here")
    if plan.fused_loss and framework == "megatron":
        notes.append("the fused cross entropy is the DeepSpeed/FSDP model's; megatron's vocab-parallel cross entropy "
                     "works in place on its own")
    if plan.precision_aware_optimizer and framework != "megatron":
        notes.append("the precision-aware optimizer" + (" and its BF16 Adam moments" if plan.adam_moments_dtype == "bf16"
                                                       else "") + " are megatron's (TE FusedAdam); fp32 master weights "
                     "and Adam moments here")
    if plan.cuda_graph_impl != "none" and framework != "megatron":
        notes.append("CUDA graphs are megatron's (--cuda-graph-impl); this framework launches its kernels eagerly")
    shard_group = plan.shard_group_size if zero == 3 and framework != "megatron" else None
    if plan.shard_group_size and shard_group is None:
        notes.append(f"hybrid sharding over groups of {plan.shard_group_size} is not available; plain sharding")
    grad_dtype = plan.grad_dtype
    if grad_dtype == "fp32" and framework == "deepspeed" and zero == 0 and precision == "bf16":
        grad_dtype = None
        notes.append("DeepSpeed ZeRO-0 with bf16 keeps 16-bit gradients (its BF16_Optimizer needs ZeRO-1); "
                     "gradients in bf16 here")
    equivalent = ParallelPlan(
        framework=framework, tp=1, pp=1, vp=1, cp=1, ep=1, dp=world, mbs=plan.mbs, gbs=gbs, seq_length=plan.seq_length,
        zero_stage=zero, shard_group_size=shard_group, recompute=recompute, precision=precision,
        layer_spec=plan.layer_spec, grad_dtype=grad_dtype, expandable_segments=plan.expandable_segments,
        fused_loss=plan.fused_loss and framework != "megatron")
    return equivalent, tuple(notes)
