"""Measure the activation bytes megatron-core saves for backward, against the planner's estimate.

    python -m genconf.train.activations --model tests/data/tiny-gpt.yaml --recompute selective --mbs 2 --json
    python -m genconf.train.activations --model A.yaml B.yaml --recompute none selective full --json  # every pair
    python -m genconf.train.activations --model A.yaml --recompute block --recompute-layers 1  # block recompute

One forward (with the launcher's loss) of a megatron-core GPTModel built exactly as the megatron launcher builds
it (local layer spec, BF16, one process) is recorded with torch.autograd.graph.saved_tensors_hooks: every
storage still held for backward when the forward ends is counted once, parameters excluded.

A CPU run must count what the CUDA kernels keep, so three CPU kernels are replaced by functions that save
what their CUDA versions save: dropout keeps a 1-byte bool mask (CPU: a mask in the activation dtype),
RMSNorm keeps its input and an fp32 statistic (CPU: a composite that keeps two fp32 copies), and LayerNorm
keeps fp32 mean/rstd (CPU: in the input dtype). Everything else runs unchanged.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import warnings
import weakref

import torch
import torch.nn.functional as F


class _Dropout(torch.autograd.Function):
    """CUDA's native_dropout: saves a bool mask, 1 byte per element."""

    @staticmethod
    def forward(ctx, x, p):
        keep = torch.rand(x.shape, device=x.device) >= p
        ctx.save_for_backward(keep)
        ctx.scale = 1.0 / (1.0 - p)
        return x * keep.to(x.dtype) * ctx.scale

    @staticmethod
    def backward(ctx, grad):
        (keep,) = ctx.saved_tensors
        return grad * keep.to(grad.dtype) * ctx.scale, None


class _RMSNorm(torch.autograd.Function):
    """A fused RMSNorm kernel's saves: the input (its dtype) and the fp32 reciprocal RMS."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, rstd, weight)
        out = (xf * rstd).to(x.dtype)
        return out * weight if weight is not None else out

    @staticmethod
    def backward(ctx, grad):
        x, rstd, weight = ctx.saved_tensors
        xf, g = x.float(), grad.float()
        normed = xf * rstd
        gw = (g * normed).reshape(-1, x.shape[-1]).sum(0).to(weight.dtype) if weight is not None else None
        gn = g * weight.float() if weight is not None else g
        gx = rstd * (gn - normed * (gn * normed).mean(-1, keepdim=True))
        return gx.to(x.dtype), gw, None


class _LayerNorm(torch.autograd.Function):
    """A fused LayerNorm kernel's saves: the input and fp32 mean and rstd."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        xf = x.float()
        mean = xf.mean(-1, keepdim=True)
        rstd = torch.rsqrt(xf.var(-1, unbiased=False, keepdim=True) + eps)
        ctx.save_for_backward(x, mean, rstd, weight)
        out = ((xf - mean) * rstd).to(x.dtype)
        if weight is not None:
            out = out * weight
        return out + bias if bias is not None else out

    @staticmethod
    def backward(ctx, grad):
        x, mean, rstd, weight = ctx.saved_tensors
        xf, g = x.float(), grad.float()
        normed = (xf - mean) * rstd
        flat = lambda t: t.reshape(-1, x.shape[-1])  # noqa: E731
        gw = flat(g * normed).sum(0).to(weight.dtype) if weight is not None else None
        gb = flat(g).sum(0).to(weight.dtype) if weight is not None else None
        gn = g * weight.float() if weight is not None else g
        gx = rstd * (gn - gn.mean(-1, keepdim=True) - normed * (gn * normed).mean(-1, keepdim=True))
        return gx.to(x.dtype), gw, gb, None


@contextlib.contextmanager
def cuda_like_saves():
    """Swap F.dropout / F.rms_norm / F.layer_norm for versions that save what the CUDA kernels save."""
    originals = (F.dropout, F.rms_norm, F.layer_norm)

    def dropout(x, p=0.5, training=True, inplace=False):
        return _Dropout.apply(x, p) if training and p > 0 else x

    def rms_norm(x, normalized_shape, weight=None, eps=None):
        return _RMSNorm.apply(x, weight, eps if eps is not None else torch.finfo(torch.float32).eps)

    def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
        return _LayerNorm.apply(x, weight, bias, eps)

    F.dropout, F.rms_norm, F.layer_norm = dropout, rms_norm, layer_norm
    try:
        yield
    finally:
        F.dropout, F.rms_norm, F.layer_norm = originals


def saved_bytes(run_forward, params) -> tuple[int, int]:
    """(bytes of the storages still saved for backward after `run_forward()`, storages counted),
    each storage once, parameters excluded."""
    param_ptrs = {p.untyped_storage().data_ptr() for p in params}
    packed: dict[int, tuple[int, list[weakref.ref]]] = {}  # storage address -> (bytes, the tensors saved on it)

    def pack(t):
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in param_ptrs:
            return t
        seen = packed.get(ptr)
        if seen is None or not any(ref() is not None for ref in seen[1]):
            # New storage, or the address of a freed transient reused by a new one.
            packed[ptr] = (storage.nbytes(), [weakref.ref(t)])
        else:
            seen[1].append(weakref.ref(t))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        keep = run_forward()
    alive = [(nbytes, refs) for nbytes, refs in packed.values() if any(ref() is not None for ref in refs)]
    del keep
    return sum(n for n, _ in alive), len(alive)


def measure(model_path: str, *, recompute: str, mbs: int, seq: int, precision: str = "bf16",
            recompute_layers: int | None = None) -> dict:
    """Build the launcher's megatron model for a one-GPU plan and compare saved bytes with the planner.
    recompute_layers: under full recompute, block recompute of that many layers (--recompute-method block)."""
    from genconf.catalog.models import resolve_model
    from genconf.plan import memory
    from genconf.plan.runconfig import RunConfig
    from genconf.plan.specs import ParallelPlan, TrainSpec
    from genconf.train import mcore_compat, runtime
    from genconf.train.runners.megatron import _loss_func, build, transformer_config, transformer_config_kwargs

    model, _ = resolve_model(model_path)
    plan = ParallelPlan(framework="megatron", dp=1, mbs=mbs, gbs=mbs, seq_length=seq, recompute=recompute,
                        precision=precision, layer_spec="local",
                        recompute_layers=recompute_layers if recompute == "full" else None)
    cfg = RunConfig(model=model, plan=plan, train=TrainSpec(train_steps=1), num_gpus=1, data={},
                            precision_recipe=precision, prediction={}, shrink={}, artifacts="")
    compat = mcore_compat.install()
    try:
        from megatron.core import parallel_state as ps

        os.environ.setdefault("MASTER_PORT", str(29600 + os.getpid() % 1000))
        d = runtime.init_distributed()
        ps.initialize_model_parallel()
        mcore_compat.model_parallel_manual_seed(1234)
        config = transformer_config(transformer_config_kwargs(cfg, cpu=True))
        with cuda_like_saves():
            chunks, _opt = build(cfg, config, d)
            net = chunks[0]
            net.train()
            tokens = torch.randint(0, model.vocab_size, (mbs, seq))
            labels = torch.randint(0, model.vocab_size, (mbs, seq))
            positions = torch.arange(seq).unsqueeze(0).expand(mbs, -1)
            loss_mask = torch.ones(mbs, seq)

            def forward():
                out = net(tokens, positions, None, labels=labels)
                return _loss_func(loss_mask, out)[0]

            measured, storages = saved_bytes(forward, list(net.parameters()))
        ps.destroy_model_parallel()
        torch.distributed.destroy_process_group()
        # megatron-core sizes its per-layer aux-loss log by the first MoE model's layers (moe_utils.py
        # save_to_aux_losses_tracker): the next model of this process starts a log of its own.
        from megatron.core.transformer.moe.moe_utils import get_moe_layer_wise_logging_tracker
        get_moe_layer_wise_logging_tracker().clear()
    finally:
        compat.uninstall()
    planned = memory.stage_memory(model, plan, 0).activations_bytes
    return {"model": model.name, "recompute": recompute, "recompute_layers": plan.recompute_layers, "mbs": mbs,
            "seq": seq, "measured_bytes": measured, "planned_bytes": planned, "ratio": planned / measured,
            "storages": storages}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, nargs="+")
    ap.add_argument("--recompute", choices=("none", "selective", "full", "block"), default=["none"], nargs="+",
                    help="block: full recompute of the first --recompute-layers layers (--recompute-method block)")
    ap.add_argument("--mbs", type=int, default=2)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--recompute-layers", type=int, default=1,
                    help="layers of each model chunk block recompute recomputes (megatron --recompute-num-layers)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    # One process for every (model, recompute) pair: the imports, not the forward, are most of a measurement's time.
    for model in args.model:
        for recompute in args.recompute:
            torch.manual_seed(0)
            block = recompute == "block"
            result = measure(model, recompute="full" if block else recompute, mbs=args.mbs, seq=args.seq,
                             precision=args.precision, recompute_layers=args.recompute_layers if block else None)
            result["recompute"] = recompute
            if args.json:
                print(json.dumps(result), flush=True)
            else:
                print(f"{result['model']} recompute={recompute}: measured {result['measured_bytes']:,} B, "
                      f"planned {result['planned_bytes']:,} B (x{result['ratio']:.3f})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
