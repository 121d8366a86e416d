"""Published training runs (benchmarks/data, copied from shared/data) as genconf specs and measurements.

Each usable CSV row becomes a `Run`: the model, the cluster, the published layout as a ParallelPlan (knobs the
source does not state are listed in `unknown` and searched by the benchmark), and what was measured:
tokens/s per GPU (converted from TFLOP/s with the source's own FLOP formula where only that is given) and
per-GPU memory where reported. Rows that cannot be modelled are returned with the reason.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from pathlib import Path

from genconf.catalog.clusters import resolve_cluster
from genconf.plan.specs import ClusterSpec, ModelSpec, ParallelPlan

DATA = Path(__file__).resolve().parent / "data"
FILES = ("megatron_narayanan2021.csv", "korthikanti2022.csv", "megatron_core_h100_2024.csv", "torchtitan.csv",
         "bigscience_bloom_sweep.csv", "opt_bloom_fsdp_papers.csv")


@dataclass
class Run:
    source: str
    file: str
    label: str
    model: ModelSpec
    cluster: ClusterSpec
    plan: ParallelPlan
    measured_tokens_per_s_per_gpu: float
    measured_mem_gib: float | None
    unknown: tuple[str, ...] = ()
    notes: list[str] = field(default_factory=list)


def _int(value: str) -> int | None:
    value = (value or "").strip()
    return int(float(value)) if value and re.fullmatch(r"[0-9.]+", value) else None


def _float(value: str) -> float | None:
    value = (value or "").strip()
    return float(value) if value and re.fullmatch(r"[0-9.eE+-]+", value) else None


def _cluster(row: dict, file: str) -> tuple[ClusterSpec | None, str]:
    gpu = row["gpu"]
    if file == "bigscience_bloom_sweep.csv" or "bigscience" in row["source"]:
        return resolve_cluster("jean-zay-a100"), ""
    if gpu.startswith("A100"):
        return resolve_cluster("dgx-a100"), ""
    if gpu.startswith("H100 (80GB)"):
        return resolve_cluster("dgx-h100"), ""
    if "Grand Teton" in gpu or "lower TDP" in gpu:
        return resolve_cluster("grand-teton-h100"), ""
    if gpu.startswith("H200"):
        return resolve_cluster("hgx-h200"), ""
    return None, f"unknown GPU {gpu!r}"


def _recompute(text: str) -> str | None:
    t = text.lower()
    if not t:
        return None
    if "selective" in t:
        return "selective"
    if "full" in t or "with recompute" in t or "checkpointing" in t:
        return "full"
    if "no recompute" in t or "sequence parallelism" == t.strip():
        return "none"
    return None


def _model(row: dict, file: str) -> ModelSpec:
    layers, h, heads = _int(row["layers"]), _int(row["hidden"]), _int(row["heads"])
    kv = _int(row["kv_heads"]) or heads
    ffn = _int(row["ffn_hidden"])
    vocab = _int(row["vocab"]) or (250880 if "250k" in row["vocab"] else 51200)
    seq = _int(row["seq_len"]) or 2048
    llama = file == "torchtitan.csv"
    return ModelSpec(
        name=re.sub(r"[^a-z0-9.]+", "-", row["model"].lower()).strip("-") or "run",
        num_layers=layers, hidden_size=h, num_attention_heads=heads, num_query_groups=kv,
        ffn_hidden_size=ffn or 4 * h, vocab_size=vocab, seq_length=seq,
        activation="swiglu" if llama else "gelu", normalization="rmsnorm" if llama else "layernorm",
        position_embedding="rope" if llama else "learned", tie_embeddings=False, add_bias_linear=not llama,
        hidden_dropout=0.0 if llama else 0.1, attention_dropout=0.0 if llama else 0.1)


def _flops_per_token(row: dict, file: str, model: ModelSpec) -> float | None:
    """The FLOP count the source divided by to get its TFLOP/s."""
    l, h, s, v = model.num_layers, model.hidden_size, model.seq_length, model.vocab_size
    if file == "megatron_narayanan2021.csv" or file == "bigscience_bloom_sweep.csv" or "BLOOM-176B" in row["model"]:
        return 96 * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))  # Narayanan 2021 eq. 3 (hardware, full recompute)
    if file in ("korthikanti2022.csv", "megatron_core_h100_2024.csv"):
        from genconf.plan.counting import model_flops_per_token

        return model_flops_per_token(model, s)  # eq. 7 / Megatron num_floating_point_operations
    return None


def load_runs() -> tuple[list[Run], list[tuple[str, str, str]]]:
    """(usable runs, [(file, label, reason skipped)])."""
    runs: list[Run] = []
    skipped: list[tuple[str, str, str]] = []
    for file in FILES:
        with open(DATA / file) as f:
            for i, row in enumerate(csv.DictReader(f)):
                label = f"{row['model']} #{i}"
                try:
                    run, why = _row_to_run(row, file, label)
                except ValueError as exc:
                    run, why = None, f"invalid spec: {exc}"
                if run is None:
                    skipped.append((file, label, why))
                else:
                    runs.append(run)
    return runs, skipped


def _row_to_run(row: dict, file: str, label: str) -> tuple[Run | None, str]:
    if not _int(row["layers"]) or not _int(row["hidden"]) or not _int(row["heads"]):
        return None, "architecture not stated"
    num_gpus, tp, pp = _int(row["num_gpus"]), _int(row["tp"]), _int(row["pp"])
    if not num_gpus or not tp or not pp:
        return None, "GPU count or layout not stated"
    if "single transformer layer" in row["model"]:
        return None, "per-layer timing, not a training step"
    cluster, why = _cluster(row, file)
    if cluster is None:
        return None, why
    model = _model(row, file)
    cp = _int(row["cp"]) or 1
    dp = _int(row["dp"]) or num_gpus // (tp * pp * cp)
    if tp * pp * cp * dp != num_gpus:
        return None, f"tp*pp*cp*dp = {tp * pp * cp * dp} != {num_gpus} GPUs"
    unknown = []
    mbs = _int(row["mbs"])
    if mbs is None:
        unknown.append("mbs")
        mbs = 1
    vp = _int(row["vp"])
    if vp is None:
        vp = 1
        if pp > 1 and file in ("megatron_narayanan2021.csv", "megatron_core_h100_2024.csv"):
            unknown.append("vp")
    recompute = _recompute(row["recompute"])
    if recompute is None:
        unknown.append("recompute")
        recompute = "selective"
    local = re.search(r"local batch size (\d+)", row["notes"])
    gbs = _int(row["gbs"]) or (int(local.group(1)) * dp if local else mbs * dp)
    precision = "fp8" if "FP8" in row["precision"] else "fp16" if row["precision"].startswith("FP16 (") else "bf16"
    fsdp = file == "torchtitan.csv"
    # DeepSpeed: Narayanan 2021 Table 2's ZeRO-3 runs, and Megatron-DeepSpeed (BLOOM) with ZeRO-0/1.
    deepspeed = "ZeRO-3" in row["model"] or "ZeRO" in row["precision"]
    zero = 3 if "ZeRO-3" in row["model"] else 0 if "ZeRO-0" in row["precision"] else 1
    modern = file in ("torchtitan.csv", "megatron_core_h100_2024.csv")
    plan = ParallelPlan(
        framework="fsdp" if fsdp else "deepspeed" if deepspeed else "megatron", tp=tp, pp=pp, vp=vp, cp=cp, dp=dp, mbs=mbs, gbs=gbs,
        seq_length=model.seq_length, zero_stage=3 if fsdp else zero, recompute=recompute,
        sequence_parallel=tp > 1 and (file in ("korthikanti2022.csv", "megatron_core_h100_2024.csv", "torchtitan.csv")
                                      and "no sequence parallel" not in row["recompute"]),
        grad_accum_fp32="BF16 optimizer" in row["notes"] or "BF16_Optimizer" in row["precision"],
        precision=precision, layer_spec="te" if modern else "local",
        tp_comm_overlap=file == "megatron_core_h100_2024.csv")
    tokens = _float(row["tokens_per_sec_per_gpu"])
    tflops = _float(row["tflops_per_gpu"])
    mfu = _float(row["mfu"])
    if tflops is None and mfu is not None and file == "megatron_core_h100_2024.csv":
        tflops = mfu * 989.4
    per_token = _flops_per_token(row, file, model)
    from_tflops = tflops * 1e12 / per_token if tflops is not None and per_token is not None else None
    if tokens is None:
        if from_tflops is None:
            return None, "no tokens/s and no TFLOP/s with a known FLOP formula"
        tokens = from_tflops
    elif from_tflops is not None and abs(tokens / from_tflops - 1) > 0.25:
        # The row's derived tokens/s (from s/iter and batch) contradicts its own TFLOP/s.
        return None, f"inconsistent row: tokens/s {tokens:.0f} vs {from_tflops:.0f} implied by its TFLOP/s"
    mem = _float(row["mem_gib_per_gpu"])
    if mem is not None and "selective" in row["recompute"] and file == "torchtitan.csv":
        # torchtitan's per-op selective checkpointing keeps a different set of tensors than Megatron's
        # selective recompute, which is what genconf models: compare throughput only.
        mem = None
    return Run(source=row["source"][:90], file=file, label=label, model=model, cluster=cluster, plan=plan,
               measured_tokens_per_s_per_gpu=tokens, measured_mem_gib=mem, unknown=tuple(unknown)), ""
