"""One MoE layer of GPT-OSS 120B and of Qwen3-30B-A3B, piece by piece, on the local GPU, against the cost model.

    python benchmarks/moe_layer.py --measure OUT.json      # on a CUDA GPU (plain PyTorch; no TE, no megatron)
    python benchmarks/moe_layer.py --compare OUT.json      # anywhere: genconf's prices for the same pieces

The published GPT-OSS runs (Megatron-Bridge) need about 1.75x the per-layer GPU time genconf prices
(benchmarks/results/gpu_work_scale.md). This measures what such a layer does on one rank of an EP8 group
(tp 1, micro-batch 1, seq 4096, balanced routing as moe_router_force_load_balancing gives), each piece as
megatron-core writes it where plain PyTorch can: RMSNorm; the QKV and output projections with their biases;
causal attention through torch's flash and cuDNN SDPA kernels (no attention sinks: torch has none); the
router; the token permute (gather) and unpermute (weighted scatter-add); the experts' fc1 and fc2 as one cuBLAS
GEMM per local expert (Transformer Engine's GroupedLinear in BF16) and as torch._grouped_mm; GPT-OSS's
activation as megatron-core's weighted_bias_quick_geglu_impl (eager clamps and cat, then the torch.compile'd
weighted quick-GEGLU) and Qwen3's as its weighted SwiGLU; GPT-OSS's fc2 bias as megatron-core's
TEGroupedMLP._apply_bias (per expert: bias x probs, add, then cat). Each piece is timed forward and
forward + backward with CUDA events (median of the repetitions after warm-up), then the whole layer in one
autograd graph, with the host sync of dropless routing (tokens per expert copied to the host), on the GPU's
clock and on the wall clock.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@dataclass(frozen=True)
class Shape:
    name: str
    catalog: str          # genconf's model name
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int              # per expert
    experts: int
    top_k: int
    bias: bool            # linear biases (GPT-OSS: q/k/v/o and experts)
    act: str              # "clamped-quick-geglu" (GPT-OSS) or "swiglu"
    activation_clamp: float | None = None  # megatron-core activation_func_clamp_value (GPT-OSS: 7.0)
    ep: int = 8
    tokens: int = 4096    # micro-batch 1 x seq 4096

    @property
    def local_experts(self) -> int:
        return self.experts // self.ep

    @property
    def rows(self) -> int:
        """Routed rows this rank's experts receive after the dispatch: every rank of the EP group sends each of
        its tokens top_k times, spread evenly over all experts."""
        return self.tokens * self.top_k * self.ep // self.experts * self.local_experts


SHAPES = {
    "gpt-oss-120b": Shape("GPT-OSS 120B", "gpt-oss-120b", 2880, 64, 8, 64, 2880, 128, 4, True,
                          "clamped-quick-geglu", 7.0),
    "qwen3-30b-a3b": Shape("Qwen3-30B-A3B", "qwen3-30b-a3b", 2048, 32, 4, 128, 768, 128, 8, False, "swiglu"),
}


# --- measuring (torch) -----------------------------------------------------------------------------------

def _timer(torch, device: str):
    def run(fn, reps: int = 20, warm: int = 5, queued: bool = False) -> float:
        """Median milliseconds of fn() over reps calls after warm. On a GPU, between two CUDA events: inline, the
        host launches the kernels as the GPU runs them (a gap where the host is slower counts); queued, behind a
        10 ms GPU spin, so every kernel is already queued when the GPU reaches it (the GPU's own time)."""
        for _ in range(warm):
            fn()
        if device == "cuda":
            times = []
            for _ in range(reps):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                if queued:
                    torch.cuda._sleep(20_000_000)  # cycles: about 10 ms at the H100/H200 boost clock
                a.record()
                fn()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b))
            return statistics.median(times)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)
    return run


class _LoopGrouped:
    """One GEMM per expert into slices of one buffer (Transformer Engine's GroupedLinear in BF16: cuBLAS per
    expert), forward and backward (data and weight gradients, bias gradient)."""

    def __new__(cls, torch):
        class LoopGrouped(torch.autograd.Function):
            @staticmethod
            def forward(ctx, a, w, b, splits):
                y = a.new_empty(a.shape[0], w.shape[1])
                for e, (ae, ye) in enumerate(zip(a.split(splits), y.split(splits))):
                    if b is None:
                        torch.mm(ae, w[e].t(), out=ye)
                    else:
                        torch.addmm(b[e], ae, w[e].t(), out=ye)
                ctx.save_for_backward(a, w)
                ctx.has_bias, ctx.splits = b is not None, splits
                return y

            @staticmethod
            def backward(ctx, g):
                a, w = ctx.saved_tensors
                splits = ctx.splits
                da, dw = torch.empty_like(a), torch.empty_like(w)
                db = g.new_empty(w.shape[0], w.shape[1]) if ctx.has_bias else None
                for e, (ae, ge, dae) in enumerate(zip(a.split(splits), g.split(splits), da.split(splits))):
                    torch.mm(ge, w[e], out=dae)
                    torch.mm(ge.t(), ae, out=dw[e])
                    if db is not None:
                        torch.sum(ge, 0, out=db[e])
                return da, dw, db, None
        return LoopGrouped


def _pieces(torch, s: Shape, device: str, reps: int) -> dict:
    import torch.nn.functional as F

    dt = torch.bfloat16 if device == "cuda" else torch.float32
    timed = _timer(torch, device)
    gen = torch.Generator(device=device).manual_seed(0)

    leaves = []

    def rand(*shape, grad=True, scale=0.02):
        t = (torch.randn(*shape, device=device, dtype=dt, generator=gen) * scale)
        leaves.append(t)
        return t.requires_grad_(grad)

    n, h, q, kv = s.tokens, s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim
    e_loc, rows, f = s.local_experts, s.rows, s.ffn
    splits = [rows // e_loc] * e_loc
    out: dict[str, dict] = {}

    def both(name, fwd, note=""):
        """Forward alone, and forward + backward (fwd returns (output, grad)); queued (the GPU's time) and inline
        (the host launching as the GPU runs)."""
        def fb():
            for t in leaves:  # fresh gradients: no accumulation pass (TE accumulates into main_grad in the GEMM)
                t.grad = None
            y, g = fwd()
            y.backward(g)
        try:
            row = {"note": note}
            for suffix, queued in (("", True), ("_inline", False)):
                f_ms = timed(lambda: fwd()[0], reps, queued=queued)
                fb_ms = timed(fb, reps, queued=queued)
                row[f"fwd_ms{suffix}"], row[f"bwd_ms{suffix}"] = f_ms, max(0.0, fb_ms - f_ms)
            out[name] = row
        except Exception as exc:  # a backend this torch or GPU lacks: recorded, not fatal
            out[name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}

    x = rand(n, h, scale=1.0)
    gx = torch.randn(n, h, device=device, dtype=dt)
    w_norm = torch.ones(h, device=device, dtype=dt, requires_grad=True)
    leaves.append(w_norm)
    both("norm", lambda: (F.rms_norm(x, (h,), w_norm), gx))

    w_qkv, b_qkv = rand(q + 2 * kv, h), (rand(q + 2 * kv) if s.bias else None)
    g_qkv = torch.randn(n, q + 2 * kv, device=device, dtype=dt)
    both("qkv", lambda: (F.linear(x, w_qkv, b_qkv), g_qkv))

    from torch.nn.attention import SDPBackend, sdpa_kernel
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "math": SDPBackend.MATH}
    for heads, d, tag in ((s.heads, s.head_dim, ""), (q // 128, 128, "_d128")):
        if tag and d == s.head_dim:
            continue
        kvh = max(1, heads * s.kv_heads // s.heads)
        qq = rand(1, heads, n, d, scale=1.0)
        kk, vv = rand(1, kvh, n, d, scale=1.0), rand(1, kvh, n, d, scale=1.0)
        ga = torch.randn(1, heads, n, d, device=device, dtype=dt)
        for bname, backend in backends.items():
            if bname == "math" and device == "cuda":
                continue
            for gqa in (True, False):
                def attn(backend=backend, gqa=gqa):
                    k_, v_ = (kk, vv) if gqa else (kk.repeat_interleave(heads // kvh, 1),
                                                   vv.repeat_interleave(heads // kvh, 1))
                    with sdpa_kernel([backend]):
                        y = F.scaled_dot_product_attention(qq, k_, v_, is_causal=True, enable_gqa=gqa)
                    return y, ga
                both(f"attn{tag}_{bname}" + ("" if gqa else "_expanded"), attn,
                     f"causal, {heads} heads x d {d}, {kvh} KV heads" + ("" if gqa else " (KV repeated first)"))
                if "error" not in out[f"attn{tag}_{bname}" + ("" if gqa else "_expanded")]:
                    break  # GQA ran natively: the expanded variant is not needed

    ctx = rand(n, q, scale=1.0)
    w_o, b_o = rand(h, q), (rand(h) if s.bias else None)
    both("proj", lambda: (F.linear(ctx, w_o, b_o), gx))

    w_r = rand(s.experts, h)
    g_r = torch.randn(n, s.experts, device=device, dtype=torch.float32)

    def router():
        logits = F.linear(x, w_r).float()
        top, idx = torch.topk(logits, s.top_k, dim=-1)
        probs = torch.zeros_like(logits).scatter(1, idx, torch.softmax(top, dim=-1))
        return probs, g_r
    both("router", router, "bf16 linear, fp32 top-k + softmax over the chosen")

    # This rank's routed rows: token i's j-th copy goes to local expert (i * top_k + j) % local experts, sorted by
    # expert (balanced). The gather stands for both the dispatch's permute and the received rows' sort.
    flat = torch.arange(rows, device=device) % n
    order = torch.argsort(torch.arange(rows, device=device) % e_loc, stable=True)
    token_of_row = flat[order]
    g_rows = torch.randn(rows, h, device=device, dtype=dt)
    both("permute", lambda: (x.index_select(0, token_of_row), g_rows), f"gather {rows} rows of {h}")

    xr = rand(rows, h, scale=1.0)

    LoopGrouped = _LoopGrouped(torch)

    w1, b1 = rand(e_loc, 2 * f, h), (rand(e_loc, 2 * f) if s.bias else None)
    w2, b2 = rand(e_loc, h, f), (rand(e_loc, h) if s.bias else None)
    g1 = torch.randn(rows, 2 * f, device=device, dtype=dt)
    both("fc1_loop", lambda: (LoopGrouped.apply(xr, w1, b1, splits), g1), f"{e_loc} experts x {rows // e_loc} rows, "
         f"{h} -> {2 * f}" + (" + bias" if s.bias else ""))
    hr = rand(rows, f, scale=1.0)
    both("fc2_loop", lambda: (LoopGrouped.apply(hr, w2, None, splits), g_rows),
         f"{f} -> {h}" + (", bias added apart (fc2_bias)" if s.bias else ""))
    if device == "cuda":
        offs = torch.cumsum(torch.tensor(splits, device=device), 0).to(torch.int32)
        # [experts, out, in] weights passed transposed, as torchtitan's MoE calls it
        both("fc1_grouped_mm", lambda: (torch._grouped_mm(xr, w1.transpose(-2, -1), offs=offs), g1),
             "torch._grouped_mm, no bias")
        both("fc2_grouped_mm", lambda: (torch._grouped_mm(hr, w2.transpose(-2, -1), offs=offs), g_rows),
             "torch._grouped_mm")

    # The activation, as megatron-core's bias_act_func with bias_activation_fusion (experts.py; fused_bias_geglu.py,
    # fused_bias_swiglu.py: jit_fuser is torch.compile).
    probs = torch.rand(rows, 1, device=device, dtype=torch.float32).requires_grad_()  # the router's gradient
    leaves.append(probs)
    y1 = rand(rows, 2 * f, scale=1.0)
    g_act = torch.randn(rows, f, device=device, dtype=dt)
    if s.activation_clamp:
        unclamped = _activation(torch, s, clamp=False)
        both("act_unclamped", lambda: (unclamped(y1, probs), g_act),
             "the same activation with its clamp off (the clamp's cost is act minus this)")
    act = _activation(torch, s)
    both("act", lambda: (act(y1, probs), g_act), s.act + " (clamp and cat eager, the rest torch.compile'd)"
         if s.act != "swiglu" else "weighted SwiGLU, torch.compile'd")

    if s.bias:
        y2 = rand(rows, h, scale=1.0)  # fc2's output

        def apply_bias():
            return torch.cat([t + b * p for t, b, p in zip(y2.split(splits), b2, probs.split(splits))]).to(dt), g_rows
        both("fc2_bias", apply_bias, "per expert: bias x fp32 probs, add, then cat and cast back "
             "(TEGroupedMLP._apply_bias)")

    yr = rand(rows, h, scale=1.0)
    both("unpermute", lambda: (torch.zeros(n, h, device=device, dtype=dt).index_add(0, token_of_row, yr), gx),
         f"scatter-add {rows} rows into {n}")
    return out


def _activation(torch, s: Shape, clamp: bool = True):
    """The experts' activation with the router's probabilities, as megatron-core runs it."""
    compile_ = torch.compile

    if s.act == "swiglu":
        @compile_
        def fwd(y, w):
            a, b = torch.chunk(y, 2, -1)
            return (torch.nn.functional.silu(a) * b * w).to(y.dtype)

        @compile_
        def back(g, y, w):
            a, b = torch.chunk(y, 2, -1)
            sig = torch.sigmoid(a.float())
            ga = g.float() * w
            da = ga * sig * (1 + a.float() * (1 - sig)) * b.float()
            dbb = ga * a.float() * sig
            dw = torch.sum(torch.nn.functional.silu(a.float()) * b.float() * g.float(), -1, keepdim=True)
            return torch.cat((da, dbb), -1).to(y.dtype), dw

        limit = None
    else:
        @compile_
        def fwd(y, w):
            a, b = torch.chunk(y, 2, -1)
            # quick_gelu(a) * (b + glu_linear_offset 1.0): megatron-core fused_bias_geglu.py, 1.702 its constant
            return (a * torch.sigmoid(1.702 * a) * (b + 1.0) * w).to(y.dtype)

        @compile_
        def back(g, y, w):
            a, b = torch.chunk(y, 2, -1)
            sig = torch.sigmoid(1.702 * a)
            gw = g * w
            da = gw * sig * (1 + 1.702 * a * (1 - sig)) * (b + 1.0)
            dbb = gw * a * sig
            dw = torch.sum(a * sig * (b + 1.0) * g.to(w.dtype), -1, keepdim=True)
            return torch.cat((da, dbb), -1).to(y.dtype), dw

        limit = s.activation_clamp if clamp else None

    class Act(torch.autograd.Function):
        @staticmethod
        def forward(ctx, y, w):
            ctx.save_for_backward(y, w)
            return fwd(y, w)

        @staticmethod
        def backward(ctx, g):
            y, w = ctx.saved_tensors
            dy, dw = back(g, y, w)
            return dy, dw

    def run(y, w):
        if limit is not None:
            a, b = y.chunk(2, -1)
            y = torch.cat((a.clamp(max=limit), b.clamp(min=-limit, max=limit)), -1)
        return Act.apply(y, w)
    return run


def _layer(torch, s: Shape, device: str, reps: int) -> dict:
    """The whole layer in one autograd graph: norm, QKV, attention (flash), proj, residual, norm, router, permute,
    host sync on the tokens per expert, fc1, activation, fc2 (+ bias per expert), unpermute, residual."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dt = torch.bfloat16 if device == "cuda" else torch.float32
    gen = torch.Generator(device=device).manual_seed(1)

    params = []

    def p(*shape, scale=0.02):
        params.append((torch.randn(*shape, device=device, dtype=dt, generator=gen) * scale).requires_grad_())
        return params[-1]

    n, h, q, kv, d = s.tokens, s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim, s.head_dim
    e_loc, f = s.local_experts, s.ffn
    w_n1, w_n2 = p(h, scale=0.0), p(h, scale=0.0)
    with torch.no_grad():
        w_n1 += 1.0
        w_n2 += 1.0
    w_qkv, b_qkv = p(q + 2 * kv, h), (p(q + 2 * kv) if s.bias else None)
    w_o, b_o = p(h, q), (p(h) if s.bias else None)
    w_r = p(s.experts, h)
    w1, b1 = p(e_loc, 2 * f, h), (p(e_loc, 2 * f) if s.bias else None)
    w2, b2 = p(e_loc, h, f), (p(e_loc, h) if s.bias else None)
    act = _activation(torch, s)
    grouped = _LoopGrouped(torch)
    x0 = p(n, h, scale=1.0)
    g = torch.randn(n, h, device=device, dtype=dt)
    rows = s.rows
    pos = torch.arange(rows, device=device)
    order = torch.argsort(pos % e_loc, stable=True)
    token_of_row = (pos % n)[order]
    backend = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION] if device == "cuda" else [SDPBackend.MATH]

    def step():
        for t in params:  # fresh gradients each step: no accumulation pass
            t.grad = None
        a = F.rms_norm(x0, (h,), w_n1)
        qkv = F.linear(a, w_qkv, b_qkv)
        qh, kh, vh = qkv.split([q, kv, kv], -1)
        qh = qh.view(1, n, s.heads, d).transpose(1, 2)
        kh = kh.view(1, n, s.kv_heads, d).transpose(1, 2)
        vh = vh.view(1, n, s.kv_heads, d).transpose(1, 2)
        with sdpa_kernel(backend):
            c = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, enable_gqa=True)
        x1 = x0 + F.linear(c.transpose(1, 2).reshape(n, q), w_o, b_o)
        m = F.rms_norm(x1, (h,), w_n2)
        logits = F.linear(m, w_r).float()
        top, idx = torch.topk(logits, s.top_k, dim=-1)
        # Balanced routing (force load balancing): the counts still go to the host, as dropless routing copies them.
        counts = torch.bincount(pos % e_loc, minlength=e_loc)
        splits = counts.tolist()
        wts = torch.softmax(top, -1).reshape(-1)[order]  # rows == tokens x top_k
        xr = m.index_select(0, token_of_row)
        y1 = grouped.apply(xr, w1, b1, splits)
        hdn = act(y1, wts.unsqueeze(-1))
        y2 = grouped.apply(hdn, w2, None, splits)
        if b2 is not None:
            pr = wts.unsqueeze(-1).split(splits)
            y2 = torch.cat([t + b * pe for t, b, pe in zip(y2.split(splits), b2, pr)]).to(y2.dtype)
        x2 = x1 + torch.zeros(n, h, device=device, dtype=y2.dtype).index_add(0, token_of_row, y2)
        x2.backward(g)

    for _ in range(3):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    gpu, wall = [], []
    for _ in range(reps):
        if device == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            a.record()
            step()
            b.record()
            b.synchronize()
            wall.append((time.perf_counter() - t0) * 1e3)
            gpu.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            step()
            wall.append((time.perf_counter() - t0) * 1e3)
    return {"fwd_bwd_ms_gpu_clock": statistics.median(gpu) if gpu else None,
            "fwd_bwd_ms_wall": statistics.median(wall),
            "note": "whole layer, eager, experts one GEMM per expert, cuDNN attention"}


def measure(path: Path, names: list[str], reps: int, scale: float) -> None:
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    result = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
              "torch": torch.__version__, "cuda": torch.version.cuda, "reps": reps, "scale": scale, "models": {}}
    for name in names:
        s = SHAPES[name]
        if scale != 1.0:  # a small copy for a CPU dry run
            from dataclasses import replace
            s = replace(s, hidden=int(s.hidden * scale) // 64 * 64 or 64, ffn=int(s.ffn * scale) // 64 * 64 or 64,
                        tokens=int(s.tokens * scale) // 128 * 128 or 128)
        t0 = time.perf_counter()
        pieces = _pieces(torch, s, device, reps)
        layer = _layer(torch, s, device, reps)
        result["models"][name] = {"shape": s.__dict__, "pieces": pieces, "layer": layer,
                                  "seconds": round(time.perf_counter() - t0, 1)}
        print(json.dumps({name: result["models"][name]}, indent=1), flush=True)
        path.write_text(json.dumps(result, indent=1) + "\n")


# --- comparing (pure genconf) --------------------------------------------------------------------------

def predicted(s: Shape, gpu_name: str) -> dict[str, tuple[float, float]]:
    """genconf's forward and backward milliseconds for the same pieces on `gpu_name` (its catalog calibration)."""
    from genconf.catalog.hardware import calibration_for, resolve_gpu
    from genconf.plan import cost, kernels

    gpu, cal = resolve_gpu(gpu_name), calibration_for(gpu_name)
    n, h, q, kv = s.tokens, s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim
    rows_per_expert, f = s.rows // s.local_experts, s.ffn
    ms = lambda fb: (fb[0] * 1e3, fb[1] * 1e3)  # noqa: E731
    peak16 = gpu.peak_bf16_tflops * cost.sustained_clock(gpu, cal, gemm=False)

    def attn(heads: int, d: int) -> tuple[float, float]:
        kw = dict(peak_tflops=peak16, sms=gpu.num_sms, causal=True)
        return (kernels.flash_attention_s(heads, n, n, d, efficiency=cal.attention_fwd_efficiency,
                                          tile_overhead_s=cal.attention_fwd_tile_s, **kw),
                kernels.flash_attention_s(heads, n, n, d, efficiency=cal.attention_bwd_efficiency,
                                          tile_overhead_s=cal.attention_bwd_tile_s, backward=True, **kw))
    mem = lambda b: cost._mem_s(gpu, cal, b) * 1e3  # noqa: E731
    out = {
        "qkv": ms(cost.linear_s(gpu, cal, n, q + 2 * kv, h, "bf16")),
        "proj": ms(cost.linear_s(gpu, cal, n, h, q, "bf16")),
        "router": ms(cost.linear_s(gpu, cal, n, s.experts, h, "bf16")),
        "fc1": ms(cost.linear_s(gpu, cal, rows_per_expert, 2 * f, h, "bf16", groups=s.local_experts)),
        "fc2": ms(cost.linear_s(gpu, cal, rows_per_expert, h, f, "bf16", groups=s.local_experts)),
        "attn": ms(attn(s.heads, s.head_dim)),
        "attn_d128": ms(attn(q // 128, 128)),
        # memory-bound passes at the HBM rate genconf uses: read + write once (bf16)
        "norm": (mem(2 * 2 * n * h), mem(3 * 2 * 2 * n * h)),
        "permute": (mem(2 * 2 * s.rows * h), mem(2 * 2 * s.rows * h)),
        "unpermute": (mem(2 * 2 * s.rows * h), mem(2 * 2 * s.rows * h)),
        "act": (mem(2 * 3 * s.rows * f), mem(2 * 5 * s.rows * f)),
    }
    out["act_unclamped"] = out["act"]
    if s.act == "clamped-quick-geglu":  # genconf's price of the clamps (cost.CLAMP_BYTES, from this benchmark)
        out["act"] = tuple(a + mem(c * s.rows * 2 * f) for a, c in zip(out["act"], cost.CLAMP_BYTES))
    if s.bias:  # cost.EXPERT_BIAS_BYTES, from this benchmark
        out["fc2_bias"] = tuple(mem(b * s.rows * h) for b in cost.EXPERT_BIAS_BYTES)
    return out


def layer_price(s: Shape, gpu_name: str) -> tuple[float, float]:
    """genconf's forward and backward seconds for the whole layer (full attention) as megatron-core with Transformer
    Engine runs it: tp 1, ep 8, micro-batch 1, BF16."""
    from genconf.catalog.clusters import resolve_cluster
    from genconf.catalog.hardware import calibration_for
    from genconf.catalog.models import resolve_model
    from genconf.plan import cost

    model = resolve_model(s.catalog)[0]
    lt = cost._layer_time(model, 1, 1, s.ep, 1, s.tokens, False, "bf16", None, "megatron-te", False,
                          resolve_cluster(gpu=gpu_name), calibration_for(gpu_name), False)
    return lt.fwd_s, lt.bwd_s


def compare(path: Path, gpu_name: str) -> str:
    data = json.loads(path.read_text())
    lines = [f"# One MoE layer, piece by piece: measured on {data['device']} vs genconf's prices ({gpu_name})", "",
             f"Command: `python benchmarks/moe_layer.py --measure {path.name}` on the GPU (torch {data['torch']}, "
             f"CUDA {data['cuda']}), then `python benchmarks/moe_layer.py --compare {path.name} --gpu {gpu_name}`.",
             "Milliseconds for one micro-batch (1 x 4096 tokens) on one rank of an EP8 group, tp 1, balanced routing; "
             "ratio = measured / genconf. genconf's memory-bound rows are one read + one write per tensor "
             "(the fused floor), so their ratio is the passes the implementation really makes; GPT-OSS's act and fc2_bias "
             "rows are priced with cost.CLAMP_BYTES and cost.EXPERT_BIAS_BYTES, which were taken from this measurement "
             "(their agreement is by construction; the published runs test them: benchmarks/results/history.md).", ""]
    alias = {"fc1_loop": "fc1", "fc2_loop": "fc2", "fc1_grouped_mm": "fc1", "fc2_grouped_mm": "fc2",
             "attn_flash": "attn", "attn_cudnn": "attn", "attn_flash_expanded": "attn", "attn_cudnn_expanded": "attn",
             "attn_d128_flash": "attn_d128", "attn_d128_cudnn": "attn_d128", "attn_d128_flash_expanded": "attn_d128",
             "attn_d128_cudnn_expanded": "attn_d128"}
    for name, m in data["models"].items():
        s = Shape(**m["shape"])
        pred = predicted(s, gpu_name)
        lines += [f"## {s.name}: {s.local_experts} local experts x {s.rows // s.local_experts} rows, hidden {s.hidden}, "
                  f"ffn {s.ffn}, {s.heads} heads x d {s.head_dim}", "",
                  "| piece | what | GPU fwd ms | GPU bwd ms | inline fwd + bwd | genconf fwd | genconf bwd | ratio fwd "
                  "| ratio bwd |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
        for piece, r in m["pieces"].items():
            if "error" in r:
                lines.append(f"| {piece} | did not run: {r['error']} | | | | | | | |")
                continue
            p = pred.get(alias.get(piece, piece))
            pf, pb = p if p else (None, None)
            cell = lambda v: f"{v:.3f}" if v is not None else "-"  # noqa: E731
            ratio = lambda a, b: f"{a / b:.2f}" if b else "-"  # noqa: E731
            inline = r.get("fwd_ms_inline", r["fwd_ms"]) + r.get("bwd_ms_inline", r["bwd_ms"])
            lines.append(f"| {piece} | {r['note']} | {r['fwd_ms']:.3f} | {r['bwd_ms']:.3f} | {inline:.3f} | {cell(pf)} | "
                         f"{cell(pb)} | {ratio(r['fwd_ms'], pf)} | {ratio(r['bwd_ms'], pb)} |")
        # The layer's sum: the per-expert GEMMs, cuDNN attention (TE's fused attention; native GQA where it ran), every
        # other piece once.
        chosen = [k for k in m["pieces"] if "error" not in m["pieces"][k] and not k.endswith("grouped_mm")
                  and not k.startswith("attn") and k != "act_unclamped"]
        attn = next((k for k in ("attn_cudnn", "attn_flash", "attn_cudnn_expanded", "attn_flash_expanded") if "error" not in
                     m["pieces"].get(k, {"error": 1})), None)
        chosen += [attn] if attn else []
        meas = sum(m["pieces"][k]["fwd_ms"] + m["pieces"][k]["bwd_ms"] for k in chosen)
        prices = sum(sum(pred[alias.get(k, k)]) for k in chosen if alias.get(k, k) in pred)
        lay = m["layer"]
        gpu_clock = f"{lay['fwd_bwd_ms_gpu_clock']:.3f} ms on the GPU's clock, " if lay["fwd_bwd_ms_gpu_clock"] else ""
        layer_f, layer_b = layer_price(s, gpu_name)
        lines += ["", f"Sum of the pieces ({', '.join(chosen)}), forward + backward on the GPU's clock: measured "
                  f"{meas:.3f} ms; genconf's prices of the same pieces {prices:.3f} ms (x{meas / prices:.2f}); genconf's "
                  f"whole layer (megatron-core with TE, every element-wise pass priced) {1e3 * (layer_f + layer_b):.3f} ms "
                  f"(x{meas / (1e3 * (layer_f + layer_b)):.2f}).", "",
                  f"Whole layer, forward + backward: {gpu_clock}{lay['fwd_bwd_ms_wall']:.3f} ms on the wall clock "
                  f"({lay['note']}; one norm more and the residual adds beside the sum's pieces): x"
                  f"{(lay['fwd_bwd_ms_gpu_clock'] or lay['fwd_bwd_ms_wall']) / (1e3 * (layer_f + layer_b)):.2f} "
                  "genconf's whole layer.", ""]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measure", type=Path, help="measure on this machine's GPU, write JSON here")
    ap.add_argument("--compare", type=Path, help="a --measure JSON: print it beside genconf's prices")
    ap.add_argument("--gpu", default="h200", help="genconf GPU to price with (--compare)")
    ap.add_argument("--models", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--scale", type=float, default=1.0, help="shrink the shapes (a CPU dry run)")
    ap.add_argument("--write", type=Path, help="--compare: also write the table here")
    args = ap.parse_args()
    return measure_or_compare(ap, args, lambda: measure(args.measure, args.models, args.reps, args.scale),
                              lambda: compare(args.compare, args.gpu))


def measure_or_compare(ap, args, measure_, compare_) -> int:
    """The flow of the GPU benchmarks (this one, eager_elementwise.py): --measure on a GPU, --compare anywhere
    (printed, and written to --write)."""
    if args.measure:
        measure_()
    if args.compare:
        text = compare_()
        print(text)
        if args.write:
            args.write.write_text(text)
    if not (args.measure or args.compare):
        ap.error("give --measure OUT.json or --compare OUT.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
