"""Where genconf's data lives and how its YAML is read: one-line errors naming the file, the line and the key."""

from __future__ import annotations

from pathlib import Path

import yaml

from genconf.plan import limits
from genconf.plan.errors import GenconfError

_PACKAGE_DIR = Path(__file__).resolve().parents[1]
"""genconf/: the checkout's top-level folders sit beside it, an installed copy's under genconf/_data."""
CATALOG_DIR = Path(__file__).resolve().parent
"""genconf/catalog/: hardware.yaml, clusters.yaml, calibration.yaml."""
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""The C YAML parser where PyYAML has it (much faster start-up), else the pure-Python one."""


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
    except UnicodeDecodeError as exc:
        raise GenconfError(f"{path}: not UTF-8 text (byte {exc.start}): is it a YAML file?") from None
    try:
        data = yaml.load(text, Loader=YAML_LOADER)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise GenconfError(f"{path}:{where} is not valid YAML: {problem}") from None
    if not isinstance(data, dict):
        raise GenconfError(f"{path}: expected a mapping of keys to values, got {type(data).__name__}")
    return data


def check_keys(path: Path | str, data: dict, allowed: tuple[str, ...]) -> None:
    for key in data:
        if key not in allowed:
            raise GenconfError(f"{path}: unknown key '{key}' (allowed: {', '.join(allowed)})")


def build(cls, path: Path | str, values: dict):
    """cls(**values), after every number is checked against its documented range (genconf.plan.limits; issue 15:
    a 2**31 layer count made the search run for minutes); one line naming the file and field."""
    bad = limits.check_all(values, where=str(path))
    if bad:
        raise GenconfError(bad[0])
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise GenconfError(f"{path}: {exc}") from None
