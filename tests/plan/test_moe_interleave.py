"""MoE layers interleaved with dense ones (ModelSpec.moe_layer_interval; Llama 4 Maverick's moe_layer_freq [0, 1] * 24):
which layers are MoE, which of them each pipeline chunk holds (by hand), what a rank's parameters are, and the
Megatron-LM flag written and read back. megatron-core's own per-stage build of the same flags is in
tests/render/test_moe_fidelity.py."""

from __future__ import annotations

import dataclasses

import pytest

from genconf.catalog.models import resolve_model
from genconf.plan import pipeline
from genconf.plan.counting import active_param_count, exact_param_count
from genconf.plan.memory import rank_params, rank_params_block
from genconf.plan.specs import ModelSpec, ParallelPlan, TrainSpec
from genconf.render.megatron import arg_values, megatron_args, megatron_plan, moe_layer_pattern


def _tiny(**kw) -> ModelSpec:
    return ModelSpec(**{"name": "tiny-interleaved", "num_layers": 12, "hidden_size": 256, "num_attention_heads": 8,
                        "ffn_hidden_size": 512, "vocab_size": 1024, "seq_length": 512, "activation": "swiglu",
                        "normalization": "rmsnorm", "position_embedding": "rope", "add_bias_linear": False,
                        "num_experts": 8, "moe_top_k": 2, "moe_ffn_hidden_size": 128, "moe_layer_interval": 2, **kw})


def _plan(**kw) -> ParallelPlan:
    return ParallelPlan(**{"framework": "megatron", "tp": 1, "dp": 8, "ep": 8, "mbs": 1, "gbs": 8, "seq_length": 512,
                           **kw})


def test_every_other_layer_is_moe_from_the_second():
    m = _tiny()
    assert m.mlp_pattern == "-E" * 6 and (m.moe_layers, m.dense_layers) == (6, 6)
    assert [i for i in range(12) if m.is_moe_layer(i)] == [1, 3, 5, 7, 9, 11]
    three = _tiny(moe_layer_interval=3)
    assert three.mlp_pattern == "--E" * 4 and (three.moe_layers, three.dense_layers) == (4, 8)
    # The unchanged cases: every layer MoE, or DeepSeek-V3's dense prefix.
    assert _tiny(moe_layer_interval=1).mlp_pattern == "E" * 12
    assert _tiny(moe_layer_interval=1, first_k_dense_replace=3).mlp_pattern == "---" + "E" * 9


@pytest.mark.parametrize("kw, message", [
    (dict(moe_layer_interval=0), "integer >= 1"),
    (dict(moe_layer_interval=5), "num_layers (12) is not a multiple of moe_layer_interval (5)"),
    (dict(moe_layer_interval=24), "moe_layer_interval (24) is more than num_layers (12): no layer would be MoE"),
    (dict(first_k_dense_replace=1), "moe_layer_interval 2 with first_k_dense_replace 1"),
    (dict(num_experts=0, moe_top_k=0, moe_ffn_hidden_size=None), "num_experts 0"),
])
def test_refused_combinations_name_their_values(kw, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _tiny(**kw)


def test_each_chunk_holds_the_kinds_its_layer_indices_have():
    """By hand, 12 layers -E-E-E-E-E-E: pp 2 x vp 2 gives virtual stages of 3 layers in the order rank 0, rank 1,
    rank 0, rank 1 (layers 0-2, 3-5, 6-8, 9-11): rank 0 holds -E- and -E- (4 dense), rank 1 E-E and E-E (2 dense).
    Uneven pp 3 with 3 first and 5 last layers: 0-2 -E-, 3-6 E-E-, 7-11 E-E-E (2 dense each). A layout of 5 | 3 | 4
    layers: 0-4 -E-E-, 5-7 E-E, 8-11 -E-E (3, 1, 2 dense)."""
    m = _tiny()
    plan = _plan(pp=2, vp=2)
    assert [pipeline.chunk_mlp_patterns(m, plan, r) for r in (0, 1)] == [("-E-", "-E-"), ("E-E", "E-E")]
    assert [pipeline.dense_layers_on_rank(m, plan, r) for r in (0, 1)] == [4, 2]
    assert [pipeline.dense_layers_in_chunks(m, plan, r) for r in (0, 1)] == [(2, 2), (1, 1)]
    uneven = _plan(pp=3, pp_first_stage_layers=3, pp_last_stage_layers=5)
    assert [pipeline.chunk_mlp_patterns(m, uneven, r) for r in range(3)] == [("-E-",), ("E-E-",), ("E-E-E",)]
    assert [pipeline.dense_layers_on_rank(m, uneven, r) for r in range(3)] == [2, 2, 2]
    layout = _plan(pp=3, pp_layout="Et*5|t*3|t*4L")
    assert [pipeline.dense_layers_on_rank(m, layout, r) for r in range(3)] == [3, 1, 2]
    # A dense prefix still sits on the earliest chunks (DeepSeek-V3's three dense layers on the first rank).
    prefix = _tiny(moe_layer_interval=1, first_k_dense_replace=4)
    assert [pipeline.dense_layers_in_chunks(prefix, plan, r) for r in (0, 1)] == [(3, 0), (1, 0)]


def test_a_rank_s_parameters_follow_its_dense_and_moe_layers():
    """Rank 0 of pp 2 x vp 2 holds 4 dense and 2 MoE layers, rank 1 2 and 4: their decoder parameters differ by two
    MoE layers less two dense ones; the ranks together hold every parameter of the model once (tp = ep = 1, the
    vocabulary of 1024 rows needing no padding; untied, so that the last rank holds no second copy of the embedding)."""
    m = _tiny(tie_embeddings=False)
    plan = _plan(pp=2, vp=2, dp=1, ep=1, gbs=1)
    moe, dense = rank_params_block(m, plan), rank_params_block(m, plan, dense=True)
    # Attention q, k, v and output projections of 256 x 256 (8 heads, 8 query groups), two RMSNorms; the MoE
    # layer's router (8 x 256) and 8 experts of 3 x 256 x 128, the dense layer's SwiGLU of 3 x 256 x 512.
    assert moe == 4 * 256 * 256 + 2 * 256 + 8 * 256 + 8 * 3 * 256 * 128 == 1_051_136
    assert dense == 4 * 256 * 256 + 2 * 256 + 3 * 256 * 512 == 655_872
    r0, r1 = rank_params(m, plan, 0), rank_params(m, plan, 1)
    assert r0.total - 1024 * 256 == 4 * dense + 2 * moe
    assert r1.total - 1024 * 256 - 256 == 2 * dense + 4 * moe  # the output layer and final norm on the last rank
    assert r0.total + r1.total == exact_param_count(m)


def test_llama4_counts_by_hand():
    """Llama 4 Maverick's text decoder (NeMo Llama4Experts128Config): 24 dense layers of attention 5120 x (5120 +
    2 x 1024) + 5120^2, two RMSNorms and a 3 x 5120 x 16384 SwiGLU; 24 MoE layers of the same attention, 128 routed
    experts and one shared expert of 3 x 5120 x 8192 and a 128 x 5120 router; untied 202,048-row embedding and
    output, a final norm. Scout: 48 MoE layers of 16 experts."""
    attention = 5120 * (5120 + 2 * 1024) + 5120 * 5120 + 2 * 5120
    expert = 3 * 5120 * 8192
    ends = 2 * 202048 * 5120 + 5120
    maverick, scout = resolve_model("llama4-maverick")[0], resolve_model("llama4-scout")[0]
    assert maverick.mlp_pattern == "-E" * 24
    assert exact_param_count(maverick) == 24 * (attention + 3 * 5120 * 16384) + 24 * (
        attention + 129 * expert + 128 * 5120) + ends == 400_711_848_960
    assert active_param_count(maverick) == exact_param_count(maverick) - 24 * 127 * expert == 17_184_691_200
    assert scout.moe_layers == 48 and scout.dense_layers == 0
    assert exact_param_count(scout) == 48 * (attention + 17 * expert + 16 * 5120) + ends == 107_769_861_120
    assert active_param_count(scout) == exact_param_count(scout) - 48 * 15 * expert == 17_172_894_720


@pytest.mark.parametrize("interval, text", [(2, "([0,1]*6)"), (3, "([0]*2+[1])*4"), (4, "([0]*3+[1])*3")])
def test_the_flag_is_written_as_megatron_lm_evaluates_it_and_read_back(interval, text):
    """Megatron-LM's moe_freq_type evaluates a --moe-layer-freq holding '[' as a Python list expression
    (arguments.py _eval_pattern): the file's text must evaluate to the spec's layers, and genconf's reader must get
    the spec back."""
    m = _tiny(moe_layer_interval=interval)
    values = arg_values(megatron_args(m, _plan(), TrainSpec(train_steps=10)))
    assert values["--moe-layer-freq"] == text
    assert eval(text) == moe_layer_pattern(text, 12) == [int(k == "E") for k in m.mlp_pattern]  # noqa: S307
    back, _ = megatron_plan(values, m, 8)
    assert (back.moe_layer_interval, back.first_k_dense_replace, back.mlp_pattern) == (interval, 0, m.mlp_pattern)
    with pytest.raises(ValueError, match="--moe-layer-freq"):
        moe_layer_pattern(text, 10)  # a pattern of another length is no layer list of this model
    assert dataclasses.replace(back, name=m.name) == m
