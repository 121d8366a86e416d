"""The one training loop (as torchtitan's Trainer and OLMo-core's Trainer drive their TrainSpec / TrainModule): the
loop owns the step cadence, the learning-rate schedule, metrics.jsonl and the progress line, the first step's
memory measurement, checkpoint cadence and bookkeeping, resume and failure injection; a Runner
(genconf.train.runners) builds the framework's model and optimizer and runs, saves and loads it."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist

from genconf.plan.runconfig import RunConfig, unbuildable
from genconf.plan.specs import TrainSpec
from genconf.train import checkpoints, collectives, failure, measure, preempt, runtime, watchdog
from genconf.train.data import source_from


class Runner:
    """What one framework plugs into the loop. `build` sets `model` (what the first-step memory measurement
    reads) and `optimizer` (whose parameter groups get the schedule's learning rate); `step` runs one optimizer
    step over the plan's micro-batches; `save`/`load` write and read the framework's own checkpoint format in a
    step's checkpoint directory. The other hooks default to nothing."""

    framework = ""
    """megatron | deepspeed | fsdp: the precision checks and the launcher's name."""
    label = ""
    """How messages name the framework (DeepSpeed, FSDP)."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.model = None
        self.optimizer = None

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        """The entry point's flags beyond --artifacts, --run-dir and --resume."""

    @staticmethod
    def artifacts_of(args: argparse.Namespace) -> Path | None:
        """The artifacts directory the run's plan comes from (when the run directory has no config.json)."""
        return args.artifacts

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """Around everything, from before the process group exists to after it is gone."""
        yield

    def world_error(self, d: runtime.Dist) -> str | None:
        """Why the started processes do not fit the plan, or None: one process per data-parallel rank here (DeepSpeed
        and FSDP plans are data-parallel only); megatron's runner counts every parallel dimension."""
        plan = self.cfg.plan
        if d.world_size != plan.dp:
            return f"this {self.label} plan has dp={plan.dp} but {d.world_size} processes were started"
        return None

    def setup(self, d: runtime.Dist) -> None:
        """After the process group exists and before the seed is set (model-parallel groups)."""

    def build(self, d: runtime.Dist, run_dir: Path) -> None:
        raise NotImplementedError

    def describe(self) -> str:
        """The start-up line: framework, layout, micro-batches, precision."""
        raise NotImplementedError

    def step(self, step: int, source, d: runtime.Dist) -> tuple[float, float | None]:
        """One optimizer step: (the step's mean loss over every micro-batch and rank, the gradient norm)."""
        raise NotImplementedError

    def step_metrics(self) -> dict:
        """What metrics.jsonl records for every step beyond the loop's columns."""
        return {}

    def save(self, path: Path, d: runtime.Dist) -> None:
        raise NotImplementedError

    def load(self, path: Path, d: runtime.Dist) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """After the last step, before the process group is destroyed."""


def train(runner: Runner, run_dir: Path, *, resume: bool | str) -> int:
    """Run `runner`'s plan from step 0, or from the newest verified checkpoint in `run_dir` when resuming
    (resume="auto": when there is one, else from step 0). Between steps: the hang watchdog's heartbeat, and
    the preemption signal (all ranks agree, checkpoint and stop)."""
    cfg = runner.cfg
    plan, spec = cfg.plan, cfg.train
    store = checkpoints.CheckpointStore(run_dir / runtime.CHECKPOINTS, keep_last=spec.keep_checkpoints,
                                        reserve_bytes=reserve_bytes())
    preemption = preempt.install()
    activity = "starting"
    d = None
    dog = None
    try:
        with runner.session():
            d = runtime.init_distributed()
            error = runner.world_error(d)
            if error:
                runtime.fail(error)
            runner.setup(d)
            runtime.seed_everything(spec.seed)
            activity = "building the model"
            runner.build(d, run_dir)
            found = None
            if resume:
                activity = "verifying checkpoints"
                found = store.newest_verified(rank=d.rank, world=d.world_size, agree=lambda why: _first(why, d))
                if found.path is None and resume != "auto":
                    runtime.fail(f"--resume: {found.summary()} under {store.root}")
                if found.path is None:
                    found = None
            start = found.step if found else 0
            if found:
                refuse_other_run(found.manifest, cfg)
                if start >= spec.train_steps and resume == "auto":  # a requeued job whose run had ended
                    if d.is_main:
                        print(f"genconf: the run already finished at step {start}; nothing to do", flush=True)
                    dist.destroy_process_group()
                    return 0
                if start >= spec.train_steps:
                    runtime.fail(f"--resume: the run finished at step {start} of {spec.train_steps}; give --steps N "
                                 f"(more than {start}) to extend it")
            prepare_run_dir(run_dir, cfg, d, start=start, store=store)
            if found:
                activity = f"loading {found.path.name}"
                if d.is_main:
                    print(f"genconf: {found.summary()}", flush=True)
                runner.load(found.path, d)
            source = source_from(cfg.data, cfg.model.vocab_size, spec.seed)
            metrics = Metrics(run_dir, d, plan.gbs * plan.seq_length, spec.train_steps)
            if d.is_main:
                print(f"genconf: {runner.describe()}", flush=True)
            dog = watchdog.Watchdog.from_env(run_dir, d.rank, predicted_step_s=predicted_step_s(cfg, d))
            if dog is not None:
                dog.start()
            estimate = None
            stopped = None
            for step in range(start, spec.train_steps):
                activity = f"in step {step}"
                lr = set_lr(runner.optimizer, step, spec)
                maybe_slow_down()  # before the step's clock starts: measured step times stay honest
                metrics.start_step()
                maybe_hang(step, d)
                loss, grad_norm = runner.step(step, source, d)
                extra = runner.step_metrics()
                if step == start:
                    extra.update(measure.first_step_memory(runner.model, runner.optimizer, cfg, d))
                    estimate = checkpoint_estimate(runner, d)
                metrics.end_step(step, loss, grad_norm, lr=lr, **extra)
                preempted = _any(preemption.requested, d)
                if should_checkpoint(step, spec) or (preempted and spec.checkpoint_every_steps > 0):
                    activity = f"while saving checkpoint {checkpoints.step_name(step + 1)}"
                    if dog is not None:
                        dog.beat(step, activity, allow_s=save_allowance_s(estimate, d))
                    save_checkpoint(store, runner, step + 1, d, estimate_bytes=estimate, cfg=cfg)
                if dog is not None:
                    dog.beat(step)
                maybe_inject_failure(step, d)
                if preempted and step + 1 < spec.train_steps:  # on the last step the run simply ends
                    stopped = step + 1
                    break
            activity = "finishing"
            dist.barrier()
            if stopped is None and d.is_main:
                preempt.write_finished(run_dir, step=spec.train_steps)
            if stopped is not None and d.is_main:
                saved = store.final_dir(stopped)
                preempt.write_marker(run_dir, step=stopped, checkpoint=saved.name if saved.is_dir() else None)
                under_slurm = "SLURM_JOB_ID" in os.environ  # else `genconf launch` says how to continue
                print(f"genconf: preempted ({preempt.SIGNAL_NAME}) after step {stopped}: "
                      + (f"checkpoint {saved.name} saved" if saved.is_dir() else "no checkpoint (checkpoints are off)")
                      + ((("; the requeued job resumes from it" if saved.is_dir() else "; a requeued job starts over")
                          if under_slurm else "")), flush=True)
            if dog is not None:
                dog.stop()
                dog = None
            runner.close()
            dist.barrier()
            dist.destroy_process_group()
    except (SystemExit, KeyboardInterrupt):
        if dog is not None:
            dog.stop()
        raise
    except BaseException as exc:
        line = failure.record(run_dir, d.rank if d is not None else int(os.environ.get("RANK", "0")),
                              activity, exc)
        print(f"genconf: error: {line}", file=sys.stderr, flush=True)
        raise
    return 0


def exit_process(code: int) -> None:
    """End a training process once main() has returned: every rank is past the last barrier, the process group
    is destroyed and the run's files are closed, so what is left is the interpreter's teardown, where the C++
    destructors of the communication threads can race (a rank finished all 12 steps of the olmo-7b-fsdp recipe,
    then aborted with "terminate called without an active exception", about once in 16 runs under CPU load; torchrun
    then reports the run failed). os._exit skips that teardown; the standard streams are flushed first."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def main(runner_class: type[Runner], argv: list[str] | None = None, *, description: str = "") -> int:
    """A training entry point: `train_<framework>.py --artifacts DIR --run-dir RUN [--resume[=auto]]`."""
    preempt.install()  # before anything slow: a signal that comes early must not end the process
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--artifacts", type=Path, help="directory written by `genconf -o`")
    ap.add_argument("--run-dir", type=Path, required=True)
    ap.add_argument("--resume", nargs="?", const=True, default=False, choices=(True, "auto"),
                    help="continue from the newest verified checkpoint (auto: if there is one; a requeued Slurm job)")
    runner_class.add_arguments(ap)
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    cfg = runtime.load_and_check(args.run_dir, runner_class.artifacts_of(args), runner_class.framework)
    why = unbuildable(cfg.model, cfg.plan)  # a hand-run sbatch script: one line before any rank builds a wrong model
    if why:
        runtime.fail(why)
    runner = runner_class(cfg)
    _KEPT_UNTIL_EXIT.append(runner)
    return train(runner, args.run_dir, resume=args.resume)


_KEPT_UNTIL_EXIT: list = []
"""The runner of main(), never freed: exit_process ends the process with it alive. Freed when main() returned, it
dropped DDP's Reducer, the last holder of the destroyed gloo process group, whose destructor then joined its worker
thread and hung for good (a finished 2-rank FSDP run under CPU load, torch 2.13: ~ProcessGroupGloo in
std::thread::join from the frame's teardown; torchrun waited on that rank)."""


# --- metrics, schedule, checkpoints ---------------------------------------------------------------

class Metrics:
    """metrics.jsonl (one JSON object per step) and a progress line, written by rank 0 only."""

    def __init__(self, run_dir: Path, d: runtime.Dist, tokens_per_step: int, total_steps: int) -> None:
        self.run_dir, self.d, self.tokens_per_step, self.total_steps = run_dir, d, tokens_per_step, total_steps
        self._t0 = time.perf_counter()

    def start_step(self) -> None:
        if self.d.device.type == "cuda":
            torch.cuda.synchronize()
        self._t0 = time.perf_counter()

    def end_step(self, step: int, loss: float, grad_norm: float | None, **extra) -> dict:
        if self.d.device.type == "cuda":
            torch.cuda.synchronize()
        step_time = time.perf_counter() - self._t0
        mem, kind = runtime.peak_memory_gib(self.d.device)
        row = {"step": step, "loss": loss, "grad_norm": grad_norm, "step_time_s": step_time,
               "tokens_per_s": self.tokens_per_step / step_time,
               "tokens_per_s_per_gpu": self.tokens_per_step / step_time / self.d.world_size,
               "peak_mem_gib": mem, "peak_mem_kind": kind, **extra}
        if self.d.is_main:
            with open(self.run_dir / runtime.METRICS, "a") as f:
                f.write(json.dumps(row, sort_keys=True) + "\n")
            gn = f"{grad_norm:.3f}" if grad_norm is not None else "-"
            print(f"step {step:>5}/{self.total_steps} | loss {loss:.4f} | grad norm {gn} | "
                  f"{row['tokens_per_s']:,.0f} tok/s | {step_time:.3f} s | mem {mem:.2f} GiB", flush=True)
        return row


def prepare_run_dir(run_dir: Path, cfg: RunConfig, d: runtime.Dist, *, start: int,
                    store: checkpoints.CheckpointStore | None = None) -> None:
    """Write config/versions/seed (rank 0), keep metrics.jsonl's rows before `start`, and forget the preemption
    marker of an earlier launch. Starting at step 0 in a directory that holds an earlier run's metrics and
    checkpoints starts over: both are removed (the checkpoints with one line), so a later resume cannot mix runs."""
    if d.is_main:
        if start == 0 and store is not None:
            removed = store.clear()
            if removed:
                print(f"genconf: starting over in {run_dir}: removed {len(removed)} checkpoint(s) of an earlier run "
                      f"(newest {removed[-1].name})", flush=True)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / runtime.RUN_CONFIG).write_text(json.dumps(cfg.to_dict(), indent=1, sort_keys=True))
        (run_dir / runtime.VERSIONS).write_text(json.dumps(runtime.versions(), indent=1, sort_keys=True))
        (run_dir / "seed").write_text(f"{cfg.train.seed}\n")
        metrics = run_dir / runtime.METRICS
        if metrics.exists():
            text = metrics.read_text()
            lines = [line for line in text.splitlines() if line.strip()]
            if lines and not text.endswith("\n"):
                lines = lines[:-1]  # cut mid-write by a killed run: a step the checkpoint does not hold either
            kept = [line for line in lines if json.loads(line)["step"] < start]
            metrics.write_text("".join(line + "\n" for line in kept))
        preempt.clear_marker(run_dir)
    if dist.is_initialized():
        dist.barrier()


# --- checkpoints through genconf.train.checkpoints ------------------------------------------------

RESERVE_ENV = "GENCONF_CHECKPOINT_RESERVE_MIB"
SAVE_MIN_BYTES_PER_S = 50e6
"""The slowest storage the watchdog allows for a save (50 MB/s, a busy network file system), on top of its usual timeout."""


def reserve_bytes() -> int:
    """Free space a save must leave: GENCONF_CHECKPOINT_RESERVE_MIB, default genconf.train.checkpoints.RESERVE_BYTES."""
    value = os.environ.get(RESERVE_ENV)
    return int(float(value) * 2**20) if value else checkpoints.RESERVE_BYTES


def checkpoint_meta(cfg: RunConfig, world_size: int) -> dict:
    """What a checkpoint must agree with to be loaded: the framework and every degree of the layout."""
    from genconf.plan.memory import vocab_rows

    p = cfg.plan
    return {"framework": p.framework, "world_size": world_size, "model": cfg.model.name,
            "layout": {"tp": p.tp, "pp": p.pp, "vp": p.vp, "cp": p.cp, "ep": p.ep, "dp": p.dp, "zero": p.zero_stage},
            "vocab_rows": vocab_rows(cfg.model, cfg.plan), "train_steps": cfg.train.train_steps}


def refuse_other_run(manifest: dict | None, cfg: RunConfig) -> None:
    """One line, exit 2, when a checkpoint was written by another framework or layout, or holds another number of
    vocabulary rows (a DeepSpeed/FSDP checkpoint from before genconf's own model padded its vocabulary records none:
    it holds the vocabulary unpadded; the padding was to a multiple of 64 from 858e46f, of 128 from 35c45de)."""
    meta = (manifest or {}).get("meta") or {}
    ours = checkpoint_meta(cfg, cfg.plan.world_size)
    for key in ("framework", "world_size", "layout"):
        if key in meta and meta[key] != ours[key]:
            runtime.fail(f"--resume: the checkpoint was written with {key} {meta[key]}, this run has {ours[key]}")
    if meta and meta.get("framework") == cfg.plan.framework:
        before = ours["vocab_rows"] if cfg.plan.framework == "megatron" else cfg.model.vocab_size
        rows, now = meta.get("vocab_rows", before), ours["vocab_rows"]
        if rows != now:
            runtime.fail(f"--resume: the checkpoint holds {rows} vocabulary rows, this run's model {now} (genconf's "
                         f"own model pads its vocabulary: to a multiple of 64 from 858e46f, of 128 from 35c45de): "
                         f"resume it with the genconf that wrote it, or start a new run")


def checkpoint_estimate(runner: Runner, d: runtime.Dist) -> int:
    """Bytes the first checkpoint will take: every rank's parameters and optimizer states, summed (what the
    runners save, give or take the RNG state; DeepSpeed's 16-bit weights are saved once, so this errs high)."""
    module = getattr(runner.model, "module", runner.model)
    local = measure.param_bytes(module) + measure.optimizer_bytes(runner.optimizer)
    return int(collectives.sum_over_ranks([float(local)], d)[0])


def save_allowance_s(estimate: int | None, d: runtime.Dist) -> float:
    """How long the watchdog lets a save take: this rank's share at the slowest storage we accept, hashing included."""
    return 2 * (estimate or 0) / max(1, d.world_size) / SAVE_MIN_BYTES_PER_S


def save_checkpoint(store: checkpoints.CheckpointStore, runner: Runner, step: int, d: runtime.Dist, *,
                    estimate_bytes: int | None, cfg: RunConfig) -> None:
    """Save step's checkpoint through the store: rank 0 checks the free space and stages, every rank writes and
    hashes its share, rank 0 writes the manifest and renames. A save the disk cannot hold stops the run before
    anything is written (issue 13: the disk filled and the run died with "exited with code 1"): one line naming
    the free and the needed bytes, recorded for the launcher, exit 2 on every rank; the checkpoints before it
    are intact, so the run resumes from the newest once space is freed."""
    why = None
    if d.is_main:
        try:
            store.begin(step, expected_bytes=store.expected_bytes(estimate_bytes))
        except checkpoints.NoSpaceError as exc:
            why = str(exc)
    why = _first(why, d)
    if why:
        line = f"rank {d.rank} stopped before checkpoint {checkpoints.step_name(step)}: {why}"
        if d.is_main:
            failure.record_line(store.root.parent, d.rank, line)
            print(f"genconf: error: {line}", file=sys.stderr, flush=True)
        dist.destroy_process_group()  # every rank is here (the reason was shared): end cleanly, not by abort
        raise SystemExit(2)
    runner.save(store.staging_dir(step), d)
    dist.barrier()
    entries = store.hash_share(step, d.rank, d.world_size)
    gathered: list = [None] * d.world_size
    dist.all_gather_object(gathered, entries)
    if d.is_main:
        store.commit(step, [e for part in gathered for e in part], checkpoint_meta(cfg, d.world_size))
    dist.barrier()


def _any(flag: bool, d: runtime.Dist) -> bool:
    """True on every rank when it is true on any (the preemption signal reaches ranks at different steps)."""
    return collectives.max_over_ranks([1.0 if flag else 0.0], d)[0] > 0


def _first(value, d: runtime.Dist):
    """The first rank's non-None value, on every rank (an all-gather of small Python objects)."""
    if d.world_size == 1:
        return value
    gathered: list = [None] * d.world_size
    dist.all_gather_object(gathered, value)
    return next((v for v in gathered if v), None)


def predicted_step_s(cfg: RunConfig, d: runtime.Dist) -> float | None:
    """The planner's step time, for the watchdog, where it describes this run: the full-size plan on a GPU."""
    step_s = (cfg.prediction or {}).get("step_time_s")
    return float(step_s) if step_s and d.device.type == "cuda" and not cfg.shrink else None


def should_checkpoint(step: int, train: TrainSpec) -> bool:
    """After step `step` (0-based) completes: every N steps and after the last one; never when N is 0."""
    done = step + 1
    return train.checkpoint_every_steps > 0 and (done == train.train_steps or done % train.checkpoint_every_steps == 0)


def lr_at(step: int, train: TrainSpec) -> float:
    """Linear warm-up then cosine/linear decay to min_lr, or constant (what the artifacts configure)."""
    if train.warmup_steps and step < train.warmup_steps:
        return train.lr * (step + 1) / train.warmup_steps
    if train.lr_decay == "constant":
        return train.lr
    span = max(1, train.train_steps - train.warmup_steps)
    progress = min(1.0, (step - train.warmup_steps) / span)
    if train.lr_decay == "linear":
        return train.lr - (train.lr - train.min_lr) * progress
    return train.min_lr + 0.5 * (train.lr - train.min_lr) * (1 + math.cos(math.pi * progress))


def set_lr(optimizer, step: int, train: TrainSpec) -> float:
    """Apply the schedule's learning rate for `step` to every parameter group; returns it."""
    lr = lr_at(step, train)
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr


def maybe_hang(step: int, d: runtime.Dist) -> None:
    """Test hook: GENCONF_HANG_STEP=N (and GENCONF_HANG_RANK=r, default 0) makes rank r stop making progress in
    step N, to exercise the watchdog; the other ranks then wait for it in the step's first collective."""
    hang = os.environ.get("GENCONF_HANG_STEP")
    if hang is not None and step == int(hang) and d.rank == int(os.environ.get("GENCONF_HANG_RANK", "0")):
        while True:
            time.sleep(3600)


def maybe_slow_down() -> None:
    """Test hook: GENCONF_STEP_SLEEP_S=S makes every step S seconds longer (numerics unchanged), so that a short
    Slurm time limit ends a tiny run in the middle (the preemption test)."""
    delay = os.environ.get("GENCONF_STEP_SLEEP_S")
    if delay:
        time.sleep(float(delay))


def maybe_inject_failure(step: int, d: runtime.Dist) -> None:
    """Test hook: GENCONF_FAIL_STEP=N (and GENCONF_FAIL_RANK=r, default 0) makes rank r raise after step N,
    to exercise how launchers and Slurm report a dying job."""
    fail_step = os.environ.get("GENCONF_FAIL_STEP")
    if fail_step is not None and step == int(fail_step) and d.rank == int(os.environ.get("GENCONF_FAIL_RANK", "0")):
        raise RuntimeError(f"injected failure on rank {d.rank} after step {step} (GENCONF_FAIL_STEP)")
