"""Hugging Face `config.json` -> ModelSpec, for the decoder families whose parameters genconf counts exactly.

Standard library only (json): transformers is never imported. Each family maps the fields that change the
parameter count, the memory or the FLOPs onto ModelSpec's megatron-core names; what genconf does not model
but which changes none of those (rope scaling, logit soft-capping, embedding scaling, parallel residuals) is
stated in the spec's `source` and printed by `genconf models --from-hf`. A field genconf does not know is refused
with one line, since it might change the model.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path

from genconf.plan import limits
from genconf.plan.errors import GenconfError
from genconf.plan.specs import LLAMA3_ROPE_SCALING, ModelSpec

# Fields every transformers PretrainedConfig may carry (tokens, generation defaults, bookkeeping), and the
# numerical knobs that change no parameter count, memory or FLOP: genconf reads past them.
_GENERIC_KEYS = frozenset("""
architectures model_type transformers_version torch_dtype dtype use_cache initializer_range
bos_token_id eos_token_id pad_token_id sep_token_id decoder_start_token_id tokenizer_class
return_dict output_hidden_states output_attentions torchscript pruned_heads chunk_size_feed_forward
is_decoder tie_encoder_decoder finetuning_task id2label label2id num_labels prefix task_specific_params
problem_type max_length min_length do_sample early_stopping num_beams num_beam_groups diversity_penalty
temperature top_k top_p typical_p repetition_penalty length_penalty no_repeat_ngram_size
encoder_no_repeat_ngram_size bad_words_ids num_return_sequences output_scores return_dict_in_generate
forced_bos_token_id forced_eos_token_id remove_invalid_values exponential_decay_length_penalty suppress_tokens
begin_suppress_tokens tf_legacy_loss use_bfloat16 cross_attention_hidden_size auto_map
rms_norm_eps layer_norm_eps layer_norm_epsilon pretraining_tp cache_implementation
output_router_logits router_aux_loss_coef router_z_loss_coef router_jitter_noise
is_llama_config transformers.js_config
""".split())

_DEFAULT_ONLY = {"use_bidirectional_attention": False, "rope_interleaved": False, "use_mrope": False}
"""Fields read past at the value every family genconf imports has (Gemma-3 and SmolLM2 configs write them out, and
Qwen2.5's and the DeepSeek-R1-Distill-Qwen configs `use_mrope`): causal attention, rotary pairs as halves of the
head, one position per token rather than Qwen2-VL's multimodal rotary sections. Any other value changes the model
and is refused."""

_TOKENIZER_KEYS = frozenset({"tokenizer_class", "model_max_length", "added_tokens_decoder", "add_bos_token",
                             "chat_template"})

FAMILIES: dict[str, tuple[str, Callable]] = {}
"""architectures[0] -> (family name, mapper). Filled by @_family below."""


def _family(name: str, *architectures: str):
    def register(fn):
        for arch in architectures:
            FAMILIES[arch] = (name, fn)
        return fn
    return register


@dataclass(frozen=True)
class HFModel:
    """A config.json read into a ModelSpec, with what genconf does not model said in words."""

    spec: ModelSpec
    architecture: str
    notes: tuple[str, ...]
    """Features of the checkpoint that change no parameter, memory or FLOP count genconf makes, or do but are
    not modelled (a sliding-window layer pattern no window_attn_skip_freq describes), one sentence each."""
    path: Path


class _Fields:
    """The config's fields, remembering which ones a mapper read so the rest can be checked."""

    def __init__(self, data: dict, where: str) -> None:
        self.data, self.where, self.read = data, where, set()
        self.info: list[str] = []
        """Notes on how a field was read that change no estimate (the import prints them; plans do not warn)."""

    def get(self, key: str, default=None):
        self.read.add(key)
        value = self.data.get(key)
        return default if value is None else value

    def integer(self, key: str, default: int | None = None, *, required: bool = True) -> int | None:
        value = self.get(key, default)
        if value is None:
            if required:
                raise GenconfError(f"{self.where}: missing field '{key}'")
            return None
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise GenconfError(f"{self.where}: field '{key}' must be a positive integer, got {value!r}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise GenconfError(f"{self.where}: field '{key}' must be true or false, got {value!r}")
        return value

    def fraction(self, key: str, default: float) -> float:
        value = self.get(key, default)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 <= value < 1.0:
            raise GenconfError(f"{self.where}: field '{key}' must be a probability in [0, 1), got {value!r}")
        return float(value)

    def refuse(self, key: str, value, why: str) -> GenconfError:
        return GenconfError(f"{self.where}: {key} = {json.dumps(value)} is not supported: {why}")


# --- shared pieces --------------------------------------------------------------------------------

_SILU = ("silu", "swish")
_GELU = ("gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_python", "quick_gelu")


_LAYER_TYPES = {"sliding_attention": True, "full_attention": False}
"""transformers' layer_types (and rope_parameters keys): whether the layer is windowed."""


def _rope_dicts(f: _Fields) -> tuple[dict | None, dict | None]:
    """(the global rotary parameters, the windowed layers' own or None) from rope_scaling and transformers 5's
    rope_parameters, checked: a dict (or null) each, a parameter set per layer type (Gemma-3 in transformers 5:
    {"full_attention": {...}, "sliding_attention": {...}}) split into the full layers' and the windowed layers', a
    numeric factor and original context. None where neither key holds one."""
    main = local = None
    for key in ("rope_scaling", "rope_parameters"):
        value = f.get(key)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise f.refuse(key, value, "an object of rotary parameters (or null) is expected")
        nested = {k: v for k, v in value.items() if isinstance(v, dict)}
        flat_types = sorted(k for k in value if k in _LAYER_TYPES and k not in nested)
        if flat_types:  # {"full_attention": 1}: a layer type's parameters must be an object, not read as a flat key
            raise f.refuse(key, value, f"the rotary parameters of {', '.join(flat_types)} must be an object")
        if nested:
            if set(nested) - set(_LAYER_TYPES) or len(nested) != len(value):
                raise f.refuse(key, value, f"rotary parameters per layer type are read for {', '.join(_LAYER_TYPES)} "
                               "only")
            value, local = nested.get("full_attention", {}), nested.get("sliding_attention", local)
        for part in filter(None, (value, local)):
            factor, original = part.get("factor"), part.get("original_max_position_embeddings")
            if factor is not None and (isinstance(factor, bool) or not isinstance(factor, (int, float)) or
                                       not factor > 0):
                raise f.refuse(key, part, "its factor must be a positive number")
            if original is not None and (isinstance(original, bool) or not isinstance(original, int) or original < 1):
                raise f.refuse(key, part, "its original_max_position_embeddings must be a positive integer")
        main = {**(main or {}), **value}
    return main, local


DEFAULT_SEQ_LENGTH = 8192
"""The longest sequence an import plans by default: max_position_embeddings is the context a checkpoint serves, often
far past what it was pre-trained at (Mistral-Nemo's 1,024,000, Qwen3's 40,960), and a plan at that length is a
long-context run of its own (context parallelism, minutes per step). Said in f.info; --seq-len plans longer."""

SEQ_NOTE_TAIL = "(plan longer runs with --seq-len)"
"""How the note on the chosen sequence ends: a plan given --seq-len leaves that note out."""


def _seq_length(f: _Fields) -> int:
    """The pre-training context: rope scaling's original length where the checkpoint was extended by it, else
    max_position_embeddings; either at most DEFAULT_SEQ_LENGTH (said in f.info: planning at the pre-training context is
    a choice, not an approximation)."""
    longest = f.integer("max_position_embeddings")
    scaling, _ = _rope_dicts(f)
    if scaling and scaling.get("original_max_position_embeddings"):
        original = scaling["original_max_position_embeddings"]
        kind = scaling.get("rope_type") or scaling.get("type") or "scaled"
        if original < longest:
            seq = min(original, DEFAULT_SEQ_LENGTH)
            f.info.append(f"{kind} rope scaling stretches the context to {longest:,} tokens from {original:,}; "
                          f"seq_length is {seq:,} {SEQ_NOTE_TAIL}")
            return seq
    if longest > DEFAULT_SEQ_LENGTH:
        f.info.append(f"max_position_embeddings is {longest:,} (the context it serves); seq_length is "
                      f"{DEFAULT_SEQ_LENGTH:,}, a pre-training length {SEQ_NOTE_TAIL}")
        return DEFAULT_SEQ_LENGTH
    return longest


def _rope(f: _Fields, notes: list[str]) -> dict:
    """ModelSpec.rope_theta and rope_scaling_factor of a rotary model: rope_theta (top level, or inside transformers
    5's rope_parameters; the full-attention layers' where it is given per layer type), and the factor of Llama 3.1's
    rope_type llama3 scaling (megatron --use-rope-scaling). Other scalings (YaRN, linear, dynamic) change no count
    genconf makes and are not rendered: said in f.info. A windowed layers' base of their own is a note."""
    out = {}
    scaling, local = _rope_dicts(f)
    theta = (scaling or {}).get("rope_theta", f.get("rope_theta"))
    if theta is not None:
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 1:
            raise GenconfError(f"{f.where}: field 'rope_theta' must be a number above 1, got {theta!r}")
        out["rope_theta"] = float(theta)
    if local and local.get("rope_theta") is not None and local.get("rope_theta") != theta:
        notes.append(f"the windowed layers' rotary base is {local['rope_theta']:,.10g}: the artifacts rotate every "
                     f"layer at {theta:,.10g}")
    if scaling is not None and scaling.get("factor") is not None:
        kind = scaling.get("rope_type") or scaling.get("type") or "scaled"
        low, high, original = LLAMA3_ROPE_SCALING
        shape = (scaling.get("low_freq_factor", low), scaling.get("high_freq_factor", high),
                 scaling.get("original_max_position_embeddings", original))
        if kind == "llama3" and shape == LLAMA3_ROPE_SCALING:
            out["rope_scaling_factor"] = float(scaling["factor"])
        elif kind != "default":
            f.info.append(f"its {kind} rope scaling (factor {scaling['factor']:g}) is not written into the artifacts: "
                          f"they rotate at rope_theta alone")
    return out


def _window_pattern(windowed: list[bool]) -> int | None:
    """ModelSpec.window_attn_skip_freq for a per-layer list (True: windowed): 0 when every layer is windowed, n when
    layer i (1-indexed) is windowed exactly when i % n != 0 (megatron-core's transformer/utils.py
    is_layer_window_attention), None when no such n describes the list (megatron-core also takes a per-layer list;
    genconf's ModelSpec does not)."""
    if all(windowed):
        return 0
    for n in range(2, len(windowed) + 1):
        if all(w == ((i + 1) % n != 0) for i, w in enumerate(windowed)):
            return n
    return None


def _sliding_window(f: _Fields, notes: list[str], layers: int, *, use_default: bool = True,
                    every_other: bool = False, window_default: int | None = None,
                    first_full_default: int | None = None, pattern: int | None = None) -> dict:
    """Sliding-window attention as ModelSpec's sliding_window and window_attn_skip_freq (megatron-core's window_size
    (w, 0) and window_attn_skip_freq: a query sees itself and the w keys before it, as Megatron-Bridge imports
    GPT-OSS; transformers' own mask keeps one key fewer). Which layers are windowed: transformers' `layer_types` where
    the config lists them; else Qwen2's rule (layers from max_window_layers on, when use_sliding_window); else Gemma-3's
    (`pattern`: every layer but each pattern-th); else every layer (Mistral) or every other one from the first
    (Gemma-2). Defaults where a key is absent are the transformers config class's (`window_default`,
    `first_full_default`)."""
    use = f.get("use_sliding_window", use_default)
    window = f.get("sliding_window") if "sliding_window" in f.data else window_default
    first_full = f.get("max_window_layers", first_full_default)
    types = f.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers or any(t not in _LAYER_TYPES for t in types):
            raise f.refuse("layer_types", types, f"one of {', '.join(_LAYER_TYPES)} per layer ({layers}) is expected")
    if not use or window is None:
        return {}
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise f.refuse("sliding_window", window, "a positive number of tokens (or null: no window) is expected")
    if types is not None:
        windowed = [_LAYER_TYPES[t] for t in types]
    elif isinstance(first_full, int):
        windowed = [i >= first_full for i in range(layers)]  # modeling_qwen2: full below max_window_layers
    elif pattern:
        windowed = [(i + 1) % pattern != 0 for i in range(layers)]  # modeling_gemma3: is_sliding
    else:
        windowed = [i % 2 == 0 for i in range(layers)] if every_other else [True] * layers
    if not any(windowed):
        return {}
    freq = _window_pattern(windowed)
    if freq is None:
        notes.append(f"sliding-window attention ({window:,} tokens) on {sum(windowed)} of {layers} layers, in no "
                     f"pattern one window_attn_skip_freq describes: priced as full causal attention (an upper bound)")
        return {}
    return {"sliding_window": window, "window_attn_skip_freq": freq}


def _softcapping(f: _Fields, notes: list[str]) -> None:
    """Gemma-2/3's attention and final logit soft-capping (tanh): noted, as no parameter or counted FLOP changes."""
    caps = [f"{k} {f.get(k)}" for k in ("attn_logit_softcapping", "final_logit_softcapping") if f.get(k) is not None]
    if caps:
        notes.append(f"logit soft-capping ({', '.join(caps)}) is element-wise: no parameters, FLOPs not counted")


def _query_scale(f: _Fields, notes: list[str], values: dict) -> None:
    """Gemma-2/3's query_pre_attn_scalar: scores scaled by 1/sqrt(it) rather than 1/sqrt(head_dim). megatron-core's
    TransformerConfig.softmax_scale would carry it, but Megatron-LM has no flag for it (arguments.py leaves it out)."""
    scalar = f.get("query_pre_attn_scalar")
    head_dim = values.get("kv_channels") or values["hidden_size"] // values["num_attention_heads"]
    if scalar is not None and scalar != head_dim:
        notes.append(f"attention scores are scaled by 1/sqrt({scalar}) (query_pre_attn_scalar); the artifacts and "
                     f"genconf's own model scale by 1/sqrt(head_dim {head_dim}) (no parameters or FLOPs change)")


def _gated(f: _Fields, notes: list[str], key: str = "hidden_act") -> str:
    """SiLU-gated MLPs are SwiGLU; a GELU gate (Gemma's GeGLU) has the same tensors and FLOPs."""
    act = f.get(key, "silu")
    if act in _SILU:
        return "swiglu"
    if act in _GELU:
        notes.append(f"the MLP gate is GELU ({act}, GeGLU), counted as SwiGLU: the same tensors, memory and FLOPs; "
                     "genconf's own model and the rendered Megatron/OLMo configs build SwiGLU")
        return "swiglu"
    raise f.refuse(key, act, f"a gated MLP with SiLU or GELU is expected ({', '.join(_SILU + _GELU)})")


def _plain_gelu(f: _Fields, key: str, notes: list[str]) -> str:
    act = f.get(key, "gelu")
    if act not in _GELU:
        raise f.refuse(key, act, f"genconf models a GELU MLP here ({', '.join(_GELU)})")
    if act not in ("gelu", "gelu_python"):
        notes.append(f"the MLP's {act} (an approximation of GELU) is built as exact GELU by the artifacts and genconf's "
                     "own model: the same parameters and FLOPs, slightly different activations")
    return "gelu"


def _linear_biases(f: _Fields, *, mlp_key: str | None = "mlp_bias") -> bool:
    """Llama-style `attention_bias` (q, k, v and o) and `mlp_bias`: both or neither is add_bias_linear."""
    attention = f.flag("attention_bias", False)
    mlp = f.flag(mlp_key, False) if mlp_key else False
    if attention != mlp:
        mlp_says = f"{mlp_key} is {json.dumps(mlp)}" if mlp_key else "this family's MLP has no bias"
        raise f.refuse("attention_bias", attention, f"{mlp_says}, and genconf has biases on every linear layer "
                       "(add_bias_linear) or on QKV only (add_qkv_bias), not this mix")
    return attention


def _llama_like(f: _Fields, notes: list[str], *, tie_default: bool, act_key: str = "hidden_act",
                mlp_bias_key: str | None = "mlp_bias") -> dict:
    heads = f.integer("num_attention_heads")
    seq = _seq_length(f)
    return dict(
        num_layers=f.integer("num_hidden_layers"), hidden_size=f.integer("hidden_size"), num_attention_heads=heads,
        num_query_groups=f.integer("num_key_value_heads", heads), kv_channels=f.integer("head_dim", required=False),
        ffn_hidden_size=f.integer("intermediate_size"), vocab_size=f.integer("vocab_size"), seq_length=seq,
        activation=_gated(f, notes, act_key), normalization="rmsnorm", position_embedding="rope",
        tie_embeddings=f.flag("tie_word_embeddings", tie_default),
        add_bias_linear=_linear_biases(f, mlp_key=mlp_bias_key),
        hidden_dropout=0.0, attention_dropout=f.fraction("attention_dropout", 0.0),
    )


# --- families -------------------------------------------------------------------------------------
# Defaults are the transformers config classes' own (tie_word_embeddings differs by family).

@_family("llama", "LlamaForCausalLM")
def _llama(f: _Fields, notes: list[str]) -> dict:
    values = _llama_like(f, notes, tie_default=False)
    values.update(_sliding_window(f, notes, values["num_layers"]))
    return values


@_family("mistral", "MistralForCausalLM")
def _mistral(f: _Fields, notes: list[str]) -> dict:
    # MistralConfig: sliding_window 4096 when the key is absent (null: none, as from v0.2 on).
    values = _llama_like(f, notes, tie_default=False)
    values.update(_sliding_window(f, notes, values["num_layers"], window_default=4096))
    return values


@_family("mixtral", "MixtralForCausalLM")
def _mixtral(f: _Fields, notes: list[str]) -> dict:
    values = _llama_like(f, notes, tie_default=False)
    values.update(_sliding_window(f, notes, values["num_layers"]))
    # Every layer is sparse: block_sparse_moe.gate (e x h, no bias) and e SwiGLU experts of intermediate_size.
    # Its router: softmax, the top k renormalised (megatron's default router: a softmax over the k chosen).
    top_k = f.integer("num_experts_per_tok")
    values.update(num_experts=f.integer("num_local_experts"), moe_top_k=top_k, moe_ffn_hidden_size=values["ffn_hidden_size"],
                  **_aux_loss(f, 0.001, top_k=top_k, layers=values["num_layers"]))
    return values


@_family("qwen2", "Qwen2ForCausalLM")
def _qwen2(f: _Fields, notes: list[str]) -> dict:
    # modeling_qwen2: q_proj, k_proj and v_proj have biases, o_proj and the MLP none (not a config field).
    values = _llama_like(f, notes, tie_default=False, mlp_bias_key=None)
    values["add_qkv_bias"] = True
    values.update(_sliding_window(f, notes, values["num_layers"], use_default=False, first_full_default=28))
    return values


@_family("qwen3", "Qwen3ForCausalLM")
def _qwen3(f: _Fields, notes: list[str]) -> dict:
    # modeling_qwen3: q_norm and k_norm are RMSNorm(head_dim), applied per head.
    values = _llama_like(f, notes, tie_default=False, mlp_bias_key=None)
    values.update(qk_layernorm=True, qk_layernorm_per_head=True)
    values.update(_sliding_window(f, notes, values["num_layers"], use_default=False, first_full_default=28))
    return values


def _qwen_moe(f: _Fields, values: dict) -> dict:
    """The MoE fields Qwen2-MoE and Qwen3-MoE share: every layer MoE, a router (gate) of e x h without bias, SwiGLU
    experts of moe_intermediate_size. norm_topk_prob false (both configs' default): softmax over every expert, the top
    k's weights kept as they are: megatron's pre-softmax router (Megatron-Bridge's Qwen MoE bridges: pre_softmax =
    not norm_topk_prob)."""
    step, dense = f.get("decoder_sparse_step", 1), f.get("mlp_only_layers", [])
    if step != 1:
        raise f.refuse("decoder_sparse_step", step, "genconf models every layer as MoE (decoder_sparse_step 1)")
    if dense:
        raise f.refuse("mlp_only_layers", dense, "genconf models every layer as MoE (no dense layers)")
    top_k = f.integer("num_experts_per_tok")
    values.update(num_experts=f.integer("num_experts"), moe_top_k=top_k,
                  moe_ffn_hidden_size=f.integer("moe_intermediate_size"),
                  moe_router_pre_softmax=not f.flag("norm_topk_prob", False),
                  **_aux_loss(f, 0.001, top_k=top_k, layers=values["num_layers"]))
    return values


@_family("qwen3-moe", "Qwen3MoeForCausalLM")
def _qwen3_moe(f: _Fields, notes: list[str]) -> dict:
    """Qwen3-MoE: Qwen3's attention and _qwen_moe's experts; no shared expert."""
    return _qwen_moe(f, _qwen3(f, notes))


@_family("qwen2-moe", "Qwen2MoeForCausalLM")
def _qwen2_moe(f: _Fields, notes: list[str]) -> dict:
    """Qwen1.5-MoE / Qwen2-MoE (modeling_qwen2_moe): Qwen2's attention (q, k and v biases), _qwen_moe's experts, and
    in every layer one shared expert MLP of shared_expert_intermediate_size whose output is scaled by
    sigmoid(shared_expert_gate(x)), an h -> 1 linear without bias: megatron-core's moe_shared_expert_gate
    (shared_experts.py gate_weight, shape (1, h))."""
    values = _qwen_moe(f, _qwen2(f, notes))
    values.update(moe_shared_expert_intermediate_size=f.integer("shared_expert_intermediate_size"),
                  moe_shared_expert_gate=True)
    return values


@_family("olmoe", "OlmoeForCausalLM")
def _olmoe(f: _Fields, notes: list[str]) -> dict:
    """OLMoE (modeling_olmoe): OLMo-2-style q_norm = RMSNorm(heads * head_dim) and k_norm = RMSNorm(kv_heads * head_dim)
    over the full width, but pre-norm layers; every layer a router (e x h, no bias) and num_experts SwiGLU experts of
    intermediate_size, no shared expert."""
    values = _llama_like(f, notes, tie_default=False, mlp_bias_key=None)
    values["qk_layernorm"] = True
    if f.get("clip_qkv") is not None:
        notes.append(f"q, k and v are clipped to +-{f.get('clip_qkv')} (element-wise, no parameters)")
    top_k = f.integer("num_experts_per_tok")
    # norm_topk_prob false (OlmoeConfig's default): megatron's pre-softmax router (Megatron-Bridge's OLMoE bridge sets
    # moe_router_pre_softmax); router_aux_loss_coef 0.01 where absent (OlmoeConfig).
    values.update(num_experts=f.integer("num_experts"), moe_top_k=top_k, moe_ffn_hidden_size=values["ffn_hidden_size"],
                  moe_router_pre_softmax=not f.flag("norm_topk_prob", False),
                  **_aux_loss(f, 0.01, top_k=top_k, layers=values["num_layers"]))
    return values


@_family("phi3", "Phi3ForCausalLM")
def _phi3(f: _Fields, notes: list[str]) -> dict:
    """Phi-3 / Phi-3.5 / Phi-4-mini (modeling_phi3): llama's tensors, with q, k and v fused into qkv_proj and gate and
    up into gate_up_proj (the same parameter counts as the separate projections), no biases, and the config's
    sliding_window passed to every layer's attention (Phi3Attention: sliding_window=config.sliding_window)."""
    for key in ("mlp_bias", "lm_head_bias"):  # Phi-4-mini's config writes both false: modeling_phi3 has no biases
        if f.flag(key, False):
            raise f.refuse(key, True, "modeling_phi3 has no biases on its projections")
    if f.flag("attention_bias", False):
        raise f.refuse("attention_bias", True, "modeling_phi3 has no biases on its projections")
    # Phi-4-mini's remote-code keys: every layer full (full_attn_mod 1) and no position interpolation (factor 1);
    # transformers' Phi3Config has neither, and any other value would change the attention.
    for key in ("full_attn_mod", "interpolate_factor"):
        if f.get(key, 1) != 1:
            raise f.refuse(key, f.get(key), f"genconf imports Phi-3 with {key} 1 (transformers' modeling_phi3)")
    values = _llama_like(f, notes, tie_default=False, mlp_bias_key=None)
    values["hidden_dropout"] = f.fraction("resid_pdrop", 0.0)
    if f.fraction("embd_pdrop", 0.0) != values["hidden_dropout"]:
        f.info.append(f"embd_pdrop {f.get('embd_pdrop')} is written as the hidden dropout {values['hidden_dropout']}")
    longest = f.integer("max_position_embeddings")
    original = f.integer("original_max_position_embeddings", required=False)
    if original and original < longest:  # Phi3Config keeps the pre-training context at the top level
        seq = min(original, DEFAULT_SEQ_LENGTH)
        f.info[:] = [i for i in f.info if not i.startswith("max_position_embeddings is")]
        f.info.append(f"rope scaling stretches the context to {longest:,} tokens from {original:,}; seq_length is "
                      f"{seq:,} {SEQ_NOTE_TAIL}")
        values["seq_length"] = seq
    scaling, _ = _rope_dicts(f)
    kind = (scaling or {}).get("rope_type") or (scaling or {}).get("type")
    if kind == "longrope":  # a per-frequency rescale of the rotary angles: no parameters
        f.info.append("its longrope rope scaling (short_factor / long_factor per frequency) is not written into the "
                      "artifacts: they rotate at rope_theta alone")
    share = f.get("partial_rotary_factor", 1.0)
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
        raise f.refuse("partial_rotary_factor", share, "a share of each head's dimensions in (0, 1] is expected")
    if share != 1:
        # modeling_phi3 rotates the first int(head_dim * share) dimensions of each head, as megatron-core's
        # rotary_percent does (--rotary-percent); no parameter changes.
        values["rotary_percent"] = float(share)
    window = f.get("sliding_window")
    if isinstance(window, int) and not isinstance(window, bool) and window >= longest:
        # A window at least as long as any sequence masks nothing (Phi-3.5-mini: 262,144 > 131,072 positions).
        f.info.append(f"sliding_window {window:,} is no shorter than max_position_embeddings {longest:,}: full "
                      f"causal attention")
    else:
        values.update(_sliding_window(f, notes, values["num_layers"]))
    return values


@_family("granite", "GraniteForCausalLM")
def _granite(f: _Fields, notes: list[str]) -> dict:
    """IBM Granite 3.x (modeling_granite): Llama's tensors, and four scalars that scale activations without
    parameters: the embeddings by embedding_multiplier, each sublayer's output by residual_multiplier before the
    residual add, attention scores by attention_multiplier (instead of 1/sqrt(head_dim)), logits divided by
    logits_scaling."""
    values = _llama_like(f, notes, tie_default=False)
    defaults = {"embedding_multiplier": 1.0, "residual_multiplier": 1.0, "attention_multiplier": 1.0,
                "logits_scaling": 1.0}  # GraniteConfig's defaults
    scalars = {k: f.get(k, d) for k, d in defaults.items()}
    for key, value in scalars.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise f.refuse(key, value, "a positive number is expected")
    changed = [f"{k} {v:g}" for k, v in scalars.items() if v != defaults[k]]
    if changed:
        notes.append(f"its scalar multipliers ({', '.join(changed)}) have no parameters or counted FLOPs; the artifacts "
                     f"do not apply them (Megatron-LM has no flags for them)")
    return values


@_family("deepseek-v3", "DeepseekV3ForCausalLM")
def _deepseek_v3(f: _Fields, notes: list[str]) -> dict:
    """DeepSeek-V3 / R1 and Kimi K2: MLA, shared experts, dense first layers, sigmoid routing with the
    aux-loss-free expert bias (topk_method noaux_tc), multi-token prediction."""
    method = f.get("topk_method", "noaux_tc")
    if method != "noaux_tc":
        raise f.refuse("topk_method", method, "genconf imports DeepSeek-V3's noaux_tc routing (sigmoid scores and an "
                       "expert bias)")
    if f.get("scoring_func", "sigmoid") != "sigmoid":
        raise f.refuse("scoring_func", f.get("scoring_func"), "noaux_tc routing scores experts with a sigmoid")
    if not f.flag("norm_topk_prob", True):
        # megatron-core's sigmoid router always renormalises the k chosen scores (moe_utils.topk_routing_with_score_function).
        raise f.refuse("norm_topk_prob", False, "megatron-core renormalises a sigmoid router's top k; genconf cannot "
                       "leave them as they are")
    values = _mla_moe(f, notes)
    # Megatron-Bridge's DeepSeek-V3 bridge: seq_aux_loss at aux_loss_alpha (1e-4 where absent), expert bias.
    coeff = f.get("aux_loss_alpha", 1e-4)
    f.get("seq_aux")  # the sequence-wise loss: the one megatron's seq_aux_loss computes
    values.update(moe_router_score_function="sigmoid", moe_router_expert_bias=True,
                  moe_router_load_balancing="seq_aux_loss", moe_aux_loss_coeff=float(coeff),
                  mtp_num_layers=f.get("num_nextn_predict_layers", 0))
    notes.append("its routers' e_score_correction_bias (n_routed_experts a MoE layer) is a checkpoint tensor that "
                 "megatron-core keeps as a buffer (expert_bias): not counted as a parameter")
    return values


@_family("deepseek-v2", "DeepseekV2ForCausalLM")
def _deepseek_v2(f: _Fields, notes: list[str]) -> dict:
    """DeepSeek-V2 and V2-Lite (modeling_deepseek.py of deepseek-ai/DeepSeek-V2): MLA (V2-Lite without the query
    latent), shared experts, dense first layers, and a softmax router (MoEGate) whose top k keep their weights from the
    softmax over every expert (norm_topk_prob false) times routed_scaling_factor: megatron-core's pre-softmax router
    with --moe-router-topk-scaling-factor, as Megatron-Bridge's DeepSeek-V2 bridge sets it. topk_method greedy picks
    the top k of all experts; group_limited_greedy (device-limited routing, DeepSeek-V2 Sec. 2.2.2) first keeps each
    token's topk_group best of n_group expert groups."""
    method = f.get("topk_method", "greedy")  # DeepseekV2Config's default
    if method not in ("greedy", "group_limited_greedy"):
        raise f.refuse("topk_method", method, "DeepSeek-V2 routes greedy or group_limited_greedy (noaux_tc is "
                       "DeepSeek-V3's: DeepseekV3ForCausalLM)")
    if f.get("scoring_func", "softmax") != "softmax":
        raise f.refuse("scoring_func", f.get("scoring_func"), "DeepSeek-V2's MoEGate scores experts with a softmax")
    values = _mla_moe(f, notes)
    top_k, experts = values["moe_top_k"], values["num_experts"]
    # MoEGate: with norm_topk_prob (and k > 1) the top k are renormalised and routed_scaling_factor is not applied;
    # megatron-core's softmax over the k chosen logits is that renormalisation, but it would still scale them.
    renormalised = f.flag("norm_topk_prob", False) and top_k > 1
    if renormalised and values["moe_router_topk_scaling_factor"]:
        raise f.refuse("routed_scaling_factor", f.get("routed_scaling_factor"), "with norm_topk_prob true DeepSeek-V2 "
                       "leaves the renormalised weights unscaled, where megatron-core would scale them")
    values["moe_router_pre_softmax"] = not renormalised
    groups, group_topk = values["moe_router_num_groups"], values["moe_router_group_topk"]
    if method == "greedy" or groups == 1:
        # n_group and topk_group are read past: greedy routing (or one group) chooses among every expert.
        values.update(moe_router_num_groups=None, moe_router_group_topk=None)
    else:
        if experts % groups or group_topk > groups or group_topk > top_k:
            raise f.refuse("topk_group", group_topk, f"megatron-core ranks each of the n_group {groups} groups of the "
                           f"{experts} experts by its best num_experts_per_tok / topk_group experts: n_group must "
                           f"divide the experts and topk_group be at most n_group and num_experts_per_tok {top_k}")
        if top_k // group_topk != 1:
            # moe_utils.group_limited_topk: group_scores = scores.topk(topk // group_topk).sum(); MoEGate: .max()
            notes.append(f"DeepSeek-V2 ranks its {groups} expert groups by each group's best expert score; "
                         f"megatron-core's group-limited routing ranks them by the sum of their top "
                         f"{top_k // group_topk} (top-{top_k} over {group_topk} groups): the same tensors and FLOPs, "
                         f"tokens may reach other groups")
    # MoEGate's balance loss at aux_loss_alpha (DeepseekV2Config: 0.001): per sequence when seq_aux (megatron-core's
    # seq_aux_loss), else over the batch's tokens (its aux_loss); the paper's device- and communication-level losses
    # (Sec. 2.2.3) have no config field.
    coeff = f.get("aux_loss_alpha", 0.001)
    if isinstance(coeff, bool) or not isinstance(coeff, (int, float)) or coeff < 0:
        raise f.refuse("aux_loss_alpha", coeff, "a number >= 0 is expected")
    per_sequence = f.flag("seq_aux", True)
    balancing = ("seq_aux_loss" if per_sequence else "aux_loss") if coeff > 0 else "none"
    values.update(moe_router_load_balancing=balancing, moe_aux_loss_coeff=float(coeff))
    # transformers 5's DeepseekV2Config writes these out: no MLP bias, and head_dim as the rotary part of a head.
    if f.flag("mlp_bias", False):
        raise f.refuse("mlp_bias", True, "DeepSeek-V2's MLPs and experts have no biases")
    if f.get("head_dim", values["qk_pos_emb_head_dim"]) != values["qk_pos_emb_head_dim"]:
        raise f.refuse("head_dim", f.get("head_dim"), f"transformers' DeepseekV2Config sets it to qk_rope_head_dim "
                       f"({values['qk_pos_emb_head_dim']})")
    return values


def _mla_moe(f: _Fields, notes: list[str]) -> dict:
    """The DeepSeek-V2/V3 tensors: MLA (DeepSeek-V2 Sec. 2.1), DeepSeekMoE's routed and shared experts (Sec. 2.2),
    first_k_dense_replace dense layers, and the router's group-limited top-k."""
    heads = f.integer("num_attention_heads")
    if f.get("num_key_value_heads", heads) != heads:
        raise f.refuse("num_key_value_heads", f.get("num_key_value_heads"), "multi-head latent attention has one "
                       "key and value per query head")
    if f.flag("attention_bias", False):
        raise f.refuse("attention_bias", True, "genconf's MLA has no biases on its projections")
    if f.get("moe_layer_freq", 1) != 1:
        raise f.refuse("moe_layer_freq", f.get("moe_layer_freq"), "genconf models every layer after "
                       "first_k_dense_replace as MoE (moe_layer_freq 1)")
    f.get("ep_size")  # the inference code's expert-parallel degree: no count changes
    shared = f.get("n_shared_experts", 0)
    if not isinstance(shared, int) or isinstance(shared, bool) or shared < 0:
        raise f.refuse("n_shared_experts", shared, "a number of shared experts >= 0 is expected")
    expert = f.integer("moe_intermediate_size")
    groups, group_topk = f.integer("n_group", 1), f.integer("topk_group", 1)
    scaling = f.get("routed_scaling_factor", 1.0)
    if isinstance(scaling, bool) or not isinstance(scaling, (int, float)) or not scaling > 0:
        raise f.refuse("routed_scaling_factor", scaling, "a positive number is expected")
    dense = f.get("first_k_dense_replace", 0)
    if not isinstance(dense, int) or isinstance(dense, bool) or dense < 0:
        raise f.refuse("first_k_dense_replace", dense, "a number of layers >= 0 is expected")
    # DeepseekV2Config / DeepseekV3Config: q_lora_rank 1536 where the key is absent; null projects the queries
    # straight from the hidden state (DeepSeek-V2-Lite).
    q_lora_rank = f.integer("q_lora_rank", None if "q_lora_rank" in f.data else 1536, required=False)
    return dict(
        num_layers=f.integer("num_hidden_layers"), hidden_size=f.integer("hidden_size"), num_attention_heads=heads,
        ffn_hidden_size=f.integer("intermediate_size"), vocab_size=f.integer("vocab_size"), seq_length=_seq_length(f),
        activation=_gated(f, notes), normalization="rmsnorm", position_embedding="rope",
        tie_embeddings=f.flag("tie_word_embeddings", False), add_bias_linear=False, hidden_dropout=0.0,
        attention_dropout=f.fraction("attention_dropout", 0.0),
        kv_lora_rank=f.integer("kv_lora_rank"), q_lora_rank=q_lora_rank,
        qk_head_dim=f.integer("qk_nope_head_dim"), qk_pos_emb_head_dim=f.integer("qk_rope_head_dim"),
        v_head_dim=f.integer("v_head_dim"),
        num_experts=f.integer("n_routed_experts"), moe_top_k=f.integer("num_experts_per_tok"),
        moe_ffn_hidden_size=expert, first_k_dense_replace=dense,
        # DeepSeekMoE: the n_shared_experts shared experts run as one MLP of n x moe_intermediate_size.
        moe_shared_expert_intermediate_size=shared * expert or None,
        moe_router_topk_scaling_factor=float(scaling) if scaling != 1 else None,
        moe_router_num_groups=groups, moe_router_group_topk=group_topk,
    )


@_family("gpt-oss", "GptOssForCausalLM")
def _gpt_oss(f: _Fields, notes: list[str]) -> dict:
    """gpt-oss-20b / 120b (modeling_gpt_oss): GQA with q/k/v/o biases and a learned sink logit per head, alternating
    128-token windowed and full layers, MoE experts with biases and a clamped GLU, a router with a bias."""
    if not f.flag("attention_bias", True):
        raise f.refuse("attention_bias", False, "gpt-oss's experts keep their biases: genconf cannot drop only the "
                       "attention's")
    # Its experts always have biases (gate_up_proj_bias, down_proj_bias): with attention_bias, every linear layer does.
    values = _llama_like(f, notes, tie_default=False, mlp_bias_key="attention_bias")
    values.update(_sliding_window(f, notes, values["num_layers"]))
    top_k = f.integer("num_experts_per_tok")
    if f.get("experts_per_token", top_k) != top_k:  # the original checkpoint's name for num_experts_per_tok
        raise f.refuse("experts_per_token", f.get("experts_per_token"), f"num_experts_per_tok is {top_k}")
    f.get("initial_context_length")  # the pre-training context, as rope_scaling's original_max_position_embeddings
    limit = f.get("swiglu_limit")
    # Megatron-Bridge's GPT-OSS bridge: softmax over the top k (pre_softmax false), no balancing loss, clamp 7.0;
    # router_aux_loss_coef is transformers' (unused by the bridge).
    f.get("router_aux_loss_coef")
    values.update(num_experts=f.integer("num_local_experts"), moe_top_k=top_k,
                  moe_ffn_hidden_size=values["ffn_hidden_size"], moe_router_load_balancing="none",
                  moe_aux_loss_coeff=0.0, **({"activation_clamp": float(limit)} if limit is not None else {}))
    notes.append("its attention sinks (one learned logit per head and layer) are not counted: megatron-core "
                 "softmax_type learnable has no Megatron-LM flag (its routers' bias is: megatron-core's router "
                 "takes one per expert from add_bias_linear)")
    return values


def _aux_loss(f: _Fields, default: float, *, top_k: int, layers: int) -> dict:
    """ModelSpec.moe_aux_loss_coeff from router_aux_loss_coef (the config class's default where absent), 1:1 as
    Megatron-Bridge's bridges map it. The two losses differ in scale, said in f.info: transformers' one loss pools
    every layer's tokens and counts each of a token's k choices (modeling_mixtral load_balancing_loss_func), where
    megatron-core adds each layer's loss over fractions of T x k choices (moe_utils.switch_load_balancing_loss_func),
    so coefficient x k / layers balances as transformers does."""
    coeff = f.get("router_aux_loss_coef", default)
    if isinstance(coeff, bool) or not isinstance(coeff, (int, float)) or coeff < 0:
        raise f.refuse("router_aux_loss_coef", coeff, "a number >= 0 is expected")
    if coeff > 0:
        f.info.append(f"router_aux_loss_coef {coeff:g} is written as --moe-aux-loss-coeff {coeff:g}, as Megatron-Bridge "
                      f"maps it; megatron-core adds that loss per layer over top-{top_k} fractions, so "
                      f"{coeff * top_k / layers:.3g} (x {top_k} / {layers} layers) would balance as transformers' "
                      f"pooled loss does")
    return {"moe_aux_loss_coeff": float(coeff)}


@_family("olmo", "OlmoForCausalLM")
def _olmo(f: _Fields, notes: list[str]) -> dict:
    # modeling_olmo: LayerNorm without weight or bias (OlmoLayerNorm), bias-free MLP.
    values = _llama_like(f, notes, tie_default=False, mlp_bias_key=None)
    values["normalization"] = "nonparametric"
    if f.get("clip_qkv") is not None:
        notes.append(f"q, k and v are clipped to +-{f.get('clip_qkv')} (element-wise, no parameters)")
    return values


@_family("olmo2", "Olmo2ForCausalLM")
def _olmo2(f: _Fields, notes: list[str]) -> dict:
    # modeling_olmo2: q_norm = RMSNorm(heads * head_dim), k_norm = RMSNorm(kv_heads * head_dim), over the full width.
    values = _llama_like(f, notes, tie_default=False, mlp_bias_key=None)
    values["qk_layernorm"] = True
    notes.append("RMSNorm follows each sublayer (x + norm(f(x))) instead of preceding it: the same parameters")
    return values


@_family("gemma", "GemmaForCausalLM")
def _gemma(f: _Fields, notes: list[str]) -> dict:
    # GemmaConfig: hidden_activation wins over the legacy hidden_act; embeddings tied by default.
    key = "hidden_activation" if f.data.get("hidden_activation") is not None else "hidden_act"
    f.get("hidden_act")
    values = _llama_like(f, notes, tie_default=True, act_key=key, mlp_bias_key=None)
    notes.append("the embedding output is scaled by sqrt(hidden_size) and RMSNorm weights are offsets from 1 "
                 "(no parameters)")
    return values


@_family("gemma2", "Gemma2ForCausalLM")
def _gemma2(f: _Fields, notes: list[str]) -> dict:
    values = _gemma(f, notes)
    # modeling_gemma2: input, post_attention, pre_feedforward and post_feedforward RMSNorms in every layer.
    values["sandwich_norm"] = True
    values.update(_sliding_window(f, notes, values["num_layers"], every_other=True))
    _softcapping(f, notes)
    _query_scale(f, notes, values)
    f.get("sliding_window_size")  # the early gemma-2-9b/27b configs repeat sliding_window under this name
    return values


@_family("gemma3", "Gemma3ForCausalLM")
def _gemma3(f: _Fields, notes: list[str]) -> dict:
    values = _gemma(f, notes)
    # modeling_gemma3: Gemma-2's four norms per layer, and q_norm / k_norm RMSNorm(head_dim) on each head.
    values.update(sandwich_norm=True, qk_layernorm=True, qk_layernorm_per_head=True)
    # Gemma3TextConfig: sliding_window 4096 and sliding_window_pattern 6 when absent (every 6th layer full).
    pattern = f.get("sliding_window_pattern", 6)
    if not isinstance(pattern, int) or isinstance(pattern, bool) or pattern < 1:
        raise f.refuse("sliding_window_pattern", pattern, "a positive number of layers is expected")
    values.update(_sliding_window(f, notes, values["num_layers"], window_default=4096, pattern=pattern))
    _softcapping(f, notes)
    if f.get("rope_local_base_freq") is not None:
        notes.append(f"the windowed layers' rotary base is {f.get('rope_local_base_freq'):,.10g}: the artifacts "
                     f"rotate every layer at rope_theta")
    _query_scale(f, notes, values)
    return values


@_family("gpt2", "GPT2LMHeadModel")
def _gpt2(f: _Fields, notes: list[str]) -> dict:
    if f.flag("add_cross_attention", False):
        raise f.refuse("add_cross_attention", True, "genconf models decoder-only models")
    hidden = f.integer("n_embd")
    for key in ("n_ctx", "embd_pdrop", "scale_attn_weights", "scale_attn_by_inverse_layer_idx",
                "reorder_and_upcast_attn", "n_special", "predict_special_tokens", "summary_type", "summary_use_proj",
                "summary_activation", "summary_proj_to_labels", "summary_first_dropout"):
        f.get(key)
    # GPT2LMHeadModel: Conv1D layers with biases, LayerNorm with bias, learned positions, lm_head tied to wte.
    return dict(num_layers=f.integer("n_layer"), hidden_size=hidden, num_attention_heads=f.integer("n_head"),
                ffn_hidden_size=f.integer("n_inner", 4 * hidden), vocab_size=f.integer("vocab_size"),
                seq_length=f.integer("n_positions"), activation=_plain_gelu(f, "activation_function", notes),
                normalization="layernorm", position_embedding="learned",
                tie_embeddings=f.flag("tie_word_embeddings", True), add_bias_linear=True,
                hidden_dropout=f.fraction("resid_pdrop", 0.1), attention_dropout=f.fraction("attn_pdrop", 0.1))


@_family("gpt-neox", "GPTNeoXForCausalLM")
def _gpt_neox(f: _Fields, notes: list[str]) -> dict:
    # modeling_gpt_neox: fused query_key_value and dense with biases (attention_bias, default true), MLP with
    # biases, LayerNorm with bias, rotary positions, embed_out untied by default.
    if not f.flag("attention_bias", True):
        raise f.refuse("attention_bias", False, "the GPT-NeoX MLP keeps its biases: genconf cannot drop only the "
                       "attention's")
    key = "rotary_pct" if f.data.get("rotary_pct") is not None else "partial_rotary_factor"
    f.get("rotary_pct")
    pct = f.get(key, (_rope_dicts(f)[0] or {}).get("partial_rotary_factor", 1.0))  # transformers 5 keeps it there
    if isinstance(pct, bool) or not isinstance(pct, (int, float)) or not 0 < pct <= 1:
        raise f.refuse(key, pct, "a share of each head's dimensions in (0, 1] is expected")
    if f.flag("use_parallel_residual", True):
        notes.append("attention and MLP run in parallel from one residual (x + attn(ln1(x)) + mlp(ln2(x))): the same "
                     "parameters and FLOPs; activations are counted as for the sequential layer")
    base = f.get("rotary_emb_base")  # GPT-NeoX's name for rope_theta (which newer configs carry too)
    f.get("classifier_dropout")
    return dict(**({"rope_theta": float(base)} if base is not None else {}), rotary_percent=float(pct),
                num_layers=f.integer("num_hidden_layers"), hidden_size=f.integer("hidden_size"),
                num_attention_heads=f.integer("num_attention_heads"), ffn_hidden_size=f.integer("intermediate_size"),
                vocab_size=f.integer("vocab_size"), seq_length=_seq_length(f),
                activation=_plain_gelu(f, "hidden_act", notes), normalization="layernorm", position_embedding="rope",
                tie_embeddings=f.flag("tie_word_embeddings", False), add_bias_linear=True,
                hidden_dropout=f.fraction("hidden_dropout", 0.0), attention_dropout=f.fraction("attention_dropout", 0.0))


def _layer_list(layers: list[int]) -> str:
    """Layer indices as a short phrase: `3, 7, ..., 47` for an arithmetic run of more than three, else all of them."""
    steps = {b - a for a, b in zip(layers, layers[1:])}
    if len(layers) > 3 and len(steps) == 1:
        return f"{layers[0]}, {layers[1]}, ..., {layers[-1]}"
    return ", ".join(map(str, layers))


_LLAMA4_LAYER_TYPES = {"chunked_attention": True, "full_attention": False}
"""transformers 5's Llama4TextConfig layer_types: whether the layer attends within chunks of attention_chunk_size."""


@_family("llama4", "Llama4ForCausalLM", "Llama4ForConditionalGeneration")
def _llama4(f: _Fields, notes: list[str]) -> dict:
    """Llama 4's text decoder (modeling_llama4; Llama4ForConditionalGeneration's text_config): GQA without biases,
    MoE layers of num_local_experts SwiGLU experts of intermediate_size, one shared expert as wide and a bias-free
    router (e x h) scoring the top k with a sigmoid, one MoE layer in every interleave_moe_layer_step (layer i when
    i % step == step - 1, Llama4TextConfig's moe_layers), the others a dense SwiGLU MLP of intermediate_size_mlp.
    Defaults where a key is absent are Llama4TextConfig's."""
    values = _llama_like(f, notes, tie_default=False, mlp_bias_key=None)
    layers = values["num_layers"]
    values["kv_channels"] = f.integer("head_dim", 128)
    expert = f.integer("intermediate_size", 8192)
    step = f.integer("interleave_moe_layer_step", 1)
    if layers % step:
        raise f.refuse("interleave_moe_layer_step", step, f"num_hidden_layers ({layers}) is not a multiple of it; "
                       f"genconf ends the model on an MoE layer, as NeMo's Llama 4 importer asserts")
    pattern = list(range(step - 1, layers, step))  # Llama4TextConfig.moe_layers where the key is absent
    moe_layers = f.get("moe_layers")
    if moe_layers is not None and moe_layers != pattern:
        raise f.refuse("moe_layers", moe_layers, f"genconf places one MoE layer in every interleave_moe_layer_step "
                       f"({step}): layers {_layer_list(pattern)}")
    top_k = f.integer("num_experts_per_tok", 1)
    # Llama4Router: sigmoid of the top k logits, no balancing loss in the catalog's llama4 entries (NeMo's Llama4Config:
    # sigmoid score function, no pre-softmax, moe_aux_loss_coeff megatron-core's default 0).
    values.update(ffn_hidden_size=f.integer("intermediate_size_mlp", 16384),
                  num_experts=f.integer("num_local_experts", 16), moe_top_k=top_k, moe_ffn_hidden_size=expert,
                  moe_shared_expert_intermediate_size=expert,
                  moe_layer_interval=step, moe_router_score_function="sigmoid", moe_router_pre_softmax=False,
                  moe_aux_loss_coeff=0.0)
    coeff = f.get("router_aux_loss_coef")
    if coeff:
        f.info.append(f"router_aux_loss_coef {coeff:g} is not written: the plan trains without a balancing loss "
                      f"(--moe-aux-loss-coeff 0), as NeMo's Llama4Config and models/llama4-*.yaml do")
    if top_k > 1:  # moe_utils.topk_routing_with_score_function: sigmoid scores of k > 1 are divided by their sum
        notes.append(f"its top-{top_k} sigmoid scores weight the experts as they are; megatron-core renormalises them "
                     f"to sum to 1 (same parameters and FLOPs)")

    # no_rope_layers: 1 where the layer rotates (transformers' name notwithstanding), 0 where it is NoPE; empty or
    # absent: every no_rope_layer_interval-th layer is NoPE (Llama4TextConfig).
    interval = f.integer("no_rope_layer_interval", 4)
    rotates = f.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(layers)]
    if not isinstance(rotates, list) or len(rotates) != layers or any(r not in (0, 1) for r in rotates):
        raise f.refuse("no_rope_layers", rotates, f"one 0 (NoPE) or 1 (RoPE) per layer ({layers}) is expected")
    nope = [i for i, r in enumerate(rotates) if not r]
    rope_count = layers - len(nope)
    tuning = f.get("attn_temperature_tuning", True)
    f.get("attn_scale"), f.get("floor_scale"), f.get("for_llm_compressor")  # the temperature's shape; a quantizer flag
    if nope:
        scaled = (" and scale their queries up with the position (attn_temperature_tuning): the artifacts do neither"
                  if tuning else ": the artifacts rotate every layer")
        notes.append(f"its {len(nope)} NoPE layers ({_layer_list(nope)}) skip RoPE{scaled} (no parameter or FLOP "
                     f"difference; megatron-core no_rope_freq)")
    chunk = f.get("attention_chunk_size", 8192)
    types = f.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers or any(t not in _LLAMA4_LAYER_TYPES for t in types):
            raise f.refuse("layer_types", types, f"one of {', '.join(_LLAMA4_LAYER_TYPES)} per layer ({layers}) "
                           f"is expected")
        chunked = sum(_LLAMA4_LAYER_TYPES[t] for t in types)
    else:
        chunked = rope_count  # Llama4TextConfig: the RoPE layers attend in chunks
    if chunk is not None and chunked:
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise f.refuse("attention_chunk_size", chunk, "a positive number of tokens (or null: none) is expected")
        notes.append(f"its chunked attention ({chunk:,}-token chunks on {chunked} of {layers} layers) is priced as "
                     f"full causal attention: the same up to {chunk:,} tokens, an overestimate of the attention FLOPs "
                     f"beyond; the artifacts train full causal attention")
    if f.flag("use_qk_norm", True) and rope_count:
        notes.append(f"its L2 norm of queries and keys on the {rope_count} RoPE layers (use_qk_norm, no weights) is "
                     f"neither priced nor written to the artifacts")
    notes.append("its router weights scale each expert's input instead of its output (megatron-core "
                 "moe_apply_probs_on_input): not written to the artifacts (same parameters and FLOPs)")
    notes.append("its interleaved RoPE (adjacent pairs of each head rotated together; megatron-core "
                 "rotary_interleaved) is not written: the artifacts rotate the two halves of each head (same "
                 "parameters and FLOPs)")
    return values


_VISION_LANGUAGE = {"Llama4ForConditionalGeneration"}
"""Architectures whose config.json nests the text decoder in `text_config` beside a `vision_config`: the import plans
the text decoder."""

_VISION_LANGUAGE_KEYS = frozenset({"text_config", "vision_config", "boi_token_index", "eoi_token_index",
                                   "image_token_index", "tie_word_embeddings"})


def _text_decoder(f: _Fields, arch: str, notes: list[str]) -> _Fields:
    """The text_config of a vision-language config.json as the fields to map, its top level checked: the keys
    _VISION_LANGUAGE_KEYS and _GENERIC_KEYS only, a top-level tie_word_embeddings (Llama4Config's) the text's own."""
    text = f.get("text_config")
    if not isinstance(text, dict):
        raise f.refuse("text_config", text, f"{arch} keeps its text decoder's fields in an object text_config")
    for key in _VISION_LANGUAGE_KEYS:
        f.get(key)
    _check_known(f, arch, notes)
    inner = _Fields(dict(text), f"{f.where}: text_config")
    tied = f.data.get("tie_word_embeddings")
    if tied is not None:
        if "tie_word_embeddings" in text and text["tie_word_embeddings"] != tied:
            raise f.refuse("tie_word_embeddings", tied, f"text_config says {json.dumps(text['tie_word_embeddings'])}")
        inner.data["tie_word_embeddings"] = tied
    notes.append("the import plans the text decoder only: the vision encoder and its projector (vision_config) are "
                 "neither counted nor trained")
    return inner


def _check_known(f: _Fields, arch: str, notes: list[str]) -> None:
    """Refuse the first field no mapper read and genconf does not read past (it might change the model)."""
    unknown = sorted(k for k in f.data if k not in f.read and k not in _GENERIC_KEYS and not k.startswith("_"))
    if "quantization_config" in unknown:
        unknown.remove("quantization_config")
        notes.append("quantization_config is ignored: genconf plans training of the full-precision model")
    if unknown:
        raise GenconfError(f"{f.where}: field '{unknown[0]}' is not one genconf knows for {arch} and may change the "
                           f"model; remove it from a copy if it does not, or write the model as YAML"
                           + (f" (also unknown: {', '.join(unknown[1:])})" if len(unknown) > 1 else ""))


# --- reading --------------------------------------------------------------------------------------

def config_path(path: Path) -> Path:
    """The config.json a --model path names: the file itself, or config.json inside a directory."""
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise GenconfError(f"{path} has no config.json (a Hugging Face model directory holds one)")
        return path / "config.json"
    if not path.is_file():
        raise GenconfError(f"model file {path} does not exist")
    return path


def default_name(path: Path) -> str:
    """A catalog-style name from the model's folder (`Qwen3-8B/config.json` -> `qwen3-8b`)."""
    stem = path.parent.name if path.name == "config.json" else path.stem
    name = re.sub(r"[^a-z0-9._-]+", "-", stem.lower()).strip("-.")
    return name or "hf-model"


def read_config(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise GenconfError(f"cannot read {path}: {exc.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise GenconfError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise GenconfError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def model_from_config(data: dict, *, name: str, where: str) -> tuple[ModelSpec, str, tuple[str, ...]]:
    """(spec, architecture, notes) for a parsed config.json; GenconfError (one line) for anything genconf cannot
    map exactly."""
    archs = data.get("architectures") or []
    if not archs and "hidden_size" not in data and _TOKENIZER_KEYS & set(data):
        raise GenconfError(f"{where} looks like a tokenizer's config ({', '.join(sorted(_TOKENIZER_KEYS & set(data)))}),"
                           f" not a model's: give the model's config.json")
    if not isinstance(archs, list) or len(archs) != 1 or not isinstance(archs[0], str):
        raise GenconfError(f"{where}: 'architectures' must list one model class, got {json.dumps(archs)} "
                           f"(genconf reads {', '.join(sorted(FAMILIES))})")
    arch = archs[0]
    if arch not in FAMILIES:
        raise GenconfError(f"{where}: architecture '{arch}' is not one genconf can import "
                           f"(it reads {', '.join(sorted(FAMILIES))}); write the model as YAML like models/*.yaml")
    family, mapper = FAMILIES[arch]
    f = _Fields(data, where)
    notes: list[str] = []
    if arch in _VISION_LANGUAGE:
        f = _text_decoder(f, arch, notes)
    values = mapper(f, notes)
    for key, default in _DEFAULT_ONLY.items():
        if key in f.data and f.get(key) != default:
            raise f.refuse(key, f.data[key], f"genconf imports models with {key} {json.dumps(default)}")
    if values.get("position_embedding") == "rope":
        values.update(_rope(f, notes))
        share = (_rope_dicts(f)[0] or {}).get("partial_rotary_factor", values.get("rotary_percent", 1.0))
        if share != values.get("rotary_percent", 1.0):
            raise f.refuse("rope_parameters", {"partial_rotary_factor": share},
                           f"genconf imports partial rotary embeddings for GPT-NeoX only, not {arch}")
    _check_known(f, arch, notes)
    source = f"Hugging Face config.json ({arch}, {family} family) read by genconf.hf"
    bad = limits.check_all(values, where=where)  # as a models/*.yaml file's (catalog.files.build)
    if bad:
        raise GenconfError(bad[0])
    try:
        spec = ModelSpec(name=name, source=source, unmodelled=tuple(notes), **values)
    except ValueError as exc:
        raise GenconfError(f"{where}: {exc}") from None
    return spec, arch, tuple(f.info + notes)


def model_from_hf(ref: Path | str, *, name: str | None = None) -> HFModel:
    """Read a config.json (or a directory holding one)."""
    path = config_path(Path(ref))
    spec, arch, notes = model_from_config(read_config(path), name=name or default_name(path), where=str(path))
    return HFModel(spec=spec, architecture=arch, notes=notes, path=path)


def looks_like_hf(ref: str) -> bool:
    """A --model reference meant as a Hugging Face config: a .json file or a directory."""
    return ref.endswith(".json") or Path(ref).is_dir()


# --- writing the catalog YAML ---------------------------------------------------------------------

_ALWAYS = ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size", "vocab_size",
           "seq_length", "activation", "normalization", "position_embedding", "tie_embeddings", "add_bias_linear",
           "hidden_dropout", "attention_dropout")


def _derived(spec: ModelSpec, name: str):
    """What ModelSpec.__post_init__ fills in for an optional field left out (None): num_query_groups, kv_channels,
    norm_bias, moe_ffn_hidden_size, mamba_num_heads; None where it derives nothing or the spec needs the field."""
    try:
        return getattr(replace(spec, **{name: None}), name)
    except (ValueError, TypeError):
        return None


def catalog_yaml(model: HFModel, params: int) -> str:
    """The model as a models/*.yaml file: the same keys, non-default optional ones only, notes as comments."""
    spec = model.spec
    defaults = {f.name: f.default for f in fields(ModelSpec)}
    lines = [f"# Imported from {model.path} ({model.architecture}) by `genconf models --from-hf`:",
             f"# {params:,} parameters (genconf.counting.exact_param_count)."]
    lines += [f"# {note}" for note in model.notes if note not in spec.unmodelled]  # f.info: no plan warns of it
    lines += [f"name: {spec.name}", f"source: {json.dumps(spec.source)}"]
    if spec.unmodelled:  # one sentence a line: every plan of the model warns of each
        lines += ["unmodelled:"] + [f"  - {json.dumps(note)}" for note in spec.unmodelled]
    for f in fields(ModelSpec):
        if f.name in ("name", "source", "unmodelled"):
            continue
        value = getattr(spec, f.name)
        default = _derived(spec, f.name) if defaults[f.name] is None else defaults[f.name]
        if f.name not in _ALWAYS and value == default:
            continue
        lines.append(f"{f.name}: {json.dumps(value)}")
    return "\n".join(lines) + "\n"


def write_catalog_yaml(ref: str, *, output: str | None = None, name: str | None = None, force: bool = False) -> int:
    """`genconf models --from-hf FILE [-o OUT.yaml]`: print the YAML, or write it (atomically) to OUT."""
    import os
    import sys

    from genconf.plan.counting import exact_param_count

    out = Path(output) if output else None
    if name is not None and (name != name.lower() or " " in name):
        # It was refused as the config.json's fault: 'config.json: ModelSpec.name must be lowercase without spaces'.
        raise GenconfError(f"--name {name!r}: a model's name is lowercase without spaces, such as "
                           f"{default_name(Path(name + '.yaml'))!r}")
    if out is not None and name is None:
        name = default_name(out)
    model = model_from_hf(ref, name=name)
    text = catalog_yaml(model, exact_param_count(model.spec))
    if out is None:
        sys.stdout.write(text)
        return 0
    if out.suffix not in (".yaml", ".yml"):
        raise GenconfError(f"-o {out}: the catalog file must end in .yaml")
    if out.exists() and not force:
        raise GenconfError(f"{out} exists; add --force to replace it")
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, out)
    except OSError as exc:
        raise GenconfError(f"cannot write {out}: {exc.strerror}") from None
    print(f"genconf: wrote {out} ({model.spec.name}, {exact_param_count(model.spec):,} parameters)", file=sys.stderr)
    return 0
