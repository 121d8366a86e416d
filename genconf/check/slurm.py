"""launch_*.sbatch: the #SBATCH header as sbatch reads it and torchrun's world against the plan; `--slurm` asks
Slurm itself (`sbatch --test-only`, the only subprocess of genconf check)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

from genconf.check.common import Problem
from genconf.plan.equivalent import equivalent_plan
from genconf.plan.planfile import PlanFile
from genconf.render import slurm


_SHORT = {"-N": "--nodes", "-J": "--job-name", "-t": "--time", "-p": "--partition", "-A": "--account",
          "-o": "--output", "-e": "--error", "-D": "--chdir", "-n": "--ntasks", "-c": "--cpus-per-task"}


def sbatch_arguments(line: str) -> list[str]:
    """The words of an #SBATCH line as sbatch splits them: quotes and backslash escapes, `#` ends it."""
    words, word, quote, escape, started = [], [], "", False, False
    for ch in line:
        if escape:
            word.append(ch)
            escape, started = False, True
        elif ch == "\\":
            escape = True
        elif quote:
            if ch == quote:
                quote = ""
            else:
                word.append(ch)
        elif ch in "\"'":
            quote, started = ch, True
        elif ch == "#":
            break
        elif ch.isspace():
            if started:
                words.append("".join(word))
                word, started = [], False
        else:
            word.append(ch)
            started = True
    if started:
        words.append("".join(word))
    return words


def sbatch_options(text: str) -> tuple[dict[str, tuple[int, str]], list[tuple[int, str]]]:
    """(#SBATCH options as option -> (line, value), #SBATCH lines sbatch ignores because they follow a command)."""
    options: dict[str, tuple[int, str]] = {}
    ignored: list[tuple[int, str]] = []
    in_header = True
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if number > 1 and stripped and not stripped.startswith("#"):
            in_header = False
        if not raw.startswith("#SBATCH"):
            continue
        if not in_header:
            ignored.append((number, raw))
            continue
        words = sbatch_arguments(raw[len("#SBATCH"):])
        i = 0
        while i < len(words):
            word = words[i]
            if word.startswith("--"):
                key, eq, value = word.partition("=")
                if not eq and i + 1 < len(words) and not words[i + 1].startswith("-"):
                    value, i = words[i + 1], i + 1
            elif word in _SHORT:
                key, value = _SHORT[word], words[i + 1] if i + 1 < len(words) else ""
                i += 1
            else:
                key, value = word, ""
            options[key] = (number, value)
            i += 1
    return options, ignored


def _torchrun_flags(text: str) -> dict[str, tuple[int, str]]:
    """--nnodes and --nproc-per-node of the torchrun command (its continuation lines included)."""
    lines = text.splitlines()
    out: dict[str, tuple[int, str]] = {}
    for start, line in enumerate(lines):
        if ("torch.distributed.run" in line or re.search(r"\btorchrun\b", line)) and not line.lstrip().startswith("#"):
            i = start
            while True:
                for match in re.finditer(r"(--nnodes|--nproc[-_]per[-_]node)(?:=|\s+)(\S+)", lines[i]):
                    key = "--nnodes" if match.group(1) == "--nnodes" else "--nproc-per-node"
                    out.setdefault(key, (i + 1, match.group(2).strip("'\"")))
                if not lines[i].rstrip().endswith("\\") or i + 1 >= len(lines):
                    break
                i += 1
            break
    return out


def _launch_words(text: str) -> tuple[int, list[str]] | None:
    """(first line, words as the shell splits them) of the command that runs torchrun, its continuation lines
    joined; None where there is none or it does not parse."""
    lines = text.splitlines()
    for start, line in enumerate(lines):
        if line.lstrip().startswith("#") or not ("torch.distributed.run" in line or slurm.RANK_SIGNAL_MODULE in line):
            continue
        end = start
        while lines[end].rstrip().endswith("\\") and end + 1 < len(lines):
            end += 1
        joined = " ".join(l.rstrip().removesuffix("\\") for l in lines[start:end + 1])
        try:
            return start + 1, shlex.split(joined)
        except ValueError:
            return None
    return None


def check_preemption(name: str, text: str, signal_option: tuple[int, str] | None) -> list[Problem]:
    """Slurm's preemption notice reaches the ranks: genconf.run.rank_signal around torchrun names the script torchrun
    starts (it passes SIGUSR1 to the processes running it), and without the wrapper an `#SBATCH --signal=USR1` needs
    SIGUSR1 in torchrun's --signals-to-handle (else the notice kills torchrun: its default disposition)."""
    found = _launch_words(text)
    if found is None or "torch.distributed.run" not in found[1]:
        return []
    line, words = found
    run = words.index("torch.distributed.run")
    script = next((w for w in words[run + 1:] if not w.startswith("-")), None)
    if slurm.RANK_SIGNAL_MODULE in words[:run]:
        wrapped = words[words.index(slurm.RANK_SIGNAL_MODULE) + 1]
        if script is not None and wrapped != script:
            return [Problem(name, line, f"{slurm.RANK_SIGNAL_MODULE} passes SIGUSR1 to ranks running {wrapped}, but "
                                        f"torchrun starts {script}: a preemption notice would not reach the ranks")]
        return []
    handled = any(w.startswith("--signals-to-handle") and "SIGUSR1" in w for w in words[run:])
    # Slurm signals the job steps (torchrun) unless B: sends it to the batch shell alone (sbatch(1), --signal).
    usr1 = signal_option and re.match(r"^(?:R:)?(?:SIG)?(?:USR1|10)(?:@|$)", signal_option[1].upper())
    if usr1 and not handled:
        return [Problem(name, signal_option[0], f"#SBATCH --signal=USR1 without {slurm.RANK_SIGNAL_MODULE} around "
                                                "torchrun (or SIGUSR1 in its --signals-to-handle): the notice would "
                                                "kill torchrun")]
    return []


_GPU_COUNT = re.compile(r"^(?:[A-Za-z0-9_-]+:)*(\d+)$")
_JOB_TOKEN = re.compile(r"^[A-Za-z0-9._-]+$")


def check_sbatch(name: str, text: str, p: PlanFile) -> list[Problem]:
    problems: list[Problem] = []
    nodes, per_node = slurm.slurm_layout(p.cluster, p.num_gpus)
    if not text.startswith("#!"):
        problems.append(Problem(name, 1, "the first line must be '#!' and an interpreter (sbatch refuses the script)"))
    options, ignored = sbatch_options(text)
    for number, raw in ignored:
        problems.append(Problem(name, number, f"{raw.strip()}: sbatch ignores #SBATCH lines after the first command"))

    def expect(option: str, want: int, why: str) -> None:
        if option not in options:
            problems.append(Problem(name, None, f"no #SBATCH {option} line ({why} needs {option}={want})"))
            return
        line, value = options[option]
        match = _GPU_COUNT.match(value) if option == "--gpus-per-node" else re.match(r"^(\d+)$", value)
        if not match or int(match.group(1)) != want:
            problems.append(Problem(name, line, f"#SBATCH {option}={value} contradicts the plan: {why} needs "
                                                f"{option}={want}"))

    layout = f"{p.num_gpus} GPUs on {p.cluster.gpus_per_node}-GPU nodes"
    expect("--nodes", nodes, layout)
    expect("--ntasks-per-node", 1, "one torchrun per node")
    expect("--gpus-per-node", per_node, layout)
    for option in ("--job-name", "--account", "--partition"):
        if option in options and not _JOB_TOKEN.match(options[option][1]):
            line, value = options[option]
            problems.append(Problem(name, line, f"#SBATCH {option}={value!r}: use letters, digits, '.', '_', '-'"))
    if "--time" in options and not slurm.SLURM_TIME.match(options["--time"][1]):
        line, value = options["--time"]
        problems.append(Problem(name, line, f"#SBATCH --time={value!r} is not a Slurm time (HH:MM:SS or D-HH:MM:SS)"))
    elif "--time" in options and "--signal" in options:
        problems += _notice_inside_the_limit(name, options["--time"][1], options["--signal"])
    problems += _shell_syntax(name, text)
    torchrun = _torchrun_flags(text)
    if not torchrun:
        problems.append(Problem(name, None, "no torchrun (python -m torch.distributed.run) command"))
        return problems
    for flag, want in (("--nnodes", nodes), ("--nproc-per-node", per_node)):
        if flag not in torchrun:
            problems.append(Problem(name, None, f"torchrun has no {flag} (the plan needs {flag}={want})"))
            continue
        line, value = torchrun[flag]
        if value != str(want):
            problems.append(Problem(name, line, f"torchrun {flag}={value} contradicts the plan: {layout} needs "
                                                f"{flag}={want}"))
    return problems + check_preemption(name, text, options.get("--signal"))


def rerender_command(directory: Path) -> str:
    """`genconf render DIR/plan.json -o DIR --force` with the Slurm options DIR's launch script was rendered with
    (plan.json does not keep them: a bare re-render would reset the time limit, partition, account, job name and a
    run directory outside DIR to their defaults). The interpreter (--python) is left to this machine's."""
    directory = Path(directory)
    words = ["genconf", "render", shlex.quote(str(directory / "plan.json")), "-o", shlex.quote(str(directory)),
             "--force"]
    script = next(iter(sorted(directory.glob("launch_*.sbatch"))), None)
    if script is None:
        return " ".join(words)
    try:
        text = script.read_text()
    except (OSError, UnicodeDecodeError):
        return " ".join(words)  # its options cannot be read back
    options, _ = sbatch_options(text)
    for option in ("--job-name", "--account", "--partition", "--time"):
        if option in options:
            words += [option, shlex.quote(options[option][1])]
    values = _assignments(text)
    run_dir, rendered_at = values.get("RUN_DIR"), values.get("ARTIFACTS")
    if run_dir and rendered_at and Path(run_dir) != Path(rendered_at) / "runs":
        words += ["--run-dir", shlex.quote(run_dir)]  # chosen at render time, outside the directory
    return " ".join(words)


def _assignments(text: str) -> dict[str, str]:
    """The script's top-level VAR=value lines (RUN_DIR, ARTIFACTS, ...), unquoted."""
    out = {}
    for line in text.splitlines():
        found = re.match(r"^([A-Z_]+)=(.*)$", line)
        if found:
            try:
                out[found.group(1)] = shlex.split(found.group(2))[0]
            except (ValueError, IndexError):
                continue
    return out


def rendered_elsewhere(name: str, text: str, directory: Path) -> Problem | None:
    """A generated script's ARTIFACTS= line naming another directory than the one it is in: the directory was copied
    or moved after it was rendered, and the job would read (and, through RUN_DIR, write) the old paths."""
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("ARTIFACTS="):
            try:
                rendered = Path(shlex.split(line.split("=", 1)[1])[0])
            except (ValueError, IndexError):
                return Problem(name, number, f"cannot parse {line.strip()!r}")
            if rendered.resolve() == Path(directory).resolve():
                return None
            return Problem(name, number, f"rendered at {rendered} (ARTIFACTS and RUN_DIR point there, not here): "
                                         f"re-render it here with `{rerender_command(directory)}`")
    return None


def _notice_inside_the_limit(name: str, time: str, signal_option: tuple[int, str]) -> list[Problem]:
    """`--signal=SIG@SECONDS` must come inside `--time`: a notice as long as the limit arrives as the job starts."""
    line, value = signal_option
    lead = re.search(r"@(\d+)$", value)
    limit = slurm.time_limit_s(time) if time not in ("UNLIMITED", "INFINITE") else 0
    if lead and limit and int(lead.group(1)) >= limit and int(lead.group(1)) != slurm.preempt_signal_s(time):
        return [Problem(name, line, f"#SBATCH --signal={value} comes {lead.group(1)} s before a {limit} s --time: "
                                    f"at the job's start; genconf renders @{slurm.preempt_signal_s(time)} for it")]
    return []


def _shell_syntax(name: str, text: str) -> list[Problem]:
    """bash -n's first complaint (an unbalanced quote from a hand edit): the script would not run at all."""
    bash = shutil.which("bash")
    if bash is None:
        return []
    out = subprocess.run([bash, "-n"], input=text, capture_output=True, text=True, timeout=30)
    if out.returncode == 0:
        return []
    first = (out.stderr.strip().splitlines() or ["syntax error"])[0]
    found = re.match(r"^.*?: line (\d+): (.*)$", first)
    return [Problem(name, int(found.group(1)) if found else None, f"bash -n: {found.group(2) if found else first}")]


def check_launch_env(text: str, p: PlanFile) -> list[Problem]:
    """launch_env.sh against the plan: the cluster's NCCL settings, and CUDA_DEVICE_MAX_CONNECTIONS=1 where Megatron's
    tensor or context parallelism needs it (what launch_megatron.sbatch exports)."""
    name = "launch_env.sh"
    problems: list[Problem] = []
    exports: dict[str, tuple[int, str]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped.startswith("export "):
            continue
        try:
            words = shlex.split(stripped[len("export "):])
        except ValueError as exc:
            problems.append(Problem(name, number, f"cannot parse the export: {exc}"))
            continue
        exports.update((w.split("=", 1)[0], (number, w.split("=", 1)[1])) for w in words if "=" in w)
    for var, want in p.cluster.nccl_env:
        if var not in exports:
            problems.append(Problem(name, None, f"no export {var}={want} (cluster {p.cluster.name})"))
        elif exports[var][1] != want:
            problems.append(Problem(name, exports[var][0], f"{var}={exports[var][1]} contradicts cluster "
                                                           f"{p.cluster.name} ({var}={want})"))
    megatron, _ = equivalent_plan(p.plan, "megatron")
    connections = exports.get("CUDA_DEVICE_MAX_CONNECTIONS")
    if megatron.megatron_fsdp:
        # Megatron-LM (core_v0.16.1 arguments.py) asserts the opposite under Megatron-FSDP, TP or CP or not.
        if connections is not None and connections[1] == "1":
            problems.append(Problem(name, connections[0], "Megatron-FSDP needs CUDA_DEVICE_MAX_CONNECTIONS other than 1 "
                                                          "(Megatron-LM's arguments.py asserts it)"))
    elif (megatron.tp > 1 or megatron.cp > 1) and (connections is None or connections[1] != "1"):
        problems.append(Problem(name, connections[0] if connections else None,
                                f"Megatron with tp={megatron.tp} cp={megatron.cp} needs CUDA_DEVICE_MAX_CONNECTIONS=1 "
                                f"(Megatron-LM's arguments.py asserts it)"))
    return problems


def sbatch_test_only(path: Path) -> str | None:
    """Slurm's own verdict on a script without running it: None when `sbatch --test-only` accepts it, else
    what sbatch said, on one line."""
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        return "sbatch not found: --slurm needs the Slurm client on PATH"
    try:
        out = subprocess.run([sbatch, "--test-only", path.name], capture_output=True, text=True, timeout=60,
                             cwd=path.parent)
    except subprocess.TimeoutExpired:
        return "sbatch --test-only did not answer within 60 s (is slurmctld up?)"
    if out.returncode == 0:
        return None
    said = [line.strip() for line in (out.stderr + out.stdout).splitlines() if line.strip()]
    return "; ".join(said) or f"sbatch --test-only exited with {out.returncode}"
