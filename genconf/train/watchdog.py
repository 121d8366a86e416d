"""Hangs caught: a watchdog per rank, fed a heartbeat every step. A rank that makes no progress for several
times the step time (and at least a few minutes) writes every thread's Python stack to RUN/stacks/rank-N.txt
and exits with EXIT_HANG; the launcher then names the ranks and where they waited (`summarize`).

Two timers, because a hang can hold the GIL (a C call that never returns without releasing it):
- a Python daemon thread checks the deadline every second, writes why it fired, dumps the stacks
  (faulthandler.dump_traceback) and exits with EXIT_HANG;
- faulthandler.dump_traceback_later, re-armed on every heartbeat a grace period later, is CPython's C-level
  watchdog thread: it needs no GIL, dumps the stacks into the same file and exits (code 1).
And SIGTERM dumps the stacks before the process ends (faulthandler.register, chained to the previous
handler): when one rank gives up, torchrun terminates the others, and their stacks show where they waited.

Standard library only (no torch).
"""

from __future__ import annotations

import faulthandler
import os
import re
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

EXIT_HANG = 75
"""A rank's exit status when its watchdog fired (EX_TEMPFAIL in sysexits.h: a hang that may not recur)."""
STACKS = "stacks"
DEFAULT_FLOOR_S = 300.0
"""Never fire before this long without progress: collectives, data loading and saves stall for minutes."""
DEFAULT_FACTOR = 10.0
"""Fire after this many step times without progress (the predicted step, or the slowest one measured)."""
FIRST_STEP_FACTOR = 3.0
"""The first step (kernel selection, allocation, compilation) gets this many timeouts."""
BACKSTOP_GRACE_S = 60.0
HEADER = "# genconf watchdog"
HUNG = "# genconf watchdog fired:"


def stacks_file(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / STACKS / f"rank-{rank}.txt"


class Watchdog:
    """One rank's hang detector. start() before the loop, beat(step) after every step (and around saves),
    stop() at the end. With exit=False (tests) it calls on_hang(reason) instead of ending the process."""

    def __init__(self, run_dir: Path, rank: int, *, predicted_step_s: float | None = None,
                 factor: float = DEFAULT_FACTOR, floor_s: float = DEFAULT_FLOOR_S, poll_s: float = 1.0,
                 exit: bool = True, backstop: bool = True, on_hang=None, clock=time.monotonic) -> None:
        if floor_s <= 0 or factor <= 0:
            raise ValueError(f"watchdog floor_s ({floor_s}) and factor ({factor}) must be positive")
        self.path = stacks_file(run_dir, rank)
        self.rank = rank
        self.predicted_step_s = predicted_step_s or 0.0
        self.factor, self.floor_s, self.poll_s = factor, floor_s, poll_s
        self.exit, self.backstop, self.on_hang, self.clock = exit, backstop, on_hang, clock
        self.step: int | None = None
        self.activity = "starting"
        self.slowest_step_s = 0.0
        self.fired: str | None = None
        self._last = clock()
        self._deadline = self._last + FIRST_STEP_FACTOR * self.timeout_s
        self._fd: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls, run_dir: Path, rank: int, *, predicted_step_s: float | None = None,
                 environ=os.environ) -> "Watchdog | None":
        """GENCONF_WATCHDOG=0 turns it off; GENCONF_WATCHDOG_FLOOR_S and GENCONF_WATCHDOG_FACTOR tune it."""
        if environ.get("GENCONF_WATCHDOG", "1") == "0":
            return None
        return cls(run_dir, rank, predicted_step_s=predicted_step_s,
                   floor_s=float(environ.get("GENCONF_WATCHDOG_FLOOR_S", DEFAULT_FLOOR_S)),
                   factor=float(environ.get("GENCONF_WATCHDOG_FACTOR", DEFAULT_FACTOR)))

    @property
    def timeout_s(self) -> float:
        """Seconds without progress before it fires: the floor, or factor x the longest step."""
        return max(self.floor_s, self.factor * max(self.predicted_step_s, self.slowest_step_s))

    def start(self) -> "Watchdog":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        main = threading.main_thread().ident or 0
        os.write(self._fd, (f"{HEADER}: rank {self.rank}, pid {os.getpid()}, host {socket.gethostname()}, "
                            f"main thread 0x{main:016x}\n").encode())
        if self.exit:  # only in a rank process: these are process-wide
            try:
                faulthandler.register(signal.SIGTERM, file=self._fd, all_threads=True, chain=True)
            except (RuntimeError, ValueError, OSError):
                pass
        self._arm(self._deadline - self.clock())
        self._thread = threading.Thread(target=self._watch, name=f"genconf-watchdog-{self.rank}", daemon=True)
        self._thread.start()
        return self

    def beat(self, step: int | None = None, activity: str = "training", *, allow_s: float | None = None) -> None:
        """Progress: step `step` is done and `activity` comes next; allow_s grants a known long operation (a
        checkpoint save) more than the usual timeout."""
        now = self.clock()
        with self._lock:
            if step is not None and self.step is not None and step > self.step:
                self.slowest_step_s = max(self.slowest_step_s, (now - self._last) / (step - self.step))
            if step is not None:
                self.step = step
            self.activity = activity
            self._last = now
            wait = max(self.timeout_s, allow_s or 0.0)
            self._deadline = now + wait
        self._arm(wait)

    def stop(self) -> None:
        """The run ended normally: disarm, and remove the stacks file (it holds only its header)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.backstop and self.exit:
            faulthandler.cancel_dump_traceback_later()
        if self.exit:
            try:
                faulthandler.unregister(signal.SIGTERM)
            except (RuntimeError, ValueError):
                pass
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            if self.fired is None:
                self.path.unlink(missing_ok=True)
                try:
                    self.path.parent.rmdir()
                except OSError:
                    pass

    def _arm(self, wait_s: float) -> None:
        if self.backstop and self.exit and self._fd is not None:
            faulthandler.dump_traceback_later(wait_s + BACKSTOP_GRACE_S, exit=True, file=self._fd)

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            with self._lock:
                now = self.clock()
                if now < self._deadline:
                    continue
                idle = now - self._last
                after = f"after step {self.step}" if self.step is not None else "before the first step"
                reason = (f"rank {self.rank} made no progress for {idle:.0f} s (timeout {self.timeout_s:.0f} s) "
                          f"{after}, {self.activity}")
            self._fire(reason)
            return

    def _fire(self, reason: str) -> None:
        self.fired = reason
        if self._fd is not None:
            os.write(self._fd, f"{HUNG} {reason}\n".encode())
            faulthandler.dump_traceback(file=self._fd, all_threads=True)
            os.fsync(self._fd)
        print(f"genconf: error: {reason}: stacks in {self.path}; exiting with {EXIT_HANG}", file=sys.stderr, flush=True)
        if self.exit:
            os._exit(EXIT_HANG)
        if self.on_hang is not None:
            self.on_hang(reason)


# --- reading the stacks (the launcher) ---------------------------------------------------------------

_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-f]+)")
_TIMEOUT = re.compile(r"^Timeout \((\d+:\d\d:\d\d(?:\.\d+)?)\)!", re.M)
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


@dataclass(frozen=True, slots=True)
class RankStacks:
    rank: int
    path: Path
    hung: str | None
    """The watchdog's reason when it fired on this rank, None when the stacks came from SIGTERM."""
    where: str
    """Where the main thread was: its innermost frame, and the innermost genconf frame that led there."""


def main_thread_frames(text: str) -> list[tuple[str, int, str]]:
    """(file, line, function) of the main thread's last dump, innermost first."""
    m = re.search(r"main thread (0x[0-9a-f]+)", text)
    main = int(m.group(1), 16) if m else None
    blocks: list[tuple[int, list]] = []
    for line in text.splitlines():
        t = _THREAD.match(line)
        if t:
            blocks.append((int(t.group(1), 16), []))
            continue
        f = _FRAME.match(line)
        if f and blocks:
            blocks[-1][1].append((f["file"], int(f["line"]), f["func"]))
    ours = [frames for ident, frames in blocks if ident == main] or [frames for _, frames in blocks[-1:]]
    return ours[-1] if ours else []


def _short(file: str) -> str:
    parts = Path(file).parts
    for anchor in ("genconf", "launchers", "torch", "deepspeed", "megatron"):
        if anchor in parts:
            return "/".join(parts[len(parts) - 1 - parts[::-1].index(anchor):])
    return Path(file).name


def where(frames: list[tuple[str, int, str]]) -> str:
    if not frames:
        return "no Python stack"
    file, line, func = frames[0]
    text = f"{func} ({_short(file)}:{line})"
    ours = next(((f, n, fn) for f, n, fn in frames[1:] if "genconf" in Path(f).parts or "launchers" in Path(f).parts),
                None)
    if ours is not None and ours != frames[0]:
        text += f" from {ours[2]} ({_short(ours[0])}:{ours[1]})"
    return text


def read_stacks(run_dir: Path, *, since: float = 0.0) -> list[RankStacks]:
    """The stacks files written since `since` (a time.time()) that hold a dump, by rank."""
    out = []
    root = Path(run_dir) / STACKS
    if not root.is_dir():
        return out
    for path in root.glob("rank-*.txt"):
        try:
            if path.stat().st_mtime < since:
                continue
            text = path.read_text(errors="replace")
            rank = int(path.stem.split("-", 1)[1])
        except (OSError, ValueError):
            continue
        frames = main_thread_frames(text)
        hung = next((line[len(HUNG):].strip() for line in text.splitlines() if line.startswith(HUNG)), None)
        backstop = _TIMEOUT.search(text)
        if hung is None and backstop:  # faulthandler's C timer: the Python watchdog could not get the GIL
            hung = f"rank {rank} made no progress for {backstop.group(1)}, holding the GIL (faulthandler's timer fired)"
        if frames or hung:
            out.append(RankStacks(rank, path, hung, where(frames)))
    return sorted(out, key=lambda r: r.rank)


def summarize(run_dir: Path, *, since: float = 0.0) -> str | None:
    """One line when a watchdog fired in this run: which ranks hung and where every rank waited."""
    ranks = read_stacks(run_dir, since=since)
    hung = [r for r in ranks if r.hung]
    if not hung:
        return None
    detail = hung[0].hung.split("made no progress ", 1)[-1]
    lead = f"training hung: {', '.join(f'rank {r.rank}' for r in hung)} made no progress {detail}"
    places = "; ".join(f"rank {r.rank} in {r.where}" for r in ranks)
    return f"{lead}; {places}; stacks in {Path(run_dir) / STACKS}"
