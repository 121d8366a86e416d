"""Preemption the Slurm way: the sbatch script asks for SIGUSR1 some time before the time limit
(`--signal=USR1@<seconds>`) and for `--requeue`; genconf.run.rank_signal, torchrun's parent, passes the signal
to the ranks (torchrun itself ignores it); every rank notes it, the ranks agree at the end of a step, save a
checkpoint, write RUN/preempted and exit; the script then requeues the job, and the requeued job
(SLURM_RESTART_COUNT > 0) resumes from that checkpoint by itself.

Only SIGUSR1: SIGTERM is also what torchrun sends the surviving ranks when one fails, and a save then would
wait for a rank that is gone. Standard library only.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

SIGNAL = signal.SIGUSR1
SIGNAL_NAME = "USR1"
MARKER = "preempted"
"""RUN/preempted: written by rank 0 after the preemption checkpoint; the sbatch script requeues on it."""
FINISHED = "finished"
"""RUN/finished: written by rank 0 once every rank has finished the last step. The sbatch script and `genconf
launch` read this marker, not the exit code, to tell a finished run: a torchrun that handles SIGUSR1 itself (as
sbatch scripts from before genconf.run.rank_signal ran it) and is signalled after the ranks' last look at the flag
exits 1 after they finished the run."""
EXIT_PREEMPTED = 0
"""A rank that checkpointed on the signal ends normally; the marker, not the exit code, says it stopped early."""


class Preemption:
    """The signal as a flag: set by the handler, read by the training loop at the end of each step."""

    def __init__(self) -> None:
        self.received_at: float | None = None
        self._previous = None

    @property
    def requested(self) -> bool:
        return self.received_at is not None

    def install(self) -> "Preemption":
        self._previous = signal.signal(SIGNAL, self._handle)
        return self

    def uninstall(self) -> None:
        if self._previous is not None:
            signal.signal(SIGNAL, self._previous)
            self._previous = None

    def _handle(self, signum, frame) -> None:
        if self.received_at is None:
            self.received_at = time.time()


_ACTIVE: Preemption | None = None


def install() -> Preemption:
    """The process's one Preemption, its handler installed on the first call (the entry points call this
    before importing torch, so an early signal is noted, not fatal)."""
    global _ACTIVE
    if _ACTIVE is None:
        _ACTIVE = Preemption().install()
    return _ACTIVE


def _write(run_dir: Path, name: str, fields: dict) -> Path:
    path = Path(run_dir) / name
    tmp = path.with_name(name + ".tmp")
    tmp.write_text(json.dumps({**fields, "time": time.time()}) + "\n")
    os.replace(tmp, path)
    return path


def _read(run_dir: Path, name: str) -> dict | None:
    try:
        return json.loads((Path(run_dir) / name).read_text())
    except (OSError, ValueError):
        return None


def write_marker(run_dir: Path, *, step: int, checkpoint: str | None) -> Path:
    """RUN/preempted: where the run stopped and which checkpoint it left (None: checkpoints were off)."""
    return _write(run_dir, MARKER, {"step": step, "checkpoint": checkpoint})


def read_marker(run_dir: Path) -> dict | None:
    return _read(run_dir, MARKER)


def write_finished(run_dir: Path, *, step: int) -> Path:
    """RUN/finished: the run trained through its last step (`step` steps) on every rank."""
    return _write(run_dir, FINISHED, {"step": step})


def read_finished(run_dir: Path) -> dict | None:
    return _read(run_dir, FINISHED)


def clear_marker(run_dir: Path) -> None:
    """Forget both markers of an earlier launch."""
    for name in (MARKER, FINISHED):
        (Path(run_dir) / name).unlink(missing_ok=True)


def requeued(environ=os.environ) -> bool:
    """This is a requeued Slurm job (Slurm counts restarts in SLURM_RESTART_COUNT)."""
    try:
        return int(environ.get("SLURM_RESTART_COUNT", "0")) > 0
    except ValueError:
        return False
