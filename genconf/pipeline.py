"""How layers split over pipeline stages, and how many micro-batches each stage keeps in flight."""

from __future__ import annotations

from genconf.specs import ParallelPlan


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
