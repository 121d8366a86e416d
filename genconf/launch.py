"""`genconf launch DIR`: run the plan in an artifact directory, locally through torchrun or through Slurm.

A run directory gets the resolved config (the plan, shrunk for a smoke test if asked, keeping its parallel
layout), and the framework's entry point in `launchers/` trains from it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from genconf import cpu_numerics, precision, rules
from genconf.catalog import resource_dir
from genconf.errors import GenconfError
from genconf.report import specs_from_dict, train_from_dict
from genconf.specs import ModelSpec, ParallelPlan, TrainSpec

ENTRY_POINTS = {"megatron": "train_megatron.py", "deepspeed": "train_deepspeed.py", "fsdp": "train_fsdp.py"}


def read_plan(artifacts: Path) -> dict:
    path = artifacts / "plan.json"
    if not path.is_file():
        raise GenconfError(f"{artifacts} has no plan.json (write one with: genconf ... -o {artifacts})")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise GenconfError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg}") from None


def shrink(model: ModelSpec, plan: ParallelPlan, train: TrainSpec, *, layers: int | None = None,
           hidden: int | None = None, heads: int | None = None, vocab: int | None = None, seq_len: int | None = None,
           global_batch: int | None = None, mbs: int | None = None, steps: int | None = None,
           lr: float | None = None, checkpoint_every: int | None = None,
           precision: str | None = None) -> tuple[ModelSpec, ParallelPlan, TrainSpec]:
    """A smaller model and run with the same parallel layout (tp, pp, vp, cp, ep, dp, zero, recompute)."""
    m, p, t = model, plan, train
    if layers is not None:
        # An uneven split is specific to the full model's layer count: the shrunk model splits evenly.
        m = dataclasses.replace(m, num_layers=layers)
        p = dataclasses.replace(p, pp_first_stage_layers=None, pp_last_stage_layers=None,
                                pp_embedding_as_layer=False, pp_loss_as_layer=False)
    if hidden is not None or heads is not None:
        h = hidden or m.hidden_size
        a = heads or m.num_attention_heads
        if h % a:
            raise GenconfError(f"--hidden {h} is not divisible by {a} attention heads (give --heads)")
        ratio = m.num_attention_heads // m.num_query_groups
        groups = max(1, a // ratio) if a % max(1, a // ratio) == 0 else a
        scale = h / m.hidden_size
        ffn = max(8, int(round(m.ffn_hidden_size * scale / 8)) * 8)
        moe_ffn = max(8, int(round(m.moe_ffn_hidden_size * scale / 8)) * 8)
        m = dataclasses.replace(m, hidden_size=h, num_attention_heads=a, num_query_groups=groups, kv_channels=None,
                                ffn_hidden_size=ffn, moe_ffn_hidden_size=moe_ffn)
    if vocab is not None:
        m = dataclasses.replace(m, vocab_size=vocab)
    if seq_len is not None:
        m = dataclasses.replace(m, seq_length=max(m.seq_length, seq_len) if m.position_embedding == "rope" else seq_len)
        p = dataclasses.replace(p, seq_length=seq_len)
    if global_batch is not None or mbs is not None:
        gbs = global_batch or p.gbs
        per_rank = max(1, gbs // p.dp)
        # Without --mbs, the largest micro-batch <= the plan's that still divides the per-rank batch.
        micro = mbs or max(m for m in range(1, min(p.mbs, per_rank) + 1) if per_rank % m == 0)
        p = dataclasses.replace(p, gbs=gbs, mbs=micro)
    if steps is not None:
        t = dataclasses.replace(t, train_steps=steps, warmup_steps=min(t.warmup_steps, max(1, steps // 10)),
                                checkpoint_every_steps=min(t.checkpoint_every_steps, steps) or steps)
    if lr is not None:
        t = dataclasses.replace(t, lr=lr, min_lr=min(t.min_lr, lr / 10))
    if checkpoint_every is not None:
        t = dataclasses.replace(t, checkpoint_every_steps=checkpoint_every)
    if precision is not None:
        p = dataclasses.replace(p, precision=precision)
        t = dataclasses.replace(t, fp8_recipe=(t.fp8_recipe or "current") if precision == "fp8" else None)
    return m, p, t


def run_config_from_artifacts(artifacts: Path, shrink_args: dict, data: dict | None = None):
    """The RunConfig of DIR's plan, shrunk; GenconfError (one line) when the shrunk plan breaks a rule."""
    from genconf.catalog import resolve_gpu
    from genconf.train.runtime import RunConfig

    d = read_plan(artifacts)
    model, cluster, plan, num_gpus = specs_from_dict(d)
    train = train_from_dict(d)
    try:
        model, plan, train = shrink(model, plan, train, **{k: v for k, v in shrink_args.items() if v is not None})
    except ValueError as exc:
        raise GenconfError(f"cannot shrink the plan: {exc}") from None
    if shrink_args.get("seq_len") and plan.cp > 1 and plan.seq_length % (2 * plan.cp):
        raise GenconfError(f"--seq-len {plan.seq_length} must be divisible by 2 x cp ({2 * plan.cp})")
    ctx = rules.Context(model, cluster, plan, plan.world_size)
    structural = [v for v in rules.check(ctx) if v.severity == rules.ERROR
                  and v.rule not in ("whole_nodes", "world_size", "tp_inside_node")]
    if structural:
        raise GenconfError(f"the shrunk plan is invalid: {structural[0]}")
    recipe = precision.recipe_for(plan.precision, train.fp8_recipe)
    prediction = {"gpu": cluster.gpu.name, "num_gpus": num_gpus,
                  "tokens_per_s_per_gpu": d.get("perf", {}).get("tokens_per_s_per_gpu"),
                  "peak_mem_gib": d.get("memory", {}).get("total_gib"),
                  "step_time_s": d.get("perf", {}).get("step_time_s"), "layout": d.get("layout")}
    resolve_gpu(cluster.gpu.name)
    return RunConfig(model=model, plan=plan, train=train, num_gpus=plan.world_size, data=data or {"kind": "synthetic"},
                     precision_recipe=recipe.name, prediction=prediction,
                     shrink={k: v for k, v in shrink_args.items() if v is not None}, artifacts=str(artifacts.resolve()))


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
            from genconf.catalog import gpu_for_device_name, resolve_gpu

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
    if cfg.plan.cp > 1 and not (cuda and te):
        raise GenconfError(f"context parallelism (cp={cfg.plan.cp}) needs Transformer Engine attention on a GPU")
    if cfg.model.is_moe and cfg.plan.framework != "megatron":
        raise GenconfError(f"{cfg.model.name} is a mixture of experts: only the megatron launcher runs experts")
    if not cuda:
        refuse_too_big_for_host(cfg)


def refuse_too_big_for_host(cfg) -> None:
    """A CPU run of a full-size plan is killed by the OOM killer, not refused: say so before it starts."""
    import dataclasses as dc

    from genconf.memory import GIB, stage_memory

    plan = dc.replace(cfg.plan, layer_spec="local", sequence_parallel=False)
    per_rank = max(stage_memory(cfg.model, plan, s).total_bytes for s in {0, plan.pp - 1})
    need = per_rank * plan.world_size
    have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need > 0.8 * have:
        raise GenconfError(f"on this CPU the plan needs about {need / GIB:,.0f} GiB ({plan.world_size} ranks x "
                           f"{per_rank / GIB:,.1f} GiB) but the machine has {have / GIB:,.0f} GiB: shrink it for a "
                           f"smoke test (--layers, --hidden, --vocab, --seq-len, --global-batch)")


def entry_point(framework: str) -> Path:
    return resource_dir("launchers") / ENTRY_POINTS[framework]


def launch_local(cfg, run_dir: Path, *, resume: bool, python: str = sys.executable, extra_env: dict | None = None,
                 stdout=None) -> int:
    """torchrun --standalone with one process per rank of the plan (gloo on CPUs, NCCL on GPUs)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if not resume:
        (run_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1, sort_keys=True))
    cmd = [python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={cfg.plan.world_size}",
           str(entry_point(cfg.plan.framework)), "--artifacts", cfg.artifacts, "--run-dir", str(run_dir)]
    if resume:
        cmd.append("--resume")
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
               **(extra_env or {}))
    if not cuda_available():
        env.update(cpu_numerics.pinned_env(env))  # the same loss curve on every x86 CPU (genconf.cpu_numerics)
    print(f"genconf: launching {' '.join(cmd)}", file=sys.stderr, flush=True)
    return subprocess.call(cmd, env=env, stdout=stdout)


def sbatch_script(artifacts: Path, framework: str) -> Path:
    script = artifacts / f"launch_{framework}.sbatch"
    if not script.is_file():
        raise GenconfError(f"{artifacts} has no {script.name}")
    return script


def script_run_dir(script: Path) -> Path:
    """The RUN_DIR the generated sbatch script trains into (the quoted assignment genconf rendered)."""
    import shlex

    for line in script.read_text().splitlines():
        if line.startswith("RUN_DIR="):
            return Path(shlex.split(line.split("=", 1)[1])[0])
    raise GenconfError(f"{script}: no RUN_DIR= line")


JOB_DONE = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
            "PREEMPTED")


def job_state(job_id: str) -> tuple[str, str]:
    """(JobState, ExitCode) from `scontrol show job -o` (no accounting needed)."""
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True)
    fields = dict(kv.split("=", 1) for kv in out.stdout.split() if "=" in kv)
    return fields.get("JobState", "UNKNOWN"), fields.get("ExitCode", "?")


def submit(cfg, artifacts: Path, *, wait: bool, timeout_s: float = 3600) -> int:
    """sbatch the plan's script unchanged; with wait, poll until it ends and surface a failure with the job
    id, its state and the tail of its log."""
    if shutil.which("sbatch") is None:
        raise GenconfError("sbatch is not on PATH: --submit needs a Slurm client (or run without --submit)")
    script = sbatch_script(artifacts, cfg.plan.framework)
    run_dir = script_run_dir(script)
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)  # Slurm opens --output there before the job runs
    (run_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1, sort_keys=True))
    out = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True)
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
    raise GenconfError(f"job {job_id} ended {state} (exit code {code}); logs: {', '.join(str(p) for p in logs) or run_dir}")


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
