"""torchrun with the preemption signal (SIGUSR1) delivered to the ranks themselves, not through torchrun.

torchrun's own handling of a signal is racy: its handler raises SignalException wherever the agent is, and inside
torch.distributed.elastic.metrics.prof before that wrapper binds `start` (torch 2.13, api.py) the exception turns
into an UnboundLocalError, on which torchrun SIGTERMs its ranks instead of forwarding the signal: no preemption
checkpoint. So torchrun is started with SIGUSR1 ignored (an ignored disposition survives exec, and torchrun's
--signals-to-handle no longer names it), and whoever runs it here, `genconf launch` or the sbatch script's
`python -m genconf.run.rank_signal SCRIPT -- TORCHRUN...`, sends the signal it receives to each rank once that rank
catches it (its SigCgt in /proc: the entry points install genconf.train.preempt's handler before importing torch),
so a notice that comes while the ranks start is held until they can take it. (One that comes while torchrun itself
is being started, the few milliseconds of the fork and exec, is lost.)

Standard library only: the sbatch script runs it on every node before torch is imported.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from genconf.train import preempt

POLL_S = 0.2
"""How often a held notice is retried on ranks that do not catch the signal yet."""
NO_RANK_WARNING_S = 30.0
"""After a notice, how long without finding any rank before saying so (once)."""
WAIT_THROUGH = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
"""What the sbatch script's wrapper outlives: Slurm (scancel, the time limit) and the terminal signal torchrun as
well, which forwards them to its ranks and ends when they have; the wrapper keeps waiting for it, since the step
ends, and everything left in it is killed, when its task (the wrapper) exits. One of these sent to the wrapper alone
(a kill of its pid) is swallowed too: end the run through torchrun or Slurm (scancel)."""


def _say(text: str) -> None:
    """One line on stderr, unbuffered: called from a signal handler, where a buffered write could be re-entered."""
    try:
        os.write(2, f"genconf: {text}\n".encode())
    except OSError:
        pass


def rank_pids(parent: int, script: str) -> list[int]:
    """The processes `parent` (torchrun) started that run `script` (its ranks), read from /proc; [] where there is
    no /proc or no rank has started yet."""
    pids = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return pids
    for name in names:
        if not name.isdigit():
            continue
        try:
            stat = Path("/proc", name, "stat").read_bytes()
            argv = Path("/proc", name, "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        # "pid (comm) state ppid ...": comm may hold spaces, parentheses and any byte, so the fields start after the
        # last ")".
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1 and fields[1] == str(parent).encode() and os.fsencode(script) in argv:
            pids.append(int(name))
    return sorted(pids)


def catches(pid: int, signum: int) -> bool:
    """Whether process `pid` has a handler installed for `signum` (the SigCgt mask of /proc/PID/status)."""
    try:
        status = Path("/proc", str(pid), "status").read_bytes()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith(b"SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


class Interrupts:
    """Ctrl-C at a local launch (`genconf launch`), counted. The terminal sends SIGINT to its whole foreground
    process group; torchrun and its ranks are started with it ignored (an ignored disposition survives exec, and
    CPython installs its KeyboardInterrupt handler only over the default one), so it reaches the launch alone: the
    first asks the ranks to stop as on a preemption notice (a checkpoint at the end of the step), a second stops
    them now (SIGTERM to torchrun, which passes it on). SIGTERM to the launch (a kill of its pid, `timeout`) stops
    them now too, instead of leaving torchrun running without it. `at_once`: the first Ctrl-C stops them now (a
    run whose end is its only use, as `genconf ci`'s smoke runs)."""

    def __init__(self, *, at_once: bool = False) -> None:
        self.at_once = at_once
        self.presses = 0
        self.terminated = False

    @property
    def any(self) -> bool:
        return bool(self.presses) or self.terminated


def run(cmd: list[str], script: str, *, env: dict | None = None, stdout=None, wait_through: tuple = (),
        interrupts: Interrupts | None = None) -> int:
    """Run `cmd` (torchrun starting `script` on each rank) to its end and return its exit code; SIGUSR1 received
    meanwhile goes to every rank, held for those that do not catch it yet. `wait_through`: signals that do not stop
    the wait (they are not passed on: torchrun gets them from the same sender). `interrupts`: SIGINT and SIGTERM
    handled as Interrupts says (torchrun must then leave SIGINT to its default: not in its --signals-to-handle)."""
    signum = preempt.SIGNAL
    proc: subprocess.Popen | None = None
    stop_pending = False  # a SIGTERM that came while torchrun was being started: sent once it is

    def stop_now() -> None:
        nonlocal stop_pending
        if proc is None:
            stop_pending = True
            return
        try:
            proc.send_signal(signal.SIGTERM)
        except OSError:  # ended meanwhile
            pass

    def terminate(_signum, _frame) -> None:
        interrupts.terminated = True
        _say("SIGTERM: stopping the ranks now")
        stop_now()

    # Ignored here, so torchrun inherits it ignored (and its ranks, until they install their handler). SIGINT too
    # with `interrupts` (a Ctrl-C in the milliseconds of the fork and exec is lost); SIGTERM is handled from before
    # the start, so a kill then does not leave torchrun running without the launch (a handler is reset at exec).
    previous = signal.signal(signum, signal.SIG_IGN)
    previous_int = signal.signal(signal.SIGINT, signal.SIG_IGN) if interrupts is not None else None
    previous_term = signal.signal(signal.SIGTERM, terminate) if interrupts is not None else None
    try:
        proc = subprocess.Popen(cmd, env=env, stdout=stdout)
    except BaseException:
        signal.signal(signum, previous)
        if interrupts is not None:
            signal.signal(signal.SIGINT, previous_int)
            signal.signal(signal.SIGTERM, previous_term)
        raise
    if stop_pending:
        stop_now()
    notice_at: float | None = None
    warned = False
    sent: set[int] = set()

    def deliver() -> None:
        nonlocal warned
        try:
            ranks = rank_pids(proc.pid, script)
            for pid in ranks:
                if pid not in sent and catches(pid, signum):
                    try:
                        os.kill(pid, signum)
                    except OSError:  # gone meanwhile
                        continue
                    sent.add(pid)
                    _say(f"passed SIG{preempt.SIGNAL_NAME} to rank process {pid}")
            if not ranks and not warned and notice_at is not None and time.monotonic() - notice_at > NO_RANK_WARNING_S:
                warned = True
                _say(f"SIG{preempt.SIGNAL_NAME} held: no process running {script} under torchrun (pid {proc.pid}) "
                     f"after {NO_RANK_WARNING_S:.0f} s")
        except Exception as exc:  # noqa: BLE001 - a signal handler must not end the wait for torchrun
            _say(f"passing SIG{preempt.SIGNAL_NAME} to the ranks failed: {exc!r}")

    def receive(_signum, _frame) -> None:
        nonlocal notice_at
        if notice_at is None:
            notice_at = time.monotonic()
        deliver()

    def interrupt(_signum, _frame) -> None:
        interrupts.presses += 1
        if interrupts.presses == 1 and not interrupts.at_once:
            _say("Ctrl-C: the ranks stop at the end of this step, after a checkpoint (Ctrl-C again: stop now, "
                 "without one)")
            receive(signum, None)
        else:
            _say("Ctrl-C: stopping the ranks now" if interrupts.at_once and interrupts.presses == 1
                 else "Ctrl-C again: stopping the ranks now")
            stop_now()

    handlers = {signum: previous, **{s: signal.signal(s, lambda *_: None) for s in wait_through}}
    if interrupts is not None:
        handlers[signal.SIGINT] = previous_int
        handlers[signal.SIGTERM] = previous_term
        if previous_int is not signal.SIG_IGN:  # a background job (`genconf launch ... &`) keeps ignoring it
            signal.signal(signal.SIGINT, interrupt)
    signal.signal(signum, receive)
    try:
        while True:
            # A wait with a timeout, so a held notice is retried (a blocking wait resumes after the handler runs).
            try:
                return proc.wait(timeout=POLL_S)
            except subprocess.TimeoutExpired:
                if notice_at is not None:
                    deliver()  # ranks that started, or installed their handler, since the notice
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)


def main(argv: list[str] | None = None) -> int:
    """`python -m genconf.run.rank_signal SCRIPT -- TORCHRUN...`: the sbatch script's srun command."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 3 or args[1] != "--":
        print("usage: python -m genconf.run.rank_signal SCRIPT -- TORCHRUN...", file=sys.stderr)
        return 2
    rc = run(args[2:], args[0], wait_through=WAIT_THROUGH)
    return rc if rc >= 0 else 128 - rc  # killed by a signal: the shell's convention


if __name__ == "__main__":
    sys.exit(main())
