"""The launch_*.sbatch scripts' values: nodes, GPUs per node and torchrun's world from the plan, the Slurm options
(account, partition, time, paths) validated, and the job name as a plain #SBATCH token."""

from __future__ import annotations

import re
from dataclasses import dataclass

from genconf.plan.equivalent import equivalent_plan
from genconf.plan.specs import ClusterSpec, ParallelPlan

ENTRY_POINTS = {"megatron": "train_megatron.py", "deepspeed": "train_deepspeed.py", "fsdp": "train_fsdp.py"}
"""The training entry point in launchers/ that torchrun starts, per framework."""
PREEMPT_SIGNAL_LEAD_S = 180
"""Seconds before the time limit Slurm sends SIGUSR1 (`--signal=USR1@180`): a step and a checkpoint must fit in
it, and Slurm may send the signal up to a minute early (sbatch(1), --signal). torchrun gives its ranks as long to
exit after it forwards them a SIGTERM (--shutdown-timeout). A job shorter than 4x this gets a quarter of its time
limit instead (preempt_signal_s)."""
RANK_SIGNAL_MODULE = "genconf.run.rank_signal"
"""The module the sbatch script runs torchrun under (`python -m RANK_SIGNAL_MODULE SCRIPT -- TORCHRUN...`), which
passes Slurm's preemption notice to the ranks; genconf check looks for it."""
TORCHRUN_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
"""What torchrun forwards to its ranks: its default four. Not SIGUSR1, the preemption signal: torchrun runs with it
ignored and genconf.run.rank_signal, its parent, passes it to the ranks (torchrun's own forwarding can turn it into
a SIGTERM)."""

def time_limit_s(time: str) -> int:
    """Seconds in a Slurm time limit (sbatch(1), --time: "minutes", "minutes:seconds", "hours:minutes:seconds",
    "days-hours", "days-hours:minutes", "days-hours:minutes:seconds")."""
    days, _, rest = time.rpartition("-")
    parts = [int(x) for x in rest.split(":")]
    if days:
        h, m, sec = (parts + [0, 0])[:3]
        return int(days) * 86400 + h * 3600 + m * 60 + sec
    if len(parts) == 1:
        return parts[0] * 60
    if len(parts) == 2:
        return parts[0] * 60 + parts[1]
    return parts[0] * 3600 + parts[1] * 60 + parts[2]


def preempt_signal_s(time: str) -> int:
    """When Slurm signals the job before its limit: PREEMPT_SIGNAL_LEAD_S, or a quarter of a short limit (a
    2-minute job gets 30 s, not a signal at its start). No limit (UNLIMITED, INFINITE, or a limit of zero, which
    sbatch(1) reads as none: the partition's own limit, if any, still ends the job) gets the full lead."""
    if time in ("UNLIMITED", "INFINITE") or time_limit_s(time) == 0:
        return PREEMPT_SIGNAL_LEAD_S
    return max(1, min(PREEMPT_SIGNAL_LEAD_S, time_limit_s(time) // 4))


_SLURM_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
SLURM_TIME = re.compile(r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+|\d+-\d+:\d{1,2}|\d+-\d+:\d{1,2}:\d{1,2}"
                         r"|UNLIMITED|INFINITE)$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_JOB_NAME_MAX = 128


def _printable(text: str) -> bool:
    return all(32 <= ord(c) != 127 for c in text)


def sbatch_job_name(name: str) -> str:
    """The job name as an #SBATCH token: every character outside [A-Za-z0-9._-] becomes '_'.
    #SBATCH lines are read by sbatch, not by a shell, so nothing there can run; sanitising keeps them plain."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)[:_JOB_NAME_MAX] or "genconf"


@dataclass(frozen=True, kw_only=True, slots=True)
class SlurmOptions:
    """What a launch script needs beyond the plan: Slurm accounting, paths on the cluster, the interpreter."""

    job_name: str
    """As given; the #SBATCH line carries sbatch_job_name(job_name), the script body the original, quoted."""
    run_dir: str
    """Absolute directory for logs (run_dir/logs) and checkpoints; the job's working directory."""
    artifacts_dir: str
    """Absolute directory holding plan.json and the configs (what `-o` names)."""
    launchers_dir: str
    """Absolute directory of genconf's training entry points (train_megatron.py, ...)."""
    python: str
    """Interpreter that starts torchrun on each node."""
    account: str | None = None
    partition: str | None = None
    time: str = "24:00:00"
    """Slurm time limit: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS."""
    master_port: int = 29500
    """Rendezvous port on the first node (MASTER_PORT in the environment overrides it)."""

    def __post_init__(self) -> None:
        if not self.job_name or not _printable(self.job_name):
            raise ValueError(f"--job-name must be non-empty printable text, got {self.job_name!r}")
        for flag, value in (("--account", self.account), ("--partition", self.partition)):
            if value is not None and not _SLURM_NAME.match(value):
                raise ValueError(f"{flag} {value!r} is not a Slurm name (letters, digits, '.', '_', '-')")
        if not SLURM_TIME.match(self.time):
            raise ValueError(f"--time {self.time!r} is not a Slurm time (minutes, HH:MM:SS or D-HH:MM:SS)")
        for flag, value in (("--run-dir", self.run_dir), ("--output", self.artifacts_dir),
                            ("launchers", self.launchers_dir), ("--python", self.python)):
            if not value.startswith("/") or not _printable(value) or "\\" in value:
                raise ValueError(f"{flag} must be an absolute path without control characters or backslashes, "
                                 f"got {value!r}")
        if not 1 <= self.master_port <= 65535:
            raise ValueError(f"master port must be in 1..65535, got {self.master_port}")


def slurm_layout(cluster: ClusterSpec, num_gpus: int) -> tuple[int, int]:
    """(nodes, GPUs per node) of the job: whole nodes, or part of one."""
    per_node = min(num_gpus, cluster.gpus_per_node)
    return max(1, num_gpus // per_node), per_node


def slurm_settings(cluster: ClusterSpec, plan: ParallelPlan, num_gpus: int, options: SlurmOptions) -> dict:
    """Every value a launch script renders, from the plan's world size, the cluster preset and the options."""
    if plan.world_size != num_gpus:
        raise ValueError(f"plan world size tp x pp x cp x dp = {plan.world_size} != {num_gpus} GPUs")
    nodes, per_node = slurm_layout(cluster, num_gpus)
    for name, _ in cluster.nccl_env:
        if not _ENV_NAME.match(name):
            raise ValueError(f"cluster {cluster.name}: {name!r} is not an environment variable name")
    megatron, _ = equivalent_plan(plan, "megatron")
    return {
        "nodes": nodes, "gpus_per_node": per_node, "ntasks_per_node": 1, "nproc_per_node": per_node,
        "world_size": nodes * per_node, "job_name": sbatch_job_name(options.job_name),
        "job_name_given": options.job_name, "account": options.account, "partition": options.partition,
        "time": options.time, "run_dir": options.run_dir, "log_dir": options.run_dir.rstrip("/") + "/logs",
        "artifacts": options.artifacts_dir, "launchers": options.launchers_dir, "python": options.python,
        "master_port": options.master_port, "nccl_env": list(cluster.nccl_env), "cluster_name": cluster.name,
        "preempt_signal_s": preempt_signal_s(options.time), "torchrun_signals": TORCHRUN_SIGNALS,
        "rank_signal_module": RANK_SIGNAL_MODULE,
        # Megatron-LM asserts CUDA_DEVICE_MAX_CONNECTIONS=1 with TP or CP before Blackwell (arguments.py), and
        # != 1 with Megatron-FSDP.
        "megatron_max_connections": (megatron.tp > 1 or megatron.cp > 1) and not megatron.megatron_fsdp,
        # PyTorch's caching allocator grows segments in place (the memory model's expandable_segments).
        "expandable_segments": plan.expandable_segments,
        # Megatron-LM (core_v0.16.1 arguments.py) asserts NCCL_GRAPH_REGISTER=0 with TE's CUDA graphs over expandable
        # segments (illegal memory accesses otherwise).
        "nccl_graph_register_off": plan.expandable_segments and plan.cuda_graph_impl == "transformer_engine",
    }
