"""Train the plan's decoder with DeepSpeed (`deepspeed.initialize` with the plan's ds_config): ZeRO 0-3."""

from __future__ import annotations

import argparse
import json
import os
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from genconf import precision
from genconf.train import collectives, measure, runtime, speed
from genconf.train.data import micro_batch, source_from
from genconf.train.torch_model import GPT


def runtime_ds_config(cfg: runtime.RunConfig) -> dict:
    """The artifact's ds_config for this (possibly shrunk) plan. On a GPU, DeepSpeed's FusedAdam built for the
    detected GPU, or torch's fused AdamW with one line saying why (genconf.train.ds_ops). On a CPU the optimizer
    is passed in as a torch.optim.AdamW with the same hyper-parameters (DeepSpeed's CPU Adam needs compiled ops)."""
    from genconf.configs import deepspeed_config

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--artifacts", type=Path, help="directory written by `genconf -o`")
    ap.add_argument("--run-dir", type=Path, required=True)
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    import deepspeed

    cfg = runtime.load_and_check(args.run_dir, args.artifacts, "deepspeed")
    plan, train, model_spec = cfg.plan, cfg.train, cfg.model
    recipe = precision.recipe(cfg.precision_recipe)
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    d = runtime.init_distributed()
    if d.world_size != plan.dp:
        runtime.fail(f"this DeepSpeed plan has dp={plan.dp} but {d.world_size} processes were started")
    runtime.seed_everything(train.seed)
    model = GPT(model_spec, recompute=plan.recompute == "full")
    fast = speed.SpeedOptions.from_dict(cfg.speed)
    if fast.compile and plan.zero_stage == 3:
        if d.is_main:  # ZeRO-3 swaps parameters in and out around each module: it runs uncompiled
            print("genconf: --compile skipped: ZeRO-3 runs uncompiled (ZeRO 0-2 compile)", flush=True)
    elif speed.compile_blocks(model, fast) and d.is_main:
        print(f"genconf: torch.compile ({fast.compile_backend}) on each of the {model_spec.num_layers} decoder blocks",
              flush=True)
    ds_config = runtime_ds_config(cfg)
    if d.is_main:
        args.run_dir.mkdir(parents=True, exist_ok=True)
        (args.run_dir / "ds_config.json").write_text(json.dumps(ds_config, indent=1, sort_keys=True))
    client_opt = None
    if "optimizer" not in ds_config:
        client_opt = torch.optim.AdamW(model.parameters(), lr=train.lr, betas=(train.beta1, train.beta2),
                                       eps=train.eps, weight_decay=train.weight_decay)
    engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=client_opt, config=ds_config,
                                                   model_parameters=model.parameters())
    start = runtime.prepare_run_dir(args.run_dir, cfg, d, resume=args.resume)
    if args.resume:
        _, client = engine.load_checkpoint(str(args.run_dir / runtime.CHECKPOINTS), tag=f"step_{start:07d}")
        torch.set_rng_state(client["rng"])
    source = source_from(cfg.data, model_spec.vocab_size, train.seed)
    accum = plan.num_microbatches
    metrics = runtime.Metrics(args.run_dir, d, plan.gbs * plan.seq_length, train.train_steps)
    if d.is_main:
        print(f"genconf: DeepSpeed ZeRO-{plan.zero_stage} {type(optimizer).__name__}, dp={plan.dp}, "
              f"{accum} micro-batches of {plan.mbs}, {recipe.name}", flush=True)
    for step in range(start, train.train_steps):
        lr = runtime.set_lr(optimizer, step, train)
        metrics.start_step()
        total = torch.zeros((), dtype=torch.float64, device=d.device)  # NCCL reduces device tensors only
        for micro in range(accum):
            tokens, labels = micro_batch(source, step=step, global_batch=plan.gbs, micro_batch_size=plan.mbs,
                                         dp_rank=d.rank, dp_size=d.world_size, micro_index=micro,
                                         seq_length=plan.seq_length)
            with speed.attention_context(fast):
                loss = engine(tokens.to(d.device), labels.to(d.device))
                engine.backward(loss)
            engine.step()
            total += loss.detach().double()
        collectives.all_reduce(total, d)
        loss_value = (total / (accum * d.world_size)).item()
        norm = engine.get_global_grad_norm()
        extra = measure.first_step_memory(engine, optimizer, cfg, d) if step == start else {}
        metrics.end_step(step, loss_value, float(norm) if norm is not None else None, lr=lr, **extra)
        runtime.maybe_inject_failure(step, d)
        if runtime.should_checkpoint(step, train):
            tag = f"step_{step + 1:07d}"
            engine.save_checkpoint(str(args.run_dir / runtime.CHECKPOINTS), tag=tag,
                                   client_state={"rng": torch.get_rng_state()})
            runtime.mark_checkpoint_done(runtime.checkpoint_dir(args.run_dir, step + 1), d)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
