"""`genconf check` on hand-edited directories: each problem on its file and line, the rule book's message, and what
megatron-core alone would let through."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import copy_artifacts, needs_deepspeed, needs_megatron, one_line_error, plan_of, run_genconf, transformer_config
from genconf.check.megatron import parse_megatron_args


def test_pp2_interleaving_guard(rendered, tmp_path):
    d = rendered["gqa_fp8_pp2vp2"]
    text = (d / "megatron_args.txt").read_text()
    assert "--no-overlap-p2p-communication" not in text.replace("# Never add --no-overlap-p2p-communication", "")
    assert "Megatron-LM issues 750, 1450" in text
    edited = tmp_path / "edited"
    copy_artifacts(d, edited)
    (edited / "megatron_args.txt").write_text(text + "--no-overlap-p2p-communication\n")
    out = run_genconf("check", str(edited))
    line = len(text.splitlines()) + 1
    assert out.returncode == 2
    assert out.stdout.startswith(f"megatron_args.txt:{line}: --no-overlap-p2p-communication: with pp=2")

@needs_megatron
def test_broken_plan_is_caught_by_genconf_not_by_megatron_core(rendered, tmp_path):
    """pp=3 on an 80-layer model with 4 virtual stages: megatron-core's TransformerConfig accepts it; genconf
    check names the line, and genconf never writes such a plan in the first place."""
    edited = tmp_path / "edited"
    copy_artifacts(rendered["olmo70b"], edited)
    path = edited / "megatron_args.txt"
    text = path.read_text().replace("--pipeline-model-parallel-size 4\n", "--pipeline-model-parallel-size 3\n")
    path.write_text(text)
    args, problems = parse_megatron_args(text)
    assert problems == []
    cfg = transformer_config(args)  # megatron-core alone does not catch it
    assert cfg.pipeline_model_parallel_size == 3 and cfg.num_layers == 80
    out = run_genconf("check", str(edited))
    assert out.returncode == 2
    line = text.splitlines().index("--pipeline-model-parallel-size 3") + 1
    assert out.stdout.splitlines() == [f"megatron_args.txt:{line}: --pipeline-model-parallel-size 3: num_layers (80) is "
                                       f"not divisible by pp x vp (3 x 4 = 12); set --pp to a divisor of 80 or an "
                                       f"uneven split (first/last stage layers)"]
    # the same plan pinned on the command line is refused before any file exists
    target = tmp_path / "never"
    out = run_genconf("--model", "70b", "--gpus", "384", "--framework", "megatron", "--tp", "4", "--pp", "3", "--vp", "2",
              "--first-stage-layers", "25", "--last-stage-layers", "25", "-o", str(target))
    one_line_error(out, "pipeline_split: 25 layers on an end stage are not divisible by vp (2)")
    assert not target.exists()

def _edit(src: Path, dst: Path, name: str, old: str, new: str) -> int:
    copy_artifacts(src, dst)
    text = (dst / name).read_text()
    assert old in text, (name, old)
    (dst / name).write_text(text.replace(old, new, 1))
    return text[: text.index(old)].count("\n") + 1

@pytest.mark.parametrize("name,old,new,message", [
    ("megatron_args.txt", "--lr 0.0003", "--lr fast", "--lr fast: expected a number"),
    ("megatron_args.txt", "--seed 1234", "--sead 1234", "unknown flag --sead"),
    ("megatron_args.txt", "--global-batch-size 1056", "--global-batch-size 1000",
     "--global-batch-size 1000: global batch (1000) must be divisible by mbs x dp (1 x 24 = 24)"),
    ("megatron_args.txt", "--tensor-model-parallel-size 4", "--tensor-model-parallel-size 5",
     "--tensor-model-parallel-size 5: tp x pp x cp = 5 x 4 x 1 = 20 does not divide the plan's 384 GPUs"),
    ("megatron_args.txt", "--num-layers 80", "--num-layers 81", "--num-layers 81"),
    # any value launch would not train: it trains plan.json (an edited --lr passed the check before)
    ("megatron_args.txt", "--lr 0.0003", "--lr 0.05", "--lr 0.05: contradicts plan.json (--lr 0.0003)"),
    ("megatron_args.txt", "--log-interval 10", "--use-flash-attn\n--log-interval 10",
     "--use-flash-attn: contradicts plan.json (--use-flash-attn absent)"),
    ("ds_config.json", '"train_batch_size": 1152', '"train_batch_size": 1000',
     "train_batch_size (1000) != train_micro_batch_size_per_gpu x gradient_accumulation_steps x data-parallel size "
     "(1 x 3 x 384 = 1152)"),
    ("ds_config.json", '"stage": 3', '"stage": 1', "zero_optimization.stage 1 contradicts plan.json (zero=3"),
    ("ds_config.json", '"stage": 3,', '"stage": three,', "invalid JSON: Expecting value"),
    ("olmo_fsdp.yaml", "sharding_strategy: FULL_SHARD", "sharding_strategy: FULLSHARD",
     "fsdp.sharding_strategy 'FULLSHARD' is not one of FULL_SHARD|SHARD_GRAD_OP|HYBRID_SHARD|NO_SHARD"),
    ("olmo_fsdp.yaml", "  n_layers: 80", "  n_layers: 80: 1", "invalid YAML: mapping values are not allowed here"),
    # a misspelt key is named where it is (it read "model.n_layers None contradicts plan.json" at `model:`)
    ("olmo_fsdp.yaml", "  n_layers: 80", "  n_layer: 80",
     "model.n_layers is missing (plan.json: 80); model.n_layer is not a key genconf writes"),
    # a nested key DeepSpeed's own DeepSpeedZeroConfig refuses (deepspeed.initialize would)
    ("ds_config.json", '"stage": 3,', '"stage": 3, "overlap_com": true,',
     "zero_optimization.overlap_com: not a key DeepSpeed's DeepSpeedZeroConfig takes"),
    ("launch_megatron.sbatch", "#SBATCH --nodes=96", "#SBATCH --nodes=95",
     "#SBATCH --nodes=95 contradicts the plan: 384 GPUs on 4-GPU nodes needs --nodes=96"),
    ("launch_deepspeed.sbatch", "--nproc-per-node=4", "--nproc-per-node=8",
     "torchrun --nproc-per-node=8 contradicts the plan: 384 GPUs on 4-GPU nodes needs --nproc-per-node=4"),
    ("launch_deepspeed.sbatch", "#SBATCH --time=24:00:00", "#SBATCH --time=tomorrow",
     "#SBATCH --time='tomorrow' is not a Slurm time"),
    ("launch_megatron.sbatch", 'genconf.run.rank_signal "$LAUNCHERS"/train_megatron.py --',
     'genconf.run.rank_signal "$LAUNCHERS"/train_deepspeed.py --',
     "genconf.run.rank_signal passes SIGUSR1 to ranks running $LAUNCHERS/train_deepspeed.py, but torchrun starts "
     "$LAUNCHERS/train_megatron.py: a preemption notice would not reach the ranks"),
])
def test_check_names_the_offending_line(rendered, tmp_path, name, old, new, message):
    line = _edit(rendered["olmo70b"], tmp_path / "edited", name, old, new)
    out = run_genconf("check", str(tmp_path / "edited"))
    assert out.returncode == 2 and out.stderr == ""
    assert any(l.startswith(f"{name}:{line}: ") and message in l for l in out.stdout.splitlines()), out.stdout

def test_check_runs_the_sbatch_script_past_bash_and_its_notice_inside_the_limit(rendered, tmp_path):
    # Hand edits that passed: an unbalanced quote (the script would not run at all) and a time limit shorter than
    # the preemption notice (the notice would come as the job starts; genconf renders a quarter of a short limit).
    _edit(rendered["olmo70b"], tmp_path / "quote", "launch_megatron.sbatch", "RUN_DIR=", 'RUN_DIR="')
    out = run_genconf("check", str(tmp_path / "quote"))
    assert out.returncode == 2 and "launch_megatron.sbatch:" in out.stdout and "bash -n: unexpected EOF" in out.stdout
    _edit(rendered["olmo70b"], tmp_path / "short", "launch_megatron.sbatch", "#SBATCH --time=24:00:00",
          "#SBATCH --time=00:02:00")
    signal = (tmp_path / "short" / "launch_megatron.sbatch").read_text().split("\n").index("#SBATCH --signal=USR1@180")
    out = run_genconf("check", str(tmp_path / "short"))
    assert out.returncode == 2
    assert (f"launch_megatron.sbatch:{signal + 1}: #SBATCH --signal=USR1@180 comes 180 s before a 120 s --time: at the "
            f"job's start; genconf renders @30 for it") in out.stdout.splitlines()


@pytest.mark.parametrize("plan,old,new,message", [
    # the layout places the layers (and an MTP model's m layers): one edited by hand is not what launch trains
    ("pp_layout", "t*3|(t*2|)*3,tL", "t*2|(t*2|)*3,t*2L", "--pipeline-model-parallel-layout Et*2|(t*2|)*34,t*2|(t*2|)*3,"
     "t*2L: contradicts plan.json (--pipeline-model-parallel-layout Et*2|(t*2|)*34,t*3|(t*2|)*3,tL)"),
    # Llama 3's rotary base (a checkpoint trained at 500,000 is wrong at another)
    ("gqa_fp8_pp2vp2", "--rotary-base 500000", "--rotary-base 10001", "--rotary-base 10001: contradicts plan.json"),
])
def test_check_names_a_layout_or_rotary_base_edited_by_hand(rendered, tmp_path, plan, old, new, message):
    line = _edit(rendered[plan], tmp_path / "edited", "megatron_args.txt", old, new)
    out = run_genconf("check", str(tmp_path / "edited"))
    assert out.returncode == 2
    problems = [l for l in out.stdout.splitlines() if l.startswith("megatron_args.txt:")]
    assert len(problems) == 1 and problems[0].startswith(f"megatron_args.txt:{line}: ") and message in problems[0], out.stdout


def test_check_names_an_sbatch_whose_preemption_notice_would_kill_torchrun(rendered, tmp_path):
    """Without genconf.run.rank_signal around torchrun (a hand edit), Slurm's SIGUSR1 reaches a torchrun that does
    not handle it: its default disposition ends it, and the job with it."""
    name = "launch_deepspeed.sbatch"
    _edit(rendered["olmo70b"], tmp_path / "edited", name,
          '"$PYTHON" -m genconf.run.rank_signal "$LAUNCHERS"/train_deepspeed.py -- \\\n'
          '    "$PYTHON" -m torch.distributed.run',
          '"$PYTHON" -m torch.distributed.run')
    text = (tmp_path / "edited" / name).read_text()
    line = text.splitlines().index("#SBATCH --signal=USR1@180") + 1
    out = run_genconf("check", str(tmp_path / "edited"))
    assert out.returncode == 2
    assert (f"{name}:{line}: #SBATCH --signal=USR1 without genconf.run.rank_signal around torchrun (or SIGUSR1 in its "
            f"--signals-to-handle): the notice would kill torchrun") in out.stdout, out.stdout
    # SIGUSR1 handed to torchrun itself (the scripts before the wrapper) is a working, if racy, setup: no problem.
    (tmp_path / "edited" / name).write_text(text.replace("--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT",
                                                         "--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"))
    out = run_genconf("check", str(tmp_path / "edited"))
    assert out.returncode == 0, out.stdout


def test_check_reports_a_broken_plan_json_and_missing_files(rendered, tmp_path):
    copy_artifacts(rendered["olmo70b"], tmp_path / "a")
    run_ = plan_of(tmp_path / "a")
    run_["plan"].update(pp=3, dp=32)  # keeps the 384 GPUs; 80 layers do not split over pp x vp = 3 x 4
    text = json.dumps(run_, indent=2, sort_keys=True)
    (tmp_path / "a" / "plan.json").write_text(text)
    line = next(i for i, l in enumerate(text.splitlines(), 1) if l.startswith('  "plan": {')) + 1
    line += [l.strip() for l in text.splitlines()[line - 1:]].index('"pp": 3,')
    out = run_genconf("check", str(tmp_path / "a"))
    assert out.returncode == 2
    assert f"plan.json:{line}: pipeline_split: num_layers (80) is not divisible by pp x vp (3 x 4 = 12)" in out.stdout
    copy_artifacts(rendered["olmo70b"], tmp_path / "b")
    (tmp_path / "b" / "ds_config.json").unlink()
    out = run_genconf("check", str(tmp_path / "b"))
    assert out.returncode == 2 and out.stdout.strip() == "ds_config.json: missing (re-render with genconf render)"
    one_line_error(run_genconf("check", str(tmp_path / "nowhere")), "is not a directory")


def test_check_holds_the_ep_overlap_to_megatrons_rules(rendered, tmp_path):
    # A rendered --moe-ep-overlap plan checks clean; its flags edited the way megatron refuses at start-up are named.
    d = rendered["moe_ep_overlap"]
    assert run_genconf("check", str(d)).returncode == 0
    text = (d / "megatron_args.txt").read_text()
    # --delay-wgrad-compute without the overlap: megatron-core asserts it.
    _edit(d, tmp_path / "a", "megatron_args.txt", "--overlap-moe-expert-parallel-comm\n", "")
    out = run_genconf("check", str(tmp_path / "a"))
    assert out.returncode == 2
    assert any("--delay-wgrad-compute: needs --overlap-moe-expert-parallel-comm" in l for l in out.stdout.splitlines())
    # With Megatron's local layers: Megatron-LM's arguments.py refuses the deferred weight gradients.
    _edit(d, tmp_path / "b", "megatron_args.txt", "--transformer-impl transformer_engine", "--transformer-impl local")
    out = run_genconf("check", str(tmp_path / "b"))
    assert any("is only supported with --transformer-impl transformer_engine" in l for l in out.stdout.splitlines())
    # The overlap on a pipeline without virtual stages: the rule book's message, on the overlap's line.
    (tmp_path / "c").mkdir()
    copy_artifacts(d, tmp_path / "c" / "d")
    edited = text.replace("--num-virtual-stages-per-pipeline-rank 2\n", "")
    (tmp_path / "c" / "d" / "megatron_args.txt").write_text(edited)
    line = edited.splitlines().index("--overlap-moe-expert-parallel-comm") + 1
    out = run_genconf("check", str(tmp_path / "c" / "d"))
    assert any(l.startswith(f"megatron_args.txt:{line}: --overlap-moe-expert-parallel-comm: --moe-ep-overlap with pp > 1 "
                            f"needs virtual stages") for l in out.stdout.splitlines()), out.stdout


def test_check_holds_the_flex_dispatcher_to_megatrons_rules(rendered, tmp_path):
    # A rendered flex-dispatcher plan checks clean (its arguments read back as the plan) and genconf's own launcher,
    # which dispatches with megatron's all-to-all, refuses it in one line with the way out.
    d = rendered["moe_flex"]
    assert run_genconf("check", str(d)).returncode == 0
    plan = plan_of(d)["plan"]
    assert plan["moe_dispatcher"] == "hybridep"
    out = run_genconf("launch", str(d))
    if __import__("importlib").util.find_spec("torch"):
        one_line_error(out, "--moe-dispatcher hybridep: genconf's megatron launcher dispatches tokens with megatron's "
                            "all-to-all")


@pytest.mark.skipif(not __import__("importlib").util.find_spec("torch"), reason="launch needs the train extra")
def test_genconfs_own_launcher_refuses_the_ep_overlap_in_one_line(rendered):
    # Megatron-LM's pretrain_gpt.py builds the combined 1F1B schedule plan; genconf's runner does not: refused before
    # anything starts, with the way out.
    out = run_genconf("launch", str(rendered["moe_ep_overlap"]))
    one_line_error(out, "--moe-ep-overlap: genconf's megatron launcher does not build megatron-core's combined 1F1B")


def test_check_holds_cuda_graphs_to_megatrons_rules(rendered, tmp_path):
    # A rendered CUDA-graph plan checks clean; a scope megatron-core refuses, or a changed scope, is named on its line.
    d = rendered["moe_cuda_graphs"]
    assert run_genconf("check", str(d)).returncode == 0
    # moe_preprocess without moe_router: megatron-core's assert, as the rule book words it.
    _edit(d, tmp_path / "a", "megatron_args.txt", "--cuda-graph-scope attn moe_router moe_preprocess",
          "--cuda-graph-scope attn moe_preprocess")
    out = run_genconf("check", str(tmp_path / "a"))
    assert out.returncode == 2
    assert any("--cuda-graph-scope attn moe_preprocess: --cuda-graph-scope moe_preprocess needs moe_router" in l
               for l in out.stdout.splitlines()), out.stdout
    # A scope that is not megatron-core's.
    _edit(d, tmp_path / "b", "megatron_args.txt", "--cuda-graph-scope attn moe_router moe_preprocess",
          "--cuda-graph-scope attn everything")
    out = run_genconf("check", str(tmp_path / "b"))
    assert any("--cuda-graph-scope attn everything: expected one of" in l for l in out.stdout.splitlines()), out.stdout
    # A valid scope that is not the plan's: the priced host time no longer holds.
    _edit(d, tmp_path / "c", "megatron_args.txt", "--cuda-graph-scope attn moe_router moe_preprocess",
          "--cuda-graph-scope attn")
    out = run_genconf("check", str(tmp_path / "c"))
    assert any("--cuda-graph-scope attn: contradicts plan.json" in l for l in out.stdout.splitlines()), out.stdout


@pytest.mark.skipif(not __import__("importlib").util.find_spec("torch"), reason="launch needs the train extra")
def test_genconfs_own_launcher_refuses_cuda_graphs_in_one_line(rendered):
    out = run_genconf("launch", str(rendered["moe_cuda_graphs"]))
    one_line_error(out, "--cuda-graph-impl transformer_engine: genconf's megatron launcher runs eagerly")


def test_check_holds_olmos_fused_loss_to_the_plan(rendered, tmp_path):
    """A rendered --fused-loss plan checks clean; its olmo_fsdp.yaml edited to OLMo's F.cross_entropy is named (the
    plan's memory priced the fused loss), and the megatron launcher refuses the flag in one line."""
    assert run_genconf("check", str(rendered["fsdp_fused_loss"])).returncode == 0
    line = _edit(rendered["fsdp_fused_loss"], tmp_path / "edited", "olmo_fsdp.yaml", "fused_loss: true",
                 "fused_loss: false")
    out = run_genconf("check", str(tmp_path / "edited"))
    assert out.returncode == 2
    assert out.stdout.splitlines() == [f"olmo_fsdp.yaml:{line}: fused_loss False contradicts plan.json (True): the "
                                       f"plan's memory prices the fused cross entropy (genconf --fused-loss)"]
    one_line_error(run_genconf("--model", "1b", "--gpus", "8", "--framework", "megatron", "--fused-loss"),
                   "--fused-loss is the DeepSpeed/FSDP model's cross entropy")
    one_line_error(run_genconf("--model", "1b", "--gpus", "8", "--framework", "megatron", "--attention-kernel", "flash2"),
                   "--attention-kernel flash2 describes the DeepSpeed/FSDP model's flash attention")


def test_genconfs_own_runners_refuse_triton_attention_in_one_line(rendered, tmp_path):
    """Triton flash attention (llm-foundry's) is a stack genconf prices but does not run: launch says so first."""
    target = tmp_path / "triton"
    assert run_genconf("--model", "1b", "--gpus", "8", "--framework", "fsdp", "--zero", "3", "--attention-kernel",
                       "triton", "-o", str(target)).returncode == 0
    one_line_error(run_genconf("launch", str(target)), "--attention-kernel triton describes Triton flash attention")


@needs_deepspeed
def test_the_zero_keys_check_allows_are_the_installed_deepspeeds():
    import logging

    from genconf.check.deepspeed import ZERO_CONFIG_KEYS

    logging.disable(logging.WARNING)  # DeepSpeed's accelerator probe on a machine without a GPU
    try:
        from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    finally:
        logging.disable(logging.NOTSET)
    fields = DeepSpeedZeroConfig.model_fields
    assert DeepSpeedZeroConfig.model_config["extra"] == "forbid"
    assert ZERO_CONFIG_KEYS == set(fields) | {f.alias for f in fields.values() if f.alias}

