"""Leftovers of killed writes (issue 15 item 7): `-o DIR` renders into `.DIR.tmp-*` beside DIR and, with
--force, renames the old DIR to `.DIR.old-*`; a SIGKILL in between leaves them behind. The next write to
the same parent removes them, or names them in one line when they hold data that is not regenerable (a runs/
directory with logs or checkpoints, caught mid-move by the kill).

Which ones are stale: each name carries its writer (`.NAME.tmp-<host>.<pid>-*`, see `writer_tag`); one whose
writer is this host and whose process is gone (or is a newer process that reused the pid) is stale at once.
Clock times alone are not enough: a directory's mtime and a process's start are both kept to a few ms, and
the next write can start within that of the kill (CI saw `.run1.tmp-*` survive that way). Names without a
writer (older genconf) or from another host (a shared filesystem) fall back to their age.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Cleaned:
    removed: tuple[Path, ...]
    kept: tuple[Path, ...]
    """Leftovers that hold data (files inside sub-directories): never deleted, named instead."""

    def note(self) -> str | None:
        """One line about the kept ones, or None."""
        if not self.kept:
            return None
        names = ", ".join(str(p) for p in self.kept)
        return (f"an interrupted write left {names} holding run data (logs or checkpoints): move what you need "
                f"back into place, then delete it")


def _proc_start_time(proc: str) -> float:
    """When /proc/<proc> started (time.time() scale): its start in clock ticks since boot against the uptime
    (/proc/uptime, 10 ms; /proc/stat's btime is whole seconds, too coarse here). OSError when unreadable."""
    try:
        fields = Path(f"/proc/{proc}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (ValueError, IndexError) as exc:
        raise OSError(f"/proc/{proc}/stat: {exc}") from None
    if fields[0] in ("Z", "X"):
        raise ProcessLookupError(f"process {proc} has exited")  # a zombie not yet reaped writes nothing
    return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")


def process_start_time() -> float:
    """When this process started (time.time() scale); now where /proc cannot tell."""
    try:
        return _proc_start_time("self")
    except OSError:
        return time.time()


OTHER_HOST_AGE_S = 600.0
"""A leftover written by another host is removed once it is this old (no write takes 10 minutes)."""

CLOCK_SLACK_S = 1.0
"""Margin on mtime-against-start comparisons: both clocks are coarse (jiffies, /proc/uptime's 10 ms)."""


def _host_id() -> str:
    """Six hex digits of this host's name: a name-safe tag (host names hold dots and dashes)."""
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:6]


def writer_tag() -> str:
    """`<host>.<pid>`: what the atomic writer puts after `.tmp-` / `.old-` so a later write can tell a dead
    writer's leftover from a live one's."""
    return f"{_host_id()}.{os.getpid()}"


_TAGGED = re.compile(r"\.(?:tmp|old)-([0-9a-f]{6})\.(\d+)-")
"""What follows `.NAME` in a tagged leftover's name."""


def _pid_start_time(pid: int) -> float | None:
    """When process pid started (time.time() scale); None when it does not exist; -inf when it exists but /proc
    cannot tell (then it counts as the writer)."""
    try:
        return _proc_start_time(str(pid))
    except ProcessLookupError:
        return None
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except OSError:
            pass
        return float("-inf")


def _stale(path: Path, target_name: str, mtime: float, started_at: float) -> bool:
    """Whether leftover `path` (of target `target_name`) belongs to no write in progress."""
    match = _TAGGED.match(path.name, len(target_name) + 1)
    if match is None:
        return mtime < started_at - CLOCK_SLACK_S  # an untagged name: older than this process, with a margin
    host, pid = match.group(1), int(match.group(2))
    if host != _host_id():
        return mtime < time.time() - OTHER_HOST_AGE_S
    if pid == os.getpid():
        return False
    writer_start = _pid_start_time(pid)
    # gone, or a newer process that reused the pid (it started after the directory was last written)
    return writer_start is None or writer_start > mtime + CLOCK_SLACK_S


def leftovers(target: Path) -> list[Path]:
    """`.NAME.tmp-*` and `.NAME.old-*` directories beside target (what genconf's atomic writer makes)."""
    target = Path(target)
    parent = target.parent
    if not parent.is_dir():
        return []
    prefixes = (f".{target.name}.tmp-", f".{target.name}.old-")
    return sorted(p for p in parent.iterdir() if p.name.startswith(prefixes) and p.is_dir() and not p.is_symlink())


def _holds_data(path: Path) -> bool:
    """A sub-directory with a file in it: a runs/ tree moved by --force, not a rendered artifact."""
    for child in path.iterdir():
        if child.is_dir() and not child.is_symlink():
            if any(f.is_file() or f.is_symlink() for f in child.rglob("*")):
                return True
    return False


def clean(target: Path, *, started_at: float | None = None) -> Cleaned:
    """Remove target's stale leftovers (`_stale`: their writer is gone; untagged ones older than started_at,
    default this process's start), keep and name those that hold data. A live writer's are not touched."""
    started_at = process_start_time() if started_at is None else started_at
    removed, kept = [], []
    for path in leftovers(target):
        try:
            if not _stale(path, Path(target).name, path.stat().st_mtime, started_at):
                continue
            if _holds_data(path):
                kept.append(path)
                continue
            shutil.rmtree(path)
            removed.append(path)
        except OSError:
            continue  # vanished meanwhile, or not ours to remove: left as it is
    return Cleaned(tuple(removed), tuple(kept))
