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

from genconf.catalog.files import build, check_keys, read_yaml, resource_dir
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


@functools.lru_cache(maxsize=1)
def _model_catalog() -> _ModelCatalog:
    models: dict[str, ModelSpec] = {}
    aliases: dict[str, str] = {}
    for path in sorted(resource_dir("models").glob("*.yaml")):
        model = model_from_file(path)
        if model.name != path.stem:
            raise GenconfError(f"{path}: name '{model.name}' must equal the file name '{path.stem}'")
        models[model.name] = model
        for alias in read_yaml(path).get("aliases", []) or []:
            if alias in aliases:
                raise GenconfError(f"{path}: alias '{alias}' is also claimed by {aliases[alias]}")
            aliases[str(alias)] = model.name
    return _ModelCatalog(models, aliases)


def list_models() -> list[ModelSpec]:
    return list(_model_catalog().models.values())


def model_aliases() -> dict[str, str]:
    """Size alias -> catalog name (the seed's OLMo family: 1b, 7b, 70b)."""
    return dict(_model_catalog().aliases)


def resolve_model(ref: str) -> tuple[ModelSpec, str | None]:
    """Catalog name, size alias, YAML path or Hugging Face config.json (or its directory) -> (model, the alias
    used or None)."""
    catalog = _model_catalog()
    key = ref.strip().lower()
    if key in catalog.models:
        return catalog.models[key], None
    if key in catalog.aliases:
        return catalog.models[catalog.aliases[key]], key
    from genconf.catalog import hf

    if hf.looks_like_hf(ref):
        return hf.model_from_hf(ref).spec, None
    if ref.endswith((".yaml", ".yml")) or os.sep in ref:
        path = Path(ref)
        if not path.is_file():
            raise GenconfError(f"model file {ref} does not exist")
        return model_from_file(path), None
    near = sorted(n for n in list(catalog.models) + list(catalog.aliases) if key[:3] in n)[:6]
    hint = f"; did you mean {', '.join(near)}?" if near else ""
    raise GenconfError(f"unknown model '{ref}': not a catalog name, size alias, YAML file or Hugging Face "
                      f"config.json (see 'genconf models'){hint}")
