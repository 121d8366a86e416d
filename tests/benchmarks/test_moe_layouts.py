"""benchmarks/moe_layouts.py: every mixture-of-experts row of NeMo's recommended configs that genconf can type is
feasible pinned and as configured, none is dropped silently, and the pipeline splits typed are the recipes' own."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import moe_layouts  # noqa: E402
from published import DATA, SQUAD_DOC_TOKENS, _model_key  # noqa: E402

from genconf.catalog.hardware import calibration_for  # noqa: E402
from genconf.plan.pipeline import parse_layout  # noqa: E402
from genconf.plan.search import search  # noqa: E402

MOE_FAMILIES = ("mixtral_", "deepseek_v3", "qwen3_30b_a3b", "qwen3_235b_a22b", "llama4_", "vlm_llama4_")
"""The MoE models the file names (NeMo's scripts/performance/llm/*: Mixtral, DeepSeek-V3, Qwen3 MoE, Llama 4)."""


@pytest.fixture(scope="module")
def typed():
    return moe_layouts.cases()


def test_every_moe_row_is_evaluated_or_skipped_with_its_reason(typed):
    todo, skipped = typed
    with open(DATA / moe_layouts.FILE) as f:
        moe = {f"{r['model']} #{i}" for i, r in enumerate(csv.DictReader(f))
               if _model_key(r["model"]).startswith(MOE_FAMILIES)}
    evaluated = {c["label"] for c in todo}
    # Mixtral 6 + 4, DeepSeek-V3 8 + 1 SFT, Qwen3 3 + 3, Llama 4 7 + 2 SFT
    assert evaluated <= moe and len(evaluated) == len(todo) == 34
    assert sum(c["key"].startswith("llama4_") for c in todo) == 9
    why = {s["label"]: s["reason"] for s in skipped}
    assert moe - evaluated <= set(why)  # the rest (Llama 4's VLM) listed with the reason
    assert all(x.startswith("vlm_llama4_") and why[x].startswith("not a language model") for x in moe - evaluated)
    assert len(moe - evaluated) == 6 and all(why.values())


@pytest.mark.parametrize("kind", ["pinned", "as_configured"])
def test_every_typed_moe_row_is_feasible(typed, kind):
    todo, _ = typed
    pins = moe_layouts.pinned_pins if kind == "pinned" else moe_layouts.configured_pins
    rejected = []
    for c in todo:
        result = search(c["model"], c["cluster"], c["gpus"], calibration_for(c["cluster"].gpu.name), pins(c), keep=1)
        if not result.ranked:
            rejected.append((c["label"], moe_layouts._why(result)))
        else:
            plan = result.ranked[0].plan
            assert (plan.tp, plan.pp, plan.vp, plan.cp, plan.ep, plan.expert_tp, plan.mbs, plan.gbs) == (
                c["tp"], c["pp"], c["vp"], c["cp"], c["ep"], c["etp"], c["mbs"], c["gbs"]), c["label"]
    assert rejected == []


def test_the_committed_results_say_the_same():
    todo, skipped = moe_layouts.cases()
    results = json.loads((REPO / "benchmarks" / "results" / "moe_layouts.json").read_text())
    assert [r["label"] for r in results["rows"]] == [c["label"] for c in todo]
    assert results["summary"]["pinned_rejected"] == results["summary"]["as_configured_rejected"] == 0
    assert all(r["pinned_feasible"] and r["as_configured_feasible"] for r in results["rows"])
    assert [s["label"] for s in results["skipped"]] == [s["label"] for s in skipped]


# NVIDIA/NeMo@8cfedd72 scripts/performance/llm/pretrain_deepseek_v3.py:97-105 map_pp_vp_to_layout, transcribed as
# (embedding, decoders, loss) per virtual stage; the recipe's one MTP layer is built beside the loss.
NEMO_DEEPSEEK = {
    (4, 1): [16, 16, 16, 13],
    (8, 1): [8] * 7 + [5], (4, 2): [8] * 7 + [5],
    (16, 1): [4] * 15 + [1], (8, 2): [4] * 15 + [1], (4, 4): [4] * 15 + [1],
}


@pytest.mark.parametrize("pp_vp", sorted(NEMO_DEEPSEEK))
def test_deepseek_layouts_are_nemos_map(pp_vp):
    layout = moe_layouts.DEEPSEEK_LAYOUTS[pp_vp]
    assert list(parse_layout(layout)) == NEMO_DEEPSEEK[pp_vp]
    assert layout.startswith("E") and layout.endswith("mL") and layout.count("m") == 1


def test_the_sft_and_qwen3_splits_count_the_loss_and_embedding_as_the_recipes_do(typed):
    todo, _ = typed
    by = {c["label"]: c for c in todo}
    sft = by["deepseek_v3 (sft) #44"]
    # finetune_deepseek_v3.py:132-133: the loss a layer, the embedding not; 61 layers + loss over 31 x 2 stages
    assert list(parse_layout(sft["pp_layout"])) == [1] * 61 + [0] and sft["model"].mtp_num_layers == 0
    # recipes/qwen3_235b_a22b.py:151-152: embedding and loss each a layer; 94 + 2 slots over pp x vp stages
    assert list(parse_layout(by["qwen3_235b_a22b (pre_train) #46"]["pp_layout"])) == [2] + [3] * 30 + [2]
    assert list(parse_layout(by["qwen3_235b_a22b (pre_train) #89"]["pp_layout"])) == [0] + [1] * 94 + [0]


# The nine Llama 4 rows of the CSV as NVIDIA/NeMo@8cfedd72 types them: (GPU, GPUs, tp, pp, vp, cp, ep, etp, gbs,
# precision, CUDA graphs). Pre-training: 8,192 tokens, token drop, TP overlap asked for; SFT: 4,096-token packs, no
# token drop, TP overlap off (recipes/llama4_e128.py:397-402).
LLAMA4 = {
    "llama4_e16 (pre_train) #33": ("h100-sxm", 256, 4, 1, 1, 1, 16, 4, 1024, "bf16", True),
    "llama4_e128 (pre_train) #34": ("h100-sxm", 512, 4, 1, 1, 1, 128, 4, 1024, "bf16", True),
    "llama4_e128 (sft) #41": ("h100-sxm", 256, 8, 1, 1, 1, 32, 8, 32, "bf16", False),
    "llama4_e128 (sft) #83": ("b200", 256, 8, 1, 1, 1, 32, 8, 32, "bf16", False),
    "llama4_e16 (pre_train) #84": ("b200", 64, 1, 2, 24, 1, 8, 1, 1024, "bf16", False),
    "llama4_e128 (pre_train) #85": ("b200", 128, 1, 2, 12, 1, 64, 1, 1024, "bf16", False),
    "llama4_e16 (pre_train) #119": ("gb200", 64, 1, 1, 1, 1, 16, 1, 1024, "bf16", True),
    "llama4_e16 (pre_train) #120": ("gb200", 64, 1, 1, 1, 1, 16, 1, 1024, "fp8", True),
    "llama4_e128 (pre_train) #121": ("gb200", 128, 1, 2, 12, 1, 64, 1, 1024, "bf16", False),
}


def test_llama4_rows_are_typed_as_nemos_scripts_set_them(typed):
    todo, _ = typed
    by = {c["label"]: c for c in todo if c["key"].startswith("llama4_")}
    assert set(by) == set(LLAMA4)
    for label, (gpu, gpus, tp, pp, vp, cp, ep, etp, gbs, precision, graphs) in LLAMA4.items():
        c, sft = by[label], "(sft)" in label
        assert (c["gpu"], c["gpus"], c["tp"], c["pp"], c["vp"], c["cp"], c["ep"], c["etp"], c["mbs"], c["gbs"],
                c["precision"]) == (gpu, gpus, tp, pp, vp, cp, ep, etp, 1, gbs, precision), label
        # gpt/model/llama.py:417-437: Scout 16 experts in every layer, Maverick 128 in every second; vocab 25256 * 8
        model = c["model"]
        scout = c["key"] == "llama4_e16"
        assert model.name == ("llama4-scout" if scout else "llama4-maverick")
        assert (model.num_experts, model.moe_layer_interval) == ((16, 1) if scout else (128, 2))
        assert (model.num_layers, model.vocab_size, model.seq_length) == (48, 202048, 4096 if sft else 8192)
        # megatron's even split (no account_for_embedding / loss in the recipes); alltoall, dropless priced
        assert c["pp_layout"] == moe_layouts.DEFAULT_LAYOUT and "moe_dispatcher" not in c["opt_in"]
        assert c["opt_in"] == ({"cuda_graph_impl": "local", "cuda_graph_scope": ()} if graphs else {}) | (
            {"packed_doc_tokens": SQUAD_DOC_TOKENS} if sft else {})  # recipes/llama4_e128.py:346-348, as layouts.py
        assert c["configured"] == {"zero_stage": 1, "offload_activation_layers": 0, "recompute": "none",
                                   "precision_aware_optimizer": precision == "bf16",  # helpers.py:217-218
                                   "tp_comm_overlap": (not sft) if tp > 1 else None}
        assert any(u.startswith("token drop") for u in c["unmodelled"]) is not sft
        assert any(u.startswith("shared-expert overlap") for u in c["unmodelled"])


def test_llama4_rows_are_feasible_pinned_and_as_configured_in_the_committed_results():
    results = json.loads((REPO / "benchmarks" / "results" / "moe_layouts.json").read_text())
    rows = {r["label"]: r for r in results["rows"] if r["label"].startswith("llama4_")}
    assert set(rows) == set(LLAMA4)
    for label, r in rows.items():
        _, _, tp, pp, vp, cp, ep, etp, *_ = LLAMA4[label]
        assert r["nvidia"] == f"tp{tp} pp{pp} vp{vp} cp{cp} ep{ep} etp{etp} mbs1"
        assert r["pinned_feasible"] and r["as_configured_feasible"], label
        assert r["rank"] is not None and r["nvidia_tokens_per_s_per_gpu"] > 0  # ranked unpinned
    assert results["summary"]["moe_rows"] == 34 and results["summary"]["skipped"] == 14
