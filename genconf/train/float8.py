"""FP8 training without Transformer Engine: torchao's float8 linear layers for the FSDP (and DeepSpeed)
runners, as torchtitan (`torchtitan/components/quantization/float8.py`) and OLMo-core do.

`convert_to_float8_training` swaps every eligible nn.Linear for torchao's Float8Linear: its GEMMs run in
FP8 (e4m3 forward, e5m2 gradients) through torch._scaled_mm with per-tensor scales computed from the current
tensor ("tensorwise", the dynamic-scaling recipe genconf calls fp8-current); master weights, optimizer states
and the FSDP all-gather stay as they are. Linear layers whose dimensions are not multiples of 16 (what
_scaled_mm needs) and the output (logits) layer, which recipes keep in BF16, stay in high precision.

Where it may run is genconf.plan.precision.unsupported_reason's to say (FP8 tensor cores on a GPU; torch._scaled_mm
also has a CPU kernel, so the path runs, slowly, on a CPU for tests).
"""

from __future__ import annotations

from genconf.plan.precision import TORCHAO_RECIPES

def keep_in_high_precision(module, fqn: str) -> bool:
    """Whether a Linear stays BF16: the output layer, and shapes _scaled_mm cannot take (not multiples of 16)."""
    import torch

    if not isinstance(module, torch.nn.Linear):
        return True
    return fqn.split(".")[-1] == "output_layer" or module.in_features % 16 != 0 or module.out_features % 16 != 0


def convert(model, recipe_name: str = "fp8-current", *, emulate: bool = False) -> int:
    """Swap the model's eligible Linear layers for torchao Float8Linear in place; returns how many. `emulate`:
    cast to FP8 and back as the real path does but multiply in high precision (torchao's emulation), for CPUs
    whose pinned oneDNN ISA has no FP8 matmul."""
    import dataclasses

    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = Float8LinearConfig.from_recipe_name(TORCHAO_RECIPES[recipe_name])
    if emulate:
        config = dataclasses.replace(config, emulate=True)
    convert_to_float8_training(model, config=config,
                               module_filter_fn=lambda module, fqn: not keep_in_high_precision(module, fqn))
    return sum(1 for m in model.modules() if type(m).__name__ == "Float8Linear")
