"""The rule book: every rule that spans the model, the cluster and the plan, with a name, a severity and a
message that gives the numbers and the nearest fix. The search, the CLI and `genconf check` all use it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from genconf.plan.counting import exact_param_count
from genconf.plan.memory import GIB, MemoryEstimate
from genconf.plan.pipeline import stage_layers
from genconf.plan.specs import ClusterSpec, ModelSpec, ParallelPlan

ERROR, WARNING = "error", "warning"


@dataclass(frozen=True, slots=True)
class Context:
    model: ModelSpec
    cluster: ClusterSpec
    plan: ParallelPlan
    num_gpus: int


@dataclass(frozen=True, slots=True)
class Violation:
    rule: str
    severity: str
    message: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.message}"


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    severity: str
    doc: str
    check: Callable[[Context], str | None]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _nearest(value: int, candidates: list[int]) -> int:
    return min(candidates, key=lambda c: (abs(c - value), -c)) if candidates else 1


def _world_size(c: Context) -> str | None:
    p = c.plan
    if p.world_size != c.num_gpus:
        return (f"dp({p.dp}) * cp({p.cp}) * tp({p.tp}) * pp({p.pp}) = {p.world_size} != world size ({c.num_gpus}); "
                f"dp would be {c.num_gpus / (p.tp * p.pp * p.cp):g}")
    return None


def whole_nodes_error(num_gpus: int, gpus_per_node: int) -> str | None:
    """A job takes whole nodes, or part of one."""
    if num_gpus < 1:
        return f"the number of GPUs must be positive, got {num_gpus}"
    if num_gpus > gpus_per_node and num_gpus % gpus_per_node:
        lower, upper = num_gpus // gpus_per_node * gpus_per_node, -(-num_gpus // gpus_per_node) * gpus_per_node
        return f"{num_gpus} GPUs is not a whole number of {gpus_per_node}-GPU nodes; use {lower} or {upper}"
    return None


def _whole_nodes(c: Context) -> str | None:
    return whole_nodes_error(c.num_gpus, c.cluster.gpus_per_node)


def _tp_heads(c: Context) -> str | None:
    a, tp = c.model.num_attention_heads, c.plan.tp
    if a % tp:
        return f"tp ({tp}) must divide num_attention_heads ({a}); nearest: tp={_nearest(tp, _divisors(a))}"
    return None


def _tp_groups(c: Context) -> str | None:
    g, tp = c.model.num_query_groups, c.plan.tp
    if g % tp:
        return f"tp ({tp}) must divide num_query_groups ({g}, the KV heads); nearest: tp={_nearest(tp, _divisors(g))}"
    return None


def _tp_ffn(c: Context) -> str | None:
    f, tp = c.model.moe_ffn_hidden_size if c.model.is_moe else c.model.ffn_hidden_size, c.plan.tp
    if f % tp:
        return f"tp ({tp}) must divide ffn_hidden_size ({f})"
    return None


def _tp_domain(c: Context) -> str | None:
    domain, tp = c.cluster.nvlink_domain, c.plan.tp
    if tp > domain or domain % tp:
        best = max(d for d in _divisors(domain) if d <= min(tp, domain))
        return f"tp ({tp}) must stay inside one NVLink domain of {domain} GPUs (and divide it); nearest: tp={best}"
    return None


def _pipeline_split(c: Context) -> str | None:
    try:
        stage_layers(c.model.num_layers, c.plan)
    except ValueError as exc:
        return f"{exc}; set --pp to a divisor of {c.model.num_layers} or an uneven split (first/last stage layers)"
    return None


def _vp_needs_pp(c: Context) -> str | None:
    if c.plan.vp > 1 and c.plan.pp == 1:
        return f"vp ({c.plan.vp}) needs pipeline parallelism (pp > 1)"
    return None


def _interleave_microbatches(c: Context) -> str | None:
    p = c.plan
    m = p.num_microbatches
    if p.vp > 1 and (m < p.pp or m % p.pp):
        return (f"interleaved schedule needs micro-batches ({m}) to be a multiple of pp ({p.pp}) "
                f"(megatron-core schedules.py); use --global-batch {max(p.pp, -(-m // p.pp) * p.pp) * p.mbs * p.dp}")
    return None


def _batch(c: Context) -> str | None:
    p = c.plan
    unit = p.mbs * p.dp
    if p.gbs % unit:
        lower, upper = max(unit, p.gbs // unit * unit), -(-p.gbs // unit) * unit
        nearest = f"{lower}" if lower == upper else f"{lower} or {upper}"
        return f"global batch ({p.gbs}) must be divisible by mbs x dp ({p.mbs} x {p.dp} = {unit}); nearest: {nearest}"
    return None


def _cp_sequence(c: Context) -> str | None:
    p = c.plan
    if p.cp > 1 and p.seq_length % (2 * p.cp):
        return (f"sequence length ({p.seq_length}) must be divisible by 2 x cp ({2 * p.cp}): causal load balancing "
                f"splits it into 2 x cp chunks")
    return None


def _cp_needs_te(c: Context) -> str | None:
    if c.plan.cp > 1 and c.plan.layer_spec != "te":
        return "context parallelism needs Transformer Engine attention (--layer-spec te)"
    return None


def _ep(c: Context) -> str | None:
    p, m = c.plan, c.model
    if p.ep == 1:
        return None
    if not m.is_moe:
        return f"ep ({p.ep}) on a dense model: expert parallelism needs num_experts > 0"
    if m.num_experts % p.ep:
        return f"ep ({p.ep}) must divide num_experts ({m.num_experts}); nearest: ep={_nearest(p.ep, _divisors(m.num_experts))}"
    if (p.dp * p.cp) % p.ep:
        return f"ep ({p.ep}) must divide dp x cp ({p.dp} x {p.cp} = {p.dp * p.cp}): experts are spread over data-parallel ranks"
    return None


def _moe_sequence_parallel(c: Context) -> str | None:
    p = c.plan
    if c.model.is_moe and p.tp > 1 and not p.sequence_parallel:
        return "MoE with tp > 1 needs sequence parallelism (megatron-core)"
    return None


def _sequence_parallel(c: Context) -> str | None:
    p = c.plan
    if p.sequence_parallel and p.tp == 1:
        return "sequence parallelism needs tp > 1"
    if p.sequence_parallel and p.framework != "megatron":
        return f"sequence parallelism is a Megatron feature, not {p.framework}'s"
    return None


def _framework_degrees(c: Context) -> str | None:
    p = c.plan
    if p.framework == "megatron":
        return None
    extra = [f"{name}={value}" for name, value in (("tp", p.tp), ("pp", p.pp), ("cp", p.cp), ("ep", p.ep)) if value > 1]
    if extra:
        return (f"framework {p.framework} runs data parallelism only here (DeepSpeed ZeRO, OLMo FSDP); "
                f"{', '.join(extra)} needs --framework megatron")
    return None


def _framework_zero(c: Context) -> str | None:
    p = c.plan
    allowed = {"megatron": (0, 1), "deepspeed": (0, 1, 2, 3), "fsdp": (0, 2, 3)}[p.framework]
    if p.zero_stage not in allowed:
        hint = {"megatron": "1 = distributed optimizer", "fsdp": "0 NO_SHARD, 2 SHARD_GRAD_OP, 3 FULL_SHARD",
                "deepspeed": ""}[p.framework]
        return f"zero stage {p.zero_stage} is not available with {p.framework} ({hint})"
    if p.shard_group_size is not None:
        if p.zero_stage != 3:
            return "a shard group (hybrid sharding) needs zero stage 3"
        if p.dp % p.shard_group_size:
            return f"shard group ({p.shard_group_size}) must divide dp ({p.dp})"
    return None


def _offload(c: Context) -> str | None:
    p = c.plan
    if (p.offload_optimizer or p.offload_params) and p.framework != "deepspeed":
        return "CPU offload is a DeepSpeed ZeRO feature here; use --framework deepspeed"
    if p.offload_optimizer and p.zero_stage == 0:
        return "optimizer offload needs zero stage >= 1"
    if p.offload_params and p.zero_stage != 3:
        return "parameter offload needs zero stage 3"
    return None


def _offload_host_memory(c: Context) -> str | None:
    """DeepSpeed's estimator: host bytes per node = P x (18 with params offloaded, else 16) / nodes x 1.5
    (estimate_zero3_model_states_mem_needs, additional_buffer_factor=1.5)."""
    p = c.plan
    if not p.offload_optimizer:
        return None
    nodes = max(1, c.num_gpus // c.cluster.gpus_per_node)
    per_param = 18 if p.offload_params else 16
    need_gib = exact_param_count(c.model) * per_param / nodes * 1.5 / GIB
    have_gib = c.cluster.cpu_mem_gib_per_node
    if need_gib > have_gib:
        return (f"CPU offload needs {need_gib:,.0f} GiB of host memory per node but nodes have {have_gib:,.0f} GiB; "
                f"use at least {-(-int(need_gib * nodes) // int(have_gib))} nodes")
    return None


def _recompute(c: Context) -> str | None:
    p = c.plan
    if p.recompute == "selective" and p.framework != "megatron":
        return f"selective recompute is Megatron's; {p.framework} checkpoints whole layers (--recompute full)"
    return None


def _precision(c: Context) -> str | None:
    p, gpu = c.plan, c.cluster.gpu
    if p.precision == "fp8":
        if not gpu.supports_fp8:
            return f"FP8 needs Hopper or Blackwell tensor cores; {gpu.display_name} has none (use --precision bf16)"
        if p.framework == "deepspeed" or (p.framework == "megatron" and p.layer_spec != "te"):
            return ("FP8 runs through Transformer Engine (--framework megatron --layer-spec te) or torchao's float8 "
                    "layers (--framework fsdp)")
    if p.precision == "fp32" and p.framework == "deepspeed":
        return "fp32 is for Megatron and FSDP verification runs here; use bf16 with DeepSpeed"
    if p.precision == "fp16" and p.framework == "fsdp":
        return "fp16 with OLMo FSDP is not supported (no loss scaling there); use bf16"
    return None


def _pipeline_microbatches(c: Context) -> str | None:
    p = c.plan
    if p.pp > 1 and p.num_microbatches < p.pp:
        return (f"only {p.num_microbatches} micro-batches for {p.pp} stages: the bubble is "
                f"{(p.pp - 1) / (p.vp * max(1, p.num_microbatches)):.0%} of the step")
    return None


RULES: tuple[Rule, ...] = (
    Rule("whole_nodes", ERROR, "the job uses whole nodes (or less than one)", _whole_nodes),
    Rule("world_size", ERROR, "tp x pp x cp x dp = GPUs", _world_size),
    Rule("framework_degrees", ERROR, "DeepSpeed and FSDP plans are data-parallel only", _framework_degrees),
    Rule("framework_zero_stage", ERROR, "the zero stage exists in the framework", _framework_zero),
    Rule("tp_divides_heads", ERROR, "TP divides the attention heads", _tp_heads),
    Rule("tp_divides_kv_heads", ERROR, "TP divides the KV heads (query groups)", _tp_groups),
    Rule("tp_divides_ffn", ERROR, "TP divides the MLP width", _tp_ffn),
    Rule("tp_inside_node", ERROR, "TP stays inside an NVLink domain", _tp_domain),
    Rule("pipeline_split", ERROR, "layers split over PP x VP (evenly or as configured)", _pipeline_split),
    Rule("vp_needs_pp", ERROR, "virtual stages need PP", _vp_needs_pp),
    Rule("interleave_microbatches", ERROR, "interleaving needs a multiple of PP micro-batches", _interleave_microbatches),
    Rule("batch_divisible", ERROR, "global batch divides by micro-batch x DP", _batch),
    Rule("cp_divides_sequence", ERROR, "CP divides the sequence (into 2 x cp chunks)", _cp_sequence),
    Rule("cp_needs_te", ERROR, "CP needs TE attention", _cp_needs_te),
    Rule("ep_divides_experts", ERROR, "EP divides the experts and dp x cp", _ep),
    Rule("moe_needs_sequence_parallel", ERROR, "MoE with TP needs sequence parallelism", _moe_sequence_parallel),
    Rule("sequence_parallel", ERROR, "sequence parallelism needs Megatron TP", _sequence_parallel),
    Rule("offload", ERROR, "offload needs DeepSpeed ZeRO", _offload),
    Rule("offload_host_memory", ERROR, "offloaded states fit in host memory", _offload_host_memory),
    Rule("recompute", ERROR, "selective recompute needs Megatron", _recompute),
    Rule("precision", ERROR, "the precision runs on this GPU and framework", _precision),
    Rule("pipeline_bubble", WARNING, "at least as many micro-batches as stages", _pipeline_microbatches),
)
RULE_NAMES = tuple(r.name for r in RULES) + ("memory_fits", "batch_above_target")


def check(ctx: Context, *, first_error_only: bool = False) -> list[Violation]:
    """Every violated rule (errors and warnings), or just the first error."""
    out: list[Violation] = []
    for rule in RULES:
        message = rule.check(ctx)
        if message is not None:
            out.append(Violation(rule.name, rule.severity, message))
            if first_error_only and rule.severity == ERROR:
                break
    return out


def memory_violation(ctx: Context, mem: MemoryEstimate) -> Violation | None:
    """memory_fits: the busiest stage's need against the GPU's capacity, with the breakdown and what to try."""
    peak = mem.peak
    if peak.total_bytes <= mem.usable_bytes:
        return None
    p = ctx.plan
    parts = (f"params {peak.params_bytes / GIB:.1f} + grads {peak.grads_bytes / GIB:.1f} + optimizer "
             f"{peak.optimizer_bytes / GIB:.1f} + activations {peak.activations_bytes / GIB:.1f} + other "
             f"{peak.other_bytes / GIB:.1f}")
    tries = []
    if p.recompute != "full":
        tries.append("--recompute full")
    if p.framework == "megatron" and not p.distributed_optimizer and p.dp * p.cp > 1:
        tries.append("--zero 1 (distributed optimizer)")
    if p.framework != "megatron" and p.zero_stage < 3 and p.dp > 1:
        tries.append("--zero 3")
    if p.mbs > 1:
        tries.append("--mbs 1")
    tries.append("more GPUs or tp/pp")
    return Violation("memory_fits", ERROR,
                     f"stage {peak.stage} needs {peak.total_bytes / GIB:.1f} GiB ({parts}) > "
                     f"{mem.usable_bytes / GIB:.1f} GiB usable of {mem.capacity_bytes / GIB:.1f} on "
                     f"{ctx.cluster.gpu.name}; try {', '.join(tries)}")
