"""plan.json, the one codec: what encode writes, decode reads back to the same specs; bad text is one line with the
file and the line."""

from __future__ import annotations

import dataclasses
import json

import pytest

from conftest import REPO
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


@pytest.mark.parametrize("where,key,value", [
    # Each was rendered as it stood: a node count the cluster does not have and a stale layout line went into the
    # artifacts. They are outputs: written anew, as genconf derives them (a hand-edited plan keeps its old ones).
    ("plan", "num_microbatches", True),
    ("cluster", "num_nodes", 3),
    ("model", "params", 5),
    ("", "layout", "megatron tp=8"),
])
def test_values_genconf_derives_are_written_as_it_derives_them(run, where, key, value):
    d = json.loads(planfile.dumps(run[0]))
    (d[where] if where else d)[key] = value
    assert planfile.decode(d, "x.json").run == json.loads(planfile.dumps(run[0]))


@pytest.mark.parametrize("where,key,value,needle", [
    ("plan", "stage_layers", "x", "x.json is invalid: plan.stage_layers is 'x', genconf derives [20, 20, 20, 20]"),
    ("plan", "stage_layers", [10, 30, 20, 20], "set those, or leave stage_layers out"),
    ("cluster", "num_gpus", "64", "x.json is invalid: cluster.num_gpus must be a whole number, got '64'"),
])
def test_a_stage_split_or_gpu_count_genconf_cannot_take_is_refused(run, where, key, value, needle):
    # The layers per stage read like a setting: one that is not the plan's is refused, not silently replaced.
    d = json.loads(planfile.dumps(run[0]))
    (d[where] if where else d)[key] = value
    with pytest.raises(GenconfError) as info:
        planfile.decode(d, "x.json")
    assert needle in str(info.value)


def test_values_genconf_derives_are_filled_in_where_left_out(run):
    d = json.loads(planfile.dumps(run[0]))
    del d["layout"], d["plan"]["stage_layers"], d["cluster"]["num_nodes"]
    # render read them as they stood: KeyError 'layout' (a traceback), a template error for num_nodes
    assert planfile.decode(d).run == json.loads(planfile.dumps(run[0]))


@pytest.mark.parametrize("version,needle", [
    (999, "x.json: schema_version 999 is newer than genconf 0.1.0 reads (1): use genconf 9.0 or newer, which wrote it"),
    ("1", "x.json: schema_version must be a whole number from 1, got '1'"),
    (0, "x.json: schema_version must be a whole number from 1, got 0"),
])
def test_a_schema_version_genconf_does_not_read_is_refused(run, version, needle):
    d = json.loads(planfile.dumps(run[0]))
    d.update(schema_version=version, genconf_version="9.0")
    with pytest.raises(GenconfError) as info:
        planfile.decode(d, "x.json")
    assert str(info.value) == needle
    del d["schema_version"]  # written before the field: read as version 1
    assert planfile.decode(d).plan == run[3]



def _low(model_ref: str, gpus: int, **pins) -> tuple[list[str], object]:
    model, alias = resolve_model(model_ref)
    cluster = resolve_cluster()
    best = plan_or_explain(model, cluster, gpus, calibration_for(cluster.gpu.name), Pins(**pins)).best
    source = "--global-batch" if "gbs" in pins else "default"
    run = planfile.encode(model, alias, cluster, gpus, best, None, 1e12, batch_source=source)
    return [w for w in run["warnings"] if w.startswith("low_utilization: ")], best.cost


def test_gpus_that_outnumber_the_work_are_a_warning():
    """70B at its 4M-token default batch on 100,000 GPUs: 51 tokens each, MFU 2.5%, most of the step in the pipeline
    bubble and the gradient reduce: the plan says so, what the GPUs wait for, and what helps."""
    low, cost = _low("70b", 100_000)
    assert cost.mfu < 0.05 and len(low) == 1
    assert "100,000 GPUs share 5,120,000 tokens per step, 51 tokens each" in low[0]
    assert f"{cost.mfu:.1%} MFU" in low[0] and f"bubble {cost.bubble_s:.3f} s" in low[0]
    assert low[0].endswith("fewer GPUs or a larger --global-batch keep them busier")


def test_gpus_waiting_on_the_expert_all_to_all_are_a_warning():
    """Qwen3-30B-A3B on 4,096 GPUs of the seed cluster: most of the step is the exposed expert-parallel all-to-all,
    which the step prices inside the layers' compute (StepCost.tp_comm_s): it counts as waiting and is named (before,
    the plan ran at ~6% MFU without a word)."""
    low, cost = _low("qwen3-30b-a3b", 4096)
    assert cost.mfu < 0.10 and cost.tp_comm_s > (cost.compute_s - cost.tp_comm_s) and len(low) == 1
    waiting = cost.step_time_s - (cost.compute_s - cost.tp_comm_s) - cost.optimizer_s
    assert f"waiting {waiting / cost.step_time_s:.0%} of the {cost.step_time_s:.3f} s step" in low[0]
    assert f"(tp/ep/cp comm {cost.tp_comm_s:.3f} s" in low[0]


def test_a_busy_plan_and_a_smoke_batch_do_not_warn():
    """70B on the seed cluster (MFU ~47%) computes most of its step; a smoke-sized model's batch, default or given,
    is there to exercise the layout (MFU ~0%, yet no warning)."""
    assert _low("70b", 384)[0] == []
    tiny = str(REPO / "tests" / "data" / "tiny-llama.yaml")
    for pins in ({}, {"gbs": 16}):
        low, cost = _low(tiny, 8, **pins)
        assert low == [] and cost.mfu < 0.01


def test_one_gpu_waiting_is_told_without_fewer_gpus():
    low, _ = _low("gpt3-125m", 1, gbs=1)
    assert len(low) == 1 and "(overhead 0.050 s)" in low[0] and "GPUs share" not in low[0]
    assert low[0].endswith("the GPU takes 2,048 tokens per step; a larger --global-batch keeps it busier")


def test_a_plan_json_from_before_unmodelled_decodes(run):
    """plan.json written before ModelSpec.unmodelled existed has no such key: the model decodes with none; a
    malformed list is one line."""
    d = json.loads(planfile.dumps(run[0]))
    del d["model"]["unmodelled"]
    assert planfile.decode(d).model == run[1] and run[1].unmodelled == ()
    d["model"]["unmodelled"] = [1]
    with pytest.raises(GenconfError, match="unmodelled must be a list of sentences, got \\[1\\]"):
        planfile.decode(d)


@pytest.mark.parametrize("where,key", [("plan", "tp"), ("plan", "mbs"), ("plan", "gbs"), ("plan", "framework"),
                                       ("plan", "seq_length"), ("model", "activation"), ("train", "lr")])
def test_a_setting_left_out_is_refused_not_defaulted(run, where, key):
    # A plan.json without plan.tp rendered tp=1, without plan.mbs mbs=1 (the spec's defaults, in silence); without
    # plan.gbs it said 'global batch (1) must be divisible', without plan.framework it named ParallelPlan.__init__.
    d = json.loads(planfile.dumps(run[0]))
    del d[where][key]
    with pytest.raises(GenconfError) as info:
        planfile.decode(d, "x.json")
    assert str(info.value) == (f"x.json is missing {where}.{key}: genconf does not guess a plan's settings; add it, "
                               f"or write the plan anew with genconf --json")


@pytest.mark.parametrize("key,value,needle", [
    ("lr", "x", "x.json is invalid: TrainSpec.lr must be a number, got 'x'"),
    ("lr", True, "x.json is invalid: TrainSpec.lr must be a number, got True"),
    ("warmup_steps", "5", "x.json is invalid: TrainSpec.warmup_steps must be a whole number, got '5'"),
    ("warmup_steps", 1.5, "x.json is invalid: TrainSpec.warmup_steps must be a whole number, got 1.5"),
])
def test_a_training_setting_of_the_wrong_type_names_itself(run, key, value, needle):
    # train.lr "x" was "'<=' not supported between instances of 'float' and 'str'"; lr true rendered lr True
    d = json.loads(planfile.dumps(run[0]))
    d["train"][key] = value
    with pytest.raises(GenconfError) as info:
        planfile.decode(d, "x.json")
    assert str(info.value) == needle


def test_a_training_key_genconf_does_not_know_names_itself(run):
    # it was "TrainSpec.__init__() got an unexpected keyword argument 'learning_rate'"
    d = json.loads(planfile.dumps(run[0]))
    d["train"]["learning_rate"] = 1e-4
    with pytest.raises(GenconfError, match=r"^x.json is invalid: train.learning_rate is not a training setting genconf "
                                           r"knows \(train holds beta1, beta2, .*, lr, .*warmup_steps, weight_decay\)$"):
        planfile.decode(d, "x.json")


@pytest.mark.parametrize("path", [("cluster", "gpus_per_node"), ("cluster", "gpu_spec", "node_sizes"),
                                  ("cluster", "gpu_spec", "hbm_gib")])
def test_a_cluster_key_left_out_names_its_section(run, path):
    # It read "x.json is missing 'node_sizes'" or "GPUSpec.__init__() missing 1 required keyword-only argument".
    d = json.loads(planfile.dumps(run[0]))
    where = d
    for part in path[:-1]:
        where = where[part]
    del where[path[-1]]
    with pytest.raises(GenconfError, match=rf"^x.json is missing {'.'.join(path)}: "):
        planfile.decode(d, "x.json")
    d = json.loads(planfile.dumps(run[0]))
    d["cluster"]["gpu_spec"] = 5
    with pytest.raises(GenconfError, match=r"^x.json is invalid: 'cluster.gpu_spec' must be a JSON object, got int$"):
        planfile.decode(d, "x.json")


def test_bridged_pairs_read_back_with_their_pcie_link():
    # pcie-h100: an NVLink domain of 2 inside 8-GPU nodes and the PCIe figure between pairs both come back; a
    # cluster whose NVLink holds the node writes no PCIe key, so its plan.json is as before.
    model, alias = resolve_model("llama3-8b")
    cluster = resolve_cluster("pcie-h100")
    result = plan_or_explain(model, cluster, 16, calibration_for(cluster.gpu.name), Pins())
    d = planfile.encode(model, alias, cluster, 16, result.best, result, 1e11)
    assert (d["cluster"]["nvlink_domain_gpus"], d["cluster"]["pcie_peer_gbyte_per_s_per_gpu"]) == (2, 64)
    pf = planfile.decode(planfile.loads(planfile.dumps(d)))
    assert pf.cluster == dataclasses.replace(cluster, total_gpus=None, description=pf.cluster.description,
                                             nccl_env=tuple(sorted(cluster.nccl_env)))
    assert "pcie_peer_gbyte_per_s_per_gpu" not in planfile.cluster_dict(resolve_cluster("dgx-h100"), 8)
