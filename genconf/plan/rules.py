"""The rule book: every rule that spans the model, the cluster and the plan, with a name, a severity and a
message that gives the numbers and the nearest fix. The search, the CLI and `genconf check` all use it."""

from __future__ import annotations

import math

from collections.abc import Callable
from dataclasses import dataclass

from genconf.plan import kernels, limits, precision
from genconf.plan.counting import exact_param_count
from genconf.plan.memory import GIB, MemoryEstimate, offloaded_activation_bytes
from genconf.plan.pipeline import bubble_fraction, largest_chunk_layers, layout_mtp_layers, stage_layers
from genconf.plan.specs import ClusterSpec, ModelSpec, ParallelPlan

ERROR, WARNING = "error", "warning"


@dataclass(frozen=True, slots=True)
class Context:
    model: ModelSpec
    cluster: ClusterSpec
    plan: ParallelPlan
    num_gpus: int


@dataclass(frozen=True, slots=True)
class Violation:
    rule: str
    severity: str
    message: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.message}"


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    severity: str
    doc: str
    check: Callable[[Context], str | None]


def _divisors(n: int) -> list[int]:
    return limits.divisors(n)  # O(sqrt n): range(1, n + 1) took minutes for --gpus 10**8 (issue 15)


def _nearest(value: int, candidates: list[int]) -> int:
    return min(candidates, key=lambda c: (abs(c - value), -c)) if candidates else 1


def _world_size(c: Context) -> str | None:
    p = c.plan
    if p.world_size != c.num_gpus:
        return (f"dp({p.dp}) * cp({p.cp}) * tp({p.tp}) * pp({p.pp}) = {p.world_size} != world size ({c.num_gpus}); "
                f"dp would be {c.num_gpus / (p.tp * p.pp * p.cp):g}")
    return None


def whole_nodes_error(num_gpus: int, gpus_per_node: int) -> str | None:
    """A job takes whole nodes, or part of one."""
    if num_gpus < 1:
        return f"the number of GPUs must be positive, got {num_gpus}"
    if num_gpus > gpus_per_node and num_gpus % gpus_per_node:
        lower, upper = num_gpus // gpus_per_node * gpus_per_node, -(-num_gpus // gpus_per_node) * gpus_per_node
        return f"{num_gpus} GPUs is not a whole number of {gpus_per_node}-GPU nodes; use {lower} or {upper}"
    return None


def _whole_nodes(c: Context) -> str | None:
    return whole_nodes_error(c.num_gpus, c.cluster.gpus_per_node)


def _nearest_tp(c: Context) -> int:
    """The TP degree nearest the plan's that divides the heads and the KV heads (and a hybrid model's Mamba heads and
    groups) and stays inside an NVLink domain: the nearest divisor of the heads alone (8 for 6 of Nemotron-3 Nano's
    32) broke the KV-head rule next (its 2)."""
    domain = c.cluster.nvlink_domain
    common = math.gcd(c.model.num_attention_heads, c.model.num_query_groups)
    if c.model.is_hybrid:  # and the Mamba heads and groups (hybrid_conflict)
        common = math.gcd(common, c.model.mamba_num_heads, c.model.mamba_num_groups)
    return _nearest(c.plan.tp, [t for t in _divisors(common) if domain % t == 0])


def _tp_heads(c: Context) -> str | None:
    a, tp = c.model.num_attention_heads, c.plan.tp
    if a % tp:
        return f"tp ({tp}) must divide num_attention_heads ({a}); nearest: tp={_nearest_tp(c)}"
    return None


def _tp_groups(c: Context) -> str | None:
    g, tp = c.model.num_query_groups, c.plan.tp
    if g % tp:
        return f"tp ({tp}) must divide num_query_groups ({g}, the KV heads); nearest: tp={_nearest_tp(c)}"
    return None


def _tp_ffn(c: Context) -> str | None:
    f, tp = c.model.moe_ffn_hidden_size if c.model.is_moe else c.model.ffn_hidden_size, c.plan.tp
    if f % tp:
        return f"tp ({tp}) must divide ffn_hidden_size ({f})"
    return None


def _tp_domain(c: Context) -> str | None:
    domain, tp = c.cluster.nvlink_domain, c.plan.tp
    if tp > domain or domain % tp:
        best = max(d for d in _divisors(domain) if d <= min(tp, domain))
        return f"tp ({tp}) must stay inside one NVLink domain of {domain} GPUs (and divide it); nearest: tp={best}"
    return None


def _pipeline_split(c: Context) -> str | None:
    try:
        stage_layers(c.model.num_layers, c.plan)
    except ValueError as exc:
        if c.plan.pp_layout is not None:
            return f"{exc} (--pp-layout {c.plan.pp_layout!r})"
        return f"{exc}; set --pp to a divisor of {c.model.num_layers} or an uneven split (first/last stage layers)"
    return None


def _vp_needs_pp(c: Context) -> str | None:
    if c.plan.vp > 1 and c.plan.pp == 1:
        return f"vp ({c.plan.vp}) needs pipeline parallelism (pp > 1)"
    return None


def _interleave_microbatches(c: Context) -> str | None:
    p = c.plan
    m = p.num_microbatches
    if p.vp > 1 and (m < p.pp or m % p.pp):
        return (f"interleaved schedule needs micro-batches ({m}) to be a multiple of pp ({p.pp}) "
                f"(megatron-core schedules.py); use --global-batch {max(p.pp, -(-m // p.pp) * p.pp) * p.mbs * p.dp}")
    return None


def _batch(c: Context) -> str | None:
    p = c.plan
    unit = p.mbs * p.dp
    if p.gbs % unit:
        lower, upper = max(unit, p.gbs // unit * unit), -(-p.gbs // unit) * unit
        nearest = f"{lower}" if lower == upper else f"{lower} or {upper}"
        return f"global batch ({p.gbs}) must be divisible by mbs x dp ({p.mbs} x {p.dp} = {unit}); nearest: {nearest}"
    return None


def _cp_sequence(c: Context) -> str | None:
    p = c.plan
    if p.cp > 1 and p.seq_length % (2 * p.cp):
        return (f"sequence length ({p.seq_length}) must be divisible by 2 x cp ({2 * p.cp}): causal load balancing "
                f"splits it into 2 x cp chunks")
    return None


def _cp_needs_te(c: Context) -> str | None:
    if c.plan.cp > 1 and c.plan.layer_spec != "te":
        return "context parallelism needs Transformer Engine attention (--layer-spec te)"
    if c.plan.cp > 1 and c.plan.precision == "fp32":
        # TE runs fp32 attention unfused (its flash and fused kernels take fp16/bf16), which CP does not support.
        return "context parallelism needs TE's flash or fused attention, which take fp16/bf16: not --precision fp32"
    return None


def _mla_needs_te(c: Context) -> str | None:
    # megatron-core 0.16.1 multi_latent_attention.py:162 builds its core attention with k_channels and v_channels (the
    # query/key and value head dims differ); the local spec's DotProductAttention takes neither (a TypeError), only
    # TEDotProductAttention does. Megatron-LM's --transformer-impl local stops there too.
    if c.model.mla and c.plan.framework == "megatron" and c.plan.layer_spec != "te":
        return ("multi-latent attention needs Transformer Engine attention (--layer-spec te): megatron-core 0.16.1's "
                "local DotProductAttention takes no k_channels/v_channels, which MLASelfAttention passes it")
    return None


def _cp_window(c: Context) -> str | None:
    # Transformer Engine's context_parallel.py: a sliding window runs only with cp_comm_type a2a or all_gather,
    # and megatron's default (what genconf renders) is p2p.
    w = c.model.sliding_window
    if c.plan.cp > 1 and c.model.window_binds(c.plan.seq_length):
        return (f"context parallelism with sliding-window attention ({w:,} keys back): Transformer Engine runs a window "
                f"only with --cp-comm-type a2a or all_gather, not megatron's default p2p: plan with --cp 1")
    return None


def _ep(c: Context) -> str | None:
    p, m = c.plan, c.model
    if p.etp is not None and not m.is_moe:
        return f"etp ({p.etp}) on a dense model: expert tensor parallelism needs num_experts > 0"
    if p.etp is not None and (p.etp > p.tp or p.tp % p.etp):
        return f"expert tensor parallelism etp ({p.etp}) must divide tp ({p.tp})"
    if p.ep == 1:
        return None
    if not m.is_moe:
        return f"ep ({p.ep}) on a dense model: expert parallelism needs num_experts > 0"
    if m.num_experts % p.ep:
        return f"ep ({p.ep}) must divide num_experts ({m.num_experts}); nearest: ep={_nearest(p.ep, _divisors(m.num_experts))}"
    if (p.tp * p.cp * p.dp) % (p.ep * p.expert_tp):
        return (f"ep x etp ({p.ep} x {p.expert_tp}) must divide tp x cp x dp ({p.tp} x {p.cp} x {p.dp} = "
                f"{p.tp * p.cp * p.dp}): experts are laid over a stage's tensor-, context- and data-parallel ranks")
    return None


def _moe_bias(c: Context) -> str | None:
    # megatron-core TransformerConfig.__post_init__: "Bias in Moe is only supported when ETP==1".
    p, m = c.plan, c.model
    if m.is_moe and m.add_bias_linear and p.framework == "megatron" and p.expert_tp > 1:
        return (f"{m.name}'s experts have biases: megatron-core splits biased experts over no tensor-parallel ranks "
                f"(expert tensor parallelism {p.expert_tp}); use --etp 1")
    return None


def _moe_ep_overlap(c: Context) -> str | None:
    # megatron-core TransformerConfig.__post_init__ (overlap_moe_expert_parallel_comm): expert parallelism, no
    # full recompute, a virtual pipeline when pp > 1 (the combined 1F1B schedule), bf16/fp16 parameters; Megatron-LM
    # arguments.py: --delay-wgrad-compute with Transformer Engine layers only.
    p = c.plan
    if not p.moe_ep_overlap:
        return None
    if p.framework != "megatron" or not c.model.is_moe or p.ep == 1:
        return "--moe-ep-overlap hides megatron's expert-parallel all-to-all: it needs a MoE model with --ep > 1"
    if p.recompute == "full":
        return "--moe-ep-overlap runs without full recompute (megatron-core); use --recompute selective or none"
    if p.pp > 1 and p.vp == 1:
        return "--moe-ep-overlap with pp > 1 needs virtual stages (--vp > 1): megatron's combined 1F1B schedule"
    if p.precision not in ("bf16", "fp16", "fp8", "fp4"):
        return f"--moe-ep-overlap needs bf16/fp16 parameters, not {p.precision}"
    if c.model.mtp_num_layers > 1:
        return (f"--moe-ep-overlap runs at most one multi-token-prediction layer (megatron-core); "
                f"{c.model.name} has {c.model.mtp_num_layers}")
    if c.model.mtp_num_layers and p.pp == 1:
        return "--moe-ep-overlap with a multi-token-prediction layer needs pp > 1 (megatron-core)"
    if p.layer_spec != "te":
        # Megatron-LM arguments.py: delay_wgrad_compute "is only supported with transformer_engine implementation"
        return "--moe-ep-overlap needs Transformer Engine layers (--layer-spec te) for its deferred weight gradients"
    return None


def _moe_dispatcher(c: Context) -> str | None:
    # megatron-core 0.16.1 TransformerConfig: moe_token_dispatcher_type flex with moe_flex_dispatcher_backend deepep
    # or hybridep ("only hybridep supports the MNNVL case": NVLink domains larger than a node).
    p = c.plan
    if p.moe_dispatcher == "alltoall":
        return None
    if p.framework != "megatron" or not c.model.is_moe or p.ep == 1:
        return (f"--moe-dispatcher {p.moe_dispatcher} is megatron's flex token dispatcher: it needs a MoE model with "
                f"--ep > 1")
    if p.moe_dispatcher == "deepep" and c.cluster.nvlink_domain > c.cluster.gpus_per_node:
        return (f"--moe-dispatcher deepep does not run over multi-node NVLink ({c.cluster.name}: "
                f"{c.cluster.nvlink_domain} GPUs per NVLink domain); megatron-core's hybridep backend does: "
                f"use --moe-dispatcher hybridep")
    if c.cluster.pcie_inside_node:
        # DeepEP's and HybridEP's kernels reach every GPU of a node over NVLink (DeepEP README: intranode NVLink,
        # internode RDMA then NVLink); a node of bridged pairs has NVLink only inside each pair.
        return (f"--moe-dispatcher {p.moe_dispatcher} needs NVLink between all GPUs of a node ({c.cluster.name}: "
                f"NVLink only in groups of {c.cluster.nvlink_domain} of its {c.cluster.gpus_per_node}); use "
                f"--moe-dispatcher alltoall")
    return None


def _cuda_graphs(c: Context) -> str | None:
    # megatron-core 0.16.1 TransformerConfig.__post_init__ (cuda_graph_impl / cuda_graph_scope) and Megatron-LM's
    # --cuda-graph-scope help: what each implementation captures and what it cannot be combined with.
    p = c.plan
    impl, scope = p.cuda_graph_impl, set(p.cuda_graph_scope)
    if impl == "none":
        return "--cuda-graph-scope needs --cuda-graph-impl (local or transformer_engine)" if scope else None
    if p.framework != "megatron":
        return f"--cuda-graph-impl is megatron's CUDA graph capture; {p.framework} plans run eagerly"
    if "full_iteration" in scope and impl != "local":
        return "--cuda-graph-scope full_iteration captures the whole step with --cuda-graph-impl local"
    if "moe" in scope:
        return ("--cuda-graph-scope moe captures drop-and-pad experts only (megatron-core); genconf plans dropless "
                "MoE: use moe_router moe_preprocess")
    if "moe_preprocess" in scope and "moe_router" not in scope:
        return "--cuda-graph-scope moe_preprocess needs moe_router beside it (megatron-core)"
    if scope & {"moe_router", "moe_preprocess"} and not c.model.is_moe:
        return f"--cuda-graph-scope moe_router/moe_preprocess capture MoE routing; {c.model.name} has no experts"
    if "mamba" in scope and not c.model.is_hybrid:
        return f"--cuda-graph-scope mamba captures Mamba layers; {c.model.name} has none"
    if "mlp" in scope and c.model.is_moe and not (c.model.is_hybrid and c.model.dense_layers):
        if c.model.dense_layers:  # DeepSeek-V3's first layers, Llama 4 Maverick's every other
            return (f"--cuda-graph-scope mlp captures dense MLPs; genconf does not price it for the "
                    f"{c.model.dense_layers} dense layers of MoE model {c.model.name} (use moe_router)")
        return f"--cuda-graph-scope mlp captures dense MLPs; every layer of {c.model.name} is MoE (use moe_router)"
    if p.recompute == "full" and scope != {"full_iteration"}:
        return ("full recompute runs under CUDA graphs only with --cuda-graph-scope full_iteration (megatron-core); "
                "use --recompute selective or none")
    if p.recompute == "selective" and c.model.attention_dropout > 0 and (not scope or scope & {"attn", "full_iteration"}):
        # genconf's selective recompute is megatron's core_attn module
        return (f"attention dropout ({c.model.attention_dropout}) is not supported with graphed attention "
                f"recomputation (megatron-core): use --recompute none, or graphs that leave attention out")
    if p.offload_activation_layers:
        return "CUDA graphs do not run with activation offload (megatron-core cpu_offloading)"
    if p.moe_ep_overlap and impl != "transformer_engine":
        return ("--moe-ep-overlap runs with CUDA graphs of --cuda-graph-impl transformer_engine only (megatron-core "
                "0.16; full_iteration beside it needs 0.18)")
    return None


def _moe_sequence_parallel(c: Context) -> str | None:
    p = c.plan
    if c.model.is_moe and p.tp > 1 and not p.sequence_parallel:
        return "MoE with tp > 1 needs sequence parallelism (megatron-core)"
    return None


def _sequence_parallel(c: Context) -> str | None:
    p = c.plan
    if p.sequence_parallel and p.tp == 1:
        return "sequence parallelism needs tp > 1"
    if p.sequence_parallel and p.framework != "megatron":
        return f"sequence parallelism is a Megatron feature, not {p.framework}'s"
    return None


def _framework_degrees(c: Context) -> str | None:
    p = c.plan
    if p.framework == "megatron":
        return None
    extra = [f"{name}={value}" for name, value in (("tp", p.tp), ("pp", p.pp), ("cp", p.cp), ("ep", p.ep)) if value > 1]
    if extra:
        return (f"framework {p.framework} runs data parallelism only here (DeepSpeed ZeRO, OLMo FSDP); "
                f"{', '.join(extra)} needs --framework megatron"
                + (" (without --offload: ZeRO-Offload is DeepSpeed's)" if p.offload_optimizer else ""))
    return None


def _framework_zero(c: Context) -> str | None:
    p = c.plan
    allowed = {"megatron": (0, 1, 2, 3), "deepspeed": (0, 1, 2, 3), "fsdp": (0, 2, 3)}[p.framework]
    if p.zero_stage not in allowed:
        hint = {"megatron": "1 = distributed optimizer", "fsdp": "0 NO_SHARD, 2 SHARD_GRAD_OP, 3 FULL_SHARD",
                "deepspeed": ""}[p.framework]
        return f"zero stage {p.zero_stage} is not available with {p.framework} ({hint})"
    if p.megatron_fsdp and p.pp > 1:
        return (f"zero {p.zero_stage} with megatron is Megatron-FSDP, which does not combine with pipeline "
                f"parallelism (pp={p.pp}); use --zero 1 (distributed optimizer) with pipelining")
    if p.megatron_fsdp and c.model.position_embedding not in ("rope", "none"):
        # Megatron-LM arguments.py asserts it under --use-megatron-fsdp.
        return (f"Megatron-FSDP (megatron zero {p.zero_stage}) needs rotary or no position embeddings; "
                f"{c.model.name} has {c.model.position_embedding}: use --zero 1")
    if p.shard_group_size is not None:
        if p.zero_stage != 3:
            return "a shard group (hybrid sharding) needs zero stage 3"
        if p.dp % p.shard_group_size:
            return f"shard group ({p.shard_group_size}) must divide dp ({p.dp})"
    return None


def _offload(c: Context) -> str | None:
    p = c.plan
    if (p.offload_optimizer or p.offload_params) and p.framework != "deepspeed":
        return "CPU offload is a DeepSpeed ZeRO feature here; use --framework deepspeed"
    if p.offload_optimizer and p.zero_stage == 0:
        return "optimizer offload needs zero stage >= 1"
    if p.offload_params and p.zero_stage != 3:
        return "parameter offload needs zero stage 3"
    return None


def _offload_host_memory(c: Context) -> str | None:
    """DeepSpeed's estimator: host bytes per node = P x (18 with params offloaded, else 16) / nodes x 1.5
    (estimate_zero3_model_states_mem_needs, additional_buffer_factor=1.5)."""
    p = c.plan
    if not p.offload_optimizer:
        return None
    nodes = max(1, c.num_gpus // c.cluster.gpus_per_node)
    per_param = 18 if p.offload_params else 16
    need_gib = exact_param_count(c.model) * per_param / nodes * 1.5 / GIB
    have_gib = c.cluster.cpu_mem_gib_per_node
    if need_gib > have_gib:
        if have_gib <= 0:
            return f"CPU offload needs {need_gib:,.0f} GiB of host memory per node but the cluster gives nodes none"
        return (f"CPU offload needs {need_gib:,.0f} GiB of host memory per node but nodes have {have_gib:,.0f} GiB; "
                f"use at least {math.ceil(need_gib * nodes / have_gib)} nodes")
    return None


def _recompute(c: Context) -> str | None:
    p = c.plan
    if p.recompute == "selective" and p.framework != "megatron":
        return f"selective recompute is Megatron's; {p.framework} checkpoints whole layers (--recompute full)"
    if p.recompute_layers is not None:
        if p.recompute != "full" or p.framework != "megatron":
            return "--recompute-layers (block recompute) needs --framework megatron and --recompute full"
        try:
            most = largest_chunk_layers(c.model.num_layers, p)
        except ValueError:
            most = None  # the split itself is wrong: pipeline_split says so
        if most is not None and p.recompute_layers > most:
            # megatron-core's block method recomputes the first N layers of each chunk: past a chunk's layers it
            # recomputes them all, so a larger N only misreports the plan
            return (f"--recompute-layers ({p.recompute_layers}) is more than a model chunk holds: at most {most} "
                    f"layer{'s' * (most != 1)} ({c.model.num_layers} layers over pp {p.pp} x vp {p.vp}); "
                    f"use --recompute-layers {most}")
    modules = set(p.recompute_modules)
    if "mla_up_proj" in modules and not c.model.mla:
        return "--recompute-modules mla_up_proj recomputes multi-head latent attention's up projections: the model has none"
    if "moe_act" in modules and not c.model.is_moe:
        return "--recompute-modules moe_act recomputes the experts' activation: the model is dense"
    if "moe_act" in modules and p.layer_spec != "te":
        # megatron-core (transformer_config.py) recomputes moe_act only in the grouped experts, which genconf renders
        # with Transformer Engine's layers (--moe-grouped-gemm)
        return "--recompute-modules moe_act needs the grouped experts of Transformer Engine's layers (--layer-spec te)"
    return None


def _activation_offload(c: Context) -> str | None:
    p = c.plan
    if not p.offload_activation_layers:
        return None
    if p.framework != "megatron" or p.layer_spec != "te":
        return "activation offload is Transformer Engine's CPU offload: needs --framework megatron and --layer-spec te"
    if p.pp > 1:
        return f"megatron-core does not offload activations with pipeline parallelism (pp={p.pp})"
    if p.recompute != "none":
        return "megatron-core does not combine activation offload with activation recompute"
    if p.offload_activation_layers >= c.model.num_layers:
        return (f"offload at most num_layers - 1 = {c.model.num_layers - 1} layers' activations "
                f"(megatron-core cpu_offloading_num_layers), got {p.offload_activation_layers}")
    per_node = offloaded_activation_bytes(c.model, p) * min(c.num_gpus, c.cluster.gpus_per_node)
    have = 0.8 * c.cluster.cpu_mem_gib_per_node * GIB
    if per_node > have:
        return (f"offloaded activations need {per_node / GIB:,.0f} GiB of pinned host memory per node; nodes have "
                f"{c.cluster.cpu_mem_gib_per_node:,.0f} GiB (80% usable)")
    return None


def _compile(c: Context) -> str | None:
    if c.plan.torch_compile and c.plan.framework == "megatron":
        return "torch_compile describes genconf's DeepSpeed/FSDP model; megatron fuses through Transformer Engine"
    return None


def attention_kernel_conflict(kernel: str, framework: str | None) -> str | None:
    """Why a flash-attention kernel cannot be asked of this framework (None: it can). Used by the rule below and
    by the command line before any search."""
    if kernel != "auto" and framework == "megatron":
        return (f"--attention-kernel {kernel} describes the DeepSpeed/FSDP model's flash attention; megatron's TE layers pick "
                f"cuDNN's fused attention themselves (and the local spec runs unfused attention): drop it or choose "
                f"--framework deepspeed/fsdp")
    return None


def fused_loss_conflict(fused_loss: bool | None, framework: str | None) -> str | None:
    """Why the fused cross entropy cannot be asked of this framework (None: it can)."""
    if fused_loss and framework == "megatron":
        return ("--fused-loss is the DeepSpeed/FSDP model's cross entropy; megatron's vocab-parallel cross entropy "
                "already works in place on the 16-bit logits: drop it or choose --framework deepspeed/fsdp")
    return None


PLAN_SDPA_BACKEND = {"cudnn": "cudnn", "flash2": "flash", "math": "math"}
"""The SDPA backend genconf's runners pin for a plan's attention kernel (genconf.train.speed.PLAN_ATTENTION)."""


def attention_kernel_head_dim_conflict(kernel: str, head_dim: int) -> str | None:
    """Why the SDPA backend a pinned kernel runs cannot take this head dim (None: it can): the run would stop at its
    first step with "No available kernel" (kernels.sdpa_backend_takes, measured on an H200)."""
    backend = PLAN_SDPA_BACKEND.get(kernel)
    if backend is None or kernels.sdpa_backend_takes(backend, head_dim):
        return None
    takes = {"cudnn": "cuDNN's fused attention takes head dims that are multiples of 8 up to "
                      f"{kernels.FUSED_ATTENTION_MAX_HEAD_DIM}",
             "flash": f"flash attention takes head dims up to {kernels.SDPA_FLASH_MAX_HEAD_DIM}"}[backend]
    return (f"--attention-kernel {kernel}: {takes}, this model's is {head_dim}: plan with --attention-kernel auto "
            f"(PyTorch picks a backend that takes it)")


def attention_kernel_window_conflict(kernel: str, model: ModelSpec, seq_length: int) -> str | None:
    """Why a pinned kernel cannot run this model's sliding-window layers (None: it can): genconf's own model passes
    them a band mask (torch_model.windowed_attention), and PyTorch's flash attention takes no mask ("No available
    kernel" at the first step)."""
    if PLAN_SDPA_BACKEND.get(kernel) != "flash" or not model.window_binds(seq_length):
        return None
    return (f"--attention-kernel {kernel}: PyTorch's flash attention takes no mask, and this model's sliding-window "
            f"layers ({model.sliding_window:,} keys back) run with one: plan with --attention-kernel auto")


def _attention_kernel(c: Context) -> str | None:
    return (attention_kernel_conflict(c.plan.attention_kernel, c.plan.framework)
            or attention_kernel_head_dim_conflict(c.plan.attention_kernel, c.model.attention_head_dim)
            or attention_kernel_window_conflict(c.plan.attention_kernel, c.model, c.plan.seq_length))


def _fused_loss(c: Context) -> str | None:
    return fused_loss_conflict(c.plan.fused_loss, c.plan.framework)


def gpu_precision_refusal(precision: str, quant_recipe: str | None, gpu) -> str | None:
    """Why the GPU's tensor cores cannot run the precision, whatever the layout (None: they can): the CLI refuses such
    a request before searching, and the rule below holds any plan to it."""
    if precision == "fp8" and not gpu.supports_fp8:
        return f"FP8 needs Hopper or Blackwell tensor cores; {gpu.display_name} has none (use --precision bf16)"
    if precision == "fp4" and not gpu.peak_fp4_tflops:
        return (f"NVFP4 needs Blackwell FP4 tensor cores; {gpu.display_name} has none "
                f"(use --precision {'fp8' if gpu.supports_fp8 else 'bf16'})")
    if quant_recipe == "mxfp8" and not gpu.supports_mxfp8:
        return (f"MXFP8 needs Blackwell tensor cores; {gpu.display_name} is {gpu.arch.capitalize()} "
                f"(use --precision fp8-current or fp8-blockwise)")
    return None


def _gpu_precision(c: Context) -> str | None:
    """The GPU's own tensor cores, whatever the layout: checked first, so a plan no layout can save (FP8 on an A100)
    is named as such, not by the commonest layout rule its candidates also broke."""
    return gpu_precision_refusal(c.plan.precision, c.plan.quant_recipe, c.cluster.gpu)


def _precision(c: Context) -> str | None:
    p = c.plan
    if p.framework != "megatron" and p.precision in precision.TORCHAO_DTYPES:
        # First for DeepSpeed too: its own refusal names FSDP's torchao as the other way, which this recipe is not.
        name = precision.recipe_for(p.precision, p.fp8_recipe).name
        if name not in precision.TORCHAO_RECIPES:  # the same refusal genconf launch gives (unsupported_reason)
            return (f"{name} needs Transformer Engine (--framework megatron); FSDP trains FP8 through torchao, "
                    f"recipe {', '.join(precision.TORCHAO_RECIPES)} only")
    refusal = precision.plan_refusal(p.precision, p.framework, p.layer_spec)  # what each framework cannot train
    if refusal:
        return refusal
    if p.fp8_param_gather:
        if p.quant_recipe is None:
            return "FP8 parameters (--fp8-param-gather) need an FP8 or FP4 precision"
        if p.framework != "megatron" or p.zero_stage < 1:
            return "FP8 parameters (--fp8-param-gather) need megatron's distributed optimizer or Megatron-FSDP (--zero >= 1)"
    if p.adam_moments_dtype not in ("fp32", "bf16"):
        return f"Adam moments in {p.adam_moments_dtype!r}: fp32 or bf16"
    if p.adam_moments_dtype == "bf16" and not p.precision_aware_optimizer:
        return ("BF16 Adam moments (--adam-moments-dtype bf16) need megatron's precision-aware optimizer "
                "(--precision-aware-optimizer)")
    if p.precision_aware_optimizer and (p.framework != "megatron" or p.zero_stage < 1 or p.precision not in ("bf16", "fp8", "fp4")):
        return ("the precision-aware optimizer (16-bit master-weight remainders) needs megatron's distributed "
                "optimizer (--zero >= 1) and bf16 weights")
    if p.grad_dtype == "fp32" and p.framework == "deepspeed" and p.zero_stage == 0 and p.precision == "bf16":
        return ("DeepSpeed refuses bf16 weights with fp32 gradient accumulation at ZeRO-0 (engine.py: unsupported "
                "mix); use --zero 1 (BF16_Optimizer) or bf16 gradients")
    if p.precision == "fp32" and p.framework == "deepspeed":
        return "fp32 is for Megatron and FSDP verification runs here; use bf16 with DeepSpeed"
    return None


def _bf16_layers(c: Context) -> str | None:
    p = c.plan
    first, last = p.bf16_layers_start, p.bf16_layers_end
    if not first and not last:
        return None
    if p.quant_recipe is None:
        return f"BF16 end layers ({first} first, {last} last) apply under an FP8 or FP4 precision, not {p.precision}"
    if p.framework != "megatron" or p.layer_spec != "te":
        return "BF16 end layers are a setting of megatron's Transformer Engine layers (--first-last-layers-bf16)"
    if p.quant_recipe == "delayed":
        # megatron-core TransformerConfig.__post_init__
        return "delayed scaling does not support first / last layers in BF16 (use --precision fp8-current)"
    per_stage = c.model.num_layers // p.pp
    for name, count in (("first", first), ("last", last)):
        if count > per_stage:
            return (f"{count} BF16 {name} layers: megatron-core allows at most the layers per pipeline stage "
                    f"({c.model.num_layers} // pp {p.pp} = {per_stage})")
    return None


def lora_conflict(lora_rank: int, framework: str | None, is_moe: bool, zero_stage: int | None,
                  mla: bool = False, hybrid: bool = False) -> str | None:
    """Why LoRA cannot be planned this way (None: it can). genconf prices LoRA as Megatron-Bridge and NeMo run it.
    What the model rules out first: another framework or ZeRO stage would not make it plannable."""
    if not lora_rank:
        return None
    if is_moe:
        return "--lora-rank on a mixture-of-experts model is not modelled (adapters on routed experts): drop it"
    if mla:
        return "--lora-rank on multi-head latent attention is not modelled (adapters on the latent projections): drop it"
    if hybrid:
        return "--lora-rank on a hybrid Mamba model is not modelled (genconf plans hybrid models without LoRA): drop it"
    if framework not in (None, "megatron"):
        return (f"--lora-rank is priced as Megatron-Bridge/NeMo run LoRA (framework megatron); genconf's {framework} "
                f"model trains every weight: drop --lora-rank or choose --framework megatron")
    if zero_stage is not None and zero_stage >= 2:
        return "--lora-rank with Megatron-FSDP (--zero 2/3) is not modelled: the frozen weights need no sharding, use --zero 1"
    return None


def lora_artifacts_refusal(lora_rank: int) -> str | None:
    """Why a LoRA plan gets no artifacts (None: not a LoRA plan). genconf's renderers and launchers train every
    weight; Megatron-LM has no LoRA arguments."""
    if not lora_rank:
        return None
    return (f"a LoRA plan (--lora-rank {lora_rank}) is for sizing only: genconf's artifacts and launchers train every "
            f"weight and Megatron-LM has no LoRA arguments; run it with Megatron-Bridge's PEFT "
            f"(peft/lora.py LoRA(dim={lora_rank})) and drop -o, or plan without --lora-rank")


def _lora(c: Context) -> str | None:
    return lora_conflict(c.plan.lora_rank, c.plan.framework, c.model.is_moe, c.plan.zero_stage, c.model.mla,
                         c.model.is_hybrid)


def architecture_conflict(model, framework: str | None, layer_spec: str | None = None) -> str | None:
    """Experts, multi-head latent attention, shared experts, dense first or interleaved layers and multi-token
    prediction exist in megatron-core (with Transformer Engine layers genconf prices) only; genconf's DeepSpeed and
    FSDP model builds uniform dense GQA layers (genconf.train.torch_model refuses a mixture of experts)."""
    parts = [name for name, on in (("mixture-of-experts layers", model.is_moe),
                                   ("multi-head latent attention", model.mla),
                                   ("shared experts", bool(model.moe_shared_expert_intermediate_size)),
                                   ("dense first layers", bool(model.is_moe and model.first_k_dense_replace)),
                                   ("dense layers between MoE layers", model.moe_layer_interval > 1),
                                   ("multi-token prediction", bool(model.mtp_num_layers)),
                                   ("Mamba-2 layers", model.is_hybrid)) if on]
    if not parts:
        return None
    if framework not in (None, "megatron"):
        return f"{model.name} has {', '.join(parts)}: megatron-core builds these, genconf's {framework} model does not"
    if layer_spec == "local" and model.mla:
        return f"{model.name} has multi-head latent attention: genconf prices it with Transformer Engine layers (--layer-spec te)"
    if layer_spec == "local" and model.is_hybrid:
        return f"{model.name} is a hybrid Mamba model: megatron-core's mamba_stack_spec is Transformer Engine's (--layer-spec te)"
    return None


def hybrid_conflict(model, plan) -> str | None:
    """What megatron-core 0.16.1's MambaStack and MambaMixer accept of a plan (ssm/mamba_block.py,
    mamba_mixer.py, mamba_context_parallel.py), and what genconf prices of them."""
    if not model.is_hybrid:
        return None
    heads, groups, tp, cp = model.mamba_num_heads, model.mamba_num_groups, plan.tp, plan.cp
    if heads % tp or groups % tp:
        common = [d for d in _divisors(heads) if groups % d == 0]
        return (f"tp ({tp}) must divide the Mamba heads ({heads}) and groups ({groups}) (megatron-core MambaMixer); "
                f"nearest: tp={_nearest(tp, common)}")
    if cp > 1 and ((heads // tp) % cp or ((groups // tp) % cp and cp % (groups // tp))):
        return (f"cp ({cp}) must divide the Mamba heads per TP rank ({heads // tp}), and divide or be a multiple of "
                f"the groups per TP rank ({groups // tp}) (megatron-core mamba_context_parallel.py)")
    if plan.vp > 1:
        return "megatron-core's MambaStack has no interleaved pipeline: set --vp 1"
    if plan.pp_layout is not None or plan.pp_embedding_as_layer or plan.pp_loss_as_layer:
        return ("a hybrid model's pattern is split evenly over the stages or with first/last stage layers "
                "(megatron-core MambaStack): no pipeline layout and no embedding/loss counted as layers")
    if plan.recompute == "full":
        return "megatron-core's MambaStack has no full activation recompute: use --recompute selective or none"
    if plan.megatron_fsdp or plan.lora_rank or plan.offload_activation_layers:
        return "genconf plans hybrid Mamba models without Megatron-FSDP, LoRA or activation offload"
    if model.dense_layers and model.ffn_hidden_size % tp:
        return f"tp ({tp}) must divide ffn_hidden_size ({model.ffn_hidden_size}) of the MLP layers"
    return None


def _architecture(c: Context) -> str | None:
    conflict = architecture_conflict(c.model, c.plan.framework, c.plan.layer_spec) or hybrid_conflict(c.model, c.plan)
    if conflict:
        return conflict
    if c.plan.pp_layout is not None and c.plan.pp > 1:
        placed = layout_mtp_layers(c.plan.pp_layout)
        if placed != c.model.mtp_num_layers:
            # megatron-core asserts the count (pipeline_parallel_layer_layout.py validate_layer_layout)
            return (f"the pipeline layout places {placed} multi-token-prediction layer(s) ('m'), the model has "
                    f"{c.model.mtp_num_layers}: put {'m' * c.model.mtp_num_layers or 'none'} before the loss 'L'")
    return None


def _pipeline_microbatches(c: Context) -> str | None:
    p = c.plan
    if p.pp > 1 and p.num_microbatches < p.pp:
        return (f"only {p.num_microbatches} micro-batches for {p.pp} stages: the pipeline bubble is "
                f"{bubble_fraction(p):.0%} of the compute time")  # (p - 1) / (v m): bubble over ideal time
    return None


RULES: tuple[Rule, ...] = (
    Rule("gpu_precision", ERROR, "the GPU has tensor cores for the precision", _gpu_precision),
    Rule("whole_nodes", ERROR, "the job uses whole nodes (or less than one)", _whole_nodes),
    Rule("world_size", ERROR, "tp x pp x cp x dp = GPUs", _world_size),
    Rule("framework_degrees", ERROR, "DeepSpeed and FSDP plans are data-parallel only", _framework_degrees),
    Rule("framework_zero_stage", ERROR, "the zero stage exists in the framework", _framework_zero),
    Rule("tp_divides_heads", ERROR, "TP divides the attention heads", _tp_heads),
    Rule("tp_divides_kv_heads", ERROR, "TP divides the KV heads (query groups)", _tp_groups),
    Rule("tp_divides_ffn", ERROR, "TP divides the MLP width", _tp_ffn),
    Rule("tp_inside_node", ERROR, "TP stays inside an NVLink domain", _tp_domain),
    Rule("pipeline_split", ERROR, "layers split over PP x VP (evenly or as configured)", _pipeline_split),
    Rule("vp_needs_pp", ERROR, "virtual stages need PP", _vp_needs_pp),
    Rule("interleave_microbatches", ERROR, "interleaving needs a multiple of PP micro-batches", _interleave_microbatches),
    Rule("batch_divisible", ERROR, "global batch divides by micro-batch x DP", _batch),
    Rule("cp_divides_sequence", ERROR, "CP divides the sequence (into 2 x cp chunks)", _cp_sequence),
    Rule("cp_needs_te", ERROR, "CP needs TE attention", _cp_needs_te),
    Rule("mla_needs_te", ERROR, "MLA needs TE attention", _mla_needs_te),
    Rule("cp_window", ERROR, "CP (p2p) with no sliding window shorter than the sequence", _cp_window),
    Rule("ep_divides_experts", ERROR, "EP divides the experts and dp x cp", _ep),
    Rule("moe_bias_etp", ERROR, "experts with biases need expert TP 1 (megatron)", _moe_bias),
    Rule("moe_ep_overlap", ERROR, "EP overlap needs EP, TE layers, no full recompute, VP with PP, at most one MTP "
         "layer and PP with it", _moe_ep_overlap),
    Rule("moe_dispatcher", ERROR, "the flex dispatcher needs megatron MoE with EP (hybridep over multi-node NVLink)",
         _moe_dispatcher),
    Rule("cuda_graphs", ERROR, "CUDA graphs: megatron, a scope its implementation captures", _cuda_graphs),
    Rule("moe_needs_sequence_parallel", ERROR, "MoE with TP needs sequence parallelism", _moe_sequence_parallel),
    Rule("sequence_parallel", ERROR, "sequence parallelism needs Megatron TP", _sequence_parallel),
    Rule("offload", ERROR, "offload needs DeepSpeed ZeRO", _offload),
    Rule("offload_host_memory", ERROR, "offloaded states fit in host memory", _offload_host_memory),
    Rule("recompute", ERROR, "selective and block recompute need Megatron; block recompute at most a chunk's layers",
         _recompute),
    Rule("activation_offload", ERROR, "activation offload needs megatron with TE, no PP, no recompute", _activation_offload),
    Rule("torch_compile", ERROR, "torch.compile is for the DeepSpeed/FSDP model", _compile),
    Rule("attention_kernel", ERROR, "a flash-attention kernel is chosen for the DeepSpeed/FSDP model",
         _attention_kernel),
    Rule("fused_loss", ERROR, "the fused cross entropy is for the DeepSpeed/FSDP model", _fused_loss),
    Rule("precision", ERROR, "the precision runs on this GPU and framework", _precision),
    Rule("bf16_layers", ERROR, "BF16 end layers: an FP8/FP4 megatron TE plan, not delayed scaling, at most a stage's "
         "layers", _bf16_layers),
    Rule("lora", ERROR, "LoRA: megatron, a dense model, no Megatron-FSDP", _lora),
    Rule("architecture", ERROR, "MLA, shared experts, dense first layers, MTP and Mamba: megatron with TE layers",
         _architecture),
    Rule("pipeline_bubble", WARNING, "at least as many micro-batches as stages", _pipeline_microbatches),
)
RULE_NAMES = tuple(r.name for r in RULES) + ("memory_fits", "batch_above_target", "cannot_reach_top")
"""Every name a search's rejection counts use: the rules, memory, the batch cap, and candidates whose upper
bound on tokens/s could not reach the ranked list (branch and bound: never evaluated in full)."""


def check(ctx: Context, *, first_error_only: bool = False) -> list[Violation]:
    """Every violated rule (errors and warnings), or just the first error."""
    out: list[Violation] = []
    for rule in RULES:
        message = rule.check(ctx)
        if message is not None:
            out.append(Violation(rule.name, rule.severity, message))
            if first_error_only and rule.severity == ERROR:
                break
    return out


def memory_violation(ctx: Context, mem: MemoryEstimate, *, pinned: bool = False) -> Violation | None:
    """memory_fits: the busiest stage's need against the GPU's capacity, with the breakdown and what to try.
    A plan the user pinned whole that fits the GPU but not the headroom (the estimate's own error) is kept
    with a warning: published runs live there (Narayanan 2021's 530B ZeRO-3 run fitted on 640 GPUs, not 560)."""
    peak = mem.peak
    if peak.total_bytes <= mem.usable_bytes:
        return None
    if pinned and peak.total_bytes <= mem.capacity_bytes:
        return Violation("memory_fits", WARNING,
                         f"tight: stage {peak.stage} needs {peak.total_bytes / GIB:.1f} GiB of "
                         f"{mem.capacity_bytes / GIB:.1f} on {ctx.cluster.gpu.name}, inside the "
                         f"{mem.capacity_bytes / GIB - mem.usable_bytes / GIB:.1f} GiB the estimate's error asks to keep "
                         f"free: it may run out of memory")
    p = ctx.plan
    parts = (f"params {peak.params_bytes / GIB:.1f} + grads {peak.grads_bytes / GIB:.1f} + optimizer "
             f"{peak.optimizer_bytes / GIB:.1f} + activations {peak.activations_bytes / GIB:.1f} + other "
             f"{peak.other_bytes / GIB:.1f}")
    tries = []
    if p.framework != "megatron" and not p.fused_loss:
        tries.append("--fused-loss")  # no time lost: first
    if p.recompute != "full":
        graphed = p.cuda_graph_impl != "none" and "full_iteration" not in p.cuda_graph_scope
        if graphed:
            # megatron-core runs full recompute under CUDA graphs only with full-iteration graphs
            tries.append("--recompute full without partial CUDA graphs (or with --cuda-graph-scope full_iteration)")
        elif p.moe_ep_overlap:
            tries.append("--recompute full without --moe-ep-overlap")
        else:
            tries.append("--recompute full")
        if (graphed or p.moe_ep_overlap) and p.layer_spec == "te" and not p.recompute_modules:
            tries.append(f"--recompute selective --recompute-modules {','.join(ctx.model.extra_recompute_modules)}")
    if p.framework == "megatron" and not p.distributed_optimizer and p.dp * p.cp > 1:
        tries.append("--zero 1 (distributed optimizer)")
    if p.framework != "megatron" and p.zero_stage < 3 and p.dp > 1:
        tries.append("--zero 3")
    if p.mbs > 1:
        tries.append("--mbs 1")
    tries.append("more GPUs or tp/pp")
    return Violation("memory_fits", ERROR,
                     f"stage {peak.stage} needs {peak.total_bytes / GIB:.1f} GiB ({parts}) > "
                     f"{mem.usable_bytes / GIB:.1f} GiB usable of {mem.capacity_bytes / GIB:.1f} on "
                     f"{ctx.cluster.gpu.name}; try {', '.join(tries)}")
