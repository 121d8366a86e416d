"""Precision, the one vocabulary: recipe names, plan dtypes, TrainSpec.fp8_recipe, Transformer Engine classes and
framework flags map through genconf.plan.precision, and each mapping holds in both directions."""

from __future__ import annotations

import pytest

from conftest import reader_or_skip
from genconf.catalog.hardware import resolve_gpu
from genconf.plan import precision
from genconf.plan.equivalent import equivalent_plan
from genconf.plan.specs import PRECISIONS, ParallelPlan


@pytest.mark.parametrize("name", list(precision.RECIPES))
def test_every_recipe_is_named_by_its_plan_dtype_and_fp8_recipe(name):
    r = precision.recipe(name)
    assert r.plan_precision in PRECISIONS
    assert precision.recipe_for(r.plan_precision, r.train_fp8_recipe) is r
    assert (r.train_fp8_recipe is None) == (r.plan_precision != "fp8")
    assert (r.te_recipe is None) == (r.plan_precision not in ("fp8", "fp4"))


def test_fp8_without_a_recipe_is_current_scaling():
    r = precision.recipe_for("fp8", None)
    assert (r.name, r.train_fp8_recipe, r.bf16_first_last_layers) == ("fp8-current", "current", 1)
    assert [precision.recipe(n).compute_dtype for n in ("bf16", "fp16", "fp32", "fp8-delayed", "mxfp8")] == [
        "bfloat16", "float16", "float32", "bfloat16", "bfloat16"]
    with pytest.raises(ValueError, match="unknown precision recipe 'fp9'"):
        precision.recipe("fp9")


@pytest.mark.parametrize("fp8_recipe,megatron_recipe,fmt", [
    # Megatron-LM arguments.py: "current" is its per-tensor "tensorwise"; blockwise and MXFP8 scale E4M3 everywhere.
    ("delayed", "delayed", "hybrid"), ("current", "tensorwise", "hybrid"), ("blockwise", "blockwise", "e4m3"),
    ("mxfp8", "mxfp8", "e4m3"),
])
def test_megatron_fp8_flags(fp8_recipe, megatron_recipe, fmt):
    flags = precision.megatron_flags("fp8", fp8_recipe, (1, 2))
    assert flags == [("--bf16", None), ("--fp8-format", fmt), ("--fp8-recipe", megatron_recipe),
                     ("--first-last-layers-bf16", None), ("--num-layers-at-start-in-bf16", 1),
                     ("--num-layers-at-end-in-bf16", 2)]
    # None at either end: the switch stays off (megatron-core would otherwise default both counts to 1).
    assert precision.megatron_flags("fp8", fp8_recipe) == flags[:3]
    present = {flag for flag, _ in flags}
    assert precision.megatron_plan_precision(present) == "fp8" and precision.megatron_dtype(present) == "bfloat16"


def test_megatron_flags_of_the_other_dtypes_read_back():
    # fp16: dynamic loss scaling from 2^16, window 1000, hysteresis 2 (the same numbers as ds_config.json's).
    assert precision.megatron_flags("fp16", None) == [
        ("--fp16", None), ("--initial-loss-scale", 65536), ("--min-loss-scale", 1), ("--loss-scale-window", 1000),
        ("--hysteresis", 2)]
    assert precision.megatron_flags("bf16", None) == [("--bf16", None)]
    assert precision.megatron_flags("fp32", None) == []  # Megatron-LM's default
    for dtype in ("fp16", "bf16", "fp32"):
        present = {flag for flag, _ in precision.megatron_flags(dtype, None)}
        assert precision.megatron_plan_precision(present) == dtype
        assert precision.megatron_dtype(present) == precision.recipe(dtype).compute_dtype


def test_what_each_framework_trains_is_one_table():
    assert precision.framework_precision("fp8", "megatron") == ("fp8", None)
    assert precision.framework_precision("fp8", "deepspeed") == (
        "bf16", "FP8 runs through Transformer Engine in Megatron only; bf16 here")
    assert precision.framework_precision("fp16", "fsdp") == ("bf16", "OLMo FSDP has no loss scaler; bf16 instead of fp16")
    assert precision.framework_precision("fp16", "deepspeed") == ("fp16", None)
    # The artifacts' nearest equivalents take it from there ...
    plan = ParallelPlan(framework="megatron", tp=2, dp=4, mbs=1, gbs=8, seq_length=4096, precision="fp8")
    fsdp, notes = equivalent_plan(plan, "fsdp")
    assert fsdp.precision == "bf16" and "FP8 runs through Transformer Engine in Megatron only; bf16 here" in notes
    # ... and a launch is refused with the same rule; genconf's FSDP launcher runs FP8 through torchao instead.
    h100 = resolve_gpu("h100-sxm")
    why = precision.unsupported_reason(precision.recipe("fp8-current"), gpu=h100, framework="deepspeed",
                                       te_available=True, cuda=True)
    assert why == ("fp8-current runs through Transformer Engine layers (the megatron launcher) or torchao (fsdp), "
                   "not deepspeed")
    why = precision.unsupported_reason(precision.recipe("fp8-current"), gpu=h100, framework="fsdp",
                                       te_available=True, cuda=True)
    assert why == "FP8 with FSDP runs through torchao, which is not installed: pip install 'genconf[fp8]'"
    assert precision.unsupported_reason(precision.recipe("fp8-current"), gpu=h100, framework="fsdp", te_available=False,
                                        cuda=True, torchao_available=True) is None
    assert precision.unsupported_reason(precision.recipe("fp16"), gpu=None, framework="fsdp", te_available=False,
                                        cuda=False) == ("fp16 with the OLMo-style FSDP launcher is not supported (no "
                                                        "loss scaler there); use bf16")


@pytest.mark.parametrize("name,gpu,cuda,te,why", [
    ("fp8-current", None, False, False, "fp8-current needs a Hopper or Blackwell GPU; this run has no GPU"),
    ("fp8-delayed", "a100-80gb", True, True, "fp8-delayed needs Hopper or Blackwell tensor cores; NVIDIA A100-SXM4-80GB "
                                             "is Ampere"),
    ("mxfp8", "h100-sxm", True, True, "mxfp8 needs Blackwell tensor cores; NVIDIA H100 80GB HBM3 (SXM5) is Hopper"),
    ("fp8-blockwise", "h100-sxm", True, False, "fp8-blockwise needs Transformer Engine (pip install 'genconf[te]'), "
                                               "which is not installed"),
    ("fp8-blockwise", "h100-sxm", True, True, None),
    ("bf16", None, False, False, None),
])
def test_where_a_recipe_runs(name, gpu, cuda, te, why):
    assert precision.unsupported_reason(precision.recipe(name), gpu=resolve_gpu(gpu) if gpu else None,
                                        framework="megatron", te_available=te, cuda=cuda) == why


def test_deepspeed_fp16_needs_a_gpu():
    assert precision.unsupported_reason(precision.recipe("fp16"), gpu=None, framework="deepspeed", te_available=False,
                                        cuda=False).startswith("fp16 under DeepSpeed needs a GPU")


def test_olmo_precision_names_are_read_by_olmo_as_the_plan_dtypes():
    # OLMo's own reader (ai2-olmo 0.6.0, olmo/config.py TrainConfig.autocast_precision) maps each name to its dtype.
    olmo_config = reader_or_skip("olmo.config", "pip install --no-deps ai2-olmo==0.6.0")
    torch = reader_or_skip("torch", "pip install torch==2.13.0")
    read = {name: olmo_config.TrainConfig(precision=value).autocast_precision
            for name, value in precision.OLMO_PRECISION.items()}
    assert read == {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def test_precision_names_map_to_plan_dtypes_and_fp8_recipes():
    assert precision.plan_precision_of("fp8-delayed") == ("fp8", "delayed")
    assert precision.plan_precision_of("mxfp8") == ("fp8", "mxfp8")
    assert precision.plan_precision_of("nvfp4") == ("fp4", None) and precision.plan_precision_of("bf16") == ("bf16", None)
    assert precision.plan_precision_of("fp8") == ("fp8", None)  # the default scaling: current
    assert set(precision.PRECISION_NAMES) == set(precision.PLAN_PRECISIONS) | set(precision.RECIPES)
