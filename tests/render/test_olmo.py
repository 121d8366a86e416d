"""olmo_fsdp.yaml against the seed's OLMo configs: FSDP and DDP strategies, hybrid sharding, wrapping."""

from __future__ import annotations

from conftest import genconf_quiet, reader_or_skip

from genconf.check.directory import check_dir
from genconf.render.olmo import FSDP_WRAPPING


def test_olmo_config_matches_the_seed_shapes(rendered):
    import yaml

    fsdp = yaml.safe_load((rendered["fsdp1b"] / "olmo_fsdp.yaml").read_text())
    assert fsdp["distributed_strategy"] == "fsdp" and fsdp["fsdp"]["sharding_strategy"] == "FULL_SHARD"
    assert fsdp["fsdp"]["precision"] == "mixed" and fsdp["model"]["d_model"] == 2048 and fsdp["model"]["n_layers"] == 16
    # The 1B's embedding (kempner-olmo-1b: 32,128 x 2,048 = 66M parameters) outweighs a block (4 x 2,048^2 + 2 x 2,048 x
    # 8,192 = 50M, gelu): by_block_and_size wraps it on its own, one of OLMo's own FSDPWrapStrategy values.
    assert fsdp["fsdp"]["wrapping_strategy"] == "by_block_and_size"
    olmo_config = reader_or_skip("olmo.config", "pip install --no-deps ai2-olmo==0.6.0")
    assert set(FSDP_WRAPPING) <= {e.value for e in olmo_config.FSDPWrapStrategy}
    ddp = yaml.safe_load((rendered["ddp1b"] / "olmo_fsdp.yaml").read_text())
    assert ddp["distributed_strategy"] == "ddp" and ddp["ddp"] == {"grad_sync_mode": "batch", "find_unused_params": False}
    assert ddp["fsdp"]["sharding_strategy"] == "NO_SHARD"
    hsdp = yaml.safe_load((rendered["hsdp7b"] / "olmo_fsdp.yaml").read_text())
    assert hsdp["fsdp"]["sharding_strategy"] == "HYBRID_SHARD" and hsdp["fsdp"]["hybrid_sharding_num_model_replicas"] == 4
    # the seed's 7B: by_block (the embedding is smaller than one block)
    assert hsdp["fsdp"]["wrapping_strategy"] == "by_block" and hsdp["model"]["d_model"] == 4096


def test_bf16_gradients_reduce_in_bf16_under_fsdp(rendered):
    olmo = (rendered["fp8_block_knobs"] / "olmo_fsdp.yaml").read_text()
    assert "precision: pure" in olmo  # bf16 gradients: FSDP reduce_dtype bf16


def test_the_fused_loss_is_olmos_fused_loss(rendered):
    """OLMo's TrainConfig.fused_loss runs flash-attn's cross entropy, the one the plan priced; without it OLMo's
    F.cross_entropy keeps the fp32 log-softmax, so the key is written only where the plan fuses the loss."""
    import yaml

    fused = yaml.safe_load((rendered["fsdp_fused_loss"] / "olmo_fsdp.yaml").read_text())
    assert fused["fused_loss"] is True
    assert "fused_loss" not in yaml.safe_load((rendered["fsdp1b"] / "olmo_fsdp.yaml").read_text())


def test_olmos_flash_attention_follows_the_attention_kernel():
    """OLMo's flash_attention runs flash-attn 2; without it, PyTorch's SDPA (cuDNN's attention on Hopper and newer):
    the plan's kernel picks the key, and a Triton kernel, which OLMo cannot run, is said in the fidelity table."""
    import dataclasses

    from genconf.catalog.models import resolve_model
    from genconf.plan.specs import ParallelPlan, TrainSpec
    from genconf.render.fidelity import differences
    from genconf.render.olmo import olmo_config

    model = resolve_model("1b")[0]
    plan = ParallelPlan(framework="fsdp", dp=8, mbs=4, gbs=64, zero_stage=3)
    flash = {k: olmo_config(model, dataclasses.replace(plan, attention_kernel=k), TrainSpec(train_steps=10), "t")
             ["model"]["flash_attention"] for k in ("auto", "flash2", "cudnn", "triton", "math")}
    assert flash == {"auto": True, "flash2": True, "cudnn": False, "triton": True, "math": False}
    rows = differences(model, dataclasses.replace(plan, attention_kernel="math"), ("fsdp",))
    assert [r.aspect for r in rows] == ["attention kernel"] and "math" in rows[0].plan
    rows = differences(model, dataclasses.replace(plan, attention_kernel="triton"), ("fsdp",))
    assert [r.aspect for r in rows] == ["attention kernel"]


def test_squared_relu_models_write_an_olmo_config_olmo_loads(tmp_path):
    """Nemotron's squared ReLU is not one of OLMo's ActivationType (gelu, relu, swiglu): olmo_fsdp.yaml once said
    activation_type squared_relu, which OLMo's own TrainConfig.load refused (the probe of 2026-12-01). It now trains
    relu, the same weights (nemotron3-8b: mlp_hidden_size 16384, one ungated branch), says so in the README's
    what-differs table, and genconf check names a squared_relu line."""
    out = tmp_path / "nemotron3-8b"
    assert genconf_quiet("--model", "nemotron3-8b", "--gpus", "8", "--cluster", "dgx-h100", "--framework", "fsdp",
                         "-o", str(out)) == 0
    olmo_config = reader_or_skip("olmo.config", "pip install --no-deps ai2-olmo==0.6.0")
    cfg = olmo_config.TrainConfig.load(out / "olmo_fsdp.yaml")
    assert (str(cfg.model.activation_type), cfg.model.mlp_hidden_size, cfg.model.d_model, cfg.model.n_layers) == \
        ("relu", 16384, 4096, 32)
    assert "| `olmo_fsdp.yaml` | activation | squared ReLU, relu(x)^2 (Nemotron) | relu (activation_type: relu) |" \
        in (out / "README.md").read_text()
    assert check_dir(out).problems == ()
    text = (out / "olmo_fsdp.yaml").read_text()
    line = text.splitlines().index("  activation_type: relu") + 1
    (out / "olmo_fsdp.yaml").write_text(text.replace("activation_type: relu", "activation_type: squared_relu"))
    problems = check_dir(out).problems
    assert [(p.file, p.line) for p in problems] == [("olmo_fsdp.yaml", line)]
    assert "model.activation_type 'squared_relu' is not one of OLMo's gelu|relu|swiglu" in problems[0].message
