"""Preemption and requeue on the local Slurm cluster (issue 15): a job with a short time limit is signalled
(SIGUSR1, `#SBATCH --signal=USR1@30` for a 2-minute limit), its ranks checkpoint at a step boundary and stop,
the script requeues it (`#SBATCH --requeue`, `scontrol requeue`), the requeued job resumes from the checkpoint
by itself, and the loss curve equals an uninterrupted run's bit for bit.

Each step sleeps 3 s (GENCONF_STEP_SLEEP_S, outside the step's numerics), so 30 steps cannot fit in one
2-minute allocation: the first job must be signalled before it finishes. The requeued job waits out the local
cluster's credential lifetime (AuthInfo=cred_expire=20, local_cluster.sh) before it starts again; starting it
earlier (`scontrol update StartTime=now`) gets it killed with "Job credential revoked".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, needs_torch

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.extended, needs_torch]  # ~2.7 min, mostly Slurm's wait

TINY_GPT = str(REPO / "tests" / "data" / "tiny-gpt.yaml")
STEPS = 30
SMOKE = ["--steps", str(STEPS), "--lr", "3e-3", "--vocab", "128", "--checkpoint-every", "100"]


def genconf(*args: str, env: dict | None = None, timeout: int = 1500) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "genconf", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=timeout, env=env)


def plan(tmp_path: Path, name: str, time_limit: str) -> Path:
    out = tmp_path / name
    done = genconf("--model", TINY_GPT, "--gpus", "4", "--gpus-per-node", "2", "--mbs", "1", "--global-batch", "8",
                   "--recompute", "none", "--framework", "fsdp", "--zero", "3", "--partition", "debug", "--time",
                   time_limit, "-o", str(out))
    assert done.returncode == 0, done.stderr
    return out


def losses(run: Path) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [(r["step"], r["loss"]) for r in rows]


def test_a_job_signalled_before_its_time_limit_is_requeued_resumes_and_matches_an_uninterrupted_run(
        slurm_cluster, tmp_path):
    reference = plan(tmp_path, "reference", "00:10:00")
    done = genconf("launch", str(reference), "--submit", "--wait", *SMOKE)
    assert done.returncode == 0, done.stdout + done.stderr
    expected = losses(reference / "runs")
    assert [s for s, _ in expected] == list(range(STEPS))

    artifacts = plan(tmp_path, "preempted", "00:02:00")
    script = (artifacts / "launch_fsdp.sbatch").read_text()
    assert "#SBATCH --signal=USR1@30\n" in script and "#SBATCH --requeue\n" in script  # a quarter of 2 minutes
    env = dict(os.environ, GENCONF_STEP_SLEEP_S="3")  # sbatch exports the environment to the job
    launch = subprocess.Popen([sys.executable, "-m", "genconf", "launch", str(artifacts), "--submit", "--wait", *SMOKE],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)
    stdout, stderr = launch.communicate(timeout=600)  # the requeued job waits out cred_expire (20 s) first
    assert launch.returncode == 0, stdout + stderr
    job_id = stdout.split("submitted job ")[1].split()[0]
    run = artifacts / "runs"
    log = "".join(p.read_text() for p in sorted((run / "logs").glob(f"fsdp-{job_id}.*")))
    assert "genconf: preempted; requeueing job" in log, log[-3000:]
    assert "genconf: preempted (USR1) after step " in log
    assert "genconf: resuming from step_" in log
    fields = dict(kv.split("=", 1) for kv in subprocess.run(["scontrol", "show", "job", "-o", job_id],
                                                             capture_output=True, text=True).stdout.split() if "=" in kv)
    assert int(fields.get("Restarts", "0")) >= 1 and fields.get("JobState") == "COMPLETED", fields
    assert losses(run) == expected  # bit for bit: the same steps, the same losses
