"""The hang watchdog (issue 15 "hangs caught"): a rank without progress dumps its stacks into the run
directory and exits with a recognisable code; a GIL-holding hang is caught by faulthandler's C timer; a rank
terminated by torchrun dumps where it waited; the launcher's line names the ranks and the places."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from genconf.train import watchdog as wd


def test_timeout_is_the_floor_or_ten_step_times():
    w = wd.Watchdog("/nonexistent", 0, predicted_step_s=12.0, exit=False)
    assert w.timeout_s == 300.0  # 10 x 12 s = 120 s < the 5-minute floor
    w = wd.Watchdog("/nonexistent", 0, predicted_step_s=40.0, exit=False)
    assert w.timeout_s == 400.0
    clock = iter([0.0, 0.0, 100.0, 190.0]).__next__  # construction, beat(0), beat(1) after 100 s, beat(3) 90 s later
    w = wd.Watchdog("/nonexistent", 0, predicted_step_s=1.0, exit=False, clock=clock)
    w.beat(0)
    w.beat(1)
    assert w.slowest_step_s == 100.0 and w.timeout_s == 1000.0
    w.beat(3)  # 45 s per step: the slowest stays 100 s
    assert w.slowest_step_s == 100.0
    assert wd.Watchdog.from_env("/x", 0, environ={"GENCONF_WATCHDOG": "0"}) is None
    tuned = wd.Watchdog.from_env("/x", 3, environ={"GENCONF_WATCHDOG_FLOOR_S": "2", "GENCONF_WATCHDOG_FACTOR": "4"},
                                 predicted_step_s=1.0)
    assert (tuned.timeout_s, tuned.path.name) == (4.0, "rank-3.txt")


def test_no_progress_dumps_the_stacks_and_reports(tmp_path):
    fired = threading.Event()
    w = wd.Watchdog(tmp_path, 1, floor_s=0.5, poll_s=0.05, exit=False, backstop=False, on_hang=lambda _: fired.set())
    w.start()
    w.beat(0)
    w.beat(1, "waiting for the next batch")
    assert fired.wait(10), "the watchdog did not fire"
    text = (tmp_path / "stacks" / "rank-1.txt").read_text()
    assert text.startswith(f"{wd.HEADER}: rank 1, pid {os.getpid()}")
    assert "made no progress for" in text and "after step 1, waiting for the next batch" in text
    frames = wd.main_thread_frames(text)
    assert frames and frames[0][2] == "wait" and any(f[2] == "test_no_progress_dumps_the_stacks_and_reports" for f in frames)
    w.stop()
    assert (tmp_path / "stacks" / "rank-1.txt").exists()  # kept: it fired
    line = wd.summarize(tmp_path)
    assert line.startswith("training hung: rank 1 made no progress for ") and "after step 1" in line
    assert "; rank 1 in wait (" in line and line.endswith(f"stacks in {tmp_path / 'stacks'}")


def test_a_clean_run_leaves_no_stacks(tmp_path):
    w = wd.Watchdog(tmp_path, 0, floor_s=60, exit=False, backstop=False).start()
    w.beat(0)
    w.stop()
    assert not (tmp_path / "stacks").exists() and w.fired is None and wd.summarize(tmp_path) is None


RANK = textwrap.dedent("""
    import sys, time, re
    from genconf.train import watchdog as wd
    wd.BACKSTOP_GRACE_S = float(sys.argv[3])
    w = wd.Watchdog(sys.argv[1], int(sys.argv[2]), floor_s=float(sys.argv[5]), poll_s=0.1).start()
    w.beat(0)
    w.beat(1)

    def wait_forever():
        print("ready", flush=True)
        time.sleep(1000)

    def hold_the_gil():
        # exponential backtracking inside the C regex engine, which never releases the GIL
        re.match(r"(a+)+$", "a" * 64 + "b")

    {"sleep": wait_forever, "gil": hold_the_gil}[sys.argv[4]]()
""")


def run_rank(tmp_path, rank: int, grace_s: float, how: str, floor_s: float = 1.0) -> subprocess.Popen:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    return subprocess.Popen([sys.executable, str(script), str(tmp_path), str(rank), str(grace_s), how, str(floor_s)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_hung_rank_exits_with_the_hang_code(tmp_path):
    t0 = time.monotonic()
    proc = run_rank(tmp_path, 2, 60.0, "sleep")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == wd.EXIT_HANG, err
    assert time.monotonic() - t0 < 30
    assert "genconf: error: rank 2 made no progress for 1 s (timeout 1 s) after step 1, training" in err
    (r,) = wd.read_stacks(tmp_path)
    assert r.rank == 2 and r.hung and r.where.startswith("wait_forever (rank.py:")


def test_a_hang_that_holds_the_gil_is_caught_by_the_c_timer(tmp_path):
    proc = run_rank(tmp_path, 0, 1.0, "gil")
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 1, err  # faulthandler's exit
    text = (tmp_path / "stacks" / "rank-0.txt").read_text()
    assert "Timeout (0:00:02)!" in text
    (r,) = wd.read_stacks(tmp_path)
    assert r.where.startswith("match (") and any(f[2] == "hold_the_gil" for f in wd.main_thread_frames(text))
    assert r.hung == "rank 0 made no progress for 0:00:02, holding the GIL (faulthandler's timer fired)"
    assert wd.summarize(tmp_path).startswith("training hung: rank 0 made no progress for 0:00:02, holding the GIL")


def test_a_terminated_rank_says_where_it_waited(tmp_path):
    proc = run_rank(tmp_path, 1, 60.0, "sleep", floor_s=600)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGTERM
    (r,) = wd.read_stacks(tmp_path)
    assert r.hung is None and r.where.startswith("wait_forever (rank.py:")
    assert wd.summarize(tmp_path) is None  # terminated, not hung


def test_summary_names_every_rank(tmp_path):
    """What the launcher prints after rank 1 hung and torchrun terminated rank 0."""
    hung = run_rank(tmp_path, 1, 60.0, "sleep")
    other = run_rank(tmp_path, 0, 60.0, "sleep", floor_s=600)
    assert other.stdout.readline().strip() == "ready"
    hung.communicate(timeout=60)
    other.send_signal(signal.SIGTERM)
    other.communicate(timeout=30)
    line = wd.summarize(tmp_path, since=time.time() - 120)
    assert line.startswith("training hung: rank 1 made no progress for 1 s (timeout 1 s) after step 1, training; ")
    assert "rank 0 in wait_forever (rank.py:" in line and "rank 1 in wait_forever (rank.py:" in line
    assert wd.summarize(tmp_path, since=time.time() + 60) is None  # stacks of an earlier launch are not this one's
