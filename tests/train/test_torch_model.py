"""genconf's PyTorch GPT runs the activation its model names (megatron-core's functions, written out)."""

from __future__ import annotations

import dataclasses

import pytest

from conftest import reader_or_skip

torch = reader_or_skip("torch", "pip install -e '.[train]'", module_level=True)

from genconf.catalog.models import resolve_model  # noqa: E402
from genconf.train.torch_model import MLP  # noqa: E402


@pytest.mark.parametrize("activation, expected", [
    ("gelu", lambda y: torch.nn.functional.gelu(y)),
    ("squared_relu", lambda y: torch.relu(y) ** 2),  # Primer (So et al. 2021): relu(x)^2
])
def test_the_mlp_runs_the_model_s_activation(activation, expected):
    spec = dataclasses.replace(resolve_model("gpt3-125m")[0], activation=activation)
    torch.manual_seed(0)
    mlp = MLP(spec)
    x = torch.randn(2, 3, spec.hidden_size)
    assert torch.allclose(mlp(x), mlp.linear_fc2(expected(mlp.linear_fc1(x))), atol=1e-6)
    if activation == "squared_relu":  # not GELU: the two differ on these inputs
        assert not torch.allclose(mlp(x), mlp.linear_fc2(torch.nn.functional.gelu(mlp.linear_fc1(x))), atol=1e-3)


# CUDA autocast runs these in fp32 (torch.amp's "CUDA Ops that can autocast to float32"): on an ffn-wide tensor such a
# call keeps an fp32 copy for backward that the memory model does not price. square() is pow underneath.
_CUDA_AUTOCAST_FP32 = {"pow", "exp", "log", "rsqrt", "reciprocal", "softplus", "sum", "cumsum", "prod", "norm",
                       "softmax", "_softmax", "log_softmax", "_log_softmax", "layer_norm", "native_layer_norm"}


@pytest.mark.parametrize("activation", ["gelu", "swiglu", "squared_relu"])
def test_the_mlp_calls_no_op_that_cuda_autocast_runs_in_fp32(activation):
    """The squared-ReLU MLP once called square(): on an H200 under DDP autocast it peaked 7.5 GiB over its plan (1B, 16
    layers, micro-batch 8), an fp32 copy of every layer's ffn-wide relu output (gpu_runs/README.md). A CPU's autocast
    keeps pow in bf16, so the ops the MLP dispatches are checked instead."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names: set[str] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.add(func._schema.name.split("::")[-1])
            return func(*args, **(kwargs or {}))

    spec = dataclasses.replace(resolve_model("gpt3-125m")[0], activation=activation)
    mlp = MLP(spec)
    x = torch.randn(2, 3, spec.hidden_size, requires_grad=True)
    with Ops() as ops:  # the forward: autocast casts there, and what it saves is what backward keeps
        y = mlp(x)
    assert {"addmm", "relu" if activation == "squared_relu" else "mul" if activation == "swiglu" else "gelu"} <= ops.names
    assert not ops.names & _CUDA_AUTOCAST_FP32, sorted(ops.names & _CUDA_AUTOCAST_FP32)
    assert y.shape == x.shape


@pytest.mark.parametrize("seq, window, heads, groups", [
    (300, 64, 4, 4),      # chunks of 128 rows: the last one short
    (1000, 200, 6, 2),    # grouped-query attention: three query heads per key/value head
    (700, 513, 4, 1),     # one key/value head; a window that is no multiple of the chunk
    (64, 100, 2, 2),      # a window longer than the sequence: plain causal attention
])
def test_windowed_attention_is_megatron_cores_band(seq, window, heads, groups):
    """genconf's chunked windowed attention equals attention under megatron-core's own sliding-window mask
    (transformer/utils.py get_sliding_window_causal_mask with window_size (w, 0)), values and gradients."""
    reader_or_skip("megatron.core", "pip install -e '.[train]'")
    from megatron.core.transformer.utils import get_sliding_window_causal_mask

    from genconf.train import mcore_compat
    from genconf.train.torch_model import windowed_attention

    torch.manual_seed(0)
    q = torch.randn(2, heads, seq, 16, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(2, groups, seq, 16, dtype=torch.float64, requires_grad=True) for _ in range(2))
    with mcore_compat.cpu_megatron():  # the mask is built on device "cuda"
        masked = get_sliding_window_causal_mask(seq, seq, (window, 0))  # True: the key is masked out
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=~masked.cpu(),
                                                                enable_gqa=heads != groups)
    got = windowed_attention(q, k, v, window)
    torch.testing.assert_close(got, expected)
    for a, b in zip(torch.autograd.grad(got.square().sum(), (q, k, v)),
                    torch.autograd.grad(expected.square().sum(), (q, k, v))):
        torch.testing.assert_close(a, b)


def test_the_windowed_layers_are_megatron_cores():
    """GPT's layers use the window exactly where megatron-core's is_layer_window_attention says (1-indexed layer
    numbers, every window_attn_skip_freq-th layer full)."""
    reader_or_skip("megatron.core", "pip install -e '.[train]'")
    from megatron.core.transformer.utils import is_layer_window_attention

    from genconf.train.torch_model import GPT

    base = dataclasses.replace(resolve_model("gpt3-125m")[0], num_layers=7)
    for freq in (0, 2, 3):
        spec = dataclasses.replace(base, sliding_window=64, window_attn_skip_freq=freq)
        with torch.device("meta"):
            model = GPT(spec)
        windows = [layer.self_attention.window for layer in model.decoder.layers]
        expected = [64 if is_layer_window_attention((64, 0), freq or None, n) else None for n in range(1, 8)]
        assert windows == expected
        assert spec.windowed_layers == sum(w is not None for w in windows)


def test_windowed_attention_takes_the_fused_kernels_strided_output(monkeypatch):
    """CUDA's memory-efficient and flash kernels return [b, heads, s, d] strided as [b, s, heads, d]: the chunks'
    outputs are split and concatenated, never viewed, so grouped-query attention works with that layout too."""
    from genconf.train.torch_model import windowed_attention

    sdpa = torch.nn.functional.scaled_dot_product_attention

    def strided(*args, **kwargs):
        return sdpa(*args, **kwargs).transpose(1, 2).contiguous().transpose(1, 2)

    torch.manual_seed(0)
    q, k, v = torch.randn(2, 8, 300, 16), torch.randn(2, 2, 300, 16), torch.randn(2, 2, 300, 16)
    expected = windowed_attention(q, k, v, 64)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", strided)
    torch.testing.assert_close(windowed_attention(q, k, v, 64), expected)


def test_windowed_attention_under_autocast_builds_its_masks_once_in_its_dtype():
    """fp32 q and k under autocast (q/k norms run in fp32): q, k, v cast once and the masks built in bf16, each
    shared by every layer of the same shape: 400 tokens in chunks of 128 under a 100-key window are a first chunk
    (fewer keys), two interior ones (one mask) and a short last one."""
    from genconf.train import torch_model

    torch.manual_seed(0)
    q, k, v = torch.randn(1, 4, 400, 16), torch.randn(1, 2, 400, 16), torch.randn(1, 2, 400, 16)
    torch_model._BANDS.clear()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = torch_model.windowed_attention(q, k, v, 100)
        masks = dict(torch_model._BANDS)
        torch_model.windowed_attention(q, k, v, 100)  # a second layer: no new mask
    assert out.dtype == torch.bfloat16 and list(torch_model._BANDS) == list(masks)
    assert all(torch_model._BANDS[key] is mask for key, mask in masks.items())
    assert sorted((key[5], key[6], key[7]) for key in masks) == [(16, 0, 116), (128, 0, 228), (128, 100, 128)]
    assert all(key[:4] == (100, 128, 2, torch.bfloat16) for key in masks)
    ref = torch_model.windowed_attention(*(t.to(torch.bfloat16) for t in (q, k, v)), 100)
    torch.testing.assert_close(out, ref)


@pytest.mark.parametrize("seq, window", [(4200, 4096), (8192, 4096), (1000, 200), (300, 64)])
def test_the_cost_model_prices_the_keys_the_chunks_compute(monkeypatch, seq, window):
    """counting.window_keys_per_query (what genconf.plan.cost prices for genconf's own windowed layers) is the mean
    over queries of the keys the chunks hand SDPA, masked or not."""
    from genconf.plan.counting import window_keys_per_query
    from genconf.train.torch_model import windowed_attention

    sdpa, computed = torch.nn.functional.scaled_dot_product_attention, []

    def counting(query, key, value, **kwargs):
        computed.append(query.shape[-2] * key.shape[-2])
        return sdpa(query, key, value, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counting)
    q, k = torch.zeros(1, 2, seq, 8), torch.zeros(1, 1, seq, 8)
    windowed_attention(q, k, k, window)
    assert sum(computed) / (2 * seq) == pytest.approx(window_keys_per_query(window, seq))
    assert window_keys_per_query(window, seq) < window + 1024  # first chunks see fewer keys
