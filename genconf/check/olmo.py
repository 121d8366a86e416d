"""olmo_fsdp.yaml: OLMo's TrainConfig names and choices, and the model shape, sharding and batch against the plan."""

from __future__ import annotations

import yaml

from genconf.check.common import Problem, as_int
from genconf.plan.planfile import PlanFile
from genconf.plan.precision import OLMO_PRECISION
from genconf.render import olmo, slurm


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


_OLMO_WRAPPING = olmo.FSDP_WRAPPING + ("one_in_two", "one_in_three", "one_in_four", "one_in_five")
_OLMO_ACTIVATION_CHECKPOINTING = (None, "whole_layer", "one_in_two", "one_in_three", "one_in_four", "one_in_eight",
                                  "two_in_three", "three_in_four", "fine_grained")


def check_olmo(text: str, p: PlanFile) -> list[Problem]:
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
    expected = olmo.olmo_config(p.model, p.plan, p.train, "check")
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

    section = config.get("model") if isinstance(config.get("model"), dict) else {}
    for key in ("d_model", "n_heads", "n_layers", "mlp_hidden_size", "vocab_size"):
        if key not in section:
            # A renamed key (a typo) is what usually removed it: name the keys genconf did not write.
            strays = [k for k in section if k not in expected["model"]]
            bad(("model", strays[0]) if strays else ("model",),
                f"model.{key} is missing (plan.json: {expected['model'][key]})"
                + (f"; model.{strays[0]} is not a key genconf writes" if strays else ""))
        elif get("model", key) != expected["model"][key]:
            bad(("model", key), f"model.{key} {get('model', key)!r} contradicts plan.json ({expected['model'][key]})")
    activation = get("model", "activation_type")
    if activation is not None and activation not in olmo.OLMO_ACTIVATION_TYPES:  # TrainConfig.load refuses others
        bad(("model", "activation_type"), f"model.activation_type {activation!r} is not one of OLMo's "
                                          f"{'|'.join(olmo.OLMO_ACTIVATION_TYPES)}")
    strategy = get("fsdp", "sharding_strategy")
    if strategy not in olmo.FSDP_SHARDING:
        bad(("fsdp", "sharding_strategy"), f"fsdp.sharding_strategy {strategy!r} is not one of "
                                           f"{'|'.join(olmo.FSDP_SHARDING)}")
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
    if as_int(gbs) is None or as_int(micro) is None or gbs < 1 or micro < 1:
        bad(("global_train_batch_size",),
            "global_train_batch_size and device_train_microbatch_size must be positive integers")
    elif gbs % (micro * p.num_gpus):
        bad(("global_train_batch_size",), f"global_train_batch_size ({gbs}) must be a multiple of "
                                          f"device_train_microbatch_size x world size ({micro} x {p.num_gpus})")
    elif gbs != expected["global_train_batch_size"]:
        bad(("global_train_batch_size",), f"global_train_batch_size ({gbs}) contradicts plan.json "
                                          f"({expected['global_train_batch_size']})")
    if get("precision") not in OLMO_PRECISION.values():
        bad(("precision",), f"precision {get('precision')!r} is not {'|'.join(OLMO_PRECISION.values())}")
    if get("activation_checkpointing") not in _OLMO_ACTIVATION_CHECKPOINTING:
        bad(("activation_checkpointing",), f"activation_checkpointing {get('activation_checkpointing')!r} is not one of "
                                           f"{'|'.join(str(s) for s in _OLMO_ACTIVATION_CHECKPOINTING[1:])}")
    fused = get("fused_loss")
    if fused not in (None, True, False):
        bad(("fused_loss",), f"fused_loss {fused!r} is not true|false")
    elif bool(fused) != bool(expected.get("fused_loss")):
        bad(("fused_loss",), f"fused_loss {bool(fused)} contradicts plan.json ({bool(expected.get('fused_loss'))}): the "
                             f"plan's memory prices {'the fused' if expected.get('fused_loss') else 'an fp32'} cross "
                             f"entropy (genconf --fused-loss)")
    replicas = get("fsdp", "hybrid_sharding_num_model_replicas")
    nodes, _ = slurm.slurm_layout(p.cluster, p.num_gpus)
    if replicas is not None and (as_int(replicas) is None or replicas < 1 or nodes % replicas):
        bad(("fsdp", "hybrid_sharding_num_model_replicas"),
            f"fsdp.hybrid_sharding_num_model_replicas ({replicas}) must divide the number of nodes ({nodes})")
    return problems
