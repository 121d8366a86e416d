"""Calibration files: the cost-model terms `genconf calibrate` fitted, read, validated, applied and written.

    format: genconf-calibration/1
    gpu: h100-sxm                 # the catalog GPU it calibrates (null: measured on a CPU, calibrates nothing)
    source: bench | runs
    created_utc: ...
    environment: {device, driver, cuda, torch, world_size, nodes, backend, ...}
    terms:
      gemm_efficiency: {value: 0.66, before: 0.60, from: "bench: 45 BF16 GEMMs of olmo-1b ...", observations: 45}
    runs: [{run, steps, measured_step_time_s, predicted_step_time_s_before, predicted_step_time_s_after}]  # runs
    fit: {<group>: {terms, before_log_rmse, after_log_rmse, at_bound}}
    measurements: {gemm: [...], attention: [...], bandwidth: [...], collectives: [...]}                 # bench

Loaders reject unknown keys and name the file and the key, as the other catalogs do.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from genconf.catalog.hardware import resolve_gpu
from genconf.plan.cost import Calibration
from genconf.plan.errors import GenconfError

FORMAT = "genconf-calibration/1"
TOP_KEYS = ("format", "gpu", "source", "created_utc", "environment", "terms", "runs", "fit", "measurements", "note")
TERM_KEYS = ("value", "before", "from", "observations")


def term_names() -> tuple[str, ...]:
    """The cost model's scalar calibration terms (genconf.plan.cost.Calibration's number fields; the error bands
    and per-direction byte pairs are not fitted by calibrate)."""
    return tuple(f.name for f in dataclasses.fields(Calibration) if f.type in (float, int, "float", "int"))


def term_range(name: str) -> tuple[float, float, bool]:
    """(low, high, low allowed) of a term's value: efficiencies, exposed shares and the clock factor are fractions of
    a peak (above 1 would price faster than the hardware: MFU past 100%), an efficiency that defaults to 0 keeps 0
    for "unset" (mxfp8_gemm_efficiency: FP8's); a slowdown is at least 1; times, counts and factors are at least 0."""
    default = {f.name: f.default for f in dataclasses.fields(Calibration)}.get(name)
    if name.endswith(("_efficiency", "_exposed")) or name in ("clock_factor", "fp8_clock_ratio"):
        return 0.0, 1.0, default == 0.0 or name.endswith("_exposed")
    return 0.0, math.inf, True


def _typed(terms: dict[str, float]) -> dict:
    """Float term values as the Calibration's fields want them (integers where the field is an int)."""
    kinds = {f.name: f.type for f in dataclasses.fields(Calibration)}
    return {k: (int(round(v)) if kinds.get(k) in (int, "int") else v) for k, v in terms.items()}


@dataclass(frozen=True, kw_only=True, slots=True)
class CalibrationFile:
    path: str
    gpu: str | None
    source: str
    terms: dict[str, float]
    """Term name -> value, only the terms the file sets."""
    provenance: dict[str, str]
    """Term name -> where its value came from."""
    environment: dict

    def describe(self) -> str:
        """One line for the planner's output: which file, what it was measured on, which terms."""
        where = self.environment.get("device") or "?"
        changed = ", ".join(f"{k} {v:.4g}" for k, v in sorted(self.terms.items())) or "no terms"
        return f"{self.path} ({self.source} on {where}): {changed}"


def read_file(path: str | Path) -> CalibrationFile:
    """Load and validate a calibration file; errors name the file and the key."""
    p = Path(path)
    if not p.is_file():
        raise GenconfError(f"calibration file {p} {'is a directory' if p.is_dir() else 'does not exist'}")
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise GenconfError(f"cannot read {p}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise GenconfError(f"{p}: not UTF-8 text (byte {exc.start}): is it a calibration file?") from None
    except yaml.YAMLError as exc:
        raise GenconfError(f"{p}: not YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise GenconfError(f"{p}: expected a mapping with format: {FORMAT}")
    unknown = sorted(set(data) - set(TOP_KEYS))
    if unknown:
        raise GenconfError(f"{p}: unknown key '{unknown[0]}' (known: {', '.join(TOP_KEYS)})")
    if data.get("format") != FORMAT:
        raise GenconfError(f"{p}: format is {data.get('format')!r}, expected {FORMAT!r}")
    known = term_names()
    terms, provenance = {}, {}
    for name, entry in (data.get("terms") or {}).items():
        if name not in known:
            raise GenconfError(f"{p}: terms: unknown term '{name}' (the cost model's terms: {', '.join(known)})")
        if not isinstance(entry, dict) or "value" not in entry:
            raise GenconfError(f"{p}: terms: {name}: expected a mapping with a value")
        bad = sorted(set(entry) - set(TERM_KEYS))
        if bad:
            raise GenconfError(f"{p}: terms: {name}: unknown key '{bad[0]}' (known: {', '.join(TERM_KEYS)})")
        try:
            terms[name] = float(entry["value"])
        except (TypeError, ValueError):
            raise GenconfError(f"{p}: terms: {name}: value {entry['value']!r} is not a number") from None
        low, high, low_ok = term_range(name)
        value = terms[name]
        if not (math.isfinite(value) and (value >= low if low_ok else value > low) and value <= high):
            span = f"{'[' if low_ok else '('}{low:g}, {high:g}]" if math.isfinite(high) else f"{low:g} or more"
            raise GenconfError(f"{p}: terms: {name}: {value!r} is out of range ({span})")
        provenance[name] = str(entry.get("from", ""))
    gpu = data.get("gpu")
    if gpu is not None:
        gpu = resolve_gpu(str(gpu)).name
    return CalibrationFile(path=str(p), gpu=gpu, source=str(data.get("source", "?")), terms=terms,
                           provenance=provenance, environment=dict(data.get("environment") or {}))


def apply(cal, cf: CalibrationFile, gpu_name: str):
    """`cal` (the GPU's built-in calibration) with the file's terms; the file must be for this GPU."""
    if cf.gpu is None:
        raise GenconfError(f"calibration file {cf.path} was measured on a CPU (gpu: null): it calibrates no GPU")
    if cf.gpu != gpu_name:
        raise GenconfError(f"calibration file {cf.path} is for {cf.gpu} but the plan's GPU is {gpu_name}")
    try:
        return dataclasses.replace(cal, **_typed(cf.terms))
    except (TypeError, ValueError) as exc:
        raise GenconfError(f"calibration file {cf.path}: {exc}") from None


def write_file(path: str | Path, content: dict) -> None:
    p = Path(path)
    header = ("# genconf calibration file: the cost-model terms it sets, the values they replace and where each\n"
              "# came from. Plan with it: genconf --calibration " + p.name + " ...\n")
    tmp = p.with_name(p.name + ".tmp")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(header + yaml.safe_dump(content, sort_keys=False, width=120))
        os.replace(tmp, p)
    except OSError as exc:
        if tmp.is_file():
            tmp.unlink()
        raise GenconfError(f"cannot write {p}: {exc.strerror or exc}") from None
