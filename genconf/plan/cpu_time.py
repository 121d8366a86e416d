"""The expected time of one training step of a plan run on CPUs (`genconf launch` without a GPU), before it starts.

A CPU launch runs every rank as one process with one thread (genconf.cpu_numerics pins the thread counts), all on
this machine, with gloo between them. A step then costs

    compute   FLOPs of the step (model FLOPs + recompute) / (ranks that run at once x FLOP/s of one core)
    passes    every rank's forward+backward passes (micro-batches x virtual chunks) x a fixed cost per pass
              (Python, autograd, the framework's bookkeeping), stretched by ranks / cores when they share cores
    comm      gradient all-reduce over data parallelism, ZeRO-3/FULL_SHARD weight gathers and the activation
              all-reduces of tensor parallelism, ring-style (n-1)/n of the bytes per pass over gloo's loopback bandwidth

The rates are measured, not assumed (benchmarks/cpu_step_time.py, benchmarks/results/cpu_step_time.md): eight real
launches of the three runners on a 2-core Xeon under the AVX2 pins, shared with other jobs (load ~5), fitted; the
estimate is within 1.7x of every one. A single pinned core's FP32 GEMM peaks near 24 GFLOP/s there; a training step
reaches half of it. Another CPU differs; the estimate is for refusing a run that would take minutes a step, not
for timing it.

Pure: standard library and genconf's counting only.
"""

from __future__ import annotations

from dataclasses import dataclass

from genconf.plan.counting import (checkpoint_early_stop, exact_param_count, model_flops_per_token,
                                   recompute_flops_per_token)
from genconf.plan.specs import ModelSpec, ParallelPlan

CPU_FLOP_PER_S_PER_CORE = 12e9
"""FP32 FLOP/s one pinned core reaches inside a training step (measured: benchmarks/results/cpu_step_time.md)."""
CPU_BF16_SLOWDOWN = 6.5
"""BF16 (and FP16) GEMMs run this many times slower than FP32 under the AVX2 pins, which have no BF16 instructions
(measured, same file): the reason the recipes' smoke variants compute in FP32."""
CPU_SECONDS_PER_PASS = 0.007
"""Fixed cost of one micro-batch's forward+backward through one model chunk on one rank (measured, same file)."""
GLOO_BYTES_PER_S = 0.88e9
"""gloo all-reduce bandwidth between processes of one machine, bytes/s (measured, same file)."""
CPU_STEP_LIMIT_S = 600.0
"""`genconf launch` on a CPU refuses a plan whose step is expected to take longer than this (10 minutes)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CpuStepEstimate:
    """Expected seconds of one optimizer step of a plan on `cores` CPU cores, and its parts."""

    step_time_s: float
    compute_s: float
    """FLOPs / (min(ranks, cores) x FLOP/s per core)."""
    passes_s: float
    """Micro-batch passes per rank x seconds per pass, x ranks / cores when oversubscribed."""
    comm_s: float
    """Data- and tensor-parallel all-reduces over gloo."""
    flops_per_step: float
    """Model FLOPs plus recompute FLOPs of one step, all ranks together."""
    flop_per_s_per_core: float
    """The rate used: FP32's, or BF16's under the pins."""
    passes_per_rank: int
    ranks: int
    cores: int

    def describe(self) -> str:
        """One line: the total and how it splits."""
        return (f"{format_seconds(self.step_time_s)} per step on {self.cores} CPU core{'s' if self.cores > 1 else ''} "
                f"({self.ranks} ranks): {self.flops_per_step:.3g} FLOPs at {self.flop_per_s_per_core / 1e9:.3g} GFLOP/s "
                f"a core = {format_seconds(self.compute_s)}, {self.passes_per_rank} micro-batch passes per rank = "
                f"{format_seconds(self.passes_s)}, gloo all-reduces {format_seconds(self.comm_s)}")


def format_seconds(seconds: float) -> str:
    """0.0123 -> '12 ms', 75 -> '75 s', 7300 -> '2.0 h'."""
    if seconds < 1:
        return f"{seconds * 1e3:.0f} ms"
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def format_training_time(time_s: float, num_gpus: int) -> str:
    """'34.3 days, 315,652 GPU-hours'; a run under two days in hours, minutes or seconds (format_seconds), and its
    GPU-hours to two figures, so a short run does not read '0.0 days, 0 GPU-hours'; a run of a year or more says its
    years ('2,187.0 days (6.0 years)'). From the unrounded time: plan.json's days (34.25) read '34.2' for 34.2504."""
    days = time_s / 86400
    years = f" ({days / 365.25:.1f} years)" if days >= 365.25 else ""
    when = f"{days:,.1f} days{years}" if days >= 2 else format_seconds(time_s)
    hours = time_s * num_gpus / 3600
    return f"{when}, {f'{hours:,.0f}' if hours >= 100 else f'{hours:.2g}'} GPU-hours"


def cpu_step_time(model: ModelSpec, plan: ParallelPlan, *, cores: int,
                  flop_per_s_per_core: float = CPU_FLOP_PER_S_PER_CORE, seconds_per_pass: float = CPU_SECONDS_PER_PASS,
                  gloo_bytes_per_s: float = GLOO_BYTES_PER_S, bf16_slowdown: float = CPU_BF16_SLOWDOWN) -> CpuStepEstimate:
    """Expected CPU step time of `plan` with every rank on this machine's `cores` cores (see the module doc)."""
    if cores < 1:
        raise ValueError(f"cores must be positive, got {cores}")
    ranks = plan.world_size
    busy = min(ranks, cores)
    share = max(1.0, ranks / cores)  # ranks beyond the cores wait for one
    tokens = plan.gbs * plan.seq_length
    flops = tokens * (model_flops_per_token(model, plan.seq_length)
                      + recompute_flops_per_token(model, plan.seq_length, plan.recompute, plan.recomputed_modules,
                                                  early_stop=checkpoint_early_stop(model, plan)))
    rate = flop_per_s_per_core / (1.0 if plan.precision == "fp32" else bf16_slowdown)
    compute_s = flops / (busy * rate)
    micro = max(1, plan.gbs // (plan.mbs * plan.dp))
    passes = micro * plan.vp
    passes_s = passes * seconds_per_pass * share
    # FP32 gradients of one rank's share of the model, reduced over dp (ring: 2 (n-1)/n of the bytes)
    grad_bytes = 4 * exact_param_count(model) / (plan.tp * plan.pp)
    comm_bytes = 2 * (plan.dp - 1) / plan.dp * grad_bytes if plan.dp > 1 else 0.0
    if plan.zero_stage == 3 and plan.framework != "megatron" and plan.dp > 1:
        # ZeRO-3 / FULL_SHARD: every pass gathers the weights twice (forward, backward) and reduce-scatters gradients
        comm_bytes += passes * 3 * (plan.dp - 1) / plan.dp * grad_bytes
    if plan.tp > 1:
        # Megatron TP: two all-reduces forward and two backward per layer of b x s x h FP32 activations
        layers = model.num_layers / plan.pp
        activation_bytes = 4 * plan.mbs * plan.seq_length * model.hidden_size
        comm_bytes += micro * layers * 4 * 2 * (plan.tp - 1) / plan.tp * activation_bytes
    comm_s = comm_bytes / gloo_bytes_per_s * share
    return CpuStepEstimate(step_time_s=compute_s + passes_s + comm_s, compute_s=compute_s, passes_s=passes_s,
                           comm_s=comm_s, flops_per_step=flops, flop_per_s_per_core=rate, passes_per_rank=passes, ranks=ranks, cores=cores)
