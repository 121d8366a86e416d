"""The fused cross entropy of genconf's PyTorch model (ParallelPlan.fused_loss): the same loss and gradient as
F.cross_entropy(logits.float()), and the bytes it keeps for backward are the memory model's, counted tensor by
tensor with saved_tensors_hooks."""

from __future__ import annotations

import pytest

from conftest import needs_torch

pytestmark = needs_torch


@pytest.fixture
def chunked(monkeypatch):
    """Chunks of 700 logits, so that a small case runs through several of them."""
    import genconf.train.torch_model as tm

    monkeypatch.setattr(tm, "FUSED_LOSS_CHUNK_ELEMENTS", 700)
    return tm


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-6), ("bfloat16", 2e-5)])
def test_fused_cross_entropy_equals_torch_cross_entropy(chunked, dtype, tol):
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    logits = (torch.randn(37, 101) * 4).to(getattr(torch, dtype)).requires_grad_()
    labels = torch.randint(0, 101, (37,))
    expected = F.cross_entropy(logits.float(), labels)
    expected.backward()
    grad = logits.grad.clone()
    logits.grad = None
    loss = chunked.fused_cross_entropy(logits, labels)
    loss.backward()
    assert loss.dtype == torch.float32 and logits.grad.dtype == logits.dtype
    assert abs(loss.item() - expected.item()) <= tol * abs(expected.item())
    assert torch.allclose(logits.grad.float(), grad.float(), rtol=1e-2, atol=1e-4)


def test_the_fused_loss_keeps_the_logits_the_labels_and_a_log_sum_exp():
    """Saved for backward: the 16-bit logits, the int64 labels and the fp32 log-sum-exp per token, which is what
    genconf.plan.memory._loss_bytes prices beside the output-layer input (F.cross_entropy(logits.float()) keeps an
    fp32 log-softmax instead: twice the logits' bytes in bf16)."""
    import torch
    import torch.nn.functional as F

    from genconf.train.torch_model import fused_cross_entropy

    tokens, vocab = 64, 1000
    logits = torch.randn(tokens, vocab, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, vocab, (tokens,))

    def saved_bytes(loss_fn) -> int:
        seen: dict[int, int] = {}

        def pack(t):
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            keep = loss_fn()  # noqa: F841 (keeps the graph and its saved tensors alive)
        return sum(seen.values())

    fused = saved_bytes(lambda: fused_cross_entropy(logits, labels))
    assert fused == 2 * tokens * vocab + 8 * tokens + 4 * tokens
    upcast = saved_bytes(lambda: F.cross_entropy(logits.float(), labels))
    assert upcast == 4 * tokens * vocab + 8 * tokens + 4  # the fp32 log-softmax, the labels, nll_loss's total weight


def test_the_model_trains_with_the_fused_loss():
    """GPT(fused_loss=True) gives the same loss as F.cross_entropy and a gradient in every parameter."""
    import torch

    from genconf.plan.specs import ModelSpec
    from genconf.train.torch_model import GPT

    spec = ModelSpec(name="tiny", num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=4,
                     ffn_hidden_size=256, vocab_size=211, seq_length=16, activation="gelu", normalization="layernorm",
                     position_embedding="learned", tie_embeddings=True, add_bias_linear=True, hidden_dropout=0.0,
                     attention_dropout=0.0)
    torch.manual_seed(0)
    plain = GPT(spec)
    fused = GPT(spec, fused_loss=True)
    fused.load_state_dict(plain.state_dict())
    tokens = torch.randint(0, spec.vocab_size, (2, spec.seq_length))
    labels = torch.randint(0, spec.vocab_size, (2, spec.seq_length))
    a, b = plain(tokens, labels), fused(tokens, labels)
    assert abs(a.item() - b.item()) < 1e-5
    a.backward()
    b.backward()
    # Known answer: the gradient F.cross_entropy's model gives every parameter (the same weights, the same batch).
    for (name, p), q in zip(fused.named_parameters(), plain.parameters()):
        assert p.grad is not None and torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-6), name
