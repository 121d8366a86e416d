"""Preemption and hangs on real CPU runs (issue 15): SIGUSR1 to `genconf launch` makes every rank checkpoint at
the end of its step and stop, the launch says where and how to continue, and the resumed run's loss curve equals
an uninterrupted one bit for bit; a rank that makes no progress is caught by the watchdog, every rank's stacks
land in RUN/stacks/, and the launch ends with one line naming the ranks and where they waited.
(The Slurm side, signal before the time limit and requeue, is tests/run/test_slurm_preempt.py.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, needs_torch

pytestmark = [needs_torch, pytest.mark.slow]

TINY_GPT = str(REPO / "tests" / "data" / "tiny-gpt.yaml")
SMOKE = ["--lr", "3e-3", "--vocab", "128", "--steps", "10"]


def genconf(*args: str, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "genconf", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, env=env)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("preempt") / "plan"
    done = genconf("--model", TINY_GPT, "--gpus", "2", "--gpus-per-node", "2", "--global-batch", "8", "--mbs", "1",
                   "--recompute", "none", "--framework", "fsdp", "--zero", "3", "-o", str(out))
    assert done.returncode == 0, done.stderr
    return out


def rows(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def test_sigusr1_checkpoints_stops_and_the_resumed_curve_is_bit_identical(artifacts):
    reference = artifacts / "runs" / "reference"
    done = genconf("launch", str(artifacts), "--run-dir", str(reference), "--checkpoint-every", "100", *SMOKE)
    assert done.returncode == 0, done.stderr[-3000:]

    run = artifacts / "runs" / "preempted"
    env = dict(os.environ, GENCONF_STEP_SLEEP_S="0.5")  # time to send the signal in the middle of the run
    proc = subprocess.Popen([sys.executable, "-m", "genconf", "launch", str(artifacts), "--run-dir", str(run),
                             "--checkpoint-every", "100", *SMOKE], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while len(rows(run)) < 3 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    stopped = len(rows(run))
    assert 3 <= stopped < 10, stopped
    name = f"step_{stopped:07d}"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [name]  # only the preemption checkpoint
    assert (f"genconf: preempted after step {stopped} (checkpoint {name}); continue with: genconf launch {artifacts} "
            f"--run-dir {run} --resume") in out
    assert json.loads((run / "preempted").read_text())["step"] == stopped

    resumed = genconf("launch", str(artifacts), "--run-dir", str(run), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from {name} (step {stopped})" in resumed.stdout
    assert [r["loss"] for r in rows(run)] == [r["loss"] for r in rows(reference)]
    assert not (run / "preempted").exists()


def test_a_signal_in_the_last_step_still_ends_a_finished_run(artifacts):
    """A preemption notice that comes during the last step: the ranks finish the run (nothing to requeue), torchrun
    (which ignores SIGUSR1: genconf.run.rank_signal) ends normally, and the launch says the run finished."""
    run = artifacts / "runs" / "late"
    env = dict(os.environ, GENCONF_STEP_SLEEP_S="1.5")  # the last step is long enough to be signalled in
    proc = subprocess.Popen([sys.executable, "-m", "genconf", "launch", str(artifacts), "--run-dir", str(run),
                             "--checkpoint-every", "0", "--lr", "3e-3", "--vocab", "128", "--steps", "3"], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while len(rows(run)) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert len(rows(run)) == 3 and "run finished" in out and "torchrun exited" not in out
    assert not (run / "preempted").exists() and json.loads((run / "finished").read_text())["step"] == 3


def test_a_hung_rank_is_named_with_where_every_rank_waited(artifacts):
    """Rank 1 stops making progress in step 2 (GENCONF_HANG_STEP); rank 0 then waits for it in a collective.
    A 5-second watchdog floor instead of the default 5 minutes."""
    run = artifacts / "runs" / "hung"
    env = dict(os.environ, GENCONF_HANG_STEP="2", GENCONF_HANG_RANK="1", GENCONF_WATCHDOG_FLOOR_S="5")
    t0 = time.monotonic()
    done = genconf("launch", str(artifacts), "--run-dir", str(run), "--checkpoint-every", "0", *SMOKE, env=env,
                   timeout=300)
    elapsed = time.monotonic() - t0
    assert done.returncode == 2, done.stderr[-3000:]
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("genconf: error: training hung: "), line
    assert "rank 1 made no progress for " in line or "rank 0, rank 1 made no progress for " in line, line
    assert "after step 1" in line  # both ranks finished step 1 and never step 2
    assert "rank 1 in maybe_hang (genconf/train/loop.py:" in line, line  # where the hung rank was
    assert "rank 0 in " in line and line.endswith(f"stacks in {run / 'stacks'}"), line
    stacks = sorted(p.name for p in (run / "stacks").iterdir())
    assert stacks == ["rank-0.txt", "rank-1.txt"]
    assert "maybe_hang" in (run / "stacks" / "rank-1.txt").read_text()
    assert len(rows(run)) == 2 and elapsed < 120


def as_a_terminal_starts_it() -> None:
    """A terminal's foreground job starts with SIGINT at its default; pytest itself may run with it ignored (a
    background job of a non-interactive shell, `nohup ... &`), which its children would inherit."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def launched_in_own_group(artifacts: Path, run: Path, *flags: str, step_sleep_s: str = "0.5") -> subprocess.Popen:
    """`genconf launch` as a terminal runs it: in a process group of its own (the terminal's foreground group), so
    a Ctrl-C can be sent to every process in it, as the terminal does, without reaching pytest."""
    env = dict(os.environ, GENCONF_STEP_SLEEP_S=step_sleep_s)
    return subprocess.Popen([sys.executable, "-m", "genconf", "launch", str(artifacts), "--run-dir", str(run), *flags],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            process_group=0, preexec_fn=as_a_terminal_starts_it)


def wait_for_steps(proc: subprocess.Popen, run: Path, steps: int) -> None:
    deadline = time.monotonic() + 300
    while len(rows(run)) < steps and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert proc.poll() is None, proc.communicate()[1][-3000:]


@pytest.mark.extended  # ~25 s: a run interrupted mid-way and resumed (kept out of the 20-minute default suite)
def test_ctrl_c_stops_after_a_checkpoint_without_a_traceback_and_the_run_resumes(artifacts):
    """The terminal's SIGINT reaches every process of the launch: the ranks (started with it ignored) do not die
    with a KeyboardInterrupt each; the launch asks them to stop as on a preemption notice, waits for them, and
    says where the run stopped and how to continue."""
    run = artifacts / "runs" / "ctrl-c"
    proc = launched_in_own_group(artifacts, run, "--checkpoint-every", "100", *SMOKE)
    wait_for_steps(proc, run, 3)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    stopped = len(rows(run))
    assert 3 <= stopped < 10, stopped
    name = f"step_{stopped:07d}"
    assert "genconf: Ctrl-C: the ranks stop at the end of this step, after a checkpoint" in err
    assert (f"genconf: stopped (Ctrl-C) after step {stopped} (checkpoint {name}; continue with: genconf launch "
            f"{artifacts} --run-dir {run} --resume)") in out
    resumed = genconf("launch", str(artifacts), "--run-dir", str(run), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from {name} (step {stopped})" in resumed.stdout and len(rows(run)) == 10


@pytest.mark.extended  # ~20 s each: runs slowed to 3 s a step to be interrupted in one
@pytest.mark.parametrize("how", ["ctrl-c twice", "sigterm"])
def test_a_second_ctrl_c_or_a_sigterm_stops_the_ranks_now_and_names_the_newest_checkpoint(artifacts, how):
    """Without waiting for the step to end: the ranks are gone when the launch returns (it no longer exits before
    them), and the line names the checkpoint a resume would start from."""
    run = artifacts / "runs" / how.replace(" ", "-")
    proc = launched_in_own_group(artifacts, run, "--checkpoint-every", "2", *SMOKE, step_sleep_s="3")
    wait_for_steps(proc, run, 3)
    if how == "sigterm":
        proc.send_signal(signal.SIGTERM)  # a kill of the launch alone (`timeout`, a job manager)
    else:
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == (143 if how == "sigterm" else 130), err[-3000:]
    assert "KeyboardInterrupt" not in err, err[-3000:]
    assert "stopping the ranks now" in err
    newest = f"step_{2 * (len(rows(run)) // 2):07d}"
    why = "SIGTERM" if how == "sigterm" else "Ctrl-C"
    assert (f"genconf: stopped ({why}) before the end of a step (the newest checkpoint is {newest}; continue with: "
            f"genconf launch {artifacts} --run-dir {run} --resume)") in out, out
    assert not rank_signal_children(proc.pid)
    assert not (run / "finished").exists() and len(rows(run)) < 10


def rank_signal_children(pid: int) -> list[int]:
    """Processes still running under the launch's group (its torchrun and ranks)."""
    alive = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.getpgid(int(name)) == pid:
                    alive.append(int(name))
            except ProcessLookupError:
                continue
    return alive
