"""How the dense 80% band's construction moves its coverage, on the stored held-out residuals.

    python benchmarks/band_variants.py      # reads results/accuracy.json (accuracy.py --loso), writes results/band_variants.md

accuracy.intervals builds the dense band from the leave-one-source-out residuals with every source weighted alike
(_source_band), at the tail level whose nested check reaches 80% (_calibrated_tail). This scores that weighting
against its alternatives: pooled quantiles (every row alike) and rows weighted 1 / sqrt(their source's rows), each
at 10/90% and at wider quantiles. Per variant: the band, its in-sample
coverage, and the nested check the issue's gate reads (each source's rows against the band built without it), as a
share of rows and averaged over sources. Memory: the pooled band against one weighting every model alike, each
checked on the rows of a model left out of it.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from accuracy import RESULTS, _band, _inside, write_markdown  # noqa: E402

WEIGHTINGS = {
    "pooled": lambda n: 1.0,
    "1 / sqrt(source rows)": lambda n: 1.0 / math.sqrt(n),
    "every source alike (committed weighting)": lambda n: 1.0 / n,
}
QUANTILES = ((0.10, 0.90), (0.075, 0.925), (0.05, 0.95))


def _weighted_band(rows: list[dict], key: str, group, weight, q_lo: float, q_hi: float) -> dict | None:
    scored = [r for r in rows if r.get(key) is not None]
    count: dict = {}
    for r in scored:
        count[group(r)] = count.get(group(r), 0) + 1
    return _band([math.log(1 + r[key]) for r in scored], q_lo, q_hi, [weight(count[group(r)]) for r in scored])


def _coverage(rows: list[dict], key: str, group, weight, q_lo: float, q_hi: float) -> tuple[dict, float, float, float]:
    """(band, in-sample share, nested share of rows, nested share averaged over groups)."""
    band = _weighted_band(rows, key, group, weight, q_lo, q_hi)
    inside_all = sum(_inside(band, r[key]) for r in rows) / len(rows)
    hits = total = 0
    shares = []
    for g in sorted({group(r) for r in rows}):
        test = [r for r in rows if group(r) == g]
        rest = _weighted_band([r for r in rows if group(r) != g], key, group, weight, q_lo, q_hi)
        hit = sum(_inside(rest, r[key]) for r in test)
        hits += hit
        total += len(test)
        shares.append(hit / len(test))
    return band, inside_all, hits / total, sum(shares) / len(shares)


def main() -> int:
    held = json.loads((RESULTS / "accuracy.json").read_text())["loso_rows"]
    dense = [r for r in held if r["kind"] == "dense" and r["throughput_error"] is not None]
    memory = [r for r in held if r.get("memory_error") is not None]
    lines = ["# The 80% band's construction: coverage of each variant", "",
             "Command: `python benchmarks/band_variants.py` (the held-out rows of `accuracy.py --loso`). Nested: each "
             "source's rows against the band built without that source.", "",
             "| dense tokens/s band | quantiles | band | in sample | nested, rows | nested, mean over sources |",
             "|---|---|---|---:|---:|---:|"]
    for name, weight in WEIGHTINGS.items():
        for q_lo, q_hi in QUANTILES:
            band, ins, rows, mean = _coverage(dense, "throughput_error", lambda r: r["source"], weight, q_lo, q_hi)
            lines.append(f"| {name} | {q_lo:.3f}-{q_hi:.3f} | {band['low']:.3f}-{band['high']:.3f} | {ins:.1%} | "
                         f"{rows:.1%} | {mean:.1%} |")
    lines += ["", "| memory band (rows grouped by model) | band | in sample | nested, rows |", "|---|---|---:|---:|"]
    model = lambda r: r["model"]  # noqa: E731
    for name, weight in (("pooled", WEIGHTINGS["pooled"]),
                         ("every model alike (committed weighting)", WEIGHTINGS["every source alike (committed weighting)"])):
        band, ins, rows, _ = _coverage(memory, "memory_error", model, weight, 0.10, 0.90)
        lines.append(f"| {name} | {band['low']:.3f}-{band['high']:.3f} | {ins:.1%} | {rows:.1%} |")
    return write_markdown("band_variants", lines)


if __name__ == "__main__":
    raise SystemExit(main())
