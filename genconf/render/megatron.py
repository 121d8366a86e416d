"""megatron_args.txt: the plan (or its nearest Megatron equivalent) as Megatron-LM arguments, each flag checked
against Megatron-LM's arguments.py (MEGATRON_FLAGS); the same table types the flags genconf check reads back."""

from __future__ import annotations

from genconf.plan.counting import as_built_by_megatron
from genconf.plan.equivalent import equivalent_plan
from genconf.plan.pipeline import stage_layers
from genconf.plan.specs import ModelSpec, ParallelPlan, TrainSpec

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
