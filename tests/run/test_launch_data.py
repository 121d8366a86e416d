"""`genconf launch --data FILE` checks the token file before any rank starts (issue 15 item 6): a size that is
not a multiple of the dtype, a token id at or above the vocabulary, a file shorter than one global batch. One
line, exit 2, and no run directory: torchrun never started. On the old main each of these launched the ranks.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, reader_or_skip

np = reader_or_skip("numpy", "pip install -e '.[train]'", module_level=True)

TINY_GPT = str(REPO / "tests" / "data" / "tiny-gpt.yaml")
SEQ, GBS, VOCAB = 64, 8, 128  # --seq-len, --global-batch and --vocab of the launch below


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("data") / "plan"
    done = subprocess.run([sys.executable, "-m", "genconf", "--model", TINY_GPT, "--gpus", "2", "--gpus-per-node", "2",
                           "--global-batch", str(GBS), "--mbs", "1", "--recompute", "none", "--framework", "fsdp",
                           "--zero", "3", "-o", str(out)], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return out


def launch(artifacts: Path, data: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "genconf", "launch", str(artifacts), "--name", data.stem, "--data",
                           str(data), "--steps", "2", "--seq-len", str(SEQ), "--vocab", str(VOCAB), *extra],
                          capture_output=True, text=True, cwd=REPO, timeout=120)


def one_line_refusal(done: subprocess.CompletedProcess, artifacts: Path, name: str) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("genconf: error: "), done.stderr
    assert "launching" not in done.stdout + done.stderr and not (artifacts / "runs" / name).exists()
    return lines[0]


def test_a_size_that_is_not_a_multiple_of_the_dtype(artifacts, tmp_path):
    bad = tmp_path / "odd.bin"
    bad.write_bytes((np.arange(GBS * SEQ * 2) % VOCAB).astype(np.uint16).tobytes() + b"\x01")  # one byte too many
    line = one_line_refusal(launch(artifacts, bad), artifacts, "odd")
    assert line == (f"genconf: error: token file {bad} has {GBS * SEQ * 2 * 2 + 1:,} bytes, not a multiple of 2 (uint16): "
                    f"a truncated file or the wrong --data-dtype")


def test_a_token_id_at_or_above_the_vocabulary_anywhere_in_the_file(artifacts, tmp_path):
    tokens = (np.arange(GBS * SEQ * 4) % VOCAB).astype(np.uint16)
    tokens[-3] = VOCAB  # near the end: a run of 2 steps would never read it
    bad = tmp_path / "vocab.bin"
    tokens.tofile(bad)
    line = one_line_refusal(launch(artifacts, bad), artifacts, "vocab")
    assert line == (f"genconf: error: token file {bad}: token id {VOCAB} at position {tokens.size - 3:,} is not below "
                    f"the vocabulary size {VOCAB} (wrong tokenizer, or --vocab too small)")


def test_a_file_shorter_than_one_global_batch(artifacts, tmp_path):
    bad = tmp_path / "short.bin"
    (np.arange(SEQ * 3) % VOCAB).astype(np.uint16).tofile(bad)
    line = one_line_refusal(launch(artifacts, bad), artifacts, "short")
    assert line == (f"genconf: error: token file {bad} has {SEQ * 3} tokens but one global batch needs "
                    f"{GBS * SEQ + 1:,} ({GBS} sequences x {SEQ} tokens + 1)")


def test_the_wrong_dtype_reads_ids_beyond_the_vocabulary(artifacts, tmp_path):
    """A uint32 file read as uint16: the high halves are 0, the low ones fine, but the sizes work out; a uint16
    file read as uint32 packs two ids into one, far above the vocabulary."""
    bad = tmp_path / "dtype.bin"
    (np.arange(GBS * SEQ * 4) % VOCAB + 1).astype(np.uint16).tofile(bad)
    line = one_line_refusal(launch(artifacts, bad, "--data-dtype", "uint32"), artifacts, "dtype")
    assert "is not below the vocabulary size 128" in line and "position 0 " in line
