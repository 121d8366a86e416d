"""The megatron runner's loss function returns what Megatron-LM core_v0.16.1's pretrain_gpt.py loss_func returns."""

import pytest

from conftest import needs_megatron, needs_torch

pytestmark = [needs_torch]


def test_the_loss_is_a_token_sum_with_its_count_as_pretrain_gpt_returns_it():
    # megatron-core's forward_step divides a (sum, count, report) triple by the count and the micro-batches; the
    # legacy (mean, report) pair it also multiplies by the CP size, which pretrain_gpt's loss never gets: the runner's
    # mean made each CP rank's gradient cp x too large and the MTP loss (scaled without cp) 1/cp of pretrain_gpt's.
    import torch

    from genconf.train.runners.megatron import _loss_func

    losses = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    loss, num_tokens, report = _loss_func(mask, losses)
    assert loss.item() == 1 + 2 + 4 + 5 + 6 and num_tokens.item() == 5 and num_tokens.dtype == torch.int
    assert report["lm loss"].tolist() == [18.0, 5.0]  # summed over micro-batches, then divided: the tokens' mean


@needs_megatron
@pytest.mark.parametrize("cp", [1, 2, 4])
def test_megatron_core_makes_it_the_mean_per_micro_batch_whatever_the_cp_size(cp):
    # megatron-core's own forward_step_calc_loss, as the pipeline schedules call it on the last stage: the runner's
    # loss becomes each CP rank's token mean over the micro-batches, which DDP then averages over dp x cp ranks.
    from types import SimpleNamespace

    import torch
    from megatron.core.pipeline_parallel.schedules import forward_step_calc_loss

    from genconf.train.runners.megatron import _loss_func

    losses = torch.tensor([[1.0, 2.0, 3.0, 6.0]])
    mask = torch.ones(1, 4)
    config = SimpleNamespace(calculate_per_token_loss=False, timers=None, num_moe_experts=None, mtp_num_layers=None,
                             grad_scale_func=None)
    store: list = []
    out, num_tokens = forward_step_calc_loss(torch.nn.Module(), losses, lambda t: _loss_func(mask, t), config, None,
                                             False, 2, store, cp_group_size=cp, is_last_stage=True)
    assert out.item() == pytest.approx(3.0 / 2) and num_tokens.item() == 4  # mean 3.0 over 2 micro-batches



def _cp_reporter(rank: int, world: int, init: str, out: str) -> None:
    import json

    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from genconf.train import mcore_compat
    from genconf.train.runners.megatron import reports_loss

    compat = mcore_compat.install()
    try:
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
        ps.initialize_model_parallel(context_parallel_size=world)
        with open(f"{out}.{rank}", "w") as f:
            json.dump({"cp_rank": ps.get_context_parallel_rank(), "reports": reports_loss()}, f)
        ps.destroy_model_parallel()
        dist.destroy_process_group()
    finally:
        compat.uninstall()


@needs_megatron
def test_every_context_parallel_rank_reports_its_share_of_the_loss(tmp_path):
    # Megatron-LM core_v0.16.1 train_step sums (loss, tokens) over dp x cp ranks (training.py:1739-1753): each CP rank
    # holds its own two chunks of every sequence. The runner took CP rank 0's alone: the first and last chunks' loss.
    import json

    import torch.multiprocessing as mp

    out = str(tmp_path / "reporter")
    mp.spawn(_cp_reporter, args=(2, f"file://{tmp_path / 'init'}", out), nprocs=2, join=True)
    got = sorted((json.loads((tmp_path / f"reporter.{r}").read_text()) for r in range(2)), key=lambda g: g["cp_rank"])
    assert got == [{"cp_rank": 0, "reports": True}, {"cp_rank": 1, "reports": True}]


if __name__ == "__main__":
    pytest.main([__file__])
