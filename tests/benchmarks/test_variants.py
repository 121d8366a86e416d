"""benchmarks/variants.py: calibration hypotheses parsed, applied per architecture and scored per group."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import variants  # noqa: E402
from published import load_runs  # noqa: E402

from genconf.catalog.hardware import calibration_for  # noqa: E402


def test_all_applies_to_every_architecture_and_a_named_one_only_to_itself():
    got = variants.parse_variant("all.nvlink_efficiency=0.6,hopper.clock_factor=0.85")
    assert got == {"ampere": {"nvlink_efficiency": 0.6},
                   "hopper": {"nvlink_efficiency": 0.6, "clock_factor": 0.85},
                   "blackwell": {"nvlink_efficiency": 0.6}}
    assert variants.gpu_override(got, "h100-sxm") == {"nvlink_efficiency": 0.6, "clock_factor": 0.85}
    assert variants.gpu_override(got, "a100-80gb") == {"nvlink_efficiency": 0.6}


@pytest.mark.parametrize("text, says", [
    ("nvlink_efficiency=0.6", "expected ARCH.FIELD=VALUE"),
    ("volta.clock_factor=0.9", "expected ARCH.FIELD=VALUE"),
    ("all.no_such_term=1", "a Calibration field"),
    ("all.clock_factor=fast", "'fast' is not a number"),
])
def test_a_malformed_variant_is_refused_with_its_text(text, says):
    with pytest.raises(SystemExit, match=says):
        variants.parse_variant(text)


def test_the_committed_value_scores_as_the_committed_calibration():
    runs, _ = load_runs()
    committed = calibration_for("h100-sxm").nvlink_efficiency
    base = variants.score(runs, {}, with_layouts=False)
    same = variants.score(runs, variants.parse_variant(f"hopper.nvlink_efficiency={committed}"), with_layouts=False)
    assert same["median"] == base["median"] and same["p90"] == base["p90"]
    assert same["groups"] == base["groups"]
    # 503 fitted rows (51 of them hybrid: Nemotron 3 Nano, Super, 3.5 Lightning), MosaicML's 216, NeMo 25.x's 20,
    # NeMo AutoModel's 7, OLMo-core's 8, the nanotron playbook's 26 and DGXC benchmarking's 241 (scored, never fitted)
    assert base["rows"] == 1021


def test_a_changed_term_moves_only_the_groups_of_its_architecture():
    runs, _ = load_runs()
    base = variants.score(runs, {}, with_layouts=False)
    slower = variants.score(runs, variants.parse_variant("ampere.clock_factor=0.6"), with_layouts=False)
    for (source, kind, generation), stats in base["groups"].items():
        moved = slower["groups"][(source, kind, generation)][1]
        if generation == "ampere":
            assert moved < stats[1], (source, kind)  # a slower clock predicts fewer tokens/s: the signed error falls
        else:
            assert moved == stats[1], (source, kind, generation)


def test_a_refit_grid_names_each_term_and_its_values():
    assert variants.parse_grid("hopper.nvlink_efficiency=0.6/0.8,all.tp_overlap_exposed=0.25/0.5") == {
        ("hopper", "nvlink_efficiency"): [0.6, 0.8], ("all", "tp_overlap_exposed"): [0.25, 0.5]}
    with pytest.raises(SystemExit, match="not a list of numbers"):
        variants.parse_grid("hopper.nvlink_efficiency=0.6/high")
    with pytest.raises(SystemExit, match="ARCH.FIELD=V1/V2"):
        variants.parse_grid("nvlink_efficiency=0.6/0.8")
