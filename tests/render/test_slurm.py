"""The launch scripts are safe shell: shellcheck passes on every one, and names and paths built to inject commands
reach the job as data and run nothing."""

from __future__ import annotations

import os
import stat
import subprocess

from conftest import injection_dir, shellcheck_or_skip
from genconf.check.directory import check_dir
from genconf.render.slurm import sbatch_job_name


def test_shellcheck_passes_on_generated_scripts(rendered):
    shellcheck = shellcheck_or_skip()
    scripts = sorted(str(p) for d in rendered.values() for p in d.glob("*.sbatch"))
    assert len(scripts) >= len(rendered) + 1  # launch_megatron.sbatch in each; launch_deepspeed.sbatch for dense plans
    out = subprocess.run([shellcheck, "--shell=bash", "--severity=style", *scripts], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:]

def test_injection_through_names_and_paths_runs_nothing(tmp_path):
    out, run_dir, job = injection_dir(tmp_path)
    scripts = sorted(out.glob("*.sbatch"))
    assert [p.name for p in scripts] == ["launch_deepspeed.sbatch", "launch_fsdp.sbatch", "launch_megatron.sbatch"]
    shellcheck = shellcheck_or_skip()
    lint = subprocess.run([shellcheck, *map(str, scripts)], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout
    # Run each script as Slurm would, with scontrol and srun stubbed: srun records what it was given.
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    record = tmp_path / "srun.args"
    (stubs / "scontrol").write_text("#!/bin/sh\necho n1\n")
    (stubs / "srun").write_text('#!/bin/bash\nprintf "%s\\n" "$GENCONF_JOB_NAME" "$@" > "$SRUN_RECORD"\n')
    for stub in stubs.iterdir():
        stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    env = dict(os.environ, PATH=f"{stubs}:{os.environ['PATH']}", SLURM_JOB_NODELIST="n[1-2]", SLURM_JOB_ID="7",
               SRUN_RECORD=str(record))
    for script in scripts:
        done = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        argv = record.read_text().splitlines()
        assert argv[0] == job  # the name reaches the job verbatim, as data
        assert argv[argv.index("--run-dir") + 1] == str(run_dir)
        assert (run_dir / "logs").is_dir()
    created = [p for p in tmp_path.rglob("pwned*")]
    assert created == [], created
    text = (out / "launch_megatron.sbatch").read_text()
    assert f"#SBATCH --job-name={sbatch_job_name(job)}\n" in text and '"' not in sbatch_job_name(job)
    assert check_dir(out).problems == ()


def test_launch_scripts_set_expandable_segments(rendered):
    script = (rendered["olmo70b"] / "launch_megatron.sbatch").read_text()
    assert 'export PYTORCH_CUDA_ALLOC_CONF="${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}"' in script
