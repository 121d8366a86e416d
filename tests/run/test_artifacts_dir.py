"""Writing an artifacts directory: atomic, never over an existing directory without --force (which keeps runs/),
never over a directory that is not genconf's, nothing left behind on an error, one-line errors."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import PLANS, genconf_quiet, one_line_error, plan_of, run_genconf


def test_existing_dir_needs_force_and_force_keeps_runs(rendered, tmp_path):
    target = tmp_path / "out"
    assert genconf_quiet(*PLANS["ds_z1"], "-o", str(target)) == 0
    before = {p.name: p.read_text() for p in target.iterdir() if p.is_file()}
    (target / "runs" / "logs" / "1.out").write_text("a log worth keeping\n")
    out = run_genconf(*PLANS["ds_z2_fp16"], "-o", str(target))
    one_line_error(out, f"{target} exists; use --force to replace it")
    assert {p.name: p.read_text() for p in target.iterdir() if p.is_file()} == before
    out = run_genconf(*PLANS["ds_z2_fp16"], "-o", str(target), "--force")
    assert out.returncode == 0, out.stderr
    assert '"fp16"' in (target / "ds_config.json").read_text()
    assert (target / "runs" / "logs" / "1.out").read_text() == "a log worth keeping\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary or old directories left
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    (stranger / "thesis.tex").write_text("x")
    one_line_error(run_genconf(*PLANS["ds_z1"], "-o", str(stranger), "--force"), "is not a genconf artifacts directory")
    assert (stranger / "thesis.tex").exists()

def test_a_failed_check_leaves_the_old_directory_in_place(rendered, tmp_path):
    from genconf.plan.errors import GenconfError
    from genconf.run import artifacts_dir

    target = tmp_path / "out"
    shutil.copytree(rendered["ds_z1"], target)
    (target / "runs" / "logs" / "1.out").write_text("kept\n")
    before = sorted(str(p.relative_to(target)) for p in target.rglob("*"))
    files = {p.name: p.read_text() for p in rendered["ds_z3"].iterdir() if p.is_file()}
    files["ds_config.json"] = files["ds_config.json"].replace('"stage": 3', '"stage": 0')
    with pytest.raises(GenconfError, match="fail their own check: ds_config.json:.*zero_optimization.stage 0"):
        artifacts_dir.write_artifacts(target, files, force=True, run_dir=str(target / "runs"))
    assert sorted(str(p.relative_to(target)) for p in target.rglob("*")) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]

@pytest.mark.parametrize("extra,needle", [
    (["--time", "soon"], "--time 'soon' is not a Slurm time"),
    (["--account", "my account"], "--account 'my account' is not a Slurm name"),
    (["--partition", "gpu;reboot"], "--partition 'gpu;reboot' is not a Slurm name"),
    (["--run-dir", "relative\nnewline"], "--run-dir must be an absolute path without control characters"),
])
def test_bad_options_write_nothing(tmp_path, extra, needle):
    target = tmp_path / "out"
    one_line_error(run_genconf(*PLANS["ds_z1"], "-o", str(target), *extra), needle)
    assert list(tmp_path.iterdir()) == []

@pytest.mark.parametrize("extra,needle", [(["--time", "soon"], "--time 'soon' is not a Slurm time"),
                                           (["--account", "my account"], "--account 'my account' is not a Slurm name")])
def test_bad_slurm_options_are_refused_without_o_too(extra, needle):
    one_line_error(run_genconf(*PLANS["ds_z1"], *extra), needle)


def test_a_zero_time_limit_is_none_and_gets_the_full_signal_lead(tmp_path):
    """sbatch(1): a time limit of zero requests none; the signal comes the full lead before the partition's own."""
    from genconf.render.slurm import PREEMPT_SIGNAL_LEAD_S, preempt_signal_s

    assert preempt_signal_s("0") == preempt_signal_s("UNLIMITED") == PREEMPT_SIGNAL_LEAD_S
    assert preempt_signal_s("2") == 30  # a quarter of a short limit
    target = tmp_path / "out"
    assert genconf_quiet(*PLANS["ds_z1"], "-o", str(target), "--time", "0") == 0
    script = (target / "launch_deepspeed.sbatch").read_text()
    assert "#SBATCH --time=0\n" in script and f"#SBATCH --signal=USR1@{PREEMPT_SIGNAL_LEAD_S}\n" in script


def test_a_second_submission_never_starts_over_in_the_scripts_run_dir(tmp_path):
    """The sbatch script's RUN_DIR is fixed when rendered; a run started over there clears its checkpoints, so a
    submission without --resume is refused where an earlier run left any (a repeated `launch --submit` deleted them)."""
    target = tmp_path / "out"
    assert genconf_quiet(*PLANS["ds_z1"], "-o", str(target)) == 0
    step = target / "runs" / "checkpoints" / "step_0000012"
    step.mkdir(parents=True)
    one_line_error(run_genconf("launch", str(target), "--submit"),
                   f"{target / 'runs'} (the sbatch script's RUN_DIR) already holds a run (1 checkpoint(s), the newest "
                   f"step_0000012); use --resume to continue it")
    assert step.is_dir()
    step.rmdir()
    (target / "runs" / "metrics.jsonl").write_text("{}\n")
    one_line_error(run_genconf("launch", str(target), "--submit"), "already holds a run (its metrics.jsonl)")


def test_unwritable_target_leaves_nothing_behind(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    out = run_genconf(*PLANS["ds_z1"], "-o", str(blocker / "out"))
    one_line_error(out, f"cannot write {blocker / 'out'}: {blocker} is not a directory")  # no temporary name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]
    out = run_genconf(*PLANS["ds_z1"], "-o", str(blocker))
    one_line_error(out, "exists and is not a directory")
    deep = tmp_path / "new" / "deeper" / "out"
    assert genconf_quiet(*PLANS["ds_z1"], "-o", str(deep)) == 0 and (deep / "plan.json").is_file()

def test_render_refuses_a_broken_or_malformed_plan(rendered, tmp_path):
    run_ = plan_of(rendered["olmo70b"])
    run_["plan"].update(pp=3, dp=32)  # 4 x 3 x 32 = 384 GPUs, but 80 layers do not split over pp x vp = 12
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(run_))
    one_line_error(run_genconf("render", str(bad), "-o", str(tmp_path / "out")), "pipeline_split")
    garbled = tmp_path / "garbled.json"
    garbled.write_text('{\n  "model": {\n  oops\n}\n')
    one_line_error(run_genconf("render", str(garbled), "-o", str(tmp_path / "out")), f"{garbled}:3: invalid JSON")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json", "garbled.json"]

def test_plan_output_still_prints_with_o(tmp_path):
    out = run_genconf(*PLANS["ds_z1"], "--json", "-o", str(tmp_path / "out"))
    assert out.returncode == 0 and json.loads(out.stdout)["plan"]["framework"] == "deepspeed"
    assert "wrote 8 files" in out.stderr
