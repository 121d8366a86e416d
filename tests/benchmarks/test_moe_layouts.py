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
from published import DATA, _model_key  # noqa: E402

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
    assert evaluated <= moe and len(evaluated) == len(todo) == 25  # Mixtral 6 + 4, DeepSeek-V3 8 + 1 SFT, Qwen3 3 + 3
    why = {s["label"]: s["reason"] for s in skipped}
    assert moe - evaluated <= set(why)  # the rest (Llama 4, its VLM) listed with the reason
    assert all(why[x].startswith("Llama 4") or x.startswith("vlm_") for x in moe - evaluated)
    assert all(why.values())


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
