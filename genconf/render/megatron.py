"""megatron_args.txt: the plan (or its nearest Megatron equivalent) as Megatron-LM arguments, each flag checked
against Megatron-LM's arguments.py (MEGATRON_FLAGS); the same table types the flags genconf check reads back."""

from __future__ import annotations

import dataclasses

from genconf.plan.counting import as_built_by_megatron
from genconf.plan.equivalent import equivalent_plan
from genconf.plan.pipeline import layout_vp, stage_layers
from genconf.plan.precision import megatron_dtype, megatron_flags, megatron_fp8_recipe, megatron_plan_precision
from genconf.plan.specs import (CUDA_GRAPH_IMPLS, CUDA_GRAPH_SCOPES, RECOMPUTE_MODULES, ROUTER_DEFAULTS, ModelSpec,
                                 ParallelPlan, TrainSpec)

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
    "--pipeline-model-parallel-layout": (STR, ()),
    "--context-parallel-size": (INT, ()), "--expert-model-parallel-size": (INT, ()),
    "--expert-tensor-parallel-size": (INT, ()), "--sequence-parallel": (SWITCH, ()), "--tp-comm-overlap": (SWITCH, ()),
    "--overlap-moe-expert-parallel-comm": (SWITCH, ()), "--delay-wgrad-compute": (SWITCH, ()),
    "--cuda-graph-impl": (STR, CUDA_GRAPH_IMPLS), "--moe-pad-experts-for-cuda-graph-inference": (SWITCH, ()),
    # As Megatron-LM core_v0.16.1 (the release of genconf's megatron-core pin) takes it: nargs='+' of megatron-core's
    # CudaGraphScope names (MEGATRON_LM_SOURCE's own took one of full, attn or full_iteration).
    "--cuda-graph-scope": (LIST, CUDA_GRAPH_SCOPES),
    "--no-check-for-nan-in-loss-and-grad": (SWITCH, ()),
    "--use-distributed-optimizer": (SWITCH, ()), "--overlap-grad-reduce": (SWITCH, ()),
    "--overlap-param-gather": (SWITCH, ()), "--overlap-param-gather-with-optimizer-step": (SWITCH, ()),
    "--no-overlap-p2p-communication": (SWITCH, ()), "--distributed-backend": (STR, ("nccl", "gloo")),
    "--distributed-timeout-minutes": (INT, ()), "--ddp-bucket-size": (INT, ()),
    "--use-cpu-initialization": (SWITCH, ()), "--no-gradient-accumulation-fusion": (SWITCH, ()),
    "--use-megatron-fsdp": (SWITCH, ()),
    "--data-parallel-sharding-strategy": (STR, ("no_shard", "optim", "optim_grads", "optim_grads_params")),
    "--grad-reduce-in-bf16": (SWITCH, ()), "--use-precision-aware-optimizer": (SWITCH, ()),
    "--exp-avg-dtype": (STR, ("fp32", "fp16", "bf16", "fp8")), "--exp-avg-sq-dtype": (STR, ("fp32", "fp16", "bf16", "fp8")),
    "--cpu-offloading-num-layers": (INT, ()),
    # batch and sequence
    "--micro-batch-size": (INT, ()), "--global-batch-size": (INT, ()), "--seq-length": (INT, ()),
    "--max-position-embeddings": (INT, ()),
    # network size
    "--num-layers": (INT, ()), "--hidden-size": (INT, ()), "--ffn-hidden-size": (INT, ()),
    "--num-attention-heads": (INT, ()), "--kv-channels": (INT, ()), "--group-query-attention": (SWITCH, ()),
    "--num-query-groups": (INT, ()),
    "--position-embedding-type": (STR, ("learned_absolute", "rope", "mrope", "relative", "none")),
    "--rotary-base": (INT, ()), "--use-rope-scaling": (SWITCH, ()), "--rope-scaling-factor": (FLOAT, ()),
    "--rotary-percent": (FLOAT, ()),
    "--normalization": (STR, ("LayerNorm", "RMSNorm")), "--norm-epsilon": (FLOAT, ()),
    "--swiglu": (SWITCH, ()), "--squared-relu": (SWITCH, ()), "--disable-bias-linear": (SWITCH, ()), "--add-qkv-bias": (SWITCH, ()),
    "--untie-embeddings-and-output-weights": (SWITCH, ()), "--qk-layernorm": (SWITCH, ()),
    "--hidden-dropout": (FLOAT, ()), "--attention-dropout": (FLOAT, ()),
    "--make-vocab-size-divisible-by": (INT, ()),
    "--attention-backend": (STR, ("flash", "fused", "unfused", "local", "auto")), "--use-flash-attn": (SWITCH, ()),
    "--window-size": (STR, ()), "--window-attn-skip-freq": (INT, ()),
    # hybrid Mamba models (Megatron-LM core_v0.16.1 arguments.py: --spec, --hybrid-override-pattern; the --is-hybrid-model
    # and --mamba-* flags are generated from TransformerConfig's fields)
    "--spec": (LIST, ()), "--hybrid-override-pattern": (STR, ()), "--is-hybrid-model": (SWITCH, ()),
    # latent MoE (core_v0.16.1 arguments.py: ArgumentGroupFactory(TransformerConfig) makes --moe-latent-size; its
    # checks at line 1269) and hybrid / repeated MTP blocks (core_v0.17.1: TransformerConfig mtp_use_repeated_layer,
    # mtp_hybrid_override_pattern, deprecated there in favour of --hybrid-layer-pattern suffixes but accepted)
    "--moe-latent-size": (INT, ()), "--mtp-hybrid-override-pattern": (STR, ()), "--mtp-use-repeated-layer": (SWITCH, ()),
    "--mamba-state-dim": (INT, ()), "--mamba-head-dim": (INT, ()), "--mamba-num-groups": (INT, ()),
    "--mamba-num-heads": (INT, ()),
    # mixture of experts
    "--num-experts": (INT, ()), "--moe-router-topk": (INT, ()), "--moe-ffn-hidden-size": (INT, ()),
    "--moe-grouped-gemm": (SWITCH, ()),
    "--moe-shared-expert-intermediate-size": (INT, ()), "--moe-layer-freq": (STR, ()), "--mtp-num-layers": (INT, ()),
    # core_v0.16.1 arguments.py: ArgumentGroupFactory(TransformerConfig) makes it from moe_shared_expert_gate
    "--moe-shared-expert-gate": (SWITCH, ()),
    # multi-head latent attention
    "--multi-latent-attention": (SWITCH, ()), "--q-lora-rank": (INT, ()), "--kv-lora-rank": (INT, ()),
    "--qk-head-dim": (INT, ()), "--qk-pos-emb-head-dim": (INT, ()), "--v-head-dim": (INT, ()),
    "--moe-token-dispatcher-type": (STR, ("allgather", "alltoall", "flex")), "--moe-aux-loss-coeff": (FLOAT, ()),
    "--moe-flex-dispatcher-backend": (STR, ("deepep", "hybridep")),
    "--moe-router-load-balancing-type": (STR, ("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none")),
    "--moe-router-score-function": (STR, ("softmax", "sigmoid")), "--moe-router-pre-softmax": (SWITCH, ()),
    "--moe-router-enable-expert-bias": (SWITCH, ()), "--moe-router-topk-scaling-factor": (FLOAT, ()),
    "--moe-router-num-groups": (INT, ()), "--moe-router-group-topk": (INT, ()),
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
    "--recompute-num-layers": (INT, ()), "--recompute-modules": (LIST, RECOMPUTE_MODULES),
    "--bf16": (SWITCH, ()), "--fp16": (SWITCH, ()), "--loss-scale": (FLOAT, ()), "--initial-loss-scale": (FLOAT, ()),
    "--min-loss-scale": (FLOAT, ()), "--loss-scale-window": (FLOAT, ()), "--hysteresis": (INT, ()),
    "--fp8-format": (STR, ("e4m3", "hybrid")),
    "--fp8-recipe": (STR, ("tensorwise", "delayed", "mxfp8", "blockwise", "custom")),
    "--first-last-layers-bf16": (SWITCH, ()), "--num-layers-at-start-in-bf16": (INT, ()),
    "--num-layers-at-end-in-bf16": (INT, ()), "--fp8-param-gather": (SWITCH, ()),
    "--fp4-format": (STR, ("e2m1",)), "--fp4-recipe": (STR, ("nvfp4", "custom")), "--fp4-param-gather": (SWITCH, ()),
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



Arg = tuple[str, "str | None"]


ROTARY_BASE_DEFAULT = 10000
"""Megatron-LM's --rotary-base when the flag is absent (MEGATRON_LM_SOURCE; an int), RoFormer's base."""
ROPE_SCALING_FACTOR_DEFAULT = 8.0
"""Megatron-LM's --rope-scaling-factor when the flag is absent (MEGATRON_LM_SOURCE), Llama 3.1's factor."""
ROTARY_PERCENT_DEFAULT = 1.0
"""Megatron-LM's --rotary-percent when the flag is absent (MEGATRON_LM_SOURCE): every dimension rotated."""
MLA_ROPE_DEFAULTS = {"rotary_scaling_factor": 1.0, "mscale": 1.0, "mscale_all_dim": 0.0}
"""Megatron-LM core_v0.16.1's --rotary-scaling-factor, --mscale and --mscale-all-dim when absent (arguments.py
_add_mla_args), which core_transformer_config_from_args copies into MLATransformerConfig. Without --rope-type it keeps
MLATransformerConfig's rope_type, "yarn": YaRN at scaling factor 1 rotates as plain RoPE (inv_freq_inter equals
inv_freq_extra, mscale 1), what genconf's files say (they write no YaRN settings)."""

MAMBA_FIELDS = ("mamba_state_dim", "mamba_head_dim", "mamba_num_groups", "mamba_num_heads")
"""TransformerConfig's Mamba fields, each a --mamba-* flag; ModelSpec names them alike, with megatron-core's defaults."""


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
    if plan.pp_layout is not None:
        # arguments.py derives vp from the layout and refuses --num-virtual-stages-per-pipeline-rank beside it.
        add("--pipeline-model-parallel-layout", plan.pp_layout)
    elif plan.vp > 1:
        # The virtual size (not layers per virtual stage): Megatron-LM requires it with uneven pipelines.
        add("--num-virtual-stages-per-pipeline-rank", plan.vp)
    if plan.vp > 1:
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
    if plan.etp is not None:
        add("--expert-tensor-parallel-size", plan.etp)
    if plan.sequence_parallel:
        add("--sequence-parallel")
    if plan.tp_comm_overlap:
        add("--tp-comm-overlap")
    if plan.distributed_optimizer:
        add("--use-distributed-optimizer")
    if plan.megatron_fsdp:
        # Megatron-FSDP (zero 2: optimizer + gradients sharded, zero 3: + parameters); arguments.py requires the
        # fsdp_dtensor checkpoint format and CUDA_DEVICE_MAX_CONNECTIONS != 1 (the launch script leaves it unset).
        add("--use-megatron-fsdp")
        add("--data-parallel-sharding-strategy", "optim_grads_params" if plan.zero_stage == 3 else "optim_grads")
        add("--ckpt-format", "fsdp_dtensor")
    if plan.precision_aware_optimizer:
        add("# precision-aware optimizer (TE FusedAdam): fp32 master weights kept as 16-bit remainders"
            if plan.optimizer_keeps_remainders else
            f"# precision-aware optimizer (TE FusedAdam); under FP8 {plan.quant_recipe} scaling megatron-core keeps "
            f"the fp32 master weights itself")
        add("--use-precision-aware-optimizer")
        if plan.adam_moments_dtype == "bf16":
            add("--exp-avg-dtype", "bf16")
            add("--exp-avg-sq-dtype", "bf16")
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
    if model.is_hybrid:
        add("# hybrid Mamba-2 model: train with Megatron-LM's pretrain_mamba.py (needs mamba_ssm and causal-conv1d);")
        add("# one pattern symbol per layer: M Mamba-2, * attention, - MLP, E MoE")
        add("--spec", "megatron.core.models.mamba.mamba_layer_specs mamba_stack_spec")
        add("--is-hybrid-model")
        add("--hybrid-override-pattern", model.hybrid_pattern)
        for name in MAMBA_FIELDS:
            add("--" + name.replace("_", "-"), getattr(model, name))
    add("--num-layers", model.num_layers)
    add("--hidden-size", model.hidden_size)
    add("--ffn-hidden-size", model.ffn_hidden_size)
    add("--num-attention-heads", model.num_attention_heads)
    if model.mla:
        add("# multi-head latent attention (DeepSeek-V2/V3): keys and values from a low-rank latent")
        add("--multi-latent-attention")
        if model.q_lora_rank is not None:
            add("--q-lora-rank", model.q_lora_rank)
        add("--kv-lora-rank", model.kv_lora_rank)
        add("--qk-head-dim", model.qk_head_dim)
        add("--qk-pos-emb-head-dim", model.qk_pos_emb_head_dim)
        add("--v-head-dim", model.v_head_dim)
    elif model.kv_channels * model.num_attention_heads != model.hidden_size:
        add("--kv-channels", model.kv_channels)
    if model.grouped_query:
        add("--group-query-attention")
        add("--num-query-groups", model.num_query_groups)
    add("--position-embedding-type", {"rope": "rope", "none": "none"}.get(model.position_embedding, "learned_absolute"))
    if model.position_embedding == "rope":
        # Megatron-LM's default base is 10,000 (arguments.py, an int); Llama 3 trains at 500,000, Qwen at 1,000,000.
        add("--rotary-base", round(model.rope_theta))
        if model.rotary_percent != ROTARY_PERCENT_DEFAULT:
            add("--rotary-percent", model.rotary_percent)  # the first int(d x share) dimensions of each head
        if model.rope_scaling_factor:
            add("--use-rope-scaling")  # Llama 3.1's frequency scaling (megatron-core apply_rope_scaling)
            if model.rope_scaling_factor != ROPE_SCALING_FACTOR_DEFAULT:
                # Megatron-LM core_v0.16.1's gpt_builders.py passes rope_scaling but not the factor to GPTModel,
                # whose default (8.0) then rotates; genconf's own launcher builds the factor.
                add(f"# Megatron-LM core_v0.16.1's pretrain_gpt.py rotates at its default factor "
                    f"{ROPE_SCALING_FACTOR_DEFAULT:g} whatever this flag says (gpt_builders.py does not pass it on)")
            add("--rope-scaling-factor", model.rope_scaling_factor)
    if model.normalization == "nonparametric":
        add("# OLMo-1's non-parametric LayerNorm has no Megatron switch: LayerNorm (with weight) is the nearest")
    add("--normalization", "RMSNorm" if model.normalization == "rmsnorm" else "LayerNorm")
    if model.gated:
        add("--swiglu")
    if model.activation == "squared_relu":
        add("--squared-relu")
    if not model.add_bias_linear:
        add("--disable-bias-linear")
        if model.add_qkv_bias:
            add("--add-qkv-bias")
    if not model.tie_embeddings:
        add("--untie-embeddings-and-output-weights")
    if model.qk_layernorm:
        add("--qk-layernorm")
    elif model.mla:
        # megatron-core's MLA RMS-normalises its query and key-value latents under this switch (gpt_layer_specs:
        # q_layernorm and kv_layernorm), as DeepSeek-V3 does; without it they are identities (and uncounted)
        add("--qk-layernorm")
    add("--hidden-dropout", model.hidden_dropout)
    add("--attention-dropout", model.attention_dropout)
    if model.sliding_window:
        add(f"# sliding-window attention: {model.window_text}" + (
            f" (layers {model.window_attn_skip_freq}, {2 * model.window_attn_skip_freq}, ... full)"
            if model.window_attn_skip_freq else ""))
        add("--window-size", f"{model.sliding_window},0")
        if model.window_attn_skip_freq:
            add("--window-attn-skip-freq", model.window_attn_skip_freq)
    if model.is_moe:
        add("--num-experts", model.num_experts)
        add("--moe-router-topk", model.moe_top_k)
        add("--moe-ffn-hidden-size", model.moe_ffn_hidden_size)
        if model.moe_shared_expert_intermediate_size:
            add("--moe-shared-expert-intermediate-size", model.moe_shared_expert_intermediate_size)
            if model.moe_shared_expert_gate:
                add("--moe-shared-expert-gate")  # sigmoid gate on the shared experts (Qwen2-MoE)
        if model.moe_latent_size:
            add("# latent MoE: tokens projected to this width before dispatch and back after combine")
            add("--moe-latent-size", model.moe_latent_size)
        if model.first_k_dense_replace:
            add(f"# the first {model.first_k_dense_replace} layer(s) dense (MLP of --ffn-hidden-size), the rest MoE")
            add("--moe-layer-freq", f"([0]*{model.first_k_dense_replace}+[1]*{model.moe_layers})")
        elif model.moe_layer_interval > 1:
            n = model.moe_layer_interval
            add(f"# one MoE layer in every {n}, layers {n - 1}, {2 * n - 1}, ... (from 0); the others dense (MLP of "
                f"--ffn-hidden-size)")
            add("--moe-layer-freq", interleaved_freq(n, model.num_layers))
        if model.moe_router_load_balancing != "aux_loss":  # Megatron-LM's default
            add("--moe-router-load-balancing-type", model.moe_router_load_balancing)
        if model.moe_router_load_balancing != "none":
            add("--moe-aux-loss-coeff", model.moe_aux_loss_coeff)
        if model.moe_router_score_function != "softmax":
            add("--moe-router-score-function", model.moe_router_score_function)
        if model.moe_router_pre_softmax and model.moe_router_score_function == "softmax":
            add("--moe-router-pre-softmax")  # a softmax over every expert, the top k's weights not renormalised
        if model.moe_router_expert_bias:
            add("--moe-router-enable-expert-bias")  # aux-loss-free balancing (DeepSeek-V3)
        if model.moe_router_topk_scaling_factor:
            add("--moe-router-topk-scaling-factor", model.moe_router_topk_scaling_factor)
        if model.moe_router_num_groups:
            add("--moe-router-num-groups", model.moe_router_num_groups)
            add("--moe-router-group-topk", model.moe_router_group_topk)
        if plan.layer_spec == "te":
            # What the plan priced: TE's grouped GEMM over the rank's experts (megatron-core's default builds one
            # GEMM per expert, SequentialMLP; Megatron-Bridge's MoE recipes set moe_grouped_gemm).
            add("--moe-grouped-gemm")
        if plan.ep > 1 and plan.moe_dispatcher != "alltoall":
            add(f"# megatron's flex token dispatcher with the {plan.moe_dispatcher} backend "
                f"(needs {'DeepEP' if plan.moe_dispatcher == 'deepep' else 'HybridEP'} installed)")
            add("--moe-token-dispatcher-type", "flex")
            add("--moe-flex-dispatcher-backend", plan.moe_dispatcher)
        elif plan.ep > 1:
            add("--moe-token-dispatcher-type", "alltoall")  # recommended with expert parallelism (arguments.py)
        if plan.moe_ep_overlap:
            add("# EP all-to-all beside another micro-batch's compute (combined 1F1B), expert weight gradients")
            add("# deferred to overlap it (Megatron-Bridge's moe_a2a_overlap sets both)")
            add("--overlap-moe-expert-parallel-comm")
            add("--delay-wgrad-compute")
    if model.mtp_num_layers:
        add("--mtp-num-layers", model.mtp_num_layers)
        if model.is_hybrid or model.mtp_repeated_layer:
            add("# needs megatron-core 0.17+ (its arguments.py; 0.16.1 has neither flag and no MTP in MambaModel):")
            add("# one multi-token-prediction block run at every depth, built from a hybrid pattern")
        if model.is_hybrid:
            add("--mtp-hybrid-override-pattern", model.mtp_pattern)
        if model.mtp_repeated_layer:
            add("--mtp-use-repeated-layer")
    add("# NullTokenizer adds one end-of-document id to --vocab-size: V - 1 gives the model's V rows,")
    add("# which Megatron then pads to a multiple of 128 x tp (the memory model's count)")
    add("--tokenizer-type", "NullTokenizer")
    add("--vocab-size", model.vocab_size - 1)
    add("--make-vocab-size-divisible-by", 128)
    add("--transformer-impl", "transformer_engine" if plan.layer_spec == "te" else "local")
    # (The framework aside: for a DeepSpeed/FSDP plan this file is its nearest Megatron equivalent.)
    if plan.megatron_fuses_wgrad:
        add("# weight gradients accumulate inside their GEMMs (Megatron-LM's default), which needs apex's")
        add("# fused_weight_gradient_mlp_cuda as NVIDIA's PyTorch containers have it; without apex, plan with")
        add("# --no-gradient-accumulation-fusion (it adds a pass over the gradients) and pass that flag here")
    else:
        if plan.layer_spec == "local" and not plan.fused_kernels:
            add("# the local spec fuses weight-gradient accumulation only with apex's fused_weight_gradient_mlp_cuda")
        add("--no-gradient-accumulation-fusion")
    if plan.recompute == "selective":
        add("--recompute-granularity", "selective")
        if plan.recompute_modules:
            add("--recompute-modules", " ".join(plan.recompute_modules))
    elif plan.recompute == "full" and plan.recompute_layers is not None:
        add(f"# block recompute: the first {plan.recompute_layers} layers of each model chunk keep only their input")
        add("--recompute-granularity", "full")
        add("--recompute-method", "block")
        add("--recompute-num-layers", plan.recompute_layers)
    elif plan.recompute == "full":
        add("--recompute-granularity", "full")
        add("--recompute-method", "uniform")
        add("--recompute-num-layers", 1)
    if plan.cuda_graph_impl != "none":
        scope = " ".join(plan.cuda_graph_scope) or "the whole layer"
        add(f"# CUDA graphs ({plan.cuda_graph_impl}) replay {scope} without the host's kernel launches")
        if plan.moe_ep_overlap and plan.cuda_graph_impl == "transformer_engine":
            add("# with --delay-wgrad-compute, TE's graphs need Transformer Engine 2.10 or later (megatron-core asserts it)")
        add("--cuda-graph-impl", plan.cuda_graph_impl)
        if plan.cuda_graph_scope:
            add("--cuda-graph-scope", " ".join(plan.cuda_graph_scope))
        if "full_iteration" in plan.cuda_graph_scope:
            add("# the step's graph cannot stop on a NaN check (Megatron-LM arguments.py asserts it off)")
            add("--no-check-for-nan-in-loss-and-grad")
        if plan.cuda_graph_impl == "local" and plan.ep > 1:
            add("# Megatron-LM core_v0.16.1 asserts it with local graphs and expert parallelism (it pads inference only)")
            add("--moe-pad-experts-for-cuda-graph-inference")
    if plan.offload_activation_layers:
        add("# Transformer Engine CPU offload of these layers' activations (arguments.py sets --cpu-offloading)")
        add("--cpu-offloading-num-layers", plan.offload_activation_layers)
    add(f"# precision: {plan.precision}")
    for flag, value in megatron_flags(plan.precision, plan.fp8_recipe or train.fp8_recipe, plan.bf16_edge_layers,
                                      param_gather=plan.fp8_param_gather):
        add(flag, value)
        if flag == "--bf16" and plan.grad_dtype == "bf16":
            # Megatron-LM accumulates and reduces bf16 gradients in fp32 main_grad buffers unless told otherwise.
            add("# gradients accumulated and reduced in bf16 (half the buffer and the DP traffic)")
            add("--grad-reduce-in-bf16")
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


# --- read back: typed values, TransformerConfig kwargs, the plan they describe ---------------------

def typed_value(flag: str, words: list[str]) -> object:
    """The value of `flag` from the words after it, typed by MEGATRON_FLAGS: True for a switch, int, float, str or
    a list of str; ValueError when a number does not parse."""
    kind = MEGATRON_FLAGS[flag][0]
    if kind == SWITCH:
        return True
    if kind == LIST:
        return list(words)
    if kind == INT:
        return int(words[0])
    if kind == FLOAT:
        return float(words[0])
    return words[0]


def arg_values(args: list[Arg]) -> dict[str, object]:
    """flag -> typed value of an argument list (comment lines skipped), as Megatron-LM would read its text."""
    return {flag: typed_value(flag, [] if value is None else value.split())
            for flag, value in args if not flag.startswith("#")}


def megatron_vp(values: dict[str, object]) -> int:
    """Virtual pipeline size the way arguments.py derives it (1 = no interleaving)."""
    if "--num-virtual-stages-per-pipeline-rank" in values:
        return int(values.get("--num-virtual-stages-per-pipeline-rank"))
    if values.get("--pipeline-model-parallel-layout"):
        return layout_vp(str(values["--pipeline-model-parallel-layout"]), int(values.get("--pipeline-model-parallel-size", 1)))
    per_stage = values.get("--num-layers-per-virtual-pipeline-stage")
    if per_stage:
        layers = int(values.get("--num-layers", 0)) + int("--account-for-embedding-in-pipeline-split" in values) \
            + int("--account-for-loss-in-pipeline-split" in values)
        pp = int(values.get("--pipeline-model-parallel-size", 1))
        if pp and layers % pp == 0 and (layers // pp) % per_stage == 0:
            return (layers // pp) // per_stage
    return 1


def _window(text: object) -> tuple[int, int] | None:
    """--window-size "w,0" as megatron-core's (left, right) tuple."""
    if not text:
        return None
    left, right = (int(x) for x in str(text).strip("()\"' ").split(","))
    return left, right


def megatron_config_kwargs(values: dict[str, object]) -> dict:
    """megatron-core TransformerConfig keyword arguments for parsed Megatron-LM arguments, the way
    Megatron-LM's core_transformer_config_from_args builds them (MEGATRON_LM_SOURCE). Pure values: dtypes are
    names ('bfloat16', 'float16', 'float32') and activation_func is 'silu', 'gelu' or 'squared_relu' for the caller to
    map."""
    heads, hidden = int(values.get("--num-attention-heads")), int(values.get("--hidden-size"))
    swiglu = "--swiglu" in values
    dtype = megatron_dtype(values)
    vp = megatron_vp(values)
    overlap_p2p = vp > 1 and "--no-overlap-p2p-communication" not in values  # arguments.py: off without interleaving
    ffn = values.get("--ffn-hidden-size") or (int((4 * hidden * 2 / 3) / 64) * 64 if swiglu else 4 * hidden)
    kw = {
        "num_layers": values.get("--num-layers"), "hidden_size": hidden, "num_attention_heads": heads,
        "ffn_hidden_size": ffn, "kv_channels": values.get("--kv-channels") or hidden // heads,
        "num_query_groups": values.get("--num-query-groups", 1) if "--group-query-attention" in values else None,
        "hidden_dropout": values.get("--hidden-dropout", 0.1), "attention_dropout": values.get("--attention-dropout", 0.1),
        "add_bias_linear": "--disable-bias-linear" not in values, "add_qkv_bias": "--add-qkv-bias" in values,
        "gated_linear_unit": swiglu,
        "activation_func": "silu" if swiglu else "squared_relu" if "--squared-relu" in values else "gelu",
        "normalization": values.get("--normalization", "LayerNorm"),
        "layernorm_epsilon": values.get("--norm-epsilon", 1e-5), "qk_layernorm": "--qk-layernorm" in values,
        "init_method_std": values.get("--init-method-std", 0.02),
        "tensor_model_parallel_size": values.get("--tensor-model-parallel-size", 1),
        "pipeline_model_parallel_size": values.get("--pipeline-model-parallel-size", 1),
        "virtual_pipeline_model_parallel_size": vp if vp > 1 else None,
        "context_parallel_size": values.get("--context-parallel-size", 1),
        "expert_model_parallel_size": values.get("--expert-model-parallel-size", 1),
        "sequence_parallel": "--sequence-parallel" in values and values.get("--tensor-model-parallel-size", 1) > 1,
        "tp_comm_overlap": "--tp-comm-overlap" in values,
        "num_layers_in_first_pipeline_stage": values.get("--decoder-first-pipeline-num-layers"),
        "num_layers_in_last_pipeline_stage": values.get("--decoder-last-pipeline-num-layers"),
        "account_for_embedding_in_pipeline_split": "--account-for-embedding-in-pipeline-split" in values,
        "account_for_loss_in_pipeline_split": "--account-for-loss-in-pipeline-split" in values,
        "pipeline_model_parallel_layout": values.get("--pipeline-model-parallel-layout"),
        "overlap_p2p_comm": overlap_p2p, "batch_p2p_comm": not overlap_p2p, "deallocate_pipeline_outputs": True,
        # Megatron-LM's default (--no-gradient-accumulation-fusion turns it off); megatron-core's own is False.
        "gradient_accumulation_fusion": "--no-gradient-accumulation-fusion" not in values,
        "recompute_granularity": values.get("--recompute-granularity"),
        "recompute_method": values.get("--recompute-method"),
        "recompute_num_layers": values.get("--recompute-num-layers"),
        **({"recompute_modules": list(values["--recompute-modules"])} if values.get("--recompute-modules") else {}),
        "fp16": "--fp16" in values, "bf16": "--bf16" in values, "params_dtype": dtype, "pipeline_dtype": dtype,
        "fp8": values.get("--fp8-format"), "fp8_recipe": values.get("--fp8-recipe", "delayed"),
        "first_last_layers_bf16": "--first-last-layers-bf16" in values,
        "num_layers_at_start_in_bf16": values.get("--num-layers-at-start-in-bf16", 1),
        "num_layers_at_end_in_bf16": values.get("--num-layers-at-end-in-bf16", 1),
    }
    # Set only when given: megatron-core versions without them keep their defaults.
    optional = {"fp8_param": "--fp8-param-gather" in values, "fp4": values.get("--fp4-format"),
                "fp4_recipe": values.get("--fp4-recipe") if "--fp4-format" in values else None,
                "fp4_param": "--fp4-param-gather" in values,
                "cpu_offloading": values.get("--cpu-offloading-num-layers", 0) > 0,
                "cpu_offloading_num_layers": values.get("--cpu-offloading-num-layers"),
                "expert_tensor_parallel_size": values.get("--expert-tensor-parallel-size"),
                "window_size": _window(values.get("--window-size")),
                "window_attn_skip_freq": values.get("--window-attn-skip-freq"),
                # megatron-core checks a pipeline layout's 'm' against it (validate_layer_layout)
                "mtp_num_layers": values.get("--mtp-num-layers")}
    kw.update({k: v for k, v in optional.items() if v})
    if "--is-hybrid-model" in values:
        kw.update(is_hybrid_model=True, **_mamba_values(values))
    if "--multi-latent-attention" in values:
        # core_transformer_config_from_args: MLATransformerConfig, its fields from the same-named arguments (an absent
        # --q-lora-rank is None: queries projected straight from the hidden state) and the RoPE the config rotates.
        kw.update(multi_latent_attention=True, q_lora_rank=values.get("--q-lora-rank"),
                  kv_lora_rank=values["--kv-lora-rank"], qk_head_dim=values["--qk-head-dim"],
                  qk_pos_emb_head_dim=values["--qk-pos-emb-head-dim"], v_head_dim=values["--v-head-dim"],
                  rotary_base=values.get("--rotary-base", ROTARY_BASE_DEFAULT),
                  rotary_percent=values.get("--rotary-percent", ROTARY_PERCENT_DEFAULT), **MLA_ROPE_DEFAULTS)
    if "--num-experts" in values:
        kw.update(num_moe_experts=values.get("--num-experts"), moe_router_topk=values.get("--moe-router-topk", 2),
                  moe_grouped_gemm="--moe-grouped-gemm" in values,
                  moe_ffn_hidden_size=values.get("--moe-ffn-hidden-size") or ffn,
                  moe_aux_loss_coeff=values.get("--moe-aux-loss-coeff", 0.0),
                  moe_router_load_balancing_type=values.get("--moe-router-load-balancing-type", "aux_loss"),
                  moe_router_score_function=values.get("--moe-router-score-function", "softmax"),
                  moe_router_pre_softmax="--moe-router-pre-softmax" in values,
                  moe_router_enable_expert_bias="--moe-router-enable-expert-bias" in values,
                  moe_router_topk_scaling_factor=values.get("--moe-router-topk-scaling-factor"),
                  moe_router_num_groups=values.get("--moe-router-num-groups"),
                  moe_router_group_topk=values.get("--moe-router-group-topk"),
                  moe_token_dispatcher_type=values.get("--moe-token-dispatcher-type", "allgather"))
        if "--moe-flex-dispatcher-backend" in values:
            kw.update(moe_flex_dispatcher_backend=values["--moe-flex-dispatcher-backend"])
        if values.get("--moe-layer-freq"):
            kw.update(moe_layer_freq=moe_layer_pattern(values["--moe-layer-freq"], int(values["--num-layers"])))
        if values.get("--moe-latent-size"):
            kw.update(moe_latent_size=values["--moe-latent-size"])
        if values.get("--moe-shared-expert-intermediate-size"):
            kw.update(moe_shared_expert_intermediate_size=values["--moe-shared-expert-intermediate-size"])
            if "--moe-shared-expert-gate" in values:
                kw.update(moe_shared_expert_gate=True)
        if "--overlap-moe-expert-parallel-comm" in values:
            kw.update(overlap_moe_expert_parallel_comm=True, delay_wgrad_compute="--delay-wgrad-compute" in values)
    if values.get("--cuda-graph-impl", "none") != "none":
        kw.update(cuda_graph_impl=values["--cuda-graph-impl"], cuda_graph_scope=list(values.get("--cuda-graph-scope", [])))
    return kw


def config_kwargs(model: ModelSpec, plan: ParallelPlan, train: TrainSpec) -> dict:
    """TransformerConfig keyword arguments of the plan: exactly what megatron_args_text says, read as Megatron-LM
    reads it (the megatron runner builds its model from these)."""
    return megatron_config_kwargs(arg_values(megatron_args(model, plan, train)))


def interleaved_freq(interval: int, num_layers: int) -> str:
    """--moe-layer-freq for one MoE layer in every `interval`, the last of each run: '([0]*(n-1)+[1])*(L/n)', written
    '([0,1]*24)' for Llama 4 Maverick's interval 2 as NeMo's Llama4Experts128Config writes its list."""
    runs = num_layers // interval
    if interval == 2:
        return f"([0,1]*{runs})"
    return f"([0]*{interval - 1}+[1])*{runs}"


def moe_layer_pattern(freq: object, num_layers: int) -> list[int]:
    """--moe-layer-freq as genconf writes it, '([0]*k+[1]*n)' or interleaved_freq's, as the list Megatron-LM's
    moe_freq_type evaluates it to (arguments.py: 0 a dense layer, 1 an MoE layer, one per layer); ValueError for any
    other text."""
    dense = _leading_dense(freq)
    if dense and str(freq).replace(" ", "").endswith(f"[1]*{num_layers - dense})"):
        return [0] * dense + [1] * (num_layers - dense)
    interval = _interleave(freq, num_layers)
    if interval:
        return [1 if i % interval == interval - 1 else 0 for i in range(num_layers)]
    raise ValueError(f"--moe-layer-freq {freq}: genconf writes ([0]*k+[1]*n) with k + n = --num-layers "
                     f"({num_layers}), or ([0]*(i-1)+[1])*(n/i) (([0,1]*n/2) for i = 2) with n = --num-layers")


def _leading_dense(freq: object) -> int:
    """Leading dense layers of a --moe-layer-freq pattern as genconf writes it, '([0]*k+[1]*n)'; 0 otherwise."""
    import re

    match = re.fullmatch(r"\(\[0\]\*(\d+)\+\[1\]\*\d+\)", str(freq or "").replace(" ", ""))
    return int(match.group(1)) if match else 0


def _interleave(freq: object, num_layers: int) -> int:
    """The MoE interval n of a --moe-layer-freq pattern as interleaved_freq writes it for `num_layers` layers; 0 for
    any other text (a pattern of another length too)."""
    import re

    text = str(freq or "").replace(" ", "")
    match = re.fullmatch(r"\(\[0,1\]\*(\d+)\)", text)
    if match and 2 * int(match.group(1)) == num_layers:
        return 2
    match = re.fullmatch(r"\(\[0\]\*(\d+)\+\[1\]\)\*(\d+)", text)
    if match and (int(match.group(1)) + 1) * int(match.group(2)) == num_layers:
        return int(match.group(1)) + 1
    return 0


def _router_fields(values: dict[str, object], experts: int) -> dict:
    """ModelSpec's router fields as the arguments give them (Megatron-LM's defaults where a flag is absent)."""
    if not experts:
        return dict(ROUTER_DEFAULTS)
    g = lambda flag: values.get(flag)  # noqa: E731
    return dict(moe_router_score_function=str(g("--moe-router-score-function") or "softmax"),
                moe_router_pre_softmax="--moe-router-pre-softmax" in values,
                moe_router_expert_bias="--moe-router-enable-expert-bias" in values,
                moe_router_topk_scaling_factor=(float(g("--moe-router-topk-scaling-factor"))
                                                if g("--moe-router-topk-scaling-factor") is not None else None),
                moe_router_num_groups=int(g("--moe-router-num-groups")) if g("--moe-router-num-groups") else None,
                moe_router_group_topk=int(g("--moe-router-group-topk")) if g("--moe-router-group-topk") else None,
                moe_router_load_balancing=str(g("--moe-router-load-balancing-type") or "aux_loss"),
                moe_aux_loss_coeff=float(g("--moe-aux-loss-coeff") or 0.0))


def _mla_fields(values: dict[str, object], model: ModelSpec) -> dict:
    if "--multi-latent-attention" not in values:
        return dict(kv_lora_rank=None, q_lora_rank=None, qk_head_dim=None, qk_pos_emb_head_dim=None, v_head_dim=None)
    g = lambda flag: int(values[flag]) if values.get(flag) is not None else None  # noqa: E731
    return dict(kv_lora_rank=g("--kv-lora-rank"), q_lora_rank=g("--q-lora-rank"), qk_head_dim=g("--qk-head-dim"),
                qk_pos_emb_head_dim=g("--qk-pos-emb-head-dim"), v_head_dim=g("--v-head-dim"))


def _mamba_values(values: dict[str, object]) -> dict:
    """The Mamba fields the arguments give, the rest at megatron-core's defaults (ModelSpec's; heads None: 2 h / P)."""
    defaults = {f.name: f.default for f in dataclasses.fields(ModelSpec) if f.name in MAMBA_FIELDS}
    flags = {name: "--" + name.replace("_", "-") for name in MAMBA_FIELDS}
    return {name: int(values[flags[name]]) if values.get(flags[name]) is not None else defaults[name]
            for name in MAMBA_FIELDS}


def _hybrid_fields(values: dict[str, object], model: ModelSpec) -> dict:
    if "--hybrid-override-pattern" not in values:
        return dict(hybrid_pattern="")
    return dict(hybrid_pattern=str(values["--hybrid-override-pattern"]), **_mamba_values(values))


def megatron_plan(values: dict[str, object], model: ModelSpec, num_gpus: int) -> tuple[ModelSpec, ParallelPlan]:
    """The model and ParallelPlan a set of Megatron arguments describes (ValueError if there is none)."""
    g = lambda flag, default=None: values.get(flag, default)  # noqa: E731
    heads = int(g("--num-attention-heads"))
    experts = int(g("--num-experts", 0) or 0)
    new_model = dataclasses.replace(
        model, num_layers=int(g("--num-layers")), hidden_size=int(g("--hidden-size")), num_attention_heads=heads,
        num_query_groups=int(g("--num-query-groups", 1)) if "--group-query-attention" in values else heads,
        ffn_hidden_size=int(g("--ffn-hidden-size", model.ffn_hidden_size)),
        kv_channels=int(g("--kv-channels", 0) or int(g("--hidden-size")) // heads),
        num_experts=experts, moe_top_k=int(g("--moe-router-topk", 2)) if experts else 0,
        **_router_fields(values, experts),
        moe_ffn_hidden_size=int(g("--moe-ffn-hidden-size", 0) or g("--ffn-hidden-size", model.ffn_hidden_size)),
        moe_shared_expert_intermediate_size=int(g("--moe-shared-expert-intermediate-size")) if experts and g(
            "--moe-shared-expert-intermediate-size") else None,
        moe_shared_expert_gate=bool(experts and g("--moe-shared-expert-intermediate-size"))
        and "--moe-shared-expert-gate" in values,
        first_k_dense_replace=_leading_dense(g("--moe-layer-freq")) if experts else 0,
        moe_layer_interval=(_interleave(g("--moe-layer-freq"), int(g("--num-layers"))) or 1) if experts else 1,
        mtp_num_layers=int(g("--mtp-num-layers", 0) or 0), mtp_repeated_layer="--mtp-use-repeated-layer" in values,
        rope_theta=float(g("--rotary-base", ROTARY_BASE_DEFAULT)),
        rotary_percent=float(g("--rotary-percent", ROTARY_PERCENT_DEFAULT)),
        rope_scaling_factor=(float(g("--rope-scaling-factor", ROPE_SCALING_FACTOR_DEFAULT))
                             if "--use-rope-scaling" in values else None),
        moe_latent_size=int(g("--moe-latent-size", 0) or 0) if experts else 0,
        activation="swiglu" if "--swiglu" in values else "squared_relu" if "--squared-relu" in values else (
            model.activation if model.activation != "swiglu" and model.activation != "squared_relu" else "gelu"),
        **_hybrid_fields(values, model), **_mla_fields(values, model))
    mtp_pattern = g("--mtp-hybrid-override-pattern")
    if mtp_pattern is not None and (not new_model.is_hybrid or str(mtp_pattern) != new_model.mtp_pattern):
        raise ValueError(f"--mtp-hybrid-override-pattern {mtp_pattern}: genconf models a hybrid model's MTP block as "
                         f"one attention and one MLP layer ({new_model.mtp_pattern})")
    tp, pp, cp = (int(g(f, 1)) for f in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                                          "--context-parallel-size"))
    if num_gpus % (tp * pp * cp):
        raise ValueError(f"tp x pp x cp = {tp} x {pp} x {cp} = {tp * pp * cp} does not divide the plan's "
                         f"{num_gpus} GPUs")
    dp = num_gpus // (tp * pp * cp)
    mbs = int(g("--micro-batch-size"))
    precision = megatron_plan_precision(values)
    fp8_recipe = megatron_fp8_recipe(g("--fp8-recipe")) if precision == "fp8" else None
    sharding = g("--data-parallel-sharding-strategy", "optim_grads")
    zero = ({"optim_grads_params": 3}.get(sharding, 2) if "--use-megatron-fsdp" in values
            else 1 if "--use-distributed-optimizer" in values else 0)
    block = g("--recompute-method") == "block"
    plan = ParallelPlan(
        framework="megatron", tp=tp, pp=pp, vp=megatron_vp(values), cp=cp, ep=int(g("--expert-model-parallel-size", 1)),
        dp=dp, mbs=mbs, gbs=int(g("--global-batch-size", mbs * dp)), seq_length=int(g("--seq-length")),
        zero_stage=zero, etp=g("--expert-tensor-parallel-size"),
        recompute=g("--recompute-granularity") or "none", sequence_parallel="--sequence-parallel" in values,
        recompute_layers=int(g("--recompute-num-layers")) if block else None,
        recompute_modules=tuple(m for m in (g("--recompute-modules") or []) if m != "core_attn")
        if g("--recompute-granularity") == "selective" and g("--recompute-modules") not in (None, ["core_attn"]) else (),
        offload_activation_layers=int(g("--cpu-offloading-num-layers", 0) or 0),
        precision=precision, fp8_recipe=fp8_recipe, tp_comm_overlap="--tp-comm-overlap" in values,
        moe_ep_overlap="--overlap-moe-expert-parallel-comm" in values,
        moe_dispatcher=(g("--moe-flex-dispatcher-backend", "deepep") if g("--moe-token-dispatcher-type") == "flex"
                        else "alltoall"),
        cuda_graph_impl=g("--cuda-graph-impl", "none"), cuda_graph_scope=tuple(g("--cuda-graph-scope", [])),
        fp8_param_gather="--fp8-param-gather" in values or "--fp4-param-gather" in values,
        # megatron-core's defaults once --first-last-layers-bf16 is on: one layer at each end.
        bf16_layers_start=int(g("--num-layers-at-start-in-bf16", 1)) if "--first-last-layers-bf16" in values else 0,
        bf16_layers_end=int(g("--num-layers-at-end-in-bf16", 1)) if "--first-last-layers-bf16" in values else 0,
        precision_aware_optimizer="--use-precision-aware-optimizer" in values,
        adam_moments_dtype="bf16" if g("--exp-avg-dtype") == g("--exp-avg-sq-dtype") == "bf16" else "fp32",
        grad_dtype="bf16" if "--grad-reduce-in-bf16" in values else None,
        layer_spec="local" if g("--transformer-impl") == "local" else "te",
        # The local spec's flag says the kernel may be missing (fused_kernels is not an argument): its default.
        grad_accum_fusion="--no-gradient-accumulation-fusion" not in values or g("--transformer-impl") == "local",
        pp_first_stage_layers=g("--decoder-first-pipeline-num-layers"),
        pp_last_stage_layers=g("--decoder-last-pipeline-num-layers"),
        pp_embedding_as_layer="--account-for-embedding-in-pipeline-split" in values,
        pp_loss_as_layer="--account-for-loss-in-pipeline-split" in values,
        pp_layout=g("--pipeline-model-parallel-layout"))
    return new_model, plan
