"""CPU compatibility layer for megatron-core (checked against 0.16.1) on hosts without a GPU.

megatron-core hard-codes CUDA in a handful of places even with
``use_cpu_initialization=True``:

* the RNG tracker (``megatron.core.tensor_parallel.random``) forks/restores the
  *CUDA* generator (``torch.cuda.get_rng_state`` / ``torch.cuda.manual_seed`` /
  ``torch.cuda.default_generators``);
* ``torch.cuda.current_device()`` is used as a ``device=`` argument
  (tensor-parallel gathers, p2p shape exchange, grad buffers, optimizers ...);
* literal ``device="cuda"`` / ``.cuda()`` (pipeline schedules' token counter,
  optimizer scalars, grad-norm clipping, ...);
* ``torch.cuda.synchronize()`` after p2p / barriers.

This module is only meant to be used when ``torch.cuda.is_available()`` is
False.  It is self-contained and reversible::

    from genconf.train import mcore_compat

    with mcore_compat.cpu_megatron():            # or: h = mcore_compat.install(); ...; h.uninstall()
        torch.distributed.init_process_group("gloo")
        parallel_state.initialize_model_parallel(tp, pp, ...)
        mcore_compat.model_parallel_manual_seed(seed)   # == tensor_parallel.model_parallel_cuda_manual_seed
        cfg = TransformerConfig(..., **mcore_compat.recommended_config_kwargs(bf16=True))
        ...

What ``install()`` does (everything is undone by ``uninstall()``):

1. RNG: ``CudaRNGStatesTracker.add/fork`` and the module helpers
   ``_get_cuda_rng_state/_set_cuda_rng_state`` of ``tensor_parallel.random``
   operate on the default *CPU* generator; ``torch.cuda.manual_seed``,
   ``torch.cuda.get_rng_state`` and ``torch.cuda.set_rng_state`` are aliased to
   the CPU generator (``torch.cuda.manual_seed_all`` is left alone because
   ``torch.manual_seed`` calls it).  So ``model_parallel_cuda_manual_seed``,
   ``get_cuda_rng_tracker().fork()`` and activation checkpointing
   (``CheckpointFunction`` restores the tracker states) work unchanged.
2. ``torch.cuda.current_device()`` returns 0, ``torch.cuda.synchronize`` /
   ``torch.cuda.empty_cache`` become no-ops.
3. A ``torch.overrides.TorchFunctionMode`` (entered globally on the installing
   thread; autograd propagates it to backward) rewrites every ``device=``
   argument that names CUDA (``"cuda"``, ``"cuda:N"``, ``torch.device("cuda")``,
   a bare int index such as ``torch.cuda.current_device()``) to CPU, turns
   ``torch.device("cuda", i)`` into ``torch.device("cpu")``, ``Tensor.cuda()`` into
   a no-op move to CPU and ``Tensor.to("cuda"/int)`` into ``Tensor.to("cpu")``;
   ``Tensor.type()`` (no argument) reports CPU tensors as ``torch.cuda.<X>Tensor``
   because mcore's optimizers dispatch on / assert those strings, and
   ``Tensor.type("torch.cuda.<X>Tensor")`` casts to the CPU type.
4. ``torch.nn.Module.cuda`` becomes a no-op (returns the module).
5. ``torch.cuda.Stream`` / ``Event`` / ``current_stream`` / ``stream`` are host stand-ins whose waits and
   records do nothing (the host runs every op in order): megatron-core's MoE token dispatcher copies its
   token counts to the host on a side stream.
6. ``moe_utils.te_general_gemm`` is defined (None: the torch path) where megatron-core 0.16.1 leaves it
   undefined without Transformer Engine.
7. The MoE token dispatcher's host copies (``maybe_move_tensor_to_cpu``) give numpy split sizes for CPU
   tensors too, as all_to_all_single needs them.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
from torch.overrides import TorchFunctionMode

__all__ = [
    "CpuDeviceMode",
    "CompatHandle",
    "install",
    "uninstall",
    "cpu_megatron",
    "is_installed",
    "needs_compat",
    "recommended_config_kwargs",
    "model_parallel_manual_seed",
    "DEFAULT_BACKEND",
]

DEFAULT_BACKEND = "gloo"
_CPU = torch.device("cpu")


def needs_compat() -> bool:
    """True when no CUDA device is usable (the only case this layer is meant for)."""
    return not torch.cuda.is_available()


# --------------------------------------------------------------------------------------
# device rewriting
# --------------------------------------------------------------------------------------
def _is_cuda_device_spec(d: Any) -> bool:
    if isinstance(d, torch.device):
        return d.type == "cuda"
    if isinstance(d, str):
        return d == "cuda" or d.startswith("cuda:")
    # bare ints (as returned by torch.cuda.current_device()); bool is an int too -> exclude
    if isinstance(d, int) and not isinstance(d, bool):
        return True
    return False


def _fix_device(d: Any) -> Any:
    return _CPU if _is_cuda_device_spec(d) else d


class CpuDeviceMode(TorchFunctionMode):
    """Redirects CUDA device requests to the CPU."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs) if kwargs else {}
        name = getattr(func, "__name__", "")
        if func is torch.device:
            # torch.device("cuda"), torch.device("cuda", 0), torch.device(0)
            if args and _is_cuda_device_spec(args[0]):
                return _CPU
            if args and isinstance(args[0], str) and args[0] == "cuda":
                return _CPU
            return func(*args, **kwargs)
        if "device" in kwargs:
            kwargs["device"] = _fix_device(kwargs["device"])
        if name == "cuda" and args and isinstance(args[0], torch.Tensor):
            # Tensor.cuda(device=None, non_blocking=False, memory_format=...)
            t = args[0]
            nb = kwargs.get("non_blocking", False)
            return t.to(_CPU, non_blocking=nb)
        if name == "to" and len(args) >= 2 and isinstance(args[0], torch.Tensor):
            if _is_cuda_device_spec(args[1]):
                args = (args[0], _CPU) + tuple(args[2:])
        if name in ("pin_memory",) and args and isinstance(args[0], torch.Tensor):
            return args[0]
        if name == "type" and args and isinstance(args[0], torch.Tensor):
            if len(args) == 1 and not kwargs:
                # mcore dispatches on / asserts 'torch.cuda.FloatTensor', 'torch.cuda.BFloat16Tensor'
                # (optimizer.py, distrib_optimizer.py, clip_grads.py): report CPU tensors as such.
                t = func(*args)
                if args[0].device.type == "cpu" and t.startswith("torch.") and ".cuda." not in t:
                    return "torch.cuda." + t[len("torch."):]
                return t
            target = args[1] if len(args) > 1 else kwargs.get("dtype")
            if isinstance(target, str) and "torch.cuda." in target:
                target = target.replace("torch.cuda.", "torch.")
                if len(args) > 1:
                    args = (args[0], target) + tuple(args[2:])
                else:
                    kwargs["dtype"] = target
        return func(*args, **kwargs)


# --------------------------------------------------------------------------------------
# RNG on the CPU generator
# --------------------------------------------------------------------------------------
def _cpu_get_rng_state(device: Any = "cuda", clone: bool = False, graph_safe: bool = False):
    return torch.get_rng_state()


def _cpu_set_rng_state(new_state: torch.Tensor, device: Any = -1, graph_safe: bool = False):
    torch.set_rng_state(new_state)


def _cuda_manual_seed_to_cpu(seed: int) -> None:
    # NOT torch.manual_seed: that calls torch.cuda.manual_seed_all (fine) but we want no recursion
    # risk if someone also aliases manual_seed_all.
    torch.default_generator.manual_seed(int(seed))


def _tracker_add(self, name, seed):
    """CudaRNGStatesTracker.add on the CPU generator."""
    self._is_initialized = True
    if seed in self.seeds_:
        raise Exception("seed {} already exists".format(seed))
    self.seeds_.add(seed)
    if name in self.states_:
        raise Exception("cuda rng state {} already exists".format(name))
    orig = torch.get_rng_state()
    torch.default_generator.manual_seed(int(seed))
    self.states_[name] = torch.get_rng_state()
    torch.set_rng_state(orig)


def _make_tracker_fork(default_name: str):
    @contextlib.contextmanager
    def _tracker_fork(self, name=default_name):
        """CudaRNGStatesTracker.fork on the CPU generator (same bookkeeping as upstream,
        minus the 'CPU RNG state changed within GPU RNG context' check, which on a CPU host
        is always true by construction)."""
        if name not in self.states_:
            raise Exception("cuda rng state {} is not added".format(name))
        orig_state = torch.get_rng_state()
        orig_state_name = self._current_state_name
        if orig_state_name != "default-rng":
            self.states_[orig_state_name] = orig_state
        torch.set_rng_state(self.states_[name])
        self._current_state_name = name
        try:
            yield
        finally:
            if self._current_state_name != name:
                raise Exception(
                    f"current state name {self._current_state_name} is not the same as the "
                    f"desired state name {name}."
                )
            self.states_[name] = torch.get_rng_state()
            if orig_state_name != "default-rng":
                orig_state = self.states_[orig_state_name]
            torch.set_rng_state(orig_state)
            self._current_state_name = orig_state_name

    return _tracker_fork


def model_parallel_manual_seed(seed: int, **kw) -> None:
    """Seed like megatron training's ``_set_random_seed`` + ``model_parallel_cuda_manual_seed``.

    On a CPU host the 'device' generator *is* the CPU generator, so the data-parallel seed
    ends up in the default CPU generator and the tracker holds the tensor-/expert-parallel
    states.  Weights built with ``use_cpu_initialization=True`` are drawn from the default CPU
    generator (master weight, then split), so every TP size gives the same full weights.
    """
    from megatron.core import tensor_parallel

    torch.manual_seed(seed)
    tensor_parallel.model_parallel_cuda_manual_seed(seed, **kw)
    # model_parallel_cuda_manual_seed -> torch.cuda.manual_seed (aliased) already set CPU = seed.


# --------------------------------------------------------------------------------------
# streams and events: the host runs every op in order, so a side stream is the main one
# --------------------------------------------------------------------------------------
class _CpuEvent:
    """A CUDA event on a host where every op has finished when the next starts."""

    def record(self, stream: Any = None) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def wait(self, stream: Any = None) -> None:
        return None

    def query(self) -> bool:
        return True


class _CpuStream:
    """A CUDA stream on the host: work is ordered already, so waits and records are no-ops (megatron-core's MoE
    dispatcher copies its token counts on a side stream: token_dispatcher.py cuda_dtoh_stream)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_stream(self, stream: Any) -> None:
        return None

    def wait_event(self, event: Any) -> None:
        return None

    def record_event(self, event: Any = None) -> _CpuEvent:
        return event if event is not None else _CpuEvent()

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True


_MAIN_STREAM = _CpuStream()


def _host_copy(tensor: Any, as_numpy: bool = False, record_stream: bool = False) -> Any:
    """megatron-core's moe_utils.maybe_move_tensor_to_cpu on a host: tensors are there already, numpy when asked."""
    if torch.is_tensor(tensor) and as_numpy:
        return tensor.numpy()
    return tensor


# --------------------------------------------------------------------------------------
# install / uninstall
# --------------------------------------------------------------------------------------
class CompatHandle:
    def __init__(self) -> None:
        self._restore: List[Tuple[Any, str, Any]] = []
        self._mode: Optional[CpuDeviceMode] = None
        self._thread = threading.get_ident()
        self.active = False

    def _patch(self, obj: Any, attr: str, value: Any) -> None:
        self._restore.append((obj, attr, getattr(obj, attr, _MISSING)))
        setattr(obj, attr, value)

    def uninstall(self) -> None:
        global _ACTIVE
        if not self.active:
            return
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None
        for obj, attr, old in reversed(self._restore):
            if old is _MISSING:
                delattr(obj, attr)
            else:
                setattr(obj, attr, old)
        self._restore.clear()
        self.active = False
        if _ACTIVE is self:
            _ACTIVE = None


_ACTIVE: Optional[CompatHandle] = None
_MISSING = object()


def is_installed() -> bool:
    return _ACTIVE is not None and _ACTIVE.active


def install(force: bool = False, device_mode: bool = True) -> CompatHandle:
    """Install the CPU shims (idempotent).  Refuses when CUDA is available unless ``force``."""
    global _ACTIVE
    if is_installed():
        return _ACTIVE  # type: ignore[return-value]
    if torch.cuda.is_available() and not force:
        raise RuntimeError("mcore_compat is for hosts without a GPU; CUDA is available")

    from megatron.core.tensor_parallel import random as mrandom

    h = CompatHandle()
    # 1. RNG
    h._patch(mrandom, "_get_cuda_rng_state", _cpu_get_rng_state)
    h._patch(mrandom, "_set_cuda_rng_state", _cpu_set_rng_state)
    h._patch(mrandom.CudaRNGStatesTracker, "add", _tracker_add)
    h._patch(
        mrandom.CudaRNGStatesTracker,
        "fork",
        _make_tracker_fork(mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME),
    )
    h._patch(torch.cuda, "manual_seed", _cuda_manual_seed_to_cpu)
    h._patch(torch.cuda, "get_rng_state", lambda device="cuda": torch.get_rng_state())
    h._patch(torch.cuda, "set_rng_state", lambda new_state, device="cuda": torch.set_rng_state(new_state))
    # 2. device queries / sync
    h._patch(torch.cuda, "current_device", lambda: 0)
    h._patch(torch.cuda, "synchronize", lambda device=None: None)
    h._patch(torch.cuda, "empty_cache", lambda: None)
    # 4. Module.cuda
    h._patch(torch.nn.Module, "cuda", lambda self, device=None: self)
    # 5. Streams and events (megatron-core's MoE token dispatcher): ordered already on the host.
    h._patch(torch.cuda, "Stream", _CpuStream)
    h._patch(torch.cuda, "Event", _CpuEvent)
    h._patch(torch.cuda, "current_stream", lambda device=None: _MAIN_STREAM)
    h._patch(torch.cuda, "stream", lambda stream=None: contextlib.nullcontext())
    # 6. The MoE router GEMM reads moe_utils.te_general_gemm, which megatron-core 0.16.1 defines only when Transformer
    #    Engine imports (moe_utils.py:34, read at :1192): without TE it is None, the torch matmul path.
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        h._patch(moe_utils, "te_general_gemm", None)
    # 7. The MoE dispatcher's split sizes reach all_to_all_single as the numpy arrays maybe_move_tensor_to_cpu makes of
    #    CUDA tensors; a CPU tensor it leaves a tensor, which all_to_all_single refuses: the same arrays here.
    from megatron.core.transformer.moe import token_dispatcher

    h._patch(token_dispatcher, "maybe_move_tensor_to_cpu", _host_copy)
    # The dispatcher keeps its side stream on the class, made once: restored (None) with the rest on uninstall.
    h._patch(token_dispatcher.MoEAlltoAllTokenDispatcher, "cuda_dtoh_stream", None)
    # 3. device mode
    if device_mode:
        h._mode = CpuDeviceMode()
        h._mode.__enter__()
    h.active = True
    _ACTIVE = h
    return h


def uninstall() -> None:
    if _ACTIVE is not None:
        _ACTIVE.uninstall()


@contextlib.contextmanager
def cpu_megatron(force: bool = False, device_mode: bool = True) -> Iterator[CompatHandle]:
    already = is_installed()
    h = install(force=force, device_mode=device_mode)
    try:
        yield h
    finally:
        if not already:
            h.uninstall()


# --------------------------------------------------------------------------------------
# config
# --------------------------------------------------------------------------------------
def recommended_config_kwargs(bf16: bool = False, pipeline: bool = False) -> Dict[str, Any]:
    """TransformerConfig / ModelParallelConfig kwargs that keep mcore off CUDA-only kernels.

    ``pipeline=True`` additionally turns off batched p2p (``batch_isend_irecv``): with
    virtual pipeline stages + batch_p2p_comm=True PP=2 trains silently wrong
    (Megatron-LM issues #750, #1450), and gloo's batched p2p is not worth it anyway.
    """
    kw: Dict[str, Any] = dict(
        use_cpu_initialization=True,
        perform_initialization=True,
        # CUDA-only fusions / kernels
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        bias_dropout_fusion=False,
        gradient_accumulation_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        memory_efficient_layer_norm=False,
        cross_entropy_loss_fusion=False,
        # WrappedTorchNorm (no apex/TE) asserts these
        sequence_parallel=False,
        layernorm_zero_centered_gamma=False,
        # p2p: no cuda synchronize after batch_isend_irecv
        batch_p2p_sync=False,
        # CUDA graphs / TE never on CPU
        # (cuda_graph_impl defaults to 'none')
    )
    if pipeline:
        kw.update(batch_p2p_comm=False, overlap_p2p_comm=False)
    if bf16:
        kw.update(bf16=True, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16)
    else:
        kw.update(bf16=False, params_dtype=torch.float32, pipeline_dtype=torch.float32)
    return kw
