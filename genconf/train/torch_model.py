"""A GPT/OLMo-style decoder in plain PyTorch, built from a ModelSpec, for the DeepSpeed and FSDP launchers.

Tensors are laid out as megatron-core lays them (fused QKV, SwiGLU's two branches in one fc1), and the vocabulary
is padded to a multiple of 128 rows (`counting.torch_vocab_rows`, as OLMo pads it), so the parameter count is the
memory model's `genconf.plan.memory.rank_params` exactly: `exact_param_count(spec)` plus the padding rows.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from genconf.plan.counting import torch_vocab_rows, window_chunk_rows
from genconf.plan.memory import FUSED_LOSS_CHUNK_ELEMENTS
from genconf.plan.specs import LLAMA3_ROPE_SCALING, ModelSpec


class Norm(nn.Module):
    """LayerNorm (weight, optional bias), RMSNorm (weight) or OLMo's non-parametric LayerNorm."""

    def __init__(self, spec: ModelSpec, width: int) -> None:
        super().__init__()
        self.kind, self.width, self.eps = spec.normalization, width, 1e-5
        self.weight = nn.Parameter(torch.ones(width)) if self.kind != "nonparametric" else None
        self.bias = nn.Parameter(torch.zeros(width)) if spec.norm_bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "rmsnorm":
            return F.rms_norm(x, (self.width,), self.weight, self.eps)
        return F.layer_norm(x, (self.width,), self.weight, self.bias, self.eps)


def rope_tables(seq: int, dim: int, base: float = 10000.0,
                scaling_factor: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables for rotary embeddings (Su et al. 2021), [seq, dim], at ModelSpec.rope_theta `base`; with
    `scaling_factor`, Llama 3.1's frequency scaling (rope_type llama3: low/high frequency factors 1 and 4 over 8,192
    original positions, as megatron-core's RotaryEmbedding._apply_scaling and transformers' _compute_llama3_parameters)."""
    inv = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    if scaling_factor:
        low, high, original = LLAMA3_ROPE_SCALING
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > original / low, inv / scaling_factor, inv)
        smooth = (original / wavelen - low) / (high - low)
        medium = (wavelen >= original / high) & (wavelen <= original / low)
        inv = torch.where(medium, (1 - smooth) * scaled / scaling_factor + smooth * scaled, scaled)
    angles = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x rotated in its first cos.shape[-1] dimensions, the rest passed through (partial rotary, ModelSpec.rope_dim:
    megatron-core's _apply_rotary_pos_emb_bshd, transformers' GPT-NeoX)."""
    rotated_dim = cos.shape[-1]
    if rotated_dim < x.shape[-1]:
        return torch.cat([apply_rope(x[..., :rotated_dim], cos, sin), x[..., rotated_dim:]], dim=-1)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


_BANDS: dict[tuple, torch.Tensor] = {}
"""Band masks by (window, rows, query heads per group, dtype, device, chunk rows, first column, keys): one tensor each
that every layer shares, so the backward keeps it once."""


def _chunk_mask(window: int, rows: int, r: int, dtype: torch.dtype, device: torch.device, n: int, col: int,
                keys: int) -> torch.Tensor:
    """A chunk's additive mask, [r n, keys]: of an interior chunk's band (query row i sees columns i .. i + window of
    its rows + window keys: 0, the rest -inf), the first n rows and `keys` columns from `col`, for each of the r
    query heads stacked along the rows. Interior chunks take the band itself; the first chunks (fewer keys) and a
    short last one a slice, cached too, so no layer copies its own."""
    key = (window, rows, r, dtype, device, n, col, keys)
    if key not in _BANDS:
        i = torch.arange(rows, device=device)[:, None]
        j = torch.arange(rows + window, device=device)[None, :]
        band = torch.zeros(rows, rows + window, dtype=dtype, device=device)
        band = band.masked_fill((j < i) | (j > i + window), float("-inf")).repeat(r, 1).view(r, rows, rows + window)
        _BANDS[key] = band[:, :n, col:col + keys].reshape(r * n, keys)
    return _BANDS[key]


def windowed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, *,
                       dropout_p: float = 0.0) -> torch.Tensor:
    """Causal attention where query i sees keys i - window .. i (megatron-core's window_size (window, 0)); q [b, heads,
    s, d], k and v [b, groups, s, d]. Queries go in chunks of `window_chunk_rows` rows, each against its own keys and
    the `window` before them under an additive band mask, so nothing is s x s: scores are chunk x (chunk + window).
    The query heads of a key/value group are stacked along the rows (one mask, tiled), so grouped-query attention
    needs no copy of k and v and SDPA can pick a fused kernel that takes a mask (memory-efficient attention; flash
    attention takes none: rules.attention_kernel_window_conflict). Under autocast q, k and v are cast once and the
    mask is built in autocast's dtype, so no chunk casts its own copies."""
    b, heads, s, d = q.shape
    groups = k.shape[1]
    r = heads // groups
    if window + 1 >= s:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, enable_gqa=r > 1)
    device = q.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else q.dtype
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    rows = window_chunk_rows(window, s)
    outs = []
    for start in range(0, s, rows):
        end = min(s, start + rows)
        n, first = end - start, max(0, start - window)
        col = first - (start - window)  # the band's column of key `first`
        mask = _chunk_mask(window, rows, r, dtype, q.device, n, col, end - first)
        query = q[:, :, start:end].reshape(b, groups, r * n, d)
        out = F.scaled_dot_product_attention(query, k[:, :, first:end], v[:, :, first:end], attn_mask=mask,
                                             dropout_p=dropout_p)
        # CUDA's memory-efficient and flash kernels allocate their output [b, r n, groups, d] and return it
        # transposed (aten/src/ATen/native/transformers/cuda/attention.cu): split it, never view it.
        outs.append(out.unflatten(2, (r, n)))
    return torch.cat(outs, dim=3).flatten(1, 2)


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec, layer_number: int = 1) -> None:
        super().__init__()
        self.spec = spec
        # Sliding-window layers as megatron-core picks them (1-indexed layer numbers, ModelSpec.windowed_layer).
        self.window = spec.sliding_window if spec.windowed_layer(layer_number) else None
        h, q, kv = spec.hidden_size, spec.query_width, spec.kv_width
        self.linear_qkv = nn.Linear(h, q + 2 * kv, bias=spec.qkv_bias)
        # Per-head q/k norms (Qwen3) are one head wide and shared by the heads; OLMo-2's span the projection.
        per_head = spec.qk_layernorm_per_head
        self.q_layernorm = Norm(spec, spec.kv_channels if per_head else q) if spec.qk_layernorm else None
        self.k_layernorm = Norm(spec, spec.kv_channels if per_head else kv) if spec.qk_layernorm else None
        self.linear_proj = nn.Linear(q, h, bias=spec.add_bias_linear)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        spec = self.spec
        b, s, _ = x.shape
        q, k, v = self.linear_qkv(x).split([spec.query_width, spec.kv_width, spec.kv_width], dim=-1)
        if self.q_layernorm is not None and not spec.qk_layernorm_per_head:
            q, k = self.q_layernorm(q), self.k_layernorm(k)
        d = spec.kv_channels
        q = q.view(b, s, spec.num_attention_heads, d)
        k = k.view(b, s, spec.num_query_groups, d)
        if self.q_layernorm is not None and spec.qk_layernorm_per_head:
            q, k = self.q_layernorm(q), self.k_layernorm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = v.view(b, s, spec.num_query_groups, d).transpose(1, 2)
        if rope is not None:
            cos, sin = rope[0][:s], rope[1][:s]
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        dropout = spec.attention_dropout if self.training else 0.0
        with _cpu_attention_backend(q):
            if self.window is not None:
                out = windowed_attention(q, k, v, self.window, dropout_p=dropout)
            else:
                out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True,
                                                     enable_gqa=spec.grouped_query)
        return self.linear_proj(out.transpose(1, 2).reshape(b, s, spec.query_width))


def _cpu_attention_backend(q: torch.Tensor):
    """torch 2.13's CPU flash attention packs BF16/FP16 for AMX whenever oneDNN sees AMX, but the packing exists
    only in ATen's AVX-512 build: with ATEN_CPU_CAPABILITY below avx512 on AMX hardware it raises 'pack_vnni2 is
    only supported when avx512 is supported'. There the math backend runs instead."""
    if (q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16)
            and not torch.backends.cpu.get_cpu_capability().startswith("AVX512")):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel(SDPBackend.MATH)
    return contextlib.nullcontext()


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        if spec.is_moe:
            raise ValueError(f"{spec.name} is a mixture of experts: use the megatron launcher (expert parallelism)")
        self.gated = spec.gated
        self.squared_relu = spec.activation == "squared_relu"
        branches = 2 if spec.gated else 1
        self.linear_fc1 = nn.Linear(spec.hidden_size, branches * spec.ffn_hidden_size, bias=spec.add_bias_linear)
        self.linear_fc2 = nn.Linear(spec.ffn_hidden_size, spec.hidden_size, bias=spec.add_bias_linear)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear_fc1(x)
        if self.gated:
            gate, up = y.chunk(2, dim=-1)
            y = F.silu(gate) * up
        elif self.squared_relu:
            # relu(x)^2 (Primer, So et al. 2021), as megatron-core's squared_relu, as a product: CUDA autocast runs
            # pow (and square, which calls it) in fp32, which kept an fp32 copy of relu's output and cost 7.5 GiB
            # over the plan for a 1B model on an H200 (benchmarks/results/gpu_runs/README.md, 2026-11-27 fourth).
            r = F.relu(y)
            y = r * r
        else:
            y = F.gelu(y)
        return self.linear_fc2(y)


class Block(nn.Module):
    def __init__(self, spec: ModelSpec, layer_number: int = 1) -> None:
        super().__init__()
        self.input_layernorm = Norm(spec, spec.hidden_size)
        self.self_attention = Attention(spec, layer_number)
        # Gemma-2's sandwich norms: each sublayer's output is normalised again before the residual add.
        self.post_attention_layernorm = Norm(spec, spec.hidden_size) if spec.sandwich_norm else nn.Identity()
        self.pre_mlp_layernorm = Norm(spec, spec.hidden_size)
        self.mlp = MLP(spec)
        self.post_mlp_layernorm = Norm(spec, spec.hidden_size) if spec.sandwich_norm else nn.Identity()
        self.dropout = nn.Dropout(spec.hidden_dropout)
        # Full recompute: the block checkpoints itself inside its own forward, so a compiled block's graph holds the
        # checkpoint (torchtitan's order: AOTAutograd's partitioner recomputes only what the backward reads) and an
        # eager one stops at its last saved tensor (PyTorch's early stop): neither reruns fc2
        # (genconf.plan.counting.checkpoint_early_stop). Set by Decoder.
        self.recompute = False

    def forward(self, x: torch.Tensor, rope) -> torch.Tensor:
        if self.recompute and self.training:
            return checkpoint(self.layer, x, rope, use_reentrant=False)
        return self.layer(x, rope)

    def layer(self, x: torch.Tensor, rope) -> torch.Tensor:
        x = x + self.dropout(self.post_attention_layernorm(self.self_attention(self.input_layernorm(x), rope)))
        return x + self.dropout(self.post_mlp_layernorm(self.mlp(self.pre_mlp_layernorm(x))))


class Decoder(nn.Module):
    def __init__(self, spec: ModelSpec, *, recompute: bool = False) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block(spec, number) for number in range(1, spec.num_layers + 1))
        self.final_layernorm = Norm(spec, spec.hidden_size)
        for layer in self.layers:
            layer.recompute = recompute  # each block checkpoints itself (Block.forward)

    def forward(self, x: torch.Tensor, rope) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, rope)
        return self.final_layernorm(x)


class Embedding(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        # Padded to a multiple of 128 rows (genconf.plan.memory.vocab_rows). The padding rows are never a label; their
        # logits join the softmax, as Megatron's and OLMo's padded rows do.
        self.word_embeddings = nn.Embedding(torch_vocab_rows(spec.vocab_size), spec.hidden_size)
        self.position_embeddings = (nn.Embedding(spec.seq_length, spec.hidden_size)
                                    if spec.position_embedding == "learned" else None)
        self.dropout = nn.Dropout(spec.hidden_dropout)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.word_embeddings(tokens)
        if self.position_embeddings is not None:
            x = x + self.position_embeddings(torch.arange(tokens.shape[1], device=tokens.device))
        return self.dropout(x)


def _chunk_rows(vocab: int) -> int:
    """Rows of logits turned into fp32 at a time: at most FUSED_LOSS_CHUNK_ELEMENTS logits, at least one row."""
    return max(1, FUSED_LOSS_CHUNK_ELEMENTS // vocab)


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Mean cross entropy of 16-bit logits without an fp32 copy of them: the forward keeps the logits and each
    row's fp32 log-sum-exp; the backward writes a 16-bit gradient, turning one chunk of rows at a time into fp32
    (at most FUSED_LOSS_CHUNK_ELEMENTS logits, genconf.plan.memory prices the two fp32 copies of a chunk)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        rows = _chunk_rows(logits.shape[-1])
        lse = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
        target = torch.empty_like(lse)
        for start in range(0, logits.shape[0], rows):
            chunk = logits[start:start + rows].float()
            lse[start:start + rows] = torch.logsumexp(chunk, dim=-1)
            target[start:start + rows] = chunk.gather(1, labels[start:start + rows, None]).squeeze(1)
        ctx.save_for_backward(logits, labels, lse)
        return (lse - target).mean()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        logits, labels, lse = ctx.saved_tensors
        rows = _chunk_rows(logits.shape[-1])
        scale = grad / logits.shape[0]
        out = torch.empty_like(logits)
        for start in range(0, logits.shape[0], rows):
            probs = torch.exp(logits[start:start + rows].float() - lse[start:start + rows, None])
            probs.scatter_add_(1, labels[start:start + rows, None], torch.full_like(probs[:, :1], -1.0))
            out[start:start + rows] = probs * scale
        return out, None


def fused_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy over [tokens, vocab] logits in their own dtype (ParallelPlan.fused_loss):
    flash-attn's Triton kernel on a GPU where flash-attn is installed (as OLMo's fused_loss runs it), else the
    chunked PyTorch version above (the same memory; more passes over the logits)."""
    if logits.is_cuda:
        try:
            from flash_attn.ops.triton.cross_entropy import cross_entropy_loss
        except ImportError:
            cross_entropy_loss = None
        if cross_entropy_loss is not None:
            losses, _ = cross_entropy_loss(logits, labels)
            return losses.float().mean()
    return _ChunkedCrossEntropy.apply(logits, labels)


class GPT(nn.Module):
    """Decoder-only language model; forward(tokens, labels) returns the mean next-token loss (fp32)."""

    def __init__(self, spec: ModelSpec, *, recompute: bool = False, fused_loss: bool = False) -> None:
        super().__init__()
        self.spec = spec
        self.fused_loss = fused_loss
        self.embedding = Embedding(spec)
        self.decoder = Decoder(spec, recompute=recompute)
        self.output_layer = (None if spec.tie_embeddings
                             else nn.Linear(spec.hidden_size, torch_vocab_rows(spec.vocab_size), bias=False))
        if spec.position_embedding == "rope":
            cos, sin = rope_tables(spec.seq_length, spec.rope_dim, spec.rope_theta, spec.rope_scaling_factor)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def reset_parameters(self, std: float = 0.02) -> None:
        """GPT-2 initialisation: N(0, 0.02), output projections scaled by 1/sqrt(2 L) (Radford et al. 2019)."""
        scaled = std / math.sqrt(2 * self.spec.num_layers)
        for name, p in self.named_parameters():
            if p.dim() == 1:
                (nn.init.ones_ if name.endswith("weight") else nn.init.zeros_)(p)
            else:
                nn.init.normal_(p, 0.0, scaled if name.endswith(("linear_proj.weight", "linear_fc2.weight")) else std)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        rope = (self.rope_cos, self.rope_sin) if self.spec.position_embedding == "rope" else None
        x = self.decoder(self.embedding(tokens), rope)
        weight = self.embedding.word_embeddings.weight if self.output_layer is None else self.output_layer.weight
        logits = F.linear(x, weight)
        if labels is None:
            return logits
        if self.fused_loss:
            return fused_cross_entropy(logits.view(-1, logits.shape[-1]), labels.reshape(-1))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.reshape(-1))
