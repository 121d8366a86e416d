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


def test_the_launch_finds_the_ranks_torchrun_started_and_nothing_else(tmp_path):
    """genconf launch sends SIGUSR1 to the ranks themselves (not through torchrun, whose handler can turn it into
    a SIGTERM: genconf.run.launch.launch_local): a real parent with two children running the entry point and one
    running something else, as torchrun's tree is."""
    import subprocess
    import sys
    import time

    from genconf.run.launch import rank_pids

    entry = tmp_path / "train_fsdp.py"
    entry.write_text("import time\ntime.sleep(60)\n")
    parent = tmp_path / "agent.py"
    parent.write_text(
        "import subprocess, sys, time\n"
        f"ranks = [subprocess.Popen([sys.executable, '-u', {str(entry)!r}, '--run-dir', 'x']) for _ in range(2)]\n"
        "other = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(' '.join(str(p.pid) for p in ranks), other.pid, flush=True)\n"
        "time.sleep(60)\n")
    agent = subprocess.Popen([sys.executable, str(parent)], stdout=subprocess.PIPE, text=True)
    children = [int(pid) for pid in agent.stdout.readline().split()]
    try:
        expected = sorted(children[:2])
        deadline = time.monotonic() + 30
        while rank_pids(agent.pid, str(entry)) != expected and time.monotonic() < deadline:
            time.sleep(0.05)  # the children's command lines appear once they have exec'd
        assert len(expected) == 2 and rank_pids(agent.pid, str(entry)) == expected
        assert rank_pids(os.getpid(), str(entry)) == []  # grandchildren are not this process's ranks
        assert rank_pids(agent.pid, str(tmp_path / "train_megatron.py")) == []
    finally:
        for pid in children:
            os.kill(pid, signal.SIGKILL)
        agent.kill()
        agent.wait()
