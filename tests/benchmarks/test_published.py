"""benchmarks/published.py: published rows carry the allocator setting their launcher used.

The known answers are NVIDIA-NeMo/Megatron-Bridge's performance scripts at each container release:
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True set per model until May 2026 (setup_experiment.py cac49dcd7,
perf_plugins.py 47ff48829 / 92161fc0b / f69d4dd59), then for every run (executors.py PERF_ENV_VARS, 6f24c71f3)
except Llama with Megatron-FSDP or NCCL user buffers.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from published import load_runs  # noqa: E402


@pytest.fixture(scope="module")
def runs():
    return {(r.group, r.label): r for r in load_runs()[0]}


@pytest.mark.parametrize("release, label, expandable", [
    # 25.09: Llama 3.1 405B pre-training on GB200 in FP8-CS only (here with Megatron-FSDP: no exclusion yet).
    ("25.09", "LLAMA3.1_405B #269", True),
    ("25.09", "LLAMA3.1_405B #270", False),   # GB200 MXFP8: added 2025-10-14
    ("25.09", "LLAMA3.1_405B #279", False),   # B200
    # 25.11 and 26.02: GB200 FP8-CS and MXFP8; GB300 not yet.
    ("25.11", "LLAMA3.1_405B #245", True),
    ("25.11", "LLAMA3.1_405B #236", False),
    ("26.02", "LLAMA3.1_405B #174", True),
    ("26.02", "LLAMA3.1_405B #173", False),
    ("26.02", "LLAMA3.1_405B #172", False),   # NVFP4
    # 26.04: GB200 and GB300, FP8-CS and MXFP8; NVFP4 and H100 still without.
    ("26.04", "LLAMA3.1_405B #80", True),
    ("26.04", "LLAMA3.1_405B #130", True),
    ("26.04", "LLAMA3.1_405B #82", False),
    ("26.04", "LLAMA3.1_405B #86", False),
    ("26.04", "LLAMA3_70B #73", False),       # 70B pre-training with Megatron-FSDP
    # 26.06 and later: every run of these (no Llama with Megatron-FSDP among them).
    ("26.06", "LLAMA3.1_405B #34", True),
    ("26.06", "LLAMA3.1_405B #38", True),
    ("26.06", "Qwen3_30B_a3B #49", True),
    ("26.08", "GPT OSS 120B #4", True),
])
def test_megatron_bridge_rows_follow_the_release_scripts(runs, release, label, expandable):
    run = next(r for (group, lab), r in runs.items() if lab == label and group.startswith(f"Megatron-Bridge {release}"))
    assert run.plan.expandable_segments is expandable


def test_other_sources_ran_the_classic_allocator(runs):
    others = [r for r in runs.values() if not r.group.startswith("Megatron-Bridge")]
    assert others and not any(r.plan.expandable_segments for r in others)


# Megatron-Bridge's MoE benchmark configs (benchmarks/bridge_moe_recipes.csv: the config of each row's container
# release, read at the Megatron-Bridge ref its docs name for it). moe_a2a_overlap=True sets
# overlap_moe_expert_parallel_comm (scripts/performance/utils/overrides.py, _set_moe_a2a_overlap_overrides).
@pytest.mark.parametrize("release, label, overlap", [
    ("26.08", "GPT OSS 120B #4", True),      # perf_recipes/gpt_oss/common.py:49 (v0.6.0)
    ("26.06", "GPT OSS 120B #43", True),     # GPT_OSS_120B_PRETRAIN_CONFIG_GB300_FP8_MX_V2 (v0.5.0)
    ("26.06.01", "GPT OSS 120B #20", True),  # the same config in v0.5.1
    ("26.04.01", "GPT OSS 120B #91", False),  # GB300 BF16 V2 (v0.4.2): the WorkloadBaseConfig default, off
    ("26.02.01", "Qwen3_30B_a3B #190", True),  # H100 FP8-CS V1 with DeepEP, at the v0.3.0 layout the row shows
    ("25.11", "GPT OSS 120B #239", False),
])
def test_megatron_bridge_moe_rows_carry_their_configs_ep_overlap(runs, release, label, overlap):
    run = runs[(f"Megatron-Bridge {release[:5]}", label)]  # patch releases (26.06.01) group with their release
    assert run.plan.moe_ep_overlap is overlap


# The same configs' token dispatcher (bridge_moe_recipes.csv `dispatcher`: flex+deepep / flex+hybridep are megatron's
# flex dispatcher with that backend), typed into the plans and the pins a user would type.
@pytest.mark.parametrize("release, label, dispatcher", [
    ("26.04", "DeepSeekV3 #90", "deepep"),          # B200 MXFP8 V2 (v0.4.2): ep 32 over four nodes
    ("26.06", "Qwen3_30B_a3B #49", "hybridep"),     # H100 FP8-CS V1 (v0.5.0): ep 16 over two nodes
    ("25.09", "DeepSeekV3 (dropless) #289", "deepep"),  # perf_matrix h100 1024 GPUs: moe_enable_deepep
    ("26.04", "Qwen3_235B_a22B #105", "alltoall"),  # H100 FP8-CS V2 (v0.4.2)
])
def test_megatron_bridge_moe_rows_carry_their_configs_dispatcher(runs, release, label, dispatcher):
    from accuracy import pins_for

    run = runs[(f"Megatron-Bridge {release[:5]}", label)]
    assert run.plan.moe_dispatcher == dispatcher
    pins = pins_for(run)
    assert pins is None or pins.moe_dispatcher == dispatcher


# The same configs' CUDA graphs (cuda_graph_impl / cuda_graph_scope; Bridge's older configs enable_cuda_graph, megatron's
# local per-layer graphs). Mamba scopes are dropped: genconf models no Mamba layer.
@pytest.mark.parametrize("release, label, impl, scope", [
    ("26.08", "GPT OSS 120B #4", "local", ("full_iteration",)),      # perf_recipes/gpt_oss/common.py:25 (v0.6.0)
    ("26.04", "GPT OSS 120B #91", "transformer_engine", ("attn", "moe_router", "moe_preprocess")),  # v0.4.2 :96
    ("26.02", "Qwen3_30B_a3B #226", "transformer_engine", ("moe_router", "moe_preprocess")),  # v0.3.0 :405
    ("26.02", "Qwen3_30B_a3B #190", "none", ()),
    ("25.09", "Qwen3_30B_a3B (tokendrop) #273", "local", ()),  # v0.1.0rc3 perf_matrix: enable_cuda_graph
])
def test_megatron_bridge_moe_rows_carry_their_configs_cuda_graphs(runs, release, label, impl, scope):
    run = runs[(f"Megatron-Bridge {release[:5]}", label)]
    assert (run.plan.cuda_graph_impl, run.plan.cuda_graph_scope) == (impl, scope)


def test_rows_megatron_core_016_cannot_express_are_evaluated_with_the_rules_off(runs):
    """Full-iteration graphs beside the EP overlap ran on megatron-core 0.18+; genconf's rules follow the 0.16.1 it
    renders for, so such rows are priced as published with the rules off, never rejected."""
    from accuracy import pins_for

    run = runs[("Megatron-Bridge 26.08", "GPT OSS 120B #4")]
    assert run.plan.moe_ep_overlap and pins_for(run) is None
    assert pins_for(runs[("Megatron-Bridge 26.04", "GPT OSS 120B #91")]).cuda_graph_scope == (
        "attn", "moe_router", "moe_preprocess")


def test_a_config_whose_layout_differs_from_the_row_is_not_used():
    from published import bridge_moe_recipe

    # Row 240 (Qwen3-30B on GB300, 25.11): v0.2.0's config runs micro-batch 8, the row 4; no ref matched it.
    assert bridge_moe_recipe(240) is None
    assert bridge_moe_recipe(249)["moe_a2a_overlap"] == "off" and bridge_moe_recipe(4)["moe_a2a_overlap"] == "on"


@pytest.mark.parametrize("release, label, zero, recompute, layers, offload", [
    # Llama 3 70B FP8-CS on 64 GB200 (26.04.01, LLAMA3_70B_PRETRAIN_CONFIG_GB200_FP8_CS_V2): Megatron-FSDP with 40
    # layers' activations offloaded, no recompute; on GB300 20 layers.
    ("26.04.01", "LLAMA3_70B #76", 3, "none", None, 40),
    ("26.04.01", "LLAMA3_70B #73", 3, "none", None, 20),
    # MXFP8 on GB300, tp1 pp4 vp5: the distributed optimizer, nothing recomputed (genconf had chosen recompute).
    ("26.04.01", "LLAMA3_70B #74", 1, "none", None, 0),
    # Llama 3 8B FP8-CS on 8 H100 (25.11): full recompute of 5 layers (block), the only dense row with recompute.
    ("25.11", "LLAMA3_8B #259", 1, "full", 5, 0),
])
def test_megatron_bridge_dense_rows_carry_their_configs_memory_settings(runs, release, label, zero, recompute,
                                                                      layers, offload):
    run = runs[(f"Megatron-Bridge {release[:5]}", label)]
    p = run.plan
    assert run.configured and "recompute" not in run.unknown
    assert (p.zero_stage, p.recompute, p.recompute_layers, p.offload_activation_layers) == (zero, recompute, layers,
                                                                                             offload)


def test_every_dense_configuration_fits_as_it_ran(runs):
    """Each dense Megatron-Bridge row whose config is known is planned with its own recompute, offload, sharding and
    graphs (every degree typed, so the whole GPU is usable, as it was for the run): none is rejected."""
    from accuracy import cals_for, predict

    configured = [r for r in runs.values() if r.configured]
    assert len(configured) == 88  # every preset match, the 5 LoRA rows (planned with lora_rank 32) too
    cals = cals_for(configured)
    rejected = [(r.label, p.rejected) for r in configured
                if (p := predict(r, cals[r.cluster.gpu.name])).tokens_per_s_per_gpu is None]
    assert not rejected


def test_a_dense_preset_whose_layout_differs_from_the_row_is_not_used():
    from published import bridge_dense_recipe

    # Row 236 (405B on 256 GB300, 25.11): v0.2.0 has only 128-GPU presets (Megatron-FSDP with offload).
    assert bridge_dense_recipe(236) is None
    assert bridge_dense_recipe(76)["cpu_offloading_num_layers"] == "40"


def _nemo_llama_flops_per_token(s, layers, h, heads, kv, ffn, vocab, attention=12.0):
    """NeMo's nemo/utils/flops_formulas.llama3 per token, as it stood before causal masks were counted (NVIDIA-NeMo
    issue #14376): attention term 12 s / h; `attention` = 6 is the causal (halved) count."""
    return layers * h * h * (12 + 12 * kv / heads + 18 * ffn / h + attention * s / h + 6 * vocab / (layers * h))


@pytest.mark.parametrize("label, tflops, halved", [
    # B200, NeMo 25.04.rc2: converted with NeMo's own (unhalved) count.
    ("LLAMA3_8B long-seq (with CP) #18", 1671, False),
    ("LLAMA3_8B long-seq (with CP) #25", 1608, False),
    # H100, NeMo 24.03: the halved count (the unhalved one would put its 1M-token run at half the H100's
    # measured flash-attention rate).
    ("LLAMA2_7B long-seq (with CP) #34", 536, True),
])
def test_long_sequence_tokens_per_second_follow_the_flop_count_of_their_release(runs, label, tflops, halved):
    run = next(r for (_, lab), r in runs.items() if lab == label)
    m = run.model
    per_token = _nemo_llama_flops_per_token(m.seq_length, m.num_layers, m.hidden_size, m.num_attention_heads,
                                            m.num_query_groups, m.ffn_hidden_size, m.vocab_size,
                                            attention=6.0 if halved else 12.0)
    assert run.measured_tokens_per_s_per_gpu == pytest.approx(tflops * 1e12 / per_token, rel=1e-6)


# --- MosaicML's MPT benchmarks (llm-foundry): a validation source, scored and never fitted --------------------

def _mosaic_rows():
    import csv

    from published import DATA, MOSAIC_FILE

    with open(DATA / MOSAIC_FILE) as f:
        return list(csv.DictReader(f))


def test_every_mpt_row_counts_the_parameters_mosaicml_published(runs):
    """Each of the 216 rows's MPT is built from the yaml's d_model / n_heads / n_layers with MPTConfig's defaults
    (GELU x4, LayerNorm with bias, biases on every linear layer, tied embeddings, a learned position table of the
    row's sequence length): genconf's count equals the NumParams column exactly (it grows with the sequence)."""
    from genconf.plan.counting import exact_param_count

    mosaic = [r for r in runs.values() if r.file == "mosaicml_llm_foundry.csv"]
    rows = _mosaic_rows()
    assert len(mosaic) == len(rows) == 216
    by_label = {r.label: r for r in mosaic}
    for i, row in enumerate(rows):
        published = int(row["notes"].split("NumParams ")[1].split(" ")[0])
        assert exact_param_count(by_label[f"{row['model']} #{i}"].model) == published, row["model"]


def test_mpt_rows_are_typed_as_the_benchmark_ran(runs):
    """Composer FSDP with llm-foundry's defaults (the rows' notes cite the file and line): Triton flash attention,
    flash-attn's fused cross entropy, FULL_SHARD or SHARD_GRAD_OP, fp32 gradient reduction under mixed_precision
    DEFAULT and bf16 under PURE, Transformer Engine's delayed scaling for FP8."""
    mosaic = {r.label: r for r in runs.values() if r.file == "mosaicml_llm_foundry.csv"}
    plans = [r.plan for r in mosaic.values()]
    assert all(p.framework == "fsdp" and p.attention_kernel == "triton" and p.fused_loss for p in plans)
    assert {p.zero_stage for p in plans} == {2, 3}
    rows = _mosaic_rows()
    for i, row in enumerate(rows):
        plan = mosaic[f"{row['model']} #{i}"].plan
        assert plan.grad_dtype == ("bf16" if "mixed_precision PURE" in row["notes"] else "fp32")
        assert plan.zero_stage == (2 if "SHARD_GRAD_OP" in row["notes"] else 3)
        assert (plan.fp8_recipe == "delayed") == (plan.precision == "fp8")


def test_every_mpt_configuration_fits_as_it_ran(runs):
    """None of MosaicML's 216 published configurations is rejected. Before genconf priced the fused cross entropy
    (bf16 logits and a per-token log-sum-exp instead of an fp32 copy and an fp32 log-softmax), 59 did not fit
    (at 5bccdcb, planned with the same pins)."""
    from accuracy import cals_for, predict

    mosaic = [r for r in runs.values() if r.file == "mosaicml_llm_foundry.csv"]
    cals = cals_for(mosaic)
    rejected = [(r.label, p.rejected[:80]) for r in mosaic
                if (p := predict(r, cals[r.cluster.gpu.name])).tokens_per_s_per_gpu is None]
    assert not rejected


def test_stack_knobs_as_they_ran_is_how_the_rows_are_typed(runs):
    """benchmarks/stack_knobs.py's last variant is the rows as published.py types them (its figures are accuracy's
    MosaicML row), and its first, without the stack's knobs, rejects what the fused cross entropy makes fit."""
    import stack_knobs
    from accuracy import cals_for, evaluate_all, stats

    mosaic = [r for r in runs.values() if r.file == "mosaicml_llm_foundry.csv"]
    naive, _, ran = (stack_knobs.score(mosaic, knobs) for knobs in stack_knobs.VARIANTS.values())
    typed = stats(evaluate_all(mosaic, cals_for(mosaic)))
    assert {k: ran[k] for k in typed} == typed
    assert naive["rejected"] > 0 == ran["rejected"]


def test_torchtitan_pipeline_rows_take_torchtitans_default_micro_batches(runs):
    """torchtitan's Table 5 (Llama 3.1 405B, local batch 32, pp 8) gives no micro-batch: torchtitan cuts the local
    batch into pp x stages-per-rank micro-batches, with one stage per rank under 1F1B and two under Interleaved
    1F1B when no split points are set (parallelisms/pipeline_llama.py at the rows' commit 9dec370)."""
    table5 = {r.label: r.plan for r in runs.values() if r.file == "torchtitan.csv" and r.plan.gbs == 256
              and r.plan.pp == 8}
    assert {(p.vp, p.mbs) for p in table5.values()} == {(1, 4), (2, 2)}
    for plan in table5.values():
        assert plan.gbs // plan.dp // plan.mbs == plan.pp * plan.vp


def test_torchtitan_rows_run_async_tp_where_their_notes_say_so(runs):
    """torchtitan's notes spell it "AsyncTP", "async TP" and "Async TP" (Llama 3.1 405B Float8 + Async TP on 128 H100s,
    docs/performance.md at 9dec370a): every spelling turns on TP communication overlap, and vanilla TP rows keep it
    off."""
    titan = {r.label: r.plan for r in runs.values() if r.file == "torchtitan.csv"}
    assert titan["Llama 3.1 405B #34"].tp_comm_overlap and not titan["Llama 3.1 405B #33"].tp_comm_overlap
    assert titan["Llama 3.1 70B #19"].tp_comm_overlap and not titan["Llama 3.1 70B #18"].tp_comm_overlap
    assert titan["Llama 3.1 70B #11"].tp_comm_overlap and not titan["Llama 3.1 70B #10"].tp_comm_overlap
    # Async TP requires compile, and docs/performance.md's 405B rows ran llama3_405b.toml (compile = true at
    # 9515a140b); its 8B and 70B A100 rows ran configs with compile = false.
    assert all(titan[f"Llama 3.1 405B #{i}"].torch_compile for i in (32, 33, 34))
    assert not any(titan[label].torch_compile for label in ("Llama 3 8B #35", "Llama 3 8B #36", "Llama 3 70B #37"))


def test_mosaicml_rows_before_torch_2_1_recompute_whole_layers(runs):
    """llm-foundry's large-scale H100 table came with 5e85bd62 (setup.py: torch>=2.1,<2.1.1); its other tables are
    from 2023 (300cc5c: torch==1.13.1; b2a43a1: torch 1.13.1-2.1.0 allowed, default image mosaicml/pytorch:1.13.1)."""
    mosaic = [r for r in runs.values() if r.file == "mosaicml_llm_foundry.csv"]
    early = {r.label for r in mosaic if r.plan.checkpoint_early_stop}
    assert len(early) == 18 and all(r.plan.dp >= 128 for r in mosaic if r.label in early)


@pytest.mark.parametrize("layers, pp, embedding, split", [
    # BigScience's chronicles-prequel.md ('Re-do', 02-27): "78/12=6.5 - so the last stage has 1 block, while the rest
    # have 7" under Megatron-DeepSpeed's default partition_method 'type:transformer'.
    (78, 12, False, {"pp_last_stage_layers": 1}),
    (72, 6, False, {}),
    # 'type:transformer|embedding' (from 02-28): "2+nlayers*PP" slots, each embedding matrix one of them, which is
    # megatron's account-for-embedding/loss split.
    (106, 12, True, {"pp_embedding_as_layer": True, "pp_loss_as_layer": True}),
    (70, 12, True, {"pp_embedding_as_layer": True, "pp_loss_as_layer": True}),
    # Two stages: the split is the two counts; a fill that leaves a stage empty has no megatron split.
    (7, 2, False, {"pp_first_stage_layers": 4, "pp_last_stage_layers": 3}),
    (9, 4, False, {}),
    (11, 12, False, {}),
])
def test_bloom_rows_split_their_layers_as_deepspeeds_pipeline_did(layers, pp, embedding, split):
    from published import deepspeed_pipe_split
    assert deepspeed_pipe_split(layers, pp, embedding_weighted=embedding) == split


def test_bloom_and_pre_2023_megatron_rows_tie_the_output_layer_to_the_embeddings(runs):
    by_file = {}
    for run in runs.values():
        by_file.setdefault(run.file, []).append(run.model.tie_embeddings)
    for file in ("bigscience_bloom_sweep.csv", "megatron_narayanan2021.csv", "korthikanti2022.csv"):
        assert all(by_file[file]), file
    assert not any(by_file["torchtitan.csv"])  # Llama 3 unties them
    # The papers file by model, as _model types every row with an architecture: OPT and BLOOM tied (its minGPT-175B
    # rows, whose model has its own head, state no architecture and are not scored).
    import csv

    from published import DATA, _model
    with open(DATA / "opt_bloom_fsdp_papers.csv") as f:
        papers = [(row["model"], _model(row, "opt_bloom_fsdp_papers.csv").tie_embeddings) for row in csv.DictReader(f)
                  if row["layers"] and row["hidden"] and row["heads"]]
    assert {name[:3] for name, _ in papers} == {"OPT", "BLO"}
    assert all(tied for _, tied in papers)


def test_the_78_layer_bloom_rows_put_seven_layers_and_the_embedding_on_the_first_stage(runs):
    from genconf.plan.pipeline import stage_layers
    run = runs[("BLOOM sweep", "BLOOM-prototype 182B #71")]
    assert stage_layers(run.model.num_layers, run.plan) == (7,) * 11 + (1,)



def _nemo25_rows() -> list[dict]:
    import csv

    from published import DATA, NEMO25_FILE

    with open(DATA / NEMO25_FILE) as f:
        return list(csv.DictReader(f))


def _nemo25_runs(runs) -> dict:
    from published import NEMO25_FILE

    return {r.label: r for r in runs.values() if r.file == NEMO25_FILE}


def test_nemo25_rows_are_read_as_their_pages_state_them(runs):
    """Each of the 20 NeMo 25.x rows loads (none skipped), its gradient accumulation equals the page's GA column
    (kept in the notes), and it is typed as that release's NeMo 2.0 performance scripts ran it: FP8 delayed scaling
    in 25.02 (v2.2.0's bf16_with_fp8_mixed), per-tensor current scaling in 25.04 and 25.07 (the pages' preamble),
    bf16 gradient reduction, Megatron-FSDP where FSDP=1; grouped by the container release its source names."""
    rows = _nemo25_rows()
    nemo25 = _nemo25_runs(runs)
    assert len(rows) == len(nemo25) == 20
    for i, row in enumerate(rows):
        assert row["source"].startswith("https://docs.nvidia.com/nemo-framework/user-guide/")
        run = nemo25[f"{row['model']} #{i}"]
        plan = run.plan
        release = row["notes"].split(" ")[1]
        ga = int(row["notes"].split("GA ")[1].split(" ")[0])
        assert plan.gbs == plan.mbs * plan.dp * ga
        assert plan.fp8_recipe == ("delayed" if release == "25.02" else "current")
        assert (plan.grad_dtype, run.framework_label) == ("bf16", "NeMo")
        assert plan.zero_stage == (3 if "FSDP=1" in row["notes"] else 1)  # Megatron-FSDP, pinned as --megatron-fsdp
        assert run.group == "NeMo " + row["source"].split("(NeMo ")[1].split(" ")[0]  # the release the source names


def test_nemo25_rows_are_scored_never_fitted(runs):
    """The NeMo 25.x rows are a validation source: the fit's training set leaves them out, and none of their
    configurations is rejected."""
    from accuracy import cals_for, fitted_runs, predict, source_of

    nemo25 = list(_nemo25_runs(runs).values())
    assert {source_of(r) for r in nemo25} == {"NeMo 25.x"}
    fitted = fitted_runs(list(runs.values()))
    automodel = [r for r in runs.values() if source_of(r) == "NeMo AutoModel"]
    olmo_core = [r for r in runs.values() if source_of(r) == "OLMo-core"]
    nanotron = [r for r in runs.values() if source_of(r) == "nanotron playbook"]
    dgxc = [r for r in runs.values() if source_of(r) == "DGXC benchmarking"]
    assert not any(r in fitted for r in nemo25) and len(fitted) == (len(runs) - len(nemo25) - 216 - len(automodel)
                                                                    - len(olmo_core) - len(nanotron) - len(dgxc))
    cals = cals_for(nemo25)
    assert all(predict(r, cals[r.cluster.gpu.name]).tokens_per_s_per_gpu for r in nemo25)


def test_nemo25_rows_agree_with_their_own_flop_counts():
    """Transcription check: NVIDIA's model FLOPs per token are one number per model and sequence, so each model's
    TFLOP/s-to-tokens/s ratio agrees across the pages and systems that list it, to 0.2% (four-digit figures). The
    one exception is the 25.07 page's Llama 3.1 405B row, 1.0% off the others, as published (the page's own
    parenthesised figures for that model, 1675 TFLOP/s at 638 tok/s, give its ratio again)."""
    ratios: dict[tuple[str, str], list[float]] = {}
    for row in _nemo25_rows():
        if row["tflops_per_gpu"] and not (row["model"] == "LLAMA3.1-405B" and " 25.07 " in row["notes"][:20]):
            key = (row["model"], row["seq_len"])
            ratios.setdefault(key, []).append(float(row["tflops_per_gpu"]) / float(row["tokens_per_sec_per_gpu"]))
    assert len(ratios) == 8 and sum(len(v) for v in ratios.values()) == 18
    for key, values in ratios.items():
        assert max(values) / min(values) < 1.002, key


def test_automodel_rows_are_scored_never_fitted(runs):
    """NeMo AutoModel's H100 MoE rows (nemo_automodel_perf_summary.csv) are a validation source: 7 of its 10 rows
    load (GPT-OSS 20B's and 120B's expert-parallel degree is not stated, Llama 3 70B runs
    PyTorch's context parallelism), the fit and every leave-one-source-out fit leave them out, they are planned as
    FSDP2 with expert parallelism with genconf's rules off, and each gets a prediction."""
    from accuracy import SOURCES, VALIDATION_SOURCES, cals_for, fitted_runs, pins_for, predict, source_of

    from published import AUTOMODEL_FILE

    automodel = [r for r in runs.values() if r.file == AUTOMODEL_FILE]
    assert len(automodel) == 7 and {source_of(r) for r in automodel} == {"NeMo AutoModel"}
    assert "NeMo AutoModel" in VALIDATION_SOURCES and "NeMo AutoModel" in SOURCES
    assert not any(r in fitted_runs(list(runs.values())) for r in automodel)
    assert all(r.plan.framework == "fsdp" and r.plan.ep > 1 and pins_for(r) is None for r in automodel)
    # Their "fake balanced gate": FakeBalancedGate's consecutive experts, not megatron's random force-balancing.
    assert all(r.plan.moe_routing == "contiguous" for r in automodel)
    assert all(r.plan.moe_routing == "random" for r in runs.values() if r.file != AUTOMODEL_FILE)
    # reshard_after_forward as each row ran it: true (ZeRO-3) for Nemotron V3 Super and Ultra only.
    assert {r.label.split(" (")[0] for r in automodel if r.plan.zero_stage == 3} == {"Nemotron V3 Super 120B",
                                                                                    "Nemotron V3 Ultra 550B"}
    assert all(r.plan.zero_stage in (2, 3) and r.plan.grad_dtype == "fp32" for r in automodel)
    # Ultra ran DeepEP when its row was published (the config moved to HybridEP later).
    assert all(r.plan.moe_dispatcher == "deepep" for r in automodel)
    # A pipelined row's accumulation steps are schedules of their own: typed as one (LBS x dp sequences).
    by_gpus = {(r.model.name, r.plan.world_size): r.plan for r in automodel}
    assert by_gpus[("kimi-k2", 256)].gbs == 8 * 32 and by_gpus[("deepseek-v3", 1024)].gbs == 8 * 256
    assert by_gpus[("deepseek-v3", 256)].gbs == 512
    cals = cals_for(automodel)
    assert all(predict(r, cals[r.cluster.gpu.name]).tokens_per_s_per_gpu for r in automodel)


# --- OLMo-core's README throughput table: a validation source, scored and never fitted --------------------------

OLMO_CORE_ROWS = [
    # (README line at the commit that set the figure, model, precision, tokens/s/GPU, micro-batch, global batch):
    # allenai/OLMo-core README.md, the table as it stood from e27ba745 (2024-11-05) until 41f8ddc9 removed it.
    ("e27ba745:README.md:42", "olmo-core-olmo-1124-1b", "bf16", 55000, 8, 1024),
    ("e27ba745:README.md:43", "olmo-core-olmo-1124-1b", "fp8", 65000, 8, 1024),
    ("8c03ca8a:README.md:31", "olmo2-7b", "bf16", 10000, 2, 1024),
    ("8c03ca8a:README.md:32", "olmo2-7b", "fp8", 13000, 2, 1024),
    ("41400c46:README.md:41", "olmo-core-llama-3-8b", "bf16", 9500, 2, 1024),
    ("41400c46:README.md:42", "olmo-core-llama-3-8b", "fp8", 12500, 2, 1024),
    ("8c03ca8a:README.md:33", "olmo2-13b", "bf16", 4600, 1, 2048),
    ("310866e4:README.md:42", "olmo2-13b", "fp8", 5500, 1, 2048),
]


def test_olmo_core_rows_are_read_as_the_readme_and_scripts_state_them(runs):
    """Known answers: the README's eight figures, and each row's micro-batch (rank_microbatch_size / 4096) and global
    batch (global_batch_size / 4096) from its script at the commit that published the figure; the 7B and 13B are the
    catalog's OLMo 2 entries, the 1B (18 layers, FFN 5632) and the Llama 3 8B (dolma2's 100,352-row vocabulary, 4096
    tokens) are not catalog models."""
    from published import OLMO_CORE_FILE

    got = sorted((r for r in runs.values() if r.file == OLMO_CORE_FILE), key=lambda r: int(r.label.rsplit("#", 1)[1]))
    assert [(r.source.split("@")[1], r.model.name, r.plan.precision, r.measured_tokens_per_s_per_gpu, r.plan.mbs,
             r.plan.gbs) for r in got] == OLMO_CORE_ROWS
    one_b, llama = got[0].model, got[4].model
    assert (one_b.num_layers, one_b.hidden_size, one_b.num_attention_heads, one_b.ffn_hidden_size) == (18, 2048, 16, 5632)
    assert one_b.qk_layernorm and not one_b.tie_embeddings and one_b.vocab_size == 100352
    assert (llama.num_query_groups, llama.ffn_hidden_size, llama.vocab_size, llama.seq_length) == (8, 14336, 100352, 4096)
    assert not llama.qk_layernorm
    # Each row's notes cite its figure's README line and the script lines of its micro-batch and global batch.
    import csv

    from published import DATA

    with open(DATA / OLMO_CORE_FILE) as f:
        for row, (where, _, _, _, mbs, gbs) in zip(csv.DictReader(f), OLMO_CORE_ROWS):
            assert f"allenai/OLMo-core@{where}" in row["notes"]
            assert f"rank_microbatch_size={mbs} * 4096" in row["notes"] and f"global batch {gbs} * 4096" in row["notes"]


def _validation_rows(runs, file: str, source: str, count: int) -> list:
    """A validation source's rows: all `count` of them loaded under `source`, scored, left out of every fit."""
    from accuracy import SOURCES, VALIDATION_SOURCES, fitted_runs, source_of

    rows = [r for r in runs.values() if r.file == file]
    assert len(rows) == count and {source_of(r) for r in rows} == {source}
    assert source in VALIDATION_SOURCES and source in SOURCES
    assert not any(r in fitted_runs(list(runs.values())) for r in rows)
    return rows


def _assert_all_predicted(rows: list) -> None:
    from accuracy import cals_for, predict

    cals = cals_for(rows)
    assert all(predict(r, cals[r.cluster.gpu.name]).tokens_per_s_per_gpu for r in rows)


def test_olmo_core_rows_are_typed_as_they_ran_and_scored_never_fitted(runs):
    """FSDP2 on the launcher's default 8 GPUs, reshard_after_forward true (ZeRO-3), fp32 gradient reduction, no
    activation checkpointing, torch.compile with PyTorch's SDPA (flash2), a fused cross entropy over 16-bit logits for
    the 1B (compile_loss: PyTorch's under torch.compile, the logits' cast inside it), the unfused loss's bytes for the
    7B, 8B and 13B (their Triton cross entropy ran on logits the model's forward cast to fp32: it saved them and wrote
    an fp32 gradient, until 00d34f69 moved the cast into the loss), torchao float8 as per-tensor current scaling;
    evaluated with the rules off (compiled FSDP), left out of every fit, and each gets a prediction."""
    from accuracy import pins_for

    from published import OLMO_CORE_FILE

    olmo = _validation_rows(runs, OLMO_CORE_FILE, "OLMo-core", 8)
    for r in olmo:
        p = r.plan
        assert (p.framework, p.world_size, p.tp, p.pp, p.cp, p.zero_stage, p.grad_dtype) == ("fsdp", 8, 1, 1, 1, 3, "fp32")
        assert (p.recompute, p.torch_compile, p.attention_kernel, r.unknown) == ("none", True, "flash2", ())
        assert p.fused_loss == ("1B" in r.label)
        assert p.fp8_recipe == ("current" if p.precision == "fp8" else None) and not p.fp8_param_gather
        assert r.cluster.gpu.name == "h100-sxm" and pins_for(r) is None
    _assert_all_predicted(olmo)


def test_olmo_core_rows_before_the_loss_took_the_fp32_cast_are_not_a_16_bit_fused_loss(runs):
    """The 7B, 8B and 13B figures were set at 8c03ca8a, 310866e4 and 41400c46, where Transformer.forward returned
    self.w_out(h).float() (model.py:705 / :215): their Triton cross entropy (inplace_backward=False) saved fp32 logits
    and wrote an fp32 gradient. genconf's fused_loss prices 16-bit logits (memory._loss_bytes), 2 bytes a logit where
    they held 4 saved and 6 in the backward; 00d34f69 (2024-11-01) moved the cast into the loss, before e27ba745 set
    the 1B's figures."""
    import csv

    from published import DATA, OLMO_CORE_FILE

    with open(DATA / OLMO_CORE_FILE) as f:
        notes = {row["source"]: row["notes"] for row in csv.DictReader(f)}
    for r in (r for r in runs.values() if r.file == OLMO_CORE_FILE):
        commit = r.source.split("@")[1].split(":")[0]
        fp32_logits = commit in ("8c03ca8a", "310866e4", "41400c46")
        assert ("on fp32 logits" in notes[r.source]) == fp32_logits, r.label
        if fp32_logits:
            assert f"allenai/OLMo-core@{commit}:src/olmo_core/nn/transformer/model.py:" in notes[r.source]
        assert r.plan.fused_loss == (not fp32_logits), r.label


# --- nanotron's Ultra-Scale Playbook best configurations: a validation source, scored and never fitted ----------

NANOTRON_ROWS = [
    # (params_b, nodes, dp, tp, pp, gas, mbs, zero, tokens/s/GPU): huggingface/nanotron docs/benchmark_summary.svg at
    # c2528430 (the layout, ZeRO stage and MFU of each cell), the playbook's interactive plot (tokens/s/GPU).
    ("1.34", 1, 4, 1, 2, 16, 4, 1, 38895), ("1.34", 2, 8, 1, 2, 32, 1, 1, 36497),
    ("1.34", 4, 16, 1, 2, 16, 1, 1, 33677), ("1.34", 8, 32, 1, 2, 8, 1, 1, 28494),
    ("1.34", 16, 64, 2, 1, 1, 4, 0, 30186), ("1.34", 32, 64, 4, 1, 1, 4, 0, 23775),
    ("1.34", 64, 128, 2, 2, 1, 2, 1, 4603),
    ("3.57", 1, 4, 1, 2, 32, 2, 1, 16426), ("3.57", 2, 8, 1, 2, 16, 2, 1, 15402),
    ("3.57", 4, 16, 1, 2, 8, 2, 1, 14210), ("3.57", 8, 32, 1, 2, 8, 1, 1, 12501),
    ("3.57", 16, 32, 4, 1, 1, 8, 0, 13337), ("3.57", 32, 64, 4, 1, 1, 4, 0, 10323),
    ("3.57", 64, 128, 4, 1, 1, 2, 1, 4045),
    ("8.86", 1, 2, 1, 4, 128, 1, 1, 7503), ("8.86", 2, 4, 4, 1, 16, 4, 1, 7290),
    ("8.86", 4, 16, 1, 2, 16, 1, 1, 7186), ("8.86", 8, 32, 1, 2, 8, 1, 1, 6555),
    ("8.86", 16, 16, 8, 1, 2, 8, 0, 6028), ("8.86", 32, 32, 8, 1, 1, 8, 0, 5428),
    ("8.86", 64, 128, 4, 1, 1, 2, 0, 3101),
    ("80.0", 4, 1, 8, 4, 256, 1, 0, 285), ("80.0", 8, 1, 4, 16, 256, 1, 0, 665),
    ("80.0", 16, 1, 4, 32, 256, 1, 0, 662), ("80.0", 32, 4, 4, 16, 64, 1, 1, 594),
    ("80.0", 64, 32, 16, 1, 4, 2, 1, 343),
]


def test_nanotron_rows_are_read_as_the_figure_and_the_scaling_script_state_them(runs):
    """Known answers: the heatmap's 26 cells (layout, accumulation, micro-batch, ZeRO stage), a 1M-token global batch
    of 256 sequences of 4096, and the scaling script's shapes: MHA, the 131,072 vocabulary, the output layer tied
    below an FFN of 10,000; the shapes reproduce the figure's axis (1.34B, 3.57B, 8.86B, 80.0B) through the script's
    own estimate_num_params."""
    from published import NANOTRON_FILE

    got = sorted((r for r in runs.values() if r.file == NANOTRON_FILE), key=lambda r: int(r.label.rsplit("#", 1)[1]))
    assert [(r.model.name.removeprefix("nanotron-llama-").removesuffix("b"), r.plan.world_size // 8, r.plan.dp,
             r.plan.tp, r.plan.pp, r.plan.gbs // (r.plan.dp * r.plan.mbs), r.plan.mbs, r.plan.zero_stage,
             r.measured_tokens_per_s_per_gpu) for r in got] == NANOTRON_ROWS
    for r in got:
        m = r.model
        assert r.plan.gbs * r.plan.seq_length == 256 * 4096 and m.seq_length == 4096
        assert m.num_query_groups == m.num_attention_heads and m.vocab_size == 131072
        assert m.tie_embeddings == (m.ffn_hidden_size < 10_000)
        # scripts/scaling_benchmarks.py estimate_num_params: the heatmap's axis value
        embed = m.vocab_size * m.hidden_size * (1 if m.tie_embeddings else 2)
        layer = 3 * m.hidden_size * m.ffn_hidden_size + 4 * m.hidden_size ** 2
        assert f"{(embed + m.num_layers * layer) / 1e9:.3g}" == f"{float(m.name.split('-')[-1][:-1]):.3g}"
    import csv

    from published import DATA

    with open(DATA / NANOTRON_FILE) as f:
        for row in csv.DictReader(f):
            assert row["source"].startswith("huggingface/nanotron@c2528430:docs/benchmark_summary.svg:")
            assert "vinjn/nanotron-ultrascale-playbook@e3bcfc5c:assets/data/benchmarks/benchmarks_interactive.html:1" in row["notes"]
            assert "index.html:1963" in row["notes"] and "scripts/scaling_benchmarks.py" in row["notes"]


def test_nanotron_rows_are_typed_as_they_ran_and_scored_never_fitted(runs):
    """Megatron-style TP with sequence parallelism (REDUCE_SCATTER) and 1F1B pipelining, nanotron's own DDP (ZeRO-0)
    or ZeRO-1, fp32 gradient reduction, no recompute, flash-attn 2 in fused layers, no fused weight-gradient
    accumulation, no TE userbuffer overlap, no compile; evaluated with the rules off, left out of every fit, and each
    gets a prediction."""
    from accuracy import pins_for

    from published import NANOTRON_FILE

    rows = _validation_rows(runs, NANOTRON_FILE, "nanotron playbook", 26)
    for r in rows:
        p = r.plan
        assert (p.framework, p.vp, p.cp, p.precision, p.grad_dtype, p.recompute) == ("megatron", 1, 1, "bf16", "fp32", "none")
        assert p.sequence_parallel == (p.tp > 1) and p.zero_stage in (0, 1)
        assert (p.layer_spec, p.attention_kernel, p.fused_kernels, p.grad_accum_fusion) == ("te", "flash2", False, False)
        assert (p.tp_comm_overlap, p.torch_compile, p.fused_loss, r.unknown) == (False, False, False, ())
        assert r.cluster.gpu.name == "h100-sxm" and r.cluster.gpus_per_node == 8 and pins_for(r) is None
    _assert_all_predicted(rows)


DGXC_MIRROR = Path("/work/.mirror/NVIDIA+dgxc-benchmarking/repo")
"""A clone of NVIDIA/dgxc-benchmarking, where one is at hand (test_dgxc_sources_are_the_repositorys_files)."""
DGXC_SOURCES = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "dgxc_sources"
"""Verbatim copies of the files dgxc_benchmarking.csv cites, <commit>/<path> (benchmarks/data/dgxc_sources/README.md)."""


def _dgxc_rows() -> list[dict]:
    import csv

    from published import DATA, DGXC_FILE

    with open(DATA / DGXC_FILE) as f:
        return list(csv.DictReader(f))


def _dgxc_mirror_lines(commit: str, path: str) -> list[str]:
    """The lines of NVIDIA/dgxc-benchmarking's `path` at `commit`, from the copy the repository keeps."""
    return (DGXC_SOURCES / commit / path).read_text().split("\n")


def _dgxc_cited() -> set[tuple[str, str]]:
    import re

    return {re.match(r"NVIDIA/dgxc-benchmarking@([0-9a-f]{7}):([\w./]+\.md):\d+", r["source"]).groups()
            for r in _dgxc_rows()}


def test_dgxc_sources_are_the_repositorys_files():
    """The kept copies are byte for byte the repository's files at their commits, where a clone is at hand, and every
    file a row cites is kept."""
    import subprocess

    kept = {(p.relative_to(DGXC_SOURCES).parts[0], "/".join(p.relative_to(DGXC_SOURCES).parts[1:]))
            for p in DGXC_SOURCES.rglob("*") if p.is_file() and p.parent != DGXC_SOURCES}
    assert _dgxc_cited() <= kept and len(kept) == 29
    if not DGXC_MIRROR.exists():
        pytest.skip("no clone of NVIDIA/dgxc-benchmarking here to check the kept copies against")
    for commit, path in sorted(kept):
        upstream = subprocess.run(["git", "-C", str(DGXC_MIRROR), "show", f"{commit}:{path}"], capture_output=True,
                                  check=True).stdout
        assert (DGXC_SOURCES / commit / path).read_bytes() == upstream, (commit, path)


def test_every_dgxc_row_is_its_cited_lines():
    """Each of the 281 rows: the line its source cites prints the tokens/s its notes quote, and the step-time line
    its notes cite prints the step time (the README tables as NVIDIA published them, benchmarks/data/dgxc_sources)."""
    import re

    for row in _dgxc_rows():
        commit, path, line = re.match(r"NVIDIA/dgxc-benchmarking@([0-9a-f]{7}):([\w./]+\.md):(\d+)",
                                      row["source"]).groups()
        lines = _dgxc_mirror_lines(commit, path)
        tok, tok_line = re.search(r"([0-9.]+) tokens/s at :(\d+)", row["notes"]).groups()
        step, step_line = re.search(r"step time ([0-9. ]+) s at :(\d+)", row["notes"]).groups()
        assert tok_line == line and tok in lines[int(line) - 1], row["source"]
        assert step.replace(" ", "") in lines[int(step_line) - 1].replace(" ", ""), row["source"]


def test_dgxc_rows_are_read_as_the_readmes_state_them():
    """Each DGXC row's tokens/s/GPU is its README table's tokens/s over the GPU count, agrees with seq x GBS / step
    time (to 0.5%), and cites the README line of its figure; 281 rows, of which Llama 4 Maverick's 8, the 24.09/24.12
    405B proxy scales' 12 and Grok-1's 20 from tables without a layout per GPU count are recorded, not modelled (its
    10 from NeMo 25.04 state one). Two fine-tuning cells print a tokens/s that their own step time and MFU contradict
    (the 16-GPU figure doubled), and Grok-1's two 512-GPU GB200 cells half theirs: there the step time is taken, and
    the notes say so."""
    import re

    rows = _dgxc_rows()
    assert len(rows) == 281
    assert sum(r["model"] == "Grok1-314B" for r in rows) == 30 and sum(r["model"].startswith("Llama4") for r in rows) == 8
    assert all("NOT MODELLED" in r["notes"] for r in rows if r["model"].startswith("Llama4")
               or (r["model"].startswith("Grok1") and not r["tp"]))
    assert sum(r["model"].startswith("Grok1") and "NeMo 25.04" in r["source"] and r["tp"] != "" for r in rows) == 10
    assert sum("proxy (fewer layers" in r["model"] for r in rows) == 12 and sum("(proxy, " in r["model"] for r in rows) == 6
    inconsistent = 0
    for row in rows:
        container = r"\(NeMo (24\.(05|09|12)|25\.02\.01|25\.04\.0[01]) container"
        assert re.match(r"NVIDIA/dgxc-benchmarking@[0-9a-f]{7}:[\w./]+\.md:\d+ " + container, row["source"])
        assert row["notes"].startswith(row["source"].split("(")[1].split(",")[0])  # "NeMo 24.09 container"
        tok = float(re.search(r"([0-9.]+) tokens/s at :", row["notes"]).group(1))
        step = float(re.search(r"step time ([0-9. ]+) s at", row["notes"]).group(1).replace(" ", ""))
        per_gpu, gpus = float(row["tokens_per_sec_per_gpu"]), int(row["num_gpus"])
        if "TABLE INCONSISTENT" in row["notes"]:
            inconsistent += 1
            derived = int(row["seq_len"]) * int(row["gbs"]) / step
            assert abs(derived / tok - 1) > 0.005 and abs(per_gpu - derived / gpus) < 0.06
            continue
        assert abs(per_gpu - tok / gpus) < 0.06
        if row["gbs"]:
            assert abs(int(row["seq_len"]) * int(row["gbs"]) / step / tok - 1) < 0.005, row["source"]
    assert inconsistent == 4


@pytest.mark.parametrize("commit, path, line, text", [
    ("35a9aec", "llama3.1/README_70b.md", 54, "| Throughput in tokens per second       | 71235  | 142373 | 283399 |"),
    ("35a9aec", "nemotron/README_340b.md", 55, "28432"),
    ("8f5cbb3", "nemo_megatron/README_175b.md", None, "| 93190"),
    ("8f5cbb3", "llama3.1/README_8b.md", None, "111054"),
    ("741c886", "llama3.1/README.md", 113, "| 97090\t| 51910\t| 53444\t|  106024\t| 211406 |\t422175"),
    ("741c886", "llama3.1/README.md", 106, "| 106346\t| 210769 | 419430"),
    ("741c886", "nemotron/README.md", 80, "Throughput in tokens per second |132396|264792|529584|1053845|2097152|4152776|"),
    ("741c886", "nemotron/README.md", 87, "Throughput in tokens per second |60125|119428|237772|473398"),
    ("8f5cbb3", "llama3/finetuning/README_8b.md", 70, "| Throughput in tokens per second | 192752 | 385505 | 771011 |"),
    ("8f5cbb3", "llama3/finetuning/README_70b.md", 62, "| Throughput in tokens per second | 14375 | 27887 | 53663 |"),
    ("8f5cbb3", "llama3/finetuning/README_70b.md", 48, "| Throughput in tokens per second | 39009 |"),
    ("68eaf7e", "llama3.1/README.md", 80, "| 85514           | 169590          | 335867"),
    ("60d6fd3", "llama3.1/README.md", 105, "|     105863      |"),
    ("68eaf7e", "nemotron/README.md", 158, "| Throughput in tokens per second       |96067  | 187078| 369998|"),
    ("68eaf7e", "nemotron/README.md", 116, "Throughput in tokens per second |56913|"),
    ("68eaf7e", "nemotronh/README.md", 72, "|52016|104454|203003|395888|807321|1605168|3201148|"),
    ("68eaf7e", "deepseek_v3/pretraining/README.md", 95, "| 122755.33 | 245323.97 | 489502.71"),
    ("1f6d9f4", "deepseek_v3/pretraining/README.md", 83, "Throughput in tokens per second | 342755.90 | 644781.55 |"),
])
def test_dgxc_figures_match_the_mirror(commit, path, line, text):
    """Transcription spot checks against the README text (the kept copies, benchmarks/data/dgxc_sources)."""
    lines = _dgxc_mirror_lines(commit, path)
    hits = [i + 1 for i, l in enumerate(lines) if text in l]
    assert hits and (line is None or line in hits)
    cited = [r for r in _dgxc_rows() if f"@{commit}:{path}:{hits[0]}" in r["source"]]
    assert cited


def test_dgxc_llama3_8b_finetuning_ran_pp_1_not_the_headers_pp_41():
    """The v25.02 8B fine-tuning tables' headers say 'PP=41'; the script's auto-config for 8b (which the launcher
    uses: it passes no layout) sets pipeline_parallelism = 1, and 8 GPUs x TP 1 x PP 41 could not be. The rows record
    PP 1, and their notes say why."""
    import re

    readme = _dgxc_mirror_lines("8f5cbb3", "llama3/finetuning/README_8b.md")
    assert sum("PP=41" in l for l in readme) == 4
    utils = _dgxc_mirror_lines("8f5cbb3", "llama3/finetuning/llama3_finetune_utils.py")
    start = next(i for i, l in enumerate(utils) if 'case "8b":' in l and "gpus" not in l and "global_batch" in utils[i + 2])
    block = "\n".join(utils[start:start + 8])
    assert "args.pipeline_parallelism = 1" in block and "args.tensor_parallelism = 1" in block
    assert not any(re.search(r"--?(pp|pipeline)", l) for l in _dgxc_mirror_lines("8f5cbb3", "llama3/finetuning/launch.sh")
                   if "llama3_finetune.py" in l)
    eight = [r for r in _dgxc_rows() if r["model"].startswith("Llama3-8B (")]
    assert len(eight) == 12 and all(r["pp"] == "1" and "'PP=41'" in r["notes"] and "is a typo" in r["notes"] for r in eight)


def test_dgxc_rows_are_typed_as_they_ran_and_scored_never_fitted(runs):
    """NeMo 1.x launcher recipes as they ran: Megatron with TE layers and sequence parallelism, the distributed
    optimizer with bf16 gradient reduction, TP userbuffer overlap where TP > 1, FP8 with delayed scaling and FP8
    parameters, no recompute but Nemotron-4 340B's selective, the 405B's GPT2BPE proxy vocabulary; evaluated with
    the rules off, left out of every fit, and each gets a prediction."""
    from accuracy import pins_for

    from published import DGXC_FILE

    rows = _validation_rows(runs, DGXC_FILE, "DGXC benchmarking", 241)
    assert {r.group for r in rows} == {"DGXC NeMo 24.05", "DGXC NeMo 24.09", "DGXC NeMo 24.12", "DGXC NeMo 25.02.01",
                                       "DGXC NeMo 25.04.00", "DGXC NeMo 25.04.01"}
    nemo1 = [r for r in rows
             if r.group in ("DGXC NeMo 24.05", "DGXC NeMo 24.09", "DGXC NeMo 24.12") and r.task == "pretrain"]
    assert len(nemo1) == 117
    for r in nemo1:
        p = r.plan
        assert (p.framework, p.layer_spec, p.grad_dtype, p.zero_stage) == ("megatron", "te", "bf16", 1)
        assert p.sequence_parallel == (p.tp > 1) and p.tp_comm_overlap == (p.tp > 1)
        assert (p.fp8_recipe, p.fp8_param_gather) == (("delayed", True) if p.precision == "fp8" else (None, False))
        assert p.recompute == ("selective" if r.model.name == "nemotron4-340b" else "none")
        assert r.model.vocab_size == (50257 if r.model.name == "llama3.1-405b" else r.model.vocab_size)
        assert r.cluster.gpu.name == "h100-sxm" and pins_for(r) is None and r.task == "pretrain"
    _assert_all_predicted(rows)


def test_dgxc_nemo2_rows_are_typed_as_their_scripts_ran(runs):
    """The NeMo 2.0 rows as their scripts ran (each fact cited in the row's notes): v25.02's Llama 3 SFT / LoRA (NeMo
    24.12, NeMo 25ec4e98), v25.04's pre-training (NeMo 25.02.01, NeMo d2b21556) and v25.05-v25.05.04's (NeMo 25.04.00 /
    25.04.01 on H100 and GB200 NVL72, NeMo b4148d21 / 7a8f1cc7 / 6f2c6fda): FP8 delayed scaling with FP8 parameters
    (bf16_with_fp8_mixed, the scripts' default 'ds'), bf16 gradient reduction but DeepSeek-V3's without performance
    mode, the precision-aware optimizer for BF16 from r2.3.0's set_primary_perf_configs, sequence parallelism where
    TP > 1, TP overlap where an overlap callback turns it on (not LoRA, Nemotron-H or DeepSeek-V3), the distributed
    optimizer but LoRA's plain DDP, per-layer CUDA graphs for the GB200 Nemotron-4 and Grok-1 launchers, no recompute
    but DeepSeek-V3's selective modules, the 405B's split counting embedding and loss as layers, DeepSeek-V3's
    explicit first / last stages and MTP layer, expert TP 1 but Grok-1's 4 on GB200, the 405B proxies' 8 / 30 / 62
    layers, LoRA dim 8 (8B) / 16 (70B) on linear_qkv, SQuAD packed to 4096."""
    from accuracy import pins_for

    from published import DGXC_FILE, SQUAD_DOC_TOKENS

    rows = [r for r in runs.values()
            if r.file == DGXC_FILE and (r.group.startswith("DGXC NeMo 25.") or r.task != "pretrain")]
    assert len(rows) == 124 and sum(r.task == "sft" for r in rows) == 8 and sum(r.task == "lora" for r in rows) == 12
    for r in rows:
        p, lora, name = r.plan, r.task == "lora", r.model.name
        deepseek, gb200 = name == "deepseek-v3", r.cluster.gpu.name == "gb200"
        assert (p.framework, p.layer_spec) == ("megatron", "te") and p.grad_dtype == (
            "fp32" if deepseek and "@68eaf7e:" in r.source else "bf16")
        assert p.sequence_parallel == (p.tp > 1)
        assert p.tp_comm_overlap == (p.tp > 1 and not lora and not deepseek and name != "nemotron-h-56b")
        assert p.zero_stage == (0 if lora else 1)
        assert (p.fp8_recipe, p.fp8_param_gather) == (("delayed", True) if p.precision == "fp8" else (None, False))
        assert p.precision_aware_optimizer == (p.precision == "bf16" and r.group.startswith("DGXC NeMo 25.04"))
        graphs = ("local", ()) if gb200 and name in ("nemotron4-340b", "grok1-314b") else ("none", ())
        assert (p.cuda_graph_impl, p.cuda_graph_scope) == graphs
        assert (p.recompute, p.recompute_modules) == ((("selective", ("mla_up_proj",) if not gb200 else ()) if deepseek
                                                       else ("none", ())))
        assert (p.pp_embedding_as_layer, p.pp_loss_as_layer) == ((True, True) if name.startswith("llama3.1-405b")
                                                                 and p.pp > 1 else (False, False))
        ends = (64 // p.pp - 1, 64 // p.pp - 2) if deepseek else (None, None)
        assert (p.pp_first_stage_layers, p.pp_last_stage_layers) == ends
        assert (r.model.mtp_num_layers or 0) == (1 if deepseek else 0)
        assert (p.ep > 1, p.etp) == ((True, 1) if deepseek else (True, 4 if gb200 else 1) if name == "grok1-314b"
                                     else (False, None))
        assert (p.lora_rank, p.lora_targets if lora else ()) == (({"llama3-8b": 8, "llama3-70b": 16}[name], ("linear_qkv",))
                                                                 if lora else (0, ()))
        assert p.packed_doc_tokens == (None if r.task == "pretrain" else SQUAD_DOC_TOKENS)
        assert p.seq_length == (4096 if r.task != "pretrain" or deepseek or name.startswith("nemotron4") else 8192)
        assert r.model.vocab_size == {"nemotron4-15b": 256000, "nemotron4-340b": 256000, "nemotron-h-56b": 131072,
                                      "deepseek-v3": 129280}.get(name, 128256)
        assert r.cluster.gpu.name in ("h100-sxm", "gb200") and pins_for(r) is None and r.unknown == ()
        assert r.cluster.gpus_per_node == (4 if gb200 else 8)
    proxies = sorted((r.model.name, r.model.num_layers, r.plan.pp) for r in rows
                     if r.model.name.startswith("llama3.1-405b-"))
    assert proxies == ([("llama3.1-405b-30l", 30, 4)] * 2 + [("llama3.1-405b-62l", 62, 4)] * 2
                       + [("llama3.1-405b-8l", 8, 1)] * 2)
    assert {r.plan.vp for r in rows if r.model.name == "nemotron4-340b"} == {12}
    assert sum(r.cluster.gpu.name == "gb200" for r in rows) == 27
    strong = [r for r in rows if r.model.name == "nemotron4-340b" and r.cluster.gpu.name == "gb200" and r.plan.gbs == 512]
    assert len(strong) == 6 and {r.plan.world_size for r in strong} == {128, 256, 512}


def test_dgxc_no_row_states_both_gradient_reduction_dtypes():
    # DeepSeek-V3's v25.05 rows (NeMo 7a8f1cc: pretrain_recipe() without performance mode, fp32 reduction) also
    # carried "grad_reduce_in_fp32 False (the recipe's performance mode)", copied from the rows that ran it.
    for row in _dgxc_rows():
        notes = row["notes"]
        assert not ("gradients reduced in fp32" in notes and "grad_reduce_in_fp32 False" in notes), row["source"]
