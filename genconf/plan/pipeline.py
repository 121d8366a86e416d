"""How layers split over pipeline stages, and how many micro-batches each stage keeps in flight."""

from __future__ import annotations

from dataclasses import dataclass

from genconf.plan.specs import ParallelPlan


def stage_layers(num_layers: int, plan: ParallelPlan) -> tuple[int, ...]:
    """Transformer layers on each pipeline rank (its virtual chunks together), as megatron-core splits them.

    Raises ValueError naming the numbers when the split is impossible
    (megatron-core 0.16 TransformerConfig.__post_init__, 'Uneven PP' and account_for_* branches).
    """
    pp, vp = plan.pp, plan.vp
    first, last = plan.pp_first_stage_layers, plan.pp_last_stage_layers
    if (first is not None or last is not None) and (plan.pp_embedding_as_layer or plan.pp_loss_as_layer):
        raise ValueError("explicit first/last stage layers cannot be combined with counting the embedding/loss as layers")
    if pp == 1:
        if plan.uneven_pipeline:
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
    slots = num_layers + int(plan.pp_embedding_as_layer) + int(plan.pp_loss_as_layer)
    if slots % (pp * vp):
        what = f"num_layers ({num_layers})" if slots == num_layers else f"num_layers + embedding/loss ({slots})"
        raise ValueError(f"{what} is not divisible by pp x vp ({pp} x {vp} = {pp * vp})")
    per_stage = slots // pp
    counts = [per_stage] * pp
    counts[0] -= int(plan.pp_embedding_as_layer)
    counts[-1] -= int(plan.pp_loss_as_layer)
    if min(counts) < 0:
        raise ValueError(f"a pipeline stage would hold {min(counts)} layers")
    return tuple(counts)


def inflight_chunks(plan: ParallelPlan, stage: int) -> int:
    """Model-chunk forward passes whose activations stage `stage` holds at its peak.

    1F1B: the first stage keeps p micro-batches (Korthikanti 2022, eq. 5 discussion); stage i keeps p - i.
    Interleaved: megatron-core's warm-up count (p - i - 1) * 2 + (v - 1) * p, plus the one in flight,
    which gives the first stage L * (1 + (p-1)/(p*v)) layers' worth (Korthikanti 2022, Sec. 4.2.3).
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
