"""The command line: the main job, the JSON contract, catalogs, and bad input as one line with exit 2."""

import json
import subprocess
import sys

import pytest

from conftest import REPO, genconf_cmd, one_line_error, run_genconf
from genconf.catalog.models import resolve_model
from genconf.cli.main import main

JSON_KEYS = {
    "model": ["name", "params"],
    "cluster": ["gpu", "num_gpus", "gpus_per_node"],
    "plan": ["tp", "pp", "vp", "cp", "ep", "dp", "mbs", "gbs", "seq_length", "zero_stage", "distributed_optimizer",
             "recompute", "precision", "framework"],
    "memory": ["params_gib", "grads_gib", "optimizer_gib", "activations_gib", "other_gib", "total_gib", "capacity_gib"],
    "perf": ["step_time_s", "tflops_per_gpu", "mfu", "tokens_per_s_per_gpu", "bubble_fraction"],
}


def run(*args, timeout=120):
    return subprocess.run(genconf_cmd() + list(args), capture_output=True, text=True, timeout=timeout, cwd=REPO)


def test_main_job_json_contract():
    out = run("--model", "70b", "--gpus", "384", "--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    for section, keys in JSON_KEYS.items():
        for key in keys:
            assert key in d[section], f"{section}.{key}"
    assert isinstance(d["alternatives"], list)
    assert d["model"]["alias"] == "70b" and d["model"]["name"] == "olmo-70b"
    assert d["model"]["params"] == 65_250_926_592 and d["model"]["params_workshop"] == 65_288_471_656
    p = d["plan"]
    assert p["tp"] * p["pp"] * p["cp"] * p["dp"] == 384 == d["cluster"]["num_gpus"]
    m = d["memory"]
    assert m["total_gib"] <= m["capacity_gib"]
    assert m["total_gib"] == pytest.approx(m["params_gib"] + m["grads_gib"] + m["optimizer_gib"] + m["activations_gib"]
                                           + m["other_gib"], abs=0.01)
    assert d["training"]["tokens"] == 20 * 65_250_926_592
    assert type(d["training"]["tokens"]) is int  # a count of tokens, not 1305018531840.0


def test_main_job_human_output_says_what_the_alias_resolved_to():
    out = run("--model", "70b", "--gpus", "384")
    assert out.returncode == 0, out.stderr
    assert "70b -> olmo-70b" in out.stdout
    for text in ("memory per GPU", "step time", "MFU", "tokens/s per GPU", "why this plan", "alternatives"):
        assert text in out.stdout


def test_plan_subcommand_is_the_default():
    a, b = run("plan", "--model", "7b", "--gpus", "16", "--json"), run("--model", "7b", "--gpus", "16", "--json")
    assert a.returncode == b.returncode == 0
    assert json.loads(a.stdout)["plan"] == json.loads(b.stdout)["plan"]


def test_pinned_plan_and_explain():
    out = run("--model", "llama3-8b", "--gpus", "64", "--cluster", "dgx-h100", "--framework", "megatron", "--tp", "2",
              "--pp", "2", "--mbs", "1", "--global-batch", "512", "--zero", "1", "--recompute", "selective", "--json",
              "--explain")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert (d["plan"]["tp"], d["plan"]["pp"], d["plan"]["dp"], d["plan"]["gbs"]) == (2, 2, 16, 512)
    assert "explain" in d and d["explain"]["considered"] >= 1
    text = run("--model", "70b", "--gpus", "384", "--explain").stdout
    assert "rejected by rule" in text and "memory_fits" in text and "nearest misses" in text


@pytest.mark.parametrize("args,needle", [
    (["--model", "nosuchmodel"], "unknown model 'nosuchmodel'"),
    (["--gpus", "0"], "expected a positive integer, got 0"),
    (["--gpus", "7"], "7 GPUs is not a whole number of 4-GPU nodes"),
    (["--tp", "8"], "--tp 8 is larger than a node"),
    (["--cluster", "mars"], "unknown cluster 'mars'"),
    (["--gpu", "z80"], "unknown GPU 'z80'"),
    (["--model", "llama3-8b", "--precision", "fp8", "--gpu", "a100-80gb", "--gpus", "8"], "FP8 needs Hopper"),
    # Refused before a search: it read "e.g. cp_window: ... plan with --cp 1" (the commonest rule its candidates broke),
    # and with the GPU named "... Nothing tried makes it valid" beside its own fix, after 4 s for Mixtral on 1,024.
    (["--model", "mistral-7b-v0.1", "--precision", "fp8", "--cluster", "dgx-a100", "--gpus", "1024"],
     "genconf: error: FP8 needs Hopper or Blackwell tensor cores; NVIDIA A100-SXM4-80GB has none (use --precision bf16)"),
    # Both read "e.g. architecture / mla_needs_te: ... Nothing tried makes it valid" after a search.
    (["--model", "nemotron-h-8b", "--layer-spec", "local", "--cluster", "dgx-h100", "--gpus", "8"],
     "nemotron-h-8b is a hybrid Mamba model: megatron-core's mamba_stack_spec is Transformer Engine's (--layer-spec te): "
     "drop --layer-spec local"),
    (["--model", "deepseek-v3", "--layer-spec", "local", "--cluster", "dgx-h100", "--gpus", "256"],
     "deepseek-v3 has multi-head latent attention: genconf prices it with Transformer Engine layers (--layer-spec te): "
     "drop --layer-spec local"),
    (["--model", "llama3-8b", "--precision", "mxfp8", "--cluster", "dgx-h100", "--gpus", "8"],
     "MXFP8 needs Blackwell tensor cores; NVIDIA H100 80GB HBM3 (SXM5) is Hopper (use --precision fp8-current"),
    (["--bogus-flag"], "unrecognized arguments: --bogus-flag"),
    (["--model", ""], "--model is empty"),
    (["--model", "mistral-7b-v0.1", "--gpus", "8", "--cp", "2"], "--cp-comm-type a2a"),
    (["--model", "mistral-7b-v0.1", "--gpus", "8", "--framework", "fsdp", "--attention-kernel", "flash2"],
     "takes no mask, and this model's sliding-window layers (4,096 keys back) run with one: plan with --attention-kernel "
     "auto. It would be valid with: --attention-kernel auto"),
    # Before, its fix "use --recompute selective or none" met "--recompute-layers ... needs --recompute full".
    (["--model", "nemotron-h-8b", "--cluster", "dgx-h100", "--gpus", "64", "--recompute-layers", "2"],
     "MambaStack has none (megatron-core): drop --recompute-layers"),
    # Before: "FP8 runs through Transformer Engine (--framework megatron ...) or torchao's float8 layers (--framework
    # fsdp)", and --framework fsdp refused fp8-blockwise next.
    (["--model", "70b", "--cluster", "dgx-b200", "--gpus", "96", "--framework", "deepspeed", "--precision",
      "fp8-blockwise"], "e.g. precision: fp8-blockwise needs Transformer Engine (--framework megatron); FSDP trains FP8 "
                        "through torchao, recipe fp8-current only. It would be valid with: --framework megatron"),
    # Before: "nearest: tp=8", a divisor of the 32 heads that the 2 KV heads refused next.
    (["--model", "nemotron-3-nano", "--cluster", "dgx-a100", "--gpus", "96", "--pp", "2", "--tp", "6"],
     "e.g. tp_divides_heads: tp (6) must divide num_attention_heads (32); nearest: tp=2."),
    # Before: "use --cp 2 or 4", which the sliding-window rule refused next.
    (["--model", "mistral-7b-v0.1", "--cluster", "dgx-h100", "--gpus", "96", "--cp", "3"],
     "(4,096 keys back) runs with no context parallelism here (rule cp_window): plan with --cp 1"),
    # DeepSpeed and FSDP candidates (no --framework typed) broke framework_degrees most often: the example read "e.g.
    # framework_degrees: ... cp=8 needs --framework megatron", and megatron refused --cp 8 with this model's window.
    (["--model", "mistral-7b-v0.1", "--cluster", "dgx-b200", "--gpus", "8", "--cp", "8"],
     "; e.g. cp_window: context parallelism with sliding-window attention"),
    # Each fix from here on is followed to a plan in test_the_fix_the_line_names_plans.
    (["--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "64", "--lora-rank", "16", "--framework", "deepspeed"],
     "--lora-rank on a mixture-of-experts model is not modelled (adapters on routed experts): drop it"),
    (["--model", "nemotron-h-8b", "--cluster", "dgx-h100", "--gpus", "64", "--lora-rank", "16", "--zero", "3"],
     "--lora-rank on a hybrid Mamba model is not modelled (genconf plans hybrid models without LoRA): drop it"),
    (["--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "64", "--lora-rank", "16", "--offload"],
     "drop --lora-rank or --offload"),
    (["--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "64", "--framework", "fsdp", "--offload"],
     "genconf's deepspeed model does not; drop --offload and --framework fsdp"),
    # Every candidate broke the expert rule after another: "e.g. cp_window: ... plan with --cp 1" (--cp was never typed).
    (["--model", "mistral-7b-v0.1", "--cluster", "pcie-h100", "--gpus", "768", "--ep", "8"],
     "--ep is for mixture-of-experts models, and mistral-7b-v0.1 has no experts: drop --ep"),
    (["--model", "qwen2.5-7b", "--cluster", "dgx-h100", "--gpus", "64", "--recompute", "selective", "--offload"],
     "It would be valid with: --framework megatron (without --offload: ZeRO-Offload is DeepSpeed's)"),
])
def test_bad_input_is_one_line_and_exit_2(args, needle):
    out = run(*args)
    assert out.returncode == 2
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("genconf: error:") and needle in lines[0], out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("args,fixed", [
    # Before, the line's fix met the next refusal of the same cause: "use --recompute selective or none" met
    # "--recompute-layers ... needs --recompute full"; "choose --framework megatron" or "use --zero 1" met "LoRA on a
    # mixture-of-experts (or hybrid) model is not modelled"; "use --framework deepspeed" met "deepspeed ... does not
    # [build mixture-of-experts layers]; drop --offload"; LoRA's "choose --framework megatron" and --offload's
    # "use --framework deepspeed" sent the user back and forth.
    (["--model", "nemotron-h-8b", "--recompute-layers", "2"], ["--model", "nemotron-h-8b"]),
    (["--model", "mixtral-8x7b", "--lora-rank", "16", "--zero", "3"], ["--model", "mixtral-8x7b", "--zero", "3"]),
    (["--model", "nemotron-h-8b", "--lora-rank", "16"], ["--model", "nemotron-h-8b"]),
    (["--model", "llama3-8b", "--lora-rank", "16", "--offload"], ["--model", "llama3-8b", "--offload"]),
    (["--model", "mixtral-8x7b", "--framework", "fsdp", "--offload"], ["--model", "mixtral-8x7b"]),
    (["--model", "llama3-8b", "--etp", "2", "--first-stage-layers", "2"], ["--model", "llama3-8b", "--first-stage-layers", "2"]),
    # "--framework megatron" alone met "no CPU offload for --framework megatron; use --framework deepspeed".
    (["--model", "qwen2.5-7b", "--recompute", "selective", "--offload"],
     ["--model", "qwen2.5-7b", "--recompute", "selective", "--framework", "megatron"]),
])
def test_the_fix_the_line_names_plans(args, fixed, capsys):
    where = ["--cluster", "dgx-h100", "--gpus", "64"]
    assert main(args + where) == 2
    line = capsys.readouterr().err
    dropped = [flag for flag in set(args) - set(fixed) if flag.startswith("--")]
    after = [line[line.index(word):] for word in ("drop ", "without ") if word in line]
    assert dropped and all(any(flag in tail for tail in after) or ("drop it" in line and flag in line)
                           for flag in dropped), line
    assert main(fixed + where + ["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["plan"]


def test_malformed_yaml_model(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nnum_layers: [1, 2\n")
    out = run("--model", str(bad))
    assert out.returncode == 2 and "is not valid YAML" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("name: unknown\nnum_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nffn_hidden_size: 256\n"
                       "vocab_size: 100\nseq_length: 64\nnum_layers_typo: 3\n")
    out = run("--model", str(unknown))
    assert out.returncode == 2 and f"{unknown}: unknown key 'num_layers_typo'" in out.stderr


def test_custom_model_and_cluster_files(tmp_path):
    model = tmp_path / "mine.yaml"
    model.write_text("name: mine\nnum_layers: 12\nhidden_size: 768\nnum_attention_heads: 12\nffn_hidden_size: 3072\n"
                     "vocab_size: 50304\nseq_length: 1024\n")
    cluster = tmp_path / "lab.yaml"
    cluster.write_text("name: lab\ngpu: a100-40gb\ngpus_per_node: 8\nib_gbit_per_s_per_gpu: 200\n")
    out = run("--model", str(model), "--cluster", str(cluster), "--gpus", "16", "--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["cluster"]["gpu"] == "a100-40gb" and d["cluster"]["num_nodes"] == 2 and d["model"]["name"] == "mine"


def test_catalog_commands():
    models = run("models")
    assert models.returncode == 0 and "llama3.1-405b" in models.stdout and "70b" in models.stdout
    # Every column stays apart, the longest names and MoE archs too ('moe128x8qwen3-30b' ran together once).
    header, *rows = models.stdout.splitlines()
    assert header.split() == ["name", "params", "layers", "hidden", "heads", "kv", "ffn", "vocab", "seq", "arch", "aliases"]
    by_name = {r.split()[0]: r.split(None, 10) for r in rows}
    assert by_name["qwen3-30b-a3b"][9:] == ["swiglu/rmsnorm/rope/moe128x8", "qwen3-30b, qwen/qwen3-30b-a3b"]
    # Sliding windows: on every layer (Mistral), or on 18 of GPT-OSS's 36.
    assert by_name["mistral-7b-v0.1"][9] == "swiglu/rmsnorm/rope/window4096"
    assert by_name["gpt-oss-120b"][9] == "swiglu/rmsnorm/rope/moe128x4/window128:18/36"
    # Where not every layer is MoE, how the dense ones sit: one MoE layer in n (moe_layer_interval, Llama 4
    # Maverick: NeMo's moe_layer_freq [0, 1] * 24) or k dense first layers (first_k_dense_replace: DeepSeek-V3's 3,
    # Kimi K2's 1); Scout, Qwen3 and Grok-1 are MoE on every layer.
    assert by_name["llama4-maverick"][9] == "swiglu/rmsnorm/rope/moe128x1:1in2"
    assert by_name["deepseek-v3"][9] == "swiglu/rmsnorm/rope/moe256x8:first3dense"
    assert by_name["kimi-k2"][9] == "swiglu/rmsnorm/rope/moe384x8:first1dense"
    for name in ("llama4-scout", "qwen3-235b-a22b", "grok1-314b"):
        assert by_name[name][9].rsplit("/", 1)[-1] in ("moe16x1", "moe128x8", "moe8x2"), name
    assert resolve_model("llama4-maverick")[0].mlp_pattern == "-E" * 24
    assert resolve_model("deepseek-v3")[0].mlp_pattern == "---" + "E" * 58
    assert by_name["nemotron-3.5-lightning"][1] == "32.9B"
    assert all(len(r.split()) >= 10 for r in rows)
    listed = json.loads(run("models", "--json").stdout)
    assert {"olmo-1b", "olmo-7b", "olmo-70b", "mixtral-8x7b", "gpt3-175b", "llama-65b"} <= {m["name"] for m in listed}
    hw = json.loads(run("hardware", "--json").stdout)
    gpus = {g["name"]: g for g in hw["gpus"]}
    assert {"a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200", "b200", "gb200"} <= set(gpus)
    assert gpus["h100-sxm"]["peak_bf16_tflops"] == pytest.approx(989.4)  # dense, not the 1979 sparse figure
    assert gpus["b200"]["peak_fp4_tflops"] and gpus["a100-80gb"]["peak_fp8_tflops"] is None
    assert hw["default_cluster"] == "kempner-h100"
    assert "kempner-h100" in run("hardware").stdout


# Freeze the CLI: flags change only on purpose (update this list in the same commit).
PLAN_FLAGS = sorted([
    "--model", "--gpus", "--cluster", "--gpu", "--gpus-per-node", "--calibration", "--framework", "--tp", "--pp", "--vp", "--cp", "--ep",
    "--mbs", "--global-batch", "--seq-len", "--packed-doc-len", "--first-stage-layers", "--last-stage-layers", "--pp-layout", "--zero",
    "--recompute",
    "--precision", "--lora-rank", "--lora-targets", "--recompute-modules", "--layer-spec", "--offload", "--tp-comm-overlap", "--tokens", "--top", "--explain", "--json", "--plot",
    "--etp", "--recompute-layers", "--offload-activations", "--grad-dtype", "--fp8-param-gather",
    "--bf16-first-layers", "--bf16-last-layers",
    "--no-fp8-param-gather", "--precision-aware-optimizer", "--no-precision-aware-optimizer", "--no-tp-comm-overlap",
    "--adam-moments-dtype",
    "--fused-kernels", "--no-gradient-accumulation-fusion", "--expandable-segments", "--no-expandable-segments", "--megatron-fsdp", "--moe-ep-overlap", "--moe-dispatcher",
    "--cuda-graph-impl", "--cuda-graph-scope", "--attention-kernel", "--fused-loss", "--no-fused-loss",
    "--account", "--partition", "--time", "--job-name", "--run-dir", "--python",
])


def test_cli_flags_are_frozen():
    from genconf.cli.parser import build_parser

    parser = build_parser()
    plan = parser._subparsers._group_actions[0].choices["plan"]
    flags = sorted(opt for action in plan._actions for opt in action.option_strings
                   if opt.startswith("--") and opt not in ("--help",) and not opt.startswith("--output")
                   and opt not in ("--force",))
    assert flags == PLAN_FLAGS


def test_planning_imports_nothing_heavy():
    code = ("import sys; from genconf.cli.main import main; main(['--model','7b','--gpus','8','--json']);"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch','jinja2','deepspeed','megatron'));"
            "sys.stderr.write(repr(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0 and out.stderr.strip().endswith("[]"), out.stderr[-300:]


# --- issue 12: honest ties, exact bytes and intervals, precision recipes -------------------------

def test_ties_prefer_the_simpler_layout_and_say_so(capsys):
    # With Megatron-FSDP searched too (--megatron-fsdp), zero 3 is within 1% of the distributed optimizer for 1B
    # on 8 H100s: a tie, and the simpler plan (no parameter sharding) is ranked first with the reason said.
    assert main(["--model", "1b", "--gpus", "8", "--cluster", "dgx-h100", "--megatron-fsdp", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["plan"]["zero_stage"] <= 1 and d["plan"]["recompute"] == "none" and d["plan"]["tp"] == 1
    assert any("tie" in w or "simpler" in w for w in d["why"])
    # Without it, Megatron-FSDP is not planned at all where the distributed optimizer fits.
    assert main(["--model", "1b", "--gpus", "8", "--cluster", "dgx-h100", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["plan"]["zero_stage"] <= 1 and all("zero=3" not in w for w in d["why"])


def test_json_has_exact_bytes_and_80_percent_intervals(capsys):
    assert main(["--model", "llama3-8b", "--gpus", "16", "--cluster", "dgx-h100", "--precision", "fp8-blockwise",
                 "--grad-dtype", "bf16", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    m = d["memory"]
    for key in ("params", "grads", "optimizer", "activations", "other", "allocated", "reserved", "device", "total"):
        assert isinstance(m[f"{key}_bytes"], int) and m[f"{key}_gib"] == pytest.approx(m[f"{key}_bytes"] / 2**30, abs=1e-3)
    assert m["allocated_bytes"] <= m["reserved_bytes"] <= m["device_bytes"]
    band = d["intervals_80"]
    lo, hi = band["tokens_per_s_per_gpu"]
    assert lo < d["perf"]["tokens_per_s_per_gpu"] < hi
    s_lo, s_hi = band["step_time_s"]
    assert s_lo < d["perf"]["step_time_s"] < s_hi
    assert d["plan"]["fp8_recipe"] == "blockwise" and d["plan"]["grad_dtype"] == "bf16"


def test_a_short_run_reads_in_seconds_and_takes_one_step_at_least(capsys):
    # 1,000 tokens is less than one step's batch: the run still takes that step (it read "0.0 days, 0 GPU-hours").
    assert main(["--model", "1b", "--gpus", "8", "--cluster", "dgx-h100", "--tokens", "1000", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["training"]["time_s"] == pytest.approx(d["perf"]["step_time_s"], abs=1e-3)
    assert 0 < d["training"]["gpu_hours"] == pytest.approx(d["perf"]["step_time_s"] * 8 / 3600, abs=1e-3)
    assert main(["--model", "1b", "--gpus", "8", "--cluster", "dgx-h100", "--tokens", "1000"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("train 1K tokens"))
    assert " s, 0.00" in line and "days" not in line
    # A long run still reads in days.
    assert main(["--model", "70b", "--gpus", "384"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("train "))
    assert line.rstrip().endswith("GPU-hours") and " days, " in line


def test_a_run_of_years_says_its_years_and_days_are_not_rounded_twice(capsys):
    # The 405B on 256 GPUs read "2187.0 days"; the 70B on 384 read "34.2 days" from the JSON's 34.25 (34.2504 days).
    assert main(["--model", "llama3.1-405b", "--gpus", "256", "--json"]) == 0
    days = json.loads(capsys.readouterr().out)["training"]["time_s"] / 86400
    assert days > 365.25  # a run of years
    assert main(["--model", "llama3.1-405b", "--gpus", "256"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("train "))
    assert f" {days:,.1f} days ({days / 365.25:.1f} years), " in line
    assert main(["--model", "70b", "--gpus", "384", "--json"]) == 0
    training = json.loads(capsys.readouterr().out)["training"]
    assert main(["--model", "70b", "--gpus", "384"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("train "))
    assert f" {training['time_s'] / 86400:.1f} days, " in line and "years" not in line


def test_explain_shows_the_rejections_when_nothing_fits(capsys):
    # --explain asks for the search's rejections and nearest misses: a plan that cannot fit gives them after its
    # one-line error (before, only the error), in text and in --json.
    assert main(["--model", "70b", "--gpus", "8", "--cluster", "dgx-h100", "--explain"]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "does not fit" in err
    assert "memory_fits" in out and "nearest misses:" in out and "GiB usable" in out
    assert main(["--model", "70b", "--gpus", "8", "--cluster", "dgx-h100", "--explain", "--json"]) == 2
    out, err = capsys.readouterr()
    d = json.loads(out)
    assert d["error"] == err.removeprefix("genconf: error: ").rstrip("\n")
    assert d["explain"]["considered"] == d["explain"]["rejected"]["memory_fits"] > 0
    assert d["explain"]["nearest_misses"][0]["reason"].startswith("memory_fits:")
    # Without --explain, the error alone.
    assert main(["--model", "70b", "--gpus", "8", "--cluster", "dgx-h100", "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1


def test_nvfp4_and_mxfp8_need_blackwell(capsys):
    assert main(["--model", "llama3-8b", "--gpus", "8", "--cluster", "dgx-h100", "--precision", "mxfp8"]) == 2
    assert "Blackwell" in capsys.readouterr().err
    assert main(["--model", "llama3-8b", "--gpus", "8", "--cluster", "dgx-b200", "--precision", "nvfp4", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["plan"]["precision"] == "fp4" and d["perf"]["peak_tflops_per_gpu"] > 4000


def test_a_repeated_cuda_graph_scope_is_one_line(capsys):
    assert main(["--model", "llama3-8b", "--gpus", "8", "--cuda-graph-impl", "transformer_engine",
                 "--cuda-graph-scope", "attn", "attn"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "genconf: error: --cuda-graph-scope names attn more than once"


def test_the_math_attention_kernel_plans_and_cp_1_takes_any_sequence():
    """--attention-kernel math is one of its choices (its 'why' line named no such kernel); --cp 1 splits nothing, so
    an odd sequence length is no error."""
    out = run("--model", "llama3-8b", "--gpus", "8", "--framework", "fsdp", "--attention-kernel", "math")
    assert out.returncode == 0 and "PyTorch's math backend" in out.stdout, out.stderr
    out = run("--model", "llama3-8b", "--gpus", "8", "--seq-len", "4097", "--cp", "1", "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["plan"]["cp"] == 1, out.stderr


def test_optimizer_state_flags_are_planned_or_refused_in_one_line():
    """BF16 Adam moments need megatron's precision-aware optimizer; with it the plan keeps 8 optimizer bytes per
    parameter under FP8 current scaling (fp32 master weights + two BF16 moments), 12 without."""
    base = ["--model", "llama3.1-8b", "--gpus", "16", "--cluster", "dgx-h100", "--framework", "megatron", "--tp", "2",
            "--pp", "1", "--zero", "1", "--precision", "fp8-current", "--json"]
    refused = run(*base, "--adam-moments-dtype", "bf16", "--no-precision-aware-optimizer")
    assert refused.returncode == 2 and "precision-aware optimizer" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and "Traceback" not in refused.stderr
    plain = json.loads(run(*base, "--no-precision-aware-optimizer").stdout)
    moments = json.loads(run(*base, "--adam-moments-dtype", "bf16").stdout)
    assert moments["plan"]["adam_moments_dtype"] == "bf16" and moments["plan"]["precision_aware_optimizer"]
    assert moments["memory"]["optimizer_bytes"] == pytest.approx(plain["memory"]["optimizer_bytes"] * 8 / 12, rel=0.01)


def test_fsdp_fp8_other_than_current_scaling_is_refused_at_plan_time():
    """genconf's FSDP launcher trains FP8 through torchao's tensorwise recipe only: a delayed or blockwise plan is
    refused when planned, not at launch."""
    out = run("--model", "llama3.1-8b", "--gpus", "16", "--cluster", "dgx-h100", "--framework", "fsdp",
              "--precision", "fp8-delayed")
    assert out.returncode == 2 and "fp8-delayed needs Transformer Engine" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert run("--model", "llama3.1-8b", "--gpus", "16", "--cluster", "dgx-h100", "--framework", "fsdp",
               "--precision", "fp8-current").returncode == 0


def test_another_gpu_on_an_nvl72_preset_is_refused_in_one_line():
    """Its NVLink domain across nodes and its Grace host are that system's: H100s on gb200-nvl72 planned tp=8 across
    two 4-GPU nodes 'inside the 72-GPU NVLink domain'."""
    out = run_genconf("--model", "70b", "--gpus", "144", "--cluster", "gb200-nvl72", "--gpu", "h100-sxm")
    one_line_error(out, "--gpu h100-sxm on gb200-nvl72: its NVLink domain of 72 GPUs across nodes is gb200's system")
    # the same GPU, or a node-local preset, stays as it was
    assert run_genconf("--model", "70b", "--gpus", "64", "--cluster", "gb200-nvl72", "--gpu", "gb200").returncode == 0
    assert run_genconf("--model", "70b", "--gpus", "64", "--cluster", "dgx-h100", "--gpu", "h200").returncode == 0


def test_more_gpus_than_the_preset_has_are_planned_and_said():
    """kempner-h100 has 384 GPUs: --gpus 768 plans a larger cluster of its kind, and the output says so (it said
    nothing, as if the preset had them)."""
    import json

    out = run_genconf("--model", "70b", "--gpus", "768", "--json")
    assert out.returncode == 0, out.stderr
    note = json.loads(out.stdout)["cluster"]["note"]
    assert note == "kempner-h100 has 384 GPUs: this plans 768 of the same kind (a larger cluster of its nodes and network)"
    assert "note" not in json.loads(run_genconf("--model", "70b", "--gpus", "384", "--json").stdout)["cluster"]


def test_a_cluster_file_with_a_bad_nccl_env_name_is_refused_when_read(tmp_path):
    """The name was checked only when -o rendered the launch scripts: the plan printed, then -o failed."""
    bad = tmp_path / "bad.yaml"
    bad.write_text('name: bad\ngpu: h100-sxm\ngpus_per_node: 8\nib_gbit_per_s_per_gpu: 400\nnccl_env: {"BAD NAME": x}\n')
    one_line_error(run_genconf("--model", "1b", "--gpus", "8", "--cluster", str(bad)),
                   f"{bad}: nccl_env: 'BAD NAME' is not an environment variable name")


@pytest.mark.parametrize("text,needle", [
    # a missing key read as a Python signature ("ClusterSpec.__init__() missing 1 required keyword-only argument")
    ("name: c\ngpu: h100-sxm\nib_gbit_per_s_per_gpu: 400\n", "missing key 'gpus_per_node' (a cluster needs gpu, "
                                                           "gpus_per_node, ib_gbit_per_s_per_gpu)"),
    # a null value was written into launch_env.sh as `export NCCL_X=None`
    ("name: c\ngpu: h100-sxm\ngpus_per_node: 8\nib_gbit_per_s_per_gpu: 400\nnccl_env: {NCCL_X: null}\n",
     "nccl_env: NCCL_X must be a value (a string or number), got null"),
])
def test_a_cluster_file_missing_a_key_or_a_value_is_one_line(tmp_path, text, needle):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    one_line_error(run_genconf("--model", "1b", "--gpus", "8", "--cluster", str(bad)), f"{bad}: {needle}")


def test_mfu_with_causal_attention_halved_is_shown_where_the_convention_misleads():
    """MFU counts causal attention unhalved (Megatron-LM's formula): at 1M tokens Llama 3 8B shows 97.6%, which reads
    as impossible; the plan then also shows the MFU of the FLOPs the GPU runs. At 8K the two are close: one line."""
    from genconf.plan.counting import causal_masked_flops_per_token, model_flops_per_token
    from genconf.catalog.models import resolve_model

    long = json.loads(run("--model", "llama3-8b", "--gpus", "64", "--seq-len", "1048576", "--json").stdout)["perf"]
    model = resolve_model("llama3-8b")[0]
    share = causal_masked_flops_per_token(model, 1048576) / model_flops_per_token(model, 1048576)
    assert long["mfu_causal_halved"] == pytest.approx(long["mfu"] * (1 - share), abs=1e-4)
    assert long["mfu"] > 0.9 and long["mfu_causal_halved"] < 0.55
    text = run("--model", "llama3-8b", "--gpus", "64", "--seq-len", "1048576").stdout
    assert "causal attention halved" in text
    assert "causal attention halved" not in run("--model", "llama3-8b", "--gpus", "64").stdout


def test_a_window_as_long_as_the_sequence_is_halved_as_full_attention():
    """Mistral 7B's 4,096-token window at a 4,096-token sequence is full causal attention: its masked half counts."""
    from genconf.plan.counting import causal_masked_flops_per_token
    from genconf.catalog.models import resolve_model

    mistral = resolve_model("mistral-7b-v0.1")[0]
    assert causal_masked_flops_per_token(mistral, 4096) > 0
    assert causal_masked_flops_per_token(mistral, 32768) == 0  # every layer windowed well inside the sequence


def test_plan_of_a_hugging_face_config_shows_the_imports_notes():
    # Llama 3.1's config serves 131,072 tokens through llama3 rope scaling from 8,192: the plan says which sequence the
    # import chose (its note, from genconf models --from-hf), and drops that note where --seq-len chose it instead.
    config = str(REPO / "tests" / "data" / "hf" / "llama3.1-8b")
    out = run("--model", config, "--gpus", "8")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[2] == ("         config.json: llama3 rope scaling stretches the context to 131,072 tokens from 8,192; "
                        "seq_length is 8,192 (plan longer runs with --seq-len)")
    assert "seq 8192" in lines[1] and lines[3].startswith("cluster  ")
    d = json.loads(run("--model", config, "--gpus", "8", "--json").stdout)
    assert d["model"]["import_notes"] == [lines[2].removeprefix("         config.json: ")]
    longer = json.loads(run("--model", config, "--gpus", "8", "--seq-len", "16384", "--json").stdout)
    assert "import_notes" not in longer["model"] and longer["plan"]["seq_length"] == 16384
    catalog = json.loads(run("--model", "llama3.1-8b", "--gpus", "8", "--json").stdout)
    assert "import_notes" not in catalog["model"]  # a catalog model's plan is unchanged


def test_offload_plans_deepspeed_and_is_refused_for_other_frameworks():
    # --offload is ZeRO-Offload: an unpinned search planned megatron without it (the flag was dropped), and
    # --framework fsdp --offload planned FSDP without it.
    d = json.loads(run("--model", "llama2-7b", "--gpus", "8", "--cluster", "dgx-h100", "--offload", "--json").stdout)
    assert d["plan"]["framework"] == "deepspeed" and d["plan"]["offload_optimizer"] is True
    for framework in ("fsdp", "megatron"):
        out = run("--model", "llama2-7b", "--gpus", "8", "--cluster", "dgx-h100", "--offload", "--framework", framework)
        one_line_error(out, f"genconf plans no CPU offload for --framework {framework}")
        assert out.stderr.startswith("genconf: error: --offload is DeepSpeed's ZeRO-Offload")


def test_offload_on_a_model_only_megatron_builds_says_to_drop_it():
    # Mixtral under --offload (DeepSpeed only) ended "no valid layout ... Nothing tried makes it valid".
    out = run("--model", "mixtral-8x7b", "--gpus", "64", "--offload")
    one_line_error(out, "--offload is DeepSpeed's ZeRO-Offload: mixtral-8x7b has mixture-of-experts layers")
    assert out.stderr.strip().endswith("drop --offload")


def test_the_pipeline_bubble_reads_the_same_in_performance_and_why(capsys):
    # The 405B on 384 read 'pipeline bubble 1.1%' (the JSON's 0.0115) and 'bubble 1.2% ((p-1)/(v*m))' (31/2688).
    assert main(["--model", "llama3.1-405b", "--gpus", "384"]) == 0
    out = capsys.readouterr().out
    row = next(x for x in out.splitlines() if x.strip().startswith("pipeline bubble"))
    why = next(x for x in out.splitlines() if "((p-1)/(v*m))" in x)
    assert row.split()[-1] == "1.2%" and " bubble 1.2% " in why


def test_the_step_breakdown_names_expert_and_context_parallel_traffic(capsys):
    # tp_comm holds the EP all-to-all and CP ring traffic too: DeepSeek-V3 on 1,024 read 'tp_comm 13.599' at tp=4.
    assert main(["--model", "mixtral-8x7b", "--gpus", "64", "--cluster", "dgx-h100", "--ep", "8", "--tp", "1"]) == 0
    row = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("step breakdown"))
    assert "ep_comm " in row and "tp" not in row
    assert main(["--model", "70b", "--gpus", "384"]) == 0
    row = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("step breakdown"))
    assert " tp_comm " in row


def test_every_gib_figure_in_the_json_has_its_exact_bytes_beside_it():
    # memory.stages gave params_gib and activations_gib without their bytes (the busiest stage's had both).
    out = run("--model", "70b", "--gpus", "384", "--json")
    d = json.loads(out.stdout)
    missing = []

    def walk(x, where):
        if isinstance(x, dict):
            for k, v in x.items():
                if k.endswith("_gib") and k[:-4] + "_bytes" not in x and where not in ("cluster", "cluster.gpu_spec"):
                    missing.append(f"{where}.{k}")
                if k.endswith("_gib") and k[:-4] + "_bytes" in x and isinstance(v, float):
                    assert v == pytest.approx(x[k[:-4] + "_bytes"] / 2**30, abs=1e-3), f"{where}.{k}"
                walk(v, f"{where}.{k}" if where else k)
        elif isinstance(x, list):
            for item in x:
                walk(item, where)

    walk(d, "")
    assert missing == []


def test_a_moe_model_line_gives_its_active_parameters_not_the_dense_formula(capsys):
    # Mixtral 8x7B read '46,702,792,704 parameters (workshop formula: 6,840,163,584)': a dense GPT's count of its
    # shape, and nothing on the line said it has experts.
    assert main(["--model", "mixtral-8x7b", "--gpus", "64", "--cluster", "dgx-h100", "--json"]) == 0
    m = json.loads(capsys.readouterr().out)["model"]
    assert m["params_active"] == 12_879_925_248 < m["params"]
    assert main(["--model", "mixtral-8x7b", "--gpus", "64", "--cluster", "dgx-h100"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.endswith("46,702,792,704 parameters, 12,879,925,248 active per token (2 of 8 experts)")
    assert main(["--model", "1b", "--gpus", "8", "--json"]) == 0
    m = json.loads(capsys.readouterr().out)["model"]
    assert m["params_active"] == m["params"]


@pytest.mark.parametrize("argv,cluster", [(["--model", "70b", "--gpus", "384"], "kempner-h100"),
                                          (["--model", "llama3-8b", "--gpus", "144", "--gpu", "gb200"], "gb200-nvl72")])
def test_plan_json_gives_the_nvlink_domain_hardware_gives(tmp_path, capsys, argv, cluster):
    """plan.json wrote nvlink_domain_gpus null (the spec's 'the node') where `genconf hardware --json` said 4."""
    assert main(["hardware", "--json"]) == 0
    hardware = {c["name"]: c for c in json.loads(capsys.readouterr().out)["clusters"]}
    assert main([*argv, "--json", "-o", str(tmp_path / "out")]) == 0
    printed = json.loads(capsys.readouterr().out)["cluster"]
    written = json.loads((tmp_path / "out" / "plan.json").read_text())["cluster"]
    assert printed["name"] == cluster
    assert printed["nvlink_domain_gpus"] == written["nvlink_domain_gpus"] == hardware[cluster]["nvlink_domain_gpus"]
    # The plan.json reads back to the same plan (render + check), and one written with null still reads as the node.
    assert main(["check", str(tmp_path / "out")]) == 0
    old = dict(json.loads((tmp_path / "out" / "plan.json").read_text()))
    if old["cluster"]["nvlink_domain_gpus"] == old["cluster"]["gpus_per_node"]:
        old["cluster"]["nvlink_domain_gpus"] = None
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert main(["render", str(tmp_path / "old.json"), "-o", str(tmp_path / "again")]) == 0
    capsys.readouterr()
    again = json.loads((tmp_path / "again" / "plan.json").read_text())["cluster"]
    assert again["nvlink_domain_gpus"] == hardware[cluster]["nvlink_domain_gpus"]


def test_a_window_longer_than_the_sequence_is_priced_and_said_as_full_attention(tmp_path, capsys):
    """Mistral 7B's 4,096-key window at a 2,048-token sequence (legal in its config) was accepted without a word in
    the JSON: it is full causal attention, priced as the same model without a window and said in the why lines."""
    import yaml

    spec = yaml.safe_load((REPO / "models" / "mistral-7b-v0.1.yaml").read_text())
    full = {k: v for k, v in spec.items() if k not in ("sliding_window", "window_attn_skip_freq")}
    (tmp_path / "full.yaml").write_text(yaml.safe_dump({**full, "name": "mistral-full"}))
    pins = ["--gpus", "8", "--tp", "1", "--pp", "1", "--mbs", "1", "--global-batch", "64", "--framework", "megatron",
            "--json"]
    runs = {}
    for name, model, seq in (("window", "mistral-7b-v0.1", "2048"), ("full", str(tmp_path / "full.yaml"), "2048"),
                             ("binds", "mistral-7b-v0.1", "8192")):
        assert main(["--model", model, "--seq-len", seq, *pins]) == 0
        runs[name] = json.loads(capsys.readouterr().out)
    assert runs["window"]["perf"] == runs["full"]["perf"] and runs["window"]["memory"] == runs["full"]["memory"]
    said = "sliding window of 4,096 keys covers the 2,048-token sequence: its 32 windowed layers run full causal attention"
    assert any(line.startswith(said) for line in runs["window"]["why"]), runs["window"]["why"]
    assert not any("sliding window" in line for line in runs["full"]["why"] + runs["binds"]["why"])
    assert main(["--model", "mistral-7b-v0.1", "--seq-len", "2048", "--gpus", "8"]) == 0
    assert "window 4,096 (covers the sequence: full attention)" in capsys.readouterr().out
