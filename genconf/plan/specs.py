"""Frozen specs: the model, the GPU, the cluster and the parallel plan.

Each spec checks its own fields in ``__post_init__`` (one field at a time, ``ValueError`` with the
value). Rules that span several specs (heads divisible by TP, layers by PP x VP, ...) live in
``genconf.plan.rules``. Variants come from ``dataclasses.replace``, which re-validates.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from dataclasses import dataclass

ACTIVATIONS = ("gelu", "swiglu", "squared_relu")
NORMALIZATIONS = ("layernorm", "rmsnorm", "nonparametric")
POSITION_EMBEDDINGS = ("learned", "rope", "none")
FRAMEWORKS = ("megatron", "deepspeed", "fsdp")
LR_DECAYS = ("cosine", "linear", "constant")
FP8_RECIPES = ("delayed", "current", "blockwise", "mxfp8")
RECOMPUTE = ("none", "selective", "full")
RECOMPUTE_MODULES = ("core_attn", "mla_up_proj", "moe_act", "layernorm", "mlp")
"""megatron-core --recompute-modules that genconf prices (transformer_config.py recompute_modules; core_attn is
megatron's default and what selective alone means)."""
LORA_TARGETS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")
"""The linear layers LoRA can adapt, and its default: Megatron-Bridge peft/lora.py's default target_modules (NeMo
2's likewise). NeMo 1.x's fine-tuning config adapted linear_qkv alone (megatron_gpt_finetuning_config.yaml
lora_tuning.target_modules: ['attention_qkv'])."""
PRECISIONS = ("bf16", "fp16", "fp8", "fp4", "fp32")
GRAD_DTYPES = ("fp32", "bf16")
LAYER_SPECS = ("te", "local")
ATTENTION_KERNELS = ("auto", "cudnn", "flash2", "triton", "math")
CUDA_GRAPH_IMPLS = ("none", "local", "transformer_engine")
CUDA_GRAPH_SCOPES = ("attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba", "full_iteration")
"""megatron-core 0.16.1's CudaGraphScope names (transformer/enums.py)."""
MOE_DISPATCHERS = ("alltoall", "deepep", "hybridep")
"""MoE token dispatchers genconf prices: megatron's alltoall, and its flex dispatcher's two backends (megatron-core
0.16.1 moe_token_dispatcher_type / moe_flex_dispatcher_backend)."""
MOE_ROUTINGS = ("random", "contiguous")
"""Which experts a token's top-k land on, as far as the dispatch's traffic goes (ParallelPlan.moe_routing)."""
MOE_ROUTER_SCORES = ("softmax", "sigmoid")
MOE_LOAD_BALANCING = ("aux_loss", "seq_aux_loss", "none")
ROUTER_DEFAULTS = {"moe_router_score_function": "softmax", "moe_router_pre_softmax": None, "moe_router_expert_bias": False,
                   "moe_router_topk_scaling_factor": None, "moe_router_num_groups": None, "moe_router_group_topk": None}
"""ModelSpec's router fields at their defaults: what a dense model carries (counting.dense_layer_model)."""
HYBRID_LAYER_KINDS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
"""megatron-core's hybrid_override_pattern symbols (ssm/mamba_hybrid_layer_allocation.py Symbols) genconf prices: a
Mamba-2 mixer, self-attention, an MLP and a MoE MLP, each a layer of its own with its own pre-norm."""
DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "fp4")
ARCHS = ("ampere", "hopper", "blackwell")


def _positive(obj: object, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{type(obj).__name__}.{name} must be a positive integer, got {value!r}")


def _text(obj: object, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, str):
            raise ValueError(f"{type(obj).__name__}.{name} must be text, got {value!r}")


def _one_of(obj: object, name: str, allowed: tuple[str, ...]) -> None:
    value = getattr(obj, name)
    if value not in allowed:
        raise ValueError(f"{type(obj).__name__}.{name} must be one of {'|'.join(allowed)}, got {value!r}")


def _fraction(obj: object, name: str) -> None:
    value = getattr(obj, name)
    if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"{type(obj).__name__}.{name} must be in [0, 1), got {value!r}")


LLAMA3_ROPE_SCALING = (1.0, 4.0, 8192)
"""Llama 3.1's rope scaling besides its factor (Hugging Face rope_type llama3: low_freq_factor, high_freq_factor,
original_max_position_embeddings): the only shape megatron-core's --use-rope-scaling applies
(RotaryEmbedding._apply_scaling's defaults), so ModelSpec.rope_scaling_factor means this shape."""


class HashOnce:
    """Base of a frozen spec hashed once (hash_once): the slot that keeps its hash."""

    __slots__ = ("_hash",)


def hash_once(cls: type) -> type:
    """Keep a frozen dataclass's generated hash in its instance's `_hash` slot (the class derives from HashOnce): the
    planner's caches hash the same model, cluster and calibration tens of thousands of times a search (and a plan
    several times), and each hash walks every field. The value is the generated one; a frozen instance's fields never change after
    __post_init__, and `_hash` is no field (replace, pickling and equality ignore it)."""
    generated = cls.__hash__

    def __hash__(self) -> int:
        try:
            return self._hash
        except AttributeError:
            value = generated(self)
            object.__setattr__(self, "_hash", value)
            return value

    cls.__hash__ = __hash__
    return cls


@hash_once
@dataclass(frozen=True, kw_only=True, slots=True)
class ModelSpec(HashOnce):
    """A decoder-only transformer, with fields named as megatron-core's TransformerConfig names them."""

    name: str
    """Catalog name, lowercase (``llama3-8b``)."""
    num_layers: int
    """Transformer blocks."""
    hidden_size: int
    """Model width h."""
    num_attention_heads: int
    """Query heads a."""
    ffn_hidden_size: int
    """MLP width f. For SwiGLU this is one branch: fc1 produces 2f and fc2 reads f (megatron's convention)."""
    vocab_size: int
    """Embedding rows as in the checkpoint. Megatron pads this further to a multiple of 128 x TP."""
    seq_length: int
    """Training context length in tokens."""
    num_query_groups: int | None = None
    """Key/value heads g (GQA). None = num_attention_heads (multi-head attention)."""
    kv_channels: int | None = None
    """Head dimension d. None = hidden_size / num_attention_heads."""
    activation: str = "gelu"
    """gelu | swiglu | squared_relu (relu(x)^2, not gated: Primer, So et al. 2021; Nemotron-H)."""
    activation_clamp: float | None = None
    """A clamped GLU (GPT-OSS: 7.0; megatron-core activation_func_clamp_value, Hugging Face swiglu_limit): the gate
    half is clamped from above and the linear half on both sides before the activation. None = no clamp. Priced for
    MoE experts (megatron-core's TEGroupedMLP clamps and re-concatenates fc1's output eagerly); a dense MLP's clamp
    is not priced. Parameters and FLOPs are the gated MLP's."""
    normalization: str = "layernorm"
    """layernorm | rmsnorm (weight only) | nonparametric (no parameters, OLMo-1)."""
    norm_bias: bool | None = None
    """LayerNorm has a bias. None = true for layernorm; OLMo's Kempner configs use weight-only LayerNorm."""
    position_embedding: str = "learned"
    """learned (seq_length x h table) | rope (no parameters) | none (Nemotron-H: the Mamba layers carry position)."""
    rope_theta: float = 10000.0
    """RoPE base frequency (Hugging Face rope_theta, megatron --rotary-base, OLMo rope_theta): 10,000 is RoFormer's
    and every framework's default; Llama 3 and OLMo 2 train at 500,000, Mixtral and Qwen at 1,000,000. Changes no
    parameter, memory or FLOP count; a checkpoint trained at one base is wrong at another."""
    rotary_percent: float = 1.0
    """The share of each head's dimensions that RoPE rotates, the rest passed through (Hugging Face GPT-NeoX
    rotary_pct, 0.25 for Pythia; megatron --rotary-percent; both rotate the first int(d x share) dimensions). Changes no
    parameter, memory or FLOP count."""
    rope_scaling_factor: float | None = None
    """Llama 3.1's RoPE frequency scaling (Hugging Face rope_scaling rope_type llama3: low/high frequency factors 1 and 4
    over 8,192 original positions; megatron --use-rope-scaling --rope-scaling-factor): 8 for Llama 3.1, 32 for Llama
    3.2. None: no scaling."""
    tie_embeddings: bool = True
    """Output layer shares the input embedding matrix."""
    add_bias_linear: bool = True
    """Biases on every linear layer (GPT-2/3 style)."""
    add_qkv_bias: bool = False
    """A bias on the QKV projection only, none on the output projection or the MLP (Qwen2; megatron-core's
    add_qkv_bias). Implied by add_bias_linear."""
    qk_layernorm: bool = False
    """Normalise q and k (OLMo-2, Qwen3); over their full projected width unless qk_layernorm_per_head."""
    qk_layernorm_per_head: bool = False
    """q/k norms one head wide (kv_channels), shared by every head (Qwen3, megatron-core), instead of over the
    full projection width (OLMo-2). Only with qk_layernorm."""
    sandwich_norm: bool = False
    """A second norm on each sublayer's output before the residual add (Gemma-2: four h-wide norms per layer
    instead of two). megatron-core has no such layer."""
    hidden_dropout: float = 0.1
    """Dropout after attention and MLP (megatron-core's default 0.1)."""
    attention_dropout: float = 0.1
    """Dropout on attention probabilities (megatron-core's default 0.1)."""
    num_experts: int = 0
    """Routed experts per MoE layer; 0 = dense model."""
    moe_top_k: int = 0
    """Experts each token is routed to; 0 for dense models."""
    moe_ffn_hidden_size: int | None = None
    """Expert MLP width (one SwiGLU branch). None = ffn_hidden_size."""
    moe_router_score_function: str = "softmax"
    """How the router scores experts (MOE_ROUTER_SCORES; megatron --moe-router-score-function): softmax (Mixtral,
    Qwen3, GPT-OSS) or sigmoid (DeepSeek-V3, Kimi K2, Nemotron 3). The router's FLOPs are the same."""
    moe_router_pre_softmax: bool | None = None
    """Softmax over every expert before the top-k, the k weights not renormalised (megatron --moe-router-pre-softmax;
    Hugging Face Qwen3-MoE norm_topk_prob false), instead of a softmax over the k chosen. None: on for top-1 softmax
    routing only (megatron-core refuses it without: a softmax over one score has no gradient). Softmax scoring only."""
    moe_router_expert_bias: bool = False
    """Aux-loss-free balancing: a per-expert bias added to the scores for choosing the experts only, updated from the
    load (DeepSeek-V3; megatron --moe-router-enable-expert-bias, sigmoid scoring only)."""
    moe_router_topk_scaling_factor: float | None = None
    """The routing weights scaled by this (DeepSeek-V3 2.5, Kimi K2 2.827, Nemotron 3 Nano 2.5 and Super 5.0; Hugging
    Face routed_scaling_factor; megatron --moe-router-topk-scaling-factor). None: unscaled."""
    moe_router_num_groups: int | None = None
    """Group-limited routing: the experts in this many groups, a token's k chosen within its best
    moe_router_group_topk groups (DeepSeek-V3: 8 and 4; Hugging Face n_group / topk_group; megatron
    --moe-router-num-groups / --moe-router-group-topk). None: no groups."""
    moe_router_group_topk: int | None = None
    """Groups a token's experts may come from (with moe_router_num_groups)."""
    moe_router_load_balancing: str = "aux_loss"
    """The balancing loss (MOE_LOAD_BALANCING; megatron --moe-router-load-balancing-type): aux_loss over the micro-batch
    (GShard), seq_aux_loss per sequence (DeepSeek-V3, Nemotron 3, with the expert bias), or none (GPT-OSS)."""
    moe_aux_loss_coeff: float = 0.01
    """The balancing loss's weight (megatron --moe-aux-loss-coeff; arguments.py recommends 1e-2 to start; DeepSeek-V3
    and Nemotron 3 train at 1e-4)."""
    sliding_window: int | None = None
    """Sliding-window attention: in the windowed layers each query attends to itself and the `sliding_window` keys
    before it (megatron-core's window_size (w, 0); Mistral's reference mask; a Hugging Face config's sliding_window
    read as is, as Megatron-Bridge imports GPT-OSS, though transformers' own mask keeps one key fewer). None = full
    attention."""
    window_attn_skip_freq: int = 0
    """Every Nth layer uses full attention, the others the window (megatron-core window_attn_skip_freq;
    GPT-OSS alternates: 2). 0 = every layer windowed."""
    kv_lora_rank: int | None = None
    """Multi-head latent attention (MLA, DeepSeek-V2 Sec. 2.1; megatron-core MLATransformerConfig): keys and
    values come up from a kv_lora_rank-wide latent. None = grouped-query attention."""
    q_lora_rank: int | None = None
    """MLA query latent width (None: queries projected straight from the hidden state, DeepSeek-V2-Lite)."""
    qk_head_dim: int | None = None
    """MLA: per-head query/key width without position (qk_nope_head_dim in Hugging Face configs)."""
    qk_pos_emb_head_dim: int | None = None
    """MLA: per-head query/key width carrying RoPE (qk_rope_head_dim); the key part is shared by every head."""
    v_head_dim: int | None = None
    """MLA: per-head value width."""
    moe_shared_expert_intermediate_size: int | None = None
    """Width of the shared experts every token passes through beside the routed ones (all of them together:
    n_shared_experts x moe_intermediate_size). None = no shared expert."""
    moe_shared_expert_gate: bool = False
    """Scale the shared experts' output by sigmoid(x . g), g one learned vector of hidden_size per MoE layer
    (Qwen2-MoE's shared_expert_gate; megatron-core TransformerConfig.moe_shared_expert_gate, core_v0.16).
    Needs moe_shared_expert_intermediate_size."""
    first_k_dense_replace: int = 0
    """MoE models: the first k layers have a dense MLP of ffn_hidden_size (megatron-core moe_layer_freq
    [0]*k + [1]*(L-k); DeepSeek-V3: 3)."""
    moe_layer_interval: int = 1
    """MoE models: one MoE layer in every this many, the others a dense MLP of ffn_hidden_size; layer i (from 0) is
    MoE when i % interval == interval - 1 (Hugging Face Llama4TextConfig interleave_moe_layer_step; NeMo's Llama 4
    importer, vlm/llama4/model/llama4_omni.py, writes it as moe_layer_freq ([0] * (step - 1) + [1]) * (L / step)
    and asserts L % step == 0; Llama 4 Maverick: 2, Llama4Experts128Config's [0, 1] * 24). 1 = every layer MoE.
    Not with first_k_dense_replace; num_layers must be a multiple of it (so the last layer, which an MTP block
    copies, is MoE)."""
    mtp_num_layers: int = 0
    """Multi-token prediction layers after the decoder (DeepSeek-V3 Sec. 2.2; megatron-core mtp_num_layers),
    on the last pipeline stage with a copy of the embedding. 0 = none."""
    mtp_repeated_layer: bool = False
    """One multi-token-prediction block's parameters serve every depth (megatron-core 0.17 mtp_use_repeated_layer;
    Nemotron 3 Super/Ultra: one block run twice): weights counted once, compute and activations per depth."""
    moe_latent_size: int = 0
    """Latent MoE (megatron-core moe_latent_size; Nemotron 3 Super/Ultra): each MoE layer projects tokens from
    hidden_size down to this width before dispatch (fc1_latent_proj) and back after combine (fc2_latent_proj); the
    routed experts run on the latent width, the router and shared experts on the full one. 0 = none."""
    hybrid_pattern: str = ""
    """Hybrid Mamba models (Nemotron-H, Nemotron 3): one symbol per layer, megatron-core's hybrid_override_pattern
    (HYBRID_LAYER_KINDS: M Mamba-2, * attention, - MLP, E MoE), so num_layers = len(pattern). Empty: every layer
    is attention + MLP."""
    mamba_state_dim: int = 128
    """Mamba-2 SSM state size N per head (megatron-core mamba_state_dim)."""
    mamba_head_dim: int = 64
    """Mamba-2 head dimension P (mamba_head_dim)."""
    mamba_num_groups: int = 8
    """B/C groups G shared by the heads (mamba_num_groups)."""
    mamba_num_heads: int | None = None
    """Mamba-2 heads; None = 2 h / mamba_head_dim (megatron-core's default expand of 2)."""
    mamba_conv_kernel: int = 4
    """Depthwise causal convolution width (MambaMixer d_conv)."""
    source: str = ""
    """Where the numbers come from (checkpoint config or paper table)."""
    unmodelled: tuple[str, ...] = ()
    """What the source config has that this spec does not model, one sentence each (a Hugging Face import's notes:
    a GELU-gated MLP counted as SwiGLU, a window pattern priced as full attention): every plan of the model repeats
    them as warnings, so no estimate hides an approximation."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or self.name != self.name.lower() or " " in self.name:
            raise ValueError(f"ModelSpec.name must be lowercase without spaces, got {self.name!r}")
        _text(self, "source")
        _positive(self, "num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "vocab_size", "seq_length")
        if self.num_query_groups is None:
            object.__setattr__(self, "num_query_groups", self.num_attention_heads)
        if self.kv_channels is None:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(
                    f"ModelSpec {self.name}: hidden_size ({self.hidden_size}) is not divisible by "
                    f"num_attention_heads ({self.num_attention_heads}); set kv_channels"
                )
            object.__setattr__(self, "kv_channels", self.hidden_size // self.num_attention_heads)
        if self.moe_ffn_hidden_size is None:
            object.__setattr__(self, "moe_ffn_hidden_size", self.ffn_hidden_size)
        _positive(self, "num_query_groups", "kv_channels", "moe_ffn_hidden_size")
        if self.num_attention_heads % self.num_query_groups:
            raise ValueError(
                f"ModelSpec {self.name}: num_attention_heads ({self.num_attention_heads}) must be a multiple "
                f"of num_query_groups ({self.num_query_groups})"
            )
        _one_of(self, "activation", ACTIVATIONS)
        _one_of(self, "normalization", NORMALIZATIONS)
        _one_of(self, "position_embedding", POSITION_EMBEDDINGS)
        _fraction(self, "hidden_dropout")
        _fraction(self, "attention_dropout")
        if isinstance(self.rope_theta, bool) or not isinstance(self.rope_theta, (int, float)) or not self.rope_theta > 1:
            raise ValueError(f"ModelSpec {self.name}: rope_theta must be a number above 1, got {self.rope_theta!r}")
        object.__setattr__(self, "rope_theta", float(self.rope_theta))
        if self.rope_scaling_factor is not None and (isinstance(self.rope_scaling_factor, bool) or not isinstance(
                self.rope_scaling_factor, (int, float)) or not self.rope_scaling_factor >= 1):
            raise ValueError(f"ModelSpec {self.name}: rope_scaling_factor must be a number of at least 1 or absent, got "
                             f"{self.rope_scaling_factor!r}")
        if self.rope_scaling_factor is not None:
            object.__setattr__(self, "rope_scaling_factor", float(self.rope_scaling_factor))
        if isinstance(self.rotary_percent, bool) or not isinstance(self.rotary_percent, (int, float)) or not (
                0 < self.rotary_percent <= 1):
            raise ValueError(f"ModelSpec {self.name}: rotary_percent must be a share in (0, 1], got "
                             f"{self.rotary_percent!r}")
        object.__setattr__(self, "rotary_percent", float(self.rotary_percent))
        if self.rotary_percent != 1 and (self.position_embedding != "rope" or self.mla or self.rope_dim < 2
                                         or self.rope_dim % 2):
            raise ValueError(f"ModelSpec {self.name}: rotary_percent {self.rotary_percent:g} needs rope without MLA and "
                             f"an even rotated width (int({self.kv_channels} x {self.rotary_percent:g}) = "
                             f"{int(self.kv_channels * self.rotary_percent)})")
        if self.norm_bias is None:
            object.__setattr__(self, "norm_bias", self.normalization == "layernorm")
        elif self.norm_bias and self.normalization != "layernorm":
            raise ValueError(f"ModelSpec {self.name}: norm_bias is only meaningful for layernorm, not {self.normalization}")
        if isinstance(self.unmodelled, list):
            object.__setattr__(self, "unmodelled", tuple(self.unmodelled))  # from YAML or plan.json
        if not isinstance(self.unmodelled, tuple) or not all(isinstance(n, str) and n.strip() for n in self.unmodelled):
            shown = list(self.unmodelled) if isinstance(self.unmodelled, tuple) else self.unmodelled
            raise ValueError(f"ModelSpec {self.name}: unmodelled must be a list of sentences, got {shown!r}")
        for name in ("tie_embeddings", "add_bias_linear", "add_qkv_bias", "qk_layernorm", "qk_layernorm_per_head",
                     "sandwich_norm", "norm_bias"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"ModelSpec.{name} must be true or false, got {getattr(self, name)!r}")
        if self.qk_layernorm_per_head and not self.qk_layernorm:
            raise ValueError(f"ModelSpec {self.name}: qk_layernorm_per_head needs qk_layernorm")
        if self.num_experts < 0 or (self.num_experts == 1):
            raise ValueError(f"ModelSpec {self.name}: num_experts must be 0 (dense) or >= 2, got {self.num_experts}")
        if self.num_experts and not 1 <= self.moe_top_k <= self.num_experts:
            raise ValueError(
                f"ModelSpec {self.name}: moe_top_k ({self.moe_top_k}) must be in [1, num_experts={self.num_experts}]"
            )
        if not self.num_experts and self.moe_top_k:
            raise ValueError(f"ModelSpec {self.name}: moe_top_k ({self.moe_top_k}) set on a dense model")
        self._check_router()
        if self.sliding_window is not None:
            _positive(self, "sliding_window")
        if self.activation_clamp is not None:
            if not isinstance(self.activation_clamp, (int, float)) or isinstance(self.activation_clamp, bool) \
                    or not math.isfinite(self.activation_clamp) or self.activation_clamp <= 0:
                raise ValueError(f"ModelSpec {self.name}: activation_clamp must be a positive number, got "
                                 f"{self.activation_clamp!r}")
            if not self.gated:
                raise ValueError(f"ModelSpec {self.name}: activation_clamp clamps a gated MLP's two halves; "
                                 f"{self.activation} is not gated")
        if not isinstance(self.window_attn_skip_freq, int) or self.window_attn_skip_freq < 0:
            raise ValueError(f"ModelSpec {self.name}: window_attn_skip_freq must be >= 0, got {self.window_attn_skip_freq!r}")
        if self.window_attn_skip_freq == 1 and self.sliding_window:
            raise ValueError(f"ModelSpec {self.name}: window_attn_skip_freq 1 makes every layer full attention: use 0 "
                             f"(every layer windowed), 2 or more, or no sliding_window")
        mla = ("q_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
        if self.kv_lora_rank is None:
            if any(getattr(self, k) is not None for k in mla):
                raise ValueError(f"ModelSpec {self.name}: {', '.join(mla)} need kv_lora_rank (multi-head latent attention)")
        else:
            _positive(self, "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
            if self.q_lora_rank is not None:
                _positive(self, "q_lora_rank")
            if self.grouped_query:
                raise ValueError(f"ModelSpec {self.name}: multi-head latent attention has no query groups "
                                 f"(num_query_groups {self.num_query_groups} != heads {self.num_attention_heads})")
            if self.position_embedding != "rope" or self.qk_layernorm or self.sliding_window:
                raise ValueError(f"ModelSpec {self.name}: multi-head latent attention needs rope, no q/k layernorm "
                                 f"and no sliding window")
        if self.moe_shared_expert_intermediate_size is not None:
            _positive(self, "moe_shared_expert_intermediate_size")
        if self.moe_shared_expert_gate and not self.moe_shared_expert_intermediate_size:
            raise ValueError(f"ModelSpec {self.name}: moe_shared_expert_gate gates the shared experts, but "
                             f"moe_shared_expert_intermediate_size is {self.moe_shared_expert_intermediate_size}")
        for name in ("first_k_dense_replace", "mtp_num_layers", "moe_latent_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"ModelSpec {self.name}: {name} must be >= 0, got {value!r}")
        self._check_moe_interval()
        if not self.num_experts and (self.moe_shared_expert_intermediate_size or self.first_k_dense_replace
                                     or self.moe_latent_size):
            raise ValueError(f"ModelSpec {self.name}: shared experts, first_k_dense_replace and moe_latent_size "
                             f"need num_experts")
        if not isinstance(self.mtp_repeated_layer, bool) or (self.mtp_repeated_layer and not self.mtp_num_layers):
            raise ValueError(f"ModelSpec {self.name}: mtp_repeated_layer (true or false) needs mtp_num_layers")
        if self.mamba_num_heads is None:
            object.__setattr__(self, "mamba_num_heads", 2 * self.hidden_size // self.mamba_head_dim)
        _positive(self, "mamba_state_dim", "mamba_head_dim", "mamba_num_groups", "mamba_num_heads", "mamba_conv_kernel")
        if self.hybrid_pattern:
            self._check_hybrid()
        if self.first_k_dense_replace >= self.num_layers and self.num_experts:
            raise ValueError(f"ModelSpec {self.name}: first_k_dense_replace ({self.first_k_dense_replace}) leaves "
                             f"no MoE layer of {self.num_layers}")

    def _check_moe_interval(self) -> None:
        n = self.moe_layer_interval
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"ModelSpec {self.name}: moe_layer_interval must be an integer >= 1 (1: every layer MoE), "
                             f"got {n!r}")
        if n == 1:
            return
        if not self.num_experts or self.hybrid_pattern:
            raise ValueError(f"ModelSpec {self.name}: moe_layer_interval {n} interleaves MoE and dense layers of a "
                             f"transformer with experts (num_experts {self.num_experts}; a hybrid model places its MoE "
                             f"layers with hybrid_pattern)")
        if self.first_k_dense_replace:
            raise ValueError(f"ModelSpec {self.name}: moe_layer_interval {n} with first_k_dense_replace "
                             f"{self.first_k_dense_replace}: genconf places MoE layers by one of the two; set "
                             f"the other to its default (1 and 0)")
        if n > self.num_layers:  # once named megatron --moe-layer-freq ([0]*95+[1])*0 for 48 layers
            raise ValueError(f"ModelSpec {self.name}: moe_layer_interval ({n}) is more than num_layers "
                             f"({self.num_layers}): no layer would be MoE; at most {self.num_layers} (the last "
                             f"layer MoE)")
        if self.num_layers % n:
            raise ValueError(f"ModelSpec {self.name}: num_layers ({self.num_layers}) is not a multiple of "
                             f"moe_layer_interval ({n}); genconf ends the model on an MoE layer "
                             f"(megatron --moe-layer-freq ([0]*{n - 1}+[1])*{self.num_layers // n} and a remainder "
                             f"are not modelled)")

    def _check_hybrid(self) -> None:
        pattern = self.hybrid_pattern
        if not isinstance(pattern, str) or set(pattern) - set(HYBRID_LAYER_KINDS):
            raise ValueError(f"ModelSpec {self.name}: hybrid_pattern may hold only {' '.join(HYBRID_LAYER_KINDS)} "
                             f"(megatron-core hybrid_override_pattern), got {pattern!r}")
        if len(pattern) != self.num_layers:
            raise ValueError(f"ModelSpec {self.name}: hybrid_pattern has {len(pattern)} layers, num_layers is "
                             f"{self.num_layers}")
        if ("E" in pattern) != self.is_moe:
            raise ValueError(f"ModelSpec {self.name}: a hybrid model has MoE layers (E) exactly when num_experts is set")
        if self.mla or self.first_k_dense_replace or self.sliding_window or self.sandwich_norm:
            raise ValueError(f"ModelSpec {self.name}: genconf's hybrid models have no MLA, first_k_dense_replace, "
                             f"sliding window or sandwich norms")
        if self.mamba_num_heads % self.mamba_num_groups:
            raise ValueError(f"ModelSpec {self.name}: mamba_num_heads ({self.mamba_num_heads}) must be a multiple of "
                             f"mamba_num_groups ({self.mamba_num_groups})")

    @property
    def is_hybrid(self) -> bool:
        """Mamba-2 / attention / MLP layers in a pattern (Nemotron-H)."""
        return bool(self.hybrid_pattern)

    def layers_of_kind(self, kind: str) -> int:
        """Layers of one HYBRID_LAYER_KINDS symbol ('M', '*', '-', 'E'); a transformer layer is '*' and '-' or 'E'."""
        if self.is_hybrid:
            return self.hybrid_pattern.count(kind)
        return {"M": 0, "*": self.num_layers, "-": self.num_layers - self.moe_layers, "E": self.moe_layers}[kind]

    @property
    def attention_layers(self) -> int:
        """Layers with self-attention: every layer, or a hybrid model's '*' layers."""
        return self.layers_of_kind("*")

    @property
    def mamba_inner(self) -> int:
        """Mamba-2 inner width d_inner = heads x head dimension."""
        return self.mamba_num_heads * self.mamba_head_dim

    @property
    def mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V2/V3, Kimi K2)."""
        return self.kv_lora_rank is not None

    @property
    def query_width(self) -> int:
        """a * d: width of the query projection (and of the attention output). MLA: a x (qk + rope) head dims."""
        if self.mla:
            return self.num_attention_heads * (self.qk_head_dim + self.qk_pos_emb_head_dim)
        return self.num_attention_heads * self.kv_channels

    @property
    def value_width(self) -> int:
        """a x the value head dimension: the attention output, the output projection's input."""
        return self.num_attention_heads * self.v_head_dim if self.mla else self.query_width

    @property
    def moe_layers(self) -> int:
        """Layers with a routed-expert MLP (the rest, the first_k_dense_replace first ones or those between every
        moe_layer_interval-th, are dense; a hybrid model's E)."""
        if self.hybrid_pattern:
            return self.hybrid_pattern.count("E")
        if not self.is_moe:
            return 0
        # one in every moe_layer_interval (num_layers is a multiple of it), or all after the dense prefix
        return self.num_layers // self.moe_layer_interval - self.first_k_dense_replace

    def is_moe_layer(self, index: int) -> bool:
        """Whether decoder layer `index` (from 0) of a non-hybrid model has a routed-expert MLP: megatron-core's
        moe_layer_freq list at that index (gpt_layer_specs.get_gpt_decoder_layer_specs: 1 MoE, 0 dense)."""
        if not self.is_moe:
            return False
        n = self.moe_layer_interval
        return index >= self.first_k_dense_replace and index % n == n - 1

    @property
    def mlp_pattern(self) -> str:
        """A non-hybrid model's MLP per decoder layer, one symbol each (HYBRID_LAYER_KINDS: '-' dense, 'E' MoE):
        megatron-core's moe_layer_freq list written 0 -> '-', 1 -> 'E'."""
        return "".join("E" if self.is_moe_layer(i) else "-" for i in range(self.num_layers))

    @property
    def dense_layers(self) -> int:
        """Layers with a dense MLP: a transformer's non-MoE layers, a hybrid model's '-' layers."""
        if self.hybrid_pattern:
            return self.hybrid_pattern.count("-")
        return self.num_layers - self.moe_layers

    @property
    def kv_width(self) -> int:
        """g * d: width of each of the key and value projections. MLA: the mean of the key (a x (qk + rope)) and
        value (a x v) widths after the up-projection, so that 2 x kv_width is what attention reads."""
        if self.mla:
            return (self.query_width + self.value_width) // 2
        return self.num_query_groups * self.kv_channels

    @property
    def grouped_query(self) -> bool:
        """Fewer key/value heads than query heads (grouped-query attention, Ainslie et al. 2023)."""
        return self.num_query_groups != self.num_attention_heads

    @property
    def attention_head_dim(self) -> int:
        """Head dimension the attention kernel works at: kv_channels; MLA: the mean of the query/key and value
        head widths (QK^T costs s^2 x (qk + rope), AV s^2 x v per head)."""
        if self.mla:
            return (self.qk_head_dim + self.qk_pos_emb_head_dim + self.v_head_dim) // 2
        return self.kv_channels

    def _check_router(self) -> None:
        """The router fields as megatron-core's TransformerConfig takes them (its __post_init__ asserts)."""
        _one_of(self, "moe_router_score_function", MOE_ROUTER_SCORES)
        _one_of(self, "moe_router_load_balancing", MOE_LOAD_BALANCING)
        softmax = self.moe_router_score_function == "softmax"
        if self.moe_router_pre_softmax is None:
            object.__setattr__(self, "moe_router_pre_softmax", self.moe_top_k == 1 and softmax)
        if not isinstance(self.moe_router_pre_softmax, bool) or not isinstance(self.moe_router_expert_bias, bool):
            raise ValueError(f"ModelSpec {self.name}: moe_router_pre_softmax and moe_router_expert_bias are true or false")
        if (self.moe_top_k == 1 and self.moe_router_score_function == "softmax" and not self.moe_router_pre_softmax):
            raise ValueError(f"ModelSpec {self.name}: top-1 softmax routing needs moe_router_pre_softmax (megatron-core: "
                             "a softmax over one score has no gradient)")
        if self.moe_router_pre_softmax and not softmax:
            raise ValueError(f"ModelSpec {self.name}: moe_router_pre_softmax is for softmax scoring (megatron-core's "
                             "sigmoid router ignores it)")
        if self.moe_router_expert_bias and self.moe_router_score_function != "sigmoid":
            raise ValueError(f"ModelSpec {self.name}: moe_router_expert_bias needs sigmoid scoring (megatron-core)")
        factor = self.moe_router_topk_scaling_factor
        if factor is not None and (isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 0):
            raise ValueError(f"ModelSpec {self.name}: moe_router_topk_scaling_factor must be a positive number or "
                             f"absent, got {factor!r}")
        coeff = self.moe_aux_loss_coeff
        if isinstance(coeff, bool) or not isinstance(coeff, (int, float)) or coeff < 0:
            raise ValueError(f"ModelSpec {self.name}: moe_aux_loss_coeff must be a number >= 0, got {coeff!r}")
        object.__setattr__(self, "moe_aux_loss_coeff", float(coeff))
        groups, group_topk = self.moe_router_num_groups, self.moe_router_group_topk
        if (groups is None) != (group_topk is None):
            raise ValueError(f"ModelSpec {self.name}: moe_router_num_groups and moe_router_group_topk come together")
        if groups is not None:
            _positive(self, "moe_router_num_groups", "moe_router_group_topk")
            if self.num_experts % groups or group_topk > groups or group_topk * (self.num_experts // groups) < \
                    self.moe_top_k:
                raise ValueError(f"ModelSpec {self.name}: {groups} router groups of the {self.num_experts} experts, "
                                 f"{group_topk} of them per token, cannot hold the top {self.moe_top_k}")
        routed = ("moe_router_expert_bias", "moe_router_topk_scaling_factor", "moe_router_num_groups")
        if not self.num_experts and (self.moe_router_score_function != "softmax" or any(getattr(self, k)
                                                                                         for k in routed)):
            raise ValueError(f"ModelSpec {self.name}: router fields set on a dense model")

    @property
    def rope_dim(self) -> int:
        """Per-head width rotated by RoPE (the first int(d x rotary_percent) dimensions: megatron-core's
        RotaryEmbedding, transformers' GPT-NeoX rotary_ndims)."""
        return self.qk_pos_emb_head_dim if self.mla else int(self.kv_channels * self.rotary_percent)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def expert_width(self) -> int:
        """Width the routed experts read and write (and the dispatcher moves): the latent width under latent MoE,
        else hidden_size (megatron-core experts.py, token_dispatcher.py: moe_latent_size or hidden_size)."""
        return self.moe_latent_size or self.hidden_size

    @property
    def mtp_blocks(self) -> int:
        """Multi-token-prediction blocks with their own weights: one shared by every depth under
        mtp_repeated_layer, else one per depth."""
        return min(1, self.mtp_num_layers) if self.mtp_repeated_layer else self.mtp_num_layers

    @property
    def mtp_pattern(self) -> str:
        """What one MTP block holds as hybrid layer symbols: a transformer layer, attention then the model's MLP
        kind (megatron-core 0.17 mtp_hybrid_override_pattern; Nemotron 3 Super/Ultra: '*E')."""
        return "*" + ("E" if self.is_moe else "-")

    @property
    def qkv_bias(self) -> bool:
        """The QKV projection has a bias (every linear layer has one, or only QKV does)."""
        return self.add_bias_linear or self.add_qkv_bias

    def windowed_layer(self, layer_number: int) -> bool:
        """Layer `layer_number` (1-indexed) uses the window: megatron-core's transformer/utils.py
        is_layer_window_attention, every layer when window_attn_skip_freq is 0."""
        if not self.sliding_window:
            return False
        return not self.window_attn_skip_freq or layer_number % self.window_attn_skip_freq != 0

    @property
    def windowed_layers(self) -> int:
        """Layers that use the sliding window (0 without one): all but every window_attn_skip_freq-th."""
        if not self.sliding_window:
            return 0
        freq = self.window_attn_skip_freq
        return self.num_layers - self.num_layers // freq if freq else self.num_layers

    @property
    def window_text(self) -> str:
        """'4,096 keys back in 21 of 42 layers' (empty without a window): how the CLI, the artifacts README and
        megatron_args.txt name the window."""
        if not self.sliding_window:
            return ""
        return f"{self.sliding_window:,} keys back in {self.windowed_layers} of {self.num_layers} layers"

    def window_binds(self, seq_length: int) -> bool:
        """The window leaves some keys out at this sequence length: shorter than the sequence by 2 or more (a
        query sees itself and `sliding_window` keys before it; at seq_length <= window + 1 that is every key)."""
        return bool(self.sliding_window) and self.sliding_window + 1 < seq_length

    @property
    def windowed_layer_fraction(self) -> float:
        """Share of the layers that use the sliding window (0 without one)."""
        return self.windowed_layers / self.num_layers

    @property
    def gated(self) -> bool:
        """SwiGLU: fc1 produces two branches of ffn width."""
        return self.activation == "swiglu"

    @property
    def extra_recompute_modules(self) -> tuple[str, ...]:
        """The --recompute-modules beyond core attention that apply to this model, cheapest forward to repeat
        first: norms and the experts' activation are element-wise, MLA's up projections small GEMMs, the dense
        MLP a layer's main GEMMs."""
        applies = {"layernorm": True, "moe_act": self.is_moe, "mla_up_proj": self.mla,
                   "mlp": self.dense_layers > 0}
        return tuple(m for m in ("layernorm", "moe_act", "mla_up_proj", "mlp") if applies[m])


@hash_once
@dataclass(frozen=True, kw_only=True, slots=True)
class GPUSpec(HashOnce):
    """One accelerator model with its dense (no sparsity) peak rates."""

    name: str
    """Catalog key (``h100-sxm``)."""
    display_name: str
    """Vendor name (``NVIDIA H100 80GB HBM3 SXM5``)."""
    arch: str
    """ampere | hopper | blackwell: decides FP8/MXFP8 support and the calibration set."""
    peak_fp32_tflops: float
    """Dense FP32 (non-tensor-core) TFLOP/s."""
    peak_tf32_tflops: float
    """Dense TF32 tensor-core TFLOP/s."""
    peak_bf16_tflops: float
    """Dense BF16 tensor-core TFLOP/s (half the datasheet figure marked 'with sparsity')."""
    peak_fp16_tflops: float
    """Dense FP16 tensor-core TFLOP/s."""
    peak_fp8_tflops: float | None
    """Dense FP8 tensor-core TFLOP/s; None before Hopper."""
    peak_fp4_tflops: float | None
    """Dense FP4 tensor-core TFLOP/s; None before Blackwell."""
    hbm_gib: float
    """Device memory as the driver reports it (nvidia-smi total), GiB."""
    hbm_tbyte_per_s: float
    """HBM bandwidth, TB/s (10^12 bytes)."""
    nvlink_gbyte_per_s: float
    """NVLink bandwidth per GPU, GB/s, both directions summed as NVIDIA quotes it."""
    num_sms: int
    """Streaming multiprocessors: GEMM tiles are scheduled in waves of this size."""
    node_sizes: tuple[int, ...]
    """GPUs per node in the usual server designs (HGX 4/8, NVL72 tray 4)."""
    tdp_w: int
    """Board power the peak rates assume, W."""
    source: str = ""
    """Datasheet the numbers come from."""
    nvlink_bridge_gpus: int | None = None
    """PCIe cards whose NVLink is a bridge joining this many cards (H100 PCIe: 2), so no NVLink domain of them is
    larger; None: NVLink through the node's switches (SXM boards, NVL72 racks)."""

    def __post_init__(self) -> None:
        _one_of(self, "arch", ARCHS)
        if self.nvlink_bridge_gpus is not None:
            _positive(self, "nvlink_bridge_gpus")
        _positive(self, "num_sms", "tdp_w")
        for name in ("peak_fp32_tflops", "peak_tf32_tflops", "peak_bf16_tflops", "peak_fp16_tflops",
                     "hbm_gib", "hbm_tbyte_per_s", "nvlink_gbyte_per_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"GPUSpec {self.name}: {name} must be a non-negative number, got {value!r}")
        if not self.node_sizes or any(n < 1 for n in self.node_sizes):
            raise ValueError(f"GPUSpec {self.name}: node_sizes must list positive GPU counts, got {self.node_sizes!r}")

    def peak_tflops(self, dtype: str) -> float:
        """Dense peak for a compute dtype; raises ValueError where the GPU has no such tensor cores."""
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; one of {'|'.join(DTYPES)}")
        value = getattr(self, f"peak_{dtype}_tflops")
        if not value:
            raise ValueError(f"{self.display_name} has no {dtype.upper()} tensor cores")
        return float(value)

    @property
    def supports_fp8(self) -> bool:
        return bool(self.peak_fp8_tflops)

    @property
    def supports_mxfp8(self) -> bool:
        """Microscaled FP8 (blocks of 32) needs Blackwell tensor cores."""
        return self.arch == "blackwell"

    @property
    def fp8_gemm_any_layout(self) -> bool:
        """FP8 GEMMs take either operand layout, so per-tensor-scaled FP8 tensors need no transposed copy:
        Transformer Engine's nvte_is_non_tn_fp8_gemm_supported (compute capability 10.x-11.x, the datacenter
        Blackwell parts in this catalog); Hopper's FP8 GEMMs are TN-only."""
        return self.arch == "blackwell"


HOST_CPUS = ("x86_64", "grace")
"""Host CPUs a cluster's nodes launch kernels from (ClusterSpec.host_cpu)."""


@hash_once
@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterSpec(HashOnce):
    """A homogeneous GPU cluster: node type and the networks inside and between nodes."""

    name: str
    """Preset name (``kempner-h100``)."""
    gpu: GPUSpec
    gpus_per_node: int
    """GPUs per node (what Slurm allocates per node)."""
    nvlink_domain_gpus: int | None = None
    """GPUs sharing one NVLink domain, where TP must stay: a multiple of gpus_per_node (NVL72 racks: 72) or a divisor
    of it (H100 PCIe cards joined by NVLink bridges in pairs: 2). None = gpus_per_node."""
    pcie_peer_gbyte_per_s_per_gpu: float | None = None
    """GPU-to-GPU bandwidth per GPU over PCIe, one direction, GB/s: how a GPU reaches the GPUs of its own node outside
    its NVLink domain (PCIe Gen5 x16: 64). Required where the NVLink domain is smaller than the node; None where
    NVLink holds the whole node."""
    ib_gbit_per_s_per_gpu: float
    """Inter-node bandwidth per GPU, one direction, Gb/s (InfiniBand NDR = 400)."""
    total_gpus: int | None = None
    """GPUs the cluster has; the default job size when --gpus is not given."""
    cpu_mem_gib_per_node: float = 1024.0
    """Host memory per node, for CPU offload."""
    host_link_gbyte_per_s_per_gpu: float = 55.0
    """CPU-GPU bandwidth per GPU, one direction, GB/s: what offloaded activations and optimizer states move
    over (PCIe Gen5 x16 ~55; Grace-Blackwell NVLink-C2C 900 GB/s per superchip, ~225 per GPU each way)."""
    host_cpu: str = "x86_64"
    """The CPU that launches each GPU's kernels (HOST_CPUS): x86_64 (HGX/DGX boards: Xeon, EPYC) or grace (NVIDIA's
    Arm Neoverse V2 CPU of GB200/GB300 NVL72 and GH200), whose host time per PyTorch op is longer
    (Calibration.grace_host_factor)."""
    nccl_env: tuple[tuple[str, str], ...] = ()
    """NCCL/IB environment for launch scripts (name, value)."""
    description: str = ""

    def __post_init__(self) -> None:
        _text(self, "name", "description")
        _positive(self, "gpus_per_node")
        _one_of(self, "host_cpu", HOST_CPUS)
        for name in ("total_gpus", "nvlink_domain_gpus"):
            if getattr(self, name) is not None:
                _positive(self, name)
        domain, node = self.nvlink_domain_gpus, self.gpus_per_node
        if domain is not None and domain % node and node % domain:
            raise ValueError(f"ClusterSpec {self.name}: nvlink_domain_gpus ({domain}) must be a multiple of "
                             f"gpus_per_node ({node}), a domain across nodes (NVL72: 72), or divide it, a domain inside "
                             f"the node (NVLink-bridged pairs: 2)")
        bridge = self.gpu.nvlink_bridge_gpus
        if bridge is not None and self.nvlink_domain > bridge:
            raise ValueError(f"ClusterSpec {self.name}: {self.gpu.name} cards reach NVLink only through bridges joining "
                             f"{bridge} cards, so an NVLink domain of {self.nvlink_domain} GPUs cannot hold them: set "
                             f"nvlink_domain_gpus to {bridge} and pcie_peer_gbyte_per_s_per_gpu (PCIe Gen5 x16: 64)")
        pcie = self.pcie_peer_gbyte_per_s_per_gpu
        if pcie is not None and (isinstance(pcie, bool) or not isinstance(pcie, (int, float)) or pcie <= 0):
            raise ValueError(f"ClusterSpec {self.name}: pcie_peer_gbyte_per_s_per_gpu must be a positive number, "
                             f"got {pcie!r}")
        if self.pcie_inside_node and pcie is None:
            raise ValueError(f"ClusterSpec {self.name}: an NVLink domain of {domain} GPUs inside {node}-GPU nodes "
                             f"needs pcie_peer_gbyte_per_s_per_gpu, the GPUs' bandwidth to the rest of their node "
                             f"(PCIe Gen5 x16: 64)")
        if self.ib_gbit_per_s_per_gpu <= 0:
            raise ValueError(f"ClusterSpec {self.name}: ib_gbit_per_s_per_gpu must be positive, got {self.ib_gbit_per_s_per_gpu}")
        if self.host_link_gbyte_per_s_per_gpu <= 0:
            raise ValueError(f"ClusterSpec {self.name}: host_link_gbyte_per_s_per_gpu must be positive, "
                             f"got {self.host_link_gbyte_per_s_per_gpu}")

    @property
    def nvlink_domain(self) -> int:
        """GPUs reachable over NVLink from any GPU (the node, the NVL72 rack, or a bridged pair inside the node)."""
        return self.nvlink_domain_gpus or self.gpus_per_node

    @property
    def pcie_inside_node(self) -> bool:
        """The node holds several NVLink domains (bridged pairs), which reach one another over PCIe."""
        return self.nvlink_domain < self.gpus_per_node

    @property
    def nvlink_gbyte_per_s_one_way(self) -> float:
        """NVLink bandwidth in one direction, GB/s: what a ring collective can use per GPU."""
        return self.gpu.nvlink_gbyte_per_s / 2

    @property
    def ib_gbyte_per_s_per_gpu(self) -> float:
        """InfiniBand per GPU in GB/s (400 Gb/s = 50 GB/s)."""
        return self.ib_gbit_per_s_per_gpu / 8


def quant_recipe_of(precision: str, fp8_recipe: str | None) -> str | None:
    """ParallelPlan.quant_recipe of a precision and FP8 scaling: FP8 defaults to current scaling, FP4 is NVFP4."""
    if precision == "fp8":
        return fp8_recipe or "current"
    if precision == "fp4":
        return "nvfp4"
    return None


@hash_once
@dataclass(frozen=True, kw_only=True, slots=True)
class ParallelPlan(HashOnce):
    """One way to lay a training job onto GPUs. Degrees multiply to the world size: tp*pp*cp*dp."""

    framework: str
    """megatron | deepspeed | fsdp."""
    tp: int = 1
    """Tensor-parallel degree (inside a node). 1 = disabled."""
    pp: int = 1
    """Pipeline-parallel stages. 1 = disabled."""
    vp: int = 1
    """Virtual pipeline chunks per stage (interleaved 1F1B). 1 = plain 1F1B."""
    cp: int = 1
    """Context-parallel degree: the sequence is split over cp ranks. 1 = disabled."""
    ep: int = 1
    """Expert-parallel degree (MoE), carved out of tp*cp*dp (megatron's MoE parallel folding). 1 = disabled."""
    etp: int | None = None
    """Expert tensor-parallel degree: how many ranks split each expert's weights (megatron
    --expert-tensor-parallel-size). None = tp (megatron's default); 1 = whole experts, tokens all-to-all'd."""
    dp: int = 1
    """Data-parallel replicas (or shards, under ZeRO-3/FSDP)."""
    mbs: int = 1
    """Micro-batch size in sequences."""
    gbs: int = 1
    """Global batch size in sequences per optimizer step."""
    seq_length: int = 2048
    """Sequence length in tokens."""
    packed_doc_tokens: int | None = None
    """Sequences packed from shorter documents, this many tokens each on average (fine-tuning on packed data:
    Megatron-Bridge's packed sequences, NeMo's SQuAD packed to the sequence length). Each document attends only
    within itself (THD with cu_seqlens through Transformer Engine's fused attention), so a sequence's attention
    costs seq / doc documents of doc x doc, not seq x seq. None: one document per sequence."""
    zero_stage: int = 0
    """Sharding of model states over dp: 0 none, 1 optimizer, 2 +gradients, 3 +parameters.
    megatron: 1 = distributed optimizer, 2/3 = Megatron-FSDP (--use-megatron-fsdp, sharding strategy
    optim_grads / optim_grads_params). fsdp: 0 NO_SHARD (DDP), 2 SHARD_GRAD_OP, 3 FULL_SHARD."""
    shard_group_size: int | None = None
    """ZeRO-3/FSDP shard group; None = the whole dp group. gpus_per_node = FSDP HYBRID_SHARD."""
    recompute: str = "none"
    """Activation recomputation: none | selective (core attention) | full (whole layers)."""
    recompute_layers: int | None = None
    """With recompute full: layers of each model chunk recomputed (megatron --recompute-method block
    --recompute-num-layers N); the others keep all their activations. None = every layer (uniform, 1)."""
    recompute_modules: tuple[str, ...] = ()
    """With recompute selective: the modules recomputed (megatron --recompute-modules): core_attn, mla_up_proj
    (MLA's up projections), moe_act (the experts' activation), layernorm, mlp (dense MLPs). () = core_attn."""
    offload_activation_layers: int = 0
    """Layers whose saved activations live in host memory between forward and backward (megatron-core
    --cpu-offloading-num-layers, Transformer Engine CPU offload). 0 = disabled."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism (shards LayerNorm/dropout activations over TP)."""
    precision: str = "bf16"
    """bf16 | fp16 (dynamic loss scaling) | fp8 (Transformer Engine, BF16 master weights) | fp4 (NVFP4,
    Blackwell) | fp32 (Megatron, for bit-exact verification runs: TP reproduces TP=1)."""
    fp8_recipe: str | None = None
    """Scaling recipe under precision fp8: delayed | current (per-tensor) | blockwise (1x128 / 128x128) |
    mxfp8 (blocks of 32, Blackwell). None = current. Ignored for other precisions (fp4 is NVFP4)."""
    fp8_param_gather: bool = False
    """Keep the model's weights in FP8 (TE fp8 model params, megatron --fp8-param-gather): no BF16 copy
    beside the FP8 one, and the distributed optimizer all-gathers FP8 parameters."""
    precision_aware_optimizer: bool = False
    """megatron --use-precision-aware-optimizer (TE FusedAdam): the fp32 master weights are kept as 16-bit
    remainders beside the bf16 weights (store_param_remainders) and the update reads bf16 gradients directly:
    10 optimizer bytes per parameter instead of 12, no fp32 gradient copy at the step (NeMo 1.x's
    distributed_fused_adam did the same)."""
    adam_moments_dtype: str = "fp32"
    """dtype of Adam's two moments: fp32 | bf16 (megatron --exp-avg-dtype and --exp-avg-sq-dtype under the
    precision-aware optimizer, as Megatron-Bridge's DeepSeek-V3 recipes set them): 2 + 2 bytes per parameter instead
    of 4 + 4. It changes the numerics, so it is the user's choice (--adam-moments-dtype), never a saver the search
    adds."""
    grad_dtype: str | None = None
    """dtype gradients are accumulated and reduced in: fp32 | bf16. None = the framework's default:
    megatron fp32 for bf16/fp8 (Megatron-LM accumulates in fp32 unless --grad-reduce-in-bf16), DeepSpeed the
    model dtype (data_types.grad_accum_dtype, communication_data_type), FSDP fp32 (OLMo's mixed precision,
    MixedPrecision.reduce_dtype)."""
    offload_optimizer: bool = False
    """DeepSpeed: optimizer states and FP32 master weights in host memory."""
    offload_params: bool = False
    """DeepSpeed ZeRO-3: parameters in host memory."""
    tp_comm_overlap: bool = False
    """Overlap TP collectives with GEMMs (megatron --tp-comm-overlap, TE userbuffers)."""
    moe_ep_overlap: bool = False
    """MoE: hide the expert-parallel all-to-all behind another micro-batch's compute (megatron
    --overlap-moe-expert-parallel-comm --delay-wgrad-compute: the combined 1F1B schedule pairs one micro-batch's
    forward with another's backward layer by layer, dispatch and combine on their own stream)."""
    moe_dispatcher: str = "alltoall"
    """MoE token dispatcher (MOE_DISPATCHERS): megatron's all-to-all, or its flex dispatcher with DeepEP or HybridEP
    (--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend). Both send each token once per destination
    NVLink domain over the NICs and fan it out over NVLink there (DeepEP's internode kernels; HybridEP's RDMA path),
    which inside one NVLink domain is the all-to-all (genconf.plan.cost._layer_time)."""
    moe_routing: str = "random"
    """MoE: where a token's top-k experts sit (MOE_ROUTINGS), which sets how many EP ranks and NVLink domains the flex
    dispatcher sends it to. random: spread as independent draws (learned routing; megatron's benchmark
    --moe-router-force-load-balancing, which routes on random logits: megatron-core router.py apply_random_logits).
    contiguous: k consecutive experts, token i taking i k .. i k + k - 1 mod E (NeMo AutoModel's FakeBalancedGate
    without noise, nemo_automodel/components/moe/layers.py at 89e3a9fd): with E / ep a multiple of k a token reaches
    one rank. Megatron's alltoall dispatcher sends a copy per expert either way."""
    cuda_graph_impl: str = "none"
    """CUDA graphs (megatron --cuda-graph-impl): none; transformer_engine (TE make_graphed_callables, per layer
    or per part of it); local (megatron-core's CudaGraphManager: whole layers, or with scope full_iteration the
    whole forward-backward). A replayed graph launches its kernels without the host."""
    cuda_graph_scope: tuple[str, ...] = ()
    """megatron --cuda-graph-scope: the parts of each layer captured (attn, mlp, moe_router, moe_preprocess;
    megatron-core's CudaGraphScope) or full_iteration; empty with an implementation: the whole layer."""
    expandable_segments: bool = True
    """Launch with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (genconf's scripts do): the caching
    allocator grows segments in place and fragments little. False prices the classic allocator."""
    layer_spec: str = "te"
    """te: Transformer Engine fused layers with flash attention. local: megatron-core's unfused layers."""
    fused_kernels: bool = False
    """local spec: megatron's fused scale-mask-softmax, bias-GeLU and bias-dropout-add CUDA kernels were built
    (Megatron-LM with apex or Transformer Engine installed, as the published A100 runs were): the softmax keeps
    its output in bf16 and each element-wise op is one pass. genconf's launcher pip-installs megatron-core
    without them: the softmax runs in fp32 through PyTorch."""
    checkpoint_early_stop: bool = True
    """DeepSpeed / FSDP full recompute under PyTorch's non-reentrant checkpoint (torch >= 2.1, genconf's runners) stops
    at each layer's last saved tensor and skips the MLP's output projection (counting.checkpoint_early_stop); False
    prices a stack whose checkpoint reruns the whole layer (torch 1.13, as MosaicML's 2023 benchmarks ran)."""
    grad_accum_fusion: bool = True
    """megatron: each micro-batch's weight gradient accumulates into main_grad inside its weight-gradient GEMM
    (Megatron-LM's --gradient-accumulation-fusion, on by default since 83b1e42, February 2022: TE's
    fuse_wgrad_accumulation, apex's fused_weight_gradient_mlp_cuda for megatron's own linears; megatron-core
    refuses it where apex's kernel is missing, for the output layer under TE too, so it assumes NVIDIA's PyTorch
    containers). False: --no-gradient-accumulation-fusion, as Megatron-LM ran before it: the gradient is written
    apart and a hook adds it into main_grad (ParallelPlan.wgrad_fused_into_main_grad)."""
    torch_compile: bool = False
    """DeepSpeed/FSDP: the model runs under torch.compile, its element-wise ops fused (as torchtitan runs it);
    genconf's own launchers run eager PyTorch."""
    attention_kernel: str = "auto"
    """The flash-attention kernel the layers run: cudnn (cuDNN's fused attention as Transformer Engine and PyTorch's
    SDPA run it on Hopper and Blackwell, FlashAttention-3's class), flash2 (FlashAttention-2: the flash-attn 2
    package, SDPA's flash backend), triton (flash attention written in Triton: flash-attn's flash_attn_triton,
    llm-foundry's attn_impl: triton). auto: what the stack picks (cudnn for megatron's TE layers and for genconf's
    runners on a GPU). Megatron's local spec runs unfused attention whatever this says."""
    fused_loss: bool = False
    """DeepSpeed/FSDP: the cross entropy works on the 16-bit logits and keeps only each token's fp32 log-sum-exp
    (flash-attn's fused cross-entropy, as OLMo's `fused_loss: true` and llm-foundry's MPT default use; genconf's
    runners do the same in chunks). False: F.cross_entropy(logits.float()), which holds an fp32 copy of the
    logits and saves their fp32 log-softmax (torchtitan, Hugging Face). Megatron computes its vocab-parallel
    cross entropy in place either way."""
    lora_rank: int = 0
    """LoRA fine-tuning (Hu et al. 2021): rank-r adapters on linear_qkv, linear_proj, linear_fc1 and linear_fc2 of
    every layer (Megatron-Bridge peft/lora.py's default target_modules; its default dim is 32), the base weights
    frozen: no weight gradients, gradient buffers or optimizer states for them, and no weight-gradient GEMMs.
    0 = full-parameter training. Priced as Megatron-Bridge / NeMo run it (framework megatron, dense models)."""
    lora_targets: tuple[str, ...] = LORA_TARGETS
    """With lora_rank: the linear layers that get adapters (Megatron-Bridge LoRA target_modules), a subset of
    LORA_TARGETS."""
    pp_first_stage_layers: int | None = None
    """Uneven pipeline: layers on the first stage (megatron --decoder-first-pipeline-num-layers)."""
    pp_last_stage_layers: int | None = None
    """Uneven pipeline: layers on the last stage (megatron --decoder-last-pipeline-num-layers)."""
    pp_embedding_as_layer: bool = False
    """Count the embedding as one layer when splitting (megatron --account-for-embedding-in-pipeline-split)."""
    pp_loss_as_layer: bool = False
    """Count the output layer + loss as one layer (megatron --account-for-loss-in-pipeline-split)."""
    bf16_layers_start: int = 0
    """Under an FP8/FP4 recipe, the first layers of the network Transformer Engine runs in BF16 (megatron
    --first-last-layers-bf16 --num-layers-at-start-in-bf16; megatron-core fp8_utils.is_first_last_bf16_layer counts
    global layer numbers: a hybrid model's pattern layers). 0: every layer's GEMMs quantized."""
    bf16_layers_end: int = 0
    """Same for the last layers (--num-layers-at-end-in-bf16). Megatron-Bridge's fp8-current recipe keeps one layer
    at each end in BF16 (its performance benchmarks none), its Nemotron 3 Super NVFP4 recipe the last 14."""
    pp_layout: str | None = None
    """Layers placed virtual stage by virtual stage (megatron --pipeline-model-parallel-layout, megatron-core's
    string: 'E' embedding, 't' layer, 'L' loss, '|' between stages), e.g. one layer moved off the stage that also
    runs the output layer; vp is its stage count / pp. genconf.plan.pipeline.parse_layout reads it."""

    def __post_init__(self) -> None:
        _one_of(self, "framework", FRAMEWORKS)
        _positive(self, "tp", "pp", "vp", "cp", "ep", "dp", "mbs", "gbs", "seq_length")
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"ParallelPlan.zero_stage must be 0, 1, 2 or 3, got {self.zero_stage!r}")
        _one_of(self, "recompute", RECOMPUTE)
        if not isinstance(self.recompute_modules, tuple) or len(set(self.recompute_modules)) != len(self.recompute_modules):
            raise ValueError(f"ParallelPlan.recompute_modules must be a tuple of distinct names, got {self.recompute_modules!r}")
        for module in self.recompute_modules:
            if module not in RECOMPUTE_MODULES:
                raise ValueError(f"ParallelPlan.recompute_modules: {module!r} is not one of {'|'.join(RECOMPUTE_MODULES)}")
        if self.recompute_modules and self.recompute != "selective":
            raise ValueError("ParallelPlan.recompute_modules needs recompute selective")
        _one_of(self, "precision", PRECISIONS)
        _one_of(self, "layer_spec", LAYER_SPECS)
        _one_of(self, "attention_kernel", ATTENTION_KERNELS)
        if self.fp8_recipe is not None:
            _one_of(self, "fp8_recipe", FP8_RECIPES)
        if self.grad_dtype is not None:
            _one_of(self, "grad_dtype", GRAD_DTYPES)
        for name in ("pp_first_stage_layers", "pp_last_stage_layers", "shard_group_size", "recompute_layers", "etp"):
            if getattr(self, name) is not None:
                _positive(self, name)
        if not isinstance(self.lora_rank, int) or isinstance(self.lora_rank, bool) or self.lora_rank < 0:
            raise ValueError(f"ParallelPlan.lora_rank must be >= 0, got {self.lora_rank!r}")
        if (not isinstance(self.lora_targets, tuple) or not self.lora_targets
                or len(set(self.lora_targets)) != len(self.lora_targets)
                or any(t not in LORA_TARGETS for t in self.lora_targets)):
            raise ValueError(f"ParallelPlan.lora_targets must be distinct names from {'|'.join(LORA_TARGETS)}, "
                             f"got {self.lora_targets!r}")
        if self.packed_doc_tokens is not None and (
                not isinstance(self.packed_doc_tokens, int) or isinstance(self.packed_doc_tokens, bool)
                or not 1 <= self.packed_doc_tokens <= self.seq_length):
            raise ValueError(f"ParallelPlan.packed_doc_tokens must be 1..seq_length ({self.seq_length}), "
                             f"got {self.packed_doc_tokens!r}")
        for name in ("bf16_layers_start", "bf16_layers_end"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"ParallelPlan.{name} must be >= 0, got {value!r}")
        if not isinstance(self.offload_activation_layers, int) or self.offload_activation_layers < 0:
            raise ValueError(f"ParallelPlan.offload_activation_layers must be >= 0, got {self.offload_activation_layers!r}")
        if self.pp_layout is not None and (not isinstance(self.pp_layout, str) or not self.pp_layout):
            raise ValueError(f"ParallelPlan.pp_layout must be a megatron layout string, got {self.pp_layout!r}")
        _one_of(self, "cuda_graph_impl", CUDA_GRAPH_IMPLS)
        _one_of(self, "moe_dispatcher", MOE_DISPATCHERS)
        _one_of(self, "moe_routing", MOE_ROUTINGS)
        if not isinstance(self.cuda_graph_scope, tuple) or len(set(self.cuda_graph_scope)) != len(self.cuda_graph_scope) \
                or any(scope not in CUDA_GRAPH_SCOPES for scope in self.cuda_graph_scope):
            raise ValueError(f"ParallelPlan.cuda_graph_scope must be a tuple of distinct names from "
                             f"{'|'.join(CUDA_GRAPH_SCOPES)}, got {self.cuda_graph_scope!r}")
        if self.fused_kernels and self.layer_spec != "local":
            raise ValueError("ParallelPlan.fused_kernels describes the local spec's kernels; Transformer Engine fuses its own")

    @property
    def megatron_fuses_wgrad(self) -> bool:
        """Megatron run with this plan's layers would accumulate weight gradients inside their GEMMs:
        grad_accum_fusion with TE, or with the local spec where apex was built (fused_kernels); the local spec
        without it cannot (megatron_args turn it off). Also what the Megatron equivalent of a DeepSpeed/FSDP plan
        renders."""
        return self.grad_accum_fusion and (self.layer_spec == "te" or self.fused_kernels)

    @property
    def wgrad_fused_into_main_grad(self) -> bool:
        """This plan's weight-gradient GEMMs write into main_grad: a megatron plan that fuses (megatron_fuses_wgrad)."""
        return self.framework == "megatron" and self.megatron_fuses_wgrad

    @property
    def torch_layers(self) -> bool:
        """The layers are genconf's own PyTorch model's (DeepSpeed, FSDP; eager or compiled): PyTorch SDPA attention.
        With fused_kernels a DeepSpeed plan describes Megatron-DeepSpeed's layers instead."""
        return self.framework != "megatron" and not self.fused_kernels

    @property
    def autocast_fp32_weights(self) -> bool:
        """DDP (FSDP NO_SHARD) with a 16-bit recipe: fp32 weights, the layers run under torch.autocast
        (genconf's FSDP runner, OLMo's ddp strategy); the residual stream and every norm stay fp32."""
        return self.framework == "fsdp" and self.zero_stage == 0 and self.precision != "fp32"

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    @property
    def recomputed_modules(self) -> tuple[str, ...]:
        """The modules selective recompute repeats (megatron's default: core attention); () otherwise."""
        if self.recompute != "selective":
            return ()
        return self.recompute_modules or ("core_attn",)

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per step on each pipeline: gbs / (mbs * dp), floored (rules check divisibility)."""
        return self.gbs // (self.mbs * self.dp)

    @property
    def distributed_optimizer(self) -> bool:
        """Megatron's distributed optimizer: optimizer states sharded over dp*cp (ZeRO-1 like)."""
        return self.framework == "megatron" and self.zero_stage >= 1

    @property
    def fsdp_sharding_strategy(self) -> str | None:
        """PyTorch FSDP ShardingStrategy name for framework fsdp, else None."""
        if self.framework != "fsdp":
            return None
        if self.zero_stage == 3:
            return "HYBRID_SHARD" if self.shard_group_size else "FULL_SHARD"
        return {0: "NO_SHARD", 1: "NO_SHARD", 2: "SHARD_GRAD_OP"}[self.zero_stage]

    @property
    def shard_size(self) -> int:
        """GPUs that model states are sharded over under ZeRO/FSDP/distributed optimizer (dp*cp)."""
        return self.shard_group_size or self.dp * self.cp

    @property
    def expert_tp(self) -> int:
        """Ranks each routed expert's weights are split over (etp, or tp by default)."""
        return self.etp if self.etp is not None else self.tp

    @property
    def expert_dp(self) -> int:
        """Data-parallel replicas of each expert: the tp*cp*dp ranks of a stage over ep x etp."""
        return max(1, self.tp * self.cp * self.dp // (self.ep * self.expert_tp))

    @property
    def megatron_fsdp(self) -> bool:
        """Megatron-FSDP: megatron with gradients (2) or gradients and parameters (3) sharded too."""
        return self.framework == "megatron" and self.zero_stage >= 2

    @property
    def remainders_possible(self) -> bool:
        """Whether the precision-aware optimizer would keep the fp32 master weights as 16-bit remainders beside the
        bf16 weights (TE FusedAdam, store_param_remainders) for this plan's precision. megatron-core hands its master
        weights to TE only without FP8 or under delayed scaling (OptimizerConfig.
        use_precision_aware_optimizer_no_fp8_or_ds_fp8; Megatron-LM's --fp8-recipe defaults to delayed, so an FP4
        plan qualifies): under current, blockwise or MXFP8 scaling it keeps fp32 master shards and upcasts the
        gradients as without the flag."""
        return self.precision in ("bf16", "fp4") or self.quant_recipe == "delayed"

    @property
    def optimizer_keeps_remainders(self) -> bool:
        """The precision-aware optimizer is on and keeps 16-bit remainders (remainders_possible)."""
        return self.precision_aware_optimizer and self.remainders_possible

    @property
    def quant_recipe(self) -> str | None:
        """The low-precision GEMM recipe: delayed | current | blockwise | mxfp8 | nvfp4, or None (bf16/fp16/fp32)."""
        return quant_recipe_of(self.precision, self.fp8_recipe)

    @property
    def bf16_edge_layers(self) -> tuple[int, int]:
        """(first, last) layers of the network that run in BF16 under the plan's FP8/FP4 recipe; (0, 0) when its
        GEMMs are not quantized at all."""
        if self.quant_recipe is None:
            return (0, 0)
        return (self.bf16_layers_start, self.bf16_layers_end)

    @property
    def grad_bytes(self) -> int:
        """Bytes per gradient element in the accumulation/reduction buffer (grad_dtype or the framework default)."""
        if self.precision == "fp32":
            return 4
        if self.grad_dtype is not None:
            return 4 if self.grad_dtype == "fp32" else 2
        if self.framework == "deepspeed" or self.precision == "fp16":
            return 2
        return 4

    @property
    def uneven_pipeline(self) -> bool:
        return (self.pp_first_stage_layers is not None or self.pp_last_stage_layers is not None
                or self.pp_embedding_as_layer or self.pp_loss_as_layer or self.pp_layout is not None)

    def replace(self, **changes: object) -> "ParallelPlan":
        """dataclasses.replace(self, **changes), faster (the search derives thousands of plans): the same keyword
        arguments to the same __init__; where every changed field is one __post_init__ never reads
        (PLAN_FIELDS_UNVALIDATED), the copy skips the validation, which read only this validated plan's values."""
        if type(self) is not ParallelPlan:
            return dataclasses.replace(self, **changes)
        if changes.keys() <= PLAN_FIELDS_UNVALIDATED:
            new = object.__new__(ParallelPlan)
            _copy_plan_fields(new, self)
            for name, value in changes.items():
                object.__setattr__(new, name, value)
            return new
        values = dict(zip(PLAN_FIELDS, _plan_field_values(self)))
        values.update(changes)
        return ParallelPlan(**values)

    def with_layout(self, layout: str | None) -> "ParallelPlan":
        """The plan with its layers placed by a pipeline layout (None: megatron's even split) instead of any
        first/last stage counts or embedding/loss accounting."""
        return self.replace(pp_layout=layout, pp_first_stage_layers=None, pp_last_stage_layers=None,
                            pp_embedding_as_layer=False, pp_loss_as_layer=False)


PLAN_FIELDS = tuple(f.name for f in dataclasses.fields(ParallelPlan))
_plan_field_values = operator.attrgetter(*PLAN_FIELDS)
PLAN_FIELDS_UNVALIDATED = frozenset({
    "sequence_parallel", "fp8_param_gather", "precision_aware_optimizer", "adam_moments_dtype", "offload_optimizer",
    "offload_params", "tp_comm_overlap", "moe_ep_overlap", "expandable_segments", "checkpoint_early_stop",
    "grad_accum_fusion", "torch_compile", "fused_loss", "pp_embedding_as_layer", "pp_loss_as_layer"})
"""ParallelPlan fields its __post_init__ never reads (tests/plan/test_specs_replace.py checks it): a plan copied from a
valid one with only these changed passes the same validation, so ParallelPlan.replace skips it."""


def _plan_fields_copier():
    """copy(new, old): every field of `old` set on `new`, as the generated __init__ sets them (object.__setattr__)."""
    body = "\n".join(f"    _set(new, {name!r}, old.{name})" for name in PLAN_FIELDS)
    namespace = {"_set": object.__setattr__}
    exec(f"def copy(new, old):\n{body}\n", namespace)
    return namespace["copy"]


_copy_plan_fields = _plan_fields_copier()


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainSpec:
    """Optimizer, schedule and run length: what every artifact needs beyond the layout."""

    train_steps: int
    """Optimizer steps to run."""
    lr: float = 3.0e-4
    """Peak learning rate (AdamW)."""
    min_lr: float = 3.0e-5
    """Learning rate at the end of the decay."""
    warmup_steps: int = 2000
    """Linear warm-up steps (capped at train_steps)."""
    lr_decay: str = "cosine"
    """cosine | linear | constant (after warm-up)."""
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1.0e-8
    grad_clip: float = 1.0
    """Global gradient-norm clipping; 0 = off."""
    seed: int = 1234
    fp8_recipe: str | None = None
    """delayed | current | blockwise | mxfp8 when the plan's precision is fp8."""
    checkpoint_every_steps: int = 1000
    """Save a checkpoint every N steps and after the last one; 0 = no checkpoints at all."""
    keep_checkpoints: int = 2
    """Complete checkpoints kept on disk, the newest (issue 13: a run's checkpoints filled a 64 GiB disk)."""

    def __post_init__(self) -> None:
        _positive(self, "train_steps", "seed", "keep_checkpoints")
        for name in ("warmup_steps", "checkpoint_every_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"TrainSpec.{name} must be a whole number, got {value!r}")
        for name in ("lr", "min_lr", "weight_decay", "beta1", "beta2", "eps", "grad_clip"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise ValueError(f"TrainSpec.{name} must be a number, got {value!r}")
        if self.warmup_steps < 0 or self.checkpoint_every_steps < 0:
            raise ValueError("TrainSpec: warmup_steps and checkpoint_every_steps must be >= 0")
        if not 0 <= self.min_lr <= self.lr:
            raise ValueError(f"TrainSpec: need 0 <= min_lr ({self.min_lr}) <= lr ({self.lr})")
        _one_of(self, "lr_decay", LR_DECAYS)
        if self.fp8_recipe is not None:
            _one_of(self, "fp8_recipe", FP8_RECIPES)
        for name in ("beta1", "beta2"):
            _fraction(self, name)
        if self.grad_clip < 0 or self.weight_decay < 0 or self.eps <= 0:
            raise ValueError("TrainSpec: grad_clip and weight_decay must be >= 0 and eps > 0")
