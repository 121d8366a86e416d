"""plan.json, the one codec: what encode writes, decode reads back to the same specs; bad text is one line with the
file and the line."""

from __future__ import annotations

import dataclasses
import json

import pytest

from genconf.catalog.clusters import resolve_cluster
from genconf.catalog.hardware import calibration_for
from genconf.catalog.models import resolve_model
from genconf.plan import planfile
from genconf.plan.errors import GenconfError
from genconf.plan.search import Pins, plan_or_explain


@pytest.fixture(scope="module")
def run():
    model, alias = resolve_model("70b")
    cluster = resolve_cluster()
    result = plan_or_explain(model, cluster, 384, calibration_for(cluster.gpu.name), Pins())
    return planfile.encode(model, alias, cluster, 384, result.best, result, 1.3e12), model, cluster, result.best.plan


def test_encode_then_decode_gives_the_specs_back(run):
    d, model, cluster, plan = run
    assert d["schema_version"] == planfile.SCHEMA_VERSION == 1
    pf = planfile.decode(planfile.loads(planfile.dumps(d)))
    assert (pf.model, pf.plan, pf.num_gpus) == (model, plan, 384)
    # The cluster as planning uses it (the NCCL environment as a sorted mapping); the preset's size and
    # description stay in the catalog.
    assert pf.cluster == dataclasses.replace(cluster, total_gpus=None, description=pf.cluster.description,
                                             nccl_env=tuple(sorted(cluster.nccl_env)))
    assert pf.train.train_steps == round(1.3e12 / (plan.gbs * plan.seq_length))
    assert pf.run == json.loads(planfile.dumps(d))


def test_dumps_is_what_json_prints(run):
    text = planfile.dumps(run[0])
    assert text == json.dumps(run[0], indent=2, sort_keys=True) + "\n"


def test_bad_text_names_the_line(tmp_path):
    with pytest.raises(planfile.PlanFileError) as info:
        planfile.loads('{\n  "model": {\n  oops\n}\n', "x.json")
    assert (info.value.line, info.value.column) == (3, 3)
    assert str(info.value) == "x.json:3: invalid JSON: Expecting property name enclosed in double quotes"
    with pytest.raises(planfile.PlanFileError, match=r"^x.json: expected a JSON object$"):
        planfile.loads("[1, 2]", "x.json")
    with pytest.raises(GenconfError, match=r"cannot read .*nowhere.json"):
        planfile.load(tmp_path / "nowhere.json")


def test_missing_or_invalid_parts_are_one_line(run):
    d = dict(run[0])
    del d["train"]
    with pytest.raises(GenconfError, match=r"^plan.json is missing 'train'$"):
        planfile.decode(d)
    d = json.loads(planfile.dumps(run[0]))
    d["plan"]["tp"] = 0
    with pytest.raises(GenconfError, match=r"^plan.json is invalid: "):
        planfile.decode(d)


@pytest.mark.parametrize("gpus,warned", [(384, False), (100_000, True)])
def test_gpus_that_outnumber_the_work_are_a_warning(gpus, warned):
    """70B at its 4M-token default batch: 384 GPUs compute most of the step (no warning); 100,000 share 51 tokens
    each and spend most of the step in the bubble and communication (MFU 2.5%): the plan says so and what helps."""
    model, alias = resolve_model("70b")
    cluster = resolve_cluster()
    best = plan_or_explain(model, cluster, gpus, calibration_for(cluster.gpu.name), Pins()).best
    cost = best.cost
    waiting = (cost.step_time_s - cost.compute_s - cost.optimizer_s) / cost.step_time_s
    assert (cost.mfu < 0.10 and waiting > 0.5) == warned
    low = [w for w in planfile.encode(model, alias, cluster, gpus, best, None, 1e12)["warnings"]
           if w.startswith("low_utilization: ")]
    assert len(low) == int(warned)
    if warned:
        assert f"{gpus:,} GPUs share {cost.tokens_per_step:,} tokens per step" in low[0]
        assert f"{cost.mfu:.1%} MFU" in low[0] and "fewer GPUs or a larger --global-batch" in low[0]
