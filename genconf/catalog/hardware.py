"""GPUs (``hardware.yaml``: peak FLOP/s, memory, links) and the cost model's calibration per GPU
(``calibration.yaml``: the achievable fractions fitted on published runs)."""

from __future__ import annotations

import functools
from dataclasses import fields

from genconf.catalog.files import CATALOG_DIR, build, check_keys, read_yaml
from genconf.plan.errors import GenconfError
from genconf.plan.specs import GPUSpec


GPU_KEYS = tuple(f.name for f in fields(GPUSpec) if f.name != "name")


@functools.lru_cache(maxsize=1)
def _gpu_catalog() -> dict[str, GPUSpec]:
    path = CATALOG_DIR / "hardware.yaml"
    data = read_yaml(path)
    check_keys(path, data, ("gpus",))
    gpus = {}
    for name, values in data["gpus"].items():
        check_keys(f"{path} [{name}]", values, GPU_KEYS)
        values = dict(values, node_sizes=tuple(values.get("node_sizes", ())))
        gpus[name] = build(GPUSpec, f"{path} [{name}]", {"name": name, **values})
    return gpus


def list_gpus() -> list[GPUSpec]:
    return list(_gpu_catalog().values())


def resolve_gpu(name: str) -> GPUSpec:
    gpus = _gpu_catalog()
    key = name.strip().lower()
    if key not in gpus:
        raise GenconfError(f"unknown GPU '{name}' (one of: {', '.join(gpus)})")
    return gpus[key]


# --- cost-model calibration -----------------------------------------------------------------------

@functools.lru_cache(maxsize=16)
def calibration_for(gpu_name: str):
    """The Calibration of a GPU: its architecture's values with the GPU's own overrides applied."""
    from genconf.plan.cost import Calibration

    path = CATALOG_DIR / "calibration.yaml"
    data = read_yaml(path)
    check_keys(path, data, ("archs", "gpus"))
    gpu = resolve_gpu(gpu_name)
    values = dict(data["archs"][gpu.arch])
    values.update((data.get("gpus") or {}).get(gpu.name, {}))
    allowed = tuple(f.name for f in fields(Calibration))
    check_keys(f"{path} [{gpu.name}]", values, allowed)
    return build(Calibration, f"{path} [{gpu.name}]", values)


def gpu_for_device_name(device_name: str) -> str | None:
    """The catalog GPU for a CUDA device name (torch.cuda.get_device_name()), or None."""
    name = device_name.lower()
    for key, gpu in (("h200", "h200"), ("h100 pcie", "h100-pcie"), ("h100", "h100-sxm"),
                     ("a100-sxm4-40", "a100-40gb"), ("a100", "a100-80gb"), ("gb200", "gb200"), ("b200", "b200")):
        if key in name:
            return gpu
    return None
