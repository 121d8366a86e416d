"""Every artifact from one plan: every file is rendered and passes its own check; plan.json is what --json prints and
re-renders the same files; the sbatch --nodes, torchrun's --nnodes, DeepSpeed's and Megatron's batch all come from
the plan."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import PLANS, REPO, genconf_quiet, plan_of, report_plan, run_genconf
from genconf.check.directory import check_dir
from genconf.check.megatron import parse_megatron_args
from genconf.plan.planfile import decode
from genconf.render.files import artifact_names


def test_every_plan_renders_every_file_and_passes_its_own_check(rendered):
    for name, d in rendered.items():
        plan = plan_of(d)
        files = sorted(p.name for p in d.iterdir() if p.is_file())
        want = sorted(artifact_names(report_plan(plan), decode(plan).model))
        assert files == want, name
        result = check_dir(d)
        assert result.problems == (), (name, [str(p) for p in result.problems])
        assert ("launch_fsdp.sbatch" in files) == (plan["plan"]["framework"] == "fsdp")
        assert "launch_env.sh" in files and ("olmo_fsdp.yaml" in files) == (plan["model"]["num_experts"] == 0)
        assert (d / "runs" / "logs").is_dir()

def test_plan_json_is_what_json_prints_and_rerenders_identically(rendered, tmp_path):
    d = rendered["olmo70b"]
    printed = run_genconf(*PLANS["olmo70b"], "--json")
    assert printed.returncode == 0
    assert (d / "plan.json").read_text() == printed.stdout
    out = run_genconf("render", str(d / "plan.json"), "-o", str(tmp_path / "again"))
    assert out.returncode == 0, out.stderr
    for name in ("plan.json", "ds_config.json", "megatron_args.txt", "olmo_fsdp.yaml"):
        assert (tmp_path / "again" / name).read_text() == (d / name).read_text(), name
    assert run_genconf("check", str(tmp_path / "again")).stdout.strip() == "ok: 7 files"

def test_render_of_plan_json_writes_what_dash_o_wrote(rendered, tmp_path):
    # Every file, README included: the README's memory rows beyond the five terms came in the estimate's order from
    # -o DIR and in plan.json's sorted order from `genconf render`, so an FP8 plan's two READMEs differed (TE's
    # column-wise weight copies are estimated before the logits, and sort after them).
    from genconf.plan.memory import estimate

    fp8 = tmp_path / "fp8"
    assert genconf_quiet("--model", "llama3-8b", "--gpus", "16", "--cluster", "dgx-h100", "--framework", "megatron",
                         "--tp", "2", "--pp", "1", "--precision", "fp8", "-o", str(fp8)) == 0
    pf = decode(plan_of(fp8))
    rows = [name for name, _ in estimate(pf.model, pf.plan, pf.cluster).peak.other]
    assert len(rows) > 1 and rows != sorted(rows)  # a plan whose rows the order changes
    for name, d in {**rendered, "fp8": fp8}.items():
        again = tmp_path / "again" / name
        assert genconf_quiet("render", str(d / "plan.json"), "-o", str(again)) == 0, name
        files = sorted(p.name for p in d.iterdir() if p.is_file())
        assert sorted(p.name for p in again.iterdir() if p.is_file()) == files, name
        for f in files:
            assert (again / f).read_text().replace(str(again), "DIR") == (d / f).read_text().replace(str(d), "DIR"), \
                (name, f)


def test_one_plan_drives_nodes_batches_and_degrees(rendered):
    d = rendered["olmo70b"]
    p = plan_of(d)["plan"]
    assert (p["tp"], p["pp"], p["vp"], p["dp"]) == (4, 4, 4, 24)
    args, problems = parse_megatron_args((d / "megatron_args.txt").read_text())
    assert not problems
    assert args["--global-batch-size"].value == p["gbs"] and args["--micro-batch-size"].value == p["mbs"]
    for name in ("launch_megatron.sbatch", "launch_deepspeed.sbatch"):
        text = (d / name).read_text()
        assert "#SBATCH --nodes=96\n" in text and "#SBATCH --gpus-per-node=4\n" in text
        assert "--nnodes=96 --nproc-per-node=4" in text and "#SBATCH --ntasks-per-node=1\n" in text
        assert 'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"' in text
        assert "export NCCL_IB_HCA=mlx5" in text
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in (d / "launch_megatron.sbatch").read_text()
    ds = json.loads((d / "ds_config.json").read_text())
    # 1056 is not a multiple of mbs x 384; the DeepSpeed equivalent takes the nearest multiple and says so
    readme = (d / "README.md").read_text()
    assert ds["train_batch_size"] == 1152 and "| `ds_config.json` | global batch | 1056 sequences | 1152 sequences |" in readme
    readme = (d / "README.md").read_text()
    for text in ("## Why this plan", "## Memory per GPU", "| pipeline stage |", "sbatch ", "genconf check",
                 "one `--flag value` per line | the plan's layout exactly; the model as the format allows",
                 "| `megatron_args.txt` | norm | LayerNorm without bias | LayerNorm with weight and bias |"):
        assert text in readme

def test_configs_is_pure():
    out = subprocess.run([sys.executable, "-c", "import sys, genconf.render.megatron, genconf.render.deepspeed, "
                          "genconf.render.slurm; "
                          "print(sorted(m for m in sys.modules if m.split('.')[0] in "
                          "('jinja2', 'yaml', 'torch', 'subprocess', 'deepspeed', 'megatron')))"],
                         capture_output=True, text=True, cwd=REPO)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_readme_gives_the_training_time_as_the_plan_text_does(tmp_path):
    # A short run's README read '2 steps, 0.0 days, 0 GPU-hours' (the plan's text: '1.71 s, 0.0038 GPU-hours'), a long
    # one '491495 steps, 1528.73 days'.
    out = run_genconf("--model", "1b", "--gpus", "8", "--cluster", "dgx-h100", "--tokens", "1e6", "-o",
                      str(tmp_path / "short"))
    assert out.returncode == 0, out.stderr
    text = next(x for x in out.stdout.splitlines() if x.strip().startswith("train "))
    row = next(x for x in (tmp_path / "short" / "README.md").read_text().splitlines() if x.startswith("| training |"))
    assert row.endswith(f" steps, {text.split('tokens', 1)[1].strip()} |") and "days" not in row
