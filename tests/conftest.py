"""Shared fixtures and markers. GPU and Slurm tests skip with a stated reason where those are absent."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "benchmarks" / "data"


def has_module(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


needs_torch = pytest.mark.skipif(not has_module("torch"), reason="torch not installed (pip install -e '.[train]')")
needs_deepspeed = pytest.mark.skipif(not has_module("deepspeed"), reason="deepspeed not installed (pip install -e '.[train]')")
needs_megatron = pytest.mark.skipif(not has_module("megatron.core"), reason="megatron-core not installed (pip install -e '.[train]')")


def genconf_cmd() -> list[str]:
    return [sys.executable, "-m", "genconf"]


@pytest.fixture
def env_no_color() -> dict:
    return dict(os.environ, PYTHONWARNINGS="ignore")
