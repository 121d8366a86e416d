"""Checkpoints you can trust, on real CPU runs (issue 15 "checkpoints", issue 13 part 3): every runner saves
through genconf.train.checkpoints (staged, manifest last, renamed), resume takes the newest checkpoint that
verifies and names the ones it skipped, keep-last-N prunes, `--checkpoint-every 0` saves nothing, a save the
disk cannot hold stops the run with one line, and `--resume --steps N` extends a run while any other flag that
disagrees with the saved run is refused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, needs_deepspeed, needs_megatron, needs_torch

pytestmark = [needs_torch, pytest.mark.slow]

TINY_GPT = str(REPO / "tests" / "data" / "tiny-gpt.yaml")
SMOKE = ["--lr", "3e-3", "--vocab", "128"]


def genconf(*args: str, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "genconf", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, env=env)


def ok(done: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert done.returncode == 0, f"exit {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def plan_dir(root: Path, framework: str, gpus: int, *pins: str) -> Path:
    out = root / framework
    ok(genconf("--model", TINY_GPT, "--gpus", str(gpus), "--gpus-per-node", "2", "--global-batch", "8", "--mbs", "1",
               "--recompute", "none", "--framework", framework, *pins, "-o", str(out)))
    return out


def losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def checkpoints(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").iterdir()) if (run / "checkpoints").is_dir() else []


def last_line(done: subprocess.CompletedProcess) -> str:
    return done.stderr.strip().splitlines()[-1]


LAYOUTS = [
    pytest.param("fsdp", 2, ["--zero", "3"], id="fsdp"),
    pytest.param("deepspeed", 2, ["--zero", "3"], marks=needs_deepspeed, id="deepspeed-zero3"),
    pytest.param("megatron", 2, ["--tp", "2", "--pp", "1", "--zero", "0"], marks=needs_megatron, id="megatron-tp2"),
]


@pytest.mark.parametrize("framework,gpus,pins", LAYOUTS)
def test_a_corrupt_newest_checkpoint_falls_back_to_the_older_one(tmp_path, framework, gpus, pins):
    """Issue 15 item 5: a corrupt checkpoint killed every rank with a torch traceback; the intact one beside it
    was never tried. Now resume skips it, says why, and the loss curve equals the uninterrupted run's."""
    artifacts = plan_dir(tmp_path, framework, gpus, *pins)
    run = artifacts / "runs" / "r"
    ok(genconf("launch", str(artifacts), "--run-dir", str(run), "--steps", "12", "--checkpoint-every", "4", *SMOKE))
    assert checkpoints(run) == ["step_0000008", "step_0000012"]  # keep-last-2 pruned step 4
    for name in checkpoints(run):
        manifest = json.loads((run / "checkpoints" / name / "manifest.json").read_text())
        assert manifest["step"] == int(name[5:]) and manifest["meta"]["framework"] == framework
        assert sorted(f["path"] for f in manifest["files"]) == sorted(
            p.relative_to(run / "checkpoints" / name).as_posix()
            for p in (run / "checkpoints" / name).rglob("*") if p.is_file() and p.name != "manifest.json")
    expected = losses(run)
    # Flip one byte in the middle of the newest checkpoint's largest file (size unchanged: only the checksum knows).
    newest = run / "checkpoints" / "step_0000012"
    victim = max((p for p in newest.rglob("*") if p.is_file() and p.name != "manifest.json"), key=lambda p: p.stat().st_size)
    with open(victim, "r+b") as f:
        f.seek(victim.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    done = ok(genconf("launch", str(artifacts), "--run-dir", str(run), "--resume"))
    rel = victim.relative_to(newest).as_posix()
    assert (f"genconf: resuming from step_0000008 (step 8), skipped step_0000012: {rel} does not match its SHA-256 "
            f"checksum") in done.stdout
    assert losses(run) == expected  # steps 8..11 again, bit for bit (CPU runs are deterministic)
    assert checkpoints(run) == ["step_0000008", "step_0000012"]  # the re-saved step 12 replaced the corrupt one


def test_resume_extends_a_run_and_refuses_flags_that_disagree(tmp_path):
    """Issue 15 item 4: `--resume --steps 20` after a 10-step run trained nothing and said "run finished"; the saved
    config silently won over every flag, which were still needed for the host-memory check."""
    artifacts = plan_dir(tmp_path, "fsdp", 2, "--zero", "3")
    run = artifacts / "runs" / "r"
    ok(genconf("launch", str(artifacts), "--run-dir", str(run), "--steps", "6", "--checkpoint-every", "3", *SMOKE))
    assert len(losses(run)) == 6
    finished = genconf("launch", str(artifacts), "--run-dir", str(run), "--resume")
    assert finished.returncode == 2 and last_line(finished) == (
        "genconf: error: --resume: the run finished at step 6 of 6; give --steps N (more than 6) to extend it")
    refused = genconf("launch", str(artifacts), "--run-dir", str(run), "--resume", "--steps", "9", "--lr", "1e-3")
    assert refused.returncode == 2 and refused.stderr.strip() == (
        "genconf: error: --resume: --lr 0.001 disagrees with the saved run (--lr 0.003); a resumed run keeps its "
        "settings: drop the flag, or start a new run (--name)")
    # The flags not given (--vocab, --lr) come from the saved run; the one that agrees (--vocab 128) is accepted.
    done = ok(genconf("launch", str(artifacts), "--run-dir", str(run), "--resume", "--steps", "9", "--vocab", "128"))
    assert ("genconf: extending the run from 6 to 9 steps: the learning-rate schedule (cosine, 1 warm-up step) is now "
            "defined over 9 steps; the steps already trained followed the 6-step schedule") in done.stderr
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(9))
    saved = json.loads((run / "config.json").read_text())
    assert saved["train"]["train_steps"] == 9 and saved["model"]["vocab_size"] == 128
    assert checkpoints(run) == ["step_0000006", "step_0000009"]
    # The lr of steps 6..8 follows the 9-step cosine schedule (loop.lr_at), not the 6-step one (which ends at min_lr).
    from genconf.plan.runconfig import RunConfig
    from genconf.train.loop import lr_at

    train = RunConfig.from_dict(saved).train
    assert [r["lr"] for r in rows[6:]] == pytest.approx([lr_at(s, train) for s in (6, 7, 8)])
    assert rows[6]["lr"] > train.min_lr


def test_checkpoint_every_0_saves_nothing(tmp_path):
    artifacts = plan_dir(tmp_path, "fsdp", 2, "--zero", "3")
    run = artifacts / "runs" / "off"
    ok(genconf("launch", str(artifacts), "--run-dir", str(run), "--steps", "3", "--checkpoint-every", "0", *SMOKE))
    assert len(losses(run)) == 3 and checkpoints(run) == []
    again = genconf("launch", str(artifacts), "--run-dir", str(run), "--resume", "--steps", "5")
    assert again.returncode == 2 and "no checkpoint in" in last_line(again)


def test_keep_checkpoints_keeps_the_newest_n(tmp_path):
    artifacts = plan_dir(tmp_path, "fsdp", 2, "--zero", "3")
    run = artifacts / "runs" / "keep"
    ok(genconf("launch", str(artifacts), "--run-dir", str(run), "--steps", "5", "--checkpoint-every", "1",
               "--keep-checkpoints", "3", *SMOKE))
    assert checkpoints(run) == ["step_0000003", "step_0000004", "step_0000005"]


def test_a_save_the_disk_cannot_hold_stops_the_run_with_one_line(tmp_path):
    """Issue 15 item 8 / issue 13: the checkpoints filled the disk and the run ended with "exited with code 1".
    The free-space check is real (shutil.disk_usage); the reserve it must leave is set above the disk's size."""
    artifacts = plan_dir(tmp_path, "fsdp", 2, "--zero", "3")
    run = artifacts / "runs" / "full"
    env = dict(os.environ, GENCONF_CHECKPOINT_RESERVE_MIB=str(2**40))
    done = genconf("launch", str(artifacts), "--run-dir", str(run), "--steps", "4", "--checkpoint-every", "2", *SMOKE,
                   env=env)
    assert done.returncode == 2
    line = last_line(done)
    assert line.startswith("genconf: error: training failed: rank 0 stopped before checkpoint step_0000002: not enough "
                           f"disk for a checkpoint in {run / 'checkpoints'}: it needs "), line
    assert " is free " in line and "--keep-checkpoints" in line
    assert len(losses(run)) == 2 and checkpoints(run) == []  # nothing half-written


@needs_megatron
def test_a_megatron_checkpoint_holds_each_tensor_once_and_the_planned_bytes(tmp_path):
    """BF16 megatron: 16-bit weights, fp32 masters and Adam moments, each once (14 bytes per parameter, the plan's
    checkpoint size). On the H200 the Adam state went in twice (19.2 GiB for a planned 12.2); on a CPU the copies
    shared storage, so the file hid it: the tensors' own bytes are counted here."""
    import torch

    art = plan_dir(tmp_path, "megatron", 1, "--tp", "1", "--pp", "1", "--zero", "0", "--layer-spec", "local")
    run = tmp_path / "run"
    ok(genconf("launch", str(art), "--run-dir", str(run), "--steps", "2", "--lr", "3e-3"))  # the planned model, unshrunk
    saved = torch.load(next((run / "checkpoints").iterdir()) / "rank00000.pt", weights_only=False)["tensors"]
    tensor_bytes = sum(t.numel() * t.element_size() for t in saved)
    storages = {t.untyped_storage().data_ptr() for t in saved}
    assert len(storages) == len(saved), "two saved tensors share a storage (one tensor saved twice)"
    planned = json.loads((art / "plan.json").read_text())["checkpoint"]
    assert planned["bytes_per_param"] == 14
    assert tensor_bytes == pytest.approx(planned["bytes"], rel=0.01)
