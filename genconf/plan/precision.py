"""Precision, the one vocabulary: a recipe name (bf16, fp8-current, ...) is what a run asks for; the plan's dtype
(ParallelPlan.precision: bf16 | fp16 | fp8 | fp32), TrainSpec.fp8_recipe (delayed | current | blockwise | mxfp8),
the Transformer Engine recipe class, each framework's flags (Megatron-LM's, OLMo's, the loss scaling DeepSpeed and
Megatron share) and which framework can train which dtype are derived here and nowhere else. Pure: the launcher
turns `te_recipe_kwargs` into a transformer_engine recipe object.

FP8 recipes follow NVIDIA's Transformer Engine recipes (seed 002_3767cc509e078c7e.txt, "New FP8 Recipes for
Blackwell and Hopper"): delayed scaling (hybrid E4M3 forward / E5M2 backward, amax history), per-tensor
current scaling (optionally first and last layers in BF16), DeepSeek-V3-like blockwise scaling (1x128
activations/gradients, 128x128 weights), and MXFP8 (blocks of 32, Blackwell only).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from genconf.plan.specs import PRECISIONS, GPUSpec

PLAN_PRECISIONS = PRECISIONS
"""The plan's dtypes (ParallelPlan.precision), what --precision takes."""


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

    @property
    def compute_dtype(self) -> str:
        """torch dtype name of the parameters and activations the framework computes with: FP8 recipes keep
        BF16 there (Transformer Engine casts GEMM inputs to FP8 on the fly)."""
        return {"fp16": "float16", "fp32": "float32"}.get(self.plan_precision, "bfloat16")

    @property
    def train_fp8_recipe(self) -> str | None:
        """The TrainSpec.fp8_recipe that names this recipe (None when it is not FP8)."""
        return next((train for train, name in FP8_BY_TRAIN_NAME.items() if name == self.name), None)


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
    """The recipe a plan precision (+ TrainSpec.fp8_recipe) names; an fp8 plan without one is fp8-current."""
    if precision == "fp8":
        return recipe(FP8_BY_TRAIN_NAME[fp8_recipe or "current"])
    return recipe(precision)


TORCHAO_RECIPES = {"fp8-current": "tensorwise"}
"""FP8 without Transformer Engine (FSDP): genconf recipe -> torchao Float8LinearConfig recipe (torchtitan's)."""

# --- frameworks -----------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True, slots=True)
class LossScaling:
    """FP16 dynamic loss scaling, the same in ds_config.json, megatron_args.txt and the megatron runner."""

    initial_power: int = 16
    """The scale starts at 2**initial_power."""
    window_steps: int = 1000
    """Steps without overflow before the scale doubles."""
    hysteresis: int = 2
    """Overflowing steps tolerated before the scale halves."""
    min_scale: int = 1

    @property
    def initial_scale(self) -> int:
        return 2**self.initial_power


FP16_LOSS_SCALING = LossScaling()

_TE_LAYERS_ONLY = ("bf16", "FP8 runs through Transformer Engine in Megatron only; bf16 here",
                   "{recipe} runs through Transformer Engine layers (the megatron launcher) or torchao (fsdp), "
                   "not {framework}")
_FRAMEWORK_LIMITS: dict[tuple[str, str], tuple[str, str, str]] = {
    # (plan dtype, framework) -> (the dtype that framework trains instead, the note in its artifact, the refusal
    # when a run asks for it). FP8 needs Transformer Engine's layers, which only the Megatron path builds; genconf's
    # own FSDP launcher runs FP8 through torchao (unsupported_reason), but OLMo's trainer config has no FP8.
    ("fp8", "deepspeed"): _TE_LAYERS_ONLY,
    ("fp8", "fsdp"): _TE_LAYERS_ONLY,
    ("fp16", "fsdp"): ("bf16", "OLMo FSDP has no loss scaler; bf16 instead of fp16",
                       "fp16 with the OLMo-style FSDP launcher is not supported (no loss scaler there); use bf16"),
}


def framework_precision(plan_precision: str, framework: str) -> tuple[str, str | None]:
    """(the dtype `framework` trains a `plan_precision` plan in, the note saying why when that differs)."""
    limit = _FRAMEWORK_LIMITS.get((plan_precision, framework))
    return (limit[0], limit[1]) if limit else (plan_precision, None)


def megatron_flags(plan_precision: str, fp8_recipe: str | None, bf16_first_last_layers: int) -> list[tuple[str, object]]:
    """Megatron-LM's precision arguments as (flag, value) pairs, value None for a switch."""
    flags: list[tuple[str, object]] = []
    if plan_precision == "fp16":
        # Dynamic loss scaling (no --loss-scale), same start (2^16), window and hysteresis as ds_config.json.
        ls = FP16_LOSS_SCALING
        flags += [("--fp16", None), ("--initial-loss-scale", ls.initial_scale), ("--min-loss-scale", ls.min_scale),
                  ("--loss-scale-window", ls.window_steps), ("--hysteresis", ls.hysteresis)]
    elif plan_precision != "fp32":  # Megatron-LM trains in fp32 unless told otherwise
        flags.append(("--bf16", None))
    if plan_precision == "fp8":
        r = recipe_for(plan_precision, fp8_recipe)
        flags += [("--fp8-format", r.megatron_fp8_format), ("--fp8-recipe", r.megatron_fp8_recipe)]
        if bf16_first_last_layers > 0:
            flags += [("--first-last-layers-bf16", None), ("--num-layers-at-start-in-bf16", bf16_first_last_layers),
                      ("--num-layers-at-end-in-bf16", bf16_first_last_layers)]
    return flags


def megatron_plan_precision(flags: Collection[str]) -> str:
    """The plan dtype a set of Megatron-LM flags trains in."""
    return "fp8" if "--fp8-format" in flags else "fp16" if "--fp16" in flags else "bf16" if "--bf16" in flags else "fp32"


def megatron_dtype(flags: Collection[str]) -> str:
    """torch dtype name of megatron-core's params_dtype/pipeline_dtype for a set of Megatron-LM flags."""
    return "float16" if "--fp16" in flags else "bfloat16" if "--bf16" in flags else "float32"


OLMO_PRECISION = {"bf16": "amp_bf16", "fp16": "amp_fp16", "fp32": "fp32"}
"""Plan dtype -> OLMo TrainConfig.precision (OLMo's three values; anything else trains as amp_bf16)."""


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
    if r.name == "fp16" and framework == "deepspeed" and not cuda:
        return "fp16 under DeepSpeed needs a GPU: DeepSpeed's FP16 optimizer does not run on the CPU (use bf16)"
    limit = _FRAMEWORK_LIMITS.get((r.plan_precision, framework))
    if limit:
        return limit[2].format(recipe=r.name, framework=framework)
    return None
