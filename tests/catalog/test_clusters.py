"""Cluster presets and the NVLink domain: a domain across nodes (NVL72) or inside one (H100 PCIe cards bridged in
pairs), and what --gpu and --gpus-per-node keep of it."""

from __future__ import annotations

import dataclasses

import pytest

from genconf.catalog.clusters import resolve_cluster, resolve_cluster_noted
from genconf.plan.errors import GenconfError
from genconf.plan.specs import ClusterSpec


def test_h100_pcie_without_a_cluster_plans_on_bridged_pairs_and_says_so():
    cluster, note = resolve_cluster_noted(None, gpu="h100-pcie")
    assert (cluster.name, cluster.gpus_per_node, cluster.nvlink_domain) == ("pcie-h100", 8, 2)
    assert cluster.pcie_inside_node and cluster.pcie_peer_gbyte_per_s_per_gpu == 64
    assert note == ("--gpu h100-pcie without --cluster: its usual node, pcie-h100 (8 GPUs per node, NVLink in groups "
                    "of 2 GPUs, PCIe at 64 GB/s per GPU between them); --cluster chooses another")


def test_a_domain_that_neither_divides_nor_spans_whole_nodes_is_refused():
    gpu = resolve_cluster("pcie-h100").gpu
    with pytest.raises(ValueError, match=r"nvlink_domain_gpus \(3\) must be a multiple of gpus_per_node \(8\), a "
                                         r"domain across nodes \(NVL72: 72\), or divide it"):
        ClusterSpec(name="odd", gpu=gpu, gpus_per_node=8, nvlink_domain_gpus=3, pcie_peer_gbyte_per_s_per_gpu=64,
                    ib_gbit_per_s_per_gpu=200)


def test_a_domain_inside_the_node_needs_the_pcie_figure():
    gpu = resolve_cluster("pcie-h100").gpu
    with pytest.raises(ValueError, match=r"an NVLink domain of 2 GPUs inside 8-GPU nodes needs "
                                         r"pcie_peer_gbyte_per_s_per_gpu"):
        ClusterSpec(name="pairs", gpu=gpu, gpus_per_node=8, nvlink_domain_gpus=2, ib_gbit_per_s_per_gpu=200)
    pairs = ClusterSpec(name="pairs", gpu=gpu, gpus_per_node=8, nvlink_domain_gpus=2,
                        pcie_peer_gbyte_per_s_per_gpu=64, ib_gbit_per_s_per_gpu=200)
    assert pairs.nvlink_domain == 2
    with pytest.raises(ValueError, match="pcie_peer_gbyte_per_s_per_gpu must be a positive number, got 0"):
        dataclasses.replace(pairs, pcie_peer_gbyte_per_s_per_gpu=0)


@pytest.mark.parametrize("per_node,domain", [(8, 2), (4, 2), (2, 2), (1, 1)])
def test_part_of_a_bridged_node_keeps_its_pairs(per_node, domain):
    # Slurm's share of a node: 4 of the 8 cards are still two pairs; 2 are one pair, the whole NVLink domain.
    cluster = resolve_cluster("pcie-h100", gpus_per_node=per_node)
    assert (cluster.gpus_per_node, cluster.nvlink_domain, cluster.pcie_inside_node) == (per_node, domain,
                                                                                        domain < per_node)


def test_another_gpu_on_bridged_pairs_is_refused():
    with pytest.raises(GenconfError, match=r"--gpu h100-sxm on pcie-h100: its NVLink domain of 2 GPUs inside each node "
                                           r"is h100-pcie's system"):
        resolve_cluster("pcie-h100", gpu="h100-sxm")


@pytest.mark.parametrize("preset,domain", [("kempner-h100", 4), ("dgx-h100", 8)])
def test_h100_pcie_cards_are_refused_on_an_nvlink_node_they_cannot_form(preset, domain):
    # H100 PCIe cards reach NVLink only through bridges joining two (NVIDIA H100 PCIe product brief, PB-11133):
    # swapped into a node whose NVLink joins 4 or 8 GPUs they were planned with NVLink across all of them.
    with pytest.raises(GenconfError, match=rf"--gpu h100-pcie on {preset}: its cards reach NVLink only through "
                                           rf"bridges joining 2, not {preset}'s NVLink domain of {domain} GPUs; use "
                                           r"--cluster pcie-h100 \(with --gpus-per-node for your node's size\)"):
        resolve_cluster(preset, gpu="h100-pcie")
    # A cluster built by hand (a cluster file) is held to the same bridge.
    gpu = resolve_cluster("pcie-h100").gpu
    with pytest.raises(ValueError, match=r"h100-pcie cards reach NVLink only through bridges joining 2 cards, so an "
                                         r"NVLink domain of 4 GPUs cannot hold them"):
        ClusterSpec(name="four", gpu=gpu, gpus_per_node=4, ib_gbit_per_s_per_gpu=200)


@pytest.mark.parametrize("preset,gpu,usual", [("dgx-h100", "gb200", "gb200-nvl72"),
                                               ("dgx-a100", "gb300", "gb300-nvl72")])
def test_a_gpu_swapped_into_a_preset_node_it_never_comes_in_is_refused(preset, gpu, usual):
    # GB200 and GB300 come in trays of 4 (hardware.yaml node_sizes [4]): --gpu gb200 on dgx-h100 once planned eight of
    # them in one 8-GPU NVLink node (the probe of 2026-12-01), while --gpus-per-node 8 with --gpu gb200 was refused.
    with pytest.raises(GenconfError, match=rf"^--gpu {gpu} on {preset}: {gpu} nodes hold 4 GPUs, not {preset}'s 8; "
                                           rf"use --cluster {usual}, or a cluster file"):
        resolve_cluster(preset, gpu=gpu)
    # A node size it comes in, or part of one (Slurm's share of an 8-GPU B200 node), is kept.
    assert resolve_cluster("dgx-h100", gpu="b200").gpus_per_node == 8
    assert resolve_cluster("kempner-h100", gpu=gpu).gpus_per_node == 4
    assert resolve_cluster("kempner-h100", gpu="b200").gpus_per_node == 4


def test_only_a_bridged_gpu_writes_its_bridge_into_plan_json():
    from genconf.plan.planfile import cluster_dict, cluster_from_dict

    pairs, sxm = resolve_cluster("pcie-h100"), resolve_cluster("dgx-h100")
    assert cluster_dict(pairs, 8)["gpu_spec"]["nvlink_bridge_gpus"] == 2
    assert "nvlink_bridge_gpus" not in cluster_dict(sxm, 8)["gpu_spec"]  # other GPUs' files as they were
    assert cluster_from_dict(cluster_dict(pairs, 8)).gpu == pairs.gpu
    assert cluster_from_dict(cluster_dict(sxm, 8)).gpu == sxm.gpu
