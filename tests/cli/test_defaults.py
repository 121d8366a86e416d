"""Defaults an expert would pick (issue 14): the global batch from the model's size, and the output saying where it
came from; small models on data-parallel layouts that need no sharding; a GPU named without a cluster on its usual
node; `genconf launch` on a CPU giving the expected step time and refusing steps over 10 minutes."""

import json

import pytest

from conftest import REPO, needs_torch, one_line_error, run_genconf
from genconf.plan.batch import MI, SMOKE_MAX_MICROBATCHES


def plan_json(*args: str) -> dict:
    out = run_genconf(*args, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.parametrize("model,gpus,tokens", [
    ("gpt3-125m", 8, 256 * 2048),  # GPT-3 Small: 0.5M (Brown et al. 2020, Table 2.1)
    ("llama3-8b", 32, 4 * MI),  # Llama-2 7B to 70B: 4M
    ("llama3.1-405b", 2048, 16 * MI),  # Llama-3 405B: 16M
])
def test_the_default_batch_follows_the_published_runs_and_says_so(model, gpus, tokens):
    d = plan_json("--model", model, "--gpus", str(gpus), "--cluster", "dgx-h100")
    batch = d["batch"]
    assert batch["source"] == "default" and batch["default_tokens_per_step"] == tokens and batch["rule"]
    # rounded to whole units of the layout, within the 1.5x the search allows
    assert batch["global_batch"] == d["plan"]["gbs"] and tokens / 1.5 <= batch["tokens_per_step"] <= 1.5 * tokens
    text = run_genconf("--model", model, "--gpus", str(gpus), "--cluster", "dgx-h100").stdout
    assert f"batch    {batch['global_batch']:,} x {batch['seq_length']:,} = {batch['tokens_per_step']:,} tokens per step" \
        in text
    rounded = batch["global_batch"] != batch["default_global_batch"]
    said = f"the default: {batch['rule']}" + (f"; {batch['default_global_batch']:,} sequences, rounded to "
                                              f"{batch['global_batch']:,} for the layout" if rounded else "")
    assert said in text


def test_a_default_batch_rounded_for_the_layout_says_from_what():
    """70B on 384 GPUs: the 4M-token default is 1,024 sequences of 4,096; the layout takes 1,056 (before: the line
    said 'the default: 4M tokens' beside 4,325,376 tokens)."""
    d = plan_json("--model", "70b", "--gpus", "384")
    assert (d["batch"]["default_global_batch"], d["batch"]["global_batch"]) == (1024, d["plan"]["gbs"])
    assert d["plan"]["gbs"] % (d["plan"]["mbs"] * d["plan"]["dp"]) == 0 and d["plan"]["gbs"] != 1024
    text = run_genconf("--model", "70b", "--gpus", "384").stdout
    assert ("the default: 4M tokens, published for Llama-2 7B (6.74B params) to Llama-2 70B (69B); 1,024 sequences, "
            f"rounded to {d['plan']['gbs']:,} for the layout") in text


def test_a_smoke_batch_capped_below_the_default_says_capped():
    """A smoke-sized model's default (455 sequences of 16 tokens) is capped at 64 micro-batches: 'capped', not
    'rounded'."""
    text = run_genconf("--model", str(REPO / "tests" / "data" / "tiny-llama.yaml"), "--gpus", "1", "--mbs", "1",
                       "--seq-len", "16").stdout
    assert "at most 64 micro-batches: a smoke-sized model; 455 sequences, capped at 64 for the layout" in text


def test_a_pinned_batch_says_it_was_pinned():
    d = plan_json("--model", "1b", "--gpus", "8", "--global-batch", "512")
    assert d["batch"]["source"] == "--global-batch" and d["plan"]["gbs"] == 512


def test_models_above_1b_get_025m_to_16m_tokens_per_step():
    for model, gpus in (("1b", 8), ("gpt3-2.7b", 16), ("llama2-13b", 64), ("llama3-70b", 384), ("gpt-1t", 4096)):
        tokens = plan_json("--model", model, "--gpus", str(gpus))["batch"]["tokens_per_step"]
        assert 0.25 * MI <= tokens <= 16 * MI * 1.5, (model, tokens)


def test_a_smoke_sized_model_gets_a_smoke_sized_batch(tmp_path):
    # issue 14: a 174K-parameter model at seq 128 on 2 GPUs got 32,768 sequences, 2,048 micro-batches a step
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text("name: tiny\nnum_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nffn_hidden_size: 256\n"
                    "vocab_size: 512\nseq_length: 128\n")
    d = plan_json("--model", str(tiny), "--gpus", "2", "--gpus-per-node", "2")
    assert d["model"]["params"] < 200_000
    assert d["plan"]["num_microbatches"] <= SMOKE_MAX_MICROBATCHES and d["plan"]["gbs"] <= 64
    assert "smoke-sized" in d["batch"]["rule"]


@pytest.mark.parametrize("model,gpus,not_this", [("gpt3-125m", 8, "FULL_SHARD"), ("1b", 8, "zero=3")])
def test_small_models_choose_ddp_or_zero1_where_they_fit(model, gpus, not_this):
    d = plan_json("--model", model, "--gpus", str(gpus))
    p = d["plan"]
    assert not_this not in d["layout"], d["layout"]
    sharding = p["zero_stage"] if p["framework"] != "megatron" else (1 if p["distributed_optimizer"] else 0)
    assert sharding <= 1 and p["tp"] == p["pp"] == 1, d["layout"]


@pytest.mark.parametrize("gpu,preset,per_node,domain", [
    ("gb200", "gb200-nvl72", 4, 72), ("gb300", "gb300-nvl72", 4, 72), ("b200", "dgx-b200", 8, 8),
    ("h100-sxm", "dgx-h100", 8, 8), ("h200", "hgx-h200", 8, 8), ("h100-pcie", "pcie-h100", 8, 2),
])
def test_a_gpu_without_a_cluster_gets_its_usual_node_and_says_so(gpu, preset, per_node, domain):
    d = plan_json("--model", "llama3-70b", "--gpus", "144", "--gpu", gpu)
    c = d["cluster"]
    assert (c["name"], c["gpus_per_node"], c["nvlink_domain_gpus"] or c["gpus_per_node"]) == (preset, per_node, domain)
    assert c["note"].startswith(f"--gpu {gpu} without --cluster: its usual node, {preset}")
    assert c["note"] in run_genconf("--model", "llama3-70b", "--gpus", "144", "--gpu", gpu).stdout


def test_a_gpu_with_a_cluster_keeps_the_cluster():
    c = plan_json("--model", "llama3-8b", "--gpus", "8", "--gpu", "b200", "--cluster", "kempner-h100")["cluster"]
    assert (c["name"], c["gpu"], c["gpus_per_node"]) == ("kempner-h100", "b200", 4) and "note" not in c


@needs_torch
def test_launch_on_a_cpu_refuses_a_step_over_10_minutes(tmp_path):
    # GPT-3 Small at sequence 256 in BF16 (no BF16 instructions under the AVX2 pins): about two hours a step
    art = tmp_path / "g125"
    assert run_genconf("--model", "gpt3-125m", "--gpus", "2", "--gpus-per-node", "2", "--framework", "fsdp", "--zero",
                       "0", "--mbs", "1", "--layer-spec", "local", "-o", str(art)).returncode == 0
    out = run_genconf("launch", str(art), "--steps", "1", "--seq-len", "256", "--name", "slow")
    lines = out.stderr.strip().splitlines()
    assert any(line.startswith("genconf: expected ") and " per step on " in line for line in lines), out.stderr
    assert any("scaled down with the shrunk model" in line for line in lines), out.stderr
    assert out.returncode == 2 and lines[-1].startswith("genconf: error: a step is expected to take ")
    assert "over the 10.0 min limit" in lines[-1] and "--force" in lines[-1]
    assert not (art / "runs" / "slow").exists()


@needs_torch
def test_force_lets_a_slow_step_through(monkeypatch):
    from genconf.catalog.models import resolve_model
    from genconf.plan.specs import ParallelPlan
    from genconf.run import launch

    class Cfg:
        model = resolve_model("gpt3-125m")[0]
        plan = ParallelPlan(framework="fsdp", dp=2, mbs=1, gbs=256, seq_length=2048, zero_stage=0, precision="fp32")

    est = launch.cpu_step_estimate(Cfg, force=True, cores=2)
    assert est.step_time_s > 600
    with pytest.raises(Exception, match="over the 10.0 min limit"):
        launch.cpu_step_estimate(Cfg, force=False, cores=2)


def test_launch_force_is_a_flag():
    out = run_genconf("launch", "--help")
    assert "--force" in out.stdout and "10 minutes" in out.stdout
    one_line_error(run_genconf("launch", "/nonexistent", "--force"), "/nonexistent does not exist: give an artifacts directory")


@needs_torch
def test_a_cpu_launch_says_how_long_the_whole_run_takes(capsys):
    # A shrunk model keeps the plan's steps: `launch --layers 2 --hidden 64 ...` of a 1B plan printed a second a
    # step and then ran 27,234 of them (10 hours) without a word.
    from genconf.catalog.models import resolve_model
    from genconf.plan.specs import ParallelPlan, TrainSpec
    from genconf.run import launch

    class Cfg:
        model = resolve_model("gpt3-125m")[0]
        plan = ParallelPlan(framework="fsdp", dp=2, mbs=1, gbs=2, seq_length=128, zero_stage=0, precision="fp32")
        train = TrainSpec(train_steps=100_000)
        shrink: dict = {}

    est = launch.cpu_step_estimate(Cfg, force=True, cores=2)
    total = est.step_time_s * 100_000
    assert total > launch.SMOKE_HINT_S
    err = capsys.readouterr().err
    assert "genconf: 100,000 steps: about " in err and "in all (a smoke test: add --steps N)" in err
    Cfg.shrink = {"steps": 100_000}  # asked for: no hint
    launch.cpu_step_estimate(Cfg, force=True, cores=2)
    assert "add --steps N" not in capsys.readouterr().err

