"""Misaligned 16-bit GEMMs on the local GPU: the unfused attention of Megatron-DeepSpeed at BLOOM's head dims.

    python benchmarks/misaligned_gemm.py --measure OUT.json   # on a CUDA GPU (plain PyTorch)
    python benchmarks/misaligned_gemm.py --compare OUT.json   # anywhere: the slowdowns, as a table

Why: the BLOOM sweep's rows whose head dim is not a multiple of 8 elements (16 bytes in bf16) are the sweep's most
over-predicted (BLOOM-prototype 20B, head dim 450, and 200B, head dim 150: +29% to +31%; 182B with 128 heads, head
dim 108: +31% to +37%; benchmarks/results/accuracy.json), while the rows of the same days with aligned head dims
are within a few percent. BigScience's chronicles-prequel.md notes "NHEADS=108 breaks constraints for invoking
optimized fused softmax kernel". Tensor-core GEMM kernels load 16-byte vectors (cuBLAS "Tensor Core usage"
restrictions); a leading dimension or a batch stride that is not a multiple of 16 bytes falls back to narrower
loads or to SIMT kernels. genconf prices these two GEMMs with the slowdown this measures
(Calibration.misaligned_attention_gemm_slowdown, from the H200 run in results/misaligned_gemm_h200.md).

What it measures, each forward and forward + backward (the GPU's own time, moe_layer._timer queued):
- attention: Megatron(-DeepSpeed) 2022's core attention, as its ParallelAttention runs it: q, k, v as views of the
  fused QKV output ([s, b, np, 3 d], batch stride 3 d), torch.baddbmm for the scaled scores, a causal mask and
  softmax, torch.bmm for the context, at head dims 108, 150 and 450 (BLOOM's) and the aligned 112, 144 and 448
  next to them (same batch and sequence); and "attention GEMMs", its two batched GEMMs alone (no mask or softmax,
  whose cost does not depend on the head dim and would dilute the GEMMs' slowdown);
- linear: an output layer of 50,257 columns (GPT-2's vocabulary, unpadded) against 50,304, the padding nanoGPT's
  model.py makes ("GPT-2 vocab_size of 50257, padded up to nearest multiple of 64 for efficiency");
- sdpa: the same head dims through genconf's own model's attention (genconf/train/torch_model.py: q, k, v views of
  the fused QKV output, [b, h, s, d], F.scaled_dot_product_attention causal with PyTorch's own backend choice), and
  which of its fused backends (flash, memory-efficient, cuDNN) take each head dim: genconf prices that attention
  from it (kernels.sdpa_fused_supported: flash at the misaligned slowdown, or the math backend's fp32 GEMMs).
The result is each misaligned shape's time over its aligned neighbour's, per FLOP: the factor a misaligned GEMM
would take in genconf's cost model. Run on an H200, bf16 and fp16 (benchmarks/results/gpu_runs/README.md).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ATTENTION = (
    # (label, head dim, aligned neighbour, heads per GPU x micro-batch, sequence): BLOOM sweep rows
    ("20B tp8 mbs1", 450, 448, 4, 2048),
    ("200B tp8 mbs1", 150, 144, 12, 2048),
    ("182B 128 heads tp8 mbs4", 108, 112, 64, 2048),
)
LINEAR = (("GPT-2 vocabulary", 50257, 50304, 768, 8 * 1024),)
"""(label, columns, aligned columns, fan-in, tokens)."""


# --- measuring (torch) -----------------------------------------------------------------------------------

def _attention(torch, batches: int, seq: int, d: int, device: str, dtype, gemms_only: bool = False):
    """Forward and forward + backward closures of Megatron 2022's core attention on a fused QKV output (gemms_only:
    its two batched GEMMs alone, the scores passed to the second without the mask and softmax)."""
    gen = torch.Generator(device=device).manual_seed(0)
    qkv = torch.randn(seq, 1, batches, 3 * d, device=device, dtype=dtype, generator=gen, requires_grad=True)
    mask = torch.ones(seq, seq, device=device, dtype=torch.bool).triu(1)
    scale = d ** -0.5

    def forward():
        q, k, v = qkv.split(d, dim=-1)                     # views: batch stride 3 d (megatron split_tensor_...)
        q = q.view(seq, batches, d).transpose(0, 1)        # [b*np, s, d]
        k = k.view(seq, batches, d).transpose(0, 1)
        v = v.view(seq, batches, d).transpose(0, 1)
        out = torch.empty(batches, seq, seq, device=device, dtype=dtype)
        scores = torch.baddbmm(out, q, k.transpose(1, 2), beta=0.0, alpha=scale)
        if gemms_only:
            return torch.bmm(scores, v)
        probs = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        return torch.bmm(probs, v)

    def both():
        forward().sum().backward()

    return forward, both


def _sdpa(torch, heads: int, seq: int, d: int, device: str, dtype, backend=None):
    """Forward and forward + backward closures of genconf's own model's attention (torch_model.SelfAttention): q, k,
    v as views of one fused QKV output, [b, h, s, d] after a transpose, causal SDPA; `backend` pins one SDPBackend."""
    import contextlib

    from torch.nn.attention import sdpa_kernel

    gen = torch.Generator(device=device).manual_seed(0)
    qkv = torch.randn(1, seq, 3 * heads * d, device=device, dtype=dtype, generator=gen, requires_grad=True)
    pick = (lambda: sdpa_kernel([backend])) if backend is not None else contextlib.nullcontext

    def forward():
        q, k, v = (t.view(1, seq, heads, d).transpose(1, 2) for t in qkv.split(heads * d, dim=-1))
        with pick():
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    def both():
        forward().sum().backward()

    return forward, both


def _sdpa_backends(torch, heads: int, seq: int, d: int, device: str, dtype) -> list[str]:
    """The fused SDPA backends that run forward and backward at this head dim (each pinned alone)."""
    from torch.nn.attention import SDPBackend

    took = []
    for name in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION"):
        _, both = _sdpa(torch, heads, seq, d, device, dtype, getattr(SDPBackend, name))
        try:
            both()
            took.append(name.lower())
        except RuntimeError:
            pass
    return took


def _linear(torch, n: int, k: int, tokens: int, device: str, dtype):
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(tokens, k, device=device, dtype=dtype, generator=gen, requires_grad=True)
    w = torch.randn(n, k, device=device, dtype=dtype, generator=gen, requires_grad=True)

    def forward():
        return torch.nn.functional.linear(x, w)

    def both():
        forward().sum().backward()

    return forward, both


def measure(out: Path, reps: int, scale: float, dtype_name: str = "bf16") -> None:
    import torch
    from moe_layer import _timer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name] if device == "cuda" else torch.float32
    timed = _timer(torch, device)
    rows = []
    for label, d, aligned, batches, seq in ATTENTION:
        seq = max(64, int(seq * scale))
        for dim in (d, aligned):
            flops = 4 * batches * seq * seq * dim  # QK^T and PV, forward (the mask is applied, not skipped)
            for kind, gemms_only in (("attention", False), ("attention GEMMs", True)):
                fwd, both = _attention(torch, batches, seq, dim, device, dtype, gemms_only)
                f, fb = timed(fwd, reps, queued=True), timed(both, reps, queued=True)
                rows.append({"kind": kind, "label": label, "dim": dim, "aligned": dim == aligned,
                             "batches": batches, "seq": seq, "fwd_ms": f, "fwd_bwd_ms": fb, "fwd_flops": flops})
        if device == "cuda":
            for dim in (d, aligned):
                fwd, both = _sdpa(torch, batches, seq, dim, device, dtype)
                f, fb = timed(fwd, reps, queued=True), timed(both, reps, queued=True)
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                both()
                peak_mib = (torch.cuda.max_memory_allocated() - base) / 2**20
                rows.append({"kind": "sdpa", "label": label, "dim": dim, "aligned": dim == aligned,
                             "batches": batches, "seq": seq, "fwd_ms": f, "fwd_bwd_ms": fb,
                             "fwd_flops": 2 * batches * seq * seq * dim,  # causal: half of QK^T and PV
                             "fwd_bwd_peak_mib": peak_mib,
                             "backends": _sdpa_backends(torch, batches, seq, dim, device, dtype)})
    for label, n, aligned, k, tokens in LINEAR:
        tokens = max(64, int(tokens * scale))
        for cols in (n, aligned):
            fwd, both = _linear(torch, cols, k, tokens, device, dtype)
            f, fb = timed(fwd, reps, queued=True), timed(both, reps, queued=True)
            rows.append({"kind": "linear", "label": label, "dim": cols, "aligned": cols == aligned, "k": k,
                         "tokens": tokens, "fwd_ms": f, "fwd_bwd_ms": fb, "fwd_flops": 2 * tokens * cols * k})
    meta = {"device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
            "torch": torch.__version__, "dtype": str(dtype), "scale": scale, "reps": reps}
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(compare_rows(meta, rows))


# --- comparing (no torch) ------------------------------------------------------------------------------

def slowdowns(rows: list[dict]) -> list[dict]:
    """Per misaligned shape: its time per forward FLOP over its aligned neighbour's, forward and forward + backward."""
    out = []
    for r in rows:
        if r["aligned"]:
            continue
        twin = next(a for a in rows if a["aligned"] and a["kind"] == r["kind"] and a["label"] == r["label"])
        per = r["fwd_flops"] / twin["fwd_flops"]
        bwd = (r["fwd_bwd_ms"] - r["fwd_ms"]) / (twin["fwd_bwd_ms"] - twin["fwd_ms"]) / per
        out.append({"kind": r["kind"], "label": r["label"], "dim": r["dim"], "aligned_dim": twin["dim"],
                    "fwd": r["fwd_ms"] / twin["fwd_ms"] / per, "bwd": bwd,
                    "fwd_bwd": r["fwd_bwd_ms"] / twin["fwd_bwd_ms"] / per})
    return out


def compare_rows(meta: dict, rows: list[dict]) -> str:
    lines = [f"# Misaligned 16-bit GEMMs: {meta['device']} ({meta['dtype']}, torch {meta['torch']}, "
             f"scale {meta['scale']})", "",
             "Command: `python benchmarks/misaligned_gemm.py --measure OUT.json` on the GPU, then `--compare OUT.json`.",
             "Time per FLOP of each misaligned shape over its aligned neighbour's (1.0: no penalty).", "",
             "| what | shape | dim / aligned | forward | backward | forward + backward |", "|---|---|---|---:|---:|---:|"]
    found = slowdowns(rows)
    for s in found:
        lines.append(f"| {s['kind']} | {s['label']} | {s['dim']} / {s['aligned_dim']} | {s['fwd']:.2f} | "
                     f"{s['bwd']:.2f} | {s['fwd_bwd']:.2f} |")
    sdpa = [r for r in rows if r["kind"] == "sdpa"]
    if sdpa:
        lines += ["", "genconf's own model's attention (SDPA, PyTorch's backend choice): the fused backends that take "
                      "each head dim, and the forward + backward's peak memory beyond its inputs (an s x s score "
                      "tensor would be heads x s^2 x 2 bytes).", "",
                  "| shape | head dim | backends | forward ms | forward + backward ms | peak MiB | s^2 scores MiB |",
                  "|---|---:|---|---:|---:|---:|---:|"]
        for r in sdpa:
            scores_mib = r["batches"] * r["seq"] ** 2 * 2 / 2**20
            lines.append(f"| {r['label']} | {r['dim']} | {', '.join(r['backends']) or 'math only'} | "
                         f"{r['fwd_ms']:.3f} | {r['fwd_bwd_ms']:.3f} | {r['fwd_bwd_peak_mib']:.0f} | "
                         f"{scores_mib:.0f} |")
    gemms = [s for s in found if s["kind"] == "attention GEMMs"]
    if gemms:
        fwd, bwd = (statistics.median(s[k] for s in gemms) for k in ("fwd", "bwd"))
        lines += ["", f"Median over the attention GEMMs: forward {fwd:.2f}, backward {bwd:.2f} "
                      "(genconf's Calibration.misaligned_attention_gemm_slowdown)."]
    return "\n".join(lines) + "\n"


def compare(path: Path) -> str:
    data = json.loads(path.read_text())
    return compare_rows(data["meta"], data["rows"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measure", type=Path, help="measure on this machine's GPU, write JSON here")
    ap.add_argument("--compare", type=Path, help="a --measure JSON: print the slowdowns")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--scale", type=float, default=1.0, help="shrink the sequences and tokens (a CPU dry run)")
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16",
                    help="on a GPU (a CPU runs fp32): fp16 is what the BLOOM sweep ran")
    ap.add_argument("--write", type=Path, help="--compare: also write the table here")
    args = ap.parse_args()
    from moe_layer import measure_or_compare

    return measure_or_compare(ap, args, lambda: measure(args.measure, args.reps, args.scale, args.dtype),
                              lambda: compare(args.compare))


if __name__ == "__main__":
    raise SystemExit(main())
