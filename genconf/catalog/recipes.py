"""Versioned training recipes (`recipes/*.yaml`): model, cluster, layout, precision, optimizer, batch, seed,
data, length and expectations, plus a `smoke` variant that trains on a CPU in seconds. A recipe may `extends:`
another and change a few keys. Unknown keys are an error naming the file and the key.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path

from genconf.catalog.clusters import resolve_cluster
from genconf.catalog.files import read_yaml, resource_dir
from genconf.catalog.hardware import calibration_for
from genconf.catalog.models import MODEL_KEYS, resolve_model
from genconf.plan import planfile, precision
from genconf.plan.errors import GenconfError
from genconf.plan.specs import ModelSpec, ParallelPlan, TrainSpec

TOP_KEYS = ("name", "version", "description", "extends", "model", "cluster", "gpus", "precision", "layout",
            "optimizer", "batch", "seed", "data", "train", "expect", "smoke")
SECTIONS = {
    "layout": ("framework", "tp", "pp", "vp", "cp", "ep", "zero", "mbs", "recompute", "layer_spec",
               "first_stage_layers", "last_stage_layers", "pp_layout", "tp_comm_overlap", "grad_dtype"),
    "optimizer": ("lr", "min_lr", "warmup_steps", "lr_decay", "weight_decay", "beta1", "beta2", "eps", "grad_clip"),
    "batch": ("global_batch", "seq_length"),
    "data": ("kind", "path", "dtype", "branching"),
    "train": ("steps", "tokens", "checkpoint_every_steps"),
    "expect": ("golden", "loss_tolerance", "throughput_band", "peak_memory_gib", "min_loss_drop"),
    "smoke": ("gpus", "layers", "hidden", "heads", "vocab", "seq_length", "global_batch", "mbs", "steps", "lr",
              "warmup_steps", "precision", "layout", "note"),
}
SMOKE_LAYOUT_KEYS = ("tp", "pp", "vp", "dp", "zero", "recompute")
SMOKE_PRECISION = "fp32"
"""Smoke variants compute in FP32 on the CPU: BF16 GEMMs there dispatch on the instruction set (AMX,
AVX512-BF16, emulation) and their curves do not travel between machines; FP32 with the pins of
genconf.train.cpu_numerics does. The recipe's own precision is what the full-size plan and artifacts use."""


@dataclass(frozen=True)
class Recipe:
    name: str
    path: Path
    data: dict = field(repr=False)
    """The merged mapping (after `extends`)."""

    def section(self, key: str) -> dict:
        return dict(self.data.get(key) or {})

    @property
    def version(self) -> int:
        return int(self.data.get("version", 1))

    @property
    def precision_recipe(self) -> precision.PrecisionRecipe:
        return precision.recipe(self.data.get("precision", "bf16"))

    @property
    def golden_path(self) -> Path | None:
        golden = self.section("expect").get("golden")
        return (self.path.parent / golden) if golden else None


RECIPES_DIR_ENV = "GENCONF_RECIPES_DIR"
"""Another recipes folder (for trying recipes out, and for tests); default: the package's recipes/."""


def recipe_dir() -> Path:
    import os

    custom = os.environ.get(RECIPES_DIR_ENV)
    if custom:
        if not Path(custom).is_dir():
            raise GenconfError(f"{RECIPES_DIR_ENV}={custom} is not a directory")
        return Path(custom)
    return resource_dir("recipes")


def list_recipes() -> list[str]:
    return sorted(p.stem for p in recipe_dir().glob("*.yaml"))


def _merge(base: dict, child: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in child.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _check(path: Path, data: dict) -> None:
    for key, value in data.items():
        if key not in TOP_KEYS:
            raise GenconfError(f"{path}: unknown key '{key}' (allowed: {', '.join(TOP_KEYS)})")
        if key in SECTIONS and value is not None:
            if not isinstance(value, dict):
                raise GenconfError(f"{path}: '{key}' must be a mapping")
            for sub in value:
                if sub not in SECTIONS[key]:
                    raise GenconfError(f"{path}: unknown key '{key}.{sub}' (allowed: {', '.join(SECTIONS[key])})")
    smoke_layout = (data.get("smoke") or {}).get("layout") or {}
    for sub in smoke_layout:
        if sub not in SMOKE_LAYOUT_KEYS:
            raise GenconfError(f"{path}: unknown key 'smoke.layout.{sub}' (allowed: {', '.join(SMOKE_LAYOUT_KEYS)})")
    if "model" in data and isinstance(data["model"], dict):
        allowed = MODEL_KEYS
        for sub in data["model"]:
            if sub not in allowed:
                raise GenconfError(f"{path}: unknown key 'model.{sub}'")
    for key, what in (("extends", "a recipe name"), ("cluster", "a cluster preset or YAML file"),
                      ("description", "one line of text")):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise GenconfError(f"{path}: {key} must be {what}, got {data[key]!r}")
    if "precision" in data and data["precision"] not in precision.RECIPES:
        raise GenconfError(f"{path}: precision '{data['precision']}' is not a recipe "
                           f"(one of: {', '.join(precision.RECIPES)})")


_INTEGERS = {"": ("version", "gpus", "seed"),
             "layout": ("tp", "pp", "vp", "cp", "ep", "zero", "mbs", "first_stage_layers", "last_stage_layers"),
             "optimizer": ("warmup_steps",), "batch": ("global_batch", "seq_length"),
             "train": ("steps", "checkpoint_every_steps"),
             "smoke": ("gpus", "layers", "hidden", "heads", "vocab", "seq_length", "global_batch", "mbs", "steps",
                       "warmup_steps"),
             "smoke.layout": ("tp", "pp", "vp", "dp", "zero")}
_NUMBERS = {"optimizer": ("lr", "min_lr", "weight_decay", "beta1", "beta2", "eps", "grad_clip"), "train": ("tokens",),
            "smoke": ("lr",), "expect": ("loss_tolerance", "peak_memory_gib", "min_loss_drop")}
_CHOICES = {("layout", "framework"): ("megatron", "deepspeed", "fsdp"),
            ("layout", "recompute"): ("none", "selective", "full"),
            ("smoke.layout", "recompute"): ("none", "selective", "full"),
            ("layout", "layer_spec"): ("te", "local"), ("layout", "grad_dtype"): ("fp32", "bf16"),
            ("data", "kind"): ("synthetic", "memmap")}  # genconf.train.data.source_from
_ZERO_ALLOWED = {"zero", "warmup_steps", "seed"}
_FLOAT_TEXT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def _typed(path: Path, data: dict) -> None:
    """Every value of a known type is of it, in place: YAML 1.1 reads 3e-4 (no decimal point) as text, so a number
    written so is read as the number; anything else is a GenconfError naming the key (a traceback before)."""
    def mapping(section: str) -> dict:
        if not section:
            return data
        node: object = data
        for part in section.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        return node if isinstance(node, dict) else {}

    for section, keys in _INTEGERS.items():
        m = mapping(section)
        for key in keys:
            if key in m and m[key] is not None:
                value, low = m[key], 0 if key in _ZERO_ALLOWED else 1
                if isinstance(value, bool) or not isinstance(value, int) or value < low:
                    raise GenconfError(f"{path}: {section + '.' if section else ''}{key} must be "
                                       f"{'a non-negative' if low == 0 else 'a positive'} integer, got {value!r}")
    for section, keys in _NUMBERS.items():
        m = mapping(section)
        for key in keys:
            if key in m and m[key] is not None:
                value = m[key]
                if isinstance(value, str) and _FLOAT_TEXT.match(value.strip()):
                    value = m[key] = float(value)
                if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                    raise GenconfError(f"{path}: {section}.{key} must be a non-negative number, got {m[key]!r}")
    for (section, key), allowed in _CHOICES.items():
        m = mapping(section)
        if key in m and m[key] is not None and m[key] not in allowed:
            raise GenconfError(f"{path}: {section}.{key} must be one of {', '.join(allowed)}, got {m[key]!r}")
    data_path = mapping("data").get("path")
    if mapping("data").get("kind") == "memmap" and not (isinstance(data_path, str) and data_path):
        raise GenconfError(f"{path}: data.kind memmap reads a tokenized file: give data.path, got {data_path!r}")
    golden = mapping("expect").get("golden")
    if golden is not None and not isinstance(golden, str):
        raise GenconfError(f"{path}: expect.golden must be a file name (relative to the recipe), got {golden!r}")
    band = mapping("expect").get("throughput_band")
    if band is not None and not (isinstance(band, list) and len(band) == 2
                                 and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in band)
                                 and 0 <= band[0] <= band[1]):
        raise GenconfError(f"{path}: expect.throughput_band must be [low, high], measured / predicted tokens per "
                           f"second with 0 <= low <= high (such as [0.8, 1.25]), got {band!r}")
    overlap = mapping("layout").get("tp_comm_overlap")
    if overlap is not None and not isinstance(overlap, bool):
        raise GenconfError(f"{path}: layout.tp_comm_overlap must be true or false, got {overlap!r}")


def unknown_recipe(ref: str, what: str = "unknown recipe") -> str:
    """Why recipe `ref` is not found: a path that is not there, or a name not in the recipes folder (naming the folder
    when it holds none: an empty GENCONF_RECIPES_DIR read '(one of: )')."""
    if ref.endswith((".yaml", ".yml")):
        return f"recipe file {ref} {'is not a file' if Path(ref).exists() else 'does not exist'}"
    available = list_recipes()
    if not available:
        return f"{what} '{ref}': {recipe_dir()} holds no recipes (NAME.yaml files)"
    return f"{what} '{ref}' (one of: {', '.join(available)})"


def load_recipe(ref: str, _seen: tuple[str, ...] = ()) -> Recipe:
    """A recipe by name (recipes/NAME.yaml) or path, with its `extends:` chain merged (child keys win)."""
    path = Path(ref) if ref.endswith((".yaml", ".yml")) else recipe_dir() / f"{ref}.yaml"
    if not path.is_file():
        raise GenconfError(unknown_recipe(ref))
    data = read_yaml(path)
    _check(path, data)
    name = data.get("name", path.stem)
    if name != path.stem:
        raise GenconfError(f"{path}: name '{name}' must equal the file name '{path.stem}'")
    parent = data.get("extends")
    if parent:
        if parent in _seen or parent == name:
            raise GenconfError(f"{path}: 'extends' forms a cycle through {parent}")
        base = load_recipe(parent, _seen + (name,))
        merged = _merge({k: v for k, v in base.data.items() if k not in ("name", "description")}, data)
        merged.pop("extends", None)
        data = merged
    _typed(path, data)
    return Recipe(name=name, path=path, data=data)


# --- turning a recipe into specs --------------------------------------------------------------------

def model_of(recipe: Recipe) -> ModelSpec:
    ref = recipe.data.get("model")
    if isinstance(ref, dict):
        values = {k: v for k, v in ref.items() if k != "aliases"}
        values.setdefault("name", f"{recipe.name}-model")
        try:
            return ModelSpec(**values)
        except (TypeError, ValueError) as exc:
            raise GenconfError(f"{recipe.path}: model: {exc}") from None
    if not ref:
        raise GenconfError(f"{recipe.path}: missing key 'model'")
    return resolve_model(str(ref))[0]


def _train_spec(recipe: Recipe, plan: ParallelPlan, model: ModelSpec, *, steps: int | None = None,
                lr: float | None = None, warmup: int | None = None) -> TrainSpec:
    opt = recipe.section("optimizer")
    run = recipe.section("train")
    if steps is None:
        steps = run.get("steps")
        if steps is None:
            from genconf.plan.counting import chinchilla_tokens

            tokens = float(run.get("tokens") or chinchilla_tokens(model))
            steps = max(1, round(tokens / (plan.gbs * plan.seq_length)))
    r = recipe.precision_recipe
    values = {k: opt[k] for k in ("lr", "min_lr", "warmup_steps", "lr_decay", "weight_decay", "beta1", "beta2", "eps",
                                  "grad_clip") if k in opt}
    if lr is not None:
        values["lr"] = lr
        values["min_lr"] = min(values.get("min_lr", lr / 10), lr / 10)
    if warmup is not None:
        values["warmup_steps"] = warmup
    values["warmup_steps"] = min(values.get("warmup_steps", 2000), steps)
    try:
        return TrainSpec(train_steps=int(steps), seed=int(recipe.data.get("seed", 1234)),
                         fp8_recipe=r.train_fp8_recipe,
                         checkpoint_every_steps=int(run.get("checkpoint_every_steps", min(1000, int(steps)))), **values)
    except ValueError as exc:
        raise GenconfError(f"{recipe.path}: optimizer: {exc}") from None


def pins_of(recipe: Recipe):
    from genconf.plan.search import Pins

    layout = recipe.section("layout")
    batch = recipe.section("batch")
    return Pins(framework=layout.get("framework"), tp=layout.get("tp"), pp=layout.get("pp"), vp=layout.get("vp"),
                cp=layout.get("cp"), ep=layout.get("ep"), mbs=layout.get("mbs"), gbs=batch.get("global_batch"),
                seq_length=batch.get("seq_length"), zero_stage=layout.get("zero"), recompute=layout.get("recompute"),
                precision=recipe.precision_recipe.plan_precision, layer_spec=layout.get("layer_spec", "te"),
                fp8_recipe=recipe.precision_recipe.train_fp8_recipe,
                pp_first_stage_layers=layout.get("first_stage_layers"),
                pp_last_stage_layers=layout.get("last_stage_layers"), pp_layout=layout.get("pp_layout"),
                tp_comm_overlap=layout.get("tp_comm_overlap"), grad_dtype=layout.get("grad_dtype"))


def full_run(recipe: Recipe) -> dict:
    """Plan the recipe at full size: the run dict `genconf recipe` prints and renders."""
    from genconf.plan.search import plan_or_explain

    model = model_of(recipe)
    cluster = resolve_cluster(recipe.data.get("cluster"))
    gpus = int(recipe.data.get("gpus") or cluster.total_gpus or cluster.gpus_per_node)
    cal = calibration_for(cluster.gpu.name)
    result = plan_or_explain(model, cluster, gpus, cal, pins_of(recipe), keep=3)
    best = result.best
    train = _train_spec(recipe, best.plan, model)
    tokens = float(train.train_steps * best.plan.gbs * best.plan.seq_length)
    run = planfile.encode(model, None, cluster, gpus, best, result, tokens, train, cal=cal,
                          batch_source="recipe" if recipe.section("batch").get("global_batch") else "default")
    run["recipe"] = {"name": recipe.name, "version": recipe.version, "precision_recipe": recipe.precision_recipe.name,
                     "data": recipe.section("data") or {"kind": "synthetic"}}
    return run


def smoke_run(recipe: Recipe) -> dict:
    """The smoke variant: the full plan's framework, sharding, recompute and kinds of parallelism on a tiny model,
    with the degrees the smoke section gives (a 2-core CPU hosts a few ranks), planned for the recipe's cluster."""
    from genconf.plan import rules
    from genconf.plan.search import evaluate

    full = full_run(recipe)
    decoded = planfile.decode(full)
    model, cluster, plan = decoded.model, decoded.cluster, decoded.plan
    smoke = recipe.section("smoke")
    layout = dict(smoke.get("layout") or {})
    r = precision.recipe(smoke.get("precision", SMOKE_PRECISION))
    heads = smoke.get("heads", 4)
    hidden = smoke.get("hidden", 64)
    ratio = model.num_attention_heads // model.num_query_groups
    groups = heads // ratio if heads % ratio == 0 and heads // ratio >= 1 else heads
    scale = hidden / model.hidden_size
    tiny = dataclasses.replace(
        model, name=f"{model.name}-smoke", num_layers=smoke.get("layers", 4), hidden_size=hidden,
        num_attention_heads=heads, num_query_groups=groups, kv_channels=None,
        ffn_hidden_size=max(8, int(round(model.ffn_hidden_size * scale / 8)) * 8),
        moe_ffn_hidden_size=max(8, int(round(model.moe_ffn_hidden_size * scale / 8)) * 8),
        vocab_size=smoke.get("vocab", 256), seq_length=max(smoke.get("seq_length", 64), 64))
    seq = smoke.get("seq_length", 64)
    tp, pp, vp = layout.get("tp", plan.tp), layout.get("pp", plan.pp), layout.get("vp", plan.vp)
    dp = layout.get("dp", 1 if plan.framework == "megatron" else 2)
    gbs = smoke.get("global_batch", 8)
    mbs = smoke.get("mbs", 1)
    small = dataclasses.replace(
        plan.with_layout(None), tp=tp, pp=pp, vp=vp, cp=1, dp=dp, mbs=mbs, gbs=gbs, seq_length=seq,
        zero_stage=layout.get("zero", plan.zero_stage), recompute=layout.get("recompute", plan.recompute),
        sequence_parallel=plan.framework == "megatron" and tp > 1, shard_group_size=None,
        offload_optimizer=False, offload_params=False, ep=min(plan.ep, dp))
    small = precision.plan_in_precision(small, r.plan_precision)
    world = small.world_size
    ctx = rules.Context(tiny, cluster, small, world)
    errors = [v for v in rules.check(ctx) if v.severity == rules.ERROR and v.rule != "whole_nodes"]
    if errors:
        raise GenconfError(f"{recipe.path}: the smoke variant is invalid: {errors[0]}")
    ev = evaluate(tiny, cluster, small, world, calibration_for(cluster.gpu.name), check_rules=False)
    steps = int(smoke.get("steps", 12))
    train = _train_spec(recipe, small, tiny, steps=steps, lr=smoke.get("lr", 1e-3), warmup=smoke.get("warmup_steps", 3))
    train = dataclasses.replace(train, fp8_recipe=r.train_fp8_recipe, checkpoint_every_steps=steps)
    run = planfile.encode(tiny, None, cluster, world, ev, None, float(steps * gbs * seq), train, batch_source="smoke")
    run["recipe"] = {"name": recipe.name, "version": recipe.version, "precision_recipe": r.name, "smoke": True,
                     "full_layout": full["layout"], "note": smoke.get("note", ""),
                     "data": recipe.section("data") or {"kind": "synthetic"}}
    return run
