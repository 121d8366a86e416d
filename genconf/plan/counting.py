"""Parameter counts and FLOPs from a ModelSpec alone (no model is built).

Parameters are listed tensor by tensor with megatron-core's module names, so the same list gives
the exact count of a public checkpoint, the count on one tensor/expert-parallel rank, and the
tensors that DeepSpeed/FSDP/megatron pad when they shard.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from genconf.plan.specs import ModelSpec


@dataclass(frozen=True, slots=True)
class ParamTensor:
    """One parameter tensor of the model."""

    name: str
    """megatron-core name inside its module (``self_attention.linear_qkv.weight``)."""
    numel: int
    """Elements in the whole tensor (all TP and EP ranks together)."""
    tp_sharded: bool
    """Split across tensor-parallel ranks (column-, row- or vocab-parallel)."""
    expert: bool = False
    """Holds every routed expert's copy: split across expert-parallel ranks too."""
    gemm_weight: bool = False
    """A matmul weight: FP8 recipes keep casted copies of these."""

    def numel_per_rank(self, tp: int, ep: int = 1, etp: int | None = None) -> int:
        """Elements on one rank: TP-sharded tensors split over tp (routed experts over etp, the expert
        tensor-parallel degree, tp when None), expert tensors over ep too."""
        split = (etp if (self.expert and etp is not None) else tp) if self.tp_sharded else 1
        return self.numel // split // (ep if self.expert else 1)


def _norm(prefix: str, width: int, model: ModelSpec) -> list[ParamTensor]:
    if model.normalization == "nonparametric":
        return []
    tensors = [ParamTensor(f"{prefix}.weight", width, False)]
    if model.norm_bias:
        tensors.append(ParamTensor(f"{prefix}.bias", width, False))
    return tensors


@functools.lru_cache(maxsize=256)
def as_built_by_megatron(model: ModelSpec) -> ModelSpec:
    """The model megatron-core actually builds for a spec: it has no bias-free or non-parametric LayerNorm
    (LayerNorm always has weight and bias), normalises q and k per head (kv_channels wide), not over the
    full projection width as OLMo does, and has no sandwich (post-sublayer) norms."""
    import dataclasses

    norm = "rmsnorm" if model.normalization == "rmsnorm" else "layernorm"
    built = dataclasses.replace(model, normalization=norm, norm_bias=norm == "layernorm", sandwich_norm=False)
    return model if built == model else built


@functools.lru_cache(maxsize=256)
def layer_tensors(model: ModelSpec, per_head_qk_norm: bool = False) -> tuple[ParamTensor, ...]:
    """The parameters of one decoder layer, as megatron-core's GPT layer spec names them.
    per_head_qk_norm: q/k norms one head wide (megatron-core) instead of the full width (OLMo)."""
    h, q, kv = model.hidden_size, model.query_width, model.kv_width
    bias = model.add_bias_linear
    qkv = q + 2 * kv
    out: list[ParamTensor] = _norm("input_layernorm", h, model)
    out.append(ParamTensor("self_attention.linear_qkv.weight", qkv * h, True, gemm_weight=True))
    if model.qkv_bias:
        out.append(ParamTensor("self_attention.linear_qkv.bias", qkv, True))
    if model.qk_layernorm:
        # OLMo-2 and the Kempner OLMo configs normalise q and k over their full projected width;
        # Qwen3 and megatron-core normalise each head (kv_channels wide), sharing the weights across heads.
        per_head = per_head_qk_norm or model.qk_layernorm_per_head
        qn, kn = (model.kv_channels, model.kv_channels) if per_head else (q, kv)
        out += _norm("self_attention.q_layernorm", qn, model) + _norm("self_attention.k_layernorm", kn, model)
    out.append(ParamTensor("self_attention.linear_proj.weight", h * q, True, gemm_weight=True))
    if bias:
        out.append(ParamTensor("self_attention.linear_proj.bias", h, False))
    if model.sandwich_norm:
        out += _norm("post_attention_layernorm", h, model)
    out += _norm("pre_mlp_layernorm", h, model)
    branches = 2 if model.gated else 1
    if model.is_moe:
        f, e = model.moe_ffn_hidden_size, model.num_experts
        out.append(ParamTensor("mlp.router.weight", e * h, False))
        out.append(ParamTensor("mlp.experts.linear_fc1.weight", e * branches * f * h, True, expert=True, gemm_weight=True))
        if bias:
            out.append(ParamTensor("mlp.experts.linear_fc1.bias", e * branches * f, True, expert=True))
        out.append(ParamTensor("mlp.experts.linear_fc2.weight", e * h * f, True, expert=True, gemm_weight=True))
        if bias:
            out.append(ParamTensor("mlp.experts.linear_fc2.bias", e * h, False, expert=True))
    else:
        f = model.ffn_hidden_size
        out.append(ParamTensor("mlp.linear_fc1.weight", branches * f * h, True, gemm_weight=True))
        if bias:
            out.append(ParamTensor("mlp.linear_fc1.bias", branches * f, True))
        out.append(ParamTensor("mlp.linear_fc2.weight", h * f, True, gemm_weight=True))
        if bias:
            out.append(ParamTensor("mlp.linear_fc2.bias", h, False))
    if model.sandwich_norm:
        out += _norm("post_mlp_layernorm", h, model)
    return tuple(out)


LORA_TARGETS = ("self_attention.linear_qkv", "self_attention.linear_proj", "mlp.linear_fc1", "mlp.linear_fc2")
"""The linear layers LoRA adapts: Megatron-Bridge peft/lora.py's default target_modules (NeMo 2's likewise)."""


def lora_layer_tensors(model: ModelSpec, rank: int) -> tuple[ParamTensor, ...]:
    """One layer's LoRA adapters (Hu et al. 2021, eq. 3: W + B A with A r x in, B out x r), as Megatron-Bridge's
    ParallelLinearAdapter holds them: linear_in (A) and linear_out (B) per target, each split over TP on one of
    its dimensions. Trainable; the base weights they adapt are frozen."""
    if not rank:
        return ()
    h, q, kv = model.hidden_size, model.query_width, model.kv_width
    f = model.ffn_hidden_size
    shapes = {"self_attention.linear_qkv": (h, q + 2 * kv), "self_attention.linear_proj": (q, h),
              "mlp.linear_fc1": (h, (2 if model.gated else 1) * f), "mlp.linear_fc2": (f, h)}
    out = []
    for name in LORA_TARGETS:
        fan_in, fan_out = shapes[name]
        out.append(ParamTensor(f"{name}.adapter.linear_in.weight", rank * fan_in, True))
        out.append(ParamTensor(f"{name}.adapter.linear_out.weight", fan_out * rank, True))
    return tuple(out)


def lora_param_count(model: ModelSpec, rank: int) -> int:
    """Trainable parameters of a LoRA run: every layer's adapters."""
    return model.num_layers * _total(lora_layer_tensors(model, rank))


def embedding_tensors(model: ModelSpec, vocab_rows: int) -> tuple[ParamTensor, ...]:
    """Input embedding (vocab-parallel) and, for learned positions, the position table (replicated)."""
    out = [ParamTensor("embedding.word_embeddings.weight", vocab_rows * model.hidden_size, True)]
    if model.position_embedding == "learned":
        out.append(ParamTensor("embedding.position_embeddings.weight", model.seq_length * model.hidden_size, False))
    return tuple(out)


def final_norm_tensors(model: ModelSpec) -> tuple[ParamTensor, ...]:
    return tuple(_norm("decoder.final_layernorm", model.hidden_size, model))


def output_tensors(model: ModelSpec, vocab_rows: int) -> tuple[ParamTensor, ...]:
    """The output (logits) layer; none when the embedding is tied and both live on one stage."""
    if model.tie_embeddings:
        return ()
    return (ParamTensor("output_layer.weight", vocab_rows * model.hidden_size, True, gemm_weight=True),)


def padded_vocab_size(vocab_size: int, tp: int, divisible_by: int = 128) -> int:
    """Megatron pads the vocabulary to a multiple of 128 x TP (--make-vocab-size-divisible-by)."""
    multiple = divisible_by * tp
    return -(-vocab_size // multiple) * multiple


def _total(tensors: tuple[ParamTensor, ...]) -> int:
    return sum(t.numel for t in tensors)


def exact_param_count(model: ModelSpec) -> int:
    """Parameters of the checkpoint: layers, embeddings (unpadded rows), final norm, output layer."""
    return (model.num_layers * _total(layer_tensors(model))
            + _total(embedding_tensors(model, model.vocab_size))
            + _total(final_norm_tensors(model))
            + _total(output_tensors(model, model.vocab_size)))


def active_param_count(model: ModelSpec) -> int:
    """Parameters a token passes through (MoE: top-k of the experts); the '6N' of FLOP counting."""
    if not model.is_moe:
        return exact_param_count(model)
    expert = sum(t.numel for t in layer_tensors(model) if t.expert)
    return exact_param_count(model) - model.num_layers * expert * (model.num_experts - model.moe_top_k) // model.num_experts


def workshop_param_count(model: ModelSpec) -> int:
    """The seed's approximation P = N(12D^2+10D) + D(V+T) + 2D + V(D+1) (000_c341372fa13853c8.txt)."""
    n, d, v, t = model.num_layers, model.hidden_size, model.vocab_size, model.seq_length
    return n * (12 * d * d + 10 * d) + d * (v + t) + 2 * d + v * (d + 1)


def param_breakdown(model: ModelSpec) -> dict[str, int]:
    """Exact count split into the parts a user recognises."""
    layer = layer_tensors(model)
    parts = {
        "attention": sum(t.numel for t in layer if t.name.startswith("self_attention")) * model.num_layers,
        "mlp": sum(t.numel for t in layer if t.name.startswith("mlp")) * model.num_layers,
        "norms": (sum(t.numel for t in layer if "layernorm" in t.name and "self_attention" not in t.name)
                  * model.num_layers + _total(final_norm_tensors(model))),
        "embedding": _total(embedding_tensors(model, model.vocab_size)),
        "output_layer": _total(output_tensors(model, model.vocab_size)),
    }
    return parts


# --- FLOPs ----------------------------------------------------------------------------------------

def _layer_matmul_macs_per_token(model: ModelSpec) -> int:
    """Multiply-accumulates per token in one layer's matmuls (routed experts: top-k of them)."""
    h, q, kv = model.hidden_size, model.query_width, model.kv_width
    branches = 3 if model.gated else 2
    if model.is_moe:
        mlp = branches * h * model.moe_ffn_hidden_size * model.moe_top_k
    else:
        mlp = branches * h * model.ffn_hidden_size
    return h * (q + 2 * kv) + h * q + mlp


def model_flops_per_token(model: ModelSpec, seq_length: int, vocab_rows: int | None = None) -> float:
    """Training FLOPs per token, forward + backward, no recomputation, causal mask not halved.

    Megatron-LM num_floating_point_operations (the DGX Cloud benchmark convention,
    shared/data/dgxc_model_flops_convention.csv): 6 x (matmul MACs) + 12*L*s*(a*d) for QK^T and AV,
    + 6*V*h for the logits. Equals Korthikanti 2022 eq. 7 for GPT-3-style models.
    """
    vocab = vocab_rows if vocab_rows is not None else model.vocab_size
    layers = model.num_layers * (6 * _layer_matmul_macs_per_token(model) + 12 * seq_length * model.query_width)
    return float(layers + 6 * vocab * model.hidden_size)


def lora_flops_per_token(model: ModelSpec, seq_length: int, rank: int, vocab_rows: int | None = None) -> float:
    """Training FLOPs per token of a LoRA run: the frozen matmuls forward and data gradient only (4 x MACs, no
    weight gradient), attention and the logits as in full training (the logits' weight frozen too: 4 x V x h),
    and the adapters' own forward and backward (6 x r x (in + out) per target)."""
    vocab = vocab_rows if vocab_rows is not None else model.vocab_size
    adapters = sum(t.numel for t in lora_layer_tensors(model, rank))
    layers = model.num_layers * (4 * _layer_matmul_macs_per_token(model) + 12 * seq_length * model.query_width
                                 + 6 * adapters)
    return float(layers + 4 * vocab * model.hidden_size)


def recompute_flops_per_token(model: ModelSpec, seq_length: int, recompute: str) -> float:
    """Extra forward FLOPs per token spent recomputing activations (hardware FLOPs - model FLOPs).

    full: every layer's forward again (Narayanan 2021 eq. 3: 96 vs 72 B*s*l*h^2);
    selective: only QK^T, softmax and AV (Korthikanti 2022 eq. 8: s/(3h) instead of s/(6h)).
    """
    attention_fwd = 4 * seq_length * model.query_width
    if recompute == "full":
        return float(model.num_layers * (2 * _layer_matmul_macs_per_token(model) + attention_fwd))
    if recompute == "selective":
        return float(model.num_layers * attention_fwd)
    return 0.0


def chinchilla_tokens(model: ModelSpec) -> int:
    """20 tokens per parameter: the Chinchilla rule the seeds quote (001_bf03ad0d050df037.txt)."""
    return 20 * exact_param_count(model)


def human_count(n: float) -> str:
    """1234567 -> '1.23M'."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            value = n / scale
            return f"{value:.3g}{unit}" if value < 100 else f"{value:.0f}{unit}"
    return f"{n:.0f}"


