"""Pipeline layouts (megatron --pipeline-model-parallel-layout): read and written as megatron-core reads them, priced
rank by rank, and searched where moving a layer off the slowest rank is faster: the known answer is NVIDIA's own
layout for Llama 3 70B FP8 on 64 H100s (Megatron-Bridge llama3_70b_pretrain_64gpu_h100_fp8cs_config, #5391)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import genconf_quiet, needs_megatron, run_genconf
from genconf.catalog.clusters import resolve_cluster
from genconf.catalog.hardware import calibration_for
from genconf.catalog.models import resolve_model
from genconf.plan import memory
from genconf.plan.cost import balanced_layout, layout_of_counts, step_cost
from genconf.plan.pipeline import format_layout, parse_layout, stage_layers
from genconf.plan.search import DEFAULT_LAYOUT, TIE_FRACTION, Pins, search
from genconf.plan.specs import ParallelPlan

NVIDIA_70B_H100_FP8 = "Et*2|(t*2|)*34,t*3|(t*2|)*3,tL"
"""Megatron-Bridge perf_recipes/llama/h100/llama3.py, tp4 pp8 vp5 (NVIDIA-NeMo/Megatron-Bridge@56ae11dff)."""


def _megatron_counts(layout: str, pp: int, num_layers: int) -> tuple[int | None, list[list[int]]]:
    import torch
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.enums import LayerType

    cfg = TransformerConfig(num_layers=num_layers, hidden_size=64, num_attention_heads=4, pipeline_model_parallel_size=pp,
                            pipeline_model_parallel_layout=layout, pipeline_dtype=torch.float32)
    rows = cfg.pipeline_model_parallel_layout.layout
    return cfg.virtual_pipeline_model_parallel_size, [[chunk.count(LayerType.decoder) for chunk in row] for row in rows]


@needs_megatron
@pytest.mark.parametrize("layout,pp,num_layers", [
    (NVIDIA_70B_H100_FP8, 8, 80),
    ("Et|(tt|)*30L", 16, 61),                   # Megatron-Bridge's Kimi K2 layout on H100 (an empty last stage)
    ("Et|t*2|t|L", 2, 4),
    ("Et*4|t*5|(t*4|)*17,t*3L", 4, 80),
])
def test_layouts_read_as_megatron_core_reads_them(layout, pp, num_layers):
    vp, theirs = _megatron_counts(layout, pp, num_layers)
    vp = vp or 1
    counts = parse_layout(layout)
    assert [[counts[chunk * pp + rank] for chunk in range(vp)] for rank in range(pp)] == theirs
    plan = ParallelPlan(framework="megatron", pp=pp, vp=vp, dp=1, mbs=1, gbs=pp * 2, pp_layout=layout)
    assert stage_layers(num_layers, plan) == tuple(sum(row) for row in theirs)
    # genconf's own writing of the same placement is read back the same by megatron-core
    assert _megatron_counts(format_layout(counts), pp, num_layers) == _megatron_counts(layout, pp, num_layers)


def test_format_writes_nvidias_string():
    assert format_layout(parse_layout(NVIDIA_70B_H100_FP8)) == NVIDIA_70B_H100_FP8


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=9), min_size=1, max_size=40))
def test_format_and_parse_are_inverses(counts):
    assert parse_layout(format_layout(counts)) == tuple(counts)


@pytest.mark.parametrize("text,why", [
    ("tEL", "embedding"), ("Et|Lt", "loss"), ("Et|tm|L", "multi-token"), ("Et|tX|L", "unknown character"),
    ("Et|(t|*3L", "unbalanced"), ("E(t|)*99999999L", "unrolls too far"), ("", "non-empty"),
])
def test_bad_layouts_say_why(text, why):
    with pytest.raises(ValueError, match=why):
        parse_layout(text)


def test_layout_must_match_the_model_and_the_pipeline():
    plan = ParallelPlan(framework="megatron", pp=8, vp=5, dp=1, mbs=1, gbs=16, pp_layout=NVIDIA_70B_H100_FP8)
    with pytest.raises(ValueError, match="places 80 layers, the model has 81"):
        stage_layers(81, plan)
    with pytest.raises(ValueError, match="40 virtual stages, pp x vp = 8 x 4"):
        stage_layers(80, plan.replace(vp=4))
    with pytest.raises(ValueError, match="cannot be combined"):
        stage_layers(80, plan.replace(pp_last_stage_layers=10))


def _llama70b_fp8_h100():
    model, _ = resolve_model("llama3-70b")
    cluster = resolve_cluster("dgx-h100")
    plan = ParallelPlan(framework="megatron", tp=4, pp=8, vp=5, dp=2, mbs=1, gbs=256, seq_length=8192, zero_stage=1,
                        precision="fp8", fp8_recipe="current", fp8_param_gather=True, sequence_parallel=True,
                        tp_comm_overlap=True)
    return model, cluster, plan, calibration_for("h100-sxm")


def test_balancing_finds_nvidias_layout_for_llama3_70b_fp8_on_h100():
    model, cluster, plan, cal = _llama70b_fp8_h100()
    ours = balanced_layout(model, plan, cluster, cal)
    assert ours is not None
    mine, nvidia = plan.replace(pp_layout=ours), plan.replace(pp_layout=NVIDIA_70B_H100_FP8)
    # One layer moves off the last rank (it also runs the BF16 output layer and the loss) onto a middle rank: the
    # same placement as NVIDIA's up to which middle rank takes it, so the same slowest rank and step time.
    assert stage_layers(80, mine)[-1] == stage_layers(80, nvidia)[-1] == 9
    assert sorted(stage_layers(80, mine)) == sorted(stage_layers(80, nvidia)) == [9] + [10] * 6 + [11]
    assert step_cost(model, mine, cluster, cal).step_time_s == pytest.approx(
        step_cost(model, nvidia, cluster, cal).step_time_s, rel=1e-12)
    # ... and faster than megatron's even split by more than the model's tie fraction
    even = step_cost(model, plan, cluster, cal).step_time_s
    assert even / step_cost(model, mine, cluster, cal).step_time_s - 1 > TIE_FRACTION


def test_balancing_leaves_balanced_and_non_pipeline_plans_alone():
    model, cluster, plan, cal = _llama70b_fp8_h100()
    assert balanced_layout(model, plan.replace(pp=1, vp=1, dp=16), cluster, cal) is None
    assert balanced_layout(model, plan.replace(pp_layout=NVIDIA_70B_H100_FP8), cluster, cal) is None
    # GPT-3 175B in BF16 on pp8 x vp12: the output layer (50K vocabulary) costs a third of a layer; moving a whole
    # layer off the last rank would make the receiving rank the slowest, so nothing moves.
    gpt, _ = resolve_model("gpt3-175b")
    bf16 = ParallelPlan(framework="megatron", tp=8, pp=8, vp=12, dp=1, mbs=1, gbs=64, seq_length=2048, zero_stage=1,
                        sequence_parallel=True, tp_comm_overlap=True)
    assert balanced_layout(gpt, bf16, resolve_cluster("dgx-a100"), calibration_for("a100-80gb")) is None


def test_layout_of_counts_keeps_the_loss_stage_lightest():
    assert layout_of_counts([10, 10, 10, 10, 10, 10, 10, 9], 5).endswith("tL")
    assert stage_layers(80, ParallelPlan(framework="megatron", pp=8, vp=5, dp=1, mbs=1, gbs=16,
                                         pp_layout=layout_of_counts([10, 11, 10, 10, 10, 10, 10, 9], 5))) \
        == (10, 11, 10, 10, 10, 10, 10, 9)


def test_search_offers_the_layout_unless_told_not_to():
    model, cluster, _, cal = _llama70b_fp8_h100()
    # NVIDIA's performance recipe turns fp8-current's BF16 end layers off (Megatron-Bridge _perf_precision); with
    # them on, the last rank's last layer is BF16 too and the balance moves a second layer off it.
    pins = Pins(framework="megatron", tp=4, pp=8, vp=5, mbs=1, gbs=256, seq_length=8192, precision="fp8",
                recompute="none", bf16_layers=(0, 0))
    result = search(model, cluster, 64, cal, pins, keep=3)
    best = result.best
    assert best.plan.pp_layout is not None and stage_layers(80, best.plan)[-1] == 9
    plain = search(model, cluster, 64, cal, Pins(**{**_fields(pins), "pp_layout": DEFAULT_LAYOUT}), keep=3).best
    assert plain.plan.pp_layout is None and plain.plan == best.plan.with_layout(None)
    assert best.cost.tokens_per_s > plain.cost.tokens_per_s * (1 + TIE_FRACTION)
    # the search remembers what megatron's own split gave, for "why this plan"
    assert result.split_tokens_per_s[best.plan] == pytest.approx(plain.cost.tokens_per_s, rel=1e-12)
    given_ = search(model, cluster, 64, cal, Pins(**{**_fields(pins), "pp_layout": NVIDIA_70B_H100_FP8}), keep=3).best
    assert given_.plan.pp_layout == NVIDIA_70B_H100_FP8


def test_a_pinned_first_or_last_stage_is_kept_as_typed():
    """--first-stage-layers / --last-stage-layers are the user's split: the search does not rebalance it into a layout
    (where it did, "why this plan" called the user's split megatron's own)."""
    model, cluster, _, cal = _llama70b_fp8_h100()
    pins = Pins(tp=4, pp=8, vp=1, mbs=1, gbs=256, seq_length=8192, precision="fp8", bf16_layers=(0, 0))
    assert search(model, cluster, 64, cal, pins, keep=1).best.plan.pp_layout is not None  # free: rebalanced
    for first, last in ((17, None), (None, 3), (14, 6)):  # the others split evenly (megatron asserts it)
        pinned = Pins(**{**_fields(pins), "pp_first_stage_layers": first, "pp_last_stage_layers": last})
        best = search(model, cluster, 64, cal, pinned, keep=1).best
        assert best.plan.pp_layout is None
        assert (best.plan.pp_first_stage_layers, best.plan.pp_last_stage_layers) == (first, last)
        counts = stage_layers(80, best.plan)
        assert (first is None or counts[0] == first) and (last is None or counts[-1] == last)


def _fields(pins: Pins) -> dict:
    return {name: getattr(pins, name) for name in Pins.__slots__}


def test_memory_checks_every_rank_that_can_hold_the_peak():
    assert memory._layout_stages_to_check((10, 11, 10, 10, 10, 10, 10, 9)) == (0, 1, 7)
    assert memory._layout_stages_to_check((10, 10, 10, 10, 10, 10, 11, 9)) == (0, 6, 7)
    model, cluster, plan, _ = _llama70b_fp8_h100()
    est = memory.estimate(model, plan.replace(pp_layout=NVIDIA_70B_H100_FP8), cluster)
    assert [s.stage for s in est.stages] == [0, 3, 7] and est.peak.layers in (10, 11)


def test_cli_plans_a_given_layout_and_renders_it(tmp_path):
    out = tmp_path / "out"
    assert genconf_quiet("--model", "llama3-70b", "--gpus", "64", "--cluster", "dgx-h100", "--tp", "4", "--pp", "8",
                         "--pp-layout", NVIDIA_70B_H100_FP8, "--precision", "fp8", "--global-batch", "256",
                         "--mbs", "1", "-o", str(out)) == 0
    text = (out / "megatron_args.txt").read_text()
    assert f"--pipeline-model-parallel-layout {NVIDIA_70B_H100_FP8}\n" in text
    # searched (not given), the layout's reason says what it gains over megatron's split
    done = run_genconf("--model", "llama3-70b", "--gpus", "64", "--cluster", "dgx-h100", "--tp", "4", "--pp", "8",
                       "--vp", "5", "--precision", "fp8", "--global-batch", "256", "--mbs", "1")
    assert done.returncode == 0 and "faster than megatron's own split" in done.stdout
    assert "# layers per pipeline rank: [10, 10, 10, 11, 10, 10, 10, 9]" in text


@pytest.mark.parametrize("flags,message", [
    (["--pp-layout", "Et|tX|L"], "--pp-layout: pipeline layout: unknown character"),
    (["--pp", "3", "--pp-layout", NVIDIA_70B_H100_FP8], "40 virtual stages: --pp must be a divisor"),
    (["--pp", "8", "--vp", "4", "--pp-layout", NVIDIA_70B_H100_FP8], "= pp 8 x vp 5, not --vp 4"),
    (["--framework", "fsdp", "--pp-layout", NVIDIA_70B_H100_FP8], "needs --framework megatron"),
])
def test_cli_refuses_bad_layouts_in_one_line(flags, message):
    done = run_genconf("--model", "llama3-70b", "--gpus", "64", *flags)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_the_simulated_schedule_agrees_the_layout_is_faster():
    # megatron-core's interleaved schedule, pass by pass (genconf.plan.pipeline.simulate_schedule), with each rank's
    # chunk passes from the stage model: the layout shortens the makespan as the closed form says (within 0.5%).
    from genconf.plan.cost import stage_times
    from genconf.plan.pipeline import simulate_schedule

    model, cluster, plan, cal = _llama70b_fp8_h100()
    spans = []
    for p in (plan, plan.replace(pp_layout=balanced_layout(model, plan, cluster, cal))):
        stages = stage_times(model, p, cluster, cal)
        blocks = simulate_schedule(p, [s.forward_s / p.vp for s in stages],
                                   [(s.total_s - s.forward_s) / p.vp for s in stages])
        span = max(b.end_s for b in blocks)
        cost = step_cost(model, p, cluster, cal)
        assert span == pytest.approx(cost.compute_s + cost.bubble_s, rel=0.005)
        spans.append(span)
    assert spans[0] / spans[1] - 1 > 0.05


@st.composite
def _layouts(draw):
    """(pp, vp, counts): a split of GPT-3 1.3B's 24 layers over pp x vp virtual stages, sometimes one layer off."""
    pp, vp = draw(st.sampled_from([2, 4, 8])), draw(st.sampled_from([1, 2, 3]))
    cuts = sorted(draw(st.lists(st.integers(0, 24), min_size=pp * vp - 1, max_size=pp * vp - 1)))
    counts = [b - a for a, b in zip([0] + cuts, cuts + [24])]
    if draw(st.integers(0, 4)) == 0:
        counts[draw(st.integers(0, len(counts) - 1))] += draw(st.sampled_from([-1, 1]))
    return pp, vp, [max(0, c) for c in counts]


@settings(max_examples=120, deadline=None)
@given(_layouts(), st.booleans(), st.booleans())
def test_any_layout_plans_or_says_why_in_one_line(layout, pin_vp, zero):
    # Layouts of every shape: planned (and then sound: the plan's layers are the model's, vp is the layout's) or
    # refused in one line, never a traceback.
    import contextlib
    import io
    import json

    from genconf.cli.main import main

    pp, vp, counts = layout
    out, err = io.StringIO(), io.StringIO()
    args = ["--model", "gpt3-1.3b", "--gpus", "16", "--cluster", "dgx-h100", "--pp", str(pp), "--pp-layout",
            format_layout(counts), "--json"] + (["--vp", str(vp)] if pin_vp else []) + (["--zero", "1"] if zero else [])
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(args)
    assert code in (0, 2), err.getvalue()
    if code == 2:
        assert len(err.getvalue().strip().splitlines()) == 1 and "Traceback" not in err.getvalue()
        return
    plan = json.loads(out.getvalue())["plan"]
    assert sum(counts) == 24 and plan["pp_layout"] == format_layout(counts) and plan["vp"] == vp
    assert sum(plan["stage_layers"]) == 24 and len(plan["stage_layers"]) == pp
