"""What each artifact cannot carry of the plan, one row per difference: the layout a framework rewrites (model
parallelism into sharding, selective into full recompute, FP8 into BF16, the batch rounded to the world size) and the
model features a format cannot express (Qwen2's QKV-only bias, Gemma-2's sandwich norms, per-head q/k norms, a head
dimension other than hidden / heads, sliding windows, experts). The artifacts README prints them in one table, so
nothing is dropped silently.

Pure: standard library and genconf's specs and configs only.
"""

from __future__ import annotations

from dataclasses import dataclass

from genconf.plan.equivalent import equivalent_plan
from genconf.plan.precision import framework_precision
from genconf.plan.specs import ModelSpec, ParallelPlan

FRAMEWORK_FILES = {"megatron": "megatron_args.txt", "deepspeed": "ds_config.json", "fsdp": "olmo_fsdp.yaml"}

OLMO_NO_EXPERTS = ("OLMo's TrainConfig (olmo/config.py, read by TrainConfig.load) has no mixture-of-experts block "
                   "(block_type is sequential or llama, with one MLP), so an olmo_fsdp.yaml would train a dense model. "
                   "OLMo-core describes experts in another config tree (TransformerConfig with block name `moe` and "
                   "MoEConfig: num_experts, hidden_size, router MoERouterConfig top_k), which TrainConfig.load does not "
                   "read; use megatron_args.txt for this model")


@dataclass(frozen=True, kw_only=True, slots=True)
class Difference:
    """One way an artifact differs from the plan."""

    file: str
    """The artifact (``olmo_fsdp.yaml``)."""
    aspect: str
    """What differs: parallelism, sharding, recompute, precision, global batch, offload, or a model feature."""
    plan: str
    """The plan's value."""
    in_file: str
    """What the artifact holds instead ("not written" when the file is left out)."""
    why: str
    """Why, in a few words."""


OLMO_NO_MAMBA = ("OLMo's TrainConfig (olmo/config.py, read by TrainConfig.load) has no Mamba-2 block (block_type is "
                 "sequential or llama: attention and an MLP in every layer), so an olmo_fsdp.yaml would train a "
                 "transformer of another shape; use megatron_args.txt with Megatron-LM's pretrain_mamba.py")


def olmo_config_omitted(model: ModelSpec) -> str | None:
    """Why olmo_fsdp.yaml is not written for this model, or None when it is."""
    if model.is_moe:
        return OLMO_NO_EXPERTS
    return OLMO_NO_MAMBA if model.is_hybrid else None


def _degrees(plan: ParallelPlan) -> str:
    parts = [f"{name}={value}" for name, value in (("tp", plan.tp), ("pp", plan.pp), ("vp", plan.vp), ("cp", plan.cp),
                                                   ("ep", plan.ep)) if value > 1]
    return " ".join(parts + [f"dp={plan.dp}"])


def _sharded(plan: ParallelPlan) -> tuple[int, int | None]:
    """(how much is sharded: 0 nothing, 1 optimizer states, 2 + gradients, 3 + parameters; shard group)."""
    if plan.framework == "megatron":
        return (1 if plan.distributed_optimizer else 0), None
    return plan.zero_stage, plan.shard_group_size


def _sharding(plan: ParallelPlan) -> str:
    if plan.framework == "megatron":
        return "distributed optimizer (zero=1)" if plan.distributed_optimizer else "no sharding (zero=0)"
    if plan.framework == "fsdp":
        group = f", groups of {plan.shard_group_size}" if plan.shard_group_size else ""
        return f"FSDP {plan.fsdp_sharding_strategy}{group}"
    group = f", hpZ groups of {plan.shard_group_size}" if plan.shard_group_size else ""
    return f"ZeRO-{plan.zero_stage}{group}"


def _packing(plan: ParallelPlan, file: str) -> list[Difference]:
    """Packed documents are the data's: no framework argument makes a loader pack them."""
    if plan.packed_doc_tokens is None or plan.packed_doc_tokens >= plan.seq_length:
        return []
    return [Difference(file=file, aspect="packed documents",
                       plan=f"documents of ~{plan.packed_doc_tokens} tokens packed into {plan.seq_length}",
                       in_file="what the data loader feeds (not written)",
                       why="packing is the dataset's (Megatron-Bridge packed sequences, cu_seqlens): the speed "
                           "assumes it")]


def layout_differences(plan: ParallelPlan, framework: str) -> list[Difference]:
    """How `framework`'s artifact rewrites the plan's layout (nothing when it is the plan's own framework)."""
    file = FRAMEWORK_FILES[framework]
    return _packing(plan, file) + _layout_differences(plan, framework, file)


def _layout_differences(plan: ParallelPlan, framework: str, file: str) -> list[Difference]:
    if framework == plan.framework:
        # Only the dtype can differ: OLMo's trainer config has no FP8 that genconf's FSDP launcher trains (torchao);
        # and OLMo runs flash-attn 2 or PyTorch's SDPA, no Triton attention.
        in_file, why = framework_precision(plan.precision, framework, plan_framework=plan.framework)
        rows = ([Difference(file=file, aspect="precision", plan=plan.precision, in_file=in_file,
                            why=why.split("; ")[0].split(": ")[0])] if in_file != plan.precision else [])
        if framework == "fsdp" and plan.attention_kernel == "triton":
            rows.append(Difference(file=file, aspect="attention kernel", plan="flash attention in Triton",
                                   in_file="flash_attention: true (flash-attn 2)",
                                   why="OLMo chooses flash-attn or PyTorch's SDPA, not a Triton kernel"))
        if framework == "fsdp" and plan.attention_kernel == "math":
            rows.append(Difference(file=file, aspect="attention kernel", plan="SDPA's math backend (unfused, fp32)",
                                   in_file="flash_attention: false (PyTorch's SDPA, its own backend choice)",
                                   why="OLMo's config cannot pin an SDPA backend"))
        return rows
    same, _ = equivalent_plan(plan, framework)
    rows: list[Difference] = []
    if _degrees(plan) != _degrees(same):
        why = ("DeepSpeed and FSDP artifacts are data parallel only: parameters are sharded (ZeRO-3 / FULL_SHARD) "
               "instead of split by model parallelism") if framework != "megatron" else "the same GPUs, data parallel"
        rows.append(Difference(file=file, aspect="parallelism", plan=_degrees(plan), in_file=_degrees(same), why=why))
    if _sharded(plan) != _sharded(same):
        if framework == "megatron":
            why = "Megatron's distributed optimizer shards optimizer states only; gradients and weights stay replicated"
        elif plan.framework == "megatron" and same.zero_stage == 3:
            why = "sharded parameters stand in for model parallelism"
        else:
            why = f"{framework} has no exact counterpart; the nearest sharding"
        rows.append(Difference(file=file, aspect="sharding", plan=_sharding(plan), in_file=_sharding(same), why=why))
    if plan.recompute != same.recompute:
        rows.append(Difference(file=file, aspect="recompute", plan=plan.recompute, in_file=same.recompute,
                               why="selective recompute is Megatron's; whole-layer checkpointing instead"))
    if plan.precision != same.precision:
        why = framework_precision(plan.precision, framework)[1].split("; ")[0]  # the note, without "bf16 here"
        rows.append(Difference(file=file, aspect="precision", plan=plan.precision, in_file=same.precision, why=why))
    if plan.fused_loss != same.fused_loss:
        rows.append(Difference(file=file, aspect="cross entropy", plan="fused over the 16-bit logits",
                               in_file="megatron's vocab-parallel cross entropy (bf16 logits + one fp32 buffer)",
                               why="megatron computes its own loss"))
    if plan.gbs != same.gbs:
        rows.append(Difference(file=file, aspect="global batch", plan=f"{plan.gbs} sequences",
                               in_file=f"{same.gbs} sequences",
                               why=f"must be a multiple of micro-batch x GPUs ({same.mbs} x {same.dp})"))
    if (plan.offload_optimizer or plan.offload_params) and not (same.offload_optimizer or same.offload_params):
        rows.append(Difference(file=file, aspect="offload", plan="optimizer states on the CPU", in_file="on the GPU",
                               why="CPU offload is DeepSpeed's"))
    return rows


def feature_differences(model: ModelSpec, framework: str, seq_length: int | None = None) -> list[Difference]:
    """Model features `framework`'s artifact cannot express (the model is built differently from the spec), at the
    plan's `seq_length` where given (a window covering it is plain causal attention)."""
    file = FRAMEWORK_FILES[framework]
    rows: list[Difference] = []

    def add(aspect: str, plan: str, in_file: str, why: str) -> None:
        rows.append(Difference(file=file, aspect=aspect, plan=plan, in_file=in_file, why=why))

    if framework == "megatron":
        if model.sandwich_norm:
            add("sandwich norms", "four norms per layer (Gemma-2)", "two (pre-attention, pre-MLP)",
                "megatron-core has no post-sublayer norms")
        if model.normalization == "nonparametric":
            add("norm", "non-parametric LayerNorm (OLMo-1)", "LayerNorm with weight and bias",
                "Megatron has no switch for a norm without parameters")
        elif model.normalization == "layernorm" and not model.norm_bias:
            add("norm", "LayerNorm without bias", "LayerNorm with weight and bias",
                "megatron-core's LayerNorm always has a bias")
        if model.qk_layernorm and not model.qk_layernorm_per_head:
            add("q/k norm", "over the full projection width (OLMo-2)", f"per head ({model.kv_channels} wide)",
                "megatron-core normalises q and k per head")
    elif framework == "deepspeed":
        if model.is_moe:
            add("experts", f"{model.num_experts} experts, top-{model.moe_top_k}", "none: the JSON carries no model",
                "DeepSpeed's config has no model; genconf's DeepSpeed runner builds dense layers only, so `genconf "
                "launch` refuses this plan there (DeepSpeed-MoE needs its own model code)")
        elif model.is_hybrid:
            add("Mamba-2 layers", f"{model.layers_of_kind('M')} of {model.num_layers} layers",
                "none: the JSON carries no model", "DeepSpeed's config has no model; genconf's DeepSpeed runner "
                "builds GPT layers only, so `genconf launch` refuses this plan there (no launch_deepspeed.sbatch)")
    elif framework == "fsdp":
        if model.is_moe:
            add("experts", f"{model.num_experts} experts, top-{model.moe_top_k}, ffn {model.moe_ffn_hidden_size}",
                "not written", OLMO_NO_EXPERTS)
            return rows  # no file: nothing else to compare
        if model.is_hybrid:
            add("Mamba-2 layers", f"{model.layers_of_kind('M')} of {model.num_layers} layers", "not written",
                OLMO_NO_MAMBA)
            return rows  # no file: nothing else to compare
        if model.activation == "squared_relu":
            add("activation", "squared ReLU, relu(x)^2 (Nemotron)", "relu (activation_type: relu)",
                "OLMo's ActivationType is gelu, relu or swiglu (TrainConfig.load refuses squared_relu); "
                "megatron_args.txt (--squared-relu) and genconf's own FSDP model square it; same weights and GEMMs")
        if model.add_qkv_bias and not model.add_bias_linear:
            add("bias", "on q, k and v only (Qwen2)", "none (include_bias: false)",
                "OLMo's include_bias is all linear layers or none")
        if model.qk_layernorm_per_head:
            add("q/k norm", f"per head ({model.kv_channels} wide)", "over the full projection width",
                "OLMo's attention_layer_norm normalises the whole projection")
        if model.sandwich_norm:
            add("sandwich norms", "four norms per layer (Gemma-2)", "two (pre-attention, pre-MLP)",
                "OLMo's block has norms before (or, with norm_after, after) each sublayer, not both")
        if model.sliding_window and (seq_length is None or model.window_binds(seq_length)):
            add("sliding window", model.window_text, "full causal attention",
                "OLMo's TrainConfig has no attention window (genconf's own FSDP model and megatron_args.txt have it)")
        if model.kv_channels * model.num_attention_heads != model.hidden_size:
            add("head dimension", f"{model.kv_channels}", f"{model.hidden_size // model.num_attention_heads} "
                "(d_model / n_heads)", "OLMo derives the head dimension from d_model and n_heads")
        if model.position_embedding == "rope" and model.rotary_percent != 1:
            add("partial rotary", f"{model.rotary_percent:.0%} of each head's dimensions rotated", "every dimension",
                "OLMo's ModelConfig rotates the whole head (megatron_args.txt and genconf's own FSDP model rotate "
                "the share)")
        if model.position_embedding == "rope" and model.rope_scaling_factor:
            add("rope scaling", f"Llama 3.1's (factor {model.rope_scaling_factor:g})", "none (rope_theta only)",
                "OLMo's ModelConfig has no RoPE frequency scaling (megatron_args.txt and genconf's own FSDP model have "
                "it)")
    return rows


def differences(model: ModelSpec, plan: ParallelPlan, frameworks: tuple[str, ...] = ("megatron", "deepspeed", "fsdp")
                ) -> tuple[Difference, ...]:
    """Every difference between the plan and the artifacts of `frameworks`, the plan's own framework first."""
    order = sorted(frameworks, key=lambda f: f != plan.framework)
    rows: list[Difference] = []
    for framework in order:
        if framework == "fsdp" and model.is_moe:
            rows += feature_differences(model, framework, plan.seq_length)
            continue
        rows += layout_differences(plan, framework) + feature_differences(model, framework, plan.seq_length)
    return tuple(rows)
