"""The megatron runner's checkpoint holds the Adam state the optimizer megatron-core picked would itself create.

megatron-core 0.16.1 steps with Transformer Engine's FusedAdam wherever TE imports (every CUDA machine with
`pip install -e '.[te]'`), apex's FusedAdam without TE, torch's AdamW only without either (optimizer/__init__.py:12-34).
A resume builds the optimizer, makes its state before any step and copies the checkpoint's tensors into it; a
torch-style state ("step", exp_avg, exp_avg_sq) on TE's FusedAdam, which keeps exp_avg and exp_avg_sq per parameter
and the step in the parameter group (TE 2.9 fused_adam.py:401 initialize_state, :497 group["step"]), held one tensor
more per parameter than the checkpoint: every GPU resume with TE stopped at "does not match this layout".

TE does not build without CUDA, so its FusedAdam is stood in for by the contract its source shows (the lines above);
torch's AdamW runs for real.
"""

import pytest

from conftest import needs_megatron, needs_torch

pytestmark = [needs_torch, needs_megatron]


def _te_like_adam():
    """An optimizer with Transformer Engine 2.9 FusedAdam's state contract: initialize_state(param,
    store_param_remainders) makes exp_avg and exp_avg_sq (fused_adam.py:401), the step lives in the group (:497)."""
    import torch

    class TEContractAdam(torch.optim.Optimizer):
        store_param_remainders = False

        def __init__(self, params):
            super().__init__(params, {"lr": 1e-2})

        def initialize_state(self, param, store_param_remainders):
            self.state[param]["exp_avg"] = torch.zeros_like(param, dtype=torch.float32)
            self.state[param]["exp_avg_sq"] = torch.zeros_like(param, dtype=torch.float32)

        @torch.no_grad()
        def step(self):
            for group in self.param_groups:
                group["step"] = group.get("step", 0) + 1
                for p in group["params"]:
                    if len(self.state[p]) == 0:
                        self.initialize_state(p, False)
                    self.state[p]["exp_avg"].add_(p.grad)
                    self.state[p]["exp_avg_sq"].add_(p.grad * p.grad)
                    p.sub_(group["lr"] * self.state[p]["exp_avg"] / group["step"])

    return TEContractAdam


def _stepped(optimizer, param):
    param.grad = param.detach().clone() + 1
    optimizer.step()
    return optimizer


def _state_keys(optimizer):
    return [sorted(k for k, v in optimizer.state[p].items() if hasattr(v, "shape"))
            for g in optimizer.param_groups for p in g["params"]]


@pytest.mark.parametrize("kind", ["torch", "te"])
def test_a_fresh_optimizers_state_has_the_tensors_a_stepped_one_saves(kind):
    import torch

    from genconf.train.runners.megatron import _ensure_adam_state

    def make():
        param = torch.nn.Parameter(torch.randn(4, 3))
        opt = torch.optim.AdamW([param], lr=1e-2) if kind == "torch" else _te_like_adam()([param])
        return opt, param

    saved, param = make()
    _stepped(saved, param)  # the checkpoint is written after real steps
    fresh, _ = make()  # the resume's optimizer, before its first step
    _ensure_adam_state(fresh)
    assert _state_keys(fresh) == _state_keys(saved)
    assert _state_keys(fresh) == ([["exp_avg", "exp_avg_sq", "step"]] if kind == "torch" else [["exp_avg", "exp_avg_sq"]])


def test_the_group_step_of_a_fused_adam_survives_the_resume():
    """TE's and apex's FusedAdam count steps in the parameter group: lost, the resumed run's first update would take
    step 1's bias correction."""
    import torch

    from genconf.train.runners.megatron import _group_steps, _set_group_steps

    param = torch.nn.Parameter(torch.randn(2))
    opt = _te_like_adam()([param])
    for _ in range(3):
        _stepped(opt, param)
    steps = _group_steps(opt)
    assert steps == [3]
    fresh = _te_like_adam()([torch.nn.Parameter(torch.randn(2))])
    _set_group_steps(fresh, steps)
    assert _group_steps(fresh) == [3]
    adamw = torch.optim.AdamW([torch.nn.Parameter(torch.randn(2))])
    assert _group_steps(adamw) == [None]  # torch's Adam keeps its step in the state tensors, saved with them
    _set_group_steps(adamw, [None])
    assert "step" not in adamw.param_groups[0]
