"""ds_config.json: DeepSpeed's batch arithmetic, ZeRO stage, offload and precision against the plan."""

from __future__ import annotations

from genconf.check.common import Problem, as_int, json_line, load_json
from genconf.plan.equivalent import equivalent_plan
from genconf.plan.planfile import PlanFile
from genconf.render import deepspeed


def check_ds_config(text: str, p: PlanFile) -> list[Problem]:
    name = "ds_config.json"
    config, problems = load_json(name, text)
    if problems:
        return problems
    if not isinstance(config, dict):
        return [Problem(name, 1, "expected a JSON object")]

    def at(*keys: str) -> int | None:
        return json_line(text, *keys)

    expected = deepspeed.deepspeed_config(p.model, p.plan, p.train)
    ds_plan, _ = equivalent_plan(p.plan, "deepspeed")
    dp = ds_plan.dp
    values = {}
    for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
        value = as_int(config.get(key))
        if value is None or value < 1:
            problems.append(Problem(name, at(key), f"{key} must be a positive integer, got {config.get(key)!r}"))
        values[key] = value
    if None not in values.values():
        tbs, micro, accum = (values[k] for k in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                                 "gradient_accumulation_steps"))
        if tbs != micro * accum * dp:
            problems.append(Problem(name, at("train_batch_size"),
                                    f"train_batch_size ({tbs}) != train_micro_batch_size_per_gpu x "
                                    f"gradient_accumulation_steps x data-parallel size ({micro} x {accum} x {dp} = "
                                    f"{micro * accum * dp})"))
        elif tbs != expected["train_batch_size"]:
            problems.append(Problem(name, at("train_batch_size"),
                                    f"train_batch_size ({tbs}) contradicts plan.json (global batch "
                                    f"{expected['train_batch_size']}); edit plan.json and re-render"))
    zero = config.get("zero_optimization", {})
    if not isinstance(zero, dict):
        problems.append(Problem(name, at("zero_optimization"), "zero_optimization must be an object"))
        zero = {}
    stage = zero.get("stage", 0)
    want = expected["zero_optimization"]["stage"]
    if stage not in (0, 1, 2, 3) or isinstance(stage, bool):
        problems.append(Problem(name, at("zero_optimization", "stage"),
                                f"zero_optimization.stage must be 0-3, got {stage!r}"))
    elif stage != want:
        problems.append(Problem(name, at("zero_optimization", "stage"),
                                f"zero_optimization.stage {stage} contradicts plan.json (zero={want} for "
                                f"{ds_plan.dp} GPUs); edit plan.json and re-render"))
    if isinstance(zero.get("offload_param"), dict) and zero["offload_param"].get("device", "none") != "none" and stage != 3:
        problems.append(Problem(name, at("zero_optimization", "offload_param"),
                                f"offload_param needs zero_optimization.stage 3, not {stage}"))
    if isinstance(zero.get("offload_optimizer"), dict) and zero["offload_optimizer"].get("device", "none") != "none" \
            and stage == 0:
        problems.append(Problem(name, at("zero_optimization", "offload_optimizer"),
                                "offload_optimizer needs ZeRO stage >= 1"))

    def enabled(key: str) -> bool:
        section = config.get(key)
        return isinstance(section, dict) and bool(section.get("enabled"))

    fp16, bf16 = enabled("fp16"), enabled("bf16")
    want_fp16 = "fp16" in expected
    if fp16 and bf16:
        problems.append(Problem(name, at("fp16"), "fp16 and bf16 are both enabled"))
    elif not fp16 and not bf16 and ds_plan.precision != "fp32":
        problems.append(Problem(name, None, f"neither bf16 nor fp16 is enabled; the plan trains in "
                                            f"{'fp16' if want_fp16 else 'bf16'}"))
    elif fp16 != want_fp16:
        problems.append(Problem(name, at("fp16" if fp16 else "bf16"),
                                f"{'fp16' if fp16 else 'bf16'} contradicts plan.json (precision "
                                f"{'fp16' if want_fp16 else ds_plan.precision})"))
    problems += _zero_keys_deepspeed_refuses(name, text, zero, expected["zero_optimization"])
    scheduler = config.get("scheduler")
    if isinstance(scheduler, dict) and isinstance(scheduler.get("params"), dict):
        warmup = scheduler["params"].get("warmup_num_steps")
        if warmup is not None and (as_int(warmup) is None or warmup < 1):
            problems.append(Problem(name, at("scheduler", "params", "warmup_num_steps"),
                                    f"warmup_num_steps must be a positive integer (DeepSpeed refuses {warmup!r})"))
    return problems


ZERO_CONFIG_KEYS = frozenset("""
allgather_bucket_size allgather_partitions allgather_sequential compute_grad_norm contiguous_gradients cpu_offload
cpu_offload_param cpu_offload_use_pin_memory elastic_checkpoint enable_sanity_checks gather_16bit_weights_on_model_save
ignore_unused_parameters leaf_module legacy_stage1 load_from_fp32_weights log_trace_cache_warnings max_live_parameters
max_reuse_distance memory_efficient_linear model_persistence_threshold module_granularity_threshold offload_optimizer
offload_param overlap_comm override_module_apply param_persistence_threshold parameter_alignment
pipeline_loading_checkpoint prefetch_bucket_size reduce_bucket_size reduce_scatter round_robin_gradients
save_muon_momentum_buffer_in_memory stage stage3_allgather_sequential stage3_gather_16bit_weights_on_model_save
stage3_gather_fp16_weights_on_model_save stage3_max_live_parameters stage3_max_reuse_distance
stage3_model_persistence_threshold stage3_module_granularity_threshold stage3_param_persistence_threshold
stage3_prefetch_bucket_size stage3_use_all_reduce_for_fetch_params sub_group_size use_all_reduce_for_fetch_params
use_multi_rank_bucket_allreduce zenflow zero_hpz_partition_size zero_quantized_gradients
zero_quantized_nontrainable_weights zero_quantized_weights
""".split())
"""DeepSpeed 0.19.8's DeepSpeedZeroConfig fields and their aliases (runtime/zero/config.py), which forbids any other
key (extra='forbid'): deepspeed.initialize refuses a misspelt `overlap_com`. tests/check/test_check.py holds this
set to the installed DeepSpeed's."""


def _zero_keys_deepspeed_refuses(name: str, text: str, zero: dict, rendered: dict) -> list[Problem]:
    """zero_optimization keys that are neither genconf's nor DeepSpeed's (a typo in a hand edit)."""
    unknown = [k for k in zero if k not in rendered and k not in ZERO_CONFIG_KEYS]
    return [Problem(name, json_line(text, "zero_optimization", key),
                    f"zero_optimization.{key}: not a key DeepSpeed's DeepSpeedZeroConfig takes (it refuses unknown "
                    f"keys)") for key in unknown]
