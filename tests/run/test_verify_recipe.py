"""`genconf verify` of a recipe's smoke run compares it with the recipe's own golden curve (launch prints that
command; without the golden a correct 12-step run failed the loss-floor check), and a run that stopped part-way is
no pass (a preempted run passed)."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from conftest import REPO, genconf_cmd, needs_torch


def genconf(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(genconf_cmd() + list(args), capture_output=True, text=True, cwd=REPO, timeout=600)


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("recipe") / "olmo"
    done = genconf("recipe", "olmo-1b-ddp", "--smoke", "-o", str(out))
    assert done.returncode == 0, done.stderr
    done = genconf("launch", str(out), "--name", "r1")
    assert done.returncode == 0, done.stderr
    return out / "runs" / "r1"


@needs_torch
def test_a_recipe_smoke_run_is_verified_against_the_recipe_s_golden_curve(smoke_run):
    done = genconf("verify", str(smoke_run), "--json")
    report = json.loads(done.stdout)
    assert done.returncode == 0 and report["ok"], report
    assert "recipes/golden/olmo-1b-ddp.smoke.txt" in done.stderr and "tolerance 5e-05" in done.stderr
    loss = next(c for c in report["checks"] if c["name"] == "loss")
    assert "within 5e-05 of the golden curve" in loss["detail"]
    completed = next(c for c in report["checks"] if c["name"] == "completed")
    assert completed["status"] == "pass" and completed["detail"] == "12 of 12 steps"


def _unfinished_copy(run, to):
    """A copy of a finished run without its finished marker, and its metrics lines (for the test to cut)."""
    shutil.copytree(run, to)
    (to / "finished").unlink()
    return to, (to / "metrics.jsonl").read_text().splitlines()


@needs_torch
def test_a_run_that_stopped_part_way_does_not_pass(smoke_run, tmp_path):
    run, lines = _unfinished_copy(smoke_run, tmp_path / "runs" / "cut")
    (run / "metrics.jsonl").write_text("\n".join(lines[:6]) + "\n")
    done = genconf("verify", str(run), "--json")
    report = json.loads(done.stdout)
    assert done.returncode == 1 and not report["ok"]
    completed = next(c for c in report["checks"] if c["name"] == "completed")
    assert completed["status"] == "fail" and "stopped at 6 of 12 steps" in completed["detail"]
    assert "no finished marker" in completed["detail"]


@needs_torch
def test_a_run_killed_while_writing_its_last_line_is_a_run_that_stopped(smoke_run, tmp_path):
    # The last metrics line cut mid-write (no newline) stopped verify with "metrics.jsonl:7: not a JSON line".
    run, lines = _unfinished_copy(smoke_run, tmp_path / "runs" / "killed")
    metrics = run / "metrics.jsonl"
    metrics.write_text("\n".join(lines[:6]) + "\n" + lines[6][: len(lines[6]) // 2])
    report = json.loads(genconf("verify", str(run), "--json").stdout)
    completed = next(c for c in report["checks"] if c["name"] == "completed")
    assert completed["status"] == "fail" and "stopped at 6 of 12 steps" in completed["detail"]
    metrics.write_text("\n".join(lines[:6]) + "\n{broken\n" + "\n".join(lines[7:]) + "\n")  # not the last line
    done = genconf("verify", str(run))
    assert done.returncode == 2 and "metrics.jsonl:7: not a JSON line" in done.stderr


@needs_torch
def test_a_local_launch_runs_under_the_rendered_run_dir(tmp_path):
    """--run-dir given when rendering is where the sbatch script trains; a local launch goes there too (it went
    to DIR/runs, so checkpoints meant for scratch storage landed beside the artifacts)."""
    out, scratch = tmp_path / "out", tmp_path / "scratch"
    done = genconf("recipe", "olmo-1b-ddp", "--smoke", "-o", str(out), "--run-dir", str(scratch))
    assert done.returncode == 0, done.stderr
    done = genconf("launch", str(out), "--steps", "2", "--name", "x")
    assert done.returncode == 0, done.stderr
    assert (scratch / "x" / "metrics.jsonl").is_file() and not (out / "runs").exists()


@pytest.mark.parametrize("flags,needle", [(["--tolerance", "-1"], "--tolerance -1: an absolute loss difference"),
                                          (["--min-drop", "5"], "--min-drop 5: a fraction of the first loss")])
def test_verify_refuses_meaningless_thresholds(tmp_path, flags, needle):
    done = genconf("verify", str(tmp_path), *flags)
    assert done.returncode == 2 and done.stderr.startswith(f"genconf: error: {needle}") and done.stderr.count("\n") == 1
