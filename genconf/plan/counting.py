"""Parameter counts and FLOPs from a ModelSpec alone (no model is built).

Parameters are listed tensor by tensor with megatron-core's module names, so the same list gives
the exact count of a public checkpoint, the count on one tensor/expert-parallel rank, and the
tensors that DeepSpeed/FSDP/megatron pad when they shard.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from genconf.plan.specs import HYBRID_LAYER_KINDS, LORA_TARGETS, ROUTER_DEFAULTS, ModelSpec, ParallelPlan


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
def dense_layer_model(model: ModelSpec) -> ModelSpec:
    """The model as its dense layers see it: an MoE model's dense layers (first_k_dense_replace, or those between
    every moe_layer_interval-th) have a plain MLP of ffn_hidden_size (megatron-core moe_layer_freq 0); every
    per-layer function prices them through this spec."""
    if not model.is_moe:
        return model
    import dataclasses

    return dataclasses.replace(model, num_experts=0, moe_top_k=0, moe_ffn_hidden_size=None,
                               moe_shared_expert_intermediate_size=None, moe_shared_expert_gate=False,
                               first_k_dense_replace=0, moe_layer_interval=1, mtp_num_layers=0,
                               mtp_repeated_layer=False, moe_latent_size=0, hybrid_pattern="", **ROUTER_DEFAULTS)


def transformer_view(model: ModelSpec) -> ModelSpec:
    """A hybrid model seen as a transformer of its attention and MLP/MoE layers: what its multi-token-prediction
    block (mtp_pattern '*E') holds, for the per-layer functions."""
    if not model.is_hybrid:
        return model
    import dataclasses

    return dataclasses.replace(model, hybrid_pattern="")


def _attention_tensors(model: ModelSpec, per_head_qk_norm: bool) -> list[ParamTensor]:
    h, q, kv = model.hidden_size, model.query_width, model.kv_width
    out: list[ParamTensor] = []
    if model.mla:
        # megatron-core MLASelfAttention (DeepSeek-V2 eq. 9-19): the down projections are replicated over TP
        # ("duplicated"), the up projections column-parallel, the latents RMS-normalised; the RoPE key part
        # (qk_pos_emb_head_dim wide) comes straight from the kv down projection, shared by every head.
        a, qk = model.num_attention_heads, model.query_width
        if model.q_lora_rank is None:
            out.append(ParamTensor("self_attention.linear_q_proj.weight", qk * h, True, gemm_weight=True))
        else:
            out.append(ParamTensor("self_attention.linear_q_down_proj.weight", model.q_lora_rank * h, False,
                                   gemm_weight=True))
            out += _norm("self_attention.q_layernorm", model.q_lora_rank, model)
            out.append(ParamTensor("self_attention.linear_q_up_proj.weight", qk * model.q_lora_rank, True,
                                   gemm_weight=True))
        out.append(ParamTensor("self_attention.linear_kv_down_proj.weight",
                               (model.kv_lora_rank + model.qk_pos_emb_head_dim) * h, False, gemm_weight=True))
        out += _norm("self_attention.kv_layernorm", model.kv_lora_rank, model)
        out.append(ParamTensor("self_attention.linear_kv_up_proj.weight",
                               a * (model.qk_head_dim + model.v_head_dim) * model.kv_lora_rank, True, gemm_weight=True))
        out.append(ParamTensor("self_attention.linear_proj.weight", h * model.value_width, True, gemm_weight=True))
        if model.add_bias_linear:
            out.append(ParamTensor("self_attention.linear_proj.bias", h, False))
        return out
    qkv = q + 2 * kv
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
    if model.add_bias_linear:
        out.append(ParamTensor("self_attention.linear_proj.bias", h, False))
    return out


def _mamba_tensors(model: ModelSpec) -> list[ParamTensor]:
    """megatron-core MambaMixer (ssm/mamba_mixer.py; Mamba-2, Dao & Gu 2024, Sec. 7): in_proj makes z and x
    (d_inner each), B and C (groups x state each) and dt (one per head), column-parallel; a depthwise causal conv
    over x, B, C; per-head dt_bias, A_log and D; a gated RMSNorm over d_inner; out_proj row-parallel. Every
    tensor but out_proj's output dimension is split over TP by heads and groups."""
    h, di, heads = model.hidden_size, model.mamba_inner, model.mamba_num_heads
    bc = 2 * model.mamba_num_groups * model.mamba_state_dim
    bias = model.add_bias_linear
    out = [ParamTensor("mixer.in_proj.weight", (2 * di + bc + heads) * h, True, gemm_weight=True)]
    if bias:
        out.append(ParamTensor("mixer.in_proj.bias", 2 * di + bc + heads, True))
    out += [ParamTensor("mixer.conv1d.weight", (di + bc) * model.mamba_conv_kernel, True),
            ParamTensor("mixer.conv1d.bias", di + bc, True),
            ParamTensor("mixer.dt_bias", heads, True), ParamTensor("mixer.A_log", heads, True),
            ParamTensor("mixer.D", heads, True), ParamTensor("mixer.norm.weight", di, True),
            ParamTensor("mixer.out_proj.weight", h * di, True, gemm_weight=True)]
    if bias:
        out.append(ParamTensor("mixer.out_proj.bias", h, False))
    return out


@functools.lru_cache(maxsize=256)
def layer_tensors(model: ModelSpec, per_head_qk_norm: bool = False, kind: str = "") -> tuple[ParamTensor, ...]:
    """The parameters of one decoder layer, as megatron-core's GPT layer spec names them (an MoE model's MoE
    layer; its dense layers are dense_layer_model's).
    per_head_qk_norm: q/k norms one head wide (megatron-core) instead of the full width (OLMo).
    kind: a hybrid model's layer symbol (specs.HYBRID_LAYER_KINDS): its pre-norm and one block, M a Mamba-2 mixer,
    * attention, - a dense MLP of ffn_hidden_size, E the MoE MLP (megatron-core mamba_layer_specs.py)."""
    h = model.hidden_size
    bias = model.add_bias_linear
    if kind == "M":
        return tuple(_norm("input_layernorm", h, model) + _mamba_tensors(model))
    out: list[ParamTensor] = []
    if kind in ("", "*"):
        out += _norm("input_layernorm", h, model)
        out += _attention_tensors(model, per_head_qk_norm)
        if model.sandwich_norm:
            out += _norm("post_attention_layernorm", h, model)
    if kind == "*":
        return tuple(out)
    if kind == "-" and model.is_moe:
        model = dense_layer_model(model)
    out += _norm("pre_mlp_layernorm", h, model)
    branches = 2 if model.gated else 1
    if model.is_moe:
        f, e, w = model.moe_ffn_hidden_size, model.num_experts, model.expert_width
        out.append(ParamTensor("mlp.router.weight", e * h, False))
        if bias:
            # megatron-core TopKRouter: a bias per expert whenever add_bias_linear (moe/router.py), as gpt-oss's.
            out.append(ParamTensor("mlp.router.bias", e, False))
        if model.moe_latent_size:
            # megatron-core MoELayer latent projections: TELinear "duplicated" (whole on every TP rank), h -> latent
            # before dispatch and latent -> h after combine.
            for name, fan_in, fan_out in (("fc1_latent_proj", h, w), ("fc2_latent_proj", w, h)):
                out.append(ParamTensor(f"mlp.{name}.weight", fan_in * fan_out, False, gemm_weight=True))
                if bias:
                    out.append(ParamTensor(f"mlp.{name}.bias", fan_out, False))
        out.append(ParamTensor("mlp.experts.linear_fc1.weight", e * branches * f * w, True, expert=True, gemm_weight=True))
        if bias:
            out.append(ParamTensor("mlp.experts.linear_fc1.bias", e * branches * f, True, expert=True))
        out.append(ParamTensor("mlp.experts.linear_fc2.weight", e * w * f, True, expert=True, gemm_weight=True))
        if bias:
            out.append(ParamTensor("mlp.experts.linear_fc2.bias", e * w, False, expert=True))
        fs = model.moe_shared_expert_intermediate_size
        if fs:
            # megatron-core SharedExpertMLP: a dense TP-split MLP every token passes through (DeepSeekMoE Sec. 2.2).
            out.append(ParamTensor("mlp.shared_experts.linear_fc1.weight", branches * fs * h, True, gemm_weight=True))
            out.append(ParamTensor("mlp.shared_experts.linear_fc2.weight", h * fs, True, gemm_weight=True))
            if model.moe_shared_expert_gate:
                # megatron-core shared_experts.py: gate_weight of shape (1, hidden_size), replicated over TP.
                out.append(ParamTensor("mlp.shared_experts.gate_weight", h, False))
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


@functools.lru_cache(maxsize=256)
def mtp_tensors(model: ModelSpec, per_head_qk_norm: bool = False) -> tuple[ParamTensor, ...]:
    """The multi-token-prediction layers (megatron-core MultiTokenPredictionLayer, DeepSeek-V3 Sec. 2.2): per
    layer the normalised embedding and hidden state (enorm, hnorm), their 2h -> h projection (eh_proj,
    column-parallel), one decoder layer and a final norm. They share the embedding and output layer. Under
    mtp_repeated_layer one block serves every depth; a hybrid model's block is a transformer layer ('*E')."""
    h = model.hidden_size
    out: list[ParamTensor] = []
    for i in range(model.mtp_blocks):
        p = f"mtp.layers.{i}"
        out += _norm(f"{p}.enorm", h, model) + _norm(f"{p}.hnorm", h, model)
        out.append(ParamTensor(f"{p}.eh_proj.weight", h * 2 * h, True, gemm_weight=True))
        out += [ParamTensor(f"{p}.transformer_layer.{t.name}", t.numel, t.tp_sharded, t.expert, t.gemm_weight)
                for t in layer_tensors(model, per_head_qk_norm)]
        out += _norm(f"{p}.final_layernorm", h, model)
    return tuple(out)


def decoder_layer_tensors(model: ModelSpec, per_head_qk_norm: bool = False) -> tuple[tuple[ParamTensor, ...], int]:
    """(tensors of one layer, how many) for each kind of decoder layer: the MoE layers, then the dense ones; a
    hybrid model's by symbol."""
    if model.is_hybrid:
        return tuple((layer_tensors(model, per_head_qk_norm, k), model.layers_of_kind(k)) for k in HYBRID_LAYER_KINDS
                     if model.layers_of_kind(k))
    kinds = [(layer_tensors(model, per_head_qk_norm), model.moe_layers or model.num_layers)]
    if model.is_moe and model.dense_layers:
        kinds.append((layer_tensors(dense_layer_model(model), per_head_qk_norm), model.dense_layers))
    return tuple(kinds)


LORA_MODULES = {"linear_qkv": "self_attention.linear_qkv", "linear_proj": "self_attention.linear_proj",
                "linear_fc1": "mlp.linear_fc1", "linear_fc2": "mlp.linear_fc2"}
"""Each LoRA target's module in a megatron-core TransformerLayer."""
LORA_COLUMN_PARALLEL = ("linear_qkv", "linear_fc1")
"""Targets split over TP on their output (column-parallel); the others on their input (row-parallel)."""


def lora_target_shapes(model: ModelSpec, targets: tuple[str, ...] = LORA_TARGETS) -> dict[str, tuple[int, int]]:
    """(fan_in, fan_out) of each adapted linear layer, unsplit, in LORA_TARGETS order."""
    h, q, kv, f = model.hidden_size, model.query_width, model.kv_width, model.ffn_hidden_size
    shapes = {"linear_qkv": (h, q + 2 * kv), "linear_proj": (q, h),
              "linear_fc1": (h, (2 if model.gated else 1) * f), "linear_fc2": (f, h)}
    return {name: shape for name, shape in shapes.items() if name in targets}


def lora_layer_tensors(model: ModelSpec, rank: int,
                       targets: tuple[str, ...] = LORA_TARGETS) -> tuple[ParamTensor, ...]:
    """One layer's LoRA adapters (Hu et al. 2021, eq. 3: W + B A with A r x in, B out x r), as Megatron-Bridge's
    ParallelLinearAdapter holds them: linear_in (A) and linear_out (B) per target, each split over TP on one of
    its dimensions. Trainable; the base weights they adapt are frozen."""
    if not rank:
        return ()
    out = []
    for name, (fan_in, fan_out) in lora_target_shapes(model, targets).items():
        module = LORA_MODULES[name]
        out.append(ParamTensor(f"{module}.adapter.linear_in.weight", rank * fan_in, True))
        out.append(ParamTensor(f"{module}.adapter.linear_out.weight", fan_out * rank, True))
    return tuple(out)


def lora_param_count(model: ModelSpec, rank: int, targets: tuple[str, ...] = LORA_TARGETS) -> int:
    """Trainable parameters of a LoRA run: every layer's adapters."""
    return model.num_layers * _total(lora_layer_tensors(model, rank, targets))


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


TORCH_VOCAB_MULTIPLE = 128
"""genconf's own PyTorch model (DeepSpeed, FSDP) and its OLMo artifact pad the vocabulary rows to this multiple: OLMo's
model warns below it ("Embedding size is not a multiple of 128! This could hurt throughput performance",
olmo/model.py), Megatron's --make-vocab-size-divisible-by defaults to it (times TP), nanoGPT pads to 64."""


def torch_vocab_rows(vocab_size: int) -> int:
    """Embedding and output rows of genconf's own PyTorch model: the vocabulary padded to TORCH_VOCAB_MULTIPLE."""
    return padded_vocab_size(vocab_size, 1, TORCH_VOCAB_MULTIPLE)


def window_chunk_rows(window: int, seq: int) -> int:
    """Query rows per chunk of genconf's own sliding-window attention (genconf.train.torch_model.windowed_attention):
    the multiple of 128 at or above a quarter of the window, at least 128 and at most the sequence. A design choice:
    each query computes window + chunk keys, so a quarter costs 25% over the band, in 4 x seq / window kernel calls
    (a smaller chunk computes less and launches more; 128 rows is a flash tile)."""
    return max(1, min(seq, max(128, -(-window // 4 // 128) * 128)))


def window_keys_per_query(window: int, seq: int) -> float:
    """Keys per query that genconf's own windowed attention computes, masked or not, averaged over the sequence:
    each chunk of n query rows runs against its own rows and the `window` keys before them (fewer at the start),
    window + chunk rows for an interior chunk. For windows at least 2 keys shorter than the sequence: a longer one
    runs plain causal attention, which genconf.plan.cost prices as such."""
    rows = window_chunk_rows(window, seq)
    keys = sum((min(seq, start + rows) - start) * (min(seq, start + rows) - max(0, start - window))
               for start in range(0, seq, rows))
    return keys / seq


def vocab_padding_params(model: ModelSpec, vocab_rows: int) -> int:
    """Parameters the padding rows add: the embedding's, and the output layer's when untied."""
    def total(rows: int) -> int:
        return _total(embedding_tensors(model, rows) + output_tensors(model, rows))
    return total(vocab_rows) - total(model.vocab_size)


def padded_vocab_size(vocab_size: int, tp: int, divisible_by: int = 128) -> int:
    """Megatron pads the vocabulary to a multiple of 128 x TP (--make-vocab-size-divisible-by)."""
    multiple = divisible_by * tp
    return -(-vocab_size // multiple) * multiple


def _total(tensors: tuple[ParamTensor, ...]) -> int:
    return sum(t.numel for t in tensors)


@functools.lru_cache(maxsize=256)  # the search's memory floors ask per layout
def exact_param_count(model: ModelSpec) -> int:
    """Parameters of the checkpoint: layers, embeddings (unpadded rows), final norm, output layer, and the
    multi-token-prediction layers (their shared embedding and output layer counted once)."""
    return (sum(count * _total(tensors) for tensors, count in decoder_layer_tensors(model))
            + _total(mtp_tensors(model))
            + _total(embedding_tensors(model, model.vocab_size))
            + _total(final_norm_tensors(model))
            + _total(output_tensors(model, model.vocab_size)))


def active_param_count(model: ModelSpec) -> int:
    """Parameters a token passes through (MoE: top-k of the experts); the '6N' of FLOP counting."""
    if not model.is_moe:
        return exact_param_count(model)
    expert = sum(t.numel for t in layer_tensors(model, kind="E" if model.is_hybrid else "") if t.expert)
    moe_layers = model.moe_layers + model.mtp_blocks
    return exact_param_count(model) - moe_layers * expert * (model.num_experts - model.moe_top_k) // model.num_experts


def workshop_param_count(model: ModelSpec) -> int:
    """The seed's approximation P = N(12D^2+10D) + D(V+T) + 2D + V(D+1) (000_c341372fa13853c8.txt)."""
    n, d, v, t = model.num_layers, model.hidden_size, model.vocab_size, model.seq_length
    return n * (12 * d * d + 10 * d) + d * (v + t) + 2 * d + v * (d + 1)


def param_breakdown(model: ModelSpec) -> dict[str, int]:
    """Exact count split into the parts a user recognises."""
    kinds = decoder_layer_tensors(model)

    def part(keep) -> int:
        return sum(count * sum(t.numel for t in layer if keep(t.name)) for layer, count in kinds)

    parts = {
        "attention": part(lambda name: name.startswith("self_attention")),
        "mamba": part(lambda name: name.startswith("mixer")),
        "mlp": part(lambda name: name.startswith("mlp")),
        "norms": (part(lambda name: "layernorm" in name and "self_attention" not in name)
                  + _total(final_norm_tensors(model))),
        "embedding": _total(embedding_tensors(model, model.vocab_size)),
        "output_layer": _total(output_tensors(model, model.vocab_size)),
    }
    if model.mtp_num_layers:
        parts["multi_token_prediction"] = _total(mtp_tensors(model))
    if not model.is_hybrid:
        del parts["mamba"]
    return parts


# --- FLOPs ----------------------------------------------------------------------------------------

def _mamba_macs_per_token(model: ModelSpec) -> int:
    """One Mamba-2 layer's projections: in_proj h -> 2 d_inner + 2 G N + heads, out_proj d_inner -> h."""
    di = model.mamba_inner
    return model.hidden_size * (2 * di + 2 * model.mamba_num_groups * model.mamba_state_dim + model.mamba_num_heads) \
        + di * model.hidden_size


def _attention_macs_per_token(model: ModelSpec) -> int:
    """Multiply-accumulates per token of one layer's attention projections (QKV and output)."""
    h, q, kv = model.hidden_size, model.query_width, model.kv_width
    if model.mla:
        # Megatron-LM num_floating_point_operations' MLA terms: the down and up projections, the shared RoPE key,
        # the output projection.
        a = model.num_attention_heads
        q_macs = h * q if model.q_lora_rank is None else model.q_lora_rank * (h + q)
        kv_macs = model.kv_lora_rank * (h + a * (model.qk_head_dim + model.v_head_dim)) + h * model.qk_pos_emb_head_dim
        return q_macs + kv_macs + model.value_width * h
    return h * (q + 2 * kv) + h * q


def _mlp_macs_per_token(model: ModelSpec) -> int:
    """Same for one layer's MLP (routed experts: top-k of them, and the shared experts)."""
    branches = 3 if model.gated else 2
    if model.is_moe:
        # Latent MoE: the routed experts on the latent width plus its h -> latent -> h projections (Megatron-Bridge
        # flop_utils.py moe_layer_flops, moe_latent_size branch); shared experts on the full width.
        h, w = model.hidden_size, model.expert_width
        latent = 2 * h * w if model.moe_latent_size else 0
        return (branches * (w * model.moe_ffn_hidden_size * model.moe_top_k
                            + h * (model.moe_shared_expert_intermediate_size or 0)) + latent)
    return branches * model.hidden_size * model.ffn_hidden_size


def _layer_matmul_macs_per_token(model: ModelSpec, kind: str = "") -> int:
    """Multiply-accumulates per token in one layer's matmuls; `kind`: one hybrid layer (counting.layer_tensors):
    M a Mamba layer, * the attention half, - / E the dense / MoE MLP half of a transformer layer."""
    if kind == "M":
        return _mamba_macs_per_token(model)
    mlp = _mlp_macs_per_token(dense_layer_model(model) if kind == "-" else model)
    return {"": _attention_macs_per_token(model) + mlp, "*": _attention_macs_per_token(model), "-": mlp, "E": mlp}[kind]


@functools.lru_cache(maxsize=256)  # step_cost asks per plan; a model's count never changes
def _layers_macs_per_token(model: ModelSpec) -> int:
    """Matmul MACs per token of every decoder layer and multi-token-prediction layer (with its 2h -> h eh_proj)."""
    mtp = model.mtp_num_layers * (_layer_matmul_macs_per_token(model) + 2 * model.hidden_size ** 2)
    if model.is_hybrid:
        return sum(model.layers_of_kind(k) * _layer_matmul_macs_per_token(model, k) for k in HYBRID_LAYER_KINDS) + mtp
    dense = _layer_matmul_macs_per_token(dense_layer_model(model))
    moe = _layer_matmul_macs_per_token(model)
    return (model.moe_layers * moe + model.dense_layers * dense if model.is_moe else model.num_layers * dense) + mtp


@functools.lru_cache(maxsize=256)  # step_cost asks per plan; a model's count never changes
def _attention_flops_per_token(model: ModelSpec, seq_length: int) -> int:
    """Forward + backward FLOPs of QK^T and AV in every layer: 6 x s x (query/key + value widths), causal mask
    not halved (12 s a d per layer for a = d heads). A sliding-window layer sees at most window + 1 keys per query
    in place of s (Megatron-Bridge's flop_utils.py: min(window + 1, s) as the windowed layers' context)."""
    widths = 6 * (model.query_width + model.value_width)
    layers = model.attention_layers + model.mtp_num_layers
    windowed = model.windowed_layers
    context = min(seq_length, (model.sliding_window or seq_length) + 1)
    return (layers - windowed) * widths * seq_length + windowed * widths * context


def causal_masked_flops_per_token(model: ModelSpec, seq_length: int) -> float:
    """The half of the full-attention layers' QK^T and AV FLOPs that a causal mask skips (flash attention computes the
    lower triangle only), which model_flops_per_token counts by convention: what MFU with the mask halved leaves out."""
    # A window at least as long as the sequence is full causal attention (the count's context is min(w + 1, s)).
    windowed = model.windowed_layers if (model.sliding_window or seq_length) + 1 < seq_length else 0
    layers = model.attention_layers + model.mtp_num_layers - windowed
    return 0.5 * layers * 6 * (model.query_width + model.value_width) * seq_length


def ssm_flops_per_token(model: ModelSpec) -> int:
    """Forward + backward FLOPs of the Mamba-2 layers' state-space scan beyond their projections: Megatron-LM's
    num_floating_point_operations (training.py, mamba_layer_flops: 7 x d_inner x state per token forward), x 3."""
    return 3 * model.layers_of_kind("M") * 7 * model.mamba_inner * model.mamba_state_dim


def model_flops_per_token(model: ModelSpec, seq_length: int, vocab_rows: int | None = None) -> float:
    """Training FLOPs per token, forward + backward, no recomputation, causal mask not halved.

    Megatron-LM num_floating_point_operations (the DGX Cloud benchmark convention,
    shared/data/dgxc_model_flops_convention.csv): 6 x (matmul MACs) + 12*L*s*(a*d) for QK^T and AV (min(w + 1, s)
    in place of s in sliding-window layers),
    + 6*V*h for the logits (once more per multi-token-prediction layer). Equals Korthikanti 2022 eq. 7 for
    GPT-3-style models.
    """
    vocab = vocab_rows if vocab_rows is not None else model.vocab_size
    return float(6 * _layers_macs_per_token(model) + _attention_flops_per_token(model, seq_length)
                 + ssm_flops_per_token(model) + (1 + model.mtp_num_layers) * 6 * vocab * model.hidden_size)


def lora_flops_per_token(model: ModelSpec, seq_length: int, rank: int, vocab_rows: int | None = None,
                         targets: tuple[str, ...] = LORA_TARGETS) -> float:
    """Training FLOPs per token of a LoRA run: the frozen matmuls forward and data gradient only (4 x MACs, no
    weight gradient), attention and the logits as in full training (the logits' weight frozen too: 4 x V x h),
    and the adapters' own forward and backward (6 x r x (in + out) per target)."""
    vocab = vocab_rows if vocab_rows is not None else model.vocab_size
    adapters = sum(t.numel for t in lora_layer_tensors(model, rank, targets))
    return float(4 * _layers_macs_per_token(model) + _attention_flops_per_token(model, seq_length)
                 + model.num_layers * 6 * adapters + 4 * vocab * model.hidden_size)


def recompute_flops_per_token(model: ModelSpec, seq_length: int, recompute: str,
                              modules: tuple[str, ...] = ("core_attn",), *, early_stop: bool = False) -> float:
    """Extra forward FLOPs per token spent recomputing activations (hardware FLOPs - model FLOPs).

    full: every layer's forward again (Narayanan 2021 eq. 3: 96 vs 72 B*s*l*h^2), less each layer's MLP output
    projection under PyTorch's early-stopping checkpoint (`early_stop`: checkpoint_early_stop);
    selective: the recomputed modules' forward, by default QK^T, softmax and AV (Korthikanti 2022 eq. 8: s/(3h)
    instead of s/(6h)); mla_up_proj the MLA up projections, mlp the dense layers' MLPs (element-wise modules:
    no matmul FLOPs).
    """
    if recompute == "full":
        skipped = 2 * model.hidden_size * model.ffn_hidden_size * model.num_layers if early_stop else 0
        return float(2 * _layers_macs_per_token(model) + _attention_flops_per_token(model, seq_length) / 3
                     + ssm_flops_per_token(model) / 3 - skipped)
    if recompute != "selective":
        return 0.0
    flops = _attention_flops_per_token(model, seq_length) / 3 if "core_attn" in modules else 0.0
    if "mla_up_proj" in modules and model.mla:
        a = model.num_attention_heads
        up = model.kv_lora_rank * a * (model.qk_head_dim + model.v_head_dim) + (model.q_lora_rank or 0) * model.query_width
        flops += 2 * (model.num_layers + model.mtp_num_layers) * up
    if "mlp" in modules:
        dense = dense_layer_model(model)
        flops += 2 * (3 if model.gated else 2) * model.hidden_size * dense.ffn_hidden_size * model.dense_layers
    return float(flops)


def checkpoint_early_stop(model: ModelSpec, plan: ParallelPlan) -> bool:
    """Whether full recompute leaves each layer's MLP output projection out. PyTorch's non-reentrant checkpoint stops
    recomputing once the last tensor the layer saved for backward has been rebuilt (torch >= 2.1, pytorch#96866:
    early stop by default), and autograd saves an op's inputs before it runs, so the output projection (its input is
    the last saved tensor), its TP reduction and the residual add are not run again; a compiled layer whose graph
    holds the checkpoint (torchtitan's order, and genconf's runners') is cut by AOTAutograd's partitioner, which
    recomputes only what the backward reads: the same (both measured on CPU: tests/train/test_early_stop.py).
    genconf's own PyTorch model (under FSDP and DeepSpeed), torchtitan, Composer and OLMo checkpoint this way;
    megatron-core's and Megatron-DeepSpeed's checkpoints rerun the whole layer, as does torch before 2.1
    (plan.checkpoint_early_stop False). Not when something after that GEMM saves a tensor (a hidden-dropout mask, a
    post-MLP sandwich norm), when an eager GEMM is a custom autograd Function, which saves its inputs after running
    (torchao's and Transformer Engine's FP8 linears), under LoRA adapters, nor for MoE or hybrid layers."""
    return (plan.recompute == "full" and plan.torch_layers and plan.checkpoint_early_stop
            and (plan.quant_recipe is None or plan.torch_compile) and not plan.lora_rank and model.hidden_dropout == 0
            and not model.sandwich_norm and not model.is_moe and not model.is_hybrid)


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


