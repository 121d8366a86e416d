"""How big a plan's checkpoints are, and how much disk keeping the newest N takes (issue 13 part 3: the
plan's output says it before a run fills a disk). Pure: counts from genconf.counting.

A checkpoint holds the model states a resume needs, once (sharded frameworks write each shard once; the
replicas of plain data parallelism write nothing extra): the weights in the dtype the framework keeps them,
an FP32 master copy where the weights are 16-bit, and Adam's two FP32 moments. Gradients are not saved.
"""

from __future__ import annotations

from dataclasses import dataclass

from genconf.plan.counting import exact_param_count, lora_param_count, vocab_padding_params
from genconf.plan.memory import vocab_rows
from genconf.plan.specs import ModelSpec, ParallelPlan

ADAM_BYTES_PER_PARAM = 8
"""Adam's exp_avg and exp_avg_sq in FP32 (Kingma & Ba 2015; every framework here keeps them in FP32)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointSize:
    bytes_per_param: int
    params: int
    keep_last: int
    what: str
    """The states a checkpoint holds, in words."""

    @property
    def checkpoint_bytes(self) -> int:
        return self.bytes_per_param * self.params

    @property
    def disk_bytes(self) -> int:
        """The newest keep_last checkpoints, plus one being written before the oldest is pruned."""
        return (self.keep_last + 1) * self.checkpoint_bytes


def bytes_per_param(plan: ParallelPlan) -> tuple[int, str]:
    """(bytes, what) a checkpoint stores per parameter under this plan's framework and precision."""
    if plan.framework == "fsdp":
        # OLMo-style FSDP keeps FP32 parameters (mixed precision casts a BF16 copy for compute only).
        return 4 + ADAM_BYTES_PER_PARAM, "fp32 weights, Adam moments"
    if plan.precision == "fp32" and plan.framework == "megatron":
        # Megatron-LM docs, distributed optimizer table: fp32 params need no separate main copy.
        return 4 + ADAM_BYTES_PER_PARAM, "fp32 weights, Adam moments"
    if plan.precision == "fp32":
        # DeepSpeed ZeRO keeps an FP32 partition copy of the weights even when they are FP32 already.
        return 4 + 4 + ADAM_BYTES_PER_PARAM, "fp32 weights, fp32 optimizer copy, Adam moments"
    # 16-bit (bf16, fp16; fp8 plans keep bf16 weights): the seed's 14P, 2 + 3 x 4 bytes
    # (000_c341372fa13853c8.txt, 'Required Memory Estimation').
    return 2 + 4 + ADAM_BYTES_PER_PARAM, "16-bit weights, fp32 master weights, Adam moments"


def checkpoint_size(model: ModelSpec, plan: ParallelPlan, *, keep_last: int = 2) -> CheckpointSize:
    per_param, what = bytes_per_param(plan)
    if plan.lora_rank:
        # Megatron-Bridge's PEFT checkpoints hold the adapters' states only; the frozen base is the pretrained one.
        return CheckpointSize(bytes_per_param=per_param,
                              params=lora_param_count(model, plan.lora_rank, plan.lora_targets),
                              keep_last=keep_last, what=f"LoRA adapters only: {what}")
    # The embedding (and an untied output layer) are saved at the rows the framework pads them to (memory.vocab_rows).
    params = exact_param_count(model) + vocab_padding_params(model, vocab_rows(model, plan))
    return CheckpointSize(bytes_per_param=per_param, params=params, keep_last=keep_last, what=what)
