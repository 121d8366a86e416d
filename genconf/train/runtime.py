"""The training process (genconf.train.loop drives it): the run config and the precision check, distributed
start-up, seeding, versions, peak memory, and the one-line exit for bad input."""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import random
import resource
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from genconf.plan import runconfig
from genconf.plan.errors import GenconfError
from genconf.plan.runconfig import RunConfig

RUN_CONFIG = "config.json"
METRICS = "metrics.jsonl"
VERSIONS = "versions.json"
CHECKPOINTS = "checkpoints"


def load_run_config(run_dir: Path, artifacts: Path | None) -> RunConfig:
    """RUN/config.json if `genconf launch` wrote one, else the artifact directory's plan.json as it is."""
    path = run_dir / RUN_CONFIG
    if path.is_file():
        return RunConfig.from_dict(json.loads(path.read_text()))
    if artifacts is None:
        raise GenconfError(f"{path} does not exist and no --artifacts directory was given")
    from genconf.catalog.hardware import resolve_gpu

    cfg = runconfig.from_artifacts(artifacts, {})
    resolve_gpu(cfg.prediction["gpu"])
    return cfg


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
        from genconf.train import cpu_numerics

        # What decides CPU numerics: the kernels ATen dispatched to and the pins in force (genconf.train.cpu_numerics).
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


def fail(message: str) -> None:
    """One line on stderr, exit code 2 (the launchers' bad-input path)."""
    print(f"genconf: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def detect_gpu():
    """The catalog GPUSpec of the local CUDA device (by name, else by compute capability), None on a CPU."""
    if not torch.cuda.is_available():
        return None
    from genconf.catalog.hardware import gpu_for_device_name, list_gpus, resolve_gpu

    name = gpu_for_device_name(torch.cuda.get_device_name())
    if name:
        return resolve_gpu(name)
    major, _ = torch.cuda.get_device_capability()
    arch = {8: "ampere", 9: "hopper", 10: "blackwell", 12: "blackwell"}.get(major)
    return next((g for g in list_gpus() if g.arch == arch), None)


def load_and_check(run_dir: Path, artifacts: Path | None, framework: str) -> RunConfig:
    """The run's config, after refusing (one line, exit 2) a precision recipe this machine cannot run."""
    import importlib.util

    from genconf.plan import precision

    cfg = load_run_config(run_dir, artifacts)
    te = importlib.util.find_spec("transformer_engine") is not None and framework == "megatron"
    torchao = importlib.util.find_spec("torchao") is not None
    why = precision.unsupported_reason(precision.recipe(cfg.precision_recipe), gpu=detect_gpu(), framework=framework,
                                       te_available=te, cuda=torch.cuda.is_available(), torchao_available=torchao)
    if why:
        fail(why)
    return cfg
