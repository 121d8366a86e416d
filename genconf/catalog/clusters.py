"""Cluster presets (``clusters.yaml``) and cluster YAML files: GPUs per node, NVLink domain, InfiniBand per GPU,
NCCL environment; ``--gpu`` and ``--gpus-per-node`` override a preset."""

from __future__ import annotations

import functools
import os
from dataclasses import replace
from pathlib import Path

from genconf.catalog.files import CATALOG_DIR, build, check_keys, read_yaml
from genconf.catalog.hardware import resolve_gpu
from genconf.plan.errors import GenconfError
from genconf.plan.specs import ClusterSpec

CLUSTER_KEYS = ("gpu", "gpus_per_node", "nvlink_domain_gpus", "ib_gbit_per_s_per_gpu", "total_gpus",
                "cpu_mem_gib_per_node", "nccl_env", "description", "name")


@functools.lru_cache(maxsize=1)
def _cluster_presets() -> tuple[str, dict[str, dict]]:
    path = CATALOG_DIR / "clusters.yaml"
    data = read_yaml(path)
    check_keys(path, data, ("default", "clusters"))
    return data["default"], data["clusters"]


def cluster_from_mapping(name: str, values: dict, where: str) -> ClusterSpec:
    check_keys(where, values, CLUSTER_KEYS)
    if "gpu" not in values:
        raise GenconfError(f"{where}: missing key 'gpu'")
    values = dict(values)
    values.pop("name", None)
    values["gpu"] = resolve_gpu(str(values["gpu"]))
    values["nccl_env"] = tuple((str(k), str(v)) for k, v in (values.get("nccl_env") or {}).items())
    return build(ClusterSpec, where, {"name": name, **values})


def list_clusters() -> list[ClusterSpec]:
    default, presets = _cluster_presets()
    return [cluster_from_mapping(n, v, f"clusters.yaml [{n}]") for n, v in presets.items()]


def default_cluster_name() -> str:
    return _cluster_presets()[0]


def resolve_cluster(ref: str | None = None, *, gpu: str | None = None, gpus_per_node: int | None = None) -> ClusterSpec:
    """A preset name or YAML file, with --gpu / --gpus-per-node overrides applied."""
    default, presets = _cluster_presets()
    ref = ref or default
    if ref in presets:
        cluster = cluster_from_mapping(ref, presets[ref], f"clusters.yaml [{ref}]")
    elif ref.endswith((".yaml", ".yml")) or os.sep in ref:
        path = Path(ref)
        if not path.is_file():
            raise GenconfError(f"cluster file {ref} does not exist")
        data = read_yaml(path)
        cluster = cluster_from_mapping(str(data.get("name", path.stem)), data, str(path))
    else:
        raise GenconfError(f"unknown cluster '{ref}' (presets: {', '.join(presets)}; or a YAML file)")
    changes: dict = {}
    if gpu is not None:
        changes["gpu"] = resolve_gpu(gpu)
    if gpus_per_node is not None:
        if gpus_per_node < 1:
            raise GenconfError(f"--gpus-per-node must be positive, got {gpus_per_node}")
        changes["gpus_per_node"] = gpus_per_node
        if cluster.nvlink_domain_gpus is not None and cluster.nvlink_domain_gpus % gpus_per_node:
            changes["nvlink_domain_gpus"] = None
    if changes:
        try:
            cluster = replace(cluster, **changes)
        except ValueError as exc:
            raise GenconfError(str(exc)) from None
    return cluster
