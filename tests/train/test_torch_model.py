"""genconf's PyTorch GPT runs the activation its model names (megatron-core's functions, written out)."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

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
