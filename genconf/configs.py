"""Every artifact's configuration, built as plain dicts and lists from one plan (pure: standard library only).

One `ParallelPlan` drives all of them. A plan runs exactly in its own framework; the other frameworks get
the nearest equivalent on the same GPUs (`equivalent_plan`), whose differences are stated as notes. The
shell (`genconf.artifacts`) renders these with jinja2 and writes them; `genconf.check` re-validates them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from genconf.counting import as_built_by_megatron
from genconf.memory import deepspeed_zero_buckets
from genconf.pipeline import stage_layers
from genconf.specs import ClusterSpec, ModelSpec, ParallelPlan, TrainSpec

MEGATRON_LM_SOURCE = "NVIDIA/Megatron-LM megatron/training/arguments.py @ 000c4ac24f61159c138b0975def722c65245983c"
"""Where every Megatron-LM flag name, type and choice below was checked."""

SWITCH, INT, FLOAT, STR, LIST = "switch", "int", "float", "str", "list"

MEGATRON_FLAGS: dict[str, tuple[str, tuple[str, ...]]] = {
    # flag: (kind, choices). Checked against MEGATRON_LM_SOURCE; `genconf check` refuses anything else.
    # distributed
    "--tensor-model-parallel-size": (INT, ()), "--pipeline-model-parallel-size": (INT, ()),
    "--num-virtual-stages-per-pipeline-rank": (INT, ()), "--num-layers-per-virtual-pipeline-stage": (INT, ()),
    "--decoder-first-pipeline-num-layers": (INT, ()), "--decoder-last-pipeline-num-layers": (INT, ()),
    "--account-for-embedding-in-pipeline-split": (SWITCH, ()), "--account-for-loss-in-pipeline-split": (SWITCH, ()),
    "--context-parallel-size": (INT, ()), "--expert-model-parallel-size": (INT, ()),
    "--expert-tensor-parallel-size": (INT, ()), "--sequence-parallel": (SWITCH, ()), "--tp-comm-overlap": (SWITCH, ()),
    "--use-distributed-optimizer": (SWITCH, ()), "--overlap-grad-reduce": (SWITCH, ()),
    "--overlap-param-gather": (SWITCH, ()), "--overlap-param-gather-with-optimizer-step": (SWITCH, ()),
    "--no-overlap-p2p-communication": (SWITCH, ()), "--distributed-backend": (STR, ("nccl", "gloo")),
    "--distributed-timeout-minutes": (INT, ()), "--ddp-bucket-size": (INT, ()),
    "--use-cpu-initialization": (SWITCH, ()), "--no-gradient-accumulation-fusion": (SWITCH, ()),
    # batch and sequence
    "--micro-batch-size": (INT, ()), "--global-batch-size": (INT, ()), "--seq-length": (INT, ()),
    "--max-position-embeddings": (INT, ()),
    # network size
    "--num-layers": (INT, ()), "--hidden-size": (INT, ()), "--ffn-hidden-size": (INT, ()),
    "--num-attention-heads": (INT, ()), "--kv-channels": (INT, ()), "--group-query-attention": (SWITCH, ()),
    "--num-query-groups": (INT, ()),
    "--position-embedding-type": (STR, ("learned_absolute", "rope", "mrope", "relative", "none")),
    "--rotary-base": (INT, ()), "--normalization": (STR, ("LayerNorm", "RMSNorm")), "--norm-epsilon": (FLOAT, ()),
    "--swiglu": (SWITCH, ()), "--disable-bias-linear": (SWITCH, ()), "--add-qkv-bias": (SWITCH, ()),
    "--untie-embeddings-and-output-weights": (SWITCH, ()), "--qk-layernorm": (SWITCH, ()),
    "--hidden-dropout": (FLOAT, ()), "--attention-dropout": (FLOAT, ()),
    "--make-vocab-size-divisible-by": (INT, ()),
    "--attention-backend": (STR, ("flash", "fused", "unfused", "local", "auto")), "--use-flash-attn": (SWITCH, ()),
    # mixture of experts
    "--num-experts": (INT, ()), "--moe-router-topk": (INT, ()), "--moe-ffn-hidden-size": (INT, ()),
    "--moe-token-dispatcher-type": (STR, ("allgather", "alltoall", "flex")), "--moe-aux-loss-coeff": (FLOAT, ()),
    "--moe-router-load-balancing-type": (STR, ("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none")),
    # tokenizer and data
    "--tokenizer-type": (STR, ("BertWordPieceLowerCase", "BertWordPieceCase", "GPT2BPETokenizer",
                               "SentencePieceTokenizer", "GPTSentencePieceTokenizer", "HuggingFaceTokenizer",
                               "Llama2Tokenizer", "TikTokenizer", "MultimodalTokenizer", "NullTokenizer",
                               "NullMultimodalTokenizer", "SFTTokenizer")),
    "--tokenizer-model": (STR, ()), "--vocab-size": (INT, ()), "--vocab-file": (STR, ()), "--merge-file": (STR, ()),
    "--mock-data": (SWITCH, ()), "--data-path": (LIST, ()), "--split": (STR, ()), "--data-cache-path": (STR, ()),
    "--num-workers": (INT, ()),
    # layers, recompute, precision
    "--transformer-impl": (STR, ("local", "transformer_engine")),
    "--recompute-granularity": (STR, ("full", "selective")), "--recompute-method": (STR, ("uniform", "block")),
    "--recompute-num-layers": (INT, ()), "--recompute-modules": (LIST, ()),
    "--bf16": (SWITCH, ()), "--fp16": (SWITCH, ()), "--loss-scale": (FLOAT, ()), "--initial-loss-scale": (FLOAT, ()),
    "--min-loss-scale": (FLOAT, ()), "--loss-scale-window": (FLOAT, ()), "--hysteresis": (INT, ()),
    "--fp8-format": (STR, ("e4m3", "hybrid")),
    "--fp8-recipe": (STR, ("tensorwise", "delayed", "mxfp8", "blockwise", "custom")),
    "--first-last-layers-bf16": (SWITCH, ()), "--num-layers-at-start-in-bf16": (INT, ()),
    "--num-layers-at-end-in-bf16": (INT, ()), "--fp8-param-gather": (SWITCH, ()),
    # optimizer and schedule
    "--optimizer": (STR, ("adam", "sgd", "muon", "dist_muon")), "--lr": (FLOAT, ()), "--min-lr": (FLOAT, ()),
    "--lr-decay-style": (STR, ("constant", "linear", "cosine", "inverse-square-root", "WSD")),
    "--lr-warmup-iters": (INT, ()), "--lr-decay-iters": (INT, ()), "--lr-warmup-init": (FLOAT, ()),
    "--train-iters": (INT, ()), "--weight-decay": (FLOAT, ()), "--adam-beta1": (FLOAT, ()),
    "--adam-beta2": (FLOAT, ()), "--adam-eps": (FLOAT, ()), "--clip-grad": (FLOAT, ()), "--seed": (INT, ()),
    "--init-method-std": (FLOAT, ()),
    # checkpoints, logging, evaluation
    "--save": (STR, ()), "--load": (STR, ()), "--save-interval": (INT, ()),
    "--ckpt-format": (STR, ("torch", "torch_dist", "zarr", "torch_dcp", "fsdp_dtensor")),
    "--log-interval": (INT, ()), "--log-throughput": (SWITCH, ()), "--timing-log-level": (INT, ("0", "1", "2")),
    "--tensorboard-dir": (STR, ()), "--wandb-project": (STR, ()), "--wandb-exp-name": (STR, ()),
    "--eval-iters": (INT, ()), "--eval-interval": (INT, ()), "--manual-gc": (SWITCH, ()),
    "--manual-gc-interval": (INT, ()),
}

# Megatron-LM arguments.py: --lr-decay-style names; TrainSpec.lr_decay uses the same three.
_MEGATRON_FP8 = {
    # TrainSpec.fp8_recipe -> (--fp8-recipe, --fp8-format). "current" is Megatron's per-tensor "tensorwise";
    # blockwise and MXFP8 scale E4M3 everywhere (Transformer Engine Float8BlockScaling / MXFP8BlockScaling).
    "delayed": ("delayed", "hybrid"), "current": ("tensorwise", "hybrid"),
    "blockwise": ("blockwise", "e4m3"), "mxfp8": ("mxfp8", "e4m3"),
}
FSDP_SHARDING = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD")
FSDP_WRAPPING = ("by_block", "by_block_and_size", "by_block_group", "by_block_group_and_size", "size_based")
OLMO_SCHEDULERS = {"cosine": "cosine_with_warmup", "linear": "linear_with_warmup", "constant": "constant_with_warmup"}

# --- one plan, three frameworks ---------------------------------------------------------------------


def _round_batch(gbs: int, unit: int) -> int:
    """The multiple of `unit` nearest to `gbs` (at least one unit)."""
    return max(unit, round(gbs / unit) * unit)


def equivalent_plan(plan: ParallelPlan, framework: str) -> tuple[ParallelPlan, tuple[str, ...]]:
    """The plan itself when `framework` is its own, else the nearest `framework` plan on the same GPUs with
    the same micro-batch, sequence and (where it divides) global batch; the notes say what differs."""
    if framework == plan.framework:
        return plan, ()
    world = plan.world_size
    notes: list[str] = []
    model_parallel = {name: value for name, value in (("tp", plan.tp), ("pp", plan.pp), ("cp", plan.cp), ("ep", plan.ep))
                      if value > 1}
    if framework == "megatron":
        zero = 1 if plan.zero_stage >= 1 else 0
        if plan.zero_stage >= 2:
            notes.append(f"zero={plan.zero_stage} becomes Megatron's distributed optimizer, which shards optimizer "
                         f"states only (gradients and parameters stay replicated)")
        recompute = plan.recompute
    else:
        if plan.framework == "megatron":
            zero = 3 if model_parallel else {0: 0, 1: 1 if framework == "deepspeed" else 2}[plan.zero_stage]
        else:
            zero = {0: 0, 1: 1 if framework == "deepspeed" else 2, 2: 2, 3: 3}[plan.zero_stage]
        if model_parallel:
            degrees = ", ".join(f"{k}={v}" for k, v in model_parallel.items())
            notes.append(f"{degrees} becomes data parallelism over {world} GPUs; zero={zero} shards parameters in place "
                         f"of model parallelism")
        elif zero != plan.zero_stage:
            notes.append(f"zero={plan.zero_stage} has no {framework} counterpart; zero={zero} is the nearest")
        recompute = "full" if plan.recompute != "none" else "none"
        if plan.recompute == "selective":
            notes.append("selective recompute is Megatron's; full (whole-layer) checkpointing instead")
    precision = plan.precision
    if precision == "fp8" and framework != "megatron":
        precision = "bf16"
        if plan.framework == "fsdp" and framework == "fsdp":
            notes.append("OLMo's trainer has no FP8: bf16 here (genconf launch trains this plan in FP8 through torchao)")
        else:
            notes.append("FP8 runs through Transformer Engine in Megatron only; bf16 here")
    if precision == "fp16" and framework == "fsdp":
        precision = "bf16"
        notes.append("OLMo FSDP has no loss scaler; bf16 instead of fp16")
    gbs = _round_batch(plan.gbs, plan.mbs * world)
    if gbs != plan.gbs:
        notes.append(f"global batch {plan.gbs} is not a multiple of mbs x GPUs ({plan.mbs} x {world}); {gbs} instead")
    if (plan.offload_optimizer or plan.offload_params) and framework != "deepspeed":
        notes.append("CPU offload is DeepSpeed's; states stay on the GPU here")
    shard_group = plan.shard_group_size if zero == 3 and framework != "megatron" else None
    if plan.shard_group_size and shard_group is None:
        notes.append(f"hybrid sharding over groups of {plan.shard_group_size} is not available; plain sharding")
    equivalent = ParallelPlan(
        framework=framework, tp=1, pp=1, vp=1, cp=1, ep=1, dp=world, mbs=plan.mbs, gbs=gbs, seq_length=plan.seq_length,
        zero_stage=zero, shard_group_size=shard_group, recompute=recompute, precision=precision,
        layer_spec=plan.layer_spec)
    return equivalent, tuple(notes)


# --- DeepSpeed ------------------------------------------------------------------------------------


def deepspeed_scheduler(train: TrainSpec) -> dict:
    """TrainSpec's schedule as a DeepSpeed scheduler (deepspeed/runtime/lr_schedules.py names and parameters).

    WarmupCosineLR works in ratios of the optimizer's lr: warm-up from 0, cosine down to min_lr / lr.
    WarmupDecayLR warms up from warmup_min_lr and decays linearly back to it, so it starts at min_lr, not 0.
    """
    warmup = max(1, min(train.warmup_steps, train.train_steps))  # DeepSpeed refuses warmup_num_steps <= 0
    if train.lr_decay == "cosine":
        return {"type": "WarmupCosineLR", "params": {
            "total_num_steps": train.train_steps, "warmup_num_steps": warmup, "warmup_min_ratio": 0.0,
            "cos_min_ratio": train.min_lr / train.lr if train.lr else 0.0, "warmup_type": "linear"}}
    if train.lr_decay == "linear":
        return {"type": "WarmupDecayLR", "params": {
            "total_num_steps": train.train_steps, "warmup_num_steps": warmup, "warmup_min_lr": train.min_lr,
            "warmup_max_lr": train.lr, "warmup_type": "linear"}}
    return {"type": "WarmupLR", "params": {
        "warmup_num_steps": warmup, "warmup_min_lr": 0.0, "warmup_max_lr": train.lr, "warmup_type": "linear"}}


def deepspeed_zero(model: ModelSpec, plan: ParallelPlan) -> dict:
    """zero_optimization for the plan's stage, buckets sized from the hidden size like the memory model's."""
    stage = plan.zero_stage
    if stage == 0:
        return {"stage": 0}
    buckets = deepspeed_zero_buckets(model.hidden_size)
    zero: dict = {"stage": stage, "overlap_comm": True, "contiguous_gradients": True,
                  "reduce_bucket_size": buckets["reduce_bucket_size"]}
    if stage <= 2:
        zero.update(allgather_partitions=True, allgather_bucket_size=buckets["allgather_bucket_size"],
                    reduce_scatter=True)
    else:
        zero.update({key: buckets[key] for key in ("stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
                                                   "stage3_max_live_parameters", "stage3_max_reuse_distance")})
        zero["stage3_gather_16bit_weights_on_model_save"] = True
        if plan.shard_group_size:
            # ZeRO++ hpZ: a secondary copy of the parameters sharded inside groups of this size (the node),
            # so the forward/backward all-gathers stay on NVLink (Wang et al. 2023, ZeRO++ Sec. 3.2).
            zero["zero_hpz_partition_size"] = plan.shard_group_size
    if plan.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if plan.offload_params and stage == 3:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return zero


def deepspeed_config(model: ModelSpec, plan: ParallelPlan, train: TrainSpec) -> dict:
    """ds_config.json for the plan (or its nearest DeepSpeed equivalent), with the plan's world size as dp."""
    plan, _ = equivalent_plan(plan, "deepspeed")
    accum = plan.gbs // (plan.mbs * plan.dp)
    config: dict = {
        # train_batch_size = micro x accumulation x dp, e.g. 2 x 256 x 4 = 2048 sequences per step
        "train_batch_size": plan.gbs,
        "train_micro_batch_size_per_gpu": plan.mbs,
        "gradient_accumulation_steps": accum,
        "gradient_clipping": train.grad_clip,
        "steps_per_print": 10,
        "zero_optimization": deepspeed_zero(model, plan),
        "optimizer": {"type": "AdamW", "params": {"lr": train.lr, "betas": [train.beta1, train.beta2],
                                                  "eps": train.eps, "weight_decay": train.weight_decay}},
        "scheduler": deepspeed_scheduler(train),
        # Verification switches: turn on for a few steps to compare measured time and FLOP/s with the plan.
        "wall_clock_breakdown": False,
        "flops_profiler": {"enabled": False, "profile_step": min(10, train.train_steps), "module_depth": -1,
                           "top_modules": 1, "detailed": False, "output_file": None},
    }
    if plan.precision == "fp16":
        # Dynamic loss scaling: start at 2^16, halve on overflow after 2 bad steps, double after 1000 good ones.
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                          "hysteresis": 2, "min_loss_scale": 1}
    elif plan.precision != "fp32":
        config["bf16"] = {"enabled": True}
        if plan.grad_accum_fp32:
            config["data_types"] = {"grad_accum_dtype": "fp32"}
    if plan.recompute != "none":
        config["activation_checkpointing"] = {
            "partition_activations": False, "contiguous_memory_optimization": False, "cpu_checkpointing": False,
            "number_checkpoints": model.num_layers, "synchronize_checkpoint_boundary": False, "profile": False}
    return config


# --- Megatron -------------------------------------------------------------------------------------

Arg = tuple[str, "str | None"]


def megatron_args(model: ModelSpec, plan: ParallelPlan, train: TrainSpec) -> list[Arg]:
    """Megatron-LM / megatron-core arguments as (flag, value) pairs, value None for switches; ("# ...", None)
    is a comment line. Flag names as in MEGATRON_LM_SOURCE."""
    plan, _ = equivalent_plan(plan, "megatron")
    out: list[Arg] = []

    def add(flag: str, value: object = None) -> None:
        out.append((flag, None if value is None else str(value)))

    add("# parallelism: world size = tp x pp x cp x dp = "
        f"{plan.tp} x {plan.pp} x {plan.cp} x {plan.dp} = {plan.world_size}")
    add("--tensor-model-parallel-size", plan.tp)
    add("--pipeline-model-parallel-size", plan.pp)
    if plan.vp > 1:
        # The virtual size (not layers per virtual stage): Megatron-LM requires it with uneven pipelines.
        add("--num-virtual-stages-per-pipeline-rank", plan.vp)
        if plan.pp == 2:
            add("# pp=2 with virtual stages: overlap_p2p_comm stays on (the default), so batch_p2p_comm is off;")
            add("# batched p2p with pp=2 mis-orders sends and trains wrong (Megatron-LM issues 750, 1450).")
            add("# Never add --no-overlap-p2p-communication here (arguments.py also refuses it for pp <= 2).")
    if plan.pp_first_stage_layers is not None:
        add("--decoder-first-pipeline-num-layers", plan.pp_first_stage_layers)
    if plan.pp_last_stage_layers is not None:
        add("--decoder-last-pipeline-num-layers", plan.pp_last_stage_layers)
    if plan.pp_embedding_as_layer:
        add("--account-for-embedding-in-pipeline-split")
    if plan.pp_loss_as_layer:
        add("--account-for-loss-in-pipeline-split")
    if plan.pp > 1:
        add(f"# layers per pipeline rank: {list(stage_layers(model.num_layers, plan))}")
    add("--context-parallel-size", plan.cp)
    add("--expert-model-parallel-size", plan.ep)
    if plan.sequence_parallel:
        add("--sequence-parallel")
    if plan.tp_comm_overlap:
        add("--tp-comm-overlap")
    if plan.distributed_optimizer:
        add("--use-distributed-optimizer")
    if plan.dp * plan.cp > 1:
        add("--overlap-grad-reduce")
        if plan.distributed_optimizer:
            add("--overlap-param-gather")
    add(f"# batch: {plan.gbs} sequences = mbs {plan.mbs} x dp {plan.dp} x {plan.num_microbatches} micro-batches")
    add("--micro-batch-size", plan.mbs)
    add("--global-batch-size", plan.gbs)
    add("--seq-length", plan.seq_length)
    add("--max-position-embeddings", max(plan.seq_length, model.seq_length))
    add(f"# model: {model.name}")
    if as_built_by_megatron(model) != model:
        add("# megatron-core has no bias-free or non-parametric LayerNorm and normalises q/k per head: it builds")
        add("# LayerNorm with weight and bias, and per-head q/k norms (genconf's memory model counts what it builds)")
    if model.sandwich_norm:
        add("# megatron-core has no post-sublayer (sandwich) norms: it builds two norms per layer, not four")
    add("--num-layers", model.num_layers)
    add("--hidden-size", model.hidden_size)
    add("--ffn-hidden-size", model.ffn_hidden_size)
    add("--num-attention-heads", model.num_attention_heads)
    if model.kv_channels * model.num_attention_heads != model.hidden_size:
        add("--kv-channels", model.kv_channels)
    if model.num_query_groups != model.num_attention_heads:
        add("--group-query-attention")
        add("--num-query-groups", model.num_query_groups)
    add("--position-embedding-type", "rope" if model.position_embedding == "rope" else "learned_absolute")
    if model.normalization == "nonparametric":
        add("# OLMo-1's non-parametric LayerNorm has no Megatron switch: LayerNorm (with weight) is the nearest")
    add("--normalization", "RMSNorm" if model.normalization == "rmsnorm" else "LayerNorm")
    if model.gated:
        add("--swiglu")
    if not model.add_bias_linear:
        add("--disable-bias-linear")
        if model.add_qkv_bias:
            add("--add-qkv-bias")
    if not model.tie_embeddings:
        add("--untie-embeddings-and-output-weights")
    if model.qk_layernorm:
        add("--qk-layernorm")
    add("--hidden-dropout", model.hidden_dropout)
    add("--attention-dropout", model.attention_dropout)
    if model.is_moe:
        add("--num-experts", model.num_experts)
        add("--moe-router-topk", model.moe_top_k)
        add("--moe-ffn-hidden-size", model.moe_ffn_hidden_size)
        add("--moe-aux-loss-coeff", 0.01)  # arguments.py: "a starting value of 1e-2 is recommended"
        if plan.ep > 1:
            add("--moe-token-dispatcher-type", "alltoall")  # recommended with expert parallelism (arguments.py)
    add("# NullTokenizer adds one end-of-document id to --vocab-size: V - 1 gives the model's V rows,")
    add("# which Megatron then pads to a multiple of 128 x tp (the memory model's count)")
    add("--tokenizer-type", "NullTokenizer")
    add("--vocab-size", model.vocab_size - 1)
    add("--make-vocab-size-divisible-by", 128)
    add("--transformer-impl", "transformer_engine" if plan.layer_spec == "te" else "local")
    if plan.recompute == "selective":
        add("--recompute-granularity", "selective")
    elif plan.recompute == "full":
        add("--recompute-granularity", "full")
        add("--recompute-method", "uniform")
        add("--recompute-num-layers", 1)
    add(f"# precision: {plan.precision}")
    if plan.precision == "fp16":
        # Dynamic loss scaling (no --loss-scale), same start (2^16), window and hysteresis as ds_config.json.
        add("--fp16")
        add("--initial-loss-scale", 65536)
        add("--min-loss-scale", 1)
        add("--loss-scale-window", 1000)
        add("--hysteresis", 2)
    elif plan.precision != "fp32":  # Megatron-LM trains in fp32 unless told otherwise
        add("--bf16")
    if plan.precision == "fp8":
        recipe, fmt = _MEGATRON_FP8[train.fp8_recipe or "current"]
        add("--fp8-format", fmt)
        add("--fp8-recipe", recipe)
        if train.fp8_bf16_first_last_layers > 0:
            add("--first-last-layers-bf16")
            add("--num-layers-at-start-in-bf16", train.fp8_bf16_first_last_layers)
            add("--num-layers-at-end-in-bf16", train.fp8_bf16_first_last_layers)
    add(f"# optimizer and schedule: {train.train_steps} steps")
    add("--optimizer", "adam")  # Megatron's adam is AdamW: decoupled weight decay
    add("--lr", train.lr)
    add("--min-lr", train.min_lr)
    add("--lr-decay-style", train.lr_decay)
    add("--lr-warmup-iters", min(train.warmup_steps, train.train_steps))
    add("--train-iters", train.train_steps)
    add("--weight-decay", train.weight_decay)
    add("--adam-beta1", train.beta1)
    add("--adam-beta2", train.beta2)
    add("--adam-eps", train.eps)
    add("--clip-grad", train.grad_clip)
    add("--seed", train.seed)
    add("# checkpoints, logs and data: replace --mock-data with --data-path for real data")
    add("--save-interval", train.checkpoint_every_steps or train.train_steps)
    add("--log-interval", 10)
    add("--log-throughput")
    add("--mock-data")
    return out


def megatron_args_text(args: list[Arg]) -> str:
    """One `--flag value` (or `--flag`, or `# comment`) per line."""
    return "".join(f"{flag}\n" if value is None else f"{flag} {value}\n" for flag, value in args)


# --- OLMo FSDP ------------------------------------------------------------------------------------


def fsdp_wrapping(model: ModelSpec) -> str:
    """by_block (the seed's 7B config) unless the embedding outweighs a block; then by_block_and_size also
    wraps wte and ff_out on their own, so the root unit no longer holds the whole vocabulary table."""
    block = 4 * model.hidden_size * model.hidden_size + (3 if model.gated else 2) * model.hidden_size * model.ffn_hidden_size
    return "by_block_and_size" if model.vocab_size * model.hidden_size > block else "by_block"


def olmo_config(model: ModelSpec, plan: ParallelPlan, train: TrainSpec, run_name: str) -> dict:
    """An OLMo TrainConfig (KempnerInstitute/OLMo olmo/config.py names) for the plan or its FSDP equivalent."""
    plan, _ = equivalent_plan(plan, "fsdp")
    strategy = plan.fsdp_sharding_strategy
    affine = model.normalization != "nonparametric"
    fsdp: dict = {"wrapping_strategy": fsdp_wrapping(model), "precision": "mixed", "sharding_strategy": strategy}
    if strategy == "HYBRID_SHARD":
        fsdp["hybrid_sharding_num_model_replicas"] = plan.dp // plan.shard_group_size
    olmo_model = {
        "d_model": model.hidden_size, "n_heads": model.num_attention_heads, "n_layers": model.num_layers,
        # OLMo's mlp_hidden_size is ff_proj's output: both SwiGLU branches, 2 x megatron's ffn_hidden_size
        "mlp_hidden_size": model.ffn_hidden_size * (2 if model.gated else 1),
        "activation_type": model.activation, "block_type": "sequential", "weight_tying": model.tie_embeddings,
        "alibi": False, "rope": model.position_embedding == "rope", "flash_attention": plan.layer_spec == "te",
        "attention_dropout": model.attention_dropout, "attention_layer_norm": model.qk_layernorm,
        "include_bias": model.add_bias_linear, "layer_norm_type": "rms" if model.normalization == "rmsnorm" else "default",
        "layer_norm_with_affine": affine, "attention_layer_norm_with_affine": affine,
        "bias_for_layer_norm": model.norm_bias, "residual_dropout": model.hidden_dropout,
        "embedding_dropout": model.hidden_dropout, "max_sequence_length": plan.seq_length,
        "vocab_size": model.vocab_size, "embedding_size": -(-model.vocab_size // 128) * 128,
        "init_device": "meta" if strategy in ("FULL_SHARD", "HYBRID_SHARD", "SHARD_GRAD_OP") else "cuda",
        "init_fn": "mitchell",
    }
    if model.num_query_groups != model.num_attention_heads:
        olmo_model["n_kv_heads"] = model.num_query_groups
    config: dict = {
        "run_name": run_name, "seed": train.seed, "dry_run": False, "model": olmo_model,
        "optimizer": {"name": "adamw", "learning_rate": train.lr, "weight_decay": train.weight_decay,
                      "betas": [train.beta1, train.beta2], "eps": train.eps, "metrics_log_interval": 10},
        "scheduler": {"name": OLMO_SCHEDULERS[train.lr_decay], "units": "steps",
                      "t_warmup": min(train.warmup_steps, train.train_steps), "t_max": train.train_steps,
                      "alpha_f": train.min_lr / train.lr if train.lr else 0.0, "warmup_min_lr": 0.0},
        "max_duration": train.train_steps,
        # global 2048 = micro 2 x accumulation x world size (OLMo derives the accumulation itself)
        "global_train_batch_size": plan.gbs,
        "device_train_microbatch_size": plan.mbs,
        "precision": {"fp16": "amp_fp16", "fp32": "fp32"}.get(plan.precision, "amp_bf16"),
        "max_grad_norm": train.grad_clip or None, "max_grad_norm_ratio": None,
        "save_interval": train.checkpoint_every_steps or train.train_steps,
        "activation_checkpointing": "whole_layer" if plan.recompute != "none" else None,
        "distributed_strategy": "ddp" if strategy == "NO_SHARD" else "fsdp",
        "fsdp": fsdp,
        "speed_monitor": {"window_size": 20},
    }
    if strategy == "NO_SHARD":
        # The seed's OLMo 1B DDP config: gradients synchronised once per batch, every parameter used.
        config["ddp"] = {"grad_sync_mode": "batch", "find_unused_params": False}
    return config


# --- Slurm ----------------------------------------------------------------------------------------

_SLURM_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
SLURM_TIME = re.compile(r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+|\d+-\d+:\d{1,2}|\d+-\d+:\d{1,2}:\d{1,2}"
                         r"|UNLIMITED|INFINITE)$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_JOB_NAME_MAX = 128


def _printable(text: str) -> bool:
    return all(32 <= ord(c) != 127 for c in text)


def sbatch_job_name(name: str) -> str:
    """The job name as an #SBATCH token: every character outside [A-Za-z0-9._-] becomes '_'.
    #SBATCH lines are read by sbatch, not by a shell, so nothing there can run; sanitising keeps them plain."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)[:_JOB_NAME_MAX] or "genconf"


@dataclass(frozen=True, kw_only=True, slots=True)
class SlurmOptions:
    """What a launch script needs beyond the plan: Slurm accounting, paths on the cluster, the interpreter."""

    job_name: str
    """As given; the #SBATCH line carries sbatch_job_name(job_name), the script body the original, quoted."""
    run_dir: str
    """Absolute directory for logs (run_dir/logs) and checkpoints; the job's working directory."""
    artifacts_dir: str
    """Absolute directory holding plan.json and the configs (what `-o` names)."""
    launchers_dir: str
    """Absolute directory of genconf's training entry points (train_megatron.py, ...)."""
    python: str
    """Interpreter that starts torchrun on each node."""
    account: str | None = None
    partition: str | None = None
    time: str = "24:00:00"
    """Slurm time limit: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS."""
    master_port: int = 29500
    """Rendezvous port on the first node (MASTER_PORT in the environment overrides it)."""

    def __post_init__(self) -> None:
        if not self.job_name or not _printable(self.job_name):
            raise ValueError(f"--job-name must be non-empty printable text, got {self.job_name!r}")
        for flag, value in (("--account", self.account), ("--partition", self.partition)):
            if value is not None and not _SLURM_NAME.match(value):
                raise ValueError(f"{flag} {value!r} is not a Slurm name (letters, digits, '.', '_', '-')")
        if not SLURM_TIME.match(self.time):
            raise ValueError(f"--time {self.time!r} is not a Slurm time (minutes, HH:MM:SS or D-HH:MM:SS)")
        for flag, value in (("--run-dir", self.run_dir), ("--output", self.artifacts_dir),
                            ("launchers", self.launchers_dir), ("--python", self.python)):
            if not value.startswith("/") or not _printable(value) or "\\" in value:
                raise ValueError(f"{flag} must be an absolute path without control characters or backslashes, "
                                 f"got {value!r}")
        if not 1 <= self.master_port <= 65535:
            raise ValueError(f"master port must be in 1..65535, got {self.master_port}")


def slurm_layout(cluster: ClusterSpec, num_gpus: int) -> tuple[int, int]:
    """(nodes, GPUs per node) of the job: whole nodes, or part of one."""
    per_node = min(num_gpus, cluster.gpus_per_node)
    return max(1, num_gpus // per_node), per_node


def slurm_settings(cluster: ClusterSpec, plan: ParallelPlan, num_gpus: int, options: SlurmOptions) -> dict:
    """Every value a launch script renders, from the plan's world size, the cluster preset and the options."""
    if plan.world_size != num_gpus:
        raise ValueError(f"plan world size tp x pp x cp x dp = {plan.world_size} != {num_gpus} GPUs")
    nodes, per_node = slurm_layout(cluster, num_gpus)
    for name, _ in cluster.nccl_env:
        if not _ENV_NAME.match(name):
            raise ValueError(f"cluster {cluster.name}: {name!r} is not an environment variable name")
    megatron, _ = equivalent_plan(plan, "megatron")
    return {
        "nodes": nodes, "gpus_per_node": per_node, "ntasks_per_node": 1, "nproc_per_node": per_node,
        "world_size": nodes * per_node, "job_name": sbatch_job_name(options.job_name),
        "job_name_given": options.job_name, "account": options.account, "partition": options.partition,
        "time": options.time, "run_dir": options.run_dir, "log_dir": options.run_dir.rstrip("/") + "/logs",
        "artifacts": options.artifacts_dir, "launchers": options.launchers_dir, "python": options.python,
        "master_port": options.master_port, "nccl_env": list(cluster.nccl_env), "cluster_name": cluster.name,
        # Megatron-LM asserts CUDA_DEVICE_MAX_CONNECTIONS=1 with TP or CP before Blackwell (arguments.py).
        "megatron_max_connections": megatron.tp > 1 or megatron.cp > 1,
    }


def artifact_names(plan: ParallelPlan) -> tuple[str, ...]:
    """The files one plan renders to, plan.json first; launch_fsdp.sbatch only for FSDP plans."""
    names = ["plan.json", "ds_config.json", "megatron_args.txt", "olmo_fsdp.yaml", "launch_megatron.sbatch",
             "launch_deepspeed.sbatch"]
    if plan.framework == "fsdp":
        names.append("launch_fsdp.sbatch")
    return tuple(names + ["README.md"])
