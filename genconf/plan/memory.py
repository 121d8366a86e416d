"""Per-GPU memory, per pipeline stage: model states, activations and stated allowances. Bytes throughout.

Model states follow each framework's own accounting (Megatron's distributed-optimizer table,
DeepSpeed's ZeRO estimators, PyTorch FSDP/DDP). Activations are built term by term from what each
implementation saves for backward (Korthikanti et al. 2022, Table 2, generalised to GQA, SwiGLU,
MoE, context parallelism, FP8, and to the two layer specs: Transformer Engine (`te`) and
megatron-core's unfused local spec (`local`)).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from genconf.plan.counting import (
    ParamTensor,
    as_built_by_megatron,
    dense_layer_model,
    embedding_tensors,
    final_norm_tensors,
    layer_tensors,
    lora_layer_tensors,
    mtp_tensors,
    output_tensors,
    padded_vocab_size,
    torch_vocab_rows,
    transformer_view,
)
from genconf.plan.kernels import sdpa_fused_supported, te_fused_attention
from genconf.plan.pipeline import (bf16_layers_on_rank, chunk_layers, chunk_mlp_patterns, chunk_patterns,
                                   dense_layer_mix, dense_layers_on_rank, hybrid_kinds_on_rank, hybrid_layer_mix,
                                   hybrid_mix_first_ranks, inflight_chunks, placement, stage_layers)
from genconf.plan.specs import HYBRID_LAYER_KINDS, ClusterSpec, ModelSpec, ParallelPlan

GIB = 2**30

CUDA_CONTEXT_BYTES = int(0.75 * GIB)
"""CUDA context plus cuBLAS/cuDNN handles and workspaces on Hopper (about 500-800 MiB measured)."""
NCCL_BYTES_PER_GROUP = int(0.25 * GIB)
"""NCCL channel buffers for each communicator a rank is in (NCCL_BUFFSIZE 4 MiB x channels x peers)."""
FRAGMENTATION_FRACTION = 0.23
"""PyTorch's default caching allocator (fixed segments) reserves this fraction above the bytes live at the
peak: blocks freed by initialisation (DeepSpeed/FSDP flattening) and by each micro-batch's activations are split
and cached, and later, differently sized requests cannot all reuse them (the optimizer step's own segment is
StageMemory.step_segment_bytes). Fitted to the published per-GPU memory (BLOOM's nvidia-smi readings; torchtitan's
max reserved), none of which set expandable segments: 71 of 73 within 10%, median |error| 3.3%
(benchmarks/results/memory_fragmentation.md; 0.25 before the step's segment was priced)."""
UNRELEASABLE_FRACTION = 0.03
"""Of that slack, what a plan must still budget for: before it reports out-of-memory PyTorch frees its cached
blocks and retries (CUDACachingAllocator: release_cached_blocks on a failed cudaMalloc), so only blocks split by
tensors that are still live stay lost to fragmentation. An upper bound from runs that fit: the largest allowance
under which every published configuration still fits as it ran (Megatron-Bridge's Llama 3 70B FP8 on 64 GB200,
Megatron-FSDP with 40 layers offloaded and PyTorch's default allocator, is 96.9% of the GPU in live bytes:
benchmarks/results/accuracy.md, "as configured"); 0.10 before that evidence. It caps both allocators'."""
EXPANDABLE_FRAGMENTATION_FRACTION = 0.05
"""Same with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (genconf's launch scripts set it): segments grow
in place and freed blocks are reused, so only block rounding and a few cached blocks remain (an allowance, not
fitted: no published run reports its reserved memory with expandable segments)."""


class _TotalSlot:
    """Where a StageMemory keeps its total_bytes once summed (the search asks for it several times a stage)."""

    __slots__ = ("_total",)


@dataclass(frozen=True, slots=True)
class StageMemory(_TotalSlot):
    """What one GPU of one pipeline stage holds at its peak, in bytes."""

    stage: int
    layers: int
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    other: tuple[tuple[str, int], ...]
    """Other tensors live at the peak, named: transient buffers, gathered ZeRO-3 params, FP8 weight caches, ..."""
    allocator_bytes: int = 0
    """What the caching allocator reserves beyond the live tensors at the peak (cached and split blocks), capped at
    what the GPU leaves room for where stage_memory is given its capacity (estimate() gives it)."""
    runtime_bytes: int = 0
    """Outside PyTorch's allocator: the CUDA context, library workspaces and NCCL buffers."""
    unreleasable_bytes: int = 0
    """The part of allocator_bytes a plan must budget for (fragmentation PyTorch cannot release on demand)."""
    step_segment_bytes: int = 0
    """The part of allocator_bytes the optimizer step's transient buffers take in a segment of their own, beside the
    activations' cached ones (the classic allocator; memory.step_segment_bytes)."""

    @property
    def other_bytes(self) -> int:
        """The named other tensors plus the budgeted fragmentation and the runtime (the 'other' line)."""
        return sum(b for _, b in self.other) + self.unreleasable_bytes + self.runtime_bytes

    @property
    def allocated_bytes(self) -> int:
        """Live tensors at the peak: torch.cuda.max_memory_allocated()."""
        return (self.params_bytes + self.grads_bytes + self.optimizer_bytes + self.activations_bytes
                + sum(b for _, b in self.other))

    @property
    def reserved_bytes(self) -> int:
        """What the caching allocator holds at the peak: torch.cuda.max_memory_reserved()."""
        return self.allocated_bytes + self.allocator_bytes

    @property
    def device_bytes(self) -> int:
        """Device memory in use at the peak as nvidia-smi shows it: reserved plus the runtime."""
        return self.reserved_bytes + self.runtime_bytes

    @property
    def total_bytes(self) -> int:
        """What the plan needs on the GPU: live tensors, the fragmentation that cannot be released, the runtime.
        (The allocator may show more, device_bytes, while it caches freed blocks it would give back.)"""
        try:
            return self._total
        except AttributeError:  # summed once: a frozen stage's fields never change (the same int every time)
            total = self.allocated_bytes + self.unreleasable_bytes + self.runtime_bytes
            object.__setattr__(self, "_total", total)
            return total


HEADROOM_FRACTION = 0.05
"""A plan must leave 5% of the GPU's memory free: the estimate's own error (benchmarks/results/accuracy.md)."""


class _PeakSlot:
    """Where a MemoryEstimate keeps its peak stage once found (the search asks for it several times an estimate)."""

    __slots__ = ("_peak",)


@dataclass(frozen=True, slots=True)
class MemoryEstimate(_PeakSlot):
    stages: tuple[StageMemory, ...]
    capacity_bytes: int

    @property
    def peak(self) -> StageMemory:
        try:
            return self._peak
        except AttributeError:  # found once: the stages of a frozen estimate never change
            peak = max(self.stages, key=lambda s: s.total_bytes)
            object.__setattr__(self, "_peak", peak)
            return peak

    @property
    def usable_bytes(self) -> int:
        """Capacity less the headroom a plan must leave free."""
        return int(self.capacity_bytes * (1 - HEADROOM_FRACTION))

    @property
    def fits(self) -> bool:
        return self.peak.total_bytes <= self.usable_bytes


# --- parameters on one rank -----------------------------------------------------------------------

def vocab_rows(model: ModelSpec, plan: ParallelPlan) -> int:
    """Embedding rows on the GPU: Megatron pads to 128 x TP (--make-vocab-size-divisible-by); genconf's own model
    (DeepSpeed, FSDP) to 128, as OLMo's embedding_size (counting.TORCH_VOCAB_MULTIPLE): GPT-2's unpadded
    50,257-row output layer ran 3.7x slower per FLOP than 50,304 rows on an H200 (results/misaligned_gemm_h200.md)."""
    if plan.framework == "megatron":
        return padded_vocab_size(model.vocab_size, plan.tp)
    return torch_vocab_rows(model.vocab_size)


def stage_tensors(model: ModelSpec, plan: ParallelPlan, stage: int) -> tuple[tuple[ParamTensor, int], ...]:
    """(tensor, how many copies) held by one rank of pipeline stage `stage`."""
    layers = stage_layers(model.num_layers, plan)[stage]
    return _held_tensors(model, plan.framework == "megatron", layers, stage == 0, stage == plan.pp - 1,
                         vocab_rows(model, plan), dense_layers_on_rank(model, plan, stage), _kinds(model, plan, stage))


def _kinds(model: ModelSpec, plan: ParallelPlan, stage: int) -> tuple[tuple[str, int], ...]:
    """A hybrid model's (symbol, layers) on the rank; () for a transformer."""
    return hybrid_kinds_on_rank(model, plan, stage) if model.is_hybrid else ()


@functools.lru_cache(maxsize=16384)
def _held_tensors(model: ModelSpec, megatron: bool, layers: int, first: bool, last: bool,
                  rows: int, dense: int = 0, kinds: tuple[tuple[str, int], ...] = ()) -> tuple[tuple[ParamTensor, int], ...]:
    """`dense` of the `layers` are an MoE model's dense layers (counting.dense_layer_model); `kinds`: a hybrid
    model's layers by symbol."""
    if megatron:
        model = as_built_by_megatron(model)
    if kinds:
        held = [(t, count) for kind, count in kinds for t in layer_tensors(model, megatron, kind)]
    else:
        held = [(t, layers - dense) for t in layer_tensors(model, megatron)] if layers > dense else []
    if dense:
        held += [(t, dense) for t in layer_tensors(dense_layer_model(model), megatron)]
    if first:
        held += [(t, 1) for t in embedding_tensors(model, rows)]
    if last:
        held += [(t, 1) for t in final_norm_tensors(model)]
        held += [(t, 1) for t in output_tensors(model, rows)]
        held += [(t, 1) for t in mtp_tensors(model, megatron)]
        if (model.tie_embeddings or model.mtp_num_layers) and not first:
            # Megatron keeps a copy of the word embedding on the last stage for a tied output layer (synced by
            # all-reduce) and for the multi-token-prediction layers, which embed the shifted tokens again.
            held += [(t, 1) for t in embedding_tensors(model, rows) if "word_embeddings" in t.name]
    return tuple(held)


@dataclass(frozen=True, slots=True)
class RankParams:
    dense: int
    """Parameters sharded (under ZeRO/distributed optimizer) over dp*cp."""
    expert: int
    """Routed-expert parameters, sharded over the expert-data-parallel group dp*cp/ep."""
    gemm: int
    """Matmul weights among them (FP8 keeps casts of these)."""
    largest_module: int
    """The largest single module's parameters (DeepSpeed ZeRO-3 gathers one module at a time)."""

    @property
    def total(self) -> int:
        return self.dense + self.expert


def rank_params(model: ModelSpec, plan: ParallelPlan, stage: int) -> RankParams:
    layers = stage_layers(model.num_layers, plan)[stage]
    return _rank_params(model, plan.framework, plan.tp, plan.ep, plan.expert_tp, layers, stage == 0,
                        stage == plan.pp - 1, vocab_rows(model, plan), dense_layers_on_rank(model, plan, stage),
                        _kinds(model, plan, stage))


@functools.lru_cache(maxsize=16384)
def _rank_params(model: ModelSpec, framework: str, tp: int, ep: int, etp: int, layers: int, first: bool, last: bool,
                 rows: int, dense_layers: int = 0, kinds: tuple[tuple[str, int], ...] = ()) -> RankParams:
    dense = expert = gemm = 0
    modules: dict[str, int] = {}
    for tensor, copies in _held_tensors(model, framework == "megatron", layers, first, last, rows, dense_layers, kinds):
        numel = tensor.numel_per_rank(tp, ep, etp)
        if tensor.expert:
            expert += numel * copies
        else:
            dense += numel * copies
        if tensor.gemm_weight:
            gemm += numel * copies
        module = tensor.name.rsplit(".", 1)[0]
        modules[module] = modules.get(module, 0) + numel
    return RankParams(dense, expert, gemm, max(modules.values(), default=0))


# --- sharding, padded as each framework pads ----------------------------------------------------------

def _ceil_to(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _groups(model: ModelSpec, plan: ParallelPlan, stage: int, expert: bool) -> list[list[tuple[int, int]]]:
    """The stage's parameters as the framework groups them for sharding: megatron one buffer per virtual
    chunk; FSDP one flat parameter per wrapped unit (each block, then the root); DeepSpeed one group.
    Each group is a list of (elements on this TP/EP rank, copies)."""
    held = [(t.numel_per_rank(plan.tp, plan.ep, plan.expert_tp), copies, t) for t, copies in stage_tensors(model, plan, stage)
            if t.expert == expert]
    layer_copies = stage_layers(model.num_layers, plan)[stage]
    decoder = ("input_", "self_", "pre_", "post_", "mlp")
    # One layer's tensors (DeepSpeed and FSDP plans have uniform layers: rules.architecture_conflict).
    in_layer = [(n, t) for n, c, t in held if c == layer_copies and t.name.startswith(decoder)]
    rest = [(n, c) for n, c, t in held if not (c == layer_copies and t.name.startswith(decoder))]
    layer = [(n, 1) for n, _ in in_layer]
    if plan.framework == "megatron":
        chunks = [[(n, per_chunk) for n, _ in layer] for per_chunk in chunk_layers(model.num_layers, plan, stage)]
        first = [(n, c) for n, c, t in held if "embedding" in t.name and (stage == 0 or "word" not in t.name)]
        last = [(n, c) for n, c, t in held if not t.name.startswith(("input_", "self_", "pre_", "mlp", "embedding"))]
        if stage == 0:
            chunks[0] += [x for x in first if stage == 0]
        if stage == plan.pp - 1:
            tied_copy = [(n, c) for n, c, t in held if "word_embeddings" in t.name] if stage != 0 else []
            chunks[-1] += last + tied_copy
        return chunks
    if plan.framework == "fsdp":
        return [layer] * layer_copies + ([rest] if rest else [])
    return [[(n, c) for n, c, _ in held]]


def shard_elements(model: ModelSpec, plan: ParallelPlan, stage: int, *, expert: bool = False) -> int:
    """Elements of the optimizer's shard on the busiest rank, with the framework's padding:
    megatron distributed optimizer: buckets whose parameters start 64-aligned and whose ends are padded to
    lcm(d, 128), each split in d equal ranges (param_and_grad_buffer.py); DeepSpeed ZeRO-1/2: one flat group
    padded to a multiple of 2*d (stage_1_and_2.py, nccl alignment); DeepSpeed ZeRO-3: each parameter
    partitioned separately, ceil(n/d) each (partition_numel); FSDP: each unit's flat parameter padded to a
    multiple of d (FlatParamHandle)."""
    d = plan.expert_dp if expert else plan.shard_size
    if plan.framework == "megatron":
        return _megatron_shard(model, plan, stage, d, expert)
    groups = _groups(model, plan, stage, expert)
    if plan.framework == "deepspeed" and plan.zero_stage < 3:
        real = sum(n * c for g in groups for n, c in g)
        return _ceil_to(real, 2 * d) // d
    if plan.framework == "deepspeed":
        return sum(-(-n // d) * c for g in groups for n, c in g)
    return sum(-(-sum(n * c for n, c in g) // d) for g in groups)


MEGATRON_LAYER_ORDER = ("input_layernorm", "mixer.in_proj", "mixer.conv1d", "mixer.dt_bias", "mixer.A_log", "mixer.D",
                        "mixer.norm", "mixer.out_proj", "self_attention.linear_proj", "self_attention.linear_qkv",
                        "self_attention.linear_q_proj", "self_attention.linear_q_down_proj",
                        "self_attention.linear_q_up_proj", "self_attention.linear_kv_down_proj",
                        "self_attention.linear_kv_up_proj", "self_attention.q_layernorm", "self_attention.kv_layernorm",
                        "self_attention.k_layernorm", "pre_mlp_layernorm",
                        "mlp.router", "mlp.fc1_latent_proj", "mlp.fc2_latent_proj", "mlp.experts",
                        "mlp.shared_experts", "mlp.linear_fc1", "mlp.linear_fc2")
"""Module registration order inside a megatron-core TransformerLayer (Attention builds linear_proj before
SelfAttention adds linear_qkv; MoELayer the router, the latent projections, then the experts; MambaMixer builds
in_proj, conv1d, dt_bias, A_log, D, norm, out_proj): the order of model.parameters(), which the gradient buffer walks
backwards."""


def _megatron_shard(model: ModelSpec, plan: ParallelPlan, stage: int, d: int, expert: bool) -> int:
    """Real parameter elements in the busiest data-parallel rank's range of every buffer of this stage."""
    chunks = chunk_layers(model.num_layers, plan, stage)
    # An MoE model's dense and MoE layers in each chunk, in layer order (where the model has both).
    mixed = model.is_moe and not model.is_hybrid and model.dense_layers
    return _megatron_shard_cached(model, plan.tp, plan.ep, plan.expert_tp, plan.pp, plan.vp, chunks,
                                  stage == 0, stage == plan.pp - 1, vocab_rows(model, plan), d, expert,
                                  chunk_mlp_patterns(model, plan, stage) if mixed else (),
                                  chunk_patterns(model, plan, stage) if model.is_hybrid else ())


@functools.lru_cache(maxsize=1024)
def _layer_block(model: ModelSpec, tp: int, ep: int, etp: int,
                 expert: bool, kind: str = "") -> tuple[tuple[int, ...], tuple[tuple[int, int], ...], int]:
    """One layer as the gradient buffer lays it out (walking backwards) from a 64-aligned start: its tensors'
    elements, the alignment gaps inside it, and where its last parameter ends."""
    layer = sorted(layer_tensors(model, True, kind),
                   key=lambda t: next(i for i, m in enumerate(MEGATRON_LAYER_ORDER) if t.name.startswith(m)))
    block = list(reversed([t.numel_per_rank(tp, ep, etp) for t in layer if t.expert == expert]))
    gaps, end = [], 0
    for i, numel in enumerate(block):
        begin = _ceil_to(end, 64) if i else 0
        if begin > end:
            gaps.append((end, begin))
        end = begin + numel
    return tuple(block), tuple(gaps), end


@functools.lru_cache(maxsize=4096)
def _megatron_shard_cached(model: ModelSpec, tp: int, ep: int, etp: int, pp: int, vp: int, chunks: tuple[int, ...],
                           first: bool, last: bool, rows: int, d: int, expert: bool,
                           mlp_chunks: tuple[str, ...] = (), chunk_kinds: tuple[str, ...] = ()) -> int:
    shared = (model.tie_embeddings or model.mtp_num_layers > 0) and pp > 1
    total_width = 0
    deficit: dict[int, int] = {}  # padding elements inside rank r's ranges
    for chunk, layers in enumerate(chunks):
        embedding, loss = first and chunk == 0, last and chunk == vp - 1
        ends = (shared, first, rows) if embedding or loss else (False, False, 0)  # what only the ends' tensors read
        width, padding = _chunk_shard(model, tp, ep, etp, layers, mlp_chunks[chunk] if mlp_chunks else "",
                                      chunk_kinds[chunk] if chunk_kinds else None, embedding, loss, *ends, d, expert)
        total_width += width
        for r, elements in padding:
            deficit[r] = deficit.get(r, 0) + elements
    return total_width - (min(deficit.get(r, 0) for r in range(d)) if len(deficit) == d else 0)


@functools.lru_cache(maxsize=16384)
def _chunk_shard(model: ModelSpec, tp: int, ep: int, etp: int, layers: int, mlp: str, kinds: str | None,
                 embedding: bool, loss: bool, shared: bool, first: bool, rows: int, d: int,
                 expert: bool) -> tuple[int, tuple[tuple[int, int], ...]]:
    """One model chunk's gradient buffer (its own buckets): (the range width every rank holds in it, the padding
    elements in rank r's ranges as (r, elements)). Chunks alike in these arguments are alike, whatever the pipeline
    around them: _megatron_shard_cached adds them up. kinds: a hybrid model's layer symbols in the chunk (None: a
    transformer's `layers`, of MLP kinds `mlp` in layer order where an MoE model has dense layers too ('-' dense, 'E'
    MoE; ModelSpec.mlp_pattern), all alike where empty); embedding, loss: the chunk opens the first stage or
    closes the last; first: the stage is the first."""
    megatron_model = as_built_by_megatron(model)
    if kinds is None:
        blocks = {False: _layer_block(megatron_model, tp, ep, etp, expert)}
        if "-" in mlp:
            blocks[True] = _layer_block(dense_layer_model(megatron_model), tp, ep, etp, expert)
    else:  # a hybrid model: one block per layer symbol
        blocks = {k: _layer_block(megatron_model, tp, ep, etp, expert, k) for k in set(kinds)}
    align_end = math.lcm(d, 128)
    bucket_size = max(40_000_000, 1_000_000 * d)  # DistributedDataParallel's default with the distributed optimizer
    head: list[tuple[int, bool]] = []  # (elements, own bucket) laid out before the layers (walking backwards)
    tail: list[tuple[int, bool]] = []
    if loss:
        # The multi-token-prediction layers come after the decoder: first in the buffer's backward walk.
        head += [(t.numel_per_rank(tp, ep, etp), False) for t in reversed(mtp_tensors(megatron_model, True))
                 if t.expert == expert]
    if not expert and loss:
        output = output_tensors(megatron_model, rows)
        if shared and not first:
            output += embedding_tensors(megatron_model, rows)[:1]
        head += [(t.numel_per_rank(tp, ep), shared and "word" in t.name) for t in reversed(output)]
        head += [(t.numel_per_rank(tp, ep), False) for t in reversed(final_norm_tensors(megatron_model))]
    if not expert and embedding:
        tail += [(t.numel_per_rank(tp, ep), shared and "word" in t.name)
                 for t in reversed(embedding_tensors(megatron_model, rows))]
    # Walking backwards: the chunk's layers from its last (a dense prefix's layers come last); a hybrid model's
    # layers from its last symbol back.
    order = list(reversed(kinds)) if kinds is not None else (
        [k == "-" for k in reversed(mlp)] if mlp else [False] * layers)
    if not head and not tail and not any(blocks[k][0] for k in set(order)):
        return 0, ()
    gaps: list[tuple[int, int, int]] = []  # (start, end, bucket) of padding
    buckets: list[tuple[int, int]] = []
    start = bucket_start = 0

    def place(numel: int, own_bucket: bool) -> None:
        nonlocal start, bucket_start
        aligned = _ceil_to(start, 64)
        if own_bucket and start > bucket_start:  # close the open bucket: this gap belongs to it
            aligned = _ceil_to(start, align_end)
            gaps.append((start, aligned, len(buckets)))
            buckets.append((bucket_start, aligned))
            bucket_start = aligned
        elif aligned > start:
            gaps.append((start, aligned, len(buckets)))
        start = aligned + numel
        if start - bucket_start >= bucket_size or own_bucket:
            end = _ceil_to(start, align_end)
            gaps.append((start, end, len(buckets)))
            buckets.append((bucket_start, end))
            start = bucket_start = end

    for numel, own in head:
        place(numel, own)
    for kind in order:
        block, block_gaps, block_end = blocks[kind]
        if not block:
            continue
        aligned = _ceil_to(start, 64)
        if aligned + block_end - bucket_start < bucket_size:  # no bucket closes inside this layer
            if aligned > start:
                gaps.append((start, aligned, len(buckets)))
            gaps += [(aligned + a, aligned + b, len(buckets)) for a, b in block_gaps]
            start = aligned + block_end
        else:
            for numel in block:
                place(numel, False)
    for numel, own in tail:
        place(numel, own)
    if start > bucket_start:
        end = _ceil_to(start, align_end)
        gaps.append((start, end, len(buckets)))
        buckets.append((bucket_start, end))
    # Rank r holds range r of every bucket; its real elements are the range's width less the gaps in it.
    padding: dict[int, int] = {}
    for g0, g1, bucket in gaps:
        b0, b1 = buckets[bucket]
        width = (b1 - b0) // d
        for r in range((g0 - b0) // width, min(d, (g1 - 1 - b0) // width + 1)):
            padding[r] = padding.get(r, 0) + min(g1, b0 + (r + 1) * width) - max(g0, b0 + r * width)
    return sum((b1 - b0) // d for b0, b1 in buckets), tuple(padding.items())


# --- model states ---------------------------------------------------------------------------------

def deepspeed_zero_buckets(hidden_size: int) -> dict[str, int]:
    """DeepSpeed bucket sizes (elements) sized from the hidden size, as HF's 'auto' values:
    reduce_bucket_size = h^2, stage3_prefetch_bucket_size = 0.9 h^2, stage3_param_persistence_threshold = 10 h
    (transformers.integrations.deepspeed, HfTrainerDeepSpeedConfig.trainer_config_finalize), rounded up to even
    counts: ZeRO-1/2 assert the all-gather bucket is a multiple of nccl_start_alignment_factor (2)."""
    h2 = _ceil_to(hidden_size * hidden_size, 2)
    return {
        "reduce_bucket_size": h2,
        "allgather_bucket_size": h2,
        "stage3_prefetch_bucket_size": _ceil_to(int(0.9 * h2), 2),
        "stage3_param_persistence_threshold": 10 * hidden_size,
        "stage3_max_live_parameters": max(10**9 // 10, 4 * h2),
        "stage3_max_reuse_distance": max(10**9 // 10, 4 * h2),
    }


QUANT_WEIGHT_BYTES = {"delayed": (1.0, 1.0), "current": (1.0, 1.0), "blockwise": (1.0 + 4 / 16384, 1.0 + 4 / 16384),
                      "mxfp8": (1.0 + 1 / 32, 1.0 + 1 / 32), "nvfp4": (0.5 + 1 / 16, 0.5 + 1 / 16)}
"""Bytes per weight element of Transformer Engine's quantized copies per recipe: (row-wise copy the forward
reads, column-wise/transposed copy the data gradient reads). FP8 per-tensor: one byte each; blockwise adds an
fp32 scale per 128x128 block; MXFP8 an E8M0 scale per 32 values; NVFP4 4-bit values with an FP8 scale per 16."""

FSDP_GRAD_BUCKETS = "Megatron-FSDP unsharded gradient buckets"

PER_TENSOR_RECIPES = ("delayed", "current")
"""Recipes whose column-wise copy is the transpose of the row-wise one under the same scale: where the GPU's FP8
GEMMs take either layout (Blackwell), Transformer Engine keeps only the row-wise data (quantizer.cpp,
Float8Quantizer / Float8CurrentScalingQuantizer: with_transpose = columnwise && !nvte_is_non_tn_fp8_gemm_supported).
Blockwise, MXFP8 and NVFP4 scale along one direction, so their column-wise copy is quantized apart."""

QUANT_ACTIVATION_BYTES = {"delayed": 1.0, "current": 1.0, "blockwise": 1.0 + 4 / 128, "mxfp8": 1.0 + 1 / 32,
                          "nvfp4": 0.5 + 1 / 16}
"""Bytes per element of a GEMM input that Transformer Engine saves for the weight gradient, per recipe (the
quantized copy instead of the BF16 tensor: blockwise keeps an fp32 scale per 1x128, MXFP8 one per 32)."""


def _model_states(model: ModelSpec, plan: ParallelPlan, rp: RankParams, layers: int,
                  pp_stage: int = 0, *, fp8_any_layout: bool = False,
                  terms: _PlanTerms | None = None) -> tuple[int, int, int, list[tuple[str, int]], int]:
    """(params, grads, optimizer, other, step_transient) bytes for one rank holding `rp` and `layers`
    transformer layers. step_transient: what exists only during the optimizer step (activations are gone).
    fp8_any_layout: the GPU's FP8 GEMMs take either layout (GPUSpec.fp8_gemm_any_layout). terms: where given, the
    plan's part of the key is taken from it (found once for the stages of a plan)."""
    # Model states do not depend on the micro-batch, the batch or recompute: one computation per layout.
    plan_key = terms.states_key if terms is not None else None
    if plan_key is None:
        plan_key = _states_plan_key(model, plan)
        if terms is not None:
            terms.states_key = plan_key
    key = (plan_key, rp, layers, pp_stage, fp8_any_layout)
    hit = _MODEL_STATES.get(key)
    if hit is None:
        if len(_MODEL_STATES) > 16384:
            _MODEL_STATES.clear()
        params, grads, optimizer, other, step = _model_states_uncached(model, plan, rp, layers, pp_stage,
                                                                       fp8_any_layout)
        hit = _MODEL_STATES[key] = (params, grads, optimizer, tuple(other), step)
    params, grads, optimizer, other, step = hit
    return params, grads, optimizer, list(other), step


_MODEL_STATES: dict[tuple, tuple] = {}


def _megatron_stage_shard(model: ModelSpec, plan: ParallelPlan, stage: int) -> int:
    """A megatron stage's dense plus expert optimizer shard (shard_elements of each), cached on what _megatron_shard
    reads: the model, the layers' placement, tp, ep, etp, the stage and the two shard sizes. Model states are found
    per layout, precision-aware optimizer and data-parallel size; the same shard recurs across them (Qwen3-235B on
    512 GPUs: 5,890 model states, 1,703 distinct shards)."""
    key = (model, placement(plan), plan.tp, plan.ep, plan.expert_tp, stage, plan.shard_size, plan.expert_dp)
    hit = _MEGATRON_SHARDS.get(key)
    if hit is None:
        if len(_MEGATRON_SHARDS) > 16384:
            _MEGATRON_SHARDS.clear()
        hit = _MEGATRON_SHARDS[key] = (shard_elements(model, plan, stage)
                                       + shard_elements(model, plan, stage, expert=True))
    return hit


_MEGATRON_SHARDS: dict[tuple, int] = {}


def _states_plan_key(model: ModelSpec, plan: ParallelPlan) -> tuple:
    """The model and the plan's fields that model states read (_model_states' key, less the stage's own part)."""
    return (model, plan.framework, plan.tp, plan.ep, plan.expert_tp, plan.pp, plan.vp, plan.dp, plan.cp,
            plan.zero_stage, plan.shard_group_size, plan.precision, plan.quant_recipe, plan.fp8_param_gather,
            plan.bf16_edge_layers,
            plan.precision_aware_optimizer, plan.adam_moments_dtype, plan.lora_rank,
            plan.grad_bytes, plan.layer_spec, plan.offload_optimizer, plan.offload_params,
            stage_layers(model.num_layers, plan),
            plan.seq_length if model.position_embedding == "learned" else 0)


def _model_states_uncached(model: ModelSpec, plan: ParallelPlan, rp: RankParams, layers: int,
                           pp_stage: int = 0, fp8_any_layout: bool = False
                           ) -> tuple[int, int, int, list[tuple[str, int]], int]:
    other: list[tuple[str, int]] = []
    shard: int | None = None
    step_transient = 0

    def sharded(per_param: float, on: bool) -> int:
        nonlocal shard
        if not on:
            return int(per_param * rp.total)
        if shard is None:
            shard = (_megatron_stage_shard(model, plan, pp_stage) if plan.framework == "megatron" else
                     shard_elements(model, plan, pp_stage) + shard_elements(model, plan, pp_stage, expert=True))
        return int(per_param * shard)

    if plan.framework == "megatron":
        # Megatron-LM docs, distributed optimizer table: bf16 params + fp32 grads = 18 bytes, or 6 + 12/d;
        # fp16 params + fp16 grads = 20 bytes (fp32 main params, fp32 grad copy, Adam), or 4 + 16/d.
        # The gradient buffer holds plan.grad_bytes per element (fp32 unless --grad-reduce-in-bf16).
        grad_bytes = plan.grad_bytes
        opt_bytes = megatron_optimizer_bytes(plan)
        param_bytes = 4.0 if plan.precision == "fp32" else 2.0
        recipe = plan.quant_recipe
        gathered_row = 2.0  # bytes per matmul weight element Megatron-FSDP all-gathers
        if recipe is not None and plan.layer_spec == "te":
            row, col = QUANT_WEIGHT_BYTES[recipe]
            if plan.fp8_param_gather:
                gathered_row = row  # the quantized row-wise data is what is sharded and gathered
            if fp8_any_layout and recipe in PER_TENSOR_RECIPES:
                col = 0.0  # the data gradient reads the row-wise copy (TE quantizer.cpp: no transpose allocated)
            # The BF16 end layers' weights stay BF16 (megatron-core builds them outside fp8_model_init): only the
            # quantized layers' matmul weights have quantized copies (a rank's layers priced as its mean layer).
            bf16_layers = bf16_layers_on_rank(model.num_layers, plan, pp_stage)
            quantized = int(rp.gemm * (1.0 - bf16_layers / layers)) if layers else rp.gemm
            gemm = quantized
            if plan.zero_stage >= 3:
                # Megatron-FSDP keeps only the gathered units' quantized copies (two layers and the root).
                unit_gemm = sum(t.numel_per_rank(plan.tp, plan.ep, plan.expert_tp)
                                for t in layer_tensors(as_built_by_megatron(model), True) if t.gemm_weight)
                gemm = min(gemm, 2 * unit_gemm + max(0, gemm - layers * unit_gemm))
            if plan.fp8_param_gather:
                # TE fp8 model params: the matmul weights are stored quantized (row-wise); the column-wise copy
                # the data gradient needs is cached beside them. No BF16 copy of those weights.
                param_bytes_total = 2.0 * (rp.total - quantized) + row * quantized
                if col:
                    other.append((f"{recipe} column-wise weight copies (TE)", int(col * gemm)))
            else:
                # BF16 weights, and TE's quantized copies kept across the micro-batches of a step.
                param_bytes_total = 2.0 * rp.total
                copies = "row- and column-wise" if col else "row-wise; FP8 GEMMs take either layout"
                other.append((f"{recipe} weight copies (TE, {copies})", int((row + col) * gemm)))
        else:
            param_bytes_total = param_bytes * rp.total
        fsdp3 = plan.zero_stage >= 3
        params = sharded(param_bytes_total / max(1, rp.total), True) if fsdp3 else int(param_bytes_total)
        grads = sharded(grad_bytes, plan.zero_stage >= 2)
        optimizer = sharded(opt_bytes, plan.distributed_optimizer)
        if plan.megatron_fsdp:
            # Megatron-FSDP: each layer's gradients are reduce-scattered from an unsharded bucket, and under
            # optim_grads_params its parameters are all-gathered into a double buffer (--fsdp-double-buffer).
            unit = rank_params_block(model, plan)
            other.append((f"{FSDP_GRAD_BUCKETS} (2 layers)", int(2 * grad_bytes * unit)))
            if fsdp3:
                root = _root_params(model, plan, rp, layers, pp_stage)
                unit_gemm = sum(t.numel_per_rank(plan.tp, plan.ep, plan.expert_tp)
                                for t in layer_tensors(as_built_by_megatron(model), True) if t.gemm_weight)
                layer_bytes = 2.0 * (unit - unit_gemm) + gathered_row * unit_gemm
                other.append(("Megatron-FSDP gathered parameters (root + 2 layers)", int(2 * root + 2 * layer_bytes)))
        elif plan.grad_bytes == 2 and plan.distributed_optimizer and not plan.optimizer_keeps_remainders:
            # The optimizer step upcasts this rank's shard of the bf16 gradients to fp32.
            step_transient = sharded(4, True)
        if plan.adam_moments_dtype == "bf16":
            # TE FusedAdam copies a param group's BF16 moments to fp32 for its kernel (fused_adam.py step:
            # get_unscaled_state(...).float()), freed after the group: 8 bytes per parameter of the shard.
            step_transient += sharded(8, plan.distributed_optimizer)
        if plan.lora_rank:
            # LoRA (Megatron-Bridge PEFT): the base weights are frozen, kept as above (bf16 and TE's quantized
            # copies) but with no gradient buffer and no optimizer state; the adapters are trained like any
            # parameter (bf16 weight, gradient buffer, fp32 master and Adam, sharded by the distributed optimizer).
            adapters = lora_rank_params(model, plan, layers)
            shards = plan.dp * plan.cp if plan.distributed_optimizer else 1
            params += 2 * adapters
            grads = grad_bytes * adapters
            optimizer = -(-opt_bytes * adapters // shards)
            step_transient = -(-4 * adapters // shards) if grad_bytes == 2 and plan.distributed_optimizer \
                and not plan.optimizer_keeps_remainders else 0
            if plan.adam_moments_dtype == "bf16":
                step_transient += -(-8 * adapters // shards)  # the BF16 moments' fp32 copies, as above
    elif plan.framework == "deepspeed":
        # DeepSpeed estimate_zero2/3_model_states_mem_needs: 2 bytes 16-bit params + 18 bytes per parameter
        # (2 grads16, 4 grads32, 4 params32, 8 Adam) of which ZeRO shards the stage's part over dp.
        # The fp32 gradient partition only exists during the step (stage_1_and_2.py sets it to None after;
        # ZeRO-0's FP16_Optimizer flattens the 16-bit gradients to fp32 inside step()): a step transient.
        # ZeRO-0 with bf16 runs FP16_Optimizer (engine.py, DDP_BFLOAT16): an fp32 flat master copy
        # (fp32_groups_flat, 4 bytes) plus Adam (8) = 12 bytes, unsharded.
        stage = plan.zero_stage
        params = sharded(2, stage >= 3)
        grads = sharded(2, stage >= 2)
        optimizer = sharded(12, stage >= 1)
        # ZeRO-0's FP16_Optimizer.step (fp16/fused_optimizer.py) builds every gradient's fp32 copy
        # (p.grad.to(fp32)) before _flatten_dense_tensors concatenates them: 4 + 4 bytes per parameter at once.
        step_transient = sharded(4, True) if stage >= 1 else sharded(8, False)
        if plan.grad_dtype == "fp32" and plan.precision == "bf16" and stage <= 1:
            # BF16_Optimizer (engine.py picks it for bf16 + fp32 grad accumulation + ZeRO-1): bf16 grads plus an
            # unsharded fp32 accumulation buffer; master weights and Adam sharded.
            grads = sharded(2 + 4, False)
            step_transient = 0
        if plan.offload_optimizer:
            # Gradient partitions stream to host memory as they are reduced (estimator: 2P on the GPU).
            optimizer = grads = step_transient = 0
        if plan.offload_params and stage >= 3:
            params = 0
        if stage >= 3:
            # Estimator: 4 x largest layer for the gathered 16-bit params and grads of one module,
            # plus the prefetch bucket our ds_config sets.
            buckets = deepspeed_zero_buckets(model.hidden_size)
            other.append(("ZeRO-3 gathered module (4 x largest layer)", 4 * rp.largest_module))
            other.append(("ZeRO-3 prefetch bucket", 2 * buckets["stage3_prefetch_bucket_size"]))
        elif stage >= 1:
            buckets = deepspeed_zero_buckets(model.hidden_size)
            other.append(("ZeRO reduce + all-gather buckets", 2 * (buckets["reduce_bucket_size"] + buckets["allgather_bucket_size"])))
    else:  # fsdp, OLMo-style mixed precision: FP32 parameters, BF16 compute (FP32 compute for fp32 plans)
        stage = plan.zero_stage
        c = 4 if plan.precision == "fp32" else 2  # bytes of the compute copy of a parameter
        # The fp32 flat parameters stay sharded at rest from SHARD_GRAD_OP on: it keeps the unsharded compute copy
        # (below) from forward to backward, not the fp32 parameters (torch FSDP's FlatParamHandle: _local_shard fp32,
        # _full_param_padded in MixedPrecision.param_dtype).
        params = sharded(4, stage >= 2)
        grads = sharded(4, stage >= 2)
        optimizer = sharded(8, stage >= 2)
        unit = rank_params_block(model, plan)
        root = _root_params(model, plan, rp, layers, pp_stage)
        reduce_bytes = plan.grad_bytes  # MixedPrecision(reduce_dtype): fp32 (OLMo's mixed) or bf16 (pure)
        if stage == 0:
            # OLMo's DDP: torch DDP keeps a flat gradient bucket copy (gradient_as_bucket_view=False),
            # and autocast keeps BF16 casts of the weights alive for backward.
            other.append(("DDP gradient buckets", reduce_bytes * rp.total))
            if plan.precision != "fp32":
                other.append(("autocast bf16 weight casts", 2 * rp.total))
        elif stage == 2:
            other.append(("SHARD_GRAD_OP unsharded compute params", c * rp.total))
        elif plan.pp > 1:
            # With pipelining, FSDP keeps the stage's parameters gathered between micro-batches
            # (reshard_after_forward=False) and reduce-scatters fp32 gradients only after the last one.
            other.append(("FSDP unsharded compute params (pipeline)", c * rp.total))
            other.append(("FSDP unsharded fp32 gradients (pipeline)", 4 * rp.total))
        else:
            # by_block wrapping: root unit (embedding, output) + current and prefetched block, in bf16,
            # and one block's unsharded gradient (compute dtype, cast to the reduce dtype for the reduce-scatter).
            other.append(("FSDP gathered units (compute dtype, root + 2 blocks)", c * (root + 2 * unit)))
            other.append(("FSDP unsharded block gradient", (c + reduce_bytes) * unit))
    return params, grads, optimizer, other, step_transient


def lora_rank_params(model: ModelSpec, plan: ParallelPlan, layers: int) -> int:
    """Trainable LoRA adapter parameters on one rank holding `layers` layers (0 without LoRA)."""
    adapters = lora_layer_tensors(model, plan.lora_rank, plan.lora_targets)
    return layers * sum(t.numel_per_rank(plan.tp) for t in adapters)


def rank_params_block(model: ModelSpec, plan: ParallelPlan, *, dense: bool = False, kind: str = "") -> int:
    """Parameters of one transformer block on one rank (dense: one of an MoE model's dense layers; kind: one of a
    hybrid model's layers; a hybrid model's largest layer when neither is given)."""
    megatron = plan.framework == "megatron"
    spec = as_built_by_megatron(model) if megatron else model
    if dense:
        spec = dense_layer_model(spec)
    if model.is_hybrid and not kind:
        return max(rank_params_block(model, plan, kind=k) for k in HYBRID_LAYER_KINDS if model.layers_of_kind(k))
    return sum(t.numel_per_rank(plan.tp, plan.ep, plan.expert_tp) for t in layer_tensors(spec, megatron, kind))


def _root_params(model: ModelSpec, plan: ParallelPlan, rp: RankParams, layers: int, stage: int) -> int:
    """A rank's parameters outside its decoder layers (embedding, final norm, output layer, MTP layers)."""
    if model.is_hybrid:
        return rp.total - sum(count * rank_params_block(model, plan, kind=kind) for kind, count in _kinds(model, plan, stage))
    dense = dense_layers_on_rank(model, plan, stage)
    return rp.total - (layers - dense) * rank_params_block(model, plan) - dense * rank_params_block(model, plan, dense=True)


# --- activations ----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class _Dims:
    n: int      # tokens in one micro-batch on one rank, before TP sharding: mbs * seq / cp
    s: int      # keys each query attends to (the whole sequence)
    h: int
    q: int      # query width a*d
    kv: int     # key/value width g*d
    v: int      # attention output width (a*d; MLA: a x v_head_dim)
    f: int      # MLP width (one branch)
    branches: int  # 2 for SwiGLU
    heads: int
    t: int      # TP divisor of TP-sharded tensors
    r: int      # divisor of replicated-region tensors: t under sequence parallelism, else 1
    e: int      # activation bytes (bf16/fp16)
    ne: int     # bytes of a norm's saved input: 4 under DDP autocast (the norms run in fp32), else e
    g: float    # GEMM-input bytes saved for the weight gradient (the quantized copy under FP8/FP4 with TE)
    moe_k: int  # routed experts per token (1 for dense)


def _dims(model: ModelSpec, plan: ParallelPlan) -> _Dims:
    sp = plan.sequence_parallel and plan.tp > 1
    # Transformer Engine saves FP8/FP4 casts for backward; torchao's Float8Linear (FSDP) is priced as BF16 here.
    recipe = plan.quant_recipe if plan.layer_spec == "te" and plan.framework == "megatron" else None
    return _dims_of(model, plan.mbs * plan.seq_length // plan.cp, plan.seq_length, plan.tp, sp, plan.precision,
                    recipe, plan.autocast_fp32_weights)


@functools.lru_cache(maxsize=4096)
def _dims_of(model: ModelSpec, n: int, seq: int, tp: int, sp: bool, precision: str, recipe: str | None,
             autocast_fp32: bool) -> _Dims:
    """_dims from the plan's fields it reads, cached: stage_memory asks for it several times per stage."""
    f = model.moe_ffn_hidden_size if model.is_moe else model.ffn_hidden_size
    e = 4 if precision == "fp32" else 2
    return _Dims(n=n, s=seq, h=model.hidden_size,
                 q=model.query_width, kv=model.kv_width, v=model.value_width, f=f, branches=2 if model.gated else 1,
                 heads=model.num_attention_heads, t=tp, r=tp if sp else 1, e=e,
                 ne=4 if autocast_fp32 else e,
                 g=QUANT_ACTIVATION_BYTES[recipe] if recipe else e, moe_k=model.moe_top_k if model.is_moe else 1)


def _norm_terms(model: ModelSpec, d: _Dims, label: str) -> list[tuple[str, float]]:
    """A norm saves its input (e bytes; fp32 under DDP autocast, which runs norms in fp32 on the fp32 residual
    stream) and fp32 statistics (mean+rstd for LayerNorm, rstd for RMSNorm)."""
    stats = 8 if model.normalization in ("layernorm", "nonparametric") else 4
    return [(f"{label} input", d.ne * d.n * d.h / d.r), (f"{label} statistics (fp32)", stats * d.n / d.r)]


def _mlp_terms(model: ModelSpec, d: _Dims, spec: str) -> list[tuple[str, float]]:
    k, n = d.moe_k, d.n
    if model.is_moe:
        # megatron-core 0.16 MoE: the router GEMM keeps its 16-bit input; the grouped fc1 keeps the dispatched tokens
        # as it consumes them (Transformer Engine GroupedLinear: the quantized copy under FP8/FP4, the bf16 tokens
        # otherwise); unpermute keeps only indices, since the routing probabilities are applied inside the
        # activation (experts.py activation_func_with_probs, token_dispatcher.py unpermute without probs).
        w = model.expert_width
        terms = [("router input", d.e * n * d.h / d.r), ("fc1 input (dispatched tokens)", d.g * k * n * w / d.r)]
        if model.moe_latent_size:
            # Latent MoE (megatron-core moe_layer.py): fc1_latent_proj keeps the layer's tokens, fc2_latent_proj the
            # combined latent tokens, each on the rank's sequence share (TELinear "duplicated").
            terms += [("latent down-projection input", d.g * n * d.h / d.r),
                      ("latent up-projection input", d.g * n * w / d.r)]
    else:
        terms = [("fc1 input", d.g * n * d.h / d.r)]
    if spec == "local" and model.gated:
        # Unfused SwiGLU (megatron-core glu): fc1 output (both branches, kept by silu through a view), silu
        # output, `x_linear + glu_linear_offset` (a new tensor) and the product that fc2 saves: 10 s b f bytes.
        terms += [("fc1 output (2 branches)", d.e * k * n * 2 * d.f / d.t),
                  ("silu output", d.e * k * n * d.f / d.t),
                  ("linear branch + offset", d.e * k * n * d.f / d.t),
                  ("fc2 input (swiglu product)", d.e * k * n * d.f / d.t)]
    else:
        terms += [("activation input (fc1 output)", d.e * k * n * d.branches * d.f / d.t),
                  ("fc2 input (activation output)", (d.g if spec == "te" else d.e) * k * n * d.f / d.t)]
    if model.is_moe:
        if spec == "local":
            # The unfused activation_func_with_probs keeps the activation's output for the probabilities' gradient
            # beside the weighted product fc2 consumes (measured: tests/train, tiny-moe).
            terms += [("expert activation output (probabilities applied after)", d.e * k * n * d.f / d.t)]
        # Router scores (fp32, every expert), top-k indices (int64) and probabilities (fp32), the routing map (bool
        # and a 16-bit copy), the permutation's indices (int64) and the permuted probabilities (16-bit).
        terms += [("router probabilities (fp32)", 4 * n * model.num_experts / d.r),
                  ("routing indices and map", n * (22 * k + 3 * model.num_experts) / d.r)]
        fs = model.moe_shared_expert_intermediate_size
        if fs:
            # The shared experts: a TP-split MLP on every token (its input gathered over the sequence).
            terms += [("shared experts fc1 input", d.g * n * d.h / d.r),
                      ("shared experts activation input", d.e * n * d.branches * fs / d.t),
                      ("shared experts fc2 input", (d.g if spec == "te" else d.e) * n * fs / d.t)]
    return terms


def layer_activation_terms(model: ModelSpec, plan: ParallelPlan, *, recompute: str | None = None,
                           kind: str = "") -> list[tuple[str, float]]:
    """Bytes one transformer layer saves for backward, per micro-batch, on one GPU, named term by term.

    `te`: Transformer Engine fused LayerNorm+Linear and flash attention: no s^2 tensor; q, k, v, the
    output and the fp32 log-sum-exp are kept; GQA keeps k and v at their own width.
    `local`: megatron-core 0.16's unfused local spec (what runs on a CPU), as measured with
    saved_tensors_hooks (tests/train/test_train.py, test_activation_bytes_match_the_local_spec_estimate, running
    genconf/train/activations.py): the attention scores are kept, softmax in fp32 plus a
    bf16 copy (7 a s^2 b bytes with attention dropout instead of Korthikanti's 5), K and V are expanded to
    every head before the matmuls, RoPE copies q and k, and unfused SwiGLU keeps five ffn-wide tensors.
    Dropout masks are 1 byte per element and norm statistics fp32, as the CUDA kernels keep them.
    kind: one of a hybrid model's layers (specs.HYBRID_LAYER_KINDS); a hybrid model's mean layer when not given.
    """
    recompute = plan.recompute if recompute is None else recompute
    if model.is_hybrid and not kind:
        # The mean of its layers (stage_memory prices each rank's own kinds: pipeline.hybrid_layer_mix).
        return [(f"{HYBRID_LAYER_KINDS[k]} layers: {name}", b * model.layers_of_kind(k) / model.num_layers)
                for k in HYBRID_LAYER_KINDS if model.layers_of_kind(k)
                for name, b in layer_activation_terms(model, plan, recompute=recompute, kind=k)]
    if kind == "-" and model.is_moe:
        model = dense_layer_model(model)
    d = _dims(model, plan)
    n, t, r, e = d.n, d.t, d.r, d.e
    if recompute == "full":
        return [("layer input (full recompute)", e * n * d.h / r)]
    spec = plan.layer_spec
    hidden_mask = [("dropout mask", 1.0 * n * d.h / r)] if model.hidden_dropout > 0 else []
    if kind == "M":
        return _mamba_terms(model, d) + hidden_mask
    terms: list[tuple[str, float]] = _norm_terms(model, d, "input norm")
    terms.append(("qkv input" if not model.mla else "q/kv down-projection input", d.g * n * d.h / r))
    if model.mla:
        # megatron-core MLASelfAttention: the latents are gathered over the sequence before their norms and the
        # column-parallel up projections, which save them whole (norm input and GEMM input each); the RoPE key part
        # comes from the kv down projection.
        latents = (model.q_lora_rank or 0) + model.kv_lora_rank
        terms += [("q/kv latent norm inputs", d.ne * n * latents), ("q/kv up-projection inputs", d.g * n * latents),
                  ("rope key part", e * n * model.qk_pos_emb_head_dim)]
    if model.qk_layernorm:
        terms += [("q/k norm inputs", d.ne * n * (d.q + d.kv) / t)]
    if fused_attention(model, plan):
        terms += [("flash attention q", e * n * d.q / t), ("flash attention k, v", e * n * 2 * d.kv / t),
                  ("flash attention output", e * n * d.v / t),
                  ("softmax log-sum-exp (fp32)", 4.0 * n * d.heads / t)]
        if d.ne > e and (model.qk_layernorm or model.position_embedding == "rope"):
            # Under autocast q and k reach attention as bf16 casts of fp32 tensors (the fp32 q/k norms, RoPE by
            # fp32 tables), so v, a view, keeps the whole qkv output alive beside them (measured on an H200 with
            # benchmarks/gpu_memory_probe.py: OLMo 1B saves 48 bytes per token and hidden unit per layer, 36 in bf16).
            terms.append(("qkv output kept alive by v (q, k are autocast copies)", e * n * (d.q + d.kv) / t))
        if d.g < d.e:
            terms.append(("proj input (quantized copy)", d.g * n * d.v / t))
    else:
        # The local spec, TE's unfused attention where its fused kernels do not take the head dim (with TE's
        # fused scale-mask-softmax), or PyTorch SDPA's math backend (an unfused mask and softmax).
        core = recompute != "selective" or "core_attn" in (plan.recompute_modules or ("core_attn",))
        if plan.torch_layers:
            terms += _sdpa_math_terms(model, d)
        else:
            fused = plan.fused_kernels or (spec == "te" and plan.framework == "megatron")
            terms += _local_attention_terms(model, d, recompute if core else "none", fused)
    sandwich = model.sandwich_norm and plan.framework != "megatron"  # megatron-core builds no sandwich norms
    if sandwich:
        terms += _norm_terms(model, d, "post-attention norm")
    terms += hidden_mask
    if kind == "*":
        return _drop_recomputed(terms, plan.recomputed_modules, model, d) if recompute == "selective" else terms
    if kind in ("-", "E"):
        terms = []
    terms += _norm_terms(model, d, "pre-mlp norm")
    mlp = _mlp_terms(model, d, spec)
    if recompute == "selective" and "mlp" in plan.recomputed_modules and not model.is_moe:
        # megatron's mlp recompute checkpoints the dense MLP: only its input is kept.
        mlp = mlp[:1]
    terms += mlp
    if sandwich:
        terms += _norm_terms(model, d, "post-mlp norm")
    terms += hidden_mask
    if recompute == "selective":
        terms = _drop_recomputed(terms, plan.recomputed_modules, model, d)
    return terms


def _mamba_terms(model: ModelSpec, d: _Dims) -> list[tuple[str, float]]:
    """One Mamba-2 layer under megatron-core's memory-efficient path (MambaMixer._ssm_training): in_proj (TE
    LayerNormLinear) keeps the layer input and its norm's output; mamba_ssm's mamba_split_conv1d_scan_combined keeps
    the whole in_proj output (z, x, B, C, dt) and the ungated scan output, recomputing the convolution in backward
    (ssd_combined.py MambaSplitConv1dScanCombinedFn: save_for_backward(zxbcdt, ..., out_x, ...)); the gated RMSNorm
    keeps its input and fp32 rstd per group; out_proj its input."""
    n, t, e = d.n, d.t, d.e
    di, heads, groups = model.mamba_inner, model.mamba_num_heads, model.mamba_num_groups
    in_width = 2 * di + 2 * groups * model.mamba_state_dim + heads
    return _norm_terms(model, d, "input norm") + [
        ("in_proj input", d.g * n * d.h / d.r),
        ("in_proj output (z, x, B, C, dt)", e * n * in_width / t),
        ("scan output", e * n * di / t),
        ("gated norm input", e * n * di / t), ("gated norm statistics (fp32)", 4.0 * n * groups / t),
        ("out_proj input", d.g * n * di / t)]


_RECOMPUTE_DROPS = {
    # megatron-core's CheckpointWithoutOutput modules: their outputs are freed after the forward and rebuilt
    # before the backward, so the tensors that saved them are not kept (transformer_layer.py, multi_latent_attention.py,
    # experts.py).
    "mla_up_proj": ("flash attention q", "flash attention k, v"),
    "moe_act": ("fc2 input (activation output)", "shared experts fc2 input"),
    "layernorm": ("qkv input", "q/kv down-projection input", "router input", "fc1 input", "shared experts fc1 input"),
}


def _drop_recomputed(terms: list[tuple[str, float]], modules: tuple[str, ...], model: ModelSpec,
                     d: "_Dims") -> list[tuple[str, float]]:
    drop: set[str] = set()
    if "mla_up_proj" in modules and model.mla:
        drop.update(_RECOMPUTE_DROPS["mla_up_proj"])
    if "moe_act" in modules and model.is_moe:
        drop.update(_RECOMPUTE_DROPS["moe_act"])
    if "layernorm" in modules and d.g >= d.e:
        # Under FP8 the GEMMs keep their own quantized copies of the norm outputs: nothing is freed.
        drop.update(_RECOMPUTE_DROPS["layernorm"])
    return [(name, b) for name, b in terms if name not in drop]


def fused_attention(model: ModelSpec, plan: ParallelPlan) -> bool:
    """Whether core attention runs a fused (flash) kernel, keeping no s x s scores: Transformer Engine's where it
    takes the head dim (megatron's te spec); PyTorch's SDPA where a fused backend takes it and the plan does not pin
    the math backend (genconf's own model, ParallelPlan.torch_layers, whatever its layer_spec: the CPU host check
    pins math, which a CPU runs under dropout); the local spec and Megatron-DeepSpeed run it unfused."""
    d = model.attention_head_dim
    if plan.torch_layers:
        return plan.attention_kernel != "math" and sdpa_fused_supported(d, gqa=model.grouped_query)
    return plan.layer_spec == "te" and te_fused_attention(d, plan.precision)


def _sdpa_math_terms(model: ModelSpec, d: _Dims) -> list[tuple[str, float]]:
    """PyTorch SDPA's math backend (genconf's own model at a head dim no fused kernel takes): it upcasts q, k, v to
    fp32 (repeating k, v to every head under grouped-query attention) and saves those copies and the fp32 softmax
    output for its backward (with dropout, the mask and the dropped probabilities too); RoPE's products and the
    upcasts save nothing of their inputs, so the QKV output is not kept alive."""
    n, t, e = d.n, d.t, d.e
    kv = d.q if d.kv < d.q else d.kv
    s2 = d.heads * n * d.s / t
    terms = [("q, k, v upcast to fp32 (SDPA math)", 4.0 * n * (d.q + 2 * kv) / t),
             ("softmax output (fp32, SDPA math)", 4.0 * s2)]
    if model.attention_dropout > 0:
        terms += [("attention dropout mask", 1.0 * s2), ("attention probs after dropout (fp32)", 4.0 * s2)]
    terms.append(("proj input (attention context)", e * n * d.q / t))
    return terms


def _local_attention_terms(model: ModelSpec, d: _Dims, recompute: str, fused: bool) -> list[tuple[str, float]]:
    """megatron-core local spec, core attention. The fused QKV output stays alive while any saved tensor is a
    view of it: q, k without RoPE, and v whenever K/V are not expanded (no GQA); GQA expansion and RoPE make
    copies. Selective recompute checkpoints core attention, keeping only its inputs (before the expansion)."""
    n, t, e = d.n, d.t, d.e
    gqa, rope = d.kv < d.q, model.position_embedding == "rope"
    terms: list[tuple[str, float]] = []
    if rope:
        terms += [("q after rope", e * n * d.q / t), ("rope cos/sin (bf16)", 8.0 * d.s * model.rope_dim)]
    if recompute == "selective":
        if rope:
            terms.append(("k after rope", e * n * d.kv / t))
        keeps_buffer = True  # v is always a view of the QKV output here
    else:
        if gqa:
            terms.append(("k, v expanded to every head", e * n * 2 * d.q / t))
        elif rope:
            terms.append(("k after rope", e * n * d.kv / t))
        keeps_buffer = not rope or not gqa
    if keeps_buffer:
        terms.append(("qkv output (kept alive by views)", e * n * (d.q + 2 * d.kv) / t))
    if recompute != "selective":
        s2 = d.heads * n * d.s / t  # attention-score elements per micro-batch on this rank
        if fused:
            # megatron's scaled_upper_triang_masked_softmax: no mask tensor, bf16 output saved for its backward
            # (and read by the AV bmm when there is no dropout): Korthikanti 2022's 5as^2b with dropout.
            terms.append(("softmax output (fused kernel, bf16)", e * s2))
        else:
            terms += [("causal mask (bool)", 1.0 * d.s * d.s), ("softmax output (fp32)", 4.0 * s2)]
        if model.attention_dropout > 0:
            terms += [("attention dropout mask", 1.0 * s2), ("attention probs after dropout", e * s2)]
        elif not fused:
            terms.append(("attention probs (bf16 copy)", e * s2))
    terms.append(("proj input (attention context)", e * n * d.q / t))
    return terms


def layer_activation_bytes(model: ModelSpec, plan: ParallelPlan, *, recompute: str | None = None,
                           bf16: bool = False, dense: bool = False, kind: str = "") -> float:
    """One layer's saved activations; bf16: the layer is one of the plan's BF16 end layers (no quantized copies);
    dense: one of an MoE model's dense layers (counting.dense_layer_model), its MoE layer otherwise; kind: one of a
    hybrid model's layers (specs.HYBRID_LAYER_KINDS), its mean layer when not given."""
    recompute = plan.recompute if recompute is None else recompute
    if dense:
        model = _dense_view(model)
    precision, recipe = ("bf16", None) if bf16 and plan.quant_recipe else (plan.precision, plan.quant_recipe)
    return _layer_activation_bytes(model, plan.mbs, plan.seq_length, plan.cp, plan.tp, plan.sequence_parallel,
                                   precision, recipe, plan.layer_spec, recompute, plan.fused_kernels,
                                   plan.framework, plan.zero_stage if plan.framework == "fsdp" else 0,
                                   plan.recompute_modules if recompute == "selective" else (),
                                   plan.attention_kernel, kind)  # one cache entry per layout


@functools.lru_cache(maxsize=256)
def _dense_view(model: ModelSpec) -> ModelSpec:
    """dense_layer_model, built once a model (the cache keys below hash it)."""
    return dense_layer_model(model)


@functools.lru_cache(maxsize=16384)
def _layer_activation_bytes(model: ModelSpec, mbs: int, seq: int, cp: int, tp: int, sp: bool, precision: str,
                            recipe: str | None, layer_spec: str, recompute: str, fused: bool = False,
                            framework: str = "megatron", zero_stage: int = 0, modules: tuple[str, ...] = (),
                            attention_kernel: str = "auto", kind: str = "") -> float:
    plan = ParallelPlan(framework=framework, zero_stage=zero_stage, tp=tp, cp=cp, mbs=mbs, gbs=mbs, seq_length=seq,
                        sequence_parallel=sp,
                        precision=precision, fp8_recipe=recipe if precision == "fp8" else None,
                        layer_spec=layer_spec, recompute=recompute, fused_kernels=fused,
                        recompute_modules=modules if recompute == "selective" else (),
                        attention_kernel=attention_kernel)
    return sum(b for _, b in layer_activation_terms(model, plan, recompute=recompute, kind=kind))


def korthikanti_layer_bytes(model: ModelSpec, plan: ParallelPlan) -> float:
    """Korthikanti et al. 2022, Table 2, per layer: sbh(34/t + 5as/(ht)) with SP, sbh(10 + 24/t + 5as/(ht))
    without; selective drops the 5as/h term; full recompute keeps 2sbh."""
    s, b, h, a, t = plan.seq_length, plan.mbs, model.hidden_size, model.num_attention_heads, plan.tp
    sbh = s * b * h
    if plan.recompute == "full":
        return 2.0 * sbh / (t if plan.sequence_parallel else 1)
    attn = 0.0 if plan.recompute == "selective" else 5.0 * a * s / (h * t)
    if plan.sequence_parallel:
        return sbh * (34.0 / t + attn)
    return sbh * (10.0 + 24.0 / t + attn)


FUSED_LOSS_CHUNK_ELEMENTS = 2**25
"""Logits genconf's chunked fused cross entropy turns into fp32 at a time (genconf.train.torch_model): 32 Mi
elements, two fp32 copies of a chunk (256 MiB) beside the 16-bit logits."""


def _loss_bytes(plan: ParallelPlan, d: "_Dims", rows: int) -> tuple[float, tuple[str, float]]:
    """(saved for backward, the loss's transient peak) of the output layer and the cross entropy, per micro-batch."""
    logits = d.n * rows / d.t  # logit elements on this rank
    if plan.fused_loss and plan.framework != "megatron":
        # Fused cross entropy (flash-attn's cross_entropy_loss, OLMo's fused_loss, llm-foundry's MPT default;
        # genconf.train.torch_model.fused_cross_entropy): the output-layer input, the 16-bit logits themselves, and
        # per token the fp32 log-sum-exp and the int64 label. The backward writes a 16-bit logits gradient beside
        # them; genconf's chunked version also holds two fp32 copies of one chunk (FUSED_LOSS_CHUNK_ELEMENTS).
        saved = d.e * d.n * d.h / d.r + d.e * logits + 12.0 * d.n
        return saved, ("fused cross-entropy backward: 16-bit logits gradient + one fp32 chunk (loss)",
                       d.e * logits + 8.0 * min(logits, FUSED_LOSS_CHUNK_ELEMENTS))
    # The output-layer input, the fp32 softmax of the cross entropy with its bool target mask and int64 masked
    # targets, and the fp32 loss mask (megatron tensor_parallel.vocab_parallel_cross_entropy; F.cross_entropy
    # saves the same fp32 log-softmax).
    saved = d.e * d.n * d.h / d.r + 4.0 * logits + 13.0 * d.n
    if plan.framework == "megatron" or plan.fused_kernels:
        # Megatron's model (also under DeepSpeed): vocab_parallel_cross_entropy upcasts once and works in place:
        # bf16 logits + one fp32 buffer.
        return saved, (f"{_logits_dtype(plan, d)} logits before the fp32 loss", d.e * logits)
    if plan.framework == "fsdp" and d.t > 1:
        # torchtitan's 2D FSDP + TP computes the loss on vocab-sharded DTensor logits (loss_parallel,
        # torch/distributed/tensor/parallel/loss.py): its nll-loss backward builds fp32 zeros, exp(log-softmax)
        # and their sum beside the saved fp32 log-softmax before multiplying by the gradient, 12 bytes per
        # element (the forward's x - max and exp(x - max) beside the fp32 logits are 8).
        return saved, ("fp32 loss-parallel cross-entropy backward (zeros, exp, sum)", 12.0 * logits)
    # F.cross_entropy(logits.float()): 16-bit logits, their fp32 copy and the fp32 log-softmax coexist (fp32 logits:
    # .float() is the same tensor, beside the log-softmax).
    return saved, (f"{_logits_dtype(plan, d)} logits + fp32 {'copy' if d.e < 4 else 'log-softmax'} before the loss",
                   (d.e + 4.0) * logits)


def _logits_dtype(plan: ParallelPlan, d: "_Dims") -> str:
    """The logits' dtype, for a memory line's name."""
    return "fp32" if d.e >= 4 else "fp16" if plan.precision == "fp16" else "bf16"


# --- a whole stage --------------------------------------------------------------------------------

def _stage_extras(model: ModelSpec, plan: ParallelPlan, stage: int, first_chunks: int,
                  chunks: int, terms: "_PlanTerms | None" = None,
                  recomputed_layer_bytes: float | None = None) -> tuple[float, list[tuple[str, float]]]:
    """Activations (saved) and transient buffers of the embedding and the loss held by this stage. terms: the plan's
    stage-independent terms (_PlanTerms), where the caller prices several stages of it. recomputed_layer_bytes: the
    largest layer full recompute rebuilds on this stage, where its layers differ (an MoE layer's otherwise)."""
    x = (terms if terms is not None else _PlanTerms(model, plan)).extras()
    saved = 0.0
    transient: list[tuple[str, float]] = []
    if x.rope_table:
        # Each checkpointed layer's inputs include the fp32 rotary table [s, 1, 1, d]: one storage per chunk.
        saved += chunks * 4.0 * x.d.s * model.rope_dim
    if stage == 0:
        saved += first_chunks * x.embedding_per_mb
    if stage == plan.pp - 1:
        # One micro-batch at a time reaches the loss: the final norm, the output layer and the cross entropy.
        final_norm, loss_saved, loss_transient, mtp = x.last()
        saved += final_norm
        saved += loss_saved
        transient.append(loss_transient)
        if model.mtp_num_layers:
            saved += mtp
    if plan.pp > 1:
        transient.append(x.send_recv)
    if plan.recompute == "full":
        layer = x.recomputed_layer
        if recomputed_layer_bytes is not None:
            layer = (layer[0], recomputed_layer_bytes)
        # The loss's buffers are gone before the first layer is recomputed: the larger of the two is the peak.
        loss = [i for i, (name, _) in enumerate(transient) if "loss" in name]
        if loss and transient[loss[0]][1] >= layer[1]:
            pass
        elif loss:
            transient[loss[0]] = layer
        else:
            transient.append(layer)
    return saved, transient


class _Extras:
    """The stage-independent terms of _stage_extras for one plan (the same expressions, evaluated once a plan; the
    last stage's when a last stage is priced)."""

    __slots__ = ("model", "plan", "terms", "d", "rope_table", "embedding_per_mb", "_last", "send_recv",
                 "recomputed_layer")

    def __init__(self, model: ModelSpec, plan: ParallelPlan, terms: "_PlanTerms") -> None:
        self.model, self.plan, self.terms = model, plan, terms
        d = self.d = terms.d
        self.rope_table = plan.recompute == "full" and model.position_embedding == "rope"
        # Embedding (measured on megatron-core 0.16): int64 token ids (+ a masked copy and a bool mask under
        # vocab-parallel TP), int64 position ids for learned positions, and the 1-byte dropout mask.
        per_mb = 8.0 * d.n + (9.0 * d.n if d.t > 1 else 0.0)
        if model.position_embedding == "learned":
            per_mb += 8.0 * d.s
        if model.hidden_dropout > 0:
            per_mb += 1.0 * d.n * d.h / d.r
        self.embedding_per_mb = per_mb
        self._last: tuple | None = None
        self.send_recv = ("pipeline send/recv buffers", 4.0 * d.e * d.n * d.h / d.r)
        self.recomputed_layer = (("recomputed layer during backward", terms.layer_bytes("none"))
                                 if plan.recompute == "full" else None)

    def last(self) -> tuple[float, float, tuple[str, float], float]:
        """(final norm, loss saved, loss transient, MTP layers) of the last stage."""
        if self._last is None:
            model, plan, d = self.model, self.plan, self.d
            final_norm = sum(b for _, b in _norm_terms(model, d, "final norm"))
            loss_saved, loss_transient = _loss_bytes(plan, d, self.terms.rows)
            mtp = 0.0
            if model.mtp_num_layers:
                # Each multi-token-prediction layer (one micro-batch in flight, like the loss): the embedding of the
                # shifted tokens, its two norms and the 2h-wide eh_proj input, one decoder layer, and its own loss.
                mtp_layer = (layer_activation_bytes(transformer_view(model), plan) + 4 * d.e * d.n * d.h / d.r
                             + 2 * sum(b for _, b in _norm_terms(model, d, "mtp norm")) + loss_saved)
                mtp = model.mtp_num_layers * mtp_layer
            self._last = (final_norm, loss_saved, loss_transient, mtp)
        return self._last


class _PlanTerms:
    """What stage_memory reads of a plan whatever the stage, found once for the stages estimate() prices (the same
    calls with the same arguments: the same values)."""

    __slots__ = ("model", "plan", "layers", "d", "rows", "per_layer", "_layer_bytes", "_extras", "states_key")

    def __init__(self, model: ModelSpec, plan: ParallelPlan) -> None:
        self.model, self.plan = model, plan
        self.layers = stage_layers(model.num_layers, plan)
        self.d = _dims(model, plan)
        self.rows = vocab_rows(model, plan)
        self.per_layer = layer_activation_bytes(model, plan)
        self._layer_bytes: dict = {}
        self._extras: _Extras | None = None
        self.states_key: tuple | None = None

    def layer_bytes(self, recompute: str | None = None, bf16: bool = False, dense: bool = False,
                    kind: str = "") -> float:
        """layer_activation_bytes(model, plan, recompute=recompute, bf16=bf16, dense=dense, kind=kind)."""
        key = (recompute, bf16, dense, kind)
        if key not in self._layer_bytes:
            self._layer_bytes[key] = layer_activation_bytes(self.model, self.plan, recompute=recompute, bf16=bf16,
                                                            dense=dense, kind=kind)
        return self._layer_bytes[key]

    def extras(self) -> _Extras:
        if self._extras is None:
            self._extras = _Extras(self.model, self.plan, self)
        return self._extras


def _communicator_groups(plan: ParallelPlan) -> int:
    return sum(1 for size in (plan.tp, plan.pp, plan.cp, plan.dp, plan.ep) if size > 1)


def megatron_optimizer_bytes(plan: ParallelPlan) -> int:
    """Optimizer bytes per parameter of a megatron plan (Megatron-LM docs, distributed optimizer table): fp32 master
    weight and Adam's two fp32 moments, 12; fp16 adds the fp32 gradient copy, 16; fp32 keeps no separate master, 8.
    The precision-aware optimizer keeps the master as a 16-bit remainder where TE holds it
    (ParallelPlan.optimizer_keeps_remainders), and BF16 moments where the plan asks (megatron-core OptimizerConfig
    exp_avg_dtype / exp_avg_sq_dtype)."""
    if plan.precision == "fp16":
        return 16
    if plan.precision == "fp32":
        return 8
    master_bytes = 2 if plan.optimizer_keeps_remainders else 4
    moment_bytes = 2 if plan.adam_moments_dtype == "bf16" else 4
    return master_bytes + 2 * moment_bytes


def step_transient_bytes(model: ModelSpec, plan: ParallelPlan, stage: int) -> int:
    """Bytes that exist only during the optimizer step on this stage (DeepSpeed's fp32 gradient partition,
    megatron's fp32 upcast of bf16 gradient shards): the step's peak is model states plus these, activations gone."""
    layers = stage_layers(model.num_layers, plan)[stage]
    return _model_states(model, plan, rank_params(model, plan, stage), layers, stage)[4]


def offload_bytes_per_layer(model: ModelSpec, plan: ParallelPlan) -> float:
    """Activation bytes one layer keeps per micro-batch, which activation offload moves to the host and back (an MoE
    model's MoE layer, a hybrid model's mean layer; offloaded_activation_bytes counts each layer at its own kind)."""
    return layer_activation_bytes(model, plan, recompute="none" if plan.recompute == "full" else None)


def offloaded_activation_bytes(model: ModelSpec, plan: ParallelPlan, layers: int | None = None,
                               terms: _PlanTerms | None = None) -> float:
    """Activation bytes per micro-batch of the first `layers` decoder layers (the plan's offload_activation_layers
    where not given), which activation offload moves to the host and back: TE's CPU offload takes the first layers
    of the forward (transformer_engine/pytorch/cpu_offload.py: groups below num_offload_group), an MoE model's dense
    layers among them at a dense layer's bytes, a hybrid model's layers at their own kind's."""
    layers = plan.offload_activation_layers if layers is None else layers
    recompute = "none" if plan.recompute == "full" else None
    if model.is_hybrid:
        # A hybrid model's first layers, each at its own kind's bytes (the kinds of hybrid_pattern's first symbols).
        head = model.hybrid_pattern[:max(0, layers)]
        return sum(head.count(k) * (terms.layer_bytes(recompute, kind=k) if terms is not None
                                    else layer_activation_bytes(model, plan, recompute=recompute, kind=k))
                   for k in HYBRID_LAYER_KINDS if k in head)
    per_layer = (terms.layer_bytes(recompute) if terms is not None
                 else layer_activation_bytes(model, plan, recompute=recompute))
    offloaded = layers * per_layer
    dense = _dense_prefix_layers(model, layers)
    if dense:
        dense_layer = (terms.layer_bytes(recompute, dense=True) if terms is not None
                       else layer_activation_bytes(model, plan, recompute=recompute, dense=True))
        offloaded += dense * (dense_layer - per_layer)
    return offloaded


def _dense_prefix_layers(model: ModelSpec, layers: int) -> int:
    """Dense layers among a (non-hybrid) MoE model's first `layers` decoder layers."""
    if not model.is_moe or model.is_hybrid or not model.dense_layers or layers <= 0:
        return 0
    return model.mlp_pattern.count("-", 0, layers)


def _dense_layers_delta(plan: ParallelPlan, terms: _PlanTerms, mix: tuple[int, int, int, int]) -> float:
    """Bytes a rank's dense layers (pipeline.dense_layer_mix) keep beyond the MoE layers stage_memory priced them
    as, over all of its chunks: each layer at its own kind's bytes, full recompute's recomputed layers at their input
    (the same for both kinds), block recompute's other layers whole, and BF16 end layers in BF16."""
    dense, dense_recomputed, _, dense_bf16 = mix
    if plan.recompute == "full":
        delta = dense_recomputed * (terms.layer_bytes(dense=True) - terms.per_layer)
        if plan.recompute_layers is not None:
            delta += (dense - dense_recomputed) * (terms.layer_bytes("none", dense=True) - terms.layer_bytes("none"))
        return delta
    delta = dense * (terms.layer_bytes(dense=True) - terms.per_layer)
    if dense_bf16 and plan.quant_recipe:
        # Their BF16 copies in place of the MoE layer's priced above (stage_memory's BF16 end layers).
        delta += dense_bf16 * (terms.layer_bytes(bf16=True, dense=True) - terms.layer_bytes(dense=True)
                               - terms.layer_bytes(bf16=True) + terms.per_layer)
    return delta


def _hybrid_layers_bytes(plan: ParallelPlan, terms: _PlanTerms,
                         mix: tuple[tuple[str, int, int, int], ...]) -> tuple[float, float | None]:
    """(activation bytes of a hybrid model's rank over all of its chunks, one micro-batch each; the largest layer
    full recompute rebuilds on it, None without full recompute) from its layer kinds (pipeline.hybrid_layer_mix):
    each layer at its own kind's bytes, full recompute's recomputed layers at their input, block recompute's other
    layers whole, BF16 end layers in BF16 at their own kind's bytes."""
    total, recomputed_layer = 0.0, None
    full = plan.recompute == "full"
    for kind, layers, recomputed, bf16 in mix:
        if full:
            total += recomputed * terms.layer_bytes(kind=kind) + (layers - recomputed) * terms.layer_bytes("none",
                                                                                                        kind=kind)
            if recomputed:
                recomputed_layer = max(recomputed_layer or 0.0, terms.layer_bytes("none", kind=kind))
            continue
        total += layers * terms.layer_bytes(kind=kind)
        if bf16 and plan.quant_recipe:
            total += bf16 * (terms.layer_bytes(bf16=True, kind=kind) - terms.layer_bytes(kind=kind))
    return total, recomputed_layer


def stage_memory(model: ModelSpec, plan: ParallelPlan, stage: int, *, fp8_any_layout: bool = False,
                 capacity_bytes: int | None = None, terms: _PlanTerms | None = None) -> StageMemory:
    """One pipeline stage's memory per GPU. fp8_any_layout: the GPU's FP8 GEMMs take either operand layout
    (GPUSpec.fp8_gemm_any_layout; False prices Hopper's transposed copies). capacity_bytes: the GPU's memory, which
    caps the allocator's cache: where a request finds no free memory PyTorch frees its cached blocks and retries
    (CUDACachingAllocator release_cached_blocks), so reserved memory never passes the GPU; the unreleasable part
    stays (a plan that needs more does not fit). terms: the plan's stage-independent terms (_PlanTerms), where the
    caller prices several stages of the plan (estimate)."""
    if terms is None:
        terms = _PlanTerms(model, plan)
    layers = terms.layers[stage]
    # rank_params(model, plan, stage), with the layers and vocabulary rows found once a plan:
    mix = dense_layer_mix(model, plan, stage)  # the rank's dense layers (an MoE model's), where they sit
    rp = _rank_params(model, plan.framework, plan.tp, plan.ep, plan.expert_tp, layers, stage == 0, stage == plan.pp - 1,
                      terms.rows, mix[0], _kinds(model, plan, stage))
    params, grads, optimizer, other, step_transient = _model_states(model, plan, rp, layers, stage,
                                                                    fp8_any_layout=fp8_any_layout, terms=terms)
    chunks = inflight_chunks(plan, stage)
    # Each in-flight chunk holds layers/vp layers; Korthikanti 2022 eq. 5 for the first stage.
    per_chunk_layers = layers / plan.vp
    per_layer = terms.per_layer
    recomputed_layer = None
    kinds_mix = hybrid_layer_mix(model, plan, stage) if model.is_hybrid else ()
    if kinds_mix:
        # A hybrid model's rank holds its own mix of Mamba, attention, MLP and MoE layers, not the model's mean
        # layer: each kind at its own bytes (pipeline.hybrid_layer_mix, exact per chunk). With interleaving the
        # rank's mix is averaged over its in-flight chunks, as the BF16 end layers are (exact without it; megatron's
        # MambaStack does not interleave).
        rank_bytes, recomputed_layer = _hybrid_layers_bytes(plan, terms, kinds_mix)
        per_chunk = rank_bytes / plan.vp
    elif plan.recompute == "full" and plan.recompute_layers is not None:
        # Block recompute: the first recompute_layers layers of each chunk keep only their input.
        kept = max(0.0, per_chunk_layers - plan.recompute_layers)
        per_chunk = (per_chunk_layers - kept) * per_layer + kept * terms.layer_bytes("none")
    else:
        per_chunk = per_chunk_layers * per_layer
    bf16_layers = 0 if kinds_mix else bf16_layers_on_rank(model.num_layers, plan, stage)
    if bf16_layers and plan.recompute != "full":
        # The BF16 end layers save their GEMM inputs in BF16, not as quantized copies: spread over the rank's
        # chunks (exact without interleaving; the first and last chunks hold them).
        per_chunk += bf16_layers / plan.vp * (terms.layer_bytes(bf16=True) - per_layer)
    if mix[0]:
        # An MoE model's dense layers (first_k_dense_replace, moe_layer_interval) hold a dense layer's activations,
        # not the MoE layer's priced above. Where they sit is exact per chunk (pipeline.dense_layer_mix); with
        # interleaving they are spread over the in-flight chunks as the rank's mix averaged over its chunks, as
        # the BF16 end layers are (exact without interleaving).
        per_chunk += _dense_layers_delta(plan, terms, mix) / plan.vp
        if plan.recompute == "full":
            # The backward rebuilds one recomputed layer at a time: the largest of those on this rank.
            _, dense_recomputed, moe_recomputed, _ = mix
            recomputed_layer = max(terms.layer_bytes("none", dense=True) if dense_recomputed else 0.0,
                                   terms.layer_bytes("none") if moe_recomputed else 0.0) or None
    activations = per_chunk * chunks
    named = list(other)
    if plan.offload_activation_layers and plan.pp == 1:
        # TE CPU offload: the offloaded layers' activations leave the GPU after their forward, each layer's copy
        # synchronised before a later layer's so that activation memory stays (layers - offloaded) x one layer's
        # (transformer_engine/pytorch/cpu_offload.py, get_cpu_offload_context).
        offloaded = min(plan.offload_activation_layers, layers)
        activations -= offloaded_activation_bytes(model, plan, offloaded, terms) * chunks
    first_chunks = min(plan.num_microbatches, plan.pp) if plan.pp > 1 else 1
    saved, transient = _stage_extras(model, plan, stage, first_chunks, chunks, terms, recomputed_layer)
    activations = max(0.0, activations) + saved
    transient_bytes = sum(b for _, b in transient)
    named += [(name, int(b)) for name, b in transient]
    if plan.megatron_fsdp and stage == plan.pp - 1:
        # Megatron-FSDP's unsharded gradient buckets exist only in the backward of the layers, after the output
        # layer's backward has freed the loss's fp32 buffer and the logits: the two peaks do not add up.
        d = terms.d
        loss = 4.0 * d.n * terms.rows / d.t + sum(b for n, b in transient if "logits" in n)
        named = [(n, int(max(0.0, b - loss)) if n.startswith(FSDP_GRAD_BUCKETS) else b) for n, b in named]
        named = [(n, b) for n, b in named if b or not n.startswith(FSDP_GRAD_BUCKETS)]
    if step_transient > activations + transient_bytes:
        # The optimizer step's fp32 gradients outgrow the activations, which are free by then.
        named.append(("optimizer-step fp32 gradients beyond the activation peak",
                      int(step_transient - activations - transient_bytes)))
    named_bytes = sum(b for _, b in named)  # (summed once: the same ints each time)
    allocated = params + grads + optimizer + activations + named_bytes
    fraction = EXPANDABLE_FRAGMENTATION_FRACTION if plan.expandable_segments else FRAGMENTATION_FRACTION
    unreleasable = min(fraction, UNRELEASABLE_FRACTION)
    groups = _communicator_groups(plan)
    runtime = CUDA_CONTEXT_BYTES + groups * NCCL_BYTES_PER_GROUP
    segment = step_segment_bytes(plan, step_transient, activations + transient_bytes)
    cached = fraction * allocated + segment
    if capacity_bytes is not None:
        room = max(unreleasable * allocated, capacity_bytes - runtime - int(params) - int(grads) - int(optimizer)
                   - int(activations) - named_bytes)
        cached, segment = min(cached, room), min(segment, room)
    out = StageMemory(stage=stage, layers=layers, params_bytes=int(params), grads_bytes=int(grads),
                      optimizer_bytes=int(optimizer), activations_bytes=int(activations), other=tuple(named),
                      allocator_bytes=int(cached), runtime_bytes=runtime,
                      unreleasable_bytes=int(unreleasable * allocated), step_segment_bytes=int(segment))
    # Its total_bytes, as the property sums it (integers: allocated_bytes' terms, then the fragmentation and runtime).
    object.__setattr__(out, "_total", out.params_bytes + out.grads_bytes + out.optimizer_bytes + out.activations_bytes
                       + named_bytes + out.unreleasable_bytes + runtime)
    return out


def step_segment_bytes(plan: ParallelPlan, step_transient: float, freed_before_step: float) -> float:
    """Reserved bytes the optimizer step adds beside the activations' cached segments. The classic caching
    allocator gives each large request a segment of its own and keeps freed ones cached
    (c10/cuda/CUDACachingAllocator.cpp: get_free_block takes a cached block only if it is at least the size asked
    for): DeepSpeed ZeRO-1/2's one flat fp32 gradient partition per parameter group (stage_1_and_2.py,
    get_flat_partition), allocated once the backward has freed the activations, fits none of their segments and is
    cudaMalloc'd beside them, so reserved (and nvidia-smi) memory holds both. The part of it beyond the activations
    is already live at the step's peak (stage_memory). Megatron upcasts gradient shards one parameter at a time
    (distrib_optimizer.py, _copy_model_grads_to_main_grads): small requests that split cached blocks, none. A plan's
    fit is unchanged: on an out-of-memory the allocator frees its cache and retries. With expandable segments the
    freed pages are mapped into the new block instead: none."""
    if plan.expandable_segments or plan.framework != "deepspeed" or plan.zero_stage not in (1, 2):
        return 0.0
    return max(0.0, min(step_transient, freed_before_step))


def estimate(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec) -> MemoryEstimate:
    """Memory of the pipeline stages that can hold the peak: stage 0 (most micro-batches in flight, the
    embedding), the last (the loss) and, when the ends hold fewer layers than the middle, stage 1; for an MoE
    model with dense layers or a hybrid model, the first rank of each mix of layers (_mix_stages_to_check)."""
    if plan.pp_layout is not None:
        stages = _layout_stages_to_check(stage_layers(model.num_layers, plan))
    else:
        stages = _stages_to_check(plan.pp, plan.uneven_pipeline)
    if plan.pp > 1 and (model.is_hybrid or model.is_moe and model.dense_layers):
        stages = _mix_stages_to_check(model, plan, stages)
    any_layout = cluster.gpu.fp8_gemm_any_layout
    capacity = int(cluster.gpu.hbm_gib * GIB)
    terms = _PlanTerms(model, plan)  # what every stage reads of the plan, found once
    return MemoryEstimate(stages=tuple(stage_memory(model, plan, i, fp8_any_layout=any_layout, capacity_bytes=capacity,
                                                    terms=terms) for i in stages), capacity_bytes=capacity)


def _mix_stages_to_check(model: ModelSpec, plan: ParallelPlan, stages: tuple[int, ...]) -> tuple[int, ...]:
    """`stages` and the first rank of each (layers, layer mix) the pipeline ranks hold, a (non-hybrid) MoE model's
    dense layer mix or a hybrid model's kinds: a rank's dense layers hold other activations and parameters than its
    MoE layers (DeepSeek-V3's dense first layers make stage 0 lighter than stage 1), a hybrid rank's Mamba, attention
    and MLP layers others than the model's mean layer; a later rank of the same mix holds no more micro-batches in
    flight."""
    if model.is_hybrid:
        return tuple(sorted(set(stages).union(hybrid_mix_first_ranks(model, plan))))
    counts = stage_layers(model.num_layers, plan)
    out, seen = set(stages), set()
    for i, n in enumerate(counts):
        key = (n, dense_layer_mix(model, plan, i))
        if key not in seen:
            seen.add(key)
            out.add(i)
    return tuple(sorted(out))


def _layout_stages_to_check(counts: tuple[int, ...]) -> tuple[int, ...]:
    """With a pipeline layout any rank may hold the most layers: the ends, and every rank holding more layers than
    all ranks before it (a later rank with no more layers holds fewer micro-batches in flight)."""
    out, most = {0, len(counts) - 1}, -1
    for i, n in enumerate(counts):
        if n > most:
            out.add(i)
            most = n
    return tuple(sorted(out))


@functools.lru_cache(maxsize=64)
def _stages_to_check(pp: int, uneven: bool = True) -> tuple[int, ...]:
    """With an even split every middle stage holds the same layers as stage 0 and fewer micro-batches in flight."""
    return tuple(sorted({0, min(1, pp - 1) if uneven else 0, pp - 1}))


def model_state_bytes_per_param(plan: ParallelPlan) -> float:
    """Bytes of params+grads+optimizer per parameter on one GPU with no sharding (seed: 14P for bf16 weights
    + fp32 Adam 'just loading weights'; Megatron 18; DeepSpeed 20; FSDP/DDP fp32 16)."""
    megatron = {"fp16": 20.0, "fp32": 16.0}.get(plan.precision, 18.0)
    return {"megatron": megatron, "deepspeed": 20.0, "fsdp": 16.0}[plan.framework]


def seed_model_bytes(params: int) -> int:
    """The seed's 'just loading weights' estimate: 2 bytes bf16 params + 3 x 4 bytes fp32 optimizer = 14P
    (000_c341372fa13853c8.txt, 'Required Memory Estimation')."""
    return 14 * params
