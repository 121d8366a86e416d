"""Sequences packed from shorter documents (ParallelPlan.packed_doc_tokens, --packed-doc-len): each document attends
only within itself, so flash attention does documents x doc^2 of work instead of seq^2; nothing else changes."""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest

from conftest import REPO, one_line_error, run_genconf
from genconf.catalog.clusters import resolve_cluster
from genconf.catalog.hardware import calibration_for
from genconf.catalog.models import resolve_model
from genconf.cli.main import main
from genconf.plan import cost, memory, planfile, runconfig
from genconf.plan.specs import ParallelPlan, TrainSpec
from genconf.render.fidelity import layout_differences

sys.path.insert(0, str(REPO / "benchmarks"))
import published  # noqa: E402

MODEL = resolve_model("llama3-8b")[0]
CLUSTER = resolve_cluster("dgx-h100")
CAL = calibration_for(CLUSTER.gpu.name)


def plan(**kw) -> ParallelPlan:
    values = dict(framework="megatron", tp=1, pp=1, dp=8, mbs=8, gbs=64, seq_length=4096, zero_stage=1,
                  recompute="none", precision="bf16")
    values.update(kw)
    return ParallelPlan(**values)


def test_a_packed_sequence_attends_as_its_documents_would_alone():
    # 8 sequences of 4,096 tokens, each packed from 16 documents of 256: the attention of 128 sequences of 256 tokens
    # (the same flash kernel problems, cu_seqlens marking where each starts).
    packed = cost.layer_time(MODEL, plan(packed_doc_tokens=256), CLUSTER, CAL)
    alone = cost.layer_time(MODEL, plan(mbs=128, gbs=1024, seq_length=256), CLUSTER, CAL)
    assert packed.attn_fwd_s == pytest.approx(alone.attn_fwd_s, rel=1e-12)
    # Against the whole sequence: FlashAttention-2's causal tiling (Dao 2023) visits T(T+1)/2 key blocks for T query
    # tiles of 128, 528 for 4,096 tokens and 16 x 3 = 48 packed: the work falls to 48 / 528, and the per-wave cost of
    # the same 32 query tiles per sequence stays, so the time falls to between 9.1% and a fifth.
    whole = cost.layer_time(MODEL, plan(), CLUSTER, CAL)
    assert 48 / 528 < packed.attn_fwd_s / whole.attn_fwd_s < 0.2
    # Everything but the attention is the same: the GEMMs, element-wise passes, communication and host time.
    assert packed.fwd_s - packed.attn_fwd_s == pytest.approx(whole.fwd_s - whole.attn_fwd_s, rel=1e-12)
    assert (packed.tp_comm_s, packed.host_s) == (whole.tp_comm_s, whole.host_s)
    assert packed.bwd_s < whole.bwd_s


def test_a_document_as_long_as_the_sequence_is_no_packing():
    assert cost.layer_time(MODEL, plan(packed_doc_tokens=4096), CLUSTER, CAL) == cost.layer_time(MODEL, plan(),
                                                                                                CLUSTER, CAL)


def test_memory_is_unchanged_and_the_local_spec_still_computes_every_score():
    # Flash attention keeps no scores whether documents are packed or not; megatron's unfused local attention
    # masks the packed documents but still writes the whole seq x seq score matrix.
    for p in (plan(), plan(layer_spec="local")):
        whole = memory.estimate(MODEL, p, CLUSTER).peak.total_bytes
        assert memory.estimate(MODEL, dataclasses.replace(p, packed_doc_tokens=256), CLUSTER).peak.total_bytes == whole
    local = plan(layer_spec="local")
    assert cost.layer_time(MODEL, dataclasses.replace(local, packed_doc_tokens=256), CLUSTER, CAL) == \
        cost.layer_time(MODEL, local, CLUSTER, CAL)


def test_context_parallel_splits_each_document_and_keeps_the_merges():
    # Transformer Engine's THD context parallelism cuts every document into 2 cp pieces, two per rank. A 4,096-token
    # document at cp 2: pieces of 1,024 tokens (8 query tiles each) against the document's 32 key tiles, causal on
    # average: 2 x 8 x 16.5 = 264 blocks a rank, half of cp 1's 32 x 16.5 = 528; the ring's merges of the partial
    # outputs come on top, so a rank's attention is a little over half.
    def attention(doc_tokens, cp):
        p = plan(mbs=1, gbs=8, seq_length=32768, cp=cp, dp=8 // cp, packed_doc_tokens=doc_tokens)
        return cost.layer_time(MODEL, p, CLUSTER, CAL).attn_fwd_s

    assert 0.5 < attention(4096, 2) / attention(4096, 1) < 0.7
    # 256-token documents: 64-token pieces still take a whole 128-row tile each, so a rank visits as many blocks as
    # cp 1 does (2 x 1 x 1.5 = 3 a document) and pays the merges besides: context parallelism buys nothing here.
    assert attention(256, 2) > attention(256, 1)
    # Both far below the unpacked ring's: 32,768 tokens attending causally over the whole sequence.
    unpacked = cost.layer_time(MODEL, plan(mbs=1, gbs=8, seq_length=32768, cp=2, dp=4), CLUSTER, CAL).attn_fwd_s
    assert attention(4096, 2) < unpacked / 4


def test_a_document_shorter_than_its_last_tile_pays_the_whole_tile():
    # A varlen kernel starts each document on a fresh 128-row tile: a 240-token document costs as a 256-token one,
    # and a sequence holds 256 / 240 as many of them (to the rounding of the last wave).
    assert cost.layer_time(MODEL, plan(packed_doc_tokens=240), CLUSTER, CAL).attn_fwd_s == pytest.approx(
        cost.layer_time(MODEL, plan(packed_doc_tokens=256), CLUSTER, CAL).attn_fwd_s * 256 / 240, rel=0.005)


def test_a_sliding_window_shorter_than_the_document_is_a_band():
    windowed = dataclasses.replace(MODEL, name="windowed", sliding_window=128, window_attn_skip_freq=2)
    band = cost.layer_time(windowed, plan(), CLUSTER, CAL, windowed=True).attn_fwd_s
    # 1,024-token documents under a 128-token window: each query tile sees its diagonal key tile and the one
    # before, as in the unpacked sequence (63 tiles of 32 x 32 either way).
    long_docs = cost.layer_time(windowed, plan(packed_doc_tokens=1024), CLUSTER, CAL, windowed=True).attn_fwd_s
    assert long_docs == pytest.approx(band, rel=0.01)
    # 64-token documents: 64 causal documents, each still a whole 128 x 128 tile to the kernel (varlen tiles are
    # not shared between documents): as many tiles as the band's, in more waves: no cheaper.
    short_docs = cost.layer_time(windowed, plan(packed_doc_tokens=64), CLUSTER, CAL, windowed=True).attn_fwd_s
    assert short_docs >= long_docs


def test_the_plan_validates_and_round_trips():
    with pytest.raises(ValueError, match="packed_doc_tokens must be 1..seq_length"):
        plan(packed_doc_tokens=8192)
    with pytest.raises(ValueError, match="packed_doc_tokens"):
        plan(packed_doc_tokens=0)
    p = plan(packed_doc_tokens=240)
    assert planfile.plan_from_dict(planfile.plan_dict(p, MODEL)) == p
    # A smoke test's shorter sequence keeps the documents no longer than it.
    _, shrunk, _ = runconfig.shrink(MODEL, p, TrainSpec(train_steps=10), seq_len=128, global_batch=64)
    assert (shrunk.seq_length, shrunk.packed_doc_tokens) == (128, 128)


def test_every_artifact_says_the_packing_is_the_datas():
    for framework in ("megatron", "deepspeed", "fsdp"):
        rows = [d for d in layout_differences(plan(packed_doc_tokens=240), framework) if d.aspect == "packed documents"]
        assert len(rows) == 1 and "240 tokens packed into 4096" in rows[0].plan
    assert not [d for d in layout_differences(plan(), "megatron") if d.aspect == "packed documents"]


def test_cli_prices_it_says_why_and_refuses_longer_documents(capsys):
    args = ["--model", "llama3-8b", "--gpus", "8", "--cluster", "dgx-h100", "--tp", "1", "--pp", "1", "--mbs", "1",
            "--global-batch", "32", "--seq-len", "4096", "--json"]
    assert main(args) == 0
    whole = json.loads(capsys.readouterr().out)
    assert main(args + ["--packed-doc-len", "240"]) == 0
    packed = json.loads(capsys.readouterr().out)
    assert packed["plan"]["packed_doc_tokens"] == 240 and whole["plan"]["packed_doc_tokens"] is None
    assert packed["perf"]["tokens_per_s_per_gpu"] > whole["perf"]["tokens_per_s_per_gpu"]
    assert any("packed from documents of ~240 tokens" in w for w in packed["why"])
    assert main(args[:-1] + ["--packed-doc-len", "8192"]) == 2
    err = capsys.readouterr().err
    assert "--packed-doc-len 8192 is longer than the sequence (4096)" in err and err.count("\n") == 1


def test_genconfs_runners_refuse_a_packed_plan_in_one_line(tmp_path):
    target = tmp_path / "packed"
    assert run_genconf("--model", "1b", "--gpus", "8", "--packed-doc-len", "256", "-o", str(target)).returncode == 0
    one_line_error(run_genconf("launch", str(target)), "--packed-doc-len 256: the plan's speed assumes documents packed")


def test_nvidias_fine_tuning_rows_are_typed_packed_and_pre_training_rows_not():
    runs, _ = published.load_runs()
    tuned = [r for r in runs if r.task != "pretrain" and r.file in published.NVIDIA_FILES]
    assert tuned and all(r.plan.packed_doc_tokens == published.SQUAD_DOC_TOKENS for r in tuned)
    assert all(r.plan.packed_doc_tokens is None for r in runs if r.task == "pretrain")


def test_a_plan_that_fits_nowhere_suggests_a_shorter_sequence_with_its_documents(capsys):
    # what_would_fit tries halved sequences with the same pins: the documents shrink with them (no traceback).
    assert main(["--model", "llama3-8b", "--gpus", "8", "--cluster", "dgx-h100", "--seq-len", "131072",
                 "--packed-doc-len", "131072", "--tp", "1", "--cp", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("genconf: error: llama3-8b does not fit") and "--seq-len 65536" in err
    assert err.count("\n") == 1
