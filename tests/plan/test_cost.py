"""The cost model against answers worked by hand: a GEMM-bound and a bandwidth-bound kernel and layer, the
pipeline bubble (p-1)/(v m) (Narayanan et al. 2021, Sec. 2.2), and a data-parallel all-reduce on a stated link,
2(d-1)/d x bytes / bandwidth (the ring all-reduce, Patarasuk & Yuan 2009). Each number is derived in the test;
tests/plan/test_kernels.py holds the same forms against kernels measured on an H100."""

from __future__ import annotations

import dataclasses

import pytest

from genconf.catalog.clusters import resolve_cluster
from genconf.catalog.hardware import calibration_for
from genconf.catalog.models import resolve_model
from genconf.plan import kernels
from genconf.plan.cost import (Calibration, _all_to_all_s, _dp_comm_s, _flex_all_to_all_s, _tp_collective_s,
                               ep_unpaired_share, groups_reached, layer_time, linear_s, stage_times, step_cost)
from genconf.plan.pipeline import bubble_fraction
from genconf.plan.specs import ClusterSpec, ParallelPlan

PEAK_TFLOPS = 1000.0  # a round peak, so the arithmetic below stays exact
HBM_TBYTE_PER_S = 4.0


def _gemm(m: int, n: int, k: int, *, sms: int = 128, efficiency: float = 0.5, tile_overhead_s: float = 0.0) -> float:
    return kernels.gemm_s(m, n, k, peak_tflops=PEAK_TFLOPS, efficiency=efficiency, tile_overhead_s=tile_overhead_s,
                          sms=sms, hbm_tbyte_per_s=HBM_TBYTE_PER_S, in_bytes=2, out_bytes=2)


def test_a_large_square_gemm_is_compute_bound():
    # 4096^3: 2 x 4096^3 = 137,438,953,472 FLOPs at 1000 TFLOP/s x 0.5 efficiency = 2.74878e-4 s.
    # Its bf16 operands, 3 x 4096^2 x 2 bytes = 100,663,296 bytes, take 2.5e-5 s at 4 TB/s: compute wins.
    # 128x128 tiles: 32 x 32 = 1024 of them, exactly 8 waves of 128 SMs, so no quantization loss (128x256
    # tiles: 512 of them, 4 waves of twice the work, the same); too many tiles for split-K to pay.
    assert _gemm(4096, 4096, 4096) == pytest.approx(2 * 4096**3 / (1000e12 * 0.5), rel=1e-12)
    assert _gemm(4096, 4096, 4096) == pytest.approx(2.74877906944e-4, rel=1e-12)
    # 132 SMs: the same 1024 tiles need ceil(1024 / 132) = 8 waves of 132 slots, 1024/1056 of them busy.
    assert _gemm(4096, 4096, 4096, sms=132) == pytest.approx(2.74877906944e-4 * 1056 / 1024, rel=1e-12)
    # A fixed cost per 128x128 tile and wave (prologue, epilogue): 8 waves x 1 us on top.
    assert _gemm(4096, 4096, 4096, tile_overhead_s=1e-6) == pytest.approx(2.74877906944e-4 + 8e-6, rel=1e-12)


def test_a_single_token_gemm_is_bandwidth_bound():
    # One token through an 8192 x 8192 weight: the 2-byte weight alone is 134,217,728 bytes; with the input
    # and output rows the GEMM moves 2 x (8192 + 8192^2 + 8192) = 134,250,496 bytes, 3.35626e-5 s at 4 TB/s.
    # Its tensor cores work on whole 128-row tiles: the token is padded to 128 rows, 64 output tiles of
    # 2 x 128 x 128 x 8192 FLOPs = 1.718e13 FLOPs, 1.718e-5 s at the full 1000 TFLOP/s however the k dimension
    # is split over the SMs: memory still wins, by 1.95x.
    want = 2 * (8192 + 8192 * 8192 + 8192) / 4e12
    assert want == pytest.approx(3.3562624e-5, rel=1e-12)
    assert _gemm(1, 8192, 8192, efficiency=1.0) == pytest.approx(want, rel=1e-12)
    padded = 64 * 2 * 128 * 128 * 8192 / 1000e12
    assert padded == pytest.approx(1.7179869184e-5, rel=1e-12) and padded < want / 1.9
    # At half the peak the padded tiles (3.4e-5 s) take longer than the bytes: the GEMM turns compute-bound.
    assert _gemm(1, 8192, 8192) > want


def _gpu_and_cal(efficiency: float = 0.5):
    cluster = resolve_cluster("dgx-h100")
    gpu = dataclasses.replace(cluster.gpu, peak_bf16_tflops=PEAK_TFLOPS, hbm_tbyte_per_s=HBM_TBYTE_PER_S, num_sms=128)
    cal = dataclasses.replace(calibration_for("h100-sxm"), gemm_efficiency=efficiency, gemm_tile_overhead_s=0.0,
                              hbm_efficiency=1.0, clock_factor=1.0, power_clock_exponent=0.0)
    return gpu, cal


def test_a_gemm_bound_layer_is_its_three_gemms():
    # One linear layer, forward (n x k) @ (k x n_out), and backward: dgrad (n x n_out) @ (n_out x k) and wgrad
    # (k x n) @ (n x n_out): three GEMMs of 2 x n x k x n_out FLOPs each. n = 8192 tokens, h = 4096 -> 4 x 4096:
    # 3 x 2 x 8192 x 4096 x 16384 = 3.2985e12 FLOPs at 500 TFLOP/s = 6.597e-3 s; every tile count is a
    # multiple of 128 (8192, 2048 and 4096 tiles), so no wave is partly empty.
    gpu, cal = _gpu_and_cal()
    fwd, bwd = linear_s(gpu, cal, 8192, 16384, 4096, "bf16")
    assert fwd == pytest.approx(2 * 8192 * 4096 * 16384 / (1000e12 * 0.5), rel=1e-12)
    assert fwd + bwd == pytest.approx(3 * 2 * 8192 * 4096 * 16384 / (1000e12 * 0.5), rel=1e-12)
    assert fwd + bwd == pytest.approx(6.597069766656e-3, rel=1e-12)


def test_a_bandwidth_bound_layer_is_its_bytes():
    # A micro-batch of 8 tokens through an 8192 -> 8192 linear layer: each of the three GEMMs reads or writes the
    # 8192 x 8192 weight (or its gradient) and two 8-token rows, 2 x (8 x 8192 + 8192^2 + 8 x 8192) = 134,479,872
    # bytes, 3.36200e-5 s at 4 TB/s. At the full 1000 TFLOP/s their tensor-core time is at most 1.72e-5 s (the
    # 8 tokens padded to 128-row tiles, as in the single-token GEMM): 3 x 3.36200e-5 = 1.00860e-4 s.
    gpu, cal = _gpu_and_cal(efficiency=1.0)
    per_gemm = 2 * (8 * 8192 + 8192 * 8192 + 8 * 8192) / 4e12
    assert per_gemm == pytest.approx(3.3619968e-5, rel=1e-12)
    fwd, bwd = linear_s(gpu, cal, 8, 8192, 8192, "bf16")
    assert fwd == pytest.approx(per_gemm, rel=1e-12) and bwd == pytest.approx(2 * per_gemm, rel=1e-12)


def test_the_pipeline_bubble_is_p_minus_1_over_v_m():
    # pp=4 stages, vp=2 virtual stages, gbs 128 / (mbs 1 x dp 8) = 16 micro-batches: (4 - 1) / (2 x 16) = 3/32.
    plan = ParallelPlan(framework="megatron", tp=4, pp=4, vp=2, dp=8, mbs=1, gbs=128, seq_length=4096)
    assert plan.num_microbatches == 16
    assert bubble_fraction(plan) == 3 / 32 == 0.09375
    assert bubble_fraction(dataclasses.replace(plan, vp=1)) == 3 / 16
    assert bubble_fraction(dataclasses.replace(plan, pp=1, vp=1, dp=32)) == 0.0
    # step_cost charges (p-1)/v slowest-stage micro-batch times, each with its p2p sends (in the warm-up and
    # flush every send is on the critical path): over the m micro-batch times of the slowest stage, the same 3/32.
    model, _ = resolve_model("llama3-8b")
    cluster = resolve_cluster("dgx-h100")
    cal = calibration_for("h100-sxm")
    cost = step_cost(model, plan, cluster, cal)
    slowest = max(st.total_s for st in stage_times(model, plan, cluster, cal))
    assert cost.compute_s == pytest.approx(16 * slowest, rel=1e-12)
    assert cost.bubble_s / (cost.compute_s + 16 * _p2p_per_microbatch(plan, cluster, cal)) == pytest.approx(
        3 / 32, rel=1e-12)
    assert cost.bubble_fraction == 3 / 32


def _p2p_per_microbatch(plan: ParallelPlan, cluster: ClusterSpec, cal: Calibration) -> float:
    """One micro-batch's pipeline sends, worked by hand for llama3-8b (hidden 4096) at 4,096 tokens, tp 4, on
    dgx-h100: each chunk boundary sends 2 bytes x 4,096 tokens x 4,096 = 32 MiB, a quarter of it per rank with
    sequence parallelism (the activations stay split along the sequence).
    Pipeline neighbours are tp x dp = 32 ranks apart (megatron's tp-cp-dp-pp order), in another node: one
    400 Gb/s NIC (50 GB/s) at ib_efficiency, plus the call latency. Forward activations and backward gradients,
    at each of the vp virtual stages; under interleaving pp_overlap_exposed of it can stall a rank."""
    assert (plan.tp, plan.cp, plan.dp, cluster.gpus_per_node) == (4, 1, 8, 8)
    send = 2 * 4096 * 4096 / (4 if plan.sequence_parallel else 1) / (50e9 * cal.ib_efficiency) + cal.collective_latency_s
    return 2 * send * plan.vp * (cal.pp_overlap_exposed if plan.vp > 1 else 1.0)


def test_interleaved_p2p_costs_every_rank_its_exposed_share():
    # megatron's interleaved schedule runs its sends and receives beside the next chunk's compute
    # (overlap_p2p_comm), but NCCL's send/receive kernels take SMs and memory bandwidth from that compute on every
    # rank, the slowest (the last: it also runs the output layer and the loss) included: pp_overlap_exposed of
    # each micro-batch's transfers costs it, however much slack the faster ranks have.
    model, _ = resolve_model("llama3-8b")
    cluster = resolve_cluster("dgx-h100")
    cal = calibration_for("h100-sxm")
    plan = ParallelPlan(framework="megatron", tp=4, pp=4, vp=2, dp=8, mbs=1, gbs=128, seq_length=4096,
                        sequence_parallel=True)
    stages = sorted(st.total_s for st in stage_times(model, plan, cluster, cal))
    others, slowest = stages[-2], stages[-1]
    p2p = _p2p_per_microbatch(plan, cluster, cal)
    assert slowest - others > p2p > 0  # the faster ranks' slack would cover the sends: it does not hide them
    cost = step_cost(model, plan, cluster, cal)
    assert cost.pp_comm_s == pytest.approx(16 * p2p, rel=1e-12)
    assert cost.step_time_s == pytest.approx(
        16 * (slowest + p2p) + cost.bubble_s + cost.dp_comm_s + cost.optimizer_s + cost.overhead_s, rel=1e-12)
    # Twice the virtual stages: twice the chunk boundaries, twice the sends.
    deeper = dataclasses.replace(plan, vp=4)
    assert step_cost(model, deeper, cluster, cal).pp_comm_s == pytest.approx(2 * cost.pp_comm_s, rel=1e-12)
    # Without interleaving, megatron's 1F1B sends and receives block (batched isend/irecv, waited on): every
    # rank spends its own transfers in full.
    flat = dataclasses.replace(plan, vp=1)
    assert step_cost(model, flat, cluster, cal).pp_comm_s == pytest.approx(16 * _p2p_per_microbatch(flat, cluster, cal),
                                                                          rel=1e-12)


def test_a_pipeline_wider_than_the_nvlink_domain_sends_over_infiniband():
    # Stage s holds ranks [s B, (s+1) B), B = tp x cp x dp: tp 2 pp 8 dp 1 on 8-GPU nodes puts stages 0-3 in one
    # node and 4-7 in the next, so the 3 -> 4 boundary crosses a NIC and paces the schedule. Two stages fit in a
    # node (2 x tp = 4), which had priced every send over NVLink (on a 25 Gb/s fabric the search then chose such
    # pipelines at NVLink prices).
    model, _ = resolve_model("llama3-8b")
    cluster = resolve_cluster("dgx-h100")
    cal = dataclasses.replace(calibration_for("h100-sxm"), collective_latency_s=0.0)
    wide = ParallelPlan(framework="megatron", tp=2, pp=8, dp=1, mbs=1, gbs=64, seq_length=4096)
    narrow = dataclasses.replace(wide, pp=4, gbs=64)  # 8 GPUs: one node
    send = 2 * 4096 * 4096  # bytes a boundary sends, forward activations (no sequence parallelism)
    ib = cluster.ib_gbyte_per_s_per_gpu * cal.ib_efficiency * 1e9
    # Forward and backward at each of the 64 micro-batches, blocking (no interleaving).
    assert step_cost(model, wide, cluster, cal).pp_comm_s == pytest.approx(64 * 2 * send / ib, rel=1e-9)
    assert step_cost(model, narrow, cluster, cal).pp_comm_s < 64 * 2 * send / ib / 4  # NVLink: over 4x the NIC's


def _stated_link():
    """Llama 3 8B on 4-GPU H100 nodes with one 400 Gb/s NIC per GPU, links at full rate (ib_efficiency 1), no call
    latency, and 400M parameters on the reducing rank."""
    model, _ = resolve_model("llama3-8b")
    cluster = ClusterSpec(name="stated", gpu=resolve_cluster("dgx-h100").gpu, gpus_per_node=4,
                          ib_gbit_per_s_per_gpu=400)
    cal = dataclasses.replace(calibration_for("h100-sxm"), ib_efficiency=1.0, collective_latency_s=0.0)
    return model, cluster, cal, 400_000_000


def test_a_data_parallel_all_reduce_on_a_stated_link():
    # Megatron DP (no distributed optimizer) over d = 8 GPUs, 400M parameters on the rank reducing fp32
    # gradients: 1.6e9 bytes. Ring all-reduce: 2 (d-1)/d x bytes / bus bandwidth. Links at full rate
    # (ib_efficiency 1) and no call latency.
    model, cluster, cal, params = _stated_link()
    # tp=4, dp=8 on 4-GPU nodes: one DP rank per node, so each ring leaves the node through one 400 Gb/s NIC,
    # 50 GB/s: 2 x 7/8 x 1.6e9 / 50e9 = 0.056 s.
    one_nic = ParallelPlan(framework="megatron", tp=4, dp=8, mbs=1, gbs=8, seq_length=4096, zero_stage=0)
    allreduce = 2 * 7 / 8 * 4 * params / 50e9
    assert allreduce == pytest.approx(0.056, rel=1e-12)
    # Nothing to hide behind: the whole all-reduce is exposed, plus the last of the ceil(400M / 40M) = 10
    # buckets, which only starts once backward is over: 0.056 + 0.0056.
    assert _dp_comm_s(model, one_nic, cluster, cal, params, 0, 0.0, 0.0) == pytest.approx(0.056 + 0.0056, rel=1e-12)
    # A backward long enough to hide it (0.9 x 1 s > 0.056 s): only the last bucket is exposed.
    assert _dp_comm_s(model, one_nic, cluster, cal, params, 0, 1.0, 0.0) == pytest.approx(0.0056, rel=1e-12)
    # tp=1: four DP ranks in each node, so NCCL's rings use all four NICs, 4 x 50 = 200 GB/s: a quarter of it.
    four_nics = dataclasses.replace(one_nic, tp=1)
    assert _dp_comm_s(model, four_nics, cluster, cal, params, 0, 0.0, 0.0) == pytest.approx(
        (0.056 + 0.0056) / 4, rel=1e-12)
    # Inside one NVLink domain (d = 4 on a 4-GPU node) it runs on NVLink's one-way 450 GB/s instead.
    in_node = dataclasses.replace(four_nics, dp=4, gbs=4)
    nvlink = cluster.nvlink_gbyte_per_s_one_way * 1e9 * cal.nvlink_efficiency
    assert _dp_comm_s(model, in_node, cluster, cal, params, 0, 0.0, 0.0) == pytest.approx(
        2 * 3 / 4 * 4 * params / nvlink * 1.1, rel=1e-12)


def test_deepspeed_zero2_reduces_every_micro_batch_zero1_once():
    # DeepSpeed ZeRO-1 reduces the accumulated gradients at the accumulation boundary; ZeRO-2 keeps only its
    # partition, so each micro-batch's backward reduce-scatters (stage_1_and_2.py). Same link as above: one 400 Gb/s
    # NIC per DP rank (tp=4), no call latency, 400M parameters of bf16 gradients (DeepSpeed reduces in the model's
    # dtype by default): reduce-scatter (d-1)/d x 0.8e9 / 50e9 = 0.014 s, and the last of its 10 buckets (0.0014 s)
    # once the backward is over.
    model, cluster, cal, params = _stated_link()
    reduce = 7 / 8 * 2 * params / 50e9
    assert reduce == pytest.approx(0.014, rel=1e-12)
    zero1 = ParallelPlan(framework="deepspeed", tp=4, dp=8, mbs=1, gbs=64, seq_length=4096, zero_stage=1)
    zero2 = dataclasses.replace(zero1, zero_stage=2)
    assert zero1.num_microbatches == 8 and zero1.grad_bytes == 2
    one, two = (_dp_comm_s(model, p, cluster, cal, params, 0, 0.0, 0.0) for p in (zero1, zero2))
    assert two - one == pytest.approx(7 * (reduce + reduce / 10), rel=1e-12)  # 7 more reductions, each exposed
    # A backward that hides a reduction leaves each micro-batch's last bucket exposed.
    hidden = _dp_comm_s(model, zero2, cluster, cal, params, 0, 1.0, 0.0) - _dp_comm_s(model, zero1, cluster, cal,
                                                                                    params, 0, 1.0, 0.0)
    assert hidden == pytest.approx(7 * reduce / 10, rel=1e-12)
    single = dataclasses.replace(zero1, gbs=8)  # one micro-batch: the two stages communicate alike
    assert _dp_comm_s(model, single, cluster, cal, params, 0, 0.0, 0.0) == _dp_comm_s(
        model, dataclasses.replace(single, zero_stage=2), cluster, cal, params, 0, 0.0, 0.0)


def test_the_step_adds_up():
    # The step time is the sum of its parts, and the rates are what they say: tokens per step over the step time,
    # model FLOPs per step per GPU against the dtype's dense peak.
    model, _ = resolve_model("70b")
    cluster = resolve_cluster()
    plan = ParallelPlan(framework="megatron", tp=4, pp=4, vp=4, dp=24, mbs=1, gbs=1056, seq_length=4096, zero_stage=1,
                        sequence_parallel=True)
    cost = step_cost(model, plan, cluster, calibration_for(cluster.gpu.name))
    parts = cost.compute_s + cost.bubble_s + cost.pp_comm_s + cost.dp_comm_s + cost.optimizer_s + cost.overhead_s
    assert cost.step_time_s == pytest.approx(parts, rel=1e-12)
    assert cost.tokens_per_step == 1056 * 4096
    assert cost.tokens_per_s_per_gpu == pytest.approx(1056 * 4096 / cost.step_time_s / 384, rel=1e-12)
    assert cost.mfu == pytest.approx(cost.model_flops_per_step / cost.step_time_s / 384 / 989.4e12, rel=1e-9)
    # Korthikanti 2022 eq. 7, 72 B s L h^2 (1 + s/(6h) + V/(12 h L)) a batch, on seed 000's OLMo 70B (a GPT block of
    # 12 D^2 weights: D 8192, N 80, V 50,280, T 4096).
    L, h, s, v = 80, 8192, 4096, 50280
    assert cost.model_flops_per_step == pytest.approx(
        1056 * s * 72 * L * h * h * (1 + s / (6 * h) + v / (12 * h * L)), rel=1e-12)


def test_the_ep_overlap_hides_the_paired_all_to_all():
    # Mixtral 8x7B (hidden 4096, top-2 routing) at 4,096 tokens, tp 1, ep 8 inside one 8-GPU H100 node. Each
    # dispatch or combine moves 2 bytes x 4,096 tokens x 2 routes x 4,096 = 64 MiB per rank, 7/8 of it to the other
    # seven GPUs over NVLink (450 GB/s one way at nvlink_efficiency, and at NCCL's all-to-all share of it: megatron's
    # alltoall dispatcher) plus the call latency, (1 + log2 8) x 15 us.
    model, _ = resolve_model("mixtral-8x7b")
    cluster = resolve_cluster("dgx-h100")
    cal = dataclasses.replace(calibration_for("h100-sxm"), ep_overlap_exposed=0.25)
    a2a = (7 / 8 * 2 * 4096 * 2 * 4096 / (450e9 * cal.nvlink_efficiency * cal.nccl_all_to_all_efficiency)
           + cal.collective_latency_s * 4)
    plan = ParallelPlan(framework="megatron", ep=8, dp=8, mbs=1, gbs=32, seq_length=4096)
    assert plan.num_microbatches == 4
    off = layer_time(model, plan, cluster, cal)
    on = layer_time(model, dataclasses.replace(plan, moe_ep_overlap=True), cluster, cal)
    # Dispatch and combine, forward and backward: 4 all-to-alls per layer, all exposed without the overlap.
    assert off.tp_comm_s == pytest.approx(4 * a2a, rel=1e-9)
    # With it, the first forward and the last backward have no partner (1 of 4 micro-batches). A paired layer's
    # all-to-alls run under the other micro-batch's compute, which outlasts them here: ep_overlap_exposed of them
    # still costs.
    assert ep_unpaired_share(dataclasses.replace(plan, moe_ep_overlap=True)) == pytest.approx(1 / 4)
    assert 4 * a2a < off.fwd_s + off.bwd_s
    assert on.tp_comm_s == pytest.approx(4 * a2a * (1 / 4 + 3 / 4 * 0.25), rel=1e-9)
    assert (on.fwd_s, on.bwd_s) == (off.fwd_s, off.bwd_s)  # the compute itself is unchanged
    # Over NVLink fifty times slower the all-to-alls outlast the compute: the paired layers pay the excess in full.
    slow = dataclasses.replace(cal, nvlink_efficiency=cal.nvlink_efficiency / 50)
    comm = layer_time(model, plan, cluster, slow).tp_comm_s
    compute = off.fwd_s + off.bwd_s
    assert comm > compute
    paired = comm - compute + 0.25 * compute
    assert layer_time(model, dataclasses.replace(plan, moe_ep_overlap=True), cluster, slow).tp_comm_s == \
        pytest.approx(comm / 4 + 3 / 4 * paired, rel=1e-9)
    # Interleaved pipeline (pp 2, vp 2, ep 4, 8 micro-batches): megatron's warm-up runs (2 - 1) x 2 + (2 - 1) x 2 + 1
    # = 5 of the 16 chunk forwards unpaired, and the flush as many backwards.
    piped = dataclasses.replace(plan, pp=2, vp=2, ep=4, dp=4, gbs=32, moe_ep_overlap=True)
    assert piped.num_microbatches == 8
    assert ep_unpaired_share(piped) == pytest.approx(5 / 16)
    assert ep_unpaired_share(dataclasses.replace(piped, moe_ep_overlap=False)) is None


def test_the_flex_dispatcher_crosses_the_nics_once_per_destination_node():
    # Qwen3-30B-A3B (128 experts, top 8, hidden 2048) over ep 16 on two 8-GPU H100 nodes, 4,096 tokens per rank in
    # bf16. megatron's all-to-all sends each of a token's 8 copies to its expert's GPU: 8/16 of them to the other
    # node. DeepEP sends a token once to each other node holding one of its experts.
    import itertools
    from math import comb

    cluster = resolve_cluster("dgx-h100")
    cal = calibration_for("h100-sxm")
    token_bytes = 2 * 4096 * 2048
    ib = cluster.ib_gbyte_per_s_per_gpu * cal.ib_efficiency * 1e9
    latency = cal.collective_latency_s * 5  # (1 + log2 16)
    # The expected number of other nodes reached, counted over every set of 8 distinct experts of 16 (8 per node)
    # for a small check, then in closed form for 128: P(a node has none) = C(E - E/2, k) / C(E, k).
    sets = list(itertools.combinations(range(16), 8))
    assert sum(any(e >= 8 for e in s) for s in sets) / len(sets) == pytest.approx(1 - comb(8, 8) / comb(16, 8))
    other_nodes = 1 - comb(64, 8) / comb(128, 8)  # ~0.9966: almost every token reaches the other node once
    flex = _flex_all_to_all_s(cluster, cal, token_bytes, 8, 128, 16, 1)
    assert flex == pytest.approx(max(token_bytes * 8 * 15 / 16 / (cluster.nvlink_gbyte_per_s_one_way
                                                                  * cal.nvlink_efficiency * 1e9),
                                     token_bytes * other_nodes / ib) + latency, rel=1e-9)
    # megatron's alltoall dispatcher: NCCL's all-to-all, at its share of the link rates (nccl_all_to_all_efficiency)
    nccl = cal.nccl_all_to_all_efficiency
    plain = _all_to_all_s(cluster, cal, token_bytes * 8, 16, 1)
    assert plain == pytest.approx(max(token_bytes * 8 * 7 / 16 / (cluster.nvlink_gbyte_per_s_one_way
                                                                  * cal.nvlink_efficiency * nccl * 1e9),
                                      token_bytes * 8 * 8 / 16 / (ib * nccl)) + latency, rel=1e-9)
    # 4 copies over the NICs against ~1: the NICs still bind (NVLink carries 7.5 copies at ~8x their bandwidth)
    assert token_bytes * other_nodes / ib > token_bytes * 7.5 / (cluster.nvlink_gbyte_per_s_one_way
                                                                 * cal.nvlink_efficiency * 1e9)
    assert 3.4 / nccl < plain / flex < 4 / nccl  # the latency term does not scale with the rate
    # Inside one NVLink domain (ep 8 on a node, or any EP on a GB200 NVL72 rack) DeepEP's kernels move the plain
    # all-to-all's bytes, at the ring collectives' link rates.
    assert _flex_all_to_all_s(cluster, cal, token_bytes, 8, 128, 8, 1) == _all_to_all_s(
        cluster, cal, token_bytes * 8, 8, 1, nccl=False)
    nvl72 = resolve_cluster("gb200-nvl72")
    gb = calibration_for("gb200")
    assert _flex_all_to_all_s(nvl72, gb, token_bytes, 8, 128, 64, 1) == _all_to_all_s(
        nvl72, gb, token_bytes * 8, 64, 1, nccl=False)
    # Through the layer: the plan field chooses it; dispatch and combine, forward and backward. HybridEP's RDMA path
    # sends a token once per other node too (DeepEP hybrid-ep docs/Hybrid-EP_Implementation.md).
    model, _ = resolve_model("qwen3-30b-a3b")
    plan = ParallelPlan(framework="megatron", ep=16, dp=16, mbs=1, gbs=64, seq_length=4096)
    alltoall = layer_time(model, plan, cluster, cal)
    deep = layer_time(model, dataclasses.replace(plan, moe_dispatcher="deepep"), cluster, cal)
    hybrid = layer_time(model, dataclasses.replace(plan, moe_dispatcher="hybridep"), cluster, cal)
    assert alltoall.tp_comm_s == pytest.approx(4 * plain, rel=1e-9)
    assert deep.tp_comm_s == pytest.approx(4 * flex, rel=1e-9)
    assert hybrid.tp_comm_s == deep.tp_comm_s
    assert (deep.fwd_s, deep.bwd_s) == (alltoall.fwd_s, alltoall.bwd_s)



def test_contiguous_routing_reaches_fewer_ranks_and_nodes():
    # NeMo AutoModel's FakeBalancedGate (no noise): token i takes experts i k .. i k + k - 1 mod E. Qwen3-30B-A3B
    # (128 experts, top 8) at ep 8 holds 16 experts per rank: every token reaches one rank, against ~5.3 under random
    # draws; DeepSeek-V3 (256, top 8) at ep 64: two ranks, one node of the 8.
    from math import comb
    assert groups_reached(8, 128, 8, "contiguous") == 1.0
    assert groups_reached(8, 128, 8) == pytest.approx(8 * (1 - comb(112, 8) / comb(128, 8)), rel=1e-9)
    assert groups_reached(8, 256, 64, "contiguous") == 2.0
    assert groups_reached(8, 256, 8, "contiguous") == 1.0
    assert groups_reached(6, 128, 8, "contiguous") == pytest.approx(1.25)  # 6 of 16 straddle a rank boundary
    cluster = resolve_cluster("dgx-h100")
    cal = calibration_for("h100-sxm")
    token_bytes = 2 * 4096 * 2048
    # Inside a node: the random pricing's all-to-all of k copies, scaled by the ranks reached over random's.
    assert _flex_all_to_all_s(cluster, cal, token_bytes, 8, 128, 8, 1, "contiguous") == pytest.approx(
        _all_to_all_s(cluster, cal, token_bytes * 8 / groups_reached(8, 128, 8), 8, 1, nccl=False), rel=1e-12)
    # Random routing is priced as before (the calibration's fit).
    assert _flex_all_to_all_s(cluster, cal, token_bytes, 8, 128, 16, 1, "random") == \
        _flex_all_to_all_s(cluster, cal, token_bytes, 8, 128, 16, 1)
    # Through the layer: the plan field; megatron's alltoall dispatcher sends a copy per expert either way.
    model, _ = resolve_model("qwen3-30b-a3b")
    plan = ParallelPlan(framework="megatron", ep=64, dp=64, mbs=1, gbs=64, seq_length=4096, moe_dispatcher="deepep")
    random_ = layer_time(model, plan, cluster, cal)
    contiguous = layer_time(model, dataclasses.replace(plan, moe_routing="contiguous"), cluster, cal)
    assert contiguous.tp_comm_s < random_.tp_comm_s / 3
    plain = dataclasses.replace(plan, moe_dispatcher="alltoall")
    assert layer_time(model, plain, cluster, cal).tp_comm_s == \
        layer_time(model, dataclasses.replace(plain, moe_routing="contiguous"), cluster, cal).tp_comm_s
    with pytest.raises(ValueError):
        dataclasses.replace(plan, moe_routing="round-robin")

def test_tp_backward_overlaps_the_column_parallel_collectives_with_independent_gemms():
    # Llama 3 70B, tp 8 with sequence parallelism on a DGX H100, no userbuffers. Forward: two all-gathers and two
    # reduce-scatters in line (4 x one). Backward (megatron-core / TE Linear): the two row-parallel layers
    # all-gather their output gradient before any GEMM (2 x one, exposed); the two column-parallel layers' input
    # all-gather runs under their data-gradient GEMM and their gradient's reduce-scatter under the weight-gradient
    # GEMM: each costs what outlasts its GEMM plus tp_overlap_exposed of the rest.
    model, _ = resolve_model("llama3-70b")
    cluster = resolve_cluster("dgx-h100")
    cal = dataclasses.replace(calibration_for("h100-sxm"), collective_latency_s=0.0)
    plan = ParallelPlan(framework="megatron", tp=8, dp=1, mbs=1, gbs=1, seq_length=8192, zero_stage=0,
                        sequence_parallel=True, tp_comm_overlap=False)
    n, h, t = 8192, model.hidden_size, 8
    one = (t - 1) / t * 2 * n * h / (cluster.nvlink_gbyte_per_s_one_way * 1e9 * cal.nvlink_efficiency)
    qkv_b = linear_s(cluster.gpu, cal, n, (model.query_width + 2 * model.kv_width) // t, h, "bf16")[1]
    fc1_b = linear_s(cluster.gpu, cal, n, 2 * model.ffn_hidden_size // t, h, "bf16")[1]
    hidden = sum(max(0.0, one - g) + cal.tp_overlap_exposed * min(one, g) for g in (qkv_b / 2,) * 2 + (fc1_b / 2,) * 2)
    layer = layer_time(model, plan, cluster, cal)
    assert layer.tp_fwd_comm_s == pytest.approx(4 * one, rel=1e-9)
    assert layer.tp_comm_s == pytest.approx(4 * one + 2 * one + hidden, rel=1e-9)
    assert layer.tp_comm_s < 8 * one  # less than the forward's collectives twice over
    # With userbuffers (--tp-comm-overlap) both passes keep tp_overlap_exposed of their collectives.
    overlapped = layer_time(model, dataclasses.replace(plan, tp_comm_overlap=True), cluster, cal)
    assert overlapped.tp_comm_s == pytest.approx(8 * one * cal.tp_overlap_exposed, rel=1e-9)
    # PyTorch's DTensor TP (torchtitan without async TP) runs the backward's collectives in line.
    fsdp = dataclasses.replace(plan, framework="fsdp", zero_stage=3)
    assert layer_time(model, fsdp, cluster, cal).tp_comm_s == pytest.approx(8 * one, rel=1e-9)


# --- the stacks' own kernels -----------------------------------------------------------------------------

@pytest.mark.parametrize("gpu, flash2", [("h100-sxm", 0.53), ("a100-80gb", 1.0)])
def test_the_attention_kernel_scales_the_flash_attention_time(gpu, flash2):
    """cuDNN's fused attention is the kernel tables' rate; FlashAttention-2 runs at flash2_attention_factor of it
    (0.53 on Hopper, measured on an H200: benchmarks/results/eager_elementwise_h200.md; 1 on Ampere, whose
    efficiencies are FlashAttention-2's), and Triton's flash
    attention at triton_attention_factor (0.6, Dao 2023) of FlashAttention-2. A long sequence, so that attention is
    what the time difference is."""
    from genconf.plan.cost import implementation

    model = dataclasses.replace(resolve_model("llama3-8b")[0], seq_length=32768)
    cluster = resolve_cluster("dgx-h100" if gpu.startswith("h100") else "dgx-a100")
    cal = calibration_for(gpu)
    assert cal.flash2_attention_factor == flash2 and cal.triton_attention_factor == 0.6
    plan = ParallelPlan(framework="fsdp", dp=8, mbs=1, gbs=8, seq_length=32768, zero_stage=3)
    assert implementation(plan) == "torch-bf16"
    attn = {k: layer_time(model, dataclasses.replace(plan, attention_kernel=k), cluster, cal).attn_fwd_s
            for k in ("auto", "cudnn", "flash2", "triton")}
    assert attn["auto"] == attn["cudnn"]
    assert attn["flash2"] == pytest.approx(attn["cudnn"] / flash2, rel=0.02)  # the per-wave overheads are not scaled
    assert attn["triton"] == pytest.approx(attn["flash2"] / 0.6, rel=0.02)
    # The H200 measurement the Hopper factor comes from (benchmarks/results/eager_elementwise_h200.json): cuDNN / flash
    # of forward + backward at head dim 128, 2K-32K tokens.
    if gpu.startswith("h100"):
        import json
        from pathlib import Path

        sweep = json.loads((Path(__file__).resolve().parents[2] / "benchmarks/results/eager_elementwise_h200.json")
                           .read_text())["attention"]
        d128 = [row for row in sweep.values() if row["head_dim"] == 128]
        assert len(d128) == 3
        for row in d128:
            ms = {k: row[k]["fwd_ms"] + row[k]["bwd_ms"] for k in ("cudnn", "flash")}
            assert ms["cudnn"] / ms["flash"] == pytest.approx(flash2, abs=0.025)


def test_sharded_fsdp_runs_the_bf16_model_and_ddp_the_autocast_one():
    """genconf's FSDP runner (as OLMo's and Composer's) gathers bf16 weights under FULL_SHARD / SHARD_GRAD_OP
    (MixedPrecision(param_dtype=bf16)): the same eager bf16 model as DeepSpeed's; DDP (NO_SHARD) keeps fp32 weights
    and runs under autocast, casting them every micro-batch with fp32 norms and residual stream."""
    from genconf.plan.cost import ELEMENTWISE_PASSES, implementation

    base = ParallelPlan(framework="fsdp", dp=8, mbs=1, gbs=8)
    assert implementation(dataclasses.replace(base, zero_stage=3)) == "torch-bf16"
    assert implementation(dataclasses.replace(base, zero_stage=2)) == "torch-bf16"
    assert implementation(dataclasses.replace(base, zero_stage=0)) == "torch-autocast"
    assert implementation(dataclasses.replace(base, zero_stage=0, precision="fp32")) == "torch-bf16"
    assert ELEMENTWISE_PASSES["torch-autocast"] > ELEMENTWISE_PASSES["torch-bf16"]


def test_the_fused_loss_reads_the_logits_once_each_way():
    """flash-attn's fused cross entropy moves 6 bytes per logit (read forward; read and write the gradient
    backward) where F.cross_entropy(logits.float()) is priced at 24: the output layer's time falls by 18 bytes per
    logit at the GPU's HBM rate."""
    from genconf.plan.cost import _logits_s, _mem_s

    model = resolve_model("gpt3-125m")[0]
    cluster, cal = resolve_cluster("dgx-h100"), calibration_for("h100-sxm")
    plan = ParallelPlan(framework="fsdp", dp=8, mbs=8, gbs=64, seq_length=2048, zero_stage=3)
    n = 8 * 2048
    saved = _logits_s(model, plan, cluster, cal) - _logits_s(model, dataclasses.replace(plan, fused_loss=True),
                                                               cluster, cal)
    rows = 50304  # genconf's own model pads GPT-2's 50,257 rows to a multiple of 128
    assert saved == pytest.approx(_mem_s(cluster.gpu, cal, 24.0 * n * rows) - _mem_s(cluster.gpu, cal, 6.0 * n * rows))


def test_biased_experts_and_a_clamped_glu_cost_their_measured_bytes():
    # GPT-OSS 120B at tp 1, ep 8, micro-batch 1 x 4,096 on an H200: each rank's 16 experts receive 4,096 x 4 routes =
    # 16,384 rows. Its per-expert output bias costs EXPERT_BIAS_BYTES per element of the experts' output (16,384 x
    # 2,880) and its clamps CLAMP_BYTES per element of fc1's output (16,384 x 5,760), forward and backward, at the
    # HBM rate the other memory-bound passes get; selective recompute of moe_act repeats the clamps' forward too.
    from genconf.plan.cost import CLAMP_BYTES, EXPERT_BIAS_BYTES, _mem_s

    oss, _ = resolve_model("gpt-oss-120b")
    cluster = resolve_cluster(gpu="h200")
    cal = calibration_for("h200")
    plan = ParallelPlan(framework="megatron", ep=8, dp=8, mbs=1, gbs=64, seq_length=4096)
    plain = dataclasses.replace(oss, add_bias_linear=False, activation_clamp=None)
    clamped = dataclasses.replace(oss, add_bias_linear=False)
    biased = dataclasses.replace(oss, activation_clamp=None)
    base = layer_time(plain, plan, cluster, cal)
    rows = 4096 * 4
    for model, per_element, elements in ((biased, EXPERT_BIAS_BYTES, rows * 2880), (clamped, CLAMP_BYTES, rows * 5760)):
        lt = layer_time(model, plan, cluster, cal)
        assert lt.fwd_s - base.fwd_s == pytest.approx(_mem_s(cluster.gpu, cal, per_element[0] * elements), rel=1e-9)
        assert lt.bwd_s - base.bwd_s == pytest.approx(_mem_s(cluster.gpu, cal, per_element[1] * elements), rel=1e-9)
    clamp_fwd = _mem_s(cluster.gpu, cal, CLAMP_BYTES[0] * rows * 5760)
    assert layer_time(clamped, plan, cluster, cal).recompute_s(("moe_act",)) - base.recompute_s(("moe_act",)) == \
        pytest.approx(clamp_fwd, rel=1e-9)
    # The H200 measurement they come from (benchmarks/results/moe_layer_h200.md): GPT-OSS's bias 0.609 / 1.125 ms, its
    # activation 0.428 / 1.008 ms against 0.068 / 0.271 ms with the clamp off.
    for per_element, elements, measured_ms in ((EXPERT_BIAS_BYTES, rows * 2880, (0.609, 1.125)),
                                               (CLAMP_BYTES, rows * 5760, (0.428 - 0.068, 1.008 - 0.271))):
        for b, ms in zip(per_element, measured_ms):
            assert 1e3 * _mem_s(cluster.gpu, cal, b * elements) == pytest.approx(ms, rel=0.01)
    # Experts split over 2 tensor-parallel ranks (etp = tp = 2, sequence parallel): each rank holds half of fc1's output
    # columns for the same 16,384 routed rows, so half the clamp's bytes; fc2's output (and its bias) is full width.
    split = dataclasses.replace(plan, tp=2, dp=4, sequence_parallel=True)
    base2 = layer_time(plain, split, cluster, cal)
    clamp2 = layer_time(clamped, split, cluster, cal).fwd_s - base2.fwd_s
    bias2 = layer_time(biased, split, cluster, cal).fwd_s - base2.fwd_s
    assert clamp2 == pytest.approx(_mem_s(cluster.gpu, cal, CLAMP_BYTES[0] * rows * 5760 / 2), rel=1e-9)
    assert bias2 == pytest.approx(_mem_s(cluster.gpu, cal, EXPERT_BIAS_BYTES[0] * rows * 2880), rel=1e-9)
    # A dense layer's biases ride in its GEMMs' epilogues: only the experts' per-expert bias is priced.
    gpt, _ = resolve_model("gpt3-1.3b")
    dense = ParallelPlan(framework="megatron", dp=8, mbs=1, gbs=8)
    assert gpt.add_bias_linear
    assert layer_time(gpt, dense, cluster, cal) == layer_time(dataclasses.replace(gpt, add_bias_linear=False), dense,
                                                              cluster, cal)


def test_a_clamp_needs_a_gated_mlp():
    gpt, _ = resolve_model("gpt3-1.3b")
    with pytest.raises(ValueError, match="activation_clamp clamps a gated MLP"):
        dataclasses.replace(gpt, activation_clamp=7.0)
    oss, _ = resolve_model("gpt-oss-120b")
    assert oss.activation_clamp == 7.0
    for bad in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="activation_clamp must be a positive number"):
            dataclasses.replace(oss, activation_clamp=bad)


def test_eager_pytorch_prices_each_element_wise_piece_as_measured():
    """Under sharded FSDP (eager PyTorch, bf16) each element-wise piece costs its EAGER_BYTES per element, measured on
    an H200 (benchmarks/results/eager_elementwise_h200.md): RoPE per element of q and k (rotary models only, as under
    Transformer Engine), dropout per element of h in each half, a linear layer's bias per output element."""
    import json
    from pathlib import Path

    from genconf.plan.cost import EAGER_BYTES, ELEMENTWISE_PASSES, _mem_s

    cluster, cal = resolve_cluster("dgx-h100"), calibration_for("h100-sxm")
    rotary = dataclasses.replace(resolve_model("llama3-8b")[0], seq_length=2048)
    learned = dataclasses.replace(rotary, position_embedding="learned")
    plan = ParallelPlan(framework="fsdp", dp=8, mbs=2, gbs=16, seq_length=2048, zero_stage=3)
    n, h, q, kv = 2 * 2048, rotary.hidden_size, rotary.query_width, rotary.kv_width

    def diff(a, b, p=plan):
        la, lb = layer_time(a, p, cluster, cal), layer_time(b, p, cluster, cal)
        return la.fwd_s - lb.fwd_s, la.bwd_s - lb.bwd_s
    rope = diff(rotary, learned)
    for i in (0, 1):
        assert rope[i] == pytest.approx(_mem_s(cluster.gpu, cal, EAGER_BYTES["rope"][i] * n * (q + kv)), rel=1e-9)
    # Transformer Engine's fused RoPE: one read and one write of q and k in bf16, twice that backward.
    te = ParallelPlan(framework="megatron", dp=8, mbs=2, gbs=16, seq_length=2048)
    te_rope = diff(rotary, learned, te)
    assert te_rope[0] == pytest.approx(_mem_s(cluster.gpu, cal, ELEMENTWISE_PASSES["megatron-te"] * 4 * n * (q + kv)))
    assert te_rope[1] == pytest.approx(2 * te_rope[0])
    dropout = diff(dataclasses.replace(learned, hidden_dropout=0.1), learned)
    for i in (0, 1):
        assert dropout[i] == pytest.approx(_mem_s(cluster.gpu, cal, EAGER_BYTES["dropout"][i] * 2 * n * h), rel=1e-9)
    biased = dataclasses.replace(learned, add_bias_linear=True)
    assert biased.qkv_bias
    bias = diff(biased, learned)
    widths = (q + 2 * kv) + h + 2 * rotary.ffn_hidden_size + h  # QKV, proj, fc1 (gated: two halves), fc2
    for i in (0, 1):
        assert bias[i] == pytest.approx(_mem_s(cluster.gpu, cal, EAGER_BYTES["bias"][i] * n * widths), rel=1e-9)
    # DDP under autocast keeps the norms and residual stream in fp32: twice their bytes.
    ddp = dataclasses.replace(plan, zero_stage=0)
    norm_add = [EAGER_BYTES["rmsnorm"][i] + EAGER_BYTES["add"][i] for i in (0, 1)]
    eager = layer_time(learned, plan, cluster, cal)
    autocast = layer_time(learned, ddp, cluster, cal)
    assert autocast.fwd_s - eager.fwd_s == pytest.approx(_mem_s(cluster.gpu, cal, norm_add[0] * 2 * n * h), rel=1e-9)
    # The constants are the measurement's: each piece within 10% of both measured shapes, at the run's own HBM rate.
    data = json.loads((Path(__file__).resolve().parents[2] / "benchmarks/results/eager_elementwise_h200.json")
                      .read_text())
    for shape in data["shapes"].values():
        rate = shape["pieces"]["hbm"]["tbyte_per_s"] * 1e12
        width = {"h": shape["hidden"], "f": shape["ffn"], "qk": 2 * shape["heads"] * shape["head_dim"]}
        for piece, w in (("layernorm", "h"), ("rmsnorm", "h"), ("gelu", "f"), ("swiglu", "f"), ("rope", "qk"),
                         ("dropout", "h")):
            t = shape["pieces"][piece]
            for i, key in enumerate(("fwd_ms", "bwd_ms")):
                measured = t[key] * 1e-3 * rate / (shape["tokens"] * width[w])
                assert EAGER_BYTES[piece][i] == pytest.approx(measured, rel=0.1), (piece, key)
        add_fwd = shape["pieces"]["add"]["fwd_ms"] * 1e-3 * rate / (shape["tokens"] * shape["hidden"])
        assert EAGER_BYTES["add"] == (pytest.approx(add_fwd, rel=0.1),) * 2  # the gradient join: the same add
        bias_bwd = shape["pieces"]["bias"]["bwd_ms"] * 1e-3 * rate / (shape["tokens"] * shape["hidden"])
        assert EAGER_BYTES["bias"][1] == pytest.approx(bias_bwd, rel=0.1)


@pytest.mark.parametrize("name", ["llama3-8b", "gpt3-1.3b"])
def test_an_eager_layer_s_element_wise_work_is_the_sum_of_its_pieces(name):
    """The whole of _eager_elementwise_s against a sum written out piece by piece: two norms and two residual adds over
    h, the model's norm kind and activation (RMSNorm and the chunked SwiGLU for Llama 3, LayerNorm and GELU for GPT-3),
    RoPE over q and k where rotary, each biased linear's output, dropout in each half where set; the attention half
    alone (a hybrid model's '*' layer) is its share; autocast doubles the norms and adds, backward too."""
    from genconf.plan.cost import EAGER_BYTES, _eager_elementwise_s, _mem_s

    model = resolve_model(name)[0]
    cluster, cal = resolve_cluster("dgx-h100"), calibration_for("h100-sxm")
    gpu, n = cluster.gpu, 4096
    h, q, kv, f = model.hidden_size, model.query_width, model.kv_width, model.ffn_hidden_size
    norm = EAGER_BYTES["rmsnorm" if model.normalization == "rmsnorm" else "layernorm"]
    act = EAGER_BYTES["swiglu" if model.gated else "gelu"]
    assert (model.normalization, model.gated, model.position_embedding) == (
        ("rmsnorm", True, "rope") if name == "llama3-8b" else ("layernorm", False, "learned"))
    drop = EAGER_BYTES["dropout"] if model.hidden_dropout > 0 else (0.0, 0.0)
    bias_widths = ((q + 2 * kv) * model.qkv_bias + h * model.add_bias_linear,
                   ((2 if model.gated else 1) * f + h) * model.add_bias_linear)

    def half(i, stream=1.0):
        return stream * (norm[i] + EAGER_BYTES["add"][i]) * h + drop[i] * h
    for i in (0, 1):
        attn = half(i) + (EAGER_BYTES["rope"][i] * (q + kv) if model.position_embedding == "rope" else 0.0) \
            + EAGER_BYTES["bias"][i] * bias_widths[0]
        mlp = half(i) + act[i] * f + EAGER_BYTES["bias"][i] * bias_widths[1]
        whole = _eager_elementwise_s(model, 1, 1, n, 1.0, 1.0, "torch-bf16", gpu, cal)[i]
        assert whole == pytest.approx(_mem_s(gpu, cal, n * (attn + mlp)), rel=1e-12)
        assert _eager_elementwise_s(model, 1, 1, n, 1.0, 0.0, "torch-bf16", gpu, cal)[i] == pytest.approx(
            _mem_s(gpu, cal, n * attn), rel=1e-12)
        autocast = _eager_elementwise_s(model, 1, 1, n, 1.0, 1.0, "torch-autocast", gpu, cal)[i]
        assert autocast - whole == pytest.approx(_mem_s(gpu, cal, n * 2 * (half(i, 2.0) - half(i))), rel=1e-9)


def test_misaligned_head_dims_slow_the_unfused_attention_gemms():
    """BLOOM-prototype 20B (hidden 14,400, 32 heads: head dim 450, not a multiple of 8 16-bit elements) under
    megatron's unfused attention: QK^T and AV cost their aligned time times the slowdown measured on an H200
    (results/misaligned_gemm_h200.md); the softmax's traffic does not change, and 448 is aligned."""
    cluster = resolve_cluster("dgx-a100")
    cal = calibration_for(cluster.gpu.name)
    plan = ParallelPlan(framework="megatron", tp=8, dp=1, mbs=1, gbs=1, seq_length=2048, layer_spec="local",
                        fused_kernels=True)
    model = dataclasses.replace(resolve_model("gpt3-13b")[0], hidden_size=14400, num_attention_heads=32,
                                num_query_groups=32, ffn_hidden_size=4 * 14400, kv_channels=450)
    flat = dataclasses.replace(cal, misaligned_attention_gemm_slowdown=(1.0, 1.0))
    slow, even = layer_time(model, plan, cluster, cal), layer_time(model, plan, cluster, flat)
    rows = 1 * 4 * 2048  # micro-batch x heads per GPU x queries
    qk_f, qk_b = linear_s(cluster.gpu, cal, rows, 2048, 450, "bf16")
    av_f, av_b = linear_s(cluster.gpu, cal, rows, 450, 2048, "bf16")
    f, b = cal.misaligned_attention_gemm_slowdown
    assert slow.attn_fwd_s - even.attn_fwd_s == pytest.approx((f - 1) * (qk_f + av_f))
    assert slow.bwd_s - even.bwd_s == pytest.approx((b - 1) * (qk_b + av_b))
    aligned = dataclasses.replace(model, hidden_size=14336, ffn_hidden_size=4 * 14336, kv_channels=448)
    assert layer_time(aligned, plan, cluster, cal) == layer_time(aligned, plan, cluster, flat)
    # Transformer Engine's flash and cuDNN attention do not take a head dim of 450 (not a multiple of 8): its unfused
    # attention runs the same misaligned GEMMs, with TE's fused softmax (megatron's fused scores' traffic), and keeps
    # the scores for backward where flash attention keeps none.
    te = dataclasses.replace(plan, layer_spec="te", fused_kernels=False)
    slow_te, even_te = layer_time(model, te, cluster, cal), layer_time(model, te, cluster, flat)
    assert slow_te.attn_fwd_s - even_te.attn_fwd_s == pytest.approx((f - 1) * (qk_f + av_f))
    assert slow_te.attn_fwd_s == pytest.approx(slow.attn_fwd_s)
    from genconf.plan.memory import layer_activation_terms

    names = {name for name, _ in layer_activation_terms(model, te)}
    assert "flash attention q" not in names and any("softmax" in name for name in names), names
    # 448 is aligned but beyond the fused kernels' 256: unfused at the aligned rate; GPT-3 13B's 128 runs flash.
    assert slow_te.attn_fwd_s > layer_time(aligned, te, cluster, cal).attn_fwd_s
    assert "flash attention q" not in {name for name, _ in layer_activation_terms(aligned, te)}
    assert "flash attention q" in {name for name, _ in layer_activation_terms(resolve_model("gpt3-13b")[0], te)}


def test_pytorch_sdpa_at_misaligned_head_dims():
    """genconf's own model (FSDP, DeepSpeed; eager or compiled) runs PyTorch's SDPA. On an H200 with torch 2.11
    (results/misaligned_gemm_h200.md, 2,048 tokens): flash attention took head dims 150 and 108 (padded to a multiple
    of 8; per FLOP x2.93 / x3.18 forward against 144 and 112), memory-efficient attention 448, and only the math
    backend 450 (fp32 GEMMs on the CUDA cores: 1.00 ms forward for 4 heads). The predictions come within 15% of
    those; megatron's plans and Megatron-DeepSpeed's (fused kernels) are priced as before."""
    from genconf.plan.kernels import sdpa_fused_supported
    from genconf.plan.memory import layer_activation_terms

    assert [sdpa_fused_supported(d) for d in (64, 108, 128, 150, 256, 448, 450)] == [True] * 6 + [False]
    assert not sdpa_fused_supported(448, gqa=True)  # the memory-efficient kernel takes no enable_gqa
    cluster = resolve_cluster("hgx-h200")
    cal = calibration_for(cluster.gpu.name)
    flat = dataclasses.replace(cal, misaligned_attention_gemm_slowdown=(1.0, 1.0))
    plan = ParallelPlan(framework="fsdp", dp=8, mbs=1, gbs=8, seq_length=2048, zero_stage=3)
    base = resolve_model("gpt3-13b")[0]

    def with_head_dim(dim: int, heads: int, groups: int | None = None):
        return dataclasses.replace(base, hidden_size=dim * heads, num_attention_heads=heads,
                                   num_query_groups=groups or heads, ffn_hidden_size=4 * dim * heads, kv_channels=dim)

    def attention_fwd_s(model, p=plan, c=cal) -> float:
        return layer_time(model, p, cluster, c).attn_fwd_s

    padded = with_head_dim(150, 12)
    # Flash at a padded head dim: the measured slowdown per FLOP against the aligned neighbour.
    for dim, aligned, heads, measured in ((150, 144, 12, 2.93), (108, 112, 128, 3.18)):
        per_flop = attention_fwd_s(with_head_dim(dim, heads)) / attention_fwd_s(with_head_dim(aligned, heads))
        assert per_flop / (dim / aligned) == pytest.approx(measured, rel=0.15), dim
        names = {name for name, _ in layer_activation_terms(with_head_dim(dim, heads), plan)}
        assert "flash attention q" in names and not any("softmax output" in name for name in names), names
    assert attention_fwd_s(with_head_dim(144, 12)) == attention_fwd_s(with_head_dim(144, 12), c=flat)
    # The math backend at 450: fp32 CUDA-core GEMMs, no tensor-core alignment penalty, fp32 copies and scores kept.
    math_only = with_head_dim(450, 4)
    assert attention_fwd_s(math_only) == attention_fwd_s(math_only, c=flat)
    assert attention_fwd_s(math_only) == pytest.approx(1.00e-3, rel=0.15)
    names = {name for name, _ in layer_activation_terms(math_only, plan)}
    assert "flash attention q" not in names and "softmax output (fp32, SDPA math)" in names, names
    # 448 with grouped-query attention: math as well (priced and counted so); without it, memory-efficient attention
    # (measured 0.225 ms forward for 4 heads), keeping no scores.
    gqa = {name for name, _ in layer_activation_terms(with_head_dim(448, 4, groups=2), plan)}
    assert "softmax output (fp32, SDPA math)" in gqa
    assert "flash attention q" in {name for name, _ in layer_activation_terms(with_head_dim(448, 4), plan)}
    assert attention_fwd_s(with_head_dim(448, 4)) == pytest.approx(0.225e-3, rel=0.15)
    # The layer spec is megatron's: genconf's model runs SDPA whatever a plan says of it; pinning the math backend
    # (--attention-kernel math, what a CPU runs under dropout) keeps the fp32 scores at any head dim.
    local = dataclasses.replace(plan, layer_spec="local")
    assert layer_activation_terms(padded, local) == layer_activation_terms(padded, plan)
    pinned = {name for name, _ in layer_activation_terms(with_head_dim(128, 12), dataclasses.replace(
        plan, attention_kernel="math"))}
    assert "softmax output (fp32, SDPA math)" in pinned
    # DeepSpeed and compiled plans run the same SDPA; megatron's and Megatron-DeepSpeed's attention is not SDPA.
    for own in (dataclasses.replace(plan, framework="deepspeed", zero_stage=1),
                dataclasses.replace(plan, torch_compile=True)):
        assert attention_fwd_s(padded, p=own) > attention_fwd_s(padded, p=own, c=flat)
    for other in (ParallelPlan(framework="megatron", dp=8, mbs=1, gbs=8, seq_length=2048, layer_spec="local"),
                  ParallelPlan(framework="deepspeed", dp=8, mbs=1, gbs=8, seq_length=2048, zero_stage=1,
                               layer_spec="local", fused_kernels=True)):
        names = {name for name, _ in layer_activation_terms(padded, other)}
        assert "flash attention q" not in names and not any("SDPA" in name for name in names), names


def test_q_and_k_norms_cost_a_norm_over_q_and_k():
    """OLMo's attention_layer_norm (the Kempner 1B: LayerNorm over the full q and k widths, 2,048 each): eager PyTorch
    runs the layer's norm kernel over q and k (fp32 under autocast, twice the bf16 bytes); fused stacks read and write
    q and k once more, the same count as RoPE's pass."""
    from genconf.plan.cost import ELEMENTWISE_PASSES, EAGER_BYTES, _eager_elementwise_s, _mem_s

    model = resolve_model("kempner-olmo-1b")[0]
    plain = dataclasses.replace(model, qk_layernorm=False)
    cluster, cal = resolve_cluster("dgx-h100"), calibration_for("h100-sxm")
    gpu, n, qk = cluster.gpu, 4096, model.query_width + model.kv_width
    for impl, stream in (("torch-bf16", 1.0), ("torch-autocast", 2.0)):
        for i in (0, 1):
            extra = (_eager_elementwise_s(model, 1, 1, n, 1.0, 1.0, impl, gpu, cal)[i]
                     - _eager_elementwise_s(plain, 1, 1, n, 1.0, 1.0, impl, gpu, cal)[i])
            # _mem_s is linear in bytes: the difference of the two layers is the norm's bytes over q and k
            assert extra == pytest.approx(_mem_s(gpu, cal, n * stream * EAGER_BYTES["layernorm"][i] * qk), rel=1e-9)
    plan = ParallelPlan(framework="megatron", dp=8, mbs=1, gbs=8, seq_length=2048)
    fused = layer_time(model, plan, cluster, cal).fwd_s - layer_time(plain, plan, cluster, cal).fwd_s
    passes = ELEMENTWISE_PASSES["megatron-te"]
    assert fused == pytest.approx(_mem_s(gpu, cal, passes * 2048 * 2 * 2 * qk), rel=1e-9)


def test_recomputed_forwards_widen_the_window_that_hides_sharded_communication():
    # torchtitan's Llama 3.1 405B FP8 on 128 H100s (tp8 x FSDP16, full activation checkpointing), local batch 1:
    # every micro-batch all-gathers each layer's weights twice and reduce-scatters its gradients, behind the
    # forward and the backward. The recomputed forward runs inside each layer's backward, so the collectives hide
    # behind it too: the exposed time drops by the overlap efficiency x the recompute time, while still exposed.
    model, _ = resolve_model("llama3.1-405b")
    cluster = resolve_cluster("grand-teton-h100")
    cal = calibration_for(cluster.gpu.name)
    full = ParallelPlan(framework="fsdp", tp=8, dp=16, mbs=1, gbs=16, seq_length=8192, zero_stage=3,
                        precision="fp8", recompute="full", sequence_parallel=True)
    none = dataclasses.replace(full, recompute="none")
    with_recompute, without = step_cost(model, full, cluster, cal), step_cost(model, none, cluster, cal)
    assert with_recompute.recompute_s > 0 and without.dp_comm_s > cal.dp_overlap_efficiency * with_recompute.recompute_s
    assert without.dp_comm_s - with_recompute.dp_comm_s == pytest.approx(
        cal.dp_overlap_efficiency * with_recompute.recompute_s, rel=1e-9)


def test_pytorch_s_checkpoint_recomputes_each_layer_up_to_its_mlp_output_projection():
    # PyTorch's non-reentrant checkpoint (genconf's own model, torchtitan, Composer) stops once the layer's last saved
    # tensor, fc2's input, is rebuilt: fc2 and the eager residual add (EAGER_BYTES per element of n x h) are not run
    # again (tests/train/test_early_stop.py measures it). megatron-core's checkpoint reruns the whole layer, an FP8
    # linear (a custom autograd Function) saves its input only after its GEMM has run, and torch before 2.1 had no
    # early stop.
    from genconf.plan.cost import EAGER_BYTES, _mem_s
    model, _ = resolve_model("llama3-8b")
    cluster = resolve_cluster("dgx-h100")
    cal = calibration_for(cluster.gpu.name)
    plan = ParallelPlan(framework="fsdp", dp=8, mbs=1, gbs=8, seq_length=8192, zero_stage=3, recompute="full")
    layer = layer_time(model, plan, cluster, cal)
    n, h = 8192, model.hidden_size
    fc2_f, _ = linear_s(cluster.gpu, cal, n, h, model.ffn_hidden_size, "bf16")
    assert layer.early_stop_skip_s == pytest.approx(fc2_f + _mem_s(cluster.gpu, cal, n * EAGER_BYTES["add"][0] * h),
                                                    rel=1e-12)
    cost = step_cost(model, plan, cluster, cal)  # one micro-batch, every layer recomputed
    assert cost.recompute_s == pytest.approx(model.num_layers * (layer.fwd_s - layer.early_stop_skip_s), rel=1e-9)
    whole = dataclasses.replace(plan, framework="megatron", zero_stage=1)
    assert layer_time(model, whole, cluster, cal).early_stop_skip_s == 0.0
    assert step_cost(model, whole, cluster, cal).recompute_s == pytest.approx(
        model.num_layers * layer_time(model, whole, cluster, cal).fwd_s, rel=1e-9)
    assert layer_time(model, dataclasses.replace(plan, precision="fp8"), cluster, cal).early_stop_skip_s == 0.0
    assert layer_time(model, dataclasses.replace(plan, recompute="none"), cluster, cal).early_stop_skip_s == 0.0
    old_torch = dataclasses.replace(plan, checkpoint_early_stop=False)
    assert step_cost(model, old_torch, cluster, cal).recompute_s == pytest.approx(model.num_layers * layer.fwd_s,
                                                                                 rel=1e-9)


def test_a_sliding_window_never_costs_more_than_causal_attention():
    """Mistral 7B's 4,096-key window at sequences just past it, on Transformer Engine (the causal band) and on
    genconf's own model (chunks under a mask): no windowed layer is priced above the same layer attending causally
    to the whole sequence, and a window covering the sequence is priced as causal attention."""
    windowed = resolve_model("mistral-7b-v0.1")[0]
    full = dataclasses.replace(windowed, sliding_window=None)
    cluster = resolve_cluster("dgx-h100")
    cal = calibration_for("h100-sxm")
    for framework, zero in (("megatron", 1), ("fsdp", 3)):
        for seq in (4097, 4098, 5000, 8192, 32768):
            p = ParallelPlan(framework=framework, dp=8, mbs=1, gbs=8, seq_length=seq, zero_stage=zero)
            band = layer_time(windowed, p, cluster, cal, windowed=True)
            causal = layer_time(full, p, cluster, cal)
            if seq == 4097:
                assert band.attn_fwd_s == pytest.approx(causal.attn_fwd_s)
            if framework == "megatron":
                assert band.attn_fwd_s <= causal.attn_fwd_s * 1.0001, (framework, seq)
            elif seq >= 8192:  # the chunks compute window + chunk keys per query, masked or not
                assert band.attn_fwd_s < causal.attn_fwd_s, (framework, seq)


def test_unfused_attention_computes_every_score_under_a_window():
    """megatron-core's local spec builds the full scores and masks the band (dot_product_attention.py baddbmm over
    every key, FusedScaleMaskSoftmax with get_sliding_window_causal_mask): a windowed layer costs what a full one
    does there."""
    windowed = resolve_model("mistral-7b-v0.1")[0]
    full = dataclasses.replace(windowed, sliding_window=None)
    p = ParallelPlan(framework="megatron", dp=8, mbs=1, gbs=8, seq_length=8192, zero_stage=1, layer_spec="local")
    cluster, cal = resolve_cluster("dgx-h100"), calibration_for("h100-sxm")
    band = layer_time(windowed, p, cluster, cal, windowed=True)
    assert band.attn_fwd_s == pytest.approx(layer_time(full, p, cluster, cal).attn_fwd_s)


def _bridged_pairs():
    """8 H100 PCIe cards per node, NVLink bridges in pairs (clusters.yaml pcie-h100: NVLink 600 GB/s both ways, 300
    one way; PCIe Gen5 x16 64 GB/s one way; 200 Gb/s = 25 GB/s of NIC per GPU), links at full rate, no latency."""
    model, _ = resolve_model("llama3-8b")
    cluster = resolve_cluster("pcie-h100")
    cal = dataclasses.replace(calibration_for("h100-pcie"), nvlink_efficiency=1.0, ib_efficiency=1.0,
                              collective_latency_s=0.0)
    return model, cluster, cal


def test_a_bridged_pair_runs_tp_on_nvlink_and_the_node_s_dp_ring_on_pcie():
    model, cluster, cal = _bridged_pairs()
    assert (cluster.gpus_per_node, cluster.nvlink_domain, cluster.pcie_peer_gbyte_per_s_per_gpu) == (8, 2, 64)
    # TP=2 inside the pair, an all-gather of 64 MiB under sequence parallelism: (2-1)/2 x 2**26 bytes at 300 GB/s.
    assert _tp_collective_s(cluster, cal, 2, True, 2**26) == pytest.approx(0.5 * 2**26 / 300e9, rel=1e-12)
    # DP over the node's 8 GPUs (tp=1, 400M parameters reducing fp32 gradients, 1.6e9 bytes): the ring leaves the
    # pairs, so every hop that crosses one runs at PCIe's 64 GB/s: 2 x 7/8 x 1.6e9 / 64e9 = 0.04375 s, exposed in
    # full (no backward to hide behind), plus the last of the 10 buckets (1/10 of it again).
    params = 400_000_000
    dp8 = ParallelPlan(framework="megatron", tp=1, dp=8, mbs=1, gbs=8, seq_length=4096, zero_stage=0)
    ring = 2 * 7 / 8 * 4 * params / 64e9
    assert ring == pytest.approx(0.04375, rel=1e-12)
    assert _dp_comm_s(model, dp8, cluster, cal, params, 0, 0.0, 0.0) == pytest.approx(ring * 1.1, rel=1e-12)
    # tp=2 dp=4: one DP rank per pair, four pairs: PCIe again, 2 x 3/4 x 1.6e9 / 64e9.
    dp4 = dataclasses.replace(dp8, tp=2, dp=4, gbs=4)
    assert _dp_comm_s(model, dp4, cluster, cal, params, 0, 0.0, 0.0) == pytest.approx(
        2 * 3 / 4 * 4 * params / 64e9 * 1.1, rel=1e-12)
    # dp=2 inside one pair: NVLink, 2 x 1/2 x 1.6e9 / 300e9.
    dp2 = dataclasses.replace(dp8, dp=2, gbs=2)
    assert _dp_comm_s(model, dp2, cluster, cal, params, 0, 0.0, 0.0) == pytest.approx(
        2 * 1 / 2 * 4 * params / 300e9 * 1.1, rel=1e-12)


def test_across_bridged_nodes_the_slower_of_pcie_and_the_nic():
    model, cluster, cal = _bridged_pairs()
    params = 400_000_000
    # tp=2 dp=8 on two nodes: four DP ranks per node drive four NICs' share, 4 x 25 = 100 GB/s, but the ring's hops
    # inside the node cross pairs over PCIe, 64 GB/s: PCIe paces it.
    two_nodes = ParallelPlan(framework="megatron", tp=2, dp=8, mbs=1, gbs=8, seq_length=4096, zero_stage=0)
    assert _dp_comm_s(model, two_nodes, cluster, cal, params, 0, 0.0, 0.0) == pytest.approx(
        2 * 7 / 8 * 4 * params / 64e9 * 1.1, rel=1e-12)
    # One DP rank per node (tp=8 priced as if allowed; the rule book refuses it): one GPU's NIC share, 25 GB/s, the
    # slower of it and PCIe.
    one_per_node = dataclasses.replace(two_nodes, tp=8, dp=2, gbs=2)
    assert _dp_comm_s(model, one_per_node, cluster, cal, params, 0, 0.0, 0.0) == pytest.approx(
        2 * 1 / 2 * 4 * params / 25e9 * 1.1, rel=1e-12)
    # A pipeline over one node (tp=2 pp=4): stage boundaries cross pairs, so each send runs at PCIe's 64 GB/s.
    pipe = ParallelPlan(framework="megatron", tp=2, pp=4, dp=1, mbs=1, gbs=64, seq_length=4096)
    send = 2 * 4096 * 4096  # forward activations of one micro-batch, bf16, no sequence parallelism
    assert step_cost(model, pipe, cluster, cal).pp_comm_s == pytest.approx(64 * 2 * send / 64e9, rel=1e-9)


def test_an_all_to_all_over_bridged_pairs_sends_what_leaves_the_pair_over_pcie():
    _, cluster, cal = _bridged_pairs()
    cal = dataclasses.replace(cal, nccl_all_to_all_efficiency=1.0)
    # 8 ranks of one node, 1 GB each: 1/8 to the pair's other GPU over NVLink (300 GB/s), 6/8 over PCIe (64 GB/s),
    # none over the NICs: PCIe paces it.
    assert _all_to_all_s(cluster, cal, 1e9, 8, 1) == pytest.approx(6 / 8 * 1e9 / 64e9, rel=1e-12)
    # 16 ranks over two nodes: 14/16 leave the pair over PCIe (64 GB/s), 8/16 leave the node over the NIC (25 GB/s):
    # the NIC paces it.
    assert _all_to_all_s(cluster, cal, 1e9, 16, 1) == pytest.approx(8 / 16 * 1e9 / 25e9, rel=1e-12)
