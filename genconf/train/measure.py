"""Measure what a built model and its optimizer hold on this rank, to compare with the planner's memory model.

Parameter bytes: the model's parameters as this rank stores them (DeepSpeed ZeRO-3: the partitions;
FSDP: the sharded flat parameters). Optimizer bytes: FP32 master weights (where the framework keeps a
separate copy) plus every tensor in the optimizer state (Adam's moments), storages counted once.
"""

from __future__ import annotations

import torch

from genconf.plan import memory


def _unique_bytes(tensors) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None or not torch.is_tensor(t) or t.numel() == 0:
            continue
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = max(seen.get(storage.data_ptr(), 0), t.numel() * t.element_size())
    return sum(seen.values())


def param_bytes(module: torch.nn.Module) -> int:
    """Bytes of this rank's parameters (each tensor's own elements; ZeRO-3 partitions where they exist)."""
    total = 0
    for p in module.parameters():
        shard = getattr(p, "ds_tensor", None)
        total += (shard.numel() * shard.element_size()) if shard is not None else p.numel() * p.element_size()
    return total


def _master_tensors(optimizer) -> list[torch.Tensor]:
    """FP32 master copies: megatron (distributed or not) and DeepSpeed ZeRO keep them outside the model."""
    out: list[torch.Tensor] = []
    for name in ("shard_fp32_from_float16_groups", "fp32_from_float16_groups",  # megatron-core
                 "single_partition_of_fp32_groups", "fp32_partitioned_groups_flat",  # DeepSpeed ZeRO-1/2, ZeRO-3
                 "fp32_groups_flat_partition",  # DeepSpeed BF16_Optimizer
                 # DeepSpeed ZeRO-0 with bf16/fp16 (engine.py DDP_BFLOAT16/FP16 -> FP16_Optimizer with a fused
                 # Adam, FP16_UnfusedOptimizer otherwise): the fp32 master copy the H100 run missed.
                 "fp32_groups_flat", "fp32_groups"):
        groups = getattr(optimizer, name, None)
        if groups is None:
            continue
        for group in groups:
            out += list(group) if isinstance(group, (list, tuple)) else [group]
    return out


def _inner_optimizers(optimizer) -> list:
    """The torch optimizers behind framework wrappers (megatron ChainedOptimizer, DeepSpeed ZeRO)."""
    if hasattr(optimizer, "chained_optimizers"):
        return [o for c in optimizer.chained_optimizers for o in _inner_optimizers(c)]
    inner = getattr(optimizer, "optimizer", None)
    if inner is not None and inner is not optimizer and hasattr(inner, "state"):
        return [optimizer] + _inner_optimizers(inner) if _master_tensors(optimizer) else _inner_optimizers(inner)
    return [optimizer]


def optimizer_bytes(optimizer) -> int:
    tensors: list[torch.Tensor] = []
    for opt in _inner_optimizers(optimizer):
        tensors += _master_tensors(opt)
        for state in getattr(opt, "state", {}).values():
            tensors += [v for v in state.values() if torch.is_tensor(v) and v.dim() > 0]
    return _unique_bytes(tensors)


def first_step_memory(model, optimizer, cfg, d) -> dict:
    """Measured parameter and optimizer bytes on this rank, next to the planner's, reduced to rank 0 as the
    maximum over ranks (the busiest rank is what the planner's peak stage describes), and per pipeline stage the
    difference between its busiest rank and its own plan (the largest over stages: a stage the maxima hide still
    shows; ranks of one stage may hold less than its busiest, which the plan prices, through shard padding)."""
    from genconf.train import collectives

    module = getattr(model, "module", model)
    stage = _pipeline_stage(cfg)
    planned = memory.stage_memory(cfg.model, cfg.plan, stage)
    mine = [param_bytes(module), optimizer_bytes(optimizer), planned.params_bytes, planned.optimizer_bytes]
    # One float64 buffer on the run's device (NCCL reduces device tensors only); exact below 2**53 bytes. Slot
    # `stage` of each quantity holds this rank's value, the others 0: the maximum over ranks is each stage's.
    pp = cfg.plan.pp
    per_stage = [0.0] * (4 * pp)
    for i, value in enumerate(mine):
        per_stage[i * pp + stage] = float(value)
    values = collectives.max_over_ranks(per_stage, d)
    stages = [[values[i * pp + s] for i in range(4)] for s in range(pp)]
    return {"measured_param_bytes": int(max(s[0] for s in stages)),
            "measured_optimizer_bytes": int(max(s[1] for s in stages)),
            "planned_param_bytes": int(max(s[2] for s in stages)),
            "planned_optimizer_bytes": int(max(s[3] for s in stages)),
            "param_bytes_off_by": int(max(abs(s[0] - s[2]) for s in stages)),
            "optimizer_bytes_off_by": int(max(abs(s[1] - s[3]) for s in stages))}


def _pipeline_stage(cfg) -> int:
    if cfg.plan.pp == 1:
        return 0
    from megatron.core import parallel_state

    return parallel_state.get_pipeline_model_parallel_rank()
