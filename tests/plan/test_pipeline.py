"""Pipeline stages and schedules: layers per stage as megatron-core builds them, and the 1F1B / interleaved schedule
simulated pass by pass, whose idle time with equal stages is the (p-1)/(v m) bubble and whose forward passes held
are what the memory model counts in flight."""

from __future__ import annotations

import dataclasses

import pytest

from conftest import needs_megatron
from genconf.plan.pipeline import bubble_fraction, inflight_chunks, schedule_order, simulate_schedule, stage_layers
from genconf.plan.specs import ParallelPlan


def test_405b_uses_embedding_and_loss_as_layers_on_16_stages():
    # Llama-3.1 405B: 126 layers on 16 stages = (126 + 2) / 16, first and last stages hold 7 layers.
    plan = ParallelPlan(framework="megatron", tp=8, pp=16, dp=1, mbs=1, gbs=16, seq_length=8192,
                        pp_embedding_as_layer=True, pp_loss_as_layer=True)
    layers = stage_layers(126, plan)
    assert layers[0] == layers[-1] == 7 and set(layers[1:-1]) == {8} and sum(layers) == 126

@needs_megatron
@pytest.mark.parametrize("num_layers,pp,vp,first,last,emb,loss", [
    (80, 4, 1, None, None, False, False), (80, 6, 1, 12, 12, False, False), (126, 16, 1, None, None, True, True),
    (32, 4, 2, None, None, False, False), (30, 4, 1, 6, 6, False, False), (48, 4, 3, None, None, False, False),
])
def test_stage_layers_match_megatron_core(num_layers, pp, vp, first, last, emb, loss):
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(num_layers=num_layers, hidden_size=64, num_attention_heads=4,
                               pipeline_model_parallel_size=pp,
                               virtual_pipeline_model_parallel_size=vp if vp > 1 else None,
                               num_layers_in_first_pipeline_stage=first, num_layers_in_last_pipeline_stage=last,
                               account_for_embedding_in_pipeline_split=emb, account_for_loss_in_pipeline_split=loss,
                               pipeline_dtype=__import__("torch").float32)
    plan = ParallelPlan(framework="megatron", pp=pp, vp=vp, dp=1, mbs=1, gbs=pp * 2, pp_first_stage_layers=first,
                        pp_last_stage_layers=last, pp_embedding_as_layer=emb, pp_loss_as_layer=loss)
    theirs = tuple(sum(get_num_layers_to_build(config, vp_stage=v if vp > 1 else None, pp_rank=r) for v in range(vp))
                   for r in range(pp))
    assert stage_layers(num_layers, plan) == theirs

def _plan(pp, vp, m):
    return ParallelPlan(framework="megatron", pp=pp, vp=vp, dp=1, mbs=1, gbs=m, seq_length=128)

GRID = [(2, 1, 1), (2, 1, 8), (4, 1, 8), (8, 1, 32), (2, 2, 4), (2, 2, 8), (4, 2, 4), (4, 2, 8), (4, 3, 12),
        (4, 4, 44), (8, 2, 16), (1, 1, 4), (1, 1, 1)]

@pytest.mark.parametrize("pp,vp,m", GRID)
def test_schedule_with_equal_stages_has_the_formula_bubble(pp, vp, m):
    plan = _plan(pp, vp, m)
    forward, backward = 1.0, 2.0  # a backward costs two forwards
    blocks = simulate_schedule(plan, [forward] * pp, [backward] * pp)
    assert len(blocks) == pp * m * vp * 2
    for r in range(pp):
        mine = [b for b in blocks if b.stage == r]
        assert sorted((b.microbatch, b.chunk, b.forward) for b in mine) == sorted(
            (mb, c, f) for mb in range(m) for c in range(vp) for f in (True, False))
        assert all(a.end_s <= b.start_s + 1e-12 for a, b in zip(mine, mine[1:]))  # one pass at a time
    span = max(b.end_s for b in blocks)
    ideal = m * vp * (forward + backward)
    # Seed 003 (Narayanan 2021, Sec. 2.2), worked by hand: a rank's chunk passes take t_f + t_b = v (f + b), the
    # interleaved bubble is (p-1)(t_f + t_b)/v = (p-1)(f + b), so span = (v m + p - 1)(f + b) and the bubble over
    # the ideal m (t_f + t_b) is (p-1)/(v m) (1F1B: v = 1, any m; interleaved: m a multiple of p, as every row here).
    assert span == pytest.approx((vp * m + pp - 1) * (forward + backward), abs=1e-12)
    assert span / ideal - 1 == pytest.approx((pp - 1) / (vp * m), abs=1e-12)
    assert bubble_fraction(plan) == pytest.approx((pp - 1) / (vp * m), abs=1e-12)

@pytest.mark.parametrize("pp,vp,m", GRID)
def test_schedule_holds_the_chunks_the_memory_model_counts(pp, vp, m):
    plan = _plan(pp, vp, m)
    for stage in range(pp):
        held = peak = 0
        for forward, _, _ in schedule_order(plan, stage):
            held += 1 if forward else -1
            peak = max(peak, held)
        assert peak == inflight_chunks(plan, stage)

def test_schedule_respects_every_dependency():
    plan = _plan(4, 2, 8)
    blocks = simulate_schedule(plan, [1.0, 1.5, 1.0, 2.0], [2.0, 3.0, 2.0, 4.0], p2p_s=0.25)
    end = {(b.forward, b.microbatch, b.chunk * 4 + b.stage): b for b in blocks}
    for b in blocks:
        virtual = b.chunk * 4 + b.stage
        before = (end.get((True, b.microbatch, virtual - 1)) if b.forward
                  else end.get((False, b.microbatch, virtual + 1)) or end[(True, b.microbatch, virtual)])
        if before is not None:
            hop = 0.25 if before.stage != b.stage else 0.0
            assert b.start_s >= before.end_s + hop - 1e-12

def test_schedule_refuses_wrong_stage_times():
    with pytest.raises(ValueError, match="one forward and one backward time per stage"):
        simulate_schedule(_plan(4, 1, 8), [1.0] * 3, [2.0] * 4)


def test_the_ep_overlap_keeps_the_chunks_in_flight():
    # megatron-core get_pp_rank_microbatches: with overlap_moe_expert_parallel_comm the interleaved schedule runs one
    # extra warm-up forward, (4 - 0 - 1) x 2 + (2 - 1) x 4 + 1 = 11 on rank 0 of pp 4, vp 2; it stands in for the
    # forward plain 1F1B runs before each backward, and the combined step frees a backward layer per forward layer
    # it adds: the peak stays at 11 chunks, as without the overlap (10 warm-up forwards + the one in flight).
    plan = ParallelPlan(framework="megatron", pp=4, vp=2, ep=8, dp=8, mbs=1, gbs=128, seq_length=4096)
    assert inflight_chunks(plan, 0) == inflight_chunks(dataclasses.replace(plan, moe_ep_overlap=True), 0) == 11
    assert inflight_chunks(dataclasses.replace(plan, moe_ep_overlap=True), 3) == 5
    assert inflight_chunks(dataclasses.replace(plan, pp=1, vp=1, dp=32, moe_ep_overlap=True), 0) == 1
