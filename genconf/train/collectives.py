"""Collectives on the run's device, and a guard that says where one is not.

NCCL takes only CUDA tensors: a CPU tensor in an all-reduce fails with "No backend type associated with
device type cpu", far from the line that built it (the issue's first GPU runs died that way in the FSDP and
DeepSpeed runners' loss reduction and in measure.first_step_memory). So:

- the runners reduce through `sum_over_ranks` / `max_over_ranks` / `all_reduce`, which build or require
  their buffers on the run's device (`Dist.device`: cuda:N under NCCL, cpu under gloo);
- `DeviceGuard` wraps torch.distributed's collectives for the whole process (genconf's calls and the
  frameworks' own) and refuses, before NCCL sees it, any tensor on an NCCL group that is not on the run's
  GPU, naming the caller's file and line.

A CPU run has only gloo groups, which take CPU tensors, so there the guard has nothing to refuse and cannot
catch a stray `.cpu()`; the tests therefore run the reduction helpers with a run device that is not the CPU
(meta) under a guard in placement-only mode, and a structural test keeps every collective in genconf.train
going through this module.
"""

from __future__ import annotations

import functools
import traceback
from collections.abc import Iterable

import torch
import torch.distributed as dist

GUARDED = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
           "broadcast", "reduce", "all_to_all", "all_to_all_single", "gather", "scatter", "send", "recv", "isend",
           "irecv")
"""torch.distributed functions that take tensors (looked up as module attributes by torch's FSDP, megatron-core
and DeepSpeed's torch backend, so wrapping the attribute reaches their calls too)."""

BACKEND_DEVICE = {"nccl": "cuda", "gloo": "cpu", "mpi": "cpu"}


def _tensors(value) -> Iterable[torch.Tensor]:
    if torch.is_tensor(value):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


def _caller() -> str:
    """file:line of the first frame outside this module and torch.distributed."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if not frame.filename.endswith(("collectives.py",)) and "torch/distributed/" not in frame.filename:
            return f"{frame.filename}:{frame.lineno}"
    return "?"


def _group_backend(args, kwargs) -> str:
    """The backend of the process group a collective call uses (its `group` argument, else the default)."""
    group = kwargs.get("group")
    if group is None:
        group = next((a for a in args if isinstance(a, dist.ProcessGroup)), None)
    try:
        return str(dist.get_backend(group)).lower()
    except (RuntimeError, ValueError):  # no default group yet: the call itself will say so
        return ""


class DeviceGuard:
    """Wraps torch.distributed's collectives: every tensor argument must be on `device` (type, and index for
    CUDA). `only_for_backend`: check only calls on groups of that backend (a run's guard checks NCCL groups:
    megatron-core and DeepSpeed also keep gloo groups for host tensors on purpose). `placement_only`: check and
    return None without calling the backend (for devices no backend serves, such as meta in the tests)."""

    def __init__(self, device: torch.device, *, placement_only: bool = False, only_for_backend: str | None = None) -> None:
        self.device = torch.device(device)
        self.placement_only = placement_only
        self.only_for_backend = only_for_backend
        self.checked = 0
        """How many tensors passed the check (tests read it)."""
        self._saved: dict[str, object] = {}

    def check(self, name: str, tensors: Iterable[torch.Tensor]) -> None:
        for t in tensors:
            ok = t.device.type == self.device.type and (self.device.index is None or t.device.index == self.device.index)
            if not ok:
                raise RuntimeError(f"genconf: {name} got a tensor on {t.device} but this run's collectives run on "
                                   f"{self.device} (the backend would refuse it); called from {_caller()}")
            self.checked += 1

    def _wrap(self, name: str, fn):
        @functools.wraps(fn)
        def guarded(*args, **kwargs):
            if self.only_for_backend is None or _group_backend(args, kwargs) == self.only_for_backend:
                self.check(name, _tensors(list(args) + list(kwargs.values())))
            return None if self.placement_only else fn(*args, **kwargs)
        guarded.__genconf_guard__ = True
        return guarded

    def install(self) -> "DeviceGuard":
        for name in GUARDED:
            fn = getattr(dist, name, None)
            if fn is None or getattr(fn, "__genconf_guard__", False):
                continue
            self._saved[name] = fn
            setattr(dist, name, self._wrap(name, fn))
        return self

    def uninstall(self) -> None:
        for name, fn in self._saved.items():
            setattr(dist, name, fn)
        self._saved.clear()

    def __enter__(self) -> "DeviceGuard":
        return self.install()

    def __exit__(self, *exc) -> None:
        self.uninstall()


def collective_device(backend: str, device: torch.device) -> torch.device:
    """The device a backend's collectives need: the run's CUDA device under NCCL, the CPU under gloo."""
    kind = BACKEND_DEVICE.get(str(backend).lower())
    if kind is None:
        return device
    if kind == "cuda" and device.type != "cuda":
        raise ValueError(f"backend {backend} needs a CUDA device, the run has {device}")
    return device if kind == device.type else torch.device(kind)


def all_reduce(tensor: torch.Tensor, d, op=None) -> torch.Tensor:
    """In-place all-reduce of a tensor that must already be on the run's device."""
    if tensor.device.type != d.device.type:
        raise RuntimeError(f"genconf: all_reduce of a tensor on {tensor.device}; this run's device is {d.device} "
                           f"(called from {_caller()})")
    if dist.is_initialized():
        dist.all_reduce(tensor, op=op if op is not None else dist.ReduceOp.SUM)
    return tensor


def _over_ranks(values: list[float], d, op) -> list[float]:
    buffer = torch.tensor([float(v) for v in values], dtype=torch.float64, device=d.device)
    if dist.is_initialized():
        dist.all_reduce(buffer, op=op)
    return buffer.tolist() if buffer.device.type != "meta" else [float("nan")] * len(values)


def sum_over_ranks(values: list[float], d) -> list[float]:
    """Element-wise sum over every rank, through a float64 buffer on the run's device."""
    return _over_ranks(values, d, dist.ReduceOp.SUM)


def max_over_ranks(values: list[float], d) -> list[float]:
    """Element-wise maximum over every rank (float64 holds byte counts exactly up to 2**53)."""
    return _over_ranks(values, d, dist.ReduceOp.MAX)


def install_for(d) -> DeviceGuard:
    """The process-wide guard for a run (genconf.train.runtime.init_distributed installs it): on NCCL groups
    every tensor must be on the run's GPU, which is all NCCL accepts; gloo groups take what gloo takes."""
    return DeviceGuard(collective_device(d.backend, d.device), only_for_backend="nccl").install()
