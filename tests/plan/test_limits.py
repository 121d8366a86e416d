"""Bounded input (issue 15 item 1): every number has a documented range, checked in one line; divisors in
O(sqrt n), so the search cannot spend minutes on a large GPU count."""

from __future__ import annotations

import dataclasses
import time

import pytest

from genconf.catalog import clusters, hardware, models
from genconf.plan import limits


def brute_divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def test_divisors_equal_the_definition():
    for n in range(1, 3000):
        assert limits.divisors(n) == brute_divisors(n)
    assert limits.divisors(720_720)[:12] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12] and len(limits.divisors(720_720)) == 240
    assert limits.divisors(1_048_576) == [2**k for k in range(21)]
    assert limits.divisors(999_999_999_989) == [1, 999_999_999_989]  # a prime near 1e12
    for bad in (0, -4, 2.0, True):
        with pytest.raises(ValueError):
            limits.divisors(bad)


def test_divisors_are_fast_where_the_scan_took_minutes():
    t0 = time.perf_counter()
    for n in (limits.MAX_GPUS, 100_000_000, 2**31, 999_999_999_989):
        limits.divisors(n)
    assert time.perf_counter() - t0 < 0.5  # range(1, n + 1) over 1e12 would take hours


@pytest.mark.parametrize("flag, value, line", [
    ("--gpus", 10_000_000, "--gpus 10,000,000 is out of range (1 to 1,048,576 GPUs)"),
    ("--gpus", 1_048_576, None),
    ("--gpus-per-node", 1_000_000_000, "--gpus-per-node 1,000,000,000 is out of range (1 to 1,024 GPUs)"),
    ("--layers", 2_147_483_648, "--layers 2,147,483,648 is out of range (1 to 16,384 layers)"),
    ("--zero", 4, "--zero 4 is out of range (0 to 3)"),
    ("--tokens", float("inf"), "--tokens must be a finite number, got inf"),
    ("--tokens", float("nan"), "--tokens must be a finite number, got nan"),
    ("--lr", -1.0, "--lr -1 is out of range (0 to 10)"),
    ("--unknown-flag", 10**30, None),
])
def test_flags(flag, value, line):
    assert limits.check_flag(flag, value) == line


def test_yaml_fields_one_line_each():
    lines = limits.check_all({"num_layers": 2_147_483_648, "hidden_size": 4096, "nvlink_domain_gpus": 2_147_483_648,
                              "vocab_size": "50k", "tie_embeddings": True, "num_experts": True,
                              "ib_gbit_per_s_per_gpu": float("inf")}, where="my.yaml")
    assert lines == [
        "my.yaml: num_layers 2,147,483,648 is out of range (1 to 16,384 layers)",
        "my.yaml: nvlink_domain_gpus 2,147,483,648 is out of range (1 to 1,048,576 GPUs)",
        "my.yaml: vocab_size must be a whole number, got '50k'",
        "my.yaml: num_experts must be a whole number, got True",
        "my.yaml: ib_gbit_per_s_per_gpu must be a finite number, got inf",
    ]


def test_everything_genconf_ships_is_inside_the_ranges():
    """The ranges are documented limits, not tight fits: every catalog model, GPU and cluster passes."""
    for spec in models.list_models() + hardware.list_gpus() + clusters.list_clusters():
        values = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
        assert limits.check_all(values, where=spec.name) == []


def test_every_flag_names_a_range_and_the_table_lists_them():
    assert all(name in limits.RANGES for name in limits.FLAGS.values())
    table = limits.table_markdown().splitlines()
    assert len(table) == 2 + len(limits.RANGES)
    assert "| `num_gpus` (`--gpus`) | 1 to 1,048,576 | GPUs |" in limits.table_markdown()


def test_the_readme_shows_the_ranges_as_they_are():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert limits.table_markdown() in readme, "regenerate the README table: python -c 'from genconf.plan import " \
                                              "limits; print(limits.table_markdown())'"
