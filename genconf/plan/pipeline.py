"""How layers split over pipeline stages, and how many micro-batches each stage keeps in flight."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from genconf.plan.specs import HYBRID_LAYER_KINDS, ModelSpec, ParallelPlan

MAX_LAYOUT_STAGES = 16_384
"""Virtual stages a layout string may unroll to (pp x vp; limits.py caps vp at 16,384 too)."""


@functools.lru_cache(maxsize=256)
def parse_layout(text: str) -> tuple[int, ...]:
    """Decoder layers of each virtual stage of a megatron-core pipeline layout string, in its flattened order
    (virtual stage chunk * pp + rank: rank r runs stages r, r + pp, ...).

    The grammar is megatron-core's (PipelineParallelLayerLayout.parse_str_to_list): 'E' embedding, 't' a
    transformer layer, 'L' the output layer and loss, '|' between virtual stages, 'x*n' and '(...)*n' repeat,
    commas are cosmetic; the embedding opens the first stage and the loss closes the last
    (validate_layer_layout); multi-token-prediction layers 'm' stand in the last stage before the loss (genconf
    places them there: layout_mtp_layers counts them). Raises ValueError with the reason.
    """
    s = text.replace(",", "")
    if not s or len(s) > 10_000:
        raise ValueError("a pipeline layout is a non-empty megatron layout string such as 'Et*2|(t*2|)*6tL'")
    bad = sorted(set(re.sub(r"[EtmL|()*0-9]", "", s)))
    if bad:
        raise ValueError(f"pipeline layout: unknown character(s) {''.join(bad)!r} (E embedding, t layer, L loss, "
                         f"| between virtual stages, *n repeats)")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        def unroll(match: re.Match) -> str:
            times = int(match.group(2))
            if len(match.group(1)) * times > MAX_LAYOUT_STAGES * 64:
                raise ValueError(f"pipeline layout: {match.group(0)!r} unrolls too far (at most {MAX_LAYOUT_STAGES} "
                                 f"virtual stages)")
            return match.group(1) * times
        s = re.sub(pattern, unroll, s)
    if re.search(r"[()*0-9]", s):
        raise ValueError(f"pipeline layout {text!r}: unbalanced parentheses or a repeat without a count")
    stages = s.split("|")
    if len(stages) > MAX_LAYOUT_STAGES:
        raise ValueError(f"pipeline layout: {len(stages)} virtual stages, more than {MAX_LAYOUT_STAGES}")
    flat = "".join(stages)
    if flat.count("E") != 1 or not flat.startswith("E"):
        raise ValueError("pipeline layout: the embedding 'E' comes exactly once, first")
    if flat.count("L") != 1 or not flat.endswith("L"):
        raise ValueError("pipeline layout: the loss 'L' comes exactly once, last")
    if "m" in "".join(stages[:-1]) or not re.fullmatch(r"[Et]*m*L", stages[-1]):
        raise ValueError("pipeline layout: genconf places multi-token-prediction layers 'm' in the loss's stage, "
                         "after its decoder layers and before the 'L' ('...t*3mL'); megatron-core also takes them in a "
                         "virtual stage of their own ('...,m|L'), which genconf does not price")
    return tuple(stage.count("t") for stage in stages)


@functools.lru_cache(maxsize=256)  # the rules ask per candidate (rules._architecture)
def layout_mtp_layers(text: str) -> int:
    """Multi-token-prediction layers ('m') a layout places (all in its last stage)."""
    s = text.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        s = re.sub(pattern, lambda match: match.group(1) * int(match.group(2)), s)
    return s.count("m")


def format_layout(counts: tuple[int, ...] | list[int], mtp: int = 0) -> str:
    """The megatron-core layout string of decoder layers per virtual stage (flattened order, embedding on the
    first, the model's `mtp` multi-token-prediction layers and the loss on the last), runs of equal stages written as
    (...|)*n: parse_layout's inverse."""
    if not counts:
        raise ValueError("a pipeline layout needs at least one virtual stage")

    def layers(k: int) -> str:
        return "" if k == 0 else ("t" if k == 1 else f"t*{k}")

    last = len(counts) - 1
    pieces = [("E" if i == 0 else "") + layers(k) + ("m" * mtp + "L" if i == last else "") + ("|" if i < last else "")
              for i, k in enumerate(counts)]
    out, i = [], 0
    while i < len(pieces):
        j = i
        while 0 < i < last and j + 1 < last and pieces[j + 1] == pieces[i]:
            j += 1
        if j > i:
            out.append(f"({pieces[i]})*{j - i + 1},")
        else:
            out.append(pieces[i])
        i = j + 1
    return "".join(out)


def layout_vp(text: str, pp: int) -> int:
    """Virtual stages per rank of a layout for pp ranks, as megatron-core derives it (stages / pp, at least 1)."""
    return max(1, len(parse_layout(text)) // max(1, pp))


@functools.lru_cache(maxsize=4096)
def layout_stage_layers(text: str, pp: int, vp: int) -> tuple[int, ...]:
    """Layers per pipeline rank (its virtual stages together) of a layout string for pp ranks x vp stages."""
    counts = parse_layout(text)
    if len(counts) != pp * vp:
        raise ValueError(f"the pipeline layout has {len(counts)} virtual stages, pp x vp = {pp} x {vp} = {pp * vp} "
                         f"(megatron-core derives vp from the layout: {len(counts)} / pp)")
    return tuple(sum(counts[chunk * pp + rank] for chunk in range(vp)) for rank in range(pp))


def placement(plan: ParallelPlan) -> tuple:
    """The plan's fields that place layers on pipeline ranks: (pp, vp, first and last stage layers, embedding and
    loss counted as layers, layout). The search asks the functions below once per plan; they are cached per placement
    (their results depend on nothing else)."""
    return (plan.pp, plan.vp, plan.pp_first_stage_layers, plan.pp_last_stage_layers, plan.pp_embedding_as_layer,
            plan.pp_loss_as_layer, plan.pp_layout)


def stage_layers(num_layers: int, plan: ParallelPlan) -> tuple[int, ...]:
    """Transformer layers on each pipeline rank (its virtual chunks together), as megatron-core splits them.

    Raises ValueError naming the numbers when the split is impossible
    (megatron-core 0.16 TransformerConfig.__post_init__, 'Uneven PP' and account_for_* branches).
    """
    return _stage_layers(num_layers, placement(plan))


@functools.lru_cache(maxsize=4096)
def _stage_layers(num_layers: int, where: tuple) -> tuple[int, ...]:
    """stage_layers of the plan's placement (`where`)."""
    pp, vp, first, last, embedding, loss, layout = where
    if layout is not None:
        if first is not None or last is not None or embedding or loss:
            raise ValueError("a pipeline layout places every layer itself: it cannot be combined with first/last "
                             "stage layers or counting the embedding/loss as layers")
        if pp == 1:
            raise ValueError("a pipeline layout needs pp > 1")
        counts = layout_stage_layers(layout, pp, vp)
        if sum(counts) != num_layers:
            raise ValueError(f"the pipeline layout places {sum(counts)} layers, the model has {num_layers}")
        return counts
    if (first is not None or last is not None) and (embedding or loss):
        raise ValueError("explicit first/last stage layers cannot be combined with counting the embedding/loss as layers")
    if pp == 1:
        if first is not None or last is not None or embedding or loss:  # ParallelPlan.uneven_pipeline
            raise ValueError("uneven pipeline settings need pp > 1")
        if num_layers % vp:
            raise ValueError(f"num_layers ({num_layers}) is not divisible by vp ({vp})")
        return (num_layers,)
    if first is not None or last is not None:
        middle_layers, middle_stages = num_layers, pp
        for count in (first, last):
            if count is not None:
                if count % vp:
                    raise ValueError(f"{count} layers on an end stage are not divisible by vp ({vp})")
                middle_layers -= count
                middle_stages -= 1
        if middle_layers < 0 or bool(middle_layers) != bool(middle_stages):
            raise ValueError(f"{middle_layers} layers left for {middle_stages} middle stages "
                             f"(num_layers {num_layers}, first {first}, last {last}, pp {pp})")
        per_middle = middle_layers // middle_stages if middle_stages else 0
        if middle_stages and (middle_layers % middle_stages or per_middle % vp):
            raise ValueError(f"{middle_layers} middle layers do not split evenly over {middle_stages} stages x vp {vp}")
        counts = [per_middle] * pp
        if first is not None:
            counts[0] = first
        if last is not None:
            counts[-1] = last
        return tuple(counts)
    slots = num_layers + int(embedding) + int(loss)
    if slots % (pp * vp):
        what = f"num_layers ({num_layers})" if slots == num_layers else f"num_layers + embedding/loss ({slots})"
        raise ValueError(f"{what} is not divisible by pp x vp ({pp} x {vp} = {pp * vp})")
    per_stage = slots // pp
    counts = [per_stage] * pp
    counts[0] -= int(embedding)
    counts[-1] -= int(loss)
    if min(counts) < 0:
        raise ValueError(f"a pipeline stage would hold {min(counts)} layers")
    return tuple(counts)


def chunk_layers(num_layers: int, plan: ParallelPlan, stage: int) -> tuple[int, ...]:
    """Layers of each of pipeline rank `stage`'s vp model chunks, in chunk order (megatron-core
    get_transformer_layer_offset / the layout's stages chunk * pp + stage). With the embedding or loss counted
    as a layer, the first chunk of the first rank and the last chunk of the last rank hold one layer less."""
    return _chunk_layers(num_layers, placement(plan), stage)


@functools.lru_cache(maxsize=16384)
def _chunk_layers(num_layers: int, where: tuple, stage: int) -> tuple[int, ...]:
    """chunk_layers of the plan's placement (`where`)."""
    pp, vp, _, _, embedding, loss, layout = where
    if layout is not None and pp > 1:
        counts = parse_layout(layout)
        return tuple(counts[chunk * pp + stage] for chunk in range(vp))
    total = _stage_layers(num_layers, where)[stage]
    if embedding or loss:
        per_chunk = (num_layers + int(embedding) + int(loss)) // (pp * vp)
        chunks = [per_chunk] * vp
        if stage == 0 and embedding:
            chunks[0] -= 1
        if stage == pp - 1 and loss:
            chunks[-1] -= 1
        return tuple(chunks)
    return tuple([total // vp] * vp)


def largest_chunk_layers(num_layers: int, plan: ParallelPlan) -> int:
    """The most layers any model chunk of any pipeline rank holds (chunk_layers): the most layers block recompute
    (megatron --recompute-num-layers) can recompute per chunk. Raises ValueError where the split is impossible."""
    return max(max(_chunk_layers(num_layers, placement(plan), stage)) for stage in range(plan.pp))


def layers_in_range_on_rank(num_layers: int, plan: ParallelPlan, stage: int, lo: int, hi: int) -> int:
    """How many of the layers with global index in [lo, hi) pipeline rank `stage` holds: layers fill the virtual
    stages in order (virtual stage chunk * pp + rank; megatron-core get_transformer_layer_offset)."""
    lo, hi = max(0, lo), min(num_layers, hi)
    if hi <= lo:
        return 0
    return _layers_in_range_on_rank(num_layers, placement(plan), stage, lo, hi)


@functools.lru_cache(maxsize=16384)
def _layers_in_range_on_rank(num_layers: int, where: tuple, stage: int, lo: int, hi: int) -> int:
    """layers_in_range_on_rank of the plan's placement (`where`), lo < hi inside the model."""
    pp, vp = where[:2]
    virtual = [_chunk_layers(num_layers, where, rank) for rank in range(pp)]
    start = held = 0
    for chunk in range(vp):
        for rank in range(pp):
            count = virtual[rank][chunk]
            if rank == stage:
                held += max(0, min(hi, start + count) - max(lo, start))
            start += count
    return held


def dense_layers_on_rank(model: ModelSpec, plan: ParallelPlan, stage: int) -> int:
    """How many of a (non-hybrid) MoE model's dense layers pipeline rank `stage` holds: the first_k_dense_replace
    ones sit on the earliest virtual stages, interleaved ones (moe_layer_interval) wherever their indices fall."""
    return sum(dense_layers_in_chunks(model, plan, stage))


def dense_layers_in_chunks(model: ModelSpec, plan: ParallelPlan, stage: int) -> tuple[int, ...]:
    """dense_layers_on_rank for each of rank `stage`'s vp model chunks, in chunk order."""
    if not model.is_moe or model.is_hybrid or not model.dense_layers:
        return (0,) * plan.vp
    if model.moe_layer_interval == 1:  # a dense prefix: count it by ranges (the search asks per plan)
        k = model.first_k_dense_replace
        return tuple(max(0, min(k, end) - start) for start, end in chunk_ranges(model.num_layers, plan, stage))
    return tuple(p.count("-") for p in chunk_mlp_patterns(model, plan, stage))


def dense_layer_mix(model: ModelSpec, plan: ParallelPlan, stage: int,
                    recompute_layers: int | None = None) -> tuple[int, int, int, int]:
    """Where a (non-hybrid) MoE model's dense layers sit among rank `stage`'s layers, for pricing them per kind:
    (dense layers, dense layers among the recomputed ones, MoE layers among the recomputed ones, dense layers among
    the BF16 end layers). The recomputed ones are the first `recompute_layers` of each model chunk (megatron block
    recompute; the plan's own under full recompute where not given), every layer without block recompute.
    (0, 0, 0, 0) for a model without dense layers."""
    if not model.is_moe or model.is_hybrid or not model.dense_layers:
        return (0, 0, 0, 0)
    if recompute_layers is None and plan.recompute == "full":
        recompute_layers = plan.recompute_layers
    return _dense_layer_mix(model, placement(plan), stage, model.num_layers if recompute_layers is None
                            else recompute_layers, plan.bf16_edge_layers)


@functools.lru_cache(maxsize=16384)
def _mlp_pattern(model: ModelSpec) -> str:
    """ModelSpec.mlp_pattern, built once a model."""
    return model.mlp_pattern


@functools.lru_cache(maxsize=16384)
def _dense_layer_mix(model: ModelSpec, where: tuple, stage: int, recomputed: int,
                     edges: tuple[int, int]) -> tuple[int, int, int, int]:
    """dense_layer_mix of the plan's placement (`where`), `recomputed` layers at the start of each chunk."""
    pattern = _mlp_pattern(model)
    first, last = edges
    tail = max(first, model.num_layers - last)
    dense = dense_recomputed = moe_recomputed = dense_bf16 = 0
    for start, end in _chunk_ranges(model.num_layers, where, stage):
        cut = min(end, start + recomputed)
        dense += pattern.count("-", start, end)
        dense_recomputed += pattern.count("-", start, cut)
        moe_recomputed += pattern.count("E", start, cut)
        dense_bf16 += pattern.count("-", start, min(first, end)) + pattern.count("-", max(tail, start), end)
    return dense, dense_recomputed, moe_recomputed, dense_bf16


def chunk_ranges(num_layers: int, plan: ParallelPlan, stage: int) -> tuple[tuple[int, int], ...]:
    """[start, end) global layer indices of each of rank `stage`'s vp model chunks: layers fill the virtual stages in
    order chunk * pp + rank (megatron-core get_transformer_layer_offset; a layout's stages in its flattened order)."""
    return _chunk_ranges(num_layers, placement(plan), stage)


@functools.lru_cache(maxsize=16384)
def _chunk_ranges(num_layers: int, where: tuple, stage: int) -> tuple[tuple[int, int], ...]:
    """chunk_ranges of the plan's placement (`where`)."""
    pp, vp = where[:2]
    virtual = [_chunk_layers(num_layers, where, rank) for rank in range(pp)]
    start, out = 0, []
    for chunk in range(vp):
        for rank in range(pp):
            count = virtual[rank][chunk]
            if rank == stage:
                out.append((start, start + count))
            start += count
    return tuple(out)


def chunk_mlp_patterns(model: ModelSpec, plan: ParallelPlan, stage: int) -> tuple[str, ...]:
    """A non-hybrid model's MLP kinds (ModelSpec.mlp_pattern: '-' dense, 'E' MoE) in each of rank `stage`'s model
    chunks, in layer order."""
    pattern = model.mlp_pattern
    return tuple(pattern[start:end] for start, end in chunk_ranges(model.num_layers, plan, stage))


def bf16_layers_on_rank(num_layers: int, plan: ParallelPlan, stage: int) -> int:
    """How many of the plan's BF16 end layers (ParallelPlan.bf16_edge_layers: the first and the last of the network,
    megatron-core fp8_utils.is_first_last_bf16_layer) pipeline rank `stage` holds."""
    first, last = plan.bf16_edge_layers
    if not first and not last:
        return 0
    return _bf16_layers_per_rank(num_layers, plan.pp, plan.vp, plan.pp_first_stage_layers, plan.pp_last_stage_layers,
                                 plan.pp_embedding_as_layer, plan.pp_loss_as_layer, plan.pp_layout, first, last)[stage]


@functools.lru_cache(maxsize=4096)
def _bf16_layers_per_rank(num_layers: int, pp: int, vp: int, first_stage: int | None, last_stage: int | None,
                          embedding: bool, loss: bool, layout: str | None, first: int, last: int) -> tuple[int, ...]:
    """bf16_layers_on_rank for every rank at once, from the fields that place layers (the search asks per plan)."""
    plan = ParallelPlan(framework="megatron", pp=pp, vp=vp, pp_first_stage_layers=first_stage,
                        pp_last_stage_layers=last_stage, pp_embedding_as_layer=embedding, pp_loss_as_layer=loss,
                        pp_layout=layout)
    tail = max(first, num_layers - last)
    virtual = [chunk_layers(num_layers, plan, rank) for rank in range(pp)]
    held = [0] * pp
    start = 0
    for chunk in range(vp):
        for rank in range(pp):
            end = start + virtual[rank][chunk]
            held[rank] += max(0, min(first, end) - start) + max(0, end - max(tail, start))
            start = end
    return tuple(held)


def chunk_patterns(model: ModelSpec, plan: ParallelPlan, stage: int) -> tuple[str, ...]:
    """A hybrid model's layers (hybrid_pattern symbols) in each of rank `stage`'s model chunks: megatron-core
    cuts the pattern into contiguous runs, one per virtual stage in order chunk * pp + rank (MambaStack's layer
    offset, as get_transformer_layer_offset)."""
    return tuple(model.hybrid_pattern[start:end] for start, end in chunk_ranges(model.num_layers, plan, stage))


def hybrid_kinds_on_rank(model: ModelSpec, plan: ParallelPlan, stage: int) -> tuple[tuple[str, int], ...]:
    """(symbol, layers) a hybrid model's pipeline rank `stage` holds, in HYBRID_LAYER_KINDS order."""
    held = "".join(chunk_patterns(model, plan, stage))
    return tuple((k, held.count(k)) for k in HYBRID_LAYER_KINDS if held.count(k))


def hybrid_layer_mix(model: ModelSpec, plan: ParallelPlan, stage: int,
                     recompute_layers: int | None = None) -> tuple[tuple[str, int, int, int], ...]:
    """Where a hybrid model's layer kinds sit among rank `stage`'s layers, for pricing their activations per kind:
    (symbol, layers, layers among the recomputed ones, layers among the BF16 end layers) for each kind the rank
    holds, in HYBRID_LAYER_KINDS order. The recomputed ones are the first `recompute_layers` of each model chunk
    (megatron block recompute; the plan's own under full recompute where not given), every layer without block
    recompute (as dense_layer_mix). () for a transformer."""
    if not model.is_hybrid:
        return ()
    if recompute_layers is None and plan.recompute == "full":
        recompute_layers = plan.recompute_layers
    return _hybrid_layer_mix(model.hybrid_pattern, placement(plan), stage, model.num_layers if recompute_layers is None
                             else recompute_layers, plan.bf16_edge_layers)


@functools.lru_cache(maxsize=16384)
def _hybrid_layer_mix(pattern: str, where: tuple, stage: int, recomputed: int,
                      edges: tuple[int, int]) -> tuple[tuple[str, int, int, int], ...]:
    """hybrid_layer_mix of the plan's placement (`where`), `recomputed` layers at the start of each chunk."""
    first, last = edges
    num_layers = len(pattern)
    tail = max(first, num_layers - last)
    held = recomputed_held = bf16_held = ""
    for start, end in _chunk_ranges(num_layers, where, stage):
        held += pattern[start:end]
        recomputed_held += pattern[start:min(end, start + recomputed)]
        bf16_held += pattern[start:min(first, end)] + pattern[max(tail, start):end]
    return tuple((k, held.count(k), recomputed_held.count(k), bf16_held.count(k))
                 for k in HYBRID_LAYER_KINDS if k in held)


def hybrid_mix_first_ranks(model: ModelSpec, plan: ParallelPlan) -> tuple[int, ...]:
    """The first pipeline rank of each (layers, hybrid_layer_mix) a hybrid model's ranks hold, found once a placement
    (estimate() asks for every plan the search prices)."""
    recompute_layers = plan.recompute_layers if plan.recompute == "full" else None
    return _hybrid_mix_first_ranks(model.hybrid_pattern, placement(plan), model.num_layers if recompute_layers is None
                                   else recompute_layers, plan.bf16_edge_layers)


@functools.lru_cache(maxsize=4096)
def _hybrid_mix_first_ranks(pattern: str, where: tuple, recomputed: int, edges: tuple[int, int]) -> tuple[int, ...]:
    """hybrid_mix_first_ranks of the plan's placement (`where`)."""
    firsts, seen = [], set()
    for stage, layers in enumerate(_stage_layers(len(pattern), where)):
        key = (layers, _hybrid_layer_mix(pattern, where, stage, recomputed, edges))
        if key not in seen:
            seen.add(key)
            firsts.append(stage)
    return tuple(firsts)


def inflight_chunks(plan: ParallelPlan, stage: int) -> int:
    """Model-chunk forward passes whose activations stage `stage` holds at its peak.

    1F1B: the first stage keeps p micro-batches (Korthikanti 2022, eq. 5 discussion); stage i keeps p - i.
    Interleaved: megatron-core's warm-up count (p - i - 1) * 2 + (v - 1) * p, plus the one in flight,
    which gives the first stage L * (1 + (p-1)/(p*v)) layers' worth (Korthikanti 2022, Sec. 4.2.3).
    MoE EP overlap (combined 1F1B) leaves the count as it is: its one extra warm-up forward (megatron-core
    get_pp_rank_microbatches) takes the place of the steady state's forward before each backward, and in the combined
    step the forward's layers fill as the paired backward's free (model_chunk_schedule_plan.py), one layer apart.
    """
    m = plan.num_microbatches
    if plan.pp == 1:
        return 1
    if plan.vp == 1:
        return max(1, min(m, plan.pp - stage))
    warmup = (plan.pp - stage - 1) * 2 + (plan.vp - 1) * plan.pp
    return max(1, min(m * plan.vp, warmup + 1))


def bubble_fraction(plan: ParallelPlan) -> float:
    """Pipeline bubble relative to ideal time: (p-1)/(v*m) (Narayanan 2021, Sec. 2.2; seed 003)."""
    if plan.pp == 1:
        return 0.0
    return (plan.pp - 1) / (plan.vp * max(1, plan.num_microbatches))


# --- the schedule itself --------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class PipelineBlock:
    """One forward or backward pass of one micro-batch through one model chunk on one pipeline rank."""

    stage: int
    """Pipeline rank, 0 = first."""
    microbatch: int
    chunk: int
    """Virtual stage (model chunk) on this rank, 0..vp-1; the chunk runs layers of virtual stage chunk*pp+stage."""
    forward: bool
    start_s: float
    end_s: float


def _interleaved_table(m: int, v: int, group: int) -> list[tuple[int, int]]:
    """(micro-batch, chunk) of the k-th forward on a rank: megatron-core schedules.get_schedule_table, micro-batches
    taken `group` (= pp) at a time through every chunk."""
    table: list[tuple[int, int]] = []
    for first in range(0, m, group):
        last = m if first + group >= m else first + group
        table += [(mb, chunk) for chunk in range(v) for mb in range(first, last)]
    return table


def schedule_order(plan: ParallelPlan, stage: int) -> list[tuple[bool, int, int]]:
    """The (forward?, micro-batch, chunk) passes rank `stage` runs, in order: megatron-core's 1F1B
    (forward_backward_pipelining_without_interleaving: p - i - 1 warm-up forwards, then one forward one backward,
    then the cool-down backwards) or its interleaved schedule (warm-up (p - i - 1) * 2 + (v - 1) * p, capped at
    m * v; megatron-core 0.16 get_pp_rank_microbatches and get_schedule_table), the counts `inflight_chunks` reads."""
    p, v, m = plan.pp, plan.vp, plan.num_microbatches
    if p == 1:
        # forward_backward_no_pipelining: each micro-batch forward then backward (gradient accumulation).
        return [(fwd, mb, chunk) for mb in range(m)
                for fwd, chunk in [(True, c) for c in range(v)] + [(False, c) for c in reversed(range(v))]]
    total = m * v
    if v == 1:
        warmup = min(p - stage - 1, m)
        fwd = bwd = [(mb, 0) for mb in range(m)]
    else:
        warmup = min(total, (p - stage - 1) * 2 + (v - 1) * p)
        fwd = _interleaved_table(m, v, p)
        bwd = [(mb, v - 1 - chunk) for mb, chunk in fwd]
    order: list[tuple[bool, int, int]] = [(True, *fwd[k]) for k in range(warmup)]
    for k in range(total - warmup):
        order += [(True, *fwd[warmup + k]), (False, *bwd[k])]
    order += [(False, *bwd[k]) for k in range(total - warmup, total)]
    return order


def simulate_schedule(plan: ParallelPlan, forward_s: list[float] | tuple[float, ...],
                      backward_s: list[float] | tuple[float, ...], p2p_s: float = 0.0) -> tuple[PipelineBlock, ...]:
    """Start and end of every pass when each rank runs `schedule_order` as soon as its inputs have arrived.

    forward_s / backward_s: one model chunk's pass for one micro-batch on each rank (seconds, pp entries).
    A forward needs the previous virtual stage's forward of that micro-batch, a backward the next virtual
    stage's backward; a hand-off between ranks takes p2p_s. With equal stages the idle time this leaves is
    the (p-1)/(v*m) bubble of `bubble_fraction` (Narayanan 2021, Sec. 2.2).
    """
    p, v = plan.pp, plan.vp
    if len(forward_s) != p or len(backward_s) != p:
        raise ValueError(f"need one forward and one backward time per stage ({p}), got {len(forward_s)}, {len(backward_s)}")
    orders = [schedule_order(plan, r) for r in range(p)]
    done: dict[tuple[bool, int, int], float] = {}  # (forward?, micro-batch, virtual stage) -> end time
    free = [0.0] * p
    nxt = [0] * p
    blocks: list[PipelineBlock] = []
    last_virtual = p * v - 1
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for r in range(p):
            while nxt[r] < len(orders[r]):
                forward, mb, chunk = orders[r][nxt[r]]
                virtual = chunk * p + r
                if forward:
                    dep = (True, mb, virtual - 1) if virtual > 0 else None
                else:
                    dep = (False, mb, virtual + 1) if virtual < last_virtual else (True, mb, virtual)
                if dep is not None and dep not in done:
                    break
                ready = 0.0 if dep is None else done[dep] + (p2p_s if dep[2] % p != r else 0.0)
                start = max(free[r], ready)
                end = start + (forward_s[r] if forward else backward_s[r])
                done[(forward, mb, virtual)] = end
                free[r] = end
                blocks.append(PipelineBlock(stage=r, microbatch=mb, chunk=chunk, forward=forward, start_s=start, end_s=end))
                nxt[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise ValueError(f"pipeline schedule deadlocks for pp={p} vp={v} m={plan.num_microbatches}")
    return tuple(sorted(blocks, key=lambda b: (b.stage, b.start_s)))
def dp_overlap_passes(plan: ParallelPlan) -> float:
    """How many of a stage's per-micro-batch backward (or forward) passes the data-parallel gradient
    reduce-scatter (or the next step's parameter all-gather) can hide behind.

    megatron-core launches a chunk's gradient reduction when that chunk's last micro-batch backward fills its
    buckets (DistributedDataParallel.overlap_grad_reduce; the schedules enable grad sync per model chunk). Without
    interleaving that is the last micro-batch's backward: 1 pass. With v chunks the last round runs the backward
    of p micro-batches on each chunk, v-1 .. 0, so chunk c's reduction hides behind the c x p chunk-backwards
    after it: the stream has ((v - 1) p + 1) / v whole-stage passes to fill (megatron-core
    pipeline_parallel/schedules.py, forward_backward_pipelining_with_interleaving). The parameter all-gather of
    overlap_param_gather mirrors it over the first round of forwards.
    """
    if plan.pp == 1 or plan.vp == 1:
        return 1.0
    return ((plan.vp - 1) * min(plan.pp, plan.num_microbatches) + 1) / plan.vp


def recomputed_layers(plan: ParallelPlan, stage_layer_count: int) -> int:
    """Layers of a pipeline rank that full recompute re-runs: all of them, or recompute_layers of each of
    its vp model chunks (megatron --recompute-method block --recompute-num-layers N)."""
    if plan.recompute != "full":
        return 0
    if plan.recompute_layers is None:
        return stage_layer_count
    per_chunk = stage_layer_count // plan.vp
    return min(plan.recompute_layers, per_chunk) * plan.vp
