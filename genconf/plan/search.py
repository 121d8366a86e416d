"""Search over parallel layouts: enumerate candidates, reject them by named rules and memory, rank the rest
by predicted throughput. Pinned degrees narrow the space; pinning everything evaluates exactly one plan.

The space is complete for megatron: every TP that divides the heads inside the NVLink domain, every CP that
splits the sequence, every PP that divides the remaining GPUs, even and uneven layer splits (explicit first/last
stage layers, embedding and loss counted as layers), every legal virtual-stage count, micro-batches 1-8, the
distributed optimizer or not (Megatron-FSDP without pipelining), recompute none/selective/full. Plans that
almost fit get the cheapest memory saver that makes them fit: gradients reduced in bf16, FP8 weights kept in
FP8, block recompute of just enough layers, or activation offload. Divisors are enumerated in O(sqrt n) and
candidates that cannot fit or cannot win are cut early, so a 1T model on 16,384 GPUs is searched in about a second.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections import Counter
from dataclasses import dataclass, field, replace

from genconf.plan import limits
from genconf.plan import memory as mem
from genconf.plan import rules
from genconf.plan.batch import BatchDefault, default_batch, global_batch_for
from genconf.plan.cost import (Calibration, StepCost, _layer_time, balanced_layout, implementation, layout_of_counts,
                               step_cost)
from genconf.plan.counting import dense_layer_model, exact_param_count
from genconf.plan.errors import NoFeasiblePlan
from genconf.plan.memory import GIB, MemoryEstimate
from genconf.plan.pipeline import largest_chunk_layers, layout_vp, parse_layout
from genconf.plan.precision import bf16_edge_default
from genconf.plan.specs import (HYBRID_LAYER_KINDS, LORA_TARGETS, ClusterSpec, HashOnce, ModelSpec, ParallelPlan,
                                hash_once)

MAX_BATCH_GROWTH = 1.5
"""Without --global-batch, a candidate may round the batch up to 1.5x the default (genconf.plan.batch), not more."""
BATCH_TOO_LARGE = "batch_above_target"
"""Marker yielded for layouts whose data parallelism alone forces a batch above the target."""
TIE_FRACTION = 0.03
"""Plans within this fraction of the fastest are a tie for the model: its median error on published runs it
was not fitted to is about this (benchmarks/results/accuracy.md). Among tied plans the one sure to fit in memory is
preferred, then the simplest (_tie_key)."""
MICRO_BATCHES = (1, 2, 3, 4, 5, 6, 7, 8)
"""Micro-batch sizes tried (with a pinned global batch, only those that divide the batch per replica)."""
DEFAULT_LAYOUT = "default"
"""Pins.pp_layout that keeps megatron's own layer split (no pipeline layout)."""

MIN_TOKENS_PER_CP_RANK = 1024
"""Context parallelism is tried while every rank keeps at least this many tokens of the sequence."""


@dataclass(frozen=True, slots=True)
class Pins:
    """Degrees and choices the user fixed on the command line; None = search over it."""

    framework: str | None = None
    tp: int | None = None
    pp: int | None = None
    vp: int | None = None
    cp: int | None = None
    ep: int | None = None
    mbs: int | None = None
    gbs: int | None = None
    seq_length: int | None = None
    packed_doc_tokens: int | None = None
    """Sequences packed from documents of this mean length (ParallelPlan.packed_doc_tokens); None: one per sequence."""
    zero_stage: int | None = None
    recompute: str | None = None
    precision: str = "bf16"
    layer_spec: str = "te"
    offload: bool | None = None
    pp_first_stage_layers: int | None = None
    pp_last_stage_layers: int | None = None
    tp_comm_overlap: bool | None = None
    """None: on wherever TP > 1 with Transformer Engine."""
    moe_ep_overlap: bool = False
    """MoE: megatron's EP all-to-all overlap (--overlap-moe-expert-parallel-comm); opt-in, where the rules allow it
    (expert parallelism, no full recompute, pp 1 or interleaved)."""
    moe_dispatcher: str = "alltoall"
    """MoE token dispatcher (specs.MOE_DISPATCHERS): megatron's all-to-all by default; DeepEP or HybridEP (megatron's
    flex dispatcher) when asked for, as they need their own libraries (NVSHMEM, GPUDirect RDMA) on the cluster."""
    cuda_graph_impl: str = "none"
    """megatron --cuda-graph-impl (none | transformer_engine | local); opt-in, never searched."""
    cuda_graph_scope: tuple[str, ...] = ()
    """megatron --cuda-graph-scope with it."""
    fp8_recipe: str | None = None
    grad_dtype: str | None = None
    """None: the framework's default (fp32 for megatron's bf16/FP8 training)."""
    fp8_param_gather: bool | None = None
    """None: on for FP8/FP4 megatron plans with a sharded optimizer (as NeMo's FP8 recipes set it), off otherwise."""
    recompute_layers: int | None = None
    recompute_modules: tuple[str, ...] = ()
    """With selective recompute: the modules repeated (ParallelPlan.recompute_modules); () = core attention."""
    offload_activation_layers: int | None = None
    """None: 0, or just enough layers to make a plan fit where the host link allows it."""
    etp: int | None = None
    """Expert tensor parallelism; None: tried as megatron's default (tp) and as 1 (whole experts)."""
    precision_aware_optimizer: bool | None = None
    """None: off, or on where it is what makes a plan fit."""
    adam_moments_dtype: str = "fp32"
    """ParallelPlan.adam_moments_dtype: bf16 turns the precision-aware optimizer on with it."""
    fused_kernels: bool = False
    """local spec: megatron's fused softmax and element-wise kernels were built (ParallelPlan.fused_kernels)."""
    grad_accum_fusion: bool = True
    """megatron: weight gradients accumulate into main_grad inside their GEMMs (ParallelPlan.grad_accum_fusion)."""
    checkpoint_early_stop: bool = True
    """DeepSpeed / FSDP: full recompute stops at each layer's last saved tensor (ParallelPlan.checkpoint_early_stop)."""
    expandable_segments: bool = True
    """False: price PyTorch's classic caching allocator (the run does not set expandable segments)."""
    attention_kernel: str = "auto"
    """DeepSpeed/FSDP plans: the flash-attention kernel their layers run (ParallelPlan.attention_kernel)."""
    fused_loss: bool | None = None
    """DeepSpeed/FSDP plans: the fused cross entropy over the 16-bit logits (ParallelPlan.fused_loss). None: off, or
    on where it is what makes a plan fit (it costs no time: genconf's runners then fuse the loss)."""
    megatron_fsdp: bool = False
    """Search Megatron-FSDP (megatron zero 3) beside the distributed optimizer. Off by default: search() turns it
    on only when no other megatron plan fits (or when --zero pins the stage)."""
    lora_rank: int = 0
    """LoRA fine-tuning with adapters of this rank (ParallelPlan.lora_rank); 0: full-parameter training."""
    lora_targets: tuple[str, ...] = LORA_TARGETS
    """The linear layers LoRA adapts (ParallelPlan.lora_targets)."""
    bf16_layers: tuple[int, int] | None = None
    """(first, last) layers kept in BF16 under an FP8/FP4 recipe (ParallelPlan.bf16_layers_start / _end). None: the
    recipe's default (genconf.plan.precision.bf16_edge_default) on megatron's TE layers."""
    pp_layout: str | None = None
    """None: megatron's own splits, and a layout moving layers off the slowest pipeline rank where that is faster
    (genconf.plan.cost.balanced_layout). DEFAULT_LAYOUT: megatron's own splits only. Else a megatron layout
    string, used as given (vp = its virtual stages / pp)."""

    def degrees_pinned(self) -> bool:
        return None not in (self.framework, self.tp, self.pp, self.mbs, self.zero_stage, self.recompute)


@dataclass(frozen=True, slots=True)
class Evaluation:
    plan: ParallelPlan
    violations: tuple[rules.Violation, ...]
    memory: MemoryEstimate | None = None
    cost: StepCost | None = None

    @property
    def errors(self) -> tuple[rules.Violation, ...]:
        return tuple(v for v in self.violations if v.severity == rules.ERROR)

    @property
    def ok(self) -> bool:
        return not self.errors and self.memory is not None and self.cost is not None

    @property
    def overflow_ratio(self) -> float:
        if self.memory is None:
            return float("inf")
        return self.memory.peak.total_bytes / self.memory.capacity_bytes


@dataclass(frozen=True, slots=True)
class SearchResult:
    ranked: tuple[Evaluation, ...]
    """Feasible plans, best first, one per layout."""
    considered: int
    rejected: dict[str, int] = field(default_factory=dict)
    """Rejected candidates per rule (the first rule each broke)."""
    nearest_misses: tuple[Evaluation, ...] = ()
    fastest: Evaluation | None = None
    """The fastest feasible plan, when one within TIE_FRACTION that is surer to fit or simpler was ranked first."""
    split_tokens_per_s: dict[ParallelPlan, float] = field(default_factory=dict)
    """For each plan the search gave a pipeline layout: the tokens/s of the same plan with megatron's own split."""
    tie_break: str = ""
    """Where `fastest` is set: what put the first plan ahead of it (tie_break)."""
    runner_up_tie_break: str = ""
    """Where the runner-up is within TIE_FRACTION of the first plan: what put the first ahead of it (tie_break, or
    that speed decided between two plans as simple and as sure to fit); "" where the runner-up is no tie."""
    alternatives: tuple[Evaluation, ...] = ()
    """The best plan of each other layout, best first (the runner-up is the first): layouts apart from their
    pipeline schedule (_schedule_free_key), so that no alternative is the first plan with another interleaving."""
    past_headroom: Evaluation | None = None
    """The fastest candidate that fits the GPU but not the headroom (memory.HEADROOM_FRACTION, kept free for the
    estimate's own error), its cost priced, where it is faster than the first plan by more than TIE_FRACTION (or
    nothing fits at all): the plan a user may pin whole to take, warned (rules.memory_violation). None otherwise, and
    where every degree was pinned (the search then keeps such a plan itself)."""
    past_headroom_flags: str = ""
    """The flags that, beside the user's own, pin past_headroom whole (pin_whole_flags)."""

    @property
    def best(self) -> Evaluation | None:
        return self.ranked[0] if self.ranked else None


def evaluate(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, num_gpus: int, cal: Calibration,
             *, check_rules: bool = True, pinned: bool = False, violations: list[rules.Violation] | None = None,
             estimate: MemoryEstimate | None = None, priced: dict | None = None) -> Evaluation:
    """Rules, then memory, then cost. With check_rules=False (benchmarks of published runs) only the
    layer split must be valid. pinned: the user fixed every degree (a plan between the headroom and the
    GPU's capacity is kept, with a warning). violations, estimate: the plan's rules.check and mem.estimate where the
    caller has them already. priced: where given, step_cost keeps the plan's stage times there."""
    ctx = rules.Context(model, cluster, plan, num_gpus)
    if violations is None:
        violations = rules.check(ctx) if check_rules else []
    if check_rules and any(v.severity == rules.ERROR for v in violations):
        return Evaluation(plan, tuple(violations))
    if estimate is None:
        estimate = mem.estimate(model, plan, cluster)
    too_big = rules.memory_violation(ctx, estimate, pinned=pinned) if check_rules else None
    if too_big is not None and too_big.severity == rules.WARNING:
        violations, too_big = list(violations) + [too_big], None
    if too_big is not None:
        return Evaluation(plan, tuple(violations) + (too_big,), estimate)
    return Evaluation(plan, tuple(violations), estimate, step_cost(model, plan, cluster, cal, priced=priced))


@functools.lru_cache(maxsize=4096)
def divisors(n: int) -> tuple[int, ...]:
    """Divisors of n, ascending (genconf.plan.limits.divisors, O(sqrt n)), cached: the search asks for few;
    none for n < 1 (an empty remainder of GPUs)."""
    return tuple(limits.divisors(n)) if n >= 1 else ()


def _divisors(n: int) -> list[int]:
    return list(divisors(n))


def _given_layout(pins: Pins) -> str | None:
    """The layout string the user pinned, or None (searched, or megatron's own split)."""
    return None if pins.pp_layout in (None, DEFAULT_LAYOUT) else pins.pp_layout


def _split_options(num_layers: int, pp: int) -> list[dict]:
    """Ways to split the layers over pp stages: evenly; counting embedding and loss as layers
    (--account-for-embedding/loss-in-pipeline-split); or explicit first/last stage counts (the ends carry the
    embedding and the logits, so they get fewer; --decoder-first/last-pipeline-num-layers)."""
    if pp == 1:
        return [{}]
    options = [{}] if num_layers % pp == 0 else []
    if num_layers % pp and (num_layers + 1) % pp == 0 and (num_layers + 1) // pp >= 2:
        # The loss alone as a layer (--account-for-loss-in-pipeline-split): the last rank holds one layer fewer.
        options.append({"pp_loss_as_layer": True})
    if num_layers % pp and (num_layers + 2) % pp == 0 and (num_layers + 2) // pp >= 2:
        options.append({"pp_embedding_as_layer": True, "pp_loss_as_layer": True})
    if num_layers % pp:
        if pp > 2:
            share = num_layers / pp
            ends = [x for x in range(1, num_layers) if (num_layers - 2 * x) > 0 and (num_layers - 2 * x) % (pp - 2) == 0]
            if ends:
                x = min(ends, key=lambda x: (abs(x - (share - 0.5)), x))
                options.append({"pp_first_stage_layers": x, "pp_last_stage_layers": x})
        elif pp == 2 and num_layers >= 2:  # one layer cannot be split over two stages (a 0-layer stage)
            half = num_layers // 2
            options.append({"pp_first_stage_layers": half, "pp_last_stage_layers": num_layers - half})
    return options


def even_layout(num_layers: int, pp: int, vp: int, mtp: int = 0) -> str | None:
    """A pipeline layout (megatron --pipeline-model-parallel-layout) of num_layers over pp ranks x vp virtual stages
    as even as whole layers allow, for a pipeline no --decoder-first/last-pipeline-num-layers split fits: the
    remainder on the middle ranks first (the first rank also embeds, the last also computes the loss), each rank's on
    its earliest virtual stages (cost.layout_of_counts), the MTP layers beside the loss. None where a virtual stage
    would hold no layer."""
    base, extra = divmod(num_layers, pp)
    if base < vp:
        return None
    counts = [base] * pp
    for rank in sorted(range(pp), key=lambda r: (r in (0, pp - 1), r))[:extra]:
        counts[rank] += 1
    return layout_of_counts(counts, vp, mtp)


def _vp_options(num_layers: int, pp: int, split: dict) -> list[int]:
    """Every virtual-stage count the split allows: the layer slots per pipeline rank divide by vp
    (megatron-core: num_layers (+ embedding/loss) divisible by pp x vp; explicit end stages by vp too)."""
    if pp == 1:
        return [1]
    if split.get("pp_layout"):
        return [layout_vp(split["pp_layout"], pp)]
    first, last = split.get("pp_first_stage_layers"), split.get("pp_last_stage_layers")
    if first is not None or last is not None:
        middle = (num_layers - (first or 0) - (last or 0)) // max(1, pp - (first is not None) - (last is not None))
        parts = [x for x in (first, last, middle) if x]
        return [v for v in divisors(math.gcd(*parts))] if parts else [1]
    slots = num_layers + int(split.get("pp_embedding_as_layer", False)) + int(split.get("pp_loss_as_layer", False))
    return [v for v in divisors(slots // pp) if slots % (pp * v) == 0]


def _gbs_for(pins: Pins, target: BatchDefault, unit: int, microbatch_sequences: int) -> int:
    if pins.gbs is not None:
        return pins.gbs
    return global_batch_for(target, unit, microbatch_sequences=microbatch_sequences)


def _cp_options(pins: Pins, seq: int) -> list[int]:
    if pins.cp:
        return [pins.cp]
    out, c = [1], 2
    while seq % (2 * c) == 0 and seq // c >= MIN_TOKENS_PER_CP_RANK:
        out.append(c)
        c *= 2
    return out


@hash_once
@dataclass(frozen=True, slots=True)
class _Layout(HashOnce):
    framework: str
    tp: int
    cp: int
    pp: int
    dp: int
    ep: int
    vp: int
    split: tuple[tuple[str, object], ...]
    zero: int
    shard_group: int | None
    etp: int | None = None


def _layouts(model: ModelSpec, cluster: ClusterSpec, num_gpus: int, pins: Pins, seq: int):
    """(layout, reason or None): every layout shape the search considers, before micro-batch and recompute."""
    # LoRA is priced as Megatron-Bridge runs it (rules.lora_conflict): megatron plans only.
    # So are MLA, shared experts, dense first layers and MTP (rules.architecture_conflict).
    megatron_only = pins.lora_rank or rules.architecture_conflict(model, "deepspeed")
    frameworks = [pins.framework] if pins.framework else ["megatron"] if megatron_only else ["megatron", "deepspeed", "fsdp"]
    domain = cluster.nvlink_domain
    for framework in frameworks:
        if framework == "megatron":
            tps = [pins.tp] if pins.tp else [t for t in divisors(domain) if model.num_attention_heads % t == 0
                                               and model.num_query_groups % t == 0 and (not model.is_hybrid or (
                                                   model.mamba_num_heads % t == 0 and model.mamba_num_groups % t == 0))]
            cps = _cp_options(pins, seq)
        else:
            tps, cps = [pins.tp or 1], [pins.cp or 1]
        for tp in tps:
            for cp in cps:
                if num_gpus % (tp * cp):
                    if pins.tp and pins.cp:  # let the rules say why
                        yield _Layout(framework, tp, cp, pins.pp or 1, 1, pins.ep or 1, pins.vp or 1, (), pins.zero_stage or 0, None)
                    continue
                rest = num_gpus // (tp * cp)
                pps = [pins.pp] if pins.pp else ([p for p in divisors(rest) if p <= model.num_layers + 2]
                                                if framework == "megatron" else [1])
                given = _given_layout(pins)
                if given is not None and not pins.pp:
                    pps = [p for p in pps if p > 1 and len(parse_layout(given)) % p == 0] or pps
                for pp in pps:
                    dp = max(1, rest // pp)
                    etps = ([pins.etp] if pins.etp else ([None, 1] if tp > 1 else [None])) if model.is_moe or pins.etp else [None]
                    eps = [pins.ep] if pins.ep else ([e for e in divisors(model.num_experts) if (tp * dp * cp) % e == 0]
                                                     if model.is_moe and framework == "megatron" else [1])
                    if given is not None:
                        splits = [{"pp_layout": given}]
                    elif pins.pp_first_stage_layers or pins.pp_last_stage_layers:
                        splits = [{k: v for k, v in (("pp_first_stage_layers", pins.pp_first_stage_layers),
                                                     ("pp_last_stage_layers", pins.pp_last_stage_layers)) if v}]
                    else:
                        splits = _split_options(model.num_layers, pp)
                        if model.is_hybrid:  # MambaStack: an even split or first/last stage layers (rules.hybrid_conflict)
                            splits = [x for x in splits if not x.get("pp_embedding_as_layer")]
                        elif framework == "megatron" and pp > 1 and pins.pp_layout != DEFAULT_LAYOUT:
                            # No split megatron's flags can write for this pipeline (61 layers over 16 ranks, or
                            # over 4 x 4 virtual stages): a layout string can (Megatron-Bridge's DeepSeek-V3 recipes).
                            wanted = [pins.vp] if pins.vp else [1]
                            for vp in wanted:
                                if not any(vp in _vp_options(model.num_layers, pp, x) for x in splits):
                                    layout = even_layout(model.num_layers, pp, vp, model.mtp_num_layers)
                                    if layout is not None:
                                        splits.append({"pp_layout": layout})
                        splits = splits or [{}]
                    for split in splits:
                        # A pinned --vp that disagrees with a layout's stages is for the rules to name (pipeline_split).
                        vps = [pins.vp] if pins.vp else [1] if model.is_hybrid else _vp_options(model.num_layers, pp, split)
                        if framework == "megatron":
                            # The distributed optimizer moves the same bytes as DDP's all-reduce (reduce-scatter +
                            # all-gather) and holds less: DDP (0) only where there is nothing to shard over (there the
                            # distributed optimizer still enables FP8 parameters and the precision-aware optimizer).
                            # Megatron-FSDP (zero 2/3) is opt-in: typed with --zero, or searched when nothing
                            # else fits (search's second pass): an experimental sharding mode is never the default.
                            zeros = ([pins.zero_stage] if pins.zero_stage is not None
                                     else [0, 1] if dp * cp == 1
                                     else ([1, 3] if pp == 1 and pins.megatron_fsdp else [1]))
                        else:
                            zeros = ([pins.zero_stage] if pins.zero_stage is not None
                                     else ([1, 2, 3, 0] if framework == "deepspeed" else [3, 2, 0]))
                        for vp in vps:
                            for ep, etp in itertools.product(eps, etps):
                                if (tp * cp * dp) % (ep * (etp or tp)):
                                    continue
                                for zero in zeros:
                                    if zero and dp * cp == 1 and pins.zero_stage is None and framework != "megatron":
                                        continue  # nothing to shard over
                                    groups = [None]
                                    if framework == "fsdp" and zero == 3 and dp > cluster.gpus_per_node:
                                        groups.append(cluster.gpus_per_node)
                                    for group in groups:
                                        yield _Layout(framework, tp, cp, pp, dp, ep, vp, tuple(split.items()), zero, group,
                                                      etp)


def _bf16_edges(pins: Pins, framework: str, layers: int, pp: int) -> tuple[int, int]:
    """The plan's BF16 end layers: as pinned, else the precision recipe's default (fp8-current: one at each end) for
    megatron's Transformer Engine layers, at most what megatron-core allows (the layers per pipeline stage)."""
    if pins.bf16_layers is not None:
        return pins.bf16_layers
    if framework != "megatron" or pins.layer_spec != "te":
        return (0, 0)
    k = min(bf16_edge_default(pins.precision, pins.fp8_recipe), layers // max(1, pp))
    return (k, k)


def _plan(layout: _Layout, pins: Pins, seq: int, *, mbs: int, gbs: int, recompute: str, layers: int) -> ParallelPlan:
    framework, tp = layout.framework, layout.tp
    megatron = framework == "megatron"
    quant = pins.precision in ("fp8", "fp4")
    bf16_start, bf16_end = _bf16_edges(pins, framework, layers, layout.pp)
    offload = bool(pins.offload)
    fp8_param_gather = pins.fp8_param_gather
    if fp8_param_gather is None:
        fp8_param_gather = (megatron and quant and layout.zero >= 1 and pins.layer_spec == "te"
                            and (pins.fp8_recipe or "current") != "blockwise")
    overlap = pins.tp_comm_overlap
    if overlap is None:
        overlap = megatron and tp > 1 and pins.layer_spec == "te"
    return ParallelPlan(
        framework=framework, tp=tp, pp=layout.pp, vp=layout.vp, cp=layout.cp, ep=layout.ep, etp=layout.etp,
        dp=layout.dp, mbs=mbs,
        gbs=gbs, seq_length=seq, zero_stage=layout.zero, shard_group_size=layout.shard_group, recompute=recompute,
        # No document is longer than its sequence (what_would_fit tries shorter sequences with the same pins).
        packed_doc_tokens=None if pins.packed_doc_tokens is None else min(pins.packed_doc_tokens, seq),
        recompute_layers=pins.recompute_layers if recompute == "full" else None,
        recompute_modules=pins.recompute_modules if recompute == "selective" else (),
        sequence_parallel=megatron and tp > 1, precision=pins.precision,
        fp8_recipe=pins.fp8_recipe if pins.precision == "fp8" else None, fp8_param_gather=fp8_param_gather,
        grad_dtype=pins.grad_dtype, layer_spec=pins.layer_spec, tp_comm_overlap=overlap,
        moe_ep_overlap=pins.moe_ep_overlap,  # the rules keep it to megatron MoE plans with EP
        moe_dispatcher=pins.moe_dispatcher,  # likewise
        cuda_graph_impl=pins.cuda_graph_impl, cuda_graph_scope=pins.cuda_graph_scope,
        precision_aware_optimizer=megatron and layout.zero >= 1 and (
            pins.adam_moments_dtype == "bf16" if pins.precision_aware_optimizer is None else pins.precision_aware_optimizer),
        adam_moments_dtype=pins.adam_moments_dtype,
        offload_optimizer=offload and framework == "deepspeed",
        offload_params=offload and framework == "deepspeed" and layout.zero == 3,
        offload_activation_layers=pins.offload_activation_layers or 0,
        fused_kernels=pins.fused_kernels and pins.layer_spec == "local", expandable_segments=pins.expandable_segments,
        grad_accum_fusion=pins.grad_accum_fusion, checkpoint_early_stop=pins.checkpoint_early_stop,
        fused_loss=bool(pins.fused_loss) and not megatron,
        attention_kernel="auto" if megatron else pins.attention_kernel, lora_rank=pins.lora_rank,
        lora_targets=pins.lora_targets, bf16_layers_start=bf16_start, bf16_layers_end=bf16_end,
        **dict(layout.split))


def _specs(model: ModelSpec, cluster: ClusterSpec, num_gpus: int, pins: Pins):
    """(layout, mbs, gbs, recompute) of every base plan the search considers, or (layout, BATCH_TOO_LARGE)."""
    seq = pins.seq_length or model.seq_length
    target = default_batch(exact_param_count(model), seq)  # the default global batch, from the model's size
    recomputes_all = [pins.recompute] if pins.recompute else ["none", "selective", "full"]
    for layout in _layouts(model, cluster, num_gpus, pins, seq):
        recomputes = [r for r in recomputes_all if r != "selective" or layout.framework == "megatron" or pins.recompute]
        if pins.mbs:
            mbss = [pins.mbs]
        elif layout.cp > 1:
            mbss = [1]  # context parallelism is for sequences too long for one GPU: never paired with mbs > 1
        elif pins.gbs is not None:
            local = pins.gbs // max(1, layout.dp)
            mbss = [m for m in MICRO_BATCHES if local % m == 0] or [1]
        else:
            mbss = [1, 2, 4, 8]
        for mbs in mbss:
            unit = mbs * layout.dp * (layout.pp if layout.vp > 1 else 1)
            gbs = _gbs_for(pins, target, unit, mbs * layout.dp)
            if pins.gbs is None and gbs * seq > MAX_BATCH_GROWTH * max(target.tokens_per_step, seq):
                if mbs == mbss[0] and not pins.mbs:
                    yield layout, BATCH_TOO_LARGE, 0, ""
                break  # would buy speed with a bigger batch than training wants
            if pins.mbs is None and gbs < mbs * layout.dp:
                break
            for recompute in recomputes:
                yield layout, mbs, gbs, recompute


def candidates(model: ModelSpec, cluster: ClusterSpec, num_gpus: int, pins: Pins):
    """Every base plan the search considers (rules decide later which are valid), smallest micro-batch and
    cheapest recompute first within a layout."""
    seq = pins.seq_length or model.seq_length
    for layout, mbs, gbs, recompute in _specs(model, cluster, num_gpus, pins):
        if mbs == BATCH_TOO_LARGE:
            yield layout, BATCH_TOO_LARGE
        else:
            yield layout, _plan(layout, pins, seq, mbs=mbs, gbs=gbs, recompute=recompute, layers=model.num_layers)


def _optimistic_tokens_per_s(model: ModelSpec, cluster: ClusterSpec, cal: Calibration, pins: Pins, seq: int,
                             layout: _Layout, mbs: int, gbs: int, recompute: str, memo: dict | None = None) -> float:
    """An upper bound on a candidate's tokens/s from its layer time alone (no communication, no optimizer):
    (m + (p-1)/v) x layers per stage x (forward + backward [+ recompute]). Candidates whose bound cannot reach
    the ranking are never evaluated in full. memo: where given, each layer time is kept there for the candidates
    that share it (one search: the model, cluster, calibration, pins and sequence are the same)."""
    key = (layout.framework, layout.tp, layout.cp, layout.ep, layout.etp, layout.zero, mbs, recompute)
    if memo is not None and key in memo:
        per_layer = memo[key]
    else:
        per_layer = _optimistic_layer_s(model, cluster, cal, pins, seq, layout, mbs, recompute)
        if memo is not None:
            memo[key] = per_layer
    if per_layer is None:
        return math.inf  # the GPU cannot run this precision, or the shape is invalid: the rules will say why
    layers = -(-model.num_layers // layout.pp)
    dict_split = dict(layout.split)
    if dict_split.get("pp_first_stage_layers") or dict_split.get("pp_last_stage_layers"):
        layers = max(layers, (model.num_layers - (dict_split.get("pp_first_stage_layers") or 0)
                              - (dict_split.get("pp_last_stage_layers") or 0)) // max(1, layout.pp - 2))
    m = max(1, gbs // (mbs * layout.dp))
    step = (m + (layout.pp - 1) / layout.vp) * layers * per_layer
    return gbs * seq / step / num_gpus_of(layout)


def _optimistic_layer_s(model: ModelSpec, cluster: ClusterSpec, cal: Calibration, pins: Pins, seq: int,
                        layout: _Layout, mbs: int, recompute: str) -> float | None:
    """_optimistic_tokens_per_s's time of one layer (forward + backward [+ recompute], and the exposed TP, EP and CP
    communication), from the layout's framework, tp, cp, ep, etp and ZeRO stage, the micro-batch and the recompute
    alone; None where it cannot be priced. The mean layer as step_cost prices a rank's layers (cost._mixed_layer:
    a hybrid model's kinds, sliding-window layers, an MoE model's dense layers), with the TP overlap _plan will set;
    the host's launch time is left out (it only adds), and with EP overlap every chunk's all-to-all is taken as
    paired with another's compute (cost.ep_unpaired_share: the unpaired share only adds)."""
    megatron = layout.framework == "megatron"
    quant = "nvfp4" if pins.precision == "fp4" else ((pins.fp8_recipe or "current") if pins.precision == "fp8" else None)
    overlap = pins.tp_comm_overlap
    if overlap is None:
        overlap = megatron and layout.tp > 1 and pins.layer_spec == "te"  # as _plan sets it
    impl = _implementation_of(layout.framework, pins.layer_spec, pins.fused_kernels, layout.zero)
    # (model, kind, windowed, share of the layers): as cost._mixed_layer weighs them.
    if model.is_hybrid:
        kinds = [(model, k, False, model.layers_of_kind(k) / model.num_layers) for k in HYBRID_LAYER_KINDS
                 if model.layers_of_kind(k)]
    else:
        win = model.windowed_layer_fraction if model.sliding_window else 0.0
        dense = model.dense_layers / model.num_layers if model.is_moe and model.dense_layers else 0.0
        kinds = [(model, "", False, (1 - win) * (1 - dense)), (model, "", True, win * (1 - dense))]
        if dense:
            kinds.append((dense_layer_model(model), "", False, dense))
    per_layer = 0.0
    for spec, kind, windowed, share in kinds:
        if not share:
            continue
        try:
            lt = _layer_time(spec, layout.tp, layout.cp, layout.ep, mbs, seq, megatron and layout.tp > 1, pins.precision,
                             quant, impl, overlap, cluster, cal, windowed, layout.etp,
                             0.0 if pins.moe_ep_overlap else None, attention="auto" if megatron else pins.attention_kernel,
                             lora=pins.lora_rank if megatron else 0, lora_targets=pins.lora_targets,
                             dispatcher=pins.moe_dispatcher, kind=kind, doc_tokens=pins.packed_doc_tokens,
                             early_stop=not megatron and not pins.fused_kernels)
        except (ValueError, ZeroDivisionError):
            return None
        # Selective at its cheapest: the modules pinned, else the default core attention or the one module the
        # memory savers may put in its place (_savers' module recompute starts from one of
        # model.extra_recompute_modules, without core attention).
        selective = (lt.recompute_s(pins.recompute_modules) if pins.recompute_modules else
                     min(lt.recompute_s((module,)) for module in ("core_attn", *model.extra_recompute_modules)))
        # Full recompute at its cheapest: PyTorch's early stop where a torch stack may run it (a bound).
        full = lt.fwd_s - lt.early_stop_skip_s
        per_layer += share * (lt.fwd_s + lt.bwd_s + lt.tp_comm_s + lt.cp_comm_s
                              + {"none": 0.0, "selective": selective}.get(recompute, full))
    return per_layer


@functools.lru_cache(maxsize=64)
def _implementation_of(framework: str, layer_spec: str, fused_kernels: bool, zero_stage: int) -> str:
    """How a framework's layers run (genconf.plan.cost.implementation), without building a plan per candidate."""
    return implementation(ParallelPlan(framework=framework, layer_spec=layer_spec, torch_compile=False,
                                       fused_kernels=fused_kernels and layer_spec == "local", zero_stage=zero_stage))


def num_gpus_of(layout: _Layout) -> int:
    return layout.tp * layout.cp * layout.pp * layout.dp


@functools.lru_cache(maxsize=4096)
def _states_floor_bytes(model: ModelSpec, layout: _Layout, precision: str, offload: bool, lora: bool = False,
                        bf16_moments: bool = False) -> float:
    """A lower bound on one GPU's parameters + gradients + optimizer states for the layout, whatever the
    micro-batch, recompute or memory savers: the average stage's share, 16-bit (or FP8) weights and gradients,
    10 bytes of optimizer state per parameter (6 with BF16 Adam moments: remainders + 2 + 2), each sharded as far
    as the layout shards it. LoRA: the frozen weights alone (the adapters' states are a fraction of a percent)."""
    per_rank = exact_param_count(model) / (layout.tp * layout.pp * (layout.ep if model.is_moe else 1))
    shard = max(1, layout.dp * layout.cp)
    weights = 1.0 if precision in ("fp8", "fp4") else 2.0
    if offload:
        return weights * per_rank / (shard if layout.zero >= 3 else 1)
    fsdp = layout.framework == "fsdp"
    if fsdp:
        weights = 4.0  # fp32 parameters
    if lora:
        return weights * per_rank
    params = weights * per_rank / (shard if layout.zero >= (2 if fsdp else 3) else 1)
    if fsdp and layout.zero == 2:
        # SHARD_GRAD_OP shards its fp32 parameters and keeps the gathered compute copy (memory.py's FSDP branch).
        params += (4.0 if precision == "fp32" else 2.0) * per_rank
    grads = 2.0 * per_rank / (shard if layout.zero >= 2 else 1)
    optimizer = (6.0 if bf16_moments else 10.0) * per_rank / (shard if layout.zero >= 1 else 1)
    return params + grads + optimizer


# --- memory savers ----------------------------------------------------------------------------------

def _savers(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, pins: Pins,
            estimate: MemoryEstimate) -> list[tuple[ParallelPlan, MemoryEstimate | None]]:
    """For a plan that does not fit: the same plan with the framework's memory savers added one after another,
    cheapest first, until it fits (each sized to the excess): the precision-aware optimizer (16-bit master
    remainders: bit-exact, 2 bytes/param), for selective plans megatron's module recompute one module at a time,
    block recompute of just enough layers, activation offload of just enough layers; a saver that frees nothing is
    skipped. DeepSpeed/FSDP plans have one: the fused cross entropy (no fp32 copies of the logits), returned
    for the caller to evaluate. Returns [] when even all of them do not fit. Gradients in bf16 change the numerics,
    so they are the user's choice (--grad-dtype bf16), never a saver the search adds. Each variant comes with its
    memory estimate (None: not made here)."""
    if estimate.peak.total_bytes <= estimate.usable_bytes:
        return []
    current = plan
    ladder = []
    if plan.framework != "megatron":
        # DeepSpeed/FSDP: the fused cross entropy drops the logits' fp32 copies (no time lost); nothing else here.
        return [(plan.replace(fused_loss=True), None)] if pins.fused_loss is None and not plan.fused_loss else []
    if pins.precision_aware_optimizer is None and current.zero_stage >= 1 and \
            current.remainders_possible:
        ladder.append(lambda m, p, est: p.replace(precision_aware_optimizer=True))
    if current.recompute == "selective" and not pins.recompute_modules and current.layer_spec == "te":
        # megatron-core's module recompute, cheapest first (the modules NVIDIA's MoE recipes list, Megatron-Bridge:
        # DeepSeek-V3 mla_up_proj, GPT-OSS layernorm + moe_act; then the dense MLP).
        ladder += [functools.partial(_module_recompute, module=m) for m in model.extra_recompute_modules]
    # A hybrid Mamba model gets neither block recompute nor activation offload: megatron-core's MambaStack has no full
    # recompute and genconf plans no offload for it (rules.hybrid_conflict), so the variant would only be refused.
    if current.recompute == "none" and pins.recompute is None and pins.recompute_layers is None \
            and not model.is_hybrid:
        ladder.append(_block_recompute)
    if current.pp == 1 and current.layer_spec == "te" and pins.offload_activation_layers is None \
            and current.recompute == "none" and not model.is_hybrid:
        ladder.append(_activation_offload)
    est = estimate
    for step in ladder:
        nxt = step(model, current, est)
        if nxt is None:
            continue
        nxt_est = mem.estimate(model, nxt, cluster)
        if nxt_est.peak.total_bytes >= est.peak.total_bytes:
            continue  # frees nothing here (layernorm recompute under FP8): not worth its time
        current, est = nxt, nxt_est
        if est.fits:
            return [_without_spare_optimizer_saver(model, cluster, plan, current, est)]
    return []


def _without_spare_optimizer_saver(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, saved: ParallelPlan,
                                   saved_estimate: MemoryEstimate) -> tuple[ParallelPlan, MemoryEstimate]:
    """`saved` without the precision-aware optimizer the ladder added first, where the savers added after it
    (module or block recompute, activation offload) make the plan fit on their own: a saver no longer needed is
    one more thing for the user to carry, and "why this plan" would say it is what makes the plan fit.
    Returned with its memory estimate."""
    if plan.precision_aware_optimizer or not saved.precision_aware_optimizer:
        return saved, saved_estimate
    trial = saved.replace(precision_aware_optimizer=False)
    if trial == plan:  # (saved is plan with the optimizer alone)
        return saved, saved_estimate
    peak = saved_estimate.peak
    if peak.total_bytes + peak.optimizer_bytes / 5 > saved_estimate.usable_bytes:
        return saved, saved_estimate  # 12 bytes a parameter instead of 10 would not fit (the step's buffers aside)
    trial_estimate = mem.estimate(model, trial, cluster)
    return (trial, trial_estimate) if trial_estimate.fits else (saved, saved_estimate)


def _module_recompute(model: ModelSpec, plan: ParallelPlan, est: MemoryEstimate, *, module: str) -> ParallelPlan:
    """Selective recompute with `module` added to the modules repeated. Core attention, the default, is dropped
    from the list: with Transformer Engine's flash attention repeating it frees nothing."""
    return plan.replace(recompute_modules=(*plan.recompute_modules, module))


def _block_recompute(model: ModelSpec, plan: ParallelPlan, est: MemoryEstimate) -> ParallelPlan | None:
    """Block recompute: each recomputed layer of a chunk frees (full - input-only) activations in every in-flight
    chunk of the busiest stage; recompute just enough of them."""
    excess = est.peak.total_bytes - est.usable_bytes
    stage = est.peak.stage
    chunks = mem.inflight_chunks(plan, stage)
    saving = (mem.layer_activation_bytes(model, plan, recompute="none")
              - mem.layer_activation_bytes(model, plan, recompute="full")) * chunks
    per_chunk = mem.stage_layers(model.num_layers, plan)[stage] // plan.vp
    if saving <= 0:
        return None
    k = math.ceil(excess * 1.05 / saving)
    if mem.dense_layer_mix(model, plan, stage)[0]:
        # An MoE model's dense layers among each chunk's first k free a dense layer's bytes (mean over the chunks,
        # as stage_memory prices them): recompute more layers while they free less than the excess.
        dense_saving = (mem.layer_activation_bytes(model, plan, recompute="none", dense=True)
                        - mem.layer_activation_bytes(model, plan, recompute="full", dense=True)) * chunks
        while 0 < k < per_chunk:
            _, dense, moe, _ = mem.dense_layer_mix(model, plan, stage, recompute_layers=k)
            if (dense * dense_saving + moe * saving) / plan.vp >= excess * 1.05:
                break
            k += 1
    return plan.replace(recompute="full", recompute_layers=k) if 0 < k < per_chunk else None


def _activation_offload(model: ModelSpec, plan: ParallelPlan, est: MemoryEstimate) -> ParallelPlan | None:
    """Activation offload: the offloaded layers' activations leave the GPU; offload just enough of them."""
    excess = est.peak.total_bytes - est.usable_bytes
    per_layer = mem.offload_bytes_per_layer(model, plan)
    if per_layer <= 0:
        return None
    need = (excess + 2 * per_layer) * 1.05
    k = math.ceil(need / per_layer)
    # An MoE model's dense layers among the first k offload a dense layer's bytes, a hybrid model's layers their own
    # kind's: offload more while short.
    while 0 < k < model.num_layers and mem.offloaded_activation_bytes(model, plan, k) < need:
        k += 1
    return plan.replace(offload_activation_layers=k) if 0 < k < model.num_layers else None


_RECOMPUTE_MEMORY = {"full": 0, "selective": 1, "none": 2}
"""Activation memory order of the recompute settings (more recompute, less memory)."""


def _lean_plan(model: ModelSpec, layout: _Layout, pins: Pins, seq: int, *, runnable: bool = False) -> ParallelPlan:
    """The layout's plan that needs the least memory among those the pins allow: the smallest micro-batch, the
    fewest virtual stages (fewest micro-batches in flight), full recompute. runnable: the leanest recompute the
    model's rules accept instead, selective recompute of every module for a hybrid Mamba model (megatron-core's
    MambaStack has no full recompute), so that the plan can be estimated and named (the bound _core_too_big
    takes stays full recompute's)."""
    vps = [pins.vp] if pins.vp else _vp_options(model.num_layers, layout.pp, dict(layout.split))
    lean = replace(layout, vp=min(vps))
    mbs = pins.mbs or 1
    gbs = pins.gbs if pins.gbs is not None else mbs * layout.dp * layout.pp
    leanest = "selective" if runnable and model.is_hybrid and layout.framework == "megatron" else "full"
    plan = _plan(lean, pins, seq, mbs=mbs, gbs=max(gbs, mbs * layout.dp), recompute=pins.recompute or leanest,
                 layers=model.num_layers)
    if plan.recompute == "selective" and not pins.recompute_modules and plan.framework == "megatron" \
            and plan.layer_spec == "te":
        # Selective recompute pinned: the saver ladder (_savers) may repeat every module megatron can.
        plan = plan.replace(recompute_modules=model.extra_recompute_modules)
    return plan.replace(fused_loss=True) if pins.fused_loss is None and plan.framework != "megatron" else plan


def _keeping_the_rules(model: ModelSpec, cluster: ClusterSpec, num_gpus: int, layout: _Layout, pins: Pins,
                       plan: ParallelPlan) -> ParallelPlan:
    """A floored layout's leanest plan (_lean_plan), or, where it breaks a rule that the layout's own candidate kept
    (it was cut on memory after the rules), the leanest variant that keeps them: less recompute (--moe-ep-overlap,
    CUDA graphs and activation offload run without full recompute), the layout's own virtual stages (a pipeline
    under --moe-ep-overlap needs them). Otherwise the error named the rule the leaner plan broke ("e.g.
    moe_ep_overlap: ... needs --ep > 1") where every layout that keeps the rules runs out of memory."""
    def keeps(p: ParallelPlan) -> bool:
        return not any(v.severity == rules.ERROR
                       for v in rules.check(rules.Context(model, cluster, p, num_gpus), first_error_only=True))

    if keeps(plan):
        return plan
    variants = [plan]
    if pins.recompute is None:
        modules = model.extra_recompute_modules if plan.framework == "megatron" and plan.layer_spec == "te" else ()
        variants += [plan.replace(recompute="selective", recompute_layers=None, recompute_modules=modules),
                     plan.replace(recompute="none", recompute_layers=None, recompute_modules=())]
    if layout.vp != plan.vp:
        variants += [v.replace(vp=layout.vp) for v in variants]
    return next((v for v in variants[1:] if keeps(v)), plan)


def _core_too_big(model: ModelSpec, cluster: ClusterSpec, pins: Pins, seq: int, layout: _Layout, usable: float,
                  memo: dict) -> bool:
    """True when the leanest plan of this layout's core (same degrees and sharding; the smallest micro-batch,
    no interleaving, full recompute, and every memory saver taken at its largest) still does not fit: then no
    variant of it does (activation memory grows with the micro-batch, the virtual stages and less recompute)."""
    core = (layout.framework, layout.tp, layout.cp, layout.pp, layout.dp, layout.ep, layout.split, layout.zero,
            layout.shard_group, layout.etp)
    if core in memo:
        return memo[core]
    plan = _lean_plan(model, layout, pins, seq)
    try:
        peak = mem.estimate(model, plan, cluster).peak
    except ValueError:
        memo[core] = False  # an invalid split: let the rules say why
        return False
    floor = peak.total_bytes
    if model.is_hybrid and plan.recompute == "full":
        # MambaStack has no full recompute: the variants that run (selective or none) rebuild no whole layer in the
        # backward, and each of their layers keeps at least its input norm's input (the full-recompute layer's
        # bytes). The largest recomputed kind on the rank (stage_memory) is no floor for them: leave it out.
        floor -= dict(peak.other).get("recomputed layer during backward", 0)
    if plan.framework == "megatron" and pins.precision_aware_optimizer is None and plan.zero_stage >= 1 and \
            plan.remainders_possible:
        floor -= peak.optimizer_bytes / 6 + step_transient_bytes_or_zero(model, plan, peak.stage)
    if plan.framework == "megatron" and plan.pp == 1 and plan.layer_spec == "te" and pins.offload_activation_layers is None:
        floor -= peak.activations_bytes
    memo[core] = floor > usable
    return memo[core]


def step_transient_bytes_or_zero(model: ModelSpec, plan: ParallelPlan, stage: int) -> int:
    return mem.step_transient_bytes(model, plan, stage)


def _complexity(plan: ParallelPlan) -> tuple:
    """How much a plan asks of its users, for breaking ties (the faster plan first among equals): sharding
    beyond the distributed optimizer (ZeRO-3 / FSDP / Megatron-FSDP only where less sharding does not fit),
    recompute (none where activations fit), offload and other memory savers, then parallel dimensions in use
    (tp, pp, cp, ep; interleaving is a schedule of the pipeline, not a dimension of its own: Megatron's
    convention is a shallow pipeline with virtual stages). The pipeline's depth is not one: NVIDIA's layouts
    (benchmarks/layouts.py) rank lower with either the shallower or the deeper pipeline first among ties."""
    dims = sum(1 for d in (plan.tp, plan.pp, plan.cp, plan.ep) if d > 1)
    sharding = {0: 0, 1: 0, 2: 1, 3: 2}[plan.zero_stage]
    recompute = {"none": 0, "selective": 1, "full": 2}[plan.recompute]
    extras = (int(plan.offload_activation_layers > 0) + int(plan.offload_optimizer) + int(plan.grad_dtype == "bf16")
              + int(plan.precision_aware_optimizer) + int(bool(plan.recompute_modules))
              + int(plan.pp_layout is not None or plan.pp_first_stage_layers is not None
                    or plan.pp_last_stage_layers is not None or plan.pp_embedding_as_layer or plan.pp_loss_as_layer))
    return (sharding, recompute, extras, dims)


def memory_at_risk(ev: Evaluation, memory_hi: float) -> bool:
    """The top of the peak memory's 80% interval (Calibration.memory_band) reaches past the GPU's capacity: more
    than a one-in-ten chance that the plan runs out of memory where the estimate says it fits."""
    return ev.memory is not None and ev.memory.peak.total_bytes * memory_hi > ev.memory.capacity_bytes


def _tie_key(ev: Evaluation, memory_hi: float) -> tuple:
    """Among plans the model cannot tell apart: the one sure to fit in memory first (a run that works the first
    time), then the simplest (_complexity)."""
    return (int(memory_at_risk(ev, memory_hi)), *_complexity(ev.plan))


def tie_break(chosen: Evaluation, fastest: Evaluation, memory_hi: float) -> str:
    """The first criterion of _tie_key on which `chosen` beat the plan it was tied with (the fastest, or the
    runner-up), in words; "" where their keys are equal (speed decided)."""
    a, b = _tie_key(chosen, memory_hi), _tie_key(fastest, memory_hi)
    if a[0] < b[0]:
        top_gib = fastest.memory.peak.total_bytes * memory_hi / 2**30
        return (f"the faster plan's peak memory could reach {top_gib:.1f} GiB (the top of its 80% interval), past "
                f"the GPU's {fastest.memory.capacity_bytes / 2**30:.1f} GiB; this plan's stays below it")
    words = ["it needs less sharding (no ZeRO-3/FSDP where less sharding fits)",
             "it needs less recompute (none where activations fit)", "it needs fewer memory savers and options",
             "it uses fewer parallel dimensions"]
    for word, x, y in zip(words, a[1:], b[1:]):
        if x != y:
            return word
    return ""


def _layout_key(plan: ParallelPlan) -> tuple:
    """One ranked entry per layout. Megatron's DDP and its distributed optimizer over data-parallel groups of one (the
    dense weights' dp x cp and the experts' expert_dp) shard nothing: the same layout (the optimizer only enables FP8
    parameters and the precision-aware optimizer)."""
    zero = plan.zero_stage
    if plan.framework == "megatron" and zero <= 1 and plan.dp * plan.cp == 1 and plan.expert_dp == 1:
        zero = 0
    return (plan.framework, plan.tp, plan.pp, plan.vp, plan.cp, plan.ep, plan.etp, zero, plan.shard_group_size)


def _schedule_free_key(plan: ParallelPlan) -> tuple:
    """A layout apart from its pipeline schedule: the virtual stages per rank (vp) and the layer split are how one
    pipeline runs its layers, not another layout (a user choosing between layouts is shown tp x pp x cp x ep and
    the sharding; the interleaving depth is the search's to pick, Megatron's convention)."""
    key = _layout_key(plan)
    return key[:3] + key[4:]  # _layout_key without its vp (index 3)


def same_layout(a: ParallelPlan, b: ParallelPlan) -> bool:
    """Whether two plans are one layout apart from their pipeline schedule (_schedule_free_key)."""
    return _schedule_free_key(a) == _schedule_free_key(b)


def _other_layouts(ranked: list[Evaluation], keep: int) -> tuple[Evaluation, ...]:
    """The first-ranked plan of each layout other than the first plan's, apart from the schedule, up to `keep`."""
    seen = {_schedule_free_key(ranked[0].plan)} if ranked else set()
    out: list[Evaluation] = []
    for ev in ranked[1:] if keep > 0 else ():
        key = _schedule_free_key(ev.plan)
        if key not in seen:
            seen.add(key)
            out.append(ev)
            if len(out) >= keep:
                break
    return tuple(out)


def search(model: ModelSpec, cluster: ClusterSpec, num_gpus: int, cal: Calibration, pins: Pins = Pins(),
           *, keep: int = 10) -> SearchResult:
    """All candidates, the feasible ones ranked by tokens/s (best per layout first); among plans within
    TIE_FRACTION of the fastest, the one sure to fit in memory, then the simplest, comes first (_tie_key).

    Megatron-FSDP is searched only when asked for (--zero 2/3) or when no other megatron plan fits: NVIDIA's
    published layouts use it for few models (Llama 3 70B and 405B on GB200/GB300), and a user should not get an
    experimental sharding mode unless it is what makes the model fit."""
    result = _search(model, cluster, num_gpus, cal, pins, keep=keep)
    if (not pins.megatron_fsdp and pins.zero_stage is None and pins.framework in (None, "megatron")
            and pins.pp in (None, 1) and not any(ev.plan.framework == "megatron" for ev in result.ranked)):
        result = _search(model, cluster, num_gpus, cal, replace(pins, megatron_fsdp=True), keep=keep)
    return result


def _search(model: ModelSpec, cluster: ClusterSpec, num_gpus: int, cal: Calibration, pins: Pins, *,
            keep: int) -> SearchResult:
    """search() over the candidates the pins allow.

    Branch and bound: every candidate gets a cheap upper bound on its tokens/s; they are evaluated best bound
    first, and once no remaining bound can enter the ranked list the rest are counted as pruned."""
    seq = pins.seq_length or model.seq_length
    considered = 0
    rejected: Counter[str] = Counter()
    feasible: list[Evaluation] = []
    memory_misses: list[Evaluation] = []
    past_headroom: list[Evaluation] = []  # memory misses inside the GPU's capacity, in the order of their bounds
    rule_misses: list[Evaluation] = []
    entries = []
    layer_s: dict[tuple, float] = {}  # the bounds' layer times (_optimistic_tokens_per_s)
    for order, (layout, mbs, gbs, recompute) in enumerate(_specs(model, cluster, num_gpus, pins)):
        if mbs == BATCH_TOO_LARGE:
            considered += 1
            rejected[BATCH_TOO_LARGE] += 1
            continue
        bound = _optimistic_tokens_per_s(model, cluster, cal, pins, seq, layout, mbs, gbs, recompute, layer_s)
        entries.append((-bound, order, layout, mbs, gbs, recompute))
    entries.sort(key=lambda e: (e[0], e[1]))
    pinned = pins.degrees_pinned()
    usable = cluster.gpu.hbm_gib * GIB * (1 if pinned else 1 - mem.HEADROOM_FRACTION)
    core_memo: dict[tuple, bool] = {}
    failed: dict[_Layout, list[tuple[int, int]]] = {}  # (mbs, recompute level) that fit nowhere, per layout
    floored: list[tuple[float, _Layout]] = []  # rejected on a memory bound without a full estimate
    fits_at: dict[tuple, str] = {}   # (layout, mbs) -> the recompute that fitted: costlier ones cannot win
    too_big: dict[_Layout, int] = {}  # layout -> smallest micro-batch that fits nowhere, even with full recompute
    best_per_layout: dict[tuple, float] = {}
    threshold = 0.0
    pruned = 0
    seen: set[ParallelPlan] = set()
    split_speed: dict[ParallelPlan, float] = {}  # layout plan -> tokens/s of megatron's own split
    priced: dict[ParallelPlan, tuple] = {}  # plan that fits -> its stage times, as step_cost found them
    for index, (neg_bound, _, layout, mbs, gbs, recompute) in enumerate(entries):
        if -neg_bound < threshold:
            pruned = len(entries) - index
            break
        if mbs >= too_big.get(layout, 1 << 30):
            continue
        level = _RECOMPUTE_MEMORY[recompute]
        if any(mbs >= f_mbs and level >= f_level for f_mbs, f_level in failed.get(layout, ())):
            considered += 1
            rejected["memory_fits"] += 1  # needs more memory than a variant that did not fit
            continue
        key = (layout, mbs)
        if key in fits_at and pins.recompute is None:
            continue  # a cheaper recompute already fits at this micro-batch
        plan = _plan(layout, pins, seq, mbs=mbs, gbs=gbs, recompute=recompute, layers=model.num_layers)
        if plan in seen:
            continue
        seen.add(plan)
        considered += 1
        violations = rules.check(rules.Context(model, cluster, plan, num_gpus), first_error_only=True)
        broken = [v for v in violations if v.severity == rules.ERROR]
        if broken:
            rejected[broken[0].rule] += 1
            if len(rule_misses) < 50:
                rule_misses.append(Evaluation(plan, tuple(broken)))
            continue
        floor = _states_floor_bytes(model, layout, pins.precision, bool(pins.offload), bool(pins.lora_rank),
                                    pins.adam_moments_dtype == "bf16")
        if floor > usable or _core_too_big(model, cluster, pins, seq, layout, usable, core_memo):
            rejected["memory_fits"] += 1  # even its leanest variant does not fit: no need to look closer
            floored.append((floor, layout))
            continue
        # No error: the check ran every rule, so `violations` are the plan's warnings, as evaluate() would find them.
        ev = evaluate(model, cluster, plan, num_gpus, cal, pinned=pinned, violations=violations, priced=priced)
        found = [ev] if ev.ok else []
        if ev.ok:
            fits_at[key] = plan.recompute
        elif ev.memory is not None and ev.errors and ev.errors[0].rule == "memory_fits":
            for variant, variant_estimate in _savers(model, cluster, plan, pins, ev.memory):
                if variant in seen:
                    continue
                seen.add(variant)
                considered += 1
                trial = evaluate(model, cluster, variant, num_gpus, cal, pinned=pinned, estimate=variant_estimate,
                                 priced=priced)
                if trial.ok:
                    found.append(trial)
        # Every degree typed, or the first/last stage's layers: evaluate exactly that split.
        if (pins.pp_layout is None and not pinned and pins.pp_first_stage_layers is None
                and pins.pp_last_stage_layers is None):
            for good in list(found):
                if good.plan.framework != "megatron" or good.plan.pp == 1:
                    continue  # (balanced_layout's own first test)
                # Moving layers cannot make the pipeline faster than its mean rank (compute and bubble follow the
                # slowest rank, the rest stays): skip where even that is no gain the model can tell apart, or cannot
                # reach the plans kept (as the candidates' own bounds are pruned).
                loads = [st.total_s for st in priced.pop(good.plan)]  # (evaluate priced every plan found)
                gain = max(loads) * len(loads) / sum(loads)
                if gain <= 1 + TIE_FRACTION or good.cost.tokens_per_s / num_gpus * gain < threshold:
                    continue
                layout_str = balanced_layout(model, good.plan, cluster, cal)
                if layout_str is None:
                    continue
                variant = good.plan.with_layout(layout_str)
                if variant in seen:
                    continue
                seen.add(variant)
                considered += 1
                trial = evaluate(model, cluster, variant, num_gpus, cal, pinned=pinned)
                # Kept only where it is faster by more than the model can tell apart (else the simpler split).
                if trial.ok and trial.cost.tokens_per_s > good.cost.tokens_per_s * (1 + TIE_FRACTION):
                    found.append(trial)
                    split_speed[variant] = good.cost.tokens_per_s
        priced.clear()  # this candidate's stage times: read above only, not kept through the search
        for good in found:
            feasible.append(good)
            k = _schedule_free_key(good.plan)
            best_per_layout[k] = max(best_per_layout.get(k, 0.0), good.cost.tokens_per_s / num_gpus)
        if found and len(best_per_layout) > keep:
            # Nothing that cannot beat the (keep + 1)-th best layout apart from its schedule can enter the ranking's
            # first `keep` plans (each layout's vp variants count there) or the `keep` alternatives of other layouts.
            speeds = sorted(best_per_layout.values(), reverse=True)
            threshold = min(speeds[keep], speeds[0] * (1 - TIE_FRACTION))
        if ev.ok:
            continue
        first = ev.errors[0].rule
        rejected[first] += 1
        if first == "memory_fits":
            memory_misses.append(ev)
            if (not pinned and len(past_headroom) < PAST_HEADROOM_KEPT
                    and ev.memory.peak.total_bytes <= ev.memory.capacity_bytes):
                past_headroom.append(ev)
            if not found and pins.recompute_layers is None:
                failed.setdefault(layout, []).append((mbs, level))
            if plan.recompute == "full" and not found and pins.mbs is None and plan.recompute_layers is None:
                too_big[layout] = min(too_big.get(layout, 1 << 30), mbs)  # bigger micro-batches need more still
        elif len(ev.errors) == 1 and len(rule_misses) < 50:
            rule_misses.append(ev)
    if pruned:
        rejected["cannot_reach_top"] = pruned
        considered += pruned
    feasible.sort(key=lambda e: (-e.cost.tokens_per_s, e.memory.peak.total_bytes))
    fastest = feasible[0] if feasible else None
    # One plan per layout: the first by _tie_key of the layout's plans within TIE_FRACTION of its fastest (a micro-batch
    # that needs module recompute and the precision-aware optimizer to fit does not stand for its layout when
    # a plain one runs as fast, to the model's error).
    memory_hi = cal.memory_band[1]
    by_layout: dict[tuple, list[Evaluation]] = {}
    for ev in feasible:
        by_layout.setdefault(_layout_key(ev.plan), []).append(ev)
    ranked = []
    for group in by_layout.values():
        floor = group[0].cost.tokens_per_s * (1 - TIE_FRACTION)
        ranked.append(min((ev for ev in group if ev.cost.tokens_per_s >= floor),
                          key=lambda e: (_tie_key(e, memory_hi), -e.cost.tokens_per_s)))
    ranked.sort(key=lambda e: (-e.cost.tokens_per_s, e.memory.peak.total_bytes))
    if ranked:
        # Honest ties: what the model cannot tell apart from the fastest plan (which may be a faster variant of a
        # layout that its simpler representative stands for) is ordered by _tie_key (sure to fit, then simplicity), then
        # speed.
        floor = fastest.cost.tokens_per_s * (1 - TIE_FRACTION)
        tied = [ev for ev in ranked if ev.cost.tokens_per_s >= floor]
        rest = ranked[len(tied):]
        tied.sort(key=lambda e: (_tie_key(e, memory_hi), -e.cost.tokens_per_s))
        ranked = tied + rest
    if not feasible and floored:
        # Nothing fits: estimate in full the leanest plan (micro-batch 1, full recompute, fewest virtual stages,
        # the precision-aware optimizer where it applies) of the layouts with the smallest states, so that the
        # error names the plan that comes closest, not a fat variant that was cut on a bound.
        floored.sort(key=lambda f: f[0])
        lean_seen: set[ParallelPlan] = set()
        for _, layout in floored:
            if len(lean_seen) >= 8:
                break
            plan = _lean_plan(model, layout, pins, seq, runnable=True)
            if plan.framework == "megatron" and plan.zero_stage >= 1 and pins.precision_aware_optimizer is None \
                    and plan.remainders_possible:
                plan = plan.replace(precision_aware_optimizer=True)
            plan = _keeping_the_rules(model, cluster, num_gpus, layout, pins, plan)
            if plan in lean_seen:
                continue
            lean_seen.add(plan)
            ev = evaluate(model, cluster, plan, num_gpus, cal, pinned=pinned)
            if ev.memory is not None and not ev.ok:
                memory_misses.append(ev)
                # (Only at the user's batch: the leanest plan's own is the smallest the layout allows.)
                if not pinned and pins.gbs is not None and ev.memory.peak.total_bytes <= ev.memory.capacity_bytes:
                    past_headroom.append(ev)
    memory_misses.sort(key=lambda e: e.overflow_ratio)
    rule_misses.sort(key=lambda e: -rejected[e.errors[0].rule])  # the commonest reason's misses first (stable)
    misses = tuple(memory_misses[:5]) + tuple(rule_misses[:3])
    tight = None
    if past_headroom:
        priced = [replace(ev, cost=step_cost(model, ev.plan, cluster, cal)) for ev in past_headroom]
        tight = max(priced, key=lambda e: (e.cost.tokens_per_s, -e.memory.peak.total_bytes))
        if ranked and tight.cost.tokens_per_s <= ranked[0].cost.tokens_per_s * (1 + TIE_FRACTION):
            tight = None  # no faster than the plan that keeps the headroom, to the model's error
    kept = tuple(ranked[:keep])
    others = _other_layouts(ranked, keep)
    ahead = fastest if ranked and fastest is not ranked[0] else None
    runner_up = ""
    if others and others[0].cost.tokens_per_s >= ranked[0].cost.tokens_per_s * (1 - TIE_FRACTION):
        runner_up = (tie_break(ranked[0], others[0], memory_hi)
                     or "the faster of two plans as simple and as sure to fit")
    return SearchResult(kept, considered, dict(rejected.most_common()), misses, ahead,
                        {ev.plan: split_speed[ev.plan] for ev in kept + others if ev.plan in split_speed},
                        (tie_break(ranked[0], ahead, memory_hi) or "it is as simple and as sure to fit")
                        if ahead is not None else "", runner_up, others, tight,
                        pin_whole_flags(tight.plan, pins, model) if tight is not None else "")


class _Budget:
    """Memory estimates the suggestions may still spend."""

    def __init__(self, estimates: int) -> None:
        self.left = estimates

    def spend(self, n: int = 1) -> bool:
        self.left -= n
        return self.left >= 0


PAST_HEADROOM_KEPT = 8
"""Candidates inside the GPU's capacity but past the headroom whose cost search() prices for past_headroom: the first
ones by their speed bound (the order it evaluates them in), so the few that could be fastest."""


SUGGESTION_ESTIMATES = 1500
"""Memory estimates each kind of suggestion (more GPUs, a shorter sequence) may spend: about 0.6 s on a loaded
2-core CI machine. A model that would need more to prove where it fits gets the other suggestions only (issue
15: every planning run ends in under 2 s). A count, not a clock, so the message never depends on the machine."""


def _fits_anywhere(model: ModelSpec, cluster: ClusterSpec, num_gpus: int, cal: Calibration, pins: Pins,
                   budget: _Budget | None = None) -> Evaluation | None:
    """The first candidate that fits (memory savers included), or None. Pruned as search() prunes, so that a
    model that fits nowhere is proved so quickly (issue 15: the suggestions alone took over 2 s): a layout whose
    leanest variant cannot fit is skipped whole, and so is a micro-batch and recompute that needs more memory
    than one of the same layout that did not fit."""
    # Megatron-FSDP counts: search() falls back to it where nothing else fits, so a suggestion may rely on it.
    pins = replace(pins, megatron_fsdp=True)
    seq = pins.seq_length or model.seq_length
    usable = cluster.gpu.hbm_gib * GIB * (1 - mem.HEADROOM_FRACTION)
    core_memo: dict[tuple, bool] = {}
    failed: dict[_Layout, list[tuple[int, int]]] = {}
    for layout, mbs, gbs, recompute in _specs(model, cluster, num_gpus, pins):
        if mbs == BATCH_TOO_LARGE:
            continue
        level = _RECOMPUTE_MEMORY[recompute]
        if any(mbs >= f_mbs and level >= f_level for f_mbs, f_level in failed.get(layout, ())):
            continue
        if _states_floor_bytes(model, layout, pins.precision, bool(pins.offload), bool(pins.lora_rank),
                                    pins.adam_moments_dtype == "bf16") > usable:
            continue
        known = len(core_memo)
        too_big = _core_too_big(model, cluster, pins, seq, layout, usable, core_memo)
        if budget is not None and not budget.spend(len(core_memo) - known):
            return None
        if too_big:
            continue
        plan = _plan(layout, pins, seq, mbs=mbs, gbs=gbs, recompute=recompute, layers=model.num_layers)
        ctx = rules.Context(model, cluster, plan, num_gpus)
        if any(v.severity == rules.ERROR for v in rules.check(ctx, first_error_only=True)):
            continue
        if budget is not None and not budget.spend():
            return None
        estimate = mem.estimate(model, plan, cluster)
        if estimate.fits:
            return Evaluation(plan, (), estimate)
        for variant, variant_estimate in _savers(model, cluster, plan, pins, estimate):
            if variant_estimate is None:
                variant_estimate = mem.estimate(model, variant, cluster)
            if variant_estimate.fits and not any(
                    v.severity == rules.ERROR for v in rules.check(rules.Context(model, cluster, variant, num_gpus))):
                return Evaluation(variant, (), variant_estimate)
        if pins.recompute_layers is None:
            failed.setdefault(layout, []).append((mbs, level))
    return None


def _fitting_batch(model: ModelSpec, cluster: ClusterSpec, num_gpus: int, cal: Calibration, pins: Pins,
                   budget: _Budget) -> str | None:
    """Whether a plan fits with these pins at the default batch (_fits_anywhere), None where none does; else what
    the tip adds besides: "" where there is no --global-batch or the plan found takes the user's (its rules and
    memory at that batch), else " --global-batch G", the batch it was found at (the user's stays on the command
    line: a tip checked without it failed there)."""
    fit = _fits_anywhere(model, cluster, num_gpus, cal, replace(pins, gbs=None), budget)
    if fit is None:
        return None
    if pins.gbs is None or pins.gbs == fit.plan.gbs:
        return ""
    try:
        typed = fit.plan.replace(gbs=pins.gbs)
    except ValueError:
        typed = None
    if typed is not None and not any(v.severity == rules.ERROR for v in rules.check(
            rules.Context(model, cluster, typed, num_gpus), first_error_only=True)) \
            and mem.estimate(model, typed, cluster).fits:
        return ""
    return f" --global-batch {fit.plan.gbs}"


def what_would_fit(model: ModelSpec, cluster: ClusterSpec, num_gpus: int, cal: Calibration, pins: Pins) -> list[str]:
    """Suggestions for a model that fits nowhere: more GPUs, a shorter sequence, recompute, offload."""
    tips = []
    per_node = cluster.gpus_per_node
    budget = _Budget(SUGGESTION_ESTIMATES)
    # Part of a node is a job too (rules.whole_nodes_error): 2 GPUs before a whole node of 4. Past one node, whole
    # nodes: the GPUs doubled (rounded down to nodes) and the nodes doubled, the fewest first (3 GPUs of a 4-GPU
    # node: 6 -> 4, 8, 12, 16, 24, ...).
    nodes = -(-num_gpus // per_node)
    candidates = {g if g <= per_node else g // per_node * per_node for g in (num_gpus << k for k in range(1, 7))}
    candidates |= {per_node * (nodes << k) for k in range(7)}
    for more_gpus in sorted(g for g in candidates if g > num_gpus):
        batch = _fitting_batch(model, cluster, more_gpus, cal, pins, budget)
        if batch is not None:
            tips.append(f"--gpus {more_gpus}{batch}")
            break
        if budget.left < 0:
            break
    seq = pins.seq_length or model.seq_length
    budget = _Budget(SUGGESTION_ESTIMATES)
    while seq > 512 and budget.left >= 0:
        seq //= 2
        batch = _fitting_batch(model, cluster, num_gpus, cal, replace(pins, seq_length=seq), budget)
        if batch is not None:
            tips.append(f"--seq-len {seq}{batch}")
            break
    if pins.zero_stage is not None:
        # A pinned ZeRO stage: the next stage that fits shards more state at a smaller cost than offload.
        budget = _Budget(SUGGESTION_ESTIMATES)
        for stage in range(pins.zero_stage + 1, 4):
            if _fits_anywhere(model, cluster, num_gpus, cal, replace(pins, zero_stage=stage), budget):
                tips.append(f"--zero {stage}")
                break
            if budget.left < 0:
                break
    if pins.recompute not in (None, "full") and _fits_anywhere(model, cluster, num_gpus, cal, replace(pins, recompute="full")):
        tips.append("--recompute full")
    # A pinned degree that holds too much on each GPU (GPT-3 175B at --tp 2 --pp 4 on 64 GPUs: 175e9 / 8 x 6 bytes of
    # weights and fp32 gradients alone, whatever the GPU count): the value of the first plan that fits with it freed.
    budget = _Budget(SUGGESTION_ESTIMATES)
    for field, flag in FIT_PIN_FLAGS:
        if getattr(pins, field) is None or budget.left < 0:
            continue
        freed = replace(pins, **{field: None}, **({"vp": None} if field == "pp" else {}))
        fit = _fits_anywhere(model, cluster, num_gpus, cal, freed, budget)
        if fit is not None:
            tips.append(f"{flag} {getattr(fit.plan, field)}"
                        + (f" --vp {fit.plan.vp}" if field == "pp" and pins.vp else ""))
    if pins.framework in (None, "deepspeed") and _fits_anywhere(
            model, cluster, num_gpus, cal, replace(pins, framework="deepspeed", zero_stage=3, offload=True, tp=None, pp=None,
                                                   vp=None, cp=None, adam_moments_dtype="fp32",
                                                   precision_aware_optimizer=None)):
        dropped = [flag for field, flag in (("tp", "--tp"), ("pp", "--pp"), ("vp", "--vp"), ("cp", "--cp"))
                   if getattr(pins, field) not in (None, 1)]
        why = ["DeepSpeed has no tensor, pipeline or context parallelism here"] if dropped else []
        if pins.adam_moments_dtype == "bf16":  # checked as fp32 above: DeepSpeed refuses the flag (rules._precision)
            dropped.append("--adam-moments-dtype bf16")
            why.append("BF16 Adam moments are megatron's precision-aware optimizer")
        tips.append("--framework deepspeed --zero 3 --offload"
                    + (f" (without {' '.join(dropped)}: {'; '.join(why)})" if dropped else ""))
    return tips


PIN_FLAGS = (("tp", "--tp"), ("pp", "--pp"), ("vp", "--vp"), ("cp", "--cp"), ("ep", "--ep"), ("etp", "--etp"),
             ("mbs", "--mbs"), ("gbs", "--global-batch"), ("zero_stage", "--zero"))
"""The pinned degrees what_would_be_valid frees one at a time (Pins field, command-line flag)."""

FIT_PIN_FLAGS = tuple((field, flag) for field, flag in PIN_FLAGS if field in ("tp", "pp", "cp", "ep", "mbs"))
"""Those what_would_fit frees one at a time: the degrees that set how much each GPU holds (a freed pp frees its vp)."""


def pin_whole_flags(plan: ParallelPlan, pins: Pins, model: ModelSpec) -> str:
    """The command-line flags that, beside the user's own, pin `plan` whole (Pins.degrees_pinned, and its
    interleaving, context and expert degrees, so that the search evaluates exactly it): those not already typed."""
    fields = [("framework", "--framework"), ("tp", "--tp"), ("pp", "--pp")]
    fields += [("vp", "--vp")] if plan.pp > 1 else []
    fields += [("cp", "--cp")]
    if model.is_moe:
        fields += [("ep", "--ep"), ("etp", "--etp")]
    fields += [("mbs", "--mbs"), ("zero_stage", "--zero"), ("recompute", "--recompute")]
    if plan.recompute == "full" and plan.recompute_layers is not None:
        fields.append(("recompute_layers", "--recompute-layers"))
    if plan.offload_activation_layers:
        fields.append(("offload_activation_layers", "--offload-activations"))
    flags = [f"{flag} {getattr(plan, name)}" for name, flag in fields
             if getattr(pins, name) is None and getattr(plan, name) is not None]
    # The memory savers the search took for it (a pinned search keeps the GPU's whole capacity and adds none).
    if plan.recompute_modules and not pins.recompute_modules:
        flags.append(f"--recompute-modules {','.join(plan.recompute_modules)}")
    if plan.precision_aware_optimizer and pins.precision_aware_optimizer is None:
        flags.append("--precision-aware-optimizer")
    if plan.fused_loss and pins.fused_loss is None:
        flags.append("--fused-loss")
    return " ".join(flags)


def what_would_be_valid(model: ModelSpec, cluster: ClusterSpec, num_gpus: int, cal: Calibration, pins: Pins, *,
                        batch_rejected: bool = False) -> list[str]:
    """For a plan no layout satisfies (the pins break a rule, not the memory): each pinned degree that, freed and
    searched, gives a valid plan, as the flag with the value the search picks ('--pp 8'); batch_rejected (layouts
    that needed more than the default batch): the smallest --global-batch that is valid; where none of these is,
    a pinned framework freed ('--framework megatron')."""
    tips = []
    for field, flag in PIN_FLAGS:
        if getattr(pins, field) is None:
            continue
        freed = replace(pins, **{field: None})
        if field == "pp":
            freed = replace(freed, vp=None)  # the virtual stages follow the pipeline depth
        result = search(model, cluster, num_gpus, cal, freed, keep=1)
        if result.ranked:
            plan = result.best.plan
            if field == "pp" and plan.pp == pins.pp:
                continue  # the pipeline depth was not the problem: the virtual stages' own tip says what was
            value = getattr(plan, field)
            tip = (f"no {flag} (its default)" if value is None else  # etp: the expert TP follows tp
                   f"{flag} {value}" + (f" --vp {plan.vp}" if field == "pp" and pins.vp else ""))
            if tip not in tips:
                tips.append(tip)
    if pins.recompute_layers is not None:
        # Block recompute past a model chunk's layers (rules._recompute): the most the best plan without the pin
        # holds in a chunk, where the search takes it (a layout the search balanced may hold more than its split)
        freed = search(model, cluster, num_gpus, cal, replace(pins, recompute_layers=None), keep=1)
        most = largest_chunk_layers(model.num_layers, freed.best.plan) if freed.ranked else pins.recompute_layers
        if most < pins.recompute_layers and search(model, cluster, num_gpus, cal,
                                                   replace(pins, recompute_layers=most), keep=1).ranked:
            tips.append(f"--recompute-layers {most}")
    if pins.attention_kernel != "auto" and search(model, cluster, num_gpus, cal,
                                                  replace(pins, attention_kernel="auto"), keep=1).ranked:
        tips.append("--attention-kernel auto")  # a kernel that cannot run this model (head dim, window)
    gbs = _smallest_valid_batch(model, cluster, num_gpus, cal, pins) if batch_rejected else None
    if gbs is not None:
        tips.append(f"--global-batch {gbs}")
    fewer = _most_gpus_for_the_batch(model, cluster, num_gpus, cal, pins) if batch_rejected and pins.gbs is None else None
    if fewer is not None:
        tips.append(f"--gpus {fewer}")
    if not tips and pins.framework is not None:
        # The last resort, the largest change to what was asked: the framework that builds this model or precision
        # (Mixtral or an FP8 plan under DeepSpeed). Before, such errors ended "Nothing tried makes it valid".
        # The first plan that fits, not a search's best: a whole search of Qwen3-235B on 384 GPUs takes 3 s.
        fit = _fits_anywhere(model, cluster, num_gpus, cal, replace(pins, framework=None), _Budget(SUGGESTION_ESTIMATES))
        if fit is not None:
            # --offload pins DeepSpeed (pins_from_args) and is refused with any other framework.
            tips.append(f"--framework {fit.plan.framework}" + (" (without --offload: ZeRO-Offload is DeepSpeed's)"
                                                               if pins.offload and fit.plan.framework != "deepspeed" else ""))
    return tips


BATCH_TIP_SEARCHES = 8
"""At most this many searches look for a --global-batch tip."""


def _fewest_data_parallel(model: ModelSpec, cluster: ClusterSpec, num_gpus: int, pins: Pins) -> int:
    """The fewest data-parallel ranks any layout the search considers has: each needs at least one sequence a step,
    so no global batch below it is valid (1 where there is no layout)."""
    seq = pins.seq_length or model.seq_length
    return min((layout.dp for layout in _layouts(model, cluster, num_gpus, pins, seq)), default=1)


def _smallest_valid_batch(model: ModelSpec, cluster: ClusterSpec, num_gpus: int, cal: Calibration,
                          pins: Pins) -> int | None:
    """Where the default batch is too small for every layout (long sequences, or more GPUs than sequences: each
    data-parallel rank needs a sequence, and the default's tokens per step make few), the smallest global batch a
    layout takes: the data-parallel degrees (divisors of the GPUs) and doublings of the default past it, from the
    fewest data-parallel ranks a layout has, smallest first. None with a pinned batch, or where none of the first
    BATCH_TIP_SEARCHES is valid."""
    if pins.gbs is not None:
        return None
    seq = pins.seq_length or model.seq_length
    target = default_batch(exact_param_count(model), seq).sequences
    floor = _fewest_data_parallel(model, cluster, num_gpus, pins)
    sizes = set(divisors(num_gpus)) | {target << k for k in range(1, 8)} | {floor}
    for gbs in sorted(g for g in sizes if g > MAX_BATCH_GROWTH * target and g >= floor)[:BATCH_TIP_SEARCHES]:
        if search(model, cluster, num_gpus, cal, replace(pins, gbs=gbs), keep=1).ranked:
            return gbs
    return None


def _most_gpus_for_the_batch(model: ModelSpec, cluster: ClusterSpec, num_gpus: int, cal: Calibration,
                             pins: Pins) -> int | None:
    """Where the default batch is too small for every layout on num_gpus: fewer GPUs (whole nodes) whose fewest
    data-parallel ranks the default batch gives a sequence each, the most of them that plans; None where none of
    the first BATCH_TIP_SEARCHES does."""
    seq = pins.seq_length or model.seq_length
    target = default_batch(exact_param_count(model), seq).sequences
    width = num_gpus // _fewest_data_parallel(model, cluster, num_gpus, pins)  # tp x pp x cp of the widest layout
    per_node = cluster.gpus_per_node
    gpus = min(width * max(1, int(MAX_BATCH_GROWTH * target)), num_gpus - 1)
    for _ in range(BATCH_TIP_SEARCHES):  # whole nodes, a node or a layout's width fewer each time
        gpus = gpus // per_node * per_node if gpus > per_node else gpus
        if gpus < 1:
            return None
        if search(model, cluster, gpus, cal, pins, keep=1).ranked:
            return gpus
        gpus -= max(per_node, width)
    return None


def plan_or_explain(model: ModelSpec, cluster: ClusterSpec, num_gpus: int, cal: Calibration, pins: Pins,
                    *, keep: int = 10) -> SearchResult:
    """search(), raising NoFeasiblePlan with the reason and what would make it fit when nothing does."""
    result = search(model, cluster, num_gpus, cal, pins, keep=keep)
    if result.ranked:
        return result
    gpu = cluster.gpu
    memory_misses = [ev for ev in result.nearest_misses if ev.memory is not None]
    if result.rejected.get("memory_fits") and memory_misses:
        closest = memory_misses[0]
        peak = closest.memory.peak
        why = (f"{model.name} does not fit on {num_gpus:,} x {gpu.name} ({gpu.hbm_gib:g} GiB each): the closest plan "
               f"({describe(closest.plan)}) needs {peak.total_bytes / GIB:.1f} GiB per GPU on stage {peak.stage}, "
               f"over the {closest.memory.usable_bytes / GIB:.1f} GiB a plan may use "
               f"({mem.HEADROOM_FRACTION:.0%} kept free for the estimate's error)")
        tight = result.past_headroom
        if tight is not None:
            # Inside the GPU, past the headroom only: the user may take it, warned, by pinning it whole.
            flags = result.past_headroom_flags
            if tight.plan == closest.plan:
                why += f", but inside the GPU's {tight.memory.capacity_bytes / GIB:.1f}"
            else:
                why += (f"; {describe(tight.plan)} needs {tight.memory.peak.total_bytes / GIB:.1f} GiB, inside the "
                        f"GPU's {tight.memory.capacity_bytes / GIB:.1f} but not the headroom")
            why += (f": pinned whole ({flags}) it is planned, with a warning that it may run out of memory"
                    if flags else "")
        tips = what_would_fit(model, cluster, num_gpus, cal, pins)
        raise NoFeasiblePlan(why + (f". It would fit with: {'; or '.join(tips)}" if tips else ". Nothing tried makes it fit"),
                             result)
    pinned = " ".join(f"{flag} {getattr(pins, field)}" for field, flag in PIN_FLAGS if getattr(pins, field) is not None)
    if result.considered:
        top = ", ".join(f"{name} x{count}" for name, count in list(result.rejected.items())[:3])
        example = result.nearest_misses[0].errors[0] if result.nearest_misses else None  # of the commonest reason
        if example is not None and example.rule == "framework_degrees" and pins.framework is None:
            # The degrees typed rule out DeepSpeed and FSDP, which nobody asked for; megatron's own reason is the one to
            # fix (mistral-7b-v0.1 with --cp 8 read "e.g. framework_degrees: cp=8 needs --framework megatron", and
            # --framework megatron met its sliding-window rule).
            own = search(model, cluster, num_gpus, cal, replace(pins, framework="megatron"), keep=1)
            if own.nearest_misses:
                example = own.nearest_misses[0].errors[0]
        if example is None and next(iter(result.rejected)) == BATCH_TOO_LARGE:
            seq = pins.seq_length or model.seq_length
            target = default_batch(exact_param_count(model), seq)
            fewest = _fewest_data_parallel(model, cluster, num_gpus, pins)
            example = (f"every layout needs a global batch over {MAX_BATCH_GROWTH:g} x the default "
                       f"{target.sequences:,} sequences of {seq:,} tokens ({target.tokens_per_step / 1e6:.1f}M tokens a step, "
                       f"from the model's size)"
                       + (f": each of the {fewest:,} or more data-parallel ranks of a layout on {num_gpus:,} GPUs needs "
                          f"a sequence" if fewest > MAX_BATCH_GROWTH * target.sequences else ""))
        why = (f"no valid layout for {model.name} on {num_gpus:,} x {gpu.name} ({result.considered} candidates rejected: "
               f"{top})" + (f"; e.g. {example}" if example else ""))
    else:
        why = (f"no layout of {model.name} on {num_gpus:,} x {gpu.name} has {pinned or 'these settings'}: the degrees must "
               f"divide the GPUs (tp x pp x cp x dp), the heads, layers and experts they split"
               + (", and the global batch must be a multiple of mbs x dp" if pins.gbs is not None else ""))
    tips = what_would_be_valid(model, cluster, num_gpus, cal, pins,
                               batch_rejected=bool(result.rejected.get(BATCH_TOO_LARGE)))
    if tips:
        raise NoFeasiblePlan(why + f". It would be valid with: {'; or '.join(tips)}", result)
    tips = what_would_fit(model, cluster, num_gpus, cal, pins)
    raise NoFeasiblePlan(why + (f". It would fit with: {'; or '.join(tips)}" if tips else ". Nothing tried makes it valid"),
                         result)


def describe(plan: ParallelPlan) -> str:
    """One-line layout: 'megatron tp=4 pp=8 vp=2 dp=12 mbs=1 gbs=1152 zero=1 recompute=selective'."""
    parts = [plan.framework, f"tp={plan.tp}", f"pp={plan.pp}"]
    if plan.vp > 1:
        parts.append(f"vp={plan.vp}")
    if plan.cp > 1:
        parts.append(f"cp={plan.cp}")
    if plan.ep > 1:
        parts.append(f"ep={plan.ep}")
    if plan.etp is not None and plan.etp != plan.tp:
        parts.append(f"etp={plan.etp}")
    parts += [f"dp={plan.dp}", f"mbs={plan.mbs}", f"gbs={plan.gbs}"]
    if plan.framework == "fsdp":
        parts.append(plan.fsdp_sharding_strategy)
    else:
        parts.append(f"zero={plan.zero_stage}")
    recompute = f"recompute={plan.recompute}"
    if plan.recompute == "full" and plan.recompute_layers is not None:
        recompute += f"({plan.recompute_layers}/chunk)"
    elif plan.recompute_modules:
        recompute += f"({','.join(plan.recompute_modules)})"
    parts.append(recompute)
    if plan.quant_recipe:
        first, last = plan.bf16_edge_layers
        parts.append(plan.quant_recipe + (f"(bf16 layers first/last={first}/{last})" if first or last else ""))
    if plan.grad_dtype == "bf16":
        parts.append("grads=bf16")
    if plan.precision_aware_optimizer:
        parts.append("precision-aware-optimizer")
    if plan.adam_moments_dtype == "bf16":
        parts.append("adam-moments=bf16")
    if plan.fused_loss:
        parts.append("fused-loss")
    if plan.attention_kernel != "auto":
        parts.append(f"attention={plan.attention_kernel}")
    if plan.offload_activation_layers:
        parts.append(f"offload-activations={plan.offload_activation_layers}")
    if plan.offload_optimizer:
        parts.append("offload")
    if plan.pp_first_stage_layers or plan.pp_last_stage_layers:
        parts.append(f"layers first/last={plan.pp_first_stage_layers}/{plan.pp_last_stage_layers}")
    if plan.pp_embedding_as_layer:
        parts.append("embedding+loss as layers")
    if plan.pp_layout is not None:
        parts.append(f"layout={plan.pp_layout}")
    return " ".join(parts)
