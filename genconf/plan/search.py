"""Search over parallel layouts: enumerate candidates, reject them by named rules and memory, rank the rest
by predicted throughput. Pinned degrees narrow the space; pinning everything evaluates exactly one plan."""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field, replace

from genconf.plan import memory as mem
from genconf.plan import rules
from genconf.plan.cost import Calibration, StepCost, step_cost
from genconf.plan.errors import NoFeasiblePlan
from genconf.plan.memory import GIB, MemoryEstimate
from genconf.plan.specs import ClusterSpec, ModelSpec, ParallelPlan

DEFAULT_TOKENS_PER_STEP = 4 * 2**20
"""Default global batch: ~4M tokens per step (LLaMA, Llama-2/3 and OLMo pre-training batches)."""
MAX_BATCH_GROWTH = 1.5
"""Without --global-batch, a candidate may round the batch up to 1.5x the default, not more."""
BATCH_TOO_LARGE = "batch_above_target"
"""Marker yielded for layouts whose data parallelism alone forces a batch above the target."""


@dataclass(frozen=True, slots=True)
class Pins:
    """Degrees and choices the user fixed on the command line; None = search over it."""

    framework: str | None = None
    tp: int | None = None
    pp: int | None = None
    vp: int | None = None
    cp: int | None = None
    ep: int | None = None
    mbs: int | None = None
    gbs: int | None = None
    seq_length: int | None = None
    zero_stage: int | None = None
    recompute: str | None = None
    precision: str = "bf16"
    layer_spec: str = "te"
    offload: bool | None = None
    pp_first_stage_layers: int | None = None
    pp_last_stage_layers: int | None = None
    tp_comm_overlap: bool = False

    def degrees_pinned(self) -> bool:
        return None not in (self.framework, self.tp, self.pp, self.mbs, self.zero_stage, self.recompute)


@dataclass(frozen=True, slots=True)
class Evaluation:
    plan: ParallelPlan
    violations: tuple[rules.Violation, ...]
    memory: MemoryEstimate | None = None
    cost: StepCost | None = None

    @property
    def errors(self) -> tuple[rules.Violation, ...]:
        return tuple(v for v in self.violations if v.severity == rules.ERROR)

    @property
    def ok(self) -> bool:
        return not self.errors and self.memory is not None and self.cost is not None

    @property
    def overflow_ratio(self) -> float:
        if self.memory is None:
            return float("inf")
        return self.memory.peak.total_bytes / self.memory.capacity_bytes


@dataclass(frozen=True, slots=True)
class SearchResult:
    ranked: tuple[Evaluation, ...]
    """Feasible plans, best first, one per layout."""
    considered: int
    rejected: dict[str, int] = field(default_factory=dict)
    """Rejected candidates per rule (the first rule each broke)."""
    nearest_misses: tuple[Evaluation, ...] = ()

    @property
    def best(self) -> Evaluation | None:
        return self.ranked[0] if self.ranked else None


def evaluate(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, num_gpus: int, cal: Calibration,
             *, check_rules: bool = True) -> Evaluation:
    """Rules, then memory, then cost. With check_rules=False (benchmarks of published runs) only the
    layer split must be valid."""
    ctx = rules.Context(model, cluster, plan, num_gpus)
    violations = rules.check(ctx) if check_rules else []
    if check_rules and any(v.severity == rules.ERROR for v in violations):
        return Evaluation(plan, tuple(violations))
    estimate = mem.estimate(model, plan, cluster)
    too_big = rules.memory_violation(ctx, estimate) if check_rules else None
    if too_big is not None:
        return Evaluation(plan, tuple(violations) + (too_big,), estimate)
    return Evaluation(plan, tuple(violations), estimate, step_cost(model, plan, cluster, cal))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _split_options(num_layers: int, pp: int) -> list[dict]:
    """Ways to split the layers over pp stages: evenly; counting embedding and loss as layers;
    or explicit first/last stage counts (the ends carry the embedding and the logits, so they get fewer)."""
    if pp == 1 or num_layers % pp == 0:
        return [{}]
    options = []
    if (num_layers + 2) % pp == 0 and (num_layers + 2) // pp >= 2:
        options.append({"pp_embedding_as_layer": True, "pp_loss_as_layer": True})
    if pp > 2:
        share = num_layers / pp
        ends = [x for x in range(1, num_layers) if (num_layers - 2 * x) > 0 and (num_layers - 2 * x) % (pp - 2) == 0]
        if ends:
            x = min(ends, key=lambda x: (abs(x - (share - 0.5)), x))
            options.append({"pp_first_stage_layers": x, "pp_last_stage_layers": x})
    elif pp == 2:
        half = num_layers // 2
        options.append({"pp_first_stage_layers": half, "pp_last_stage_layers": num_layers - half})
    return options


def _gbs_for(pins: Pins, seq: int, unit: int) -> int:
    if pins.gbs is not None:
        return pins.gbs
    target = max(1, round(DEFAULT_TOKENS_PER_STEP / seq))
    return max(unit, round(target / unit) * unit)


def candidates(model: ModelSpec, cluster: ClusterSpec, num_gpus: int, pins: Pins):
    """Every plan the search considers (rules decide later which are valid)."""
    seq = pins.seq_length or model.seq_length
    frameworks = [pins.framework] if pins.framework else ["megatron", "deepspeed", "fsdp"]
    domain = cluster.nvlink_domain
    for framework in frameworks:
        if framework == "megatron":
            tps = [pins.tp] if pins.tp else [t for t in _divisors(domain) if model.num_attention_heads % t == 0
                                               and model.num_query_groups % t == 0]
            cps = [pins.cp] if pins.cp else [c for c in (1, 2, 4, 8, 16) if c == 1 or seq // c >= 4096]
            zeros = [pins.zero_stage] if pins.zero_stage is not None else [1, 0]
            recomputes = [pins.recompute] if pins.recompute else ["none", "selective", "full"]
        else:
            tps, cps = [pins.tp or 1], [pins.cp or 1]
            zeros = ([pins.zero_stage] if pins.zero_stage is not None
                     else ([1, 2, 3, 0] if framework == "deepspeed" else [3, 2, 0]))
            recomputes = [pins.recompute] if pins.recompute else ["none", "full"]
        for tp, cp in itertools.product(tps, cps):
            if num_gpus % (tp * cp):
                if pins.tp and pins.cp:
                    yield _plan(framework, pins, seq, tp=tp, cp=cp, pp=pins.pp or 1, dp=1, mbs=pins.mbs or 1, gbs=pins.gbs or 1)
                continue
            rest = num_gpus // (tp * cp)
            pps = [pins.pp] if pins.pp else ([p for p in _divisors(rest) if p <= model.num_layers + 2]
                                            if framework == "megatron" else [1])
            for pp in pps:
                dp = max(1, rest // pp)
                eps = [pins.ep] if pins.ep else ([e for e in _divisors(model.num_experts) if (dp * cp) % e == 0]
                                                 if model.is_moe and framework == "megatron" else [1])
                splits = ([{k: v for k, v in (("pp_first_stage_layers", pins.pp_first_stage_layers),
                                              ("pp_last_stage_layers", pins.pp_last_stage_layers)) if v}]
                          if pins.pp_first_stage_layers or pins.pp_last_stage_layers else _split_options(model.num_layers, pp))
                for split in splits:
                    per_stage = model.num_layers // pp
                    vps = [pins.vp] if pins.vp else ([1] + [v for v in (2, 3, 4, 6, 8) if per_stage % v == 0 and not split]
                                                     if pp > 1 else [1])
                    for vp, ep in itertools.product(vps, eps):
                        mbss = [pins.mbs] if pins.mbs else [1, 2, 4, 8]
                        for mbs in mbss:
                            unit = mbs * dp * (pp if vp > 1 else 1)
                            gbs = _gbs_for(pins, seq, unit)
                            if pins.gbs is None and gbs * seq > MAX_BATCH_GROWTH * DEFAULT_TOKENS_PER_STEP:
                                if mbs == 1 and not pins.mbs:
                                    yield BATCH_TOO_LARGE
                                continue  # would buy speed with a bigger batch than training wants
                            if pins.mbs is None and gbs < mbs * dp:
                                continue
                            for zero, recompute in itertools.product(zeros, recomputes):
                                if zero and dp * cp == 1 and pins.zero_stage is None:
                                    continue  # nothing to shard over
                                shard_groups = [None]
                                if framework == "fsdp" and zero == 3 and dp > cluster.gpus_per_node:
                                    shard_groups.append(cluster.gpus_per_node)
                                offloads = [False] if not pins.offload else [True]
                                for shard_group, offload in itertools.product(shard_groups, offloads):
                                    yield _plan(framework, pins, seq, tp=tp, pp=pp, vp=vp, cp=cp, ep=ep, dp=dp, mbs=mbs,
                                                gbs=gbs, zero_stage=zero, recompute=recompute,
                                                shard_group_size=shard_group, offload=offload, **split)


def _plan(framework: str, pins: Pins, seq: int, *, offload: bool = False, **kw) -> ParallelPlan:
    tp = kw.get("tp", 1)
    return ParallelPlan(framework=framework, seq_length=seq, precision=pins.precision, layer_spec=pins.layer_spec,
                        sequence_parallel=framework == "megatron" and tp > 1, tp_comm_overlap=pins.tp_comm_overlap,
                        offload_optimizer=offload and framework == "deepspeed",
                        offload_params=offload and framework == "deepspeed" and kw.get("zero_stage") == 3, **kw)


def _layout_key(plan: ParallelPlan) -> tuple:
    return (plan.framework, plan.tp, plan.pp, plan.vp, plan.cp, plan.ep, plan.zero_stage, plan.shard_group_size)


def search(model: ModelSpec, cluster: ClusterSpec, num_gpus: int, cal: Calibration, pins: Pins = Pins(),
           *, keep: int = 10) -> SearchResult:
    """All candidates, the feasible ones ranked by tokens/s (best per layout first)."""
    considered = 0
    rejected: Counter[str] = Counter()
    feasible: list[Evaluation] = []
    memory_misses: list[Evaluation] = []
    rule_misses: list[Evaluation] = []
    seen: set[ParallelPlan] = set()
    for plan in candidates(model, cluster, num_gpus, pins):
        if plan == BATCH_TOO_LARGE:
            considered += 1
            rejected[BATCH_TOO_LARGE] += 1
            continue
        if plan in seen:
            continue
        seen.add(plan)
        considered += 1
        ev = evaluate(model, cluster, plan, num_gpus, cal)
        if ev.ok:
            feasible.append(ev)
            continue
        first = ev.errors[0].rule
        rejected[first] += 1
        if first == "memory_fits":
            memory_misses.append(ev)
        elif len(ev.errors) == 1 and len(rule_misses) < 50:
            rule_misses.append(ev)
    feasible.sort(key=lambda e: (-e.cost.tokens_per_s, e.memory.peak.total_bytes))
    ranked, layouts = [], set()
    for ev in feasible:
        key = _layout_key(ev.plan)
        if key not in layouts:
            layouts.add(key)
            ranked.append(ev)
        if len(ranked) >= keep:
            break
    memory_misses.sort(key=lambda e: e.overflow_ratio)
    misses = tuple(memory_misses[:5]) + tuple(rule_misses[:3])
    return SearchResult(tuple(ranked), considered, dict(rejected.most_common()), misses)


def _fits_anywhere(model: ModelSpec, cluster: ClusterSpec, num_gpus: int, cal: Calibration, pins: Pins) -> Evaluation | None:
    for plan in candidates(model, cluster, num_gpus, pins):
        if plan == BATCH_TOO_LARGE:
            continue
        ctx = rules.Context(model, cluster, plan, num_gpus)
        if any(v.severity == rules.ERROR for v in rules.check(ctx, first_error_only=True)):
            continue
        estimate = mem.estimate(model, plan, cluster)
        if estimate.fits:
            return Evaluation(plan, (), estimate)
    return None


def what_would_fit(model: ModelSpec, cluster: ClusterSpec, num_gpus: int, cal: Calibration, pins: Pins) -> list[str]:
    """Suggestions for a model that fits nowhere: more GPUs, a shorter sequence, recompute, offload."""
    tips = []
    per_node = cluster.gpus_per_node
    for factor in (2, 4, 8, 16, 32, 64):
        more = max(per_node, num_gpus * factor // per_node * per_node)
        if _fits_anywhere(model, cluster, more, cal, replace(pins, gbs=None)):
            tips.append(f"--gpus {more}")
            break
    seq = pins.seq_length or model.seq_length
    while seq > 512:
        seq //= 2
        if _fits_anywhere(model, cluster, num_gpus, cal, replace(pins, seq_length=seq, gbs=None)):
            tips.append(f"--seq-len {seq}")
            break
    if pins.recompute not in (None, "full") and _fits_anywhere(model, cluster, num_gpus, cal, replace(pins, recompute="full")):
        tips.append("--recompute full")
    if pins.framework in (None, "deepspeed") and _fits_anywhere(
            model, cluster, num_gpus, cal, replace(pins, framework="deepspeed", zero_stage=3, offload=True, tp=None, pp=None)):
        tips.append("--framework deepspeed --zero 3 --offload")
    return tips


def plan_or_explain(model: ModelSpec, cluster: ClusterSpec, num_gpus: int, cal: Calibration, pins: Pins,
                    *, keep: int = 10) -> SearchResult:
    """search(), raising NoFeasiblePlan with the reason and what would make it fit when nothing does."""
    result = search(model, cluster, num_gpus, cal, pins, keep=keep)
    if result.ranked:
        return result
    gpu = cluster.gpu
    if result.rejected.get("memory_fits") and result.nearest_misses:
        closest = result.nearest_misses[0]
        peak = closest.memory.peak
        why = (f"{model.name} does not fit on {num_gpus} x {gpu.name} ({gpu.hbm_gib:g} GiB each): the closest plan "
               f"({describe(closest.plan)}) needs {peak.total_bytes / GIB:.1f} GiB per GPU on stage {peak.stage}")
    else:
        top = ", ".join(f"{name} x{count}" for name, count in list(result.rejected.items())[:3])
        example = result.nearest_misses[0].errors[0] if result.nearest_misses else None
        why = (f"no valid layout for {model.name} on {num_gpus} x {gpu.name} ({result.considered} candidates rejected: "
               f"{top})" + (f"; e.g. {example}" if example else ""))
    tips = what_would_fit(model, cluster, num_gpus, cal, pins)
    raise NoFeasiblePlan(why + (f". It would fit with: {'; or '.join(tips)}" if tips else ". Nothing tried makes it fit"))


def describe(plan: ParallelPlan) -> str:
    """One-line layout: 'megatron tp=4 pp=8 vp=2 dp=12 mbs=1 gbs=1152 zero=1 recompute=selective'."""
    parts = [plan.framework, f"tp={plan.tp}", f"pp={plan.pp}"]
    if plan.vp > 1:
        parts.append(f"vp={plan.vp}")
    if plan.cp > 1:
        parts.append(f"cp={plan.cp}")
    if plan.ep > 1:
        parts.append(f"ep={plan.ep}")
    parts += [f"dp={plan.dp}", f"mbs={plan.mbs}", f"gbs={plan.gbs}"]
    if plan.framework == "fsdp":
        parts.append(plan.fsdp_sharding_strategy)
    else:
        parts.append(f"zero={plan.zero_stage}")
    parts.append(f"recompute={plan.recompute}")
    if plan.offload_optimizer:
        parts.append("offload")
    if plan.pp_first_stage_layers or plan.pp_last_stage_layers:
        parts.append(f"layers first/last={plan.pp_first_stage_layers}/{plan.pp_last_stage_layers}")
    if plan.pp_embedding_as_layer:
        parts.append("embedding+loss as layers")
    return " ".join(parts)
