"""GPU-only checks (marker `gpu`): skipped, with the reason, on machines without CUDA (CI has none).

Run on a GPU machine with `python -m pytest -m gpu`. They cover what only a GPU shows: Transformer Engine
layers, the FP8 recipes the hardware supports, NCCL, and measured throughput and memory against the plan.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from conftest import REPO

torch = pytest.importorskip("torch", reason="torch not installed")
CUDA = torch.cuda.is_available()
TE = importlib.util.find_spec("transformer_engine") is not None
MEGATRON = importlib.util.find_spec("megatron.core") is not None

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (none here)")]


def _arch() -> str:
    major = torch.cuda.get_device_capability()[0] if CUDA else 0
    return {8: "ampere", 9: "hopper", 10: "blackwell", 12: "blackwell"}.get(major, "other")


def genconf(*args: str, timeout: int = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "genconf", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=timeout)


def test_gemm_benchmark_matches_the_cost_model():
    out = subprocess.run([sys.executable, "benchmarks/gemm.py", "--quick"], capture_output=True, text=True, cwd=REPO,
                         timeout=1200)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout[out.stdout.index("{"):])
    assert summary["rows"] > 0
    assert 0.5 < summary["median_measured_over_predicted"] < 2.0


@pytest.mark.skipif(not MEGATRON, reason="megatron-core not installed")
def test_bf16_run_is_verified_against_the_prediction(tmp_path):
    artifacts = tmp_path / "bf16"
    done = genconf("--model", "1b", "--gpus", "1", "--gpus-per-node", "1", "--framework", "megatron", "--tp", "1",
                   "--pp", "1", "--zero", "0", "--mbs", "1", "--global-batch", "8", "-o", str(artifacts))
    assert done.returncode == 0, done.stderr
    done = genconf("launch", str(artifacts), "--name", "run", "--steps", "20", "--lr", "3e-4")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(genconf("verify", str(artifacts / "runs" / "run"), "--json").stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["throughput"]["status"] != "n/a" and checks["peak memory"]["status"] != "n/a"
    assert checks["model states"]["status"] == "pass"


@pytest.mark.skipif(not (MEGATRON and TE), reason="FP8 needs megatron-core and Transformer Engine")
@pytest.mark.parametrize("recipe,arch", [("delayed", ("hopper", "blackwell")), ("current", ("hopper", "blackwell")),
                                         ("blockwise", ("hopper", "blackwell")), ("mxfp8", ("blackwell",))])
def test_fp8_recipes_train(tmp_path, recipe, arch):
    if _arch() not in arch:
        pytest.skip(f"fp8 {recipe} needs {' or '.join(arch)}; this GPU is {_arch()}")
    artifacts = tmp_path / recipe
    done = genconf("--model", "1b", "--gpus", "1", "--gpus-per-node", "1", "--framework", "megatron", "--tp", "1",
                   "--pp", "1", "--zero", "0", "--mbs", "1", "--global-batch", "8", "--precision", "fp8",
                   "-o", str(artifacts))
    assert done.returncode == 0, done.stderr
    plan = json.loads((artifacts / "plan.json").read_text())
    plan["train"]["fp8_recipe"] = recipe
    (artifacts / "plan.json").write_text(json.dumps(plan))
    done = genconf("launch", str(artifacts), "--name", "run", "--layers", "4", "--steps", "20", "--lr", "3e-4")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [json.loads(line) for line in (artifacts / "runs" / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["loss"] < rows[0]["loss"]
