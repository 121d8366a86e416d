"""Hybrid Mamba-2 models (Nemotron-H, Nemotron 3 Nano): counting, pipeline split, rules, pricing and search."""

from __future__ import annotations

import dataclasses

import pytest

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
