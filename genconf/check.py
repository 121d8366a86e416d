"""`genconf check DIR`: re-validate an artifacts directory (perhaps edited by hand) and name the offending line.

Each file is parsed the way its tool parses it (JSON, YAML, Megatron-LM's `--flag value`, sbatch's #SBATCH
lines) and held against plan.json and the one rule book (`genconf.rules`): the Megatron arguments are turned
back into a ParallelPlan and run through `rules.check`, so `--pipeline-model-parallel-size 3` on an 80-layer
model is refused here even though megatron-core's TransformerConfig accepts it. The only subprocess is the
optional `sbatch --test-only` (`--slurm`).
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

from genconf import configs, report, rules
from genconf.errors import GenconfError
from genconf.specs import ClusterSpec, ModelSpec, ParallelPlan, TrainSpec


@dataclass(frozen=True, slots=True)
class Problem:
    file: str
    line: int | None
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}" if self.line else f"{self.file}: {self.message}"


@dataclass(frozen=True, slots=True)
class CheckResult:
    files: tuple[str, ...]
    """Files that were checked."""
    problems: tuple[Problem, ...]


@dataclass(frozen=True, slots=True)
class Planned:
    """What plan.json says: the specs every other file is held against."""

    run: dict
    model: ModelSpec
    cluster: ClusterSpec
    plan: ParallelPlan
    num_gpus: int
    train: TrainSpec


# --- plan.json ------------------------------------------------------------------------------------

_RULE_PLAN_KEY = {
    "whole_nodes": ("cluster", "num_gpus"), "world_size": ("plan", "dp"), "framework_degrees": ("plan", "framework"),
    "framework_zero_stage": ("plan", "zero_stage"), "tp_divides_heads": ("plan", "tp"),
    "tp_divides_kv_heads": ("plan", "tp"), "tp_divides_ffn": ("plan", "tp"), "tp_inside_node": ("plan", "tp"),
    "pipeline_split": ("plan", "pp"), "vp_needs_pp": ("plan", "vp"), "interleave_microbatches": ("plan", "gbs"),
    "batch_divisible": ("plan", "gbs"), "cp_divides_sequence": ("plan", "cp"), "cp_needs_te": ("plan", "cp"),
    "ep_divides_experts": ("plan", "ep"), "moe_needs_sequence_parallel": ("plan", "sequence_parallel"),
    "sequence_parallel": ("plan", "sequence_parallel"), "offload": ("plan", "offload_optimizer"),
    "offload_host_memory": ("plan", "offload_optimizer"), "recompute": ("plan", "recompute"),
    "precision": ("plan", "precision"),
}


def json_key_lines(text: str) -> dict[tuple, int]:
    """1-based line of every object key in JSON text, by its path (array elements by index)."""
    out: dict[tuple, int] = {}
    stack: list[list] = []  # [kind, current key or element index]
    i, n, line = 0, len(text), 1
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            k = j + 1
            while k < n and text[k] in " \t\r":
                k += 1
            if k < n and text[k] == ":" and stack and stack[-1][0] == "obj":
                try:
                    stack[-1][1] = json.loads(text[i:j + 1])
                except ValueError:
                    stack[-1][1] = text[i + 1:j]
                out.setdefault(tuple(frame[1] for frame in stack), line)
            line += text.count("\n", i, j + 1)
            i = j + 1
            continue
        elif c == "{":
            stack.append(["obj", None])
        elif c == "[":
            stack.append(["arr", 0])
        elif c in "}]" and stack:
            stack.pop()
        elif c == "," and stack and stack[-1][0] == "arr":
            stack[-1][1] += 1
        i += 1
    return out


def json_line(text: str, *keys: str) -> int | None:
    """1-based line of the key path `keys` (or of its nearest present ancestor) in JSON text."""
    lines = json_key_lines(text)
    for n in range(len(keys), 0, -1):
        if keys[:n] in lines:
            return lines[keys[:n]]
    return None


def _load_json(name: str, text: str) -> tuple[object, list[Problem]]:
    try:
        return json.loads(text), []
    except json.JSONDecodeError as exc:
        return None, [Problem(name, exc.lineno, f"invalid JSON: {exc.msg} (column {exc.colno})")]


def check_plan(text: str) -> tuple[Planned | None, list[Problem]]:
    run, problems = _load_json("plan.json", text)
    if problems:
        return None, problems
    if not isinstance(run, dict):
        return None, [Problem("plan.json", 1, "expected a JSON object")]
    try:
        model, cluster, plan, num_gpus = report.specs_from_dict(run)
        train = report.train_from_dict(run)
    except GenconfError as exc:
        return None, [Problem("plan.json", None, str(exc).removeprefix("plan.json "))]
    for v in rules.check(rules.Context(model, cluster, plan, num_gpus)):
        if v.severity == rules.ERROR:
            problems.append(Problem("plan.json", json_line(text, *_RULE_PLAN_KEY.get(v.rule, ("plan",))), str(v)))
    return Planned(run, model, cluster, plan, num_gpus, train), problems


# --- ds_config.json -------------------------------------------------------------------------------

def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def check_ds_config(text: str, p: Planned) -> list[Problem]:
    name = "ds_config.json"
    config, problems = _load_json(name, text)
    if problems:
        return problems
    if not isinstance(config, dict):
        return [Problem(name, 1, "expected a JSON object")]

    def at(*keys: str) -> int | None:
        return json_line(text, *keys)

    expected = configs.deepspeed_config(p.model, p.plan, p.train)
    ds_plan, _ = configs.equivalent_plan(p.plan, "deepspeed")
    dp = ds_plan.dp
    values = {}
    for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
        value = _int(config.get(key))
        if value is None or value < 1:
            problems.append(Problem(name, at(key), f"{key} must be a positive integer, got {config.get(key)!r}"))
        values[key] = value
    if None not in values.values():
        tbs, micro, accum = (values[k] for k in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                                 "gradient_accumulation_steps"))
        if tbs != micro * accum * dp:
            problems.append(Problem(name, at("train_batch_size"),
                                    f"train_batch_size ({tbs}) != train_micro_batch_size_per_gpu x "
                                    f"gradient_accumulation_steps x data-parallel size ({micro} x {accum} x {dp} = "
                                    f"{micro * accum * dp})"))
        elif tbs != expected["train_batch_size"]:
            problems.append(Problem(name, at("train_batch_size"),
                                    f"train_batch_size ({tbs}) contradicts plan.json (global batch "
                                    f"{expected['train_batch_size']}); edit plan.json and re-render"))
    zero = config.get("zero_optimization", {})
    if not isinstance(zero, dict):
        problems.append(Problem(name, at("zero_optimization"), "zero_optimization must be an object"))
        zero = {}
    stage = zero.get("stage", 0)
    want = expected["zero_optimization"]["stage"]
    if stage not in (0, 1, 2, 3) or isinstance(stage, bool):
        problems.append(Problem(name, at("zero_optimization", "stage"),
                                f"zero_optimization.stage must be 0-3, got {stage!r}"))
    elif stage != want:
        problems.append(Problem(name, at("zero_optimization", "stage"),
                                f"zero_optimization.stage {stage} contradicts plan.json (zero={want} for "
                                f"{ds_plan.dp} GPUs); edit plan.json and re-render"))
    if isinstance(zero.get("offload_param"), dict) and zero["offload_param"].get("device", "none") != "none" and stage != 3:
        problems.append(Problem(name, at("zero_optimization", "offload_param"),
                                f"offload_param needs zero_optimization.stage 3, not {stage}"))
    if isinstance(zero.get("offload_optimizer"), dict) and zero["offload_optimizer"].get("device", "none") != "none" \
            and stage == 0:
        problems.append(Problem(name, at("zero_optimization", "offload_optimizer"),
                                "offload_optimizer needs ZeRO stage >= 1"))

    def enabled(key: str) -> bool:
        section = config.get(key)
        return isinstance(section, dict) and bool(section.get("enabled"))

    fp16, bf16 = enabled("fp16"), enabled("bf16")
    want_fp16 = "fp16" in expected
    if fp16 and bf16:
        problems.append(Problem(name, at("fp16"), "fp16 and bf16 are both enabled"))
    elif not fp16 and not bf16 and ds_plan.precision != "fp32":
        problems.append(Problem(name, None, f"neither bf16 nor fp16 is enabled; the plan trains in "
                                            f"{'fp16' if want_fp16 else 'bf16'}"))
    elif fp16 != want_fp16:
        problems.append(Problem(name, at("fp16" if fp16 else "bf16"),
                                f"{'fp16' if fp16 else 'bf16'} contradicts plan.json (precision "
                                f"{'fp16' if want_fp16 else ds_plan.precision})"))
    scheduler = config.get("scheduler")
    if isinstance(scheduler, dict) and isinstance(scheduler.get("params"), dict):
        warmup = scheduler["params"].get("warmup_num_steps")
        if warmup is not None and (_int(warmup) is None or warmup < 1):
            problems.append(Problem(name, at("scheduler", "params", "warmup_num_steps"),
                                    f"warmup_num_steps must be a positive integer (DeepSpeed refuses {warmup!r})"))
    return problems


# --- megatron_args.txt ----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class MegatronArg:
    line: int
    flag: str
    text: str | None
    """The value as written (None for a switch)."""
    value: object
    """Typed: True for a switch, int, float, str, or a list of str."""


def parse_megatron_args(text: str, name: str = "megatron_args.txt") -> tuple[dict[str, MegatronArg], list[Problem]]:
    """Every `--flag [value]` line (blank and `#` lines skipped), typed by configs.MEGATRON_FLAGS."""
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
        if flag not in configs.MEGATRON_FLAGS:
            problems.append(Problem(name, number, f"unknown flag {flag} (not a Megatron-LM argument genconf checks; "
                                                  f"see {configs.MEGATRON_LM_SOURCE})"))
            continue
        if flag in args:
            problems.append(Problem(name, number, f"{flag} given twice (first on line {args[flag].line})"))
            continue
        kind, choices = configs.MEGATRON_FLAGS[flag]
        shown = f"{flag} {' '.join(rest)}".strip()
        if kind == configs.SWITCH:
            if rest:
                problems.append(Problem(name, number, f"{flag} is a switch and takes no value, got {' '.join(rest)!r}"))
                continue
            args[flag] = MegatronArg(number, flag, None, True)
            continue
        if not rest or (kind != configs.LIST and len(rest) > 1):
            problems.append(Problem(name, number, f"{shown}: expected one value" if rest else f"{flag} needs a value"))
            continue
        value: object = rest if kind == configs.LIST else rest[0]
        try:
            if kind == configs.INT:
                value = int(rest[0])
            elif kind == configs.FLOAT:
                value = float(rest[0])
        except ValueError:
            wanted = "an integer" if kind == configs.INT else "a number"
            problems.append(Problem(name, number, f"{shown}: expected {wanted}"))
            continue
        if choices and str(value) not in choices:
            problems.append(Problem(name, number, f"{shown}: expected one of {'|'.join(choices)}"))
            continue
        args[flag] = MegatronArg(number, flag, " ".join(rest), value)
    return args, problems


def _get(args: dict[str, MegatronArg], flag: str, default: object = None) -> object:
    return args[flag].value if flag in args else default


def megatron_vp(args: dict[str, MegatronArg]) -> int:
    """Virtual pipeline size the way arguments.py derives it (1 = no interleaving)."""
    if "--num-virtual-stages-per-pipeline-rank" in args:
        return int(_get(args, "--num-virtual-stages-per-pipeline-rank"))
    per_stage = _get(args, "--num-layers-per-virtual-pipeline-stage")
    if per_stage:
        layers = int(_get(args, "--num-layers", 0)) + int("--account-for-embedding-in-pipeline-split" in args) \
            + int("--account-for-loss-in-pipeline-split" in args)
        pp = int(_get(args, "--pipeline-model-parallel-size", 1))
        if pp and layers % pp == 0 and (layers // pp) % per_stage == 0:
            return (layers // pp) // per_stage
    return 1


def _window(text: str | None) -> tuple[int, int] | None:
    """--window-size "w,0" as megatron-core's (left, right) tuple."""
    if not text:
        return None
    left, right = (int(x) for x in str(text).strip("()\"' ").split(","))
    return left, right


def megatron_config_kwargs(args: dict[str, MegatronArg]) -> dict:
    """megatron-core TransformerConfig keyword arguments for parsed Megatron-LM arguments, the way
    Megatron-LM's core_transformer_config_from_args builds them (MEGATRON_LM_SOURCE). Pure values: dtypes are
    names ('bfloat16', 'float16', 'float32') and activation_func is 'silu' or 'gelu' for the caller to map."""
    heads, hidden = int(_get(args, "--num-attention-heads")), int(_get(args, "--hidden-size"))
    swiglu = "--swiglu" in args
    dtype = "float16" if "--fp16" in args else "bfloat16" if "--bf16" in args else "float32"
    vp = megatron_vp(args)
    overlap_p2p = vp > 1 and "--no-overlap-p2p-communication" not in args  # arguments.py: off without interleaving
    ffn = _get(args, "--ffn-hidden-size") or (int((4 * hidden * 2 / 3) / 64) * 64 if swiglu else 4 * hidden)
    kw = {
        "num_layers": _get(args, "--num-layers"), "hidden_size": hidden, "num_attention_heads": heads,
        "ffn_hidden_size": ffn, "kv_channels": _get(args, "--kv-channels") or hidden // heads,
        "num_query_groups": _get(args, "--num-query-groups", 1) if "--group-query-attention" in args else None,
        "hidden_dropout": _get(args, "--hidden-dropout", 0.1), "attention_dropout": _get(args, "--attention-dropout", 0.1),
        "add_bias_linear": "--disable-bias-linear" not in args, "gated_linear_unit": swiglu,
        "activation_func": "silu" if swiglu else "gelu", "normalization": _get(args, "--normalization", "LayerNorm"),
        "layernorm_epsilon": _get(args, "--norm-epsilon", 1e-5), "qk_layernorm": "--qk-layernorm" in args,
        "init_method_std": _get(args, "--init-method-std", 0.02),
        "tensor_model_parallel_size": _get(args, "--tensor-model-parallel-size", 1),
        "pipeline_model_parallel_size": _get(args, "--pipeline-model-parallel-size", 1),
        "virtual_pipeline_model_parallel_size": vp if vp > 1 else None,
        "context_parallel_size": _get(args, "--context-parallel-size", 1),
        "expert_model_parallel_size": _get(args, "--expert-model-parallel-size", 1),
        "sequence_parallel": "--sequence-parallel" in args and _get(args, "--tensor-model-parallel-size", 1) > 1,
        "tp_comm_overlap": "--tp-comm-overlap" in args,
        "num_layers_in_first_pipeline_stage": _get(args, "--decoder-first-pipeline-num-layers"),
        "num_layers_in_last_pipeline_stage": _get(args, "--decoder-last-pipeline-num-layers"),
        "account_for_embedding_in_pipeline_split": "--account-for-embedding-in-pipeline-split" in args,
        "account_for_loss_in_pipeline_split": "--account-for-loss-in-pipeline-split" in args,
        "overlap_p2p_comm": overlap_p2p, "batch_p2p_comm": not overlap_p2p, "deallocate_pipeline_outputs": True,
        "recompute_granularity": _get(args, "--recompute-granularity"),
        "recompute_method": _get(args, "--recompute-method"),
        "recompute_num_layers": _get(args, "--recompute-num-layers"),
        "fp16": "--fp16" in args, "bf16": "--bf16" in args, "params_dtype": dtype, "pipeline_dtype": dtype,
        "fp8": _get(args, "--fp8-format"), "fp8_recipe": _get(args, "--fp8-recipe", "delayed"),
        "first_last_layers_bf16": "--first-last-layers-bf16" in args,
        "num_layers_at_start_in_bf16": _get(args, "--num-layers-at-start-in-bf16", 1),
        "num_layers_at_end_in_bf16": _get(args, "--num-layers-at-end-in-bf16", 1),
    }
    # Set only when given: megatron-core versions without them keep their defaults.
    optional = {"fp8_param": "--fp8-param-gather" in args, "fp4": _get(args, "--fp4-format"),
                "fp4_recipe": _get(args, "--fp4-recipe") if "--fp4-format" in args else None,
                "fp4_param": "--fp4-param-gather" in args,
                "cpu_offloading": _get(args, "--cpu-offloading-num-layers", 0) > 0,
                "cpu_offloading_num_layers": _get(args, "--cpu-offloading-num-layers"),
                "expert_tensor_parallel_size": _get(args, "--expert-tensor-parallel-size"),
                "window_size": _window(_get(args, "--window-size")),
                "window_attn_skip_freq": _get(args, "--window-attn-skip-freq")}
    kw.update({k: v for k, v in optional.items() if v})
    if "--num-experts" in args:
        kw.update(num_moe_experts=_get(args, "--num-experts"), moe_router_topk=_get(args, "--moe-router-topk", 2),
                  moe_ffn_hidden_size=_get(args, "--moe-ffn-hidden-size") or ffn,
                  moe_aux_loss_coeff=_get(args, "--moe-aux-loss-coeff", 0.0),
                  moe_token_dispatcher_type=_get(args, "--moe-token-dispatcher-type", "allgather"))
    return kw


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
    "ep_divides_experts": ("--expert-model-parallel-size", "--num-experts"),
    "moe_needs_sequence_parallel": ("--tensor-model-parallel-size",),
    "sequence_parallel": ("--sequence-parallel",),
    "recompute": ("--recompute-granularity",),
    "precision": ("--fp8-format", "--fp16", "--transformer-impl"),
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
                 "--cpu-offloading-num-layers")
_DEFAULTS = {"--tensor-model-parallel-size": 1, "--pipeline-model-parallel-size": 1, "--context-parallel-size": 1,
             "--expert-model-parallel-size": 1, "--num-virtual-stages-per-pipeline-rank": 1}
_REQUIRED = ("--num-layers", "--hidden-size", "--num-attention-heads", "--max-position-embeddings",
             "--micro-batch-size", "--seq-length")


def _line_of(args: dict[str, MegatronArg], flags: tuple[str, ...]) -> tuple[int | None, str]:
    for flag in flags:
        if flag in args:
            a = args[flag]
            return a.line, a.flag if a.text is None else f"{a.flag} {a.text}"
    return None, ""


def megatron_plan(args: dict[str, MegatronArg], model: ModelSpec, num_gpus: int) -> tuple[ModelSpec, ParallelPlan]:
    """The model and ParallelPlan a set of Megatron arguments describes (ValueError if there is none)."""
    g = lambda flag, default=None: _get(args, flag, default)  # noqa: E731
    heads = int(g("--num-attention-heads"))
    experts = int(g("--num-experts", 0) or 0)
    new_model = dataclasses.replace(
        model, num_layers=int(g("--num-layers")), hidden_size=int(g("--hidden-size")), num_attention_heads=heads,
        num_query_groups=int(g("--num-query-groups", 1)) if "--group-query-attention" in args else heads,
        ffn_hidden_size=int(g("--ffn-hidden-size", model.ffn_hidden_size)),
        kv_channels=int(g("--kv-channels", 0) or int(g("--hidden-size")) // heads),
        num_experts=experts, moe_top_k=int(g("--moe-router-topk", 2)) if experts else 0,
        moe_ffn_hidden_size=int(g("--moe-ffn-hidden-size", 0) or g("--ffn-hidden-size", model.ffn_hidden_size)))
    tp, pp, cp = (int(g(f, 1)) for f in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                                          "--context-parallel-size"))
    if num_gpus % (tp * pp * cp):
        raise ValueError(f"tp x pp x cp = {tp} x {pp} x {cp} = {tp * pp * cp} does not divide the plan's "
                         f"{num_gpus} GPUs")
    dp = num_gpus // (tp * pp * cp)
    mbs = int(g("--micro-batch-size"))
    precision = ("fp8" if "--fp8-format" in args else "fp4" if "--fp4-format" in args else "fp16" if "--fp16" in args
                 else "bf16" if "--bf16" in args else "fp32")
    fp8_recipe = {"tensorwise": "current", "delayed": "delayed", "blockwise": "blockwise", "mxfp8": "mxfp8"}.get(
        g("--fp8-recipe", "delayed")) if precision == "fp8" else None
    sharding = g("--data-parallel-sharding-strategy", "optim_grads")
    zero = ({"optim_grads_params": 3}.get(sharding, 2) if "--use-megatron-fsdp" in args
            else 1 if "--use-distributed-optimizer" in args else 0)
    block = g("--recompute-method") == "block"
    plan = ParallelPlan(
        framework="megatron", tp=tp, pp=pp, vp=megatron_vp(args), cp=cp, ep=int(g("--expert-model-parallel-size", 1)),
        dp=dp, mbs=mbs, gbs=int(g("--global-batch-size", mbs * dp)), seq_length=int(g("--seq-length")),
        zero_stage=zero, etp=g("--expert-tensor-parallel-size"),
        recompute=g("--recompute-granularity") or "none", sequence_parallel="--sequence-parallel" in args,
        recompute_layers=int(g("--recompute-num-layers")) if block else None,
        offload_activation_layers=int(g("--cpu-offloading-num-layers", 0) or 0),
        precision=precision, fp8_recipe=fp8_recipe, tp_comm_overlap="--tp-comm-overlap" in args,
        fp8_param_gather="--fp8-param-gather" in args or "--fp4-param-gather" in args,
        precision_aware_optimizer="--use-precision-aware-optimizer" in args,
        grad_dtype="bf16" if "--grad-reduce-in-bf16" in args else None,
        layer_spec="local" if g("--transformer-impl") == "local" else "te",
        pp_first_stage_layers=g("--decoder-first-pipeline-num-layers"),
        pp_last_stage_layers=g("--decoder-last-pipeline-num-layers"),
        pp_embedding_as_layer="--account-for-embedding-in-pipeline-split" in args,
        pp_loss_as_layer="--account-for-loss-in-pipeline-split" in args)
    return new_model, plan


def _megatron_lm_checks(args: dict[str, MegatronArg], name: str) -> list[Problem]:
    """What Megatron-LM's validate_args asserts (MEGATRON_LM_SOURCE), plus the PP=2 interleaving guard."""
    out: list[Problem] = []

    def problem(flag: str, message: str) -> None:
        line, shown = _line_of(args, (flag,))
        out.append(Problem(name, line, f"{shown}: {message}" if shown else message))

    vp, pp = megatron_vp(args), int(_get(args, "--pipeline-model-parallel-size", 1))
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
    seq, max_pos = _get(args, "--seq-length"), _get(args, "--max-position-embeddings")
    if seq is not None and max_pos is not None and max_pos < seq:
        problem("--max-position-embeddings", f"must be >= --seq-length ({seq})")
    lr, min_lr = _get(args, "--lr"), _get(args, "--min-lr", 0.0)
    if lr is not None and min_lr > lr:
        problem("--min-lr", f"must be <= --lr ({lr})")
    return out


def check_megatron_args(text: str, p: Planned) -> list[Problem]:
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
        model, plan = megatron_plan(args, p.model, p.num_gpus)
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
    expected, _ = parse_megatron_args(configs.megatron_args_text(configs.megatron_args(p.model, p.plan, p.train)))
    for flag in _LAYOUT_FLAGS:
        got, want = _get(args, flag, _DEFAULTS.get(flag)), _get(expected, flag, _DEFAULTS.get(flag))
        if got != want:
            line, shown = _line_of(args, (flag,))
            if line in reported and line is not None:
                continue
            wanted = "absent" if want is None else ("present" if want is True else str(want))
            problems.append(Problem(name, line, f"{shown or flag + ' missing'}: contradicts plan.json ({flag} "
                                                f"{wanted}); edit plan.json and re-render"))
    return problems


# --- olmo_fsdp.yaml -------------------------------------------------------------------------------

def yaml_lines(text: str) -> dict[tuple[str, ...], int]:
    """1-based line of every mapping key path in a YAML document."""
    out: dict[tuple[str, ...], int] = {}

    def walk(node: yaml.Node, path: tuple[str, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                sub = path + (str(key.value),)
                out[sub] = key.start_mark.line + 1
                walk(value, sub)

    root = yaml.compose(text, Loader=yaml.SafeLoader)
    if root is not None:
        walk(root, ())
    return out


_OLMO_WRAPPING = configs.FSDP_WRAPPING + ("one_in_two", "one_in_three", "one_in_four", "one_in_five")
_OLMO_ACTIVATION_CHECKPOINTING = (None, "whole_layer", "one_in_two", "one_in_three", "one_in_four", "one_in_eight",
                                  "two_in_three", "three_in_four", "fine_grained")


def check_olmo(text: str, p: Planned) -> list[Problem]:
    name = "olmo_fsdp.yaml"
    try:
        config = yaml.safe_load(text)
        lines = yaml_lines(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        return [Problem(name, mark.line + 1 if mark else None,
                        f"invalid YAML: {getattr(exc, 'problem', None) or str(exc).splitlines()[0]}")]
    if not isinstance(config, dict):
        return [Problem(name, 1, "expected a mapping (an OLMo TrainConfig)")]
    expected = configs.olmo_config(p.model, p.plan, p.train, "check")
    problems: list[Problem] = []

    def get(*keys: str) -> object:
        node: object = config
        for key in keys:
            node = node.get(key) if isinstance(node, dict) else None
        return node

    def bad(keys: tuple[str, ...], message: str) -> None:
        line = None
        for n in range(len(keys), 0, -1):
            line = lines.get(keys[:n])
            if line:
                break
        problems.append(Problem(name, line, message))

    for key in ("d_model", "n_heads", "n_layers", "mlp_hidden_size", "vocab_size"):
        if get("model", key) != expected["model"][key]:
            bad(("model", key), f"model.{key} {get('model', key)!r} contradicts plan.json ({expected['model'][key]})")
    strategy = get("fsdp", "sharding_strategy")
    if strategy not in configs.FSDP_SHARDING:
        bad(("fsdp", "sharding_strategy"), f"fsdp.sharding_strategy {strategy!r} is not one of "
                                           f"{'|'.join(configs.FSDP_SHARDING)}")
    elif strategy != expected["fsdp"]["sharding_strategy"]:
        bad(("fsdp", "sharding_strategy"), f"fsdp.sharding_strategy {strategy} contradicts plan.json "
                                           f"({expected['fsdp']['sharding_strategy']})")
    wrapping = get("fsdp", "wrapping_strategy")
    if wrapping is not None and wrapping not in _OLMO_WRAPPING:
        bad(("fsdp", "wrapping_strategy"), f"fsdp.wrapping_strategy {wrapping!r} is not one of {'|'.join(_OLMO_WRAPPING)}")
    elif isinstance(wrapping, str) and wrapping.startswith("by_block_group") \
            and not (get("model", "block_group_size") or 1) > 1:
        bad(("fsdp", "wrapping_strategy"), f"fsdp.wrapping_strategy {wrapping} needs model.block_group_size > 1")
    if get("fsdp", "precision") not in (None, "pure", "mixed"):
        bad(("fsdp", "precision"), f"fsdp.precision {get('fsdp', 'precision')!r} is not pure|mixed")
    distributed = get("distributed_strategy")
    if distributed not in ("ddp", "fsdp", "single"):
        bad(("distributed_strategy",), f"distributed_strategy {distributed!r} is not ddp|fsdp|single")
    elif distributed != expected["distributed_strategy"]:
        bad(("distributed_strategy",), f"distributed_strategy {distributed} contradicts plan.json "
                                       f"({expected['distributed_strategy']} for {expected['fsdp']['sharding_strategy']})")
    gbs, micro = get("global_train_batch_size"), get("device_train_microbatch_size")
    if _int(gbs) is None or _int(micro) is None or gbs < 1 or micro < 1:
        bad(("global_train_batch_size",),
            "global_train_batch_size and device_train_microbatch_size must be positive integers")
    elif gbs % (micro * p.num_gpus):
        bad(("global_train_batch_size",), f"global_train_batch_size ({gbs}) must be a multiple of "
                                          f"device_train_microbatch_size x world size ({micro} x {p.num_gpus})")
    elif gbs != expected["global_train_batch_size"]:
        bad(("global_train_batch_size",), f"global_train_batch_size ({gbs}) contradicts plan.json "
                                          f"({expected['global_train_batch_size']})")
    if get("precision") not in ("amp_bf16", "amp_fp16", "fp32"):
        bad(("precision",), f"precision {get('precision')!r} is not amp_bf16|amp_fp16|fp32")
    if get("activation_checkpointing") not in _OLMO_ACTIVATION_CHECKPOINTING:
        bad(("activation_checkpointing",), f"activation_checkpointing {get('activation_checkpointing')!r} is not one of "
                                           f"{'|'.join(str(s) for s in _OLMO_ACTIVATION_CHECKPOINTING[1:])}")
    replicas = get("fsdp", "hybrid_sharding_num_model_replicas")
    nodes, _ = configs.slurm_layout(p.cluster, p.num_gpus)
    if replicas is not None and (_int(replicas) is None or replicas < 1 or nodes % replicas):
        bad(("fsdp", "hybrid_sharding_num_model_replicas"),
            f"fsdp.hybrid_sharding_num_model_replicas ({replicas}) must divide the number of nodes ({nodes})")
    return problems


# --- sbatch scripts -------------------------------------------------------------------------------

_SHORT = {"-N": "--nodes", "-J": "--job-name", "-t": "--time", "-p": "--partition", "-A": "--account",
          "-o": "--output", "-e": "--error", "-D": "--chdir", "-n": "--ntasks", "-c": "--cpus-per-task"}


def sbatch_arguments(line: str) -> list[str]:
    """The words of an #SBATCH line as sbatch splits them: quotes and backslash escapes, `#` ends it."""
    words, word, quote, escape, started = [], [], "", False, False
    for ch in line:
        if escape:
            word.append(ch)
            escape, started = False, True
        elif ch == "\\":
            escape = True
        elif quote:
            if ch == quote:
                quote = ""
            else:
                word.append(ch)
        elif ch in "\"'":
            quote, started = ch, True
        elif ch == "#":
            break
        elif ch.isspace():
            if started:
                words.append("".join(word))
                word, started = [], False
        else:
            word.append(ch)
            started = True
    if started:
        words.append("".join(word))
    return words


def sbatch_options(text: str) -> tuple[dict[str, tuple[int, str]], list[tuple[int, str]]]:
    """(#SBATCH options as option -> (line, value), #SBATCH lines sbatch ignores because they follow a command)."""
    options: dict[str, tuple[int, str]] = {}
    ignored: list[tuple[int, str]] = []
    in_header = True
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if number > 1 and stripped and not stripped.startswith("#"):
            in_header = False
        if not raw.startswith("#SBATCH"):
            continue
        if not in_header:
            ignored.append((number, raw))
            continue
        words = sbatch_arguments(raw[len("#SBATCH"):])
        i = 0
        while i < len(words):
            word = words[i]
            if word.startswith("--"):
                key, eq, value = word.partition("=")
                if not eq and i + 1 < len(words) and not words[i + 1].startswith("-"):
                    value, i = words[i + 1], i + 1
            elif word in _SHORT:
                key, value = _SHORT[word], words[i + 1] if i + 1 < len(words) else ""
                i += 1
            else:
                key, value = word, ""
            options[key] = (number, value)
            i += 1
    return options, ignored


def _torchrun_flags(text: str) -> dict[str, tuple[int, str]]:
    """--nnodes and --nproc-per-node of the torchrun command (its continuation lines included)."""
    lines = text.splitlines()
    out: dict[str, tuple[int, str]] = {}
    for start, line in enumerate(lines):
        if ("torch.distributed.run" in line or re.search(r"\btorchrun\b", line)) and not line.lstrip().startswith("#"):
            i = start
            while True:
                for match in re.finditer(r"(--nnodes|--nproc[-_]per[-_]node)(?:=|\s+)(\S+)", lines[i]):
                    key = "--nnodes" if match.group(1) == "--nnodes" else "--nproc-per-node"
                    out.setdefault(key, (i + 1, match.group(2).strip("'\"")))
                if not lines[i].rstrip().endswith("\\") or i + 1 >= len(lines):
                    break
                i += 1
            break
    return out


_GPU_COUNT = re.compile(r"^(?:[A-Za-z0-9_-]+:)*(\d+)$")
_JOB_TOKEN = re.compile(r"^[A-Za-z0-9._-]+$")


def check_sbatch(name: str, text: str, p: Planned) -> list[Problem]:
    problems: list[Problem] = []
    nodes, per_node = configs.slurm_layout(p.cluster, p.num_gpus)
    if not text.startswith("#!"):
        problems.append(Problem(name, 1, "the first line must be '#!' and an interpreter (sbatch refuses the script)"))
    options, ignored = sbatch_options(text)
    for number, raw in ignored:
        problems.append(Problem(name, number, f"{raw.strip()}: sbatch ignores #SBATCH lines after the first command"))

    def expect(option: str, want: int, why: str) -> None:
        if option not in options:
            problems.append(Problem(name, None, f"no #SBATCH {option} line ({why} needs {option}={want})"))
            return
        line, value = options[option]
        match = _GPU_COUNT.match(value) if option == "--gpus-per-node" else re.match(r"^(\d+)$", value)
        if not match or int(match.group(1)) != want:
            problems.append(Problem(name, line, f"#SBATCH {option}={value} contradicts the plan: {why} needs "
                                                f"{option}={want}"))

    layout = f"{p.num_gpus} GPUs on {p.cluster.gpus_per_node}-GPU nodes"
    expect("--nodes", nodes, layout)
    expect("--ntasks-per-node", 1, "one torchrun per node")
    expect("--gpus-per-node", per_node, layout)
    for option in ("--job-name", "--account", "--partition"):
        if option in options and not _JOB_TOKEN.match(options[option][1]):
            line, value = options[option]
            problems.append(Problem(name, line, f"#SBATCH {option}={value!r}: use letters, digits, '.', '_', '-'"))
    if "--time" in options and not configs.SLURM_TIME.match(options["--time"][1]):
        line, value = options["--time"]
        problems.append(Problem(name, line, f"#SBATCH --time={value!r} is not a Slurm time (HH:MM:SS or D-HH:MM:SS)"))
    torchrun = _torchrun_flags(text)
    if not torchrun:
        problems.append(Problem(name, None, "no torchrun (python -m torch.distributed.run) command"))
        return problems
    for flag, want in (("--nnodes", nodes), ("--nproc-per-node", per_node)):
        if flag not in torchrun:
            problems.append(Problem(name, None, f"torchrun has no {flag} (the plan needs {flag}={want})"))
            continue
        line, value = torchrun[flag]
        if value != str(want):
            problems.append(Problem(name, line, f"torchrun {flag}={value} contradicts the plan: {layout} needs "
                                                f"{flag}={want}"))
    return problems


def sbatch_test_only(path: Path) -> str | None:
    """Slurm's own verdict on a script without running it: None when `sbatch --test-only` accepts it, else
    what sbatch said, on one line."""
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        return "sbatch not found: --slurm needs the Slurm client on PATH"
    try:
        out = subprocess.run([sbatch, "--test-only", path.name], capture_output=True, text=True, timeout=60,
                             cwd=path.parent)
    except subprocess.TimeoutExpired:
        return "sbatch --test-only did not answer within 60 s (is slurmctld up?)"
    if out.returncode == 0:
        return None
    said = [line.strip() for line in (out.stderr + out.stdout).splitlines() if line.strip()]
    return "; ".join(said) or f"sbatch --test-only exited with {out.returncode}"


# --- the directory --------------------------------------------------------------------------------

def check_dir(path: Path, *, slurm: bool = False) -> CheckResult:
    """Every problem in an artifacts directory; files named relative to it."""
    path = Path(path)
    if not path.is_dir():
        raise GenconfError(f"{path} is not a directory")
    plan_file = path / "plan.json"
    if not plan_file.is_file():
        return CheckResult((), (Problem("plan.json", None, "missing: not a genconf artifacts directory"),))
    planned, problems = check_plan(plan_file.read_text())
    checked = ["plan.json"]
    if planned is None or problems:
        # Every other file derives from plan.json: with the plan itself broken there is nothing to hold them to.
        return CheckResult(tuple(checked), tuple(problems))
    for name in configs.artifact_names(planned.plan):
        if name in ("plan.json", "README.md"):
            continue
        file = path / name
        if not file.is_file():
            problems.append(Problem(name, None, "missing (re-render with genconf render)"))
            continue
        try:
            text = file.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(Problem(name, None, f"cannot read: {exc}"))
            continue
        checked.append(name)
        try:
            if name == "ds_config.json":
                problems += check_ds_config(text, planned)
            elif name == "megatron_args.txt":
                problems += check_megatron_args(text, planned)
            elif name == "olmo_fsdp.yaml":
                problems += check_olmo(text, planned)
            else:
                problems += check_sbatch(name, text, planned)
        except (ValueError, TypeError) as exc:
            problems.append(Problem(name, None, str(exc)))
        if slurm and name.endswith(".sbatch"):
            refusal = sbatch_test_only(file)
            if refusal is not None:
                problems.append(Problem(name, None, refusal))
    return CheckResult(tuple(checked), tuple(problems))
