"""Precision, the one vocabulary: a recipe name (bf16, fp8-current, ...) is what a run asks for; the plan's dtype
(ParallelPlan.precision: bf16 | fp16 | fp8 | fp4 | fp32), the FP8 scaling (ParallelPlan.fp8_recipe and
TrainSpec.fp8_recipe: delayed | current | blockwise | mxfp8), what --precision takes,
the Transformer Engine recipe class, each framework's flags (Megatron-LM's, OLMo's, the loss scaling DeepSpeed and
Megatron share) and which framework can train which dtype are derived here and nowhere else. Pure: the launcher
turns `te_recipe_kwargs` into a transformer_engine recipe object.

FP8 recipes follow NVIDIA's Transformer Engine recipes (seed 002_3767cc509e078c7e.txt, "New FP8 Recipes for
Blackwell and Hopper"): delayed scaling (hybrid E4M3 forward / E5M2 backward, amax history), per-tensor
current scaling (optionally first and last layers in BF16), DeepSeek-V3-like blockwise scaling (1x128
activations/gradients, 128x128 weights), and MXFP8 (blocks of 32, Blackwell only).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass

from genconf.plan.specs import PRECISIONS, GPUSpec, ParallelPlan

PLAN_PRECISIONS = PRECISIONS
"""The plan's dtypes (ParallelPlan.precision)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PrecisionRecipe:
    name: str
    """bf16 | fp16 | fp8-delayed | fp8-current | fp8-blockwise | mxfp8 | nvfp4."""
    plan_precision: str
    """The planner's precision: bf16 | fp16 | fp8 | fp4."""
    te_recipe: str | None
    """transformer_engine.common.recipe class name, None for BF16/FP16/FP32."""
    te_recipe_kwargs: tuple[tuple[str, object], ...] = ()
    """Keyword arguments for that class (Format names as strings)."""
    megatron_recipe: str | None = None
    """Megatron-LM --fp8-recipe value (--fp4-recipe for FP4)."""
    megatron_format: str | None = None
    """Megatron-LM --fp8-format value (--fp4-format for FP4)."""
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
                    megatron_recipe="delayed", megatron_format="hybrid", needs_arch=("hopper", "blackwell"),
                    description="FP8 delayed scaling: E4M3 forward, E5M2 gradients, scale from a 1024-step amax history"),
    PrecisionRecipe(name="fp8-current", plan_precision="fp8", te_recipe="Float8CurrentScaling",
                    te_recipe_kwargs=(("fp8_format", "HYBRID"),),
                    megatron_recipe="tensorwise", megatron_format="hybrid", needs_arch=("hopper", "blackwell"),
                    bf16_first_last_layers=1,
                    description="FP8 per-tensor current scaling, first and last layers in BF16"),
    PrecisionRecipe(name="fp8-blockwise", plan_precision="fp8", te_recipe="Float8BlockScaling",
                    te_recipe_kwargs=(("fp8_format", "E4M3"),),
                    megatron_recipe="blockwise", megatron_format="e4m3", needs_arch=("hopper", "blackwell"),
                    description="FP8 block scaling (DeepSeek-V3 like): 1x128 activations and gradients, 128x128 weights, all E4M3"),
    PrecisionRecipe(name="mxfp8", plan_precision="fp8", te_recipe="MXFP8BlockScaling",
                    te_recipe_kwargs=(("fp8_format", "E4M3"),),
                    megatron_recipe="mxfp8", megatron_format="e4m3", needs_arch=("blackwell",),
                    description="MXFP8: one E8M0 scale per block of 32 values, E4M3 everywhere (Blackwell only)"),
    PrecisionRecipe(name="nvfp4", plan_precision="fp4", te_recipe="NVFP4BlockScaling",
                    megatron_recipe="nvfp4", megatron_format="e2m1", needs_arch=("blackwell",),
                    description="NVFP4: E2M1 values, an E4M3 scale per 16 and an FP32 scale per tensor; 2D 16x16 "
                                "weight scaling, random Hadamard transforms and stochastic rounding of gradients "
                                "(Blackwell only; Megatron --fp4-format e2m1 --fp4-recipe nvfp4)"),
)}
"""Every recipe genconf knows, by name."""

FP8_BY_TRAIN_NAME = {"delayed": "fp8-delayed", "current": "fp8-current", "blockwise": "fp8-blockwise",
                     "mxfp8": "mxfp8"}
"""TrainSpec.fp8_recipe -> recipe name."""


PRECISION_NAMES = tuple(dict.fromkeys((*PLAN_PRECISIONS, *RECIPES)))
"""What --precision takes: a plan dtype (fp8 = FP8 with the default scaling, fp4 = NVFP4) or a recipe name."""


def plan_precision_of(name: str) -> tuple[str, str | None]:
    """(ParallelPlan.precision, ParallelPlan.fp8_recipe) of a --precision value: a plan dtype as it is (the scaling
    left to the default), a recipe name as its dtype and FP8 scaling."""
    if name in PLAN_PRECISIONS:
        return name, None
    r = recipe(name)
    return r.plan_precision, r.train_fp8_recipe


def recipe(name: str) -> PrecisionRecipe:
    if name not in RECIPES:
        raise ValueError(f"unknown precision recipe {name!r} (one of: {', '.join(RECIPES)})")
    return RECIPES[name]


def recipe_for(precision: str, fp8_recipe: str | None) -> PrecisionRecipe:
    """The recipe a plan precision (+ TrainSpec.fp8_recipe) names; an fp8 plan without one is fp8-current."""
    if precision == "fp8":
        return recipe(FP8_BY_TRAIN_NAME[fp8_recipe or "current"])
    if precision == "fp4":
        return recipe("nvfp4")
    return recipe(precision)


def bf16_edge_default(plan_precision: str, fp8_recipe: str | None) -> int:
    """Layers at each end of the network the precision's recipe keeps in BF16 (fp8-current: 1, as Megatron-Bridge's
    bf16_with_fp8_current_scaling_mixed; 0 for the others and for unquantized dtypes)."""
    if plan_precision not in TE_LAYERS_ONLY:
        return 0
    return recipe_for(plan_precision, fp8_recipe).bf16_first_last_layers


def plan_in_precision(plan: ParallelPlan, plan_precision: str) -> ParallelPlan:
    """The plan trained in another dtype (a smoke test, `genconf launch --precision`): the FP8 scaling, FP8/FP4
    parameters, BF16 end layers and the precision-aware optimizer (16-bit master remainders) stay only where that
    dtype has them."""
    quantized = plan_precision in TE_LAYERS_ONLY
    aware = plan.precision_aware_optimizer and plan_precision in ("bf16", *TE_LAYERS_ONLY)
    return dataclasses.replace(
        plan, precision=plan_precision, fp8_recipe=plan.fp8_recipe if plan_precision == "fp8" else None,
        bf16_layers_start=plan.bf16_layers_start if quantized else 0,
        bf16_layers_end=plan.bf16_layers_end if quantized else 0,
        fp8_param_gather=plan.fp8_param_gather and plan_precision in TE_LAYERS_ONLY,
        precision_aware_optimizer=aware,
        adam_moments_dtype=plan.adam_moments_dtype if aware else "fp32")

TORCHAO_RECIPES = {"fp8-current": "tensorwise"}
"""FP8 without Transformer Engine (genconf's FSDP launcher): genconf recipe -> torchao Float8LinearConfig recipe
(torchtitan's)."""


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

@dataclass(frozen=True, kw_only=True, slots=True)
class FrameworkLimit:
    """A plan dtype a framework cannot train, said once for every place that meets it."""

    instead: str
    """The dtype that framework's artifact trains instead."""
    note: str
    """The note in that artifact (equivalent_plan's notes, the artifacts README)."""
    refusal: str
    """Why `genconf launch` refuses a run asking for it ({recipe} and {framework} filled in)."""
    rule: str | None
    """Why the rule book refuses a plan asking for it (the `precision` rule); None where genconf's own launcher
    trains such a plan another way, so only that framework's artifact differs."""
    own_note: str | None = None
    """The note when the plan itself is of that framework and genconf's launcher trains it (rule None)."""


TE_LAYERS_ONLY = {"fp8": "FP8", "fp4": "NVFP4"}
"""Plan dtypes whose GEMMs only Transformer Engine's layers run (which only the Megatron path builds with the te
layer spec), with the name messages give them."""

TORCHAO_DTYPES = ("fp8",)
"""Plan dtypes genconf's FSDP launcher also trains, through torchao's float8 layers (TORCHAO_RECIPES)."""


def _te_layers_only(plan_precision: str) -> FrameworkLimit:
    name = TE_LAYERS_ONLY[plan_precision]
    if plan_precision in TORCHAO_DTYPES:
        return FrameworkLimit(
            instead="bf16", note=f"{name} runs through Transformer Engine in Megatron only; bf16 here",
            refusal="{recipe} runs through Transformer Engine layers (the megatron launcher) or torchao (fsdp), "
                    "not {framework}",
            rule=f"{name} runs through Transformer Engine (--framework megatron --layer-spec te) or torchao's float8 "
                 f"layers (--framework fsdp)")
    return FrameworkLimit(
        instead="bf16", note=f"{name} runs through Transformer Engine in Megatron only; bf16 here",
        refusal="{recipe} runs through Transformer Engine layers: use the megatron launcher, not {framework}",
        rule=f"{name} runs through Transformer Engine: needs --framework megatron and --layer-spec te")


_FRAMEWORK_LIMITS: dict[tuple[str, str], FrameworkLimit] = {
    **{(dtype, framework): _te_layers_only(dtype) for dtype in TE_LAYERS_ONLY for framework in ("deepspeed", "fsdp")},
    # genconf's FSDP launcher trains FP8 through torchao's float8 layers (unsupported_reason says where), but
    # OLMo's trainer config has no FP8: an FSDP plan stays legal and only its OLMo artifact falls back to bf16.
    **{(dtype, "fsdp"): dataclasses.replace(
        _te_layers_only(dtype), rule=None,
        own_note=f"OLMo's trainer has no {TE_LAYERS_ONLY[dtype]}: bf16 here (genconf launch trains this plan in "
                 f"{TE_LAYERS_ONLY[dtype]} through torchao)") for dtype in TORCHAO_DTYPES},
    ("fp16", "fsdp"): FrameworkLimit(
        instead="bf16", note="OLMo FSDP has no loss scaler; bf16 instead of fp16",
        refusal="fp16 with the OLMo-style FSDP launcher is not supported (no loss scaler there); use bf16",
        rule="fp16 with OLMo FSDP is not supported (no loss scaling there); use bf16"),
}
"""(plan dtype, framework) -> what that framework cannot train, and what it trains instead."""


def framework_precision(plan_precision: str, framework: str, *, plan_framework: str | None = None) -> tuple[str, str | None]:
    """(the dtype `framework`'s artifact trains a `plan_precision` plan of `plan_framework` in, the note saying why
    when that differs)."""
    limit = _FRAMEWORK_LIMITS.get((plan_precision, framework))
    if limit is None:
        return plan_precision, None
    return limit.instead, (limit.own_note if plan_framework == framework and limit.own_note else limit.note)


def plan_refusal(plan_precision: str, framework: str, layer_spec: str) -> str | None:
    """Why a plan cannot train `plan_precision` with this framework and layer spec (the rule book's `precision`
    rule), from the same table as the artifacts' notes and the launch refusal; None when it can."""
    limit = _FRAMEWORK_LIMITS.get((plan_precision, framework))
    if limit is None and plan_precision in TE_LAYERS_ONLY and layer_spec != "te":
        limit = _te_layers_only(plan_precision)  # megatron-core's local layers are not Transformer Engine's either
    return limit.rule if limit else None  # a None rule: legal, only an artifact differs


def megatron_flags(plan_precision: str, fp8_recipe: str | None, bf16_layers: tuple[int, int] = (0, 0), *,
                   param_gather: bool = False) -> list[tuple[str, object]]:
    """Megatron-LM's precision arguments as (flag, value) pairs, value None for a switch. bf16_layers: the first
    and last layers kept in BF16 (ParallelPlan.bf16_edge_layers); param_gather: the weights are kept, and
    all-gathered, in FP8 (FP4) (ParallelPlan.fp8_param_gather)."""
    flags: list[tuple[str, object]] = []
    if plan_precision == "fp16":
        # Dynamic loss scaling (no --loss-scale), same start (2^16), window and hysteresis as ds_config.json.
        ls = FP16_LOSS_SCALING
        flags += [("--fp16", None), ("--initial-loss-scale", ls.initial_scale), ("--min-loss-scale", ls.min_scale),
                  ("--loss-scale-window", ls.window_steps), ("--hysteresis", ls.hysteresis)]
    elif plan_precision != "fp32":  # Megatron-LM trains in fp32 unless told otherwise
        flags.append(("--bf16", None))
    if plan_precision in TE_LAYERS_ONLY:
        r = recipe_for(plan_precision, fp8_recipe)
        prefix = f"--{plan_precision}"  # --fp8-format / --fp4-format, ...
        flags += [(f"{prefix}-format", r.megatron_format), (f"{prefix}-recipe", r.megatron_recipe)]
        start, end = bf16_layers
        if start or end:
            # Both counts written: Megatron-LM's own defaults are 1 and 1 once the switch is on.
            flags += [("--first-last-layers-bf16", None), ("--num-layers-at-start-in-bf16", start),
                      ("--num-layers-at-end-in-bf16", end)]
        if param_gather:
            flags.append((f"{prefix}-param-gather", None))
    return flags


def megatron_plan_precision(flags: Collection[str]) -> str:
    """The plan dtype a set of Megatron-LM flags trains in."""
    for dtype in TE_LAYERS_ONLY:
        if f"--{dtype}-format" in flags:
            return dtype
    return "fp16" if "--fp16" in flags else "bf16" if "--bf16" in flags else "fp32"


def megatron_fp8_recipe(megatron_recipe: str | None) -> str | None:
    """ParallelPlan.fp8_recipe of a Megatron-LM --fp8-recipe value (absent: Megatron-LM's default, delayed; None for
    one genconf has no recipe of, e.g. custom)."""
    name = megatron_recipe or "delayed"
    return next((r.train_fp8_recipe for r in RECIPES.values() if r.plan_precision == "fp8" and r.megatron_recipe == name),
                None)


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
    if r.plan_precision in ("fp8", "fp4"):
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
        return limit.refusal.format(recipe=r.name, framework=framework)
    return None
