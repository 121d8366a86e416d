"""Hybrid Mamba-2 models (Nemotron-H, Nemotron 3 Nano): counting, pipeline split, rules, pricing and search."""

from __future__ import annotations

import dataclasses

import pytest

from conftest import reader_or_skip

from genconf.catalog.clusters import resolve_cluster
from genconf.catalog.hardware import calibration_for
from genconf.catalog.models import resolve_model
from genconf.plan import counting, rules
from genconf.plan.cost import layer_time, ssd_macs_per_token, step_cost
from genconf.plan.memory import layer_activation_bytes, rank_params
from genconf.plan.pipeline import chunk_patterns, hybrid_kinds_on_rank
from genconf.plan.search import Pins, search
from genconf.plan.specs import ModelSpec, ParallelPlan


def _model(name: str) -> ModelSpec:
    return resolve_model(name)[0]


@pytest.mark.parametrize("name, params, active", [
    # Hand count of megatron-core's MambaMixer (in_proj h x (2 d_inner + 2 G N + heads), conv1d over x, B, C with
    # bias, dt_bias / A_log / D per head, gated norm d_inner, out_proj), TE-fused pre-norms, untied embeddings:
    # HF nvidia/Nemotron-H-8B-Base-8K ("8B") and NVIDIA-Nemotron-3-Nano-30B-A3B ("31.6B total, 3.6B active with
    # embeddings"), as counted independently from the Megatron-Bridge providers.
    ("nemotron-h-8b", 8_100_852_736, 8_100_852_736),
    ("nemotron-3-nano", 31_577_937_344, 3_580_073_408),
])
def test_hybrid_parameter_counts_match_the_public_checkpoints(name, params, active):
    model = _model(name)
    assert counting.exact_param_count(model) == params
    assert counting.active_param_count(model) == active


def test_a_mamba_layer_is_counted_tensor_by_tensor():
    m = _model("nemotron-h-8b")  # h 4096, d_inner 128 x 64 = 8192, G 8, N 128, 128 heads
    tensors = {t.name: t.numel for t in counting.layer_tensors(m, True, "M")}
    assert tensors["mixer.in_proj.weight"] == (2 * 8192 + 2 * 8 * 128 + 128) * 4096
    assert tensors["mixer.conv1d.weight"] == (8192 + 2 * 8 * 128) * 4
    assert tensors["mixer.out_proj.weight"] == 4096 * 8192
    assert tensors["mixer.A_log"] == tensors["mixer.D"] == tensors["mixer.dt_bias"] == 128
    assert tensors["input_layernorm.weight"] == 4096
    # The attention and MLP layers carry one pre-norm each and nothing of the other half.
    attention = {t.name for t in counting.layer_tensors(m, True, "*")}
    mlp = {t.name for t in counting.layer_tensors(m, True, "-")}
    assert not any(n.startswith("mlp") for n in attention) and not any(n.startswith("self_attention") for n in mlp)


def test_model_flops_follow_megatrons_hybrid_formula_for_the_projections():
    m = _model("nemotron-h-8b")
    s, h, di = 8192, 4096, 8192
    mamba = 6 * 24 * (h * (2 * di + 2 * 8 * 128 + 128) + di * h) + 3 * 24 * 7 * di * 128
    attention = 6 * 4 * (h * (4096 + 2 * 1024) + h * 4096) + 4 * 6 * s * (4096 + 4096)
    mlp = 6 * 24 * 2 * h * 21504
    logits = 6 * 131072 * h
    assert counting.model_flops_per_token(m, s) == pytest.approx(mamba + attention + mlp + logits, rel=1e-12)


def test_the_pattern_is_cut_into_contiguous_runs_per_stage():
    m = _model("nemotron-h-8b")
    plan = ParallelPlan(framework="megatron", pp=4, dp=2, mbs=1, gbs=64, seq_length=8192)
    parts = [chunk_patterns(m, plan, s) for s in range(4)]
    assert "".join(p[0] for p in parts) == m.hybrid_pattern
    assert all(len(p[0]) == 13 for p in parts)
    kinds = dict(hybrid_kinds_on_rank(m, plan, 0))
    assert kinds == {k: m.hybrid_pattern[:13].count(k) for k in "M*-" if m.hybrid_pattern[:13].count(k)}
    # The stage's parameters are its own layers', exactly.
    total = sum(rank_params(m, plan, s).total for s in range(4))
    assert total == counting.exact_param_count(m) + 0  # untied: no embedding copy on the last stage


@pytest.mark.parametrize("change, says", [
    (dict(vp=2, pp=2), "no interleaved pipeline"),
    (dict(recompute="full"), "no full activation recompute"),
    (dict(tp=3), "Mamba heads"),
    (dict(framework="deepspeed"), "Mamba-2 layers"),
])
def test_plans_megatron_core_cannot_build_are_refused(change, says):
    m = _model("nemotron-h-8b")
    cluster = resolve_cluster("dgx-h100")
    base = dict(framework="megatron", tp=1, pp=1, dp=8, mbs=1, gbs=64, seq_length=8192)
    base.update(change)
    if base["framework"] == "deepspeed":
        base.update(tp=1, pp=1, vp=1)
    base["dp"] = 8 // (base["tp"] * base["pp"]) if 8 % (base["tp"] * base["pp"]) == 0 else 1
    plan = ParallelPlan(**base)
    messages = [v.message for v in rules.check(rules.Context(m, cluster, plan, 8))]
    assert any(says in msg for msg in messages), messages


def test_a_mamba_layer_costs_its_projections_and_the_scan():
    m = _model("nemotron-h-8b")
    cluster = resolve_cluster("dgx-h100")
    cal = calibration_for("h100-sxm")
    plan = ParallelPlan(framework="megatron", tp=1, dp=8, mbs=1, gbs=64, seq_length=8192)
    mamba = layer_time(m, plan, cluster, cal, kind="M")
    slow = layer_time(m, plan, cluster, dataclasses.replace(cal, ssd_scan_efficiency=cal.ssd_scan_efficiency / 2), kind="M")
    fwd_macs, _ = ssd_macs_per_token(m)
    scan_s = 2 * fwd_macs * 8192 / (cluster.gpu.peak_bf16_tflops * 1e12 * cal.ssd_scan_efficiency)
    # Halving the scan's rate adds its forward time once more (the scan is compute-bound at this rate).
    assert slow.fwd_s - mamba.fwd_s == pytest.approx(scan_s, rel=0.02)
    # A transformer layer is its attention half plus its MLP half.
    dense = dataclasses.replace(m, hybrid_pattern="", name="x")
    whole = layer_time(dense, plan, cluster, cal)
    halves = [layer_time(m, plan, cluster, cal, kind=k) for k in "*-"]
    assert whole.fwd_s == pytest.approx(sum(x.fwd_s for x in halves), rel=1e-9)
    assert whole.bwd_s == pytest.approx(sum(x.bwd_s for x in halves), rel=1e-9)


def test_each_moe_layer_waits_for_its_own_host_time():
    """Nemotron 3 Super on 64 GB200 at tp 2, ep 64, micro-batch 1 (Megatron-Bridge's published layout): its MoE layers
    are host-bound (the eager expert block after the per-layer token-count synchronisation), its Mamba layers GPU-bound.
    Pooled over the rank's layers the Mamba layers' GPU time would hide the MoE layers' host time; the dispatcher's
    synchronisation stops the host from running ahead, so each MoE layer's wait counts and the step grows by it."""
    from genconf.plan.cost import _mixed_layer, _mtp_layer_s

    m = _model("nemotron-3-super")
    cluster = resolve_cluster("gb200-nvl72")
    cal = calibration_for("gb200")
    plan = ParallelPlan(framework="megatron", tp=2, ep=64, dp=32, mbs=1, gbs=512, seq_length=8192,
                        sequence_parallel=True, precision="fp8", fp8_recipe="mxfp8", grad_dtype="bf16",
                        bf16_layers_start=0, bf16_layers_end=0)  # every layer at the one FP8 pace
    kinds = {k: layer_time(m, plan, cluster, cal, kind=k) for k in "M*E"}

    def busy(lt):
        return lt.fwd_s + lt.bwd_s + lt.tp_comm_s + lt.cp_comm_s

    share = {k: m.layers_of_kind(k) / m.num_layers for k in kinds}
    assert kinds["E"].host_s > busy(kinds["E"]) and kinds["M"].host_s < busy(kinds["M"])
    wait_s = sum(share[k] * max(0.0, lt.host_s - busy(lt)) for k, lt in kinds.items())
    pooled_wait_s = max(0.0, sum(share[k] * (lt.host_s - busy(lt)) for k, lt in kinds.items()))
    assert pooled_wait_s == 0.0 < wait_s  # the Mamba layers' slack would hide it all
    full, mixed = _mixed_layer(m, plan, cluster, cal)
    assert mixed["host_wait_s"] == pytest.approx(wait_s, rel=1e-12)
    cost = step_cost(m, plan, cluster, cal)
    gpu_only = step_cost(m, plan, cluster, dataclasses.replace(cal, kernel_launch_s=0.0, graph_launch_s=0.0))
    # The step is the GPU work plus each micro-batch's waits on the rank's 88 layers and on its multi-token-prediction
    # layer (a transformer layer with an MoE, priced at the longer of its GPU and host times).
    zero = dataclasses.replace(cal, kernel_launch_s=0.0, graph_launch_s=0.0)
    mtp_wait_s = m.mtp_num_layers * (_mtp_layer_s(m, plan, cluster, cal) - _mtp_layer_s(m, plan, cluster, zero))
    waited_s = plan.num_microbatches * (m.num_layers * wait_s + mtp_wait_s)
    assert cost.compute_s - gpu_only.compute_s == pytest.approx(waited_s, rel=1e-6)


def test_an_moe_models_dense_layers_do_not_hide_its_moe_layers_host_time():
    """DeepSeek-V3 (3 dense layers of 61) on 128 GB200s at ep 8 without CUDA graphs: the MoE layer waits for its eager
    host time on the Grace CPU, the dense layers have none to wait for; the mean layer's wait is the MoE layers' share
    of theirs (pooled, the dense layers' GPU time would have hidden part of it)."""
    from genconf.plan.cost import _mixed_layer, dense_layer_model

    m = _model("deepseek-v3")
    cluster = resolve_cluster("gb200-nvl72")
    cal = calibration_for("gb200")
    plan = ParallelPlan(framework="megatron", tp=1, pp=16, ep=8, dp=8, mbs=1, gbs=1024, seq_length=4096,
                        precision="fp8", fp8_recipe="current", grad_dtype="bf16", bf16_layers_start=0, bf16_layers_end=0)
    moe = layer_time(m, plan, cluster, cal)
    dense = layer_time(dense_layer_model(m), plan, cluster, cal)

    def wait_s(lt):
        return max(0.0, lt.host_s - (lt.fwd_s + lt.bwd_s + lt.tp_comm_s + lt.cp_comm_s))

    assert wait_s(moe) > 0.0 == wait_s(dense)
    share = m.dense_layers / m.num_layers
    assert share == pytest.approx(3 / 61)
    _, mixed = _mixed_layer(m, plan, cluster, cal)
    assert mixed["host_wait_s"] == pytest.approx((1 - share) * wait_s(moe), rel=1e-12)
    pooled_wait_s = max(0.0, (1 - share) * (moe.host_s - (moe.fwd_s + moe.bwd_s + moe.tp_comm_s + moe.cp_comm_s))
                        + share * (dense.host_s - (dense.fwd_s + dense.bwd_s + dense.tp_comm_s + dense.cp_comm_s)))
    assert pooled_wait_s < mixed["host_wait_s"]


def test_activations_are_the_mean_of_the_layers():
    m = _model("nemotron-3-nano")
    plan = ParallelPlan(framework="megatron", ep=8, dp=8, mbs=1, gbs=64, seq_length=8192, precision="bf16")
    from genconf.plan.memory import layer_activation_terms
    per_kind = {k: sum(b for _, b in layer_activation_terms(m, plan, kind=k)) for k in "M*E"}
    mean = sum(per_kind[k] * m.layers_of_kind(k) for k in "M*E") / m.num_layers
    assert layer_activation_bytes(m, plan) == pytest.approx(mean)
    # in_proj output (z, x, B, C, dt) and the scan output dominate a Mamba layer's saved bytes.
    assert per_kind["M"] > 2 * 8192 * (2 * 4096 + 2 * 8 * 128 + 64)


def test_the_search_plans_a_hybrid_model_with_megatron_only():
    m = _model("nemotron-h-8b")
    cluster = resolve_cluster("dgx-h100")
    result = search(m, cluster, 8, calibration_for("h100-sxm"), Pins(precision="fp8"))
    best = result.best.plan
    assert best.framework == "megatron" and best.vp == 1 and best.recompute != "full"
    assert m.mamba_num_heads % best.tp == 0
    cost = step_cost(m, best, cluster, calibration_for("h100-sxm"))
    assert 0.1 < cost.mfu < 0.7


@pytest.mark.parametrize("name, buffers, published", [
    # Megatron-Bridge's model verification cards: every tensor of the HF checkpoints, MTP block included. The
    # checkpoints also hold each MoE layer's router correction bias (512 / 128 experts; 40 + 1 / 23 + 1 MoE layers),
    # which megatron-core keeps as a buffer (expert_bias), not a parameter.
    ("nemotron-3-super", 41 * 512, 123_611_033_088),
    ("nemotron-3.5-lightning", 24 * 128, 32_913_266_240),
])
def test_latent_moe_and_repeated_mtp_counts_match_the_checkpoints(name, buffers, published):
    assert counting.exact_param_count(_model(name)) + buffers == published


def test_latent_moe_runs_the_experts_on_the_latent_width():
    m = _model("nemotron-3-super")  # h 4096, latent 1024, 512 experts of width 2688, squared ReLU (one branch)
    tensors = {t.name: t for t in counting.layer_tensors(m, True, "E")}
    assert tensors["mlp.experts.linear_fc1.weight"].numel == 512 * 2688 * 1024
    assert tensors["mlp.experts.linear_fc2.weight"].numel == 512 * 1024 * 2688
    for name in ("mlp.fc1_latent_proj.weight", "mlp.fc2_latent_proj.weight"):
        assert tensors[name].numel == 4096 * 1024 and not tensors[name].tp_sharded  # TELinear "duplicated"
    assert tensors["mlp.shared_experts.linear_fc1.weight"].numel == 5376 * 4096  # shared experts on the full width
    # Megatron-Bridge flop_utils.py moe_layer_flops (latent branch), as multiply-accumulates per token.
    assert counting._mlp_macs_per_token(m) == 2 * 1024 * 2688 * 22 + 2 * 4096 * 5376 + 2 * 4096 * 1024
    # The dispatcher moves latent-wide tokens: a quarter of the all-to-all of the same model without the latent.
    plain = dataclasses.replace(m, moe_latent_size=0)
    plan = ParallelPlan(framework="megatron", tp=1, ep=64, dp=64, mbs=1, gbs=512, seq_length=8192, zero_stage=1,
                        precision="bf16", grad_dtype="bf16")
    cluster = resolve_cluster("gb300-nvl72")
    cal = calibration_for("gb300")
    latent_lt, plain_lt = (layer_time(x, plan, cluster, cal, kind="E") for x in (m, plain))
    assert latent_lt.tp_comm_s < 0.3 * plain_lt.tp_comm_s
    assert latent_lt.fwd_s < plain_lt.fwd_s


def test_a_repeated_mtp_block_is_counted_once_and_run_at_every_depth():
    m = _model("nemotron-3.5-lightning")
    unshared = dataclasses.replace(m, mtp_repeated_layer=False)
    block = counting.exact_param_count(m) - counting.exact_param_count(_model("nemotron-3-nano"))
    assert counting.exact_param_count(unshared) == counting.exact_param_count(m) + block
    h = m.hidden_size
    # The block is one attention and one MoE layer ('*E') with enorm, hnorm, the 2h -> h eh_proj and a final norm.
    layer = (sum(t.numel for t in counting.layer_tensors(m, kind="*"))
             + sum(t.numel for t in counting.layer_tensors(m, kind="E")))
    assert block == layer + 2 * h * h + 3 * h
    # Compute and FLOPs count both depths, shared weights or not.
    assert counting.model_flops_per_token(m, 8192) == counting.model_flops_per_token(unshared, 8192)
    nano = counting.model_flops_per_token(_model("nemotron-3-nano"), 8192)
    assert counting.model_flops_per_token(m, 8192) > nano
    plan = ParallelPlan(framework="megatron", tp=1, ep=8, dp=8, mbs=2, gbs=512, seq_length=8192, zero_stage=1,
                        precision="bf16", grad_dtype="bf16")
    cluster, cal = resolve_cluster("gb200-nvl72"), calibration_for("gb200")
    assert step_cost(m, plan, cluster, cal).step_time_s > step_cost(_model("nemotron-3-nano"), plan, cluster, cal).step_time_s
    assert layer_activation_bytes(m, plan) == layer_activation_bytes(_model("nemotron-3-nano"), plan)


def test_latent_moe_and_hybrid_mtp_render_and_read_back():
    from genconf.check.megatron import parse_megatron_args
    from genconf.render.megatron import megatron_args, megatron_args_text, megatron_plan
    from genconf.plan.specs import TrainSpec

    m = _model("nemotron-3-super")
    plan = ParallelPlan(framework="megatron", tp=1, ep=64, dp=64, mbs=1, gbs=512, seq_length=8192, zero_stage=1,
                        precision="bf16", grad_dtype="bf16")
    text = megatron_args_text(megatron_args(m, plan, TrainSpec(train_steps=10)))
    args, problems = parse_megatron_args(text)
    assert problems == []
    values = {flag: a.value for flag, a in args.items()}
    assert values["--moe-latent-size"] == 1024 and values["--mtp-hybrid-override-pattern"] == "*E"
    assert "--mtp-use-repeated-layer" in values and "megatron-core 0.17+" in text
    back, _ = megatron_plan(values, m, 64)
    assert (back.moe_latent_size, back.mtp_num_layers, back.mtp_repeated_layer) == (1024, 2, True)
    values["--mtp-hybrid-override-pattern"] = "*-"
    with pytest.raises(ValueError, match="one attention and one MLP layer"):
        megatron_plan(values, m, 64)


def test_megatron_core_accepts_the_latent_moe_config():
    reader_or_skip("megatron.core", "pip install -e '.[train]'")
    from conftest import transformer_config
    from genconf.check.megatron import parse_megatron_args
    from genconf.render.megatron import megatron_args, megatron_args_text
    from genconf.plan.specs import TrainSpec

    m = dataclasses.replace(_model("nemotron-3-super"), mtp_num_layers=0, mtp_repeated_layer=False)  # 0.16.1: no hybrid MTP
    plan = ParallelPlan(framework="megatron", tp=1, ep=64, dp=64, mbs=1, gbs=512, seq_length=8192, zero_stage=1,
                        precision="bf16", grad_dtype="bf16")
    args, _ = parse_megatron_args(megatron_args_text(megatron_args(m, plan, TrainSpec(train_steps=10))))
    cfg = transformer_config(args)
    assert cfg.moe_latent_size == 1024 and cfg.num_moe_experts == 512 and cfg.is_hybrid_model
