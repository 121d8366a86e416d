"""olmo_fsdp.yaml: the plan (or its nearest FSDP equivalent) as an OLMo TrainConfig (KempnerInstitute/OLMo
olmo/config.py names)."""

from __future__ import annotations

import yaml

from genconf.plan.counting import torch_vocab_rows
from genconf.plan.equivalent import equivalent_plan
from genconf.plan.precision import OLMO_PRECISION
from genconf.plan.specs import ModelSpec, ParallelPlan, TrainSpec
from genconf.render.templates import comment

FSDP_SHARDING = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD")
FSDP_WRAPPING = ("by_block", "by_block_and_size", "by_block_group", "by_block_group_and_size", "size_based")
OLMO_SCHEDULERS = {"cosine": "cosine_with_warmup", "linear": "linear_with_warmup", "constant": "constant_with_warmup"}
OLMO_ACTIVATION_TYPES = ("gelu", "relu", "swiglu")
"""OLMo's ActivationType (ai2-olmo 0.6.0 olmo/config.py): TrainConfig.load refuses any other model.activation_type."""
OLMO_ACTIVATIONS = {"gelu": "gelu", "swiglu": "swiglu", "squared_relu": "relu"}
"""genconf's activation -> OLMo's nearest: OLMo has no squared ReLU (Nemotron's relu(x)^2), so its file trains relu
(the same weights and GEMMs); fidelity.feature_differences says so in the artifacts README."""


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
    # OLMo FSDPPrecision: mixed reduces gradients in fp32 (MixedPrecision.reduce_dtype), pure in bf16.
    fsdp: dict = {"wrapping_strategy": fsdp_wrapping(model),
                  "precision": "pure" if plan.grad_dtype == "bf16" else "mixed", "sharding_strategy": strategy}
    if strategy == "HYBRID_SHARD":
        fsdp["hybrid_sharding_num_model_replicas"] = plan.dp // plan.shard_group_size
    olmo_model = {
        "d_model": model.hidden_size, "n_heads": model.num_attention_heads, "n_layers": model.num_layers,
        # OLMo's mlp_hidden_size is ff_proj's output: both SwiGLU branches, 2 x megatron's ffn_hidden_size
        "mlp_hidden_size": model.ffn_hidden_size * (2 if model.gated else 1),
        "activation_type": OLMO_ACTIVATIONS[model.activation], "block_type": "sequential",
        "weight_tying": model.tie_embeddings,
        "alibi": False, "rope": model.position_embedding == "rope",
        **({"rope_theta": round(model.rope_theta)} if model.position_embedding == "rope" else {}),  # OLMo: an int
        # flash-attn 2; without it OLMo runs PyTorch's SDPA (cuDNN's attention on Hopper and newer)
        "flash_attention": plan.layer_spec == "te" and plan.attention_kernel in ("auto", "flash2", "triton"),
        "attention_dropout": model.attention_dropout, "attention_layer_norm": model.qk_layernorm,
        "include_bias": model.add_bias_linear, "layer_norm_type": "rms" if model.normalization == "rmsnorm" else "default",
        "layer_norm_with_affine": affine, "attention_layer_norm_with_affine": affine,
        "bias_for_layer_norm": model.norm_bias, "residual_dropout": model.hidden_dropout,
        "embedding_dropout": model.hidden_dropout, "max_sequence_length": plan.seq_length,
        "vocab_size": model.vocab_size, "embedding_size": torch_vocab_rows(model.vocab_size),
        "init_device": "meta" if strategy in ("FULL_SHARD", "HYBRID_SHARD", "SHARD_GRAD_OP") else "cuda",
        "init_fn": "mitchell",
    }
    if model.grouped_query:
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
        "precision": OLMO_PRECISION.get(plan.precision, "amp_bf16"),
        "max_grad_norm": train.grad_clip or None, "max_grad_norm_ratio": None,
        "save_interval": train.checkpoint_every_steps or train.train_steps,
        "activation_checkpointing": "whole_layer" if plan.recompute != "none" else None,
        "distributed_strategy": "ddp" if strategy == "NO_SHARD" else "fsdp",
        "fsdp": fsdp,
        "speed_monitor": {"window_size": 20},
    }
    if plan.fused_loss:
        # OLMo's fused_loss: flash-attn's cross entropy over the 16-bit logits (needs flash-attn installed).
        config["fused_loss"] = True
    if strategy == "NO_SHARD":
        # The seed's OLMo 1B DDP config: gradients synchronised once per batch, every parameter used.
        config["ddp"] = {"grad_sync_mode": "batch", "find_unused_params": False}
    return config


def olmo_yaml(config: dict, layout: str) -> str:
    header = (f"# OLMo trainer config (KempnerInstitute/OLMo olmo/config.py TrainConfig) for: {comment(layout)}\n"
              "# Generated by genconf from plan.json. Add data/tokenizer sections (and eos/pad token ids) for real data.\n")
    return header + yaml.safe_dump(config, sort_keys=False, default_flow_style=False, width=120)
