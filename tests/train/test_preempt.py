"""The preemption flag and marker (issue 15 "preemption and requeue"): SIGUSR1 becomes a flag the loop reads
at a step boundary; the marker says where the run stopped; a requeued job is recognised from Slurm's count."""

from __future__ import annotations

import pytest

import contextlib
import os
import signal
import time

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


def _interrupted(*, presses: int = 0, terminated: bool = False):
    from genconf.run.rank_signal import Interrupts

    interrupts = Interrupts()
    interrupts.presses, interrupts.terminated = presses, terminated
    return interrupts


def test_a_stopped_run_names_its_checkpoint_a_rank_s_failure_wins_and_sigterm_exits_143(tmp_path, capsys):
    """report_end after Ctrl-C or SIGTERM: the preemption checkpoint the ranks wrote is named even when a second
    Ctrl-C came after it; a rank that failed while stopping (a full disk) is the error, not hidden behind the stop;
    SIGTERM exits 143 (128 + 15), Ctrl-C 130."""
    from genconf.plan.errors import GenconfError
    from genconf.run.launch import report_end
    from genconf.train import failure

    since = preempt.time.time() - 1
    hint = "genconf launch X --resume"
    preempt.write_marker(tmp_path, step=7, checkpoint="step_0000007")
    assert report_end(tmp_path, 0, since=since, resume_hint=hint, interrupts=_interrupted(presses=2)) == 130
    assert "genconf: stopped (Ctrl-C) after step 7 (checkpoint step_0000007; continue with: genconf launch X --resume)" \
        in capsys.readouterr().out
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    assert report_end(stopped, -15, since=since, resume_hint=hint, interrupts=_interrupted(terminated=True)) == 143
    assert "genconf: stopped (SIGTERM) before the end of a step (no checkpoint to resume from)" in capsys.readouterr().out
    failure.record_line(stopped, 1, "rank 1 failed saving the checkpoint: the disk is full")
    with pytest.raises(GenconfError, match="training failed while stopping: .*the disk is full"):
        report_end(stopped, 1, since=since, resume_hint=hint, interrupts=_interrupted(presses=1))


def test_requeued():
    assert not preempt.requeued({})
    assert not preempt.requeued({"SLURM_RESTART_COUNT": "0"})
    assert preempt.requeued({"SLURM_RESTART_COUNT": "2"})
    assert not preempt.requeued({"SLURM_RESTART_COUNT": "x"})


AGENT = """import subprocess, sys
ranks = [subprocess.Popen([sys.executable, '-u', sys.argv[1], str(i)]) for i in range(2)]
other = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(20)'])
print(' '.join(str(p.pid) for p in ranks), other.pid, flush=True)
codes = [p.wait() for p in ranks]
other.kill()
sys.exit(max(codes))
"""
"""A stand-in for torchrun: two ranks running the entry point and one other child. It handles no signal: had it not
inherited SIGUSR1 ignored, the notice would kill it."""

RANK = """import os, signal, sys, time
time.sleep(1.0 + float(sys.argv[1]))  # still starting (torch importing) when the notice comes: it must be held
got = []
signal.signal(signal.SIGUSR1, lambda *a: got.append(time.time()))
deadline = time.time() + 20
while not got and time.time() < deadline:
    time.sleep(0.01)
time.sleep(0.3)  # a second delivery would land here
open(os.path.join(os.path.dirname(sys.argv[0]), 'got' + sys.argv[1]), 'w').write(str(len(got)))
"""


class ReachedTheTest(Exception):
    """A signal meant for the code under test reached the test's own handler instead."""


def _reached(signum, _frame):
    raise ReachedTheTest(signal.Signals(signum).name)


@contextlib.contextmanager
def signalled_at(delay_s: float, send, *signums: int):
    """`send()` on a timer, with this process's own handlers for `signums` raising ReachedTheTest meanwhile: a
    signal that the code under test does not handle while it runs fails the test instead of ending pytest."""
    import threading

    saved = {s: signal.signal(s, _reached) for s in signums}
    timer = threading.Timer(delay_s, send)
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        for s, handler in saved.items():
            signal.signal(s, handler)


def test_the_notice_reaches_every_rank_once_held_until_it_catches_it_and_not_torchrun(tmp_path):
    """genconf launch and the sbatch script pass SIGUSR1 to the ranks themselves (genconf.run.rank_signal): a
    real process tree, signalled before its ranks install their handlers."""
    import subprocess
    import sys

    from genconf.run import rank_signal

    entry = tmp_path / "train_fsdp.py"
    entry.write_text(RANK)
    agent = tmp_path / "agent.py"
    agent.write_text(AGENT)

    def notice() -> None:
        # As Slurm signals a job step: every process, here the launch and the stand-in torchrun (its ranks ignore it
        # until they install their handler).
        for pid in [os.getpid(), *rank_signal.rank_pids(os.getpid(), str(entry))]:
            os.kill(pid, signal.SIGUSR1)

    with signalled_at(0.5, notice, signal.SIGUSR1):
        rc = rank_signal.run([sys.executable, str(agent), str(entry)], str(entry), stdout=subprocess.DEVNULL)
        assert signal.getsignal(signal.SIGUSR1) is _reached  # restored
    assert rc == 0  # the stand-in torchrun ignored the notice and its ranks ended normally
    assert [(tmp_path / f"got{i}").read_text() for i in range(2)] == ["1", "1"]  # once each, not lost


def test_the_sbatch_wrapper_outlives_slurms_sigterm_until_torchrun_has_ended(tmp_path):
    """Slurm's SIGTERM (scancel, the time limit) reaches the wrapper and torchrun alike; the wrapper waits for
    torchrun to end its ranks, since the step is killed once its task exits."""
    import sys

    from genconf.run import rank_signal

    torchrun = tmp_path / "torchrun.py"
    torchrun.write_text("import signal, sys, time\n"
                        "signal.signal(signal.SIGTERM, lambda *a: (time.sleep(1.0), sys.exit(3)))\n"
                        "time.sleep(20)\n")

    def term() -> None:
        for pid in [os.getpid(), *rank_signal.rank_pids(os.getpid(), str(torchrun))]:
            os.kill(pid, signal.SIGTERM)

    start = time.monotonic()
    with signalled_at(1.5, term, signal.SIGTERM):
        rc = rank_signal.main([str(torchrun), "--", sys.executable, str(torchrun)])
    assert rc == 3 and time.monotonic() - start < 15  # torchrun's own exit code, after its shutdown
    assert rank_signal.main(["x.py", "python"]) == 2  # usage


def test_the_ranks_are_the_children_running_the_entry_point(tmp_path):
    import subprocess
    import sys

    from genconf.run.rank_signal import catches, rank_pids

    entry = tmp_path / "train_fsdp.py"
    entry.write_text("import time\ntime.sleep(20)\n")
    agent = tmp_path / "agent.py"
    agent.write_text(AGENT)
    proc = subprocess.Popen([sys.executable, str(agent), str(entry)], stdout=subprocess.PIPE, text=True)
    children = [int(pid) for pid in proc.stdout.readline().split()]
    try:
        expected = sorted(children[:2])
        deadline = time.monotonic() + 30
        while rank_pids(proc.pid, str(entry)) != expected and time.monotonic() < deadline:
            time.sleep(0.05)  # a child's command line is the entry point's once it has exec'd
        assert len(expected) == 2 and rank_pids(proc.pid, str(entry)) == expected
        # One level only: from here, the stand-in torchrun (its command line names the entry point, as torchrun's
        # does), not its ranks.
        assert rank_pids(os.getpid(), str(entry)) == [proc.pid]
        assert rank_pids(proc.pid, str(tmp_path / "train_megatron.py")) == []
        assert not catches(expected[0], signal.SIGUSR1)
        # A handler of this process's own: Python installs its KeyboardInterrupt handler only where SIGINT was not
        # ignored at start-up, and a shell's background job (`cmd &` without job control) starts with it ignored.
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            assert catches(os.getpid(), signal.SIGINT)
        finally:
            signal.signal(signal.SIGINT, previous)
    finally:
        for pid in children[::-1]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()
