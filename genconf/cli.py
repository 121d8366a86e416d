"""The `genconf` command. With no subcommand it plans (`genconf plan` is the same).

Bad input is one line on stderr and exit code 2; a plan that cannot fit says why and what would.
"""

from __future__ import annotations

import argparse
import json
import sys

from genconf import __version__
from genconf.errors import GenconfError

SUBCOMMANDS = ("plan", "models", "hardware", "render", "check", "launch", "verify", "recipe", "ci", "calibrate")


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag as one line (GenconfError) instead of usage + exit."""

    def error(self, message: str) -> None:  # noqa: D401 - argparse API
        raise GenconfError(message)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _token_count(text: str) -> float:
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
    g.add_argument("--model", "-m", default="70b", help="catalog name, size alias (1b, 7b, 70b) or YAML file (default: 70b)")
    g.add_argument("--gpus", "-n", type=_positive_int, help="number of GPUs (default: the cluster's total)")
    g.add_argument("--cluster", help="cluster preset or YAML file (default: kempner-h100, the seed's cluster)")
    g.add_argument("--gpu", help="override the cluster's GPU (see 'genconf hardware')")
    g.add_argument("--gpus-per-node", type=_positive_int, help="override GPUs per node")
    g.add_argument("--calibration", metavar="FILE", help="plan with the cost-model terms of a calibration file "
                   "(written by 'genconf calibrate') over the GPU's built-in ones")
    g = p.add_argument_group("pinned choices (evaluate exactly these; the rest is searched)")
    g.add_argument("--framework", choices=("megatron", "deepspeed", "fsdp"))
    for flag, text in (("--tp", "tensor parallel"), ("--pp", "pipeline stages"), ("--vp", "virtual stages per pipeline rank"),
                       ("--cp", "context parallel"), ("--ep", "expert parallel"), ("--mbs", "micro-batch size"),
                       ("--global-batch", "global batch in sequences"), ("--seq-len", "sequence length"),
                       ("--first-stage-layers", "layers on the first pipeline stage"),
                       ("--last-stage-layers", "layers on the last pipeline stage")):
        g.add_argument(flag, type=_positive_int, help=text)
    g.add_argument("--zero", type=int, choices=(0, 1, 2, 3), help="ZeRO stage (megatron: 1 = distributed optimizer; "
                   "fsdp: 0 NO_SHARD, 2 SHARD_GRAD_OP, 3 FULL_SHARD)")
    g.add_argument("--recompute", choices=("none", "selective", "full"))
    g.add_argument("--precision", choices=("bf16", "fp16", "fp8", "fp32"), default="bf16",
                   help="fp32: Megatron verification runs (TP reproduces TP=1 exactly)")
    g.add_argument("--layer-spec", choices=("te", "local"), default="te",
                   help="te: Transformer Engine + flash attention (GPU clusters); local: megatron-core unfused (CPU)")
    g.add_argument("--offload", action="store_true", help="DeepSpeed ZeRO CPU offload of optimizer (and params at stage 3)")
    g.add_argument("--tp-comm-overlap", action="store_true", help="overlap TP communication with GEMMs (TE userbuffers)")
    g = p.add_argument_group("output")
    g.add_argument("--tokens", type=_token_count, help="training tokens for the time estimate (default: 20 per parameter)")
    g.add_argument("--top", type=_positive_int, default=3, help="show this many ranked plans (default 3)")
    g.add_argument("--explain", action="store_true", help="counts of rejected candidates per rule and the nearest misses")
    g.add_argument("--json", action="store_true", help="print one JSON object")
    g.add_argument("--plot", metavar="DIR", help="draw memory.png (per pipeline stage) and schedule.png (the pipeline "
                   "schedule), with their numbers in CSV, into DIR (needs the plot extra)")
    add_artifact_arguments(p)


def add_artifact_arguments(p: argparse.ArgumentParser, *, output_required: bool = False) -> None:
    """Where and how the plan's artifacts are written (plan -o DIR, render PLAN.json -o DIR)."""
    g = p.add_argument_group("artifacts (DeepSpeed, Megatron, OLMo-FSDP and Slurm files from the plan)")
    g.add_argument("-o", "--output", metavar="DIR", required=output_required,
                   help="write plan.json, ds_config.json, megatron_args.txt, olmo_fsdp.yaml, launch_*.sbatch and "
                        "README.md to DIR (atomically)")
    g.add_argument("--force", action="store_true",
                   help="replace an existing DIR (directories in it, such as runs/, are kept)")
    g.add_argument("--account", help="Slurm account (#SBATCH --account)")
    g.add_argument("--partition", help="Slurm partition (#SBATCH --partition)")
    g.add_argument("--time", default="24:00:00", help="Slurm time limit (default 24:00:00)")
    g.add_argument("--job-name", help="Slurm job name (default genconf-<model>)")
    g.add_argument("--run-dir", help="run directory for logs and checkpoints (default DIR/runs)")
    g.add_argument("--python", help="interpreter that starts torchrun on the nodes (default: this one)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="genconf", description="Plan, render, launch and verify LLM training runs.")
    parser.add_argument("--version", action="version", version=f"genconf {__version__}")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    plan = sub.add_parser("plan", help="plan a run (the default command)")
    add_plan_arguments(plan)
    models = sub.add_parser("models", help="list the model catalog, or import a Hugging Face config.json")
    models.add_argument("--json", action="store_true")
    models.add_argument("--from-hf", metavar="FILE", help="write the catalog YAML of a Hugging Face config.json "
                        "(or a directory holding one) to stdout, or to -o")
    models.add_argument("-o", "--output", metavar="OUT.yaml", help="with --from-hf: write here; the model is named "
                        "after the file, so it can go into models/")
    models.add_argument("--name", help="with --from-hf: the model's name (default: the -o file's or the folder's)")
    models.add_argument("--force", action="store_true", help="with --from-hf -o: replace an existing file")
    hardware = sub.add_parser("hardware", help="list GPUs and cluster presets")
    hardware.add_argument("--json", action="store_true")
    from genconf import commands

    commands.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0] not in SUBCOMMANDS and argv[0] not in ("-h", "--help", "--version")):
        argv.insert(0, "plan")
    try:
        args = build_parser().parse_args(argv)
        from genconf import commands

        return commands.dispatch(args)
    except GenconfError as exc:
        print(f"genconf: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("genconf: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


def print_json(obj: object) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True))
