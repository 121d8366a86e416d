"""A run, resolved: RunConfig (what RUN/config.json holds and every training entry point reads) and `shrink`, the
smoke-test version of a plan that keeps its parallel layout. Pure: `genconf launch` writes it, the torch runtime
reads it, neither reaches into the other."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from genconf.plan import rules
from genconf.plan.batch import default_batch, global_batch_for
from genconf.plan.counting import exact_param_count
from genconf.plan.errors import GenconfError
from genconf.plan.planfile import PlanFile, decode, load, model_from_dict, plan_from_dict
from genconf.plan.precision import plan_in_precision, recipe_for
from genconf.plan.specs import ModelSpec, ParallelPlan, TrainSpec


@dataclass(frozen=True)
class RunConfig:
    """Everything a run needs, resolved: written to RUN/config.json by `genconf launch`."""

    model: ModelSpec
    plan: ParallelPlan
    train: TrainSpec
    num_gpus: int
    data: dict
    precision_recipe: str
    prediction: dict
    """What the planner predicted for the full-size plan: tokens_per_s_per_gpu, peak_mem_gib, gpu."""
    shrink: dict
    """Smoke-test overrides applied to the artifact's plan (layers, hidden, steps, ...)."""
    artifacts: str
    speed: dict = dataclasses.field(default_factory=dict)
    """Speed switches the runners apply on a GPU (genconf.train.speed.SpeedOptions as a dict; {} = defaults)."""

    def to_dict(self) -> dict:
        return {"model": dataclasses.asdict(self.model), "plan": dataclasses.asdict(self.plan),
                "train": dataclasses.asdict(self.train), "num_gpus": self.num_gpus, "data": self.data,
                "precision_recipe": self.precision_recipe, "prediction": self.prediction, "shrink": self.shrink,
                "artifacts": self.artifacts, "speed": self.speed}

    @classmethod
    def from_dict(cls, d: dict) -> "RunConfig":
        return cls(model=model_from_dict(d["model"]), plan=plan_from_dict(d["plan"]), train=TrainSpec(**d["train"]),
                   num_gpus=int(d["num_gpus"]), data=d.get("data") or {"kind": "synthetic"},
                   precision_recipe=d["precision_recipe"], prediction=d.get("prediction") or {},
                   shrink=d.get("shrink") or {}, artifacts=d.get("artifacts", ""), speed=d.get("speed") or {})


def shrink(model: ModelSpec, plan: ParallelPlan, train: TrainSpec, *, layers: int | None = None,
           hidden: int | None = None, heads: int | None = None, vocab: int | None = None, seq_len: int | None = None,
           global_batch: int | None = None, mbs: int | None = None, steps: int | None = None,
           lr: float | None = None, checkpoint_every: int | None = None, keep_checkpoints: int | None = None,
           precision: str | None = None) -> tuple[ModelSpec, ParallelPlan, TrainSpec]:
    """A smaller model and run with the same parallel layout (tp, pp, vp, cp, ep, dp, zero, recompute). A smaller
    model without --global-batch also gets a smaller batch: its own default, if below the plan's."""
    m, p, t = model, plan, train
    if layers is not None:
        # An uneven split is specific to the full model's layer count: the shrunk model splits evenly.
        m = dataclasses.replace(m, num_layers=layers)
        p = p.with_layout(None)
    if hidden is not None or heads is not None:
        h = hidden or m.hidden_size
        a = heads or m.num_attention_heads
        if h % a:
            if hidden is None:
                raise GenconfError(f"--heads {a} does not divide the model's hidden size {h}: give --heads dividing "
                                   f"it, or --hidden")
            raise GenconfError(f"--hidden {h} is not divisible by {a} attention heads"
                               + (": give --heads dividing it, or another --hidden" if heads else
                                  f" (the model's): give --heads dividing {h}, or a --hidden divisible by {a}"))
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
        doc = p.packed_doc_tokens
        p = dataclasses.replace(p, seq_length=seq_len, packed_doc_tokens=None if doc is None else min(doc, seq_len))
    if global_batch is None and any(v is not None for v in (layers, hidden, heads, vocab, seq_len)):
        # A smaller model wants a smaller batch (genconf.plan.batch): the shrunk model's default, never more than the
        # plan's, in whole units of the layout (mbs x dp, x pp when interleaved) so the layout stays valid.
        micro, unit = mbs or p.mbs, (mbs or p.mbs) * p.dp * (p.pp if p.vp > 1 else 1)
        smaller = global_batch_for(default_batch(exact_param_count(m), p.seq_length), unit,
                                   microbatch_sequences=micro * p.dp)
        if smaller < p.gbs:
            p = dataclasses.replace(p, gbs=smaller)
    if global_batch is not None or mbs is not None:
        gbs = global_batch or p.gbs
        per_rank = max(1, gbs // p.dp)
        # Without --mbs, the largest micro-batch <= the plan's that still divides the per-rank batch.
        micro = mbs or max(m for m in range(1, min(p.mbs, per_rank) + 1) if per_rank % m == 0)
        p = dataclasses.replace(p, gbs=gbs, mbs=micro)
    if steps is not None:
        t = dataclasses.replace(t, train_steps=steps, warmup_steps=min(t.warmup_steps, max(1, steps // 10)),
                                checkpoint_every_steps=min(t.checkpoint_every_steps, steps))
    if lr is not None:
        t = dataclasses.replace(t, lr=lr, min_lr=min(t.min_lr, lr / 10))
    if checkpoint_every is not None:
        t = dataclasses.replace(t, checkpoint_every_steps=checkpoint_every)
    if keep_checkpoints is not None:
        t = dataclasses.replace(t, keep_checkpoints=keep_checkpoints)
    if precision is not None:
        p = plan_in_precision(p, precision)
        t = dataclasses.replace(t, fp8_recipe=recipe_for(precision, t.fp8_recipe).train_fp8_recipe)
    return m, p, t


def read_plan(artifacts: Path) -> PlanFile:
    """The decoded plan.json of an artifacts directory."""
    path = artifacts / "plan.json"
    if not path.is_file():
        if artifacts.is_file() and artifacts.name == "plan.json":
            raise GenconfError(f"{artifacts} is the plan file: give its directory, {artifacts.parent}")
        if (artifacts / "config.json").is_file() and (artifacts / "metrics.jsonl").exists():
            raise GenconfError(f"{artifacts} is a run directory: give the artifacts directory it was launched from "
                               f"(and --run-dir {artifacts} --resume to continue it)")
        if artifacts.is_file():  # '-o afile' would fail: it is a file, not an artifacts directory
            raise GenconfError(f"{artifacts} is a file: give an artifacts directory (written by genconf ... -o DIR)")
        if not artifacts.exists():
            raise GenconfError(f"{artifacts} does not exist: give an artifacts directory (write one with: genconf "
                               f"... -o {artifacts})")
        raise GenconfError(f"{artifacts} has no plan.json (write one with: genconf ... -o {artifacts})")
    return decode(load(path), str(path))


def _structural(model: ModelSpec, cluster, plan: ParallelPlan) -> list:
    """The rule errors a shrunk plan must not have (the cluster's node shape aside: a smoke test runs on what is here)."""
    ctx = rules.Context(model, cluster, plan, plan.world_size)
    return [v for v in rules.check(ctx) if v.severity == rules.ERROR
            and v.rule not in ("whole_nodes", "world_size", "tp_inside_node")]


def from_artifacts(artifacts: Path, shrink_args: dict, data: dict | None = None) -> RunConfig:
    """The RunConfig of DIR's plan, shrunk; GenconfError (one line) when the shrunk plan breaks a rule."""
    pf = read_plan(artifacts)
    d, model, cluster, plan, num_gpus, train = pf.run, pf.model, pf.cluster, pf.plan, pf.num_gpus, pf.train
    try:
        model, plan, train = shrink(model, plan, train, **{k: v for k, v in shrink_args.items() if v is not None})
    except ValueError as exc:
        raise GenconfError(f"cannot shrink the plan: {exc}") from None
    if shrink_args.get("seq_len") and plan.cp > 1 and plan.seq_length % (2 * plan.cp):
        raise GenconfError(f"--seq-len {plan.seq_length} must be divisible by 2 x cp ({2 * plan.cp})")
    structural = _structural(model, cluster, plan)
    if structural:
        v = structural[0]
        layers = shrink_args.get("layers")
        if v.rule == "pipeline_split" and layers and plan.pp_layout is None:
            # launch has no --pp: the layers are what a smoke test changes
            slots = plan.pp * plan.vp
            raise GenconfError(f"the shrunk plan is invalid: --layers {layers} does not split over pp {plan.pp} x vp "
                               f"{plan.vp}; give a multiple of {slots} (at least {slots})")
        batch = shrink_args.get("global_batch")
        if v.rule in ("interleave_microbatches", "batch_divisible") and batch:
            # The next batch the shrink (which picks the micro-batch) and the rules both take.
            for gbs in range(batch + 1, batch + 64 * max(1, pf.plan.dp * pf.plan.pp) + 1):
                try:
                    m2, p2, _ = shrink(pf.model, pf.plan, pf.train, **{**{k: v2 for k, v2 in shrink_args.items()
                                                                          if v2 is not None}, "global_batch": gbs})
                except (ValueError, GenconfError):
                    continue
                if not _structural(m2, cluster, p2):
                    raise GenconfError(f"the shrunk plan is invalid: {v.rule}: --global-batch {batch} gives "
                                       f"{plan.num_microbatches} micro-batches of {plan.mbs}; use --global-batch {gbs}")
        shrunk = any(shrink_args.get(k) is not None for k in ("layers", "hidden", "heads", "vocab", "seq_len",
                                                               "global_batch", "mbs"))
        raise GenconfError(f"the shrunk plan is invalid: {v}" if shrunk else f"{artifacts / 'plan.json'} is invalid: {v}")
    recipe = recipe_for(plan.precision, plan.fp8_recipe or train.fp8_recipe)
    prediction = {"gpu": cluster.gpu.name, "num_gpus": num_gpus,
                  "tokens_per_s_per_gpu": d.get("perf", {}).get("tokens_per_s_per_gpu"),
                  "peak_mem_gib": d.get("memory", {}).get("total_gib"),
                  "step_time_s": d.get("perf", {}).get("step_time_s"), "layout": d.get("layout")}
    return RunConfig(model=model, plan=plan, train=train, num_gpus=plan.world_size, data=data or {"kind": "synthetic"},
                     precision_recipe=recipe.name, prediction=prediction,
                     shrink={k: v for k, v in shrink_args.items() if v is not None}, artifacts=str(artifacts.resolve()))


RESUME_MAY_CHANGE = ("steps", "checkpoint_every", "keep_checkpoints")
"""Flags a resumed run takes: its length (the schedule is then defined over the new length) and its checkpoint
policy (when to save, how many to keep: nothing the loss curve depends on). Every other flag must agree."""


def _saved_value(saved: RunConfig, flag: str):
    m, p, t = saved.model, saved.plan, saved.train
    return {"layers": m.num_layers, "hidden": m.hidden_size, "heads": m.num_attention_heads, "vocab": m.vocab_size,
            "seq_len": p.seq_length, "global_batch": p.gbs, "mbs": p.mbs, "lr": t.lr, "precision": p.precision}[flag]


def resumed(saved: RunConfig, flags: dict, data: dict | None = None,
            framework: str | None = None) -> tuple[RunConfig, list[str]]:
    """The saved run with the flags a resume may change applied, and what changed in words. Any other flag that
    disagrees with the saved run is a GenconfError naming both values (a resumed run keeps its settings)."""
    for flag, value in flags.items():
        if value is None or flag in RESUME_MAY_CHANGE:
            continue
        was = _saved_value(saved, flag)
        if value != was:
            name = "--" + flag.replace("_", "-")
            raise GenconfError(f"--resume: {name} {value} disagrees with the saved run ({name} {was}); a resumed run "
                               f"keeps its settings: drop the flag, or start a new run (--name)")
    if framework is not None and framework != saved.plan.framework:
        raise GenconfError(f"--resume: --framework {framework} disagrees with the saved run (--framework "
                           f"{saved.plan.framework})")
    if data is not None and (data.get("path"), data.get("dtype")) != (saved.data.get("path"), saved.data.get("dtype")):
        was = f"--data {saved.data['path']} --data-dtype {saved.data.get('dtype')}" if saved.data.get("path") else \
            "synthetic tokens"
        raise GenconfError(f"--resume: --data {data['path']} --data-dtype {data['dtype']} disagrees with the saved run "
                           f"({was})")
    t, notes = saved.train, []
    steps = flags.get("steps")
    if steps is not None and steps != t.train_steps:
        verb = "extending" if steps > t.train_steps else "shortening"
        notes.append(f"{verb} the run from {t.train_steps:,} to {steps:,} steps: the learning-rate schedule ({t.lr_decay}, "
                     f"{t.warmup_steps:,} warm-up step{'' if t.warmup_steps == 1 else 's'}) is now defined over {steps:,} steps; the steps already trained "
                     f"followed the {t.train_steps:,}-step schedule")
        t = dataclasses.replace(t, train_steps=steps)
    if flags.get("checkpoint_every") is not None and flags["checkpoint_every"] != t.checkpoint_every_steps:
        every = flags["checkpoint_every"]
        notes.append(f"checkpoints every {every:,} steps (was {t.checkpoint_every_steps:,})" if every else
                     "checkpoints off (--checkpoint-every 0)")
        t = dataclasses.replace(t, checkpoint_every_steps=every)
    if flags.get("keep_checkpoints") is not None and flags["keep_checkpoints"] != t.keep_checkpoints:
        notes.append(f"keeping the newest {flags['keep_checkpoints']} checkpoints (was {t.keep_checkpoints})")
        t = dataclasses.replace(t, keep_checkpoints=flags["keep_checkpoints"])
    shrink = dict(saved.shrink, **{k: flags[k] for k in RESUME_MAY_CHANGE if flags.get(k) is not None})
    return dataclasses.replace(saved, train=t, shrink=shrink), notes


def compile_supported(plan) -> bool:
    """Whether genconf's runner compiles this plan's decoder blocks when the run asks (launch --compile): DeepSpeed
    ZeRO 0-2 and DDP (FSDP NO_SHARD). ZeRO-3 swaps parameters in and out around each module, and FSDP1 needs
    use_orig_params=True under torch.compile, which changes what the optimizer holds from what memory counts."""
    if plan.framework == "deepspeed":
        return plan.zero_stage != 3
    return plan.framework == "fsdp" and plan.zero_stage == 0


def needs_te_attention(model: ModelSpec, plan: ParallelPlan) -> str | None:
    """Why this run needs Transformer Engine attention on a GPU (None: megatron-core's local spec runs it, on a CPU
    too): what `genconf launch` and the megatron runner refuse where TE or a GPU is missing."""
    if plan.cp > 1:
        return f"context parallelism (cp={plan.cp}) needs Transformer Engine attention on a GPU"
    if model.mla and plan.framework == "megatron":
        # megatron-core 0.16.1 multi_latent_attention.py:162 passes k_channels and v_channels to its core attention;
        # the local spec's DotProductAttention takes neither (TypeError), only TEDotProductAttention does. Past that,
        # without TE its isinstance(self.linear_proj, TELinear) (line 185) meets the MagicMock that
        # extensions/transformer_engine.py puts in TE's place, another TypeError.
        return (f"{model.name} has multi-latent attention, which megatron-core 0.16.1 builds only with Transformer "
                f"Engine attention on a GPU: its local DotProductAttention takes no k_channels/v_channels, which "
                f"MLASelfAttention passes it; launch it on a CUDA machine with pip install -e '.[te]', or smoke-test "
                f"the rest of the shape here from a copy of the model without its MLA fields (q_lora_rank, "
                f"kv_lora_rank, qk_head_dim, qk_pos_emb_head_dim, v_head_dim)")
    return None


def unbuildable(model: ModelSpec, plan: ParallelPlan) -> str | None:
    """Why genconf's runners cannot train this plan as planned (None: they can), on any machine: what
    `genconf launch` refuses before anything starts, `launch --submit` before sbatch, and the runners themselves at
    start-up (a hand-run sbatch script), each with this line; the artifacts README says it too."""
    m, p = model, plan
    pretrain = "run megatron_args.txt with Megatron-LM's pretrain_gpt.py"
    if m.is_moe and p.framework != "megatron":
        return f"{m.name} is a mixture of experts: only the megatron launcher runs experts"
    if m.is_hybrid:
        return (f"{m.name} is a hybrid Mamba model: genconf's launchers build GPT models; run megatron_args.txt with "
                "Megatron-LM's pretrain_mamba.py (mamba_ssm and causal-conv1d, CUDA only)")
    if m.mla and p.framework != "megatron":
        return (f"{m.name} has multi-latent attention: only the megatron launcher builds it (megatron-core's "
                f"MLASelfAttention); re-plan with --framework megatron")
    if m.moe_latent_size:
        # megatron-core 0.16.1 builds the latent projections only with Transformer Engine (moe_layer.py:171), a path
        # genconf's runner has not been run on.
        return f"{m.name} has latent experts: genconf's megatron launcher builds full-width experts; {pretrain}"
    if m.mtp_num_layers and p.framework != "megatron":
        return (f"{m.name} has {m.mtp_num_layers} multi-token-prediction layer(s): only the megatron launcher builds "
                f"them (megatron-core's MultiTokenPredictionBlock); re-plan with --framework megatron")
    if m.mtp_repeated_layer:
        # megatron-core 0.16.1 has no shared MTP layer: it would build mtp_num_layers separate ones, which genconf
        # counts as one (ModelSpec.mtp_blocks).
        return (f"{m.name} repeats one multi-token-prediction layer {m.mtp_num_layers} times, which megatron-core "
                f"0.16.1 cannot build (--mtp-use-repeated-layer needs megatron-core 0.17+); {pretrain} on 0.17+")
    if p.moe_ep_overlap:
        return (f"--moe-ep-overlap: genconf's megatron launcher does not build megatron-core's combined 1F1B schedule "
                f"plan; {pretrain}, or re-plan without it")
    if p.moe_dispatcher != "alltoall":
        return (f"--moe-dispatcher {p.moe_dispatcher}: genconf's megatron launcher dispatches tokens with megatron's "
                f"all-to-all (DeepEP and HybridEP are CUDA/NVSHMEM libraries); {pretrain}, or re-plan without it")
    if p.attention_kernel == "triton":
        return ("--attention-kernel triton describes Triton flash attention (llm-foundry's attn_impl: triton); "
                "genconf's runners run scaled_dot_product_attention: re-plan with --attention-kernel cudnn, flash2 or "
                "auto")
    if p.packed_doc_tokens is not None and p.packed_doc_tokens < p.seq_length:
        return (f"--packed-doc-len {p.packed_doc_tokens}: the plan's speed assumes documents packed into each "
                "sequence, and genconf's runners train on whole synthetic sequences, so verify would compare unlike "
                "runs; re-plan without it to launch here")
    if p.cuda_graph_impl != "none":
        return (f"--cuda-graph-impl {p.cuda_graph_impl}: genconf's megatron launcher runs eagerly (it does not capture "
                f"CUDA graphs); {pretrain}, or re-plan without it")
    return None
