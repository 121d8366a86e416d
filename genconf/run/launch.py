"""`genconf launch DIR`: run the plan in an artifact directory, locally through torchrun or through Slurm.

A run directory gets the resolved config (the plan, shrunk for a smoke test if asked, keeping its parallel
layout), and the framework's entry point in `launchers/` trains from it.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from genconf.catalog.files import resource_dir
from genconf.catalog.hardware import resolve_gpu
from genconf.plan import kernels, precision, runconfig
from genconf.plan.errors import GenconfError
from genconf.plan.runconfig import RunConfig
from genconf.render.slurm import ENTRY_POINTS, PREEMPT_SIGNAL_LEAD_S, TORCHRUN_SIGNALS
from genconf.run import rank_signal
from genconf.train import checkpoints, cpu_numerics, failure, preempt, watchdog

LOCAL_TORCHRUN_SIGNALS = ",".join(name for name in TORCHRUN_SIGNALS.split(",") if name != "SIGINT")
"""A local launch's torchrun leaves SIGINT alone: it runs ignored there, Ctrl-C being the launch's
(rank_signal.Interrupts)."""


def run_config_from_artifacts(artifacts: Path, shrink_args: dict, data: dict | None = None) -> RunConfig:
    """The RunConfig of DIR's plan, shrunk (genconf.plan.runconfig), for a GPU the catalog knows."""
    cfg = runconfig.from_artifacts(artifacts, shrink_args, data)
    resolve_gpu(cfg.prediction["gpu"])
    return cfg


def cuda_available() -> bool:
    """Whether torch sees a CUDA device (False without torch)."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


def refuse_unrunnable(cfg) -> None:
    """Refuse, before anything starts, a precision recipe this machine cannot run (one line)."""
    import importlib.util

    cuda = False
    gpu = None
    if importlib.util.find_spec("torch") is not None:
        import torch

        cuda = torch.cuda.is_available()
        if cuda:
            from genconf.catalog.hardware import gpu_for_device_name, resolve_gpu

            name = gpu_for_device_name(torch.cuda.get_device_name())
            gpu = resolve_gpu(name) if name else None
    else:
        raise GenconfError("training needs the train extra: pip install 'genconf[train]' (torch, deepspeed, megatron-core)")
    te = importlib.util.find_spec("transformer_engine") is not None
    torchao = importlib.util.find_spec("torchao") is not None
    why = precision.unsupported_reason(precision.recipe(cfg.precision_recipe), gpu=gpu, framework=cfg.plan.framework,
                                       te_available=te, cuda=cuda, torchao_available=torchao)
    if why:
        raise GenconfError(why)
    why = runconfig.needs_te_attention(cfg.model, cfg.plan)
    if why and not (cuda and te):
        raise GenconfError(why)
    why = runconfig.unbuildable(cfg.model, cfg.plan)
    if why:
        raise GenconfError(why)
    why = attention_backend_refusal(cfg) if cuda else None  # a CPU runs neither kernel: the option changes nothing
    if why:
        raise GenconfError(why)
    if not cuda:
        refuse_too_big_for_host(cfg)


def attention_backend_refusal(cfg) -> str | None:
    """Why the run's pinned SDPA backend (--attention) cannot take its model's head dim on a GPU (None: it can):
    the run would stop at its first step with "No available kernel" (kernels.sdpa_backend_takes)."""
    backend = (cfg.speed or {}).get("attention", "auto")
    d = cfg.model.attention_head_dim
    gqa = cfg.model.grouped_query
    # genconf's DeepSpeed and FSDP runners build its own model (SDPA) whatever the plan's layer spec says.
    if cfg.plan.framework == "megatron" or kernels.sdpa_backend_takes(backend, d, gqa):
        return None
    return (f"--attention {backend}: PyTorch's {backend} attention does not take this model's head dim ({d}"
            f"{', grouped-query' if gqa else ''}); the run would stop at its first step with \"No available kernel\": "
            f"use --attention auto")


def refuse_too_big_for_host(cfg) -> None:
    """A CPU run of a full-size plan is killed by the OOM killer, not refused: say so before it starts."""
    import dataclasses as dc

    from genconf.plan.memory import GIB, stage_memory

    # A CPU runs no fused attention kernel under dropout (SDPA's math backend; megatron's local spec).
    plan = dc.replace(cfg.plan, sequence_parallel=False,
                      **({"attention_kernel": "math"} if cfg.plan.torch_layers else {"layer_spec": "local"}))
    per_rank = max(stage_memory(cfg.model, plan, s).total_bytes for s in {0, plan.pp - 1})
    need = per_rank * plan.world_size
    have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need > 0.8 * have:
        raise GenconfError(f"on this CPU the plan needs about {need / GIB:,.0f} GiB ({plan.world_size} ranks x "
                           f"{per_rank / GIB:,.1f} GiB) but the machine has {have / GIB:,.0f} GiB: shrink it for a "
                           f"smoke test (--layers, --hidden, --vocab, --seq-len, --global-batch)")


SMOKE_HINT_S = 3600.0
"""A CPU launch expected to run longer than this without --steps is told how to make it a smoke test."""


def cpu_step_estimate(cfg, *, force: bool, cores: int | None = None, done_steps: int = 0):
    """Print the expected time of one step on this machine's CPUs (genconf.plan.cpu_time) before a CPU launch, and
    refuse one expected to take more than CPU_STEP_LIMIT_S (10 minutes) a step unless `force`."""
    from genconf.plan.cpu_time import CPU_STEP_LIMIT_S, cpu_step_time, format_seconds

    est = cpu_step_time(cfg.model, cfg.plan, cores=cores or len(os.sched_getaffinity(0)))
    print(f"genconf: expected {est.describe()}", file=sys.stderr, flush=True)
    steps = getattr(getattr(cfg, "train", None), "train_steps", 0) - done_steps
    if steps > 1:
        # A shrunk model keeps the plan's steps unless --steps says otherwise: hours of CPU for a smoke test.
        total = est.step_time_s * steps
        hint = (" (a smoke test: add --steps N)" if total > SMOKE_HINT_S and not cfg.shrink.get("steps")
                and not done_steps else "")
        left = " left" if done_steps else ""
        print(f"genconf: {steps:,} steps{left}: about {format_seconds(total)} in all{hint}", file=sys.stderr,
              flush=True)
    if est.step_time_s > CPU_STEP_LIMIT_S and not force:
        raise GenconfError(f"a step is expected to take {format_seconds(est.step_time_s)} on this CPU "
                           f"({est.passes_per_rank} micro-batch passes per rank, {est.flops_per_step:.3g} FLOPs), over "
                           f"the {format_seconds(CPU_STEP_LIMIT_S)} limit: shrink it (--layers, --hidden, --seq-len, "
                           f"--global-batch) or pass --force")
    return est


def shrunk_batch_note(artifacts: Path, cfg) -> str | None:
    """A line saying the batch was scaled down with the shrunk model, when it was (genconf.plan.runconfig.shrink)."""
    from genconf.plan.batch import default_batch
    from genconf.plan.counting import exact_param_count, human_count

    before = runconfig.read_plan(artifacts).plan
    if cfg.shrink.get("global_batch") or cfg.plan.gbs >= before.gbs:
        return None
    params = exact_param_count(cfg.model)
    return (f"global batch {cfg.plan.gbs} sequences of {cfg.plan.seq_length} (the plan's {before.gbs}), scaled down with "
            f"the shrunk model ({human_count(params)} parameters): {default_batch(params, cfg.plan.seq_length).reason}")


def entry_point(framework: str) -> Path:
    return resource_dir("launchers") / ENTRY_POINTS[framework]


@functools.cache
def torchrun_accepts(python: str, flag: str) -> bool:
    """Whether `python -m torch.distributed.run` has the option `flag` (asked of that interpreter's torch: the
    `--shutdown-timeout` the launch passes is missing from torch 2.11's)."""
    if python == sys.executable:
        from torch.distributed.run import get_args_parser

        return any(flag in action.option_strings for action in get_args_parser()._actions)
    code = ("import sys; from torch.distributed.run import get_args_parser as p; "
            "sys.exit(0 if any(sys.argv[1] in a.option_strings for a in p()._actions) else 1)")
    return subprocess.run([python, "-c", code, flag], capture_output=True, timeout=300).returncode == 0


def launch_local(cfg, run_dir: Path, *, resume: bool, python: str = sys.executable, extra_env: dict | None = None,
                 stdout=None, interrupts: rank_signal.Interrupts | None = None) -> int:
    """torchrun --standalone with one process per rank of the plan (gloo on CPUs, NCCL on GPUs). SIGUSR1 to the
    launch reaches every rank, which checkpoints and stops (as a Slurm job does before its time limit). With
    `interrupts`, Ctrl-C reaches the launch alone and stops the ranks the same way (rank_signal.Interrupts)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1, sort_keys=True))
    grace = ([f"--shutdown-timeout={PREEMPT_SIGNAL_LEAD_S}"] if torchrun_accepts(python, "--shutdown-timeout")
             else [])  # older torchruns (2.11) lack it: they give the ranks their fixed 30 s after a SIGTERM
    script = str(entry_point(cfg.plan.framework))
    cmd = [python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={cfg.plan.world_size}",
           f"--signals-to-handle={TORCHRUN_SIGNALS if interrupts is None else LOCAL_TORCHRUN_SIGNALS}", *grace,
           script, "--artifacts", cfg.artifacts, "--run-dir", str(run_dir)]
    if resume:
        cmd.append("--resume")
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
               **(extra_env or {}))
    if not cuda_available():
        env.update(cpu_numerics.pinned_env(env))  # the same loss curve on every x86 CPU (genconf.train.cpu_numerics)
    if cfg.plan.expandable_segments:
        # As the launch scripts: the caching allocator grows segments in place (the memory estimate assumes it).
        env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    print(f"genconf: launching {' '.join(cmd)}", file=sys.stderr, flush=True)
    # SIGUSR1 to `genconf launch` (a preemption notice, or a user's kill -USR1) goes to the ranks themselves, not
    # through torchrun (genconf.run.rank_signal): they checkpoint at the end of the step and stop
    # (genconf.train.preempt), and torchrun sees them end normally.
    return rank_signal.run(cmd, script, env=env, stdout=stdout, interrupts=interrupts)


def check_data(cfg) -> None:
    """The run's token file checked before any rank starts (genconf.run.datacheck); one line on stderr."""
    if (cfg.data or {}).get("kind") != "memmap":
        return
    from genconf.run.datacheck import check_token_file

    summary = check_token_file(cfg.data["path"], dtype=cfg.data.get("dtype", "uint16"), vocab_size=cfg.model.vocab_size,
                               seq_length=cfg.plan.seq_length, global_batch=cfg.plan.gbs)
    print(f"genconf: {summary.line(cfg.model.vocab_size)}", file=sys.stderr, flush=True)


def earlier_run(run_dir: Path) -> str | None:
    """What in run_dir is an earlier run's (its checkpoints, or its metrics), in words; None where there is none. A
    run started over in a directory clears its checkpoints (genconf.train.loop): a launch must not do that unasked."""
    steps = checkpoints.CheckpointStore(run_dir / "checkpoints").steps()
    if steps:
        return f"{len(steps)} checkpoint(s), the newest {steps[-1][1].name}"
    if (run_dir / "metrics.jsonl").is_file():
        return "its metrics.jsonl"
    return None


def complete_checkpoints(store: checkpoints.CheckpointStore) -> list[tuple[int, Path]]:
    """(step, directory) of each checkpoint whose manifest was written (a save that was cut short has none)."""
    return [(step, path) for step, path in store.steps() if (path / checkpoints.MANIFEST).is_file()]


def check_resumable(run_dir: Path, cfg, steps_flag: int | None) -> int:
    """The newest checkpoint step a resume can start from (by its manifest, not yet verified: the ranks verify
    the checksums and fall back to an older one), or one line saying why there is nothing to resume."""
    store = checkpoints.CheckpointStore(run_dir / "checkpoints")
    complete = [step for step, _ in complete_checkpoints(store)]
    if not complete:
        raise GenconfError(f"--resume: no checkpoint in {store.root} (checkpoints off, or the run stopped before "
                           f"its first)")
    newest = complete[-1]
    # A finished run has nothing to resume, unless its last checkpoint is broken: then the ranks fall back to
    # an older one (hashing it here costs a read of one checkpoint, and only in this case).
    if newest >= cfg.train.train_steps and store.verify(store.final_dir(newest)) is None:
        if steps_flag is not None:
            raise GenconfError(f"--resume --steps {steps_flag}: the newest checkpoint is at step {newest}; give more "
                               f"than {newest} steps")
        raise GenconfError(f"--resume: the run finished at step {newest} of {cfg.train.train_steps}; give --steps N "
                           f"(more than {newest}) to extend it")
    return newest


EXIT_INTERRUPTED = 130
"""A launch stopped by Ctrl-C exits as the shell's convention for SIGINT has it (128 + 2); by SIGTERM, 143."""
EXIT_TERMINATED = 143


def report_end(run_dir: Path, rc: int, *, since: float, resume_hint: str,
               interrupts: rank_signal.Interrupts | None = None) -> int:
    """After the ranks are gone: 0 when the run finished or stopped for preemption (one line each), else a
    GenconfError naming the cause: a hang (which ranks, where they waited), the first rank's failure (the disk
    is full, out of memory, the exception), or the exit code. A run stopped by Ctrl-C or SIGTERM
    (`interrupts`) that did not finish: one line, with where a resume would start, and EXIT_INTERRUPTED (or
    EXIT_TERMINATED), unless a rank failed meanwhile: that failure is the error."""
    marker = preempt.read_marker(run_dir)
    marked = bool(marker) and marker.get("time", 0) >= since
    finished = preempt.read_finished(run_dir)
    finished_now = (bool(finished) and finished.get("time", 0) >= since) or (rc == 0 and not marked)
    if interrupts is not None and interrupts.any and not finished_now:
        failed = failure.summarize(run_dir, since=since)
        if failed:
            raise GenconfError(f"training failed while stopping: {failed} (run directory {run_dir})")
        why = "SIGTERM" if interrupts.terminated else "Ctrl-C"
        if marked:  # the ranks stopped after their checkpoint, whatever came after the first Ctrl-C
            saved = (f"checkpoint {marker['checkpoint']}; continue with: {resume_hint}" if marker.get("checkpoint")
                     else "no checkpoint: checkpoints are off")
            print(f"genconf: stopped ({why}) after step {marker['step']} ({saved})", flush=True)
        else:
            complete = complete_checkpoints(checkpoints.CheckpointStore(run_dir / "checkpoints"))
            resume = (f"the newest checkpoint is {complete[-1][1].name}; continue with: {resume_hint}" if complete
                      else "no checkpoint to resume from")
            print(f"genconf: stopped ({why}) before the end of a step ({resume})", flush=True)
        return EXIT_TERMINATED if interrupts.terminated else EXIT_INTERRUPTED
    if marked:
        saved = f"checkpoint {marker['checkpoint']}" if marker.get("checkpoint") else "no checkpoint (checkpoints off)"
        print(f"genconf: preempted after step {marker['step']} ({saved}); continue with: {resume_hint}", flush=True)
        return 0
    if rc == 0 or finished_now:
        # The ranks finished; torchrun failed after them (genconf.train.preempt.FINISHED).
        late = f" (torchrun exited {rc} after the last step)" if rc else ""
        print(f"genconf: run finished: {run_dir}  (genconf verify {run_dir}){late}")
        return 0
    hung = watchdog.summarize(run_dir, since=since)
    if hung:
        raise GenconfError(hung)
    failed = failure.summarize(run_dir, since=since)
    if failed:
        raise GenconfError(f"training failed: {failed} (run directory {run_dir})")
    killed = " (a rank was killed: out of memory?)" if rc in (-9, 137) else ""
    raise GenconfError(f"training exited with code {rc}{killed}; see the output above (run directory {run_dir})")


def sbatch_script(artifacts: Path, framework: str) -> Path:
    script = artifacts / f"launch_{framework}.sbatch"
    if not script.is_file():
        raise GenconfError(f"{artifacts} has no {script.name}")
    return script


def _script_text(script: Path) -> str:
    """A generated sbatch script's text; a binary or unreadable one is one line (a hand edit, a copy gone wrong)."""
    from genconf.check.slurm import rerender_command

    try:
        return script.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise GenconfError(f"{script} cannot be read as text ({exc}): re-render it "
                           f"({rerender_command(script.parent)})") from None


def script_run_dir(script: Path) -> Path:
    """The RUN_DIR the generated sbatch script trains into (the quoted assignment genconf rendered)."""
    import shlex

    for line in _script_text(script).splitlines():
        if line.startswith("RUN_DIR="):
            return Path(shlex.split(line.split("=", 1)[1])[0])
    raise GenconfError(f"{script}: no RUN_DIR= line")


def moved_since_render(artifacts: Path, script: Path) -> str | None:
    """Why DIR's sbatch scripts point elsewhere (a copied or moved directory: their ARTIFACTS and RUN_DIR are the
    paths it was rendered at), with the command that re-renders them here; None where they point at DIR."""
    from genconf.check.slurm import rendered_elsewhere

    problem = rendered_elsewhere(script.name, _script_text(script), artifacts)
    return None if problem is None else f"{artifacts}: {problem.message}"


JOB_DONE = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
            "PREEMPTED")


def job_state(job_id: str) -> tuple[str, str]:
    """(JobState, ExitCode) from `scontrol show job -o` (no accounting needed)."""
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True)
    fields = dict(kv.split("=", 1) for kv in out.stdout.split() if "=" in kv)
    return fields.get("JobState", "UNKNOWN"), fields.get("ExitCode", "?")


def submit(cfg, artifacts: Path, *, wait: bool, resume: bool = False, timeout_s: float = 3600) -> int:
    """sbatch the plan's script unchanged; with wait, poll until it ends (through any requeues) and surface a
    failure with the job id, its state, the cause the ranks recorded and the tail of its log. With resume the
    job continues the run in the script's RUN_DIR (GENCONF_RESUME=1, which the script reads)."""
    why = runconfig.unbuildable(cfg.model, cfg.plan)  # the script runs genconf's runner: it would refuse it
    if why:
        raise GenconfError(why)
    if shutil.which("sbatch") is None:
        raise GenconfError("sbatch is not on PATH: --submit needs a Slurm client (or run without --submit)")
    script = sbatch_script(artifacts, cfg.plan.framework)
    run_dir = script_run_dir(script)
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)  # Slurm opens --output there before the job runs
    (run_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1, sort_keys=True))
    since = time.time()
    env = dict(os.environ, GENCONF_RESUME="1") if resume else None
    out = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise GenconfError(f"sbatch refused {script.name}: {(out.stderr or out.stdout).strip().splitlines()[-1]}")
    job_id = out.stdout.strip().split(";")[0]
    print(f"genconf: submitted job {job_id} ({script.name}); run directory {run_dir}", flush=True)
    if not wait:
        return 0
    deadline = time.monotonic() + timeout_s
    state, code = "PENDING", "?"
    while time.monotonic() < deadline:
        state, code = job_state(job_id)
        if state in JOB_DONE:
            break
        time.sleep(0.5)
    if state == "COMPLETED" and code.startswith("0:"):
        print(f"genconf: job {job_id} COMPLETED", flush=True)
        return 0
    logs = sorted((run_dir / "logs").glob(f"*-{job_id}.*")) if (run_dir / "logs").is_dir() else []
    print("\n".join(log_excerpt(logs)), file=sys.stderr)
    why = watchdog.summarize(run_dir, since=since) or failure.summarize(run_dir, since=since)
    raise GenconfError(f"job {job_id} ended {state} (exit code {code})" + (f": {why}" if why else "")
                       + f"; logs: {', '.join(str(p) for p in logs) or run_dir}")


_EXCEPTION = re.compile(r"\b\w*(Error|Exception|error): ")


def log_excerpt(logs: list[Path], tail: int = 12) -> list[str]:
    """What a failed job's logs say: the exception lines (the first is the root cause, usually buried above
    the other ranks' consequential errors and torchrun's own traceback), then the tail of each log."""
    lines: list[str] = []
    for log in logs:
        text = log.read_text(errors="replace").splitlines()
        causes = list(dict.fromkeys(line.strip() for line in text if _EXCEPTION.search(line)))
        causes = causes[:2] + causes[-3:] if len(causes) > 5 else causes  # the first is the root cause
        lines += [f"  {log.name}: {line}" for line in causes]
        lines += [f"  {log.name}: {line}" for line in text[-tail:]]
    return lines
