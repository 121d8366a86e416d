"""Memory model against known answers: the seed's worked examples, DeepSpeed's own estimators,
Megatron's distributed-optimizer table and Korthikanti et al. 2022 Table 2."""

import csv
import dataclasses
import math

import pytest

from conftest import DATA, mpt_760m, needs_deepspeed
from genconf.catalog.clusters import resolve_cluster
from genconf.catalog.models import resolve_model
from genconf.plan.counting import exact_param_count
from genconf.plan.memory import (
    estimate,
    korthikanti_layer_bytes,
    layer_activation_bytes,
    layer_activation_terms,
    rank_params,
    seed_model_bytes,
    stage_memory,
    step_transient_bytes,
)
from genconf.plan.pipeline import inflight_chunks, stage_layers
from genconf.plan.specs import ModelSpec, ParallelPlan


def test_seed_14p_rule_for_the_70b_exercise():
    # 000_c341372fa13853c8.txt: M = 14P = 14 * 65 B = 910 GB; needs more than one 80 GB GPU.
    assert seed_model_bytes(65 * 10**9) == 910 * 10**9
    model, _ = resolve_model("70b")
    assert round(seed_model_bytes(65_288_471_656) / 1e9) == 914  # exact P from the seed's formula


@pytest.mark.parametrize("params,gb", [(300e6, 4), (1e9, 14), (7e9, 98), (13e9, 182), (70e9, 980)])
def test_seed_memory_table(params, gb):
    # The seed's table 'Approx. memory used to train model (GB)' is 14P, rounded.
    assert round(seed_model_bytes(int(params)) / 1e9) == pytest.approx(gb, abs=0.5)


def _ds_plan(zero: int, n: int, **kw) -> ParallelPlan:
    return ParallelPlan(framework="deepspeed", dp=n, zero_stage=zero, mbs=1, gbs=n, seq_length=2048, **kw)


def _model_states(model, plan) -> int:
    # DeepSpeed's estimators count the fp32 gradient partition with the model states; genconf prices it as
    # what it is, a buffer that exists only inside optimizer.step() (stage_1_and_2.py / stage3.py free it).
    stage = stage_memory(model, plan, 0)
    gathered = sum(b for name, b in stage.other if name.startswith("ZeRO-3 gathered"))
    return (stage.params_bytes + stage.grads_bytes + stage.optimizer_bytes + gathered
            + step_transient_bytes(model, plan, 0))


def _held_params(model: ModelSpec) -> int:
    """The parameters genconf's model holds, counted on the model itself built on the meta device (its vocabulary
    padded to a multiple of 128 rows: GPT-3's 50,257 to 50,304)."""
    import torch

    from genconf.train.torch_model import GPT

    with torch.device("meta"):
        return sum(p.numel() for p in GPT(model).parameters())


@pytest.mark.parametrize("name,tied", [("gpt3-125m", True), ("gpt3-125m", False), ("olmo-1b", True), ("llama2-7b", False)])
def test_genconf_s_own_model_holds_the_parameters_the_memory_model_counts(name, tied):
    """The DeepSpeed/FSDP model built on the meta device against rank_params: the checkpoint's parameters plus the
    padding rows of the embedding (and of the output layer when untied); 50,257 pads, 50,304 and 32,000 do not."""
    import dataclasses as dc

    model = dc.replace(resolve_model(name)[0], tie_embeddings=tied)
    plan = ParallelPlan(framework="fsdp", dp=8, mbs=1, gbs=8, seq_length=model.seq_length, zero_stage=3)
    built = _held_params(model)
    assert built == rank_params(model, plan, 0).total
    padding = (-model.vocab_size) % 64 * model.hidden_size * (1 if tied else 2)
    assert built - exact_param_count(model) == padding and (padding > 0) == (model.vocab_size % 64 != 0)


@needs_deepspeed
@pytest.mark.parametrize("name", ["gpt3-1.3b", "llama2-7b", "olmo-70b"])
@pytest.mark.parametrize("nodes,per_node", [(1, 8), (4, 4), (96, 4)])
@pytest.mark.parametrize("offload", [False, True])
def test_zero2_matches_deepspeed_estimator(name, nodes, per_node, offload):
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    model, _ = resolve_model(name)
    plan = _ds_plan(2, nodes * per_node, offload_optimizer=offload)
    total = _held_params(model)
    _, ds_gpu = estimate_zero2_model_states_mem_needs(total, per_node, nodes, cpu_offload=offload)
    # ZeRO-1/2 pad the flat group to a multiple of 2 x dp elements (stage_1_and_2.py); the estimator does not.
    assert _model_states(model, plan) == pytest.approx(ds_gpu, rel=1e-5)


@needs_deepspeed
@pytest.mark.parametrize("name", ["gpt3-1.3b", "llama3-8b", "olmo-70b"])
@pytest.mark.parametrize("nodes,per_node", [(1, 8), (96, 4)])
@pytest.mark.parametrize("offload_opt,offload_params", [(False, False), (True, False), (True, True)])
def test_zero3_matches_deepspeed_estimator(name, nodes, per_node, offload_opt, offload_params):
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

    model, _ = resolve_model(name)
    plan = _ds_plan(3, nodes * per_node, offload_optimizer=offload_opt, offload_params=offload_params)
    total = _held_params(model)
    largest = rank_params(model, plan, 0).largest_module
    _, ds_gpu, _ = estimate_zero3_model_states_mem_needs(
        total, largest, per_node, nodes, cpu_offload=offload_opt, cpu_offload_params=offload_params)
    # The estimator's 18 bytes/param omit ZeRO-3's 16-bit gradient partition, which stage3.py allocates as
    # grad_partitions_flat_buffer (gradient_accumulation_dtype = bf16): 2 more bytes per parameter shard.
    grad_partition = 0 if offload_opt else 2 * total / (nodes * per_node)
    # ZeRO-3 partitions each parameter separately, ceil(numel / dp) elements (padding); the estimator does not.
    assert _model_states(model, plan) == pytest.approx(ds_gpu + grad_partition, rel=1e-4)


@needs_deepspeed
def test_largest_module_matches_deepspeed_on_a_real_model():
    # DeepSpeed's all_live estimator finds the largest module of a built model; compare with the spec's.
    import torch

    # genconf's own model, built on the meta device: its 1,000-token vocabulary padded to 1,024 rows.
    from genconf.train.torch_model import GPT

    model = ModelSpec(name="tiny", num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=256,
                      vocab_size=1000, seq_length=32, tie_embeddings=False)
    with torch.device("meta"):
        net = GPT(model)
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in net.modules())
    assert rank_params(model, _ds_plan(3, 8), 0).largest_module == largest == 1024 * 64


def test_megatron_distributed_optimizer_table():
    # Megatron-LM docs (distributed optimizer): bf16 params + fp32 grads: 18 bytes/param, or 6 + 12/d.
    model, _ = resolve_model("llama2-7b")
    base = dict(framework="megatron", tp=1, pp=1, mbs=1, seq_length=4096)
    for d in (1, 8, 64):
        plain = stage_memory(model, ParallelPlan(dp=d, gbs=d, zero_stage=0, **base), 0)
        dist = stage_memory(model, ParallelPlan(dp=d, gbs=d, zero_stage=1, **base), 0)
        p = rank_params(model, ParallelPlan(dp=d, gbs=d, **base), 0).total
        assert plain.params_bytes + plain.grads_bytes + plain.optimizer_bytes == 18 * p
        # (the distributed optimizer pads its buffer to lcm(d, 128) elements: a few bytes)
        assert dist.params_bytes + dist.grads_bytes + dist.optimizer_bytes == pytest.approx((6 + 12 / d) * p, rel=1e-6)
        fp16 = stage_memory(model, ParallelPlan(dp=d, gbs=d, zero_stage=1, precision="fp16", **base), 0)
        assert fp16.params_bytes + fp16.grads_bytes + fp16.optimizer_bytes == pytest.approx((4 + 16 / d) * p, rel=1e-6)


def _gpt(h=6144, a=64, layers=48, dropout=0.1) -> ModelSpec:
    return ModelSpec(name="gpt", num_layers=layers, hidden_size=h, num_attention_heads=a, ffn_hidden_size=4 * h,
                     vocab_size=51200, seq_length=2048, hidden_dropout=dropout, attention_dropout=dropout)


def _korthikanti_formulas() -> dict[str, str]:
    with open(DATA / "korthikanti2022_activation_memory_formulas.csv") as f:
        return {row["configuration"]: row["activation_bytes_per_transformer_layer"] for row in csv.DictReader(f)}


@pytest.mark.parametrize("t,sp,recompute,row", [
    (1, False, "none", "no parallelism"),
    (8, False, "none", "tensor parallel (baseline)"),
    (8, True, "none", "tensor + sequence parallel"),
    (8, False, "selective", "tensor parallel + selective activation recomputation"),
    (8, True, "selective", "tensor parallel + sequence parallel + selective activation recomputation"),
    (1, False, "full", "full activation recomputation"),
])
def test_korthikanti_table2(t, sp, recompute, row):
    model = _gpt()
    plan = ParallelPlan(framework="megatron", tp=t, dp=1, mbs=4, gbs=4, seq_length=2048, sequence_parallel=sp,
                        recompute=recompute, layer_spec="local")
    s, b, h, a = 2048, 4, 6144, 64
    expected = eval(_korthikanti_formulas()[row], {}, dict(s=s, b=b, h=h, a=a, t=t))  # the paper's formula text
    assert korthikanti_layer_bytes(model, plan) == pytest.approx(expected, rel=1e-12)


def _norm_stats_bytes(model, plan) -> float:
    return sum(b for name, b in layer_activation_terms(model, plan) if "statistics" in name)


@pytest.mark.parametrize("t,sp", [(1, False), (8, True)])
def test_local_spec_is_korthikanti_with_fp32_softmax(t, sp):
    # megatron-core local spec in BF16 keeps the softmax in FP32 plus a BF16 copy: the s^2 term is 7 a s^2 b
    # instead of Korthikanti's 5, plus the s x s bool causal mask each layer builds; everything else is
    # Table 2's 34 s b h (+ tiny fp32 norm statistics).
    model = _gpt()
    s, b, h, a = 2048, 4, 6144, 64
    plan = ParallelPlan(framework="megatron", tp=t, dp=1, mbs=b, gbs=b, seq_length=s, sequence_parallel=sp,
                        layer_spec="local")
    ours = layer_activation_bytes(model, plan) - _norm_stats_bytes(model, plan)
    assert ours == pytest.approx(s * b * h * (34 / t) + 7 * a * s * s * b / t + s * s, rel=1e-12)
    selective = plan.replace(recompute="selective")
    assert layer_activation_bytes(model, selective) - _norm_stats_bytes(model, selective) == pytest.approx(34 * s * b * h / t)
    assert layer_activation_bytes(model, plan.replace(recompute="full")) == 2 * s * b * h / t


def test_first_stage_holds_all_layers_worth_under_1f1b():
    # Korthikanti 2022 eq. 5: the first stage stores p micro-batches of L/p layers = L layers, whatever p;
    # interleaving multiplies that by 1 + (p-1)/(p v).
    L = 48
    for p in (2, 4, 8):
        plan = ParallelPlan(framework="megatron", pp=p, dp=1, mbs=1, gbs=64, seq_length=2048)
        assert inflight_chunks(plan, 0) * stage_layers(L, plan)[0] == L
        for v in (2, 3):
            if L % (p * v):
                continue
            inter = plan.replace(vp=v)
            layers = inflight_chunks(inter, 0) * stage_layers(L, inter)[0] / v
            assert layers == pytest.approx(L * (1 + (p - 1) / (p * v)))


def test_seed_cluster_70b_needs_many_gpus():
    # 910 GB of weights and Adam cannot fit in one 80 GB GPU; one node of four H100 is not enough either.
    model, _ = resolve_model("70b")
    cluster = resolve_cluster()
    plan = ParallelPlan(framework="megatron", tp=4, dp=1, mbs=1, gbs=1, seq_length=4096, sequence_parallel=True,
                        recompute="full")
    assert not estimate(model, plan, cluster).fits
    assert estimate(model, plan, cluster).peak.total_bytes > 14 * 65e9 / 4


def test_tied_embedding_copy_on_last_stage():
    model, _ = resolve_model("gpt3-1.3b")
    plan = ParallelPlan(framework="megatron", pp=2, dp=1, mbs=1, gbs=8, seq_length=2048)
    first, last = rank_params(model, plan, 0), rank_params(model, plan, 1)
    vocab = 50304  # 50257 padded to a multiple of 128
    assert first.total - last.total == 2048 * 2048 - 2 * 2048  # position table vs final norm; word embedding on both
    assert last.total > 12 * model.num_layers // 2 * 2048**2 + vocab * 2048 - 1
    assert math.isclose(first.total + last.total - vocab * 2048, exact_param_count(model) + 47 * 2048, rel_tol=0)


def test_torchtitan_loss_parallel_peak():
    """torchtitan's Llama 3.1 70B, 2D FSDP x TP8 on 256 H100 96GB, local batch 16 x 8192, full AC, Float8
    (benchmarks/data/torchtitan.csv, table of Dec 2024): max reserved 71.9 GiB (67.6 GiB with async TP, the same
    layout). The peak is the start of the backward: every layer's input is kept and the loss-parallel
    cross entropy (torch/distributed/tensor/parallel/loss.py) holds the fp32 log-softmax beside fp32 zeros,
    exp() and their sum, 16 bytes per logit, which no recomputed layer overlaps."""
    model, _ = resolve_model("llama3-70b")  # Llama 3.1 70B has the same shapes
    plan = ParallelPlan(framework="fsdp", tp=8, dp=32, mbs=16, gbs=512, seq_length=8192, zero_stage=3,
                        recompute="full", sequence_parallel=True, precision="fp8", fp8_recipe="current",
                        torch_compile=True, expandable_segments=False)
    peak = stage_memory(model, plan, 0)
    other = dict(peak.other)
    logits = 16 * 8192 * model.vocab_size / 8
    assert other["fp32 loss-parallel cross-entropy backward (zeros, exp, sum)"] == int(12 * logits)
    assert "recomputed layer during backward" not in other  # it comes after the loss, and is smaller
    for measured_gib in (71.9, 67.6):
        assert peak.reserved_bytes / 2**30 == pytest.approx(measured_gib, rel=0.10)


# --- what the modern stack keeps (issue 12: memory the way the frameworks allocate it) ----------------------

LLAMA405 = resolve_model("llama3.1-405b")[0]


def _fp8_plan(**kw) -> ParallelPlan:
    base = dict(framework="megatron", tp=4, pp=16, vp=4, dp=4, mbs=1, gbs=1536, seq_length=8192, zero_stage=1,
                precision="fp8", fp8_recipe="current", fp8_param_gather=True, grad_dtype="bf16",
                pp_embedding_as_layer=True, pp_loss_as_layer=True)
    return ParallelPlan(**{**base, **kw})


def test_per_tensor_fp8_keeps_no_transposed_weight_copy_where_fp8_gemms_take_either_layout():
    # Transformer Engine allocates the transpose only where FP8 GEMMs are TN-only (Hopper): one byte per matmul
    # weight element on the H100, none on Blackwell; MXFP8's column-wise copy is quantized apart and stays.
    plan = _fp8_plan()
    hopper = stage_memory(LLAMA405, plan, 1)
    blackwell = stage_memory(LLAMA405, plan, 1, fp8_any_layout=True)
    gemm = rank_params(LLAMA405, plan, 1).gemm
    assert dict(hopper.other)["current column-wise weight copies (TE)"] == gemm
    assert "current column-wise weight copies (TE)" not in dict(blackwell.other)
    assert hopper.allocated_bytes - blackwell.allocated_bytes == gemm
    mx = _fp8_plan(fp8_recipe="mxfp8")
    assert (stage_memory(LLAMA405, mx, 1).allocated_bytes
            == stage_memory(LLAMA405, mx, 1, fp8_any_layout=True).allocated_bytes)
    assert resolve_cluster("gb200-nvl72").gpu.fp8_gemm_any_layout and not resolve_cluster("dgx-h100").gpu.fp8_gemm_any_layout


def test_optimizer_shard_counts_each_virtual_chunks_own_layers():
    # Llama 3.1 405B, pp 16 x vp 4 with the embedding and loss counted as layers (Megatron-Bridge's recipe): rank 0
    # holds chunks of 1, 2, 2, 2 layers plus the embedding, a middle rank 2, 2, 2, 2. The distributed optimizer's
    # shard is about (layers x a layer's parameters + the embedding) / dp x 12 bytes on both (under current scaling
    # megatron-core keeps fp32 master weights itself, precision-aware optimizer or not).
    from genconf.plan.pipeline import chunk_layers

    plan = _fp8_plan(precision_aware_optimizer=True)
    assert chunk_layers(LLAMA405.num_layers, plan, 0) == (1, 2, 2, 2)
    assert chunk_layers(LLAMA405.num_layers, plan, 1) == (2, 2, 2, 2)
    assert chunk_layers(LLAMA405.num_layers, plan, 15) == (2, 2, 2, 1)
    for stage in (0, 1, 15):
        held = rank_params(LLAMA405, plan, stage).total
        got = stage_memory(LLAMA405, plan, stage).optimizer_bytes
        assert got == pytest.approx(12 * held / plan.dp, rel=0.01), stage


def test_activation_offload_keeps_the_layers_not_offloaded():
    # TE's default synchroniser: activation memory is (layers - offloaded) x one layer's (cpu_offload.py).
    model = resolve_model("llama3-70b")[0]
    plan = ParallelPlan(framework="megatron", tp=1, pp=1, dp=64, mbs=2, gbs=256, seq_length=8192, zero_stage=3,
                        precision="fp8", fp8_recipe="current", fp8_param_gather=True, grad_dtype="bf16")
    kept = stage_memory(model, plan, 0)
    off = stage_memory(model, plan.replace(offload_activation_layers=40), 0)
    layer = layer_activation_bytes(model, plan)
    assert kept.activations_bytes - off.activations_bytes == pytest.approx(40 * layer, abs=2)
    assert not any("staging" in name for name, _ in off.other)


def test_megatron_fsdp_gradient_buckets_wait_for_the_loss_buffers_to_go():
    # The unsharded gradient buckets exist in the layers' backward, after the output layer's backward freed the
    # loss's fp32 buffer and logits: the last stage budgets the larger of the two, not their sum.
    model = resolve_model("llama3-70b")[0]
    plan = ParallelPlan(framework="megatron", tp=1, pp=1, dp=64, mbs=2, gbs=256, seq_length=8192, zero_stage=3,
                        precision="fp8", fp8_recipe="current", fp8_param_gather=True, grad_dtype="bf16")
    other = dict(stage_memory(model, plan, 0).other)
    assert not any(name.startswith("Megatron-FSDP unsharded gradient buckets") for name in other)
    assert "bf16 logits before the fp32 loss" in other


# --- the loss, as each stack computes it -------------------------------------------------------------------

def test_the_fused_loss_keeps_16_bit_logits_and_a_log_sum_exp():
    """F.cross_entropy(logits.float()) saves the fp32 log-softmax (4 bytes per logit) and, while the loss runs,
    holds the bf16 logits and their fp32 copy (2 + 4); the fused cross entropy saves the bf16 logits (2) and per
    token a log-sum-exp and a label (12 bytes), and its backward writes a bf16 gradient (2) beside one fp32 chunk
    of 2**25 logits (8 bytes each). MPT-760M, micro-batch 24 x 2048 (n = 49,152 tokens), vocab 50,368 (50,432 rows in
    genconf's own model, padded to a multiple of 128)."""
    from genconf.plan.memory import FUSED_LOSS_CHUNK_ELEMENTS

    model = mpt_760m()
    plan = ParallelPlan(framework="fsdp", dp=8, mbs=24, gbs=192, seq_length=2048, zero_stage=3)
    n, v = 24 * 2048, 50432
    upcast = stage_memory(model, plan, 0)
    fused = stage_memory(model, dataclasses.replace(plan, fused_loss=True), 0)
    assert upcast.activations_bytes - fused.activations_bytes == (4 - 2) * n * v + (13 - 12) * n
    assert dict(upcast.other)["bf16 logits + fp32 copy before the loss"] == 6 * n * v
    assert dict(fused.other)["fused cross-entropy backward: 16-bit logits gradient + one fp32 chunk (loss)"] == \
        2 * n * v + 8 * FUSED_LOSS_CHUNK_ELEMENTS
    # MosaicML ran this on 8 H100 80GB (llm-foundry's benchmark table): it fits with the fused loss only.
    assert fused.total_bytes < 79.6 * 2**30 < upcast.total_bytes


def test_megatron_keeps_its_own_vocab_parallel_loss():
    model = mpt_760m()
    plan = ParallelPlan(framework="megatron", dp=8, mbs=2, gbs=16, seq_length=2048, zero_stage=1)
    assert dict(stage_memory(model, plan, 0).other)["bf16 logits before the fp32 loss"] == 2 * 2 * 2048 * 50432


def test_the_loss_line_names_the_logits_dtype():
    # fp32 training keeps fp32 logits (4 bytes each), and F.cross_entropy's .float() is then the same tensor: the
    # lines said "bf16 logits" whatever the precision.
    model = mpt_760m()
    plan = ParallelPlan(framework="megatron", dp=8, mbs=2, gbs=16, seq_length=2048, zero_stage=1, precision="fp32")
    assert dict(stage_memory(model, plan, 0).other)["fp32 logits before the fp32 loss"] == 4 * 2 * 2048 * 50432
    fsdp = ParallelPlan(framework="fsdp", dp=8, mbs=2, gbs=16, seq_length=2048, zero_stage=3, precision="fp32")
    assert dict(stage_memory(model, fsdp, 0).other)["fp32 logits + fp32 log-softmax before the loss"] == \
        8 * 2 * 2048 * 50432


def test_zero0_step_holds_every_gradients_fp32_copy_and_their_flat_concatenation():
    # DeepSpeed's FP16_Optimizer.step (runtime/fp16/fused_optimizer.py, which ZeRO-0 runs for fp16 and for bf16
    # with bf16 gradient accumulation): _flatten_dense_tensors([p.grad.to(fp32) for p in group]) holds the
    # per-parameter fp32 copies and their concatenation at once, 8 bytes per parameter; ZeRO-1/2 flatten only the
    # rank's fp32 partition (4 bytes per parameter over dp).
    model, _ = resolve_model("gpt3-1.3b")
    total = rank_params(model, _ds_plan(0, 8), 0).total
    assert step_transient_bytes(model, _ds_plan(0, 8), 0) == 8 * total
    assert step_transient_bytes(model, _ds_plan(1, 8), 0) == pytest.approx(4 * total / 8, rel=1e-3)


def test_the_optimizer_step_takes_a_segment_of_its_own_under_the_classic_allocator():
    # BLOOM's 200B prototype on A100s (tp8 pp10, Megatron-DeepSpeed ZeRO-1, full recompute): at the step DeepSpeed
    # builds one flat fp32 gradient partition, after the backward freed the activations. The classic allocator
    # cannot place it in their cached segments, so reserved memory holds both; the plan's fit does not change (on
    # an out-of-memory the cache is freed and the request retried). BLOOM's nvidia-smi readings: 51 / 53 GB at dp 2,
    # 73 / 75 GB at dp 1.
    from genconf.plan import memory

    model = ModelSpec(name="bloom-prototype-200b", num_layers=80, hidden_size=14400, num_attention_heads=96,
                      num_query_groups=96, ffn_hidden_size=4 * 14400, vocab_size=250880, seq_length=2048,
                      activation="gelu", normalization="layernorm", position_embedding="none",
                      tie_embeddings=True, add_bias_linear=True)
    dp2 = ParallelPlan(framework="deepspeed", tp=8, pp=10, dp=2, mbs=1, gbs=2048, seq_length=2048, zero_stage=1,
                       recompute="full", precision="bf16", sequence_parallel=False, layer_spec="local",
                       fused_kernels=True, expandable_segments=False)
    dp1 = dataclasses.replace(dp2, dp=1)
    for plan in (dp2, dp1):
        stage = memory.stage_memory(model, plan, 0)
        step = memory.step_transient_bytes(model, plan, 0)
        beyond = sum(b for n, b in stage.other if n.startswith("optimizer-step"))
        # What the step holds beside the activations' segments: the whole partition where it fits under the
        # activations' peak (dp 2), else the part under it (dp 1: the rest is live at the step's own peak).
        assert stage.step_segment_bytes > 0 and stage.step_segment_bytes == pytest.approx(step - beyond, abs=2)
        assert stage.allocator_bytes == pytest.approx(
            memory.FRAGMENTATION_FRACTION * stage.allocated_bytes + stage.step_segment_bytes, abs=2)
        expandable = memory.stage_memory(model, dataclasses.replace(plan, expandable_segments=True), 0)
        assert expandable.step_segment_bytes == 0
        assert stage.total_bytes - stage.unreleasable_bytes == expandable.total_bytes - expandable.unreleasable_bytes
    assert memory.step_transient_bytes(model, dp1, 0) > memory.stage_memory(model, dp1, 0).step_segment_bytes
    # Megatron upcasts its gradient shards one parameter at a time: small requests that reuse cached blocks.
    megatron = dataclasses.replace(dp2, framework="megatron")
    assert memory.stage_memory(model, megatron, 0).step_segment_bytes == 0


def test_reserved_memory_never_passes_the_gpu():
    # The allocator frees its cache before it reports out-of-memory: a plan whose live bytes fill most of an
    # 80 GB GPU cannot show 25% more than that reserved.
    from genconf.plan import memory

    model, _ = resolve_model("llama3-70b")
    cluster = resolve_cluster("dgx-h100")
    plan = ParallelPlan(framework="megatron", tp=4, pp=8, dp=2, mbs=1, gbs=64, seq_length=8192, zero_stage=1,
                        sequence_parallel=True, expandable_segments=False, recompute="selective")
    est = memory.estimate(model, plan, cluster)
    raw = memory.stage_memory(model, plan, est.peak.stage)
    assert est.fits and raw.device_bytes > est.capacity_bytes  # uncapped, the fraction alone would pass the GPU
    assert est.peak.device_bytes == est.capacity_bytes
    assert est.peak.total_bytes == raw.total_bytes  # what the plan needs is unchanged


@pytest.mark.parametrize("fields, bytes_per_param", [
    ({}, 12),  # fp32 master weight + two fp32 moments (Megatron-LM docs, distributed optimizer table)
    ({"precision": "bf16", "fp8_recipe": None, "fp8_param_gather": False, "precision_aware_optimizer": True}, 10),
    ({"fp8_recipe": "delayed", "precision_aware_optimizer": True}, 10),  # TE FusedAdam: 16-bit remainders
    ({"precision_aware_optimizer": True}, 12),  # current scaling: megatron-core keeps the fp32 master itself
    ({"fp8_recipe": "mxfp8", "precision_aware_optimizer": True}, 12),
    ({"precision_aware_optimizer": True, "adam_moments_dtype": "bf16"}, 8),  # DeepSeek-V3's recipe
    ({"precision": "bf16", "fp8_recipe": None, "fp8_param_gather": False, "precision_aware_optimizer": True,
      "adam_moments_dtype": "bf16"}, 6),
])
def test_optimizer_bytes_follow_who_keeps_the_master_weights(fields, bytes_per_param):
    """megatron-core hands the fp32 master weights to TE's FusedAdam (kept as 16-bit remainders beside the bf16
    weights) only without FP8 or under delayed scaling (OptimizerConfig.use_precision_aware_optimizer_no_fp8_or_ds_fp8);
    BF16 moments (exp_avg_dtype, exp_avg_sq_dtype) take 2 + 2 bytes instead of 4 + 4."""
    plan = _fp8_plan(**fields)
    held = rank_params(LLAMA405, plan, 1).total
    assert stage_memory(LLAMA405, plan, 1).optimizer_bytes == pytest.approx(bytes_per_param * held / plan.dp, rel=0.01)


def test_bf16_adam_moments_add_their_fp32_copies_during_the_step():
    # TE FusedAdam upcasts a param group's BF16 moments for its kernel (fused_adam.py get_unscaled_state .float()):
    # 8 bytes per parameter of the shard during the step, beside the 4-byte fp32 gradient copy megatron-core makes
    # where it keeps fp32 master weights itself (FP8 current scaling here).
    from genconf.plan.memory import step_transient_bytes

    plan = _fp8_plan(precision_aware_optimizer=True)
    held = rank_params(LLAMA405, plan, 1).total
    assert step_transient_bytes(LLAMA405, plan, 1) == pytest.approx(4 * held / plan.dp, rel=0.01)
    bf16 = dataclasses.replace(plan, adam_moments_dtype="bf16")
    assert step_transient_bytes(LLAMA405, bf16, 1) == pytest.approx(12 * held / plan.dp, rel=0.01)


@pytest.mark.parametrize("name", ["gpt3-1.3b", "llama3-8b"])
def test_cached_layer_bytes_equal_the_terms_for_every_field_the_terms_read(name):
    # layer_activation_bytes caches on a few plan fields; each field layer_activation_terms reads must be among them
    # (the attention kernel was not: --attention-kernel math priced DeepSpeed/FSDP plans with flash attention's
    # memory, 28.8 GiB where the s x s scores need about 138).
    model, _ = resolve_model(name)
    base = ParallelPlan(framework="deepspeed", zero_stage=1, mbs=2, gbs=16, seq_length=2048)
    variants = [dict(attention_kernel=k) for k in ("auto", "math", "cudnn", "flash2")]
    variants += [dict(framework="fsdp", zero_stage=z, attention_kernel=k) for z in (0, 2, 3) for k in ("auto", "math")]
    variants += [dict(framework="megatron", layer_spec=s, tp=t, sequence_parallel=t > 1, recompute=r, zero_stage=0)
                 for s in ("te", "local") for t in (1, 2) for r in ("none", "selective", "full")]
    variants += [dict(fused_kernels=True, layer_spec="local"), dict(precision="fp32"), dict(cp=2), dict(mbs=4, gbs=32)]
    checked = set()
    for change in variants:
        plan = dataclasses.replace(base, **change)
        expected = sum(b for _, b in layer_activation_terms(model, plan))
        assert layer_activation_bytes(model, plan) == pytest.approx(expected, rel=1e-12), change
        checked.add(expected)
    assert len(checked) > 10  # the variants do move the bytes
    math_plan = dataclasses.replace(base, attention_kernel="math")
    assert layer_activation_bytes(model, math_plan) > 2 * layer_activation_bytes(model, base)  # s x s scores kept


def test_fp32_under_transformer_engine_keeps_the_attention_scores_and_takes_no_cp():
    # TE's flash and fused attention take fp16/bf16 inputs (get_attention_backend): an fp32 plan runs its unfused
    # attention, which keeps the s x s scores and which context parallelism does not support. It was priced as flash
    # attention and planned with cp 2 (a start-up failure: "No dot product attention support").
    from genconf.plan import rules
    from genconf.plan.memory import fused_attention

    model, _ = resolve_model("llama3-8b")
    cluster = resolve_cluster("dgx-h100")
    bf16 = ParallelPlan(framework="megatron", tp=2, dp=4, mbs=1, gbs=8, seq_length=8192, zero_stage=1)
    fp32 = dataclasses.replace(bf16, precision="fp32")
    assert fused_attention(model, bf16) and not fused_attention(model, fp32)
    assert layer_activation_bytes(model, fp32) > 3 * layer_activation_bytes(model, bf16)  # the 8k x 8k scores
    errors = [v.rule for v in rules.check(rules.Context(model, cluster, dataclasses.replace(fp32, cp=2, dp=2), 8))
              if v.severity == rules.ERROR]
    assert errors == ["cp_needs_te"]
    assert not [v for v in rules.check(rules.Context(model, cluster, dataclasses.replace(bf16, cp=2, dp=2), 8))
                if v.severity == rules.ERROR]
