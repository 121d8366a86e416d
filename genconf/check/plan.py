"""plan.json: decoded by the one codec (genconf.plan.planfile) and held against the rule book, each violation on
the line of the key it is about."""

from __future__ import annotations

from genconf.check.common import Problem, json_line
from genconf.plan import rules
from genconf.plan.errors import GenconfError
from genconf.plan.planfile import PlanFile, PlanFileError, decode, loads

_RULE_PLAN_KEY = {
    "whole_nodes": ("cluster", "num_gpus"), "world_size": ("plan", "dp"), "framework_degrees": ("plan", "framework"),
    "framework_zero_stage": ("plan", "zero_stage"), "tp_divides_heads": ("plan", "tp"),
    "tp_divides_kv_heads": ("plan", "tp"), "tp_divides_ffn": ("plan", "tp"), "tp_inside_node": ("plan", "tp"),
    "pipeline_split": ("plan", "pp"), "vp_needs_pp": ("plan", "vp"), "interleave_microbatches": ("plan", "gbs"),
    "batch_divisible": ("plan", "gbs"), "cp_divides_sequence": ("plan", "cp"), "cp_needs_te": ("plan", "cp"),
    "cp_window": ("plan", "cp"), "mla_needs_te": ("plan", "layer_spec"),
    "ep_divides_experts": ("plan", "ep"), "moe_needs_sequence_parallel": ("plan", "sequence_parallel"),
    "sequence_parallel": ("plan", "sequence_parallel"), "offload": ("plan", "offload_optimizer"),
    "offload_host_memory": ("plan", "offload_optimizer"), "recompute": ("plan", "recompute"),
    "precision": ("plan", "precision"),
}


def check_plan(text: str) -> tuple[PlanFile | None, list[Problem]]:
    try:
        p = decode(loads(text))
    except PlanFileError as exc:
        column = f" (column {exc.column})" if exc.column else ""
        return None, [Problem("plan.json", exc.line or 1, exc.detail + column)]
    except GenconfError as exc:
        return None, [Problem("plan.json", None, str(exc).removeprefix("plan.json "))]
    problems = []
    for v in rules.check(rules.Context(p.model, p.cluster, p.plan, p.num_gpus)):
        if v.severity == rules.ERROR:
            problems.append(Problem("plan.json", json_line(text, *_RULE_PLAN_KEY.get(v.rule, ("plan",))), str(v)))
    return p, problems
