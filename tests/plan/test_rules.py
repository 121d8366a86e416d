"""The rule book: each rule, broken on its own, is named and says the numbers and the nearest fix; the search and
`genconf check` report exactly these messages (tests/plan/test_search.py, tests/check/test_check.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from genconf.catalog.clusters import resolve_cluster
from genconf.catalog.models import resolve_model
from genconf.plan import rules
from genconf.plan.memory import estimate
from genconf.plan.specs import ParallelPlan


def violations(model: str, plan: ParallelPlan, *, cluster: str | None = None, gpus: int | None = None) -> dict:
    m, _ = resolve_model(model)
    c = resolve_cluster(cluster)
    return {v.rule: v.message for v in rules.check(rules.Context(m, c, plan, gpus or plan.world_size))}


def megatron(**kw) -> ParallelPlan:
    base = dict(framework="megatron", dp=1, mbs=1, gbs=8, seq_length=4096)
    base.update(kw)
    return ParallelPlan(**base)


def test_rules_name_the_numbers():
    model, _ = resolve_model("llama3-8b")
    cluster = resolve_cluster()
    plan = ParallelPlan(framework="megatron", tp=8, pp=1, dp=48, mbs=3, gbs=100, seq_length=8192)
    found = {v.rule: v.message for v in rules.check(rules.Context(model, cluster, plan, 384))}
    assert "world_size" not in found  # 48 x 1 x 8 x 1 = 384
    assert "tp (8) must stay inside one NVLink domain of 4 GPUs" in found["tp_inside_node"]
    assert "global batch (100) must be divisible by mbs x dp (3 x 48 = 144)" in found["batch_divisible"]


def test_whole_nodes():
    assert rules.whole_nodes_error(7, 4) == "7 GPUs is not a whole number of 4-GPU nodes; use 4 or 8"
    assert rules.whole_nodes_error(2, 4) is None  # part of one node
    assert rules.whole_nodes_error(384, 4) is None
    assert rules.whole_nodes_error(0, 4) == "the number of GPUs must be positive, got 0"


def test_world_size():
    found = violations("llama3-8b", megatron(tp=2, pp=2, dp=3, gbs=12), gpus=16)
    assert found["world_size"] == "dp(3) * cp(1) * tp(2) * pp(2) = 12 != world size (16); dp would be 4"


def test_tensor_parallel_divides_heads_kv_heads_and_stays_in_a_node():
    # llama3-8b: 32 heads, 8 KV heads. tp=3: the divisors of 32 nearest 3 are 2 and 4; the larger wins.
    assert violations("llama3-8b", megatron(tp=3, gbs=8))["tp_divides_heads"] == (
        "tp (3) must divide num_attention_heads (32); nearest: tp=4")
    found = violations("llama3-8b", megatron(tp=16), cluster="dgx-h100")
    assert found["tp_divides_kv_heads"] == "tp (16) must divide num_query_groups (8, the KV heads); nearest: tp=8"
    assert found["tp_inside_node"] == ("tp (16) must stay inside one NVLink domain of 8 GPUs (and divide it); "
                                       "nearest: tp=8")


def test_pipeline_split_and_virtual_stages():
    # 80 layers over pp=3 x vp=4 = 12 chunks do not divide.
    found = violations("70b", megatron(tp=4, pp=3, vp=4, dp=32, gbs=1056), gpus=384)
    assert found["pipeline_split"] == ("num_layers (80) is not divisible by pp x vp (3 x 4 = 12); set --pp to a "
                                       "divisor of 80 or an uneven split (first/last stage layers)")
    assert violations("llama3-8b", megatron(vp=2))["vp_needs_pp"] == "vp (2) needs pipeline parallelism (pp > 1)"
    # 6 micro-batches on 4 interleaved stages: megatron-core needs a multiple of 4; 8 x mbs 1 x dp 1 = 8.
    found = violations("llama3-8b", megatron(pp=4, vp=2, gbs=6))
    assert found["interleave_microbatches"] == ("interleaved schedule needs micro-batches (6) to be a multiple of pp "
                                                "(4) (megatron-core schedules.py); use --global-batch 8")
    # Fewer micro-batches than stages is allowed, with the bubble it costs: (4-1)/(1 x 2) = 150%.
    assert violations("llama3-8b", megatron(pp=4, gbs=2))["pipeline_bubble"] == (
        "only 2 micro-batches for 4 stages: the pipeline bubble is 150% of the compute time")


def test_batch_context_and_expert_parallelism():
    assert violations("llama3-8b", megatron(dp=4, mbs=2, gbs=20), gpus=4)["batch_divisible"] == (
        "global batch (20) must be divisible by mbs x dp (2 x 4 = 8); nearest: 16 or 24")
    found = violations("llama3-8b", megatron(cp=3, seq_length=4096, layer_spec="local"))
    assert found["cp_divides_sequence"] == ("sequence length (4096) must be divisible by 2 x cp (6): causal load "
                                            "balancing splits it into 2 x cp chunks")
    assert found["cp_needs_te"] == "context parallelism needs Transformer Engine attention (--layer-spec te)"
    # Transformer Engine's context parallelism over p2p (megatron's default cp_comm_type) refuses a window shorter
    # than the sequence (context_parallel.py); one covering the sequence is plain causal attention.
    assert "--cp-comm-type a2a" in violations("mistral-7b-v0.1", megatron(cp=2, seq_length=8192))["cp_window"]
    assert "cp_window" not in violations("mistral-7b-v0.1", megatron(cp=2, seq_length=4096))
    # mixtral-8x7b: 8 experts.
    assert violations("mixtral-8x7b", megatron(dp=3, ep=3, gbs=6), gpus=3)["ep_divides_experts"] == (
        "ep (3) must divide num_experts (8); nearest: ep=4")
    assert violations("llama3-8b", megatron(dp=2, ep=2, gbs=2))["ep_divides_experts"] == (
        "ep (2) on a dense model: expert parallelism needs num_experts > 0")


def test_the_ep_overlap_needs_what_megatron_core_asserts():
    # megatron-core TransformerConfig: overlap_moe_expert_parallel_comm needs expert parallelism, no full recompute,
    # a virtual pipeline when pp > 1, and 16-bit parameters; Megatron-LM: --delay-wgrad-compute needs TE layers.
    ok = megatron(dp=8, ep=8, gbs=8, moe_ep_overlap=True)
    assert "moe_ep_overlap" not in violations("mixtral-8x7b", ok, gpus=8)
    assert "moe_ep_overlap" not in violations("mixtral-8x7b", megatron(dp=4, pp=2, vp=2, ep=4, gbs=8,
                                                                      moe_ep_overlap=True), gpus=8)
    needs = "--moe-ep-overlap hides megatron's expert-parallel all-to-all: it needs a MoE model with --ep > 1"
    assert violations("mixtral-8x7b", megatron(dp=8, gbs=8, moe_ep_overlap=True), gpus=8)["moe_ep_overlap"] == needs
    assert violations("llama3-8b", megatron(dp=8, gbs=8, moe_ep_overlap=True), gpus=8)["moe_ep_overlap"] == needs
    assert violations("mixtral-8x7b", ParallelPlan(framework="deepspeed", dp=8, mbs=1, gbs=8, seq_length=4096,
                                                   moe_ep_overlap=True), gpus=8)["moe_ep_overlap"] == needs
    assert violations("mixtral-8x7b", megatron(dp=8, ep=8, gbs=8, recompute="full", moe_ep_overlap=True),
                      gpus=8)["moe_ep_overlap"] == (
        "--moe-ep-overlap runs without full recompute (megatron-core); use --recompute selective or none")
    assert violations("mixtral-8x7b", megatron(dp=4, pp=2, ep=4, gbs=8, moe_ep_overlap=True),
                      gpus=8)["moe_ep_overlap"] == (
        "--moe-ep-overlap with pp > 1 needs virtual stages (--vp > 1): megatron's combined 1F1B schedule")
    assert violations("mixtral-8x7b", megatron(dp=8, ep=8, gbs=8, precision="fp32", moe_ep_overlap=True),
                      gpus=8)["moe_ep_overlap"] == "--moe-ep-overlap needs bf16/fp16 parameters, not fp32"
    assert violations("mixtral-8x7b", megatron(dp=8, ep=8, gbs=8, layer_spec="local", moe_ep_overlap=True),
                      gpus=8)["moe_ep_overlap"] == (
        "--moe-ep-overlap needs Transformer Engine layers (--layer-spec te) for its deferred weight gradients")


def test_the_flex_dispatcher_needs_megatron_moe_with_ep_and_hybridep_over_multi_node_nvlink():
    # megatron-core 0.16.1: moe_token_dispatcher_type flex with moe_flex_dispatcher_backend deepep or hybridep; only
    # hybridep supports multi-node NVLink (the MNNVL case).
    for backend in ("deepep", "hybridep"):
        ok = megatron(dp=16, ep=16, gbs=16, moe_dispatcher=backend)
        assert "moe_dispatcher" not in violations("qwen3-30b-a3b", ok, cluster="dgx-h100")
        needs = f"--moe-dispatcher {backend} is megatron's flex token dispatcher: it needs a MoE model with --ep > 1"
        assert violations("qwen3-30b-a3b", megatron(dp=16, gbs=16, moe_dispatcher=backend),
                          cluster="dgx-h100")["moe_dispatcher"] == needs
        assert violations("llama3-8b", megatron(dp=16, gbs=16, moe_dispatcher=backend),
                          cluster="dgx-h100")["moe_dispatcher"] == needs
    rack = megatron(dp=64, ep=64, gbs=64, moe_dispatcher="deepep")
    assert violations("qwen3-30b-a3b", rack, cluster="gb200-nvl72")["moe_dispatcher"] == (
        "--moe-dispatcher deepep does not run over multi-node NVLink (gb200-nvl72: 72 GPUs per NVLink domain); "
        "megatron-core's hybridep backend does: use --moe-dispatcher hybridep")
    assert "moe_dispatcher" not in violations("qwen3-30b-a3b", replace(rack, moe_dispatcher="hybridep"),
                                              cluster="gb200-nvl72")
    with pytest.raises(ValueError, match="moe_dispatcher"):
        megatron(dp=8, ep=8, moe_dispatcher="nccl")


def test_cuda_graphs_capture_what_megatron_core_allows():
    # megatron-core 0.16.1 TransformerConfig.__post_init__ (cuda_graph_impl / cuda_graph_scope) and Megatron-LM's
    # --cuda-graph-scope help
    def graphs(model, plan, impl, *scope):
        return violations(model, replace(plan, cuda_graph_impl=impl, cuda_graph_scope=scope), gpus=8).get("cuda_graphs")

    moe, dense = megatron(dp=8, ep=8, gbs=8), megatron(dp=8, gbs=8)
    assert graphs("mixtral-8x7b", moe, "transformer_engine", "attn", "moe_router", "moe_preprocess") is None
    assert graphs("mixtral-8x7b", moe, "local", "full_iteration") is None
    assert graphs("llama3-8b", dense, "local") is None  # whole layers
    assert graphs("llama3-8b", dense, "transformer_engine", "attn", "mlp") is None
    assert graphs("llama3-8b", dense, "none", "attn") == "--cuda-graph-scope needs --cuda-graph-impl (local or transformer_engine)"
    assert graphs("llama3-8b", ParallelPlan(framework="fsdp", dp=8, mbs=1, gbs=8, seq_length=4096, zero_stage=3),
                  "local") == "--cuda-graph-impl is megatron's CUDA graph capture; fsdp plans run eagerly"
    assert graphs("llama3-8b", dense, "transformer_engine", "full_iteration") == (
        "--cuda-graph-scope full_iteration captures the whole step with --cuda-graph-impl local")
    assert graphs("llama3-8b", dense, "local", "attn") is None  # megatron-core's own partial graphs
    assert graphs("mixtral-8x7b", moe, "transformer_engine", "moe").startswith(
        "--cuda-graph-scope moe captures drop-and-pad experts only")
    assert graphs("mixtral-8x7b", moe, "transformer_engine", "moe_preprocess") == (
        "--cuda-graph-scope moe_preprocess needs moe_router beside it (megatron-core)")
    assert graphs("llama3-8b", dense, "transformer_engine", "moe_router") == (
        "--cuda-graph-scope moe_router/moe_preprocess capture MoE routing; llama3-8b has no experts")
    assert graphs("mixtral-8x7b", moe, "transformer_engine", "mlp").startswith("--cuda-graph-scope mlp captures dense")
    assert graphs("llama3-8b", replace(dense, recompute="full"), "transformer_engine", "attn").startswith(
        "full recompute runs under CUDA graphs only with --cuda-graph-scope full_iteration")
    assert graphs("llama3-8b", replace(dense, recompute="full"), "local", "full_iteration") is None
    # Attention dropout with graphed attention recomputation (genconf's selective recompute is core_attn).
    dropout = megatron(tp=8, dp=1, gbs=8, sequence_parallel=True, recompute="selective")
    assert graphs("gpt3-175b", dropout, "transformer_engine", "attn").startswith(
        "attention dropout (0.1) is not supported with graphed attention recomputation")
    assert graphs("gpt3-175b", dropout, "local", "full_iteration").startswith("attention dropout")
    assert graphs("gpt3-175b", dropout, "transformer_engine", "mlp") is None
    assert graphs("llama3-8b", replace(dense, offload_activation_layers=2), "transformer_engine", "attn") == (
        "CUDA graphs do not run with activation offload (megatron-core cpu_offloading)")
    overlap = replace(moe, moe_ep_overlap=True)
    assert graphs("mixtral-8x7b", overlap, "transformer_engine", "attn", "moe_router") is None
    assert graphs("mixtral-8x7b", overlap, "local", "full_iteration").startswith(
        "--moe-ep-overlap runs with CUDA graphs of --cuda-graph-impl transformer_engine only")


def test_frameworks_precision_offload_and_recompute():
    found = violations("1b", ParallelPlan(framework="deepspeed", tp=2, dp=4, mbs=1, gbs=8, seq_length=4096,
                                          recompute="selective", precision="fp8"))
    assert found["framework_degrees"] == ("framework deepspeed runs data parallelism only here (DeepSpeed ZeRO, OLMo "
                                          "FSDP); tp=2 needs --framework megatron")
    assert found["recompute"] == ("selective recompute is Megatron's; deepspeed checkpoints whole layers "
                                  "(--recompute full)")
    assert found["precision"] == ("FP8 runs through Transformer Engine (--framework megatron --layer-spec te) or "
                                  "torchao's float8 layers (--framework fsdp)")
    assert violations("1b", megatron(precision="fp8"), cluster="dgx-a100")["gpu_precision"] == (
        "FP8 needs Hopper or Blackwell tensor cores; NVIDIA A100-SXM4-80GB has none (use --precision bf16)")
    assert violations("1b", ParallelPlan(framework="fsdp", dp=2, mbs=1, gbs=2, seq_length=2048, zero_stage=3,
                                         offload_optimizer=True))["offload"] == (
        "CPU offload is a DeepSpeed ZeRO feature here; use --framework deepspeed")
    assert violations("1b", megatron(tp=1, sequence_parallel=True))["sequence_parallel"] == (
        "sequence parallelism needs tp > 1")


def test_first_error_only_stops_at_the_first():
    m, _ = resolve_model("llama3-8b")
    ctx = rules.Context(m, resolve_cluster(), megatron(tp=3, dp=5, mbs=2, gbs=7), 4)
    every = rules.check(ctx)
    first = rules.check(ctx, first_error_only=True)
    assert len(every) > 1 and first == every[:1] and first[0].severity == rules.ERROR


def test_memory_violation_gives_the_breakdown_and_what_to_try():
    m, _ = resolve_model("70b")
    cluster = resolve_cluster()
    plan = megatron(tp=4, pp=1, dp=1, mbs=2, gbs=8)
    v = rules.memory_violation(rules.Context(m, cluster, plan, 4), estimate(m, plan, cluster))
    assert v.rule == "memory_fits" and v.severity == rules.ERROR
    assert v.message.startswith("stage 0 needs ") and "GiB (params " in v.message
    assert v.message.endswith("on h100-sxm; try --recompute full, --mbs 1, more GPUs or tp/pp")
    # Under partial CUDA graphs megatron-core refuses full recompute: the advice says what it takes.
    graphed = replace(plan, cuda_graph_impl="transformer_engine", cuda_graph_scope=("attn",))
    v = rules.memory_violation(rules.Context(m, cluster, graphed, 4), estimate(m, graphed, cluster))
    assert v.message.endswith("try --recompute full without partial CUDA graphs (or with --cuda-graph-scope "
                              "full_iteration), --recompute selective --recompute-modules layernorm,mlp, --mbs 1, "
                              "more GPUs or tp/pp")


def test_every_rule_has_one_name():
    names = [r.name for r in rules.RULES]
    assert len(names) == len(set(names)) and set(names) <= set(rules.RULE_NAMES)
    assert {r.severity for r in rules.RULES} == {rules.ERROR, rules.WARNING}


@pytest.mark.parametrize("plan", [megatron(tp=4, pp=4, vp=4, dp=24, gbs=1056, sequence_parallel=True, zero_stage=1)])
def test_the_main_jobs_plan_breaks_no_rule(plan):
    assert violations("70b", plan) == {}


def test_flash_attention_is_not_pinned_for_sliding_window_layers():
    """genconf's own model runs windowed layers with a band mask, which PyTorch's flash attention does not take;
    where the window covers the sequence the layers run plain causal attention and any kernel may be pinned."""
    from genconf.plan.rules import attention_kernel_window_conflict

    model = resolve_model("mistral-7b-v0.1")[0]
    assert "takes no mask" in attention_kernel_window_conflict("flash2", model, 8192)
    assert attention_kernel_window_conflict("flash2", model, 4097) is None  # 4,096 keys back: every key
    assert attention_kernel_window_conflict("auto", model, 8192) is None
    assert attention_kernel_window_conflict("flash2", resolve_model("llama3-8b")[0], 8192) is None
    plan = ParallelPlan(framework="fsdp", dp=8, mbs=1, gbs=8, seq_length=8192, zero_stage=3, attention_kernel="flash2")
    assert "attention_kernel" in violations("mistral-7b-v0.1", plan)


def test_a_pinned_attention_kernel_must_take_the_head_dim():
    """The SDPA backend a pinned kernel runs must take the model's head dim, or the launch stops at its first step
    ("No available kernel"): on an H200 cuDNN's attention took neither 150 nor 448, flash took 150 and not 450
    (results/misaligned_gemm_h200.md)."""
    from genconf.plan.rules import attention_kernel_head_dim_conflict

    assert attention_kernel_head_dim_conflict("cudnn", 128) is None
    assert "multiples of 8 up to 256" in attention_kernel_head_dim_conflict("cudnn", 150)
    assert "multiples of 8 up to 256" in attention_kernel_head_dim_conflict("cudnn", 448)
    assert attention_kernel_head_dim_conflict("flash2", 150) is None
    assert "up to 256" in attention_kernel_head_dim_conflict("flash2", 450)
    assert attention_kernel_head_dim_conflict("auto", 450) is None
    assert attention_kernel_head_dim_conflict("math", 450) is None
    model = replace(resolve_model("gpt3-13b")[0], hidden_size=150 * 32, num_attention_heads=32, num_query_groups=32,
                    ffn_hidden_size=4 * 150 * 32, kv_channels=150)
    plan = ParallelPlan(framework="fsdp", dp=8, mbs=1, gbs=8, seq_length=2048, zero_stage=3, attention_kernel="cudnn")
    found = rules.check(rules.Context(model, resolve_cluster("dgx-h100"), plan, 8))
    assert any("--attention-kernel cudnn" in v.message for v in found), found
    auto = rules.check(rules.Context(model, resolve_cluster("dgx-h100"), replace(plan, attention_kernel="auto"), 8))
    assert not any("--attention-kernel" in v.message for v in auto), auto


def test_block_recompute_takes_at_most_a_chunks_layers():
    # 1b: 16 layers over pp 8 x vp 1 = 2 a chunk; megatron's block method recomputes min(N, chunk) layers, so a
    # larger N is full recompute shown as something else.
    found = violations("1b", megatron(pp=8, recompute="full", recompute_layers=100))
    assert found["recompute"] == ("--recompute-layers (100) is more than a model chunk holds: at most 2 layers "
                                  "(16 layers over pp 8 x vp 1); use --recompute-layers 2")
    assert "recompute" not in violations("1b", megatron(pp=8, recompute="full", recompute_layers=2))
    assert "recompute" not in violations("1b", megatron(recompute="full", recompute_layers=16))


def test_bridged_pairs_keep_tp_in_the_pair_and_refuse_the_flex_dispatcher():
    found = violations("llama3-8b", megatron(tp=4), cluster="pcie-h100", gpus=8)
    assert found["tp_inside_node"] == ("tp (4) must stay inside one NVLink domain of 2 GPUs (and divide it); "
                                       "nearest: tp=2")
    assert "tp_inside_node" not in violations("llama3-8b", megatron(tp=2), cluster="pcie-h100", gpus=8)
    moe = megatron(ep=8, moe_dispatcher="deepep", gbs=8)
    assert violations("mixtral-8x7b", moe, cluster="pcie-h100", gpus=8)["moe_dispatcher"] == (
        "--moe-dispatcher deepep needs NVLink between all GPUs of a node (pcie-h100: NVLink only in groups of 2 of "
        "its 8); use --moe-dispatcher alltoall")
