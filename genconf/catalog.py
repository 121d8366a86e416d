"""Catalog loading: models (``models/*.yaml``), GPUs (``hardware.yaml``) and cluster presets.

Loaders reject unknown keys and name the file and the key. A ``--model`` may be a catalog name,
a size alias (``70b``) or a path to a YAML file; a ``--cluster`` a preset name or a YAML file.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, fields, replace
from pathlib import Path

import yaml

from genconf.errors import GenconfError
from genconf.specs import ClusterSpec, GPUSpec, ModelSpec

_PACKAGE_DIR = Path(__file__).resolve().parent
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# Keys a model file may hold besides ModelSpec's fields: catalog metadata.
_MODEL_META_KEYS = ("aliases",)


def resource_dir(name: str) -> Path:
    """A top-level data folder (models, recipes, templates): the checkout's, or the installed copy."""
    for candidate in (_PACKAGE_DIR.parent / name, _PACKAGE_DIR / "_data" / name):
        if candidate.is_dir():
            return candidate
    raise GenconfError(f"genconf's {name}/ folder is missing (looked in {_PACKAGE_DIR.parent} and {_PACKAGE_DIR / '_data'})")


def read_yaml(path: Path) -> dict:
    """Parse one YAML mapping, turning parse errors into a one-line GenconfError."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise GenconfError(f"cannot read {path}: {exc.strerror}") from None
    try:
        data = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise GenconfError(f"{path}:{where} is not valid YAML: {problem}") from None
    if not isinstance(data, dict):
        raise GenconfError(f"{path}: expected a mapping of keys to values, got {type(data).__name__}")
    return data


def _check_keys(path: Path | str, data: dict, allowed: tuple[str, ...]) -> None:
    for key in data:
        if key not in allowed:
            raise GenconfError(f"{path}: unknown key '{key}' (allowed: {', '.join(allowed)})")


def _build(cls, path: Path | str, values: dict):
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise GenconfError(f"{path}: {exc}") from None


# --- models ---------------------------------------------------------------------------------------

MODEL_KEYS = tuple(f.name for f in fields(ModelSpec)) + _MODEL_META_KEYS


def model_from_file(path: Path) -> ModelSpec:
    data = read_yaml(path)
    _check_keys(path, data, MODEL_KEYS)
    values = {k: v for k, v in data.items() if k not in _MODEL_META_KEYS}
    if "name" not in values:
        raise GenconfError(f"{path}: missing key 'name'")
    for required in ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "vocab_size", "seq_length"):
        if required not in values:
            raise GenconfError(f"{path}: missing key '{required}'")
    return _build(ModelSpec, path, values)


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
            found = yaml.load(line, Loader=_Loader)["aliases"] or []
        except (yaml.YAMLError, TypeError):
            raise GenconfError(f"{path}: 'aliases' must be a one-line list like [70b, olmo-70b]") from None
        for alias in found:
            if str(alias) in aliases:
                raise GenconfError(f"{path}: alias '{alias}' is also claimed by {aliases[str(alias)].stem}")
            aliases[str(alias)] = path
    return aliases


def list_models() -> list[ModelSpec]:
    return list(_model_catalog().models.values())


def model_aliases() -> dict[str, str]:
    """Size alias -> catalog name (the seed's OLMo family: 1b, 7b, 70b)."""
    return dict(_model_catalog().aliases)


def resolve_model(ref: str) -> tuple[ModelSpec, str | None]:
    """Catalog name, size alias or YAML path -> (model, the alias used or None)."""
    key = ref.strip().lower()
    own = resource_dir("models") / f"{key}.yaml"
    if key and "/" not in key and own.is_file():
        return _catalog_model(own), None
    aliases = _alias_index()
    if key in aliases:
        return _catalog_model(aliases[key]), key
    if ref.endswith((".yaml", ".yml")) or os.sep in ref:
        path = Path(ref)
        if not path.is_file():
            raise GenconfError(f"model file {ref} does not exist")
        return model_from_file(path), None
    catalog = _model_catalog()
    near = sorted(n for n in list(catalog.models) + list(catalog.aliases) if key[:3] in n)[:6]
    hint = f"; did you mean {', '.join(near)}?" if near else ""
    raise GenconfError(f"unknown model '{ref}': not a catalog name, size alias or YAML file (see 'genconf models'){hint}")


# --- GPUs and clusters ----------------------------------------------------------------------------

GPU_KEYS = tuple(f.name for f in fields(GPUSpec) if f.name != "name")
CLUSTER_KEYS = ("gpu", "gpus_per_node", "nvlink_domain_gpus", "ib_gbit_per_s_per_gpu", "total_gpus",
                "host_link_gbyte_per_s_per_gpu", "cpu_mem_gib_per_node", "nccl_env", "description", "name")


@functools.lru_cache(maxsize=1)
def _gpu_catalog() -> dict[str, GPUSpec]:
    path = _PACKAGE_DIR / "hardware.yaml"
    data = read_yaml(path)
    _check_keys(path, data, ("gpus",))
    gpus = {}
    for name, values in data["gpus"].items():
        _check_keys(f"{path} [{name}]", values, GPU_KEYS)
        values = dict(values, node_sizes=tuple(values.get("node_sizes", ())))
        gpus[name] = _build(GPUSpec, f"{path} [{name}]", {"name": name, **values})
    return gpus


def list_gpus() -> list[GPUSpec]:
    return list(_gpu_catalog().values())


def resolve_gpu(name: str) -> GPUSpec:
    gpus = _gpu_catalog()
    key = name.strip().lower()
    if key not in gpus:
        raise GenconfError(f"unknown GPU '{name}' (one of: {', '.join(gpus)})")
    return gpus[key]


@functools.lru_cache(maxsize=1)
def _cluster_presets() -> tuple[str, dict[str, dict]]:
    path = _PACKAGE_DIR / "clusters.yaml"
    data = read_yaml(path)
    _check_keys(path, data, ("default", "clusters"))
    return data["default"], data["clusters"]


def cluster_from_mapping(name: str, values: dict, where: str) -> ClusterSpec:
    _check_keys(where, values, CLUSTER_KEYS)
    if "gpu" not in values:
        raise GenconfError(f"{where}: missing key 'gpu'")
    values = dict(values)
    values.pop("name", None)
    values["gpu"] = resolve_gpu(str(values["gpu"]))
    values["nccl_env"] = tuple((str(k), str(v)) for k, v in (values.get("nccl_env") or {}).items())
    return _build(ClusterSpec, where, {"name": name, **values})


def list_clusters() -> list[ClusterSpec]:
    default, presets = _cluster_presets()
    return [cluster_from_mapping(n, v, f"clusters.yaml [{n}]") for n, v in presets.items()]


def default_cluster_name() -> str:
    return _cluster_presets()[0]


def resolve_cluster(ref: str | None = None, *, gpu: str | None = None, gpus_per_node: int | None = None) -> ClusterSpec:
    """A preset name or YAML file, with --gpu / --gpus-per-node overrides applied."""
    default, presets = _cluster_presets()
    ref = ref or default
    if ref in presets:
        cluster = cluster_from_mapping(ref, presets[ref], f"clusters.yaml [{ref}]")
    elif ref.endswith((".yaml", ".yml")) or os.sep in ref:
        path = Path(ref)
        if not path.is_file():
            raise GenconfError(f"cluster file {ref} does not exist")
        data = read_yaml(path)
        cluster = cluster_from_mapping(str(data.get("name", path.stem)), data, str(path))
    else:
        raise GenconfError(f"unknown cluster '{ref}' (presets: {', '.join(presets)}; or a YAML file)")
    changes: dict = {}
    if gpu is not None:
        changes["gpu"] = resolve_gpu(gpu)
    if gpus_per_node is not None:
        if gpus_per_node < 1:
            raise GenconfError(f"--gpus-per-node must be positive, got {gpus_per_node}")
        changes["gpus_per_node"] = gpus_per_node
        if cluster.nvlink_domain_gpus is not None and cluster.nvlink_domain_gpus % gpus_per_node:
            changes["nvlink_domain_gpus"] = None
    if changes:
        try:
            cluster = replace(cluster, **changes)
        except ValueError as exc:
            raise GenconfError(str(exc)) from None
    return cluster


# --- cost-model calibration -----------------------------------------------------------------------

@functools.lru_cache(maxsize=16)
def calibration_for(gpu_name: str):
    """The Calibration of a GPU: its architecture's values with the GPU's own overrides applied."""
    from genconf.cost import Calibration

    path = _PACKAGE_DIR / "calibration.yaml"
    data = read_yaml(path)
    _check_keys(path, data, ("archs", "gpus"))
    gpu = resolve_gpu(gpu_name)
    values = dict(data["archs"][gpu.arch])
    values.update((data.get("gpus") or {}).get(gpu.name, {}))
    allowed = tuple(f.name for f in fields(Calibration))
    _check_keys(f"{path} [{gpu.name}]", values, allowed)
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    for key, value in values.items():
        if isinstance(value, str):
            try:
                values[key] = float(value)  # YAML 1.1 reads '2e-05' as a string
            except ValueError:
                raise GenconfError(f"{path} [{gpu.name}]: {key} must be a number, got {value!r}") from None
    return _build(Calibration, f"{path} [{gpu.name}]", values)


def gpu_calibration_overrides(gpu_name: str) -> dict:
    """The calibration values calibration.yaml sets for this GPU itself (beyond its architecture's)."""
    data = read_yaml(_PACKAGE_DIR / "calibration.yaml")
    return dict((data.get("gpus") or {}).get(resolve_gpu(gpu_name).name, {}))


def gpu_for_device_name(device_name: str) -> str | None:
    """The catalog GPU for a CUDA device name (torch.cuda.get_device_name()), or None."""
    name = device_name.lower()
    for key, gpu in (("h200", "h200"), ("h100 pcie", "h100-pcie"), ("h100", "h100-sxm"),
                     ("a100-sxm4-40", "a100-40gb"), ("a100", "a100-80gb"), ("gb300", "gb300"), ("b300", "b300"),
                     ("gb200", "gb200"), ("b200", "b200")):
        if key in name:
            return gpu
    return None
