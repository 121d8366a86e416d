"""The checkpoint store (issue 15 "checkpoints you can trust", issue 13 part 3 "checkpoints that cannot kill a
run"): staged, manifest last, verified at resume, pruned to the newest N, refused before a save the disk
cannot hold. Real files on real file systems; the ENOSPC cases use a small tmpfs (root only)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from genconf.train.checkpoints import (MANIFEST, CheckpointError, CheckpointStore, NoSpaceError, read_manifest,
                                       sha256_file)


def save(store: CheckpointStore, step: int, files: dict[str, bytes], *, world: int = 1, expected: int | None = None):
    """What the training loop does: rank 0 begins, every rank writes and hashes its share, rank 0 commits."""
    staging = store.begin(step, expected_bytes=expected)
    for rel, data in files.items():
        (staging / rel).parent.mkdir(parents=True, exist_ok=True)
        (staging / rel).write_bytes(data)
    entries = [e for rank in range(world) for e in store.hash_share(step, rank, world)]
    return store.commit(step, entries, {"framework": "test"})


def rank_files(step: int, world: int = 2, size: int = 1000) -> dict[str, bytes]:
    return {f"rank{r:05d}.pt": bytes([(step + r) % 256]) * size for r in range(world)}


def test_sha256_known_answer(tmp_path):
    (tmp_path / "abc").write_bytes(b"abc")
    # FIPS 180-2, appendix B.1: SHA-256("abc")
    assert sha256_file(tmp_path / "abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_manifest_is_written_last_with_sizes_and_checksums(tmp_path):
    store = CheckpointStore(tmp_path / "checkpoints")
    files = {"rank00000.pt": b"a" * 10, "rank00001.pt": b"b" * 20, "sub/extra.bin": b"c" * 3}
    final = save(store, 10, files)
    assert final.name == "step_0000010"
    assert not any(p.name.startswith(".") for p in store.root.iterdir())
    manifest = read_manifest(final)
    assert manifest["step"] == 10 and manifest["total_bytes"] == 33 and manifest["meta"] == {"framework": "test"}
    assert [(f["path"], f["size_bytes"], f["sha256"]) for f in manifest["files"]] == [
        (rel, len(data), hashlib.sha256(data).hexdigest()) for rel, data in sorted(files.items())]
    # sha256sum can check it by hand
    if shutil.which("sha256sum"):
        listing = "".join(f"{f['sha256']}  {f['path']}\n" for f in manifest["files"])
        out = subprocess.run(["sha256sum", "-c", "-"], input=listing, text=True, cwd=final, capture_output=True)
        assert out.returncode == 0, out.stdout + out.stderr
    assert store.verify(final) is None


def test_hash_shares_over_ranks_cover_every_file_once(tmp_path):
    one = CheckpointStore(tmp_path / "a")
    three = CheckpointStore(tmp_path / "b")
    files = {f"f{i}.bin": os.urandom(100 + i) for i in range(7)}
    m1 = read_manifest(save(one, 5, files, world=1))
    m3 = read_manifest(save(three, 5, files, world=3))
    assert m1["files"] == m3["files"]
    # a rank's share is a disjoint slice: together they are every file
    staging = three.begin(6)
    for rel, data in files.items():
        (staging / rel).write_bytes(data)
    shares = [{e.path for e in three.hash_share(6, r, 3)} for r in range(3)]
    assert sorted(p for s in shares for p in s) == sorted(files) and all(len(s) in (2, 3) for s in shares)
    three.abort(6)
    assert not three.staging_dir(6).exists()


def test_commit_refuses_a_manifest_that_misses_a_file(tmp_path):
    store = CheckpointStore(tmp_path)
    staging = store.begin(1)
    (staging / "a").write_bytes(b"1")
    (staging / "b").write_bytes(b"2")
    with pytest.raises(CheckpointError, match="do not match"):
        store.commit(1, store.hash_share(1, 0, 2))
    assert not store.final_dir(1).exists()


@pytest.mark.parametrize("damage, reason", [
    ("flip", "does not match its SHA-256 checksum"),
    ("truncate", "has 999 bytes, the manifest says 1,000"),
    ("delete", "rank00001.pt is missing"),
    ("manifest", "no manifest.json"),
    ("garbage", "unreadable manifest.json"),
    ("extra", "stray.pt is not in the manifest"),
])
def test_resume_skips_a_damaged_checkpoint_and_takes_the_older_one(tmp_path, damage, reason):
    """Issue 15 item 5: a corrupt newest checkpoint must not be loaded; the intact one beside it is."""
    store = CheckpointStore(tmp_path, keep_last=3)
    save(store, 10, rank_files(10))
    newest = save(store, 20, rank_files(20))
    victim = newest / "rank00001.pt"
    if damage == "flip":
        data = bytearray(victim.read_bytes())
        data[500] ^= 0x01
        victim.write_bytes(bytes(data))
    elif damage == "truncate":
        victim.write_bytes(victim.read_bytes()[:999])
    elif damage == "delete":
        victim.unlink()
    elif damage == "manifest":
        (newest / MANIFEST).unlink()
    elif damage == "garbage":
        (newest / MANIFEST).write_text("{not json")
    elif damage == "extra":
        (newest / "stray.pt").write_bytes(b"x")
    found = store.newest_verified()
    assert found.step == 10 and found.path == store.final_dir(10)
    assert [s.path.name for s in found.skipped] == ["step_0000020"]
    assert reason in found.skipped[0].reason
    assert found.summary().startswith("resuming from step_0000010 (step 10), skipped step_0000020: ")


def test_agreement_across_ranks_takes_the_first_reason(tmp_path):
    """A checksum only one rank checks still makes every rank skip the checkpoint."""
    store = CheckpointStore(tmp_path, keep_last=3)
    save(store, 1, rank_files(1))
    newest = save(store, 2, rank_files(2))
    data = bytearray((newest / "rank00001.pt").read_bytes())
    data[0] ^= 0xFF
    (newest / "rank00001.pt").write_bytes(bytes(data))
    # rank 0 of 2 hashes only rank00000.pt: alone it would accept step 2
    assert store.verify(newest, rank=0, world=2) is None
    order = iter(store.candidates())

    def agree(why):  # what an all-gather gives rank 0: rank 1's verdict on the same checkpoint
        _, path = next(order)
        return why or store.verify(path, rank=1, world=2)

    found = store.newest_verified(rank=0, world=2, agree=agree)
    assert found.step == 1 and "checksum" in found.skipped[0].reason


def test_no_checkpoint_at_all(tmp_path):
    found = CheckpointStore(tmp_path / "none").newest_verified()
    assert found.step is None and found.summary() == "no verified checkpoint"


def test_keep_last_prunes_older_checkpoints(tmp_path):
    store = CheckpointStore(tmp_path)  # default: keep 2
    for step in (5, 10, 15, 20):
        save(store, step, rank_files(step))
    assert [s for s, _ in store.steps()] == [15, 20]
    store3 = CheckpointStore(tmp_path / "three", keep_last=3)
    for step in range(1, 6):
        save(store3, step, rank_files(step))
    assert [s for s, _ in store3.steps()] == [3, 4, 5]
    with pytest.raises(ValueError, match="positive"):
        CheckpointStore(tmp_path, keep_last=0)


def test_prune_keeps_a_directory_without_manifest_for_resume_to_name(tmp_path):
    store = CheckpointStore(tmp_path, keep_last=1)
    save(store, 1, rank_files(1))
    store.final_dir(0).mkdir()  # e.g. an old-style checkpoint with a 'done' marker
    (store.final_dir(0) / "done").write_text("ok\n")
    save(store, 2, rank_files(2))
    assert [s for s, _ in store.steps()] == [0, 2]
    assert "no manifest.json" in store.verify(store.final_dir(0))


def test_leftovers_of_a_killed_save_are_removed_by_the_next_save(tmp_path):
    store = CheckpointStore(tmp_path)
    save(store, 1, rank_files(1))
    killed = store.staging_dir(2)
    killed.mkdir()
    (killed / "rank00000.pt").write_bytes(b"half")
    pruning = tmp_path / ".step_0000001.del"
    pruning.mkdir()
    unrelated = tmp_path / ".keep-me"
    unrelated.mkdir()
    assert store.newest_verified().step == 1  # never looked at
    save(store, 3, rank_files(3))
    assert not killed.exists() and not pruning.exists() and unrelated.exists()


def test_saving_a_step_again_replaces_it(tmp_path):
    store = CheckpointStore(tmp_path)
    save(store, 4, {"a": b"old"})
    save(store, 4, {"a": b"new!"})
    assert (store.final_dir(4) / "a").read_bytes() == b"new!" and store.verify(store.final_dir(4)) is None


def test_free_space_is_checked_before_anything_is_written(tmp_path):
    store = CheckpointStore(tmp_path / "ckpt")
    free = shutil.disk_usage(tmp_path).free
    with pytest.raises(NoSpaceError) as err:
        store.begin(1, expected_bytes=2 * free)
    message = str(err.value)
    assert "\n" not in message and "not enough disk for a checkpoint" in message and "GiB is free" in message
    assert "--checkpoint-every" in message and "--keep-checkpoints" in message
    assert not store.staging_dir(1).exists()
    # the next checkpoint's size comes from the newest manifest, else from the caller's estimate
    assert store.expected_bytes(123) == 123
    save(store, 1, rank_files(1, size=4096))
    assert store.expected_bytes(123) == 2 * 4096


@pytest.fixture
def small_fs(tmp_path):
    """A 1 MiB tmpfs: real ENOSPC without filling the machine's disk (needs root and mount)."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / f"fs-{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {out.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", str(mnt)], capture_output=True)


def test_a_full_disk_is_refused_from_the_previous_checkpoints_size(small_fs):
    """Issue 13: checkpoints filled the disk and killed the run. With the size of the last checkpoint known,
    the next save that cannot fit is refused before a byte is written, and the one on disk stays valid."""
    store = CheckpointStore(small_fs / "checkpoints", keep_last=2, reserve_bytes=0)
    save(store, 1, rank_files(1, size=300 * 1024))  # 600 KiB of a 1 MiB disk
    with pytest.raises(NoSpaceError, match=r"it needs 0\.6 MiB \(\+ 0\.0 MiB kept free\) but 0\.4 MiB is free \(1 checkpoint\(s\) here hold 0\.6 MiB\)"):
        store.begin(2, expected_bytes=store.expected_bytes())
    assert store.newest_verified().step == 1 and not store.staging_dir(2).exists()


def test_a_write_that_hits_enospc_leaves_the_older_checkpoint_intact(small_fs):
    store = CheckpointStore(small_fs / "checkpoints", reserve_bytes=0)
    save(store, 1, {"a.pt": b"x" * 100_000})
    staging = store.begin(2, expected_bytes=None)
    with pytest.raises(OSError) as err:
        (staging / "a.pt").write_bytes(b"y" * (2 << 20))
    assert err.value.errno == errno.ENOSPC
    store.abort(2)
    assert [s for s, _ in store.steps()] == [1] and store.newest_verified().step == 1
    assert json.loads((store.final_dir(1) / MANIFEST).read_text())["total_bytes"] == 100_000


def test_the_store_the_watchdog_and_the_checks_import_no_torch():
    """They run in `genconf launch` before any rank starts, and in tests without the train extra."""
    import sys

    code = ("import sys; import genconf.train.checkpoints, genconf.train.watchdog, genconf.run.datacheck, genconf.run.leftovers, "
            "genconf.plan.limits, genconf.plan.checkpoint_size; "
            "sys.stderr.write(repr(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy', 'jinja2'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stderr.strip().endswith("[]"), out.stderr[-300:]


def test_resume_refuses_a_checkpoint_with_another_vocabulary_row_count(capsys):
    """GPT-3's 50,257-token vocabulary: genconf's own model (FSDP, DeepSpeed) holds 50,304 rows since it pads it (to
    a multiple of 64 from 858e46f, of 128 since); a checkpoint written before holds 50,257 and records no row count.
    Resuming it says so in one line (exit 2) rather than failing inside load_state_dict on the shapes; megatron's
    padding did not change."""
    from genconf.catalog.models import resolve_model
    from genconf.plan.runconfig import RunConfig
    from genconf.plan.specs import ParallelPlan, TrainSpec
    from genconf.train.loop import checkpoint_meta, refuse_other_run

    model = resolve_model("gpt3-125m")[0]

    def cfg(framework: str) -> RunConfig:
        plan = ParallelPlan(framework=framework, dp=1, mbs=1, gbs=1, seq_length=2048, zero_stage=0)
        return RunConfig(model=model, plan=plan, train=TrainSpec(train_steps=10), num_gpus=1, data={},
                         precision_recipe="bf16", prediction={}, shrink={}, artifacts="")

    fsdp = cfg("fsdp")
    meta = checkpoint_meta(fsdp, 1)
    assert meta["vocab_rows"] == 50304
    refuse_other_run({"meta": meta}, fsdp)  # written by this genconf: accepted
    old = {k: v for k, v in meta.items() if k != "vocab_rows"}
    with pytest.raises(SystemExit) as exit_:
        refuse_other_run({"meta": old}, fsdp)
    assert exit_.value.code == 2
    assert "holds 50257 vocabulary rows, this run's model 50304" in capsys.readouterr().err
    megatron = cfg("megatron")
    refuse_other_run({"meta": {k: v for k, v in checkpoint_meta(megatron, 1).items() if k != "vocab_rows"}}, megatron)


def test_resume_refuses_a_checkpoint_padded_to_64_rows(capsys):
    """MPT-760M's 50,368 rows are a multiple of 64 (genconf's padding from 858e46f) but not of 128 (35c45de on): a
    checkpoint of the 64-row padding records 50,368 rows, this genconf's model holds 50,432, and resuming says so."""
    from genconf.plan.runconfig import RunConfig
    from genconf.plan.specs import ParallelPlan, TrainSpec
    from genconf.train.loop import checkpoint_meta, refuse_other_run

    from conftest import mpt_760m  # noqa: I001 (the tests' own helpers)

    plan = ParallelPlan(framework="deepspeed", dp=1, mbs=1, gbs=1, seq_length=2048, zero_stage=1)
    cfg = RunConfig(model=mpt_760m(), plan=plan, train=TrainSpec(train_steps=10), num_gpus=1, data={},
                    precision_recipe="bf16", prediction={}, shrink={}, artifacts="")
    meta = checkpoint_meta(cfg, 1)
    assert meta["vocab_rows"] == 50432
    with pytest.raises(SystemExit) as exit_:
        refuse_other_run({"meta": meta | {"vocab_rows": 50368}}, cfg)
    assert exit_.value.code == 2
    assert "holds 50368 vocabulary rows, this run's model 50432" in capsys.readouterr().err
