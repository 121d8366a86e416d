"""The element-wise work of one dense layer in eager PyTorch, piece by piece, on the local GPU, in HBM bytes.

    python benchmarks/eager_elementwise.py --measure OUT.json   # on a CUDA GPU (plain PyTorch)
    python benchmarks/eager_elementwise.py --compare OUT.json   # anywhere: bytes per element, against genconf's

genconf prices a layer's element-wise work (norms, residual adds, RoPE, the activation) as the HBM bytes Transformer
Engine's fused kernels move, times a pass factor per stack (cost.ELEMENTWISE_PASSES: 2.0 for eager PyTorch). The
stacks that run eagerly differ in what each piece costs: torch's LayerNorm and GELU are one kernel each, as fused
as TE's; an RMSNorm, a SwiGLU or a RoPE written in PyTorch ops is several. This measures each piece as the eager
stacks genconf prices write it (llm-foundry's MPT, genconf's own PyTorch GPT in genconf/train/torch_model.py):

- layernorm: F.layer_norm with weight and bias, width h;
- rmsnorm: F.rms_norm with weight, width h;
- add: the residual add x + y, width h (its backward passes the gradient on; the add that joins the residual's
  two gradients is the same kernel as the forward's, counted by the cost model as one more add);
- gelu: F.gelu (exact), width f;
- swiglu: F.silu(gate) * up on the two halves of fc1's output (width 2 f in, f out);
- rope: genconf's apply_rope (cat of the rotated halves, two multiplies and an add) on q and k, [b, s, 2 heads, d];
- bias: F.linear with a bias minus without (the epilogue forward, the bias gradient's column sum backward);
- dropout: F.dropout p 0.1, width h (forward mask and scale, backward the same mask).

Each piece is timed forward, and forward + backward (backward = the difference), behind a GPU spin (the GPU's own
time; moe_layer._timer), at two shapes (MPT-1B's micro-batch 12 x 2,048 tokens and MPT-7B's 4 x 2,048). The HBM
rate is measured in the same run (a bf16 add of 1 GiB operands), and each piece is reported as bytes per element
of its width at that rate: what the cost model multiplies by the GPU's HBM rate.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = {
    # name: (tokens, hidden, ffn, heads, head_dim)
    "mpt-1b": (12 * 2048, 2048, 8192, 16, 128),
    "mpt-7b": (4 * 2048, 4096, 16384, 32, 128),
}
PIECES = ("layernorm", "rmsnorm", "add", "gelu", "swiglu", "rope", "bias", "dropout")
WIDTH = {"layernorm": "h", "rmsnorm": "h", "add": "h", "gelu": "f", "swiglu": "f", "rope": "qk", "bias": "h",
         "dropout": "h"}
"""The width each piece's elements are counted in (per token): h, f (the activation's output), qk (q + k)."""


# --- measuring (torch) -----------------------------------------------------------------------------------

def _pieces(torch, tokens: int, h: int, f: int, heads: int, d: int, device: str, reps: int) -> dict:
    import torch.nn.functional as F
    from moe_layer import _timer

    from genconf.train.torch_model import apply_rope, rope_tables

    dt = torch.bfloat16 if device == "cuda" else torch.float32
    timed = _timer(torch, device)
    gen = torch.Generator(device=device).manual_seed(0)
    leaves = []

    def rand(*shape, grad=True):
        t = torch.randn(*shape, device=device, dtype=dt, generator=gen)
        leaves.append(t)
        return t.requires_grad_(grad)

    def grad_like(y):
        return torch.randn(y.shape, device=device, dtype=y.dtype, generator=gen)

    out: dict[str, dict] = {}

    def both(name, fwd):
        y0 = fwd()
        g = grad_like(y0)
        del y0

        def fb():
            for t in leaves:
                t.grad = None
            fwd().backward(g)
        f_ms = timed(fwd, reps, queued=True)
        fb_ms = timed(fb, reps, queued=True)
        out[name] = {"fwd_ms": f_ms, "bwd_ms": max(0.0, fb_ms - f_ms)}

    x, y = rand(tokens, h), rand(tokens, h)
    w, b = rand(h), rand(h)
    both("layernorm", lambda: F.layer_norm(x, (h,), w, b))
    both("rmsnorm", lambda: F.rms_norm(x, (h,), w))
    both("add", lambda: x + y)
    both("dropout", lambda: F.dropout(x, 0.1, training=True))
    u = rand(tokens, f)
    both("gelu", lambda: F.gelu(u))
    u2 = rand(tokens, 2 * f)

    def swiglu():
        gate, up = u2.chunk(2, dim=-1)
        return F.silu(gate) * up
    both("swiglu", swiglu)
    seq = 2048
    qk = rand(tokens // seq, seq, 2 * heads, d)  # q and k side by side: the same element-wise work as both
    cos, sin = (t.to(device)[:, None, :] for t in rope_tables(seq, d))
    both("rope", lambda: apply_rope(qk, cos, sin))
    a = rand(tokens, f)
    wl, bl = rand(h, f), rand(h)
    both("linear_bias", lambda: F.linear(a, wl, bl))
    both("linear_nobias", lambda: F.linear(a, wl))
    out["bias"] = {k: out["linear_bias"][k] - out["linear_nobias"][k] for k in ("fwd_ms", "bwd_ms")}
    # The HBM rate: a bf16 add of 1 GiB operands (read 2, write 1).
    big = 2**29 if device == "cuda" else 2**20
    p, q2 = torch.randn(big, device=device, dtype=dt), torch.randn(big, device=device, dtype=dt)
    ms = timed(lambda: p + q2, reps, queued=True)
    out["hbm"] = {"tbyte_per_s": 3 * big * p.element_size() / (ms * 1e-3) / 1e12}
    return out


ATTENTION = ((2048, 16, 128), (8192, 16, 128), (32768, 16, 128), (2048, 12, 64), (8192, 12, 64))
"""(seq, heads, head dim) of the attention sweep, 32,768 tokens each: MPT-1B's heads and MPT-125M's (d 64)."""


def _attention(torch, device: str, reps: int, scale: float) -> dict:
    """Causal attention through torch's SDPA flash backend (its FlashAttention-2) and cuDNN's, forward and
    backward: the flash2 factor genconf prices (Calibration.flash2_attention_factor) is their ratio."""
    import torch.nn.functional as F
    from moe_layer import _timer
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dt = torch.bfloat16 if device == "cuda" else torch.float32
    timed = _timer(torch, device)
    out = {}
    for seq, heads, d in ATTENTION:
        if scale != 1.0:
            seq, heads = 256, 2
        b = max(1, 32768 // seq) if scale == 1.0 else 1
        q, k, v = (torch.randn(b, heads, seq, d, device=device, dtype=dt, requires_grad=True) for _ in range(3))
        g = torch.randn(b, heads, seq, d, device=device, dtype=dt)
        row = {"batch": b, "seq": seq, "heads": heads, "head_dim": d}
        for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                              ("math", SDPBackend.MATH)):
            if (name == "math") == (device == "cuda"):
                continue

            def fwd(backend=backend):
                with sdpa_kernel([backend]):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True)

            def fb(fwd=fwd):
                q.grad = k.grad = v.grad = None
                fwd().backward(g)
            try:
                f_ms = timed(fwd, reps, queued=True)
                row[name] = {"fwd_ms": f_ms, "bwd_ms": max(0.0, timed(fb, reps, queued=True) - f_ms)}
            except Exception as exc:  # a backend this torch or GPU lacks: recorded, not fatal
                row[name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
        out[f"s{seq}_h{heads}_d{d}"] = row
        if scale != 1.0:
            break
    return out


def _mpt_layer(torch, tokens: int, h: int, f: int, heads: int, d: int, device: str, reps: int) -> dict:
    """One MPT block as llm-foundry writes it (LayerNorm, Wqkv with bias, causal attention, out_proj with bias,
    residual add, LayerNorm, up_proj with bias, exact GELU, down_proj with bias, residual add; no dropout), in bf16
    weights, forward and forward + backward, attention through SDPA's flash backend (FlashAttention-2; llm-foundry
    ran Triton's) and cuDNN's."""
    import torch.nn.functional as F
    from moe_layer import _timer
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dt = torch.bfloat16 if device == "cuda" else torch.float32
    timed = _timer(torch, device)
    seq = 2048
    b = tokens // seq

    def p(*shape):
        return (torch.randn(*shape, device=device, dtype=dt) * 0.02).requires_grad_(True)
    params = dict(ln1_w=p(h), ln1_b=p(h), w_qkv=p(3 * h, h), b_qkv=p(3 * h), w_o=p(h, h), b_o=p(h), ln2_w=p(h),
                  ln2_b=p(h), w_up=p(f, h), b_up=p(f), w_down=p(h, f), b_down=p(h))
    x = torch.randn(b, seq, h, device=device, dtype=dt, requires_grad=True)
    g = torch.randn(b, seq, h, device=device, dtype=dt)
    out = {}
    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        if device != "cuda":
            backend = SDPBackend.MATH

        def fwd(backend=backend, w=params):
            a = F.layer_norm(x, (h,), w["ln1_w"], w["ln1_b"])
            qkv = F.linear(a, w["w_qkv"], w["b_qkv"]).view(b, seq, 3, heads, d)
            q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
            with sdpa_kernel([backend]):
                ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            y = x + F.linear(ctx.transpose(1, 2).reshape(b, seq, h), w["w_o"], w["b_o"])
            m = F.layer_norm(y, (h,), w["ln2_w"], w["ln2_b"])
            return y + F.linear(F.gelu(F.linear(m, w["w_up"], w["b_up"])), w["w_down"], w["b_down"])

        def fb(fwd=fwd):
            for t in (x, *params.values()):
                t.grad = None
            fwd().backward(g)
        f_ms = timed(fwd, reps, queued=True)
        fb_ms = timed(fb, reps, queued=True)
        out[name] = {"fwd_ms": f_ms, "bwd_ms": max(0.0, fb_ms - f_ms), "fwd_ms_inline": timed(fwd, reps),
                     "fb_ms_inline": timed(fb, reps)}
        if device != "cuda":
            break
    return out


OWN_MODEL, OWN_MBS, OWN_SEQ = "1b", 8, 2048
"""genconf's own PyTorch GPT as its GPU suite trains it (benchmarks/gpu_suite.sh: the 1b model at micro-batch 8)."""


def _own_layer(torch, device: str, reps: int, scale: float) -> dict:
    """One decoder block of genconf's own PyTorch GPT (genconf.train.torch_model.Block, the 1b catalog model, bf16
    weights) forward and forward + backward with SDPA left to torch (auto) and pinned to flash and cuDNN, and its
    parts alone at the same shape: the four GEMMs (F.linear), attention, and the element-wise pieces, so that the
    block can be set against the sum of its measured parts and against genconf's price."""
    import dataclasses

    import torch.nn.functional as F
    from moe_layer import _timer
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from genconf.catalog.models import resolve_model
    from genconf.train.torch_model import Block, rope_tables

    spec = resolve_model(OWN_MODEL)[0]
    mbs, seq = OWN_MBS, OWN_SEQ
    if scale != 1.0:
        spec = dataclasses.replace(spec, hidden_size=64, num_attention_heads=2, num_query_groups=2, kv_channels=32,
                                   ffn_hidden_size=256)
        mbs, seq = 1, 256
    dt = torch.bfloat16 if device == "cuda" else torch.float32
    timed = _timer(torch, device)
    block = Block(spec).to(device=device, dtype=dt)
    h, q, kv, d = spec.hidden_size, spec.query_width, spec.kv_width, spec.kv_channels
    cos, sin = (t.to(device) for t in rope_tables(seq, d))
    x = torch.randn(mbs, seq, h, device=device, dtype=dt, requires_grad=True)
    g = torch.randn(mbs, seq, h, device=device, dtype=dt)
    backends = {"auto": None, "flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    out: dict = {"model": spec.name, "mbs": mbs, "seq": seq, "block": {}, "gemms": {}, "attention": {}}
    for name, backend in backends.items():
        if device != "cuda" and backend is not None:
            continue

        def fwd(backend=backend):
            if backend is None:
                return block(x, (cos, sin))
            with sdpa_kernel([backend]):
                return block(x, (cos, sin))

        def fb(fwd=fwd):
            x.grad = None
            for p in block.parameters():
                p.grad = None
            fwd().backward(g)
        f_ms = timed(fwd, reps, queued=True)
        out["block"][name] = {"fwd_ms": f_ms, "bwd_ms": max(0.0, timed(fb, reps, queued=True) - f_ms)}
    n = mbs * seq
    branches = 2 if spec.gated else 1
    for name, (fan_in, fan_out) in {"qkv": (h, q + 2 * kv), "proj": (q, h), "fc1": (h, branches * spec.ffn_hidden_size),
                                    "fc2": (spec.ffn_hidden_size, h)}.items():
        a = torch.randn(n, fan_in, device=device, dtype=dt, requires_grad=True)
        w = (torch.randn(fan_out, fan_in, device=device, dtype=dt) * 0.02).requires_grad_(True)
        go = torch.randn(n, fan_out, device=device, dtype=dt)

        def lin_fb(a=a, w=w, go=go):
            a.grad = w.grad = None
            F.linear(a, w).backward(go)
        f_ms = timed(lambda a=a, w=w: F.linear(a, w), reps, queued=True)
        out["gemms"][name] = {"fwd_ms": f_ms, "bwd_ms": max(0.0, timed(lin_fb, reps, queued=True) - f_ms)}
    heads = spec.num_attention_heads
    qq, kk, vv = (torch.randn(mbs, heads, seq, d, device=device, dtype=dt, requires_grad=True) for _ in range(3))
    ga = torch.randn(mbs, heads, seq, d, device=device, dtype=dt)
    for name, backend in backends.items():
        if device != "cuda" and backend is not None:
            continue

        def att(backend=backend):
            if backend is None:
                return F.scaled_dot_product_attention(qq, kk, vv, is_causal=True)
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(qq, kk, vv, is_causal=True)

        def att_fb(att=att):
            qq.grad = kk.grad = vv.grad = None
            att().backward(ga)
        f_ms = timed(att, reps, queued=True)
        out["attention"][name] = {"fwd_ms": f_ms, "bwd_ms": max(0.0, timed(att_fb, reps, queued=True) - f_ms)}
    out["pieces"] = _pieces(torch, n, h, spec.ffn_hidden_size, heads, d, device, reps)
    return out


def measure(path: Path, reps: int, scale: float, only_own: bool = False) -> None:
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    result = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
              "reps": reps, "scale": scale, "shapes": {}}
    for name, (tokens, h, f, heads, d) in SHAPES.items() if not only_own else ():
        if scale != 1.0:  # a small copy for a CPU dry run
            tokens, h, f, heads, d = 2048, 64, 256, 2, 32
        t0 = time.perf_counter()
        pieces = _pieces(torch, tokens, h, f, heads, d, device, reps)
        layer = _mpt_layer(torch, tokens, h, f, heads, d, device, reps)
        result["shapes"][name] = {"tokens": tokens, "hidden": h, "ffn": f, "heads": heads, "head_dim": d,
                                  "pieces": pieces, "layer": layer, "seconds": round(time.perf_counter() - t0, 1)}
        print(json.dumps({name: result["shapes"][name]}), flush=True)
        path.write_text(json.dumps(result, indent=1) + "\n")
    if not only_own:
        result["attention"] = _attention(torch, device, reps, scale)
        print(json.dumps({"attention": result["attention"]}), flush=True)
    result["own"] = _own_layer(torch, device, reps, scale)
    print(json.dumps({"own": result["own"]}), flush=True)
    path.write_text(json.dumps(result, indent=1) + "\n")


# --- comparing (pure genconf) --------------------------------------------------------------------------

def bytes_per_element(shape: dict) -> dict[str, tuple[float, float]]:
    """Each piece's forward and backward time as bf16-equivalent HBM bytes per element of its width, at the
    HBM rate measured in the same run."""
    rate = shape["pieces"]["hbm"]["tbyte_per_s"] * 1e12
    width = {"h": shape["hidden"], "f": shape["ffn"], "qk": 2 * shape["heads"] * shape["head_dim"]}
    got = {}
    for piece in PIECES:
        elems = shape["tokens"] * width[WIDTH[piece]]
        t = shape["pieces"][piece]
        got[piece] = (t["fwd_ms"] * 1e-3 * rate / elems, t["bwd_ms"] * 1e-3 * rate / elems)
    return got


def _price_mpt_layer(shape: dict, kernel: str) -> tuple[float, float]:
    """genconf's forward and backward time of the measured MPT block on one H200 (FSDP, bf16 weights)."""
    from genconf.catalog.clusters import resolve_cluster
    from genconf.catalog.hardware import calibration_for
    from genconf.plan.cost import layer_time
    from genconf.plan.specs import ModelSpec, ParallelPlan

    seq = 2048
    model = ModelSpec(name="mpt-block", num_layers=1, hidden_size=shape["hidden"],
                      num_attention_heads=shape["heads"], num_query_groups=shape["heads"],
                      ffn_hidden_size=shape["ffn"], vocab_size=50368, seq_length=seq, activation="gelu",
                      normalization="layernorm", position_embedding="learned", tie_embeddings=True,
                      add_bias_linear=True, hidden_dropout=0.0, attention_dropout=0.0)
    mbs = shape["tokens"] // seq
    plan = ParallelPlan(framework="fsdp", tp=1, pp=1, dp=1, mbs=mbs, gbs=mbs, seq_length=seq, zero_stage=3,
                        recompute="none", attention_kernel=kernel)
    lt = layer_time(model, plan, resolve_cluster(gpu="h200", gpus_per_node=1), calibration_for("h200"))
    return lt.fwd_s, lt.bwd_s


def _compare_own(own: dict, name: str) -> list[str]:
    """genconf's own block against the sum of its measured parts, and its element-wise remainder (the block less
    its GEMMs and attention) against genconf's price of the element-wise work before (TE's count x 2, RoPE on every
    model) and now (EAGER_BYTES)."""
    from genconf.catalog.clusters import resolve_cluster
    from genconf.catalog.hardware import calibration_for
    from genconf.catalog.models import resolve_model
    from genconf.plan.cost import ELEMENTWISE_PASSES, _eager_elementwise_s, _mem_s

    spec = resolve_model(OWN_MODEL)[0]
    n = own["mbs"] * own["seq"]
    h, q, kv, f = spec.hidden_size, spec.query_width, spec.kv_width, spec.ffn_hidden_size
    pieces, gemms, attn = own["pieces"], own["gemms"], own["attention"]["auto"]
    norm = "rmsnorm" if spec.normalization == "rmsnorm" else "layernorm"
    act = "swiglu" if spec.gated else "gelu"
    rope = spec.position_embedding == "rope"
    keys = ("fwd_ms", "bwd_ms")
    gemm_ms = [sum(gm[k] for gm in gemms.values()) for k in keys]
    # The add's backward: the residual's gradient join, priced as the forward add (see above).
    elem_ms = [2 * pieces[norm][k] + 2 * pieces["add"]["fwd_ms"] + pieces[act][k] + (pieces["rope"][k] if rope else 0)
               for k in keys]
    block = own["block"]["auto"]
    gpu = resolve_cluster(gpu="h200", gpus_per_node=1).gpu
    cal = calibration_for("h200")
    per_token = 2 * (10 * h + (2 * (q + kv) if rope else 0) + (3 if spec.gated else 2) * f)
    flat = _mem_s(gpu, cal, ELEMENTWISE_PASSES["torch-bf16"] * n * per_token)
    before_ms = (1e3 * flat, 2e3 * flat)
    now_ms = tuple(1e3 * t for t in _eager_elementwise_s(spec, 1, 1, n, 1.0, 1.0, "torch-bf16", gpu, cal))
    rows = [("the block (SDPA left to torch)", [block[k] for k in keys]),
            ("the block, SDPA pinned to flash / to cuDNN", None),
            ("its four GEMMs (F.linear alone)", gemm_ms), ("its attention (SDPA left to torch)", [attn[k] for k in keys]),
            (f"its element-wise pieces ({norm} x 2, add x 2, {act}" + (", rope" if rope else "") + ")", elem_ms)]
    lines = [f"genconf's own PyTorch GPT (`genconf.train.torch_model.Block`, the {OWN_MODEL} catalog model {spec.name}: "
             f"{norm}, {act}, {'RoPE' if rope else spec.position_embedding}, micro-batch {own['mbs']} x {own['seq']}; "
             f"`--measure {name} --own-only`), ms forward / backward on the GPU's clock:", "",
             "| what | forward | backward |", "|---|---:|---:|"]
    for label, ms in rows:
        if ms is None:
            fl, cu = own["block"]["flash"], own["block"]["cudnn"]
            lines.append(f"| {label} | {fl['fwd_ms']:.2f} / {cu['fwd_ms']:.2f} | {fl['bwd_ms']:.2f} / {cu['bwd_ms']:.2f} |")
        else:
            lines.append(f"| {label} | {ms[0]:.2f} | {ms[1]:.2f} |")
    parts = [gemm_ms[i] + attn[keys[i]] + elem_ms[i] for i in (0, 1)]
    rest = [block[keys[i]] - gemm_ms[i] - attn[keys[i]] for i in (0, 1)]
    lines += [f"| the sum of its parts | {parts[0]:.2f} ({parts[0] / block['fwd_ms']:.0%} of the block) | "
              f"{parts[1]:.2f} ({parts[1] / block['bwd_ms']:.0%}) |",
              f"| the block less its GEMMs and attention (its element-wise work and layout copies) | {rest[0]:.2f} | "
              f"{rest[1]:.2f} |",
              f"| genconf's element-wise price before: TE's count x {ELEMENTWISE_PASSES['torch-bf16']} | "
              f"{before_ms[0]:.2f} | {before_ms[1]:.2f} |",
              f"| genconf's element-wise price now: EAGER_BYTES | {now_ms[0]:.2f} | {now_ms[1]:.2f} |", "",
              "SDPA left to torch ran cuDNN's attention (its times equal the pinned cuDNN's), as genconf prices "
              "`--attention-kernel auto` for its runners."]
    return lines


def compare(path: Path) -> str:
    from genconf.plan.cost import EAGER_BYTES, ELEMENTWISE_PASSES

    data = json.loads(path.read_text())
    lines = [f"# Eager element-wise pieces on {data['device']} (torch {data['torch']})", "",
             f"Measured: `python benchmarks/eager_elementwise.py --measure {path.name}`; this table: "
             f"`python benchmarks/eager_elementwise.py --compare {path.name}`.", "",
             "Bytes per element of the piece's width (h, f or q + k per token) at the HBM rate measured in the same "
             "run, forward / backward. genconf before: TE's fused count x the flat eager factor "
             f"({ELEMENTWISE_PASSES['torch-bf16']}) x (1 forward, 2 backward); genconf now: cost.EAGER_BYTES.", ""]
    fused = {"layernorm": 4.0, "rmsnorm": 4.0, "add": 6.0, "gelu": 4.0, "swiglu": 6.0, "rope": 4.0, "bias": 0.0,
             "dropout": 0.0}  # TE's fused count (cost._layer_time's per_token): read + write, bf16
    shapes = list(data["shapes"])
    head = "| piece | width | " + " | ".join(f"{s} ({data['shapes'][s]['pieces']['hbm']['tbyte_per_s']:.2f} TB/s)"
                                            for s in shapes) + " | genconf before | genconf now |"
    lines += [head, "|---|---|" + "---:|" * (len(shapes) + 2)]
    per = {s: bytes_per_element(data["shapes"][s]) for s in shapes}
    for piece in PIECES:
        before = ELEMENTWISE_PASSES["torch-bf16"] * fused[piece]
        now = EAGER_BYTES[piece]
        cells = " | ".join(f"{per[s][piece][0]:.1f} / {per[s][piece][1]:.1f}" for s in shapes)
        lines.append(f"| {piece} | {WIDTH[piece]} | {cells} | {before:.1f} / {2 * before:.1f} | "
                     f"{now[0]:.1f} / {now[1]:.1f} |")
    lines += ["", "The add's measured backward is two copies of the given gradient into the two leaves' .grad (the benchmark's "
              "artefact); in a layer the residual's two gradients are joined by one add, priced as the forward's.", "",
              "Causal attention, torch SDPA's flash backend (FlashAttention-2) against cuDNN's, ms forward / backward "
              "(Calibration.flash2_attention_factor is the ratio cuDNN / flash of forward + backward):", "",
              "| shape | flash | cuDNN | cuDNN / flash |", "|---|---:|---:|---:|"]
    for key, row in data.get("attention", {}).items():
        if "error" in row.get("flash", {}) or "error" in row.get("cudnn", {}) or "flash" not in row:
            continue
        fl, cu = row["flash"], row["cudnn"]
        ratio = (cu["fwd_ms"] + cu["bwd_ms"]) / (fl["fwd_ms"] + fl["bwd_ms"])
        lines.append(f"| {row['batch']} x {row['heads']} heads x {row['seq']} x d {row['head_dim']} | "
                     f"{fl['fwd_ms']:.2f} / {fl['bwd_ms']:.2f} | {cu['fwd_ms']:.2f} / {cu['bwd_ms']:.2f} | {ratio:.3f} |")
    lines += ["", "One MPT block (llm-foundry's, bf16 weights, no dropout), ms forward / backward on the GPU's clock, against "
              "genconf's layer_time for the same shape (FSDP, torch-bf16) on an H200:", "",
              "| shape | attention | measured | genconf | measured / genconf |", "|---|---|---:|---:|---:|"]
    for name in shapes:
        sh = data["shapes"][name]
        for kernel, key in (("flash2", "flash"), ("auto", "cudnn")):
            m = sh.get("layer", {}).get(key)
            if not m:
                continue
            fwd_s, bwd_s = _price_mpt_layer(sh, kernel)
            lines.append(f"| {name} | {key} | {m['fwd_ms']:.2f} / {m['bwd_ms']:.2f} | {fwd_s * 1e3:.2f} / "
                         f"{bwd_s * 1e3:.2f} | {(m['fwd_ms'] + m['bwd_ms']) / ((fwd_s + bwd_s) * 1e3):.3f} |")
    lines += ["", "The whole block runs at about 0.75x genconf's price on the H200: genconf prices Hopper's GEMMs at its "
              "sustained clock under training load (calibration.yaml hopper.clock_factor 0.8, fitted on published runs), "
              "while a single GPU running one layer holds its boost clock."]
    own_path = path.with_name(path.name.replace("eager_elementwise", "eager_own"))
    if own_path.exists():
        lines += ["", *_compare_own(json.loads(own_path.read_text())["own"], own_path.name)]
    times = " ".join(f"{s}: {data['shapes'][s]['seconds']} s." for s in shapes)
    lines += ["", f"Run time: {times}", ""]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measure", type=Path, help="measure on this machine's GPU, write JSON here")
    ap.add_argument("--compare", type=Path, help="a --measure JSON: print it beside genconf's prices")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--own-only", action="store_true",
                    help="--measure: only genconf's own block and its parts (not the MPT shapes or the sweep)")
    ap.add_argument("--scale", type=float, default=1.0, help="shrink the shapes (a CPU dry run)")
    ap.add_argument("--write", type=Path, help="--compare: also write the table here")
    args = ap.parse_args()
    from moe_layer import measure_or_compare

    return measure_or_compare(ap, args, lambda: measure(args.measure, args.reps, args.scale, args.own_only),
                              lambda: compare(args.compare))


if __name__ == "__main__":
    raise SystemExit(main())
