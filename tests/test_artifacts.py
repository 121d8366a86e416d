"""Artifacts from one plan, checked by the real tools: DeepSpeed's DeepSpeedConfig with the plan's world size,
megatron-core's TransformerConfig, shellcheck; genconf check on hand-edited files; atomic writing; injection."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, genconf_cmd, needs_deepspeed, needs_megatron, shellcheck_or_skip
from genconf import check, configs
from genconf.cli import main

# name -> plan flags. Every one is a plan genconf accepts; the comments say what each covers.
PLANS = {
    # the main job's model and cluster, pinned to a classic 3D layout: megatron tp4 pp4 vp4, sp, distributed optimizer
    "olmo70b": ["--model", "70b", "--gpus", "384", "--framework", "megatron", "--tp", "4", "--pp", "4", "--vp", "4",
                "--zero", "1", "--mbs", "1", "--recompute", "none"],
    "fsdp1b": ["--model", "1b", "--gpus", "4", "--gpus-per-node", "2", "--framework", "fsdp", "--zero", "3"],
    "ddp1b": ["--model", "1b", "--gpus", "8", "--framework", "fsdp", "--zero", "0"],
    "hsdp7b": ["--model", "7b", "--gpus", "16", "--framework", "fsdp", "--zero", "3", "--gpus-per-node", "4",
               "--mbs", "1", "--global-batch", "512"],
    "ds_z0": ["--model", "1b", "--gpus", "8", "--framework", "deepspeed", "--zero", "0"],
    "ds_z1": ["--model", "1b", "--gpus", "8", "--framework", "deepspeed", "--zero", "1"],
    "ds_z2_fp16": ["--model", "7b", "--gpus", "8", "--framework", "deepspeed", "--zero", "2", "--precision", "fp16"],
    "ds_z3": ["--model", "7b", "--gpus", "16", "--framework", "deepspeed", "--zero", "3", "--recompute", "full"],
    "ds_z2_offload": ["--model", "7b", "--gpus", "8", "--framework", "deepspeed", "--zero", "2", "--offload"],
    "ds_z3_offload": ["--model", "70b", "--gpus", "32", "--framework", "deepspeed", "--zero", "3", "--offload"],
    "gqa_fp8_pp2vp2": ["--model", "llama3-8b", "--gpus", "16", "--cluster", "dgx-h100", "--framework", "megatron",
                       "--tp", "2", "--pp", "2", "--vp", "2", "--precision", "fp8", "--global-batch", "256"],
    "moe_ep_cp": ["--model", "mixtral-8x7b", "--gpus", "64", "--cluster", "dgx-h100", "--framework", "megatron",
                  "--ep", "8"],
    "uneven_pp": ["--model", "llama3-8b", "--gpus", "24", "--cluster", "dgx-h100", "--framework", "megatron", "--tp", "8",
                  "--pp", "3", "--first-stage-layers", "10", "--last-stage-layers", "10"],
    "selective": ["--model", "llama2-13b", "--gpus", "16", "--cluster", "dgx-h100", "--framework", "megatron",
                  "--tp", "4", "--pp", "2", "--recompute", "selective"],
    "full_fp16_local": ["--model", "gpt3-2.7b", "--gpus", "8", "--cluster", "dgx-a100", "--framework", "megatron",
                        "--tp", "2", "--recompute", "full", "--precision", "fp16", "--layer-spec", "local"],
    # the modern Megatron knobs: FP8 blockwise with FP8 parameters, bf16 gradients, precision-aware optimizer,
    # block recompute of 2 layers per chunk
    "fp8_block_knobs": ["--model", "llama3-8b", "--gpus", "16", "--cluster", "dgx-h100", "--framework", "megatron",
                        "--tp", "2", "--pp", "2", "--vp", "2", "--zero", "1", "--precision", "fp8-blockwise",
                        "--fp8-param-gather", "--grad-dtype", "bf16", "--precision-aware-optimizer",
                        "--recompute-layers", "2", "--global-batch", "256"],
    # Megatron-FSDP (zero 3 = optim_grads_params)
    "megatron_fsdp": ["--model", "llama3-8b", "--gpus", "8", "--cluster", "dgx-h100", "--framework", "megatron",
                      "--tp", "1", "--pp", "1", "--zero", "3", "--mbs", "1"],
    # DeepSpeed ZeRO-1 with an fp32 gradient accumulation buffer (BF16_Optimizer)
    "ds_z1_fp32_grads": ["--model", "1b", "--gpus", "8", "--framework", "deepspeed", "--zero", "1",
                         "--grad-dtype", "fp32"],
}
DS_PLANS = ["ds_z0", "ds_z1", "ds_z2_fp16", "ds_z3", "ds_z2_offload", "ds_z3_offload", "olmo70b", "fsdp1b", "hsdp7b",
            "uneven_pp", "ds_z1_fp32_grads"]
MEGATRON_PLANS = ["olmo70b", "gqa_fp8_pp2vp2", "moe_ep_cp", "uneven_pp", "selective", "full_fp16_local", "ds_z3",
                  "fsdp1b", "fp8_block_knobs", "megatron_fsdp"]


def genconf_quiet(*args: str) -> int:
    """Run the CLI in-process, swallowing its stdout/stderr."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return main(list(args))


def run(*args: str, timeout: int = 120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(genconf_cmd() + list(args), capture_output=True, text=True, timeout=timeout, cwd=REPO, **kw)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, Path]:
    """Every plan in PLANS rendered once into its own directory."""
    root = tmp_path_factory.mktemp("artifacts")
    dirs = {}
    for name, flags in PLANS.items():
        assert genconf_quiet(*flags, "-o", str(root / name)) == 0, name
        dirs[name] = root / name
    # HYBRID_SHARD: the search prefers FULL_SHARD here, so set the shard group (a node) in plan.json and re-render.
    run_ = plan_of(dirs["hsdp7b"])
    run_["plan"]["shard_group_size"] = 4
    (root / "hsdp7b.json").write_text(json.dumps(run_))
    assert genconf_quiet("render", str(root / "hsdp7b.json"), "-o", str(dirs["hsdp7b"]), "--force") == 0
    return dirs


def plan_of(d: Path) -> dict:
    return json.loads((d / "plan.json").read_text())


def one_line_error(out: subprocess.CompletedProcess, needle: str) -> None:
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("genconf: error:") and needle in lines[0], out.stderr
    assert "Traceback" not in out.stderr


# --- every file, from one plan ---------------------------------------------------------------------

def test_every_plan_renders_every_file_and_passes_its_own_check(rendered):
    for name, d in rendered.items():
        plan = plan_of(d)
        files = sorted(p.name for p in d.iterdir() if p.is_file())
        want = sorted(configs.artifact_names(report_plan(plan)))
        assert files == want, name
        result = check.check_dir(d)
        assert result.problems == (), (name, [str(p) for p in result.problems])
        assert ("launch_fsdp.sbatch" in files) == (plan["plan"]["framework"] == "fsdp")
        assert (d / "runs" / "logs").is_dir()


def report_plan(run: dict):
    from genconf.report import specs_from_dict

    return specs_from_dict(run)[2]


def test_plan_json_is_what_json_prints_and_rerenders_identically(rendered, tmp_path):
    d = rendered["olmo70b"]
    printed = run(*PLANS["olmo70b"], "--json")
    assert printed.returncode == 0
    assert (d / "plan.json").read_text() == printed.stdout
    out = run("render", str(d / "plan.json"), "-o", str(tmp_path / "again"))
    assert out.returncode == 0, out.stderr
    for name in ("plan.json", "ds_config.json", "megatron_args.txt", "olmo_fsdp.yaml"):
        assert (tmp_path / "again" / name).read_text() == (d / name).read_text(), name
    assert run("check", str(tmp_path / "again")).stdout.strip() == "ok: 6 files"


def test_one_plan_drives_nodes_batches_and_degrees(rendered):
    d = rendered["olmo70b"]
    p = plan_of(d)["plan"]
    assert (p["tp"], p["pp"], p["vp"], p["dp"]) == (4, 4, 4, 24)
    args, problems = check.parse_megatron_args((d / "megatron_args.txt").read_text())
    assert not problems
    assert args["--global-batch-size"].value == p["gbs"] and args["--micro-batch-size"].value == p["mbs"]
    for name in ("launch_megatron.sbatch", "launch_deepspeed.sbatch"):
        text = (d / name).read_text()
        assert "#SBATCH --nodes=96\n" in text and "#SBATCH --gpus-per-node=4\n" in text
        assert "--nnodes=96 --nproc-per-node=4" in text and "#SBATCH --ntasks-per-node=1\n" in text
        assert 'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"' in text
        assert "export NCCL_IB_HCA=mlx5" in text
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in (d / "launch_megatron.sbatch").read_text()
    ds = json.loads((d / "ds_config.json").read_text())
    # 1056 is not a multiple of mbs x 384; the DeepSpeed equivalent takes the nearest multiple and says so
    assert ds["train_batch_size"] == 1152 and "1152 instead" in (d / "README.md").read_text()
    readme = (d / "README.md").read_text()
    for text in ("## Why this plan", "## Memory per GPU", "| pipeline stage |", "sbatch ", "genconf check",
                 "one `--flag value` per line | the plan exactly |"):
        assert text in readme


def test_zero3_thresholds_come_from_the_hidden_size(rendered):
    from genconf.memory import deepspeed_zero_buckets

    for name in ("ds_z3", "ds_z3_offload"):
        d = rendered[name]
        h = plan_of(d)["model"]["hidden_size"]
        zero = json.loads((d / "ds_config.json").read_text())["zero_optimization"]
        buckets = deepspeed_zero_buckets(h)
        # HF's 'auto' values (0.9 h^2, 10 h, h^2), rounded up to even element counts (DeepSpeed asserts it).
        even = lambda n: n + n % 2  # noqa: E731
        assert zero["stage3_prefetch_bucket_size"] == even(int(0.9 * h * h)) == buckets["stage3_prefetch_bucket_size"]
        assert zero["stage3_param_persistence_threshold"] == 10 * h
        assert zero["reduce_bucket_size"] == even(h * h)
    hsdp = json.loads((rendered["hsdp7b"] / "ds_config.json").read_text())
    assert hsdp["zero_optimization"]["zero_hpz_partition_size"] == 4  # ZeRO++ hpZ inside the node


def test_olmo_config_matches_the_seed_shapes(rendered):
    import yaml

    fsdp = yaml.safe_load((rendered["fsdp1b"] / "olmo_fsdp.yaml").read_text())
    assert fsdp["distributed_strategy"] == "fsdp" and fsdp["fsdp"]["sharding_strategy"] == "FULL_SHARD"
    assert fsdp["fsdp"]["precision"] == "mixed" and fsdp["model"]["d_model"] == 2048 and fsdp["model"]["n_layers"] == 16
    assert fsdp["fsdp"]["wrapping_strategy"] in configs.FSDP_WRAPPING
    ddp = yaml.safe_load((rendered["ddp1b"] / "olmo_fsdp.yaml").read_text())
    assert ddp["distributed_strategy"] == "ddp" and ddp["ddp"] == {"grad_sync_mode": "batch", "find_unused_params": False}
    assert ddp["fsdp"]["sharding_strategy"] == "NO_SHARD"
    hsdp = yaml.safe_load((rendered["hsdp7b"] / "olmo_fsdp.yaml").read_text())
    assert hsdp["fsdp"]["sharding_strategy"] == "HYBRID_SHARD" and hsdp["fsdp"]["hybrid_sharding_num_model_replicas"] == 4
    # the seed's 7B: by_block (the embedding is smaller than one block)
    assert hsdp["fsdp"]["wrapping_strategy"] == "by_block" and hsdp["model"]["d_model"] == 4096


# --- DeepSpeed's own config parser with the plan's world size ---------------------------------------

class PlanMPU:
    """What DeepSpeedConfig asks an mpu: the data-parallel world size (here the plan's GPUs)."""

    def __init__(self, dp: int):
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp


@pytest.fixture
def deepspeed_config_cls(monkeypatch):
    import deepspeed.comm
    from deepspeed.runtime.config import DeepSpeedConfig

    # DeepSpeedConfig reads the mpu's world size only after dist.get_rank() succeeds; without a process group
    # it falls back to world size 1. Answer rank 0 so the plan's world size is the one it checks against.
    monkeypatch.setattr(deepspeed.comm, "get_rank", lambda group=None: 0)
    return DeepSpeedConfig


@needs_deepspeed
@pytest.mark.parametrize("name", DS_PLANS)
def test_deepspeed_accepts_every_ds_config_with_the_plans_world_size(rendered, deepspeed_config_cls, name):
    import torch
    from deepspeed.runtime import lr_schedules

    d = rendered[name]
    run_ = plan_of(d)
    world = run_["cluster"]["num_gpus"]
    raw = json.loads((d / "ds_config.json").read_text())
    cfg = deepspeed_config_cls(raw, mpu=PlanMPU(world))
    assert cfg.world_size == world
    assert cfg.train_batch_size == cfg.train_micro_batch_size_per_gpu * cfg.gradient_accumulation_steps * world
    ds_plan, _ = configs.equivalent_plan(report_plan(run_), "deepspeed")
    assert cfg.zero_optimization_stage == ds_plan.zero_stage
    assert cfg.float16_config.enabled == (ds_plan.precision == "fp16")
    assert cfg.bfloat16_config.enabled == (ds_plan.precision != "fp16")
    assert (cfg.zero_config.offload_optimizer is not None) == ds_plan.offload_optimizer
    assert (cfg.zero_config.offload_param is not None) == ds_plan.offload_params
    if ds_plan.precision == "fp16":
        assert cfg.float16_config.initial_scale_power == 16 and raw["fp16"]["loss_scale"] == 0  # dynamic
    with pytest.raises(AssertionError, match="train_batch_size is not equal"):
        deepspeed_config_cls(raw, mpu=PlanMPU(world * 2))  # the world size really is checked
    # optimizer and scheduler are real DeepSpeed / torch names and parameters
    params = [torch.nn.Parameter(torch.zeros(2))]
    opt = torch.optim.AdamW(params, **{k: tuple(v) if k == "betas" else v for k, v in raw["optimizer"]["params"].items()})
    sched = getattr(lr_schedules, raw["scheduler"]["type"])(opt, **raw["scheduler"]["params"])
    assert raw["scheduler"]["type"] in lr_schedules.VALID_LR_SCHEDULES
    sched.step()


def test_ds_config_covers_every_stage_offload_and_precision(rendered):
    seen = set()
    for name in DS_PLANS:
        ds = json.loads((rendered[name] / "ds_config.json").read_text())
        zero = ds["zero_optimization"]
        seen.add(f"zero{zero['stage']}")
        seen.update(k for k in ("offload_optimizer", "offload_param") if k in zero)
        seen.update(k for k in ("bf16", "fp16") if ds.get(k, {}).get("enabled"))
    assert {"zero0", "zero1", "zero2", "zero3", "offload_optimizer", "offload_param", "bf16", "fp16"} <= seen


# --- megatron-core's TransformerConfig ------------------------------------------------------------

def transformer_config(args: dict):
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer import TransformerConfig

    kw = check.megatron_config_kwargs(args)
    dtypes = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
    kw.update(params_dtype=dtypes[kw["params_dtype"]], pipeline_dtype=dtypes[kw["pipeline_dtype"]],
              activation_func={"silu": F.silu, "gelu": F.gelu}[kw["activation_func"]])
    return TransformerConfig(**kw)


@needs_megatron
@pytest.mark.parametrize("name", MEGATRON_PLANS)
def test_megatron_core_accepts_every_argument_set(rendered, name):
    d = rendered[name]
    args, problems = check.parse_megatron_args((d / "megatron_args.txt").read_text())
    assert problems == []  # every flag is a Megatron-LM argument, typed and within its choices
    cfg = transformer_config(args)
    plan, _ = configs.equivalent_plan(report_plan(plan_of(d)), "megatron")
    assert (cfg.tensor_model_parallel_size, cfg.pipeline_model_parallel_size, cfg.context_parallel_size,
            cfg.expert_model_parallel_size) == (plan.tp, plan.pp, plan.cp, plan.ep)
    assert cfg.virtual_pipeline_model_parallel_size == (plan.vp if plan.vp > 1 else None)
    assert cfg.sequence_parallel == plan.sequence_parallel
    assert cfg.recompute_granularity == (None if plan.recompute == "none" else plan.recompute)
    if name == "gqa_fp8_pp2vp2":
        assert cfg.gated_linear_unit and cfg.normalization == "RMSNorm" and cfg.num_query_groups == 8
        assert (cfg.fp8, cfg.fp8_recipe, cfg.first_last_layers_bf16) == ("hybrid", "tensorwise", True)
        assert cfg.num_layers_at_start_in_bf16 == cfg.num_layers_at_end_in_bf16 == 1
        # pp=2 with interleaving: p2p overlapped, never batched (Megatron-LM issues 750, 1450)
        assert cfg.overlap_p2p_comm and not cfg.batch_p2p_comm
    if name == "moe_ep_cp":
        assert cfg.num_moe_experts == 8 and cfg.moe_router_topk == 2
    if name == "uneven_pp":
        assert (cfg.num_layers_in_first_pipeline_stage, cfg.num_layers_in_last_pipeline_stage) == (10, 10)
    if name == "full_fp16_local":
        assert cfg.fp16 and cfg.recompute_method == "uniform" and cfg.recompute_num_layers == 1
    if name == "fp8_block_knobs":
        assert (cfg.fp8, cfg.fp8_recipe, cfg.fp8_param) == ("e4m3", "blockwise", True)
        assert cfg.recompute_method == "block" and cfg.recompute_num_layers == 2
        text = (d / "megatron_args.txt").read_text()
        assert "--grad-reduce-in-bf16\n" in text and "--use-precision-aware-optimizer\n" in text
    if name == "megatron_fsdp":
        text = (d / "megatron_args.txt").read_text()
        assert "--use-megatron-fsdp\n" in text and "--data-parallel-sharding-strategy optim_grads_params" in text
        assert "--ckpt-format fsdp_dtensor" in text
        assert "CUDA_DEVICE_MAX_CONNECTIONS" not in (d / "launch_megatron.sbatch").read_text().replace("# ", "")


def test_launch_scripts_set_expandable_segments(rendered):
    script = (rendered["olmo70b"] / "launch_megatron.sbatch").read_text()
    assert 'export PYTORCH_CUDA_ALLOC_CONF="${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}"' in script


def test_gradient_dtype_reaches_every_framework(rendered):
    ds = json.loads((rendered["ds_z1_fp32_grads"] / "ds_config.json").read_text())
    assert ds["data_types"] == {"grad_accum_dtype": "fp32"} and ds["communication_data_type"] == "fp32"
    olmo = (rendered["fp8_block_knobs"] / "olmo_fsdp.yaml").read_text()
    assert "precision: pure" in olmo  # bf16 gradients: FSDP reduce_dtype bf16


def test_emitted_flags_are_megatron_lm_arguments(rendered):
    for name, d in rendered.items():
        text = (d / "megatron_args.txt").read_text()
        flags = [line.split()[0] for line in text.splitlines() if line and not line.startswith("#")]
        assert flags and all(flag in configs.MEGATRON_FLAGS for flag in flags), name
        assert "--no-overlap-p2p-communication" not in flags and "--use-mcore-models" not in flags


def test_pp2_interleaving_guard(rendered, tmp_path):
    d = rendered["gqa_fp8_pp2vp2"]
    text = (d / "megatron_args.txt").read_text()
    assert "--no-overlap-p2p-communication" not in text.replace("# Never add --no-overlap-p2p-communication", "")
    assert "Megatron-LM issues 750, 1450" in text
    edited = tmp_path / "edited"
    shutil.copytree(d, edited)
    (edited / "megatron_args.txt").write_text(text + "--no-overlap-p2p-communication\n")
    out = run("check", str(edited))
    line = len(text.splitlines()) + 1
    assert out.returncode == 2
    assert out.stdout.startswith(f"megatron_args.txt:{line}: --no-overlap-p2p-communication: with pp=2")


@needs_megatron
def test_broken_plan_is_caught_by_genconf_not_by_megatron_core(rendered, tmp_path):
    """pp=3 on an 80-layer model with 4 virtual stages: megatron-core's TransformerConfig accepts it; genconf
    check names the line, and genconf never writes such a plan in the first place."""
    edited = tmp_path / "edited"
    shutil.copytree(rendered["olmo70b"], edited)
    path = edited / "megatron_args.txt"
    text = path.read_text().replace("--pipeline-model-parallel-size 4\n", "--pipeline-model-parallel-size 3\n")
    path.write_text(text)
    args, problems = check.parse_megatron_args(text)
    assert problems == []
    cfg = transformer_config(args)  # megatron-core alone does not catch it
    assert cfg.pipeline_model_parallel_size == 3 and cfg.num_layers == 80
    out = run("check", str(edited))
    assert out.returncode == 2
    line = text.splitlines().index("--pipeline-model-parallel-size 3") + 1
    assert out.stdout.splitlines() == [f"megatron_args.txt:{line}: --pipeline-model-parallel-size 3: num_layers (80) is "
                                       f"not divisible by pp x vp (3 x 4 = 12); set --pp to a divisor of 80 or an "
                                       f"uneven split (first/last stage layers)"]
    # the same plan pinned on the command line is refused before any file exists
    target = tmp_path / "never"
    out = run("--model", "70b", "--gpus", "384", "--framework", "megatron", "--tp", "4", "--pp", "3", "--vp", "2",
              "--first-stage-layers", "25", "--last-stage-layers", "25", "-o", str(target))
    one_line_error(out, "pipeline_split: 25 layers on an end stage are not divisible by vp (2)")
    assert not target.exists()


# --- genconf check on hand-edited directories ------------------------------------------------------

def _edit(src: Path, dst: Path, name: str, old: str, new: str) -> int:
    shutil.copytree(src, dst)
    text = (dst / name).read_text()
    assert old in text, (name, old)
    (dst / name).write_text(text.replace(old, new, 1))
    return text[: text.index(old)].count("\n") + 1


@pytest.mark.parametrize("name,old,new,message", [
    ("megatron_args.txt", "--lr 0.0003", "--lr fast", "--lr fast: expected a number"),
    ("megatron_args.txt", "--seed 1234", "--sead 1234", "unknown flag --sead"),
    ("megatron_args.txt", "--global-batch-size 1056", "--global-batch-size 1000",
     "--global-batch-size 1000: global batch (1000) must be divisible by mbs x dp (1 x 24 = 24)"),
    ("megatron_args.txt", "--tensor-model-parallel-size 4", "--tensor-model-parallel-size 5",
     "--tensor-model-parallel-size 5: tp x pp x cp = 5 x 4 x 1 = 20 does not divide the plan's 384 GPUs"),
    ("megatron_args.txt", "--num-layers 80", "--num-layers 81", "--num-layers 81"),
    ("ds_config.json", '"train_batch_size": 1152', '"train_batch_size": 1000',
     "train_batch_size (1000) != train_micro_batch_size_per_gpu x gradient_accumulation_steps x data-parallel size "
     "(1 x 3 x 384 = 1152)"),
    ("ds_config.json", '"stage": 3', '"stage": 1', "zero_optimization.stage 1 contradicts plan.json (zero=3"),
    ("ds_config.json", '"stage": 3,', '"stage": three,', "invalid JSON: Expecting value"),
    ("olmo_fsdp.yaml", "sharding_strategy: FULL_SHARD", "sharding_strategy: FULLSHARD",
     "fsdp.sharding_strategy 'FULLSHARD' is not one of FULL_SHARD|SHARD_GRAD_OP|HYBRID_SHARD|NO_SHARD"),
    ("olmo_fsdp.yaml", "  n_layers: 80", "  n_layers: 80: 1", "invalid YAML: mapping values are not allowed here"),
    ("launch_megatron.sbatch", "#SBATCH --nodes=96", "#SBATCH --nodes=95",
     "#SBATCH --nodes=95 contradicts the plan: 384 GPUs on 4-GPU nodes needs --nodes=96"),
    ("launch_deepspeed.sbatch", "--nproc-per-node=4", "--nproc-per-node=8",
     "torchrun --nproc-per-node=8 contradicts the plan: 384 GPUs on 4-GPU nodes needs --nproc-per-node=4"),
    ("launch_deepspeed.sbatch", "#SBATCH --time=24:00:00", "#SBATCH --time=tomorrow",
     "#SBATCH --time='tomorrow' is not a Slurm time"),
])
def test_check_names_the_offending_line(rendered, tmp_path, name, old, new, message):
    line = _edit(rendered["olmo70b"], tmp_path / "edited", name, old, new)
    out = run("check", str(tmp_path / "edited"))
    assert out.returncode == 2 and out.stderr == ""
    assert any(l.startswith(f"{name}:{line}: ") and message in l for l in out.stdout.splitlines()), out.stdout


def test_check_reports_a_broken_plan_json_and_missing_files(rendered, tmp_path):
    shutil.copytree(rendered["olmo70b"], tmp_path / "a")
    run_ = plan_of(tmp_path / "a")
    run_["plan"].update(pp=3, dp=32)  # keeps the 384 GPUs; 80 layers do not split over pp x vp = 3 x 4
    text = json.dumps(run_, indent=2, sort_keys=True)
    (tmp_path / "a" / "plan.json").write_text(text)
    line = next(i for i, l in enumerate(text.splitlines(), 1) if l.startswith('  "plan": {')) + 1
    line += [l.strip() for l in text.splitlines()[line - 1:]].index('"pp": 3,')
    out = run("check", str(tmp_path / "a"))
    assert out.returncode == 2
    assert f"plan.json:{line}: pipeline_split: num_layers (80) is not divisible by pp x vp (3 x 4 = 12)" in out.stdout
    shutil.copytree(rendered["olmo70b"], tmp_path / "b")
    (tmp_path / "b" / "ds_config.json").unlink()
    out = run("check", str(tmp_path / "b"))
    assert out.returncode == 2 and out.stdout.strip() == "ds_config.json: missing (re-render with genconf render)"
    one_line_error(run("check", str(tmp_path / "nowhere")), "is not a directory")


# --- writing: atomic, no overwrite without --force, one-line errors --------------------------------

def test_existing_dir_needs_force_and_force_keeps_runs(rendered, tmp_path):
    target = tmp_path / "out"
    assert genconf_quiet(*PLANS["ds_z1"], "-o", str(target)) == 0
    before = {p.name: p.read_text() for p in target.iterdir() if p.is_file()}
    (target / "runs" / "logs" / "1.out").write_text("a log worth keeping\n")
    out = run(*PLANS["ds_z2_fp16"], "-o", str(target))
    one_line_error(out, f"{target} exists; use --force to replace it")
    assert {p.name: p.read_text() for p in target.iterdir() if p.is_file()} == before
    out = run(*PLANS["ds_z2_fp16"], "-o", str(target), "--force")
    assert out.returncode == 0, out.stderr
    assert '"fp16"' in (target / "ds_config.json").read_text()
    assert (target / "runs" / "logs" / "1.out").read_text() == "a log worth keeping\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary or old directories left
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    (stranger / "thesis.tex").write_text("x")
    one_line_error(run(*PLANS["ds_z1"], "-o", str(stranger), "--force"), "is not a genconf artifacts directory")
    assert (stranger / "thesis.tex").exists()


def test_a_failed_check_leaves_the_old_directory_in_place(rendered, tmp_path):
    from genconf import artifacts
    from genconf.errors import GenconfError

    target = tmp_path / "out"
    shutil.copytree(rendered["ds_z1"], target)
    (target / "runs" / "logs" / "1.out").write_text("kept\n")
    before = sorted(str(p.relative_to(target)) for p in target.rglob("*"))
    files = {p.name: p.read_text() for p in rendered["ds_z3"].iterdir() if p.is_file()}
    files["ds_config.json"] = files["ds_config.json"].replace('"stage": 3', '"stage": 0')
    with pytest.raises(GenconfError, match="fail their own check: ds_config.json:.*zero_optimization.stage 0"):
        artifacts.write_artifacts(target, files, force=True, run_dir=str(target / "runs"))
    assert sorted(str(p.relative_to(target)) for p in target.rglob("*")) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("extra,needle", [
    (["--time", "soon"], "--time 'soon' is not a Slurm time"),
    (["--account", "my account"], "--account 'my account' is not a Slurm name"),
    (["--partition", "gpu;reboot"], "--partition 'gpu;reboot' is not a Slurm name"),
    (["--run-dir", "relative\nnewline"], "--run-dir must be an absolute path without control characters"),
])
def test_bad_options_write_nothing(tmp_path, extra, needle):
    target = tmp_path / "out"
    one_line_error(run(*PLANS["ds_z1"], "-o", str(target), *extra), needle)
    assert list(tmp_path.iterdir()) == []


def test_unwritable_target_leaves_nothing_behind(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    out = run(*PLANS["ds_z1"], "-o", str(blocker / "out"))
    one_line_error(out, "cannot write")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]
    out = run(*PLANS["ds_z1"], "-o", str(blocker))
    one_line_error(out, "exists and is not a directory")
    deep = tmp_path / "new" / "deeper" / "out"
    assert genconf_quiet(*PLANS["ds_z1"], "-o", str(deep)) == 0 and (deep / "plan.json").is_file()


def test_render_refuses_a_broken_or_malformed_plan(rendered, tmp_path):
    run_ = plan_of(rendered["olmo70b"])
    run_["plan"].update(pp=3, dp=32)  # 4 x 3 x 32 = 384 GPUs, but 80 layers do not split over pp x vp = 12
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(run_))
    one_line_error(run("render", str(bad), "-o", str(tmp_path / "out")), "pipeline_split")
    garbled = tmp_path / "garbled.json"
    garbled.write_text('{\n  "model": {\n  oops\n}\n')
    one_line_error(run("render", str(garbled), "-o", str(tmp_path / "out")), f"{garbled}:3: invalid JSON")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json", "garbled.json"]


def test_plan_output_still_prints_with_o(tmp_path):
    out = run(*PLANS["ds_z1"], "--json", "-o", str(tmp_path / "out"))
    assert out.returncode == 0 and json.loads(out.stdout)["plan"]["framework"] == "deepspeed"
    assert "wrote 7 files" in out.stderr


# --- shell safety ---------------------------------------------------------------------------------

def test_shellcheck_passes_on_generated_scripts(rendered):
    shellcheck = shellcheck_or_skip()
    scripts = sorted(str(p) for d in rendered.values() for p in d.glob("*.sbatch"))
    assert len(scripts) >= 2 * len(rendered)
    out = subprocess.run([shellcheck, "--shell=bash", "--severity=style", *scripts], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:]


INJECTION_JOB_NAME = 'x"; touch pwned; "'
"""The issue's job name. Every injected command would create a file named pwned* in the working directory."""


def injection_dir(tmp_path: Path) -> tuple[Path, Path, str]:
    """Artifacts whose job name, run directory and output directory all try to run commands."""
    run_dir = tmp_path / "run dir $(touch pwned2) `touch pwned3`"
    out = tmp_path / "art $(touch pwned4); x"
    assert genconf_quiet(*PLANS["fsdp1b"], "-o", str(out), "--job-name", INJECTION_JOB_NAME, "--run-dir", str(run_dir),
                         "--partition", "debug") == 0
    return out, run_dir, INJECTION_JOB_NAME


def test_injection_through_names_and_paths_runs_nothing(tmp_path):
    out, run_dir, job = injection_dir(tmp_path)
    scripts = sorted(out.glob("*.sbatch"))
    assert [p.name for p in scripts] == ["launch_deepspeed.sbatch", "launch_fsdp.sbatch", "launch_megatron.sbatch"]
    shellcheck = shellcheck_or_skip()
    lint = subprocess.run([shellcheck, *map(str, scripts)], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout
    # Run each script as Slurm would, with scontrol and srun stubbed: srun records what it was given.
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    record = tmp_path / "srun.args"
    (stubs / "scontrol").write_text("#!/bin/sh\necho n1\n")
    (stubs / "srun").write_text('#!/bin/bash\nprintf "%s\\n" "$GENCONF_JOB_NAME" "$@" > "$SRUN_RECORD"\n')
    for stub in stubs.iterdir():
        stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    env = dict(os.environ, PATH=f"{stubs}:{os.environ['PATH']}", SLURM_JOB_NODELIST="n[1-2]", SLURM_JOB_ID="7",
               SRUN_RECORD=str(record))
    for script in scripts:
        done = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        argv = record.read_text().splitlines()
        assert argv[0] == job  # the name reaches the job verbatim, as data
        assert argv[argv.index("--run-dir") + 1] == str(run_dir)
        assert (run_dir / "logs").is_dir()
    created = [p for p in tmp_path.rglob("pwned*")]
    assert created == [], created
    text = (out / "launch_megatron.sbatch").read_text()
    assert f"#SBATCH --job-name={configs.sbatch_job_name(job)}\n" in text and '"' not in configs.sbatch_job_name(job)
    assert check.check_dir(out).problems == ()


def test_sbatch_lines_parse_the_way_sbatch_parses_them():
    assert check.sbatch_arguments(' --output="/a b/\\"q\\"/%j.out" --x=1 # comment') == ['--output=/a b/"q"/%j.out', "--x=1"]
    from genconf.artifacts import sbatch_quote

    for value in ("/plain", "/with space", '/quo"te', "/back\\slash", "/$(touch x)", "/hash#tag"):
        assert check.sbatch_arguments(f" --chdir={sbatch_quote(value)}") == [f"--chdir={value}"]


def test_rendering_uses_strict_undefined():
    import jinja2

    from genconf.artifacts import environment

    with pytest.raises(jinja2.UndefinedError):
        environment().get_template("launch.sbatch.j2").render()


def test_configs_is_pure():
    out = subprocess.run([sys.executable, "-c", "import sys, genconf.configs; "
                          "print(sorted(m for m in sys.modules if m.split('.')[0] in "
                          "('jinja2', 'yaml', 'torch', 'subprocess', 'deepspeed', 'megatron')))"],
                         capture_output=True, text=True, cwd=REPO)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
