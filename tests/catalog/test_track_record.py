"""genconf/catalog/track_record.yaml: each catalog model's published runs against genconf's prediction, as
benchmarks/accuracy.py scored them, and what `genconf plan` shows of it."""

from __future__ import annotations

import json
import sys

import pytest

from conftest import REPO
from genconf.catalog import track_record
from genconf.catalog.models import catalog_names, list_models, resolve_model
from genconf.cli.main import main
from genconf.plan.errors import GenconfError

sys.path.insert(0, str(REPO / "benchmarks"))
import accuracy  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "accuracy.json"


def test_the_committed_record_is_what_the_committed_accuracy_rows_give():
    # Known answer: the file is accuracy.track_record over benchmarks/results/accuracy.json's rows (the committed
    # calibration's in-sample scores), so it cannot drift from the benchmark it cites.
    rows = json.loads(RESULTS.read_text())["rows"]
    assert track_record.read_track_record() == accuracy.track_record(rows)


def test_one_model_read_alone_is_its_part_of_the_whole_file(tmp_path):
    # `genconf plan` parses only the planned model's block (read_model_record); every model's, and a name the file
    # lacks, read alone is what the whole file's parse holds; a broken block is refused as the whole read refuses it.
    record = track_record.read_track_record()
    for model in list_models():
        assert track_record.read_model_record(model.name) == record.get(model.name, {}), model.name
    broken = tmp_path / "track_record.yaml"
    text = track_record.TRACK_RECORD_FILE.read_text()
    broken.write_text(text.replace("    all: {rows:", "    all: {rowz:", 1))
    first = next(iter(record))
    with pytest.raises(GenconfError, match=rf"models\.{first}\.all: unknown key 'rowz'"):
        track_record.read_model_record(first, broken)


def test_every_model_is_a_catalog_model_and_its_scopes_add_up():
    record = track_record.read_track_record()
    names = {m.name for m in list_models()}
    assert set(record) <= names and {"llama3-70b", "llama3.1-405b", "gpt-oss-120b", "deepseek-v3"} <= set(record)
    for name, scopes in record.items():
        generations = [e for s, e in scopes.items() if s != "all"]
        assert sum(e["rows"] for e in generations) == scopes["all"]["rows"], name
        for e in scopes.values():
            assert e["min"] <= e["p10"] <= e["median"] <= e["p90"] <= e["max"], name


def test_a_run_counts_for_every_catalog_model_of_its_architecture():
    by_name = {m.name: m for m in list_models()}
    # torchtitan's Llama 3.1 8B (another name, another sequence length) is llama3-8b's and llama3.1-8b's run (the
    # same tensors); LLaMA-1 13B and Llama 2 13B share every architectural field, so a Llama 2 13B run counts for both.
    from dataclasses import replace

    titan = replace(by_name["llama3-8b"], name="llama-3.1-8b", seq_length=8192)
    assert catalog_names(titan) == ["llama3-8b", "llama3.1-8b"]
    assert set(catalog_names(by_name["llama2-13b"])) == {"llama-13b", "llama2-13b"}
    assert catalog_names(replace(by_name["llama3-8b"], num_layers=33)) == []


def test_a_spec_with_a_catalog_name_but_another_architecture_gets_no_record():
    from dataclasses import replace

    llama = resolve_model("llama3-70b")[0]
    assert track_record.record_for(llama, "hopper")["scope"] == "hopper"
    assert track_record.record_for(replace(llama, num_layers=8), "hopper") is None
    # The sequence length is not architecture (torchtitan's 8,192-token Llama runs count): the same record.
    assert track_record.record_for(replace(llama, seq_length=4096), "hopper") == track_record.record_for(llama, "hopper")


def test_quantiles_interpolate_as_numpy_does():
    assert accuracy._quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.1) == pytest.approx(1.4)
    assert accuracy._quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.5) == 3.0
    assert accuracy._quantile([2.0], 0.9) == 2.0


def test_the_plans_gpu_generation_or_else_all_the_models_runs():
    oss = resolve_model("gpt-oss-120b")[0]
    hopper = track_record.record_for(oss, "hopper")
    assert hopper["scope"] == "hopper" and hopper["rows"] >= track_record.MIN_ROWS
    scopes = track_record.read_track_record()["llama3-70b"]
    assert scopes["ampere"]["rows"] < track_record.MIN_ROWS
    assert track_record.record_for(resolve_model("llama3-70b")[0], "ampere")["scope"] == "all"
    assert track_record.record_for(resolve_model("olmo-70b")[0], "hopper") is None


@pytest.mark.parametrize("text, needle", [
    ("models: {llama3-8b: {all: {rows: 2, median: 1.0, p10: 1.0, p90: 1.0, min: 1.0, max: 1.0, sources: [x],"
     " frameworks: [fsdp], mean: 1.0}}}\n", "unknown key 'mean'"),
    ("models: {llama3-8b: {hopper: {rows: 2, median: 1.0, p10: 1.0, p90: 1.0, min: 1.0, max: 1.0,"
     " sources: [x]}}}\n", "must map 'all'"),
    ("models: {llama3-8b: {all: {rows: 0, median: 1.0, p10: 1.0, p90: 1.0, min: 1.0, max: 1.0, sources: [x],"
     " frameworks: [fsdp]}}}\n", "rows must be a positive integer"),
    ("models: {llama3-8b: {all: {rows: 2, median: 1.0, p10: 1.0, p90: 1.0, min: 1.0, max: 1.0, sources: [x],"
     " frameworks: [nemo]}}}\n", "frameworks must list framework names"),
    ("runs: []\n", "expected one key, 'models'"),
])
def test_a_broken_file_is_one_line_naming_the_file_and_key(tmp_path, text, needle):
    path = tmp_path / "track_record.yaml"
    path.write_text(text)
    with pytest.raises(GenconfError) as err:
        track_record.read_track_record(path)
    assert needle in str(err.value) and str(path) in str(err.value) and "\n" not in str(err.value)


def test_plan_shows_the_models_published_runs(capsys):
    assert main(["--model", "llama3-70b", "--gpus", "64", "--cluster", "dgx-h100", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    expected = track_record.read_track_record()["llama3-70b"]["hopper"]
    assert d["track_record"]["scope"] == "hopper" and d["track_record"]["rows"] == expected["rows"]
    assert d["track_record"]["median"] == expected["median"]
    assert main(["--model", "llama3-70b", "--gpus", "64", "--cluster", "dgx-h100"]) == 0
    out = capsys.readouterr().out
    assert f"{expected['rows']} on hopper" in out and f"median {expected['median']:.2f}" in out
    # A model no published run here used: the output says so rather than borrowing another model's record.
    assert main(["--model", "70b", "--gpus", "384"]) == 0
    assert ("published runs of this model                none in genconf's data: the 80% interval above is that of "
            "all dense models") in capsys.readouterr().out


def test_a_lora_plan_shows_no_record(capsys):
    # The recorded runs are full-parameter training: a LoRA plan is another workload.
    assert main(["--model", "llama3-8b", "--gpus", "8", "--cluster", "dgx-h100", "--lora-rank", "16", "--json"]) == 0
    assert "track_record" not in json.loads(capsys.readouterr().out)


def test_a_plan_on_another_framework_than_the_recorded_runs_says_so(capsys):
    # Llama 2 7B's published runs are NeMo's (megatron): a DeepSpeed plan of it borrows their record, and says whose.
    assert track_record.read_track_record()["llama2-7b"]["hopper"]["frameworks"] == ["megatron"]
    assert main(["--model", "llama2-7b", "--gpus", "64", "--cluster", "dgx-h100", "--framework", "deepspeed"]) == 0
    assert "(NeMo 24.07, NeMo long-seq; megatron runs, this plan deepspeed)" in capsys.readouterr().out
    assert main(["--model", "llama2-7b", "--gpus", "64", "--cluster", "dgx-h100", "--framework", "megatron"]) == 0
    assert "(NeMo 24.07, NeMo long-seq)\n" in capsys.readouterr().out
