"""torchrun with the preemption signal (SIGUSR1) delivered to the ranks themselves, not through torchrun.

torchrun's own handling of a signal is racy: its handler raises SignalException wherever the agent is, and inside
torch.distributed.elastic.metrics.prof before that wrapper binds `start` (torch 2.13, api.py) the exception turns
into an UnboundLocalError, on which torchrun SIGTERMs its ranks instead of forwarding the signal: no preemption
checkpoint. So torchrun is started with SIGUSR1 ignored (an ignored disposition survives exec, and torchrun's
--signals-to-handle no longer names it), and whoever runs it here, `genconf launch` or the sbatch script's
`python -m genconf.run.rank_signal SCRIPT -- TORCHRUN...`, sends the signal it receives to each rank once that rank
catches it (its SigCgt in /proc: the entry points install genconf.train.preempt's handler before importing torch),
so a notice that comes while the ranks start is held until they can take it.

Standard library only: the sbatch script runs it on every node before torch is imported.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from genconf.train import preempt

POLL_S = 0.2
"""How often a held notice is retried on ranks that do not catch the signal yet."""


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
            stat = Path("/proc", name, "stat").read_text()
            argv = Path("/proc", name, "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so the fields start after the last ")".
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 1 and fields[1] == str(parent) and script.encode() in argv:
            pids.append(int(name))
    return sorted(pids)


def catches(pid: int, signum: int) -> bool:
    """Whether process `pid` has a handler installed for `signum` (the SigCgt mask of /proc/PID/status)."""
    try:
        status = Path("/proc", str(pid), "status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def run(cmd: list[str], script: str, *, env: dict | None = None, stdout=None) -> int:
    """Run `cmd` (torchrun starting `script` on each rank) to its end and return its exit code; SIGUSR1 received
    meanwhile goes to every rank, held for those that do not catch it yet."""
    signum = preempt.SIGNAL
    previous = signal.signal(signum, signal.SIG_IGN)  # inherited by torchrun (and its ranks, until they install theirs)
    try:
        proc = subprocess.Popen(cmd, env=env, stdout=stdout)
    except BaseException:
        signal.signal(signum, previous)
        raise
    notice = False
    sent: set[int] = set()

    def deliver() -> None:
        for pid in rank_pids(proc.pid, script):
            if pid not in sent and catches(pid, signum):
                try:
                    os.kill(pid, signum)
                except ProcessLookupError:
                    continue
                sent.add(pid)

    def receive(_signum, _frame) -> None:
        nonlocal notice
        notice = True
        deliver()

    signal.signal(signum, receive)
    try:
        while True:
            # A wait with a timeout, so a held notice is retried (a blocking wait resumes after the handler runs).
            try:
                return proc.wait(timeout=POLL_S)
            except subprocess.TimeoutExpired:
                if notice:
                    deliver()  # ranks that started, or installed their handler, since the notice
    finally:
        signal.signal(signum, previous)


def main(argv: list[str] | None = None) -> int:
    """`python -m genconf.run.rank_signal SCRIPT -- TORCHRUN...`: the sbatch script's srun command."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 3 or args[1] != "--":
        print("usage: python -m genconf.run.rank_signal SCRIPT -- TORCHRUN...", file=sys.stderr)
        return 2
    rc = run(args[2:], args[0])
    return rc if rc >= 0 else 128 - rc  # killed by a signal: the shell's convention


if __name__ == "__main__":
    sys.exit(main())
