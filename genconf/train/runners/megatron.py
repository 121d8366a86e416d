"""Train the plan with megatron-core: GPTModel (Transformer Engine layer spec where TE and a GPU exist, the
local spec otherwise), real TP/PP/interleaved PP/CP/EP, megatron's DistributedDataParallel and (distributed)
optimizer, driven by get_forward_backward_func(). On a CPU the compat layer (mcore_compat) redirects the
few places megatron-core insists on CUDA.

The TransformerConfig is built from the same megatron_args the artifacts hold (genconf.render.megatron's
config_kwargs reads them as Megatron-LM does), so what runs is what the artifact says.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import torch

from genconf.plan import precision
from genconf.plan.counting import padded_vocab_size
from genconf.plan.runconfig import RunConfig, needs_te_attention
from genconf.train import collectives, loop, measure, runtime
from genconf.train.data import micro_batch


def with_torch_values(kw: dict) -> dict:
    """config_kwargs / megatron_config_kwargs (plain names, genconf.render.megatron) with the torch objects
    TransformerConfig takes: params_dtype and pipeline_dtype as torch dtypes, activation_func as the function
    Megatron-LM's arguments select (--swiglu: silu, --squared-relu: megatron-core's squared_relu, else gelu)."""
    import torch.nn.functional as F
    from megatron.core.activations import squared_relu

    functions = {"silu": F.silu, "gelu": F.gelu, "squared_relu": squared_relu}
    return {**kw, "params_dtype": getattr(torch, kw["params_dtype"]), "pipeline_dtype": getattr(torch, kw["pipeline_dtype"]),
            "activation_func": functions[kw["activation_func"]]}


def transformer_config_kwargs(cfg: RunConfig, *, cpu: bool) -> dict:
    """TransformerConfig kwargs for this run: the artifact's Megatron-LM arguments, mapped as Megatron-LM maps
    them, plus what a CPU run needs (compat recommendations: fusions off, CPU initialisation)."""
    from genconf.render.megatron import config_kwargs

    kw = with_torch_values(config_kwargs(cfg.model, cfg.plan, cfg.train))
    if not kw.get("fp8"):
        for key in ("fp8", "fp8_recipe", "first_last_layers_bf16", "num_layers_at_start_in_bf16",
                    "num_layers_at_end_in_bf16"):
            kw.pop(key, None)
    if cpu:
        from genconf.train import mcore_compat

        kw.update(mcore_compat.recommended_config_kwargs(bf16=kw["bf16"], pipeline=cfg.plan.pp > 1))
        if precision.recipe(cfg.precision_recipe).compute_dtype == "float16":
            kw.update(fp16=True, bf16=False, params_dtype=torch.float16, pipeline_dtype=torch.float16)
        kw["tp_comm_overlap"] = False
        without_grouped_experts(kw)  # CPU runs build the local spec: one GEMM per expert
    else:
        from megatron.core.tensor_parallel import layers as tp_layers

        if kw.get("gradient_accumulation_fusion") and not getattr(tp_layers, "_grad_accum_fusion_available", True):
            # megatron-core refuses the fusion where apex's kernel does not import (its own test); run without it.
            kw["gradient_accumulation_fusion"] = False
            if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
                print("genconf: note: apex's fused_weight_gradient_mlp_cuda is not available: weight gradients are "
                      "added into main_grad in a pass of their own, which the plan did not price (plan with "
                      "--no-gradient-accumulation-fusion)", file=sys.stderr, flush=True)
        # PP=2 with virtual stages and batched p2p trains silently wrong (Megatron-LM issues 750, 1450).
        if cfg.plan.pp == 2 and cfg.plan.vp > 1:
            kw.update(batch_p2p_comm=False, overlap_p2p_comm=True)
    return kw


def without_grouped_experts(kw: dict) -> None:
    """TransformerConfig kwargs for the local spec's experts (one GEMM each; its grouped MLP needs the grouped_gemm
    package): no grouped GEMM, and no moe_act recompute, which megatron-core runs only in grouped experts."""
    if not kw.get("moe_grouped_gemm"):
        return
    kw["moe_grouped_gemm"] = False
    modules = kw.get("recompute_modules")
    if modules and "moe_act" in modules:
        kept = [m for m in modules if m != "moe_act"]
        kw["recompute_modules"] = kept or ["core_attn"]
        if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
            print("genconf: note: the local spec's experts cannot recompute moe_act (megatron-core recomputes it in "
                  "grouped experts only): its activations stay in memory, which the plan did not count",
                  file=sys.stderr, flush=True)


def transformer_config(kw: dict):
    """megatron-core's config for these kwargs: MLATransformerConfig under multi-latent attention (as Megatron-LM's
    core_transformer_config_from_args picks it for --multi-latent-attention), TransformerConfig otherwise."""
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    return (MLATransformerConfig if kw.get("multi_latent_attention") else TransformerConfig)(**kw)


def model_specs(cfg: RunConfig, config, use_te: bool, vp_stage: int | None = None):
    """(decoder spec, MTP block spec or None, name) of one model chunk, built as Megatron-LM core_v0.16.1's
    gpt_builders.py builds them: an MoE model's decoder block spec places a dense layer where --moe-layer-freq says
    0 (get_gpt_decoder_block_spec), a dense model's one layer spec serves every layer; multi-latent attention comes
    from the config; the multi-token-prediction block repeats the model's last decoder layer
    (get_gpt_mtp_block_spec, None on the stages that hold no MTP layer). Transformer Engine's modules where usable
    (its grouped GEMM over the local experts where the config asks for it), megatron-core's local spec otherwise."""
    from megatron.core.models.gpt import gpt_layer_specs as specs

    m = cfg.model
    norm = "RMSNorm" if m.normalization == "rmsnorm" else "LayerNorm"
    mla = bool(config.multi_latent_attention)
    if m.num_experts:
        decoder = specs.get_gpt_decoder_block_spec(config, use_transformer_engine=use_te, normalization=norm,
                                                   vp_stage=vp_stage)
        if not use_te and norm == "RMSNorm":
            # The local block spec gives the final norm apex's FusedLayerNorm where apex is installed, which asserts
            # LayerNorm (megatron-core 0.16.1 gpt_layer_specs.py:644, fused_layer_norm.py:66); its layers' RMSNorm is
            # torch's, as is the final norm without apex (a CPU).
            from megatron.core.transformer.torch_norm import WrappedTorchNorm

            decoder.layer_norm = WrappedTorchNorm
    elif use_te:
        decoder = specs.get_gpt_layer_with_transformer_engine_spec(qk_layernorm=config.qk_layernorm,
                                                                   multi_latent_attention=mla)
    else:
        decoder = specs.get_gpt_layer_local_spec(qk_layernorm=config.qk_layernorm, multi_latent_attention=mla,
                                                 normalization=norm)
    mtp = None
    if config.mtp_num_layers:
        last_layer = (specs.get_gpt_decoder_layer_specs(config, use_transformer_engine=use_te, normalization=norm)[-1]
                      if m.num_experts else decoder)
        mtp = specs.get_gpt_mtp_block_spec(config, last_layer, use_transformer_engine=use_te, vp_stage=vp_stage)
    return decoder, mtp, "te" if use_te else "local"


def gpt_model(cfg: RunConfig, config, use_te: bool, vp_stage: int | None = None, pre_process: bool = True,
              post_process: bool = True):
    """megatron-core's GPTModel of one model chunk (virtual stage vp_stage; None without interleaving)."""
    from megatron.core.models.gpt import GPTModel

    from genconf.render.megatron import ROPE_SCALING_FACTOR_DEFAULT

    m, plan = cfg.model, cfg.plan
    decoder, mtp, _ = model_specs(cfg, config, use_te, vp_stage)
    return GPTModel(config=config, transformer_layer_spec=decoder, vocab_size=padded_vocab_size(m.vocab_size, plan.tp),
                    max_sequence_length=max(plan.seq_length, m.seq_length), pre_process=pre_process,
                    post_process=post_process, share_embeddings_and_output_weights=m.tie_embeddings,
                    position_embedding_type="rope" if m.position_embedding == "rope" else "learned_absolute",
                    rotary_base=round(m.rope_theta), rotary_percent=m.rotary_percent,
                    rope_scaling=bool(m.rope_scaling_factor),
                    rope_scaling_factor=m.rope_scaling_factor or ROPE_SCALING_FACTOR_DEFAULT, mtp_block_spec=mtp,
                    vp_stage=vp_stage)


def build(cfg: RunConfig, config, d: runtime.Dist, use_te: bool = False):
    """Model chunks (one per virtual stage) wrapped in Float16Module and megatron DDP, and the optimizer."""
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer.module import Float16Module

    plan, train = cfg.plan, cfg.train
    recipe = precision.recipe(cfg.precision_recipe)
    half = recipe.compute_dtype != "float32"
    chunks = []
    for vp_stage in range(plan.vp):
        vs = vp_stage if plan.vp > 1 else None
        gpt = gpt_model(cfg, config, use_te, vs, pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vs),
                        post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vs))
        if d.device.type == "cuda":
            gpt = gpt.cuda()
        if half:
            gpt = Float16Module(config, gpt)
        ddp = DistributedDataParallelConfig(
            # Megatron-LM accumulates and reduces bf16 gradients in fp32 (--accumulate-allreduce-grads-in-fp32)
            # unless the plan reduces them in bf16 (--grad-reduce-in-bf16).
            grad_reduce_in_fp32=not recipe.loss_scaling and plan.grad_dtype != "bf16",
            overlap_grad_reduce=d.device.type == "cuda", overlap_param_gather=False,
            use_distributed_optimizer=plan.distributed_optimizer)
        chunks.append(DistributedDataParallel(config, ddp, gpt, disable_bucketing=vp_stage > 0))
    loss = precision.FP16_LOSS_SCALING
    opt = OptimizerConfig(optimizer="adam", lr=train.lr, min_lr=train.min_lr, weight_decay=train.weight_decay,
                          adam_beta1=train.beta1, adam_beta2=train.beta2, adam_eps=train.eps,
                          clip_grad=train.grad_clip, bf16=recipe.compute_dtype == "bfloat16",
                          fp16=recipe.loss_scaling, params_dtype=config.params_dtype,
                          use_distributed_optimizer=plan.distributed_optimizer,
                          **({"use_precision_aware_optimizer": True} if plan.precision_aware_optimizer else {}),
                          # Megatron-LM passes its --fp8-recipe: it decides who keeps the fp32 master weights
                          # (OptimizerConfig.use_precision_aware_optimizer_no_fp8_or_ds_fp8).
                          **({"fp8_recipe": recipe.megatron_recipe} if plan.precision == "fp8" else {}),
                          **({"exp_avg_dtype": torch.bfloat16, "exp_avg_sq_dtype": torch.bfloat16}
                             if plan.adam_moments_dtype == "bf16" else {}),
                          initial_loss_scale=loss.initial_scale if recipe.loss_scaling else None,
                          loss_scale_window=loss.window_steps, hysteresis=loss.hysteresis,
                          min_loss_scale=float(loss.min_scale))
    optimizer = get_megatron_optimizer(opt, chunks)
    return chunks, optimizer


def _loss_func(loss_mask: torch.Tensor, output_tensor: torch.Tensor):
    """(sum of the token losses, their count, report), as Megatron-LM core_v0.16.1's pretrain_gpt.py loss_func returns
    them: megatron-core divides the sum by the count and the micro-batches (schedules.py forward_step). The legacy
    (mean, report) pair is multiplied by the CP size there, which made a CP rank's gradient cp x too large and
    weighed the MTP loss (scaled without that factor) 1/cp of pretrain_gpt's."""
    losses = output_tensor.float().view(-1)
    mask = loss_mask.view(-1).float()
    loss = torch.sum(losses * mask)
    num_tokens = mask.sum().detach().to(torch.int)
    return loss, num_tokens, {"lm loss": torch.cat([loss.detach().clone().view(1), num_tokens.view(1).float()])}


def _batches(cfg, source, step: int, dp_rank: int, dp_size: int, device: torch.device):
    plan = cfg.plan
    for micro in range(plan.num_microbatches):
        tokens, labels = micro_batch(source, step=step, global_batch=plan.gbs, micro_batch_size=plan.mbs,
                                     dp_rank=dp_rank, dp_size=dp_size, micro_index=micro, seq_length=plan.seq_length)
        batch = {"tokens": tokens, "labels": labels,
                 "position_ids": torch.arange(plan.seq_length).unsqueeze(0).expand(plan.mbs, -1).contiguous(),
                 "loss_mask": torch.ones(plan.mbs, plan.seq_length)}
        if plan.cp > 1:
            from megatron.core.utils import get_batch_on_this_cp_rank

            batch = get_batch_on_this_cp_rank(batch)
        yield {k: v.to(device) for k, v in batch.items()}


def _forward_step(data_iterator, model):
    batch = next(data_iterator)
    output = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
    return output, partial(_loss_func, batch["loss_mask"])


def _ensure_adam_state(inner) -> None:
    """Adam creates its state at the first step; a resume must restore into existing tensors, made as the optimizer
    itself makes them. megatron-core 0.16.1 steps with Transformer Engine's FusedAdam where TE imports, else apex's,
    and torch's AdamW only without either (optimizer/__init__.py:12-34): the fused ones keep exp_avg and exp_avg_sq
    (TE: and master_param) per parameter and the step count in the parameter group (TE 2.9 fused_adam.py:401
    initialize_state, :497 group["step"]), torch's a per-parameter "step" tensor as well. A torch-style state on TE's
    FusedAdam held one tensor more per parameter than the checkpoint it was to load (written after real steps)."""
    for group in inner.param_groups:
        for p in group["params"]:
            if inner.state.get(p):
                continue
            if hasattr(inner, "initialize_state"):  # TE's FusedAdam: its own dtypes, scales and master weights
                inner.initialize_state(p, bool(getattr(inner, "store_param_remainders", False))
                                       and p.dtype == torch.bfloat16)
            elif isinstance(inner, torch.optim.Optimizer) and type(inner).__module__.startswith("torch."):
                inner.state[p] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p),
                                  "exp_avg_sq": torch.zeros_like(p)}
            else:  # apex's FusedAdam (fused_adam.py: fp32 moments, the step in the group)
                inner.state[p] = {"exp_avg": torch.zeros_like(p, dtype=torch.float32),
                                  "exp_avg_sq": torch.zeros_like(p, dtype=torch.float32)}


def _torch_optimizers(optimizer) -> list:
    """The optimizers that hold Adam's state behind megatron's wrappers, each once."""
    wrappers = measure._inner_optimizers(optimizer)
    return list({id(o): o for o in (getattr(w, "optimizer", w) for w in wrappers)}.values())


def _group_steps(optimizer) -> list:
    """The step counts fused Adams keep per parameter group (TE 2.9 fused_adam.py:497, apex likewise): without them a
    resumed run's first update takes step 1's bias correction. None for torch's Adam (its steps are state tensors)."""
    return [group.get("step") for inner in _torch_optimizers(optimizer) for group in inner.param_groups]


def _set_group_steps(optimizer, steps: list | None) -> None:
    groups = [group for inner in _torch_optimizers(optimizer) for group in inner.param_groups]
    for group, step in zip(groups, steps or []):
        if step is not None:
            group["step"] = step


def _state_tensors(chunks, optimizer) -> list[torch.Tensor]:
    """Every tensor a same-layout resume needs, in a fixed order: parameters, fp32 masters, Adam state, each
    once. (_inner_optimizers lists a mixed-precision wrapper and the torch optimizer inside it: taking the Adam
    state of both saved it twice, 22 bytes per parameter instead of 14 for BF16 on a GPU.)"""
    wrappers = measure._inner_optimizers(optimizer)
    torch_optimizers = list({id(o): o for o in (getattr(w, "optimizer", w) for w in wrappers)}.values())
    for inner in torch_optimizers:
        _ensure_adam_state(inner)
    out = [p.data for m in chunks for p in m.parameters()]
    for opt in wrappers:
        out += [t.data for t in measure._master_tensors(opt)]
    for inner in torch_optimizers:
        for group in inner.param_groups:
            for p in group["params"]:
                state = inner.state.get(p, {})
                out += [state[k] for k in sorted(state) if torch.is_tensor(state[k])]
    return out


def reports_loss() -> bool:
    """Whether this rank's token mean enters the step's loss: each last-stage rank of tensor-parallel rank 0, one per
    data-parallel x context-parallel rank, as Megatron-LM core_v0.16.1's train_step reduces the loss over
    get_data_parallel_group(with_context_parallel=True) (megatron/training/training.py:1739-1753). A CP rank holds
    two of the 2 cp chunks of every sequence (megatron-core utils.py:2021 get_batch_on_this_cp_rank): CP rank 0 alone
    reported the loss of the sequences' first and last chunks only."""
    from megatron.core import parallel_state as ps

    return ps.is_pipeline_last_stage(ignore_virtual=True) and ps.get_tensor_model_parallel_rank() == 0


class MegatronRunner(loop.Runner):
    """megatron-core's model chunks, DDP and (distributed) optimizer, stepped by get_forward_backward_func();
    each rank saves every tensor a same-layout resume needs (parameters, fp32 masters, Adam state) with the torch
    and megatron CUDA-tracker RNG states."""

    framework = "megatron"

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        plan, cuda = self.cfg.plan, torch.cuda.is_available()
        te = importlib.util.find_spec("transformer_engine") is not None
        self.use_te = cuda and te and plan.layer_spec == "te"
        why = needs_te_attention(self.cfg.model, plan)
        if why and not self.use_te:
            runtime.fail(why)
        compat = None
        if not cuda:
            from genconf.train import mcore_compat

            compat = mcore_compat.install()
        try:
            yield
        finally:
            if compat is not None:
                compat.uninstall()

    def world_error(self, d: runtime.Dist) -> str | None:
        plan = self.cfg.plan
        if d.world_size != plan.world_size:
            return (f"the plan needs {plan.world_size} ranks (tp {plan.tp} x pp {plan.pp} x cp {plan.cp} x dp "
                    f"{plan.dp}) but {d.world_size} were started")
        return None

    def setup(self, d: runtime.Dist) -> None:
        from megatron.core import parallel_state as ps

        plan = self.cfg.plan
        ps.initialize_model_parallel(tensor_model_parallel_size=plan.tp, pipeline_model_parallel_size=plan.pp,
                                     virtual_pipeline_model_parallel_size=plan.vp if plan.vp > 1 else None,
                                     context_parallel_size=plan.cp, expert_model_parallel_size=plan.ep)

    def build(self, d: runtime.Dist, run_dir: Path) -> None:
        from megatron.core import parallel_state as ps
        from megatron.core import tensor_parallel
        from megatron.core.distributed.finalize_model_grads import finalize_model_grads
        from megatron.core.pipeline_parallel import get_forward_backward_func

        cfg, plan = self.cfg, self.cfg.plan
        if d.device.type == "cpu":
            from genconf.train import mcore_compat

            mcore_compat.model_parallel_manual_seed(cfg.train.seed)
        else:
            tensor_parallel.model_parallel_cuda_manual_seed(cfg.train.seed)
        kw = transformer_config_kwargs(cfg, cpu=d.device.type == "cpu")
        if not self.use_te:
            without_grouped_experts(kw)
        config = transformer_config(kw)
        self.spec_name = "te" if self.use_te else "local"
        self.chunks, self.optimizer = build(cfg, config, d, self.use_te)
        self.model = torch.nn.ModuleList(self.chunks)
        config.finalize_model_grads_func = finalize_model_grads
        config.no_sync_func = [m.no_sync for m in self.chunks] if plan.vp > 1 else self.chunks[0].no_sync
        config.grad_scale_func = self.optimizer.scale_loss
        self.dp_rank, self.dp_size = ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()
        self.fwd_bwd = get_forward_backward_func()
        self.last_stage_reporter = reports_loss()

    def describe(self) -> str:
        plan = self.cfg.plan
        return (f"megatron-core tp={plan.tp} pp={plan.pp} vp={plan.vp} cp={plan.cp} ep={plan.ep} dp={plan.dp}, "
                f"{plan.num_microbatches} micro-batches of {plan.mbs}, layer spec {self.spec_name}, "
                f"{self.cfg.precision_recipe}{', distributed optimizer' if plan.distributed_optimizer else ''}")

    def step(self, step: int, source, d: runtime.Dist) -> tuple[float, float | None]:
        cfg, plan, chunks, optimizer = self.cfg, self.cfg.plan, self.chunks, self.optimizer
        for m in chunks:
            m.zero_grad_buffer()
        optimizer.zero_grad()
        data = [_batches(cfg, source, step, self.dp_rank, self.dp_size, d.device) for _ in range(plan.vp)]
        out = self.fwd_bwd(forward_step_func=_forward_step, data_iterator=data if plan.vp > 1 else data[0],
                           model=chunks if plan.vp > 1 else chunks[0], num_microbatches=plan.num_microbatches,
                           seq_length=plan.seq_length // plan.cp, micro_batch_size=plan.mbs, forward_only=False)
        _ok, grad_norm, _ = optimizer.step()
        sums = torch.stack([o["lm loss"].float().cpu() for o in out]).sum(dim=0) if out else torch.ones(2)
        local = (sums[0] / sums[1]).item() if out else 0.0  # this rank's tokens' mean loss over its micro-batches
        reporter = self.last_stage_reporter
        mtp = self._mtp_loss() if cfg.model.mtp_num_layers else None
        sent = [local if reporter else 0.0, 1.0 if reporter else 0.0]
        if cfg.model.mtp_num_layers:
            sent += [mtp if reporter and mtp is not None else 0.0, 1.0 if reporter and mtp is not None else 0.0]
        got = collectives.sum_over_ranks(sent, d)
        self.mtp_loss = (got[2] / got[3] if got[3] else None) if cfg.model.mtp_num_layers else None
        return got[0] / got[1], float(grad_norm) if grad_norm is not None else None

    def _mtp_loss(self) -> float | None:
        """This rank's multi-token-prediction loss of the step, the mean over its MTP depths (megatron-core's
        MTPLossLoggingHelper holds each depth's sum over the micro-batches, averaged over dp x cp as Megatron-LM's
        training_log does); reset for the next step. None on a rank that holds no MTP layer."""
        from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

        MTPLossLoggingHelper.reduce_loss_in_tracker()
        values = MTPLossLoggingHelper.tracker.get("values")
        if values is None:
            return None
        loss = float(values.float().mean().item()) / self.cfg.plan.num_microbatches
        MTPLossLoggingHelper.clean_loss_in_tracker()
        return loss

    def step_metrics(self) -> dict:
        extra = {"layer_spec": self.spec_name}
        if getattr(self, "mtp_loss", None) is not None:
            extra["mtp_loss"] = self.mtp_loss  # Megatron-LM's "mtp_1 loss" (the mean over depths)
        return extra

    def save(self, path: Path, d: runtime.Dist) -> None:
        from megatron.core import tensor_parallel

        path.mkdir(parents=True, exist_ok=True)
        torch.save({"tensors": [t.detach().cpu() for t in _state_tensors(self.chunks, self.optimizer)],
                    "group_steps": [s.cpu() if torch.is_tensor(s) else s for s in _group_steps(self.optimizer)],
                    "rng": torch.get_rng_state(), "tracker": tensor_parallel.get_cuda_rng_tracker().get_states()},
                   path / f"rank{d.rank:05d}.pt")

    def load(self, path: Path, d: runtime.Dist) -> None:
        from megatron.core import tensor_parallel

        state = torch.load(path / f"rank{d.rank:05d}.pt", weights_only=False)
        ours = _state_tensors(self.chunks, self.optimizer)
        if len(ours) != len(state["tensors"]):
            runtime.fail(f"checkpoint {path} does not match this layout ({len(state['tensors'])} tensors, "
                         f"expected {len(ours)})")
        with torch.no_grad():
            for dst, src in zip(ours, state["tensors"]):
                dst.copy_(src)
        _set_group_steps(self.optimizer, [s.to(d.device) if torch.is_tensor(s) else s
                                          for s in state.get("group_steps") or []])
        torch.set_rng_state(state["rng"])
        tensor_parallel.get_cuda_rng_tracker().set_states(state["tracker"])

    def close(self) -> None:
        from megatron.core import parallel_state as ps

        ps.destroy_model_parallel()


def main(argv: list[str] | None = None) -> int:
    return loop.main(MegatronRunner, argv, description=__doc__.splitlines()[0])


if __name__ == "__main__":
    loop.exit_process(main())
