"""Train the plan's decoder the OLMo way: PyTorch FSDP (FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD) with
by-block wrapping and mixed precision (fp32 parameters, bf16 compute, fp32 reduction), or DDP with bf16
autocast for NO_SHARD plans (OLMo's `distributed_strategy: ddp`)."""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from torch.nn.parallel import DistributedDataParallel as DDP

from genconf.plan import precision, runconfig
from genconf.plan.runconfig import RunConfig
from genconf.train import collectives, loop, runtime, speed
from genconf.train.data import micro_batch
from genconf.train.torch_model import GPT, Block


def _shard_groups(plan, d: runtime.Dist):
    """HYBRID_SHARD process groups: shard inside groups of `shard_group_size`, replicate across them."""
    size = plan.shard_group_size
    intra = inter = None
    for start in range(0, d.world_size, size):
        ranks = list(range(start, start + size))
        group = dist.new_group(ranks)
        if d.rank in ranks:
            intra = group
    for offset in range(size):
        ranks = list(range(offset, d.world_size, size))
        group = dist.new_group(ranks)
        if d.rank in ranks:
            inter = group
    return intra, inter


def wrap(model: GPT, cfg: RunConfig, d: runtime.Dist):
    plan, recipe = cfg.plan, precision.recipe(cfg.precision_recipe)
    if plan.zero_stage == 0:
        return DDP(model, device_ids=[d.local_rank] if d.device.type == "cuda" else None)
    # OLMo's amp_bf16: bf16 compute, fp32 reduction and buffers; fp32 plans (verification) compute in fp32.
    mp = (None if recipe.compute_dtype == "float32" else
          MixedPrecision(param_dtype=getattr(torch, recipe.compute_dtype), reduce_dtype=torch.float32,
                         buffer_dtype=torch.float32))
    strategy = ShardingStrategy[plan.fsdp_sharding_strategy]
    kwargs = {}
    if strategy == ShardingStrategy.HYBRID_SHARD:
        kwargs["process_group"] = _shard_groups(plan, d)
    return FSDP(model, sharding_strategy=strategy, mixed_precision=mp, auto_wrap_policy=ModuleWrapPolicy({Block}),
                device_id=d.device, use_orig_params=False, **kwargs)


class FSDPRunner(loop.Runner):
    """The plan's GPT under FSDP (or DDP for NO_SHARD) with AdamW; each rank saves its own shard (FSDP local state
    dict), or rank 0 the whole model (DDP), with the optimizer and the torch RNG state."""

    framework = "fsdp"
    label = "FSDP"

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--config", type=Path, help="olmo_fsdp.yaml (informational: the plan is in plan.json)")

    @staticmethod
    def artifacts_of(args: argparse.Namespace) -> Path | None:
        return args.artifacts or (args.config.parent if args.config else None)

    def build(self, d: runtime.Dist, run_dir: Path) -> None:
        cfg, train, plan = self.cfg, self.cfg.train, self.cfg.plan
        recipe = precision.recipe(cfg.precision_recipe)
        model = GPT(cfg.model, recompute=plan.recompute == "full", fused_loss=plan.fused_loss).to(d.device)
        if recipe.plan_precision == "fp8":
            from genconf.train import float8

            # torchao Float8Linear: FP8 GEMMs, same parameters. On a CPU the GEMM is emulated (the casts are
            # real): oneDNN pinned to AVX2 (genconf.train.cpu_numerics) has no FP8 matmul.
            emulate = d.device.type != "cuda"
            converted = float8.convert(model, recipe.name, emulate=emulate)
            if d.is_main:
                print(f"genconf: FP8 through torchao ({recipe.name}{', GEMMs emulated on the CPU' if emulate else ''}): "
                      f"{converted} linear layers", flush=True)
        self.fast = speed.for_plan(speed.SpeedOptions.from_dict(cfg.speed), cfg.plan, d.device)
        if self.fast.compile and not runconfig.compile_supported(plan):
            if d.is_main:  # sharded plans run uncompiled (genconf.plan.runconfig.compile_supported), and say so
                print(f"genconf: --compile skipped: FSDP {plan.fsdp_sharding_strategy} runs uncompiled (DDP plans "
                      "compile)", flush=True)
        elif speed.compile_blocks(model, self.fast) and d.is_main:
            print(f"genconf: torch.compile ({self.fast.compile_backend}) on each of the {cfg.model.num_layers} "
                  "decoder blocks", flush=True)
        self.model = wrap(model, cfg, d)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=train.lr, betas=(train.beta1, train.beta2),
                                           eps=train.eps, weight_decay=train.weight_decay,
                                           **speed.adamw_kwargs(self.fast, d.device))
        self.autocast = (torch.autocast(d.device.type, dtype=getattr(torch, recipe.compute_dtype))
                         if cfg.plan.zero_stage == 0 and recipe.compute_dtype != "float32" else contextlib.nullcontext())

    def describe(self) -> str:
        plan = self.cfg.plan
        kind = "DDP (NO_SHARD)" if plan.zero_stage == 0 else f"FSDP {plan.fsdp_sharding_strategy}"
        return (f"{kind}, dp={plan.dp}, {plan.num_microbatches} micro-batches of {plan.mbs}, "
                f"{precision.recipe(self.cfg.precision_recipe).name}")

    def step(self, step: int, source, d: runtime.Dist) -> tuple[float, float | None]:
        plan, train, net, optimizer = self.cfg.plan, self.cfg.train, self.model, self.optimizer
        accum = plan.num_microbatches
        optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), dtype=torch.float64, device=d.device)  # NCCL reduces device tensors only
        for micro in range(accum):
            tokens, labels = micro_batch(source, step=step, global_batch=plan.gbs, micro_batch_size=plan.mbs,
                                         dp_rank=d.rank, dp_size=d.world_size, micro_index=micro,
                                         seq_length=plan.seq_length)
            sync = micro == accum - 1 or plan.zero_stage != 0
            with self.autocast, speed.attention_context(self.fast), (contextlib.nullcontext() if sync else net.no_sync()):
                loss = net(tokens.to(d.device), labels.to(d.device))
                (loss / accum).backward()
            total += loss.detach().double()
        if isinstance(net, FSDP):
            norm = net.clip_grad_norm_(train.grad_clip or float("inf"))
        else:
            norm = torch.nn.utils.clip_grad_norm_(net.parameters(), train.grad_clip or float("inf"))
        optimizer.step()
        collectives.all_reduce(total, d)
        return (total / (accum * d.world_size)).item(), float(norm)

    def save(self, path: Path, d: runtime.Dist) -> None:
        net, optimizer = self.model, self.optimizer
        path.mkdir(parents=True, exist_ok=True)
        if isinstance(net, FSDP):
            from torch.distributed.fsdp import StateDictType

            with FSDP.state_dict_type(net, StateDictType.LOCAL_STATE_DICT):
                state = {"model": net.state_dict(), "optimizer": optimizer.state_dict(), "rng": torch.get_rng_state()}
            torch.save(state, path / f"rank{d.rank:05d}.pt")
        elif d.is_main:
            torch.save({"model": net.module.state_dict(), "optimizer": optimizer.state_dict(),
                        "rng": torch.get_rng_state()}, path / "rank00000.pt")

    def load(self, path: Path, d: runtime.Dist) -> None:
        net, optimizer = self.model, self.optimizer
        if isinstance(net, FSDP):
            from torch.distributed.fsdp import StateDictType

            state = torch.load(path / f"rank{d.rank:05d}.pt", weights_only=False)
            with FSDP.state_dict_type(net, StateDictType.LOCAL_STATE_DICT):
                net.load_state_dict(state["model"])
        else:
            state = torch.load(path / "rank00000.pt", weights_only=False)
            net.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])


def main(argv: list[str] | None = None) -> int:
    return loop.main(FSDPRunner, argv, description=__doc__)


if __name__ == "__main__":
    loop.exit_process(main())
