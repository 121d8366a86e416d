"""Check a token file before any rank starts (issue 15 item 6): its size against the dtype, every token id
against the vocabulary (one memory-mapped pass), and that it holds at least one global batch.

A bad file used to surface in the middle of a run (an index error in the embedding at the first bad id, or
never when that id was not reached) or not at all (a file shorter than one sequence trained on truncated
batches). Here it is one line naming the file, the position and the numbers, before torchrun starts.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from genconf.plan.errors import GenconfError

ITEM_BYTES = {"uint16": 2, "uint32": 4}
"""The token file formats genconf.train.data reads (Megatron/OLMo flat binaries)."""
CHUNK_TOKENS = 1 << 24
"""Tokens per step of the scan (32-64 MiB): np.max over a chunk runs at memory bandwidth."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DataSummary:
    path: str
    dtype: str
    num_tokens: int
    max_token_id: int
    scan_s: float

    def line(self, vocab_size: int) -> str:
        return (f"data {self.path}: {self.num_tokens:,} {self.dtype} tokens, max id {self.max_token_id:,} < vocab "
                f"{vocab_size:,} (checked in {self.scan_s:.1f} s)")


def check_token_file(path: str | os.PathLike, *, dtype: str, vocab_size: int, seq_length: int,
                     global_batch: int) -> DataSummary:
    """GenconfError (one line) when the file cannot feed this run; else what it holds."""
    try:
        import numpy as np
    except ImportError:
        raise GenconfError("checking a token file needs numpy: pip install 'genconf[train]'") from None

    if dtype not in ITEM_BYTES:
        raise GenconfError(f"token file dtype must be uint16 or uint32, got {dtype!r}")
    p = Path(path)
    if not p.exists():
        raise GenconfError(f"token file {p} does not exist")
    if not p.is_file():
        raise GenconfError(f"token file {p} is not a regular file")
    if not os.access(p, os.R_OK):
        raise GenconfError(f"token file {p} is not readable")
    item = ITEM_BYTES[dtype]
    if vocab_size > 2 ** (8 * item):
        raise GenconfError(f"the vocabulary has {vocab_size:,} ids but {dtype} holds ids below {2 ** (8 * item):,}: "
                           f"tokenize to uint32 (--data-dtype uint32)")
    size = p.stat().st_size
    if size % item:
        raise GenconfError(f"token file {p} has {size:,} bytes, not a multiple of {item} ({dtype}): a truncated file "
                           f"or the wrong --data-dtype")
    num_tokens = size // item
    # A sample is seq_length + 1 tokens (inputs and the labels shifted by one), and a step reads global_batch
    # of them (genconf.train.data.micro_batch): fewer and the first step already wraps around the file.
    need = global_batch * seq_length + 1
    if num_tokens < need:
        raise GenconfError(f"token file {p} has {num_tokens:,} tokens but one global batch needs {need:,} "
                           f"({global_batch:,} sequences x {seq_length:,} tokens + 1)")
    t0 = time.perf_counter()
    data = np.memmap(p, dtype=dtype, mode="r")
    top = 0
    for start in range(0, num_tokens, CHUNK_TOKENS):
        chunk = data[start:start + CHUNK_TOKENS]
        high = int(chunk.max())
        if high >= vocab_size:
            at = start + int(np.argmax(chunk >= vocab_size))
            raise GenconfError(f"token file {p}: token id {int(data[at]):,} at position {at:,} is not below the "
                               f"vocabulary size {vocab_size:,} (wrong tokenizer, or --vocab too small)")
        top = max(top, high)
    del data
    return DataSummary(path=str(p), dtype=dtype, num_tokens=num_tokens, max_token_id=top,
                       scan_s=time.perf_counter() - t0)
