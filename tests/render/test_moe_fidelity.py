"""Mixture-of-experts artifacts as megatron-core builds them (the probe of 2026-11-29): each catalog MoE model's
router as published (DeepSeek-V3's sigmoid scores, expert bias, groups and scaling; Qwen3's renormalised softmax;
GPT-OSS without a balancing loss), MLA's latent norms, and the layouts megatron-core refuses at start-up (biased
experts split over tensor-parallel ranks, top-1 softmax routing without pre-softmax, EP overlap with an MTP layer
and no pipeline) refused by genconf instead; plans genconf's runners cannot build are refused before any rank
starts, and say so in their README."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from conftest import REPO, genconf_quiet, needs_megatron
from genconf.catalog import hf
from genconf.catalog.models import list_models, resolve_model
from genconf.plan import rules
from genconf.plan.runconfig import needs_te_attention, read_plan, unbuildable
from genconf.plan.specs import ModelSpec, ParallelPlan, TrainSpec
from genconf.render.files import artifact_names
from genconf.render.megatron import arg_values, config_kwargs, megatron_args, megatron_plan

HF = REPO / "tests" / "data" / "hf"
ROUTERS = {  # (score function, expert bias, top-k scaling, groups, group top-k, balancing, coefficient)
    "deepseek-v3": ("sigmoid", True, 2.5, 8, 4, "seq_aux_loss", 1e-4),
    "kimi-k2": ("sigmoid", True, 2.827, 1, 1, "seq_aux_loss", 1e-3),
    "nemotron-3-nano": ("sigmoid", True, 2.5, 1, 1, "seq_aux_loss", 1e-4),
    "nemotron-3-super": ("sigmoid", True, 5.0, None, None, "seq_aux_loss", 1e-4),
    "qwen3-30b-a3b": ("softmax", False, None, None, None, "aux_loss", 1e-3),
    "mixtral-8x7b": ("softmax", False, None, None, None, "aux_loss", 0.02),
    "gpt-oss-120b": ("softmax", False, None, None, None, "none", 0.0),
    # NeMo Llama4Config: top-1 sigmoid, megatron-core's aux_loss type at its default coefficient 0
    "llama4-maverick": ("sigmoid", False, None, None, None, "aux_loss", 0.0),
    "llama4-scout": ("sigmoid", False, None, None, None, "aux_loss", 0.0),
}


def _plan(model: ModelSpec, **kw) -> ParallelPlan:
    return ParallelPlan(**{"framework": "megatron", "tp": 1, "pp": 1, "dp": 8, "ep": 8, "mbs": 1, "gbs": 8,
                           "seq_length": 4096, **kw})


def _values(model: ModelSpec, **kw) -> dict:
    return arg_values(megatron_args(model, _plan(model, **kw), TrainSpec(train_steps=10)))


@pytest.mark.parametrize("name", sorted(ROUTERS))
def test_each_catalog_router_is_written_and_read_back(name):
    model = resolve_model(name)[0]
    score, bias, scaling, groups, group_topk, balancing, coeff = ROUTERS[name]
    got = (model.moe_router_score_function, model.moe_router_expert_bias, model.moe_router_topk_scaling_factor,
           model.moe_router_num_groups, model.moe_router_group_topk, model.moe_router_load_balancing,
           model.moe_aux_loss_coeff)
    assert got == ROUTERS[name]
    values = _values(model)
    assert values.get("--moe-router-score-function", "softmax") == score
    assert ("--moe-router-enable-expert-bias" in values) == bias
    assert values.get("--moe-router-topk-scaling-factor") == scaling
    assert (values.get("--moe-router-num-groups"), values.get("--moe-router-group-topk")) == (groups, group_topk)
    assert values.get("--moe-router-load-balancing-type", "aux_loss") == balancing
    assert values.get("--moe-aux-loss-coeff", 0.0) == coeff
    back, _ = megatron_plan(values, model, 8)
    assert [getattr(back, f) for f in ("moe_router_score_function", "moe_router_expert_bias",
                                       "moe_router_topk_scaling_factor", "moe_router_num_groups",
                                       "moe_router_group_topk", "moe_router_load_balancing",
                                       "moe_aux_loss_coeff", "moe_router_pre_softmax")] == \
        [*got, model.moe_router_pre_softmax]


def test_mla_writes_the_latent_norms_genconf_counts():
    """megatron-core's MLA builds its q and kv latent RMSNorms under --qk-layernorm (gpt_layer_specs); genconf
    counts them (counting._attention_tensors), so the file must ask for them."""
    assert "--qk-layernorm" in _values(resolve_model("deepseek-v3")[0])


def test_qwen3_moe_without_norm_topk_prob_is_megatron_s_pre_softmax_router():
    """transformers' Qwen3MoeConfig defaults norm_topk_prob to false: a softmax over every expert, not renormalised
    (Megatron-Bridge's Qwen3-MoE bridge: pre_softmax = not norm_topk_prob)."""
    data = json.loads((HF / "qwen3-30b-a3b" / "config.json").read_text())
    assert not hf.model_from_config(data, name="q", where="c")[0].moe_router_pre_softmax
    for off in (dict(data, norm_topk_prob=False), {k: v for k, v in data.items() if k != "norm_topk_prob"}):
        spec = hf.model_from_config(off, name="q", where="c")[0]
        assert spec.moe_router_pre_softmax and "--moe-router-pre-softmax" in _values(spec)
    assert hf.model_from_config(data, name="q", where="c")[0].moe_aux_loss_coeff == 0.001  # router_aux_loss_coef


def _tiny_moe(**kw) -> ModelSpec:
    return ModelSpec(**{"name": "tiny-moe", "num_layers": 8, "hidden_size": 256, "num_attention_heads": 8,
                        "ffn_hidden_size": 512, "vocab_size": 1024, "seq_length": 512, "activation": "swiglu",
                        "normalization": "rmsnorm", "position_embedding": "rope", "add_bias_linear": False,
                        "num_experts": 8, "moe_top_k": 2, "moe_ffn_hidden_size": 128, **kw})


def test_top1_softmax_routing_is_pre_softmax_and_refused_without_it():
    """megatron-core: "Please use --moe-router-pre-softmax when topk is 1" (a softmax over one score has no
    gradient)."""
    top1 = _tiny_moe(moe_top_k=1)
    assert top1.moe_router_pre_softmax and "--moe-router-pre-softmax" in _values(top1)
    with pytest.raises(ValueError, match="top-1 softmax routing needs moe_router_pre_softmax"):
        _tiny_moe(moe_top_k=1, moe_router_pre_softmax=False)
    with pytest.raises(ValueError, match="moe_router_expert_bias needs sigmoid scoring"):
        _tiny_moe(moe_router_expert_bias=True)
    with pytest.raises(ValueError, match="cannot hold the top 2"):
        _tiny_moe(moe_router_num_groups=8, moe_router_group_topk=1)


def _rejected(model: ModelSpec, plan: ParallelPlan, num_gpus: int) -> list[str]:
    from genconf.catalog.clusters import resolve_cluster

    cluster = resolve_cluster("dgx-h100")
    return [v.rule for v in rules.check(rules.Context(model, cluster, plan, num_gpus)) if v.severity == rules.ERROR]


def test_biased_experts_over_tensor_parallel_ranks_are_refused():
    """megatron-core: "Bias in Moe is only supported when ETP==1"; GPT-OSS's experts have biases."""
    oss = resolve_model("gpt-oss-120b")[0]
    assert "moe_bias_etp" in _rejected(oss, _plan(oss, tp=2, dp=4, ep=2, seq_length=4096), 8)
    assert "moe_bias_etp" not in _rejected(oss, _plan(oss, tp=2, dp=4, ep=2, etp=1, seq_length=4096), 8)


def test_ep_overlap_with_an_mtp_layer_needs_a_pipeline():
    """megatron-core: EP overlap with an MTP layer needs pp > 1 (and at most one MTP layer)."""
    mtp = _tiny_moe(mtp_num_layers=1)
    plan = _plan(mtp, moe_ep_overlap=True, recompute="none", precision="bf16", seq_length=512)
    assert "moe_ep_overlap" in _rejected(mtp, plan, 8)
    two = _tiny_moe(mtp_num_layers=2)
    assert "moe_ep_overlap" in _rejected(two, _plan(two, pp=2, vp=2, dp=4, ep=4, moe_ep_overlap=True, recompute="none",
                                                   precision="bf16", seq_length=512), 8)


def test_local_cuda_graphs_with_expert_parallelism_write_megatron_lm_s_required_flag():
    """Megatron-LM core_v0.16.1 arguments.py asserts --moe-pad-experts-for-cuda-graph-inference with local graphs
    and EP > 1."""
    model = _tiny_moe()
    assert "--moe-pad-experts-for-cuda-graph-inference" in _values(model, cuda_graph_impl="local")
    assert "--moe-pad-experts-for-cuda-graph-inference" not in _values(model, cuda_graph_impl="local", ep=1)


@pytest.mark.parametrize("name,why", [("deepseek-v3", None), ("kimi-k2", None),
                                      ("nemotron-3-nano", "is a hybrid Mamba model"),
                                      ("qwen3-30b-a3b", None), ("mixtral-8x7b", None)])
def test_what_genconf_s_runners_cannot_build_is_one_line_and_in_the_readme(tmp_path, name, why):
    model = resolve_model(name)[0]
    refusal = unbuildable(model, _plan(model))
    assert (refusal is None) if why is None else why in refusal
    out = tmp_path / name
    assert genconf_quiet("--model", name, "--gpus", "256", "--cluster", "dgx-h100", "-o", str(out)) == 0
    readme = (out / "README.md").read_text()
    pf = read_plan(out)  # the searched plan: its own options (a flex dispatcher, EP overlap) may be refused
    assert ("refuses this plan on every rank" in readme) == (unbuildable(pf.model, pf.plan) is not None)
    assert why is None or "refuses this plan on every rank" in readme
    assert "launch_deepspeed.sbatch" not in artifact_names(_plan(model), model)  # DeepSpeed's runner: dense only


def test_the_megatron_runner_builds_dense_first_layers_mla_and_mtp_and_refuses_latent_experts():
    """Dense first layers (--moe-layer-freq), multi-latent attention and multi-token prediction are built by the
    megatron runner as megatron-core builds them; latent experts stay refused, and only the megatron runner takes
    MLA or MTP (genconf's own model for DeepSpeed and FSDP has neither)."""
    deepseek = resolve_model("deepseek-v3")[0]
    for model in (_tiny_moe(first_k_dense_replace=1), _tiny_moe(mtp_num_layers=1), deepseek,
                  _tiny_moe(first_k_dense_replace=2, mtp_num_layers=1)):
        assert unbuildable(model, _plan(model)) is None, model.name
    latent = _tiny_moe(moe_latent_size=64)
    assert "has latent experts" in unbuildable(latent, _plan(latent))
    dense_mla = ModelSpec(name="tiny-mla", num_layers=4, hidden_size=256, num_attention_heads=8, ffn_hidden_size=512,
                          vocab_size=1024, seq_length=512, activation="swiglu", normalization="rmsnorm",
                          position_embedding="rope", add_bias_linear=False, kv_lora_rank=64, qk_head_dim=32,
                          qk_pos_emb_head_dim=16, v_head_dim=32)
    fsdp = ParallelPlan(framework="fsdp", dp=8, mbs=1, gbs=8, seq_length=512, zero_stage=3)
    assert unbuildable(dense_mla, _plan(dense_mla, ep=1)) is None
    assert "only the megatron launcher builds it" in unbuildable(dense_mla, fsdp)
    dense_mtp = dataclasses.replace(dense_mla, kv_lora_rank=None, qk_head_dim=None, qk_pos_emb_head_dim=None,
                                    v_head_dim=None, mtp_num_layers=1)
    assert "only the megatron launcher builds them" in unbuildable(dense_mtp, fsdp)
    # One MTP layer repeated at every depth: megatron-core 0.16.1 would build two (genconf counts one).
    repeated = dataclasses.replace(dense_mtp, mtp_num_layers=2, mtp_repeated_layer=True)
    assert repeated.mtp_blocks == 1 and "needs megatron-core 0.17+" in unbuildable(repeated, _plan(repeated, ep=1))


def test_mla_needs_transformer_engine_attention():
    """megatron-core 0.16.1's local DotProductAttention takes no k_channels/v_channels, which MLASelfAttention passes
    it: the rules refuse MLA with the local layer spec, and a run without TE attention on a GPU is refused."""
    deepseek = resolve_model("deepseek-v3")[0]
    assert "mla_needs_te" in _rejected(deepseek, _plan(deepseek, layer_spec="local"), 8)
    assert "mla_needs_te" not in _rejected(deepseek, _plan(deepseek), 8)
    assert "k_channels/v_channels" in needs_te_attention(deepseek, _plan(deepseek))
    assert "pip install -e '.[te]', or smoke-test the rest" in needs_te_attention(deepseek, _plan(deepseek))
    assert needs_te_attention(_tiny_moe(first_k_dense_replace=1, mtp_num_layers=1), _plan(_tiny_moe())) is None


def test_launch_submit_refuses_an_unbuildable_plan_before_sbatch(tmp_path):
    out = tmp_path / "nano"
    assert genconf_quiet("--model", "nemotron-3-nano", "--gpus", "256", "--cluster", "dgx-h100", "-o", str(out)) == 0
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "genconf", "launch", str(out), "--submit"], capture_output=True,
                          text=True, cwd=REPO)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "genconf: error: nemotron-3-nano is a hybrid Mamba model: genconf's launchers build GPT models; run "
        "megatron_args.txt with Megatron-LM's pretrain_mamba.py (mamba_ssm and causal-conv1d, CUDA only)"]


@needs_megatron
@pytest.mark.parametrize("name", [n for n in sorted(ROUTERS) if not resolve_model(n)[0].is_hybrid])
def test_megatron_core_takes_every_catalog_router(name):
    """TransformerConfig (MLATransformerConfig for MLA) built from the file's arguments as the runner reads them: its
    __post_init__ holds the router asserts (expert bias with sigmoid, top-1 with pre-softmax, groups)."""
    import torch
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    model = resolve_model(name)[0]
    plan = _plan(model, etp=1)
    kw = config_kwargs(model, plan, TrainSpec(train_steps=10))
    kw.update(params_dtype=getattr(torch, kw["params_dtype"]), pipeline_dtype=getattr(torch, kw["pipeline_dtype"]),
              activation_func=torch.nn.functional.silu)
    config = (MLATransformerConfig if model.mla else TransformerConfig)(**kw)
    assert config.multi_latent_attention == model.mla
    if model.mla:  # the file's MLA arguments, read as Megatron-LM reads them
        assert (config.q_lora_rank, config.kv_lora_rank, config.qk_head_dim, config.qk_pos_emb_head_dim,
                config.v_head_dim) == (model.q_lora_rank, model.kv_lora_rank, model.qk_head_dim,
                                       model.qk_pos_emb_head_dim, model.v_head_dim)
        assert (config.rope_type, config.rotary_scaling_factor, config.rotary_base) == ("yarn", 1.0, model.rope_theta)
    if model.first_k_dense_replace or model.moe_layer_interval > 1:
        assert config.moe_layer_freq == [int(k == "E") for k in model.mlp_pattern]
    assert (config.moe_router_score_function, config.moe_router_enable_expert_bias,
            config.moe_router_topk_scaling_factor, config.moe_router_num_groups) == ROUTERS[name][:4]


@needs_megatron
@pytest.mark.parametrize("kw", [dict(pp=4, vp=3), dict(pp=4, pp_first_stage_layers=9, pp_last_stage_layers=13),
                                dict(pp=2, vp=12), dict(pp=3, pp_layout="Et*15|t*17|t*16L")])
def test_megatron_core_builds_each_stage_s_dense_and_moe_layers_where_genconf_places_them(kw):
    """Llama 4 Maverick's --moe-layer-freq ([0,1]*24), read as the runner reads it: megatron-core's decoder block spec
    of each pipeline rank and virtual stage (get_gpt_decoder_block_spec, which slices the moe_layer_freq pattern by
    get_transformer_layer_offset or the layout) holds MoE layers exactly where genconf's chunk_mlp_patterns puts
    them, uneven first/last stages and layouts included."""
    import torch
    from megatron.core.models.gpt import gpt_layer_specs as specs
    from megatron.core.transformer.moe.moe_layer import MoELayer
    from megatron.core.transformer.transformer_config import TransformerConfig

    from genconf.plan import pipeline

    model = resolve_model("llama4-maverick")[0]
    plan = _plan(model, seq_length=8192, **kw)
    cfg = config_kwargs(model, plan, TrainSpec(train_steps=10))
    cfg.update(params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16, activation_func=torch.nn.functional.silu)
    if plan.pp_layout:
        from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

        cfg["pipeline_model_parallel_layout"] = PipelineParallelLayerLayout(plan.pp_layout, plan.pp)
    config = TransformerConfig(**cfg)
    assert config.moe_layer_freq == [0, 1] * 24
    every = specs.get_gpt_decoder_layer_specs(config, use_transformer_engine=False, normalization="RMSNorm")

    def chunk_specs(rank: int, chunk: int | None) -> list:
        if plan.pp_layout:  # get_gpt_decoder_block_spec's layout branch (its layer-count call needs a process group)
            return [every[i] for i in cfg["pipeline_model_parallel_layout"].get_layer_id_list(vp_stage=chunk,
                                                                                              pp_rank=rank)]
        return specs.get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization="RMSNorm",
                                                vp_stage=chunk, pp_rank=rank).layer_specs

    for rank in range(plan.pp):
        built = tuple("".join("E" if layer.submodules.mlp.module is MoELayer else "-"
                              for layer in chunk_specs(rank, chunk if plan.vp > 1 else None))
                      for chunk in range(plan.vp))
        assert built == pipeline.chunk_mlp_patterns(model, plan, rank), (rank, built)
        assert sum(c.count("-") for c in built) == pipeline.dense_layers_on_rank(model, plan, rank)
