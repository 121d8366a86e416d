"""Kernel and collective microbenchmarks on the devices at hand: the measurements `genconf calibrate --bench`
fits the cost model's terms to.

Method of benchmarks/data/h100_kernels/microbench.py (the script that measured the H100 tables): GEMMs at
the model's layer shapes (QKV, attention out, MLP in/out, logits; forward, data-grad and weight-grad
orientations; each TP split asked for) in BF16 and FP8 (e4m3, per-tensor scales, torch._scaled_mm); causal
attention fused (scaled_dot_product_attention: flash/cuDNN on a GPU) and unfused (QK^T, mask, softmax, AV as
separate kernels), forward and forward+backward; element-wise bandwidth (x + y); and the collectives
(all-reduce, all-gather, reduce-scatter) over every rank torchrun started, NCCL on GPUs, gloo on CPUs. Times
are medians of CUDA-event timings (wall clock on a CPU). Every rank measures its own device at the same time
(as in training: shared power and cooling); rank 0 writes the tables with the slowest rank's GEMM median.

On a CPU the same code runs (tiny shapes, FP32 instead of BF16 where BF16 is emulated, gloo), so the
plumbing is tested; CPU numbers calibrate nothing.

Run under torchrun: python -m torch.distributed.run --nproc-per-node N -m genconf.train.bench --out F.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from genconf.train import runtime


def timer(device: torch.device):
    """fn -> median seconds of `iters` calls after `warmup` calls (CUDA events on a GPU, perf_counter on a CPU)."""

    def timed(fn, warmup: int = 3, iters: int = 10) -> float:
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(iters):
            if device.type == "cuda":
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return statistics.median(times)

    return timed


def layer_gemm_shapes(model, tokens: int, tp: int) -> list[tuple[str, str, int, int, int]]:
    """(layer, pass, m, n, k) of one transformer layer's GEMMs and the logits GEMM for `tokens` tokens at TP `tp`:
    forward (m,k)x(k,n), data-grad (m,n)x(n,k), weight-grad (k,m)x(m,n). The logits at the vocabulary megatron pads to
    (a multiple of 128 x TP, which is also a multiple of genconf's own 64): an unpadded 50,257 rows runs 3.7x slower per
    FLOP (results/misaligned_gemm_h200.md) and would pull the fitted GEMM efficiency down for a shape no run uses."""
    from genconf.plan.counting import padded_vocab_size

    h, q, kv = model.hidden_size, model.query_width, model.kv_width
    f = model.ffn_hidden_size
    branches = 2 if model.gated else 1
    layers = {"qkv": (h, (q + 2 * kv) // tp), "proj": (q // tp, h), "fc1": (h, branches * f // tp),
              "fc2": (f // tp, h), "logits": (h, padded_vocab_size(model.vocab_size, tp) // tp)}
    out = []
    for layer, (k, n) in layers.items():
        for kind, (a, b, c) in {"fwd": (tokens, n, k), "dgrad": (tokens, k, n), "wgrad": (k, n, tokens)}.items():
            out.append((layer, kind, a, b, c))
    return out


def gemm_rows(model, tokens: int, tps: list[int], device: torch.device, dtypes: list[str], timed) -> list[dict]:
    half = torch.bfloat16 if device.type == "cuda" else torch.float32  # CPU BF16 GEMMs are emulated: FP32 there
    rows = []
    seen = set()
    for tp in tps:
        if model.num_attention_heads % tp or model.num_query_groups % tp and model.num_query_groups >= tp:
            continue
        for layer, kind, m, n, k in layer_gemm_shapes(model, tokens, tp):
            for dtype in dtypes:
                key = (m, n, k, dtype)
                if key in seen:
                    continue
                seen.add(key)
                if dtype == "fp8":
                    if m % 16 or n % 16 or k % 16:
                        continue
                    x = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
                    w = torch.randn(n, k, device=device).to(torch.float8_e4m3fn).t()  # column-major (k, n)
                    one = torch.ones((), device=device)

                    def fn(x=x, w=w, one=one):
                        return torch._scaled_mm(x, w, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
                else:
                    x = torch.randn(m, k, device=device, dtype=half)
                    w = torch.randn(k, n, device=device, dtype=half)

                    def fn(x=x, w=w):
                        return torch.mm(x, w)
                try:
                    s = timed(fn)
                except (RuntimeError, NotImplementedError) as exc:  # an FP8 layout or arch this build refuses
                    print(f"genconf bench: skip {dtype} {m}x{n}x{k}: {str(exc).splitlines()[0][:100]}", file=sys.stderr)
                    continue
                rows.append({"layer": layer, "pass": kind, "tp": tp, "dtype": dtype,
                             "compute_dtype": "fp8" if dtype == "fp8" else str(half).removeprefix("torch."),
                             "m": m, "n": n, "k": k, "seconds": s, "tflops": 2 * m * n * k / s / 1e12})
    return rows


def attention_rows(model, tokens: int, tps: list[int], device: torch.device, timed) -> list[dict]:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    seq = min(model.seq_length, tokens)
    batch = max(1, tokens // seq)
    d = model.kv_channels
    rows = []
    for tp in sorted(set(tps)):
        if model.num_attention_heads % tp:
            continue
        heads = model.num_attention_heads // tp
        q, k, v = (torch.randn(batch, heads, seq, d, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
        full_flops = 4.0 * batch * heads * seq * seq * d  # QK^T and AV, every score
        mask = torch.ones(seq, seq, device=device, dtype=torch.bool).tril()

        def fused():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        def unfused():
            scores = (q @ k.transpose(-1, -2)) * d ** -0.5
            probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
            return probs @ v

        for kind, fn, flops in (("flash", fused, full_flops / 2), ("unfused", unfused, full_flops)):
            def both(fn=fn):
                out = fn()
                out.backward(torch.ones_like(out))
            fwd, fwd_bwd = timed(fn), timed(both)
            # Forward FLOPs as counted by the cost model (flash skips the masked half); backward does 2.5x.
            rows.append({"kind": kind, "tp": tp, "batch": batch, "heads": heads, "seq": seq, "head_dim": d,
                         "dtype": str(dtype).removeprefix("torch."), "fwd_s": fwd, "fwd_bwd_s": fwd_bwd,
                         "fwd_flops": flops, "fwd_tflops": flops / fwd / 1e12,
                         "fwd_bwd_tflops": 3.5 * flops / fwd_bwd / 1e12})
    return rows


def bandwidth_rows(device: torch.device, mibs: list[int], timed) -> list[dict]:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    size = torch.tensor([], dtype=dtype).element_size()
    rows = []
    for mib in mibs:
        n = mib * 2**20 // size
        x, y = torch.randn(n, device=device, dtype=dtype), torch.randn(n, device=device, dtype=dtype)
        s = timed(lambda: torch.add(x, y))
        rows.append({"op": "add", "dtype": str(dtype).removeprefix("torch."), "mib_per_operand": mib,
                     "bytes_moved": 3 * n * size, "seconds": s, "gbyte_per_s": 3 * n * size / s / 1e9})
    return rows


def collective_rows(d: runtime.Dist, mibs: list[int], timed) -> list[dict]:
    """Each collective at each size (the full buffer: all-reduce's tensor, all-gather's output,
    reduce-scatter's input), timed on every rank; the slowest rank's median counts (a collective ends
    when its last rank does). genconf.run.calibrate adds the bus bandwidth."""
    n = d.world_size
    if n == 1:
        return []
    dtype = torch.bfloat16 if d.device.type == "cuda" else torch.float32
    size = torch.tensor([], dtype=dtype).element_size()
    rows = []
    for mib in mibs:
        count = max(n, mib * 2**20 // size // n * n)
        full = torch.ones(count, device=d.device, dtype=dtype)
        shard = torch.ones(count // n, device=d.device, dtype=dtype)
        ops = {"all_reduce": lambda: dist.all_reduce(full),
               "all_gather": lambda: dist.all_gather_into_tensor(full, shard),
               "reduce_scatter": lambda: dist.reduce_scatter_tensor(shard, full)}
        for name, fn in ops.items():
            dist.barrier()
            s = timed(fn, warmup=2, iters=5)
            worst = torch.tensor([s], dtype=torch.float64, device=d.device)
            dist.all_reduce(worst, op=dist.ReduceOp.MAX)
            s = float(worst.item())
            algbw = count * size / s / 1e9
            rows.append({"op": name, "ranks": n, "bytes": count * size, "dtype": str(dtype).removeprefix("torch."),
                         "seconds": s, "algbw_gbyte_per_s": algbw})
    return rows


def _driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def environment(d: runtime.Dist) -> dict:
    hosts = [None] * d.world_size
    dist.all_gather_object(hosts, socket.gethostname())
    env = {"device": torch.cuda.get_device_name(d.device) if d.device.type == "cuda" else "cpu",
           "cuda": torch.version.cuda if d.device.type == "cuda" else None,
           "driver": _driver() if d.device.type == "cuda" else None, "torch": torch.__version__,
           "python": platform.python_version(), "world_size": d.world_size, "nodes": len(set(hosts)),
           "backend": d.backend}
    env.update({k: v for k, v in runtime.versions().items() if k in ("genconf", "transformer-engine")})
    return env


def run(args) -> dict:
    from genconf.catalog.models import resolve_model

    d = runtime.init_distributed()
    torch.manual_seed(1234 + d.rank)
    if d.device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    model, _ = resolve_model(args.model)
    timed = timer(d.device)
    tps = [int(t) for t in args.tp.split(",")]
    dtypes = [t for t in args.dtypes.split(",") if t]
    started = time.time()
    tables = {"gemm": gemm_rows(model, args.tokens, tps, d.device, dtypes, timed),
              "attention": attention_rows(model, args.tokens, tps, d.device, timed),
              "bandwidth": bandwidth_rows(d.device, [int(m) for m in args.bandwidth_mib.split(",")], timed)}
    medians = [None] * d.world_size
    bf16 = [r["tflops"] for r in tables["gemm"] if r["dtype"] == "bf16"]
    dist.all_gather_object(medians, statistics.median(bf16) if bf16 else None)
    tables["collectives"] = collective_rows(d, [int(m) for m in args.collective_mib.split(",")], timed)
    out = {"model": model.name, "tokens": args.tokens, "tp": tps, "environment": environment(d),
           "gemm_median_tflops_per_rank": medians, "seconds": None, **tables}
    out["seconds"] = time.time() - started
    return out, d


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="JSON file rank 0 writes the tables to")
    ap.add_argument("--model", default="1b", help="model whose layer shapes to time (catalog name, alias or YAML)")
    ap.add_argument("--tokens", type=int, default=8192, help="tokens per micro-batch (GEMM m, attention batch x seq)")
    ap.add_argument("--tp", default="1,2,4,8", help="TP splits of the layer shapes, comma-separated")
    ap.add_argument("--dtypes", default="bf16,fp8", help="GEMM dtypes: bf16 and/or fp8")
    ap.add_argument("--bandwidth-mib", default="64,512,2048", help="element-wise operand sizes, MiB")
    ap.add_argument("--collective-mib", default="1,16,128,512", help="collective buffer sizes, MiB")
    args = ap.parse_args(argv)
    out, d = run(args)
    if d.is_main:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1, sort_keys=True))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    raise SystemExit(main())
