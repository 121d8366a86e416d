"""The documented range of every number genconf takes (flags, model/cluster/GPU YAML, recipes, plan.json),
checked before any search: one line per value out of range. And the integer arithmetic the search needs,
fast over those ranges (divisors in O(sqrt n)).

Issue 15 item 1: `--gpus 100000000` ran for minutes (divisors by scanning range(1, n + 1)), and a 2**31 layer
count or NVLink domain likewise. The upper ends are far above any machine or model built so far, each with
its reason; the lower ends are what the quantity means. Pure standard library.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_GPUS = 1_048_576
"""2**20 GPUs: 30x the largest training job published (Llama 3 405B on 16,384 H100s; xAI's 100k-GPU
cluster), and the search over it stays well under a second."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Range:
    """One number's documented range, inclusive at both ends."""

    low: float
    high: float
    unit: str
    """What it counts, in words ("GPUs", "layers"), for messages and the README table."""
    why: str = ""
    """Why the upper end is where it is."""
    integer: bool = True

    def violation(self, value: object) -> str | None:
        """What is wrong with value, without its name ('is out of range (1 to 16,384 layers)'), or None."""
        if self.integer:
            if isinstance(value, bool) or not isinstance(value, int):
                return f"must be a whole number, got {value!r}"
        else:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                return f"must be a number, got {value!r}"
            if not math.isfinite(value):
                return f"must be a finite number, got {value!r}"
        if not self.low <= value <= self.high:
            unit = f" {self.unit}" if self.unit else ""
            return f"{_fmt(value)} is out of range ({_fmt(self.low)} to {_fmt(self.high)}{unit})"
        return None


def _fmt(x: float) -> str:
    if isinstance(x, int) or (isinstance(x, float) and x.is_integer() and abs(x) < 1e15):
        return f"{int(x):,}"
    return f"{x:g}"


_LAYERS = Range(low=1, high=16_384, unit="layers", why="100x Llama 3.1 405B's 126; DeepNet trained 1,000")
_GPUS = Range(low=1, high=MAX_GPUS, unit="GPUs", why="2**20: 30x the largest published training job")
_DEGREE = Range(low=1, high=MAX_GPUS, unit="GPUs", why="a degree cannot exceed the GPU count")
_STEPS = Range(low=1, high=1_000_000_000, unit="steps", why="1e9 optimizer steps (Llama 3 405B: about 1.2 million)")

RANGES: dict[str, Range] = {
    # the job and the cluster
    "num_gpus": _GPUS,
    "total_gpus": _GPUS,
    "gpus_per_node": Range(low=1, high=1_024, unit="GPUs", why="HGX nodes hold 8, GB200 trays 4 (the flag: a node "
                                                                  "size of the GPU or of --cluster's, or a divisor)"),
    "nvlink_domain_gpus": Range(low=1, high=MAX_GPUS, unit="GPUs", why="NVL72 racks: 72; NVL576: 576"),
    "ib_gbit_per_s_per_gpu": Range(low=1e-3, high=1e6, unit="Gb/s", integer=False, why="NDR: 400, XDR: 800"),
    "host_link_gbyte_per_s_per_gpu": Range(low=0, high=1e6, unit="GB/s", integer=False,
                                           why="PCIe 5 x16: 64; Grace-Hopper C2C: 450"),
    "pcie_peer_gbyte_per_s_per_gpu": Range(low=1e-3, high=1e6, unit="GB/s", integer=False, why="PCIe 5 x16: 64"),
    "cpu_mem_gib_per_node": Range(low=0, high=1e7, unit="GiB", integer=False, why="a node with 10 PiB of RAM"),
    # the GPU
    "peak_fp32_tflops": Range(low=0, high=1e6, unit="TFLOP/s", integer=False, why="B200 FP4: 9,000"),
    "peak_tf32_tflops": Range(low=0, high=1e6, unit="TFLOP/s", integer=False, why="B200 FP4: 9,000"),
    "peak_bf16_tflops": Range(low=0, high=1e6, unit="TFLOP/s", integer=False, why="B200 FP4: 9,000"),
    "peak_fp16_tflops": Range(low=0, high=1e6, unit="TFLOP/s", integer=False, why="B200 FP4: 9,000"),
    "peak_fp8_tflops": Range(low=0, high=1e6, unit="TFLOP/s", integer=False, why="B200 FP4: 9,000"),
    "peak_fp4_tflops": Range(low=0, high=1e6, unit="TFLOP/s", integer=False, why="B200 FP4: 9,000"),
    "hbm_gib": Range(low=1e-3, high=1e6, unit="GiB", integer=False, why="B200: 180"),
    "hbm_tbyte_per_s": Range(low=1e-3, high=1e4, unit="TB/s", integer=False, why="B200: 8"),
    "nvlink_gbyte_per_s": Range(low=0, high=1e6, unit="GB/s", integer=False, why="NVLink 5: 1,800"),
    "num_sms": Range(low=1, high=100_000, unit="SMs", why="B200: 148"),
    "tdp_w": Range(low=1, high=100_000, unit="W", why="B200: 1,000"),
    "nvlink_bridge_gpus": Range(low=1, high=1_024, unit="GPUs", why="H100 PCIe bridges join 2; a node holds at most 1,024"),
    # the model
    "num_layers": _LAYERS,
    "hidden_size": Range(low=1, high=1_048_576, unit="", why="50x the widest published dense model (PaLM: 18,432)"),
    "ffn_hidden_size": Range(low=1, high=4_194_304, unit="", why="4 x the largest hidden size"),
    "moe_ffn_hidden_size": Range(low=1, high=4_194_304, unit="", why="4 x the largest hidden size"),
    "num_attention_heads": Range(low=1, high=65_536, unit="heads", why="500x Llama 3.1 405B's 128"),
    "num_query_groups": Range(low=1, high=65_536, unit="KV heads", why="at most the attention heads"),
    "kv_channels": Range(low=1, high=65_536, unit="", why="usual: 64 to 256"),
    "vocab_size": Range(low=1, high=16_777_216, unit="tokens", why="2**24: 64x Gemma's 256,000"),
    "seq_length": Range(low=1, high=16_777_216, unit="tokens", why="2**24: above the longest contexts trained (10M)"),
    "num_experts": Range(low=0, high=65_536, unit="experts", why="256x DeepSeek-V3's 256"),
    "moe_top_k": Range(low=0, high=65_536, unit="experts", why="at most the experts"),
    "hidden_dropout": Range(low=0, high=1, unit="", integer=False, why="a probability"),
    "attention_dropout": Range(low=0, high=1, unit="", integer=False, why="a probability"),
    "sliding_window": Range(low=1, high=16_777_216, unit="tokens", why="at most the longest sequence"),
    "packed_doc_tokens": Range(low=1, high=16_777_216, unit="tokens", why="at most the sequence length"),
    "window_attn_skip_freq": Range(low=0, high=16_384, unit="layers", why="at most the layers"),
    "activation_clamp": Range(low=0.001, high=1_000_000, unit="", integer=False, why="GPT-OSS: 7"),
    # the layout
    "tp": _DEGREE,
    "pp": _DEGREE,
    "cp": _DEGREE,
    "ep": _DEGREE,
    "dp": _DEGREE,
    "vp": Range(low=1, high=16_384, unit="virtual stages", why="at most the layers"),
    "mbs": Range(low=1, high=65_536, unit="sequences", why="micro-batches are 1 to 32 sequences in practice"),
    "gbs": Range(low=1, high=16_777_216, unit="sequences", why="2**24 sequences (Llama 3: 16M tokens = 2,048)"),
    "zero_stage": Range(low=0, high=3, unit=""),
    "etp": _DEGREE,
    "recompute_layers": _LAYERS,
    "offload_activation_layers": Range(low=0, high=16_384, unit="layers", why="at most the layers"),
    "pp_first_stage_layers": _LAYERS,
    "pp_last_stage_layers": _LAYERS,
    "bf16_layers_start": Range(low=0, high=16_384, unit="layers", why="at most the layers"),
    "bf16_layers_end": Range(low=0, high=16_384, unit="layers", why="at most the layers"),
    "shard_group_size": _DEGREE,
    # the run
    "train_steps": _STEPS,
    "warmup_steps": Range(low=0, high=1_000_000_000, unit="steps", why=_STEPS.why),
    "checkpoint_every_steps": Range(low=0, high=1_000_000_000, unit="steps", why="0 = no checkpoints"),
    "keep_checkpoints": Range(low=1, high=1_000, unit="checkpoints", why="the newest N are kept on disk"),
    "seed": Range(low=1, high=2**63 - 1, unit="", why="torch.manual_seed takes 64 bits"),
    "tokens": Range(low=1, high=1e18, unit="tokens", integer=False, why="1e18: 60,000x Llama 3's 15T"),
    "top": Range(low=1, high=1_000, unit="plans", why="printed plans"),
    "lr": Range(low=0, high=10, unit="", integer=False, why="AdamW diverges far below 10"),
    "min_lr": Range(low=0, high=10, unit="", integer=False, why="at most lr"),
    "branching": Range(low=1, high=16_777_216, unit="successors", why="at most the vocabulary"),
}

FLAGS: dict[str, str] = {
    "--gpus": "num_gpus", "--gpus-per-node": "gpus_per_node", "--tp": "tp", "--pp": "pp", "--vp": "vp",
    "--cp": "cp", "--ep": "ep", "--mbs": "mbs", "--global-batch": "gbs", "--seq-len": "seq_length",
    "--packed-doc-len": "packed_doc_tokens",
    "--first-stage-layers": "pp_first_stage_layers", "--last-stage-layers": "pp_last_stage_layers",
    "--zero": "zero_stage", "--top": "top", "--tokens": "tokens", "--etp": "etp",
    "--recompute-layers": "recompute_layers", "--offload-activations": "offload_activation_layers",
    "--bf16-first-layers": "bf16_layers_start", "--bf16-last-layers": "bf16_layers_end",
    # genconf launch: shrink a plan for a smoke test
    "--layers": "num_layers", "--hidden": "hidden_size", "--heads": "num_attention_heads", "--vocab": "vocab_size",
    "--steps": "train_steps", "--checkpoint-every": "checkpoint_every_steps", "--keep-checkpoints": "keep_checkpoints",
    "--lr": "lr",
}
"""Command-line flags and the quantity each sets."""


def check(name: str, value: object, *, label: str | None = None) -> str | None:
    """One line when value is outside name's range ('--gpus 10,000,000 is out of range (1 to 1,048,576 GPUs)',
    'num_layers must be a whole number ...'), else None. Unknown names are not checked."""
    rng = RANGES.get(name)
    if rng is None or value is None:
        return None
    why = rng.violation(value)
    if why is None:
        return None
    return f"{label or name} {why}"


def check_all(values: dict, *, where: str = "") -> list[str]:
    """Every violation among a mapping of field names to values (a YAML file, a spec), one line each,
    prefixed with where ('models/x.yaml: num_layers 2,147,483,648 is out of range (1 to 16,384 layers)')."""
    prefix = f"{where}: " if where else ""
    out = []
    for name, value in values.items():
        line = check(name, value)
        if line:
            out.append(prefix + line)
    return out


def check_flag(flag: str, value: object) -> str | None:
    """A command-line flag's value: '--gpus 10,000,000 is out of range (1 to 1,048,576 GPUs)'."""
    name = FLAGS.get(flag)
    return check(name, value, label=flag) if name else None


def divisors(n: int) -> list[int]:
    """Every positive divisor of n, ascending, in O(sqrt n) steps (2**20 takes 1,024)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"divisors of a positive integer only, got {n!r}")
    small, large = [], []
    for d in range(1, math.isqrt(n) + 1):
        if n % d == 0:
            small.append(d)
            if d != n // d:
                large.append(n // d)
    return small + large[::-1]


def table_markdown() -> str:
    """The ranges as the README documents them."""
    rows = ["| quantity | range | unit | why the upper end |", "|---|---|---|---|"]
    for name, r in RANGES.items():
        flags = [f for f, n in FLAGS.items() if n == name]
        label = f"`{name}`" + (f" ({', '.join(f'`{f}`' for f in flags)})" if flags else "")
        rows.append(f"| {label} | {_fmt(r.low)} to {_fmt(r.high)} | {r.unit} | {r.why} |")
    return "\n".join(rows)
