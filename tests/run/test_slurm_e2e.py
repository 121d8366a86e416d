"""Slurm end to end: a generated sbatch trains on the local emulated cluster (2 nodes x 2 fake GPUs).

The plan is rendered with genconf's own templates and submitted unchanged by `genconf launch DIR --submit
--wait`: srun starts one torchrun per node, c10d rendezvous on the first node of the allocation, 4 ranks
train on CPU with gloo, metrics.jsonl lands in the script's run directory, and `genconf verify` passes.
A job whose rank raises makes `genconf launch --submit --wait` exit non-zero with the job id, its state
and the tail of its log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, needs_deepspeed, needs_megatron, needs_torch

pytestmark = [pytest.mark.slurm, pytest.mark.slow, needs_torch]

TINY_GPT = str(REPO / "tests" / "data" / "tiny-gpt.yaml")
SLURM = ["--gpus-per-node", "2", "--partition", "debug", "--time", "00:10:00"]
SMOKE = ["--steps", "24", "--lr", "3e-3", "--vocab", "128"]  # verify's loss rule: see tests/test_train.py VERIFIED


def genconf(*args: str, env: dict | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "genconf", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=timeout, env=env)


def plan(tmp_path: Path, name: str, *pins: str) -> Path:
    out = tmp_path / name
    done = genconf("--model", TINY_GPT, "--gpus", "4", "--mbs", "1", "--global-batch", "8", "--recompute", "none",
                   *pins, *SLURM, "-o", str(out))
    assert done.returncode == 0, done.stderr
    return out


def submit_and_verify(artifacts: Path, framework: str) -> dict:
    start = time.monotonic()
    done = genconf("launch", str(artifacts), "--submit", "--wait", *SMOKE)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "COMPLETED" in done.stdout
    run = artifacts / "runs"  # the RUN_DIR the generated script trains into
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 24
    logs = sorted((run / "logs").glob(f"{framework}-*.out"))
    assert logs, list((run / "logs").iterdir())
    verify = genconf("verify", str(run), "--json")
    report = json.loads(verify.stdout)
    assert verify.returncode == 0 and report["ok"], report
    return {"seconds": time.monotonic() - start, "rows": rows, "log": logs[-1].read_text()}


@needs_megatron
def test_megatron_tp2_dp2_trains_through_slurm(slurm_cluster, tmp_path):
    artifacts = plan(tmp_path, "megatron", "--framework", "megatron", "--tp", "2", "--pp", "1", "--zero", "1")
    script = (artifacts / "launch_megatron.sbatch").read_text()
    assert "#SBATCH --nodes=2" in script and "--nnodes=2 --nproc-per-node=2" in script
    result = submit_and_verify(artifacts, "megatron")
    assert "tp=2 pp=1 vp=1 cp=1 ep=1 dp=2" in result["log"]  # 4 ranks: TP2 x DP2


@needs_deepspeed
def test_deepspeed_zero2_trains_through_slurm(slurm_cluster, tmp_path):
    artifacts = plan(tmp_path, "deepspeed", "--framework", "deepspeed", "--zero", "2")
    result = submit_and_verify(artifacts, "deepspeed")
    assert "ZeRO-2" in result["log"] and "dp=4" in result["log"]


@needs_deepspeed
def test_a_dying_job_is_reported_with_id_state_and_log(slurm_cluster, tmp_path):
    artifacts = plan(tmp_path, "dies", "--framework", "deepspeed", "--zero", "1")
    env = dict(os.environ, GENCONF_FAIL_STEP="1", GENCONF_FAIL_RANK="3")  # sbatch exports the environment
    done = genconf("launch", str(artifacts), "--submit", "--wait", *SMOKE, env=env)
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("genconf: error: job ") and "ended FAILED" in last and "exit code" in last
    job_id = last.split("job ")[1].split()[0]
    assert job_id.isdigit()
    assert "injected failure on rank 3 after step 1" in done.stderr  # the log tail is shown
