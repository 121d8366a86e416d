"""How genconf's predictions compared with the published runs of a catalog model: track_record.yaml, written by
`python benchmarks/accuracy.py --write-track-record` from its in-sample rows (the committed calibration), read by
`genconf plan` for the line "published runs of this model".

    models:
      llama3-70b:                       # every catalog model with that architecture (sequence length aside)
        all: {rows: 51, median: 0.99, p10: 0.91, p90: 1.06, min: 0.8, max: 1.25, sources: [...], frameworks: [...]}
        hopper: {...}                   # per GPU generation (genconf.plan.specs.ARCHS)

Ratios are measured / predicted tokens/s per GPU, as the 80% bands in calibration.yaml are. The record says how far
the model's own published runs sat from genconf's numbers; it moves no prediction.
"""

from __future__ import annotations

import itertools
from functools import lru_cache
from pathlib import Path

import yaml

from genconf.catalog.files import CATALOG_DIR, YAML_LOADER, read_yaml
from genconf.catalog.models import catalog_names
from genconf.plan.errors import GenconfError
from genconf.plan.specs import FRAMEWORKS, ModelSpec

TRACK_RECORD_FILE = CATALOG_DIR / "track_record.yaml"
ENTRY_KEYS = ("rows", "median", "p10", "p90", "min", "max", "sources", "frameworks")
"""frameworks: the genconf frameworks the runs were planned as (megatron, deepspeed, fsdp)."""
MIN_ROWS = 3
"""A generation's entry stands for the plan's GPU when it holds at least this many runs; else the model's 'all'."""


def _entry(path: Path, where: str, value: object) -> dict:
    if not isinstance(value, dict):
        raise GenconfError(f"{path}: {where} must be a mapping")
    unknown = sorted(set(value) - set(ENTRY_KEYS))
    missing = [k for k in ENTRY_KEYS if k not in value]
    if unknown or missing:
        what = f"unknown key {unknown[0]!r}" if unknown else f"missing key {missing[0]!r}"
        raise GenconfError(f"{path}: {where}: {what} (keys: {', '.join(ENTRY_KEYS)})")
    if not isinstance(value["rows"], int) or value["rows"] < 1:
        raise GenconfError(f"{path}: {where}.rows must be a positive integer")
    for key in ("median", "p10", "p90", "min", "max"):
        if not isinstance(value[key], (int, float)) or value[key] <= 0:
            raise GenconfError(f"{path}: {where}.{key} must be a positive number (measured / predicted)")
    if not isinstance(value["sources"], list) or not all(isinstance(s, str) for s in value["sources"]):
        raise GenconfError(f"{path}: {where}.sources must be a list of source names")
    if (not isinstance(value["frameworks"], list) or not value["frameworks"]
            or not all(f in FRAMEWORKS for f in value["frameworks"])):
        raise GenconfError(f"{path}: {where}.frameworks must list framework names ({', '.join(FRAMEWORKS)})")
    return dict(value)


def read_track_record(path: Path = TRACK_RECORD_FILE) -> dict[str, dict[str, dict]]:
    """Model name -> scope ('all' or a GPU generation) -> entry; one-line errors naming the file and the key."""
    data = read_yaml(path)
    if not isinstance(data, dict) or set(data) != {"models"} or not isinstance(data["models"], dict):
        raise GenconfError(f"{path}: expected one key, 'models', mapping model names to their records")
    out: dict[str, dict[str, dict]] = {}
    for name, scopes in data["models"].items():
        if not isinstance(scopes, dict) or "all" not in scopes:
            raise GenconfError(f"{path}: models.{name} must map 'all' (and GPU generations) to records")
        out[str(name)] = {str(s): _entry(path, f"models.{name}.{s}", v) for s, v in scopes.items()}
    return out


def read_model_record(name: str, path: Path = TRACK_RECORD_FILE) -> dict[str, dict]:
    """One model's scopes (read_track_record()[name], {} where it has none), parsed from its own block of the file
    alone: accuracy.py writes `  name:` and one `    scope: {...}` line per scope, and a plan needs one model
    (parsing all of them cost a noticeable share of a 0.3 s plan). The whole file is checked by read_track_record (its tests)."""
    try:
        text = path.read_text()
    except OSError:
        return {}
    start = text.find(f"\n  {name}:\n")
    if start < 0:
        return {}
    head, *rest = text[start + 1:].split("\n")
    block = [head, *itertools.takewhile(lambda line: line.startswith("    "), rest)]
    try:
        data = yaml.load("models:\n" + "\n".join(block) + "\n", Loader=YAML_LOADER)
    except yaml.YAMLError:
        return read_track_record(path).get(name, {})  # say where the file is broken, as the full read does
    scopes = (data or {}).get("models", {}).get(name)
    if not isinstance(scopes, dict) or "all" not in scopes:
        raise GenconfError(f"{path}: models.{name} must map 'all' (and GPU generations) to records")
    return {str(s): _entry(path, f"models.{name}.{s}", v) for s, v in scopes.items()}


@lru_cache(maxsize=64)
def _committed(name: str) -> dict[str, dict]:
    return read_model_record(name)


def record_for(model: ModelSpec, arch: str) -> dict | None:
    """The record `genconf plan` shows for a model on a GPU generation: the generation's runs where there are
    MIN_ROWS of them, else all the model's runs (scope 'all'); None for a model with no published run here, or a
    spec that carries a catalog name but not that model's architecture (a user's shrunk llama3-8b.yaml)."""
    scopes = _committed(model.name)
    if not scopes or model.name not in catalog_names(model):
        return None
    scope = arch if scopes.get(arch, {}).get("rows", 0) >= MIN_ROWS else "all"
    return {"model": model.name, "scope": scope, **scopes[scope],
            "file": "genconf/catalog/track_record.yaml (python benchmarks/accuracy.py --write-track-record)"}
