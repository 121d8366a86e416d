"""The CUDA code paths, checked on a CPU against what CUDA, NCCL and DeepSpeed's op builder would refuse.

- Collectives: the guard refuses a tensor on the wrong device before the backend sees it, naming the caller;
  the reduction helpers place their buffers on the run's device (tested with a run device that is not the
  CPU, meta, in placement-only mode); every collective in genconf.train goes through genconf.train.collectives.
- DeepSpeed: its real op builder (CUDAOpBuilder.compute_capability_args, deepspeed 0.19.8) fails on torch's
  '9.0a' exactly as the issue saw, and passes with the list genconf gives it.
- FP8 without Transformer Engine: torchao's float8 layers, refused with one line where they cannot run.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from conftest import REPO, has_module, needs_deepspeed, needs_torch

pytestmark = needs_torch


class FakeDist:
    def __init__(self, device: str, backend: str = "nccl") -> None:
        import torch

        self.device, self.backend, self.rank, self.world_size = torch.device(device), backend, 0, 1


def test_guard_refuses_a_cpu_tensor_where_the_backend_needs_another_device():
    import torch
    import torch.distributed as dist

    from genconf.train.collectives import DeviceGuard

    with DeviceGuard(torch.device("meta"), placement_only=True) as guard:
        dist.all_reduce(torch.zeros(2, device="meta"))
        dist.all_gather_into_tensor(torch.zeros(4, device="meta"), torch.zeros(2, device="meta"))
        with pytest.raises(RuntimeError, match=r"all_reduce got a tensor on cpu but this run's collectives run on meta "
                                               r"\(the backend would refuse it\); called from .*test_gpu_paths.py:\d+"):
            dist.all_reduce(torch.zeros(2).cpu())
        with pytest.raises(RuntimeError, match="reduce_scatter_tensor got a tensor on cpu"):
            dist.reduce_scatter_tensor(torch.zeros(2, device="meta"), torch.zeros(4))
    assert guard.checked == 4
    assert not getattr(dist.all_reduce, "__genconf_guard__", False)  # uninstalled


def test_reduction_helpers_put_their_buffers_on_the_run_device():
    """The runners' reductions, run with a device that is not the CPU: every tensor reaching a collective is
    on that device (the old code built `total` and `both` on the CPU and failed under NCCL)."""
    import torch
    import torch.distributed as dist

    from genconf.train import collectives
    from genconf.train.collectives import DeviceGuard

    d = FakeDist("meta")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29561")
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        with DeviceGuard(d.device, placement_only=True) as guard:
            collectives.sum_over_ranks([1.0, 2.0], d)
            collectives.max_over_ranks([3.0, 4.0], d)
            collectives.all_reduce(torch.zeros((), dtype=torch.float64, device=d.device), d)
            with pytest.raises(RuntimeError, match="all_reduce of a tensor on cpu; this run's device is meta"):
                collectives.all_reduce(torch.zeros(()), d)
        assert guard.checked == 3
    finally:
        dist.destroy_process_group()


def test_collective_device_per_backend():
    import torch

    from genconf.train.collectives import collective_device

    assert collective_device("nccl", torch.device("cuda", 3)) == torch.device("cuda", 3)
    assert collective_device("gloo", torch.device("cpu")) == torch.device("cpu")
    with pytest.raises(ValueError, match="nccl needs a CUDA device"):
        collective_device("nccl", torch.device("cpu"))


COLLECTIVE_CALLS = {"all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
                    "broadcast", "reduce", "all_to_all_single"}


def test_every_collective_in_the_training_code_goes_through_the_helpers():
    """A structural check: no `dist.<collective>(...)` in genconf/train outside collectives.py and the
    benchmark (which times the raw collectives on purpose, on the run's device)."""
    offenders = []
    for path in sorted((REPO / "genconf" / "train").rglob("*.py")):
        if path.name in ("collectives.py", "bench.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in COLLECTIVE_CALLS
                    and isinstance(node.func.value, ast.Name) and node.func.value.id in ("dist", "torch")):
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno} {node.func.attr}")
    assert offenders == [], offenders


# --- DeepSpeed's op builder -------------------------------------------------------------------------

@pytest.mark.parametrize("env,caps,expected", [
    (None, [(9, 0)], "9.0"),
    ("", [(9, 0), (9, 0)], "9.0"),
    ("9.0a", [(9, 0)], "9.0"),
    ("8.0;9.0a;10.0f+PTX", [(9, 0)], "8.0;9.0;10.0+PTX"),
    ("8.0 8.6 9.0", [(9, 0)], "8.0 8.6 9.0"),  # DeepSpeed parses this: kept as given
    ("Hopper", [(9, 0)], "9.0"),
])
def test_arch_list_for_deepspeed(env, caps, expected):
    from genconf.train.ds_ops import deepspeed_arch_list

    value, note = deepspeed_arch_list(env, caps)
    assert value == expected
    assert (note is None) == (env in (None, "", "8.0 8.6 9.0"))


@needs_deepspeed
def test_deepspeeds_builder_fails_on_9_0a_and_passes_with_genconfs_list(monkeypatch):
    from deepspeed.ops.op_builder.fused_adam import FusedAdamBuilder  # the CUDA builder, whatever the accelerator

    from genconf.train.ds_ops import prepare_arch_list

    builder = FusedAdamBuilder()
    builder.jit_mode = True
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0a")
    with pytest.raises(ValueError, match=r"invalid literal for int\(\) with base 10: '0a'"):
        builder.compute_capability_args()
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0a")
    note = prepare_arch_list(os.environ, capabilities=[(9, 0)])
    assert "'9.0a' -> '9.0'" in note
    assert builder.compute_capability_args() == []  # JIT mode: torch generates -gencode from the list
    assert os.environ["TORCH_CUDA_ARCH_LIST"] == "9.0+PTX"


@needs_deepspeed
def test_a_failed_fused_adam_build_falls_back_to_torch_adamw_with_one_line(monkeypatch):
    """DeepSpeed's CUDA FusedAdam builder with torch's '9.0a' in the list fails as in the issue (before any
    compiler runs); the run goes on with torch's fused AdamW and one line saying why."""
    from deepspeed.ops.op_builder.fused_adam import FusedAdamBuilder

    from genconf.train import ds_ops

    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0a")
    ok, why = ds_ops.fused_adam_available(FusedAdamBuilder)
    assert not ok and why == "ValueError: invalid literal for int() with base 10: '0a'"
    lines = []
    config = {"optimizer": {"type": "AdamW", "params": {"lr": 3e-4}}, "train_batch_size": 8}
    # The arch list is repaired first; here the build still fails (no CUDA toolkit for a real build on this CPU
    # machine, or whatever breaks), and the fallback takes over.
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0a")
    monkeypatch.setattr(ds_ops, "fused_adam_available", lambda builder_class=None: (False, why))
    out = ds_ops.cuda_optimizer_config(config, log=lines.append, capabilities=[(9, 0)])
    assert out["optimizer"]["params"] == {"lr": 3e-4, "torch_adam": True, "fused": True}
    assert config["optimizer"]["params"] == {"lr": 3e-4}  # not modified in place
    assert os.environ["TORCH_CUDA_ARCH_LIST"] == "9.0"
    assert lines[0] == ("genconf: TORCH_CUDA_ARCH_LIST '9.0a' -> '9.0' for DeepSpeed's op builder (it cannot parse "
                        "architecture suffixes such as '9.0a')")
    assert len(lines) == 2 and "FusedAdam could not be built (ValueError" in lines[1]
    assert "torch.optim.AdamW(fused=True)" in lines[1]


@needs_deepspeed
def test_deepspeed_builds_torch_adamw_from_the_fallback_config():
    """DeepSpeed's own engine turns `torch_adam` into torch.optim.AdamW (checked here with DeepSpeed's
    get_optimizer_configuration, the function _configure_basic_optimizer calls)."""
    import torch
    from deepspeed.runtime.engine import DeepSpeedEngine

    from genconf.train.ds_ops import with_torch_adam

    params = dict(with_torch_adam({"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})["optimizer"]["params"])
    engine = DeepSpeedEngine.__new__(DeepSpeedEngine)
    cls, extra = DeepSpeedEngine.get_optimizer_configuration(engine, params, True)
    assert cls is torch.optim.AdamW and extra == {"foreach": None}
    opt = cls([torch.nn.Parameter(torch.zeros(4))], **params, **extra)
    assert opt.defaults["fused"] is True and opt.defaults["lr"] == 1e-3


# --- FP8 through torchao -----------------------------------------------------------------------------

def test_torchao_refusals_are_one_line():
    from genconf.catalog.hardware import resolve_gpu
    from genconf.plan import precision

    current, blockwise = precision.recipe("fp8-current"), precision.recipe("fp8-blockwise")
    h100, a100 = resolve_gpu("h100-sxm"), resolve_gpu("a100-80gb")
    kw = dict(framework="fsdp", te_available=False)
    assert precision.unsupported_reason(current, gpu=h100, cuda=True, torchao_available=True, **kw) is None
    assert precision.unsupported_reason(current, gpu=None, cuda=False, torchao_available=True, **kw) is None  # CPU kernel
    assert "has none" in precision.unsupported_reason(current, gpu=a100, cuda=True, torchao_available=True, **kw)
    assert "pip install 'genconf[fp8]'" in precision.unsupported_reason(current, gpu=h100, cuda=True, **kw)
    assert "needs Transformer Engine" in precision.unsupported_reason(blockwise, gpu=h100, cuda=True,
                                                                      torchao_available=True, **kw)


@pytest.mark.skipif(not has_module("torchao"), reason="torchao not installed (pip install -e '.[fp8]')")
def test_torchao_converts_the_decoder_linears_and_trains_on_cpu():
    import torch

    from genconf.catalog.models import resolve_model
    from genconf.train import float8
    from genconf.train.torch_model import GPT

    spec, _ = resolve_model(str(REPO / "tests" / "data" / "tiny-llama.yaml"))
    torch.manual_seed(0)
    model = GPT(spec)
    before = sum(p.numel() for p in model.parameters())
    assert float8.convert(model) == 4 * spec.num_layers  # qkv, proj, fc1, fc2 per layer; not the output layer
    assert type(model.output_layer).__name__ == "Linear"
    assert sum(p.numel() for p in model.parameters()) == before  # same parameters, FP8 only in the GEMMs
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    tokens = torch.randint(0, spec.vocab_size, (2, 64))
    losses = []
    for _ in range(4):
        loss = model(tokens, tokens.roll(-1, 1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


# --- speed switches (part 7): plumbing only, the speed itself is a GPU measurement ---------------------

def test_speed_options_validate_and_round_trip():
    from genconf.train.speed import SpeedOptions

    assert SpeedOptions.from_dict({}) == SpeedOptions()
    opts = SpeedOptions.from_dict({"attention": "flash", "compile": True})
    assert SpeedOptions.from_dict(opts.to_dict()) == opts
    with pytest.raises(ValueError, match="attention must be one of"):
        SpeedOptions(attention="fast")
    with pytest.raises(ValueError, match="unknown key 'fuse'"):
        SpeedOptions.from_dict({"fuse": True})


def test_fused_adamw_only_on_a_gpu():
    import torch

    from genconf.train.speed import SpeedOptions, adamw_kwargs

    assert adamw_kwargs(SpeedOptions(), torch.device("cpu")) == {}  # CPU updates stay bit-identical
    assert adamw_kwargs(SpeedOptions(), torch.device("cuda", 0)) == {"fused": True}
    assert adamw_kwargs(SpeedOptions(fused_optimizer=False), torch.device("cuda", 0)) == {}


def test_attention_switch_pins_the_sdpa_backend():
    import torch
    import torch.nn.functional as F

    from genconf.train.speed import SpeedOptions, attention_context

    q = torch.randn(1, 2, 8, 16)
    with attention_context(SpeedOptions(attention="math")):
        ref = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    with attention_context(SpeedOptions(attention="auto")):
        assert torch.allclose(F.scaled_dot_product_attention(q, q, q, is_causal=True), ref, atol=1e-6)
    # The CPU build has no memory-efficient kernel: pinning it is an error, not a silent fallback.
    with attention_context(SpeedOptions(attention="efficient")), pytest.raises(RuntimeError):
        F.scaled_dot_product_attention(q, q, q, is_causal=True)


def test_compile_switch_compiles_each_block_in_place():
    import torch

    from genconf.catalog.models import resolve_model
    from genconf.train.speed import SpeedOptions, compile_blocks
    from genconf.train.torch_model import GPT

    spec, _ = resolve_model(str(REPO / "tests" / "data" / "tiny-llama.yaml"))
    torch.manual_seed(0)
    model = GPT(spec)
    tokens = torch.randint(0, spec.vocab_size, (1, 16))
    eager = model(tokens, tokens).item()
    params = [id(p) for p in model.parameters()]
    assert compile_blocks(model, SpeedOptions()) == 0
    assert compile_blocks(model, SpeedOptions(compile=True, compile_backend="eager")) == spec.num_layers
    assert all(block._compiled_call_impl is not None for block in model.decoder.layers)
    assert [id(p) for p in model.parameters()] == params  # same module, same parameters: counting is unchanged
    assert model(tokens, tokens).item() == pytest.approx(eager, abs=1e-6)


def test_a_pinned_sdpa_backend_that_cannot_take_the_head_dim_is_refused_before_the_launch():
    """On an H200 (kernels.sdpa_backend_takes): flash took head dims up to 256 (150 padded), memory-efficient 448 but
    not under grouped-query attention, cuDNN multiples of 8 up to 256. A run pinned to a backend that cannot serve
    the model stops at its first step ("No available kernel"); genconf refuses it in one line instead (on a GPU:
    refuse_unrunnable asks attention_backend_refusal there). Megatron's layers do not run SDPA."""
    import dataclasses

    from genconf.catalog.models import resolve_model
    from genconf.plan.kernels import sdpa_backend_takes
    from genconf.plan.runconfig import RunConfig
    from genconf.plan.specs import ParallelPlan, TrainSpec
    from genconf.run.launch import attention_backend_refusal

    assert [sdpa_backend_takes("flash", d) for d in (108, 150, 256, 450)] == [True, True, True, False]
    assert [sdpa_backend_takes("efficient", d, gqa) for d, gqa in ((448, False), (448, True), (450, False))] == \
        [True, False, False]
    assert [sdpa_backend_takes("cudnn", d) for d in (128, 150, 256, 448)] == [True, False, True, False]
    assert all(sdpa_backend_takes(b, 450, True) for b in ("math", "auto"))
    base = resolve_model("gpt3-125m")[0]
    odd = dataclasses.replace(base, hidden_size=150 * 12, kv_channels=150, ffn_hidden_size=4 * 1800)

    def cfg(model, backend: str, framework: str = "fsdp") -> RunConfig:
        plan = ParallelPlan(framework=framework, dp=1, mbs=1, gbs=1, seq_length=1024, zero_stage=0)
        return RunConfig(model=model, plan=plan, train=TrainSpec(train_steps=10), num_gpus=1, data={},
                         precision_recipe="bf16", prediction={}, shrink={}, artifacts="",
                         speed={"attention": backend} if backend != "auto" else {})

    assert attention_backend_refusal(cfg(base, "cudnn")) is None  # head dim 64
    assert attention_backend_refusal(cfg(odd, "flash")) is None
    assert attention_backend_refusal(cfg(odd, "auto")) is None
    why = attention_backend_refusal(cfg(odd, "cudnn"))
    assert why.startswith("--attention cudnn:") and "(150)" in why and "\n" not in why, why
    assert attention_backend_refusal(cfg(odd, "efficient")).startswith("--attention efficient:")
    assert attention_backend_refusal(cfg(odd, "cudnn", "megatron")) is None
    # genconf's DeepSpeed runner builds its own model (SDPA) even for a plan describing Megatron-DeepSpeed's kernels.
    fused = cfg(odd, "cudnn", "deepspeed")
    fused = dataclasses.replace(fused, plan=dataclasses.replace(fused.plan, layer_spec="local", fused_kernels=True))
    assert attention_backend_refusal(fused).startswith("--attention cudnn:")
