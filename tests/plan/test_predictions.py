"""Memory as the frameworks allocate it, a complete search, framework-aware costs and honest ties: known
answers from public parameter counts, the frameworks' own allocation rules, measured runs (issue 13's single
H100) and published layouts (NVIDIA's NeMo / Megatron-Bridge recipes)."""

from __future__ import annotations

import dataclasses
import time

import pytest

from genconf.catalog.clusters import resolve_cluster
from genconf.catalog.hardware import calibration_for
from genconf.catalog.models import resolve_model
from genconf.plan import memory as mem
from genconf.plan import rules
from genconf.plan.pipeline import stage_layers
from genconf.plan.search import TIE_FRACTION, Pins, _split_options, _vp_options, evaluate, search
from genconf.plan.specs import ParallelPlan


def _plan(**kw) -> ParallelPlan:
    base = dict(framework="megatron", dp=8, mbs=1, gbs=64, seq_length=4096, zero_stage=0)
    base.update(kw)
    return ParallelPlan(**base)


LLAMA8B = resolve_model("llama3-8b")[0]


# --- memory ---------------------------------------------------------------------------------------

def test_gradient_buffer_dtype_is_a_plan_choice():
    """megatron main_grad buffers: fp32 (Megatron-LM's default for bf16) or bf16 (--grad-reduce-in-bf16):
    4 or 2 bytes per parameter on the rank."""
    fp32 = mem.stage_memory(LLAMA8B, _plan(), 0)
    bf16 = mem.stage_memory(LLAMA8B, _plan(grad_dtype="bf16"), 0)
    params = fp32.params_bytes / 2
    assert fp32.grads_bytes == pytest.approx(4 * params)
    assert bf16.grads_bytes == pytest.approx(2 * params)
    assert _plan().grad_bytes == 4 and _plan(grad_dtype="bf16").grad_bytes == 2
    # DeepSpeed and FSDP defaults: DeepSpeed keeps 16-bit gradients, FSDP MixedPrecision reduces in fp32.
    assert _plan(framework="deepspeed").grad_bytes == 2
    assert _plan(framework="fsdp").grad_bytes == 4


def test_distributed_optimizer_and_precision_aware_optimizer_bytes():
    """Distributed optimizer: fp32 master + Adam m, v (12 bytes) sharded over dp; TE's precision-aware
    optimizer keeps the master weights as 16-bit remainders beside the bf16 weights (10 bytes)."""
    replicated = mem.stage_memory(LLAMA8B, _plan(), 0)
    sharded = mem.stage_memory(LLAMA8B, _plan(zero_stage=1), 0)
    aware = mem.stage_memory(LLAMA8B, _plan(zero_stage=1, precision_aware_optimizer=True), 0)
    params = replicated.params_bytes / 2
    assert replicated.optimizer_bytes == pytest.approx(12 * params)
    assert sharded.optimizer_bytes == pytest.approx(12 * params / 8, rel=0.01)
    assert aware.optimizer_bytes == pytest.approx(10 * params / 8, rel=0.01)


def test_megatron_fsdp_shards_parameters_and_fp8_param_gather_halves_them():
    dist = mem.stage_memory(LLAMA8B, _plan(zero_stage=1), 0)
    fsdp = mem.stage_memory(LLAMA8B, _plan(zero_stage=3), 0)
    assert fsdp.params_bytes < dist.params_bytes / 4  # sharded over dp = 8 (plus the gathered working set)
    fp8 = mem.stage_memory(LLAMA8B, _plan(zero_stage=1, precision="fp8", fp8_recipe="current"), 0)
    gathered = mem.stage_memory(LLAMA8B, _plan(zero_stage=1, precision="fp8", fp8_recipe="current",
                                               fp8_param_gather=True), 0)
    assert gathered.params_bytes < 0.75 * fp8.params_bytes  # GEMM weights in 1 byte, norms/embedding in bf16


def test_deepspeed_zero0_bf16_optimizer_bytes_are_the_fp32_master_plus_adam():
    """Issue 12: planned 11,244,429,312 bytes for DeepSpeed ZeRO-0 on the 1B model, 'measured' 7,496,286,208.
    DeepSpeed's bf16 ZeRO-0 path (FP16_Optimizer) holds a flat fp32 master copy (fp32_groups_flat, 4 bytes) and
    Adam's m and v (8 bytes): 12 x 937,035,776 = 11,244,429,312. The measurement counted Adam's states only
    (8 x 937,035,776 = 7,496,286,208): it missed fp32_groups_flat, now counted (genconf/train/measure.py)."""
    model = resolve_model("1b")[0]
    plan = ParallelPlan(framework="deepspeed", dp=1, mbs=4, gbs=32, seq_length=2048, zero_stage=0)
    stage = mem.stage_memory(model, plan, 0)
    # Known answer: the parameters of the model DeepSpeed trains (genconf's own GPT), built on the meta device.
    import torch

    from genconf.train.torch_model import GPT

    with torch.device("meta"):
        held = sum(p.numel() for p in GPT(model).parameters())
    assert held == 937_035_776
    assert stage.optimizer_bytes == 12 * held == 11_244_429_312
    assert 8 * held == 7_496_286_208  # the issue's measurement: Adam's m and v of those parameters, no fp32 master


def test_allocated_reserved_and_budget_are_separate():
    classic = mem.stage_memory(LLAMA8B, _plan(expandable_segments=False), 0)
    expandable = mem.stage_memory(LLAMA8B, _plan(), 0)
    assert classic.allocated_bytes == expandable.allocated_bytes
    assert classic.reserved_bytes > expandable.reserved_bytes > expandable.allocated_bytes
    assert expandable.device_bytes == expandable.reserved_bytes + expandable.runtime_bytes
    assert expandable.total_bytes == expandable.allocated_bytes + expandable.unreleasable_bytes + expandable.runtime_bytes


def test_te_attention_keeps_no_score_tensor_and_fused_local_keeps_bf16_scores():
    """TE/flash attention saves no s x s tensor; megatron's fused local softmax saves bf16 probabilities
    (Korthikanti's 5 a s^2 b with dropout), the unfused PyTorch softmax fp32 ones."""
    gpt = resolve_model("gpt3-2.7b")[0]
    plan = _plan(seq_length=2048, layer_spec="local")
    terms = dict(mem.layer_activation_terms(gpt, plan))
    fused = dict(mem.layer_activation_terms(gpt, dataclasses.replace(plan, fused_kernels=True)))
    te = dict(mem.layer_activation_terms(gpt, _plan(seq_length=2048)))
    s2 = gpt.num_attention_heads * 2048 * 2048
    assert terms["softmax output (fp32)"] == 4 * s2
    assert fused["softmax output (fused kernel, bf16)"] == 2 * s2
    assert not any("softmax output" in k for k in te)


# --- the search -----------------------------------------------------------------------------------

def test_every_legal_virtual_stage_count_is_tried():
    assert _vp_options(80, 4, {}) == [1, 2, 4, 5, 10, 20]  # 80 / 4 = 20 layers per rank: every divisor
    assert _vp_options(126, 8, {"pp_embedding_as_layer": True, "pp_loss_as_layer": True}) == [1, 2, 4, 8, 16]


def test_uneven_stages_are_offered_when_layers_do_not_divide():
    options = _split_options(126, 8)  # Llama 3.1 405B on 8 stages
    assert {"pp_embedding_as_layer": True, "pp_loss_as_layer": True} in options
    assert any(o.get("pp_first_stage_layers") for o in options)
    assert _split_options(80, 4) == [{}]


def test_the_loss_alone_counts_as_a_layer_where_that_divides():
    """NeMo's DeepSeek-V3 fine-tuning recipe on pp 31, vp 2 (scripts/performance/llm/finetune_deepseek_v3.py:
    account_for_loss_in_pipeline_split alone): its 61 layers and the loss make 62 slots, 2 a rank, 1 a virtual
    stage; the last rank holds one layer beside the loss."""
    split = {"pp_loss_as_layer": True}
    assert split in _split_options(61, 31)
    assert _vp_options(61, 31, split) == [1, 2]
    plan = ParallelPlan(framework="megatron", tp=1, pp=31, vp=2, dp=1, mbs=1, gbs=62, seq_length=4096, **split)
    assert stage_layers(61, plan) == (2,) * 30 + (1,)


def test_published_layouts_are_feasible_when_pinned():
    """NVIDIA's recipes, typed as a user would: none may be rejected."""
    cases = [  # (model, cluster, gpus, tp, pp, vp, cp, mbs, gbs, seq, precision)
        ("llama3-70b", "dgx-h100", 64, 4, 4, 5, 2, 1, 128, 8192, "bf16"),
        ("llama3-70b", "dgx-h100", 64, 4, 8, 5, 1, 1, 128, 8192, "fp8"),
        ("llama3.1-405b", "dgx-h100", 1024, 8, 8, 8, 2, 1, 512, 8192, "bf16"),
        ("llama3-8b", "dgx-h100", 8, 1, 1, None, 2, 1, 128, 8192, "bf16"),
    ]
    for name, cluster_name, gpus, tp, pp, vp, cp, mbs, gbs, seq, precision in cases:
        model = resolve_model(name)[0]
        cluster = resolve_cluster(cluster_name)
        pins = Pins(framework="megatron", tp=tp, pp=pp, vp=vp, cp=cp, mbs=mbs, gbs=gbs, seq_length=seq,
                    precision=precision)
        result = search(dataclasses.replace(model, seq_length=seq), cluster, gpus, calibration_for(cluster.gpu.name),
                        pins, keep=1)
        assert result.ranked, (name, result.rejected, [str(e) for m in result.nearest_misses for e in m.errors])


def test_context_parallel_with_tensor_parallel_and_micro_batches_up_to_8():
    model = dataclasses.replace(resolve_model("llama3-8b")[0], seq_length=32768)
    cluster = resolve_cluster("dgx-h100")
    result = search(model, cluster, 64, calibration_for("h100-sxm"), Pins(framework="megatron", gbs=64), keep=50)
    layouts = {(e.plan.tp, e.plan.cp) for e in result.ranked}
    assert any(tp > 1 and cp > 1 for tp, cp in layouts)
    short = search(resolve_model("1b")[0], cluster, 8, calibration_for("h100-sxm"),
                   Pins(framework="megatron", tp=1, pp=1, zero_stage=1, recompute="none"), keep=1)
    assert short.best.plan.mbs == 8  # the largest micro-batch tried, where it fits and is fastest


def test_a_plan_pinned_between_the_headroom_and_the_capacity_is_kept_with_a_warning():
    """Narayanan 2021's 530B ZeRO-3 layout on 448 A100s (the paper ran 640): a whole pinned plan that fits the
    GPU (97.8% of it) but not the estimate's headroom is kept and warned about, not rejected."""
    model = dataclasses.replace(resolve_model("gpt3-175b")[0], num_layers=105, hidden_size=20480,
                                num_attention_heads=128, num_query_groups=128, ffn_hidden_size=81920,
                                kv_channels=160, name="gpt-530b")
    cluster = resolve_cluster("dgx-a100")
    pins = Pins(framework="deepspeed", tp=1, pp=1, zero_stage=3, mbs=4, gbs=1792, recompute="full",
                layer_spec="local", fused_kernels=True, expandable_segments=False)
    result = search(model, cluster, 448, calibration_for("a100-80gb"), pins, keep=1)
    assert result.ranked
    warnings = [v for v in result.best.violations if v.rule == "memory_fits"]
    assert warnings and warnings[0].severity == rules.WARNING and "tight" in warnings[0].message


def test_search_speed_stays_bounded():
    """benchmarks/speed.py measures the targets (70B on 384 GPUs < 0.3 s, 1T on 16,384 < 2 s); here a loose
    bound that a shared CI machine still meets."""
    cluster = resolve_cluster("dgx-h100")
    for name, gpus, bound in (("70b", 384, 3.0), ("gpt-1t", 16384, 10.0)):
        model = resolve_model(name)[0]
        t0 = time.perf_counter()
        result = search(model, cluster, gpus, calibration_for("h100-sxm"))
        assert result.ranked and time.perf_counter() - t0 < bound, name


# --- frameworks and honest ties -------------------------------------------------------------------

ISSUE13 = [  # (model, framework, layer spec, mbs, recompute, measured tokens/s) on one H100, BF16, no TE
    ("1b", "deepspeed", "te", 8, "none", 66_593), ("1b", "fsdp", "te", 8, "none", 59_658),
    ("1b", "megatron", "local", 4, "none", 29_918), ("gpt3-2.7b", "megatron", "local", 2, "selective", 6_665),
    ("gpt3-2.7b", "fsdp", "te", 1, "none", 16_390),
]


@pytest.mark.parametrize("name,framework,spec,mbs,recompute,measured", ISSUE13)
def test_issue13_single_h100_runs_are_reproduced(name, framework, spec, mbs, recompute, measured):
    """genconf --model M --gpus 1 --gpu h100-sxm --gpus-per-node 1 --global-batch 32 --framework F, with the
    micro-batch and recompute the run used (benchmarks/data/genconf_h100_issue13.csv): megatron's within 10%. The
    eager runs (DeepSpeed, FSDP: genconf's PyTorch model) within 12% and never predicted fast: single-GPU eager runs
    measure 1.12-1.17x their prediction on an H200 too (OLMo 1B, GPT-3 1.3B, a squared-ReLU 1B:
    benchmarks/results/gpu_runs/README.md), and the Kempner 1B met 10% only while its q and k norms went unpriced
    (history.md, "After 5d52820")."""
    model = resolve_model(name)[0]
    cluster = resolve_cluster("kempner-h100", gpu="h100-sxm", gpus_per_node=1)
    result = search(model, cluster, 1, calibration_for("h100-sxm"),
                    Pins(framework=framework, gbs=32, layer_spec=spec, mbs=mbs, recompute=recompute,
                         zero_stage=0, expandable_segments=False))
    error = result.best.cost.tokens_per_s_per_gpu / measured - 1
    if framework == "megatron":
        assert abs(error) <= 0.10, error
    else:
        assert -0.12 <= error <= 0.0, error


def test_frameworks_are_priced_apart_where_their_kernels_differ_on_a_1b_model_over_8_gpus():
    """Megatron's TE layers beat the PyTorch model by more than the tie; FSDP's DDP (fp32 weights cast under
    autocast every micro-batch, fp32 norms and residual stream) is slower than DeepSpeed ZeRO-0's bf16 model by more
    than the tie; sharded FSDP gathers bf16 weights and runs the same bf16 model as DeepSpeed (within the tie)."""
    model, cluster, cal = resolve_model("1b")[0], resolve_cluster("dgx-h100"), calibration_for("h100-sxm")

    def speed(framework: str, zero: int | None = None) -> float:
        pins = Pins(framework=framework, zero_stage=zero)
        return search(model, cluster, 8, cal, pins).best.cost.tokens_per_s_per_gpu

    megatron, deepspeed, fsdp = speed("megatron"), speed("deepspeed"), speed("fsdp")
    assert megatron / max(deepspeed, fsdp) - 1 > TIE_FRACTION  # TE fused kernels
    assert speed("deepspeed", 0) / speed("fsdp", 0) - 1 > TIE_FRACTION
    assert abs(fsdp / deepspeed - 1) < TIE_FRACTION


def test_local_spec_costs_more_than_te():
    """megatron-core's unfused local spec measured 0.49-0.62x of the TE-based prediction on an H100."""
    model, cluster, cal = resolve_model("1b")[0], resolve_cluster("kempner-h100", gpu="h100-sxm", gpus_per_node=1), \
        calibration_for("h100-sxm")
    plan = ParallelPlan(framework="megatron", dp=1, mbs=4, gbs=32, seq_length=2048)
    te = evaluate(model, cluster, plan, 1, cal).cost.tokens_per_s_per_gpu
    local = evaluate(model, cluster, dataclasses.replace(plan, layer_spec="local"), 1, cal).cost.tokens_per_s_per_gpu
    assert 0.4 < local / te < 0.7


def _qwen3_host_case():
    """Qwen3-30B-A3B MXFP8 on 8 B200s, EP 8, with host terms chosen round (200 ops per MoE layer, 30 per local
    expert, 20 us per eager op, 1 us per graphed one) and the dense part's graphed launches."""
    from genconf.plan.cost import KERNELS_PER_LAYER, Calibration

    model, cluster = resolve_model("qwen3-30b-a3b")[0], resolve_cluster("dgx-b200")
    cal = Calibration(gemm_efficiency=0.67, fp8_gemm_efficiency=0.65, moe_host_ops=200.0,
                      moe_host_ops_per_expert=30.0, kernel_launch_s=2e-5, graph_launch_s=1e-6)
    plan = ParallelPlan(framework="megatron", ep=8, dp=8, mbs=1, gbs=512, seq_length=4096, zero_stage=1,
                        precision="fp8", fp8_recipe="mxfp8")
    return model, cluster, cal, plan, 3 * (KERNELS_PER_LAYER["megatron-te"] + 6) * 1e-6


def test_dropless_moe_layers_pay_their_eager_host_ops():
    """A dropless MoE layer synchronises with the host in every forward, so its router, dispatch and per-expert
    ops run eagerly: host time = (ops per layer + ops per local expert x local experts) x host time per op, on
    top of the graphed dense part; 128 experts over EP 8 leave 16 local experts."""
    from genconf.plan.cost import layer_time

    model, cluster, cal, plan, dense_part = _qwen3_host_case()
    assert layer_time(model, plan, cluster, cal).host_s == pytest.approx(dense_part + (200 + 30 * 16) * 2e-5)
    # The host's work does not grow with the micro-batch; with EP 32 only 4 experts are local.
    assert layer_time(model, dataclasses.replace(plan, mbs=4), cluster, cal).host_s == \
        layer_time(model, plan, cluster, cal).host_s
    assert layer_time(model, dataclasses.replace(plan, ep=32, dp=32), cluster, cal).host_s == \
        pytest.approx(dense_part + (200 + 30 * 4) * 2e-5)


def test_cuda_graphs_take_their_scopes_ops_off_the_host():
    """Graphed router (0.3 of the layer's ~50 forward MoE ops) and preprocess (0.2) scopes replay without the host;
    the per-expert ops stay eager; whole-layer graphs leave only the graphed dense part; a full-iteration graph
    replays the whole step, so no layer waits on the host."""
    from genconf.plan.cost import layer_time

    model, cluster, cal, plan, dense_part = _qwen3_host_case()

    def host(impl, *scope):
        return layer_time(model, dataclasses.replace(plan, cuda_graph_impl=impl, cuda_graph_scope=scope), cluster,
                          cal).host_s

    assert host("transformer_engine", "attn") == pytest.approx(dense_part + (200 + 30 * 16) * 2e-5)
    assert host("transformer_engine", "attn", "moe_router") == pytest.approx(dense_part + (140 + 30 * 16) * 2e-5)
    assert host("transformer_engine", "attn", "moe_router", "moe_preprocess") == \
        pytest.approx(dense_part + (100 + 30 * 16) * 2e-5)
    assert host("local") == pytest.approx(dense_part)
    assert host("local", "full_iteration") == 0.0
    # what the host time costs: the same layout is faster with its MoE routing graphed, not slower
    speeds = [evaluate(model, cluster, dataclasses.replace(plan, cuda_graph_impl=impl, cuda_graph_scope=scope), 8,
                       calibration_for("b200")).cost.tokens_per_s_per_gpu
              for impl, scope in (("none", ()), ("transformer_engine", ("attn", "moe_router", "moe_preprocess")),
                                  ("local", ("full_iteration",)))]
    assert speeds[0] < speeds[1] < speeds[2]


def test_small_micro_batches_of_a_dropless_moe_are_host_bound():
    """Megatron-Bridge 26.02 / 26.04, Qwen3-30B-A3B MXFP8 on 8 B200, EP 8, the same layout at micro-batch 1 and 4:
    9,691 and 26,859 tokens/s per GPU (2.8x), because the host's time per MoE layer does not shrink with the
    micro-batch. The calibrated model must show most of that gap (a GPU-only model shows 1.1x)."""
    model, cluster, cal = resolve_model("qwen3-30b-a3b")[0], resolve_cluster("dgx-b200"), calibration_for("b200")
    speed = {}
    for mbs in (1, 4):
        plan = ParallelPlan(framework="megatron", ep=8, dp=8, mbs=mbs, gbs=512, seq_length=4096, zero_stage=1,
                            precision="fp8", fp8_recipe="mxfp8", grad_dtype="bf16")
        speed[mbs] = evaluate(model, cluster, plan, 8, cal, check_rules=False).cost.tokens_per_s_per_gpu
    assert 2.0 < speed[4] / speed[1] < 4.0, speed
