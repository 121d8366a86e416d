"""Step time, MFU and throughput of a plan, built from kernel physics (genconf.plan.kernels): every GEMM of a layer
at its real shape and dtype, flash or unfused attention, the memory-bound passes (norms, activations, FP8
quantization), the exposed part of every collective (TP, CP, EP, PP, DP) on the link it crosses, the pipeline
bubble, host-side launch limits and the optimizer step. Seconds throughout.

Peak rates come from the GPU table (GPUSpec); kernel efficiencies from `Calibration` (genconf/catalog/calibration.yaml):
the GEMM and attention terms are fitted to measured kernels (benchmarks/data/h100_kernels), the few
end-to-end terms (sustained clock, overlap, per-micro-batch host time) to published runs (benchmarks/accuracy.py).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from genconf.plan import kernels
from genconf.plan.counting import (LORA_COLUMN_PARALLEL, causal_masked_flops_per_token, checkpoint_early_stop,
                                    dense_layer_model, layer_tensors, lora_flops_per_token, lora_target_shapes,
                                    model_flops_per_token, recompute_flops_per_token, transformer_view,
                                    window_keys_per_query)
from genconf.plan.memory import lora_rank_params, offloaded_activation_bytes, rank_params, vocab_rows
from genconf.plan.pipeline import (bf16_layers_on_rank, bubble_fraction, dp_overlap_passes, format_layout,
                                   recomputed_layers, stage_layers)
from genconf.plan.specs import (HYBRID_LAYER_KINDS, LORA_TARGETS, ClusterSpec, GPUSpec, HashOnce, ModelSpec,
                                ParallelPlan, hash_once)


@hash_once
@dataclass(frozen=True, kw_only=True, slots=True)
class Calibration(HashOnce):
    """Achievable fractions of the datasheet rates and the host-side costs, per GPU architecture."""

    gemm_efficiency: float
    """BF16 GEMM main loop: fraction of the per-SM dense peak a full wave of tiles reaches (cuBLAS)."""
    fp8_gemm_efficiency: float
    """Same for FP8 GEMMs, as a fraction of the FP8 peak."""
    fp4_gemm_efficiency: float = 0.6
    """Same for NVFP4 GEMMs (Blackwell), as a fraction of the FP4 peak."""
    mxfp8_gemm_efficiency: float = 0.0
    """Same for MXFP8 block-scaled GEMMs (Blackwell: one E8M0 scale per 32 elements of each operand, loaded
    beside the tiles), as a fraction of the FP8 peak; 0: as fp8_gemm_efficiency. Fitted on the published runs
    that differ only in the recipe (same model, layout, GPU and container): MXFP8 ran 2-10% slower than FP8
    current scaling (median 5.5%, 10 dense pairs) where the quantization traffic alone would make it ~1% faster."""
    gemm_tile_overhead_s: float = 0.5e-6
    """Fixed prologue/epilogue time per 128x128 output tile and wave."""
    attention_fwd_efficiency: float = 0.65
    """Flash-attention forward: fraction of the per-SM BF16 peak one 128 x 128 block runs at."""
    attention_bwd_efficiency: float = 0.60
    """Same for the backward."""
    attention_fwd_tile_s: float = 2.0e-6
    """Fixed cost of each wave of query tiles in the forward (prologue, rescaling, epilogue)."""
    attention_bwd_tile_s: float = 30.0e-6
    """Same in the backward (dQ accumulation, the dO.O pre-pass)."""
    local_score_bytes: tuple[float, float] = (38.0, 48.0)
    """Bytes per attention-score element the unfused (local-spec) attention moves, forward and backward.
    Without megatron's fused softmax kernels (a pip-installed megatron-core, genconf's launcher): baddbmm writes
    bf16 scores (2); masked_fill reads them and the mask and writes (5); the fp32 softmax upcasts (2+4), takes
    the row max and sum and normalises (4+4+4) and casts back (4+2); dropout reads, writes and keeps a 1-byte
    mask (5); the AV bmm reads the probabilities (2). Backward: the probability gradient (2), dropout (5), the
    fp32 softmax gradient with its row reduction (2+4, 4+4+4+4, 4+2), masked_fill (5), the two bmm gradients (4).
    With megatron's fused scale-mask-softmax kernel see local_fused_score_bytes."""
    local_fused_score_bytes: tuple[float, float] = (11.0, 15.0)
    """Same with megatron's fused kernels (ParallelPlan.fused_kernels): the fused scale-mask-softmax reads the
    bf16 scores and writes bf16 probabilities (4), dropout keeps a mask and writes (5), the bmms read and write
    (2): about 11; backward about 15 (fitted on the published A100 Megatron-LM runs)."""
    misaligned_attention_gemm_slowdown: tuple[float, float] = (2.9, 2.0)
    """Time per FLOP of the unfused attention's batched GEMMs (QK^T, AV) whose head dim is not a multiple of 8
    16-bit elements (16 bytes, the tensor-core kernels' vector loads), over an aligned neighbour's, forward and
    backward: measured 2.6-3.0 and 1.8-2.4 at BLOOM's head dims 450, 150 and 108 on an H200, bf16 and fp16
    (benchmarks/results/misaligned_gemm_h200.md)."""
    sdpa_efficient_slowdown: tuple[float, float] = (2.3, 11.8)
    """PyTorch SDPA's memory-efficient attention (what genconf's own model runs above head dim 256) over the flash
    attention this model prices at that dim, forward and backward: one measured shape, 4 heads x 2,048 tokens at
    head dim 448 on an H200, 0.225 / 3.44 ms against 0.098 / 0.291 ms priced (misaligned_gemm_h200.md)."""
    local_elementwise_passes: float = 3.0
    """Element-wise traffic of the local spec relative to TE's fused kernels: 3 without apex and megatron's
    fused kernels (bias, dropout with its RNG and mask, and the add run apart)."""
    local_fused_elementwise_passes: float = 1.5
    """Same with megatron's fused bias-GeLU and bias-dropout-add kernels and apex's LayerNorm."""
    flash2_attention_factor: float = 0.6
    """FlashAttention-2's efficiency relative to the attention efficiencies above (cuDNN's fused attention, what
    the kernel tables measured): on an H100 FlashAttention-2 reaches ~350 of the ~600-650 TFLOP/s FlashAttention-3
    and cuDNN reach forward (Shah et al. 2024, FlashAttention-3: 1.5-2.0x faster than FlashAttention-2); Hopper's
    entry in calibration.yaml is measured: 0.53 at head dim 128 on an H200 (eager_elementwise_h200.md). 1 where
    the efficiencies are FlashAttention-2's own (Ampere)."""
    triton_attention_factor: float = 0.6
    """Flash attention written in Triton relative to FlashAttention-2 (Dao 2023, FlashAttention-2: 1.3-2.5x faster
    than FlashAttention in Triton)."""
    hbm_efficiency: float = 0.9
    """Fraction of HBM bandwidth that memory-bound kernels reach."""
    nvlink_efficiency: float = 0.8
    """NCCL bus bandwidth over NVLink as a fraction of one-way link bandwidth."""
    ib_efficiency: float = 0.85
    """NCCL bus bandwidth over InfiniBand as a fraction of the NIC rate."""
    host_link_efficiency: float = 0.85
    """Fraction of the CPU-GPU link (ClusterSpec.host_link_gbyte_per_s_per_gpu) that offload copies to and from
    pinned host memory reach (the link's protocol overhead, and on Grace-Blackwell the CPU memory both GPUs of a
    superchip share)."""
    collective_latency_s: float = 1.5e-5
    """Base start-up cost of one collective (grows with log2 of the group)."""
    ring_hop_latency_s: float = 5.0e-6
    """Latency of one step of a ring all-gather/reduce-scatter between nodes (a quarter of it inside an NVLink
    domain): a ring over d ranks takes d - 1 steps."""
    kernel_launch_s: float = 4.0e-6
    """Host time per eager PyTorch op (Python, dispatcher, autocast, kernel launch): bounds layers whose GPU
    work is shorter than their launches."""
    graph_launch_s: float = 1.0e-6
    """Same with fused Transformer Engine layers and CUDA graphs (Megatron with the te spec)."""
    grace_host_factor: float = 2.75
    """Host time per launch and eager op on a Grace CPU (ClusterSpec.host_cpu: GB200/GB300 NVL72, GH200) over the x86
    hosts the launch terms describe. The default is the prior measured op for op: a torch.nn.Linear forward takes
    37.08 us of CPU time on a GB200 and 13.48 us on an H100 DGX's Xeon Platinum 8480C (TransformerEngine#2053,
    "High CPU overhead on Grace systems"); calibration.yaml's value is fitted on the MoE rows, whose layers wait
    on the host (part of that wait is the token-count copy and its synchronisation, which no CPU speeds up)."""
    moe_host_ops: float = 150.0
    """Host-side operations of one dropless MoE layer, forward + backward, that run eagerly at kernel_launch_s
    each: router GEMM, score function, top-k and the auxiliary losses (~15 forward), the permutation and its
    index bookkeeping (~10), the dispatcher's token-count copy to the host and its synchronisation, the two
    all-to-alls with their split preprocessing (~10), the activation and unpermute (~10): about 50 forward and
    twice that backward (counted from megatron-core 0.16 moe/router.py, token_dispatcher.py, experts.py)."""
    moe_host_ops_per_expert: float = 10.0
    """Same per local expert: the grouped GEMM's per-expert GEMMs of fc1 and fc2 and, under FP8/FP4, the
    quantisation of each expert's split (about 3 forward, 7 backward; Transformer Engine GroupedLinear)."""
    ssd_scan_efficiency: float = 0.3
    """Fraction of the BF16 peak the Mamba-2 scan (mamba_ssm's Triton state-space-dual kernels and what runs around
    them) reaches on the matmul work of cost.ssd_macs_per_token. This default is the prior (Dao & Gu 2024, Sec. 9.3:
    the SSD kernel overtakes FlashAttention-2 from 2K tokens, which runs at ~0.3-0.4 of peak); calibration.yaml's
    value is fitted on the hybrid rows (benchmarks/accuracy.py HYBRID_FIT_GRID) and is far lower: read it as the Mamba
    layer's time outside its GEMMs, not as a kernel efficiency."""
    step_overhead_s: float = 0.05
    """Per-step host work: data loading, logging, optimizer launch, gradient-norm synchronisation."""
    microbatch_overhead_s: float = 0.0
    """Per micro-batch and model chunk: schedule bookkeeping, p2p handshakes, Python dispatch."""
    clock_factor: float = 1.0
    """Sustained tensor-core clock under a training load's dense GEMMs relative to the one the kernels were
    measured at, on the architecture's best-powered part (see sustained_clock). Attention kernels are not
    slowed by it: the kernel table's flash-attention rates hold end to end (NeMo's long-sequence runs, where
    attention is 95% of the time at 1M tokens, run at the table's boost-clock rates, not clock_factor of them), as the
    softmax phases between their matmuls keep them below the power limit that dense GEMM streams hit."""
    fp8_clock_ratio: float = 1.0
    """Sustained clock under FP8/FP4 GEMM streams relative to clock_factor's (BF16's): a part at its power limit
    holds a lower clock when its tensor cores do twice the operations per cycle. Fitted on Hopper (benchmarks/accuracy.py
    FIT_GRID: the FP8 rows, with clock_factor measured under BF16); elsewhere 1, as the FP8 efficiencies are fitted at
    the clock the runs held."""
    full_clock_w_per_tflop: float = 0.0
    """Board power per dense BF16 datasheet TFLOP/s at which a part of this architecture holds the clock its
    efficiencies were fitted at: the best-powered part's TDP over its peak (A100 400 W / 312, H100 SXM
    700 / 989, GB300 1,400 / 2,500). A part with less power per TFLOP/s runs its tensor cores slower. 0: no
    power limit modelled."""
    power_clock_exponent: float = 0.0
    """How the sustained clock follows the power budget: clock ~ (TDP / power needed) ** this. CMOS dynamic
    power ~ C V^2 f with the voltage lowered along with the clock (DVFS) gives 1/3 at most; leakage and the
    fixed memory and I/O power make it steeper. Fitted across architectures (H100 at 500 W vs 700 W, B200 /
    B300 / GB200 / GB300 at 1,000-1,400 W)."""
    tp_overlap_exposed: float = 0.25
    """Fraction of TP communication still exposed with --tp-comm-overlap (userbuffers, split pipelined GEMMs)."""
    dp_overlap_efficiency: float = 0.9
    """Fraction of the overlap window (a micro-batch's backward or forward) gradient reduce-scatter /
    all-reduce and parameter all-gather can hide behind."""
    expert_dp_ib_overlap: float = 1.0
    """Share of the expert parameters' data-parallel collectives (megatron-core's expert-data-parallel group, the
    experts' gradient reduce-scatter and parameter all-gather) that can overlap compute where that group spans
    NVLink domains (InfiniBand); the rest is exposed. The prior, 1, treats them as the dense ones. Fitted on the
    MoE rows (benchmarks/accuracy.py EDP_FIT_GRID): the same Megatron-Bridge MoE models run 8-10% slower than
    priced on 8-GPU HGX nodes, where an expert-parallel size of 8 leaves one rank per node in each expert
    data-parallel group, and within 3% on NVL72 racks, where those groups stay inside NVLink
    (benchmarks/results/accuracy.md)."""
    nccl_all_to_all_efficiency: float = 1.0
    """What NCCL's all-to-all (megatron's alltoall token dispatcher: all_to_all_single with per-peer splits; Mamba's
    context-parallel all-to-alls) reaches of the link rates the ring collectives reach (nvlink_efficiency,
    ib_efficiency): it moves each rank's data as ranks - 1 peer sends at once. The flex dispatcher's DeepEP and
    HybridEP kernels write to their peers directly and are priced at the ring rates. Fitted on the published
    MoE rows whose recipe ran the alltoall dispatcher (benchmarks/bridge_moe_recipes.csv)."""
    ep_overlap_exposed: float = 0.25
    """Fraction of the expert-parallel all-to-all the combined 1F1B schedule hides behind another micro-batch's
    compute that still costs (megatron --overlap-moe-expert-parallel-comm): its kernels take SMs and memory
    bandwidth from the compute they hide behind (as tp_overlap_exposed for TP). What outlasts that compute is
    exposed in full."""
    pp_overlap_exposed: float = 0.25
    """Fraction of a micro-batch's pipeline p2p time every rank still pays under the interleaved schedule
    (overlap_p2p_comm): the sends and receives run beside the next chunk's compute, but NCCL's kernels take SMs and
    memory bandwidth from it (as tp_overlap_exposed for TP), on the slowest rank as on the others."""
    throughput_band: tuple[float, float] = (0.8, 1.2)
    """80% interval of measured / predicted tokens/s: percentiles of the residuals on published runs the
    calibration was not fitted to, their tail level (10% or less) the largest at which 80% of the rows fall inside
    the band built without their own source (benchmarks/accuracy.py --loso --write-calibration)."""
    moe_throughput_band: tuple[float, float] = (0.6, 1.3)
    """Same for mixture-of-experts models, a model left out instead of a source (one source, Megatron-Bridge, whose MoE
    throughput moved by up to 1.6x between container releases at the same layout)."""
    memory_band: tuple[float, float] = (0.9, 1.1)
    """Same for the measured / predicted peak memory per GPU (a model left out instead of a source)."""


# --- one transformer layer --------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class LayerTime:
    fwd_s: float
    """Forward of one layer for one micro-batch on one rank (GEMMs, attention, memory-bound passes)."""
    bwd_s: float
    """Backward of the same (data and weight gradients), without recomputation."""
    tp_comm_s: float
    """Exposed TP (sequence-parallel all-gather/reduce-scatter or all-reduce) and EP (all-to-all) time,
    forward + backward."""
    cp_comm_s: float
    """Exposed context-parallel ring traffic, forward + backward."""
    attn_fwd_s: float
    """The core-attention part of fwd_s (what selective recompute repeats)."""
    tp_fwd_comm_s: float
    """The forward part of tp_comm_s (what full recompute repeats)."""
    host_s: float
    """Host time to launch the layer's kernels, forward + backward (the GPU waits when this is longer)."""
    module_fwd_s: tuple[tuple[str, float], ...] = ()
    """Forward time of each module selective recompute can repeat (specs.RECOMPUTE_MODULES; core_attn is
    attn_fwd_s)."""
    early_stop_skip_s: float = 0.0
    """The part of fwd_s + tp_fwd_comm_s full recompute does not repeat under PyTorch's early-stopping checkpoint
    (counting.checkpoint_early_stop): the MLP's output projection, its TP reduction and the residual add."""

    def recompute_s(self, modules: tuple[str, ...]) -> float:
        """Forward time selective recompute of `modules` repeats."""
        times = dict(self.module_fwd_s, core_attn=self.attn_fwd_s)
        return sum(times.get(m, 0.0) for m in modules)


def sustained_clock(gpu: GPUSpec, cal: Calibration, *, gemm: bool = True) -> float:
    """Tensor-core clock under a training load as a fraction of the datasheet's: lowered where the part's TDP
    is below what its datasheet rate needs (power-capped parts: H100 96 GB at 500 W, B200 at 1,000 W against
    GB300's 1,400 W for a similar peak), and for dense GEMMs by the architecture's clock_factor."""
    need_w = cal.full_clock_w_per_tflop * gpu.peak_bf16_tflops
    power = min(1.0, gpu.tdp_w / need_w) ** cal.power_clock_exponent if need_w > 0 else 1.0
    return (cal.clock_factor if gemm else 1.0) * power


FP32_CUDA_CORES = "fp32-cuda-cores"
"""A GEMM dtype: fp32 without TF32 (torch.backends.cuda.matmul.allow_tf32 is False by default), on the CUDA cores."""


def _peak(gpu: GPUSpec, cal: Calibration, dtype: str) -> tuple[float, float, float]:
    """(peak TFLOP/s at the sustained clock, main-loop efficiency, bytes per input element) for GEMMs in dtype."""
    clock = sustained_clock(gpu, cal)
    if dtype in ("fp8", "mxfp8", "fp4"):
        clock *= cal.fp8_clock_ratio
    if dtype == "fp4":
        return gpu.peak_tflops("fp4") * clock, cal.fp4_gemm_efficiency, 0.5
    if dtype == "fp8":
        return gpu.peak_tflops("fp8") * clock, cal.fp8_gemm_efficiency, 1.0
    if dtype == "mxfp8":
        return gpu.peak_tflops("fp8") * clock, cal.mxfp8_gemm_efficiency or cal.fp8_gemm_efficiency, 1.0
    if dtype == "fp32":
        return gpu.peak_tflops("tf32") * clock, cal.gemm_efficiency, 4.0
    if dtype == FP32_CUDA_CORES:
        return gpu.peak_fp32_tflops * clock, cal.gemm_efficiency, 4.0
    return gpu.peak_bf16_tflops * clock, cal.gemm_efficiency, 2.0


def gemm_s(gpu: GPUSpec, cal: Calibration, m: int, n: int, k: int, dtype: str) -> float:
    peak, eff, width = _peak(gpu, cal, dtype)
    return kernels.gemm_s(max(1, m), max(1, n), max(1, k), peak_tflops=peak, efficiency=eff,
                          tile_overhead_s=cal.gemm_tile_overhead_s, sms=gpu.num_sms,
                          hbm_tbyte_per_s=gpu.hbm_tbyte_per_s * cal.hbm_efficiency, in_bytes=width,
                          out_bytes=4.0 if dtype in ("fp32", FP32_CUDA_CORES) else 2.0)


def linear_s(gpu: GPUSpec, cal: Calibration, m: int, n: int, k: int, dtype: str, *, groups: int = 1,
             frozen: bool = False) -> tuple[float, float]:
    """(forward, backward) of `groups` linear layers of one (m x k) @ (k x n) each: forward, then the data
    gradient (m x n) @ (n x k) and the weight gradient (k x m) @ (m x n), which a frozen weight (LoRA's base
    layers) skips."""
    fwd = gemm_s(gpu, cal, m, n, k, dtype)
    bwd = gemm_s(gpu, cal, m, k, n, dtype) + (0.0 if frozen else gemm_s(gpu, cal, k, n, m, dtype))
    return groups * fwd, groups * bwd


def _lora_s(gpu: GPUSpec, cal: Calibration, m: int, rank: int, fan_in: int, fan_out: int, act: int) -> tuple[float, float]:
    """(forward, backward) of one LoRA adapter on an (m x fan_in) -> (m x fan_out) layer (Hu et al. 2021): the
    input through A (fan_in -> r) and B (r -> fan_out) in bf16, its output added to the base layer's (read 2,
    write 1 of m x fan_out) and, backward, its data gradient added to the base layer's (m x fan_in)."""
    a_f, a_b = linear_s(gpu, cal, m, rank, fan_in, "bf16")
    b_f, b_b = linear_s(gpu, cal, m, fan_out, rank, "bf16")
    return (a_f + b_f + _mem_s(gpu, cal, 3.0 * act * m * fan_out),
            a_b + b_b + _mem_s(gpu, cal, 3.0 * act * m * fan_in))


def _mem_s(gpu: GPUSpec, cal: Calibration, num_bytes: float) -> float:
    return kernels.memory_bound_s(num_bytes, hbm_tbyte_per_s=gpu.hbm_tbyte_per_s, efficiency=cal.hbm_efficiency)


IMPLEMENTATIONS = ("megatron-te", "megatron-local", "megatron-local-fused", "torch-bf16", "torch-autocast",
                   "torch-compiled")
"""How a plan's layers run: megatron-core with Transformer Engine (fused kernels, cuDNN flash attention),
megatron-core's local spec (the attention scores go through HBM; with or without megatron's fused softmax and
element-wise kernels), genconf's PyTorch GPT under
DeepSpeed or sharded FSDP (bf16 weights, SDPA flash attention, eager element-wise ops) or under DDP (fp32 weights,
autocast to bf16: norms and the residual stream stay fp32), or either under torch.compile (torchtitan)."""

ELEMENTWISE_PASSES = {"megatron-te": 1.0, "megatron-local": 3.0, "megatron-local-fused": 1.5, "torch-bf16": 2.0,
                      "torch-autocast": 3.0, "torch-compiled": 1.2}
"""Memory traffic of the element-wise work (norms, residual adds, activation, RoPE, dropout) relative to TE's
fused kernels. Counted op by op: TE fuses norm+cast, bias+activation and bias+dropout+add (one read and one
write each); eager PyTorch runs each as its own kernel (about twice the passes); under autocast the residual
stream and the norms are fp32 (three times). The local spec's factors are calibration terms
(Calibration.local_elementwise_passes, local_fused_elementwise_passes)."""

KERNELS_PER_LAYER = {"megatron-te": 18, "megatron-local": 45, "megatron-local-fused": 35, "torch-bf16": 40,
                     "torch-autocast": 55, "torch-compiled": 20}
"""Forward kernels per layer (backward launches about twice as many), counted from profiles of each stack
(megatron's fused softmax, bias-GeLU and bias-dropout-add kernels replace about ten of the local spec's)."""

EAGER_BYTES = {"layernorm": (7.8, 16.8), "rmsnorm": (5.6, 15.2), "add": (6.4, 6.4), "gelu": (5.8, 7.5),
               "swiglu": (22.9, 39.3), "rope": (55.6, 59.8), "bias": (0.4, 4.3), "dropout": (7.7, 5.3)}
"""HBM bytes per element, forward and backward, of each element-wise piece of a dense layer in eager PyTorch, as
genconf's PyTorch GPT (genconf/train/torch_model.py) and llm-foundry's MPT write them, measured on an H200 at the
rate of a bf16 add in the same run (benchmarks/results/eager_elementwise_h200.md; mean of MPT-1B's and MPT-7B's
shapes, within 8% of each other but for LayerNorm's backward, 14%, and the bias's near-free forward): F.layer_norm /
F.rms_norm per element of h; the residual add (backward: the add joining the residual's two gradients, the same
kernel); exact GELU and the chunked SwiGLU (silu of one strided half times the other) per element of the
activation's output; genconf's RoPE (cat of the rotated halves, two multiplies
and an add) per element of q and k; a linear layer's bias (the GEMM's epilogue, backward the column sum) per output
element; dropout per element of h. Replaces ELEMENTWISE_PASSES for the eager stacks: torch's LayerNorm and GELU
are single kernels (as fused as Transformer Engine's count), the SwiGLU and RoPE written in PyTorch ops are not."""
EAGER_FP32_STREAM = 2.0
"""Under autocast over fp32 weights (torch-autocast) the norms and the residual stream stay fp32: their bytes
twice the bf16 pieces' (a prior, not measured: the bf16 casts of the norms' outputs before each GEMM are left out,
and a mixed fp32 + bf16 add moves 10 bytes per element rather than 12)."""

EXPERT_BIAS_BYTES = (56.4, 104.2)
"""HBM bytes per element of the experts' output (routed rows x width), forward and backward, of megatron-core's
per-expert output bias (TEGroupedMLP._apply_bias, fc2 built with skip_bias_add: for each local expert bias x its
rows' fp32 routing probabilities and the add, then one cat and the cast back to bf16; backward the bias and
probability gradients). Its traffic is about 28 bytes per element; its small per-expert kernels reach about half the
HBM rate. Measured on an H200: 0.609 / 1.125 ms for 16 experts x 1,024 rows x 2,880
(benchmarks/results/moe_layer_h200.md, GPT-OSS)."""
CLAMP_BYTES = (16.7, 34.1)
"""The same for a clamped GLU (ModelSpec.activation_clamp), per element of fc1's output (routed rows x 2 f), beyond
the fused activation: megatron-core's weighted_bias_quick_geglu_impl clamps the two halves and concatenates them
eagerly before its fused kernel; backward the clamps' masks and the halves' gradients joined again. Measured on an
H200: GPT-OSS's activation 0.428 / 1.008 ms, 0.068 / 0.271 ms with its clamp off (benchmarks/results/moe_layer_h200.md)."""

MOE_ROUTER_HOST_SHARE = 0.3
"""Share of a dropless MoE layer's eager host ops in its router (GEMM, score function, top-k, auxiliary losses:
~15 of ~50 forward ops, counted as for Calibration.moe_host_ops): what a moe_router CUDA graph replays."""
MOE_PREPROCESS_HOST_SHARE = 0.2
"""Same for the dispatcher's preprocess (routing map to per-expert counts and permutation indices: ~10 of ~50):
what a moe_preprocess graph replays. The permutation, all-to-alls, experts and unpermute stay eager."""

PARAM_BYTES_PER_MICROBATCH = {"megatron-local-fused": 10.0, "torch-bf16": 6.0, "torch-autocast": 16.0,
                              "torch-compiled": 6.0}
"""HBM traffic per parameter and micro-batch outside the GEMMs, for plans outside megatron (megatron's own:
param_bytes_per_microbatch): Megatron-DeepSpeed's layers (megatron-local-fused under DeepSpeed) add each bf16
weight gradient into an fp32 buffer (read 2 + 4, write 4); DeepSpeed's bf16 .grad accumulates (read 2 + 2,
write 2); autocast over fp32 weights (OLMo's FSDP/DDP) casts every weight to bf16 each forward (read 4, write 2)
and adds bf16 weight gradients into fp32 .grad (read 2 + 4, write 4)."""


AUTOCAST_CAST_BYTES = 6.0
"""Of torch-autocast's PARAM_BYTES_PER_MICROBATCH: casting each fp32 weight to bf16 (read 4, write 2)."""


def param_bytes_per_microbatch(plan: ParallelPlan) -> float:
    """HBM bytes per parameter and micro-batch outside the GEMMs: for megatron, nothing where its weight-gradient
    GEMMs accumulate into main_grad themselves (ParallelPlan.wgrad_fused_into_main_grad), else its hook reads the
    16-bit (fp32) gradient and reads and writes main_grad (bf16 under --grad-reduce-in-bf16); for the other
    frameworks PARAM_BYTES_PER_MICROBATCH."""
    if plan.framework == "megatron":
        grad = 4.0 if plan.precision == "fp32" else 2.0
        return 0.0 if plan.wgrad_fused_into_main_grad else grad + 2.0 * plan.grad_bytes
    return PARAM_BYTES_PER_MICROBATCH[implementation(plan)]

def implementation(plan: ParallelPlan) -> str:
    if not plan.torch_layers:
        if plan.fused_kernels:
            return "megatron-local-fused"  # megatron's layers, also under DeepSpeed (Megatron-DeepSpeed)
        return "megatron-te" if plan.layer_spec == "te" else "megatron-local"
    # genconf's own PyTorch model: SDPA attention, eager or compiled element-wise work.
    if plan.torch_compile:
        return "torch-compiled"
    if plan.autocast_fp32_weights:
        # DDP (NO_SHARD) keeps fp32 weights and computes under autocast: every forward casts them, and the
        # norms and the residual stream stay fp32 (genconf.train.runners.fsdp, OLMo's ddp strategy). Sharded FSDP
        # gathers bf16 weights (MixedPrecision(param_dtype=bf16), as OLMo's and Composer's FSDP do): the model
        # runs in bf16 like DeepSpeed's.
        return "torch-autocast"
    return "torch-bf16"


def _nvlink_gbyte_per_s(cluster: ClusterSpec, cal: Calibration) -> float:
    """One GPU's NVLink bandwidth in one direction at its achieved efficiency, GB/s."""
    return cluster.nvlink_gbyte_per_s_one_way * cal.nvlink_efficiency


def _ib_gbyte_per_s(cluster: ClusterSpec, cal: Calibration) -> float:
    """One GPU's NIC bandwidth in one direction at its achieved efficiency, GB/s."""
    return cluster.ib_gbyte_per_s_per_gpu * cal.ib_efficiency


def _ranks_per_node(cluster: ClusterSpec, ranks: int, stride: int) -> int:
    """Ranks of a group `stride` GPUs apart that share one node."""
    return max(1, min(ranks, cluster.gpus_per_node // max(1, stride)))


def _bandwidth(cluster: ClusterSpec, cal: Calibration, group_span: int, ranks: int | None = None) -> float:
    """Bus bandwidth in GB/s of a collective over `ranks` ranks spread evenly over `group_span` consecutive GPUs
    (every group of the same kind runs its collective at the same time, as DP groups do).

    Inside an NVLink domain: NVLink. Across domains, NCCL's rings enter and leave each domain once per ring and
    spread the rings over the NICs: a group with k ranks in each domain drives k NICs (its share of the domain's
    NICs, one per GPU), so its bus bandwidth is k x the NIC rate, capped by NVLink (8 ranks of a DGX node:
    8 x 50 GB/s; one rank per node, as DP under tp=8: one NIC)."""
    nvlink = _nvlink_gbyte_per_s(cluster, cal)
    if group_span <= cluster.nvlink_domain:
        return nvlink
    ranks = ranks or group_span
    stride = max(1, group_span // ranks)
    if cluster.pcie_inside_node:
        return _bandwidth_bridged(cluster, cal, group_span, ranks, stride)
    per_domain = max(1, min(ranks, cluster.nvlink_domain // stride))
    return min(nvlink, per_domain * _ib_gbyte_per_s(cluster, cal))


def _pcie_gbyte_per_s(cluster: ClusterSpec, cal: Calibration) -> float:
    """What a GPU moves over PCIe to a GPU of its node outside its NVLink domain, one direction, GB/s. No PCIe
    measurement is fitted: it takes the NICs' efficiency (a 400G NIC reaches ~42 of 50 GB/s as a DMA engine on the same
    PCIe Gen5 link, calibration.yaml), as the calibration fits one term for the non-NVLink links (run/calibrate.py)."""
    return cluster.pcie_peer_gbyte_per_s_per_gpu * cal.ib_efficiency


def _bandwidth_bridged(cluster: ClusterSpec, cal: Calibration, group_span: int, ranks: int, stride: int) -> float:
    """_bandwidth where NVLink stops inside the node (H100 PCIe cards bridged in pairs): the ring's hops inside a node
    run over NVLink while the group's ranks there sit in one NVLink domain, else over PCIe; across nodes, as above,
    the group's ranks in a node drive as many NICs, each behind its GPU's PCIe link (GPUDirect RDMA), so the slower
    of the two per GPU."""
    nvlink = _nvlink_gbyte_per_s(cluster, cal)
    pcie = _pcie_gbyte_per_s(cluster, cal)
    per_node = _ranks_per_node(cluster, ranks, stride)
    inside = nvlink if (per_node - 1) * stride < cluster.nvlink_domain else pcie
    if group_span <= cluster.gpus_per_node:
        return inside
    return min(inside, per_node * min(pcie, _ib_gbyte_per_s(cluster, cal)))


def _p2p_gbyte_per_s(cluster: ClusterSpec, cal: Calibration, span: int) -> float:
    """One GPU's link to its neighbour (a pipeline stage's, a context-parallel ring's) in a group of `span` consecutive
    GPUs, GB/s: NVLink inside the NVLink domain, else the NIC; where NVLink stops inside the node (bridged pairs), PCIe
    inside the node and, across nodes, the slower of PCIe and the NIC (GPUDirect RDMA crosses the GPU's PCIe link)."""
    if span <= cluster.nvlink_domain:
        return _nvlink_gbyte_per_s(cluster, cal)
    ib = _ib_gbyte_per_s(cluster, cal)
    if not cluster.pcie_inside_node:
        return ib
    pcie = _pcie_gbyte_per_s(cluster, cal)
    return pcie if span <= cluster.gpus_per_node else min(pcie, ib)


def _all_to_all_s(cluster: ClusterSpec, cal: Calibration, num_bytes: float, ranks: int, stride: int, *,
                  nccl: bool = True) -> float:
    """All-to-all over `ranks` ranks `stride` GPUs apart: the share of each rank's bytes bound for peers in its
    own NVLink domain moves over NVLink, the rest over the NICs, both at once (NCCL/DeepEP split by path). `nccl`:
    NCCL's all-to-all (Calibration.nccl_all_to_all_efficiency), else DeepEP's / HybridEP's kernels."""
    if ranks <= 1:
        return 0.0
    per_domain = max(1, min(ranks, cluster.nvlink_domain // max(1, stride)))
    local = (per_domain - 1) / ranks * num_bytes
    remote = (ranks - per_domain) / ranks * num_bytes
    rate = cal.nccl_all_to_all_efficiency if nccl else 1.0
    nvlink = _nvlink_gbyte_per_s(cluster, cal) * rate * 1e9
    ib = _ib_gbyte_per_s(cluster, cal) * rate * 1e9
    latency_s = cal.collective_latency_s * (1.0 + math.log2(ranks))
    if cluster.pcie_inside_node:
        # Bridged pairs: peers of the node outside the pair over PCIe, other nodes over the NICs; every byte that
        # leaves the pair crosses the GPU's PCIe link, the NIC's bytes too (GPUDirect RDMA).
        per_node = _ranks_per_node(cluster, ranks, stride)
        remote = (ranks - per_node) / ranks * num_bytes
        off_pair = (ranks - per_domain) / ranks * num_bytes
        pcie = _pcie_gbyte_per_s(cluster, cal) * rate * 1e9
        return max(local / nvlink, off_pair / pcie, remote / ib) + latency_s
    return max(local / nvlink, remote / ib) + latency_s


def groups_reached(top_k: int, experts: int, groups: int, routing: str = "random") -> float:
    """Mean number of `groups` (EP ranks, or NVLink domains of them) holding at least one of a token's top_k distinct
    experts, expert e in group e // (experts / groups) (megatron-core's and AutoModel's expert placement). random
    (ParallelPlan.moe_routing): k draws without replacement; contiguous: experts i k .. i k + k - 1 mod E for token i,
    averaged over a period of tokens."""
    if groups <= 1:
        return 1.0
    if routing == "contiguous":
        per = max(1, experts // groups)
        return sum(len({(i * top_k + j) % experts // per for j in range(top_k)}) for i in range(experts)) / experts
    miss = 1.0  # P(a given group holds none of the token's experts): k draws from E, E / groups in the group
    for i in range(top_k):
        miss *= max(0.0, (experts - experts / groups - i) / (experts - i))
    return groups * (1.0 - miss)


def _flex_all_to_all_s(cluster: ClusterSpec, cal: Calibration, token_bytes: float, top_k: int, experts: int,
                       ranks: int, stride: int, routing: str = "random") -> float:
    """Dispatch or combine through megatron's flex dispatcher with DeepEP over `ranks` EP ranks `stride`
    GPUs apart: a token crosses the NICs once per other NVLink domain holding one of its top_k experts, then fans out
    over NVLink there (DeepEP's internode kernels: one RDMA copy per destination node, tagged with the bitmask of its
    NVLink ranks, csrc/kernels/internode.cu SourceMeta; combine reduces inside the domain before crossing back).
    Experts spread evenly over the domains; a token's top_k are distinct experts. Inside one domain it is the plain
    all-to-all.

    That is the pricing for routing "random", the one the calibration is fitted with. Under another routing
    (ParallelPlan.moe_routing) the same kernels reach fewer destinations: the NVLink bytes scale by the EP ranks a
    token reaches and the NIC bytes by the domains, each over random routing's (groups_reached; DeepEP sends a
    token once per destination rank, get_dispatch_layout's is_token_in_rank). A ratio, so that whatever the fitted
    random pricing holds of the kernels' own efficiency carries over."""
    if ranks <= 1:
        return 0.0
    per_domain = max(1, min(ranks, cluster.nvlink_domain // max(1, stride)))
    domains = -(-ranks // per_domain)
    if routing == "random":
        nvlink_share = nic_share = 1.0
    else:
        nvlink_share = groups_reached(top_k, experts, ranks, routing) / groups_reached(top_k, experts, ranks)
        nic_share = groups_reached(top_k, experts, domains, routing) / groups_reached(top_k, experts, domains)
    if domains == 1:
        return _all_to_all_s(cluster, cal, token_bytes * top_k * nvlink_share, ranks, stride, nccl=False)
    # Other domains reached, on average (a token's own domain is one of those reached with chance 1 / domains).
    remote_copies = groups_reached(top_k, experts, domains) * (domains - 1) / domains * nic_share
    nvlink = _nvlink_gbyte_per_s(cluster, cal) * 1e9
    ib = _ib_gbyte_per_s(cluster, cal) * 1e9
    # Every copy still reaches its expert's GPU over NVLink: directly, or forwarded inside the destination domain.
    nvlink_bytes = token_bytes * top_k * (ranks - 1) / ranks * nvlink_share
    return max(nvlink_bytes / nvlink, token_bytes * remote_copies / ib) \
        + cal.collective_latency_s * (1.0 + math.log2(ranks))


def _tp_collective_s(cluster: ClusterSpec, cal: Calibration, t: int, sp: bool, volume: float) -> float:
    """One TP collective of a layer's `volume` bytes: an all-gather (or reduce-scatter) under sequence parallelism,
    else half an all-reduce (Korthikanti 2022, Sec. 4.2.2: the same bytes on the wire)."""
    bw = _bandwidth(cluster, cal, t)
    if sp:
        return kernels.ring_gather_s(volume, t, bus_gbyte_per_s=bw, latency_s=cal.collective_latency_s)
    return 0.5 * kernels.ring_all_reduce_s(volume, t, bus_gbyte_per_s=bw, latency_s=cal.collective_latency_s)


AMAX_BYTES = 4.0
"""One FP32 amax: what per-tensor current scaling and NVFP4 all-reduce over the TP group before quantizing a shard."""


def gathered_bytes_per_element(dtype: str, recipe: str | None, impl: str, act_bytes: float, *,
                               both_usages: bool = False) -> float:
    """Bytes per element of one sequence-parallel all-gather. Transformer Engine quantizes a column-parallel
    layer's input on its shard and gathers the quantized data with its scales (layernorm_linear.py: gather_along_
    first_dim(ln_out, ..., quantizer=quantizer)): FP8 one byte (blockwise: an FP32 scale per 128), MXFP8 one plus an
    E8M0 scale per 32, NVFP4 half a byte plus an E4M3 scale per 16. `both_usages`: a row-parallel layer's output
    gradient, which block-scaled recipes gather row- and column-wise (distributed.py _all_gather_mxfp8: one gather
    per usage; per-tensor FP8 gathers rows and transposes locally). Other stacks, and unquantized plans, gather
    `act_bytes`; reduce-scatters are never quantized."""
    if impl != "megatron-te":
        return act_bytes
    per_element = {"fp8": 1.0 + (4 / 128 if recipe == "blockwise" else 0.0), "mxfp8": 1.0 + 1 / 32,
                   "fp4": 0.5 + 1 / 16}.get(dtype)
    if per_element is None:
        return act_bytes
    if both_usages and (dtype != "fp8" or recipe == "blockwise"):
        per_element *= 2
    return per_element


def amax_reductions(recipe: str | None, impl: str, sp: bool) -> int:
    """All-reduces of one amax over the TP group that a quantized sequence-parallel gather waits for (the input
    of a column-parallel layer, the output gradient of a row-parallel one; not the backward's re-gather of the
    already quantized input): per-tensor current scaling and NVFP4's tensor scale need the whole tensor's amax
    (transformer_engine module/linear.py set_quantizer_amax_reduction_group; csrc quantizer.cpp allreduce).
    Delayed scaling reduces every layer's amaxes together when the autocast region exits
    (quantization.py reduce_and_update_fp8_tensors); block scales are local."""
    return int(sp and impl == "megatron-te" and recipe in ("current", "nvfp4"))


def _tp_gathers_s(cluster: ClusterSpec, cal: Calibration, t: int, sp: bool, elements: float, act_bytes: float,
                  dtype: str, recipe: str | None, impl: str, quantized: bool) -> tuple[float, float, float]:
    """(input gather, output-gradient gather, amax all-reduce before each) of one layer half's `elements`: the
    column-parallel layer's input and the row-parallel layer's output gradient. Without SP each is half an
    all-reduce (Korthikanti 2022, Sec. 4.2.2). `quantized`: TE's own gather (not megatron's BF16 one)."""
    if not sp:
        one_s = _tp_collective_s(cluster, cal, t, sp, act_bytes * elements)
        return one_s, one_s, 0.0
    impl = impl if quantized else ""
    in_s = _tp_collective_s(cluster, cal, t, sp, gathered_bytes_per_element(dtype, recipe, impl, act_bytes) * elements)
    grad_s = _tp_collective_s(cluster, cal, t, sp, elements * gathered_bytes_per_element(
        dtype, recipe, impl, act_bytes, both_usages=True))
    amax_s = amax_reductions(recipe, impl, sp) * kernels.ring_all_reduce_s(
        AMAX_BYTES, t, bus_gbyte_per_s=_bandwidth(cluster, cal, t), latency_s=cal.collective_latency_s)
    return in_s, grad_s, amax_s


def gemm_dtype(precision: str, recipe: str | None) -> str:
    """The dtype a plan's linear layers run their GEMMs in (MXFP8's block-scaled GEMMs are calibrated apart)."""
    dtype = {"fp8": "fp8", "fp4": "fp4", "fp32": "fp32"}.get(precision, "bf16")
    return "mxfp8" if dtype == "fp8" and recipe == "mxfp8" else dtype


def layer_time(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec, cal: Calibration, *,
               windowed: bool = False, kind: str = "", bf16: bool = False) -> LayerTime:
    """One decoder layer, one micro-batch, one rank. `windowed`: the layer uses sliding-window attention; `kind`:
    one of a hybrid model's layers; `bf16`: one of the plan's BF16 end layers (its GEMMs unquantized)."""
    precision, recipe = ("bf16", None) if bf16 and plan.quant_recipe else (plan.precision, plan.quant_recipe)
    return _layer_time(model, plan.tp, plan.cp, plan.ep, plan.mbs, plan.seq_length, plan.sequence_parallel,
                       precision, recipe, implementation(plan), plan.tp_comm_overlap, cluster, cal,
                       windowed, plan.expert_tp, ep_unpaired_share(plan), graphed_scopes(plan), plan.attention_kernel,
                       plan.lora_rank, plan.lora_targets, plan.moe_dispatcher, kind, plan.packed_doc_tokens,
                       checkpoint_early_stop(model, plan), plan.moe_routing)


def attention_factor(kernel: str, cal: Calibration) -> float:
    """The flash-attention kernel's efficiency relative to cuDNN's fused attention (ParallelPlan.attention_kernel;
    auto is what the stacks genconf prices pick by default: cuDNN's, or on Ampere FlashAttention-2's equal)."""
    if kernel == "flash2":
        return cal.flash2_attention_factor
    if kernel == "triton":
        return cal.flash2_attention_factor * cal.triton_attention_factor
    return 1.0


def graphed_scopes(plan: ParallelPlan) -> tuple[str, ...]:
    """What CUDA graphs capture of each layer: () for none, ("layer",) for whole layers (an implementation with an
    empty scope), else the plan's scopes (full_iteration: everything)."""
    if plan.cuda_graph_impl == "none":
        return ()
    return tuple(sorted(plan.cuda_graph_scope)) or ("layer",)


def ep_unpaired_share(plan: ParallelPlan) -> float | None:
    """With megatron's EP overlap, the share of chunks whose all-to-alls have no partner: the combined 1F1B schedule
    pairs each micro-batch's forward with another's backward, layer by layer (megatron-core
    pipeline_parallel/combined_1f1b.py); the warm-up forwards and the flush's backwards run alone (1 of m with
    pp = 1; megatron's interleaved warm-up, (pp - 1) x 2 + (vp - 1) x pp + 1 of the m x vp chunks, with a
    pipeline: rank 0's count, the most of any rank, so an upper bound for the others). None without the overlap."""
    if not plan.moe_ep_overlap:
        return None
    chunks = plan.num_microbatches * plan.vp
    unpaired = 1 if plan.pp == 1 else (plan.pp - 1) * 2 + (plan.vp - 1) * plan.pp + 1
    return min(1.0, unpaired / chunks)


@functools.lru_cache(maxsize=8192)
def _layer_time(model: ModelSpec, t: int, cp: int, ep: int, mbs: int, seq: int, sp: bool, precision: str,
                recipe: str | None, impl: str, tp_overlap: bool, cluster: ClusterSpec, cal: Calibration,
                windowed: bool, etp: int | None = None, ep_unpaired: float | None = None,
                graphs: tuple[str, ...] = (), attention: str = "auto", lora: int = 0,
                lora_targets: tuple[str, ...] = LORA_TARGETS, dispatcher: str = "alltoall", kind: str = "",
                doc_tokens: int | None = None, early_stop: bool = False, routing: str = "random") -> LayerTime:
    """One layer, one micro-batch, one rank. kind: one of a hybrid model's layers (specs.HYBRID_LAYER_KINDS): '*'
    the attention half of a transformer layer, '-' / 'E' its MLP half (dense / MoE), 'M' a Mamba-2 layer.
    doc_tokens: the mean length of the documents packed into each sequence (ParallelPlan.packed_doc_tokens).
    early_stop: full recompute stops before the MLP's output projection (counting.checkpoint_early_stop).
    routing: where a token's experts sit (ParallelPlan.moe_routing), for the flex dispatcher's traffic."""
    if kind == "M":
        return _mamba_time(model, t, cp, mbs, seq, sp, precision, recipe, impl, tp_overlap, cluster, cal, graphs)
    if kind == "-" and model.is_moe:
        model = dense_layer_model(model)
    wa = float(kind in ("", "*"))   # the layer has attention
    wm = float(kind in ("", "-", "E"))  # the layer has an MLP
    gpu = cluster.gpu
    n = mbs * seq // cp                      # tokens per micro-batch on this rank (GEMM rows after SP gather)
    h, q, kv, d = model.hidden_size, model.query_width, model.kv_width, model.attention_head_dim
    branches = 2 if model.gated else 1
    dtype = gemm_dtype(precision, recipe)
    act = 4 if precision == "fp32" else 2     # activation bytes

    # GEMMs: QKV, output projection, MLP (dense or the routed experts as a grouped GEMM). Under LoRA the base
    # weights are frozen (no weight-gradient GEMMs) and each of the four gets an adapter (dense models only).
    frozen = lora > 0
    r = t if sp else 1
    if model.mla:
        # Multi-head latent attention (megatron-core MLASelfAttention): the down projections run replicated on the
        # rank's sequence shard, the up projections column-parallel on the gathered latents, the output projection
        # row-parallel from the a x v_head_dim context. Counted as "qkv" (everything before attention) and "proj".
        a, ql, kl, dr = model.num_attention_heads, model.q_lora_rank, model.kv_lora_rank, model.qk_pos_emb_head_dim
        # (rows, columns, inner, an up projection: what mla_up_proj recompute repeats)
        shapes = [(n // r, kl + dr, h, False), (n, a * (model.qk_head_dim + model.v_head_dim) // t, kl, True)]
        shapes += [(n // r, ql, h, False), (n, q // t, ql, True)] if ql else [(n, q // t, h, False)]
        times = [(linear_s(gpu, cal, rows_, cols, inner, dtype), up) for rows_, cols, inner, up in shapes]
        qkv_f = sum(fb[0] for fb, _ in times)
        qkv_b = sum(fb[1] for fb, _ in times)
        up_f = sum(fb[0] for fb, up in times if up)
        v_width = model.value_width
        proj_f, proj_b = linear_s(gpu, cal, n, h, v_width // t, dtype)
        quant_in = sum(rows_ * inner for rows_, _, inner, _ in shapes) + n * v_width // t
        quant_grad = sum(rows_ * cols for rows_, cols, _, _ in shapes) + n * h
    else:
        up_f = 0.0
        qkv_f, qkv_b = linear_s(gpu, cal, n, (q + 2 * kv) // t, h, dtype, frozen=frozen)
        proj_f, proj_b = linear_s(gpu, cal, n, h, q // t, dtype, frozen=frozen)
        quant_in = n * (h + q // t)               # GEMM-input activation elements (forward), per rank
        quant_grad = n * ((q + 2 * kv) // t + h)  # output-gradient elements (backward)
    attn_quant_in, attn_quant_grad = quant_in, quant_grad
    if model.is_moe:
        f, k_top, experts = model.moe_ffn_hidden_size, model.moe_top_k, model.num_experts
        w = model.expert_width  # what the experts read and the dispatcher moves (the latent width under latent MoE)
        et = etp or t
        local_experts = max(1, experts // ep)
        # Tokens per local expert under balanced routing: the EP group's tokens (gathered over TP when the
        # experts are TP-split, else each rank's sequence-parallel share) spread over the experts.
        rows = max(1, round(n * k_top * ep / experts * et / t))
        fc1_f, fc1_b = linear_s(gpu, cal, rows, branches * f // et, w, dtype, groups=local_experts)
        fc2_f, fc2_b = linear_s(gpu, cal, rows, w, f // et, dtype, groups=local_experts)
        router_f, router_b = linear_s(gpu, cal, n, experts, h, "bf16")
        fc1_f, fc1_b = fc1_f + router_f, fc1_b + router_b
        routed = n * k_top
        quant_in += routed * (w * et / t + f // t)
        quant_grad += routed * (branches * f // t + w * et / t)
        if model.moe_latent_size:
            # Latent MoE (megatron-core moe_layer.py): h -> latent before dispatch and latent -> h after combine,
            # whole weights on the rank's sequence share (TELinear "duplicated").
            down_f, down_b = linear_s(gpu, cal, n // r, w, h, dtype)
            up_f, up_b = linear_s(gpu, cal, n // r, h, w, dtype)
            fc1_f, fc1_b, fc2_f, fc2_b = fc1_f + down_f, fc1_b + down_b, fc2_f + up_f, fc2_b + up_b
            quant_in += n // r * (h + w)
            quant_grad += n // r * (w + h)
        fs = model.moe_shared_expert_intermediate_size
        if fs:
            # Shared experts (megatron-core SharedExpertMLP): a TP-split dense MLP on every token.
            s1_f, s1_b = linear_s(gpu, cal, n, branches * fs // t, h, dtype)
            s2_f, s2_b = linear_s(gpu, cal, n, h, fs // t, dtype)
            fc1_f, fc1_b, fc2_f, fc2_b = fc1_f + s1_f, fc1_b + s1_b, fc2_f + s2_f, fc2_b + s2_b
            quant_in += n * (h + fs // t)
            quant_grad += n * (branches * fs // t + h)
    else:
        f, k_top, routed = model.ffn_hidden_size, 1, n
        fc1_f, fc1_b = linear_s(gpu, cal, n, branches * f // t, h, dtype, frozen=frozen)
        fc2_f, fc2_b = linear_s(gpu, cal, n, h, f // t, dtype, frozen=frozen)
        quant_in += n * (h + f // t)
        quant_grad += n * (branches * f // t + h)
    quant_in = wa * attn_quant_in + wm * (quant_in - attn_quant_in)
    quant_grad = wa * attn_quant_grad + wm * (quant_grad - attn_quant_grad)
    gemm_f = wa * (qkv_f + proj_f) + wm * (fc1_f + fc2_f)
    gemm_b = wa * (qkv_b + proj_b) + wm * (fc1_b + fc2_b)
    if frozen:
        # Column-parallel targets (QKV, fc1) read the full input and write their TP share; row-parallel ones
        # (proj, fc2) read their TP share and write the full width.
        for name, (fan_in, fan_out) in lora_target_shapes(model, lora_targets).items():
            if name in LORA_COLUMN_PARALLEL:
                fan_out //= t
            else:
                fan_in //= t
            ad_f, ad_b = _lora_s(gpu, cal, n, lora, fan_in, fan_out, act)
            gemm_f += ad_f
            gemm_b += ad_b

    # FP8 / FP4 quantization passes (casts, transposes, amax), memory-bound.
    q_in, q_grad = kernels.QUANT_BYTES_PER_ELEMENT[recipe]
    quant_f = _mem_s(gpu, cal, q_in * quant_in)
    quant_b = _mem_s(gpu, cal, q_grad * quant_grad)

    # Core attention.
    heads = model.num_attention_heads // t
    keys = seq
    causal = True
    sdpa = impl.startswith("torch")  # genconf's own model, eager or compiled: PyTorch SDPA
    banded = windowed and model.window_binds(seq)
    if banded and sdpa:
        # genconf's own windowed attention (torch_model.windowed_attention): each chunk of queries against its
        # rows and the window before them under a mask, every block computed. With a mask SDPA runs its
        # memory-efficient kernel, priced here at the flash rate: its own rate is not measured on a GPU.
        # (Transformer Engine's fused kernels run the causal band, below; unfused attention, megatron's local spec
        # and TE's own, computes every score and masks the band: keys = seq.)
        keys, causal = window_keys_per_query(model.sliding_window, seq), False
    peak16 = gpu.peak_bf16_tflops * sustained_clock(gpu, cal, gemm=False)  # attention: the power cap only
    te_unfused = impl == "megatron-te" and not kernels.te_fused_attention(d, precision)
    # (Windowed layers fold the query heads into rows and pass a mask: memory-efficient attention or math.)
    fused = (kernels.sdpa_backend_takes("efficient", d) if banded
             else kernels.sdpa_fused_supported(d, gqa=model.grouped_query))
    sdpa_math = sdpa and (attention == "math" or not fused)
    if impl in ("megatron-local", "megatron-local-fused") or te_unfused or sdpa_math:
        # (TE's own unfused attention runs its fused scale-mask-softmax kernel: megatron's fused scores' traffic;
        # PyTorch's math backend an unfused mask and softmax, as megatron's local spec.)
        fused_scores = impl == "megatron-local-fused" or te_unfused
        score_bytes = cal.local_fused_score_bytes if fused_scores else cal.local_score_bytes
        # Unfused: batched QK^T and AV GEMMs over (mbs x heads) with K = head dim, scores through HBM. PyTorch's math
        # backend upcasts bf16 q, k, v to fp32 (allow_fp16_bf16_reduction_math_sdp is off by default) and runs its
        # GEMMs without TF32: 1.00 ms forward for 4 heads x 2,048 x 450 on an H200, 30 TFLOP/s
        # (results/misaligned_gemm_h200.md).
        batch = mbs * heads
        gemm_dtype_ = FP32_CUDA_CORES if sdpa_math else "bf16"
        qk_f, qk_b = linear_s(gpu, cal, batch * (seq // cp), keys, d, gemm_dtype_)
        av_f, av_b = linear_s(gpu, cal, batch * (seq // cp), d, keys, gemm_dtype_)
        # (The misaligned slowdown is the tensor cores' 16-byte loads: the math backend's CUDA-core GEMMs do not pay
        # it. Priced so, that row comes out 1.04 / 2.03 ms forward / backward against 1.00 / 1.59 measured.)
        tensor_cores = not sdpa_math
        slow_f, slow_b = ((1.0, 1.0) if kernels.aligned(d) or not tensor_cores
                          else cal.misaligned_attention_gemm_slowdown)
        scores = batch * (seq // cp) * keys
        attn_f = slow_f * (qk_f + av_f) + _mem_s(gpu, cal, score_bytes[0] * scores)
        attn_b = slow_b * (qk_b + av_b) + _mem_s(gpu, cal, score_bytes[1] * scores)
    else:
        bh = mbs * heads
        backend = attention_factor(attention, cal)

        def flash(seq_q: float, seq_k: float, is_causal: bool, batch: float = bh,
                  band: int | None = None) -> tuple[float, float]:
            f = kernels.flash_attention_s(batch, seq_q, seq_k, d, causal=is_causal, peak_tflops=peak16,
                                          efficiency=cal.attention_fwd_efficiency * backend,
                                          tile_overhead_s=cal.attention_fwd_tile_s, sms=gpu.num_sms, window=band)
            b = kernels.flash_attention_s(batch, seq_q, seq_k, d, causal=is_causal, peak_tflops=peak16,
                                          efficiency=cal.attention_bwd_efficiency * backend,
                                          tile_overhead_s=cal.attention_bwd_tile_s, sms=gpu.num_sms, backward=True,
                                          window=band)
            return f, b

        packed = doc_tokens is not None and doc_tokens < seq
        window = model.sliding_window if windowed and model.sliding_window else None
        if packed and not (window and window + 1 < doc_tokens):
            # Packed documents (THD, cu_seqlens), each attending causally within itself. A varlen kernel starts every
            # document on a fresh 128-row tile (FlashAttention-2's varlen tiling, Dao 2023), so a document costs
            # its length rounded up to whole tiles; the mean length stands for all (a spread of lengths costs more:
            # the sum of squares is at least documents x mean^2). Under context parallelism every document is cut
            # into 2 cp pieces, two per rank (Transformer Engine's thd_get_partitioned_indices, as megatron-core's
            # packed-sequence batches call it, datasets/data_schedule.py): the rank's queries of a document are two
            # pieces against that document's keys, causal on average, and the ring's merges of the partial outputs
            # cover the rank's tokens as unpacked.
            docs = bh * seq / doc_tokens
            tile = kernels.ATTENTION_TILE
            if cp == 1:
                doc_q = math.ceil(doc_tokens / tile) * tile
                attn_f, attn_b = flash(doc_q, doc_q, True, batch=docs)
            else:
                piece = math.ceil(doc_tokens / (2 * cp) / tile) * tile
                attn_f, attn_b = flash(piece, doc_tokens, True, batch=2 * docs)
                merge = _mem_s(gpu, cal, 10.0 * bh * seq / cp * d)  # as the unpacked ring's, below
                attn_f, attn_b = attn_f + (cp - 1) * merge, attn_b + 2 * (cp - 1) * merge
        elif cp > 1 and causal:
            # Ring attention with the load-balanced (zigzag) split (TE's context parallelism): step 0 is the
            # causal attention of the local chunk, each of the cp - 1 others a full block against half the
            # remote keys; every step is its own kernel (its own waves), and its partial output is merged
            # into an fp32 accumulator with the log-sum-exp (read the bf16 step output 2 and the accumulator 4,
            # write 4 per element), dQ likewise.
            local = seq / cp
            diag_f, diag_b = flash(local, local, True)
            off_f, off_b = flash(local, local / 2, False)
            merge = _mem_s(gpu, cal, 10.0 * bh * local * d)
            attn_f = diag_f + (cp - 1) * (off_f + merge)
            attn_b = diag_b + (cp - 1) * (off_b + 2 * merge)
        elif banded and not sdpa:
            # Transformer Engine's sliding window (flash / cuDNN): the causal band, masked tiles skipped (packed
            # documents longer than the window too: one band over the sequence, each document's first tiles aside).
            attn_f, attn_b = flash(seq / cp, seq / cp, True, band=model.sliding_window)
        else:
            attn_f, attn_b = flash(seq / cp, keys, causal)
        if sdpa and not kernels.aligned(d):
            # PyTorch's flash backend pads a head dim that is not a multiple of 8 and runs it at about the
            # misaligned GEMMs' slowdown: per FLOP x2.93 / x3.18 forward, x1.61 / x2.23 backward at head dims 150 and
            # 108 on an H200 against 144 and 112 (results/misaligned_gemm_h200.md), beside the GEMMs' (2.9, 2.0).
            slow_f, slow_b = cal.misaligned_attention_gemm_slowdown
            attn_f, attn_b = slow_f * attn_f, slow_b * attn_b
        elif sdpa and d > kernels.SDPA_FLASH_MAX_HEAD_DIM:
            slow_f, slow_b = cal.sdpa_efficient_slowdown  # memory-efficient attention, its backward slow there
            attn_f, attn_b = slow_f * attn_f, slow_b * attn_b
    attn_f, attn_b = wa * attn_f, wa * attn_b

    # Element-wise work: norms, residual adds, RoPE (rotary models only), activation, dropout (TE fused: one read +
    # one write each).
    rope = 2 * (q + kv) / t if model.position_embedding == "rope" else 0.0
    qk_norm = 2 * (q + kv) / t if model.qk_layernorm else 0.0  # the q and k norms: one read and one write each
    per_token = act * (wa * (5 * h / r + rope + qk_norm) + wm * (5 * h / r + (3 if model.gated else 2) * k_top * f / t))
    if model.is_moe:
        per_token += wm * act * 4 * k_top * model.expert_width / r  # token permute/unpermute around the experts
    # Eager stacks run dense layers only (a mixture of experts is megatron's: rules.architecture_conflict); an
    # unvalidated MoE plan keeps the flat passes.
    if impl in ("torch-bf16", "torch-autocast") and not model.is_moe:
        elem_f, elem_b = _eager_elementwise_s(model, t, r, n * act / 2, wa, wm, impl, gpu, cal)
    else:
        passes = {"megatron-local": cal.local_elementwise_passes,
                  "megatron-local-fused": cal.local_fused_elementwise_passes}.get(impl) or ELEMENTWISE_PASSES[impl]
        elem_f = _mem_s(gpu, cal, passes * n * per_token)
        elem_b = 2 * elem_f
    clamp_f = 0.0
    if model.is_moe and wm:
        # What megatron-core's experts run eagerly beside the fused element-wise work (moe_layer_h200.md): the
        # per-expert output bias and a clamped GLU's clamps, over this rank's routed rows.
        routed_rows = rows * local_experts
        if model.add_bias_linear:
            elem_f += _mem_s(gpu, cal, EXPERT_BIAS_BYTES[0] * routed_rows * w)
            elem_b += _mem_s(gpu, cal, EXPERT_BIAS_BYTES[1] * routed_rows * w)
        if model.activation_clamp:
            fc1_out = routed_rows * branches * f // et
            clamp_f = _mem_s(gpu, cal, CLAMP_BYTES[0] * fc1_out)
            elem_f += clamp_f
            elem_b += _mem_s(gpu, cal, CLAMP_BYTES[1] * fc1_out)

    fwd = gemm_f + attn_f + elem_f + quant_f
    bwd = gemm_b + attn_b + elem_b + quant_b
    # What selective recompute of each module repeats: the MLA up projections, the (experts' and shared experts')
    # activation function and the two norms (memory-bound: read and write), a dense MLP whole.
    act_elems = n * (k_top * f + (model.moe_shared_expert_intermediate_size or 0) if model.is_moe else f) / t
    modules = (("mla_up_proj", wa * up_f),
               ("moe_act", wm * (_mem_s(gpu, cal, act * 3 * act_elems) + clamp_f) if model.is_moe else 0.0),
               ("layernorm", (wa + wm) / 2 * _mem_s(gpu, cal, act * 4 * n * h / r)),
               ("mlp", 0.0 if model.is_moe else wm * (fc1_f + fc2_f + _mem_s(gpu, cal, act * 3 * act_elems))))

    # Tensor parallelism: with SP, all-gather before QKV and fc1 and reduce-scatter after proj and fc2
    # (Korthikanti 2022, Sec. 4.2.2); without, two all-reduces. Same volume again in the backward.
    tp_f = tp_b = rs_fwd_s = 0.0
    if t > 1:
        # Per layer half: an all-gather of the input and a reduce-scatter of the output (BF16), each way. TE gathers
        # quantized data; megatron's MoE dispatcher and MLA's latents gather BF16 themselves (token_dispatcher.py
        # gather_from_sequence_parallel_region, multi_latent_attention.py).
        rs_s = _tp_collective_s(cluster, cal, t, sp, act * n * h)
        a_in_s, a_grad_s, a_amax_s = _tp_gathers_s(cluster, cal, t, sp, n * h, act, dtype, recipe, impl,
                                                   quantized=not model.mla)
        m_in_s, m_grad_s, m_amax_s = _tp_gathers_s(cluster, cal, t, sp, n * h, act, dtype, recipe, impl,
                                                   quantized=not model.is_moe)
        amax_s = wa * a_amax_s + wm * m_amax_s  # blocking, before the gather: never overlapped
        fwd_comm_s = wa * (a_in_s + rs_s) + wm * (m_in_s + rs_s)
        if tp_overlap:
            tp_f = fwd_comm_s * cal.tp_overlap_exposed + amax_s
            tp_b = (wa * (a_grad_s + rs_s) + wm * (m_grad_s + rs_s)) * cal.tp_overlap_exposed + amax_s
            rs_fwd_s = rs_s * cal.tp_overlap_exposed
        elif not impl.startswith("megatron") or (not sp and impl == "megatron-local-fused"):
            # PyTorch's DTensor TP (torchtitan without async TP) and Megatron-LM / Megatron-DeepSpeed of 2021-22
            # without SP run the backward's collectives in line.
            tp_f = tp_b = fwd_comm_s
            rs_fwd_s = rs_s
        else:
            tp_f, rs_fwd_s = fwd_comm_s + amax_s, rs_s
            # Backward without userbuffers: a column-parallel layer (QKV, fc1) launches its collective beside an
            # independent GEMM (megatron-core / TE Linear backward: with SP the input's all-gather runs under the
            # data-gradient GEMM and the data gradient's reduce-scatter under the weight-gradient GEMM; without SP
            # the gradient's all-reduce under the weight-gradient GEMM), while a row-parallel layer (proj, fc2)
            # must all-gather its output gradient before either GEMM (SP; without SP it has none).
            if sp:
                hidden = [(a_in_s, qkv_b / 2), (rs_s, qkv_b / 2)] * int(wa) + \
                         [(m_in_s, fc1_b / 2), (rs_s, fc1_b / 2)] * int(wm)
                tp_b = wa * a_grad_s + wm * m_grad_s + amax_s
            else:
                hidden = [(2 * rs_s, qkv_b / 2)] * int(wa) + [(2 * rs_s, fc1_b / 2)] * int(wm)
            tp_b += sum(max(0.0, c - g) + cal.tp_overlap_exposed * min(c, g) for c, g in hidden)
    if model.is_moe and ep > 1 and wm:
        # Token dispatch and combine (all-to-all) forward and backward over the expert-parallel group.
        # EP ranks sit etp apart inside the stage's tp x cp x dp ranks (megatron's MoE parallel folding).
        if dispatcher in ("deepep", "hybridep"):
            # DeepEP's internode kernels, and HybridEP's RDMA path since DeepEP #494 (Nov 2025; hybrid-ep branch,
            # docs/Hybrid-EP_Implementation.md: "first performs IB communication between peer GPUs, then each rank
            # distributes the received inter-node data locally", its RDMA token buffer one slot per token and other
            # node): a token crosses the NICs once per other NVLink domain holding one of its experts.
            comm = 4 * _flex_all_to_all_s(cluster, cal, act * n * model.expert_width / r, k_top, model.num_experts,
                                          ep, etp or t, routing)
        else:
            comm = 4 * _all_to_all_s(cluster, cal, act * n * k_top * model.expert_width / r, ep, etp or t)
        exposed = comm
        if ep_unpaired is not None:
            # EP overlap: a paired layer runs one micro-batch's forward beside another's backward, each one's
            # dispatch and combine on a side stream under the other's compute. What outlasts that compute stays
            # exposed, and ep_overlap_exposed of the rest (the SMs the all-to-all kernels take from the GEMMs).
            hidden = min(comm, fwd + bwd)
            paired = comm - hidden + cal.ep_overlap_exposed * hidden
            exposed = ep_unpaired * comm + (1.0 - ep_unpaired) * paired
        tp_f += exposed / 2
        tp_b += exposed / 2

    # Full recompute under PyTorch's early-stopping checkpoint ends where the layer saved its last tensor, the MLP
    # output projection's input: that GEMM, its TP reduction (its exposed share of tp_f: one of the pass's
    # reduce-scatters with SP, one of its two all-reduces without) and the eager residual add as the layer priced
    # it are not repeated (counting.checkpoint_early_stop; inductor fuses the add into its neighbours).
    skip_f = 0.0
    if early_stop and wm:
        skip_f = fc2_f + rs_fwd_s * (1 if sp else 2)
        if impl in ("torch-bf16", "torch-autocast"):
            skip_f += _mem_s(gpu, cal, n * act / 2 * _eager_stream(impl) * EAGER_BYTES["add"][0] * h / r)

    cp_comm = 0.0
    if cp > 1 and wa:
        # Ring attention: cp - 1 steps, each sending this rank's K and V chunk while attending to the previous
        # one; exposed where a step's transfer outlasts its share of the attention (backward: dK, dV too).
        bw = _p2p_gbyte_per_s(cluster, cal, t * cp)  # ring p2p between neighbours: one link each way
        kv_bytes = 2.0 * act * n * kv / t
        step = kernels.p2p_s(kv_bytes, gbyte_per_s=bw, latency_s=cal.collective_latency_s)
        steps = cp - 1
        cp_comm = steps * (max(0.0, step - attn_f / cp) + max(0.0, 2 * step - attn_b / cp))

    kernels_fwd = (KERNELS_PER_LAYER[impl] + (6 if recipe else 0)) * (wa + wm) / 2
    launch = cal.graph_launch_s if impl == "megatron-te" or "layer" in graphs else cal.kernel_launch_s
    host = 3 * kernels_fwd * launch
    if model.is_moe and "layer" not in graphs and wm:
        # Dropless MoE copies the token counts per expert to the host and synchronises in every layer's
        # forward (megatron-core token_dispatcher.py, cuda_sync_point): the expert block runs eagerly, and the
        # host cannot run ahead of the GPU past it, so its time per op bounds the layer when the experts' kernels
        # are short (small micro-batches, many local experts). Graphed router and preprocess scopes replay
        # their share of the ops without the host (megatron-core moe_layer.py: route(), preprocess()).
        eager = cal.moe_host_ops * (1.0 - MOE_ROUTER_HOST_SHARE * ("moe_router" in graphs)
                                    - MOE_PREPROCESS_HOST_SHARE * ("moe_preprocess" in graphs))
        host += (eager + cal.moe_host_ops_per_expert * local_experts) * cal.kernel_launch_s
    if "full_iteration" in graphs:
        host = 0.0  # one graph replays the whole forward-backward (megatron-core full_iteration scope)
    return LayerTime(fwd, bwd, tp_f + tp_b, cp_comm, attn_f, tp_f, host * host_factor(cluster, cal), modules,
                     early_stop_skip_s=skip_f)


def _eager_stream(impl: str) -> float:
    """Bytes of the eager residual stream and norms relative to bf16's (EAGER_FP32_STREAM under DDP autocast)."""
    return EAGER_FP32_STREAM if impl == "torch-autocast" else 1.0


def _eager_elementwise_s(model: ModelSpec, t: int, r: int, n: float, wa: float, wm: float, impl: str, gpu: GPUSpec,
                         cal: Calibration) -> tuple[float, float]:
    """Forward and backward time of a dense layer's element-wise pieces in eager PyTorch (EAGER_BYTES, measured in
    bf16), n tokens on one rank (scaled by the activations' bytes over bf16's for an fp32 plan); wa / wm: the layer
    has attention / an MLP."""
    h, q, kv, f = model.hidden_size, model.query_width, model.kv_width, model.ffn_hidden_size
    norm = EAGER_BYTES["layernorm" if model.normalization != "rmsnorm" else "rmsnorm"]
    act = (EAGER_BYTES["swiglu"] if model.gated else EAGER_BYTES["gelu"] if model.activation == "gelu"
           else tuple(2 * x for x in EAGER_BYTES["gelu"]))  # squared ReLU: two element-wise ops, each as GELU's
    stream = _eager_stream(impl)
    dropout = EAGER_BYTES["dropout"] if model.hidden_dropout > 0 else (0.0, 0.0)

    def half_bytes(i: int) -> tuple[float, float]:
        return stream * (norm[i] + EAGER_BYTES["add"][i]) * h / r + dropout[i] * h / r
    fwd, bwd = (wa + wm) * half_bytes(0), (wa + wm) * half_bytes(1)
    if model.position_embedding == "rope":
        fwd, bwd = fwd + wa * EAGER_BYTES["rope"][0] * (q + kv) / t, bwd + wa * EAGER_BYTES["rope"][1] * (q + kv) / t
    if model.qk_layernorm:
        # The q and k norms: the layer's norm kernel over q and k (fp32 under autocast, as the other norms).
        fwd, bwd = fwd + wa * stream * norm[0] * (q + kv) / t, bwd + wa * stream * norm[1] * (q + kv) / t
    fwd, bwd = fwd + wm * act[0] * f / t, bwd + wm * act[1] * f / t
    biased = wa * ((q + 2 * kv) / t * model.qkv_bias + h / r * model.add_bias_linear) + wm * model.add_bias_linear * (
        (2 if model.gated else 1) * f / t + h / r)  # each biased linear's output width per token on this rank
    fwd, bwd = fwd + EAGER_BYTES["bias"][0] * biased, bwd + EAGER_BYTES["bias"][1] * biased
    return _mem_s(gpu, cal, n * fwd), _mem_s(gpu, cal, n * bwd)


def host_factor(cluster: ClusterSpec, cal: Calibration) -> float:
    """Host time per op on the cluster's CPU relative to an x86 host (Calibration.grace_host_factor)."""
    return cal.grace_host_factor if cluster.host_cpu == "grace" else 1.0


MAMBA_KERNELS_PER_LAYER = 16
"""Forward kernels of a Mamba-2 layer with TE and mamba_ssm (fused norm + in_proj, the split-conv1d-scan kernels,
the gated norm, out_proj, casts and the residual add); backward about twice as many, as for KERNELS_PER_LAYER."""


def ssd_macs_per_token(model: ModelSpec, chunk: int = 128) -> tuple[float, float]:
    """(forward, backward) multiply-accumulates per token and Mamba-2 layer of the chunked state-space-dual scan
    (Dao & Gu 2024, Sec. 6, chunk Q = 128 as megatron-core's MambaMixer sets): per group the causal C B^T
    (Q N / 2), per head the masked product with X (Q P / 2), the chunk state B^T X (N P) and its output C h (N P).
    The backward computes the gradients of each product (about twice) and recomputes the convolution."""
    groups, heads = model.mamba_num_groups, model.mamba_num_heads
    n, p = model.mamba_state_dim, model.mamba_head_dim
    fwd = groups * chunk * n / 2 + heads * (chunk * p / 2 + 2 * n * p)
    return fwd, 2.0 * fwd


def _mamba_time(model: ModelSpec, t: int, cp: int, mbs: int, seq: int, sp: bool, precision: str, recipe: str | None,
                impl: str, tp_overlap: bool, cluster: ClusterSpec, cal: Calibration, graphs: tuple[str, ...]) -> LayerTime:
    """One Mamba-2 layer (megatron-core MambaMixer, memory-efficient path: mamba_ssm's split-conv1d-scan kernel): the
    column-parallel in_proj (z, x, B, C, dt) and row-parallel out_proj GEMMs, the scan (Triton kernels at
    Calibration.ssd_scan_efficiency of the BF16 peak, no faster than their HBM traffic), the gated RMSNorm, and TP
    collectives as for attention (an all-gather before in_proj, a reduce-scatter after out_proj under SP).
    Context parallelism all-to-alls the projections to a head split and back (mamba_context_parallel.py)."""
    gpu = cluster.gpu
    n = mbs * seq // cp
    h, di, heads = model.hidden_size, model.mamba_inner, model.mamba_num_heads
    width = 2 * di + 2 * model.mamba_num_groups * model.mamba_state_dim + heads
    dtype = gemm_dtype(precision, recipe)
    act = 4 if precision == "fp32" else 2
    r = t if sp else 1
    in_f, in_b = linear_s(gpu, cal, n, width // t, h, dtype)
    out_f, out_b = linear_s(gpu, cal, n, h, di // t, dtype)
    q_in, q_grad = kernels.QUANT_BYTES_PER_ELEMENT[recipe]
    quant_f = _mem_s(gpu, cal, q_in * n * (h + di / t))
    quant_b = _mem_s(gpu, cal, q_grad * n * (width / t + h))
    peak16 = gpu.peak_bf16_tflops * sustained_clock(gpu, cal, gemm=False)
    macs_f, macs_b = ssd_macs_per_token(model)
    local = n / t  # the rank's heads and groups are 1/t of them
    scan_bytes_f = act * n * (width + di) / t  # read z, x, B, C, dt; write the scan output
    scan_f = max(2 * macs_f * local / (peak16 * 1e12 * cal.ssd_scan_efficiency), _mem_s(gpu, cal, scan_bytes_f))
    scan_b = max(2 * macs_b * local / (peak16 * 1e12 * cal.ssd_scan_efficiency), _mem_s(gpu, cal, 2.5 * scan_bytes_f))
    # Element-wise: the fused pre-norm and residual add (as half a transformer layer's), the gated RMSNorm (read the
    # scan output and z, write).
    passes = {"megatron-local": cal.local_elementwise_passes,
              "megatron-local-fused": cal.local_fused_elementwise_passes}.get(impl) or ELEMENTWISE_PASSES[impl]
    elem_f = _mem_s(gpu, cal, passes * n * act * (5 * h / r + 3 * di / t))
    fwd = in_f + out_f + scan_f + elem_f + quant_f
    bwd = in_b + out_b + scan_b + 2 * elem_f + quant_b
    tp_f = tp_b = 0.0
    if t > 1:
        # in_proj gathers its (TE-quantized) input, out_proj reduce-scatters its output (BF16), each way.
        rs_s = _tp_collective_s(cluster, cal, t, sp, act * n * h)
        in_s, grad_s, amax_s = _tp_gathers_s(cluster, cal, t, sp, n * h, act, dtype, recipe, impl, quantized=True)
        if tp_overlap:
            tp_f = (in_s + rs_s) * cal.tp_overlap_exposed + amax_s
            tp_b = (grad_s + rs_s) * cal.tp_overlap_exposed + amax_s
        else:
            tp_f = in_s + rs_s + amax_s
            # in_proj's backward hides its collectives behind its own GEMMs as a column-parallel layer does.
            hidden = [(in_s, in_b / 2), (rs_s, in_b / 2)] if sp else [(2 * rs_s, in_b / 2)]
            tp_b = (grad_s + amax_s if sp else 0.0) + sum(
                max(0.0, c - g) + cal.tp_overlap_exposed * min(c, g) for c, g in hidden)
    cp_comm = 0.0
    if cp > 1:
        # Two all-to-alls forward (the projections to a head split, the scan output back), two backward.
        cp_comm = 2 * (_all_to_all_s(cluster, cal, act * n * width / t, cp, t)
                       + _all_to_all_s(cluster, cal, act * n * di / t, cp, t))
    launch = cal.graph_launch_s if impl == "megatron-te" or "layer" in graphs or "mamba" in graphs else cal.kernel_launch_s
    host = 3 * (MAMBA_KERNELS_PER_LAYER + (3 if recipe else 0)) * launch
    if "full_iteration" in graphs:
        host = 0.0
    modules = (("layernorm", _mem_s(gpu, cal, act * 2 * n * h / r)),)
    return LayerTime(fwd, bwd, tp_f + tp_b, cp_comm, 0.0, tp_f, host * host_factor(cluster, cal), modules)


# --- the step -------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class StepCost:
    step_time_s: float
    compute_s: float
    """Forward + backward of all micro-batches on the slowest stage, TP/CP/EP communication included."""
    bubble_s: float
    pp_comm_s: float
    dp_comm_s: float
    optimizer_s: float
    overhead_s: float
    tp_comm_s: float
    """Part of compute_s spent in exposed TP/EP/CP communication."""
    recompute_s: float
    """Part of compute_s spent recomputing activations."""
    offload_s: float
    """Exposed activation offload traffic (host link)."""
    model_flops_per_step: float
    hardware_flops_per_step: float
    tokens_per_step: int
    num_gpus: int
    peak_tflops_per_gpu: float
    bubble_fraction: float
    causal_masked_flops_per_step: float = 0.0
    """Of model_flops_per_step, the causal mask's skipped half of full attention (counting.causal_masked_flops_per_token):
    counted by Megatron's convention, never executed."""

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
        """Model FLOPs utilisation against the dense peak of the plan's compute dtype (NVIDIA's convention:
        989 TFLOP/s for BF16, 1979 for FP8 on an H100)."""
        return self.tflops_per_gpu / self.peak_tflops_per_gpu

    @property
    def mfu_causal_halved(self) -> float:
        """MFU with causal attention counted halved (what the GPU executes; NeMo's flop formulas since 2025 count it
        so): far below `mfu` at long sequences, where attention is most of the FLOPs."""
        executed = self.model_flops_per_step - self.causal_masked_flops_per_step
        return executed / self.step_time_s / self.num_gpus / 1e12 / self.peak_tflops_per_gpu

    @property
    def hfu(self) -> float:
        return self.hardware_tflops_per_gpu / self.peak_tflops_per_gpu

    @property
    def hfu_causal_halved(self) -> float:
        """HFU of the FLOPs the GPU runs: the masked half of causal attention left out, scaled by the hardware-to-model
        FLOPs ratio (recomputation re-runs attention under the same mask; an estimate where it re-runs only part)."""
        masked = self.causal_masked_flops_per_step * self.hardware_flops_per_step / self.model_flops_per_step
        return (self.hardware_flops_per_step - masked) / self.step_time_s / self.num_gpus / 1e12 / self.peak_tflops_per_gpu


def _dp_groups(plan: ParallelPlan, cluster: ClusterSpec, cal: Calibration, dense: int, expert: int
               ) -> list[tuple[int, int, float]]:
    """(parameters, ranks, bus GB/s) of each data-parallel reduction of a stage: dense parameters over the
    dp x cp ranks, expert parameters over their own expert-data-parallel group (the stage's tp x cp x dp ranks
    over ep x etp, `ep x etp` apart: megatron-core's MoE parallel folding), which for wide EP is small and spans
    the nodes one GPU each."""
    d = plan.dp * plan.cp
    span = plan.tp * d
    groups = [(dense, d, _bandwidth(cluster, cal, span, d))]
    if expert:
        groups.append((expert, plan.expert_dp, _bandwidth(cluster, cal, span, plan.expert_dp)))
    return [(p, n, bw) for p, n, bw in groups if p and n > 1]


def _dp_comm_s(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec, cal: Calibration, dense: int,
               expert: int, bwd_window_s: float, fwd_window_s: float, *, split_expert: bool = True) -> float:
    """Exposed data-parallel communication per step, for the stage holding `dense` + `expert` parameters."""
    groups = _dp_groups(plan, cluster, cal, dense, expert)
    if not groups:
        return 0.0
    # The expert-data-parallel group over InfiniBand (it spans the tp x cp x dp ranks, ep x etp apart, as
    # _dp_groups): the share of its collectives that cannot overlap (Calibration.expert_dp_ib_overlap) is exposed
    # in full; under ZeRO-3 / FSDP every collective is priced per unit below and this does not apply. A group
    # leaving its NVLink domain over PCIe (bridged pairs) is held to the same overlap: no fit of its own.
    expert_ib = (split_expert and expert and plan.expert_dp > 1 and cal.expert_dp_ib_overlap < 1.0
                 and plan.tp * plan.dp * plan.cp > cluster.nvlink_domain)
    if expert_ib and not ((plan.framework == "fsdp" and plan.zero_stage >= 2) or plan.zero_stage == 3):
        held = 1.0 - cal.expert_dp_ib_overlap
        rest = _dp_comm_s(model, plan, cluster, cal, dense, int(expert * cal.expert_dp_ib_overlap), bwd_window_s,
                          fwd_window_s, split_expert=False)
        n, ranks, bw = groups[-1]
        lat = cal.collective_latency_s
        if plan.zero_stage >= 1:
            exposed = (kernels.ring_gather_s(plan.grad_bytes * held * n, ranks, bus_gbyte_per_s=bw, latency_s=lat)
                       + kernels.ring_gather_s((1 if plan.fp8_param_gather else 2) * held * n, ranks,
                                               bus_gbyte_per_s=bw, latency_s=lat))
        else:
            exposed = kernels.ring_all_reduce_s(plan.grad_bytes * held * n, ranks, bus_gbyte_per_s=bw, latency_s=lat)
        return rest + exposed
    d = plan.dp * plan.cp
    lat = cal.collective_latency_s
    grad_bytes = plan.grad_bytes
    param_bytes = 1 if plan.fp8_param_gather else 2
    p = sum(g[0] for g in groups)
    bucket_elems = max(40_000_000, 1_000_000 * d)
    buckets = max(1, math.ceil(p / bucket_elems))
    eff = cal.dp_overlap_efficiency
    m = plan.num_microbatches

    def gathers(bytes_per_param: float) -> float:
        return sum(kernels.ring_gather_s(bytes_per_param * n, ranks, bus_gbyte_per_s=bw, latency_s=lat)
                   for n, ranks, bw in groups)

    sharded_params = (plan.framework == "fsdp" and plan.zero_stage >= 2) or plan.zero_stage == 3
    if sharded_params:
        # ZeRO-3 / FSDP / Megatron-FSDP: every micro-batch all-gathers the parameters (forward, and again for
        # the backward unless kept, as SHARD_GRAD_OP does) and reduce-scatters gradients, prefetched behind
        # compute one unit ahead. Each is a ring collective per unit (one flat parameter per layer for FSDP and
        # Megatron-FSDP; one per parameter tensor for DeepSpeed ZeRO-3), and a ring walks all d ranks: at
        # scale the hops' latency, not the bytes, bounds it (Narayanan 2021, Table 2: ZeRO-3 throughput halves
        # each time the GPUs double at a fixed batch).
        # SHARD_GRAD_OP and Megatron-FSDP's optim_grads (zero 2) keep the gathered parameters for the backward;
        # FULL_SHARD, ZeRO-3 and optim_grads_params reshard after the forward and gather again.
        regather = 0 if plan.zero_stage == 2 else 1
        layers = -(-model.num_layers // max(1, plan.pp))
        per_layer = len(layer_tensors(model, False)) if plan.framework == "deepspeed" else 1
        collectives = (layers * per_layer + 1) * (2 + regather)
        # A ring leaving the NVLink domain pays the full hop, over PCIe (bridged pairs) as over the NICs.
        hop = cal.ring_hop_latency_s if plan.tp * d > cluster.nvlink_domain else cal.ring_hop_latency_s / 4
        gather = gathers(param_bytes)
        scatter = gathers(grad_bytes)
        per_mb = gather * (1 + regather) + scatter + collectives * (d - 1) * hop
        exposed = max(0.0, per_mb - eff * (fwd_window_s + bwd_window_s)) + (gather + scatter) / max(1, layers)
        return m * exposed + 2 * lat * math.log2(d)
    if plan.zero_stage >= 1:
        # Distributed optimizer / ZeRO-1/2: reduce-scatter gradients during the last micro-batch's backward,
        # all-gather updated parameters during the next step's first forward (megatron overlap_param_gather;
        # DeepSpeed gathers after the step, unoverlapped).
        reduce = gathers(grad_bytes)
        gather = gathers(param_bytes)
        gather_window = 0.0 if plan.framework == "deepspeed" else fwd_window_s
        # DeepSpeed ZeRO-2 keeps only its gradient partition, so it reduces every micro-batch's gradients in that
        # micro-batch's backward (stage_1_and_2.py: reduce when partition_gradients or at the accumulation boundary).
        reductions = m if plan.framework == "deepspeed" and plan.zero_stage == 2 else 1
        return (reductions * (max(0.0, reduce - eff * bwd_window_s) + reduce / buckets + buckets * lat)
                + max(0.0, gather - eff * gather_window))
    allreduce = sum(kernels.ring_all_reduce_s(grad_bytes * n, ranks, bus_gbyte_per_s=bw, latency_s=lat)
                    for n, ranks, bw in groups)
    return max(0.0, allreduce - eff * bwd_window_s) + allreduce / buckets + buckets * lat


def _optimizer_s(plan: ParallelPlan, cluster: ClusterSpec, cal: Calibration, params: int) -> float:
    """Adam over this rank's shard: ~36 bytes of HBM traffic per parameter (fp32 master, grad, m, v in and
    out, 16-bit param out), plus zeroing the gradient buffer; host Adam when offloaded."""
    shard = plan.shard_size if plan.zero_stage >= 1 and not (plan.framework == "fsdp" and plan.zero_stage < 2) else 1
    p = params / shard
    if plan.offload_optimizer:
        cpu_gbyte_per_s = 100.0 / cluster.gpus_per_node  # node memory bandwidth shared by its GPUs' CPU Adam
        link = cluster.host_link_gbyte_per_s_per_gpu * cal.host_link_efficiency
        return p * 36 / (cpu_gbyte_per_s * 1e9) + p * (2 + plan.grad_bytes) / (link * 1e9)
    return _mem_s(cluster.gpu, cal, p * 36 + params * plan.grad_bytes)


def _quant_weights_s(plan: ParallelPlan, cluster: ClusterSpec, cal: Calibration, gemm_params: int, m: int) -> float:
    """Casting weights to FP8/FP4 (and their transposes): once per step when TE caches them across
    micro-batches; free when the parameters are already kept in FP8 (fp8_param_gather)."""
    if plan.quant_recipe is None or plan.fp8_param_gather:
        return 0.0
    return _mem_s(cluster.gpu, cal, 4.0 * gemm_params)


def _logits_s(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec, cal: Calibration) -> float:
    """Output layer GEMMs (kept in BF16 under FP8 recipes) and the vocab-parallel cross entropy in fp32."""
    gpu = cluster.gpu
    n = plan.mbs * plan.seq_length // plan.cp
    rows = vocab_rows(model, plan)
    f, b = linear_s(gpu, cal, n, rows // plan.tp, model.hidden_size, "fp32" if plan.precision == "fp32" else "bf16",
                    frozen=plan.lora_rank > 0)
    loss_bytes = (16.0 if plan.framework == "megatron" else 24.0) * n * rows / plan.tp
    if plan.fused_loss and plan.framework != "megatron":
        # flash-attn's fused cross entropy: the forward reads the 16-bit logits once, the backward reads them
        # again and writes their gradient (genconf's chunked fallback, without flash-attn, moves ~40 bytes).
        loss_bytes = 6.0 * n * rows / plan.tp
    return f + b + _mem_s(gpu, cal, loss_bytes)


def _embedding_s(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec, cal: Calibration) -> float:
    """Embedding lookup forward and its scatter-add into the fp32 gradient backward."""
    n = plan.mbs * plan.seq_length // plan.cp
    # Forward: read the rows, write the output (2 + 2); backward: scatter-add into the fp32 gradient (4 + 4),
    # which a frozen embedding (LoRA) skips.
    return _mem_s(cluster.gpu, cal, n * model.hidden_size * (2 + 2 + (0 if plan.lora_rank else 4 + 4)))


@dataclass(frozen=True, slots=True)
class StageTime:
    """One micro-batch through one pipeline rank, all its model chunks: what step_cost adds up per stage."""

    total_s: float
    """Forward, backward, recompute, exposed TP/CP and offload traffic, host waits, the per-micro-batch
    overheads, and the embedding (first stage) or the logits and loss (last stage)."""
    forward_s: float
    """The forward passes' part of total_s: the layers' forward with their share of the communication and host
    time, the offload of the forward, and a third of the rest (Korthikanti 2022's 1:2 forward:backward)."""
    recompute_s: float
    offload_s: float


def _mixed_layer(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec, cal: Calibration, *, bf16: bool = False
                 ) -> tuple[LayerTime, dict[str, float]]:
    """The layer with full attention, and the per-layer average over full and sliding-window layers and over an
    MoE model's MoE and dense layers (its first_k_dense_replace). bf16: of the plan's BF16 end layers."""
    keys = ("fwd_s", "bwd_s", "tp_comm_s", "cp_comm_s", "attn_fwd_s", "tp_fwd_comm_s", "early_stop_skip_s")
    modules = plan.recomputed_modules
    if model.is_hybrid:
        # A hybrid model's mean layer: a rank's layers are priced as that many of it (exact without pipelining).
        kinds = [(layer_time(model, plan, cluster, cal, kind=k, bf16=bf16), model.layers_of_kind(k) / model.num_layers)
                 for k in HYBRID_LAYER_KINDS if model.layers_of_kind(k)]
        mixed = {k: sum(w * getattr(lt, k) for lt, w in kinds) for k in keys}
        mixed["selective_s"] = sum(w * lt.recompute_s(modules) for lt, w in kinds)
        host = sum(w * lt.host_s for lt, w in kinds)
        full = LayerTime(**{k: mixed[k] for k in keys}, host_s=host)
        if model.is_moe:
            mixed["host_wait_s"] = sum(w * _host_wait_s(lt) for lt, w in kinds)
        return full, mixed
    full = layer_time(model, plan, cluster, cal, bf16=bf16)
    windowed = layer_time(model, plan, cluster, cal, windowed=True, bf16=bf16) if model.sliding_window else full
    win_frac = model.windowed_layer_fraction
    mixed = {k: (1 - win_frac) * getattr(full, k) + win_frac * getattr(windowed, k) for k in keys}
    mixed["selective_s"] = (1 - win_frac) * full.recompute_s(modules) + win_frac * windowed.recompute_s(modules)
    if model.is_moe:
        mixed["host_wait_s"] = (1 - win_frac) * _host_wait_s(full) + win_frac * _host_wait_s(windowed)
    if model.is_moe and model.dense_layers:
        dense = layer_time(dense_layer_model(model), plan, cluster, cal, bf16=bf16)
        share = model.dense_layers / model.num_layers
        mixed = {k: (1 - share) * mixed[k] + share * getattr(dense, k) for k in keys} | {
            "selective_s": (1 - share) * mixed["selective_s"] + share * dense.recompute_s(modules),
            "host_wait_s": (1 - share) * mixed["host_wait_s"] + share * _host_wait_s(dense)}
    return full, mixed


def _host_wait_s(lt: LayerTime) -> float:
    """GPU time one layer waits for the host to launch its kernels."""
    return max(0.0, lt.host_s - (lt.fwd_s + lt.bwd_s + lt.tp_comm_s + lt.cp_comm_s))


def _mtp_s(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec, cal: Calibration) -> float:
    """The multi-token-prediction layers' extra work on the last stage besides their decoder layer: the shifted
    tokens' embedding, the 2h -> h eh_proj GEMMs, and the output layer and loss again."""
    if not model.mtp_num_layers:
        return 0.0
    n = plan.mbs * plan.seq_length // plan.cp
    dtype = gemm_dtype(plan.precision, plan.quant_recipe)
    f, b = linear_s(cluster.gpu, cal, n, model.hidden_size // plan.tp, 2 * model.hidden_size, dtype)
    return model.mtp_num_layers * (f + b + _logits_s(model, plan, cluster, cal) + _embedding_s(model, plan, cluster, cal))


def _mtp_layer_s(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec, cal: Calibration) -> float:
    """A hybrid model's multi-token-prediction decoder layer, a transformer layer ('*E', counting.transformer_view,
    as the memory model saves it), at the longer of its GPU time and its host time."""
    lt = layer_time(transformer_view(model), plan, cluster, cal)
    return max(lt.fwd_s + lt.bwd_s + lt.tp_comm_s + lt.cp_comm_s, lt.host_s)


def stage_times(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec, cal: Calibration) -> tuple[StageTime, ...]:
    """Each pipeline rank's time for one micro-batch (the pipeline schedule's pass times)."""
    full, layer_gpu = _mixed_layer(model, plan, cluster, cal)
    return _stage_times(model, plan, cluster, cal, full, layer_gpu)


@dataclass(frozen=True, slots=True)
class _LayerPace:
    """One layer's share of a stage's time for one micro-batch (_stage_times)."""

    fwd_s: float
    base_s: float
    """Forward + backward GPU work."""
    busy_s: float
    """base_s with the exposed TP/EP/CP communication."""
    host_wait_s: float
    """Time the GPU waits for the host to launch the layer's kernels."""
    recompute_s: float

    @classmethod
    def of(cls, plan: ParallelPlan, full: LayerTime, layer_gpu: dict[str, float]) -> "_LayerPace":
        base = layer_gpu["fwd_s"] + layer_gpu["bwd_s"]
        busy = base + layer_gpu["tp_comm_s"] + layer_gpu["cp_comm_s"]
        # A layer takes the longer of its GPU time and the host time to launch its kernels. Over a rank's layers
        # the host runs ahead of the GPU, so their times pool (the mean layer's); a dropless MoE layer stops it:
        # its forward copies the token counts to the host and synchronises (megatron-core token_dispatcher.py
        # _maybe_dtoh_and_synchronize; HybridEP without a token budget sizes its buffers on the host), so each
        # MoE layer waits for its own host time and a hybrid model's Mamba layers or a model's dense and
        # sliding-window layers do not hide it (_mixed_layer: host_wait_s per kind of layer).
        host_wait = layer_gpu.get("host_wait_s", max(0.0, full.host_s - busy))
        if plan.recompute == "selective":
            recompute = layer_gpu["selective_s"]
        elif plan.recompute == "full":
            recompute = layer_gpu["fwd_s"] + layer_gpu["tp_fwd_comm_s"] - layer_gpu["early_stop_skip_s"]
        else:
            recompute = 0.0
        return cls(layer_gpu["fwd_s"], base, busy, host_wait, recompute)

    @property
    def total_s(self) -> float:
        return self.busy_s + self.host_wait_s

    @property
    def forward_total_s(self) -> float:
        """The forward's part of total_s: its GPU work and its share of the communication and host waits."""
        return self.fwd_s + (self.total_s - self.base_s) * (self.fwd_s / self.base_s if self.base_s else 0.0)


def _bf16_pace(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec, cal: Calibration) -> _LayerPace:
    """The pace of the plan's BF16 end layers (ParallelPlan.bf16_edge_layers): the same layer with its GEMMs in BF16
    and no quantization passes (Transformer Engine outside its fp8_autocast; megatron-core get_fp8_context)."""
    full, layer_gpu = _mixed_layer(model, plan, cluster, cal, bf16=True)
    return _LayerPace.of(plan, full, layer_gpu)


def _stage_times(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec, cal: Calibration, full: LayerTime,
                 layer_gpu: dict[str, float]) -> tuple[StageTime, ...]:
    gpu = cluster.gpu
    pace = _LayerPace.of(plan, full, layer_gpu)
    layers = stage_layers(model.num_layers, plan)
    bf16 = [bf16_layers_on_rank(model.num_layers, plan, i) for i in range(plan.pp)]
    # A BF16 end layer is priced at its own pace; a hybrid or MoE model's as its mean layer, as the others.
    pace16 = _bf16_pace(model, plan, cluster, cal) if any(bf16) else pace
    link = cluster.host_link_gbyte_per_s_per_gpu * cal.host_link_efficiency * 1e9
    stages = []
    per_param = param_bytes_per_microbatch(plan)
    sharded = plan.zero_stage >= 3 or (plan.framework == "fsdp" and plan.zero_stage >= 2)
    # Autocast casts every weight each forward (read 4, write 2); the rest of the pass is gradient accumulation,
    # which under LoRA only the adapters have.
    param_pass = [0.0] * plan.pp
    if per_param:
        cast = AUTOCAST_CAST_BYTES if implementation(plan) == "torch-autocast" else 0.0
        for i, count in enumerate(stage_layers(model.num_layers, plan)):
            held = rank_params(model, plan, i).total
            trained = lora_rank_params(model, plan, count) if plan.lora_rank else held
            param_pass[i] = _mem_s(gpu, cal, (cast * held + (per_param - cast) * trained)
                                   / (plan.shard_size if sharded else 1))
    alike: dict[tuple | None, StageTime] = {}  # middle ranks by (layers, BF16 layers, parameter pass)
    for i, count in enumerate(layers):
        # A middle rank's time follows from its key alone (the ends add the embedding or the loss): the same floats.
        key = (count, bf16[i], param_pass[i]) if 0 < i < plan.pp - 1 else None
        if key in alike:
            stages.append(alike[key])
            continue
        recomputed = recomputed_layers(plan, count) if plan.recompute == "full" else (count if plan.recompute == "selective" else 0)
        b = bf16[i]
        mix = b / count if count else 0.0  # the stage's share of BF16 layers, among the recomputed ones too
        re = recomputed * ((1.0 - mix) * pace.recompute_s + mix * pace16.recompute_s)
        off = off_fwd = 0.0
        if plan.offload_activation_layers:
            # Activations of the offloaded layers stream to the host during the forward and back during the
            # backward, each direction hidden only behind that pass's compute (TE CPU offload: one copy stream;
            # its default synchroniser lets layer i's copy finish as late as layer layers - offloaded + i starts,
            # and its reload start as early as that layer's backward: cpu_offload.py DefaultOffloadSynchronizer).
            # An MoE model's dense layers among them move a dense layer's bytes (memory.offloaded_activation_bytes).
            moved = offloaded_activation_bytes(model, plan, min(plan.offload_activation_layers, count)) / link
            off_fwd = max(0.0, moved - count * layer_gpu["fwd_s"])
            off = off_fwd + max(0.0, moved - count * layer_gpu["bwd_s"])
        layers_s = (count - b) * pace.total_s + b * pace16.total_s
        t = layers_s + re + off + plan.vp * cal.microbatch_overhead_s + param_pass[i]
        if i == 0:
            t += _embedding_s(model, plan, cluster, cal)
        if i == plan.pp - 1:
            t += _logits_s(model, plan, cluster, cal)
            t += model.mtp_num_layers * (_mtp_layer_s(model, plan, cluster, cal) if model.is_hybrid
                                         else pace.total_s) + _mtp_s(model, plan, cluster, cal)
        forward = (count - b) * pace.forward_total_s + b * pace16.forward_total_s + off_fwd
        forward += (t - layers_s - re - off) / 3
        stages.append(StageTime(total_s=t, forward_s=forward, recompute_s=re, offload_s=off))
        if key is not None:
            alike[key] = stages[-1]
    return tuple(stages)


def layout_of_counts(counts: list[int] | tuple[int, ...], vp: int, mtp: int = 0) -> str:
    """The layout string giving rank r counts[r] layers over its vp virtual stages, the extra layers of an uneven
    share on its earliest stages (so the last rank's final stage, which runs the loss, holds the fewest), and the
    model's `mtp` multi-token-prediction layers beside the loss (megatron-core asserts a layout places them all)."""
    pp = len(counts)
    stages = [0] * (pp * vp)
    for rank, n in enumerate(counts):
        base, extra = divmod(n, vp)
        for chunk in range(vp):
            stages[chunk * pp + rank] = base + (1 if chunk < extra else 0)
    return format_layout(stages, mtp)


BALANCE_GAIN = 0.005
"""A layer moves to another pipeline rank only when that shortens the slowest rank by more than this fraction."""


def balanced_layout(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec, cal: Calibration) -> str | None:
    """A pipeline layout (megatron --pipeline-model-parallel-layout) that moves whole layers off the slowest
    pipeline rank onto the fastest while that shortens the slowest: the pipeline runs at its slowest rank's pace
    (Narayanan 2021, Sec. 2.2), and the last rank also runs the output layer and the loss (under FP8 the BF16
    output GEMMs of a 128K vocabulary cost one to two layers). NVIDIA's Megatron-Bridge recipe for Llama 3 70B
    FP8 on 64 H100s (tp4 pp8 vp5) moves one layer the same way (llama3_70b_pretrain_64gpu_h100_fp8cs_config,
    Megatron-Bridge #5391). A plan's layout string is rebalanced too: the search calls this only for splits it chose
    (search.even_layout, where no split megatron's flags write fits: DeepSeek-V3's 61 layers and MTP layer over 16
    ranks, which NVIDIA's recipe splits 4 | 4 x 14 | 1 + MTP + loss), never for one the user typed. None when no move
    gains BALANCE_GAIN or the plan is not a megatron pipeline."""
    if plan.framework != "megatron" or plan.pp == 1:
        return None
    full, layer_gpu = _mixed_layer(model, plan, cluster, cal)
    counts = list(stage_layers(model.num_layers, plan))

    def loads(cs: list[int]) -> list[float]:
        trial = plan.with_layout(layout_of_counts(cs, plan.vp, model.mtp_num_layers))
        return [st.total_s for st in _stage_times(model, trial, cluster, cal, full, layer_gpu)]

    start = current = loads(counts)
    for _ in range(plan.pp * plan.vp):
        slow = max(range(plan.pp), key=current.__getitem__)
        # Among equally fast ranks the latest: it keeps the fewest micro-batches in flight (least memory).
        fast = min(range(plan.pp), key=lambda r: (current[r], -r))
        if counts[slow] <= 1 or slow == fast:
            break
        trial = counts.copy()
        trial[slow] -= 1
        trial[fast] += 1
        after = loads(trial)
        if max(after) >= max(current):
            break
        counts, current = trial, after
    if max(current) >= max(start) * (1 - BALANCE_GAIN):
        return None
    return layout_of_counts(counts, plan.vp, model.mtp_num_layers)


def step_cost(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec, cal: Calibration, *,
              priced: dict[ParallelPlan, tuple[StageTime, ...]] | None = None) -> StepCost:
    """priced: where given, keeps the plan's stage_times for the caller (the search asks for them next)."""
    gpu = cluster.gpu
    full, layer_gpu = _mixed_layer(model, plan, cluster, cal)
    stages = _stage_times(model, plan, cluster, cal, full, layer_gpu)
    if priced is not None:
        priced[plan] = stages
    stage_s = [st.total_s for st in stages]
    recompute_s = [st.recompute_s for st in stages]
    offload_s = [st.offload_s for st in stages]
    layers = stage_layers(model.num_layers, plan)
    m = plan.num_microbatches
    n = plan.mbs * plan.seq_length // plan.cp
    slowest_i = max(range(plan.pp), key=lambda i: stage_s[i])
    slowest = stage_s[slowest_i]
    pp_comm = 0.0
    if plan.pp > 1:
        # Stage s holds ranks [s B, (s+1) B), B = tp cp dp (Megatron's tp-cp-ep-dp-pp order): a pipeline wider than
        # one NVLink domain has InfiniBand boundaries (PCIe ones inside a node of bridged pairs), and the rank at one
        # paces the 1F1B schedule.
        span = plan.pp * plan.tp * plan.cp * plan.dp
        bw = _p2p_gbyte_per_s(cluster, cal, span)  # stage to stage: one GPU's link
        sp = plan.tp if plan.sequence_parallel else 1
        send = kernels.p2p_s(2.0 * n * model.hidden_size / sp, gbyte_per_s=bw, latency_s=cal.collective_latency_s)
        # Forward activations and backward gradients at every chunk boundary of a micro-batch. Interleaved
        # (overlap_p2p_comm), the transfers run beside compute and cost each rank, the slowest too, the share their
        # kernels take from it: faster ranks' slack does not hide it (genconf dropped that argument on 2026-11-25,
        # history.md). Without interleaving, batched isend/irecv are waited on: paid in full.
        pp_comm = 2 * send * plan.vp * (cal.pp_overlap_exposed if plan.vp > 1 else 1.0)
    bubble = (plan.pp - 1) / plan.vp * (slowest + pp_comm) if plan.pp > 1 else 0.0
    compute = m * slowest
    tp_comm = m * max(layers) * (layer_gpu["tp_comm_s"] + layer_gpu["cp_comm_s"])
    heaviest = max(range(plan.pp), key=lambda i: layers[i]) if plan.pp > 1 else 0
    rp = {i: rank_params(model, plan, i) for i in {0, plan.pp - 1, heaviest}}
    busiest = max(rp.values(), key=lambda r: r.total)
    params, dense, expert = busiest.total, busiest.dense, busiest.expert
    if plan.lora_rank:
        # Only the adapters are trained: their gradients are reduced and their optimizer steps; the frozen
        # weights move nowhere.
        params = dense = lora_rank_params(model, plan, max(layers))
        expert = 0
    passes = dp_overlap_passes(plan)
    # The recomputed forward runs inside each layer's backward (torch.utils.checkpoint, megatron-core
    # CheckpointFunction): the gradient reduce-scatter and ZeRO-3/FSDP's prefetched all-gather run beside it too.
    per_mb_recompute = max(st.recompute_s for st in stages)
    bwd_window = passes * (max(layers) * layer_gpu["bwd_s"] + per_mb_recompute)
    fwd_window = passes * max(layers) * layer_gpu["fwd_s"]
    dp_comm = _dp_comm_s(model, plan, cluster, cal, dense, expert, bwd_window, fwd_window)
    # The weights cast to FP8/FP4 once a step: the quantized layers' (the BF16 end layers keep theirs in BF16).
    quantized = max(r.gemm * (1.0 - bf16_layers_on_rank(model.num_layers, plan, i) / max(1, layers[i]))
                    for i, r in rp.items())
    optimizer = _optimizer_s(plan, cluster, cal, params) + _quant_weights_s(plan, cluster, cal, int(quantized), m)
    overhead = cal.step_overhead_s
    step = compute + bubble + m * pp_comm + dp_comm + optimizer + overhead
    tokens = plan.gbs * plan.seq_length
    flops_token = (lora_flops_per_token(model, plan.seq_length, plan.lora_rank, targets=plan.lora_targets)
                   if plan.lora_rank
                   else model_flops_per_token(model, plan.seq_length))
    hw_token = flops_token + recompute_flops_per_token(model, plan.seq_length, plan.recompute, plan.recomputed_modules,
                                                       early_stop=checkpoint_early_stop(model, plan))
    peak = gpu.peak_tflops({"fp8": "fp8", "fp4": "fp4", "fp16": "fp16", "fp32": "tf32"}.get(plan.precision, "bf16"))
    return StepCost(step_time_s=step, compute_s=compute, bubble_s=bubble, pp_comm_s=m * pp_comm, dp_comm_s=dp_comm,
                    optimizer_s=optimizer, overhead_s=overhead, tp_comm_s=tp_comm, recompute_s=m * recompute_s[slowest_i],
                    offload_s=m * offload_s[slowest_i],
                    model_flops_per_step=flops_token * tokens, hardware_flops_per_step=hw_token * tokens,
                    causal_masked_flops_per_step=causal_masked_flops_per_token(model, plan.seq_length) * tokens,
                    tokens_per_step=tokens, num_gpus=plan.world_size, peak_tflops_per_gpu=peak,
                    bubble_fraction=bubble_fraction(plan))


def training_time_s(cost: StepCost, tokens: float) -> float:
    """Wall time to train `tokens` tokens at this step rate: one step at least (fewer tokens still run a step)."""
    return max(tokens / cost.tokens_per_s, cost.step_time_s)


LOW_BF16_MFU_FRACTION = 0.10
"""utilization_warning's first condition: model FLOP/s under this fraction of the GPU's dense BF16 peak (whatever the
plan's precision, so FP8 and BF16 plans of one layout warn alike). A judgement of when to say so, not fitted."""
WAITING_FRACTION = 0.5
"""Its second: more of the step waiting (pipeline bubble, communication, per-step overhead) than computing, so the
GPUs outnumber the work. A judgement too, not fitted."""


def utilization_warning(cost: StepCost, bf16_peak_tflops: float) -> str | None:
    """Where the GPUs would mostly wait (LOW_BF16_MFU_FRACTION, WAITING_FRACTION): what they wait for, in seconds, and
    what helps; None otherwise."""
    # The exposed TP / EP / CP collectives sit inside compute_s (the slowest stage's layers) but are waiting too: an
    # expert-parallel MoE plan on thousands of GPUs can spend half its step in the all-to-all.
    waiting_s = cost.step_time_s - (cost.compute_s - cost.tp_comm_s) - cost.optimizer_s
    if cost.tflops_per_gpu >= LOW_BF16_MFU_FRACTION * bf16_peak_tflops or waiting_s <= WAITING_FRACTION * cost.step_time_s:
        return None
    parts = ", ".join(f"{name} {s:.3f} s" for name, s in (("tp/ep/cp comm", cost.tp_comm_s), ("bubble", cost.bubble_s),
                                                           ("pp_comm", cost.pp_comm_s), ("dp_comm", cost.dp_comm_s),
                                                           ("overhead", cost.overhead_s))
                      if s > 0)
    head = (f"the GPUs would run at {cost.mfu:.1%} MFU, waiting {waiting_s / cost.step_time_s:.0%} of the "
            f"{cost.step_time_s:.3f} s step ({parts})")
    if cost.num_gpus == 1:
        return f"{head}: the GPU takes {cost.tokens_per_step:,} tokens per step; a larger --global-batch keeps it busier"
    return (f"{head}: {cost.num_gpus:,} GPUs share {cost.tokens_per_step:,} tokens per step, "
            f"{cost.tokens_per_step / cost.num_gpus:,.0f} tokens each; fewer GPUs or a larger --global-batch keep them "
            f"busier")
