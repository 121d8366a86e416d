"""Hand launches and silent drops: launch_env.sh sets what the sbatch scripts set (sourced by bash, per framework),
the README lists every difference from the plan in one table and the hand-launch environment, an MoE plan gets no
OLMo config (and says why), and `genconf check` holds launch_env.sh and a stray olmo_fsdp.yaml to the plan."""

from __future__ import annotations

import subprocess

from conftest import copy_artifacts, plan_of
from genconf.check.directory import check_dir
from genconf.render.fidelity import OLMO_NO_EXPERTS


def sourced_env(d, *args: str) -> tuple[int, dict[str, str]]:
    """(status, the variables launch_env.sh exports) when bash sources it with `args`."""
    # as from an interactive shell: no positional parameters of its own (`.` without arguments passes the caller's)
    script = f'd="$1"; set --; . "$d"/launch_env.sh {" ".join(args)}; status=$?; env -0; exit $status'
    out = subprocess.run(["bash", "-c", script, "bash", str(d)], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    env = dict(item.split("=", 1) for item in out.stdout.split("\0") if "=" in item)
    return out.returncode, env


def test_launch_env_exports_what_the_sbatch_scripts_export(rendered):
    d = rendered["olmo70b"]  # megatron tp=4 on kempner-h100
    status, env = sourced_env(d)
    assert status == 0 and env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    sbatch = (d / "launch_megatron.sbatch").read_text()
    for name, value in plan_of(d)["cluster"]["nccl_env"].items():
        assert env[name] == value and f"export {name}=" in sbatch
    assert env["GENCONF_JOB_NAME"] == "genconf-olmo-70b"
    # DeepSpeed and FSDP runs do not want one hardware queue: launch_deepspeed.sbatch does not set it either
    status, env = sourced_env(d, "deepspeed")
    assert status == 0 and "CUDA_DEVICE_MAX_CONNECTIONS" not in env and env["NCCL_IB_HCA"] == "mlx5"
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in (d / "launch_deepspeed.sbatch").read_text()
    status, env = sourced_env(d, "jax")
    assert status == 2 and "NCCL_IB_HCA" not in env


def test_launch_env_without_tp_or_cp_sets_no_max_connections(rendered):
    d = rendered["ddp1b"]  # FSDP NO_SHARD: its Megatron equivalent has tp=1, cp=1
    status, env = sourced_env(d, "megatron")
    assert status == 0 and "CUDA_DEVICE_MAX_CONNECTIONS" not in env


def test_readme_has_the_hand_launch_environment_and_command(rendered):
    readme = (rendered["olmo70b"] / "README.md").read_text()
    assert "### By hand" in readme and "| `CUDA_DEVICE_MAX_CONNECTIONS` | `1` |" in readme
    assert "| `NCCL_IB_HCA` | `mlx5` |" in readme and "launch_env.sh megatron" in readme
    assert "--nnodes=96 --nproc-per-node=4" in readme and "train_megatron.py --artifacts" in readme


def test_the_readme_tables_every_difference(rendered):
    readme = (rendered["olmo70b"] / "README.md").read_text()
    section = readme.split("## What differs from the plan")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    files = {row.split("`")[1] for row in rows}
    # Megatron's own file differs in the model only (OLMo's bias-free LayerNorm, full-width q/k norms); DeepSpeed
    # and FSDP rewrite the layout and round the batch
    assert files == {"megatron_args.txt", "ds_config.json", "olmo_fsdp.yaml"}
    assert any("| parallelism | tp=4 pp=4 vp=4 dp=24 | dp=384 |" in row for row in rows)
    exact = (rendered["ddp1b"] / "README.md").read_text()
    assert "| `olmo_fsdp.yaml` | OLMo trainer config" in exact and "the plan exactly |" in exact


def test_an_moe_plan_writes_no_olmo_config_and_says_why(rendered):
    d = rendered["moe_ep_cp"]
    assert not (d / "olmo_fsdp.yaml").exists() and not (d / "launch_fsdp.sbatch").exists()
    readme = (d / "README.md").read_text()
    assert "| `olmo_fsdp.yaml` | experts | 8 experts, top-2" in readme and "| not written |" in readme
    assert OLMO_NO_EXPERTS in readme and "| `ds_config.json` | experts |" in readme
    assert check_dir(d).problems == ()


def test_check_flags_a_stray_olmo_config_and_a_wrong_launch_env(rendered, tmp_path):
    moe = tmp_path / "moe"
    copy_artifacts(rendered["moe_ep_cp"], moe)
    (moe / "olmo_fsdp.yaml").write_text("model: {d_model: 4096}\n")
    problems = [str(p) for p in check_dir(moe).problems]
    assert len(problems) == 1 and "olmo_fsdp.yaml" in problems[0] and "dense model" in problems[0]
    d = tmp_path / "o70"
    copy_artifacts(rendered["olmo70b"], d)
    text = (d / "launch_env.sh").read_text()
    (d / "launch_env.sh").write_text(text.replace("export CUDA_DEVICE_MAX_CONNECTIONS=1", "true")
                                     .replace("export NCCL_IB_HCA=mlx5", "export NCCL_IB_HCA=mlx4"))
    problems = [str(p) for p in check_dir(d).problems]
    assert any("NCCL_IB_HCA=mlx4 contradicts cluster kempner-h100" in p for p in problems), problems
    assert any("needs CUDA_DEVICE_MAX_CONNECTIONS=1" in p for p in problems), problems
    (d / "launch_env.sh").unlink()
    assert any(p.startswith("launch_env.sh") and "missing" in p for p in map(str, check_dir(d).problems))
