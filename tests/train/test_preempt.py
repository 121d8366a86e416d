"""The preemption flag and marker (issue 15 "preemption and requeue"): SIGUSR1 becomes a flag the loop reads
at a step boundary; the marker says where the run stopped; a requeued job is recognised from Slurm's count."""

from __future__ import annotations

import os
import signal

from genconf.train import preempt


def test_the_signal_sets_the_flag_and_nothing_else():
    before = signal.getsignal(signal.SIGUSR1)
    p = preempt.Preemption().install()
    try:
        assert not p.requested
        os.kill(os.getpid(), signal.SIGUSR1)  # without the handler this would end the process
        assert p.requested and p.received_at is not None
        first = p.received_at
        os.kill(os.getpid(), signal.SIGUSR1)
        assert p.received_at == first
    finally:
        p.uninstall()
    assert signal.getsignal(signal.SIGUSR1) == before


def test_marker_round_trip(tmp_path):
    assert preempt.read_marker(tmp_path) is None
    preempt.write_marker(tmp_path, step=7, checkpoint="step_0000007")
    m = preempt.read_marker(tmp_path)
    assert (m["step"], m["checkpoint"]) == (7, "step_0000007")
    preempt.clear_marker(tmp_path)
    assert preempt.read_marker(tmp_path) is None


def test_requeued():
    assert not preempt.requeued({})
    assert not preempt.requeued({"SLURM_RESTART_COUNT": "0"})
    assert preempt.requeued({"SLURM_RESTART_COUNT": "2"})
    assert not preempt.requeued({"SLURM_RESTART_COUNT": "x"})
