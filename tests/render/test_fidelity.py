"""genconf.fidelity: every way an artifact differs from the plan is a row (layout rewritten by a framework, model
features a format cannot express), and an artifact that matches the plan has none."""

import dataclasses

import pytest

from conftest import REPO, genconf_quiet
from genconf.catalog import hf
from genconf.catalog.models import resolve_model
from genconf.check.directory import check_dir
from genconf.render.fidelity import differences, feature_differences, layout_differences, olmo_config_omitted
from genconf.plan.specs import ParallelPlan

HF = REPO / "tests" / "data" / "hf"


def plan(**kw) -> ParallelPlan:
    values = dict(framework="megatron", tp=1, pp=1, dp=8, mbs=1, gbs=64, seq_length=2048, zero_stage=1,
                  recompute="none", precision="bf16")
    values.update(kw)
    return ParallelPlan(**values)


def rows(diffs, file):
    return {d.aspect: d for d in diffs if d.file == file}


def test_the_plans_own_framework_differs_in_nothing_of_its_layout():
    for framework, zero in (("megatron", 1), ("deepspeed", 3), ("fsdp", 2)):
        assert layout_differences(plan(framework=framework, zero_stage=zero), framework) == []


def test_model_parallelism_becomes_sharding_in_deepspeed_and_fsdp():
    p = plan(tp=4, pp=2, vp=2, dp=4, gbs=36, recompute="selective", precision="fp8")
    for framework, file, sharding in (("deepspeed", "ds_config.json", "ZeRO-3"), ("fsdp", "olmo_fsdp.yaml", "FSDP FULL_SHARD")):
        got = rows(layout_differences(p, framework), file)
        assert got["parallelism"].plan == "tp=4 pp=2 vp=2 dp=4" and got["parallelism"].in_file == "dp=32"
        assert got["sharding"].plan == "distributed optimizer (zero=1)" and got["sharding"].in_file == sharding
        assert (got["recompute"].plan, got["recompute"].in_file) == ("selective", "full")
        assert (got["precision"].plan, got["precision"].in_file) == ("fp8", "bf16")
        # 36 sequences are not a multiple of mbs 1 x 32 GPUs: the nearest multiple, 32
        assert (got["global batch"].plan, got["global batch"].in_file) == ("36 sequences", "32 sequences")


def test_equal_sharding_under_another_name_is_not_a_difference():
    # DeepSpeed ZeRO-1 and Megatron's distributed optimizer both shard optimizer states only
    assert layout_differences(plan(framework="deepspeed", zero_stage=1), "megatron") == []
    got = rows(layout_differences(plan(framework="deepspeed", zero_stage=1), "fsdp"), "olmo_fsdp.yaml")
    assert got["sharding"].in_file == "FSDP SHARD_GRAD_OP"


def test_qwen2_qkv_only_bias_is_a_row_of_the_olmo_config():
    model = hf.model_from_hf(HF / "qwen2-7b").spec
    assert model.add_qkv_bias and not model.add_bias_linear
    got = rows(feature_differences(model, "fsdp"), "olmo_fsdp.yaml")
    assert got["bias"].plan == "on q, k and v only (Qwen2)" and "include_bias" in got["bias"].in_file
    assert feature_differences(model, "megatron") == []  # --add-qkv-bias carries it


def test_gemma2_sandwich_norms_and_head_dim_are_rows():
    model = hf.model_from_hf(HF / "gemma-2-9b").spec
    assert model.sandwich_norm and model.kv_channels * model.num_attention_heads != model.hidden_size
    olmo = rows(feature_differences(model, "fsdp"), "olmo_fsdp.yaml")
    assert "four norms" in olmo["sandwich norms"].plan and olmo["head dimension"].plan == str(model.kv_channels)
    assert "four norms" in rows(feature_differences(model, "megatron"), "megatron_args.txt")["sandwich norms"].plan
    # Its sliding window (every other layer): megatron_args.txt carries it (--window-size), OLMo's config cannot.
    assert (olmo["sliding window"].plan, olmo["sliding window"].in_file) == ("4,096 keys back in 21 of 42 layers",
                                                                            "full causal attention")
    assert "sliding window" not in rows(feature_differences(model, "megatron"), "megatron_args.txt")
    # At 4,097 tokens the window covers the sequence: every layer is plain causal attention, as OLMo's.
    assert "sliding window" not in rows(feature_differences(model, "fsdp", 4097), "olmo_fsdp.yaml")
    assert "sliding window" in rows(feature_differences(model, "fsdp", 4098), "olmo_fsdp.yaml")


def test_qwen3_per_head_qk_norm_differs_in_olmo_not_in_megatron():
    model = hf.model_from_hf(HF / "qwen3-8b").spec
    assert model.qk_layernorm_per_head
    assert "q/k norm" in rows(feature_differences(model, "fsdp"), "olmo_fsdp.yaml")
    assert feature_differences(model, "megatron") == []


def test_moe_olmo_config_is_not_written_and_says_why():
    model, _ = resolve_model("mixtral-8x7b")
    why = olmo_config_omitted(model)
    assert why and "no mixture-of-experts block" in why and "MoEConfig" in why
    olmo = [d for d in differences(model, plan(ep=8)) if d.file == "olmo_fsdp.yaml"]
    assert [(d.aspect, d.in_file) for d in olmo] == [("experts", "not written")]
    assert olmo_config_omitted(resolve_model("llama3-8b")[0]) is None


def test_hybrid_mamba_model_writes_no_olmo_config_and_no_deepspeed_launcher(tmp_path):
    """Nemotron-H 8B (24 Mamba-2, 4 attention, 24 MLP layers of 52) once got an olmo_fsdp.yaml of 52 attention + MLP
    layers, which OLMo's TrainConfig.load read as that other model once squared ReLU was written as relu, and a
    launch_deepspeed.sbatch its runner refuses (the probe of 2026-12-01): neither is written now, the README says why,
    and genconf check flags a stale olmo_fsdp.yaml."""
    model = resolve_model("nemotron-h-8b")[0]
    assert (model.layers_of_kind("M"), model.layers_of_kind("*"), model.num_layers) == (24, 4, 52)
    assert "no Mamba-2 block" in olmo_config_omitted(model) and "pretrain_mamba.py" in olmo_config_omitted(model)
    out = tmp_path / "nemotron-h-8b"
    assert genconf_quiet("--model", "nemotron-h-8b", "--gpus", "8", "--cluster", "dgx-h100", "-o", str(out)) == 0
    assert sorted(p.name for p in out.iterdir() if p.is_file()) == [
        "README.md", "ds_config.json", "launch_env.sh", "launch_megatron.sbatch", "megatron_args.txt", "plan.json"]
    readme = (out / "README.md").read_text()
    assert "| `olmo_fsdp.yaml` | Mamba-2 layers | 24 of 52 layers | not written |" in readme
    assert "| `ds_config.json` | Mamba-2 layers | 24 of 52 layers | none: the JSON carries no model |" in readme
    assert check_dir(out).problems == ()
    (out / "olmo_fsdp.yaml").write_text("model:\n  n_layers: 52\n")
    problems = check_dir(out).problems
    assert [(p.file, p.line) for p in problems] == [("olmo_fsdp.yaml", None)]
    assert "describes a transformer without Mamba-2 layers" in problems[0].message
    assert "has no Mamba-2 block" in problems[0].message


@pytest.mark.parametrize("name", ["llama3-8b", "llama2-70b"])
def test_a_plain_llama_in_its_own_framework_has_no_rows(name):
    model, _ = resolve_model(name)
    assert differences(model, plan(), frameworks=("megatron",)) == ()


def test_olmo1_norms_are_rows_of_the_megatron_args():
    model, _ = resolve_model("olmo-1b")
    assert model.normalization == "nonparametric"
    got = rows(feature_differences(model, "megatron"), "megatron_args.txt")
    assert got["norm"].plan.startswith("non-parametric") and got["norm"].in_file == "LayerNorm with weight and bias"
    # and nothing for the OLMo config, which expresses it (layer_norm_with_affine: false)
    assert feature_differences(dataclasses.replace(model), "fsdp") == []
