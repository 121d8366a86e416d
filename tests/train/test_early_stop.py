"""Full recompute under PyTorch's non-reentrant checkpoint, measured: genconf's own model recomputes each layer up to
its MLP output projection and not that GEMM (torch's early stop), as counting.checkpoint_early_stop prices it."""

from __future__ import annotations

import dataclasses

import pytest

from conftest import reader_or_skip

torch = reader_or_skip("torch", "pip install -e '.[train]'", module_level=True)

from torch.utils.checkpoint import set_checkpoint_early_stop  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from genconf.catalog.models import resolve_model  # noqa: E402
from genconf.plan.counting import checkpoint_early_stop, recompute_flops_per_token  # noqa: E402
from genconf.plan.specs import ParallelPlan  # noqa: E402
from genconf.train.torch_model import Decoder  # noqa: E402

SEQ, BATCH = 32, 2


def _spec(**changes):
    base = resolve_model("gpt3-125m")[0]
    fields = dict(num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=4, ffn_hidden_size=256,
                  seq_length=SEQ, hidden_dropout=0.0, attention_dropout=0.0) | changes
    return dataclasses.replace(base, **fields)


def _backward_flops(spec, *, recompute: bool, early_stop: bool = True) -> int:
    """Matmul FLOPs of one backward (with its recomputation) through genconf's decoder layers."""
    torch.manual_seed(0)
    decoder = Decoder(spec, recompute=recompute).train()
    x = torch.randn(BATCH, SEQ, spec.hidden_size, requires_grad=True)
    with set_checkpoint_early_stop(early_stop):  # read when the checkpointed forward runs
        y = decoder(x, None)
        with FlopCounterMode(display=False) as counted:
            y.sum().backward()
    return counted.get_total_flops()


def test_full_recompute_stops_before_each_layer_s_mlp_output_projection():
    spec = _spec()
    plain = _backward_flops(spec, recompute=False)
    stopped = _backward_flops(spec, recompute=True)
    whole = _backward_flops(spec, recompute=True, early_stop=False)
    tokens = BATCH * SEQ
    # Without early stop the layer's forward GEMMs run again; with it (PyTorch's default) all but the output projection
    # (fc2: 2 x ffn x hidden FLOPs a token and layer), exactly what counting prices as skipped. (A CPU's SDPA kernel is
    # not counted by FlopCounterMode, so the attention products drop out of all three.)
    skipped = 2 * spec.ffn_hidden_size * spec.hidden_size * spec.num_layers * tokens
    assert whole - stopped == skipped
    assert tokens * (recompute_flops_per_token(spec, SEQ, "full")
                     - recompute_flops_per_token(spec, SEQ, "full", early_stop=True)) == skipped
    # What is recomputed: QKV, the attention output projection and fc1 (h (q + 2 kv) + q h + h f MACs a token and layer).
    h, q, kv = spec.hidden_size, spec.query_width, spec.kv_width
    assert stopped - plain == 2 * (h * (q + 2 * kv) + q * h + h * spec.ffn_hidden_size) * spec.num_layers * tokens


def test_a_hidden_dropout_mask_after_the_projection_makes_it_recompute_whole_layers():
    # Dropout saves its mask after fc2 has run: the last saved tensor now needs fc2, so nothing is skipped.
    spec = _spec(hidden_dropout=0.1)
    assert _backward_flops(spec, recompute=True) == _backward_flops(spec, recompute=True, early_stop=False)
    plan = ParallelPlan(framework="fsdp", dp=8, mbs=1, gbs=8, seq_length=SEQ, zero_stage=3, recompute="full")
    assert checkpoint_early_stop(_spec(), plan) and not checkpoint_early_stop(spec, plan)


def test_torchao_s_eager_fp8_linears_recompute_whole_layers():
    # Float8Linear's GEMM is a custom autograd Function: it saves its inputs after running, so the last saved tensor
    # already needs fc2 and nothing is skipped (torchao's emulation runs the same autograd on a CPU).
    reader_or_skip("torchao", "pip install -e '.[fp8]'")
    from genconf.train.float8 import convert

    def flops(recompute: bool, early_stop: bool = True) -> int:
        torch.manual_seed(0)
        decoder = Decoder(_spec(), recompute=recompute).train()
        assert convert(decoder, "fp8-current", emulate=True) == 4 * decoder_layers
        x = torch.randn(BATCH, SEQ, 64, requires_grad=True)
        with set_checkpoint_early_stop(early_stop):
            y = decoder(x, None)
            with FlopCounterMode(display=False) as counted:
                y.sum().backward()
        return counted.get_total_flops()

    decoder_layers = _spec().num_layers
    assert flops(True) == flops(True, early_stop=False) > flops(False)
    plan = ParallelPlan(framework="fsdp", dp=8, mbs=1, gbs=8, seq_length=SEQ, zero_stage=3, recompute="full",
                        precision="fp8")
    assert not checkpoint_early_stop(_spec(), plan)
    assert checkpoint_early_stop(_spec(), dataclasses.replace(plan, torch_compile=True))


def test_under_torch_compile_the_partitioner_leaves_out_the_output_projection_even_of_a_custom_function():
    # torch.compile traces a checkpointed region into one graph; AOTAutograd's min-cut partitioner (inductor's) then
    # recomputes only what the backward reads: fc2's output is not among it, a custom autograd Function's or not.
    from torch.utils.checkpoint import checkpoint

    class SavingLinear(torch.autograd.Function):  # as torchao's matmul_with_hp_or_float8_args saves
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            return x @ w.t()

        @staticmethod
        def backward(ctx, grad):
            x, w = ctx.saved_tensors
            return grad @ w, grad.reshape(-1, grad.shape[-1]).t() @ x.reshape(-1, x.shape[-1])

    class Layer(torch.nn.Module):
        def __init__(self, custom: bool) -> None:
            super().__init__()
            self.custom = custom
            self.proj, self.fc1, self.fc2 = (torch.nn.Linear(16, 16, bias=False), torch.nn.Linear(16, 64, bias=False),
                                             torch.nn.Linear(64, 16, bias=False))

        def body(self, x):
            x = x + self.proj(x)
            y = torch.nn.functional.gelu(self.fc1(x))
            return x + (SavingLinear.apply(y, self.fc2.weight) if self.custom else self.fc2(y))

        def forward(self, x):
            return checkpoint(self.body, x, use_reentrant=False)

    for custom in (False, True):
        counts: dict[str, list[int]] = {}
        try:
            layer = torch.compile(Layer(custom), backend=_counting_backend(counts))
            layer(torch.randn(2, 8, 16, requires_grad=True)).sum().backward()
        finally:
            torch._dynamo.reset()
        # 3 GEMMs forward; backward: 2 per GEMM plus proj and fc1 recomputed, not fc2.
        assert counts == {"forward": [3], "backward": [8]}, (custom, counts)


def test_genconf_s_compiled_blocks_hold_their_checkpoint_and_skip_the_output_projection():
    # genconf's runners compile each block (speed.compile_blocks) and the block checkpoints itself inside its forward:
    # the compiled graph holds the checkpoint. Compiled the other way round (a checkpoint around a compiled block), the
    # block is one autograd Function that saves after running, and its whole forward (4 GEMMs) would run again.
    from genconf.train.speed import SpeedOptions, compile_blocks
    from genconf.train.torch_model import GPT

    spec = _spec()
    counts: dict[str, list[int]] = {}
    torch.manual_seed(0)
    model = GPT(spec, recompute=True).train()
    try:
        assert compile_blocks(model, SpeedOptions(compile=True, compile_backend=_counting_backend(counts))) == 2
        model(torch.randint(0, spec.vocab_size, (BATCH, SEQ)), torch.randint(0, spec.vocab_size, (BATCH, SEQ))).backward()
    finally:
        torch._dynamo.reset()
    # Each block's graph (the blocks share one: their parameters are its inputs): QKV, proj, fc1, fc2 forward;
    # backward 2 per GEMM plus QKV, proj and fc1 recomputed.
    assert set(counts["forward"]) == {4} and set(counts["backward"]) == {11}, counts


def _counting_backend(counts: dict[str, list[int]]):
    """A torch.compile backend: AOTAutograd with inductor's min-cut partitioner, no code generation, counting each
    forward and backward graph's matrix multiplies."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    def compiler(name):
        def count(gm, _inputs):
            counts.setdefault(name, []).append(
                sum(n.op == "call_function" and "mm" in str(n.target) for n in gm.graph.nodes))
            return make_boxed_func(gm)
        return count
    return aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward"),
                        partition_fn=min_cut_rematerialization_partition)
