"""megatron_args.txt: every flag is a Megatron-LM argument, megatron-core's TransformerConfig accepts every argument
set, and the TransformerConfig kwargs the megatron runner uses are the ones the text says."""

from __future__ import annotations

import pytest

from conftest import MEGATRON_PLANS, needs_megatron, plan_of, report_plan, transformer_config
from genconf.check.directory import check_dir
from genconf.check.megatron import parse_megatron_args
from genconf.plan.equivalent import equivalent_plan
from genconf.plan.planfile import decode
from genconf.render.megatron import MEGATRON_FLAGS, config_kwargs, megatron_config_kwargs


@needs_megatron
@pytest.mark.parametrize("name", MEGATRON_PLANS)
def test_megatron_core_accepts_every_argument_set(rendered, name):
    d = rendered[name]
    args, problems = parse_megatron_args((d / "megatron_args.txt").read_text())
    assert problems == []  # every flag is a Megatron-LM argument, typed and within its choices
    cfg = transformer_config(args)
    plan, _ = equivalent_plan(report_plan(plan_of(d)), "megatron")
    assert (cfg.tensor_model_parallel_size, cfg.pipeline_model_parallel_size, cfg.context_parallel_size,
            cfg.expert_model_parallel_size) == (plan.tp, plan.pp, plan.cp, plan.ep)
    assert cfg.virtual_pipeline_model_parallel_size == (plan.vp if plan.vp > 1 else None)
    assert cfg.sequence_parallel == plan.sequence_parallel
    assert cfg.recompute_granularity == (None if plan.recompute == "none" else plan.recompute)
    if name == "gqa_fp8_pp2vp2":
        assert cfg.gated_linear_unit and cfg.normalization == "RMSNorm" and cfg.num_query_groups == 8
        assert (cfg.fp8, cfg.fp8_recipe, cfg.first_last_layers_bf16) == ("hybrid", "tensorwise", True)
        assert cfg.num_layers_at_start_in_bf16 == cfg.num_layers_at_end_in_bf16 == 1
        # pp=2 with interleaving: p2p overlapped, never batched (Megatron-LM issues 750, 1450)
        assert cfg.overlap_p2p_comm and not cfg.batch_p2p_comm
    if name == "moe_ep_cp":
        assert cfg.num_moe_experts == 8 and cfg.moe_router_topk == 2
        # the grouped GEMM the cost model prices (megatron-core's default is one GEMM per expert)
        assert cfg.moe_grouped_gemm and "--moe-grouped-gemm\n" in (d / "megatron_args.txt").read_text()
    if name == "uneven_pp":
        assert (cfg.num_layers_in_first_pipeline_stage, cfg.num_layers_in_last_pipeline_stage) == (10, 10)
    if name == "window":
        assert (cfg.window_size, cfg.window_attn_skip_freq) == ((4096, 0), None)  # every layer windowed
    if name == "pp_layout":
        # megatron-core reads the layout itself and derives vp from it: rank 3 holds 11 layers, the last 9
        assert str(cfg.pipeline_model_parallel_layout) == "Et*2|(t*2|)*34,t*3|(t*2|)*3,tL"
        assert cfg.virtual_pipeline_model_parallel_size == 5
        assert [sum(len([t for t in chunk if t.name == "decoder"]) for chunk in row)
                for row in cfg.pipeline_model_parallel_layout.layout] == [10, 10, 10, 11, 10, 10, 10, 9]
        assert "--num-virtual-stages-per-pipeline-rank" not in (d / "megatron_args.txt").read_text()
    if name == "full_fp16_local":
        assert cfg.fp16 and cfg.recompute_method == "uniform" and cfg.recompute_num_layers == 1
    if name == "fp8_block_knobs":
        assert (cfg.fp8, cfg.fp8_recipe, cfg.fp8_param) == ("e4m3", "blockwise", True)
        assert cfg.recompute_method == "block" and cfg.recompute_num_layers == 2
        text = (d / "megatron_args.txt").read_text()
        assert "--grad-reduce-in-bf16\n" in text and "--use-precision-aware-optimizer\n" in text
        assert "--exp-avg-dtype bf16\n--exp-avg-sq-dtype bf16\n" in text  # Adam's moments in BF16, read back:
        assert plan.adam_moments_dtype == "bf16" and not plan.optimizer_keeps_remainders
    if name == "moe_ep_overlap":
        # megatron-core's own checks of the EP overlap (expert parallelism, alltoall dispatcher, no full recompute,
        # a virtual pipeline with pp > 1, bf16) passed in building cfg
        assert cfg.overlap_moe_expert_parallel_comm and cfg.delay_wgrad_compute
        assert cfg.moe_token_dispatcher_type == "alltoall" and cfg.virtual_pipeline_model_parallel_size == 2
    if name == "moe_flex":
        # megatron-core's own checks of the flex dispatcher passed in building cfg
        assert (cfg.moe_token_dispatcher_type, cfg.moe_flex_dispatcher_backend) == ("flex", "hybridep")
        text = (d / "megatron_args.txt").read_text()
        assert "--moe-token-dispatcher-type flex\n--moe-flex-dispatcher-backend hybridep\n" in text
    if name == "moe_cuda_graphs":
        # megatron-core's own scope checks passed (moe_preprocess beside moe_router, MoE scopes on a MoE model)
        assert cfg.cuda_graph_impl == "transformer_engine"
        assert [s.name for s in cfg.cuda_graph_scope] == ["attn", "moe_router", "moe_preprocess"]
        # Megatron-LM refuses TE graphs over expandable segments unless NCCL leaves graph buffers unregistered
        sbatch = (d / "launch_megatron.sbatch").read_text()
        assert "expandable_segments:True" in sbatch and "\nexport NCCL_GRAPH_REGISTER=0\n" in sbatch
    if name == "megatron_fsdp":
        text = (d / "megatron_args.txt").read_text()
        assert "--use-megatron-fsdp\n" in text and "--data-parallel-sharding-strategy optim_grads_params" in text
        assert "--ckpt-format fsdp_dtensor" in text
        assert "CUDA_DEVICE_MAX_CONNECTIONS" not in (d / "launch_megatron.sbatch").read_text().replace("# ", "")
        # With its TP (tp=2), the check does not ask for the 1 that Megatron-LM refuses under Megatron-FSDP, and flags it
        assert not check_dir(d).problems
        env = d / "launch_env.sh"
        saved = env.read_text()
        try:
            env.write_text(saved + "export CUDA_DEVICE_MAX_CONNECTIONS=1\n")
            problems = [str(p) for p in check_dir(d).problems]
            assert len(problems) == 1 and "Megatron-FSDP needs CUDA_DEVICE_MAX_CONNECTIONS other than 1" in problems[0]
        finally:
            env.write_text(saved)


def test_emitted_flags_are_megatron_lm_arguments(rendered):
    for name, d in rendered.items():
        text = (d / "megatron_args.txt").read_text()
        flags = [line.split()[0] for line in text.splitlines() if line and not line.startswith("#")]
        assert flags and all(flag in MEGATRON_FLAGS for flag in flags), name
        assert "--no-overlap-p2p-communication" not in flags and "--use-mcore-models" not in flags


@pytest.mark.parametrize("name", MEGATRON_PLANS)
def test_the_runners_config_is_what_the_text_says(rendered, name):
    """render/megatron gives the argument list and the TransformerConfig kwargs from the same plan: the kwargs the
    megatron runner builds its model from equal those of the written text, read back as Megatron-LM reads it."""
    d = rendered[name]
    pf = decode(plan_of(d))
    args, problems = parse_megatron_args((d / "megatron_args.txt").read_text())
    assert problems == []
    written = megatron_config_kwargs({flag: a.value for flag, a in args.items()})
    assert written == config_kwargs(pf.model, pf.plan, pf.train)
    assert written["tensor_model_parallel_size"] == equivalent_plan(pf.plan, "megatron")[0].tp


CUDA_GRAPH_CASES = [
    # (model, plan fields, impl, scope): the rule book and megatron-core's TransformerConfig must agree on each
    ("mixtral-8x7b", dict(ep=8, dp=8), "transformer_engine", ("attn", "moe_router", "moe_preprocess")),
    ("mixtral-8x7b", dict(ep=8, dp=8), "transformer_engine", ("moe_preprocess",)),
    ("mixtral-8x7b", dict(ep=8, dp=8), "transformer_engine", ("mlp",)),
    ("mixtral-8x7b", dict(ep=8, dp=8), "transformer_engine", ("moe",)),
    ("mixtral-8x7b", dict(ep=8, dp=8), "local", ()),
    ("mixtral-8x7b", dict(ep=8, dp=8), "local", ("moe_router",)),
    ("llama3-8b", dict(dp=8), "transformer_engine", ("moe_router",)),
    ("llama3-8b", dict(dp=8), "transformer_engine", ("full_iteration",)),
    ("llama3-8b", dict(dp=8), "local", ("full_iteration",)),
    ("llama3-8b", dict(dp=8), "transformer_engine", ("attn", "mlp")),
    ("llama3-8b", dict(dp=8, recompute="full"), "transformer_engine", ("attn",)),
    ("llama3-8b", dict(dp=8, recompute="full"), "local", ("full_iteration",)),
    ("gpt3-175b", dict(tp=8, dp=1, sequence_parallel=True, recompute="selective"), "transformer_engine", ("attn",)),
    ("gpt3-175b", dict(tp=8, dp=1, sequence_parallel=True, recompute="selective"), "transformer_engine", ("mlp",)),
    ("gpt3-175b", dict(tp=8, dp=1, sequence_parallel=True, recompute="selective"), "local", ()),
]


@needs_megatron
@pytest.mark.parametrize("model_name, fields, impl, scope", CUDA_GRAPH_CASES)
def test_the_cuda_graph_rule_agrees_with_megatron_core(model_name, fields, impl, scope):
    """Each plan the rule accepts builds megatron-core's TransformerConfig from its rendered arguments; each one it
    refuses, megatron-core refuses too (an assertion in TransformerConfig.__post_init__)."""
    from megatron.core.transformer import TransformerConfig

    from genconf.catalog.clusters import resolve_cluster
    from genconf.catalog.models import resolve_model
    from genconf.plan import rules
    from genconf.plan.specs import ParallelPlan, TrainSpec
    from genconf.render.megatron import arg_values, megatron_args
    from genconf.train.runners.megatron import with_torch_values

    model, _ = resolve_model(model_name)
    plan = ParallelPlan(framework="megatron", mbs=1, gbs=64, seq_length=4096, cuda_graph_impl=impl,
                        cuda_graph_scope=scope, **fields)
    verdict = rules.check(rules.Context(model, resolve_cluster("dgx-h100"), plan, plan.world_size))
    refused = any(v.rule == "cuda_graphs" for v in verdict)
    kw = with_torch_values(megatron_config_kwargs(arg_values(megatron_args(model, plan, TrainSpec(train_steps=10)))))
    try:
        TransformerConfig(**kw)
        accepted = True
    except (AssertionError, ValueError):
        accepted = False
    assert accepted is not refused, ([str(v) for v in verdict], impl, scope)
