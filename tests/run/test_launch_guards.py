"""`genconf launch` refuses, in one line and before anything starts, what it would otherwise do silently: flags it
would ignore, a directory copied or moved since it was rendered (its scripts write to the old paths), files edited
by hand that contradict the plan.json it trains, and a --resume of another directory's run. Found by a new-user probe
of the launch flows (2026-11-30)."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import REPO, copy_artifacts, one_line_error, run_genconf

TINY_GPT = str(REPO / "tests" / "data" / "tiny-gpt.yaml")


def _runs(artifacts) -> list[str]:
    """The run directories under DIR/runs (logs/ is Slurm's, made by render)."""
    runs = artifacts / "runs"
    return sorted(p.name for p in runs.iterdir() if p.name != "logs") if runs.is_dir() else []


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    d = tmp_path_factory.mktemp("guards") / "tiny"
    out = run_genconf("--model", TINY_GPT, "--gpus", "2", "--cluster", "dgx-h100", "--framework", "megatron",
                      "--tp", "1", "--pp", "1", "--zero", "0", "-o", str(d))
    assert out.returncode == 0, out.stderr
    return d


@pytest.mark.parametrize("flags,needle", [
    (["--wait"], "--wait waits for a submitted job: add --submit"),
    (["--submit", "--name", "x"], "--submit trains in the RUN_DIR its sbatch script was rendered with: drop --name"),
    (["--submit", "--force"], "a submitted job has none: drop it"),
    (["--run-dir", "/tmp/r", "--name", "x"], "--run-dir gives its whole path: use one"),
])
def test_flags_a_launch_would_ignore_are_refused(planned, flags, needle):
    one_line_error(run_genconf("launch", str(planned), *flags), needle)
    assert _runs(planned) == []


def test_a_run_dir_that_is_a_file_is_one_line(planned, tmp_path):
    file = tmp_path / "afile"
    file.write_text("")
    one_line_error(run_genconf("launch", str(planned), "--run-dir", str(file), "--steps", "1"),
                   f"--run-dir {file} is a file, not a run directory")


def test_a_copied_directory_is_re_rendered_before_it_launches(planned, tmp_path):
    # A plain copy's sbatch scripts still say ARTIFACTS=<the original>: its runs went there (re-creating it if gone).
    copy = tmp_path / "copy"
    shutil.copytree(planned, copy)
    checked = run_genconf("check", str(copy))
    assert checked.returncode == 2 and f"rendered at {planned} (ARTIFACTS and RUN_DIR point there" in checked.stdout
    one_line_error(run_genconf("launch", str(copy), "--steps", "1"), f"{copy}: rendered at {planned}")
    assert _runs(planned) == []
    rerendered = run_genconf("render", str(copy / "plan.json"), "-o", str(copy), "--force")  # the message's command
    assert rerendered.returncode == 0, rerendered.stderr
    assert run_genconf("check", str(copy)).stdout.startswith("ok:")


def test_files_that_contradict_the_plan_are_refused_not_ignored(planned, tmp_path):
    # A launch trains plan.json: an edited megatron_args.txt would not take effect.
    edited = copy_artifacts(planned, tmp_path / "edited")
    args = edited / "megatron_args.txt"
    text = args.read_text()
    assert "--micro-batch-size 8\n" in text
    args.write_text(text.replace("--micro-batch-size 8\n", "--micro-batch-size 7\n"))
    out = run_genconf("launch", str(edited), "--steps", "1")
    one_line_error(out, f"{edited} does not check: megatron_args.txt:")
    assert "a local launch trains plan.json, so re-render them from it (genconf render " in out.stderr
    assert _runs(edited) == []


def test_a_resume_of_another_directorys_run_is_refused(planned, tmp_path):
    # The saved run is what trains; a DIR whose plan differs was silently ignored.
    from genconf.plan import runconfig

    other = tmp_path / "other"
    out = run_genconf("--model", TINY_GPT, "--gpus", "2", "--cluster", "dgx-h100", "--framework", "fsdp",
                      "--zero", "3", "-o", str(other))
    assert out.returncode == 0, out.stderr
    run = tmp_path / "run"
    run.mkdir()
    cfg = runconfig.from_artifacts(planned, {})
    (run / "config.json").write_text(json.dumps(cfg.to_dict()))
    one_line_error(run_genconf("launch", str(other), "--run-dir", str(run), "--resume"),
                   f"--resume: {run} is a run of {planned}, whose plan is not {other}'s")


def test_the_plan_file_or_a_run_given_for_the_directory_says_which_to_give(planned, tmp_path):
    one_line_error(run_genconf("launch", str(planned / "plan.json")), f"is the plan file: give its directory, {planned}")
    run = tmp_path / "r1"
    run.mkdir()
    (run / "config.json").write_text("{}")
    (run / "metrics.jsonl").write_text("")
    one_line_error(run_genconf("launch", str(run)), f"{run} is a run directory: give the artifacts directory")
    one_line_error(run_genconf("verify", str(planned)), f"{planned} is an artifacts directory: give one of its runs")


def test_a_local_launch_holds_only_the_configs_to_the_plan_a_submit_the_scripts_too(planned, tmp_path):
    # A local launch runs torchrun, not the sbatch scripts: a copy given --run-dir (the refusal's own advice) was
    # refused over its scripts' old ARTIFACTS, and so was a hand-shortened --time.
    from genconf.cli.commands import _checks_clean
    from genconf.plan.errors import GenconfError

    copy = tmp_path / "copy"
    shutil.copytree(planned, copy)
    _checks_clean(copy, submit=False)
    with pytest.raises(GenconfError, match=r"rendered at .*a submitted job runs these files"):
        _checks_clean(copy, submit=True)


def test_the_re_render_advice_keeps_the_slurm_options_plan_json_does_not(tmp_path):
    from genconf.check.slurm import rerender_command

    d = tmp_path / "opts"
    out = run_genconf("--model", TINY_GPT, "--gpus", "2", "--cluster", "dgx-h100", "--framework", "megatron",
                      "--partition", "gpu", "--time", "48:00:00", "--job-name", "myjob", "--account", "acct",
                      "--run-dir", str(tmp_path / "outruns"), "-o", str(d))
    assert out.returncode == 0, out.stderr
    command = rerender_command(d)
    assert command == (f"genconf render {d / 'plan.json'} -o {d} --force --job-name myjob --account acct --partition "
                       f"gpu --time 48:00:00 --run-dir {tmp_path / 'outruns'}")
    copy = tmp_path / "copy"
    shutil.copytree(d, copy)
    argv = rerender_command(copy).split()[1:]  # what a user pastes: the scripts name the copy, the options kept
    assert run_genconf(*argv).returncode == 0 and run_genconf("check", str(copy)).stdout.startswith("ok:")
    script = (copy / "launch_megatron.sbatch").read_text()
    assert "#SBATCH --time=48:00:00" in script and f"ARTIFACTS={copy}" in script


def test_a_resume_of_a_shrunk_run_from_its_moved_directory_goes_on(planned, tmp_path):
    # The saved plan is the shrunk one: compared with the directory's unshrunk plan, every moved shrunk run was
    # refused as another directory's.
    from genconf.cli.commands import _resumes_this_plan
    from genconf.plan import runconfig

    moved = tmp_path / "moved"
    shutil.copytree(planned, moved)
    saved = runconfig.from_artifacts(planned, {"global_batch": 16, "steps": 2})
    assert saved.plan != runconfig.read_plan(planned).plan
    _resumes_this_plan(saved, moved, tmp_path / "run")


def test_a_one_second_time_limit_passes_its_own_check(tmp_path):
    out = run_genconf("--model", TINY_GPT, "--gpus", "2", "--cluster", "dgx-h100", "--time", "0:1", "-o",
                      str(tmp_path / "short"))
    assert out.returncode == 0, out.stderr
