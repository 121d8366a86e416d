"""An MoE model's dense layers (ModelSpec.first_k_dense_replace, moe_layer_interval) hold a dense layer's activations,
not the MoE layer's: each pipeline rank prices its own mix. The measured bytes (megatron-core's local spec on a CPU)
are in tests/train/test_train.py, test_activation_bytes_match_the_local_spec_estimate (tiny-moe-dense-first,
tiny-moe-interleaved)."""

from __future__ import annotations

import dataclasses

import pytest

from genconf.catalog.clusters import resolve_cluster
from genconf.catalog.models import resolve_model
from genconf.plan import memory as mem
from genconf.plan import pipeline
from genconf.plan.specs import ModelSpec, ParallelPlan


def _deepseek(num_layers: int = 61) -> ModelSpec:
    """DeepSeek-V3 (61 layers); 64 splits evenly over pipeline ranks."""
    model = resolve_model("deepseek-v3")[0]
    return model if num_layers == model.num_layers else dataclasses.replace(model, num_layers=num_layers)


def _all_moe(model: ModelSpec) -> ModelSpec:
    return dataclasses.replace(model, first_k_dense_replace=0, moe_layer_interval=1)


def _plan(**kw) -> ParallelPlan:
    return ParallelPlan(**{"framework": "megatron", "tp": 4, "ep": 8, "dp": 16, "mbs": 1, "gbs": 64,
                           "seq_length": 4096, "recompute": "none", **kw})


def _bytes(model: ModelSpec, plan: ParallelPlan, *, dense: bool, recompute: str | None = None) -> float:
    return mem.layer_activation_bytes(model, plan, dense=dense, recompute=recompute)


@pytest.mark.parametrize("pp", [1, 4])
def test_deepseek_v3_stage_0_holds_its_three_dense_layers_at_a_dense_layer_s_bytes(pp):
    """DeepSeek-V3's first 3 layers (first_k_dense_replace) sit on stage 0: its activations are the all-MoE
    count less 3 x (MoE - dense layer bytes) in each of the pp micro-batches it keeps in flight (1F1B; 64 layers
    where pipelined)."""
    model, plan = _deepseek(61 if pp == 1 else 64), _plan(pp=pp, gbs=64 * pp)
    assert model.first_k_dense_replace == 3
    dense, moe = _bytes(model, plan, dense=True), _bytes(model, plan, dense=False)
    assert 0 < dense < moe  # a 18,432-wide dense MLP saves less than 8 routed experts + a shared one + the router
    assert mem.layer_activation_bytes(_all_moe(model), plan) == moe
    inflight = mem.inflight_chunks(plan, 0)
    assert inflight == pp
    got = mem.stage_memory(model, plan, 0).activations_bytes
    all_moe = mem.stage_memory(_all_moe(model), plan, 0).activations_bytes
    assert got - all_moe == pytest.approx(inflight * 3 * (dense - moe), abs=2)  # (bytes: int rounding)
    if pp > 1:  # the other ranks hold MoE layers only
        assert mem.stage_memory(model, plan, 1).activations_bytes == \
            mem.stage_memory(_all_moe(model), plan, 1).activations_bytes


def test_a_lighter_stage_0_makes_estimate_price_stage_1():
    """pp 16 of 64 layers: stage 0 holds 3 dense + 1 MoE layers, stage 1 four MoE ones with one micro-batch fewer in
    flight; the estimate prices stage 1 too (it was taken for stage 0's equal and left out)."""
    model = _deepseek(64)
    plan = _plan(pp=16, gbs=256)
    est = mem.estimate(model, plan, resolve_cluster("dgx-h100"))
    assert tuple(s.stage for s in est.stages) == (0, 1, 15)
    s0, s1 = est.stages[:2]
    assert s1.activations_bytes > s0.activations_bytes
    # A model without dense layers keeps the two ends.
    assert mem._stages_to_check(16, plan.uneven_pipeline) == (0, 15)


def test_interleaved_dense_layers_are_priced_per_rank():
    """Llama 4 Maverick's pattern -E-E...: pp 2 x vp 2 of a 12-layer toy puts 3 layers in each virtual stage,
    -E- and -E- on rank 0 (4 dense of 6), E-E and E-E on rank 1 (2 of 6); with interleaving the rank's mix is spread
    over its in-flight chunks (layers/vp each)."""
    model = ModelSpec(name="tiny-interleaved", num_layers=12, hidden_size=256, num_attention_heads=8,
                      ffn_hidden_size=512, vocab_size=1024, seq_length=512, activation="swiglu",
                      normalization="rmsnorm", position_embedding="rope", add_bias_linear=False, num_experts=8,
                      moe_top_k=2, moe_ffn_hidden_size=128, moe_layer_interval=2)
    plan = ParallelPlan(framework="megatron", pp=2, vp=2, dp=4, ep=4, mbs=1, gbs=16, seq_length=512)
    dense, moe = _bytes(model, plan, dense=True), _bytes(model, plan, dense=False)
    assert dense != moe
    for stage, dense_layers in ((0, 4), (1, 2)):
        assert pipeline.dense_layer_mix(model, plan, stage)[0] == dense_layers
        chunks = mem.inflight_chunks(plan, stage)
        got = mem.stage_memory(model, plan, stage).activations_bytes
        all_moe = mem.stage_memory(_all_moe(model), plan, stage).activations_bytes
        assert got - all_moe == pytest.approx(chunks * dense_layers / plan.vp * (dense - moe), abs=2)


def test_block_recompute_recomputes_the_dense_layers_that_open_a_chunk():
    """pp 1, block recompute of 2 layers: DeepSeek-V3's layers 0-1 (dense) keep only their input, layer 2 (dense)
    and the 58 MoE layers everything: the all-MoE count less one dense layer's difference."""
    model, plan = _deepseek(), _plan(recompute="full", recompute_layers=2)
    assert pipeline.dense_layer_mix(model, plan, 0) == (3, 2, 0, 0)
    got = mem.stage_memory(model, plan, 0).activations_bytes
    all_moe = mem.stage_memory(_all_moe(model), plan, 0).activations_bytes
    none_dense, none_moe = (_bytes(model, plan, dense=d, recompute="none") for d in (True, False))
    assert _bytes(model, plan, dense=True, recompute="full") == _bytes(model, plan, dense=False, recompute="full")
    assert got - all_moe == pytest.approx(none_dense - none_moe, abs=2)


def test_the_recomputed_layer_transient_is_the_largest_layer_recomputed_on_the_rank():
    """Full recompute rebuilds one layer at a time in the backward: the largest of the rank's recomputed layers.
    Block recompute of 2 layers on a pp-16 DeepSeek-V3 of 64 layers rebuilds only dense layers on stage 0 (its 4
    layers are ---E) and only MoE layers on stage 1."""
    model = _deepseek(64)
    plan = _plan(pp=16, gbs=256, recompute="full", recompute_layers=2)
    dense, moe = (_bytes(model, plan, dense=d, recompute="none") for d in (True, False))

    def transient(stage: int) -> int:
        return dict(mem.stage_memory(model, plan, stage).other).get("recomputed layer during backward", 0)

    assert transient(0) == int(dense)
    assert transient(1) == int(moe)
    uniform = plan.replace(recompute_layers=None)  # every layer recomputed: the MoE one is the largest
    assert dict(mem.stage_memory(model, uniform, 0).other)["recomputed layer during backward"] == int(moe)


def test_offloaded_layers_are_the_first_ones_each_at_its_own_kind():
    """TE's CPU offload takes the first layers: DeepSeek-V3's first 5 are 3 dense and 2 MoE."""
    model, plan = _deepseek(), _plan(offload_activation_layers=5, layer_spec="te")
    dense, moe = _bytes(model, plan, dense=True), _bytes(model, plan, dense=False)
    assert mem.offloaded_activation_bytes(model, plan) == pytest.approx(3 * dense + 2 * moe)
    assert mem.offloaded_activation_bytes(_all_moe(model), plan) == pytest.approx(5 * moe)
    got = mem.stage_memory(model, plan, 0).activations_bytes
    all_moe = mem.stage_memory(_all_moe(model), plan, 0).activations_bytes
    # Both keep 56 MoE layers on the GPU: the model offloads its 3 dense layers and 2 MoE ones, the all-MoE one 5.
    assert got == pytest.approx(all_moe, abs=2)

