"""LoRA fine-tuning plans (ParallelPlan.lora_rank) against known answers: the adapters' parameter count from the
canonical LoRA count Hugging Face peft prints, the frozen base's model states, the weight-gradient GEMMs a frozen
layer skips, the FLOP count, and the rules and command line that keep LoRA to what genconf prices."""

import dataclasses
import json

import pytest

from genconf.catalog.clusters import resolve_cluster
from genconf.catalog.hardware import calibration_for
from genconf.catalog.models import resolve_model
from genconf.cli.main import main
from genconf.plan import cost, rules
from genconf.plan.counting import (
    _layer_matmul_macs_per_token,
    lora_flops_per_token,
    lora_layer_tensors,
    lora_param_count,
    model_flops_per_token,
)
from genconf.plan.memory import estimate
from genconf.plan.search import Pins, search
from genconf.plan.specs import ParallelPlan

GIB = 2**30


def test_adapter_count_is_peft_canonical_count_less_the_tied_a_matrices():
    # Hugging Face peft, LoRA r=8 on q/k/v/o/gate/up/down of Llama-2-7B: "trainable params: 19,988,480"; r=32 is 4x.
    # Megatron-Bridge's performant LoRA adapts the fused linear_qkv and linear_fc1 with one A each (peft.md: equal
    # to canonical LoRA with A_q = A_k = A_v and A_gate = A_up tied): 2 fewer 32 x 4096 A matrices per layer in
    # qkv, 1 fewer in fc1.
    model, _ = resolve_model("llama2-7b")
    canonical = 4 * 19_988_480
    tied = model.num_layers * 32 * 4096 * (2 + 1)
    assert lora_param_count(model, 32) == canonical - tied == 67_371_008
    assert lora_layer_tensors(model, 0) == () and lora_param_count(model, 0) == 0


def test_frozen_linear_skips_the_weight_gradient_gemm():
    cluster = resolve_cluster("dgx-h100")
    cal = calibration_for(cluster.gpu.name)
    fwd, bwd = cost.linear_s(cluster.gpu, cal, 4096, 8192, 8192, "bf16")
    f_fwd, f_bwd = cost.linear_s(cluster.gpu, cal, 4096, 8192, 8192, "bf16", frozen=True)
    dgrad = cost.gemm_s(cluster.gpu, cal, 4096, 8192, 8192, "bf16")  # (m x n) @ (n x k): the forward's shape here
    wgrad = cost.gemm_s(cluster.gpu, cal, 8192, 8192, 4096, "bf16")  # (k x m) @ (m x n)
    assert f_fwd == fwd and f_bwd == pytest.approx(dgrad) and bwd == pytest.approx(dgrad + wgrad)


def test_lora_flops_are_forward_and_data_gradient_plus_the_adapters():
    model, _ = resolve_model("llama3-8b")
    s, r = 8192, 32
    adapters = sum(t.numel for t in lora_layer_tensors(model, r))
    expected = (model_flops_per_token(model, s) - model.num_layers * 2 * _layer_matmul_macs_per_token(model)
                - 2 * model.vocab_size * model.hidden_size + model.num_layers * 6 * adapters)
    assert lora_flops_per_token(model, s, r) == pytest.approx(expected)


def _plans(name: str, gpus: int, **pinned):
    model, _ = resolve_model(name)
    cluster = resolve_cluster("dgx-h100")
    full = ParallelPlan(framework="megatron", seq_length=4096, zero_stage=1, gbs=32, **pinned)
    return model, cluster, full, dataclasses.replace(full, lora_rank=32)


def test_frozen_base_has_no_gradients_or_optimizer_states():
    model, cluster, full, lora = _plans("llama3-8b", 8, tp=1, dp=8, mbs=1)
    f, l_ = estimate(model, full, cluster).peak, estimate(model, lora, cluster).peak
    adapters = lora_param_count(model, 32)  # tp 1, pp 1: every adapter on each rank
    assert l_.params_bytes == f.params_bytes + 2 * adapters
    assert l_.grads_bytes == full.grad_bytes * adapters
    assert l_.optimizer_bytes == -(-12 * adapters // 8)  # fp32 master + Adam, sharded over dp by the dist. optimizer
    assert f.grads_bytes + f.optimizer_bytes > 100 * (l_.grads_bytes + l_.optimizer_bytes)


def test_lora_step_is_faster_and_moves_only_adapter_gradients():
    model, cluster, full, lora = _plans("llama3-8b", 8, tp=1, dp=8, mbs=1)
    cal = calibration_for(cluster.gpu.name)
    f, l_ = cost.step_cost(model, full, cluster, cal), cost.step_cost(model, lora, cluster, cal)
    f_layer, l_layer = cost.layer_time(model, full, cluster, cal), cost.layer_time(model, lora, cluster, cal)
    assert l_layer.bwd_s < f_layer.bwd_s and l_layer.fwd_s > f_layer.fwd_s  # adapters' forward; no weight gradients
    assert l_.step_time_s < f.step_time_s
    assert l_.dp_comm_s < f.dp_comm_s and l_.optimizer_s < f.optimizer_s / 100  # full: reduce mostly hidden
    assert l_.model_flops_per_step < f.model_flops_per_step


def test_seventy_b_lora_fits_where_full_training_does_not():
    # NeMo's recommended LoRA layout for Llama 3 70B on 8 H100s (tp2 pp4, nemo_recommended_configs_configonly.csv):
    # full training of 70B needs ~16 bytes per parameter, 140 GiB per GPU on 8 GPUs; LoRA keeps the bf16 weights.
    model, _ = resolve_model("llama3-70b")
    cluster = resolve_cluster("dgx-h100")
    cal = calibration_for(cluster.gpu.name)
    pins = dict(framework="megatron", tp=2, pp=4, gbs=32, seq_length=4096, precision="fp8", zero_stage=1)
    assert not search(model, cluster, 8, cal, Pins(**pins), keep=1).ranked
    got = search(model, cluster, 8, cal, Pins(lora_rank=32, **pins), keep=1)
    assert got.ranked and got.best.plan.lora_rank == 32


@pytest.mark.parametrize("args, framework, moe, zero", [
    ((32, "fsdp", False, None), "fsdp", None, None),
    ((32, "megatron", True, None), None, "mixture-of-experts", None),
    ((32, "megatron", False, 3), None, None, "Megatron-FSDP"),
])
def test_rules_keep_lora_to_what_is_priced(args, framework, moe, zero):
    why = rules.lora_conflict(*args)
    assert why and (framework or moe or zero) in why
    assert rules.lora_conflict(0, "fsdp", True, 3) is None and rules.lora_conflict(32, "megatron", False, 1) is None


def test_cli_plans_lora_and_refuses_artifacts_before_writing(capsys, tmp_path):
    assert main(["--model", "llama3-8b", "--gpus", "8", "--cluster", "dgx-h100", "--lora-rank", "32", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["plan"]["lora_rank"] == 32 and d["plan"]["framework"] == "megatron"
    assert any("LoRA rank 32" in w for w in d["why"])
    out = tmp_path / "art"
    assert main(["--model", "llama3-8b", "--gpus", "8", "--lora-rank", "32", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sizing only" in err[0] and not out.exists()
    assert main(["--model", "llama3-8b", "--gpus", "8", "--lora-rank", "32", "--framework", "deepspeed"]) == 2
    assert "trains every weight" in capsys.readouterr().err


def test_lora_targets_choose_which_linears_carry_adapters():
    # NeMo 1.x adapted linear_qkv only (megatron_gpt_finetuning_config.yaml lora_tuning.target_modules
    # ['attention_qkv']): r x (h + q + 2 kv) per layer, one A (32 x 4096) and one B (12288 x 32) on Llama-2-7B.
    model, cluster, _, lora = _plans("llama2-7b", 8, tp=1, dp=8, mbs=1)
    assert lora_param_count(model, 32, ("linear_qkv",)) == model.num_layers * 32 * (4096 + 3 * 4096)
    qkv = dataclasses.replace(lora, lora_targets=("linear_qkv",))
    cal = calibration_for(cluster.gpu.name)
    one, four = cost.layer_time(model, qkv, cluster, cal), cost.layer_time(model, lora, cluster, cal)
    assert one.fwd_s < four.fwd_s and one.bwd_s < four.bwd_s  # three adapters fewer, each an add over its output
    assert (estimate(model, qkv, cluster).peak.optimizer_bytes
            == -(-12 * lora_param_count(model, 32, ("linear_qkv",)) // 8))
    with pytest.raises(ValueError, match="lora_targets"):
        dataclasses.replace(lora, lora_targets=("q_proj",))


def test_cli_lora_targets(capsys):
    args = ["--model", "llama2-7b", "--gpus", "8", "--cluster", "dgx-h100", "--lora-rank", "32", "--json"]
    assert main(args + ["--lora-targets", "linear_qkv"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["plan"]["lora_targets"] == ["linear_qkv"] and any("linear_qkv train" in w for w in d["why"])
    assert main(args + ["--lora-targets", "linear_qkv,q_proj"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--lora-targets takes distinct names" in err[0]
    assert main(["--model", "llama2-7b", "--gpus", "8", "--lora-targets", "linear_qkv"]) == 2
    assert "needs --lora-rank" in capsys.readouterr().err
