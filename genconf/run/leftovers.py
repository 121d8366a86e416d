"""Leftovers of killed writes (issue 15 item 7): `-o DIR` renders into `.DIR.tmp-*` beside DIR and, with
--force, renames the old DIR to `.DIR.old-*`; a SIGKILL in between leaves them behind. The next write to
the same parent removes those older than the current process, or names them in one line when they hold
data that is not regenerable (a runs/ directory with logs or checkpoints, caught mid-move by the kill).
"""

from __future__ import annotations

import os
import shutil
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


def process_start_time() -> float:
    """When this process started (time.time() scale): its start in clock ticks since boot (/proc/self/stat) against
    the uptime (/proc/uptime, 10 ms; /proc/stat's btime is whole seconds, too coarse here); now elsewhere."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()


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
    """Remove target's leftovers older than started_at (default: this process's start), keep and name
    those that hold data. Younger ones may be another genconf's write in progress and are not touched."""
    started_at = process_start_time() if started_at is None else started_at
    removed, kept = [], []
    for path in leftovers(target):
        try:
            if path.stat().st_mtime >= started_at:
                continue
            if _holds_data(path):
                kept.append(path)
                continue
            shutil.rmtree(path)
            removed.append(path)
        except OSError:
            continue  # vanished meanwhile, or not ours to remove: left as it is
    return Cleaned(tuple(removed), tuple(kept))
