"""DeepSeek-V3-style models: multi-head latent attention, shared experts, dense first layers, multi-token
prediction, and selective recompute of chosen modules."""

import dataclasses

import pytest

from conftest import needs_megatron
from genconf.catalog.clusters import resolve_cluster
from genconf.catalog.hardware import calibration_for
from genconf.catalog.models import resolve_model
from genconf.plan import cost, memory, pipeline, rules
from genconf.plan.counting import (active_param_count, dense_layer_model, exact_param_count, layer_tensors,
                                   model_flops_per_token, mtp_tensors)
from genconf.plan.search import Pins, search
from genconf.plan.specs import ParallelPlan

V3 = resolve_model("deepseek-v3")[0]
NO_MTP = dataclasses.replace(V3, mtp_num_layers=0)


def _plan(**kw) -> ParallelPlan:
    base = dict(framework="megatron", tp=2, pp=16, ep=64, etp=1, dp=32, mbs=1, gbs=8192, seq_length=4096,
                sequence_parallel=True, zero_stage=1, grad_dtype="bf16", pp_layout="Et*4|(t*4|)*14tmL")
    return ParallelPlan(**{**base, **kw})


def test_deepseek_v3_parameter_count_matches_the_published_checkpoint():
    # DeepSeek-V3's 671,026,419,200 main-model parameters (its Hugging Face checkpoint without the MTP module)
    # include e_score_correction_bias, 256 per MoE layer, which megatron-core keeps as a buffer (expert_bias).
    assert exact_param_count(NO_MTP) + 58 * 256 == 671_026_419_200
    # "37B activated for each token" (DeepSeek-V3 technical report, abstract)
    assert 37e9 < active_param_count(NO_MTP) < 38e9


def test_mla_layer_tensors_follow_the_latent_shapes():
    h, a = 7168, 128
    names = {t.name: t for t in layer_tensors(V3, True)}
    assert names["self_attention.linear_q_down_proj.weight"].numel == 1536 * h
    assert not names["self_attention.linear_q_down_proj.weight"].tp_sharded  # replicated ("duplicated") over TP
    assert names["self_attention.linear_q_up_proj.weight"].numel == a * (128 + 64) * 1536
    assert names["self_attention.linear_kv_down_proj.weight"].numel == (512 + 64) * h
    assert names["self_attention.linear_kv_up_proj.weight"].numel == a * (128 + 128) * 512
    assert names["self_attention.linear_proj.weight"].numel == h * a * 128
    assert names["mlp.shared_experts.linear_fc1.weight"].numel == 2 * 2048 * h
    dense = {t.name for t in layer_tensors(dense_layer_model(V3), True)}
    assert "mlp.linear_fc1.weight" in dense and not any("experts" in n for n in dense)
    # One MTP layer: enorm, hnorm, the 2h -> h projection, one MoE layer and its final norm.
    mtp = sum(t.numel for t in mtp_tensors(V3))
    assert mtp == 3 * h + 2 * h * h + sum(t.numel for t in layer_tensors(V3))


def test_mtp_adds_a_layer_and_the_logits_again_to_the_flops():
    extra = model_flops_per_token(V3, 4096) - model_flops_per_token(NO_MTP, 4096)
    layer = model_flops_per_token(dataclasses.replace(NO_MTP, num_layers=62, first_k_dense_replace=3), 4096) \
        - model_flops_per_token(NO_MTP, 4096)
    assert extra == pytest.approx(layer + 6 * 2 * 7168 ** 2 + 6 * 129280 * 7168)


def test_dense_layers_sit_on_the_first_rank_and_mtp_on_the_last():
    plan = _plan()
    assert [pipeline.dense_layers_on_rank(V3, plan, r) for r in (0, 1, 15)] == [3, 0, 0]
    first, middle, last = (memory.rank_params(V3, plan, r) for r in (0, 1, 15))
    assert first.expert < middle.expert  # one MoE layer fewer... and three dense ones
    assert any(t.name.startswith("mtp.") for t, _ in memory.stage_tensors(V3, plan, 15))
    # the last stage keeps a copy of the word embedding for the MTP layer
    assert any("word_embeddings" in t.name for t, _ in memory.stage_tensors(V3, plan, 15))


def test_layouts_place_mtp_in_the_last_stage_only():
    assert pipeline.parse_layout("Et*4|(t*4|)*14tmL")[-1] == 1
    assert pipeline.layout_mtp_layers("Et*4|(t*4|)*14tmL") == 1
    with pytest.raises(ValueError, match="in the loss.s stage"):
        pipeline.parse_layout("Et*4m|(t*4|)*14tL")


@needs_megatron
def test_searched_layouts_of_an_mtp_model_are_ones_megatron_core_accepts():
    """The search's own pipeline layouts (balanced_layout) place the MTP layers beside the loss: megatron-core asserts
    a layout places all of them (validate_layer_layout), and DeepSeek-V3's default plan on 256 H100s wrote one
    without, which Megatron-LM refused at startup."""
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    cluster = resolve_cluster("dgx-h100")
    cal = calibration_for(cluster.gpu.name)
    best = search(V3, cluster, 256, cal, Pins(), keep=1).best
    assert best.plan.pp_layout is not None and pipeline.layout_mtp_layers(best.plan.pp_layout) == 1
    PipelineParallelLayerLayout.from_str(best.plan.pp_layout, best.plan.pp).validate_layer_layout(
        V3.num_layers, V3.mtp_num_layers)
    assert cost.layout_of_counts([32, 29], 1, V3.mtp_num_layers) == "Et*32|t*29mL"
    # a layout that leaves them out is refused, saying what to write
    ctx = rules.Context(V3, cluster, best.plan.with_layout(best.plan.pp_layout.replace("m", "")), 256)
    errors = [str(v) for v in rules.check(ctx) if v.severity == rules.ERROR]
    assert any("places 0 multi-token-prediction layer(s)" in e and "put m before the loss" in e for e in errors), errors


def test_recompute_modules_free_memory_and_cost_time():
    none, up = _plan(), _plan(recompute="selective", recompute_modules=("mla_up_proj",))
    saved = memory.layer_activation_bytes(V3, none) - memory.layer_activation_bytes(V3, up)
    # q (a x 192) and k, v (a x (192 + 128)) per token, 16-bit, over TP 2
    assert saved == pytest.approx(2 * 4096 * 128 * (192 + 192 + 128) / 2)
    from genconf.catalog.clusters import resolve_cluster
    from genconf.catalog.hardware import calibration_for

    cluster = resolve_cluster("kempner-h100")
    cal = calibration_for(cluster.gpu.name)
    assert cost.step_cost(V3, up, cluster, cal).recompute_s > 0 == cost.step_cost(V3, none, cluster, cal).recompute_s
    with pytest.raises(ValueError, match="selective"):
        _plan(recompute="full", recompute_modules=("mla_up_proj",))


def test_rules_keep_these_architectures_on_megatron():
    assert "megatron-core builds these" in rules.architecture_conflict(V3, "fsdp")
    assert rules.architecture_conflict(V3, "megatron") is None
    assert rules.architecture_conflict(resolve_model("llama3-8b")[0], "fsdp") is None


def test_mla_up_proj_recompute_repeats_only_the_up_projections():
    from genconf.plan.counting import recompute_flops_per_token

    up = 512 * 128 * (128 + 128) + 1536 * 128 * (128 + 64)
    assert recompute_flops_per_token(V3, 4096, "selective", ("mla_up_proj",)) == 2 * 62 * up
    assert recompute_flops_per_token(V3, 4096, "selective", ("moe_act",)) == 0.0
    assert recompute_flops_per_token(V3, 4096, "selective") == recompute_flops_per_token(
        V3, 4096, "selective", ("core_attn",)) > 0


def test_lora_on_latent_attention_is_refused():
    assert "latent" in rules.lora_conflict(32, "megatron", False, 1, mla=True)


def test_search_adds_module_recompute_where_nothing_else_fits():
    # NVIDIA's DeepSeek-V3 FP8 layout on 1,024 H100s (Megatron-Bridge v0.1.0rc3 perf_matrix.h100.num_gpus_1024):
    # with the EP all-to-all overlap full recompute is refused, and neither no recompute nor core-attention
    # recompute fits. The search adds megatron's --recompute-modules, cheapest first, and skips layernorm,
    # which frees nothing under FP8 (the GEMMs keep their own quantized copies of the norm outputs).
    from genconf.catalog.clusters import resolve_cluster
    from genconf.catalog.hardware import calibration_for
    from genconf.plan.search import Pins, search

    cluster = resolve_cluster("dgx-h100")
    pins = Pins(framework="megatron", tp=2, pp=8, vp=4, cp=1, ep=64, etp=1, mbs=1, gbs=8192, precision="fp8",
                fp8_recipe="blockwise", grad_dtype="bf16", moe_ep_overlap=True, pp_layout="Et|(t*2|)*30mL",
                expandable_segments=False)  # that recipe did not set PyTorch's expandable segments
    result = search(V3, cluster, 1024, calibration_for(cluster.gpu.name), pins, keep=3)
    best = result.best.plan
    assert (best.recompute, best.recompute_modules) == ("selective", ("moe_act", "mla_up_proj"))
    assert result.best.memory.fits
    lighter = dataclasses.replace(best, recompute_modules=("moe_act",))
    assert not memory.estimate(V3, lighter, cluster).fits  # each module added was needed
    # Pinned modules are the user's: the search adds none.
    pinned = search(V3, cluster, 1024, calibration_for(cluster.gpu.name),
                    dataclasses.replace(pins, recompute="selective", recompute_modules=("moe_act",)), keep=3)
    assert not pinned.ranked


@needs_megatron
def test_pipelines_no_split_flag_fits_get_a_layout_megatron_core_accepts():
    """61 layers over 16 ranks, or over 4 x 4 virtual stages: no --decoder-first/last-pipeline-num-layers split fits,
    a layout string does (Megatron-Bridge's DeepSeek-V3 recipes set one). NVIDIA's published DeepSeek-V3 layouts were
    refused before (the probe of 2026-11-29)."""
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    from genconf.plan.search import even_layout

    for pp in range(2, 17):
        for vp in range(1, 5):
            layout = even_layout(61, pp, vp, 1)
            if layout is None:
                assert 61 // pp < vp
                continue
            parsed = PipelineParallelLayerLayout.from_str(layout, pp)
            parsed.validate_layer_layout(61, 1)
            assert parsed.virtual_pipeline_model_parallel_size == vp
    gb200, h100 = resolve_cluster("gb200-nvl72"), resolve_cluster("dgx-h100")
    for cluster, gpus, pins in ((gb200, 256, Pins(tp=1, pp=4, vp=4, ep=64, precision="fp8", fp8_recipe="mxfp8")),
                                (h100, 1024, Pins(tp=2, pp=16, ep=64, mbs=1, gbs=8192))):
        best = search(V3, cluster, gpus, calibration_for(cluster.gpu.name), pins, keep=1).best
        assert best is not None and best.plan.pp_layout is not None
        assert (best.plan.pp, best.plan.vp) == (pins.pp, pins.vp or 1)
        assert sum(pipeline.stage_layers(61, best.plan)) == 61
    # --pp-layout default keeps megatron's own split: no layout string where none fits
    from genconf.plan.search import DEFAULT_LAYOUT

    own = search(V3, h100, 1024, calibration_for("h100-sxm"),
                 Pins(tp=2, pp=16, ep=64, mbs=1, gbs=8192, pp_layout=DEFAULT_LAYOUT), keep=1)
    assert own.best is None or own.best.plan.pp_layout is None
