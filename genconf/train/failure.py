"""Why a rank died, in one line the launcher can print (issue 15 item 8: on a GPU the checkpoints filled the
disk and the run ended with only "exited with code 1").

Every rank that raises writes RUN/errors/rank-N.txt: what it was doing and the cause, with the causes people
act on named as such (the disk is full, out of GPU or host memory). The launcher reads the files written
during its launch (`summarize`) and ends with one line. Standard library only.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

ERRORS = "errors"
LOW_DISK_BYTES = 256 << 20
"""A write that failed with this little free space left is a full disk, whatever the library's message."""


def _free_bytes(path: Path) -> int | None:
    for p in (path, *path.parents):
        if p.exists():
            try:
                return shutil.disk_usage(p).free
            except OSError:
                return None
    return None


def cause(exc: BaseException, run_dir: Path) -> str:
    """The cause of a failure in words: 'the disk is full (...)', 'out of GPU memory (...)', or the exception."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    free = _free_bytes(Path(run_dir))
    where = f"{free / 2**20:,.0f} MiB free under {run_dir}" if free is not None else f"under {run_dir}"
    # torch.save reports a full disk as RuntimeError "... PytorchStreamWriter failed writing file ...: file write
    # failed", without the errno: a failed write with almost no space left is the same cause.
    if (isinstance(exc, OSError) and exc.errno == errno.ENOSPC) or "No space left on device" in text or (
            "write failed" in text and free is not None and free < LOW_DISK_BYTES):
        name = f" writing {exc.filename}" if isinstance(exc, OSError) and exc.filename else ""
        return f"the disk is full{name} ({where})"
    if type(exc).__name__ == "OutOfMemoryError" or "CUDA out of memory" in text:
        return f"out of GPU memory ({text[:160]})"
    if isinstance(exc, MemoryError):
        return "out of host memory (MemoryError)"
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


def record(run_dir: Path, rank: int, activity: str, exc: BaseException) -> str:
    """Write RUN/errors/rank-N.txt and return its line ('rank 0 failed while saving checkpoint step 20: ...')."""
    line = f"rank {rank} failed {activity}: {cause(exc, run_dir)}"
    record_line(run_dir, rank, line)
    return line


def record_line(run_dir: Path, rank: int, line: str) -> None:
    """Write RUN/errors/rank-N.txt with a line that already says what went wrong (a refused save)."""
    try:
        path = Path(run_dir) / ERRORS / f"rank-{rank}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(line + "\n")
    except OSError:
        pass  # the disk may be the cause: the line still goes to stderr


def summarize(run_dir: Path, *, since: float = 0.0) -> str | None:
    """The failures recorded since `since` (time.time()), the earliest first, in one line; None when none."""
    root = Path(run_dir) / ERRORS
    lines = []
    if root.is_dir():
        found = []
        for path in root.glob("rank-*.txt"):
            try:
                mtime = path.stat().st_mtime
                if mtime >= since:
                    found.append((mtime, path.read_text().strip()))
            except OSError:
                continue
        # The first failure in time is the cause; the others are usually its consequences (a peer gone).
        lines = [line for _, line in sorted(found)]
    if not lines:
        return None
    first = lines[0]
    return first if len(lines) == 1 else f"{first} (and {len(lines) - 1} more rank(s): {root})"


def clear(run_dir: Path) -> None:
    """Forget the failures of earlier launches of this run directory."""
    root = Path(run_dir) / ERRORS
    if root.is_dir():
        for path in root.glob("rank-*.txt"):
            path.unlink(missing_ok=True)

