"""Checkpoint sizes in the plan's output (issue 13 part 3): 14 bytes per parameter for 16-bit weights with
FP32 masters and Adam (the seed's 'just loading weights' 14P), 12 for FP32 weights."""

from __future__ import annotations

from genconf.catalog.models import resolve_model
from genconf.plan.checkpoint_size import checkpoint_size
from genconf.plan.counting import exact_param_count
from genconf.plan.memory import seed_model_bytes
from genconf.plan.specs import ParallelPlan


def test_sixteen_bit_weights_are_the_seeds_14p():
    model, _ = resolve_model("70b")
    size = checkpoint_size(model, ParallelPlan(framework="megatron", tp=4, pp=4, dp=24, precision="bf16"))
    # 65,250,926,592 parameters, and the untied embedding and output layer's padding rows: megatron pads the 50,280
    # tokens to 50,688 (a multiple of 128 x 4), genconf's own model (DeepSpeed) to 50,304 (of 64).
    # Counted by hand from models/olmo-70b.yaml (the seed's D=8192, N=80, V=50280; no biases, untied): per layer
    # 12 D^2 of weights, two weight-only LayerNorms and the full-width q/k norms (4 D); the embedding, the output
    # layer and the final norm.
    assert exact_param_count(model) == 80 * (12 * 8192**2 + 4 * 8192) + 2 * 50280 * 8192 + 8192 == 65_250_926_592
    assert size.checkpoint_bytes == seed_model_bytes(65_250_926_592 + 408 * 8192 * 2)
    assert size.disk_bytes == 3 * size.checkpoint_bytes  # keep 2, plus the one being written
    ds = checkpoint_size(model, ParallelPlan(framework="deepspeed", dp=384, zero_stage=3, precision="bf16"), keep_last=5)
    assert ds.checkpoint_bytes == 14 * (65_250_926_592 + 24 * 8192 * 2) and ds.disk_bytes == 6 * ds.checkpoint_bytes


def test_fp32_weights():
    model, _ = resolve_model("1b")
    n = exact_param_count(model)
    assert checkpoint_size(model, ParallelPlan(framework="fsdp", dp=8, zero_stage=3)).checkpoint_bytes == 12 * n
    assert checkpoint_size(model, ParallelPlan(framework="megatron", precision="fp32")).checkpoint_bytes == 12 * n
    assert checkpoint_size(model, ParallelPlan(framework="deepspeed", precision="fp32")).checkpoint_bytes == 16 * n


def test_the_padded_vocabulary_rows_are_saved_too():
    """GPT-3's 50,257-token vocabulary: genconf's own model holds 50,304 rows (a multiple of 128), megatron at TP 2
    50,432 (128 x 2); the checkpoint saves them, tied embeddings once (768 wide for the 125M)."""
    model, _ = resolve_model("gpt3-125m")
    n = exact_param_count(model)
    assert model.tie_embeddings
    assert checkpoint_size(model, ParallelPlan(framework="fsdp", dp=8, zero_stage=3)).params == n + 47 * 768
    assert checkpoint_size(model, ParallelPlan(framework="megatron", tp=2, dp=4)).params == n + 175 * 768
