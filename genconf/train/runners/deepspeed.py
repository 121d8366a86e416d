"""Train the plan's decoder with DeepSpeed (`deepspeed.initialize` with the plan's ds_config): ZeRO 0-3."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import torch

from genconf.plan import precision, runconfig
from genconf.plan.runconfig import RunConfig
from genconf.train import collectives, loop, runtime, speed
from genconf.train.data import micro_batch
from genconf.train.torch_model import GPT


def runtime_ds_config(cfg: RunConfig) -> dict:
    """The artifact's ds_config for this (possibly shrunk) plan. On a GPU, DeepSpeed's FusedAdam built for the
    detected GPU, or torch's fused AdamW with one line saying why (genconf.train.ds_ops). On a CPU the optimizer
    is passed in as a torch.optim.AdamW with the same hyper-parameters (DeepSpeed's CPU Adam needs compiled ops)."""
    from genconf.render.deepspeed import deepspeed_config

    config = deepspeed_config(cfg.model, cfg.plan, cfg.train)
    if torch.cuda.is_available():
        from genconf.train import ds_ops

        if speed.SpeedOptions.from_dict(cfg.speed).fused_optimizer:
            quiet = os.environ.get("RANK", "0") != "0"  # one notice per run, from rank 0
            config = ds_ops.cuda_optimizer_config(config, log=lambda line: None if quiet else print(line, flush=True))
        else:  # --no-fused-optimizer: torch's AdamW, unfused
            config = ds_ops.with_torch_adam(config)
            config["optimizer"]["params"]["fused"] = False
    else:
        config.pop("optimizer", None)
        config["zero_allow_untested_optimizer"] = True
        config.pop("flops_profiler", None)
    return config


RECOVERY_SCRIPTS = ("zero_to_fp32.py", "zero_to_torch.py")


class DeepSpeedRunner(loop.Runner):
    """The plan's GPT in a DeepSpeed engine; checkpoints are DeepSpeed's, tagged step_NNNNNNN, with the torch
    RNG state as client state."""

    framework = "deepspeed"
    label = "DeepSpeed"

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        import deepspeed

        deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
        yield

    def build(self, d: runtime.Dist, run_dir: Path) -> None:
        import deepspeed

        cfg, train = self.cfg, self.cfg.train
        model = GPT(cfg.model, recompute=cfg.plan.recompute == "full",
                    fused_loss=cfg.plan.fused_loss)
        self.fast = speed.for_plan(speed.SpeedOptions.from_dict(cfg.speed), cfg.plan, d.device)
        if self.fast.compile and not runconfig.compile_supported(cfg.plan):
            if d.is_main:  # ZeRO-3 runs uncompiled (genconf.plan.runconfig.compile_supported)
                print("genconf: --compile skipped: ZeRO-3 runs uncompiled (ZeRO 0-2 compile)", flush=True)
        elif speed.compile_blocks(model, self.fast) and d.is_main:
            print(f"genconf: torch.compile ({self.fast.compile_backend}) on each of the {cfg.model.num_layers} "
                  "decoder blocks", flush=True)
        ds_config = runtime_ds_config(cfg)
        if d.is_main:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "ds_config.json").write_text(json.dumps(ds_config, indent=1, sort_keys=True))
        client_opt = None
        if "optimizer" not in ds_config:
            client_opt = torch.optim.AdamW(model.parameters(), lr=train.lr, betas=(train.beta1, train.beta2),
                                           eps=train.eps, weight_decay=train.weight_decay)
        self.model, self.optimizer, _, _ = deepspeed.initialize(model=model, optimizer=client_opt, config=ds_config,
                                                                model_parameters=model.parameters())

    def describe(self) -> str:
        plan = self.cfg.plan
        return (f"DeepSpeed ZeRO-{plan.zero_stage} {type(self.optimizer).__name__}, dp={plan.dp}, "
                f"{plan.num_microbatches} micro-batches of {plan.mbs}, {precision.recipe(self.cfg.precision_recipe).name}")

    def step(self, step: int, source, d: runtime.Dist) -> tuple[float, float | None]:
        plan, engine = self.cfg.plan, self.model
        accum = plan.num_microbatches
        total = torch.zeros((), dtype=torch.float64, device=d.device)  # NCCL reduces device tensors only
        for micro in range(accum):
            tokens, labels = micro_batch(source, step=step, global_batch=plan.gbs, micro_batch_size=plan.mbs,
                                         dp_rank=d.rank, dp_size=d.world_size, micro_index=micro,
                                         seq_length=plan.seq_length)
            with speed.attention_context(self.fast):
                loss = engine(tokens.to(d.device), labels.to(d.device))
                engine.backward(loss)
            engine.step()
            total += loss.detach().double()
        collectives.all_reduce(total, d)
        norm = engine.get_global_grad_norm()
        return (total / (accum * d.world_size)).item(), float(norm) if norm is not None else None

    def save(self, path: Path, d: runtime.Dist) -> None:
        # The tag is the store's staging directory; no `latest` file: the checkpoint store knows the newest.
        self.model.save_checkpoint(str(path.parent), tag=path.name, client_state={"rng": torch.get_rng_state()},
                                   save_latest=False)
        # Under ZeRO rank 0 copies zero_to_fp32.py / zero_to_torch.py beside the tags (engine._copy_recovery_script):
        # into the checkpoint with them, so it is self-contained, covered by the manifest and pruned with it.
        for script in RECOVERY_SCRIPTS:
            if d.is_main and (path.parent / script).is_file():
                os.replace(path.parent / script, path / script)

    def load(self, path: Path, d: runtime.Dist) -> None:
        _, client = self.model.load_checkpoint(str(path.parent), tag=path.name)
        torch.set_rng_state(client["rng"])


def main(argv: list[str] | None = None) -> int:
    return loop.main(DeepSpeedRunner, argv, description=__doc__)


if __name__ == "__main__":
    loop.exit_process(main())
