"""Precision recipes as named objects: what each means for Transformer Engine, Megatron and DeepSpeed, and
where it can run. Pure: the launcher turns `te_recipe_kwargs` into a transformer_engine recipe object.

FP8 recipes follow NVIDIA's Transformer Engine recipes (seed 002_3767cc509e078c7e.txt, "New FP8 Recipes for
Blackwell and Hopper"): delayed scaling (hybrid E4M3 forward / E5M2 backward, amax history), per-tensor
current scaling (optionally first and last layers in BF16), DeepSeek-V3-like blockwise scaling (1x128
activations/gradients, 128x128 weights), and MXFP8 (blocks of 32, Blackwell only).
"""

from __future__ import annotations

from dataclasses import dataclass

from genconf.specs import GPUSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class PrecisionRecipe:
    name: str
    """bf16 | fp16 | fp8-delayed | fp8-current | fp8-blockwise | mxfp8."""
    plan_precision: str
    """The planner's precision: bf16 | fp16 | fp8."""
    te_recipe: str | None
    """transformer_engine.common.recipe class name, None for BF16/FP16."""
    te_recipe_kwargs: tuple[tuple[str, object], ...] = ()
    """Keyword arguments for that class (Format names as strings)."""
    megatron_fp8_recipe: str | None = None
    """Megatron-LM --fp8-recipe value."""
    megatron_fp8_format: str | None = None
    """Megatron-LM --fp8-format value."""
    needs_arch: tuple[str, ...] = ()
    """GPU architectures whose tensor cores run it (empty = any)."""
    bf16_first_last_layers: int = 0
    """Layers at each end of the network kept in BF16."""
    loss_scaling: bool = False
    """Dynamic loss scaling (FP16)."""
    description: str = ""


RECIPES: dict[str, PrecisionRecipe] = {r.name: r for r in (
    PrecisionRecipe(name="bf16", plan_precision="bf16", te_recipe=None,
                    description="BF16 compute, FP32 master weights and optimizer"),
    PrecisionRecipe(name="fp32", plan_precision="fp32", te_recipe=None,
                    description="FP32 everywhere: slow, but tensor parallelism reproduces TP=1 bit for bit (verification)"),
    PrecisionRecipe(name="fp16", plan_precision="fp16", te_recipe=None, loss_scaling=True,
                    description="FP16 compute with dynamic loss scaling (initial 2^16, window 1000, hysteresis 2)"),
    PrecisionRecipe(name="fp8-delayed", plan_precision="fp8", te_recipe="DelayedScaling",
                    te_recipe_kwargs=(("fp8_format", "HYBRID"), ("amax_history_len", 1024),
                                      ("amax_compute_algo", "max")),
                    megatron_fp8_recipe="delayed", megatron_fp8_format="hybrid", needs_arch=("hopper", "blackwell"),
                    description="FP8 delayed scaling: E4M3 forward, E5M2 gradients, scale from a 1024-step amax history"),
    PrecisionRecipe(name="fp8-current", plan_precision="fp8", te_recipe="Float8CurrentScaling",
                    te_recipe_kwargs=(("fp8_format", "HYBRID"),),
                    megatron_fp8_recipe="tensorwise", megatron_fp8_format="hybrid", needs_arch=("hopper", "blackwell"),
                    bf16_first_last_layers=1,
                    description="FP8 per-tensor current scaling, first and last layers in BF16"),
    PrecisionRecipe(name="fp8-blockwise", plan_precision="fp8", te_recipe="Float8BlockScaling",
                    te_recipe_kwargs=(("fp8_format", "E4M3"),),
                    megatron_fp8_recipe="blockwise", megatron_fp8_format="e4m3", needs_arch=("hopper", "blackwell"),
                    description="FP8 block scaling (DeepSeek-V3 like): 1x128 activations and gradients, 128x128 weights, all E4M3"),
    PrecisionRecipe(name="mxfp8", plan_precision="fp8", te_recipe="MXFP8BlockScaling",
                    te_recipe_kwargs=(("fp8_format", "E4M3"),),
                    megatron_fp8_recipe="mxfp8", megatron_fp8_format="e4m3", needs_arch=("blackwell",),
                    description="MXFP8: one E8M0 scale per block of 32 values, E4M3 everywhere (Blackwell only)"),
)}
"""Every recipe genconf knows, by name."""

FP8_BY_TRAIN_NAME = {"delayed": "fp8-delayed", "current": "fp8-current", "blockwise": "fp8-blockwise",
                     "mxfp8": "mxfp8"}
"""TrainSpec.fp8_recipe -> recipe name."""


def recipe(name: str) -> PrecisionRecipe:
    if name not in RECIPES:
        raise ValueError(f"unknown precision recipe {name!r} (one of: {', '.join(RECIPES)})")
    return RECIPES[name]


def recipe_for(precision: str, fp8_recipe: str | None) -> PrecisionRecipe:
    """The recipe a plan precision (+ TrainSpec.fp8_recipe) names."""
    if precision == "fp8":
        return recipe(FP8_BY_TRAIN_NAME[fp8_recipe or "current"])
    return recipe(precision)


TORCHAO_RECIPES = {"fp8-current": "tensorwise"}
"""FP8 without Transformer Engine (FSDP): genconf recipe -> torchao Float8LinearConfig recipe (torchtitan's)."""


def unsupported_reason(r: PrecisionRecipe, *, gpu: GPUSpec | None, framework: str, te_available: bool,
                       cuda: bool, torchao_available: bool = False) -> str | None:
    """One line saying why `r` cannot run here, or None. `gpu` None means no GPU (CPU run)."""
    if r.plan_precision == "fp8" and framework == "fsdp":
        # torchao's float8 layers: FP8 tensor cores on a GPU; torch._scaled_mm's CPU kernel runs it on a CPU.
        if r.name not in TORCHAO_RECIPES:
            return (f"{r.name} needs Transformer Engine (the megatron launcher); FSDP runs FP8 through torchao, "
                    f"recipe {', '.join(TORCHAO_RECIPES)}")
        if not torchao_available:
            return "FP8 with FSDP runs through torchao, which is not installed: pip install 'genconf[fp8]'"
        if cuda and gpu is not None and not gpu.supports_fp8:
            return f"{r.name} needs FP8 tensor cores (Hopper or Blackwell); {gpu.display_name} has none"
        return None
    if r.plan_precision == "fp8":
        if not cuda or gpu is None:
            return f"{r.name} needs a Hopper or Blackwell GPU; this run has no GPU"
        if gpu.arch not in r.needs_arch:
            need = " or ".join(a.capitalize() for a in r.needs_arch)
            return f"{r.name} needs {need} tensor cores; {gpu.display_name} is {gpu.arch.capitalize()}"
        if not te_available:
            return f"{r.name} needs Transformer Engine (pip install 'genconf[te]'), which is not installed"
        if framework != "megatron":
            return (f"{r.name} runs through Transformer Engine layers (the megatron launcher) or torchao (fsdp), "
                    f"not {framework}")
    if r.name == "fp16" and framework == "deepspeed" and not cuda:
        return "fp16 under DeepSpeed needs a GPU: DeepSpeed's FP16 optimizer does not run on the CPU (use bf16)"
    if r.name == "fp16" and framework == "fsdp":
        return "fp16 with the OLMo-style FSDP launcher is not supported (no loss scaler there); use bf16"
    return None
