"""The default global batch: tokens per step from the model's size, following published pre-training runs.

Without ``--global-batch`` the planner aims at ``default_tokens_per_step(params)`` tokens per step and turns it into
sequences of the plan's length. The rule, stated once:

- from 125M parameters up, interpolate log-linearly (in log parameters and log tokens) between the published
  batches below, flat beyond the largest (16M tokens);
- below 125M (smaller than any published row: a test or smoke model) shrink it as
  ``0.5M x (params / 125M) ** 0.654``, and give it at most ``SMOKE_MAX_MICROBATCHES`` micro-batches per step.

Pure: standard library only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MI = 2**20
"""The papers' "M" of batch tokens: GPT-3's 0.5M is 256 sequences of 2048 tokens = 0.5 x 2^20."""


@dataclass(frozen=True, kw_only=True, slots=True)
class BatchAnchor:
    """One published pre-training batch."""

    params: float
    """Parameters of the model (the paper's size)."""
    tokens_per_step: int
    """Tokens per optimizer step."""
    name: str
    """Short label for the output (``GPT-3 XL``)."""
    source: str
    """Paper and table or section."""

    def __post_init__(self) -> None:
        if self.params <= 0 or self.tokens_per_step <= 0:
            raise ValueError(f"BatchAnchor {self.name}: params and tokens_per_step must be positive")


ANCHORS: tuple[BatchAnchor, ...] = (
    # GPT-3 (Brown et al. 2020, Table 2.1; seed 001): 0.5M tokens (256 x 2048) from 125M to 760M, 1M at 1.3B; it went on
    # with 2M at 6.7B-13B and 3.2M at 175B, all for 300B-token runs. Later runs, trained on trillions of tokens, took more:
    BatchAnchor(params=125e6, tokens_per_step=256 * 2048, name="GPT-3 Small", source="Brown et al. 2020, Table 2.1"),
    BatchAnchor(params=760e6, tokens_per_step=256 * 2048, name="GPT-3 Large", source="Brown et al. 2020, Table 2.1"),
    BatchAnchor(params=1.3e9, tokens_per_step=512 * 2048, name="GPT-3 XL", source="Brown et al. 2020, Table 2.1"),
    # 4M tokens from 7B to 70B: Llama-2 (Touvron et al. 2023b, Sec. 2.2: 1024 x 4096 at every size), LLaMA 6.7B-65B
    # (Touvron et al. 2023a, Table 2; seed 001), OLMo 1B/7B (Groeneveld et al. 2024: 2048 x 2048 and 2160 x 2048) and
    # OLMo-2 7B (OLMo et al. 2024, configs/official-1124: 1024 x 4096; their 13B took 2048 x 4096 = 8M).
    BatchAnchor(params=6.74e9, tokens_per_step=4 * MI, name="Llama-2 7B", source="Touvron et al. 2023b, Sec. 2.2"),
    BatchAnchor(params=69e9, tokens_per_step=4 * MI, name="Llama-2 70B", source="Touvron et al. 2023b, Sec. 2.2"),
    # Llama-3 405B (Dubey et al. 2024, Sec. 3.4.1): 4M tokens, doubled to 8M and then to 16M as training went on.
    BatchAnchor(params=405e9, tokens_per_step=16 * MI, name="Llama-3 405B", source="Dubey et al. 2024, Sec. 3.4.1"),
)

SMALL_MODEL_EXPONENT = 0.654
"""Below the smallest anchor the batch shrinks as params^0.654: DeepSeek LLM (Bi et al. 2024, Eq. 1) fits the best
batch as B = 0.292 C^0.3271 in compute C = 6 N D, and at a fixed tokens-per-parameter D ~ N that is N^(2 x 0.3271)."""
SMOKE_MAX_MICROBATCHES = 64
"""A model below the smallest anchor (a smoke test) gets at most this many micro-batches per step: its batch is
there to exercise the layout, and a CPU step stays seconds, not minutes."""


@dataclass(frozen=True, kw_only=True, slots=True)
class BatchDefault:
    """The default batch for one model and sequence length."""

    tokens_per_step: int
    """The target the rule gives (before rounding to whole sequences and to the layout)."""
    sequences: int
    """Target global batch in sequences: tokens_per_step / seq_length, at least 1."""
    reason: str
    """Where the number came from, for the output: the anchors used and how."""
    smoke: bool
    """True below the smallest anchor: the micro-batch cap applies."""


def _label(anchor: BatchAnchor) -> str:
    """'GPT-3 XL (1.3B params, 1M tokens)'."""
    return f"{anchor.name} ({human_params(anchor.params)} params, {anchor.tokens_per_step / MI:g}M tokens)"


def human_params(n: float) -> str:
    """125e6 -> '125M', 1.3e9 -> '1.3B'."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.0f}"


def default_tokens_per_step(params: float) -> tuple[int, str, bool]:
    """(tokens per step, where it came from, smoke-sized) for a model of `params` parameters (see the module doc)."""
    if params <= 0:
        raise ValueError(f"params must be positive, got {params}")
    first, last = ANCHORS[0], ANCHORS[-1]
    if params < first.params:
        tokens = first.tokens_per_step * (params / first.params) ** SMALL_MODEL_EXPONENT
        return (max(1, round(tokens)), f"{_label(first)} scaled by (params / {human_params(first.params)})^"
                f"{SMALL_MODEL_EXPONENT} (DeepSeek LLM, Bi et al. 2024), at most {SMOKE_MAX_MICROBATCHES} "
                f"micro-batches: a smoke-sized model", True)
    if params >= last.params:
        return last.tokens_per_step, f"{_label(last)}: the largest published batch", False
    for lo, hi in zip(ANCHORS, ANCHORS[1:]):
        if lo.params <= params < hi.params:
            if lo.tokens_per_step == hi.tokens_per_step:
                return (lo.tokens_per_step, f"{lo.tokens_per_step / MI:g}M tokens, published for {lo.name} "
                        f"({human_params(lo.params)} params) to {hi.name} ({human_params(hi.params)})", False)
            # log-linear between the two published sizes around the model's
            x = math.log(params / lo.params) / math.log(hi.params / lo.params)
            tokens = lo.tokens_per_step * (hi.tokens_per_step / lo.tokens_per_step) ** x
            return round(tokens), f"log-interpolated between {_label(lo)} and {_label(hi)}", False
    raise AssertionError("unreachable: ANCHORS are sorted")


def default_batch(params: float, seq_length: int) -> BatchDefault:
    """The default global batch of a model with `params` parameters trained on sequences of `seq_length` tokens."""
    if seq_length < 1:
        raise ValueError(f"seq_length must be positive, got {seq_length}")
    tokens, reason, smoke = default_tokens_per_step(params)
    return BatchDefault(tokens_per_step=tokens, sequences=max(1, round(tokens / seq_length)), reason=reason,
                        smoke=smoke)


def global_batch_for(target: BatchDefault, unit: int, *, microbatch_sequences: int) -> int:
    """The target rounded to a multiple of `unit` (what the layout needs: mbs x dp, x pp when interleaved), at least
    one unit; for a smoke-sized model at most SMOKE_MAX_MICROBATCHES micro-batches of `microbatch_sequences`
    (mbs x dp) sequences."""
    if unit < 1 or microbatch_sequences < 1:
        raise ValueError(f"unit and microbatch_sequences must be positive, got {unit}, {microbatch_sequences}")
    gbs = max(unit, round(target.sequences / unit) * unit)
    if target.smoke:
        cap = SMOKE_MAX_MICROBATCHES * microbatch_sequences
        gbs = max(unit, min(gbs, cap // unit * unit))
    return gbs


BATCH_SOURCES = ("default", "--global-batch", "recipe", "smoke", "shrunk")
"""Where a plan's global batch came from: the rule above; the command line; a recipe's batch section; a recipe's
smoke variant; `genconf launch` shrinking the model for a smoke test."""


def batch_summary(params: float, global_batch: int, seq_length: int, source: str) -> dict:
    """plan.json's `batch`: the global batch, its tokens, where it came from and, for the default, by which rule."""
    if source not in BATCH_SOURCES:
        raise ValueError(f"batch source must be one of {'|'.join(BATCH_SOURCES)}, got {source!r}")
    target = default_batch(params, seq_length)
    return {"global_batch": global_batch, "seq_length": seq_length, "tokens_per_step": global_batch * seq_length,
            "source": source, "default_tokens_per_step": target.tokens_per_step,
            "default_global_batch": target.sequences, "rule": target.reason, "smoke": target.smoke}


def describe_batch(summary: dict) -> tuple[str, str]:
    """Two lines for people: ('256 x 2,048 = 524,288 tokens per step', 'the default: GPT-3 Small ... to ...')."""
    head = f"{summary['global_batch']:,} x {summary['seq_length']:,} = {summary['tokens_per_step']:,} tokens per step"
    source = summary["source"]
    if source == "default":
        target_sequences = summary.get("default_global_batch", summary["global_batch"])
        gbs = summary["global_batch"]
        if target_sequences == gbs:
            return head, f"the default: {summary['rule']}"
        # global_batch_for: a whole number of micro-batches on every data-parallel rank, at most the smoke cap
        how = "capped at" if summary.get("smoke") and gbs < target_sequences else "rounded to"
        return head, f"the default: {summary['rule']}; {target_sequences:,} sequences, {how} {gbs:,} for the layout"
    where = {"--global-batch": "given with --global-batch", "recipe": "the recipe's batch",
             "smoke": "the recipe's smoke variant", "shrunk": "scaled down with the shrunk model"}[source]
    return head, f"{where}; the default would be {summary['default_tokens_per_step']:,} tokens: {summary['rule']}"
