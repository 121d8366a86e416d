"""Step time, MFU and throughput of a plan: compute from FLOPs at a shape-dependent efficiency, plus the
exposed part of every collective, the pipeline bubble and the optimizer step. Seconds throughout.

Peak FLOP/s come from the GPU table (GPUSpec); achievable fractions come from `Calibration`, fitted
by benchmarks/accuracy.py against the published runs in shared/data.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from genconf.plan.counting import model_flops_per_token, recompute_flops_per_token
from genconf.plan.memory import rank_params, vocab_rows
from genconf.plan.pipeline import bubble_fraction, stage_layers
from genconf.plan.specs import ClusterSpec, GPUSpec, ModelSpec, ParallelPlan


@dataclass(frozen=True, kw_only=True, slots=True)
class Calibration:
    """Achievable fractions of the datasheet rates, per GPU architecture."""

    gemm_efficiency: float
    """Fraction of dense peak a large, well-shaped BF16 GEMM reaches (cuBLAS)."""
    fp8_gemm_efficiency: float
    """Same for FP8 GEMMs, as a fraction of the FP8 peak."""
    gemm_k_half: int
    """Reduction length at which a GEMM reaches half its large-K efficiency."""
    attention_fwd_efficiency: float
    """Flash-attention forward, fraction of BF16 peak (causal blocks skipped)."""
    attention_bwd_efficiency: float
    """Flash-attention backward, fraction of BF16 peak."""
    hbm_efficiency: float
    """Fraction of HBM bandwidth that memory-bound kernels reach."""
    nvlink_efficiency: float
    """NCCL bus bandwidth over NVLink as a fraction of one-way link bandwidth."""
    ib_efficiency: float
    """NCCL bus bandwidth over InfiniBand as a fraction of the NIC rate."""
    collective_latency_s: float
    """Fixed cost of one collective call."""
    kernel_launch_s: float
    """Host time to launch one kernel: bounds tiny layers."""
    step_overhead_s: float
    """Per-step host work: data loading, logging, optimizer launch."""
    microbatch_overhead_s: float = 0.002
    """Per micro-batch and stage: schedule bookkeeping, p2p handshakes, Python dispatch."""
    clock_factor: float = 1.0
    """Sustained clock relative to the datasheet's (power-limited parts < 1)."""
    tp_overlap_exposed: float = 0.25
    """Fraction of TP communication still exposed with --tp-comm-overlap."""
    dp_overlap_efficiency: float = 0.9
    """Fraction of the backward that gradient reduce-scatter/all-reduce can hide behind."""


# --- kernels --------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=65536)
def gemm_time_s(m: int, n: int, k: int, peak_tflops: float, efficiency: float, k_half: int, sms: int,
                hbm_tbyte_per_s: float, bytes_per_elem: int, launch_s: float) -> float:
    """One (m x k) @ (k x n) GEMM: tensor-core time at an efficiency reduced by wave quantization
    (128x128 output tiles scheduled over the SMs) and short reductions, or HBM time if memory-bound."""
    tiles = math.ceil(m / 128) * math.ceil(n / 128)
    waves = math.ceil(tiles / sms)
    utilisation = tiles / (waves * sms)
    eff = efficiency * utilisation * k / (k + k_half)
    compute = 2.0 * m * n * k / (peak_tflops * 1e12 * eff)
    memory = bytes_per_elem * (m * k + k * n + m * n) / (hbm_tbyte_per_s * 1e12)
    return max(compute, memory) + launch_s


def _linear_s(gpu: GPUSpec, cal: Calibration, m: int, n: int, k: int, fp8: bool) -> float:
    """Forward + backward (dgrad, wgrad) of one linear layer: three GEMMs."""
    if fp8:
        peak, eff, width = gpu.peak_tflops("fp8") * cal.clock_factor, cal.fp8_gemm_efficiency, 1
    else:
        peak, eff, width = gpu.peak_bf16_tflops * cal.clock_factor, cal.gemm_efficiency, 2
    hbm = gpu.hbm_tbyte_per_s * cal.hbm_efficiency
    args = (peak, eff, cal.gemm_k_half, gpu.num_sms, hbm, width, cal.kernel_launch_s)
    return gemm_time_s(m, n, k, *args) + gemm_time_s(m, k, n, *args) + gemm_time_s(k, n, m, *args)


@dataclass(frozen=True, slots=True)
class LayerTime:
    fwd_s: float
    """Forward compute of one layer for one micro-batch (GEMMs, attention, element-wise)."""
    bwd_s: float
    """Backward compute, recomputation included."""
    tp_comm_s: float
    """Exposed TP (and EP) communication, forward + backward."""
    cp_comm_s: float
    """Exposed context-parallel ring traffic."""


def _bandwidth(cluster: ClusterSpec, cal: Calibration, group_span: int) -> tuple[float, float]:
    """(bytes/s, latency) for a collective whose ranks span `group_span` consecutive GPUs."""
    if group_span <= cluster.nvlink_domain:
        return cluster.nvlink_gbyte_per_s_one_way * 1e9 * cal.nvlink_efficiency, cal.collective_latency_s
    return cluster.ib_gbyte_per_s_per_gpu * 1e9 * cal.ib_efficiency, 2 * cal.collective_latency_s


def layer_time(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec, cal: Calibration) -> LayerTime:
    gpu = cluster.gpu
    t = plan.tp
    n = plan.mbs * plan.seq_length // plan.cp          # tokens per micro-batch per rank
    h, q, kv = model.hidden_size, model.query_width, model.kv_width
    fp8 = plan.precision == "fp8"
    f = model.moe_ffn_hidden_size if model.is_moe else model.ffn_hidden_size
    k_routed = model.moe_top_k if model.is_moe else 1
    branches = 2 if model.gated else 1
    gemms = (_linear_s(gpu, cal, n, (q + 2 * kv) // t, h, fp8)
             + _linear_s(gpu, cal, n, h, q // t, fp8)
             + _linear_s(gpu, cal, n * k_routed, branches * f // t, h, fp8)
             + _linear_s(gpu, cal, n * k_routed, h, f // t, fp8))
    peak_bf16 = gpu.peak_bf16_tflops * 1e12 * cal.clock_factor
    hbm = gpu.hbm_tbyte_per_s * 1e12 * cal.hbm_efficiency
    # Attention core: QK^T and AV, 4*n*s*d*a/t multiply-adds x 2 FLOPs... = 4 n s q / t FLOPs forward.
    attn_flops = 4.0 * n * plan.seq_length * q / t
    if plan.layer_spec == "te":
        attn_flops *= 0.5  # flash attention skips fully masked causal blocks
        attn_fwd = attn_flops / (peak_bf16 * cal.attention_fwd_efficiency)
        attn_bwd = 2.5 * attn_flops / (peak_bf16 * cal.attention_bwd_efficiency)
    else:
        # Unfused: batched GEMMs with K = head dim, and the a*s^2 scores through HBM (fused softmax kernel).
        head_k = model.kv_channels
        bmm_eff = cal.gemm_efficiency * head_k / (head_k + cal.gemm_k_half)
        scores = model.num_attention_heads / t * n * plan.seq_length
        attn_fwd = attn_flops / (peak_bf16 * bmm_eff) + 7.0 * scores / hbm
        attn_bwd = 2 * attn_flops / (peak_bf16 * bmm_eff) + 10.0 * scores / hbm
    # Element-wise (norms, bias-activation, dropout-add, rope), memory-bound; unfused moves ~2x more.
    elem_bytes_per_token = 2 * (16 * h / (t if plan.sequence_parallel else 1) + 3 * branches * f * k_routed / t)
    elem_fwd = (1.0 if plan.layer_spec == "te" else 2.0) * n * elem_bytes_per_token / hbm
    fwd = gemms / 3 + attn_fwd + elem_fwd
    bwd = 2 * gemms / 3 + attn_bwd + 2 * elem_fwd
    if plan.recompute == "full":
        bwd += fwd
    elif plan.recompute == "selective":
        bwd += attn_fwd
    kernels = 14 if plan.layer_spec == "te" else 40
    fwd = max(fwd, kernels * cal.kernel_launch_s)
    bwd = max(bwd, 2 * kernels * cal.kernel_launch_s)

    tp_comm = 0.0
    if t > 1:
        bw, lat = _bandwidth(cluster, cal, t)
        volume = 2.0 * n * h  # bf16 activations of one micro-batch
        per_op = 2 * (t - 1) / t * volume / bw + lat  # all-reduce, or all-gather + reduce-scatter under SP
        ops = 4 + (2 if plan.recompute == "full" else 0)
        tp_comm = ops * per_op * (cal.tp_overlap_exposed if plan.tp_comm_overlap else 1.0)
    if model.is_moe and plan.ep > 1:
        bw, lat = _bandwidth(cluster, cal, t * plan.ep)
        a2a = (plan.ep - 1) / plan.ep * 2.0 * n * k_routed * h / (plan.sequence_parallel and t or 1) / bw + lat
        tp_comm += 4 * a2a  # dispatch + combine, forward and backward
    cp_comm = 0.0
    if plan.cp > 1:
        bw, lat = _bandwidth(cluster, cal, t * plan.cp)
        ring = (plan.cp - 1) * (2.0 * 2 * n * kv / t / bw + lat)  # K and V chunks around the ring
        cp_comm = max(0.0, ring - attn_fwd) + max(0.0, 2 * ring - attn_bwd)
    return LayerTime(fwd, bwd, tp_comm, cp_comm)


# --- the step -------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class StepCost:
    step_time_s: float
    compute_s: float
    """Forward + backward of all micro-batches on the slowest stage, TP/CP communication included."""
    bubble_s: float
    pp_comm_s: float
    dp_comm_s: float
    optimizer_s: float
    overhead_s: float
    tp_comm_s: float
    """Part of compute_s spent in exposed TP/EP communication."""
    model_flops_per_step: float
    hardware_flops_per_step: float
    tokens_per_step: int
    num_gpus: int
    peak_tflops_per_gpu: float
    bubble_fraction: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_time_s

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens_per_s / self.num_gpus

    @property
    def tflops_per_gpu(self) -> float:
        """Model TFLOP/s per GPU (no recomputation counted)."""
        return self.model_flops_per_step / self.step_time_s / self.num_gpus / 1e12

    @property
    def hardware_tflops_per_gpu(self) -> float:
        return self.hardware_flops_per_step / self.step_time_s / self.num_gpus / 1e12

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation against the dense peak of the plan's compute dtype."""
        return self.tflops_per_gpu / self.peak_tflops_per_gpu

    @property
    def hfu(self) -> float:
        return self.hardware_tflops_per_gpu / self.peak_tflops_per_gpu


def _dp_comm_s(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec, cal: Calibration,
               params_on_rank: int, bwd_window_s: float, fwd_window_s: float) -> float:
    """Exposed data-parallel communication per step."""
    d = plan.dp * plan.cp
    if d == 1:
        return 0.0
    bw, lat = _bandwidth(cluster, cal, plan.tp * d)
    ring = (d - 1) / d
    grad_bytes = 2 if plan.framework == "deepspeed" or plan.precision == "fp16" else 4
    p = params_on_rank
    buckets = max(1, math.ceil(p / 40e6))
    if plan.framework == "fsdp" or (plan.framework == "deepspeed" and plan.zero_stage == 3):
        # Every micro-batch gathers parameters for forward and backward and reduce-scatters gradients,
        # prefetched behind compute.
        per_mb = ring * (2 * 2 * p + grad_bytes * p) / bw + 3 * model.num_layers * lat
        if plan.zero_stage == 2 and plan.framework == "fsdp":
            per_mb = ring * (2 * p + grad_bytes * p) / bw + 2 * model.num_layers * lat
        if plan.zero_stage == 0:
            return max(0.0, 2 * ring * grad_bytes * p / bw - cal.dp_overlap_efficiency * bwd_window_s) + buckets * lat
        exposed = max(0.0, per_mb - cal.dp_overlap_efficiency * (bwd_window_s + fwd_window_s))
        return plan.num_microbatches * exposed + 2 * lat
    if plan.distributed_optimizer or (plan.framework == "deepspeed" and plan.zero_stage >= 1):
        reduce = ring * grad_bytes * p / bw
        gather = ring * 2 * p / bw
        if plan.framework == "deepspeed":
            fwd_window_s = 0.0  # DeepSpeed all-gathers updated parameters after the step, unoverlapped
        exposed = (max(0.0, reduce - cal.dp_overlap_efficiency * bwd_window_s)
                   + max(0.0, gather - cal.dp_overlap_efficiency * fwd_window_s))
        return exposed + reduce / buckets + 2 * buckets * lat
    allreduce = 2 * ring * grad_bytes * p / bw
    return max(0.0, allreduce - cal.dp_overlap_efficiency * bwd_window_s) + allreduce / buckets + buckets * lat


def _optimizer_s(plan: ParallelPlan, cluster: ClusterSpec, cal: Calibration, params_on_rank: int) -> float:
    """Adam over this rank's shard: ~36 bytes of HBM traffic per parameter (fp32 param, grad, m, v in and out,
    bf16 param out, grad-norm read); host Adam when offloaded."""
    shard = plan.shard_size if (plan.zero_stage >= 1 or plan.framework == "fsdp" and plan.zero_stage >= 2) else 1
    p = params_on_rank / shard
    if plan.offload_optimizer:
        cpu_gbyte_per_s = 100.0 / cluster.gpus_per_node  # node memory bandwidth shared by its GPUs' CPU Adam
        pcie_gbyte_per_s = 25.0
        return p * 36 / (cpu_gbyte_per_s * 1e9) + p * 6 / (pcie_gbyte_per_s * 1e9)
    return p * 36 / (cluster.gpu.hbm_tbyte_per_s * 1e12 * cal.hbm_efficiency)


def step_cost(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec, cal: Calibration) -> StepCost:
    gpu = cluster.gpu
    lt = layer_time(model, plan, cluster, cal)
    layer_s = lt.fwd_s + lt.bwd_s + lt.tp_comm_s + lt.cp_comm_s
    n = plan.mbs * plan.seq_length // plan.cp
    rows = vocab_rows(model, plan)
    # Logits GEMM (kept in BF16 under FP8 recipes) and the fp32 cross entropy on the last stage.
    logits_s = _linear_s(gpu, cal, n, rows // plan.tp, model.hidden_size, False)
    logits_s += 3 * 4.0 * n * rows / plan.tp / (gpu.hbm_tbyte_per_s * 1e12 * cal.hbm_efficiency)
    layers = stage_layers(model.num_layers, plan)
    stage_s = [count * layer_s + cal.microbatch_overhead_s for count in layers]
    stage_s[-1] += logits_s
    pp_comm = 0.0
    if plan.pp > 1:
        bw, lat = _bandwidth(cluster, cal, plan.tp * plan.cp * plan.dp * 2)
        sp = plan.tp if plan.sequence_parallel else 1
        send = 2.0 * n * model.hidden_size / sp / bw + lat
        pp_comm = 2 * send * (0.25 if plan.vp > 1 else 1.0)
    slowest = max(stage_s) + pp_comm
    m = plan.num_microbatches
    bubble = (plan.pp - 1) / plan.vp * slowest if plan.pp > 1 else 0.0
    compute = m * (slowest - pp_comm)
    tp_comm = m * max(layers) * lt.tp_comm_s
    # DP traffic of the stage with the most parameters, hidden behind one micro-batch's backward/forward.
    heaviest = max(range(plan.pp), key=lambda i: layers[i]) if plan.pp > 1 else 0
    params = max(rank_params(model, plan, i).total for i in {0, plan.pp - 1, heaviest})
    bwd_window = max(layers) * lt.bwd_s
    fwd_window = max(layers) * lt.fwd_s
    dp_comm = _dp_comm_s(model, plan, cluster, cal, params, bwd_window, fwd_window)
    optimizer = _optimizer_s(plan, cluster, cal, params)
    overhead = cal.step_overhead_s
    step = compute + bubble + m * pp_comm + dp_comm + optimizer + overhead
    tokens = plan.gbs * plan.seq_length
    flops_token = model_flops_per_token(model, plan.seq_length)
    hw_token = flops_token + recompute_flops_per_token(model, plan.seq_length, plan.recompute)
    peak = gpu.peak_tflops({"fp8": "fp8", "fp16": "fp16", "fp32": "tf32"}.get(plan.precision, "bf16"))
    return StepCost(step_time_s=step, compute_s=compute, bubble_s=bubble, pp_comm_s=m * pp_comm, dp_comm_s=dp_comm,
                    optimizer_s=optimizer, overhead_s=overhead, tp_comm_s=tp_comm,
                    model_flops_per_step=flops_token * tokens, hardware_flops_per_step=hw_token * tokens,
                    tokens_per_step=tokens, num_gpus=plan.world_size, peak_tflops_per_gpu=peak,
                    bubble_fraction=bubble_fraction(plan))


def training_time_s(cost: StepCost, tokens: float) -> float:
    """Wall time to train `tokens` tokens at this step rate."""
    return tokens / cost.tokens_per_s
