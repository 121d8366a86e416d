"""Leftovers of killed `-o` writes (issue 15 item 7): removed by the next write to the same parent when
older than the current process; named, not deleted, when they hold run data; young ones left alone."""

from __future__ import annotations

import os
import time

from genconf.run import leftovers


def aged(path, seconds_ago: float):
    t = time.time() - seconds_ago
    os.utime(path, (t, t))
    return path


def test_process_start_time_is_before_now():
    start = leftovers.process_start_time()
    assert time.time() - 3600 * 24 < start <= time.time()


def test_old_leftovers_are_removed_young_ones_and_others_kept(tmp_path):
    target = tmp_path / "run1"
    tmp = tmp_path / ".run1.tmp-abc123"
    tmp.mkdir()
    (tmp / "plan.json").write_text("{}")
    (tmp / "runs" / "logs").mkdir(parents=True)  # the empty skeleton the writer creates
    old = tmp_path / ".run1.old-xyz"
    old.mkdir()
    (old / "plan.json").write_text("{}")
    young = tmp_path / ".run1.tmp-new"
    young.mkdir()
    other = tmp_path / ".run2.tmp-abc"
    other.mkdir()
    for p in (tmp, old, other):
        aged(p, 60)
    done = leftovers.clean(target, started_at=time.time() - 10)
    assert done.removed == (old, tmp) and done.kept == () and done.note() is None
    assert young.exists() and other.exists() and not tmp.exists() and not old.exists()


def test_a_leftover_holding_run_data_is_named_not_deleted(tmp_path):
    moved = tmp_path / ".run1.old-q1"
    (moved / "runs" / "r1" / "checkpoints").mkdir(parents=True)
    (moved / "runs" / "r1" / "metrics.jsonl").write_text("{}\n")
    aged(moved, 60)
    done = leftovers.clean(tmp_path / "run1", started_at=time.time())
    assert done.removed == () and done.kept == (moved,) and moved.exists()
    assert done.note() == (f"an interrupted write left {moved} holding run data (logs or checkpoints): move what you "
                           f"need back into place, then delete it")


def test_a_dead_writers_leftover_is_stale_at_once_a_live_writers_is_not(tmp_path):
    """Tagged names (`.NAME.tmp-<host>.<pid>-*`) are judged by their writer, not by clocks: a leftover written a
    millisecond before this process started, by a process that is gone, is removed (CI saw the clock rule miss
    one); this process's own, and a live process's, are left alone."""
    import subprocess
    import sys

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        host = leftovers.writer_tag().split(".")[0]
        dead = tmp_path / f".run1.tmp-{host}.{dead_pid}-a1"
        mine = tmp_path / f".run1.tmp-{leftovers.writer_tag()}-b2"
        theirs = tmp_path / f".run1.old-{host}.{live.pid}-c3"
        for p in (dead, mine, theirs):
            p.mkdir()
            (p / "plan.json").write_text("{}")
        done = leftovers.clean(tmp_path / "run1", started_at=time.time() - 60)  # all younger than "this process"
        assert done.removed == (dead,) and not dead.exists() and mine.exists() and theirs.exists()
        aged(theirs, 3600)  # the live pid started after its last write: a reused pid, not the writer
        assert leftovers.clean(tmp_path / "run1").removed == (theirs,)
    finally:
        live.kill()
        live.wait()


def test_another_hosts_leftover_is_removed_by_age_only(tmp_path):
    """A shared filesystem: another host's pid means nothing here; its leftover goes once it is 10 minutes old."""
    other = tmp_path / ".run1.tmp-zzzzzz.1-x"  # not a hex host id: treated as untagged
    host = "000000" if not leftovers.writer_tag().startswith("000000") else "ffffff"
    foreign = tmp_path / f".run1.tmp-{host}.1-y"
    for p in (other, foreign):
        p.mkdir()
    aged(other, 60)
    aged(foreign, 60)
    assert leftovers.clean(tmp_path / "run1", started_at=time.time()).removed == (other,)
    aged(foreign, leftovers.OTHER_HOST_AGE_S + 60)
    assert leftovers.clean(tmp_path / "run1").removed == (foreign,)


def test_nothing_there(tmp_path):
    assert leftovers.clean(tmp_path / "missing" / "run1").removed == ()


KILL_MID_WRITE = """
import os, signal, sys
import genconf.check.directory as directory

def killed(*args, **kwargs):  # the files are in .NAME.tmp-*, the check has not run, nothing is renamed yet
    os.kill(os.getpid(), signal.SIGKILL)

directory.check_dir = killed
from genconf.cli.main import main
main(sys.argv[1:])
"""


def test_a_sigkill_during_o_leaves_a_tmp_dir_that_the_next_write_removes(tmp_path):
    """Issue 15 item 7: 21 of 110 SIGKILLs during -o left .NAME.tmp-* behind for good."""
    import subprocess
    import sys

    target = tmp_path / "run1"
    args = ["--model", "1b", "--gpus", "8", "-o", str(target)]
    killed = subprocess.run([sys.executable, "-c", KILL_MID_WRITE, *args], capture_output=True, text=True)
    assert killed.returncode == -9
    (left,) = [p for p in tmp_path.iterdir()]
    assert left.name.startswith(f".run1.tmp-{leftovers.writer_tag().split('.')[0]}.") and (left / "plan.json").is_file() and not target.exists()
    again = subprocess.run([sys.executable, "-m", "genconf", *args], capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run1"]
