"""Where a runner's GPU memory goes, phase by phase: the bytes saved for backward (grouped by dtype and shape) and
torch.cuda's allocated bytes after each forward, backward and optimizer step, for genconf's PyTorch GPT as the FSDP
runner runs a NO_SHARD (DDP + bf16 autocast, fp32 parameters) plan and as DeepSpeed runs it (bf16 parameters).

    torchrun --nproc-per-node 1 benchmarks/gpu_memory_probe.py [--model 1b --mbs 8 --seq 2048 --micro 4] > probe.json

GPU only (it is what the memory model's torch-autocast terms were checked against; benchmarks/results/gpu.md).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from genconf.catalog.models import resolve_model
from genconf.train.torch_model import GPT

GIB = 2**30


def saved_by_kind(fn) -> tuple[dict, int]:
    """Run fn() under saved_tensors_hooks: bytes of each distinct saved storage, grouped by (dtype, shape)."""
    seen: dict[int, tuple[str, tuple, int]] = {}

    def pack(t):
        if isinstance(t, torch.Tensor) and t.device.type == "cuda" and not isinstance(t, torch.nn.Parameter):
            storage = t.untyped_storage()
            seen.setdefault(storage.data_ptr(), (str(t.dtype).replace("torch.", ""), tuple(t.shape), storage.nbytes()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    groups: dict = collections.defaultdict(lambda: [0, 0])
    for dtype, shape, nbytes in seen.values():
        g = groups[f"{dtype} {list(shape)}"]
        g[0] += 1
        g[1] += nbytes
    top = sorted(groups.items(), key=lambda kv: -kv[1][1])
    return {"total_gib": sum(n for *_, n in seen.values()) / GIB,
            "groups": [{"kind": k, "count": c, "gib": b / GIB} for k, (c, b) in top[:40]]}, out


def probe(model_ref: str, mbs: int, seq: int, micro: int, mode: str) -> dict:
    spec, _ = resolve_model(model_ref)
    device = torch.device("cuda")
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    model = GPT(spec).to(device)
    if mode == "deepspeed-bf16":
        model = model.bfloat16()
        net, autocast = model, contextlib.nullcontext
    else:
        net = DDP(model, device_ids=[0])
        autocast = lambda: torch.autocast("cuda", dtype=torch.bfloat16)  # noqa: E731
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4, fused=True)
    phases = [("model", torch.cuda.memory_allocated() - base)]
    saved = None
    for step in range(2):
        opt.zero_grad(set_to_none=True)
        for m in range(micro):
            tokens = torch.randint(0, spec.vocab_size, (mbs, seq), device=device)
            sync = m == micro - 1 or mode == "deepspeed-bf16"
            ctx = contextlib.nullcontext() if sync else net.no_sync()
            torch.cuda.reset_peak_memory_stats()
            with autocast(), ctx:
                if saved is None:
                    saved, loss = saved_by_kind(lambda: net(tokens, tokens))
                else:
                    loss = net(tokens, tokens)
                after_fwd = torch.cuda.memory_allocated() - base
                fwd_peak = torch.cuda.max_memory_allocated() - base
                torch.cuda.reset_peak_memory_stats()
                (loss / micro).backward()
            phases.append((f"step {step} micro {m}: after forward", after_fwd))
            phases.append((f"step {step} micro {m}: forward peak", fwd_peak))
            phases.append((f"step {step} micro {m}: backward peak", torch.cuda.max_memory_allocated() - base))
            phases.append((f"step {step} micro {m}: after backward", torch.cuda.memory_allocated() - base))
        torch.cuda.reset_peak_memory_stats()
        opt.step()
        phases.append((f"step {step}: optimizer peak", torch.cuda.max_memory_allocated() - base))
        phases.append((f"step {step}: after optimizer", torch.cuda.memory_allocated() - base))
    return {"mode": mode, "model": model_ref, "mbs": mbs, "seq": seq, "micro": micro,
            "phases_gib": {name: round(b / GIB, 3) for name, b in phases}, "saved_first_forward": saved}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="1b")
    ap.add_argument("--mbs", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--micro", type=int, default=4)
    args = ap.parse_args()
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    dist.init_process_group("nccl")
    torch.cuda.set_device(0)
    out = [probe(args.model, args.mbs, args.seq, args.micro, mode) for mode in ("ddp-autocast", "deepspeed-bf16")]
    print(json.dumps(out, indent=1))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
