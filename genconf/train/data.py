"""Training data: a deterministic synthetic token stream (default) or a memory-mapped token file.

Both are indexed by global sample number, so every layout (any TP/PP/DP/micro-batch split) trains on the
same sequences in the same order: a TP=2 run sees exactly what the TP=1 run sees.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from genconf.plan.errors import GenconfError


ACTIVE_TOKENS = 1024
"""Token ids the synthetic chain visits (the first ones of the vocabulary). Text through a real tokenizer also
spends most of its tokens on a few thousand ids, which is why a language model's loss leaves the unigram
entropy within its first steps. A chain over all 32,128 ids of a 1B model gives each id two occurrences per
65,536-token step: on an H200, 25 healthy steps of OLMo 1B went from 10.42 to 10.23 nats against a unigram floor
of 10.20 (benchmarks/results/gpu_runs/README.md, call 2), so a short run could not be told from one with shuffled
labels."""


@dataclass(frozen=True)
class SyntheticTokens:
    """Sequences from a fixed sparse bigram chain over the first `active_tokens` ids: each token has
    `branching` likely successors, so the loss falls from ln(vocab) to about ln(active_tokens) as a model
    learns the token frequencies and on towards ln(branching) as it learns the chain. Sample i is a pure
    function of (seed, i). Vocabularies no larger than active_tokens (the CPU smoke models') use every id."""

    vocab_size: int
    seed: int = 1234
    branching: int = 4
    active_tokens: int = ACTIVE_TOKENS

    @property
    def states(self) -> int:
        return min(self.vocab_size, self.active_tokens)

    def _table(self) -> np.ndarray:
        rng = np.random.default_rng(self.seed)
        return rng.integers(0, self.states, size=(self.states, self.branching), dtype=np.int64)

    def sample(self, index: int, length: int) -> np.ndarray:
        table = _TABLES.setdefault((self.states, self.seed, self.branching), self._table())
        rng = np.random.default_rng((self.seed, index))
        choices = rng.integers(0, self.branching, size=length)
        out = np.empty(length, dtype=np.int64)
        out[0] = rng.integers(0, self.states)
        for t in range(1, length):
            out[t] = table[out[t - 1], choices[t]]
        return out


_TABLES: dict[tuple, np.ndarray] = {}


@dataclass(frozen=True)
class MemmapTokens:
    """A flat binary file of uint16 or uint32 token ids (Megatron/OLMo style), read through np.memmap.
    Sample i is tokens [i*seq, i*seq + seq + 1), wrapping around the file."""

    path: str
    dtype: str = "uint16"

    def __post_init__(self) -> None:
        if self.dtype not in ("uint16", "uint32"):
            raise GenconfError(f"token file dtype must be uint16 or uint32, got {self.dtype}")
        p = Path(self.path)
        if not p.is_file():
            raise GenconfError(f"token file {self.path} does not exist")
        if p.stat().st_size < 2 * np.dtype(self.dtype).itemsize:
            raise GenconfError(f"token file {self.path} is too small")

    def sample(self, index: int, length: int) -> np.ndarray:
        data = np.memmap(self.path, dtype=self.dtype, mode="r")
        start = (index * (length - 1)) % max(1, len(data) - length)
        return np.asarray(data[start:start + length], dtype=np.int64)


def micro_batch(source, *, step: int, global_batch: int, micro_batch_size: int, dp_rank: int, dp_size: int,
                micro_index: int, seq_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens and labels [mbs, seq] of one micro-batch: DP rank r takes a contiguous slice of the step's
    global batch, in micro-batch order."""
    per_rank = global_batch // dp_size
    first = step * global_batch + dp_rank * per_rank + micro_index * micro_batch_size
    rows = [source.sample(first + i, seq_length + 1) for i in range(micro_batch_size)]
    block = torch.from_numpy(np.stack(rows))
    return block[:, :-1].contiguous(), block[:, 1:].contiguous()


def source_from(spec: dict, vocab_size: int, seed: int):
    """{"kind": "synthetic"[, "branching": 4, "active_tokens": 1024]} or {"kind": "memmap", "path": ...,
    "dtype": "uint16"}."""
    kind = spec.get("kind", "synthetic")
    if kind == "synthetic":
        return SyntheticTokens(vocab_size=vocab_size, seed=seed, branching=int(spec.get("branching", 4)),
                               active_tokens=int(spec.get("active_tokens", ACTIVE_TOKENS)))
    if kind == "memmap":
        return MemmapTokens(path=spec["path"], dtype=spec.get("dtype", "uint16"))
    raise GenconfError(f"unknown data kind {kind!r} (synthetic | memmap)")
