"""megatron_args.txt: every line typed by Megatron-LM's argument table (genconf.render.megatron), what
Megatron-LM's validate_args asserts, and the plan the arguments describe run through the rule book."""

from __future__ import annotations

from dataclasses import dataclass

from genconf.check.common import Problem
from genconf.plan import rules
from genconf.plan.planfile import PlanFile
from genconf.render import megatron


@dataclass(frozen=True, slots=True)
class MegatronArg:
    line: int
    flag: str
    text: str | None
    """The value as written (None for a switch)."""
    value: object
    """Typed: True for a switch, int, float, str, or a list of str."""


def parse_megatron_args(text: str, name: str = "megatron_args.txt") -> tuple[dict[str, MegatronArg], list[Problem]]:
    """Every `--flag [value]` line (blank and `#` lines skipped), typed by megatron.MEGATRON_FLAGS."""
    args: dict[str, MegatronArg] = {}
    problems: list[Problem] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        tokens = line.split()
        flag, rest = tokens[0], tokens[1:]
        if not flag.startswith("--"):
            problems.append(Problem(name, number, f"expected '--flag [value]', got {line!r}"))
            continue
        if flag not in megatron.MEGATRON_FLAGS:
            problems.append(Problem(name, number, f"unknown flag {flag} (not a Megatron-LM argument genconf checks; "
                                                  f"see {megatron.MEGATRON_LM_SOURCE})"))
            continue
        if flag in args:
            problems.append(Problem(name, number, f"{flag} given twice (first on line {args[flag].line})"))
            continue
        kind, choices = megatron.MEGATRON_FLAGS[flag]
        shown = f"{flag} {' '.join(rest)}".strip()
        if kind == megatron.SWITCH:
            if rest:
                problems.append(Problem(name, number, f"{flag} is a switch and takes no value, got {' '.join(rest)!r}"))
                continue
            args[flag] = MegatronArg(number, flag, None, True)
            continue
        if not rest or (kind != megatron.LIST and len(rest) > 1):
            problems.append(Problem(name, number, f"{shown}: expected one value" if rest else f"{flag} needs a value"))
            continue
        try:
            value = megatron.typed_value(flag, rest)
        except ValueError:
            wanted = "an integer" if kind == megatron.INT else "a number"
            problems.append(Problem(name, number, f"{shown}: expected {wanted}"))
            continue
        if choices and any(str(v) not in choices for v in (value if isinstance(value, list) else [value])):
            problems.append(Problem(name, number, f"{shown}: expected one of {'|'.join(choices)}"))
            continue
        args[flag] = MegatronArg(number, flag, " ".join(rest), value)
    return args, problems


def _get(args: dict[str, MegatronArg], flag: str, default: object = None) -> object:
    return args[flag].value if flag in args else default


def _values(args: dict[str, MegatronArg]) -> dict[str, object]:
    """flag -> typed value, what genconf.render.megatron reads arguments as."""
    return {flag: a.value for flag, a in args.items()}


# Rule -> the flags whose line a violation is reported on (first one present).
_RULE_FLAGS = {
    "world_size": ("--tensor-model-parallel-size", "--pipeline-model-parallel-size"),
    "tp_divides_heads": ("--tensor-model-parallel-size", "--num-attention-heads"),
    "tp_divides_kv_heads": ("--tensor-model-parallel-size", "--num-query-groups"),
    "tp_divides_ffn": ("--tensor-model-parallel-size", "--ffn-hidden-size"),
    "tp_inside_node": ("--tensor-model-parallel-size",),
    "pipeline_split": ("--pipeline-model-parallel-size", "--num-virtual-stages-per-pipeline-rank",
                       "--decoder-first-pipeline-num-layers", "--num-layers"),
    "vp_needs_pp": ("--num-virtual-stages-per-pipeline-rank", "--num-layers-per-virtual-pipeline-stage"),
    "interleave_microbatches": ("--global-batch-size", "--num-virtual-stages-per-pipeline-rank"),
    "batch_divisible": ("--global-batch-size", "--micro-batch-size"),
    "cp_divides_sequence": ("--context-parallel-size", "--seq-length"),
    "cp_needs_te": ("--context-parallel-size", "--transformer-impl"),
    "cp_window": ("--context-parallel-size", "--window-size"),
    "mla_needs_te": ("--multi-latent-attention", "--transformer-impl"),
    "ep_divides_experts": ("--expert-model-parallel-size", "--num-experts"),
    "moe_needs_sequence_parallel": ("--tensor-model-parallel-size",),
    "moe_ep_overlap": ("--overlap-moe-expert-parallel-comm",),
    "moe_dispatcher": ("--moe-token-dispatcher-type", "--moe-flex-dispatcher-backend"),
    "cuda_graphs": ("--cuda-graph-scope", "--cuda-graph-impl"),
    "sequence_parallel": ("--sequence-parallel",),
    "recompute": ("--recompute-granularity",),
    "precision": ("--fp8-format", "--fp16", "--transformer-impl"),
    "bf16_layers": ("--num-layers-at-start-in-bf16", "--num-layers-at-end-in-bf16", "--first-last-layers-bf16"),
}
# Flags that fix the layout or the model: they must agree with plan.json (the other files derive from it).
_LAYOUT_FLAGS = ("--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                 "--num-virtual-stages-per-pipeline-rank", "--context-parallel-size", "--expert-model-parallel-size",
                 "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
                 "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
                 "--micro-batch-size", "--global-batch-size", "--seq-length", "--num-layers", "--hidden-size",
                 "--ffn-hidden-size", "--num-attention-heads", "--num-query-groups", "--num-experts",
                 "--moe-router-topk", "--moe-ffn-hidden-size", "--use-distributed-optimizer", "--fp16", "--bf16",
                 "--fp8-format", "--vocab-size", "--expert-tensor-parallel-size", "--use-megatron-fsdp",
                 "--data-parallel-sharding-strategy", "--grad-reduce-in-bf16", "--fp8-param-gather", "--fp4-format",
                 "--fp4-param-gather", "--use-precision-aware-optimizer", "--recompute-method", "--recompute-num-layers",
                 "--cpu-offloading-num-layers", "--overlap-moe-expert-parallel-comm", "--cuda-graph-impl",
                 "--cuda-graph-scope", "--first-last-layers-bf16", "--num-layers-at-start-in-bf16",
                 "--num-layers-at-end-in-bf16", "--no-gradient-accumulation-fusion",
                 "--pipeline-model-parallel-layout", "--mtp-num-layers", "--rotary-base", "--use-rope-scaling",
                 "--rope-scaling-factor", "--rotary-percent")
_DEFAULTS = {"--rotary-base": megatron.ROTARY_BASE_DEFAULT, "--rope-scaling-factor": megatron.ROPE_SCALING_FACTOR_DEFAULT,
             "--rotary-percent": megatron.ROTARY_PERCENT_DEFAULT,
             "--cuda-graph-impl": "none", "--tensor-model-parallel-size": 1, "--pipeline-model-parallel-size": 1, "--context-parallel-size": 1,
             "--expert-model-parallel-size": 1, "--num-virtual-stages-per-pipeline-rank": 1}
_REQUIRED = ("--num-layers", "--hidden-size", "--num-attention-heads", "--max-position-embeddings",
             "--micro-batch-size", "--seq-length")


def _line_of(args: dict[str, MegatronArg], flags: tuple[str, ...]) -> tuple[int | None, str]:
    for flag in flags:
        if flag in args:
            a = args[flag]
            return a.line, a.flag if a.text is None else f"{a.flag} {a.text}"
    return None, ""


def _megatron_lm_checks(args: dict[str, MegatronArg], name: str) -> list[Problem]:
    """What Megatron-LM's validate_args asserts (MEGATRON_LM_SOURCE), plus the PP=2 interleaving guard."""
    out: list[Problem] = []

    def problem(flag: str, message: str) -> None:
        line, shown = _line_of(args, (flag,))
        out.append(Problem(name, line, f"{shown}: {message}" if shown else message))

    vp, pp = megatron.megatron_vp(_values(args)), int(_get(args, "--pipeline-model-parallel-size", 1))
    if "--fp16" in args and "--bf16" in args:
        problem("--fp16", "--fp16 and --bf16 are exclusive")
    if "--num-virtual-stages-per-pipeline-rank" in args and "--num-layers-per-virtual-pipeline-stage" in args:
        problem("--num-layers-per-virtual-pipeline-stage", "give only one of it and --num-virtual-stages-per-pipeline-rank")
    if "--no-overlap-p2p-communication" in args and vp > 1 and pp <= 2:
        problem("--no-overlap-p2p-communication",
                f"with pp={pp} and virtual stages this batches p2p sends, which trains wrong (Megatron-LM issues 750, "
                f"1450; arguments.py refuses it); remove the line")
    if "--overlap-param-gather" in args and "--use-distributed-optimizer" not in args:
        problem("--overlap-param-gather", "needs --use-distributed-optimizer")
    if "--overlap-param-gather" in args and "--overlap-grad-reduce" not in args:
        problem("--overlap-param-gather", "needs --overlap-grad-reduce")
    if _get(args, "--recompute-granularity") == "selective" and "--recompute-method" in args:
        problem("--recompute-method", "is not supported with --recompute-granularity selective")
    if _get(args, "--recompute-granularity") == "full" and ("--recompute-method" not in args
                                                            or "--recompute-num-layers" not in args):
        problem("--recompute-granularity", "full recompute needs --recompute-method and --recompute-num-layers")
    if "--tp-comm-overlap" in args and "--sequence-parallel" not in args:
        problem("--tp-comm-overlap", "needs --sequence-parallel")
    if "--delay-wgrad-compute" in args and "--overlap-moe-expert-parallel-comm" not in args:
        problem("--delay-wgrad-compute", "needs --overlap-moe-expert-parallel-comm (megatron-core)")
    if "--delay-wgrad-compute" in args and _get(args, "--transformer-impl") == "local":
        problem("--delay-wgrad-compute", "is only supported with --transformer-impl transformer_engine")
    if "full_iteration" in (_get(args, "--cuda-graph-scope") or []) and "--no-check-for-nan-in-loss-and-grad" not in args:
        problem("--cuda-graph-scope", "full_iteration needs --no-check-for-nan-in-loss-and-grad (Megatron-LM)")
    seq, max_pos = _get(args, "--seq-length"), _get(args, "--max-position-embeddings")
    if seq is not None and max_pos is not None and max_pos < seq:
        problem("--max-position-embeddings", f"must be >= --seq-length ({seq})")
    lr, min_lr = _get(args, "--lr"), _get(args, "--min-lr", 0.0)
    if lr is not None and min_lr > lr:
        problem("--min-lr", f"must be <= --lr ({lr})")
    return out


def check_megatron_args(text: str, p: PlanFile) -> list[Problem]:
    name = "megatron_args.txt"
    args, problems = parse_megatron_args(text, name)
    if problems:
        return problems
    for flag in _REQUIRED:
        if flag not in args:
            problems.append(Problem(name, None, f"missing {flag} (Megatron-LM requires it)"))
    if problems:
        return problems
    problems += _megatron_lm_checks(args, name)
    reported = {prob.line for prob in problems}
    try:
        model, plan = megatron.megatron_plan(_values(args), p.model, p.num_gpus)
    except ValueError as exc:
        line, shown = _line_of(args, ("--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                                      "--num-attention-heads"))
        return problems + [Problem(name, line, f"{shown}: {exc}" if shown else str(exc))]
    for v in rules.check(rules.Context(model, p.cluster, plan, p.num_gpus)):
        if v.severity != rules.ERROR or v.rule not in _RULE_FLAGS:
            continue
        line, shown = _line_of(args, _RULE_FLAGS[v.rule])
        problems.append(Problem(name, line, f"{shown}: {v.message}" if shown else str(v)))
        reported.add(line)
    expected = megatron.arg_values(megatron.megatron_args(p.model, p.plan, p.train))
    # Every flag, not the layout's alone: `genconf launch` trains from plan.json, so an edited --lr (or any other
    # value) would be silently not what runs; the file is plan.json's rendering, line for line.
    flags = list(dict.fromkeys([*_LAYOUT_FLAGS, *expected, *args]))
    for flag in flags:
        got, want = _get(args, flag, _DEFAULTS.get(flag)), expected.get(flag, _DEFAULTS.get(flag))
        if flag == "--cuda-graph-scope" and isinstance(got, list) and isinstance(want, list):
            got, want = sorted(got), sorted(want)  # a set of scopes to megatron-core: the order is not a change
        if got != want:
            line, shown = _line_of(args, (flag,))
            if line in reported and line is not None:
                continue
            wanted = "absent" if want is None else ("present" if want is True else str(want))
            problems.append(Problem(name, line, f"{shown or flag + ' missing'}: contradicts plan.json ({flag} "
                                                f"{wanted}); edit plan.json and re-render"))
    return problems
