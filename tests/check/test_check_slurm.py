"""Generated Slurm scripts judged by a real Slurm (the local cluster of launchers/slurm/local_cluster.sh:
2 nodes x 2 fake GPUs, partition debug): `sbatch --test-only` accepts every script of a plan that fits, and a
script asking for more nodes than exist is refused by Slurm, with Slurm's own words surfaced by genconf check."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from conftest import REPO, genconf_cmd, genconf_quiet, injection_dir

pytestmark = pytest.mark.slurm

LOCAL = ["--gpus-per-node", "2", "--partition", "debug", "--time", "00:10:00"]
FITS = {
    "megatron": ["--model", "1b", "--gpus", "4", "--framework", "megatron", "--tp", "2"],
    "deepspeed": ["--model", "1b", "--gpus", "4", "--framework", "deepspeed", "--zero", "2"],
    "fsdp": ["--model", "1b", "--gpus", "4", "--framework", "fsdp", "--zero", "3"],
}


def check(d: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(genconf_cmd() + ["check", str(d), *extra], capture_output=True, text=True, cwd=REPO,
                          timeout=300)


def test_test_only_accepts_every_script_that_fits(slurm_cluster, tmp_path):
    for framework, flags in FITS.items():
        d = tmp_path / framework
        assert genconf_quiet(*flags, *LOCAL, "-o", str(d)) == 0
        scripts = sorted(d.glob("*.sbatch"))
        assert len(scripts) == (3 if framework == "fsdp" else 2)
        for script in scripts:
            text = script.read_text()
            assert "#SBATCH --nodes=2\n" in text and "--nnodes=2 --nproc-per-node=2" in text
            out = subprocess.run(["sbatch", "--test-only", script.name], capture_output=True, text=True, cwd=d,
                                 timeout=60)
            assert out.returncode == 0 and "to start at" in out.stderr, (script, out.stderr)
        out = check(d, "--slurm")
        # the scripts + ds_config.json, megatron_args.txt, olmo_fsdp.yaml, plan.json and launch_env.sh
        assert out.returncode == 0 and out.stdout.strip() == f"ok: {len(scripts) + 5} files", out.stdout + out.stderr


def test_more_nodes_than_exist_is_refused_by_slurm_and_surfaced(slurm_cluster, tmp_path):
    d = tmp_path / "too-big"
    assert genconf_quiet(*FITS["deepspeed"][:2], "--gpus", "8", *FITS["deepspeed"][4:], *LOCAL, "-o", str(d)) == 0
    assert "#SBATCH --nodes=4\n" in (d / "launch_deepspeed.sbatch").read_text()
    assert check(d).returncode == 0  # consistent with its plan: only Slurm knows the cluster has 2 nodes
    said = subprocess.run(["sbatch", "--test-only", "launch_deepspeed.sbatch"], capture_output=True, text=True, cwd=d,
                          timeout=60)
    assert said.returncode != 0
    slurm_words = "; ".join(line.strip() for line in said.stderr.splitlines() if line.strip())
    out = check(d, "--slurm")
    assert out.returncode == 2
    lines = out.stdout.splitlines()
    assert f"launch_deepspeed.sbatch: {slurm_words}" in lines, (slurm_words, out.stdout)
    assert f"launch_megatron.sbatch: {slurm_words}" in lines
    assert "Node count specification invalid" in slurm_words or "node configuration is not available" in slurm_words


def test_injection_scripts_pass_sbatch_and_create_nothing(slurm_cluster, tmp_path):
    out, run_dir, job = injection_dir(tmp_path)
    for script in sorted(out.glob("*.sbatch")):
        said = subprocess.run(["sbatch", "--test-only", script.name], capture_output=True, text=True, cwd=out,
                              timeout=60)
        assert said.returncode == 0, said.stderr
    assert [p for p in tmp_path.rglob("pwned*")] == []
    assert check(out, "--slurm").stdout.strip() == "ok: 8 files"
