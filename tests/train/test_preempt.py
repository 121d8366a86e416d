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


def test_finished_marker_round_trip_and_cleared_with_the_preemption_marker(tmp_path):
    assert preempt.read_finished(tmp_path) is None
    preempt.write_finished(tmp_path, step=30)
    preempt.write_marker(tmp_path, step=7, checkpoint=None)
    assert preempt.read_finished(tmp_path)["step"] == 30
    preempt.clear_marker(tmp_path)
    assert preempt.read_finished(tmp_path) is None and preempt.read_marker(tmp_path) is None


def test_a_run_that_finished_before_torchrun_exited_on_a_late_signal_is_a_finished_run(tmp_path, capsys):
    # torchrun raises on a handled signal (exit 1) even when the ranks had already finished the last step.
    from genconf.run.launch import report_end

    since = preempt.time.time() - 1
    preempt.write_finished(tmp_path, step=30)
    assert report_end(tmp_path, 1, since=since, resume_hint="genconf launch X --resume") == 0
    assert "run finished" in capsys.readouterr().out
    # An older launch's marker does not count.
    assert preempt.read_finished(tmp_path)["time"] >= since


def test_requeued():
    assert not preempt.requeued({})
    assert not preempt.requeued({"SLURM_RESTART_COUNT": "0"})
    assert preempt.requeued({"SLURM_RESTART_COUNT": "2"})
    assert not preempt.requeued({"SLURM_RESTART_COUNT": "x"})
