"""The model catalog (``models/*.yaml``): one ModelSpec per file, named after it, with size aliases.

A ``--model`` may be a catalog name, a size alias (``70b``), a path to a YAML file or a Hugging Face
``config.json`` (or the directory holding one, read by ``genconf.catalog.hf``). Unknown keys are an error naming
the file and the key.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, fields
from pathlib import Path

import yaml

from genconf.catalog.files import YAML_LOADER, build, check_keys, read_yaml, resource_dir
from genconf.plan.errors import GenconfError
from genconf.plan.specs import ModelSpec

# Keys a model file may hold besides ModelSpec's fields: catalog metadata.
_MODEL_META_KEYS = ("aliases",)


MODEL_KEYS = tuple(f.name for f in fields(ModelSpec)) + _MODEL_META_KEYS


def model_from_file(path: Path) -> ModelSpec:
    data = read_yaml(path)
    check_keys(path, data, MODEL_KEYS)
    values = {k: v for k, v in data.items() if k not in _MODEL_META_KEYS}
    if "name" not in values:
        raise GenconfError(f"{path}: missing key 'name'")
    for required in ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "vocab_size", "seq_length"):
        if required not in values:
            raise GenconfError(f"{path}: missing key '{required}'")
    return build(ModelSpec, path, values)


@dataclass(frozen=True, slots=True)
class _ModelCatalog:
    models: dict[str, ModelSpec]
    aliases: dict[str, str]


@functools.lru_cache(maxsize=64)
def _catalog_model(path: Path) -> ModelSpec:
    """One catalog file's model, whose name must be the file's."""
    model = model_from_file(path)
    if model.name != path.stem:
        raise GenconfError(f"{path}: name '{model.name}' must equal the file name '{path.stem}'")
    return model


@functools.lru_cache(maxsize=1)
def _model_catalog() -> _ModelCatalog:
    models = {path.stem: _catalog_model(path) for path in sorted(resource_dir("models").glob("*.yaml"))}
    return _ModelCatalog(models, {alias: path.stem for alias, path in _alias_index().items()})


@functools.lru_cache(maxsize=1)
def _alias_index() -> dict[str, Path]:
    """Alias -> catalog file, read from each file's one `aliases:` line: resolving a name parses only the
    model it names (the whole catalog is 30 YAML files, most of the CLI's start-up time)."""
    aliases: dict[str, Path] = {}
    for path in sorted(resource_dir("models").glob("*.yaml")):
        line = next((ln for ln in path.read_text().splitlines() if ln.startswith("aliases:")), None)
        if line is None:
            continue
        try:
            found = yaml.load(line, Loader=YAML_LOADER)["aliases"] or []
        except (yaml.YAMLError, TypeError):
            raise GenconfError(f"{path}: 'aliases' must be a one-line list like [70b, olmo-70b]") from None
        for alias in found:
            if str(alias) in aliases:
                raise GenconfError(f"{path}: alias '{alias}' is also claimed by {aliases[str(alias)].stem}")
            aliases[str(alias)] = path
    return aliases


def list_models() -> list[ModelSpec]:
    return list(_model_catalog().models.values())


ARCHITECTURE_IGNORED = ("name", "source", "unmodelled", "seq_length", "hidden_dropout", "attention_dropout")
"""What two specs may differ in and still be the same model: a published run at another sequence length, or a
catalog twin under another name (LLaMA 13B and Llama 2 13B), or with notes on what it does not model."""


def architecture(model: ModelSpec) -> tuple:
    """Every field of the spec but ARCHITECTURE_IGNORED."""
    return tuple(getattr(model, f.name) for f in fields(model) if f.name not in ARCHITECTURE_IGNORED)


UNTABULATED_FIELDS = ("rope_theta", "rope_scaling_factor", "rotary_percent", "moe_router_score_function",
                      "moe_router_pre_softmax", "moe_router_expert_bias", "moe_router_topk_scaling_factor",
                      "moe_router_num_groups", "moe_router_group_topk", "moe_router_load_balancing",
                      "moe_aux_loss_coeff")
"""What a published run's table does not state and no count genconf makes depends on (the rotary embedding, the
router): catalog_names reads past them."""


def catalog_names(model: ModelSpec) -> list[str]:
    """The catalog models `model` is (architecture equal, its rotary embedding and router aside: UNTABULATED_FIELDS):
    torchtitan's Llama 3.1 8B is llama3-8b and llama3.1-8b; a Llama 2 13B run is both llama-13b's and llama2-13b's."""
    def key(m: ModelSpec) -> tuple:
        return tuple(getattr(m, f.name) for f in fields(m) if f.name not in ARCHITECTURE_IGNORED + UNTABULATED_FIELDS)

    own = key(model)
    return [m.name for m in list_models() if key(m) == own]


def model_aliases() -> dict[str, str]:
    """Size alias -> catalog name (the seed's OLMo family: 1b, 7b, 70b)."""
    return dict(_model_catalog().aliases)


VARIANT_TAGS = ("-instruct", "-chat", "-base")
"""Tags in a Hugging Face id whose model has the architecture of the id without them: a post-trained or base
release of the same checkpoint (Llama-3.1-8B-Instruct, Llama-2-7b-chat-hf, Mixtral-8x7B-Instruct-v0.1,
Qwen3-30B-A3B-Instruct-2507, Qwen3-8B-Base)."""


def _variant_of(key: str, aliases: dict[str, Path]) -> str | None:
    """The Hugging Face id among the aliases that `key` is a release of: the tag dropped (…-chat-hf -> …-hf) or
    the id cut before it (…-instruct-2507 -> …); None if neither is a catalog id."""
    for tag in VARIANT_TAGS:
        at = key.find(tag)
        if at < 0:
            continue
        for base in (key[:at] + key[at + len(tag):], key[:at]):
            if "/" in base and base in aliases:
                return base
    return None


def resolve_model(ref: str) -> tuple[ModelSpec, str | None]:
    """Catalog name, size alias, YAML path or Hugging Face config.json (or its directory) -> (model, the alias
    used or None)."""
    model, alias, _ = resolve_model_noted(ref)
    return model, alias


def resolve_model_noted(ref: str) -> tuple[ModelSpec, str | None, tuple[str, ...]]:
    """resolve_model, with a Hugging Face import's notes that no plan warns of (the sequence it chose, a rope
    scaling the artifacts leave out; hf.HFModel.notes less the model's unmodelled list); () for any other model."""
    key = ref.strip().lower().rstrip("/")
    if not ref.strip():
        raise GenconfError("--model is empty: name a catalog model (genconf models), a models/*.yaml file, a Hugging "
                           "Face id or a config.json")
    own = resource_dir("models") / f"{key}.yaml"
    if key and "/" not in key and own.is_file():
        return _catalog_model(own), None, ()
    aliases = _alias_index()
    local = "/" in key and Path(ref).exists()  # a folder named like its Hugging Face id is read, not the catalog
    if key in aliases and not local:
        return _catalog_model(aliases[key]), key, ()
    # A Hugging Face id of a post-trained (or base) release of a catalog checkpoint: the same tensors.
    base = _variant_of(key, aliases) if "/" in key and not local else None
    if base is not None:
        return _catalog_model(aliases[base]), key, ()
    from genconf.catalog import hf

    if hf.looks_like_hf(ref):
        imported = hf.model_from_hf(ref)
        return imported.spec, None, tuple(n for n in imported.notes if n not in imported.spec.unmodelled)
    if ref.endswith((".yaml", ".yml")) or os.sep in ref or "/" in ref:
        path = Path(ref)
        if not path.is_file():
            if not ref.endswith((".yaml", ".yml")) and not path.exists() and ref.strip("/").count("/") == 1:
                raise GenconfError(f"unknown model '{ref}': not a file, and not a Hugging Face id of a catalog model "
                                   f"(their ids are among the aliases in 'genconf models'; for another model pass its "
                                   f"config.json)")
            raise GenconfError(f"model file {ref} does not exist")
        return model_from_file(path), None, ()
    if os.path.isfile(ref):
        raise GenconfError(f"model file {ref}: genconf reads a model YAML (.yaml or .yml, as in models/) or a Hugging "
                           f"Face config.json")
    catalog = _model_catalog()
    names = list(catalog.models) + [a for a in catalog.aliases if "/" not in a]
    shared = {n: len(os.path.commonprefix([key, n])) for n in names}
    near = sorted((n for n in names if shared[n] >= 3 or key[:3] in n), key=lambda n: (-shared[n], n))[:6]
    hint = f"; did you mean {', '.join(near)}?" if near else ""
    raise GenconfError(f"unknown model '{ref}': not a catalog name, size alias, YAML file or Hugging Face "
                      f"config.json (see 'genconf models'){hint}")
