"""The up-front token file check (issue 15 item 6): every broken file the issue names is one line, found
before anything trains; a good file passes with its token count and largest id."""

from __future__ import annotations

import numpy as np
import pytest

from genconf.run.datacheck import CHUNK_TOKENS, check_token_file
from genconf.plan.errors import GenconfError

RUN = {"vocab_size": 1000, "seq_length": 16, "global_batch": 4}  # one step reads 4 x 16 + 1 = 65 tokens


def write(path, tokens, dtype="uint16"):
    np.asarray(tokens, dtype=dtype).tofile(path)
    return path


def test_a_good_file_passes_with_its_numbers(tmp_path):
    f = write(tmp_path / "ok.bin", np.arange(200) % 1000)
    s = check_token_file(f, dtype="uint16", **RUN)
    assert (s.num_tokens, s.max_token_id) == (200, 199)
    assert s.line(1000).startswith(f"data {f}: 200 uint16 tokens, max id 199 < vocab 1,000")
    u32 = write(tmp_path / "u32.bin", [70_000, 1, 2] * 30, dtype="uint32")
    assert check_token_file(u32, dtype="uint32", vocab_size=100_000, seq_length=16, global_batch=4).max_token_id == 70_000


def test_size_not_a_multiple_of_the_dtype(tmp_path):
    f = tmp_path / "odd.bin"
    f.write_bytes(np.arange(100, dtype="uint16").tobytes() + b"\x01")
    with pytest.raises(GenconfError, match=r"has 201 bytes, not a multiple of 2 \(uint16\): a truncated file or the "
                                           r"wrong --data-dtype"):
        check_token_file(f, dtype="uint16", **RUN)
    g = write(tmp_path / "u16as32.bin", np.arange(101))  # 202 bytes read as uint32
    with pytest.raises(GenconfError, match="not a multiple of 4"):
        check_token_file(g, dtype="uint32", **RUN)


def test_a_token_id_at_or_above_the_vocabulary_is_found_wherever_it_is(tmp_path):
    tokens = np.zeros(CHUNK_TOKENS + 500, dtype="uint16")  # the bad id sits in the second chunk of the scan
    tokens[CHUNK_TOKENS + 123] = 1000
    f = write(tmp_path / "bad.bin", tokens)
    with pytest.raises(GenconfError) as err:
        check_token_file(f, dtype="uint16", **RUN)
    assert str(err.value) == (f"token file {f}: token id 1,000 at position {CHUNK_TOKENS + 123:,} is not below the "
                              f"vocabulary size 1,000 (wrong tokenizer, or --vocab too small)")


def test_shorter_than_one_global_batch(tmp_path):
    f = write(tmp_path / "short.bin", np.arange(64))  # one short of 65
    with pytest.raises(GenconfError, match=r"has 64 tokens but one global batch needs 65 \(4 sequences x 16 tokens \+ 1\)"):
        check_token_file(f, dtype="uint16", **RUN)
    check_token_file(write(tmp_path / "exact.bin", np.arange(65)), dtype="uint16", **RUN)


def test_a_vocabulary_uint16_cannot_hold(tmp_path):
    f = write(tmp_path / "t.bin", np.arange(100))
    with pytest.raises(GenconfError, match=r"128,256 ids but uint16 holds ids below 65,536: tokenize to uint32"):
        check_token_file(f, dtype="uint16", vocab_size=128_256, seq_length=4, global_batch=1)


def test_missing_and_unreadable(tmp_path):
    with pytest.raises(GenconfError, match="does not exist"):
        check_token_file(tmp_path / "nope.bin", dtype="uint16", **RUN)
    with pytest.raises(GenconfError, match="not a regular file"):
        check_token_file(tmp_path, dtype="uint16", **RUN)
    with pytest.raises(GenconfError, match="uint16 or uint32"):
        check_token_file(tmp_path / "x", dtype="int64", **RUN)
