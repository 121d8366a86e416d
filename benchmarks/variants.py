"""Score a calibration hypothesis the way the issue's gates are read, group by group.

    python benchmarks/variants.py all.nvlink_efficiency=0.6 hopper.clock_factor=0.85,ampere.clock_factor=0.9
    python benchmarks/variants.py --no-layouts all.pp_overlap_exposed=0.25
    python benchmarks/variants.py --refit hopper.nvlink_efficiency=0.5/0.6/0.7/0.8/0.9

--refit asks a different question: each variant adds terms to accuracy.py's fit grid (`ARCH.FIELD=v1/v2/...`;
a field already fitted gets the new grid), refits everything as `accuracy.py --fit` does and scores in sample
and leave-one-source-out, with the values the fit chose; a term that helps only in sample, or only at the edge
of a physically plausible range, is absorbing something else.

Each positional argument is one variant: comma-separated `ARCH.FIELD=VALUE` assignments (ARCH: ampere, hopper,
blackwell, or `all`) applied on top of genconf/catalog/calibration.yaml, with a GPU's own overrides in that file
still winning (as `accuracy.py --fit` applies its terms). Every variant is scored against the committed
calibration on all published rows (benchmarks/accuracy.py's plans) and on NVIDIA's dense layouts
(benchmarks/layouts.py): the overall median and p90 of |tokens/s error|, dense and MoE medians, the layout top 5,
and the median |error| of every (source, kind, GPU generation) group, so that a change that moves the overall
median across the gate while making most groups worse reads as what it is. The overall median of 405 rows is a
fragile statistic: rows sitting near it cross it in bulk.

Writes benchmarks/results/variants.md (the command, the summary table and the per-group table).
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import layouts  # noqa: E402
import accuracy  # noqa: E402
from accuracy import ARCHS, cal_key, cals_for, evaluate_all, fit, load_runs, loso  # noqa: E402

from genconf.catalog.hardware import calibration_for, gpu_calibration_overrides  # noqa: E402
from genconf.plan.cost import Calibration  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
GROUP_MOVE = 0.005
"""A group counts as better or worse when its median |error| moves by more than half a point."""


def _terms(text: str, form: str, parse_value, what: str):
    """Each comma-separated `ARCH.FIELD=VALUE` of `text` as (arch, field, parsed value); one line naming the part
    and the expected `form` for anything else."""
    fields = {f.name for f in dataclasses.fields(Calibration)}
    for part in filter(None, text.split(",")):
        key, sep, value = part.partition("=")
        arch, dot, field = key.partition(".")
        if not (sep and dot) or (arch != "all" and arch not in ARCHS) or field not in fields:
            raise SystemExit(f"variants.py: {part!r}: expected {form} with ARCH in all, {', '.join(ARCHS)} "
                             f"and FIELD a Calibration field")
        try:
            yield arch, field, parse_value(value)
        except ValueError:
            raise SystemExit(f"variants.py: {part!r}: {value!r} is not {what}") from None


def parse_variant(text: str) -> dict[str, dict[str, float]]:
    """'all.a=1,hopper.b=2' -> {'ampere': {'a': 1.0}, 'hopper': {'a': 1.0, 'b': 2.0}, 'blackwell': {'a': 1.0}}."""
    out: dict[str, dict[str, float]] = {arch: {} for arch in ARCHS}
    for arch, field, number in _terms(text, "ARCH.FIELD=VALUE", float, "a number"):
        for a in (ARCHS if arch == "all" else (arch,)):
            out[a][field] = number
    return {a: v for a, v in out.items() if v}


def parse_grid(text: str) -> dict[tuple[str, str], list[float]]:
    """'hopper.nvlink_efficiency=0.6/0.8' -> the fit-grid entry {('hopper', 'nvlink_efficiency'): [0.6, 0.8]}."""
    return {(arch, field): values for arch, field, values in
            _terms(text, "ARCH.FIELD=V1/V2/...", lambda v: [float(x) for x in v.split("/")], "a list of numbers")}


def _medians(rows: list[dict]) -> dict:
    scored = [r for r in rows if r["throughput_error"] is not None]
    every = sorted(abs(r["throughput_error"]) for r in scored)
    dense = sorted(abs(r["throughput_error"]) for r in scored if r["kind"] == "dense")
    return {"median": statistics.median(every), "p90": every[int(0.9 * (len(every) - 1))],
            "dense": statistics.median(dense), "dense_p90": dense[int(0.9 * (len(dense) - 1))]}


def refit_score(runs, grid: dict) -> dict:
    """Fit with `grid` added to accuracy.FIT_GRID, then in-sample and leave-one-source-out figures."""
    saved = dict(accuracy.FIT_GRID)
    accuracy.FIT_GRID.update(grid)
    try:
        override = fit(runs, quiet=True)
        held, _ = loso(runs, quiet=True)
    finally:
        accuracy.FIT_GRID.clear()
        accuracy.FIT_GRID.update(saved)
    by_source: dict[str, list[float]] = defaultdict(list)
    for r in held:
        if r["throughput_error"] is not None and r["kind"] == "dense":
            by_source[r["source"]].append(abs(r["throughput_error"]))
    chosen = {f"{arch}.{field}": override[a][field] for (arch, field) in grid
              for a in (ARCHS if arch == "all" else (arch,))[:1]}
    return {"in_sample": _medians(evaluate_all(runs, cals_for(runs, override))), "held_out": _medians(held),
            "held_out_dense_by_source": {k: statistics.median(v) for k, v in by_source.items()}, "chosen": chosen}


def refit_main(texts: list[str], write: bool) -> int:
    runs, _ = load_runs()
    results = [("committed grid", refit_score(runs, {}))] + [(t, refit_score(runs, parse_grid(t))) for t in texts]
    sources = sorted(results[0][1]["held_out_dense_by_source"])
    lines = ["# Refits with added fit terms, in sample and leave-one-source-out", "",
             f"Command: `python benchmarks/variants.py {' '.join(sys.argv[1:])}`.", "",
             "| fit grid | in sample: median / p90 / dense / dense p90 | held out: median / p90 / dense / dense p90 "
             "| values chosen |", "|---|---|---|---|"]
    for text, s in results:
        a, h = s["in_sample"], s["held_out"]
        chosen = ", ".join(f"{k} {v:g}" for k, v in s["chosen"].items()) or "-"
        lines.append(f"| `{text}` | {a['median']:.2%} / {a['p90']:.2%} / {a['dense']:.2%} / {a['dense_p90']:.2%} | "
                     f"{h['median']:.2%} / {h['p90']:.2%} / {h['dense']:.2%} / {h['dense_p90']:.2%} | {chosen} |")
    lines += ["", "Held-out dense median |error| by source (each source left out of the fit in turn):", "",
              "| fit grid | " + " | ".join(sources) + " |", "|---|" + "---:|" * len(sources)]
    for text, s in results:
        lines.append(f"| `{text}` | " + " | ".join(f"{s['held_out_dense_by_source'].get(k, float('nan')):.1%}"
                                                   for k in sources) + " |")
    out = "\n".join(lines) + "\n"
    print(out)
    if write:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "variants_refit.md").write_text(out)
    return 0


def gpu_override(override: dict, gpu_name: str) -> dict[str, float]:
    """The fields `override` changes for this GPU: its architecture's, less the ones the GPU sets itself."""
    own = gpu_calibration_overrides(gpu_name)
    return {k: v for k, v in override.get(cal_key(gpu_name), {}).items() if k not in own}


def score(runs, override: dict, with_layouts: bool) -> dict:
    cals = {name: dataclasses.replace(calibration_for(name), **gpu_override(override, name))
            for name in {r.cluster.gpu.name for r in runs}}
    rows = [r for r in evaluate_all(runs, cals) if r["throughput_error"] is not None]
    errors = sorted(abs(r["throughput_error"]) for r in rows)
    groups: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        groups[(r["source"], r["kind"], r["generation"])].append(r["throughput_error"])
    out = {
        "median": statistics.median(errors), "p90": errors[int(0.9 * (len(errors) - 1))], "rows": len(errors),
        "dense": statistics.median(abs(r["throughput_error"]) for r in rows if r["kind"] == "dense"),
        "moe": statistics.median(abs(r["throughput_error"]) for r in rows if r["kind"] == "MoE"),
        "groups": {k: (statistics.median(abs(e) for e in v), statistics.median(v), len(v)) for k, v in groups.items()},
        "top5": None,
    }
    if with_layouts:
        cases = layouts.cases()
        out["top5"] = sum(layouts.run_case(c, gpu_override(override, c["cluster"].gpu.name))["in_top5"] for c in cases)
        out["layouts"] = len(cases)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("variants", nargs="+", help="ARCH.FIELD=VALUE[,ARCH.FIELD=VALUE...] (one variant per argument)")
    ap.add_argument("--no-layouts", action="store_true", help="skip the layout top 5 (about 25 s per variant)")
    ap.add_argument("--refit", action="store_true",
                    help="variants are fit-grid additions (ARCH.FIELD=V1/V2/...): refit, score in sample and held out")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    if args.refit:
        return refit_main(args.variants, not args.no_write)
    overrides = [(text, parse_variant(text)) for text in args.variants]
    runs, _ = load_runs()
    base = score(runs, {}, not args.no_layouts)
    results = [(text, score(runs, override, not args.no_layouts)) for text, override in overrides]

    def top5(s: dict) -> str:
        return "-" if s["top5"] is None else f"{s['top5']}/{s['layouts']}"

    lines = ["# Calibration variants, scored group by group", "",
             f"Command: `python benchmarks/variants.py {' '.join(sys.argv[1:])}` (against the committed "
             f"genconf/catalog/calibration.yaml; {base['rows']} published rows).", "",
             "| variant | median | p90 | dense | MoE | layout top 5 | groups better / worse |",
             "|---|---:|---:|---:|---:|---:|---:|",
             f"| committed | {base['median']:.2%} | {base['p90']:.2%} | {base['dense']:.2%} | {base['moe']:.2%} | "
             f"{top5(base)} | - |"]
    for text, s in results:
        better = sum(s["groups"][k][0] < base["groups"][k][0] - GROUP_MOVE for k in base["groups"])
        worse = sum(s["groups"][k][0] > base["groups"][k][0] + GROUP_MOVE for k in base["groups"])
        s["better"], s["worse"] = better, worse
        lines.append(f"| `{text}` | {s['median']:.2%} | {s['p90']:.2%} | {s['dense']:.2%} | {s['moe']:.2%} | "
                     f"{top5(s)} | {better} / {worse} |")
    lines += ["", f"Median |error| (signed median) per (source, kind, generation); a move beyond {GROUP_MOVE:.1%} "
                  "counts as better or worse.", "",
              "| source | kind | generation | rows | committed | " + " | ".join(f"`{t}`" for t, _ in results) + " |",
              "|---|---|---|---:|---:|" + "---:|" * len(results)]
    for key in sorted(base["groups"]):
        med, signed, n = base["groups"][key]
        cells = [f"{s['groups'][key][0]:.1%} ({s['groups'][key][1]:+.1%})" for _, s in results]
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {n} | {med:.1%} ({signed:+.1%}) | "
                     + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "variants.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
