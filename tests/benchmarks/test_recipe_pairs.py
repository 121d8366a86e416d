"""benchmarks/accuracy.py: the MXFP8 GEMM efficiency is identified by contrast, on published rows that differ in
the recipe alone. The pairing is checked on rows built here and on the shared data (known answer: the dense
Megatron-Bridge rows published in both FP8 current scaling and MXFP8, all slower in MXFP8)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from accuracy import _pair_objective, recipe_pairs  # noqa: E402


def _row(label, recipe, gpu="gb200", group="Megatron-Bridge 25.11", error=0.0):
    plan = SimpleNamespace(tp=1, pp=1, vp=1, cp=1, ep=1, dp=8, mbs=2, gbs=128, zero_stage=1, quant_recipe=recipe)
    return {"label": label, "group": group, "gpu": gpu, "task": "pretrain", "_plan": plan, "throughput_error": error}


def test_rows_pair_only_when_everything_but_the_recipe_matches():
    rows = [_row("LLAMA3_8B #1", "current"), _row("LLAMA3_8B #2", "mxfp8"),
            _row("LLAMA3_8B #3", "mxfp8", gpu="b200"),                       # no FP8-CS partner on B200
            _row("LLAMA3_8B #4", "current", group="Megatron-Bridge 26.02"),   # another release
            _row("LLAMA3_8B #5", "nvfp4")]
    pairs = recipe_pairs(rows)
    assert [(a["label"], b["label"]) for a, b in pairs] == [("LLAMA3_8B #1", "LLAMA3_8B #2")]
    # The objective is the ratio's error: both rows 10% fast is a perfect pair, one of them is not.
    assert _pair_objective([(_row("a", "current", error=0.1), _row("b", "mxfp8", error=0.1))]) == 0.0
    assert _pair_objective([(_row("a", "current", error=0.0), _row("b", "mxfp8", error=0.1))]) > 0.09


def test_the_published_recipe_pairs_are_slower_in_mxfp8_and_so_is_genconf():
    from accuracy import cals_for, evaluate_all
    from published import load_runs

    runs = [r for r in load_runs()[0] if r.file == "megatron_bridge_perf_summary.csv" and not r.model.is_moe
            and "LLAMA3_8B" in r.label]
    pairs = recipe_pairs(evaluate_all(runs, cals_for(runs)))
    assert len(pairs) == 5  # Llama 3 8B on B200/GB200 (25.09, 25.11) and GB300 (25.11)
    for cs, mx in pairs:
        measured = mx["measured_tokens_per_s_per_gpu"] / cs["measured_tokens_per_s_per_gpu"]
        predicted = mx["predicted_tokens_per_s_per_gpu"] / cs["predicted_tokens_per_s_per_gpu"]
        assert 0.94 < measured < 0.99
        assert abs(predicted / measured - 1) < 0.04


def test_ordering_counts_pairs_measured_apart_and_whether_genconf_orders_them_alike():
    from collections import namedtuple

    from accuracy import ordering

    model = namedtuple("Model", "is_moe")(False)  # hashable, as ModelSpec is

    def row(layout, measured, predicted, gbs=128, group="S 1"):
        plan = SimpleNamespace(seq_length=8192, gbs=gbs)
        return {"source": "S", "group": group, "gpu": "h100-sxm", "precision": "FP8", "layout": layout, "_run": SimpleNamespace(model=model),
                "_plan": plan, "throughput_error": predicted / measured - 1,
                "measured_tokens_per_s_per_gpu": measured, "predicted_tokens_per_s_per_gpu": predicted}

    rows = [row("a", 100.0, 90.0), row("b", 120.0, 95.0),   # b measured and predicted faster: agrees
            row("c", 101.0, 94.0),                          # within 3% of a: a tie; against b: b faster both ways
            row("d", 150.0, 80.0),                          # measured fastest, predicted slowest: 3 disagreements
            row("e", 500.0, 1.0, gbs=256),                  # another global batch: never paired
            row("f", 500.0, 1.0, group="S 2")]              # another release of the source: never paired
    assert ordering(rows) == {"S, dense": {"pairs": 5, "agree": 2}}
