"""Cluster presets (``clusters.yaml``) and cluster YAML files: GPUs per node, NVLink domain, InfiniBand per GPU,
NCCL environment; ``--gpu`` and ``--gpus-per-node`` override a preset."""

from __future__ import annotations

import functools
import os
import re
from dataclasses import replace
from pathlib import Path

from genconf.catalog.files import CATALOG_DIR, build, check_keys, read_yaml
from genconf.catalog.hardware import resolve_gpu
from genconf.plan.errors import GenconfError
from genconf.plan.specs import ClusterSpec, GPUSpec

CLUSTER_KEYS = ("gpu", "gpus_per_node", "nvlink_domain_gpus", "pcie_peer_gbyte_per_s_per_gpu", "ib_gbit_per_s_per_gpu",
                "total_gpus", "host_link_gbyte_per_s_per_gpu", "cpu_mem_gib_per_node", "host_cpu", "nccl_env",
                "description", "name")


@functools.lru_cache(maxsize=1)
def _cluster_presets() -> tuple[str, dict[str, dict]]:
    path = CATALOG_DIR / "clusters.yaml"
    data = read_yaml(path)
    check_keys(path, data, ("default", "usual_node", "clusters"))
    return data["default"], data["clusters"]


@functools.lru_cache(maxsize=1)
def usual_nodes() -> dict[str, str]:
    """GPU name -> the cluster preset of the node it usually comes in (clusters.yaml `usual_node`)."""
    path = CATALOG_DIR / "clusters.yaml"
    usual = dict(read_yaml(path).get("usual_node") or {})
    presets = _cluster_presets()[1]
    for gpu, preset in usual.items():
        resolve_gpu(gpu)
        if preset not in presets:
            raise GenconfError(f"{path}: usual_node [{gpu}]: unknown cluster preset '{preset}'")
    return usual


CLUSTER_REQUIRED = ("gpu", "gpus_per_node", "ib_gbit_per_s_per_gpu")
"""Keys a cluster file must give (the others have defaults)."""


def cluster_from_mapping(name: str, values: dict, where: str) -> ClusterSpec:
    check_keys(where, values, CLUSTER_KEYS)
    for key in CLUSTER_REQUIRED:
        if key not in values:
            raise GenconfError(f"{where}: missing key '{key}' (a cluster needs {', '.join(CLUSTER_REQUIRED)})")
    values = dict(values)
    values.pop("name", None)
    values["gpu"] = resolve_gpu(str(values["gpu"]))
    env = values.get("nccl_env") or {}
    if not isinstance(env, dict):  # a list or a string raised AttributeError (issue 15 item 2)
        raise GenconfError(f"{where}: nccl_env must be a mapping of variable names to values (NCCL_IB_HCA: mlx5), "
                           f"got {type(env).__name__}")
    for key, value in env.items():
        if value is None or isinstance(value, (dict, list)):  # null rendered `export NCCL_X=None`
            raise GenconfError(f"{where}: nccl_env: {key} must be a value (a string or number), got "
                               f"{'null' if value is None else type(value).__name__}")
    values["nccl_env"] = tuple((str(k), str(v)) for k, v in env.items())
    for key, _ in values["nccl_env"]:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):  # as the launch scripts export it (render/slurm.py)
            raise GenconfError(f"{where}: nccl_env: {key!r} is not an environment variable name")
    return build(ClusterSpec, where, {"name": name, **values})


def list_clusters() -> list[ClusterSpec]:
    default, presets = _cluster_presets()
    return [cluster_from_mapping(n, v, f"clusters.yaml [{n}]") for n, v in presets.items()]


def default_cluster_name() -> str:
    return _cluster_presets()[0]


def resolve_cluster(ref: str | None = None, *, gpu: str | None = None, gpus_per_node: int | None = None) -> ClusterSpec:
    """A preset name or YAML file, with --gpu / --gpus-per-node overrides applied."""
    return resolve_cluster_noted(ref, gpu=gpu, gpus_per_node=gpus_per_node)[0]


def resolve_cluster_noted(ref: str | None = None, *, gpu: str | None = None,
                          gpus_per_node: int | None = None) -> tuple[ClusterSpec, str | None]:
    """resolve_cluster, and a note for the output when a GPU given without a cluster chose the node: that GPU's
    usual node (usual_nodes), or the default cluster's when it has none."""
    default, presets = _cluster_presets()
    note = None
    if ref is None and gpu is not None:
        key = resolve_gpu(gpu).name
        usual = usual_nodes().get(key)
        cluster, _ = resolve_cluster_noted(usual or default, gpu=key, gpus_per_node=gpus_per_node)
        shape = f"{cluster.gpus_per_node} GPUs per node, {nvlink_shape(cluster)}"
        if usual:
            note = f"--gpu {key} without --cluster: its usual node, {usual} ({shape}); --cluster chooses another"
        else:
            note = (f"--gpu {key} without --cluster: no preset of its usual node, so the default cluster's, {default} "
                    f"({shape}); --cluster chooses another")
        return cluster, note
    ref = ref or default
    if ref in presets:
        cluster = cluster_from_mapping(ref, presets[ref], f"clusters.yaml [{ref}]")
    elif ref.endswith((".yaml", ".yml")) or os.sep in ref:
        path = Path(ref)
        if not path.is_file():
            raise GenconfError(f"cluster file {ref} {'is a directory' if path.is_dir() else 'does not exist'}")
        data = read_yaml(path)
        # Not str(): `name: [1]` became the cluster "[1]"; ClusterSpec says a name must be text.
        cluster = cluster_from_mapping(data.get("name", path.stem), data, str(path))
    elif os.path.isfile(ref):
        raise GenconfError(f"cluster file {ref}: cluster files are YAML, named .yaml or .yml (gpu, gpus_per_node, "
                           f"ib_gbit_per_s_per_gpu, ...); or give a preset: {', '.join(presets)}")
    else:
        raise GenconfError(f"unknown cluster '{ref}' (presets: {', '.join(presets)}; or a YAML file)")
    changes: dict = {}
    if gpu is not None:
        changes["gpu"] = resolve_gpu(gpu)
        if changes["gpu"].name != cluster.gpu.name and cluster.nvlink_domain != cluster.gpus_per_node:
            # An NVLink domain across nodes (NVL72) and its host CPU, or NVLink bridges pairing PCIe cards, are that
            # system's, not the other GPU's.
            where = "across nodes" if cluster.nvlink_domain > cluster.gpus_per_node else "inside each node"
            raise GenconfError(f"--gpu {changes['gpu'].name} on {cluster.name}: its NVLink domain of "
                               f"{cluster.nvlink_domain} GPUs {where} is {cluster.gpu.name}'s system; choose a "
                               f"cluster of {changes['gpu'].name} nodes (genconf hardware), or give --gpu without "
                               f"--cluster for its usual node")
        bridge = changes["gpu"].nvlink_bridge_gpus
        if bridge is not None and cluster.nvlink_domain > bridge:
            # PCIe cards (H100 PCIe) in a node whose NVLink joins more of them: no such system exists.
            usual = usual_nodes().get(changes["gpu"].name)
            fix = (f"use --cluster {usual} (with --gpus-per-node for your node's size)" if usual else
                   f"write a cluster file with nvlink_domain_gpus {bridge}")
            raise GenconfError(f"--gpu {changes['gpu'].name} on {cluster.name}: its cards reach NVLink only through "
                               f"bridges joining {bridge}, not {cluster.name}'s NVLink domain of "
                               f"{cluster.nvlink_domain} GPUs; {fix}")
        node = changes["gpu"].node_sizes
        if gpus_per_node is None and ref in presets and node_size_error(cluster.gpus_per_node, changes["gpu"]):
            # A preset's node of GPUs this GPU never comes in: 8 GB200s (trays of 4) were planned as one 8-GPU
            # NVLink node of dgx-h100's.
            usual = usual_nodes().get(changes["gpu"].name)
            raise GenconfError(f"--gpu {changes['gpu'].name} on {cluster.name}: {changes['gpu'].name} nodes hold "
                               f"{_either(sorted(node, reverse=True))} GPUs, not {cluster.name}'s "
                               f"{cluster.gpus_per_node}; " + (f"use --cluster {usual}, " if usual else "")
                               + "or a cluster file (--cluster FILE.yaml with gpus_per_node)")
    if gpus_per_node is not None:
        if gpus_per_node < 1:
            raise GenconfError(f"--gpus-per-node must be positive, got {gpus_per_node}")
        changes["gpus_per_node"] = gpus_per_node
        domain = cluster.nvlink_domain_gpus
        if domain is not None and domain < cluster.gpus_per_node:
            # Bridged pairs stay pairs on part of the node; a node no larger than the pair is one NVLink domain.
            if gpus_per_node <= domain or gpus_per_node % domain:
                changes["nvlink_domain_gpus"] = None
        elif domain is not None and domain % gpus_per_node:
            changes["nvlink_domain_gpus"] = None
    if changes:
        try:
            cluster = replace(cluster, **changes)
        except ValueError as exc:
            raise GenconfError(str(exc)) from None
    return cluster, note


def nvlink_shape(cluster: ClusterSpec) -> str:
    """Where NVLink reaches on this cluster, in words: 'NVLink inside the node', 'an NVLink domain of 72 GPUs across
    nodes' or 'NVLink in groups of 2 GPUs, PCIe at 64 GB/s per GPU between them'."""
    domain = cluster.nvlink_domain
    if domain > cluster.gpus_per_node:
        return f"an NVLink domain of {domain} GPUs across nodes"
    if domain < cluster.gpus_per_node:
        return (f"NVLink in groups of {domain} GPUs, PCIe at {cluster.pcie_peer_gbyte_per_s_per_gpu:g} GB/s per GPU "
                f"between them")
    return "NVLink inside the node"


def node_size_error(gpus_per_node: int, gpu: GPUSpec, cluster_node: int | None = None) -> str | None:
    """Why --gpus-per-node cannot be a node of this GPU: neither a node size it comes in (GPUSpec.node_sizes), nor the
    node of the cluster it was given with (`cluster_node`: a cluster file's gpus_per_node, the place the message sends
    other nodes to), nor part of one (what Slurm allocates of a larger node); None where it can. 5 on an H100 preset
    planned five-GPU nodes no server is built as, and 1,000 one NVLink domain of 1,000 GPUs."""
    usual = sorted(set(gpu.node_sizes) | ({cluster_node} if cluster_node else set()), reverse=True)
    if any(size % gpus_per_node == 0 for size in usual):
        return None
    parts = sorted({d for size in usual for d in range(1, size) if size % d == 0} - set(usual), reverse=True)
    sizes = _either(usual)
    part = f", or {_either(parts)} to use part of each node" if parts else ""
    return (f"--gpus-per-node {gpus_per_node}: {gpu.name} nodes hold {sizes} GPUs: give {sizes}{part}; a node of "
            f"another size goes in a cluster file (--cluster FILE.yaml with gpus_per_node)")


def _either(values: list[int]) -> str:
    """[8, 4, 2] -> '8, 4 or 2'."""
    return " or ".join(filter(None, (", ".join(map(str, values[:-1])), str(values[-1]))))
