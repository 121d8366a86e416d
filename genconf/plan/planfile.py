"""plan.json, the one codec: `encode` turns a planned run into the JSON-able dict that `--json` prints and
plan.json holds, `dumps`/`loads`/`load` are its text, `decode` gives the specs back. Every reader of a plan
(render, check, launch, verify, recipes) goes through here; the text for people is genconf.cli.text.

The dict carries the whole model spec, the cluster and the plan, so `genconf render plan.json` can
rebuild every artifact without the catalog.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from dataclasses import dataclass
from pathlib import Path

from genconf import __version__
from genconf.plan.batch import batch_summary
from genconf.plan.checkpoint_size import checkpoint_size
from genconf.plan.cost import Calibration, StepCost, training_time_s, utilization_warning
from genconf.plan.counting import active_param_count, exact_param_count, workshop_param_count
from genconf.plan.errors import GenconfError
from genconf.plan.memory import GIB, HEADROOM_FRACTION, MemoryEstimate, megatron_optimizer_bytes
from genconf.plan.pipeline import stage_layers
from genconf.plan.precision import recipe_for
from genconf.plan.search import Evaluation, SearchResult, describe, same_layout
from genconf.plan.specs import ClusterSpec, GPUSpec, ModelSpec, ParallelPlan, TrainSpec

SCHEMA_VERSION = 1
"""plan.json's format version, written as `schema_version`."""


# --- encode ---------------------------------------------------------------------------------------


def _gib(n: float) -> float:
    return round(n / GIB, 3)


def memory_dict(est: MemoryEstimate) -> dict:
    """The busiest stage's memory, each figure in GiB (rounded) and exact bytes. allocated: live tensors at the
    peak (torch.cuda.max_memory_allocated); reserved: what the caching allocator holds
    (max_memory_reserved); device: reserved + CUDA context and NCCL (nvidia-smi); total: what the plan must
    fit (allocated + fragmentation that cannot be released + runtime)."""
    peak = est.peak
    parts = (("params", peak.params_bytes), ("grads", peak.grads_bytes), ("optimizer", peak.optimizer_bytes),
             ("activations", peak.activations_bytes), ("other", peak.other_bytes),
             ("allocated", peak.allocated_bytes), ("reserved", peak.reserved_bytes), ("device", peak.device_bytes),
             ("total", peak.total_bytes), ("capacity", est.capacity_bytes), ("usable", est.usable_bytes))
    d: dict = {}
    for name, value in parts:
        d[f"{name}_gib"] = _gib(value)
        d[f"{name}_bytes"] = int(value)
    d.update(peak_stage=peak.stage, other={name: _gib(b) for name, b in peak.other},
             other_bytes_by_name={name: int(b) for name, b in peak.other},
             fragmentation_bytes=int(peak.unreleasable_bytes), runtime_bytes=int(peak.runtime_bytes),
             stages=[{"stage": s.stage, "layers": s.layers, "total_gib": _gib(s.total_bytes),
                      "total_bytes": int(s.total_bytes), "params_gib": _gib(s.params_bytes),
                      "params_bytes": int(s.params_bytes), "activations_gib": _gib(s.activations_bytes),
                      "activations_bytes": int(s.activations_bytes)} for s in est.stages])
    return d


def perf_dict(cost: StepCost) -> dict:
    return {
        "step_time_s": round(cost.step_time_s, 4), "tflops_per_gpu": round(cost.tflops_per_gpu, 1),
        "hardware_tflops_per_gpu": round(cost.hardware_tflops_per_gpu, 1), "mfu": round(cost.mfu, 4),
        "mfu_causal_halved": round(cost.mfu_causal_halved, 4),
        "hfu": round(cost.hfu, 4), "hfu_causal_halved": round(cost.hfu_causal_halved, 4), "tokens_per_s": round(cost.tokens_per_s, 1),
        "tokens_per_s_per_gpu": round(cost.tokens_per_s_per_gpu, 1),
        "bubble_fraction": round(cost.bubble_fraction, 6),  # 4 digits read 1.1% beside why's 1.2% (0.011533)
        "peak_tflops_per_gpu": cost.peak_tflops_per_gpu,
        "breakdown_s": {k: round(v, 4) for k, v in (
            ("compute", cost.compute_s - cost.tp_comm_s), ("tp_comm", cost.tp_comm_s), ("bubble", cost.bubble_s),
            ("pp_comm", cost.pp_comm_s), ("dp_comm", cost.dp_comm_s), ("optimizer", cost.optimizer_s),
            ("overhead", cost.overhead_s))},
    }


def plan_dict(plan: ParallelPlan, model: ModelSpec) -> dict:
    d = dataclasses.asdict(plan)
    d.update(distributed_optimizer=plan.distributed_optimizer, fsdp_sharding_strategy=plan.fsdp_sharding_strategy,
             num_microbatches=plan.num_microbatches, stage_layers=list(stage_layers(model.num_layers, plan)))
    return d


def model_dict(model: ModelSpec, alias: str | None) -> dict:
    d = dataclasses.asdict(model)
    d.update(params=exact_param_count(model), params_active=active_param_count(model),
             params_workshop=workshop_param_count(model), alias=alias)
    if model.sliding_window:
        d.update(windowed_layers=model.windowed_layers, window_text=model.window_text)
    return d


def cluster_dict(cluster: ClusterSpec, num_gpus: int) -> dict:
    return {
        "name": cluster.name, "gpu": cluster.gpu.name, "gpu_display_name": cluster.gpu.display_name,
        "num_gpus": num_gpus, "gpus_per_node": cluster.gpus_per_node,
        "num_nodes": max(1, num_gpus // cluster.gpus_per_node),
        # The resolved domain, as `genconf hardware --json` gives it (null, the spec's "the node", read as 4 on one
        # command and null on the other).
        "nvlink_domain_gpus": cluster.nvlink_domain, "ib_gbit_per_s_per_gpu": cluster.ib_gbit_per_s_per_gpu,
        "hbm_gib": cluster.gpu.hbm_gib, "cpu_mem_gib_per_node": cluster.cpu_mem_gib_per_node,
        "host_link_gbyte_per_s_per_gpu": cluster.host_link_gbyte_per_s_per_gpu, "host_cpu": cluster.host_cpu,
        "nccl_env": dict(cluster.nccl_env),
        # A PCIe card's NVLink bridge only where it has one: files of the other GPUs stay as they were.
        "gpu_spec": {k: v for k, v in dataclasses.asdict(cluster.gpu).items()
                     if k != "nvlink_bridge_gpus" or v is not None},
        # Only where NVLink stops inside the node (bridged pairs): files of the other clusters stay as they were.
        **({"pcie_peer_gbyte_per_s_per_gpu": cluster.pcie_peer_gbyte_per_s_per_gpu}
           if cluster.pcie_peer_gbyte_per_s_per_gpu is not None else {}),
    }


def default_train(plan: ParallelPlan, tokens: float) -> TrainSpec:
    """Steps to see `tokens` at this batch; warm-up 1% of them (at most 2000); FP8 current scaling by default."""
    steps = max(1, round(tokens / (plan.gbs * plan.seq_length)))
    recipe = recipe_for(plan.precision, plan.fp8_recipe)
    return TrainSpec(train_steps=steps, warmup_steps=min(2000, max(1, steps // 100)),
                     fp8_recipe=recipe.train_fp8_recipe)


def checkpoint_dict(model: ModelSpec, plan: ParallelPlan, keep_last: int) -> dict:
    """What one checkpoint of this plan takes on disk, and the disk keep-last-N needs (issue 13: a run's
    checkpoints filled the disk; the plan says so before the run starts)."""
    size = checkpoint_size(model, plan, keep_last=keep_last)
    return {"bytes": size.checkpoint_bytes, "gib": _gib(size.checkpoint_bytes), "bytes_per_param": size.bytes_per_param,
            "holds": size.what, "keep_last": keep_last, "disk_bytes": size.disk_bytes, "disk_gib": _gib(size.disk_bytes)}


def intervals_dict(best: Evaluation, cal: Calibration, *, moe: bool = False) -> dict:
    """80% intervals of step time, tokens/s and peak memory from the calibration's held-out residual bands."""
    lo, hi = cal.moe_throughput_band if moe else cal.throughput_band
    m_lo, m_hi = cal.memory_band
    cost, peak = best.cost, best.memory.peak
    return {
        "coverage": 0.8, "source": "leave-one-source-out residuals on published runs (benchmarks/results/accuracy.md)",
        "step_time_s": [round(cost.step_time_s / hi, 4), round(cost.step_time_s / lo, 4)],
        "tokens_per_s_per_gpu": [round(cost.tokens_per_s_per_gpu * lo, 1), round(cost.tokens_per_s_per_gpu * hi, 1)],
        "peak_memory_gib": [_gib(peak.total_bytes * m_lo), _gib(peak.total_bytes * m_hi)],
        "peak_memory_bytes": [int(peak.total_bytes * m_lo), int(peak.total_bytes * m_hi)],
    }


def warnings(model: ModelSpec, best: Evaluation, cluster: ClusterSpec, *, smoke: bool) -> list[str]:
    """The plan's warnings: the rules' (pipeline_bubble, a tight fit), one per approximation of an imported model
    (model_unmodelled), and GPUs that would mostly wait (low_utilization; not for a smoke-sized batch)."""
    out = [str(v) for v in best.violations if v.severity == "warning"]
    out += [f"model_unmodelled: {note}" for note in model.unmodelled]
    idle = None if smoke else utilization_warning(best.cost, cluster.gpu.peak_tflops("bf16"))
    return out + ([f"low_utilization: {idle}"] if idle else [])


def encode(model: ModelSpec, alias: str | None, cluster: ClusterSpec, num_gpus: int, best: Evaluation,
           result: SearchResult | None, tokens: float, train: TrainSpec | None = None, *,
           cal: Calibration | None = None, batch_source: str = "default") -> dict:
    """The run dict of a plan: what `--json` prints and plan.json holds (`tokens` sets the training length;
    `cal` adds the 80% intervals of its held-out error bands; `batch_source` says where the global batch came
    from: genconf.plan.batch.BATCH_SOURCES)."""
    cost = best.cost
    alternatives = []
    if result is not None:
        for ev in result.alternatives:
            alternatives.append({"layout": describe(ev.plan), "plan": plan_dict(ev.plan, model),
                                 "memory": {"total_gib": _gib(ev.memory.peak.total_bytes),
                                            "total_bytes": int(ev.memory.peak.total_bytes)},
                                 "perf": {k: v for k, v in perf_dict(ev.cost).items() if k != "breakdown_s"}})
    train_s = training_time_s(cost, tokens)
    train = train or default_train(best.plan, tokens)
    # A smoke test's batch is there to exercise the layout, not to keep the GPUs busy: no low_utilization warning.
    batch = batch_summary(exact_param_count(model), best.plan.gbs, best.plan.seq_length, batch_source)
    smoke = batch_source in ("smoke", "shrunk") or batch["smoke"]
    return {
        "genconf_version": __version__, "schema_version": SCHEMA_VERSION,
        "model": model_dict(model, alias), "cluster": cluster_dict(cluster, num_gpus),
        "plan": plan_dict(best.plan, model), "layout": describe(best.plan),
        "batch": batch,
        "train": dataclasses.asdict(train),
        "memory": memory_dict(best.memory), "perf": perf_dict(cost),
        "checkpoint": checkpoint_dict(model, best.plan, train.keep_checkpoints),
        "training": {"tokens": round(tokens), "time_s": round(train_s, 3), "days": round(train_s / 86400, 2),
                     "gpu_hours": round(train_s * num_gpus / 3600, 3)},
        "intervals_80": intervals_dict(best, cal, moe=model.is_moe) if cal is not None else None,
        "why": why(best, result, cluster, model),
        "warnings": warnings(model, best, cluster, smoke=smoke),
        "search": ({"considered": result.considered, "rejected": result.rejected} if result is not None else None),
        "alternatives": alternatives,
        "past_headroom": past_headroom_dict(result, model),
    }


def past_headroom_dict(result: SearchResult | None, model: ModelSpec) -> dict | None:
    """SearchResult.past_headroom for --json: a faster plan inside the GPU but not the headroom, and the flags that
    take it (None where there is none)."""
    tight = result.past_headroom if result is not None else None
    if tight is None:
        return None
    return {"layout": describe(tight.plan), "plan": plan_dict(tight.plan, model),
            "memory": {"total_gib": _gib(tight.memory.peak.total_bytes), "total_bytes": int(tight.memory.peak.total_bytes),
                       "capacity_bytes": int(tight.memory.capacity_bytes)},
            "perf": {k: v for k, v in perf_dict(tight.cost).items() if k != "breakdown_s"},
            "pin_flags": result.past_headroom_flags}


def dumps(run: dict) -> str:
    """plan.json's text, as `genconf --json` prints it: sorted keys, two-space indent, trailing newline."""
    return json.dumps(run, indent=2, sort_keys=True) + "\n"


# --- decode ---------------------------------------------------------------------------------------

class PlanFileError(GenconfError):
    """plan.json is not a JSON object; `line`/`column` (1-based) say where, when known."""

    def __init__(self, source: str, detail: str, line: int | None = None, column: int | None = None) -> None:
        self.source, self.detail, self.line, self.column = source, detail, line, column
        super().__init__(f"{source}:{line}: {detail}" if line else f"{source}: {detail}")


def loads(text: str, source: str = "plan.json") -> dict:
    """The run dict in plan.json's text; PlanFileError (FILE:LINE: ...) when it is not a JSON object."""
    try:
        run = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlanFileError(source, f"invalid JSON: {exc.msg}", exc.lineno, exc.colno) from None
    if not isinstance(run, dict):
        raise PlanFileError(source, "expected a JSON object")
    return run


def load(path: Path) -> dict:
    """The run dict of a plan.json file."""
    if Path(path).is_dir():  # an artifacts directory read 'cannot read DIR: Is a directory'
        inside = Path(path) / "plan.json"
        raise GenconfError(f"{path} is a directory: give a plan.json file"
                           + (f" ({inside})" if inside.is_file() else ""))
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise GenconfError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise GenconfError(f"{path}: not UTF-8 text (byte {exc.start}): is it a plan.json?") from None
    return loads(text, str(path))


def model_from_dict(d: dict) -> ModelSpec:
    """A ModelSpec from its dict (plan.json's `model` also carries counts and the alias: those are skipped)."""
    fields = {f.name for f in dataclasses.fields(ModelSpec)}
    return ModelSpec(**{k: v for k, v in d.items() if k in fields})


LEGACY_BF16_LAYERS_KEY = "fp8_bf16_first_last_layers"
"""Where plan.json kept the BF16 end layers before ParallelPlan.bf16_layers_start / bf16_layers_end (train, one
count for both ends); decode still reads it."""


def plan_from_dict(d: dict) -> ParallelPlan:
    """A ParallelPlan from its dict (plan.json's `plan` also carries derived values: those are skipped)."""
    fields = {f.name for f in dataclasses.fields(ParallelPlan)}
    kwargs = {k: v for k, v in d.items() if k in fields}
    for name in ("cuda_graph_scope", "recompute_modules", "lora_targets"):
        if isinstance(kwargs.get(name), list):
            kwargs[name] = tuple(kwargs[name])  # JSON has lists; the plan holds a tuple
    return ParallelPlan(**kwargs)


def cluster_from_dict(c: dict) -> ClusterSpec:
    """The cluster of plan.json's `cluster`, GPU spec included."""
    sizes = c["gpu_spec"]["node_sizes"]
    if not isinstance(sizes, (list, tuple)):  # a number read "'int' object is not iterable"
        raise ValueError(f"cluster.gpu_spec.node_sizes must be a list of GPU counts per node, got {sizes!r}")
    gpu = GPUSpec(**{**c["gpu_spec"], "node_sizes": tuple(sizes)})
    domain = c.get("nvlink_domain_gpus")  # null in files before the resolved domain was written: the node
    cluster = ClusterSpec(name=c["name"], gpu=gpu, gpus_per_node=c["gpus_per_node"],
                          nvlink_domain_gpus=None if domain == c["gpus_per_node"] else domain,
                          pcie_peer_gbyte_per_s_per_gpu=c.get("pcie_peer_gbyte_per_s_per_gpu"),
                          ib_gbit_per_s_per_gpu=c["ib_gbit_per_s_per_gpu"],
                          cpu_mem_gib_per_node=c.get("cpu_mem_gib_per_node", 1024.0),
                          host_link_gbyte_per_s_per_gpu=c.get("host_link_gbyte_per_s_per_gpu", 55.0),
                          host_cpu=c.get("host_cpu", "x86_64"),
                          nccl_env=tuple(sorted((c.get("nccl_env") or {}).items())))
    return cluster


@dataclass(frozen=True, slots=True)
class PlanFile:
    """A decoded plan.json: the specs every artifact is rendered from and held against."""

    run: dict
    """The dict itself (memory, perf and why are read from it as they are), with the values genconf derives from the
    specs (counts, node count, stage layers, the layout line) as it derives them."""
    model: ModelSpec
    cluster: ClusterSpec
    plan: ParallelPlan
    num_gpus: int
    train: TrainSpec


def _schema_error(run: dict) -> str | None:
    """Why plan.json's schema_version cannot be read here (None: it can). Files from before the field are read as
    version 1, which added nothing to them; a newer version may mean what this genconf would misread."""
    version = run.get("schema_version", SCHEMA_VERSION)
    if type(version) is not int or version < 1:
        return f"schema_version must be a whole number from 1, got {version!r}"
    if version > SCHEMA_VERSION:
        writer = run.get("genconf_version")
        need = (f"genconf {writer} or newer, which wrote it" if isinstance(writer, str) and writer and writer != __version__
                else f"a genconf that writes schema_version {version}")
        return (f"schema_version {version} is newer than genconf {__version__} reads ({SCHEMA_VERSION}): use {need}")
    return None


def _same(a, b) -> bool:
    """JSON values equal as JSON sees them: true is not 1, "64" is not 64."""
    if isinstance(a, bool) or isinstance(b, bool) or isinstance(a, str) or isinstance(b, str) or a is None or b is None:
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return False


_CLUSTER_READ = frozenset({"name", "gpu_spec", "gpus_per_node", "nvlink_domain_gpus", "pcie_peer_gbyte_per_s_per_gpu",
                           "ib_gbit_per_s_per_gpu", "cpu_mem_gib_per_node", "host_link_gbyte_per_s_per_gpu", "host_cpu",
                           "nccl_env", "num_gpus"})
"""The `cluster` keys cluster_from_dict and decode read; cluster_dict derives the rest."""


def _derived(run: dict, model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, num_gpus: int) -> dict | None:
    """The values plan.json carries beside the specs (counts, node count, micro-batches, stage layers, the layout line),
    as genconf derives them, by section ("" for the top level); None where the plan cannot split its layers (the rule
    book says so, on the plan's own keys: pipeline_split)."""
    model_fields = {f.name for f in dataclasses.fields(ModelSpec)} | {"alias"}
    plan_fields = {f.name for f in dataclasses.fields(ParallelPlan)}
    try:
        derived = {"model": {k: v for k, v in model_dict(model, None).items() if k not in model_fields},
                   # nvlink_domain_gpus too, as resolved: a file from before that wrote null for "the node"
                   "cluster": {k: v for k, v in cluster_dict(cluster, num_gpus).items()
                               if k not in _CLUSTER_READ or k == "nvlink_domain_gpus"},
                   "plan": {k: v for k, v in plan_dict(plan, model).items() if k not in plan_fields},
                   "": {"layout": describe(plan)}}
    except ValueError:
        return None
    return json.loads(json.dumps(derived))  # as plan.json holds them: lists, not tuples


REQUIRED_KEYS = {
    "model": ("name", "num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "vocab_size", "seq_length",
              "num_query_groups", "kv_channels", "activation", "normalization", "position_embedding", "tie_embeddings",
              "add_bias_linear", "hidden_dropout", "attention_dropout", "num_experts", "moe_top_k"),
    "plan": ("framework", "tp", "pp", "vp", "cp", "ep", "dp", "mbs", "gbs", "seq_length", "zero_stage", "recompute",
             "precision", "layer_spec"),
    "train": ("train_steps", "lr", "min_lr", "warmup_steps", "lr_decay", "weight_decay", "beta1", "beta2", "eps",
              "grad_clip", "seed", "checkpoint_every_steps"),
    "cluster": ("name", "gpu_spec", "gpus_per_node", "ib_gbit_per_s_per_gpu", "num_gpus"),
    "cluster.gpu_spec": ("name", "display_name", "arch", "peak_fp32_tflops", "peak_tf32_tflops", "peak_bf16_tflops",
                         "peak_fp16_tflops", "peak_fp8_tflops", "peak_fp4_tflops", "hbm_gib", "hbm_tbyte_per_s",
                         "nvlink_gbyte_per_s", "num_sms", "node_sizes", "tdp_w"),
}
"""The settings every plan.json has held since its first version: one left out is refused, not taken as the spec's
default (a plan.json without plan.tp rendered tp=1, without plan.mbs mbs=1, without model.activation gelu). Keys added
later (moe_routing, bf16_layers_start, ...) still default, so older files read."""


def _missing_keys(run: dict) -> list[str]:
    """The REQUIRED_KEYS a run dict leaves out, as section.key (a section that is not a JSON object is decode's to
    refuse)."""
    missing = []
    for section, keys in REQUIRED_KEYS.items():
        where: object = run
        for part in section.split("."):
            where = where.get(part) if isinstance(where, dict) else None
        if isinstance(where, dict):
            missing += [f"{section}.{key}" for key in keys if key not in where]
    return missing


SECTION_EXTRA_KEYS = {
    "model": ("alias", "params", "params_active", "params_workshop", "windowed_layers", "window_text",
              "import_notes"),
    # grad_accum_fp32: written by genconf's first versions (grad_dtype since), and read as then: ignored.
    "plan": ("distributed_optimizer", "fsdp_sharding_strategy", "num_microbatches", "stage_layers", "grad_accum_fp32"),
    "cluster": ("gpu", "gpu_display_name", "num_nodes", "hbm_gib", "note"),
}
"""The keys each section of plan.json carries beside its spec's fields: the values genconf derives (model_dict,
plan_dict, cluster_dict) and the notes the command line adds."""


def _unknown_key(run: dict) -> str | None:
    """The first key of plan.json's model, plan or cluster section that is neither a field of its spec nor one genconf
    writes beside them, as a one-line reason (a typo such as plan.tpp was dropped in silence: the plan rendered
    without it)."""
    fields = {"model": {f.name for f in dataclasses.fields(ModelSpec)},
              "plan": {f.name for f in dataclasses.fields(ParallelPlan)}, "cluster": set(_CLUSTER_READ)}
    for section, known in fields.items():
        known |= set(SECTION_EXTRA_KEYS[section])
        unknown = sorted(k for k in run.get(section, {}) if k not in known)
        if unknown:
            return _unknown_line(f"{section}.{unknown[0]}", f"a {section}", known)
    spec = run.get("cluster", {}).get("gpu_spec", {})
    unknown = sorted(k for k in spec if k not in {f.name for f in dataclasses.fields(GPUSpec)})
    if unknown:
        return _unknown_line(f"cluster.gpu_spec.{unknown[0]}", "a GPU", {f.name for f in dataclasses.fields(GPUSpec)})
    return None


def _unknown_line(key: str, what: str, known: set[str]) -> str:
    near = difflib.get_close_matches(key.rsplit(".", 1)[1], sorted(known), n=1)
    hint = f"did you mean {key.rsplit('.', 1)[0]}.{near[0]}?" if near else "genconf --json writes every key it reads"
    return f"{key} is not {what} setting genconf knows ({hint})"


def decode(run: dict, source: str = "plan.json") -> PlanFile:
    """The specs of a run dict; GenconfError naming what is missing or invalid (`source`: the file it came from)."""
    for key in ("model", "cluster", "plan", "train"):
        if key in run and not isinstance(run[key], dict):
            raise GenconfError(f"{source} is invalid: '{key}' must be a JSON object, got {type(run[key]).__name__}")
    schema = _schema_error(run)
    if schema:
        raise GenconfError(f"{source}: {schema}")
    spec = run.get("cluster", {}).get("gpu_spec", {})
    if not isinstance(spec, dict):
        raise GenconfError(f"{source} is invalid: 'cluster.gpu_spec' must be a JSON object, got {type(spec).__name__}")
    unknown = _unknown_key(run)
    if unknown:
        raise GenconfError(f"{source} is invalid: {unknown}")
    missing = _missing_keys(run)
    if missing:
        raise GenconfError(f"{source} is missing {', '.join(missing)}: genconf does not guess a plan's settings; add "
                           f"{'it' if len(missing) == 1 else 'them'}, or write the plan anew with genconf --json")
    try:
        model = model_from_dict(run["model"])
        cluster = cluster_from_dict(run["cluster"])
        plan = plan_from_dict(run["plan"])
        num_gpus = run["cluster"]["num_gpus"]
        if type(num_gpus) is not int:
            raise ValueError(f"cluster.num_gpus must be a whole number, got {num_gpus!r}")
        train_fields = dict(run["train"])
        legacy = train_fields.pop(LEGACY_BF16_LAYERS_KEY, None)
        if legacy and "bf16_layers_start" not in run["plan"]:
            # plan.json written before the plan carried its BF16 end layers: the same count at each end.
            plan = dataclasses.replace(plan, bf16_layers_start=int(legacy), bf16_layers_end=int(legacy))
        known = {f.name for f in dataclasses.fields(TrainSpec)}
        unknown = sorted(k for k in train_fields if k not in known)
        if unknown:
            raise ValueError(f"train.{unknown[0]} is not a training setting genconf knows (train holds "
                             f"{', '.join(sorted(known))})")
        train = TrainSpec(**train_fields)
    except KeyError as exc:
        raise GenconfError(f"{source} is missing {exc}") from None
    except (TypeError, ValueError) as exc:
        raise GenconfError(f"{source} is invalid: {exc}") from None
    derived = _derived(run, model, cluster, plan, num_gpus)
    if derived is not None:
        # The values genconf derives are written as it derives them (a hand-edited plan.json keeps its old layout line
        # and counts, and render had put those in the artifacts). The one that reads like a setting, the layers per
        # stage, must agree: the split is set by plan.pp_layout or pp_first/last_stage_layers, not by this list.
        given = run["plan"].get("stage_layers", derived["plan"]["stage_layers"])
        if not _same(given, derived["plan"]["stage_layers"]):
            raise GenconfError(f"{source} is invalid: plan.stage_layers is {given!r}, genconf derives "
                               f"{derived['plan']['stage_layers']!r} from the plan: the layers per stage follow from "
                               f"pp, vp and plan.pp_layout or pp_first_stage_layers / pp_last_stage_layers; set those, "
                               f"or leave stage_layers out")
        run = {**run, **derived[""], **{section: {**run[section], **values} for section, values in derived.items()
                                        if section}}
    return PlanFile(run, model, cluster, plan, num_gpus, train)


# --- why this plan --------------------------------------------------------------------------------

def why(best: Evaluation, result: SearchResult | None, cluster: ClusterSpec, model: ModelSpec | None = None) -> list[str]:
    """Reasons for the choice, in a user's terms."""
    p, cost, peak = best.plan, best.cost, best.memory.peak
    reasons = []
    headroom = best.memory.capacity_bytes - peak.total_bytes
    reasons.append(f"fits with {headroom / GIB:.1f} GiB to spare on the busiest GPU (stage {peak.stage})")
    if model is not None and model.sliding_window and not model.window_binds(p.seq_length):
        # Legal in Hugging Face configs (Mistral 7B's 4,096 at a 2,048-token sequence): the window hides no key.
        reasons.append(f"sliding window of {model.sliding_window:,} keys covers the {p.seq_length:,}-token sequence: "
                       f"its {model.windowed_layers} windowed layers run full causal attention, priced so")
    if p.tp > 1:
        reasons.append(f"tp={p.tp} splits each layer inside the {cluster.nvlink_domain}-GPU NVLink domain "
                       f"(sequence parallel on); TP never crosses InfiniBand")
    if p.cp > 1:
        # Megatron's context parallelism (TE's ring attention, cp_comm_type p2p): the load-balanced split of each
        # sequence, key/value blocks passed around the ring while each block's attention runs (cost.py _layer_time).
        ring = ("inside the NVLink domain" if p.tp * p.cp <= cluster.nvlink_domain
                else "over PCIe, as tp x cp spans more than one NVLink domain of the node"
                if cluster.pcie_inside_node and p.tp * p.cp <= cluster.gpus_per_node
                else "over InfiniBand, as tp x cp spans more than one NVLink domain")
        reasons.append(f"cp={p.cp} splits each {p.seq_length:,}-token sequence into {p.cp} parts of "
                       f"{p.seq_length // p.cp:,} tokens, one per context-parallel rank; attention passes key/value "
                       f"blocks around the ring {ring}, beside each block's compute")
    if p.pp > 1:
        chunks = f" with {p.vp} virtual stages each" if p.vp > 1 else ""
        reasons.append(f"pp={p.pp}{chunks} over {p.num_microbatches} micro-batches: bubble {cost.bubble_fraction:.1%} "
                       f"((p-1)/(v*m))")
    if p.pp_layout is not None:
        split = result.split_tokens_per_s.get(p) if result is not None else None
        gain = f", {cost.tokens_per_s / split - 1:.1%} faster than megatron's own split" if split else ""
        reasons.append(f"pipeline layout {p.pp_layout} places the layers virtual stage by virtual stage (megatron "
                       f"--pipeline-model-parallel-layout): the pipeline runs at its slowest rank's pace, and the last "
                       f"rank also runs the output layer and the loss, so it holds fewer layers{gain}")
    if p.cuda_graph_impl != "none":
        scope = " ".join(p.cuda_graph_scope) or "whole layers"
        reasons.append(f"CUDA graphs ({p.cuda_graph_impl}: {scope}; asked for) replay their kernels without the host: "
                       f"priced as host time saved where a layer's launches outlast its GPU work (MoE routing, small "
                       f"micro-batches); their static buffers and memory pools are not priced")
    if p.moe_ep_overlap:
        reasons.append("expert-parallel all-to-all overlapped with another micro-batch's compute (megatron "
                       "--overlap-moe-expert-parallel-comm, --delay-wgrad-compute; asked for): priced hidden but for "
                       "its share of SMs and the unpaired warm-up and flush micro-batches")
    if p.moe_dispatcher != "alltoall":
        buffers = "NVSHMEM buffers" if p.moe_dispatcher == "deepep" else "RDMA and NVLink buffers"
        reasons.append(f"flex token dispatcher ({p.moe_dispatcher}; asked for): a token crosses the NICs once per "
                       f"other node holding one of its experts and fans out over NVLink there, priced so; inside one "
                       f"NVLink domain it costs what megatron's all-to-all does; its {buffers} are not priced")
    if p.framework == "megatron" and p.zero_stage >= 2:
        reasons.append(f"Megatron-FSDP (zero {p.zero_stage}) shards "
                       f"{'parameters, ' if p.zero_stage == 3 else ''}gradients and optimizer states over "
                       f"{p.shard_size} GPUs: genconf plans it only when asked (--megatron-fsdp, --zero 2/3) or when "
                       f"no plan with the distributed optimizer fits")
    elif p.distributed_optimizer:
        reasons.append(f"distributed optimizer shards fp32 master weights and Adam over dp*cp={p.dp * p.cp}")
    elif p.framework in ("deepspeed", "fsdp") and p.zero_stage:
        reasons.append(f"{'ZeRO-' + str(p.zero_stage) if p.framework == 'deepspeed' else p.fsdp_sharding_strategy} "
                       f"shards model states over {p.shard_size} GPUs")
    reasons.append({"none": "no activation recomputation needed: activations fit",
                    "selective": "selective recompute drops the attention-score activations for ~2% more FLOPs",
                    "full": f"full recompute: only layer inputs are kept, "
                            f"+{(cost.hardware_flops_per_step / cost.model_flops_per_step - 1) * 100:.0f}% FLOPs"}[p.recompute]
                   if not (p.recompute == "full" and p.recompute_layers) and not p.recompute_modules else
                   f"selective recompute of {', '.join(p.recompute_modules)} (megatron --recompute-modules): their "
                   f"outputs are rebuilt in the backward instead of kept" if p.recompute_modules else
                   f"block recompute of {p.recompute_layers} layer(s) per model chunk: just enough to fit")
    grads = {"megatron": "fp32 main_grad buffers (Megatron-LM's default for bf16/FP8)",
             "deepspeed": "DeepSpeed's default for its precision", "fsdp": "FSDP MixedPrecision reduce_dtype fp32"}
    if p.grad_dtype is None:
        reasons.append(f"gradients accumulated and reduced as the framework does by default: {grads[p.framework]}")
    else:
        reasons.append(f"gradients accumulated and reduced in {p.grad_dtype} (chosen): {p.grad_bytes} bytes per "
                       f"parameter in the gradient buffer and the data-parallel traffic")
    if p.framework == "megatron" and not p.wgrad_fused_into_main_grad:
        reasons.append("weight gradients added into main_grad in a pass of their own each micro-batch "
                       + ("(--no-gradient-accumulation-fusion)" if not p.grad_accum_fusion else
                          "(the local spec without apex cannot fuse it)") + ": priced as that pass over the parameters")
    if p.lora_rank:
        reasons.append(f"LoRA rank {p.lora_rank} (Megatron-Bridge PEFT): only the adapters on "
                       f"{'/'.join(p.lora_targets)} train; the frozen base weights carry no gradients or optimizer "
                       f"states and skip their "
                       f"weight-gradient GEMMs")
    if p.fused_loss:
        reasons.append("fused cross entropy over the 16-bit logits (--fused-loss): no fp32 copy of the logits, only "
                       "each token's fp32 log-sum-exp is kept")
    if p.packed_doc_tokens is not None and p.packed_doc_tokens < p.seq_length:
        local = p.layer_spec == "local" and p.framework == "megatron"
        reasons.append(f"sequences packed from documents of ~{p.packed_doc_tokens:,} tokens (--packed-doc-len): "
                       + ("the local spec's unfused attention masks them and still computes every score"
                          if local else
                          f"each attends within itself, about {p.packed_doc_tokens / p.seq_length:.1%} of a "
                          f"{p.seq_length:,}-token sequence's causal attention work (whole 128-row tiles aside)"))
    if p.attention_kernel != "auto":
        name = {"cudnn": "cuDNN's fused attention", "flash2": "FlashAttention-2",
                "triton": "flash attention in Triton",
                "math": "PyTorch's math backend (scores through HBM)"}[p.attention_kernel]
        reasons.append(f"attention priced as {name} (--attention-kernel {p.attention_kernel})")
    if p.precision_aware_optimizer:
        master = ("16-bit master remainders" if p.optimizer_keeps_remainders else
                  f"fp32 master weights, which megatron-core keeps itself under FP8 {p.quant_recipe} scaling")
        moments = ", BF16 Adam moments (--adam-moments-dtype bf16, as asked)" if p.adam_moments_dtype == "bf16" else ""
        reasons.append(f"precision-aware optimizer ({master}{moments}): {megatron_optimizer_bytes(p)} optimizer bytes "
                       f"per parameter instead of 12; genconf adds it only where a plan does not fit without it, or as "
                       f"asked")
    if p.offload_activation_layers:
        reasons.append(f"{p.offload_activation_layers} layers' activations offloaded to host memory (Transformer Engine "
                       f"CPU offload), hidden behind compute where the host link allows")
    if p.precision in ("fp8", "fp4"):
        recipe = p.quant_recipe
        reasons.append(f"{'NVFP4' if p.precision == 'fp4' else 'FP8 ' + recipe} GEMMs priced at the GPU's "
                       f"{p.precision.upper()} peak with the recipe's quantization passes"
                       + ("; weights kept and all-gathered in FP8" if p.fp8_param_gather else ""))
    if p.framework == "megatron" and p.layer_spec == "local":
        reasons.append("megatron local spec: unfused attention (scores through HBM) and element-wise ops priced as "
                       + ("megatron's fused kernels" if p.fused_kernels else "PyTorch ops without megatron's fused kernels"))
    if result is not None and result.fastest is not None:
        fast = result.fastest
        gap = fast.cost.tokens_per_s / cost.tokens_per_s - 1
        within = f"within {gap:.1%} of" if gap >= 0.0005 else "as fast (within 0.05%) as"
        reasons.append(f"{within} the fastest candidate ({describe(fast.plan)}), closer than the model can "
                       f"tell apart; ranked first: {result.tie_break}")
    if result is not None and result.alternatives and (
            result.fastest is None or same_layout(result.fastest.plan, best.plan)):
        # The runner-up is the best plan of another layout (SearchResult.alternatives); where the fastest candidate
        # above is this layout with another pipeline schedule, the runner-up still says what the next layout costs.
        runner = result.alternatives[0]
        gain = cost.tokens_per_s / runner.cost.tokens_per_s - 1
        # The search says whether the runner-up is a tie (within TIE_FRACTION) and what decided it.
        tied = (f" (a tie within the model's error; ranked first: {result.runner_up_tie_break})"
                if result.runner_up_tie_break else "")
        faster = (f"{gain:.1%} faster than" if gain >= 0.0005 else f"{-gain:.1%} slower than" if gain <= -0.0005
                  else "as fast (within 0.05%) as")
        reasons.append(f"{faster} the runner-up ({describe(runner.plan)}){tied}")
    if result is not None and result.past_headroom is not None:
        tight = result.past_headroom
        gain = tight.cost.tokens_per_s / cost.tokens_per_s - 1
        pin = (f": pinned whole ({result.past_headroom_flags}) it is planned, with a warning that it may run out of "
               f"memory" if result.past_headroom_flags else "")
        reasons.append(f"{describe(tight.plan)} is predicted {gain:.1%} faster but needs "
                       f"{tight.memory.peak.total_bytes / GIB:.1f} GiB, inside the GPU's "
                       f"{tight.memory.capacity_bytes / GIB:.1f} but not the {HEADROOM_FRACTION:.0%} kept free for the "
                       f"estimate's error{pin}")
    return reasons
