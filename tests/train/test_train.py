"""Launch and verify on CPU with gloo: real megatron-core, DeepSpeed and FSDP runs from generated artifacts.

Every run is planned with the CLI (pinned layout), written with -o, launched with `genconf launch` (torchrun
--standalone, one process per rank) and checked with `genconf verify`: the loss falls and the measured
parameter and optimizer bytes equal the planner's memory model.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, mcore_cpu_script, needs_deepspeed, needs_megatron, needs_torch

pytestmark = [needs_torch, pytest.mark.slow]

TINY_GPT = str(REPO / "tests" / "data" / "tiny-gpt.yaml")
TINY_LLAMA = str(REPO / "tests" / "data" / "tiny-llama.yaml")
TINY_MOE = str(REPO / "tests" / "data" / "tiny-moe.yaml")  # 4 experts, top-2: megatron-core's MoE layer on a CPU
TINY_MOE_DENSE_FIRST = str(REPO / "tests" / "data" / "tiny-moe-dense-first.yaml")  # tiny-moe, layer 0 of 3 dense
TINY_MOE_INTERLEAVED = str(REPO / "tests" / "data" / "tiny-moe-interleaved.yaml")  # tiny-moe, layers 0, 2 of 4 dense
TINY_ODD = str(REPO / "tests" / "data" / "tiny-odd.yaml")  # hidden 63: every framework pads its shards
TINY_WINDOW = str(REPO / "tests" / "data" / "tiny-window.yaml")  # sliding window 16 on every other layer
TINY_DEEPSEEK = str(REPO / "tests" / "data" / "tiny-deepseek.yaml")  # DeepSeek-V3's shape: MLA, dense first layer, MTP
SMOKE = ["--steps", "12", "--lr", "3e-3", "--vocab", "128"]
# Runs that verify must pass train 24 steps: verify's loss rule wants the loss below the labels' unigram entropy
# (4.70 nats at vocab 128), which a model that ignores its inputs cannot beat; from megatron's initial 5.36 a
# 12-step run only reaches it (genconf.run.loss_rule).
VERIFIED = ["--steps", "24", "--lr", "3e-3", "--vocab", "128"]


def genconf(*args: str, check: bool = True, timeout: int = 600) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "genconf", *args], capture_output=True, text=True, timeout=timeout,
                         cwd=REPO)
    if check and out.returncode != 0:
        raise AssertionError(f"genconf {' '.join(args)} failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return out


def plan_dir(root: Path, name: str, model: str, gpus: int, *pins: str) -> Path:
    out = root / name
    genconf("--model", model, "--gpus", str(gpus), "--gpus-per-node", "2", "--global-batch", "8", "--mbs", "1",
            "--recompute", "none", *pins, "-o", str(out))
    return out


def launch(artifacts: Path, *extra: str, name: str = "run", smoke: list[str] = SMOKE) -> Path:
    genconf("launch", str(artifacts), "--name", name, *smoke, *extra)
    return artifacts / "runs" / name


def losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def verified(run: Path) -> dict:
    out = genconf("verify", str(run), "--json", check=False)
    return json.loads(out.stdout)


LAYOUTS = {
    # name: (model, gpus, pins)
    "megatron-tp2": (TINY_LLAMA, 2, ["--framework", "megatron", "--tp", "2", "--pp", "1", "--zero", "0"]),
    "megatron-pp2-vp2": (TINY_GPT, 2, ["--framework", "megatron", "--tp", "1", "--pp", "2", "--vp", "2", "--zero", "0"]),
    "megatron-tp2-pp2": (TINY_LLAMA, 4, ["--framework", "megatron", "--tp", "2", "--pp", "2", "--zero", "0"]),
    # A pipeline layout (megatron-core builds each virtual stage from it): rank 1's last stage holds only the loss.
    "megatron-pp2-layout": (TINY_GPT, 2, ["--framework", "megatron", "--tp", "1", "--pp", "2", "--pp-layout",
                                          "Et|t*2|t|L", "--zero", "0"]),
    "megatron-dp2-distopt": (TINY_GPT, 2, ["--framework", "megatron", "--tp", "1", "--pp", "1", "--zero", "1"]),
    # Mixture of experts over EP 2: megatron-core's all-to-all dispatcher over gloo, expert weights and their
    # optimizer shards as the memory model plans them.
    "megatron-moe-ep2": (TINY_MOE, 2, ["--framework", "megatron", "--tp", "1", "--pp", "1", "--ep", "2", "--zero", "1"]),
    # A shared expert and DeepSeek-V3's router (sigmoid scores, expert bias, two groups, top-k scaling, a
    # sequence-wise loss): the runner builds what megatron_args.txt says, its tensors exactly the planned bytes.
    "megatron-moe-shared-sigmoid": ("tiny-moe-shared", 2, ["--framework", "megatron", "--tp", "1", "--pp", "1",
                                                           "--ep", "2", "--zero", "1"]),
    # Qwen2-MoE's shared expert scaled by a sigmoid gate (megatron-core moe_shared_expert_gate, a (1, h) gate_weight a
    # layer): the runner builds it from --moe-shared-expert-gate, its tensors exactly the planned bytes.
    "megatron-moe-shared-gate": ("tiny-moe-gate", 2, ["--framework", "megatron", "--tp", "1", "--pp", "1",
                                                      "--ep", "2", "--zero", "1"]),
    # DeepSeek-V3's shape less its multi-latent attention (which megatron-core 0.16.1 builds only with Transformer
    # Engine): a dense first layer (--moe-layer-freq), a shared expert, DeepSeek-V3's router and one
    # multi-token-prediction layer, over EP 2; its tensors are exactly the planned bytes.
    "megatron-deepseek-gqa": ("tiny-deepseek-gqa", 2, ["--framework", "megatron", "--tp", "1", "--pp", "1",
                                                       "--ep", "2", "--zero", "1"]),
    "deepspeed-zero1": (TINY_GPT, 2, ["--framework", "deepspeed", "--zero", "1"]),
    "deepspeed-zero2": (TINY_GPT, 2, ["--framework", "deepspeed", "--zero", "2"]),
    "deepspeed-zero3": (TINY_LLAMA, 2, ["--framework", "deepspeed", "--zero", "3"]),
    "fsdp-full-shard": (TINY_LLAMA, 2, ["--framework", "fsdp", "--zero", "3"]),
    # Sliding-window attention (64 tokens, a 16-key window on every other layer): megatron-core's local spec masks
    # the band (--window-size), genconf's own model attends in chunks (torch_model.windowed_attention).
    "megatron-window-tp2": (TINY_WINDOW, 2, ["--framework", "megatron", "--tp", "2", "--pp", "1", "--zero", "0"]),
    "fsdp-window": (TINY_WINDOW, 2, ["--framework", "fsdp", "--zero", "3"]),
    # The fused cross entropy (genconf's chunked version on a CPU): trains, verifies, holds the planned bytes.
    "fsdp-fused-loss": (TINY_GPT, 2, ["--framework", "fsdp", "--zero", "3", "--fused-loss"]),
    # Odd sizes: the exact byte counts include each framework's padding of its shards.
    "megatron-distopt-odd": (TINY_ODD, 2, ["--framework", "megatron", "--tp", "1", "--pp", "1", "--zero", "1"]),
    "deepspeed-zero1-odd": (TINY_ODD, 2, ["--framework", "deepspeed", "--zero", "1"]),
    "deepspeed-zero3-odd": (TINY_ODD, 2, ["--framework", "deepspeed", "--zero", "3"]),
    "fsdp-full-shard-odd": (TINY_ODD, 2, ["--framework", "fsdp", "--zero", "3"]),
    # SHARD_GRAD_OP keeps its fp32 parameters sharded at rest (only the compute copy stays gathered): planned as
    # unsharded fp32 before, which failed verify's model states by (1 - 1/dp) x 4 bytes a parameter.
    "fsdp-shard-grad-op-odd": (TINY_ODD, 2, ["--framework", "fsdp", "--zero", "2"]),
    # A layout with odd sizes and the distributed optimizer over dp 2: rank 0 holds two layers, rank 1 one layer and
    # the loss; the planned optimizer shard bytes stay exact.
    "megatron-pp2-layout-distopt-odd": ("tiny-odd3", 4, ["--framework", "megatron", "--tp", "1", "--pp", "2",
                                                         "--pp-layout", "Et|t|t|L", "--zero", "1"]),
    # Tied embeddings across pipeline stages: the shared word embedding gets its own distributed-optimizer bucket.
    "megatron-pp2-distopt-tied-odd": ("tiny-odd-tied", 4, ["--framework", "megatron", "--tp", "1", "--pp", "2",
                                                           "--zero", "1"]),
}


def tiny_odd_tied(root: Path) -> str:
    path = root / "tiny-odd-tied.yaml"
    text = Path(TINY_ODD).read_text().replace("name: tiny-odd", "name: tiny-odd-tied")
    path.write_text(text.replace("tie_embeddings: false", "tie_embeddings: true"))
    return str(path)


def tiny_moe_shared(root: Path) -> str:
    path = root / "tiny-moe-shared.yaml"
    text = Path(TINY_MOE).read_text().replace("name: tiny-moe", "name: tiny-moe-shared")
    path.write_text(text + "moe_shared_expert_intermediate_size: 96\nmoe_router_score_function: sigmoid\n"
                    "moe_router_expert_bias: true\nmoe_router_topk_scaling_factor: 2.5\nmoe_router_num_groups: 2\n"
                    "moe_router_group_topk: 1\nmoe_router_load_balancing: seq_aux_loss\nmoe_aux_loss_coeff: 1.0e-4\n")
    return str(path)


def tiny_moe_gate(root: Path) -> str:
    path = root / "tiny-moe-gate.yaml"
    text = Path(TINY_MOE).read_text().replace("name: tiny-moe", "name: tiny-moe-gate")
    path.write_text(text + "moe_shared_expert_intermediate_size: 96\nmoe_shared_expert_gate: true\n")
    return str(path)


def tiny_deepseek_gqa(root: Path) -> str:
    """tiny-deepseek with grouped-query attention in place of MLA (megatron-core 0.16.1 runs MLA only with TE)."""
    path = root / "tiny-deepseek-gqa.yaml"
    mla = ("kv_lora_rank:", "q_lora_rank:", "qk_head_dim:", "qk_pos_emb_head_dim:", "v_head_dim:")
    lines = [line for line in Path(TINY_DEEPSEEK).read_text().splitlines() if not line.startswith(mla)]
    text = "\n".join(lines).replace("name: tiny-deepseek", "name: tiny-deepseek-gqa")
    path.write_text(text + "\nnum_query_groups: 2\n")
    return str(path)


def tiny_odd3(root: Path) -> str:
    path = root / "tiny-odd3.yaml"
    text = Path(TINY_ODD).read_text().replace("name: tiny-odd", "name: tiny-odd3")
    path.write_text(text.replace("num_layers: 2", "num_layers: 3"))
    return str(path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("train")
    done = {}
    for name, (model, gpus, pins) in LAYOUTS.items():
        if name.startswith("megatron") and not _has("megatron.core"):
            continue
        if name.startswith("deepspeed") and not _has("deepspeed"):
            continue
        if model == "tiny-odd-tied":
            model = tiny_odd_tied(root)
        if model == "tiny-odd3":
            model = tiny_odd3(root)
        if model == "tiny-moe-shared":
            model = tiny_moe_shared(root)
        if model == "tiny-moe-gate":
            model = tiny_moe_gate(root)
        if model == "tiny-deepseek-gqa":
            model = tiny_deepseek_gqa(root)
        done[name] = launch(plan_dir(root, name, model, gpus, *pins), smoke=VERIFIED)
    return done


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_run_trains_and_verifies(runs, name):
    if name not in runs:
        pytest.skip(f"{name}: framework not installed")
    run = runs[name]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 24 and all("tokens_per_s" in r and "step_time_s" in r and "peak_mem_gib" in r for r in rows)
    report = verified(run)
    checks = {c["name"]: c for c in report["checks"]}
    assert report["ok"], report
    assert checks["loss"]["status"] == "pass"  # a significant falling trend, below the labels' unigram entropy
    # Measured parameter and optimizer-state bytes of the built model equal the planner's memory model exactly.
    assert checks["model states"]["status"] == "pass", checks["model states"]
    assert rows[0]["measured_param_bytes"] == rows[0]["planned_param_bytes"] > 0
    assert rows[0]["measured_optimizer_bytes"] == rows[0]["planned_optimizer_bytes"] > 0
    assert rows[0]["param_bytes_off_by"] == rows[0]["optimizer_bytes_off_by"] == 0  # every pipeline stage, its own plan
    assert checks["throughput"]["status"] == "n/a"  # CPU run: the prediction is for the plan's GPU
    for file in ("config.json", "versions.json", "seed"):
        assert (run / file).is_file()
    versions = json.loads((run / "versions.json").read_text())
    assert versions["torch"] and versions["genconf"]


@needs_megatron
def test_tp2_reproduces_tp1_loss(tmp_path):
    # fp32 and no dropout: megatron draws the full master weights on the CPU, then splits them over TP ranks.
    # The vocabulary (256) is a multiple of 128 x tp for both, so Megatron pads neither: the same model.
    smoke = ["--steps", "12", "--lr", "3e-3"]
    tp1 = launch(plan_dir(tmp_path, "tp1", TINY_LLAMA, 1, "--framework", "megatron", "--tp", "1", "--pp", "1",
                          "--zero", "0", "--precision", "fp32"), smoke=smoke)
    tp2 = launch(plan_dir(tmp_path, "tp2", TINY_LLAMA, 2, "--framework", "megatron", "--tp", "2", "--pp", "1",
                          "--zero", "0", "--precision", "fp32"), smoke=smoke)
    a, b = losses(tp1), losses(tp2)
    assert len(a) == len(b) == 12
    assert [round(x, 4) for x in a] == [round(x, 4) for x in b]
    assert a[-1] < a[0]


@pytest.mark.parametrize("framework,gpus,pins", [
    pytest.param("megatron", 1, ["--tp", "1", "--pp", "1", "--zero", "0"], marks=needs_megatron),
    pytest.param("deepspeed", 2, ["--zero", "2"], marks=needs_deepspeed),
    ("fsdp", 2, ["--zero", "3"]),
])
def test_resume_continues_the_same_loss_curve(tmp_path, framework, gpus, pins):
    # tiny-gpt has dropout: the RNG state is checkpointed too.
    artifacts = plan_dir(tmp_path, "resume", TINY_GPT, gpus, "--framework", framework, *pins)
    reference = launch(artifacts, "--checkpoint-every", "6", name="full")
    ckpts = sorted(p.name for p in (reference / "checkpoints").glob("step_*"))
    assert ckpts == ["step_0000006", "step_0000012"]
    # Drop the last checkpoint and the steps after the first one, then resume: steps 6..11 must match.
    shutil.rmtree(reference / "checkpoints" / "step_0000012")
    expected = losses(reference)
    genconf("launch", str(artifacts), "--run-dir", str(reference), "--resume")
    resumed = losses(reference)
    assert resumed == expected  # CPU runs are bit-identical


def test_verify_fails_with_the_reason_on_an_altered_golden(runs, tmp_path):
    run = next(iter(runs.values()))
    rows = losses(run)
    golden = tmp_path / "golden.txt"
    golden.write_text("".join(f"{step} {loss:.6f}\n" for step, loss in enumerate(rows)))
    ok = genconf("verify", str(run), "--golden", str(golden), "--tolerance", "1e-5", check=False)
    assert ok.returncode == 0, ok.stdout
    altered = rows[:]
    altered[7] += 0.25
    golden.write_text("".join(f"{step} {loss:.6f}\n" for step, loss in enumerate(altered)))
    bad = genconf("verify", str(run), "--golden", str(golden), "--tolerance", "1e-5", check=False)
    assert bad.returncode == 1
    assert f"step 7: loss {rows[7]:.6f} vs golden {altered[7]:.6f}" in bad.stdout
    assert "FAIL" in bad.stdout


def test_unrunnable_precision_is_refused_before_launch(runs):
    run = next(iter(runs.values()))
    artifacts = run.parent.parent
    out = genconf("launch", str(artifacts), "--name", "fp8", "--precision", "fp8", "--steps", "1", check=False)
    assert out.returncode == 2 and "needs a Hopper or Blackwell GPU" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and not (artifacts / "runs" / "fp8").exists()


@needs_megatron
@needs_megatron
def test_a_multi_token_prediction_run_logs_its_mtp_loss(runs):
    # Megatron-LM logs "mtp_1 loss" beside the LM loss; the runner's MTP loss reached the gradients unlogged.
    rows = [json.loads(line) for line in (runs["megatron-deepseek-gqa"] / "metrics.jsonl").read_text().splitlines()]
    mtp = [r["mtp_loss"] for r in rows]
    assert len(mtp) == 24 and all(3.0 < x < 6.0 for x in mtp)  # a next-next-token cross entropy, vocab 128
    assert sum(mtp[-4:]) / 4 < sum(mtp[:4]) / 4 - 0.3  # it trains
    assert "mtp_loss" not in json.loads((runs["megatron-moe-ep2"] / "metrics.jsonl").read_text().splitlines()[0])


def test_deepseek_shape_built_by_megatron_core_has_genconf_s_count(tmp_path):
    """megatron-core builds the DeepSeek-V3 shape (dense first layer, shared expert, MTP block) with exactly the
    parameters genconf counts, as the runner builds it (meta device, TP 1, local spec)."""
    from genconf.catalog.models import resolve_model
    from genconf.plan.counting import exact_param_count

    path = tiny_deepseek_gqa(tmp_path)
    out = subprocess.run([sys.executable, "-m", "genconf.train.meta_count", path, "--json"], capture_output=True,
                         text=True, cwd=REPO, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    built = json.loads(out.stdout.strip().splitlines()[-1])["tiny-deepseek-gqa"]
    # h 64, 4 heads in 2 groups of 16: attention 64 x (64 + 2 x 32) + 64 x 64 = 12,288 and a 64 norm; the dense
    # layer's MLP 3 x 64 x 128 = 24,576, an MoE layer's router 4 x 64, experts 4 x 3 x 64 x 32 and shared expert
    # 3 x 64 x 32 = 30,976, each with a 64 norm: layers 36,992 + 2 x 43,392; the MTP layer 2 x 64 norms, eh_proj
    # 64 x 128, one MoE layer, a final norm = 51,776; embedding and output 2 x 256 x 64, the final norm 64.
    assert built["built"] == built["planned"] == built["checkpoint"] == 208_384
    assert exact_param_count(resolve_model(path)[0]) == 208_384


MLA_COUNT_SCRIPT = mcore_cpu_script("29800 + os.getpid() % 1000", """
from genconf.plan.counting import layer_tensors
from genconf.train.runners.megatron import model_specs, transformer_config, transformer_config_kwargs
from megatron.core.transformer.spec_utils import build_module

model, _ = resolve_model(sys.argv[1])
plan = ParallelPlan(framework="megatron", dp=1, mbs=1, gbs=1, seq_length=64, layer_spec="local")
cfg = RunConfig(model=model, plan=plan, train=TrainSpec(train_steps=1), num_gpus=1, data={}, precision_recipe="bf16",
                prediction={}, shrink={}, artifacts="")
config = transformer_config(dict(transformer_config_kwargs(cfg, cpu=True), perform_initialization=False))
decoder, _, _ = model_specs(cfg, config, use_te=False)
attention = decoder.layer_specs[0].submodules.self_attention
try:
    build_module(attention, config=config, layer_number=1)
    refused = ""
except TypeError as exc:
    refused = str(exc)
# The same module with a parameter-free core attention (megatron-core's IdentityOp) in place of DotProductAttention.
# Without Transformer Engine, megatron-core's extensions module puts a MagicMock where TE would be, so
# multi_latent_attention.py imports "TELinear" (HAVE_TE True) and its isinstance(self.linear_proj, TELinear) raises
# TypeError: HAVE_TE set to the host's truth, False, for this count.
import megatron.core.transformer.multi_latent_attention as mla_module

mla_module.HAVE_TE = False
submodules = dataclasses.replace(attention.submodules, core_attention=IdentityOp)
with torch.device("meta"):
    built = build_module(dataclasses.replace(attention, submodules=submodules), config=config, layer_number=1)
planned = sum(t.numel for t in layer_tensors(model, True) if t.name.startswith("self_attention."))
print(json.dumps({"refused": refused, "built": sum(p.numel() for p in built.parameters()), "planned": planned}))
ps.destroy_model_parallel()
torch.distributed.destroy_process_group()
compat.uninstall()
""")


@needs_megatron
def test_megatron_core_s_mla_has_genconf_s_count_and_needs_te_attention():
    """megatron-core's MLASelfAttention (query and key-value latents, their RMS norms, the up projections, the shared
    RoPE key) holds exactly the parameters genconf counts for MLA; with the local spec its DotProductAttention refuses
    the k_channels/v_channels MLA passes it (TypeError), the refusal genconf states (runconfig.needs_te_attention)."""
    out = subprocess.run([sys.executable, "-c", MLA_COUNT_SCRIPT, TINY_DEEPSEEK], capture_output=True, text=True,
                         cwd=REPO, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert "unexpected keyword argument 'k_channels'" in result["refused"], result
    # h 64, 4 heads of q/k 16 + 8 (RoPE), v 16, latents q 48 and kv 32: q down 48 x 64, its norm 48, q up 48 x 4 x 24,
    # kv down (32 + 8) x 64, its norm 32, kv up 32 x 4 x (16 + 16), output 64 x 4 x 16.
    assert result["built"] == result["planned"] == 3072 + 48 + 4608 + 2560 + 32 + 4096 + 4096 == 18_512


@pytest.mark.skipif(_has("transformer_engine"), reason="Transformer Engine is installed: MLA may run here")
def test_mla_on_a_cpu_is_refused_before_launch(tmp_path):
    """megatron-core 0.16.1's local DotProductAttention takes no k_channels/v_channels, which MLASelfAttention passes
    it: a CPU run of an MLA model is refused in one line before any rank starts."""
    artifacts = plan_dir(tmp_path, "mla", TINY_DEEPSEEK, 2, "--framework", "megatron", "--tp", "1", "--pp", "1",
                         "--ep", "2", "--zero", "1")
    out = genconf("launch", str(artifacts), "--name", "mla", *SMOKE, check=False)
    assert out.returncode == 2 and "tiny-deepseek has multi-latent attention" in out.stderr
    assert "k_channels/v_channels" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert not (artifacts / "runs" / "mla").exists()


@needs_deepspeed
def test_fp16_deepspeed_on_cpu_is_refused(runs):
    artifacts = runs["deepspeed-zero2"].parent.parent
    out = genconf("launch", str(artifacts), "--name", "fp16", "--precision", "fp16", "--steps", "1", check=False)
    assert out.returncode == 2 and "fp16 under DeepSpeed needs a GPU" in out.stderr


def test_memmap_token_file(runs, tmp_path):
    import numpy as np

    tokens = tmp_path / "tokens.bin"
    rng = np.random.default_rng(0)
    np.asarray(np.tile(rng.integers(0, 128, 97), 200), dtype=np.uint16).tofile(tokens)  # a repeating pattern
    artifacts = runs["deepspeed-zero1"].parent.parent if "deepspeed-zero1" in runs else next(iter(runs.values())).parent.parent
    run = launch(artifacts, "--data", str(tokens), name="memmap")
    config = json.loads((run / "config.json").read_text())
    assert config["data"] == {"kind": "memmap", "path": str(tokens), "dtype": "uint16"}
    assert losses(run)[-1] < losses(run)[0]


@needs_megatron
def test_pp2_with_virtual_stages_never_batches_p2p():
    # Megatron-LM issues 750/1450: PP=2 + virtual stages + batch_p2p_comm trains silently wrong.
    from genconf.catalog.models import resolve_model
    from genconf.plan.runconfig import RunConfig
    from genconf.plan.specs import ParallelPlan, TrainSpec
    from genconf.train.runners.megatron import transformer_config_kwargs

    model, _ = resolve_model(TINY_GPT)
    plan = ParallelPlan(framework="megatron", pp=2, vp=2, dp=1, mbs=1, gbs=4, seq_length=64)
    cfg = RunConfig(model=model, plan=plan, train=TrainSpec(train_steps=1), num_gpus=2, data={},
                    precision_recipe="bf16", prediction={}, shrink={}, artifacts="")
    for cpu in (False, True):
        assert transformer_config_kwargs(cfg, cpu=cpu)["batch_p2p_comm"] is False


@pytest.fixture(scope="module")
def activation_measurements() -> dict[tuple[str, str], dict]:
    """Every (model, recompute) pair measured in one process (the imports are most of a measurement's time)."""
    # block: full recompute of each chunk's first layer only (a dense layer of tiny-moe-dense-first and of
    # tiny-moe-interleaved, whose other layers keep everything): where the dense layers sit is priced exactly.
    out = subprocess.run([sys.executable, "-m", "genconf.train.activations", "--model", TINY_GPT, TINY_LLAMA, TINY_MOE,
                          TINY_MOE_DENSE_FIRST, TINY_MOE_INTERLEAVED, "--recompute", "none", "selective", "full",
                          "block", "--recompute-layers", "1", "--mbs", "2", "--seq", "64", "--json"],
                         capture_output=True, text=True, cwd=REPO, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    results = [json.loads(line) for line in out.stdout.strip().splitlines() if line.startswith("{")]
    return {(r["model"], r["recompute"]): r for r in results}


@needs_megatron
@pytest.mark.parametrize("model", ["tiny-gpt", "tiny-llama", "tiny-moe", "tiny-moe-dense-first",
                                   "tiny-moe-interleaved"])
@pytest.mark.parametrize("recompute", ["none", "selective", "full", "block"])
def test_activation_bytes_match_the_local_spec_estimate(activation_measurements, model, recompute):
    # The MoE models with dense layers (first_k_dense_replace 1, moe_layer_interval 2) hold each dense layer at a
    # dense layer's bytes: priced as MoE layers they were 8.5% / 13.7% over the measurement without recompute.
    result = activation_measurements[(model, recompute)]
    # The bar is 10%; the term-by-term model lands within bytes of the measurement.
    assert abs(result["ratio"] - 1) < 0.10, result
    assert abs(result["ratio"] - 1) < 0.001, result


@needs_megatron
def test_parameter_counts_equal_megatron_core_models_built_on_meta():
    """The planner's per-rank count equals sum(p.numel()) of megatron-core's GPTModel built from the same spec
    (meta device, so 405B costs nothing); the checkpoint count differs only by Megatron's vocabulary padding
    and its LayerNorm/q-k-norm conventions."""
    names = ["gpt3-175b", "llama2-7b", "llama3-8b", "llama3.1-405b", "olmo-1b", "olmo2-7b", "mixtral-8x7b", "70b",
             "llama3.2-1b", "qwen2.5-72b", "qwen3-32b", "qwen3-235b-a22b", "grok1-314b", "gpt3-5b", "gpt3-20b",
             "gpt3-40b", "nemotron3-8b", "nemotron3-22b", "llama4-maverick", "llama4-scout"]
    out = subprocess.run([sys.executable, "-m", "genconf.train.meta_count", *names, "--json"], capture_output=True,
                         text=True, cwd=REPO, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(result) == len(names)
    for name, r in result.items():
        assert r["built"] == r["planned"], (name, r)
    assert result["llama3-8b"]["built"] == result["llama3-8b"]["checkpoint"] == 8_030_261_248
    assert result["mixtral-8x7b"]["built"] == 46_702_792_704
    # Grok-1 as NeMo's benchmark builds it: 64 x (attention 6144 x 14336 + 8 SwiGLU experts of 3 x 6144 x 32768 +
    # router 8 x 6144 + 2 RMSNorms) + untied 128,256-row embeddings + the final norm.
    grok = 64 * (6144 * 14336 + 8 * 3 * 6144 * 32768 + 8 * 6144 + 2 * 6144) + 2 * 128256 * 6144 + 6144
    assert result["grok1-314b"]["built"] == grok == 316_454_737_920
    # Llama 4 as NeMo builds it (Llama4Experts128Config / Llama4Experts16Config): attention 5120 x 7168 + 5120^2 and two
    # RMSNorms per layer; Maverick's 24 dense layers (moe_layer_freq [0, 1] * 24: 0, 2, ...) a 3 x 5120 x 16384 SwiGLU,
    # its 24 MoE layers 128 routed experts and one shared of 3 x 5120 x 8192 and a 128 x 5120 router; Scout 48 MoE
    # layers of 16 experts; untied embeddings of 202,048 rows padded to 202,112 (128 x TP 1) and a final norm.
    attention, expert, ends = 5120 * 7168 + 5120 * 5120 + 2 * 5120, 3 * 5120 * 8192, 2 * 202112 * 5120 + 5120
    maverick = 24 * (attention + 3 * 5120 * 16384) + 24 * (attention + 129 * expert + 128 * 5120) + ends
    assert result["llama4-maverick"]["built"] == maverick == 400_712_504_320
    assert result["llama4-scout"]["built"] == 48 * (attention + 17 * expert + 16 * 5120) + ends == 107_770_516_480
    for name in ("llama4-maverick", "llama4-scout"):  # the checkpoint's count: the vocabulary unpadded
        assert result[name]["built"] - result[name]["checkpoint"] == (202112 - 202048) * 5120 * 2
    # Tied embeddings, the QKV-only bias and per-head q/k norms, built by megatron-core as the checkpoints hold them.
    for name, published in (("llama3.2-1b", 1_235_814_400), ("qwen2.5-72b", 72_706_203_648),
                            ("qwen3-32b", 32_762_123_264), ("qwen3-235b-a22b", 235_093_634_560)):
        assert result[name]["built"] == result[name]["checkpoint"] == published, (name, result[name])
    assert result["gpt3-175b"]["built"] - result["gpt3-175b"]["checkpoint"] == (50304 - 50257) * 12288


def test_a_full_size_plan_on_a_cpu_is_refused_before_it_starts(tmp_path):
    artifacts = tmp_path / "big"
    genconf("--model", "1b", "--gpus", "8", "-o", str(artifacts))
    out = genconf("launch", str(artifacts), "--name", "big", "--steps", "1", check=False)
    assert out.returncode == 2 and "shrink it for a smoke test" in out.stderr and "GiB" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and not (artifacts / "runs" / "big").exists()


@pytest.mark.skipif(not _has("torchao"), reason="torchao not installed (pip install -e '.[fp8]')")
def test_fsdp_fp8_through_torchao(runs):
    """FP8 without Transformer Engine: the FSDP plan at --precision fp8 trains through torchao's Float8Linear
    (GEMMs emulated on a CPU, the casts real), verifies, and holds exactly the planned bytes."""
    artifacts = runs["fsdp-full-shard"].parent.parent
    run = launch(artifacts, "--precision", "fp8", name="fp8", smoke=VERIFIED)
    config = json.loads((run / "config.json").read_text())
    assert config["precision_recipe"] == "fp8-current" and config["plan"]["precision"] == "fp8"
    report = verified(run)
    assert report["ok"], report
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["measured_param_bytes"] == rows[0]["planned_param_bytes"]


def test_speed_switches_reach_the_runner(tmp_path):
    """`--compile --attention math` reach the FSDP runner (DDP plan: it compiles each block with inductor, here
    on the CPU) and are recorded in config.json; the run still trains. Their speed is a GPU measurement."""
    artifacts = plan_dir(tmp_path, "ddp", TINY_LLAMA, 1, "--framework", "fsdp", "--zero", "0")
    out = genconf("launch", str(artifacts), "--name", "fast", "--steps", "3", "--lr", "3e-3", "--compile",
                  "--attention", "math")
    run = artifacts / "runs" / "fast"
    assert json.loads((run / "config.json").read_text())["speed"] == {"attention": "math", "compile": True}
    assert "torch.compile (inductor) on each of the 4 decoder blocks" in out.stdout + out.stderr
    assert len(losses(run)) == 3 and losses(run)[-1] < losses(run)[0]
