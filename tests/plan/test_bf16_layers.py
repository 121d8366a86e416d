"""BF16 end layers under FP8/FP4 recipes (megatron --first-last-layers-bf16 --num-layers-at-start-in-bf16 /
--num-layers-at-end-in-bf16): which rank holds them as megatron-core places them, what they cost and hold, the rules
megatron-core enforces, and how the plan carries them into the artifacts and back."""

from __future__ import annotations

import dataclasses
import json

import pytest

from conftest import needs_megatron, run_genconf
from genconf.catalog.clusters import resolve_cluster
from genconf.catalog.hardware import calibration_for
from genconf.catalog.models import resolve_model
from genconf.plan import memory, planfile, rules
from genconf.plan.cost import stage_times, step_cost
from genconf.plan.pipeline import bf16_layers_on_rank, stage_layers
from genconf.plan.precision import bf16_edge_default, megatron_flags, plan_in_precision
from genconf.plan.search import Pins, search
from genconf.plan.specs import ParallelPlan
from genconf.render.megatron import arg_values, megatron_args, megatron_plan

H100 = resolve_cluster("dgx-h100")


def _fp8(**kw) -> ParallelPlan:
    base = dict(framework="megatron", tp=4, pp=1, dp=2, mbs=1, gbs=64, seq_length=8192, zero_stage=1,
                precision="fp8", fp8_recipe="current", sequence_parallel=True)
    return ParallelPlan(**{**base, **kw})


# --- where the layers are: megatron-core's own placement -------------------------------------------------------

@needs_megatron
@pytest.mark.parametrize("layers,pp,vp,first,last,split", [
    (32, 1, 1, 1, 1, {}),
    (80, 8, 5, 1, 1, {}),
    (80, 4, 5, 3, 14, {}),                        # more BF16 layers than one virtual stage holds
    (88, 1, 1, 0, 14, {}),                        # Nemotron 3 Super's NVFP4 recipe
    (30, 4, 1, 2, 2, {"pp_first_stage_layers": 6, "pp_last_stage_layers": 6}),
])
def test_ranks_hold_the_bf16_layers_megatron_core_runs_in_bf16(layers, pp, vp, first, last, split):
    from megatron.core.fp8_utils import is_first_last_bf16_layer
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset
    import torch

    extra = {}
    if split:
        extra = dict(num_layers_in_first_pipeline_stage=split["pp_first_stage_layers"],
                     num_layers_in_last_pipeline_stage=split["pp_last_stage_layers"])
    cfg = TransformerConfig(num_layers=layers, hidden_size=64, num_attention_heads=4, pipeline_model_parallel_size=pp,
                            virtual_pipeline_model_parallel_size=vp if vp > 1 else None,
                            pipeline_dtype=torch.float32, first_last_layers_bf16=True,
                            num_layers_at_start_in_bf16=first, num_layers_at_end_in_bf16=last, **extra)
    plan = _fp8(tp=1, pp=pp, vp=vp, dp=1, gbs=pp * 4, bf16_layers_start=first, bf16_layers_end=last, **split)
    for rank in range(pp):
        theirs = 0
        for chunk in range(vp):
            stage = chunk if vp > 1 else None
            offset = get_transformer_layer_offset(cfg, vp_stage=stage, pp_rank=rank)
            built = get_num_layers_to_build(cfg, vp_stage=stage, pp_rank=rank)
            theirs += sum(is_first_last_bf16_layer(cfg, n) for n in range(offset, offset + built))
        assert bf16_layers_on_rank(layers, plan, rank) == theirs, (rank, theirs)
    assert sum(bf16_layers_on_rank(layers, plan, r) for r in range(pp)) == min(layers, first + last)


def test_a_pipeline_layout_places_them_where_its_stages_put_the_layers():
    # NVIDIA's Llama 3 70B FP8 layout on 64 H100s: the last virtual stage holds one layer (and the loss), the one
    # before it, on rank 6, two; the first holds two on rank 0 (tests/plan/test_pp_layout.py reads it as
    # megatron-core does).
    plan = _fp8(tp=1, pp=8, vp=5, dp=1, gbs=32, bf16_layers_start=1, bf16_layers_end=2,
                pp_layout="Et*2|(t*2|)*34,t*3|(t*2|)*3,tL")
    assert [bf16_layers_on_rank(80, plan, r) for r in range(8)] == [1, 0, 0, 0, 0, 0, 1, 1]


def test_no_bf16_layers_without_a_quantized_recipe():
    plan = _fp8(pp=4, dp=1, precision="bf16", fp8_recipe=None, bf16_layers_start=1, bf16_layers_end=1)
    assert plan.bf16_edge_layers == (0, 0)
    assert all(bf16_layers_on_rank(80, plan, r) == 0 for r in range(4))


# --- what they cost ------------------------------------------------------------------------------------------

def test_every_layer_in_bf16_costs_what_the_bf16_plan_does():
    model, _ = resolve_model("llama3-8b")
    cal = calibration_for("h100-sxm")
    everything = _fp8(bf16_layers_start=model.num_layers, bf16_layers_end=0)
    plain = plan_in_precision(everything, "bf16")
    assert plain.bf16_edge_layers == (0, 0)
    ours, theirs = stage_times(model, everything, H100, cal), stage_times(model, plain, H100, cal)
    assert ours[0].total_s == pytest.approx(theirs[0].total_s, rel=1e-12)
    assert ours[0].forward_s == pytest.approx(theirs[0].forward_s, rel=1e-12)


def test_each_bf16_layer_costs_the_difference_of_one_layer():
    model, _ = resolve_model("llama3-8b")
    cal = calibration_for("h100-sxm")
    t = {k: stage_times(model, _fp8(bf16_layers_end=k), H100, cal)[0].total_s for k in (0, 1, 2, 8)}
    one = t[1] - t[0]
    assert one > 0  # a BF16 GEMM is slower than an FP8 one on an H100
    assert t[2] - t[0] == pytest.approx(2 * one, rel=1e-9) and t[8] - t[0] == pytest.approx(8 * one, rel=1e-9)
    # ... about a BF16 layer's extra time: between a third and all of an FP8 layer's
    per_layer = t[0] / model.num_layers
    assert 0.1 * per_layer < one < per_layer


def test_only_the_ranks_holding_them_are_slower():
    model, _ = resolve_model("llama3-70b")
    cal = calibration_for("h100-sxm")
    base = _fp8(pp=8, vp=5, dp=2, gbs=256)
    even = [s.total_s for s in stage_times(model, base, H100, cal)]
    edges = [s.total_s for s in stage_times(model, base.replace(bf16_layers_start=1, bf16_layers_end=1), H100, cal)]
    assert edges[0] > even[0] and edges[-1] > even[-1]
    assert edges[1:-1] == even[1:-1]
    assert step_cost(model, base.replace(bf16_layers_end=1), H100, cal).step_time_s > step_cost(
        model, base, H100, cal).step_time_s


# --- what they hold ------------------------------------------------------------------------------------------

def test_bf16_layers_keep_bf16_weights_and_inputs_and_no_quantized_copies():
    model, _ = resolve_model("llama3-8b")
    fp8 = _fp8(fp8_param_gather=True)
    quarter = fp8.replace(bf16_layers_end=model.num_layers // 4)
    a, b = memory.stage_memory(model, fp8, 0), memory.stage_memory(model, quarter, 0)
    copies = {n: v for n, v in a.other if "weight copies" in n}
    copies_b = {n: v for n, v in b.other if "weight copies" in n}
    (name, full), = copies.items()
    assert copies_b[name] == pytest.approx(0.75 * full, rel=1e-6)  # a quarter of the layers: no quantized copies
    rp = memory.rank_params(model, fp8, 0)
    # FP8 parameters: the BF16 layers' matmul weights are kept in 2 bytes instead of 1
    assert b.params_bytes - a.params_bytes == pytest.approx(0.25 * rp.gemm, rel=1e-6)
    assert b.activations_bytes > a.activations_bytes  # BF16 GEMM inputs saved instead of FP8 copies


# --- the rules megatron-core enforces ------------------------------------------------------------------------

@pytest.mark.parametrize("changes,why", [
    (dict(precision="bf16", fp8_recipe=None), "apply under an FP8 or FP4 precision"),
    (dict(fp8_recipe="delayed"), "delayed scaling does not support"),
    (dict(layer_spec="local"), "Transformer Engine layers"),
    (dict(pp=4, dp=1, bf16_layers_end=9), "at most the layers per pipeline stage"),
])
def test_rules_refuse_what_megatron_core_refuses(changes, why):
    model, _ = resolve_model("llama3-8b")
    plan = _fp8(bf16_layers_start=1, bf16_layers_end=1).replace(**changes)
    found = [v for v in rules.check(rules.Context(model, H100, plan, plan.world_size)) if v.rule == "bf16_layers"]
    assert found and why in found[0].message


def test_rules_accept_the_recipes():
    model, _ = resolve_model("llama3-8b")
    for plan in (_fp8(bf16_layers_start=1, bf16_layers_end=1), _fp8(pp=4, dp=1, bf16_layers_end=8),
                 _fp8(precision="fp4", fp8_recipe=None, bf16_layers_end=14)):
        assert not [v for v in rules.check(rules.Context(model, H100, plan, plan.world_size)) if v.rule == "bf16_layers"]


# --- the search's default, the artifacts and the command line ------------------------------------------------

def test_the_search_gives_fp8_current_its_recipes_bf16_ends():
    assert bf16_edge_default("fp8", "current") == 1 and bf16_edge_default("fp8", None) == 1
    assert bf16_edge_default("fp8", "mxfp8") == 0 and bf16_edge_default("fp4", None) == 0
    assert bf16_edge_default("bf16", None) == 0
    model, _ = resolve_model("llama3-8b")
    cal = calibration_for("h100-sxm")
    pins = dict(framework="megatron", tp=2, pp=1, mbs=1, gbs=64, seq_length=8192, zero_stage=1, recompute="none")
    best = search(model, H100, 8, cal, Pins(precision="fp8", fp8_recipe="current", **pins)).best.plan
    assert best.bf16_edge_layers == (1, 1)
    assert search(model, H100, 8, cal, Pins(precision="fp8", fp8_recipe="delayed", **pins)).best.plan.bf16_edge_layers \
        == (0, 0)
    pinned = search(model, H100, 8, cal, Pins(precision="fp8", bf16_layers=(0, 3), **pins)).best.plan
    assert pinned.bf16_edge_layers == (0, 3)
    ds = search(model, H100, 8, cal, Pins(precision="fp8", framework="deepspeed", mbs=1, gbs=64, seq_length=8192))
    assert all(ev.plan.bf16_edge_layers == (0, 0) for ev in ds.ranked)


def test_megatron_arguments_carry_them_and_read_back():
    model, _ = resolve_model("llama3-8b")
    plan = _fp8(bf16_layers_start=0, bf16_layers_end=3)
    train = planfile.default_train(plan, 1e9)
    values = arg_values(megatron_args(model, plan, train))
    assert "--first-last-layers-bf16" in values
    assert (values["--num-layers-at-start-in-bf16"], values["--num-layers-at-end-in-bf16"]) == (0, 3)
    _, back = megatron_plan(values, model, plan.world_size)
    assert (back.bf16_layers_start, back.bf16_layers_end) == (0, 3)
    assert megatron_flags("fp8", "current", (0, 0)) == megatron_flags("fp8", "current")


@needs_megatron
def test_megatron_core_accepts_the_rendered_config():
    from genconf.render.megatron import config_kwargs
    from genconf.train.runners.megatron import with_torch_values
    from megatron.core.transformer import TransformerConfig

    model, _ = resolve_model("llama3-8b")
    plan = _fp8(pp=4, dp=1, bf16_layers_start=1, bf16_layers_end=8)
    kw = with_torch_values(config_kwargs(model, plan, planfile.default_train(plan, 1e9)))
    cfg = TransformerConfig(**kw)
    assert cfg.first_last_layers_bf16 and (cfg.num_layers_at_start_in_bf16, cfg.num_layers_at_end_in_bf16) == (1, 8)
    with pytest.raises(ValueError, match="num_layers_at_end_in_bf16"):
        TransformerConfig(**{**kw, "num_layers_at_end_in_bf16": 9})  # the same limit as rules.bf16_layers


def test_plan_json_written_before_the_plan_carried_them_still_reads():
    model, _ = resolve_model("llama3-8b")
    cal = calibration_for("h100-sxm")
    plan = _fp8()
    from genconf.plan.search import evaluate

    ev = evaluate(model, H100, plan, plan.world_size, cal)
    run = json.loads(json.dumps(planfile.encode(model, None, H100, plan.world_size, ev, None, 1e9)))
    for key in ("bf16_layers_start", "bf16_layers_end"):
        del run["plan"][key]
    run["train"][planfile.LEGACY_BF16_LAYERS_KEY] = 1
    decoded = planfile.decode(run)
    assert decoded.plan.bf16_edge_layers == (1, 1)
    assert dataclasses.replace(decoded.plan, bf16_layers_start=0, bf16_layers_end=0) == plan


def test_the_command_line_sets_them_and_refuses_them_where_they_mean_nothing():
    out = run_genconf("--model", "llama3-8b", "--gpus", "8", "--cluster", "dgx-h100", "--precision", "fp8",
                      "--bf16-last-layers", "4", "--framework", "megatron", "--json")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)["plan"]
    assert (plan["bf16_layers_start"], plan["bf16_layers_end"]) == (1, 4)  # the first end keeps fp8-current's 1
    for precision in ("bf16", "fp8-delayed"):
        bad = run_genconf("--model", "llama3-8b", "--gpus", "8", "--precision", precision, "--bf16-last-layers", "2")
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
