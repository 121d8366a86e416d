"""DeepSpeed's compiled optimizer on the GPU at hand, or torch's AdamW with one line saying why.

DeepSpeed 0.19.8 builds FusedAdam just in time (op_builder/builder.py, `CUDAOpBuilder.compute_capability_args`).
It reads TORCH_CUDA_ARCH_LIST and sorts its entries with `int(part.split('+')[0])` over the dot-separated
parts, so torch's arch-specific suffixes ('9.0a' for sm_90a, '10.0f', '12.0a'), which torch itself accepts and
CUDA images export, end the run with "invalid literal for int() with base 10: '0a'". FusedAdam only needs the
plain architecture: the list DeepSpeed gets is the detected GPUs' compute capabilities (or the given list
with the suffixes dropped). Where the op still cannot be built (no nvcc, no ninja, a compiler error) the run
uses torch.optim.AdamW(fused=True) through DeepSpeed's own `torch_adam` switch: the same update rule, never a
crash.
"""

from __future__ import annotations

import copy
import os
import re

_ENTRY = re.compile(r"^(\d+)\.(\d+)([a-z]?)(\+PTX)?$")


def deepspeed_arch_list(env_value: str | None, capabilities: list[tuple[int, int]]) -> tuple[str | None, str | None]:
    """(TORCH_CUDA_ARCH_LIST for DeepSpeed's op builder, a note when it differs from the environment's).

    Unset: the detected GPUs' capabilities ('9.0'), so DeepSpeed never probes devices from a forked process.
    Set: kept when DeepSpeed can parse every entry; suffixes dropped ('9.0a' -> '9.0') otherwise; entries it
    cannot read at all (named architectures) replaced by the detected capabilities."""
    detected = ";".join(dict.fromkeys(f"{major}.{minor}" for major, minor in capabilities)) or None
    if not env_value or not env_value.strip():
        return detected, None
    entries = [e for e in re.split(r"[;\s]+", env_value.strip()) if e]
    out, changed = [], False
    for entry in entries:
        m = _ENTRY.match(entry)
        if m is None:
            changed = True
            out.extend((detected or "").split(";"))
            continue
        if m.group(3):
            changed = True
        out.append(f"{m.group(1)}.{m.group(2)}{m.group(4) or ''}")
    value = ";".join(dict.fromkeys(e for e in out if e)) or detected
    if not changed:
        return env_value, None
    return value, (f"TORCH_CUDA_ARCH_LIST {env_value!r} -> {value!r} for DeepSpeed's op builder (it cannot parse "
                   "architecture suffixes such as '9.0a')")


def prepare_arch_list(environ=os.environ, capabilities: list[tuple[int, int]] | None = None) -> str | None:
    """Set TORCH_CUDA_ARCH_LIST in `environ` for DeepSpeed's builder; returns the note to print, if any."""
    if capabilities is None:
        import torch

        capabilities = [torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())]
    value, note = deepspeed_arch_list(environ.get("TORCH_CUDA_ARCH_LIST"), capabilities)
    if value:
        environ["TORCH_CUDA_ARCH_LIST"] = value
    return note


def fused_adam_available(builder_class=None) -> tuple[bool, str]:
    """(True, '') when DeepSpeed's FusedAdam op loads (prebuilt or built now), else (False, one-line reason).
    `builder_class`: DeepSpeed's builder to use (default: the one for this machine's accelerator)."""
    try:
        if builder_class is None:
            from deepspeed.ops.op_builder import FusedAdamBuilder as builder_class

        builder_class().load(verbose=False)
    except Exception as exc:  # any build failure: the run goes on with torch's AdamW
        text = str(exc).strip().splitlines()
        return False, f"{type(exc).__name__}: {text[0] if text else ''}"[:200]
    return True, ""


def with_torch_adam(ds_config: dict) -> dict:
    """The config with DeepSpeed's optimizer switched to torch.optim.AdamW(fused=True) (DeepSpeed's
    `torch_adam` parameter; ZeRO supports torch's Adam/AdamW without zero_allow_untested_optimizer)."""
    config = copy.deepcopy(ds_config)
    params = config.setdefault("optimizer", {"type": "AdamW", "params": {}}).setdefault("params", {})
    params["torch_adam"] = True
    params["fused"] = True
    return config


def cuda_optimizer_config(ds_config: dict, *, log=print, environ=os.environ, capabilities=None,
                          builder_class=None) -> dict:
    """On a GPU: prepare the arch list, try FusedAdam, fall back to torch's fused AdamW with one line."""
    if "optimizer" not in ds_config:
        return ds_config
    note = prepare_arch_list(environ, capabilities)
    if note:
        log(f"genconf: {note}")
    ok, why = fused_adam_available(builder_class)
    if ok:
        return ds_config
    log(f"genconf: DeepSpeed's FusedAdam could not be built ({why}); using torch.optim.AdamW(fused=True), the same update")
    return with_torch_adam(ds_config)
