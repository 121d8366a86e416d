"""benchmarks/compare_calculon.py: published run -> Calculon's inputs, without a Calculon checkout.

The known answers are Calculon's own inputs for the runs of Korthikanti et al. 2022, Table 5 (its
`llm-validation` command): models/{megatron-22B,gpt3-175B,turing-530B,megatron-1T}.json and
validation/seqsel/tab5/<model>_{full,seqsel}.json in github.com/calculon-ai/calculon at commit caa4b11f8fe1.
The same runs are rows of benchmarks/data/korthikanti2022.csv, so mapping those rows must give those files.
The last tests also run Calculon on both and compare: the verbatim copy of its package and those files kept in
benchmarks/data/calculon_sources/caa4b11 (Apache-2.0), or a clone named by CALCULON_DIR.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import reader_or_skip
from genconf.catalog.clusters import resolve_cluster

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import compare_calculon as cc  # noqa: E402
from published import load_runs  # noqa: E402

# Calculon's models/*.json for the four Table 5 models.
CALCULON_MODELS = {
    "megatron-22B": {"hidden": 6144, "feedforward": 24576, "seq_size": 2048, "attn_heads": 64, "attn_size": 96,
                     "num_blocks": 48},
    "gpt3-175B": {"hidden": 12288, "feedforward": 49152, "seq_size": 2048, "attn_heads": 96, "attn_size": 128,
                  "num_blocks": 96},
    "turing-530B": {"hidden": 20480, "feedforward": 81920, "seq_size": 2048, "attn_heads": 128, "attn_size": 160,
                    "num_blocks": 105},
    "megatron-1T": {"hidden": 25600, "feedforward": 102400, "seq_size": 2048, "attn_heads": 160, "attn_size": 160,
                    "num_blocks": 128},
}
# validation/seqsel/tab5/<model>_<mode>.json: the fields every file shares, then what differs per model and mode.
TAB5_COMMON = {
    "tensor_par": 8, "data_par": 1, "tensor_par_net": 0, "pipeline_par_net": 1, "data_par_net": 1,
    "datatype": "float16", "fused_activation": False, "attention_type": "multihead", "optimizer_sharding": False,
    "tensor_par_overlap": "none", "data_par_overlap": False, "weight_offload": False, "activations_offload": False,
    "optimizer_offload": False, "training": True}
TAB5_LAYOUT = {  # model: (num_procs, pipeline_par, batch_size, microbatch_size, pipeline_interleaving)
    "megatron-22B": (8, 1, 4, 4, 1), "gpt3-175B": (64, 8, 64, 1, 3), "turing-530B": (280, 35, 280, 1, 3),
    "megatron-1T": (512, 64, 512, 1, 1)}
TAB5_MODE = {
    "full": {"activation_recompute": "full", "tensor_par_comm_type": "ar", "seq_par_ag_redo": False},
    "seqsel": {"activation_recompute": "attn_only", "tensor_par_comm_type": "rs_ag", "seq_par_ag_redo": True}}
# korthikanti2022.csv row labels (published.load_runs) of the same runs.
ROWS = {("megatron-22B", "seqsel"): "GPT-22B #0", ("megatron-22B", "full"): "GPT-22B #1",
        ("gpt3-175B", "seqsel"): "GPT-175B #2", ("gpt3-175B", "full"): "GPT-175B #3",
        ("turing-530B", "seqsel"): "GPT-530B #4", ("turing-530B", "full"): "GPT-530B #5",
        ("megatron-1T", "seqsel"): "GPT-1T #6", ("megatron-1T", "full"): "GPT-1T #7"}


def tab5_execution(model: str, mode: str) -> dict:
    procs, pp, batch, mbs, vp = TAB5_LAYOUT[model]
    return {**TAB5_COMMON, **TAB5_MODE[mode], "num_procs": procs, "pipeline_par": pp, "batch_size": batch,
            "microbatch_size": mbs, "pipeline_interleaving": vp}


@pytest.fixture(scope="module")
def runs():
    loaded, _ = load_runs()
    return {(r.file, r.label): r for r in loaded}


@pytest.mark.parametrize("model,mode", sorted(ROWS))
def test_korthikanti_rows_map_to_calculons_own_validation_inputs(runs, model, mode):
    run = runs[("korthikanti2022.csv", ROWS[(model, mode)])]
    assert cc.unrepresentable_reasons(run) == []
    assert cc.application(run.model) == CALCULON_MODELS[model]
    assert cc.execution(run) == tab5_execution(model, mode)
    assert list(cc.variants(run)) == [(run.plan.mbs, run.plan.vp, run.plan.recompute)]  # nothing unknown


def test_network_tiers_follow_megatron_rank_order():
    # TP innermost, then DP, then PP; a dimension is on NVLink (0) when it and all inside it fit the domain.
    assert cc.network_tiers(tp=2, pp=1, dp=4, domain_gpus=8) == {"tp": 0, "dp": 0, "pp": 1}
    assert cc.network_tiers(tp=4, pp=12, dp=8, domain_gpus=8) == {"tp": 0, "dp": 1, "pp": 1}
    assert cc.network_tiers(tp=1, pp=2, dp=8, domain_gpus=8) == {"tp": 0, "dp": 0, "pp": 1}
    assert cc.network_tiers(tp=2, pp=2, dp=2, domain_gpus=8) == {"tp": 0, "dp": 0, "pp": 0}
    assert cc.network_tiers(tp=8, pp=1, dp=48, domain_gpus=8) == {"tp": 0, "dp": 1, "pp": 1}


def test_cluster_network_replaces_only_nvlink_size_and_internode_bandwidth():
    stock = {"networks": [{"size": 8, "bandwidth": 300, "efficiency": 0.65},
                          {"size": 65536, "bandwidth": 25, "efficiency": 0.9}], "mem1": {"GiB": 80}}
    jean_zay = cc.with_cluster_network(stock, resolve_cluster("jean-zay-a100"))
    # 4 x 100 Gb/s Omni-Path per 8-GPU node = 50 Gb/s = 6.25 GB/s per GPU
    assert jean_zay["networks"][1]["bandwidth"] == 6.25
    assert jean_zay["networks"][0] == stock["networks"][0]
    assert jean_zay["mem1"] == stock["mem1"]
    dgx = cc.with_cluster_network(stock, resolve_cluster("dgx-a100"))
    assert dgx == stock  # Calculon's A100 file is a DGX A100: 8 GPUs on NVLink, 200 Gb/s per GPU


def test_modern_stack_rows(runs):
    run = runs[("megatron_core_h100_2024.csv", "GPT-70B #4")]  # tp8 pp2 dp48, TE, mbs/vp/recompute unknown
    exe = cc.execution(run, mbs=1, vp=2, recompute="none")
    assert exe["activation_recompute"] == "attn_only"  # flash attention keeps no s^2 scores
    assert exe["fused_activation"] and exe["data_par_overlap"] and exe["optimizer_sharding"]
    assert exe["tensor_par_comm_type"] == "rs_ag" and exe["seq_par_ag_redo"]
    assert exe["tensor_par_overlap"] == "ring"
    assert (exe["tensor_par_net"], exe["data_par_net"], exe["pipeline_par_net"]) == (0, 1, 1)
    assert cc.execution(run, recompute="full")["seq_par_ag_redo"] is False
    # gbs 384 over dp 48 = 8 sequences per replica: mbs 1, 2, 4, 8; vp > 1 needs the micro-batch count % pp == 0
    tried = list(cc.variants(run))
    assert {m for m, _, _ in tried} == {1, 2, 4, 8}
    assert (8, 2, "none") not in tried and (4, 2, "none") in tried
    assert len(tried) == 4 * 3 * 4 - 3 * 3  # mbs 8 leaves one micro-batch: only vp 1


def test_unrepresentable_rows_say_why(runs):
    fsdp = runs[("torchtitan.csv", "Llama 3 8B #35")]  # A100, FSDP full shard, GQA 8 of 32
    why = cc.unrepresentable_reasons(fsdp)
    assert any("ZeRO-3" in w for w in why) and any("grouped-query" in w for w in why) and len(why) == 2
    assert len(cc.unrepresentable_reasons(fsdp, gqa_as_mha=True)) == 1
    zero3 = runs[("megatron_narayanan2021.csv", "GPT-174.6B (ZeRO-3 (no model parallelism)) #10")]
    assert cc.unrepresentable_reasons(zero3) == [
        "deepspeed ZeRO-3 parameter sharding (Calculon shards optimizer state and gradients only)"]
    lora = runs[("nemo_perf_summary_24.07_and_longseq.csv", "LLAMA2-7B (LoRA) #15")]  # tp1 pp1 dp8, MHA, BF16/FP8
    assert lora.plan.lora_rank and cc.unrepresentable_reasons(lora) == [
        "LoRA fine-tuning (Calculon trains every weight: no frozen base, no adapters)"]


def test_swiglu_mlp_keeps_weights_and_flops(runs):
    model = runs[("torchtitan.csv", "Llama 3 8B #35")].model  # h 4096, f 14336
    app = cc.application(model)
    assert app["feedforward"] == 21504
    assert 2 * app["hidden"] * app["feedforward"] == 3 * model.hidden_size * model.ffn_hidden_size


def _script(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "benchmarks" / "compare_calculon.py"), *args],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=120)


def test_no_checkout_exits_2_with_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "CALCULON_DIR"}
    out = _script("--no-write", env=env)
    assert out.returncode == 2 and out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1
    assert "git clone https://github.com/calculon-ai/calculon" in out.stderr
    out = _script("--calculon", str(tmp_path), "--no-write", env=env)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert "is not a Calculon checkout" in out.stderr


CALCULON_SOURCES = REPO / "benchmarks" / "data" / "calculon_sources"
CALCULON_DIR = os.environ.get("CALCULON_DIR") or str(CALCULON_SOURCES / "caa4b11")
"""A clone named by CALCULON_DIR, else the kept copy of calculon-ai/calculon at caa4b11."""


def _git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def test_kept_calculon_files_are_the_repositorys_at_caa4b11():
    """Every kept file has the git blob id `git ls-tree -r caa4b11` gives it in calculon-ai/calculon (and, where
    CALCULON_DIR names a clone, its bytes)."""
    listed = {}
    for line in (CALCULON_SOURCES / "caa4b11.ls-tree").read_text().splitlines():
        meta, path = line.split("\t")
        listed[path] = meta.split()[2]
    root = CALCULON_SOURCES / "caa4b11"
    kept = {str(p.relative_to(root)): p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert sorted(kept) == sorted(listed)
    for path, p in kept.items():
        assert _git_blob_id(p.read_bytes()) == listed[path], path
        if os.environ.get("CALCULON_DIR"):
            assert p.read_bytes() == (Path(os.environ["CALCULON_DIR"]) / path).read_bytes(), path


@pytest.fixture(scope="module")
def calculon():
    """Calculon's package and root; what it imports (numpy, pandas, psutil: the train and test extras) missing
    skips, or fails under CI=true."""
    for module in ("numpy", "pandas", "psutil"):
        reader_or_skip(module, "pip install -e '.[train,test]'")
    module, root, _ = cc.load_calculon(CALCULON_DIR)
    return module, root


@pytest.mark.parametrize("model,mode", sorted(ROWS))
def test_mapped_rows_give_calculons_own_step_time(runs, calculon, model, mode):
    calculon, root = calculon
    run = runs[("korthikanti2022.csv", ROWS[(model, mode)])]
    ours = cc.calculon_predict(calculon, root, run)
    # Calculon on its own files, as its llm-validation command runs them.
    Llm = calculon.Llm
    app = json.loads((root / "models" / f"{model}.json").read_text())
    exe = json.loads((root / "validation" / "seqsel" / "tab5" / f"{model}_{mode}.json").read_text())
    syst = calculon.System(json.loads((root / "systems" / "a100_80g.json").read_text()))
    ref = Llm(Llm.Application(app), logging.getLogger("calculon"))
    ref.compile(syst, Llm.Execution.from_json(exe))
    ref.run(syst)
    assert ours["execution"] == exe
    assert ours["step_time_s"] == ref.get_total_time()
    assert ours["mem_gib"] * 2**30 == ref.get_mem_tier1_cap_req()
    assert not ours["over_memory"]
