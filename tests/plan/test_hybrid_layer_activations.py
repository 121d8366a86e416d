"""A hybrid Mamba model's pipeline rank holds its own mix of Mamba-2, attention, MLP and MoE layers
(ModelSpec.hybrid_pattern): stage_memory prices each rank's activations by its own kinds, not the model's mean layer,
and estimate() prices every rank whose mix could hold the peak. The expected figures here are summed layer by layer
from the pattern (independently of pipeline.hybrid_layer_mix). No measured case: megatron-core's MambaMixer needs
mamba_ssm's Triton kernels and Transformer Engine (its mamba_stack_spec), which the CPU measurement harness
(genconf/train/activations.py) has not got."""

from __future__ import annotations

import dataclasses

import pytest

from genconf.catalog.clusters import resolve_cluster
from genconf.catalog.models import resolve_model
from genconf.plan import memory as mem
from genconf.plan import pipeline
from genconf.plan.specs import ModelSpec, ParallelPlan


def _model(name: str) -> ModelSpec:
    return resolve_model(name)[0]


def _plan(**kw) -> ParallelPlan:
    return ParallelPlan(**{"framework": "megatron", "tp": 2, "pp": 4, "dp": 2, "mbs": 1, "gbs": 32,
                           "seq_length": 8192, "recompute": "none", **kw})


def _rank_layers(model: ModelSpec, plan: ParallelPlan, stage: int) -> list[str]:
    """The rank's layer symbols, one chunk after another (megatron-core's contiguous split of the pattern)."""
    counts = pipeline.stage_layers(model.num_layers, plan)
    start = sum(counts[:stage])
    return list(model.hybrid_pattern[start:start + counts[stage]])


def _extras_saved(model: ModelSpec, plan: ParallelPlan, stage: int) -> float:
    """The embedding's and the loss's saved bytes on this stage (not the layers')."""
    first_chunks = min(plan.num_microbatches, plan.pp)
    return mem._stage_extras(model, plan, stage, first_chunks, mem.inflight_chunks(plan, stage))[0]


@pytest.mark.parametrize("name, pp", [("nemotron-3-nano", 4), ("nemotron-h-8b", 13)])
def test_each_rank_s_activations_are_its_own_layers_at_their_own_kinds(name, pp):
    """vp 1, no recompute: every rank's layer activations are the sum over its layers of that kind's bytes, times
    the micro-batches it keeps in flight (pp - stage under 1F1B); they differ from the mean-layer figure (the
    model's mean layer x the rank's layers) where the rank's mix differs from the model's: on every rank of
    nemotron-3-nano at pp 4 (6 M, 2 *, 5 E on rank 0; the model 23, 6, 23), on most of nemotron-h-8b's at pp 13
    (MM-- beside M*M-; at pp 2 or 4 its ranks hold the model's own mix)."""
    model, plan = _model(name), _plan(pp=pp)
    per_kind = {k: mem.layer_activation_bytes(model, plan, kind=k) for k in set(model.hybrid_pattern)}
    mean = mem.layer_activation_bytes(model, plan)
    assert len(set(per_kind.values())) == len(per_kind)  # the kinds differ
    differs = 0
    for stage in range(plan.pp):
        inflight = mem.inflight_chunks(plan, stage)
        assert inflight == plan.pp - stage
        layers = _rank_layers(model, plan, stage)
        expected = sum(per_kind[k] for k in layers) * inflight
        got = mem.stage_memory(model, plan, stage).activations_bytes - _extras_saved(model, plan, stage)
        assert got == pytest.approx(expected, abs=2)  # (bytes: int rounding)
        differs += abs(got - mean * len(layers) * inflight) > 2**20
    assert differs == (plan.pp if name == "nemotron-3-nano" else 13)


@pytest.mark.parametrize("k", [1, 3])
def test_block_recompute_keeps_each_chunk_s_first_layers_at_their_input(k):
    """Block recompute of k layers (megatron --recompute-method block): each rank's first k layers keep only their
    input, its other layers everything at their own kind's bytes; the backward's transient recomputed layer is the
    largest kind among those k (nemotron-h-8b, pp 8 with 3 layers on rank 0 and 7 on the others: rank 1 opens with
    an MLP layer, rank 3 with a Mamba one)."""
    model = _model("nemotron-h-8b")
    plan = _plan(tp=1, pp=8, dp=8, gbs=128, seq_length=4096, pp_first_stage_layers=3, recompute="full",
                 recompute_layers=k)
    kinds = set(model.hybrid_pattern)
    whole = {kind: mem.layer_activation_bytes(model, plan, kind=kind, recompute="none") for kind in kinds}
    kept = {kind: mem.layer_activation_bytes(model, plan, kind=kind) for kind in kinds}
    assert len(set(kept.values())) == 1  # full recompute keeps the layer input, whatever the kind
    for stage in range(plan.pp):
        layers = _rank_layers(model, plan, stage)
        inflight = mem.inflight_chunks(plan, stage)
        expected = (sum(kept[x] for x in layers[:k]) + sum(whole[x] for x in layers[k:])) * inflight
        got = mem.stage_memory(model, plan, stage)
        assert got.activations_bytes - _extras_saved(model, plan, stage) == pytest.approx(expected, abs=2)
        transient = dict(got.other).get("recomputed layer during backward")
        if transient is not None:  # (the last stage's loss buffers may be larger)
            assert transient == int(max(whole[x] for x in layers[:k]))
    if k == 1:
        assert _rank_layers(model, plan, 1)[0] == "-" and _rank_layers(model, plan, 3)[0] == "M"
        assert whole["-"] != whole["M"]
        assert dict(mem.stage_memory(model, plan, 1).other)["recomputed layer during backward"] == int(whole["-"])
        assert dict(mem.stage_memory(model, plan, 3).other)["recomputed layer during backward"] == int(whole["M"])


def test_offloaded_layers_are_the_first_ones_each_at_its_own_kind():
    """TE's CPU offload takes the first layers: nemotron-h-8b's first 5 are M-M-M, 3 Mamba and 2 MLP layers."""
    model, plan = _model("nemotron-h-8b"), _plan(pp=1, dp=8)
    assert model.hybrid_pattern[:5] == "M-M-M"
    m, mlp = (mem.layer_activation_bytes(model, plan, kind=k) for k in "M-")
    assert mem.offloaded_activation_bytes(model, plan, 5) == pytest.approx(3 * m + 2 * mlp)


def test_bf16_end_layers_are_priced_at_their_own_kind():
    """FP8 with the first and last layer in BF16: rank 0's first layer is Mamba, the last rank's last is MLP."""
    model = _model("nemotron-h-8b")
    plan = _plan(precision="fp8", fp8_recipe="blockwise", bf16_layers_start=1, bf16_layers_end=1)
    assert plan.bf16_edge_layers == (1, 1) and model.hybrid_pattern[0] == "M" and model.hybrid_pattern[-1] == "-"
    per_kind = {k: mem.layer_activation_bytes(model, plan, kind=k) for k in set(model.hybrid_pattern)}
    for stage, edge in ((0, "M"), (plan.pp - 1, "-")):
        bf16 = mem.layer_activation_bytes(model, plan, kind=edge, bf16=True)
        assert bf16 != per_kind[edge]
        layers = _rank_layers(model, plan, stage)
        expected = (sum(per_kind[k] for k in layers) + bf16 - per_kind[edge]) * mem.inflight_chunks(plan, stage)
        got = mem.stage_memory(model, plan, stage).activations_bytes - _extras_saved(model, plan, stage)
        assert got == pytest.approx(expected, abs=2)


@pytest.mark.parametrize("name, pp, first", [("nemotron-h-8b", 4, None), ("nemotron-3-nano", 4, None),
                                             ("nemotron-h-8b", 13, None), ("nemotron-3-nano", 6, 2),
                                             ("nemotron-h-56b", 2, None), ("nemotron-3-super", 8, None)])
def test_estimate_prices_the_heaviest_rank(name, pp, first):
    """estimate()'s peak is the brute-force max over every pipeline rank (each distinct layer mix's first rank is
    priced; a later rank of the same mix holds fewer micro-batches in flight)."""
    model = _model(name)
    plan = _plan(tp=1, pp=pp, dp=8 // pp if pp < 8 else 1, gbs=8 * pp, pp_first_stage_layers=first)
    cluster = resolve_cluster("dgx-h100")
    est = mem.estimate(model, plan, cluster)
    capacity = int(cluster.gpu.hbm_gib * 2**30)
    brute = max(mem.stage_memory(model, plan, s, fp8_any_layout=cluster.gpu.fp8_gemm_any_layout,
                                 capacity_bytes=capacity).total_bytes for s in range(plan.pp))
    assert est.peak.total_bytes == brute


def test_a_middle_rank_can_hold_the_peak():
    """nemotron-h-8b, pp 8 with 3 layers on the first rank (M-M) and 7 on each other: rank 1 holds -M-M*-M (one
    attention layer), rank 2 -M-M-M- (an MLP layer in its place, heavier here) with one micro-batch fewer in
    flight, and is the heavier; stage 0, stage 1 and the last alone would miss it (the mean layer made them equal)."""
    model = _model("nemotron-h-8b")
    plan = _plan(tp=1, pp=8, dp=8, gbs=128, seq_length=4096, pp_first_stage_layers=3)
    assert "".join(_rank_layers(model, plan, 1)) == "-M-M*-M" and "".join(_rank_layers(model, plan, 2)) == "-M-M-M-"
    cluster = resolve_cluster("dgx-h100")
    est = mem.estimate(model, plan, cluster)
    totals = [mem.stage_memory(model, plan, s, capacity_bytes=est.capacity_bytes).total_bytes for s in range(plan.pp)]
    heaviest = max(range(plan.pp), key=totals.__getitem__)
    assert heaviest == 2 and est.peak.stage == 2 and est.peak.total_bytes == totals[2]
    assert 2 not in mem._stages_to_check(plan.pp, plan.uneven_pipeline)


def test_the_savers_offer_a_hybrid_plan_neither_full_recompute_nor_offload():
    """megatron-core's MambaStack has no full recompute and genconf plans no activation offload for a hybrid model
    (rules.hybrid_conflict): the saver ladder (search._savers) offers neither. Nemotron-H 8B at tp 2 on H100s, 84 GiB
    without recompute: the ladder returned block recompute of 50 layers, which the rules then refused."""
    from genconf.plan import rules, search

    model, cluster = _model("nemotron-h-8b"), resolve_cluster("dgx-h100")
    plan = _plan(tp=2, pp=1, dp=4, gbs=64, seq_length=4096)
    est = mem.estimate(model, plan, cluster)
    assert not est.fits
    block = search._block_recompute(model, plan, est)
    assert block is not None and rules.hybrid_conflict(model, block).startswith("megatron-core's MambaStack has no full")
    assert search._savers(model, cluster, plan, search.Pins(), est) == []


@pytest.mark.parametrize("pp, split", [(4, ()), (8, (("pp_first_stage_layers", 3),))])
def test_the_core_floor_stays_below_the_runnable_plans_of_a_hybrid_model(pp, split):
    """search._core_too_big prunes a layout whose leanest plan (full recompute) does not fit; MambaStack runs
    selective or no recompute, which rebuild no whole layer: the largest recomputed kind on the rank is left out of
    the floor, which stays below the runnable selective plan's peak (a layout where that plan fits is kept). A
    1,024-token vocabulary keeps the loss's buffers below the recomputed layer."""
    from genconf.plan import search

    model = dataclasses.replace(_model("nemotron-h-8b"), vocab_size=1024)
    cluster = resolve_cluster("dgx-h100")
    pins = search.Pins()
    layout = search._Layout(framework="megatron", tp=1, cp=1, pp=pp, dp=8, ep=1, vp=1, split=split, zero=1,
                            shard_group=None)
    plan = search._lean_plan(model, layout, pins, 4096)
    assert plan.recompute == "full"
    lean = mem.estimate(model, plan, cluster).peak
    transient = dict(lean.other)["recomputed layer during backward"]
    assert transient == int(max(mem.layer_activation_bytes(model, plan, kind=k, recompute="none")
                                for k in set(_rank_layers(model, plan, lean.stage))))
    runnable = search._lean_plan(model, layout, pins, 4096, runnable=True)
    assert runnable.recompute == "selective"
    fits_at = mem.estimate(model, runnable, cluster).peak.total_bytes
    assert not search._core_too_big(model, cluster, pins, 4096, layout, fits_at, {})
    # The floor: the lean peak less the recomputed layer, the precision-aware optimizer's saving and the step's fp32
    # gradients (the savers the search may still add).
    floor = lean.total_bytes - transient - lean.optimizer_bytes / 6 - mem.step_transient_bytes(model, plan, lean.stage)
    assert not search._core_too_big(model, cluster, pins, 4096, layout, floor, {})
    assert search._core_too_big(model, cluster, pins, 4096, layout, floor - 2**20, {})
