"""ParallelPlan.replace: dataclasses.replace's result, faster; the validation it skips reads none of the fields."""

import dataclasses

import pytest

from genconf.plan.specs import PLAN_FIELDS, PLAN_FIELDS_UNVALIDATED, ParallelPlan

PLAN = ParallelPlan(framework="megatron", tp=2, pp=4, vp=2, ep=8, etp=1, dp=16, mbs=1, gbs=256, zero_stage=1,
                    seq_length=4096, sequence_parallel=True, tp_comm_overlap=True, recompute="selective")


class _Reads:
    """Stands in for a plan in ParallelPlan.__post_init__, noting each field it reads."""

    def __init__(self, plan: ParallelPlan) -> None:
        object.__setattr__(self, "plan", plan)
        object.__setattr__(self, "read", set())

    def __getattr__(self, name: str) -> object:
        self.read.add(name)
        return getattr(self.plan, name)


def test_unvalidated_fields_are_never_read_by_the_validation():
    reads = _Reads(PLAN)
    ParallelPlan.__post_init__(reads)
    assert reads.read, "the stand-in saw no field: the check would prove nothing"
    # Fields only: a property read here would hide the fields it reads from this check.
    assert reads.read <= set(PLAN_FIELDS)
    assert not reads.read & PLAN_FIELDS_UNVALIDATED
    assert PLAN_FIELDS_UNVALIDATED <= set(PLAN_FIELDS)


@pytest.mark.parametrize("changes", [
    {"precision_aware_optimizer": True}, {"fused_loss": True, "tp_comm_overlap": False},
    {"recompute": "full", "recompute_layers": 3}, {"recompute_modules": ("moe_act",)},
    {"pp_layout": "Et|(t|)*6,tL", "vp": 2, "pp_first_stage_layers": None}, {"mbs": 2, "gbs": 512}, {}])
def test_replace_is_dataclasses_replace(changes):
    fast, slow = PLAN.replace(**changes), dataclasses.replace(PLAN, **changes)
    assert fast == slow and hash(fast) == hash(slow) and type(fast) is ParallelPlan
    assert all(getattr(fast, name) == getattr(slow, name) for name in PLAN_FIELDS)
    assert PLAN == dataclasses.replace(PLAN)  # the original is left as it was


@pytest.mark.parametrize("changes, error", [({"recompute": "bogus"}, ValueError), ({"tp": 0}, ValueError),
                                            ({"recompute_modules": ("moe_act",), "recompute": "full"}, ValueError),
                                            ({"no_such_field": 1}, TypeError)])
def test_replace_refuses_what_dataclasses_replace_refuses(changes, error):
    with pytest.raises(error) as fast:
        PLAN.replace(**changes)
    with pytest.raises(error) as slow:
        dataclasses.replace(PLAN, **changes)
    assert str(fast.value) == str(slow.value)
