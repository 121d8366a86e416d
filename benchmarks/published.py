"""Published training runs (benchmarks/data, copied from shared/data) as genconf specs and measurements.

Each usable CSV row becomes a `Run`: the model, the cluster, the published layout as a ParallelPlan (knobs the
source does not state are listed in `unknown` and searched by the benchmark, as their authors tuned them), and
what was measured: tokens/s per GPU (converted from TFLOP/s with the source's own FLOP formula where only that
is given) and per-GPU memory where reported. Rows genconf cannot model are returned with the reason; none is
dropped silently.
"""

from __future__ import annotations

import csv
import functools
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from genconf.catalog.clusters import resolve_cluster
from genconf.catalog.models import resolve_model
from genconf.plan.counting import model_flops_per_token
from genconf.plan.specs import LORA_TARGETS, RECOMPUTE_MODULES, ClusterSpec, ModelSpec, ParallelPlan

DATA = Path(__file__).resolve().parent / "data"
GENCONF_FILE = "genconf_h100_issue13.csv"
MOSAIC_FILE = "mosaicml_llm_foundry.csv"
"""MosaicML's MPT benchmarks (llm-foundry): Composer FSDP, not from shared/data (benchmarks/data/README.md)."""
NEMO25_FILE = "nemo_perf_summary_25.x_excerpts.csv"
"""NeMo 25.02-25.07 performance summaries (docs.nvidia.com), the rows the stored pages show; not from shared/data,
scored and no term fitted on them (accuracy.VALIDATION_SOURCES; benchmarks/data/README.md)."""
AUTOMODEL_FILE = "nemo_automodel_perf_summary.csv"
"""NeMo AutoModel's performance summary (NVIDIA-NeMo/Automodel docs/performance-summary.md): PyTorch FSDP2 with
expert parallelism and DeepEP on DGX-H100, BF16; not from shared/data, scored and no term fitted on them
(accuracy.VALIDATION_SOURCES; benchmarks/data/README.md)."""
AUTOMODEL_MODELS = {
    # The page's model names -> genconf's catalog (the configs load these Hugging Face checkpoints).
    "deepseek_v3_671b": "deepseek-v3", "kimi_k2": "kimi-k2", "qwen3_moe_30b": "qwen3-30b-a3b",
    "nemotron_v3_super_120b": "nemotron-3-super", "nemotron_v3_nano_30b": "nemotron-3-nano",
    "nemotron_v3_ultra_550b": "nemotron-3-ultra", "gpt_oss_120b": "gpt-oss-120b", "llama3_70b": "llama3.1-70b",
    "gpt_oss_20b": "gpt-oss-20b",
}
OLMO_CORE_FILE = "olmo_core_readme_throughput.csv"
"""AI2's OLMo-core README throughput table (September 2024 to March 2025): PyTorch FSDP2 with torch.compile on H100s,
BF16 and torchao float8, OLMo-1124 1B / 7B / 13B and a Llama 3 8B; not from shared/data, scored and no term fitted on
them (accuracy.VALIDATION_SOURCES; benchmarks/data/README.md)."""
OLMO_CORE_BASES = {
    # The architecture of each row's OLMo-core config (the row's notes): OLMo-1124's blocks (norm on each sublayer's
    # output, full-width QK norm) as the catalog's OLMo 2 entries hold them, or Llama 3's; its own sizes and the
    # dolma2 vocabulary from the row's columns.
    "olmo": "olmo2-7b", "llama": "llama3-8b",
}
NANOTRON_FILE = "nanotron_ultrascale_playbook.csv"
"""Hugging Face's Ultra-Scale Playbook benchmarks (huggingface/nanotron docs/benchmark_summary.svg, the playbook's
heatmap of the best configuration per model size and node count): nanotron v0.5 on 1-64 nodes of 8 H100s, BF16,
Llama-style 1.34B / 3.57B / 8.86B / 80B at sequence 4096 and 1M-token batches; not from shared/data, scored and no
term fitted on them (accuracy.VALIDATION_SOURCES; benchmarks/data/README.md)."""
DGXC_FILE = "dgxc_benchmarking.csv"
"""NVIDIA's DGX Cloud benchmarking recipes (NVIDIA/dgxc-benchmarking READMEs, v24.11.1 to v25.05.04; from v25.07 the
READMEs publish no tables): NeMo 1.x (NeMo-Framework-Launcher) pre-training on DGX-H100 in the NeMo 24.05, 24.09 and
24.12 containers, and NeMo 2.0 performance scripts (scripts/performance/llm, the NeMo commit each setup.sh checks out)
for Llama 3 SFT and LoRA in the 24.12 container and pre-training in the 25.02.01 (H100) and 25.04 (H100 and GB200
NVL72) containers, BF16 and FP8 with delayed scaling, each typed fact cited in the row's notes; not from shared/data,
scored and no term fitted on them (accuracy.VALIDATION_SOURCES; benchmarks/data/README.md)."""
DGXC_MODELS = {
    # The recipes' models -> genconf's catalog (the recipes' yaml and NeMo 2.0 config shapes are the public configs').
    "llama3.1_8b": "llama3.1-8b", "llama3.1_70b": "llama3.1-70b", "llama3.1_405b": "llama3.1-405b",
    "nemotron4_15b": "nemotron4-15b", "nemotron4_340b": "nemotron4-340b", "gpt3_175b": "gpt3-175b",
    # The fine-tuning recipes load Meta-Llama-3-8B / -70B (NeMo 2.0 Llama3Config8B / Llama3Config70B).
    "llama3_8b": "llama3-8b", "llama3_70b": "llama3-70b",
    # NeMo 2.0's NemotronHConfig56B and DeepSeekV3Config (with the recipe's one MTP layer).
    "nemotronh_56b": "nemotron-h-56b", "deepseekv3": "deepseek-v3",
    # NeMo 2.0's pretrain_grok1_314b.py model(): MixtralConfig8x7B with Grok-1's shapes (models/grok1-314b.yaml).
    "grok1_314b": "grok1-314b",
}
FILES = ("megatron_narayanan2021.csv", "korthikanti2022.csv", "megatron_core_h100_2024.csv", "torchtitan.csv",
         "bigscience_bloom_sweep.csv", "opt_bloom_fsdp_papers.csv", "nemo_perf_summary_24.07_and_longseq.csv",
         "megatron_bridge_perf_summary.csv", GENCONF_FILE, MOSAIC_FILE, NEMO25_FILE, AUTOMODEL_FILE,
         OLMO_CORE_FILE, NANOTRON_FILE, DGXC_FILE)
TIED_FILES = ("megatron_narayanan2021.csv", "korthikanti2022.csv", "bigscience_bloom_sweep.csv")
NVIDIA_FILES = ("nemo_perf_summary_24.07_and_longseq.csv", "megatron_bridge_perf_summary.csv", NEMO25_FILE, DGXC_FILE)
BRIDGE_MOE_RECIPES = Path(__file__).resolve().parent / "bridge_moe_recipes.csv"
"""Per MoE row of megatron_bridge_perf_summary.csv (by row index): the Megatron-Bridge ref of its container release
(docs/versions1.json, docs/releases/software-versions.md), the benchmark config that ran it, whether that config's
layout matches the row, and the MoE features it turned on (all-to-all overlap, dispatcher, CUDA graphs), each
with the ref:path:line it was read from."""


BRIDGE_DENSE_RECIPES = Path(__file__).resolve().parent / "bridge_dense_recipes.csv"
"""Per dense row of megatron_bridge_perf_summary.csv (by row index): the Megatron-Bridge ref of its container release
(the same mapping as bridge_moe_recipes.csv), the workload preset and builder that ran it, whether the preset's
layout matches the row, and the memory and speed settings it used after every override (recompute, CPU activation
offload, Megatron-FSDP, CUDA graphs, TP communication overlap, the pipeline split, FP8 parameter gather), each with
the ref:path:line it was read from."""


@functools.cache
def _recipe_table(path: Path) -> dict[int, dict]:
    with open(path) as f:
        return {int(r["row"]): r for r in csv.DictReader(f)}


def _matched(path: Path, index: int) -> dict | None:
    """Row `index` of a recipe table, where its config's layout matches the published row."""
    row = _recipe_table(path).get(index)
    return row if row is not None and row["layout_matches_row"].startswith("yes") else None


def bridge_moe_recipe(index: int) -> dict | None:
    """The recipe features of megatron_bridge_perf_summary.csv's MoE row `index`, where its config's layout matches."""
    return _matched(BRIDGE_MOE_RECIPES, index)


def moe_dispatcher_of(recipe: dict | None) -> str:
    """ParallelPlan.moe_dispatcher of a bridge_moe_recipes.csv row ('alltoall', 'flex+hybridep', 'flex+deepep',
    'flex+deepep (moe_enable_deepep)'); megatron's all-to-all where the recipe is unknown."""
    dispatcher = (recipe or {}).get("dispatcher") or "alltoall"
    for backend in ("hybridep", "deepep"):
        if dispatcher.startswith(f"flex+{backend}"):
            return backend
    return "alltoall"


def bridge_dense_recipe(index: int) -> dict | None:
    """The settings of megatron_bridge_perf_summary.csv's dense row `index`, where its preset's layout matches."""
    return _matched(BRIDGE_DENSE_RECIPES, index)


def dense_recipe_fields(recipe: dict) -> dict:
    """ParallelPlan fields of a bridge_dense_recipes.csv row: recompute as configured (megatron-core's default: none),
    CPU activation offload, Megatron-FSDP (genconf's megatron zero 3) or the distributed optimizer, TP overlap, FP8
    parameter gather and CUDA graphs."""
    granularity = recipe["recompute_granularity"] or "none"
    layers = int(recipe["recompute_num_layers"]) if recipe["recompute_num_layers"] else None
    fields = dict(recompute=granularity, recompute_layers=layers if granularity == "full" else None,
                  offload_activation_layers=int(recipe["cpu_offloading_num_layers"] or 0),
                  zero_stage=3 if recipe["use_megatron_fsdp"] == "true" else 1,
                  tp_comm_overlap=recipe["tp_comm_overlap"] == "true")
    if recipe["fp8_param_gather"]:
        fields["fp8_param_gather"] = recipe["fp8_param_gather"] == "true"
    if recipe["account_for_embedding"] == "true" or recipe["account_for_loss"] == "true":
        fields.update(pp_embedding_as_layer=recipe["account_for_embedding"] == "true",
                      pp_loss_as_layer=recipe["account_for_loss"] == "true")
    impl, scope = recipe["cuda_graph_impl"], recipe["cuda_graph_scope"]
    if impl == "local" and scope == "full_iteration":
        fields.update(cuda_graph_impl="local", cuda_graph_scope=("full_iteration",))
    elif impl == "local":
        fields.update(cuda_graph_impl="local", cuda_graph_scope=())  # the legacy enable_cuda_graph: whole layers
    elif impl == "transformer_engine":
        fields.update(cuda_graph_impl="transformer_engine",
                      cuda_graph_scope=tuple(re.findall(r"[a-z_]+", scope)))
    return fields


def _cuda_graphs(recipe: dict | None) -> dict:
    """ParallelPlan's CUDA graph fields from a bridge_moe_recipes.csv row (its config's cuda_graph_impl/scope)."""
    if recipe is None or recipe["cuda_graph_impl"] == "none":
        return {}
    impl = recipe["cuda_graph_impl"]
    if impl.startswith("enable_cuda_graph"):
        return dict(cuda_graph_impl="local", cuda_graph_scope=())  # the legacy flag: megatron's per-layer graphs
    if impl == "full_iteration":
        return dict(cuda_graph_impl="local", cuda_graph_scope=("full_iteration",))
    scopes = tuple(re.findall(r"\w+", recipe["cuda_graph_scope"].split("(")[0]))
    return dict(cuda_graph_impl=impl, cuda_graph_scope=scopes) if scopes else {}


CATALOG_KEYS = {
    # Models the NVIDIA tables name without an architecture: the catalog entry with the public config.
    "llama3_8b": "llama3-8b", "llama3_70b": "llama3-70b", "llama3.1_405b": "llama3.1-405b",
    "qwen3_30b_a3b": "qwen3-30b-a3b", "qwen3_235b_a22b": "qwen3-235b-a22b", "gpt_oss_120b": "gpt-oss-120b",
    "deepseekv3": "deepseek-v3", "kimi_k2": "kimi-k2",
    "nemotron_3_nano": "nemotron-3-nano", "nemotronh_8b": "nemotron-h-8b", "nemotronh_47b": "nemotron-h-47b",
    "nemotronh_56b": "nemotron-h-56b", "nemotron_3_super": "nemotron-3-super", "nemotron_3_ultra": "nemotron-3-ultra",
    "nemotron_3_5_lightning": "nemotron-3.5-lightning", "mixtral_8x7b": "mixtral-8x7b", "mixtral_8x22b": "mixtral-8x22b",
    # NVIDIA's tables call Nemotron-4 "Nemotron" (NeMo 24.07, 25.x) or "nemotron4" (NeMo's recommended configs).
    "nemotron_15b": "nemotron4-15b", "nemotron_340b": "nemotron4-340b", "nemotron4_15b": "nemotron4-15b",
    "nemotron4_340b": "nemotron4-340b",
    # ... and Nemotron-3 "Nemotron" too (NeMo 24.07) or "nemotron3": the catalog's entries are NeMo's Nemotron3Config8B
    # and 22B, which rotate half of each head (rotary_percent 0.5), as _family_defaults's spec did not.
    "nemotron_8b": "nemotron3-8b", "nemotron_22b": "nemotron3-22b", "nemotron3_8b": "nemotron3-8b",
    "nemotron3_22b": "nemotron3-22b",
    # NeMo's GPTConfig5B/20B keep megatron-core's dropout 0.1 (only GPTConfig175B sets 0.0, as _family_defaults
    # does); throughput does not price dropout under Transformer Engine layers, the memory estimate does.
    "gpt3_5b": "gpt3-5b", "gpt3_20b": "gpt3-20b",
}
NOT_MODELLED = {
    # Models genconf cannot price faithfully, with the reason the benchmark prints.
    "deepseekv4": "DeepSeek-V4 architecture not public in the data (MLA-derived attention); not modelled",
    "nemotron_3_ultra": ("Nemotron 3 Ultra: its benchmark configs (Megatron-Bridge perf_recipes/nemotronh, "
                         "_apply_nemotron_3_ultra_fsdp_hsdp) train with Megatron-FSDP (HSDP inside the NVLink domain) "
                         "and fine-grained offload of the expert MLP's activations, which genconf does not plan for "
                         "hybrid models; the model itself is in the catalog (nemotron-3-ultra)"),
    "llama4": ("Llama 4 Maverick: in genconf's catalog (llama4-maverick), but DGXC's layout table disagrees with its "
               "scripts (Layers 32 where the model has 48, which PP 2 x VP 12 needs; the H100 row's VP 12 where "
               "launch.sh sets VP=1) and the rows' NeMo settings are not typed with citations"),
    "llama3.1_405b_proxy": ("a DGXC 405B proxy configuration (fewer layers to fit under 576 GPUs; NVIDIA: 'not realistic'), "
                            "its layout not stated"),
}


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
    group: str = ""
    """Leave-one-source-out unit: the publication (and, for Megatron-Bridge, the container release)."""
    precision_label: str = ""
    """Precision as the table names it (BF16, FP8-CS, MXFP8, NVFP4, ...)."""
    framework_label: str = ""
    """The stack that ran it (Megatron-LM, NeMo/Megatron-Bridge, Megatron-DeepSpeed, torchtitan)."""
    task: str = "pretrain"
    configured: bool = False
    """The row's benchmark config is known in full (bridge_dense_recipes.csv): its memory settings are typed too."""

    @property
    def generation(self) -> str:
        return self.cluster.gpu.arch


def _int(value: str) -> int | None:
    value = (value or "").strip()
    return int(float(value)) if value and re.fullmatch(r"[0-9.]+", value) else None


def _float(value: str) -> float | None:
    value = (value or "").strip()
    return float(value) if value and re.fullmatch(r"[0-9.eE+-]+", value) else None


def _cluster(row: dict, file: str) -> tuple[ClusterSpec | None, str]:
    gpu = row["gpu"]
    if file == GENCONF_FILE:
        return resolve_cluster("kempner-h100", gpu="h100-sxm", gpus_per_node=1), ""
    if file == "bigscience_bloom_sweep.csv" or "bigscience" in row["source"]:
        return resolve_cluster("jean-zay-a100"), ""
    if gpu.startswith("A100") and "40GB" in gpu:
        # MosaicML's A100 40GB nodes: 8 GPUs, 1600 Gb/s RoCE per node (200 Gb/s per GPU, as the DGX A100 preset).
        return resolve_cluster("dgx-a100", gpu="a100-40gb"), ""
    if gpu.startswith("A100"):
        return resolve_cluster("dgx-a100"), ""
    if gpu.startswith(("H100 (80GB)", "H100-SXM 80GB")) or gpu == "H100":
        return resolve_cluster("dgx-h100"), ""
    if "Grand Teton" in gpu or "lower TDP" in gpu:
        return resolve_cluster("grand-teton-h100"), ""
    if gpu.startswith("H200"):
        return resolve_cluster("hgx-h200"), ""
    if gpu.startswith("GB300"):
        return resolve_cluster("gb300-nvl72"), ""
    if gpu.startswith("GB200"):
        return resolve_cluster("gb200-nvl72"), ""
    if gpu.startswith("B300"):
        return resolve_cluster("dgx-b300"), ""
    if gpu.startswith("B200"):
        return resolve_cluster("dgx-b200"), ""
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


def _model_key(name: str) -> str:
    return re.sub(r"\s*\(.*\)\s*", "", name).strip().lower().replace(" ", "_").replace("-", "_")


def _family_defaults(name: str) -> dict:
    """Architecture details a table omits, by model family (NeMo/Megatron config classes the rows cite)."""
    n = name.lower()
    if "llama" in n:
        vocab = 32000 if ("llama2" in n or "llama 2" in n or "llama-2" in n) else 128256
        return dict(activation="swiglu", normalization="rmsnorm", position_embedding="rope", tie_embeddings=False,
                    add_bias_linear=False, hidden_dropout=0.0, attention_dropout=0.0, vocab_size=vocab)
    if "nemotron" in n:
        # Nemotron-3/4: squared-ReLU MLP (not gated), LayerNorm1p, RoPE, no biases, 256k vocabulary.
        return dict(activation="squared_relu", normalization="layernorm", position_embedding="rope",
                    tie_embeddings=False, add_bias_linear=False, hidden_dropout=0.0, attention_dropout=0.0,
                    vocab_size=256000)
    if n.startswith("gpt3"):
        # NeMo GPTConfig175B: GELU, LayerNorm, learned positions, biases, no dropout; GPT-2 BPE vocabulary (the 5B and
        # 20B rows take the catalog's gpt3-5b/20b, CATALOG_KEYS).
        return dict(activation="gelu", normalization="layernorm", position_embedding="learned", tie_embeddings=True,
                    add_bias_linear=True, hidden_dropout=0.0, attention_dropout=0.0, vocab_size=50257)
    return {}


def _model(row: dict, file: str) -> ModelSpec:
    layers, h, heads = _int(row["layers"]), _int(row["hidden"]), _int(row["heads"])
    kv = _int(row["kv_heads"]) or heads
    ffn = _int(row["ffn_hidden"])
    seq = _int(row["seq_len"]) or 2048
    key = _model_key(row["model"])
    if file == DGXC_FILE:
        base = resolve_model(DGXC_MODELS[key])[0]
        if _int(row["vocab"]):
            # The 24.09/24.12 405B recipes' GPT2BPE proxy tokenizer (the row's notes).
            base = replace(base, vocab_size=_int(row["vocab"]))
        if layers and layers != base.num_layers:
            # v25.04's 405B proxies: the 405B's shapes with fewer layers, their layout stated (the row's notes).
            base = replace(base, name=f"{base.name}-{layers}l", num_layers=layers)
        return replace(base, seq_length=seq)
    if key in CATALOG_KEYS:
        base = resolve_model(CATALOG_KEYS[key])[0]
        if "w/o MTP" in row["model"]:
            base = replace(base, mtp_num_layers=0)  # the table's DeepSeekV3 (w/o MTP) rows
        return replace(base, seq_length=seq)
    if file == GENCONF_FILE:
        return resolve_model(row["model"])[0]
    if file == AUTOMODEL_FILE:
        base = resolve_model(AUTOMODEL_MODELS[key])[0]
        if "no MTP" in row["notes"]:
            # AutoModel's DeepSeek-V3 and Nemotron V3 Super had no MTP head then (the row's notes).
            base = replace(base, mtp_num_layers=0, mtp_repeated_layer=False)
        return replace(base, seq_length=seq)
    if file == OLMO_CORE_FILE:
        return olmo_core_model(row)
    if file == NANOTRON_FILE:
        return nanotron_model(row)
    defaults = _family_defaults(row["model"]) if file in NVIDIA_FILES else {}
    if file == MOSAIC_FILE:
        # MPTConfig's defaults as the benchmark ran them (the row's notes): GELU MLP, LayerNorm with bias, learned
        # positions, tied embeddings, biases on every linear layer (no_bias false), no dropout.
        defaults = dict(activation="gelu", normalization="layernorm", position_embedding="learned", tie_embeddings=True,
                        add_bias_linear=True, hidden_dropout=0.0, attention_dropout=0.0)
    llama = file == "torchtitan.csv"
    vocab = _int(row["vocab"]) or (250880 if "250k" in row["vocab"] else defaults.get("vocab_size", 51200))
    spec = dict(activation="swiglu" if llama else "gelu", normalization="rmsnorm" if llama else "layernorm",
                position_embedding="rope" if llama else "learned", tie_embeddings=False, add_bias_linear=not llama,
                hidden_dropout=0.0 if llama else 0.1, attention_dropout=0.0 if llama else 0.1)
    if file in TIED_FILES or (file == "opt_bloom_fsdp_papers.csv" and row["model"].startswith(("OPT", "BLOOM"))):
        # Megatron-LM before 2023 (and Megatron-DeepSpeed, BLOOM's fork of it) always shared the output layer with the
        # word embeddings (`untie_embeddings_and_output_weights` arrived in 2023); OPT and BLOOM tie them too (not
        # minGPT, the FSDP paper's GPT-175B, which has its own head).
        spec["tie_embeddings"] = True
    spec.update({k: v for k, v in defaults.items() if k != "vocab_size"})
    return ModelSpec(
        name=re.sub(r"[^a-z0-9.]+", "-", row["model"].lower()).strip("-") or "run",
        num_layers=layers, hidden_size=h, num_attention_heads=heads, num_query_groups=kv,
        ffn_hidden_size=ffn or 4 * h, vocab_size=vocab, seq_length=seq, **spec)


def olmo_core_model(row: dict) -> ModelSpec:
    """An OLMo-core README row's model: the catalog entry of its family with the row's sizes, vocabulary and sequence
    (the catalog's own entry where they match: olmo2-7b, olmo2-13b)."""
    base = resolve_model(OLMO_CORE_BASES["llama" if "llama" in row["model"].lower() else "olmo"])[0]
    h, heads = _int(row["hidden"]), _int(row["heads"])
    sizes = dict(num_layers=_int(row["layers"]), hidden_size=h, num_attention_heads=heads,
                 num_query_groups=_int(row["kv_heads"]) or heads, kv_channels=h // heads,
                 ffn_hidden_size=_int(row["ffn_hidden"]), vocab_size=_int(row["vocab"]), seq_length=_int(row["seq_len"]))
    for name in ("olmo2-7b", "olmo2-13b") if base.name != "llama3-8b" else ():
        entry = resolve_model(name)[0]
        if all(getattr(entry, k) == v for k, v in sizes.items()):
            return entry
    name = "olmo-core-" + re.sub(r"[^a-z0-9.]+", "-", row["model"].split(" (")[0].lower()).strip("-")
    return replace(base, name=name, source=row["source"], **sizes)


def nanotron_model(row: dict) -> ModelSpec:
    """A playbook row's model: Llama blocks (SwiGLU, RMSNorm, RoPE, no biases: the catalog's llama3-8b) with the
    scaling script's sizes, kv heads = heads, the 131,072 vocabulary, and the output layer tied below an FFN of 10,000
    (scripts/scaling_benchmarks.py; the row's notes)."""
    base = resolve_model("llama3-8b")[0]
    h, heads, ffn = _int(row["hidden"]), _int(row["heads"]), _int(row["ffn_hidden"])
    return replace(base, name="nanotron-llama-" + row["params_b"] + "b", source=row["source"],
                   num_layers=_int(row["layers"]), hidden_size=h, num_attention_heads=heads,
                   num_query_groups=_int(row["kv_heads"]) or heads, kv_channels=h // heads, ffn_hidden_size=ffn,
                   moe_ffn_hidden_size=ffn, vocab_size=_int(row["vocab"]), seq_length=_int(row["seq_len"]),
                   tie_embeddings=ffn < 10_000)


def _flops_per_token(row: dict, file: str, model: ModelSpec) -> float | None:
    """The FLOP count the source divided by to get its TFLOP/s."""
    l, h, s, v = model.num_layers, model.hidden_size, model.seq_length, model.vocab_size
    if file == "megatron_narayanan2021.csv" or file == "bigscience_bloom_sweep.csv" or "BLOOM-176B" in row["model"]:
        return 96 * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))  # Narayanan 2021 eq. 3 (hardware, full recompute)
    if "long_sequence" in row["source"] and "NeMo24." in row["notes"]:
        # The H100 table (NeMo 24.03, before NeMo had a flops callback) halves the causal attention term: with
        # the unhalved count its 1M-token runs would reach half the H100's measured flash-attention rate
        # (benchmarks/data/h100_kernels/attention.csv), with the halved one they match it.
        return model_flops_per_token(model, s) - 6.0 * l * s * model.query_width
    # The B200 long-sequence table (NeMo 25.04.rc2) used nemo/utils/flops_formulas.llama3 before causal masks
    # were counted (a 12 s/h attention term; NVIDIA-NeMo issue #14376, Aug 2025): the unhalved count, as below.
    # Halved, its 1M-token runs would hold 83% of the B200's BF16 peak through flash-attention fwd + bwd.
    if file in ("korthikanti2022.csv", "megatron_core_h100_2024.csv") or file in NVIDIA_FILES:
        # eq. 7 / Megatron num_floating_point_operations = the DGX Cloud convention NVIDIA's tables use
        # (benchmarks/data/dgxc_model_flops_convention.csv): no causal halving.
        return model_flops_per_token(model, s)
    return None


def _precision(row: dict, file: str, gpu_arch: str) -> tuple[str, str | None]:
    """(plan precision, fp8 recipe) from the table's precision label."""
    p = row["precision"]
    if "NVFP4" in p:
        return "fp4", None
    if "FP8" not in p and "fp8" not in p.lower():
        return ("fp16" if p.startswith("FP16 (") else "bf16"), None
    if "alt quantization" in p:
        # "MX 32x32 on GB200/B200; 128x128 w / 1x128 act on H100"
        return "fp8", "mxfp8" if gpu_arch == "blackwell" else "blockwise"
    if "MX" in p:
        return "fp8", "mxfp8"
    if "rowwise" in p:
        return "fp8", "blockwise"  # torchao rowwise scaling: a scale per row/column, both copies kept
    if file == "nemo_perf_summary_24.07_and_longseq.csv":
        return "fp8", "delayed"  # NeMo 1.x/2.0 default FP8 recipe (hybrid, amax history)
    if file in (DGXC_FILE, NEMO25_FILE):
        # As the row's notes say: DGXC's NeMo 1.x and 2.0 recipes ran TE's DelayedScaling (fp8_hybrid, amax history),
        # as NeMo 25.02 (v2.2.0) did; NeMo 25.04 and 25.07 per-tensor current scaling.
        return "fp8", "delayed" if "FP8 delayed scaling" in row["notes"] else "current"
    return "fp8", "current"      # Megatron-Bridge "FP8" / "FP8-CS": per-tensor current scaling; torchao tensorwise


def _release(row: dict) -> tuple[int, int] | None:
    """Megatron-Bridge container release (year, month) from the row's notes ("26.04.01 NeMo Container; ...")."""
    m = re.match(r"(\d+)\.(\d+)", row["notes"])
    return (int(m.group(1)), int(m.group(2))) if m else None


def _expandable_segments(row: dict, file: str, gpu: str, fp8_recipe: str | None, task: str, zero: int) -> bool:
    """Whether the run's launcher set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.

    Only Megatron-Bridge's performance scripts did, and only for some runs until May 2026 (NVIDIA-NeMo/Megatron-Bridge
    history of scripts/performance): setup_experiment.py cac49dcd7 (2025-09-27, the 25.09 configs): Llama 3.1 405B
    pre-training on GB200 in FP8-CS; perf_plugins.py 47ff48829 (2025-10-14): also MXFP8; 92161fc0b (2026-02-24):
    Llama 3 70B SFT FP8-CS on H100; by 2026-04-30 (f69d4dd59): 405B also on GB300, and 70B SFT/LoRA in FP8-CS/MXFP8
    on GB200/GB300/H100; 6f24c71f3 (2026-05-12): in the Slurm executor's PERF_ENV_VARS for every run, removed where
    NCCL user buffers are on or for Llama with Megatron-FSDP (the table does not say whether NCCL user buffers were
    on: taken as off). Each release is taken with the scripts as they stood at the end of its month. The other
    sources predate expandable segments or do not say they set them."""
    release = _release(row) if file == "megatron_bridge_perf_summary.csv" else None
    if release is None:
        return False
    key = _model_key(row["model"])
    llama = key.startswith("llama")
    if release >= (26, 6):
        return not (llama and zero >= 2)
    low = fp8_recipe in ("current", "mxfp8")
    if key == "llama3.1_405b" and task == "pretrain" and low:
        gpus = ("gb200", "gb300") if release >= (26, 4) else ("gb200",)
        return gpu in gpus and (fp8_recipe == "current" or release >= (25, 11))
    if key == "llama3_70b" and task == "sft" and low:
        if release >= (26, 4):
            return gpu in ("gb200", "gb300", "h100-sxm")
        return release >= (26, 2) and gpu == "h100-sxm" and fp8_recipe == "current"
    return False


def _group(row: dict, file: str) -> str:
    if file == "megatron_bridge_perf_summary.csv":
        m = re.match(r"(\d+\.\d+)", row["notes"])
        return f"Megatron-Bridge {m.group(1) if m else '?'}"
    if file == "nemo_perf_summary_24.07_and_longseq.csv":
        return "NeMo long-seq" if "long_sequence" in row["source"] else "NeMo 24.07"
    if file == NEMO25_FILE:
        return f"NeMo {row['notes'].split(' ')[1]}"  # its container release: "NeMo 25.04 container; ..."
    if file == AUTOMODEL_FILE:
        return "NeMo AutoModel"
    if file == OLMO_CORE_FILE:
        return "OLMo-core"
    if file == NANOTRON_FILE:
        return "nanotron playbook"
    if file == DGXC_FILE:
        return "DGXC " + row["notes"].split(" container")[0]  # "DGXC NeMo 24.09"
    return {"megatron_narayanan2021.csv": "Narayanan 2021", "korthikanti2022.csv": "Korthikanti 2022",
            "megatron_core_h100_2024.csv": "Megatron-LM H100 2024", "torchtitan.csv": "torchtitan",
            "bigscience_bloom_sweep.csv": "BLOOM sweep", "opt_bloom_fsdp_papers.csv": "OPT/BLOOM/FSDP papers",
            GENCONF_FILE: "genconf H100 (issue 13)", MOSAIC_FILE: "MosaicML llm-foundry"}[file]


def _framework_label(file: str, row: dict) -> str:
    if file in NVIDIA_FILES:
        return "Megatron-Bridge" if file == "megatron_bridge_perf_summary.csv" else "NeMo"
    if file == "torchtitan.csv":
        return "torchtitan"
    if file == MOSAIC_FILE:
        return "Composer FSDP (llm-foundry)"
    if file == AUTOMODEL_FILE:
        return "NeMo AutoModel (FSDP2 + EP)"
    if file == OLMO_CORE_FILE:
        return "OLMo-core (FSDP2)"
    if file == NANOTRON_FILE:
        return "nanotron (TP/PP + DP/ZeRO-1)"
    if file == GENCONF_FILE:
        return "genconf " + re.search(r"framework=(\w+)", row["notes"]).group(1)
    if file == "bigscience_bloom_sweep.csv" or "BLOOM" in row["model"]:
        return "Megatron-DeepSpeed"
    if "ZeRO-3" in row["model"]:
        return "DeepSpeed"
    return "Megatron-LM"


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


def deepspeed_pipe_partition(weights: list[int], parts: int) -> list[int]:
    """Item boundaries of DeepSpeed's pipeline partition as Megatron-DeepSpeed ran it in 2022 (the BLOOM sweep):
    runtime/utils.py partition_balanced's _lprobe fills each stage from the left up to the smallest bottleneck that
    fits, which for weights of 0 and 1 (the layers' here) is ceil(total / parts). BigScience's chronicles-prequel.md ('Re-do', 02-27): "78/12=6.5 - so
    the last stage has 1 block, while the rest have 7". DeepSpeed since rebalances the remainder over the last
    stages; the stage with the most layers is the same either way."""
    cap = -(-sum(weights) // parts)
    bounds, load = [0], 0
    for i, w in enumerate(weights):
        if load + w > cap and len(bounds) < parts:
            bounds.append(i)
            load = 0
        load += w
    bounds += [len(weights)] * (parts + 1 - len(bounds))
    return bounds


def deepspeed_pipe_split(num_layers: int, pp: int, *, embedding_weighted: bool) -> dict:
    """The ParallelPlan split fields of Megatron-DeepSpeed's GPTModelPipe partition (partition_method
    'type:transformer', its default, or 'type:transformer|embedding', BigScience's from 2022-02-28): the input
    embedding opens the first stage, the tied output embedding closes the last, and each weighs one layer under
    '|embedding', nothing otherwise. {} where megatron's even split is the same; empty too where no megatron split
    expresses it."""
    e = int(embedding_weighted)
    weights = [e] + [1] * num_layers + [e]
    bounds = deepspeed_pipe_partition(weights, pp)
    counts = [sum(1 for i in range(bounds[s], bounds[s + 1]) if 0 < i <= num_layers) for s in range(pp)]
    if len(set(counts)) == 1 or min(counts) == 0:
        return {}  # even, or a stage without layers (megatron has no such split)
    if pp > 2 and embedding_weighted and counts == [counts[1] - 1] + [counts[1]] * (pp - 2) + [counts[1] - 1]:
        return {"pp_embedding_as_layer": True, "pp_loss_as_layer": True}
    middle = counts[1:-1]
    if len(set(middle)) > 1:
        return {}
    split = {}
    if not middle or counts[0] != middle[0]:
        split["pp_first_stage_layers"] = counts[0]
    if not middle or counts[-1] != middle[0]:
        split["pp_last_stage_layers"] = counts[-1]
    return split


def bridge_mla_layout(model: ModelSpec, pp: int, vp: int) -> str | None:
    """The pipeline layout Megatron-Bridge's DeepSeek-V3 and Kimi K2 recipes set (recipes/deepseek/deepseek_v3.py
    _get_deepseek_v3_pipeline_layout, recipes/kimi/kimi_k2.py _get_kimi_k2_pipeline_layout): the embedding and
    an equal share of layers on the first virtual stage, the same share on every middle one, and the remainder
    with the MTP layers and the loss on the last. Their maps stop at 16 virtual stages; for 32 (a 25.11 row with
    pp 8, vp 4) genconf assumes one layer beside the embedding and two per stage after, none beside the loss."""
    stages = pp * vp
    if pp == 1:
        return None
    mtp = "m" * model.mtp_num_layers
    if stages == 32 and model.num_layers == 61:
        return f"Et|(t*2|)*30{mtp}L"
    per = -(-model.num_layers // stages)
    last = model.num_layers - per * (stages - 1)
    return f"Et*{per}|(t*{per}|)*{stages - 2}" + (f"t*{last}" if last > 1 else "t" * last) + f"{mtp}L"


SQUAD_DOC_TOKENS = 240
"""The mean length of the SQuAD examples NVIDIA's fine-tuning benchmarks pack into each sequence ("SFT on SQuAD
packed to 4096"; Megatron-Bridge's SFT and LoRA recipes train on SQuAD with packed sequences): TFDS squad/v1.1 holds
94.06 MiB in 98,169 examples, about 1,000 bytes each with the context repeated per question and the ids, titles
and answers; at about 4 bytes per Llama token and the prompt template's few tokens, about 240 tokens."""

LORA_RANK = 32
"""The adapter rank of the published LoRA rows: Megatron-Bridge peft/lora.py's LoRA.dim default (NeMo 2's likewise)."""


def dgxc_plan_fields(row: dict, plan: ParallelPlan) -> dict:
    """ParallelPlan fields a DGXC row's notes state beyond the NVIDIA defaults (each cited there from the recipe's
    script or NeMo recipe at the commit its setup.sh checks out): TP communication overlap off (NeMo 2.0 LoRA and the
    8B recipes add no overlapping MegatronCommOverlapCallback), the pipeline split counting the embedding and the loss
    as layers (NeMo 2.0's Llama 3.1 405B recipe), plain DDP without the distributed optimizer (NeMo 2.0's LoRA
    recipes), the LoRA adapters as the recipe sets them (dim and target_modules), fp32 gradient reduction where the
    recipe ran without performance mode (DeepSeek-V3 at NeMo 7a8f1cc7), the precision-aware optimizer NeMo's
    set_primary_perf_configs turns on for BF16 (r2.3.0 on), megatron-core's per-layer CUDA graphs (enable_cuda_graph:
    the GB200 Nemotron-4 launcher), explicit first / last pipeline stage layer counts and the recomputed modules
    (DeepSeek-V3), and the expert TP degree (Grok-1)."""
    notes = row["notes"]
    fields: dict = {}
    if "gradients reduced in fp32" in notes:
        fields["grad_dtype"] = "fp32"
    if plan.precision == "bf16" and "precision-aware optimizer:" in notes:
        fields["precision_aware_optimizer"] = True
    if "CUDA graphs on (enable_cuda_graph" in notes:
        fields.update(cuda_graph_impl="local", cuda_graph_scope=())  # megatron-core's per-layer graphs
    stages = re.search(r"first pipeline stage (\d+) layers, last (\d+)", notes)
    if stages and plan.pp > 1:
        fields.update(pp_first_stage_layers=int(stages.group(1)), pp_last_stage_layers=int(stages.group(2)))
    modules = re.search(r"selective recompute \((\w+)\)", row["recompute"])
    if modules and modules.group(1) in RECOMPUTE_MODULES:
        fields["recompute_modules"] = () if modules.group(1) == "core_attn" else (modules.group(1),)
    expert_tp = re.search(r"expert TP (\d+)", notes)
    if expert_tp and plan.ep > 1:
        fields["etp"] = int(expert_tp.group(1))
    if "TP comm overlap off" in notes:
        fields["tp_comm_overlap"] = False
    if plan.pp > 1 and "pipeline split counts the embedding and the loss as layers" in notes:
        fields.update(pp_embedding_as_layer=True, pp_loss_as_layer=True)
    if "distributed optimizer off" in notes:
        fields["zero_stage"] = 0
    lora = re.search(r"LoRA dim (\d+) on ([\w, ]+?):", notes)
    if plan.lora_rank and lora:
        fields.update(lora_rank=int(lora.group(1)), lora_targets=tuple(lora.group(2).replace(" ", "").split(",")))
    return fields


def _not_modelled(row: dict) -> str | None:
    key = _model_key(row["model"])
    if "Automodel" in row["source"]:
        if key not in AUTOMODEL_MODELS:
            return "model not in genconf's catalog"
        if not row["ep"] and key == "gpt_oss_20b":
            # The page prints EP '-' from its first version (NVIDIA-NeMo/Automodel@01926a5c:docs/performance-summary.md)
            # on; its config was read at 037e04a6 only (examples/benchmark/configs/gptoss_20b_te_deepep.yaml:
            # ep_size 8).
            return ("expert-parallel degree not stated (the table prints '-'; its benchmark config is not read at the "
                    "row's commit): the layout cannot be pinned")
        if not row["ep"] and key.startswith("gpt_oss"):
            return ("expert-parallel degree not stated (the table prints '-'; its benchmark config changed between "
                    "the row's versions): the layout cannot be pinned")
        if (_int(row["cp"]) or 1) > 1:
            return ("PyTorch context parallelism under FSDP2 (attn_implementation sdpa, 'required for cp>1'): genconf "
                    "models Transformer Engine's context parallelism, which FSDP plans do not use")
    for prefix, why in NOT_MODELLED.items():
        if key.startswith(prefix):
            return why
    if "torchtitan" in row["source"] and "rowwise" in row["precision"]:
        return ("torchao float8 with rowwise scales: its own quantization kernels and rowwise-scaled GEMMs, "
                "measured slower than BF16 here; genconf prices Transformer Engine's FP8 recipes only")
    if "torchtitan" in row["source"] and (_int(row["cp"]) or 1) > 1:
        return ("PyTorch's experimental context parallelism (torch.distributed.tensor.experimental.context_parallel"
                ", SDPA ring attention) under FSDP2: genconf models Transformer Engine's context parallelism, "
                "which FSDP plans do not use")
    return None


def _row_to_run(row: dict, file: str, label: str) -> tuple[Run | None, str]:
    why = _not_modelled(row)
    if why:
        return None, why
    key = _model_key(row["model"])
    if key not in CATALOG_KEYS and file not in (GENCONF_FILE, AUTOMODEL_FILE, DGXC_FILE) and (
            not _int(row["layers"]) or not _int(row["hidden"]) or not _int(row["heads"])):
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
    notes: list[str] = []
    cp = _int(row["cp"]) or 1
    ep = _int(row["ep"]) or 1
    long_seq = "long_sequence" in row["source"]
    if long_seq:
        # The long-sequence table's GPU column disagrees with its own TP x PP x CP x DP (and with its global
        # batch) by 4x for the B200 rows: the layout is what the table states; per-GPU rates do not depend on it.
        dp = _int(row["dp"]) or 1
        if tp * pp * cp * dp != num_gpus:
            notes.append(f"GPU count {num_gpus} != tp*pp*cp*dp {tp * pp * cp * dp}: layout taken as stated")
            num_gpus = tp * pp * cp * dp
    else:
        dp = num_gpus // (tp * pp * cp) if file in NVIDIA_FILES else (_int(row["dp"]) or num_gpus // (tp * pp * cp))
    if tp * pp * cp * dp != num_gpus:
        return None, f"tp*pp*cp*dp = {tp * pp * cp * dp} != {num_gpus} GPUs"
    if ep > 1 and file in NVIDIA_FILES and (tp * cp * dp) % ep:
        # Megatron's MoE parallel folding takes the expert-parallel group from a stage's tp x cp x dp ranks
        # (with expert TP 1): a larger EP cannot be built.
        return None, f"inconsistent row: ep {ep} does not divide the {tp * cp * dp} ranks of a pipeline stage"
    unknown = []
    mbs = _int(row["mbs"])
    if mbs is None and long_seq:
        mbs = 1
        notes.append("micro-batch not given: 1, as every long-context recipe uses (global batch = dp x cp-ranks' 1)")
    vp = _int(row["vp"])
    if file == "torchtitan.csv" and pp > 1 and vp is None:
        # torchtitan's pipeline defaults (parallelisms/pipeline_llama.py at the rows' commit): a single-stage
        # schedule (1F1B) holds one stage per rank, a looped one (Interleaved 1F1B) two when no split points are
        # given, and the local batch is cut into pipeline_parallel_microbatches = pp x stages per rank.
        vp = 2 if "Interleaved" in row["notes"] else 1
        local_batch = _int(row["gbs"]) // dp if _int(row["gbs"]) else None
        if mbs is None and local_batch and local_batch % (pp * vp) == 0:
            mbs = local_batch // (pp * vp)
            notes.append(f"micro-batch {mbs}: torchtitan's default {pp * vp} pipeline micro-batches of the local "
                         f"batch {local_batch}")
    if mbs is None:
        unknown.append("mbs")
        mbs = 1
    if vp is None:
        vp = 1
        if pp > 1 and file in ("megatron_narayanan2021.csv", "megatron_core_h100_2024.csv") + NVIDIA_FILES:
            unknown.append("vp")
    recompute = _recompute(row["recompute"])
    dense_recipe = (bridge_dense_recipe(int(label.rsplit("#", 1)[1]))
                    if file == "megatron_bridge_perf_summary.csv" and not model.is_moe else None)
    if recompute is None:
        if dense_recipe is None:
            unknown.append("recompute")
        recompute = "selective" if file not in NVIDIA_FILES else "none"  # a known config sets it below
    local = re.search(r"local batch size (\d+)", row["notes"])
    gbs = _int(row["gbs"]) or (int(local.group(1)) * dp if local else mbs * dp)
    precision, fp8_recipe = _precision(row, file, cluster.gpu.arch)
    fsdp = file in ("torchtitan.csv", MOSAIC_FILE, AUTOMODEL_FILE, OLMO_CORE_FILE)
    # DeepSpeed: Narayanan 2021 Table 2's ZeRO-3 runs, and Megatron-DeepSpeed (BLOOM) with ZeRO-0/1.
    deepspeed = "ZeRO-3" in row["model"] or "ZeRO" in row["precision"]
    zero = 3 if "ZeRO-3" in row["model"] else 0 if "ZeRO-0" in row["precision"] else 1
    megatron_fsdp = re.search(r"FSDP=(\d+)", row["notes"])
    if file in NVIDIA_FILES:
        zero = 3 if (megatron_fsdp and int(megatron_fsdp.group(1)) > 0) else 1
    grad_dtype = "fp32" if ("BF16 optimizer" in row["notes"] or "BF16_Optimizer" in row["precision"]) else None
    if file == "nemo_perf_summary_24.07_and_longseq.csv" and "long_sequence" not in row["source"]:
        # NeMo 1.x's performance configs (NeMo-Framework-Launcher conf/training/*) reduce gradients in bf16:
        # optim.grad_sync_dtype: bf16 with distributed_fused_adam.
        grad_dtype = "bf16"
    if file in ("megatron_bridge_perf_summary.csv", NEMO25_FILE, DGXC_FILE):
        # Both stacks' performance scripts reduce gradients in bf16: Megatron-Bridge's set_basic_perf_overrides
        # (scripts/performance/utils/helpers.py) sets ddp.grad_reduce_in_fp32 = False, NeMo 2.0's
        # trainer.plugins.grad_reduce_in_fp32 = False (DGXC's NeMo 1.x recipes: optim.grad_sync_dtype bf16; v2.2.0 scripts/llm/performance/pretrain_*.py, v2.3.0
        # scripts/performance/utils.py:351, v2.4.0 scripts/performance/helpers.py:224).
        grad_dtype = "bf16"
    modern = file in ("torchtitan.csv", "megatron_core_h100_2024.csv", MOSAIC_FILE, AUTOMODEL_FILE,
                      OLMO_CORE_FILE, NANOTRON_FILE) + NVIDIA_FILES
    if file == GENCONF_FILE:
        # The run's own plan, as its notes give it: framework, ZeRO stage, layer spec.
        fields = dict(re.findall(r"(framework|zero|layer_spec)=(\w+)", row["notes"]))
        deepspeed, fsdp = fields["framework"] == "deepspeed", fields["framework"] == "fsdp"
        zero = int(fields["zero"])
        modern = fields.get("layer_spec", "te") == "te"
    if file == MOSAIC_FILE:
        # Composer FSDP: FULL_SHARD or SHARD_GRAD_OP; mixed_precision DEFAULT reduces gradients in fp32, PURE in bf16.
        zero = 2 if "SHARD_GRAD_OP" in row["notes"] else 3
        grad_dtype = "bf16" if "mixed_precision PURE" in row["notes"] else "fp32"
        if precision == "fp8":
            fp8_recipe = "delayed"  # Transformer Engine v0.10's default recipe (DelayedScaling)
    if file == AUTOMODEL_FILE:
        # AutoModel's MoE parallelizer: fully_shard with the row's reshard_after_forward (ZeRO-3 when true, ZeRO-2
        # when false; the notes cite the config or default each row ran) and MixedPrecisionPolicy(param_dtype bf16,
        # reduce_dtype float32).
        zero = 3 if "reshard_after_forward true" in row["notes"] else 2
        grad_dtype = "fp32"
        ga = re.search(r"each of the GA (\d+) steps runs its own pipeline schedule", row["notes"])
        if ga:
            # Under a pipeline each accumulation step is a schedule of its own (its own fill and drain, and its own
            # gradient reduce: no no_sync under PP): typed as one schedule, the rate it runs at (the optimizer
            # step is then counted once a schedule, a few ms of a seconds-long step).
            gbs //= int(ga.group(1))
    if file == OLMO_CORE_FILE:
        # OLMo-core's FSDP2 (the row's notes): fully_shard per block with reshard_after_forward true (ZeRO-3; the
        # last block's kept, as FSDP would prefetch it at once), MixedPrecisionPolicy(bf16 params, fp32 reduce).
        # torchao float8 with dynamic tensorwise scales is the per-tensor current recipe (_precision), as
        # torchtitan's rows; its FP8 all-gather is not genconf's fp8_param_gather (megatron's FP8 parameters).
        zero = 3
        grad_dtype = "fp32"
    if file == NANOTRON_FILE:
        # nanotron as the playbook ran it (the row's notes): Megatron-style TP with sequence parallelism (tp_mode
        # REDUCE_SCATTER) and 1F1B pipelining, typed as genconf's megatron; its own DP: plain DDP (ZeRO-0, every
        # rank keeps the optimizer state) or ZeRO-1 (optimizer state sharded over DP, gradients reduce-scattered),
        # the same split as megatron's DDP / distributed optimizer; gradients accumulated and reduced in fp32
        # (accumulate_grad_in_fp32). Fused layers with flash attention: nanotron runs flash-attn 2 and a Triton
        # RMSNorm, no Transformer Engine, but megatron's local spec is priced with unfused attention (s x s scores
        # through HBM), so the rows take the TE spec with attention_kernel flash2; no fused weight-gradient
        # accumulation into main_grad (nanotron's fp32 accumulator adds through hooks); its async TP linear
        # communication overlaps as megatron does by default (not TE's userbuffers: tp_comm_overlap off); its
        # vocab-parallel cross entropy as megatron's; no torch.compile.
        zero = int(re.search(r"ZeRO-(\d)", row["notes"]).group(1))
        grad_dtype = "fp32"
    async_tp = re.search(r"async ?TP", row["notes"], re.IGNORECASE) is not None  # torchtitan's notes: three spellings
    lora = "lora" in row["model"].lower() or "LoRA Perf" in row["notes"]
    task = "lora" if lora else "sft" if "SFT" in row["model"] or "SFT Perf" in row["notes"] else "pretrain"
    recipe = (bridge_moe_recipe(int(label.rsplit("#", 1)[1]))
              if file == "megatron_bridge_perf_summary.csv" and model.is_moe else None)
    plan = ParallelPlan(
        framework="fsdp" if fsdp else "deepspeed" if deepspeed else "megatron", tp=tp, pp=pp, vp=vp, cp=cp, ep=ep, dp=dp,
        mbs=mbs, gbs=gbs, etp=1 if (model.is_moe and file in NVIDIA_FILES) else None,
        seq_length=model.seq_length, zero_stage=3 if file == "torchtitan.csv" else zero, recompute=recompute,
        # NVIDIA's fine-tuning rows train on SQuAD packed into each sequence: documents attend within themselves.
        packed_doc_tokens=SQUAD_DOC_TOKENS if task != "pretrain" and file in NVIDIA_FILES else None,
        sequence_parallel=tp > 1 and (file in ("korthikanti2022.csv", "megatron_core_h100_2024.csv", "torchtitan.csv",
                                               NANOTRON_FILE) + NVIDIA_FILES and "no sequence parallel" not in row["recompute"]),
        grad_dtype=grad_dtype,
        precision=precision, fp8_recipe=fp8_recipe, layer_spec="te" if modern else "local",
        # Megatron-LM and Megatron-DeepSpeed (2021-22) built megatron's fused softmax/bias kernels at start-up.
        fused_kernels=not modern and file != GENCONF_FILE,
        # Megatron-LM fused weight-gradient accumulation into main_grad from 83b1e42 (February 2022): Narayanan
        # 2021's runs predate it.
        grad_accum_fusion=file not in ("megatron_narayanan2021.csv", NANOTRON_FILE),
        # PyTorch's checkpoint stops at a layer's last saved tensor from torch 2.1: llm-foundry's large-scale H100 table
        # came with 5e85bd62, whose setup.py pins torch 2.1; its other tables date from 2023: 300cc5c pinned torch
        # 1.13.1 (the A100 40GB table, two A100 80GB rows), and b2a43a1 allowed 1.13.1-2.1.0 with the default image
        # mosaicml/pytorch:1.13.1 in submit_benchmarks.py (most likely 1.13.1; the script does not record it).
        checkpoint_early_stop=file != MOSAIC_FILE or "Large Scale" in row["source"],
        tp_comm_overlap=(file == "megatron_core_h100_2024.csv" or file in NVIDIA_FILES or async_tp) and tp > 1,
        # DGXC's NeMo 1.x FP8 recipes set +model.fp8_params, NeMo 2.0's bf16_with_fp8_mixed fp8_params (the row's notes).
        fp8_param_gather=(file == "megatron_bridge_perf_summary.csv" and fp8_recipe in ("current", "mxfp8"))
        or (file == DGXC_FILE and precision == "fp8" and "fp8 param gather" in row["notes"]),
        # Compiled where the notes say so, and where the run's config was: torchtitan's Async TP requires compile
        # (parallelize_llama.py: "Async TP requires --training.compile"), and its docs/performance.md 405B rows ran
        # train_configs/llama3_405b.toml, compile = true at 9515a140b, the commit that published them (the 8B and
        # 70B configs there: compile = false).
        torch_compile=fsdp and ("compile" in row["notes"] or async_tp
                                or (file == "torchtitan.csv" and "performance.md" in row["source"]
                                    and "405B" in row["model"])),
        expandable_segments=_expandable_segments(row, file, cluster.gpu.name, fp8_recipe, task, zero),
        # The stacks' flash attention as they ran: torchtitan's SDPA lists FlashAttention-2 first on Hopper (cuDNN
        # only from Blackwell); llm-foundry's benchmarks ran attn_impl triton (the row's notes).
        # OLMo-core with compile=True runs PyTorch's SDPA (use_flash False; the row's notes), as torchtitan.
        # nanotron calls flash-attn's flash_attn_varlen_func (the row's notes).
        attention_kernel=("flash2" if file in ("torchtitan.csv", OLMO_CORE_FILE, NANOTRON_FILE) else "triton" if file == MOSAIC_FILE
                          else "auto"),
        # llm-foundry's MPT loss_fn default: flash-attn's fused cross entropy (the row's notes).
        # OLMo-core's fused_loss=True: its Triton cross entropy (flash-attn's port), where the row's script set it
        # and the logits reached it in 16 bits; before 00d34f69 (2024-11-01) the model's forward cast them to fp32
        # (the row's notes: "on fp32 logits"), the kernel saved them and wrote an fp32 gradient: the unfused loss's
        # bytes. compile_loss=True, PyTorch's cross entropy under torch.compile, is priced as a fused one: AOTAutograd's
        # partitioner saves the 16-bit logits and the fp32 log-sum-exp, not the fp32 log-softmax, and inductor
        # fuses the upcast, the reduction and the gradient into single passes over the logits.
        fused_loss=file == MOSAIC_FILE or (file == OLMO_CORE_FILE and "on fp32 logits" not in row["notes"]
                                           and ("fused_loss=True" in row["notes"] or "compile_loss=True" in row["notes"])),
        # megatron's EP all-to-all overlap, where the row's benchmark config turned it on (moe_a2a_overlap)
        moe_ep_overlap=recipe is not None and recipe["moe_a2a_overlap"] == "on",
        # its token dispatcher (flex+deepep / flex+hybridep: megatron's flex dispatcher with that backend)
        moe_dispatcher=(("hybridep" if "dispatcher hybridep" in row["notes"] else "deepep") if file == AUTOMODEL_FILE
                        else moe_dispatcher_of(recipe)),
        # AutoModel's "fake balanced gate (ideal routing)": FakeBalancedGate without noise gives token i the experts
        # i k .. i k + k - 1 mod E (nemo_automodel/components/moe/layers.py at 89e3a9fd), consecutive experts on one
        # or two EP ranks; megatron's force-balanced routing draws them from random logits (the default).
        moe_routing="contiguous" if file == AUTOMODEL_FILE and "fake balanced gate" in row["notes"] else "random",
        # NeMo's and Megatron-Bridge's LoRA recipes: the default adapters (peft/lora.py: dim 32 on linear_qkv,
        # linear_proj, linear_fc1 and linear_fc2).
        lora_rank=LORA_RANK if lora else 0,
        # NeMo 24.07's fine-tuning ran NeMo 1.x (megatron_gpt_finetuning_config.yaml: lora_tuning.target_modules
        # ['attention_qkv'], adapter_dim 32); Megatron-Bridge's recipes adapt all four linears.
        lora_targets=("linear_qkv",) if lora and file == "nemo_perf_summary_24.07_and_longseq.csv" else LORA_TARGETS,
        **_cuda_graphs(recipe))
    if file == DGXC_FILE:
        fields = dgxc_plan_fields(row, plan)
        plan = replace(plan, **fields)
    modules = tuple(m for m in (recipe or {}).get("recompute_modules", "").split(";") if m in RECOMPUTE_MODULES)
    if modules:
        # The MoE row's recipe recomputes these modules (bridge_moe_recipes.csv, from its config's recompute_modules).
        plan = replace(plan, recompute="selective", recompute_modules=modules if modules != ("core_attn",) else ())
        unknown = [u for u in unknown if u != "recompute"]
        notes.append(f"selective recompute of {', '.join(modules)} ({recipe['bridge_ref']} {recipe['config_name']})")
    if file == "bigscience_bloom_sweep.csv" and pp > 1:
        # 'type:transformer|embedding' from 02-28 on (the rows' notes), and for the 106-layer 'Re-do' rows of 02-27
        # already (chronicles-prequel.md: "HIDDEN=12288; NLAYERS=106; regex partition_method='type:transformer|embed'").
        embedding = "embedding-balanced PP partition" in row["notes"] or (
            "section 'Re-do'" in row["notes"] and model.num_layers == 106)
        split = deepspeed_pipe_split(model.num_layers, pp, embedding_weighted=embedding)
        if split:
            plan = replace(plan, **split)
            notes.append(f"DeepSpeed's pipeline partition ({'type:transformer|embedding' if embedding else 'type:transformer'}): "
                         f"{', '.join(f'{k}={v}' for k, v in split.items())}")
    if file == "megatron_bridge_perf_summary.csv" and row["model"].startswith("DeepSeekV3"):
        # Megatron-Bridge's DeepSeek-V3 recipes keep Adam's moments in BF16 under the precision-aware optimizer
        # (recipes/deepseek/deepseek_v3.py:161-164 at v0.4.1 and v0.4.2, :205-208 at v0.5.0; perf_recipes/deepseek/
        # common.py:42-45 at v0.6.0).
        plan = replace(plan, precision_aware_optimizer=True, adam_moments_dtype="bf16")
        notes.append("precision-aware optimizer with BF16 Adam moments (Megatron-Bridge's DeepSeek-V3 recipe)")
    if model.mla and pp > 1 and plan.pp_first_stage_layers is None and plan.pp_last_stage_layers is None:
        # A row that states its first/last stage counts (DGXC's DeepSeek-V3, its notes) ran that split, not the map.
        plan = replace(plan, pp_layout=bridge_mla_layout(model, pp, plan.vp))
        notes.append(f"pipeline layout {plan.pp_layout} (Megatron-Bridge's DeepSeek-V3 / Kimi K2 layout map)")
    if dense_recipe is not None:
        # The dense row's benchmark config, as it ran (benchmarks/bridge_dense_recipes.csv).
        fields = dense_recipe_fields(dense_recipe)
        if tp == 1:
            fields["tp_comm_overlap"] = False
        if pp == 1:  # megatron applies the split settings only to a pipeline
            fields.pop("pp_embedding_as_layer", None)
            fields.pop("pp_loss_as_layer", None)
        plan = replace(plan, **fields)
        notes.append(f"as configured: {dense_recipe['bridge_ref']} {dense_recipe['config_name'].split(' ')[0]}")
    if recipe is not None and precision == "fp4" and row["model"].startswith("Nemotron_3_Super"):
        # Megatron-Bridge's Nemotron 3 Super NVFP4 recipes train with nemotron_3_super_bf16_with_nvfp4_mixed
        # (training/mixed_precision.py: first_last_layers_bf16, num_layers_at_end_in_bf16 = 14), every release
        # (v0.4.2 scripts/performance/configs/nemotronh/nemotron_3_llm_pretrain.py:43 to v0.6.0
        # perf_recipes/nemotronh/common.py). Their performance recipes turn fp8-current's BF16 end layers off
        # (perf_recipes/_common.py _perf_precision), which a ParallelPlan's default (none) already says.
        plan = replace(plan, bf16_layers_end=14)
        notes.append("the last 14 layers in BF16 (nemotron_3_super_bf16_with_nvfp4_mixed)")
    if recipe is not None and recipe["moe_a2a_overlap"] == "on":
        notes.append(f"EP all-to-all overlap on ({recipe['bridge_ref']} {recipe['config_name']})")
    source = recipe or dense_recipe
    if plan.cuda_graph_impl != "none" and source is not None:  # else the row's own notes cite its graphs (DGXC)
        notes.append(f"CUDA graphs {plan.cuda_graph_impl} {' '.join(plan.cuda_graph_scope) or 'whole layers'} "
                     f"({source['bridge_ref']} {source['config_name'].split(' ')[0]})"
                     + ("; beside the EP overlap this needs megatron-core 0.18+: evaluated with the rules off"
                        if plan.moe_ep_overlap and plan.cuda_graph_impl == "local" else ""))
    if file == "megatron_bridge_perf_summary.csv" and row["model"] == "GPT OSS 120B" and row["notes"].startswith("26.06.01"):
        # Megatron-Bridge docs/performance-summary-archive.md:90 (footnote gpt-oss-note): "Performance regression
        # in GPT-OSS 120B pre-training is a known issue" (NVIDIA/cudnn-frontend #256: the fused MoE grouped-GEMM
        # backward ~10x slower in cudnn-frontend 1.24, which v0.5.1 pinned). Scored as published, marked.
        notes.append("NVIDIA footnote: known performance regression in this release (cudnn-frontend #256)")
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
        if file in NVIDIA_FILES:
            notes.append("tokens/s from the published TFLOP/s with the DGX Cloud model-FLOPs convention")
    elif from_tflops is not None and abs(tokens / from_tflops - 1) > 0.25 and file not in NVIDIA_FILES:
        # The row's derived tokens/s (from s/iter and batch) contradicts its own TFLOP/s.
        return None, f"inconsistent row: tokens/s {tokens:.0f} vs {from_tflops:.0f} implied by its TFLOP/s"
    mem = _float(row["mem_gib_per_gpu"])
    if mem is not None and "selective" in row["recompute"] and file == "torchtitan.csv":
        # torchtitan's per-op selective checkpointing keeps a different set of tensors than Megatron's
        # selective recompute, which is what genconf models: compare throughput only.
        mem = None
    return Run(source=row["source"][:90], file=file, label=label, model=model, cluster=cluster, plan=plan,
               measured_tokens_per_s_per_gpu=tokens, measured_mem_gib=mem, unknown=tuple(unknown), notes=notes,
               group=_group(row, file), precision_label=row["precision"].split(" (")[0][:24],
               framework_label=_framework_label(file, row), task=task, configured=dense_recipe is not None), ""
