"""Kernel physics: how long one GEMM, one flash-attention call, one memory-bound pass and one collective take
on a given GPU and link. Seconds and bytes throughout; pure (standard library only).

The forms are fitted to kernels measured on one H100 80GB HBM3 (benchmarks/data/h100_kernels, tests in
tests/plan/test_kernels.py): cuBLAS GEMMs at real layer shapes in BF16 and FP8, causal flash attention forward and
backward, and element-wise HBM bandwidth. Other GPUs use the same forms with their own SM count, peak rates
and bandwidths (GPUSpec), and per-architecture efficiencies (genconf/catalog/calibration.yaml).
"""

from __future__ import annotations

import functools
import math

TILES = ((128, 128), (128, 256), (256, 128))
"""Output tile shapes cuBLAS/CUTLASS pick among on Hopper and Blackwell (the heuristics take the fastest)."""
SPLIT_K = (1, 2, 4, 8)
"""Split-K / stream-K factors for GEMMs with too few output tiles to fill the GPU (weight gradients of thin
TP slices): each split reduces k/s and the partial sums are added in fp32 afterwards."""
MIN_SPLIT_K = 1024
"""A split keeps at least this many reduction elements (shorter splits do not pay off)."""


@functools.lru_cache(maxsize=131072)
def gemm_s(m: int, n: int, k: int, *, peak_tflops: float, efficiency: float, tile_overhead_s: float, sms: int,
           hbm_tbyte_per_s: float, in_bytes: float, out_bytes: float = 2.0) -> float:
    """One (m x k) @ (k x n) GEMM on one GPU, launch excluded.

    Tensor-core time is scheduled in waves of output tiles over the SMs (wave quantization): each wave costs
    the tile's multiply-adds at `efficiency` x the per-SM peak plus a fixed prologue/epilogue per 128x128 of
    output (`tile_overhead_s`), so short reductions and thin slices run far below peak. The best tile shape
    and split-K factor are taken, as cuBLAS's heuristics do; a GEMM never runs faster than HBM can stream its
    operands (in_bytes per input element, out_bytes per output element).
    Fitted to 1,152 measured H100 GEMMs: median |error| 5%, p90 16% (tests/plan/test_kernels.py; the table's
    ~30 us per timed call added).
    """
    per_sm = peak_tflops * 1e12 * efficiency / sms
    best = math.inf
    for tm, tn in TILES:
        tiles = -(-m // tm) * -(-n // tn)
        for split in SPLIT_K:
            if split > 1 and (k / split < MIN_SPLIT_K or tiles * split > 4 * sms):
                continue
            waves = -(-(tiles * split) // sms)
            per_tile = 2.0 * tm * tn * (k / split) / per_sm + tile_overhead_s * (tm * tn) / (128 * 128)
            reduce = 4.0 * m * n * split / (hbm_tbyte_per_s * 1e12) if split > 1 else 0.0
            best = min(best, waves * per_tile + reduce)
    memory = (in_bytes * (m * k + k * n) + out_bytes * m * n) / (hbm_tbyte_per_s * 1e12)
    return max(best, memory)


ATTENTION_TILE = 128
"""Query and key block size of FlashAttention-2/3 and cuDNN's fused attention on Hopper and Blackwell."""


ALIGNED_ELEMENTS = 8
"""16-bit elements in the 16-byte vector tensor-core kernels load (cuBLAS's "Tensor Core usage" requirements): a
leading dimension or stride that is not a multiple of it runs slower kernels (results/misaligned_gemm_h200.md)."""


def aligned(elements: int) -> bool:
    """Whether a 16-bit dimension of this many elements keeps tensor-core loads 16-byte aligned."""
    return elements % ALIGNED_ELEMENTS == 0


FUSED_ATTENTION_MAX_HEAD_DIM = 256
"""The largest head dim the flash and cuDNN attention kernels take: Transformer Engine's (get_attention_backend) and
PyTorch SDPA's flash and cuDNN backends (sdp_utils.cpp check_head_dim_size_flash; measured on an H200)."""
SDPA_FLASH_MAX_HEAD_DIM = FUSED_ATTENTION_MAX_HEAD_DIM


def fused_attention_supported(head_dim: int) -> bool:
    """Whether Transformer Engine's flash and cuDNN attention backends take this head dim: aligned and at most
    FUSED_ATTENTION_MAX_HEAD_DIM (TE's get_attention_backend; cuDNN's fused attention needs 16-byte-aligned rows).
    Otherwise TE runs its UnfusedDotProductAttention: batched GEMMs with the scores in HBM."""
    return aligned(head_dim) and head_dim <= FUSED_ATTENTION_MAX_HEAD_DIM


def te_fused_attention(head_dim: int, precision: str) -> bool:
    """Whether megatron's te spec runs TE's flash or fused attention: fp16/bf16 inputs only (an fp32 plan gets its
    UnfusedDotProductAttention, get_attention_backend) at a head dim fused_attention_supported takes."""
    return precision != "fp32" and fused_attention_supported(head_dim)


def sdpa_backend_takes(backend: str, head_dim: int, gqa: bool = False) -> bool:
    """Whether PyTorch SDPA's `backend` (genconf.train.speed.ATTENTION's names) runs forward and backward at this head
    dim, `gqa`: with fewer key/value heads than query heads (genconf's model passes enable_gqa). As each did on an
    H200 with torch 2.11 (results/gpu_runs/2026-11-28/: misaligned_sdpa_h200.json, sdpa_gqa_backends.txt): flash up
    to 256, padding a dim that is not a multiple of 8 (aten's pad_last_dim); memory-efficient at multiples of 8 and
    not under grouped-query attention; cuDNN at multiples of 8 up to 256; math (and auto, torch's choice) always."""
    if backend == "flash":
        return head_dim <= SDPA_FLASH_MAX_HEAD_DIM
    if backend == "efficient":
        return aligned(head_dim) and not gqa
    if backend == "cudnn":
        return fused_attention_supported(head_dim)
    return True


def sdpa_fused_supported(head_dim: int, gqa: bool = False) -> bool:
    """Whether PyTorch's scaled_dot_product_attention (genconf's own model) runs a fused kernel at this head dim
    (flash or memory-efficient attention: sdpa_backend_takes); otherwise its math backend runs, the scores through
    HBM. On the H200: flash took head dims 150 and 108, memory-efficient attention 448, only math 450 and a 448 under
    grouped-query attention."""
    return sdpa_backend_takes("flash", head_dim, gqa) or sdpa_backend_takes("efficient", head_dim, gqa)


def flash_attention_s(batch_heads: float, seq_q: float, seq_k: float, head_dim: int, *, causal: bool,
                      peak_tflops: float, efficiency: float, tile_overhead_s: float, sms: int,
                      backward: bool = False, window: int | None = None) -> float:
    """Fused (flash) attention over `batch_heads` (batch x heads) independent problems, forward or backward.

    Work is counted in 128 x 128 (query x key) blocks, each 4 x 128 x 128 x d FLOPs forward (QK^T and AV),
    2.5x that backward (FlashAttention-2, Dao 2023, Sec. 3). Under a causal mask query tile i visits i key
    blocks (fully masked blocks are skipped), so the work is b h T (T + 1) / 2 blocks for T tiles. Query tiles
    are spread over the SMs longest first (FlashAttention-3's scheduler): the span is the larger of the
    average load and the longest tile (T blocks), and every wave of query tiles pays a fixed cost (prologue,
    softmax rescaling, epilogue; backward also the dQ accumulation). Fitted to causal attention on an H100
    (head dim 128): forward 0.65 of the per-SM BF16 peak with 2 us per wave, backward 0.60 with 30 us
    (benchmarks/data/h100_kernels/attention.csv; tests/plan/test_kernels.py: median |error| 4% / 2%).
    `window` (self-attention, seq_q = seq_k): a causal sliding window of that many keys, its query tile i
    visiting min(i + 1, ceil(window / 128) + 1) key tiles and the longest tile that band (FlashAttention-2's local
    attention, flash_fwd_kernel.h n_block_min; priced at the causal fit's rates, not measured).
    """
    tiles_q = max(1.0, seq_q / ATTENTION_TILE)
    tiles_k = max(1.0, seq_k / ATTENTION_TILE)
    per_tile = (tiles_k + 1) / 2 if causal else tiles_k
    longest = tiles_k
    if causal and window is not None:
        # A causal sliding window (self-attention, keys i - window .. i): query tile i visits min(i + 1, band) key
        # tiles, band = ceil(window / 128) + 1 (its diagonal tile and those the window reaches back into).
        band = math.ceil(window / ATTENTION_TILE) + 1
        if tiles_k > band:
            per_tile = (band * (band + 1) / 2 + (tiles_k - band) * band) / tiles_k
            longest = band
    total_blocks = batch_heads * tiles_q * per_tile
    block_s = 4.0 * ATTENTION_TILE * ATTENTION_TILE * head_dim * (2.5 if backward else 1.0) \
        / (peak_tflops * 1e12 * efficiency / sms)
    span = max(total_blocks / sms, longest) * block_s
    waves = math.ceil(batch_heads * tiles_q / sms)
    return span + waves * tile_overhead_s


def memory_bound_s(num_bytes: float, *, hbm_tbyte_per_s: float, efficiency: float) -> float:
    """A kernel that streams `num_bytes` through HBM (read + write) at `efficiency` of the datasheet rate
    (an element-wise add of large bf16 tensors reaches 3.06 of 3.35 TB/s on an H100: 0.91)."""
    return num_bytes / (hbm_tbyte_per_s * 1e12 * efficiency)


# --- collectives ------------------------------------------------------------------------------------

def _latency(ranks: int, latency_s: float) -> float:
    """Start-up cost of one collective: a base latency growing with log2 of the group (NCCL trees/rings)."""
    return latency_s * (1.0 + math.log2(ranks))


def ring_all_reduce_s(num_bytes: float, ranks: int, *, bus_gbyte_per_s: float, latency_s: float) -> float:
    """NCCL all-reduce of `num_bytes` per rank: 2 (n-1)/n x bytes over the bus bandwidth (the busbw convention
    of nccl-tests; ring algorithm, Thakur et al. 2005) plus the start-up latency."""
    if ranks <= 1:
        return 0.0
    return 2.0 * (ranks - 1) / ranks * num_bytes / (bus_gbyte_per_s * 1e9) + _latency(ranks, latency_s)


def ring_gather_s(num_bytes: float, ranks: int, *, bus_gbyte_per_s: float, latency_s: float) -> float:
    """All-gather or reduce-scatter of a `num_bytes` full tensor: (n-1)/n x bytes over the bus bandwidth."""
    if ranks <= 1:
        return 0.0
    return (ranks - 1) / ranks * num_bytes / (bus_gbyte_per_s * 1e9) + _latency(ranks, latency_s)


def all_to_all_s(num_bytes: float, ranks: int, *, bus_gbyte_per_s: float, latency_s: float) -> float:
    """All-to-all where each rank sends (n-1)/n of its `num_bytes` to the others (MoE token dispatch)."""
    if ranks <= 1:
        return 0.0
    return (ranks - 1) / ranks * num_bytes / (bus_gbyte_per_s * 1e9) + _latency(ranks, latency_s)


def p2p_s(num_bytes: float, *, gbyte_per_s: float, latency_s: float) -> float:
    """One point-to-point send (pipeline activations, context-parallel KV chunks)."""
    return num_bytes / (gbyte_per_s * 1e9) + latency_s


# --- FP8 / FP4 quantization traffic ------------------------------------------------------------------

QUANT_BYTES_PER_ELEMENT: dict[str | None, tuple[float, float]] = {
    # recipe: (bytes moved per GEMM-input activation element, per output-gradient element), beyond the BF16
    # baseline. Forward inputs: the FP8 copy the GEMM reads and the transposed FP8 copy the weight gradient
    # reads later (Hopper FP8 tensor cores take only the TN layout). Output gradients: read BF16, write the
    # FP8 copy and its transpose. Current scaling reads each tensor once more for its amax before casting;
    # blockwise and MXFP8 write per-block scales in the same pass; NVFP4 adds a 16-point Hadamard transform
    # on the weight-gradient inputs and writes 4-bit values. (Transformer Engine 2.x recipes, NVIDIA TE docs
    # "FP8 recipes"; Micikevicius et al. 2022; OCP MX spec v1.0; NVIDIA NVFP4 training report 2025.)
    None: (0.0, 0.0),
    "delayed": (2.0, 4.0),       # casts fused into the norm/activation kernels; transposes: read 1, write 1
    "current": (4.0, 6.0),       # + an amax pass over each BF16 tensor (read 2 bytes)
    "blockwise": (4.0, 6.0),     # 1x128 and 128x1 copies with fp32 scales, one read of the BF16 tensor
    "mxfp8": (3.0, 5.0),         # rowwise + columnwise MXFP8 in one pass (Blackwell: no transpose needed)
    "nvfp4": (3.5, 5.5),         # 4-bit rowwise/columnwise + FP8 scales, Hadamard pass on wgrad inputs
}
