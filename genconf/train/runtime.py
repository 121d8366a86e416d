"""What every training entry point shares: the run config, distributed start-up, seeding, the per-step
progress line and metrics.jsonl, versions, peak memory, and checkpoint bookkeeping."""

from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import json
import os
import platform
import random
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from genconf.errors import GenconfError
from genconf.specs import ModelSpec, ParallelPlan, TrainSpec

RUN_CONFIG = "config.json"
METRICS = "metrics.jsonl"
VERSIONS = "versions.json"
CHECKPOINTS = "checkpoints"


@dataclass(frozen=True)
class RunConfig:
    """Everything a run needs, resolved: written to RUN/config.json by `genconf launch`."""

    model: ModelSpec
    plan: ParallelPlan
    train: TrainSpec
    num_gpus: int
    data: dict
    precision_recipe: str
    prediction: dict
    """What the planner predicted for the full-size plan: tokens_per_s_per_gpu, peak_mem_gib, gpu."""
    shrink: dict
    """Smoke-test overrides applied to the artifact's plan (layers, hidden, steps, ...)."""
    artifacts: str
    speed: dict = dataclasses.field(default_factory=dict)
    """Speed switches the runners apply on a GPU (genconf.train.speed.SpeedOptions as a dict; {} = defaults)."""

    def to_dict(self) -> dict:
        return {"model": dataclasses.asdict(self.model), "plan": dataclasses.asdict(self.plan),
                "train": dataclasses.asdict(self.train), "num_gpus": self.num_gpus, "data": self.data,
                "precision_recipe": self.precision_recipe, "prediction": self.prediction, "shrink": self.shrink,
                "artifacts": self.artifacts, "speed": self.speed}

    @classmethod
    def from_dict(cls, d: dict) -> "RunConfig":
        return cls(model=ModelSpec(**d["model"]), plan=ParallelPlan(**d["plan"]), train=TrainSpec(**d["train"]),
                   num_gpus=int(d["num_gpus"]), data=d.get("data") or {"kind": "synthetic"},
                   precision_recipe=d["precision_recipe"], prediction=d.get("prediction") or {},
                   shrink=d.get("shrink") or {}, artifacts=d.get("artifacts", ""), speed=d.get("speed") or {})


def load_run_config(run_dir: Path, artifacts: Path | None) -> RunConfig:
    """RUN/config.json if `genconf launch` wrote one, else the artifact directory's plan.json as it is."""
    path = run_dir / RUN_CONFIG
    if path.is_file():
        return RunConfig.from_dict(json.loads(path.read_text()))
    if artifacts is None:
        raise GenconfError(f"{path} does not exist and no --artifacts directory was given")
    from genconf.launch import run_config_from_artifacts

    return run_config_from_artifacts(artifacts, {})


@dataclass
class Dist:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed() -> Dist:
    """torchrun's environment -> a process group: NCCL on GPUs, gloo on CPUs."""
    cuda = torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    if "RANK" not in os.environ:  # a plain `python launchers/...` run: world of one
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=os.environ.get("MASTER_PORT", "29533"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=datetime.timedelta(minutes=10))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    d = Dist(dist.get_rank(), dist.get_world_size(), local_rank, device, backend)
    from genconf.train import collectives

    # Every collective of this process (genconf's and the frameworks') refuses a tensor on the wrong device
    # with the caller's file and line, before NCCL's "No backend type associated with device type cpu".
    collectives.install_for(d)
    return d


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if not torch.cuda.is_available():
        # Bit-identical CPU reruns: deterministic kernels and a fixed intra-op thread count.
        torch.use_deterministic_algorithms(True)
        torch.set_num_threads(max(1, int(os.environ.get("GENCONF_THREADS", "1"))))


def versions() -> dict:
    out = {"python": platform.python_version(), "platform": platform.platform()}
    for dist_name in ("torch", "deepspeed", "megatron-core", "genconf", "transformer-engine", "numpy"):
        try:
            out[dist_name] = importlib.metadata.version(dist_name)
        except importlib.metadata.PackageNotFoundError:
            out[dist_name] = None
    out["cuda"] = torch.version.cuda if torch.cuda.is_available() else None
    out["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    if not torch.cuda.is_available():
        from genconf import cpu_numerics

        # What decides CPU numerics: the kernels ATen dispatched to and the pins in force (genconf.cpu_numerics).
        out["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        out["cpu_pins"] = cpu_numerics.effective_pins(os.environ)
        out["cpu_model"] = _cpu_model()
    return out


def _cpu_model() -> str:
    """The processor's name from /proc/cpuinfo (Linux), else platform.processor()."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def peak_memory_gib(device: torch.device) -> tuple[float, str]:
    """(peak, what was measured): CUDA max allocated on GPUs, the process's peak RSS on CPUs."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30, "cuda_max_allocated"
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss_kib / 2**20, "cpu_max_rss"


class Metrics:
    """metrics.jsonl (one JSON object per step) and a progress line, written by rank 0 only."""

    def __init__(self, run_dir: Path, d: Dist, tokens_per_step: int, total_steps: int) -> None:
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
        mem, kind = peak_memory_gib(self.d.device)
        row = {"step": step, "loss": loss, "grad_norm": grad_norm, "step_time_s": step_time,
               "tokens_per_s": self.tokens_per_step / step_time,
               "tokens_per_s_per_gpu": self.tokens_per_step / step_time / self.d.world_size,
               "peak_mem_gib": mem, "peak_mem_kind": kind, **extra}
        if self.d.is_main:
            with open(self.run_dir / METRICS, "a") as f:
                f.write(json.dumps(row, sort_keys=True) + "\n")
            gn = f"{grad_norm:.3f}" if grad_norm is not None else "-"
            print(f"step {step:>5}/{self.total_steps} | loss {loss:.4f} | grad norm {gn} | "
                  f"{row['tokens_per_s']:,.0f} tok/s | {step_time:.3f} s | mem {mem:.2f} GiB", flush=True)
        return row


def prepare_run_dir(run_dir: Path, cfg: RunConfig, d: Dist, *, resume: bool) -> int:
    """Write config/versions/seed (rank 0) and return the step to start from (after the last checkpoint
    when resuming, else 0, truncating metrics.jsonl)."""
    start = 0
    if resume:
        last = last_checkpoint(run_dir)
        if last is None:
            raise GenconfError(f"--resume: no checkpoint under {run_dir / CHECKPOINTS}")
        start = last
    if d.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / RUN_CONFIG).write_text(json.dumps(cfg.to_dict(), indent=1, sort_keys=True))
        (run_dir / VERSIONS).write_text(json.dumps(versions(), indent=1, sort_keys=True))
        (run_dir / "seed").write_text(f"{cfg.train.seed}\n")
        metrics = run_dir / METRICS
        if metrics.exists():
            kept = [line for line in metrics.read_text().splitlines()
                    if line.strip() and json.loads(line)["step"] < start] if resume else []
            metrics.write_text("".join(line + "\n" for line in kept))
    if dist.is_initialized():
        dist.barrier()
    return start


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / CHECKPOINTS / f"step_{step:07d}"


def last_checkpoint(run_dir: Path) -> int | None:
    """The step after the newest complete checkpoint (one with a 'done' marker)."""
    root = run_dir / CHECKPOINTS
    steps = sorted(int(p.name.split("_")[1]) for p in root.glob("step_*") if (p / "done").exists()) if root.is_dir() else []
    return steps[-1] if steps else None


def mark_checkpoint_done(path: Path, d: Dist) -> None:
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
    import math

    if train.warmup_steps and step < train.warmup_steps:
        return train.lr * (step + 1) / train.warmup_steps
    if train.lr_decay == "constant":
        return train.lr
    span = max(1, train.train_steps - train.warmup_steps)
    progress = min(1.0, (step - train.warmup_steps) / span)
    if train.lr_decay == "linear":
        return train.lr - (train.lr - train.min_lr) * progress
    return train.min_lr + 0.5 * (train.lr - train.min_lr) * (1 + math.cos(math.pi * progress))


def fail(message: str) -> None:
    """One line on stderr, exit code 2 (the launchers' bad-input path)."""
    print(f"genconf: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def detect_gpu():
    """The catalog GPUSpec of the local CUDA device (by name, else by compute capability), None on a CPU."""
    if not torch.cuda.is_available():
        return None
    from genconf.catalog import gpu_for_device_name, list_gpus, resolve_gpu

    name = gpu_for_device_name(torch.cuda.get_device_name())
    if name:
        return resolve_gpu(name)
    major, _ = torch.cuda.get_device_capability()
    arch = {8: "ampere", 9: "hopper", 10: "blackwell", 12: "blackwell"}.get(major)
    return next((g for g in list_gpus() if g.arch == arch), None)


def maybe_inject_failure(step: int, d: Dist) -> None:
    """Test hook: GENCONF_FAIL_STEP=N (and GENCONF_FAIL_RANK=r, default 0) makes rank r raise after step N,
    to exercise how launchers and Slurm report a dying job."""
    fail_step = os.environ.get("GENCONF_FAIL_STEP")
    if fail_step is not None and step == int(fail_step) and d.rank == int(os.environ.get("GENCONF_FAIL_RANK", "0")):
        raise RuntimeError(f"injected failure on rank {d.rank} after step {step} (GENCONF_FAIL_STEP)")


def load_and_check(run_dir: Path, artifacts: Path | None, framework: str) -> RunConfig:
    """The run's config, after refusing (one line, exit 2) a precision recipe this machine cannot run."""
    import importlib.util

    from genconf import precision

    cfg = load_run_config(run_dir, artifacts)
    te = importlib.util.find_spec("transformer_engine") is not None and framework == "megatron"
    torchao = importlib.util.find_spec("torchao") is not None
    why = precision.unsupported_reason(precision.recipe(cfg.precision_recipe), gpu=detect_gpu(), framework=framework,
                                       te_available=te, cuda=torch.cuda.is_available(), torchao_available=torchao)
    if why:
        fail(why)
    return cfg


def set_lr(optimizer, step: int, train: TrainSpec) -> float:
    """Apply the schedule's learning rate for `step` to every parameter group; returns it."""
    lr = lr_at(step, train)
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr
