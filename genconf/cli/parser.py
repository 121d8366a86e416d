"""The command line's parser: every subcommand and flag (tests/cli freezes the plan flags)."""

from __future__ import annotations

import argparse

from genconf import __version__
from genconf.plan import limits
from genconf.plan.errors import GenconfError
from genconf.plan.precision import PLAN_PRECISIONS, PRECISION_NAMES
from genconf.plan.specs import ATTENTION_KERNELS, CUDA_GRAPH_IMPLS, CUDA_GRAPH_SCOPES, MOE_DISPATCHERS

SUBCOMMANDS = ("plan", "models", "hardware", "render", "check", "launch", "verify", "recipe", "ci", "calibrate")


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag as one line (GenconfError) instead of usage + exit."""

    def error(self, message: str) -> None:  # noqa: D401 - argparse API
        raise GenconfError(message)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {value}")
    return value


def non_empty(text: str) -> str:
    """A path or name flag's value: an empty one (-o "", an unset shell variable) was silently the default, or the
    current directory."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty: give a value, or leave the option out")
    return text


def tp_splits(text: str) -> str:
    """calibrate --tp: comma-separated positive TP degrees ('1,2,4,8'), checked before the bench starts."""
    parts = [t.strip() for t in text.split(",")]
    if not all(t.isdigit() and int(t) >= 1 for t in parts):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers such as 1,2,4,8, got {text!r}")
    return ",".join(parts)


def check_ranges(args: argparse.Namespace) -> None:
    """Every numeric flag against its documented range (genconf.plan.limits), before anything is searched or
    started: the first one out of range is one line."""
    for flag in limits.FLAGS:
        value = getattr(args, flag[2:].replace("-", "_"), None)
        if isinstance(value, str):
            continue  # another subcommand's flag of the same name (calibrate --tp 1,2,4,8), not a number
        line = limits.check_flag(flag, value)
        if line:
            raise GenconfError(line)


def token_count(text: str) -> float:
    """'2e12', '1.4T', '300B' -> tokens."""
    scale = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
    t = text.strip().lower()
    try:
        return float(t[:-1]) * scale[t[-1]] if t and t[-1] in scale else float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a token count like 2e12 or 1.4T, got {text!r}") from None


def add_plan_arguments(p: argparse.ArgumentParser) -> None:
    """The flags that describe a run; shared by `plan` and the commands that plan first."""
    g = p.add_argument_group("model and cluster")
    g.add_argument("--model", "-m", default="70b", help="catalog name, size alias (1b, 7b, 70b), the Hugging Face id of a catalog model "
                   "(meta-llama/Llama-3.1-70B), a YAML file or a Hugging Face config.json (default: 70b)")
    g.add_argument("--gpus", "-n", type=positive_int, help="number of GPUs (default: the cluster's total)")
    g.add_argument("--cluster", type=non_empty, help="cluster preset or YAML file (default: kempner-h100, the seed's cluster)")
    g.add_argument("--gpu", type=non_empty, help="override the cluster's GPU (see 'genconf hardware')")
    g.add_argument("--gpus-per-node", type=positive_int, help="override GPUs per node")
    g.add_argument("--calibration", metavar="FILE", type=non_empty, help="plan with the cost-model terms of a calibration file "
                   "(written by 'genconf calibrate') over the GPU's built-in ones")
    g = p.add_argument_group("pinned choices (evaluate exactly these; the rest is searched)")
    g.add_argument("--framework", choices=("megatron", "deepspeed", "fsdp"))
    for flag, text in (("--tp", "tensor parallel"), ("--pp", "pipeline stages"), ("--vp", "virtual stages per pipeline rank"),
                       ("--cp", "context parallel"), ("--ep", "expert parallel"), ("--mbs", "micro-batch size"),
                       ("--global-batch", "global batch in sequences"), ("--seq-len", "sequence length"),
                       ("--packed-doc-len", "fine-tuning on packed sequences: the mean length in tokens of the "
                                            "documents packed into each (each attends only within itself)"),
                       ("--first-stage-layers", "layers on the first pipeline stage"),
                       ("--last-stage-layers", "layers on the last pipeline stage"),
                       ("--etp", "expert tensor parallel (MoE; default: tried as tp and as 1)"),
                       ("--recompute-layers", "with --recompute full: layers per model chunk recomputed "
                                              "(megatron --recompute-method block)"),
                       ("--offload-activations", "layers whose activations Transformer Engine offloads to the host")):
        g.add_argument(flag, type=positive_int, help=text)
    g.add_argument("--pp-layout", metavar="LAYOUT",
                   help="megatron pipeline layout: 'default' (megatron's own split only) or a layout string such as "
                        "'Et*2|(t*2|)*34,t*3|(t*2|)*3,tL' (E embedding, t layer, L loss, | between virtual stages; "
                        "vp = stages / pp). Default: megatron's split, or one moving layers off the slowest rank "
                        "where that is faster")
    g.add_argument("--zero", type=int, choices=(0, 1, 2, 3), help="ZeRO stage (megatron: 1 = distributed optimizer; "
                   "fsdp: 0 NO_SHARD, 2 SHARD_GRAD_OP, 3 FULL_SHARD)")
    g.add_argument("--megatron-fsdp", action="store_true",
                   help="also search Megatron-FSDP (megatron --zero 3) beside the distributed optimizer (default: only "
                        "where no other megatron plan fits, or with --zero 2/3)")
    g.add_argument("--recompute", choices=("none", "selective", "full"))
    g.add_argument("--recompute-modules", metavar="M[,M...]", type=non_empty,
                   help="with selective recompute: the modules repeated (megatron --recompute-modules): core_attn, "
                        "mla_up_proj, moe_act, layernorm, mlp (default core_attn); implies --recompute selective")
    g.add_argument("--precision", choices=PRECISION_NAMES, default="bf16",
                   help="bf16 | fp16 | fp32 (Megatron verification: TP reproduces TP=1 exactly) | fp8 (= fp8-current) "
                        "| fp8-delayed | fp8-current | fp8-blockwise | mxfp8 (Blackwell) | nvfp4 (Blackwell; = fp4)")
    for flag, end in (("--bf16-first-layers", "first"), ("--bf16-last-layers", "last")):
        g.add_argument(flag, type=non_negative_int, metavar="N",
                       help=f"under FP8/FP4: the {end} N layers run in BF16 (megatron --first-last-layers-bf16 "
                            f"--num-layers-at-{'start' if end == 'first' else 'end'}-in-bf16; default: the recipe's, "
                            f"fp8-current 1 at each end, the others 0)")
    g.add_argument("--grad-dtype", choices=("fp32", "bf16"),
                   help="gradient accumulation/reduction dtype (default: the framework's; fp32 for megatron)")
    g.add_argument("--fp8-param-gather", action=argparse.BooleanOptionalAction, default=None,
                   help="keep weights in FP8/FP4 and all-gather them so (default: on for megatron FP8 with zero >= 1)")
    g.add_argument("--precision-aware-optimizer", action=argparse.BooleanOptionalAction, default=None,
                   help="megatron TE FusedAdam with 16-bit master remainders (default: only where it makes a plan fit)")
    g.add_argument("--adam-moments-dtype", choices=("fp32", "bf16"), default="fp32",
                   help="Adam's two moments in bf16 (megatron's precision-aware optimizer, as Megatron-Bridge's "
                        "DeepSeek-V3 recipes): 4 bytes per parameter less at rest (the step upcasts them); changes "
                        "the numerics (default fp32)")
    g.add_argument("--layer-spec", choices=("te", "local"), default="te",
                   help="te: Transformer Engine + flash attention (GPU clusters); local: megatron-core unfused (CPU)")
    g.add_argument("--offload", action="store_true", help="DeepSpeed ZeRO CPU offload of optimizer (and params at stage 3)")
    g.add_argument("--tp-comm-overlap", action=argparse.BooleanOptionalAction, default=None,
                   help="overlap TP communication with GEMMs (TE userbuffers; default: on for megatron te with tp > 1)")
    g.add_argument("--moe-ep-overlap", action="store_true",
                   help="MoE: hide the expert-parallel all-to-all behind another micro-batch's compute (megatron "
                        "--overlap-moe-expert-parallel-comm; needs --ep > 1, TE layers, no full recompute, --vp with --pp)")
    g.add_argument("--moe-dispatcher", choices=MOE_DISPATCHERS, default="alltoall",
                   help="MoE token dispatcher: alltoall (megatron's default with --ep) or its flex dispatcher with "
                        "deepep or hybridep (a token crosses the NICs once per destination node; hybridep is the "
                        "backend for multi-node NVLink such as GB200 NVL72); needs DeepEP/HybridEP on the cluster")
    g.add_argument("--cuda-graph-impl", choices=CUDA_GRAPH_IMPLS, default="none",
                   help="megatron CUDA graphs: transformer_engine (parts of each layer, --cuda-graph-scope) or local "
                        "(whole layers, or the whole step with --cuda-graph-scope full_iteration); replayed kernels "
                        "launch without the host")
    g.add_argument("--cuda-graph-scope", nargs="+", choices=CUDA_GRAPH_SCOPES, default=(), metavar="SCOPE",
                   help=f"what the graphs capture ({', '.join(CUDA_GRAPH_SCOPES)}; none given: whole layers)")
    g.add_argument("--fused-kernels", action="store_true",
                   help="local spec: megatron's fused softmax/bias kernels were built (apex or TE installed)")
    g.add_argument("--no-gradient-accumulation-fusion", dest="grad_accum_fusion", action="store_false",
                   help="megatron: add each micro-batch's weight gradients into main_grad in a pass of their own "
                        "(Megatron-LM's flag; by default they accumulate inside the weight-gradient GEMMs)")
    g.add_argument("--attention-kernel", choices=ATTENTION_KERNELS, default="auto",
                   help="DeepSpeed/FSDP: the flash-attention kernel the model runs: cudnn (SDPA's cuDNN backend, "
                        "FlashAttention-3's class), flash2 (FlashAttention-2), triton (Triton flash attention, "
                        "llm-foundry's), math (SDPA's unfused fp32 math backend, a CPU's); auto: genconf's runners' "
                        "SDPA choice")
    g.add_argument("--fused-loss", action=argparse.BooleanOptionalAction, default=None,
                   help="DeepSpeed/FSDP: cross entropy fused over the 16-bit logits (flash-attn's kernel, OLMo's "
                        "fused_loss), no fp32 copy of the logits (default: off, or on where it makes a plan fit)")
    g.add_argument("--lora-rank", type=positive_int, default=0, metavar="R",
                   help="plan LoRA fine-tuning: rank-R adapters on linear_qkv/proj/fc1/fc2, base weights frozen (no "
                        "weight gradients or optimizer states for them), priced as Megatron-Bridge's PEFT runs it "
                        "(megatron, dense models; sizing only: no artifacts). Its default rank is 32")
    g.add_argument("--lora-targets", metavar="NAMES", default=None,
                   help="with --lora-rank: the linear layers that get adapters, comma-separated from linear_qkv, "
                        "linear_proj, linear_fc1, linear_fc2 (default: all four, Megatron-Bridge's and NeMo 2's "
                        "default; NeMo 1.x adapted linear_qkv only)")
    g.add_argument("--expandable-segments", action=argparse.BooleanOptionalAction, default=True,
                   help="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in launch scripts (default) or the classic "
                        "caching allocator (budgets more fragmentation)")
    g = p.add_argument_group("output")
    g.add_argument("--tokens", type=token_count, help="training tokens for the time estimate (default: 20 per parameter)")
    g.add_argument("--top", type=positive_int, default=3, help="show this many ranked plans (default 3)")
    g.add_argument("--explain", action="store_true", help="counts of rejected candidates per rule and the nearest misses")
    g.add_argument("--json", action="store_true", help="print one JSON object")
    g.add_argument("--plot", metavar="DIR", type=non_empty, help="draw memory.png (per pipeline stage) and schedule.png (the pipeline "
                   "schedule), with their numbers in CSV, into DIR (needs the plot extra)")
    add_artifact_arguments(p)


def add_artifact_arguments(p: argparse.ArgumentParser, *, output_required: bool = False) -> None:
    """Where and how the plan's artifacts are written (plan -o DIR, render PLAN.json -o DIR)."""
    g = p.add_argument_group("artifacts (DeepSpeed, Megatron, OLMo-FSDP and Slurm files from the plan)")
    g.add_argument("-o", "--output", metavar="DIR", type=non_empty, required=output_required,
                   help="write plan.json, ds_config.json, megatron_args.txt, olmo_fsdp.yaml, launch_*.sbatch and "
                        "README.md to DIR (atomically)")
    g.add_argument("--force", action="store_true",
                   help="replace an existing DIR (directories in it, such as runs/, are kept)")
    g.add_argument("--account", help="Slurm account (#SBATCH --account)")
    g.add_argument("--partition", help="Slurm partition (#SBATCH --partition)")
    # No argparse default: plan and recipe refuse a --time given without -o, as its siblings (the default is
    # render.slurm.SlurmOptions's, applied by artifacts_dir.default_options).
    g.add_argument("--time", type=non_empty, help="Slurm time limit (default 24:00:00)")
    g.add_argument("--job-name", type=non_empty, help="Slurm job name (default genconf-<model>)")
    g.add_argument("--run-dir", type=non_empty, help="run directory for logs and checkpoints (default DIR/runs)")
    g.add_argument("--python", type=non_empty, help="interpreter that starts torchrun on the nodes (default: this one)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="genconf", description="Plan, render, launch and verify LLM training runs.")
    parser.add_argument("--version", action="version", version=f"genconf {__version__}")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    plan = sub.add_parser("plan", help="plan a run (the default command)")
    add_plan_arguments(plan)
    models = sub.add_parser("models", help="list the model catalog, or import a Hugging Face config.json",
                            description="arch column: activation/norm/positions, then /moe<experts>x<top-k> for "
                            "mixture-of-experts models, with :1in<n> where one layer in n is MoE and the others "
                            "dense (moe_layer_interval) or :first<k>dense where the first k layers are dense "
                            "(first_k_dense_replace), and /window<tokens>[:<windowed>/<layers>] for sliding windows")
    models.add_argument("--json", action="store_true")
    models.add_argument("--from-hf", metavar="FILE", type=non_empty, help="write the catalog YAML of a Hugging Face config.json "
                        "(or a directory holding one) to stdout, or to -o")
    models.add_argument("-o", "--output", metavar="OUT.yaml", type=non_empty, help="with --from-hf: write here; the model is named "
                        "after the file, so it can go into models/")
    models.add_argument("--name", type=non_empty, help="with --from-hf: the model's name (default: the -o file's or the folder's)")
    models.add_argument("--force", action="store_true", help="with --from-hf -o: replace an existing file")
    hardware = sub.add_parser("hardware", help="list GPUs and cluster presets")
    hardware.add_argument("--json", action="store_true")
    _add_shell_commands(sub)
    return parser


def _add_shell_commands(sub: argparse._SubParsersAction) -> None:
    """render, check, launch, verify, recipe, ci."""

    render = sub.add_parser("render", help="write a plan.json's artifacts (configs, Slurm scripts) to a directory")
    render.add_argument("plan", metavar="PLAN.json", type=non_empty, help="a plan as `genconf --json` prints it")
    add_artifact_arguments(render, output_required=True)
    check = sub.add_parser("check", help="re-validate an artifacts directory and name the offending lines")
    check.add_argument("dir", metavar="DIR", type=non_empty, help="a directory written by genconf -o or genconf render")
    check.add_argument("--slurm", action="store_true", help="also ask Slurm (sbatch --test-only) about each script")

    launch = sub.add_parser("launch", help="train the plan in an artifacts directory (torchrun, or Slurm with --submit)")
    launch.add_argument("dir", metavar="DIR", type=non_empty, help="a directory written by genconf -o")
    launch.add_argument("--run-dir", type=non_empty, help="where metrics, checkpoints and logs go (default: DIR/runs/<name>)")
    launch.add_argument("--name", type=non_empty, help="run name under DIR/runs (default: a timestamp)")
    launch.add_argument("--framework", choices=("megatron", "deepspeed", "fsdp"),
                        help="the plan's own framework (the default), the only one launched: the other "
                             "frameworks' files approximate the plan (its README's 'what differs'); re-plan with "
                             "--framework to launch another exactly")
    launch.add_argument("--submit", action="store_true", help="submit the generated sbatch script instead")
    launch.add_argument("--wait", action="store_true", help="with --submit: wait for the job and report its end")
    launch.add_argument("--resume", action="store_true",
                        help="continue the run in --run-dir from its newest verified checkpoint; with --steps N, "
                             "extend (or shorten) it to N steps; other flags must agree with the saved run")
    launch.add_argument("--force", action="store_true", help="on a CPU: start even when a step is expected to take "
                        "more than 10 minutes")
    g = launch.add_argument_group("smoke test: shrink the model, keep the parallel layout")
    for flag, text in (("--layers", "transformer layers"), ("--hidden", "hidden size (MLP scaled alike)"),
                       ("--heads", "attention heads"), ("--vocab", "vocabulary size"), ("--seq-len", "sequence length"),
                       ("--global-batch", "global batch in sequences"), ("--mbs", "micro-batch size"),
                       ("--steps", "optimizer steps")):
        g.add_argument(flag, type=positive_int, help=text)
    g.add_argument("--checkpoint-every", type=non_negative_int,
                   help="save a checkpoint every N steps and after the last (0: no checkpoints)")
    g.add_argument("--keep-checkpoints", type=positive_int,
                   help="keep the newest N checkpoints on disk (default 2); older ones are deleted")
    g.add_argument("--precision", choices=PLAN_PRECISIONS, help="run with another precision recipe")
    g.add_argument("--lr", type=float, help="peak learning rate (smoke tests of tiny models want ~1e-2)")
    g.add_argument("--data", type=non_empty, help="a tokenized binary file (uint16 tokens; uint32 with --data-dtype)")
    g.add_argument("--data-dtype", choices=("uint16", "uint32"), help="with --data: its token dtype (default uint16)")
    g = launch.add_argument_group("speed on a GPU (FSDP and DeepSpeed runners; genconf.train.speed)")
    g.add_argument("--attention", choices=("auto", "flash", "cudnn", "efficient", "math"), default="auto",
                   help="scaled_dot_product_attention backend (default auto: torch picks flash/cuDNN on a GPU)")
    g.add_argument("--compile", action="store_true", help="torch.compile each decoder block (DDP and ZeRO 0-2)")
    g.add_argument("--no-fused-optimizer", action="store_true", help="plain torch AdamW instead of the fused one")

    verify = sub.add_parser("verify", help="compare a run's loss, speed and memory with its expectations")
    verify.add_argument("run", metavar="RUN", type=non_empty, help="a run directory (with metrics.jsonl)")
    verify.add_argument("--golden", type=non_empty, help="golden loss file: 'step loss' per line")
    verify.add_argument("--tolerance", type=float, help="absolute loss tolerance against the golden file (default 1e-4)")
    verify.add_argument("--min-drop", type=float, help="without a golden file: also require the loss to fall by this "
                        "fraction (default: the statistical trend rule alone)")
    verify.add_argument("--json", action="store_true")
    verify.add_argument("--plot", metavar="DIR", type=non_empty, help="draw verify.png (loss against the golden curve, tokens/s and peak "
                        "memory per step against the prediction) with its numbers in verify.csv (needs the plot extra)")

    recipe = sub.add_parser("recipe", help="plan (and with -o render) a recipe from recipes/")
    recipe.add_argument("name", metavar="NAME", nargs="?", type=non_empty, help="recipe name (omit to list them)")
    recipe.add_argument("--smoke", action="store_true", help="the recipe's CPU smoke variant instead of the full run")
    recipe.add_argument("--json", action="store_true")
    recipe.add_argument("--top", type=positive_int, default=3)
    add_artifact_arguments(recipe, output_required=False)

    ci = sub.add_parser("ci", help="run the recipes' smoke variants and verify them against their golden files")
    ci.add_argument("names", metavar="NAME", nargs="*", type=non_empty, help="recipes to run (default: every recipe with a smoke variant)")
    ci.add_argument("--update-golden", metavar="NAME", type=non_empty, help="rewrite NAME's golden file from a fresh run (shows the diff)")
    ci.add_argument("--work-dir", type=non_empty, help="where the artifacts and runs go (default: a new temporary directory)")
    ci.add_argument("--recipes-dir", type=non_empty, help="run the recipes of another folder (default: genconf's recipes/)")
    ci.add_argument("--plot", metavar="DIR", type=non_empty, help="draw each recipe's memory.png and schedule.png (its full-size plan) "
                    "and verify.png (its smoke run against the golden curve) into DIR/<recipe>/ (needs the plot extra)")
    ci.add_argument("--json", action="store_true")

    cal = sub.add_parser("calibrate", help="fit the cost model's terms to this machine's GPUs (--bench) or to measured runs")
    cal.add_argument("runs", metavar="RUN_DIR", nargs="*", type=non_empty, help="run directories (metrics.jsonl, config.json, versions.json)")
    cal.add_argument("--bench", action="store_true", help="measure GEMMs, attention, bandwidth and collectives here")
    cal.add_argument("--nproc", type=positive_int, help="ranks for --bench (default: every visible GPU, 1 on a CPU)")
    cal.add_argument("--model", type=non_empty, help="--bench: the model whose layer shapes to time (default 1b; on a machine without "
                                     "a CUDA GPU, required: there the bench only tests the plumbing)")
    cal.add_argument("--tokens", type=positive_int, help="--bench: tokens per micro-batch (default 8192; 128 on a CPU)")
    cal.add_argument("--tp", type=tp_splits, help="--bench: TP splits of the shapes, comma-separated (default 1,2,4,8)")
    cal.add_argument("--gpu", type=non_empty, help="the catalog GPU to fit against (default: the device the bench or runs ran on)")
    cal.add_argument("--terms", type=non_empty, help="runs: the terms to refit, comma-separated (default: those the runs inform)")
    cal.add_argument("-o", "--output", type=non_empty, default="calibration.yaml", help="the calibration file (default calibration.yaml)")
    cal.add_argument("--force", action="store_true", help="replace an existing calibration file")
