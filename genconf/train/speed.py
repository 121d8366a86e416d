"""The launched run's speed switches: what the FSDP and DeepSpeed runners do on a GPU to get near the 50% MFU
the issue asks of a 1B GPT on one H100 (measured 36% FSDP, 41% DeepSpeed before them).

- attention: scaled_dot_product_attention's backend. `auto` lets torch pick (FlashAttention-2 or cuDNN for
  BF16 causal attention on Hopper); `flash`, `cudnn`, `efficient`, `math` force one (an error where it cannot
  serve the shape, rather than a silent slow path).
- fused_optimizer: torch.optim.AdamW(fused=True) (one multi-tensor kernel for the whole update) on a GPU; DeepSpeed
  uses its own FusedAdam, or this where FusedAdam cannot be built (genconf.train.ds_ops).
- compile: torch.compile each decoder block (torchtitan's per-block compile: fuses norms, residual adds,
  rotary embeddings and activations into few kernels; the blocks are identical, so one compilation serves all).
  FSDP then keeps the original parameters (use_orig_params=True), which torch.compile needs.

Fused cross-entropy is not offered: torch has no fused linear + cross-entropy, and the logits of a 1B model at
micro-batch 4 x 2048 (0.8 GiB in BF16) cost less than a dependency for it.

Measured on an H200 (benchmarks/results/gpu_runs/README.md): fused AdamW and --compile took OLMo 1B to 51.8% (DeepSpeed)
and 52.8% MFU (DDP). A pinned backend that cannot take the model's head dim is refused before the launch
(genconf.plan.kernels.sdpa_backend_takes). On a CPU the defaults leave the run exactly as before (the golden curves
depend on it) and the tests check the plumbing.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, replace

from genconf.plan.rules import PLAN_SDPA_BACKEND

ATTENTION = ("auto", "flash", "cudnn", "efficient", "math")


@dataclass(frozen=True, kw_only=True, slots=True)
class SpeedOptions:
    attention: str = "auto"
    """scaled_dot_product_attention backend: auto | flash | cudnn | efficient | math."""
    fused_optimizer: bool = True
    """torch.optim.AdamW(fused=True) on a GPU (ignored on a CPU, where the update stays bit-identical)."""
    compile: bool = False
    """torch.compile each decoder block."""
    compile_backend: str = "inductor"
    """torch.compile backend ('eager' traces without generating kernels: the tests' plumbing check)."""

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION:
            raise ValueError(f"SpeedOptions: attention must be one of {', '.join(ATTENTION)}, got {self.attention!r}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None) -> "SpeedOptions":
        d = dict(d or {})
        unknown = sorted(set(d) - {"attention", "fused_optimizer", "compile", "compile_backend"})
        if unknown:
            raise ValueError(f"SpeedOptions: unknown key {unknown[0]!r}")
        return cls(**d)


PLAN_ATTENTION = PLAN_SDPA_BACKEND
"""The SDPA backend that runs a plan's attention kernel (ParallelPlan.attention_kernel)."""


def for_plan(options: SpeedOptions, plan, device) -> SpeedOptions:
    """The run's options with the plan's flash-attention kernel where the run left the backend to torch (auto): on a
    GPU the planned kernel is what the step time was priced with. A CPU has neither kernel: nothing changes there."""
    backend = PLAN_ATTENTION.get(plan.attention_kernel)
    if backend is None or options.attention != "auto" or device.type != "cuda":
        return options
    return replace(options, attention=backend)


def attention_context(options: SpeedOptions):
    """A context manager that pins scaled_dot_product_attention to the chosen backend (nothing for auto)."""
    if options.attention == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
               "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[options.attention]
    return sdpa_kernel(backend)


def adamw_kwargs(options: SpeedOptions, device) -> dict:
    """Extra torch.optim.AdamW arguments: fused=True on a GPU when asked; nothing on a CPU (same numerics)."""
    return {"fused": True} if options.fused_optimizer and device.type == "cuda" else {}


def compile_blocks(model, options: SpeedOptions) -> int:
    """Compile each decoder block in place (nn.Module.compile keeps the module and its parameters, so the
    wrapping, counting and checkpoints that follow see the same model); returns how many."""
    if not options.compile:
        return 0
    blocks = list(model.decoder.layers)
    for block in blocks:
        block.compile(backend=options.compile_backend)
    return len(blocks)
