"""The rotary base and Llama 3.1's rope scaling reach every artifact: a checkpoint trained at rope_theta 500,000 is
wrong at Megatron-LM's and OLMo's default 10,000 (the probe of 2026-11-29 found megatron_args.txt without
--rotary-base and olmo_fsdp.yaml without rope_theta for Llama 3)."""

from __future__ import annotations

import json

import pytest
import yaml

from conftest import REPO, genconf_quiet, needs_megatron, needs_torch
from genconf.catalog import hf
from genconf.catalog.models import resolve_model
from genconf.check.directory import check_dir
from genconf.plan.specs import ParallelPlan, TrainSpec
from genconf.render.megatron import arg_values, megatron_args, megatron_args_text, megatron_plan
from genconf.render.olmo import olmo_config

HF = REPO / "tests" / "data" / "hf"


def _megatron_values(name: str) -> dict:
    model, _ = resolve_model(name)
    plan = ParallelPlan(framework="megatron", tp=1, pp=1, dp=8, mbs=1, gbs=8, seq_length=model.seq_length)
    return arg_values(megatron_args(model, plan, TrainSpec(train_steps=10)))


@pytest.mark.parametrize("name,theta,factor", [("llama3-8b", 500_000, None), ("llama3.1-8b", 500_000, 8.0),
                                               ("llama3.2-1b", 500_000, 32.0), ("qwen3-8b", 1_000_000, None),
                                               ("mixtral-8x7b", 1_000_000, None), ("llama2-7b", 10_000, None),
                                               ("gpt-oss-120b", 150_000, None)])
def test_megatron_args_carry_the_rotary_base_and_llama3_scaling(name, theta, factor):
    values = _megatron_values(name)
    assert values["--rotary-base"] == theta
    assert ("--use-rope-scaling" in values) == (factor is not None)
    assert values.get("--rope-scaling-factor") == factor
    # read back as the model it describes (genconf check's view)
    model, _ = megatron_plan(values, resolve_model(name)[0], 8)
    assert (model.rope_theta, model.rope_scaling_factor) == (theta, factor)


@pytest.mark.parametrize("name,warned", [("llama3.1-8b", False), ("llama3.2-1b", True)])
def test_a_factor_megatron_lm_would_not_pass_on_is_said_beside_it(name, warned):
    # Megatron-LM core_v0.16.1's gpt_builders.py gives GPTModel rope_scaling but not --rope-scaling-factor, so its
    # pretrain_gpt.py rotates Llama 3.2's factor 32 at GPTModel's default 8.
    model, _ = resolve_model(name)
    plan = ParallelPlan(framework="megatron", tp=1, pp=1, dp=8, mbs=1, gbs=8, seq_length=model.seq_length)
    text = megatron_args_text(megatron_args(model, plan, TrainSpec(train_steps=10)))
    assert ("rotates at its default factor 8 whatever this flag says" in text) == warned


def test_a_model_without_rope_writes_no_rotary_base():
    assert "--rotary-base" not in _megatron_values("gpt3-1.3b")


def test_olmo_config_carries_rope_theta():
    model, _ = resolve_model("olmo2-7b")
    plan = ParallelPlan(framework="fsdp", tp=1, pp=1, dp=8, mbs=1, gbs=8, seq_length=model.seq_length, zero_stage=3)
    config = olmo_config(model, plan, TrainSpec(train_steps=10), "rope")
    assert config["model"]["rope_theta"] == 500_000


def test_hf_import_reads_rope_theta_and_llama3_scaling():
    llama31 = hf.model_from_hf(HF / "llama3.1-8b")
    assert (llama31.spec.rope_theta, llama31.spec.rope_scaling_factor) == (500_000.0, 8.0)
    qwen = hf.model_from_hf(HF / "qwen3-8b")
    assert (qwen.spec.rope_theta, qwen.spec.rope_scaling_factor) == (1_000_000.0, None)
    data = json.loads((HF / "llama3-8b" / "config.json").read_text())
    yarn = dict(data, rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192})
    spec, _, notes = hf.model_from_config(yarn, name="yarn", where="config.json")
    assert spec.rope_scaling_factor is None and any("yarn rope scaling (factor 4)" in n for n in notes)


@needs_torch
@needs_megatron
@pytest.mark.parametrize("theta,factor", [(10_000.0, None), (500_000.0, 8.0), (500_000.0, 32.0)])
def test_genconf_s_own_tables_are_megatron_core_s(theta, factor):
    """genconf's torch model (DeepSpeed and FSDP runs) rotates as megatron-core's RotaryEmbedding does."""
    import torch
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    from genconf.train.torch_model import rope_tables

    dim, seq = 64, 16384
    rope = RotaryEmbedding(kv_channels=dim, rotary_percent=1.0, rotary_base=int(theta), rope_scaling=bool(factor),
                           rope_scaling_factor=factor or 8.0, use_cpu_initialization=True)
    freqs = torch.outer(torch.arange(seq, dtype=torch.float32), rope.inv_freq)  # its forward's, on a CPU
    angles = torch.cat([freqs, freqs], dim=-1)
    cos, sin = rope_tables(seq, dim, theta, factor)
    assert torch.allclose(cos, angles.cos(), atol=1e-5) and torch.allclose(sin, angles.sin(), atol=1e-5)


def test_check_reads_a_missing_rotary_base_as_megatron_s_default(tmp_path):
    """Megatron-LM's --rotary-base defaults to 10,000: an artifacts directory without the line (written before
    genconf rendered it) is right for a model at that base and wrong for Llama 3's 500,000."""
    for name, ok in (("llama2-7b", True), ("llama3-8b", False)):
        d = tmp_path / name
        assert genconf_quiet("--model", name, "--gpus", "8", "--cluster", "dgx-h100", "--framework", "megatron",
                             "-o", str(d)) == 0
        args = d / "megatron_args.txt"
        args.write_text("\n".join(x for x in args.read_text().splitlines() if not x.startswith("--rotary-base")) + "\n")
        problems = [str(p) for p in check_dir(d).problems]
        assert (not problems) if ok else any("--rotary-base missing: contradicts plan.json" in p for p in problems), problems


def test_pythia_s_partial_rotary_reaches_megatron_and_is_read_back_and_checked(tmp_path):
    """GPT-NeoX's rotary_pct (Pythia: 0.25) is --rotary-percent: Megatron-LM rotates every dimension without it."""
    spec = hf.model_from_hf(HF / "pythia-160m").spec
    assert (spec.rotary_percent, spec.rope_dim) == (0.25, 16)
    d = tmp_path / "pythia"
    assert genconf_quiet("--model", str(HF / "pythia-160m"), "--gpus", "8", "--framework", "megatron",
                         "-o", str(d)) == 0
    args = d / "megatron_args.txt"
    assert "--rotary-percent 0.25" in args.read_text().splitlines()
    plan = ParallelPlan(framework="megatron", tp=1, pp=1, dp=8, mbs=1, gbs=8, seq_length=spec.seq_length)
    values = arg_values(megatron_args(spec, plan, TrainSpec(train_steps=10)))
    assert megatron_plan(values, spec, 8)[0].rotary_percent == 0.25
    assert not check_dir(d).problems
    args.write_text(args.read_text().replace("--rotary-percent 0.25\n", ""))
    assert any("--rotary-percent missing: contradicts plan.json" in str(p) for p in check_dir(d).problems)
    assert "partial rotary" in (d / "README.md").read_text()  # OLMo's config rotates the whole head


@pytest.mark.parametrize("pct", [0.0, 1.5, "x", True])
def test_a_bad_rotary_pct_is_one_line(pct):
    data = json.loads((HF / "pythia-160m" / "config.json").read_text())
    with pytest.raises(hf.GenconfError, match="rotary_pct = .* a share of each head's dimensions in"):
        hf.model_from_config(dict(data, rotary_pct=pct), name="p", where="config.json")


@needs_torch
@needs_megatron
def test_genconf_s_partial_rotary_is_megatron_core_s():
    """The first int(d x share) dimensions rotated, the rest passed through, as megatron-core applies it."""
    import torch
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd

    from genconf.train.torch_model import apply_rope, rope_tables

    dim, seq, share = 64, 32, 0.25
    rope = RotaryEmbedding(kv_channels=dim, rotary_percent=share, rotary_base=10000, use_cpu_initialization=True)
    freqs = torch.outer(torch.arange(seq, dtype=torch.float32), rope.inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)[:, None, None, :]  # [s, 1, 1, rotated]
    x = torch.randn(seq, 2, 3, dim)  # megatron-core's [s, b, heads, d]
    expected = _apply_rotary_pos_emb_bshd(x, emb)  # the unfused path apply_rotary_pos_emb takes on a CPU
    cos, sin = rope_tables(seq, int(dim * share), 10000.0)
    ours = apply_rope(x.permute(1, 2, 0, 3), cos, sin).permute(2, 0, 1, 3)  # genconf's [b, heads, s, d]
    assert torch.allclose(ours, expected, atol=1e-6)
