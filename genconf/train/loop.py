"""The one training loop (as torchtitan's Trainer and OLMo-core's Trainer drive their TrainSpec / TrainModule): the
loop owns the step cadence, the learning-rate schedule, metrics.jsonl and the progress line, the first step's
memory measurement, checkpoint cadence and bookkeeping, resume and failure injection; a Runner
(genconf.train.runners) builds the framework's model and optimizer and runs, saves and loads it."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist

from genconf.plan.errors import GenconfError
from genconf.plan.runconfig import RunConfig
from genconf.plan.specs import TrainSpec
from genconf.train import measure, runtime
from genconf.train.data import source_from


class Runner:
    """What one framework plugs into the loop. `build` sets `model` (what the first-step memory measurement
    reads) and `optimizer` (whose parameter groups get the schedule's learning rate); `step` runs one optimizer
    step over the plan's micro-batches; `save`/`load` write and read the framework's own checkpoint format in a
    step's checkpoint directory. The other hooks default to nothing."""

    framework = ""
    """megatron | deepspeed | fsdp: the precision checks and the launcher's name."""
    label = ""
    """How messages name the framework (DeepSpeed, FSDP)."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.model = None
        self.optimizer = None

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        """The entry point's flags beyond --artifacts, --run-dir and --resume."""

    @staticmethod
    def artifacts_of(args: argparse.Namespace) -> Path | None:
        """The artifacts directory the run's plan comes from (when the run directory has no config.json)."""
        return args.artifacts

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """Around everything, from before the process group exists to after it is gone."""
        yield

    def world_error(self, d: runtime.Dist) -> str | None:
        """Why the started processes do not fit the plan, or None: one process per data-parallel rank here (DeepSpeed
        and FSDP plans are data-parallel only); megatron's runner counts every parallel dimension."""
        plan = self.cfg.plan
        if d.world_size != plan.dp:
            return f"this {self.label} plan has dp={plan.dp} but {d.world_size} processes were started"
        return None

    def setup(self, d: runtime.Dist) -> None:
        """After the process group exists and before the seed is set (model-parallel groups)."""

    def build(self, d: runtime.Dist, run_dir: Path) -> None:
        raise NotImplementedError

    def describe(self) -> str:
        """The start-up line: framework, layout, micro-batches, precision."""
        raise NotImplementedError

    def step(self, step: int, source, d: runtime.Dist) -> tuple[float, float | None]:
        """One optimizer step: (the step's mean loss over every micro-batch and rank, the gradient norm)."""
        raise NotImplementedError

    def step_metrics(self) -> dict:
        """What metrics.jsonl records for every step beyond the loop's columns."""
        return {}

    def save(self, path: Path, d: runtime.Dist) -> None:
        raise NotImplementedError

    def load(self, path: Path, d: runtime.Dist) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """After the last step, before the process group is destroyed."""


def train(runner: Runner, run_dir: Path, *, resume: bool) -> int:
    """Run `runner`'s plan from step 0, or from the last checkpoint in `run_dir` when resuming."""
    cfg = runner.cfg
    plan, spec = cfg.plan, cfg.train
    with runner.session():
        d = runtime.init_distributed()
        error = runner.world_error(d)
        if error:
            runtime.fail(error)
        runner.setup(d)
        runtime.seed_everything(spec.seed)
        runner.build(d, run_dir)
        start = prepare_run_dir(run_dir, cfg, d, resume=resume)
        if resume:
            runner.load(checkpoint_dir(run_dir, start), d)
        source = source_from(cfg.data, cfg.model.vocab_size, spec.seed)
        metrics = Metrics(run_dir, d, plan.gbs * plan.seq_length, spec.train_steps)
        if d.is_main:
            print(f"genconf: {runner.describe()}", flush=True)
        for step in range(start, spec.train_steps):
            lr = set_lr(runner.optimizer, step, spec)
            metrics.start_step()
            loss, grad_norm = runner.step(step, source, d)
            extra = runner.step_metrics()
            if step == start:
                extra.update(measure.first_step_memory(runner.model, runner.optimizer, cfg, d))
            metrics.end_step(step, loss, grad_norm, lr=lr, **extra)
            maybe_inject_failure(step, d)
            if should_checkpoint(step, spec):
                path = checkpoint_dir(run_dir, step + 1)
                runner.save(path, d)
                mark_checkpoint_done(path, d)
        dist.barrier()
        runner.close()
        dist.destroy_process_group()
    return 0


def main(runner_class: type[Runner], argv: list[str] | None = None, *, description: str = "") -> int:
    """A training entry point: `train_<framework>.py --artifacts DIR --run-dir RUN [--resume]`."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--artifacts", type=Path, help="directory written by `genconf -o`")
    ap.add_argument("--run-dir", type=Path, required=True)
    ap.add_argument("--resume", action="store_true")
    runner_class.add_arguments(ap)
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    cfg = runtime.load_and_check(args.run_dir, runner_class.artifacts_of(args), runner_class.framework)
    return train(runner_class(cfg), args.run_dir, resume=args.resume)


# --- metrics, schedule, checkpoints ---------------------------------------------------------------

class Metrics:
    """metrics.jsonl (one JSON object per step) and a progress line, written by rank 0 only."""

    def __init__(self, run_dir: Path, d: runtime.Dist, tokens_per_step: int, total_steps: int) -> None:
        self.run_dir, self.d, self.tokens_per_step, self.total_steps = run_dir, d, tokens_per_step, total_steps
        self._t0 = time.perf_counter()

    def start_step(self) -> None:
        if self.d.device.type == "cuda":
            torch.cuda.synchronize()
        self._t0 = time.perf_counter()

    def end_step(self, step: int, loss: float, grad_norm: float | None, **extra) -> dict:
        if self.d.device.type == "cuda":
            torch.cuda.synchronize()
        step_time = time.perf_counter() - self._t0
        mem, kind = runtime.peak_memory_gib(self.d.device)
        row = {"step": step, "loss": loss, "grad_norm": grad_norm, "step_time_s": step_time,
               "tokens_per_s": self.tokens_per_step / step_time,
               "tokens_per_s_per_gpu": self.tokens_per_step / step_time / self.d.world_size,
               "peak_mem_gib": mem, "peak_mem_kind": kind, **extra}
        if self.d.is_main:
            with open(self.run_dir / runtime.METRICS, "a") as f:
                f.write(json.dumps(row, sort_keys=True) + "\n")
            gn = f"{grad_norm:.3f}" if grad_norm is not None else "-"
            print(f"step {step:>5}/{self.total_steps} | loss {loss:.4f} | grad norm {gn} | "
                  f"{row['tokens_per_s']:,.0f} tok/s | {step_time:.3f} s | mem {mem:.2f} GiB", flush=True)
        return row


def prepare_run_dir(run_dir: Path, cfg: RunConfig, d: runtime.Dist, *, resume: bool) -> int:
    """Write config/versions/seed (rank 0) and return the step to start from (after the last checkpoint
    when resuming, else 0, truncating metrics.jsonl)."""
    start = 0
    if resume:
        last = last_checkpoint(run_dir)
        if last is None:
            raise GenconfError(f"--resume: no checkpoint under {run_dir / runtime.CHECKPOINTS}")
        start = last
    if d.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / runtime.RUN_CONFIG).write_text(json.dumps(cfg.to_dict(), indent=1, sort_keys=True))
        (run_dir / runtime.VERSIONS).write_text(json.dumps(runtime.versions(), indent=1, sort_keys=True))
        (run_dir / "seed").write_text(f"{cfg.train.seed}\n")
        metrics = run_dir / runtime.METRICS
        if metrics.exists():
            kept = [line for line in metrics.read_text().splitlines()
                    if line.strip() and json.loads(line)["step"] < start] if resume else []
            metrics.write_text("".join(line + "\n" for line in kept))
    if dist.is_initialized():
        dist.barrier()
    return start


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / runtime.CHECKPOINTS / f"step_{step:07d}"


def last_checkpoint(run_dir: Path) -> int | None:
    """The step after the newest complete checkpoint (one with a 'done' marker)."""
    root = run_dir / runtime.CHECKPOINTS
    steps = sorted(int(p.name.split("_")[1]) for p in root.glob("step_*") if (p / "done").exists()) if root.is_dir() else []
    return steps[-1] if steps else None


def mark_checkpoint_done(path: Path, d: runtime.Dist) -> None:
    if dist.is_initialized():
        dist.barrier()
    if d.is_main:
        (path / "done").write_text("ok\n")


def should_checkpoint(step: int, train: TrainSpec) -> bool:
    """After step `step` (0-based) completes: every N steps and at the end."""
    done = step + 1
    return done == train.train_steps or (train.checkpoint_every_steps > 0 and done % train.checkpoint_every_steps == 0)


def lr_at(step: int, train: TrainSpec) -> float:
    """Linear warm-up then cosine/linear decay to min_lr, or constant (what the artifacts configure)."""
    if train.warmup_steps and step < train.warmup_steps:
        return train.lr * (step + 1) / train.warmup_steps
    if train.lr_decay == "constant":
        return train.lr
    span = max(1, train.train_steps - train.warmup_steps)
    progress = min(1.0, (step - train.warmup_steps) / span)
    if train.lr_decay == "linear":
        return train.lr - (train.lr - train.min_lr) * progress
    return train.min_lr + 0.5 * (train.lr - train.min_lr) * (1 + math.cos(math.pi * progress))


def set_lr(optimizer, step: int, train: TrainSpec) -> float:
    """Apply the schedule's learning rate for `step` to every parameter group; returns it."""
    lr = lr_at(step, train)
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr


def maybe_inject_failure(step: int, d: runtime.Dist) -> None:
    """Test hook: GENCONF_FAIL_STEP=N (and GENCONF_FAIL_RANK=r, default 0) makes rank r raise after step N,
    to exercise how launchers and Slurm report a dying job."""
    fail_step = os.environ.get("GENCONF_FAIL_STEP")
    if fail_step is not None and step == int(fail_step) and d.rank == int(os.environ.get("GENCONF_FAIL_RANK", "0")):
        raise RuntimeError(f"injected failure on rank {d.rank} after step {step} (GENCONF_FAIL_STEP)")
