"""RunConfig and shrink: a smoke test keeps the plan's parallel layout on a smaller model, and config.json reads
back to the same run."""

from __future__ import annotations

import json

import pytest

from genconf.catalog.models import resolve_model
from genconf.plan.errors import GenconfError
from genconf.plan.runconfig import RunConfig, shrink
from genconf.plan.specs import ParallelPlan, TrainSpec

PLAN = ParallelPlan(framework="megatron", tp=4, pp=4, vp=4, dp=24, mbs=1, gbs=1056, seq_length=4096, zero_stage=1,
                    sequence_parallel=True, pp_first_stage_layers=None)
TRAIN = TrainSpec(train_steps=100_000, warmup_steps=2000, checkpoint_every_steps=1000, lr=3e-4, min_lr=3e-5)


def test_shrink_keeps_the_layout():
    model, _ = resolve_model("70b")
    m, p, t = shrink(model, PLAN, TRAIN, layers=16, hidden=256, heads=8, vocab=512, seq_len=128, global_batch=96,
                     steps=12, lr=1e-2)
    assert (p.tp, p.pp, p.vp, p.dp, p.cp, p.zero_stage, p.recompute) == (4, 4, 4, 24, 1, 1, "none")
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.vocab_size) == (16, 256, 8, 512)
    # 64 heads of 64 KV heads: 8 heads keep one KV head each; the MLP scales with the hidden size, 32768 x 256/8192.
    assert m.num_query_groups == 8 and m.ffn_hidden_size == 1024
    assert (p.seq_length, p.gbs, p.mbs) == (128, 96, 1)
    # warm-up 10% of the steps at most, checkpoints no further apart than the run, min_lr at most lr / 10
    assert (t.train_steps, t.warmup_steps, t.checkpoint_every_steps, t.lr, t.min_lr) == (12, 1, 12, 1e-2, 3e-5)


def test_shrink_precision_names_the_fp8_recipe():
    model, _ = resolve_model("llama3-8b")
    _, p, t = shrink(model, PLAN, TRAIN, precision="fp8")
    assert (p.precision, t.fp8_recipe) == ("fp8", "current")
    _, p, t = shrink(model, PLAN, TRAIN, precision="bf16")
    assert (p.precision, t.fp8_recipe) == ("bf16", None)


def test_heads_must_divide_the_hidden_size():
    model, _ = resolve_model("70b")
    with pytest.raises(GenconfError, match="--hidden 100 is not divisible by 64 attention heads"):
        shrink(model, PLAN, TRAIN, hidden=100)


def test_config_json_reads_back():
    model, _ = resolve_model("llama3-8b")
    cfg = RunConfig(model=model, plan=PLAN, train=TRAIN, num_gpus=384, data={"kind": "synthetic"},
                    precision_recipe="bf16", prediction={"gpu": "h100-sxm"}, shrink={"layers": 4}, artifacts="/a")
    assert RunConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_a_shrunk_plan_that_breaks_a_rule_says_what_launch_can_change(tmp_path):
    """launch has no --pp: a layer count that does not split names the multiple to give; a batch the interleaved
    schedule cannot take names the next one the shrink (which picks the micro-batch) and the rules both accept (the
    hint was computed at the micro-batch the shrink then changed, so following it failed again)."""
    import subprocess
    import sys

    from genconf.plan.runconfig import from_artifacts

    out = tmp_path / "m2"
    subprocess.run([sys.executable, "-m", "genconf", "--model", "llama3-8b", "--gpus", "8", "--cluster", "dgx-h100",
                    "--framework", "megatron", "--tp", "1", "--pp", "2", "--vp", "2", "--cp", "1", "--mbs", "2",
                    "--global-batch", "64", "-o", str(out)], check=True, capture_output=True)
    small = dict(layers=4, hidden=64, heads=4, vocab=128, seq_len=64)
    with pytest.raises(GenconfError, match=r"--layers 6 does not split over pp 2 x vp 2; give a multiple of 4"):
        from_artifacts(out, dict(small, layers=6))
    with pytest.raises(GenconfError, match=r"use --global-batch (\d+)$") as err:
        from_artifacts(out, dict(small, global_batch=20))
    suggested = int(str(err.value).rsplit(" ", 1)[1])
    cfg = from_artifacts(out, dict(small, global_batch=suggested))  # following it works
    assert cfg.plan.gbs == suggested and cfg.plan.num_microbatches % cfg.plan.pp == 0
