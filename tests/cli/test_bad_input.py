"""Bad input found by probing the command line as a careless user would: each case is one line on stderr, exit 2,
nothing on stdout and nothing written (never a traceback, never a silently ignored flag)."""

from __future__ import annotations

import json

import pytest

from conftest import reader_or_skip

from genconf.cli.main import main

NOT_UTF8 = b"\xff\xfe\x00binary"


def one_line(capsys, argv: list[str], needle: str) -> None:
    """main(argv) fails as the CLI promises: exit 2, one 'genconf: error:' line holding `needle`, empty stdout."""
    rc = main(argv)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2, (out, err)
    assert out == ""
    assert len(lines) == 1 and lines[0].startswith("genconf: error:") and needle in lines[0], err


@pytest.mark.parametrize("flag", ["--model", "--cluster", "--calibration"])
def test_a_binary_input_file_is_one_line(tmp_path, capsys, flag):
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(NOT_UTF8)
    one_line(capsys, [flag, str(bad), "--gpus", "8"], f"{bad}: not UTF-8 text")


def test_a_binary_recipe_or_plan_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(NOT_UTF8)
    one_line(capsys, ["recipe", str(bad)], f"{bad}: not UTF-8 text")
    plan = tmp_path / "plan.json"
    plan.write_bytes(NOT_UTF8)
    one_line(capsys, ["render", str(plan), "-o", str(tmp_path / "out")], f"{plan}: not UTF-8 text")
    assert not (tmp_path / "out").exists()


def test_check_names_a_binary_plan_json(tmp_path, capsys):
    (tmp_path / "plan.json").write_bytes(NOT_UTF8)
    assert main(["check", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out.startswith("plan.json: cannot read") and "Traceback" not in err


def test_verify_names_a_binary_golden_file(tmp_path, capsys):
    from conftest import REPO

    golden = tmp_path / "golden.txt"
    golden.write_bytes(NOT_UTF8)
    one_line(capsys, ["verify", str(REPO / "tests/data/verify-run"), "--golden", str(golden)],
             f"golden file {golden} cannot be read as text")


@pytest.mark.parametrize("section,value", [("plan", []), ("model", []), ("cluster", "x"), ("train", 5)])
def test_render_and_check_a_plan_json_section_of_the_wrong_type(tmp_path, capsys, section, value):
    import json

    assert main(["--model", "1b", "--gpus", "8", "--json"]) == 0
    run = json.loads(capsys.readouterr().out)
    run[section] = value
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(run))
    one_line(capsys, ["render", str(plan), "-o", str(tmp_path / "out")], f"'{section}' must be a JSON object")
    assert not (tmp_path / "out").exists()
    assert main(["check", str(tmp_path)]) == 2
    assert f"'{section}' must be a JSON object" in capsys.readouterr().out


@pytest.mark.parametrize("text,needle", [
    ("name: 5\nnum_layers: 4\nhidden_size: 256\nnum_attention_heads: 4\nffn_hidden_size: 1024\nvocab_size: 1000\n"
     "seq_length: 512\n", "ModelSpec.name must be lowercase without spaces, got 5"),
    ("name: m\nnum_layers: 4\nhidden_size: 256\nnum_attention_heads: 4\nffn_hidden_size: 1024\nvocab_size: 1000\n"
     "seq_length: 512\nsource: [a, b]\n", "ModelSpec.source must be text, got ['a', 'b']"),
])
def test_a_model_file_with_a_name_or_source_not_text(tmp_path, capsys, text, needle):
    model = tmp_path / "m.yaml"
    model.write_text(text)
    one_line(capsys, ["--model", str(model), "--gpus", "8"], needle)


def test_a_cluster_file_with_a_description_not_text(tmp_path, capsys):
    cluster = tmp_path / "lab.yaml"
    cluster.write_text("gpu: h100-sxm\ngpus_per_node: 8\nib_gbit_per_s_per_gpu: 400\ndescription: [a]\n")
    one_line(capsys, ["--cluster", str(cluster), "--model", "1b", "--gpus", "8"],
             "ClusterSpec.description must be text, got ['a']")


def test_a_cluster_file_with_a_name_not_text(tmp_path, capsys):
    # `name: [1]` planned a cluster called "[1]".
    cluster = tmp_path / "lab.yaml"
    cluster.write_text("gpu: h100-sxm\ngpus_per_node: 8\nib_gbit_per_s_per_gpu: 400\nname: [1]\n")
    one_line(capsys, ["--cluster", str(cluster), "--model", "1b", "--gpus", "8"],
             f"{cluster}: ClusterSpec.name must be text, got [1]")


def test_verify_refuses_an_infinite_tolerance(capsys):
    from conftest import REPO

    one_line(capsys, ["verify", str(REPO / "tests/data/verify-run"), "--tolerance", "inf"],
             "--tolerance inf: an absolute loss difference, 0 or more (and finite)")


@pytest.mark.parametrize("argv", [
    ["-o", ""], ["--plot", ""], ["--cluster", ""], ["--calibration", ""], ["--time", ""], ["--job-name", " "],
    ["--run-dir", ""], ["--python", ""], ["--recompute-modules", ""],
    ["models", "--from-hf", ""], ["render", "", "-o", "out"], ["check", ""], ["launch", ""], ["verify", ""],
    ["recipe", ""], ["ci", "--work-dir", ""], ["calibrate", "--bench", "-o", ""], ["calibrate", "--bench", "--terms", ""],
])
def test_an_empty_path_or_name_is_refused(tmp_path, monkeypatch, capsys, argv):
    """An empty value (an unset shell variable) was the default in silence: plan -o "" wrote nothing and said nothing,
    --cluster "" planned the default cluster, check "" checked the current directory, recipe "" listed the recipes."""
    monkeypatch.chdir(tmp_path)
    one_line(capsys, argv, "is empty: give a value, or leave the option out")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("tp", ["3,x", "0", "", "1,,2"])
def test_calibrate_bench_tp_splits_are_checked_before_the_bench_starts(tmp_path, capsys, tp):
    # --tp 3,x started torchrun, whose ranks failed with a ValueError several lines long.
    one_line(capsys, ["calibrate", "--bench", "--model", "tests/data/tiny-llama.yaml", "--tp", tp,
                      "-o", str(tmp_path / "c.yaml")], "argument --tp: expected comma-separated positive integers")


def test_calibrate_output_that_is_a_directory_or_under_a_file(tmp_path, capsys):
    # -o DIR --force was an IsADirectoryError traceback after the fit (or a benchmark of minutes).
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("x")
    run = str(tmp_path / "no-run")
    one_line(capsys, ["calibrate", run, "-o", str(tmp_path / "dir"), "--force"],
             f"-o {tmp_path / 'dir'} is a directory: give the calibration file's path")
    one_line(capsys, ["calibrate", run, "-o", str(tmp_path / "file" / "c.yaml")], f"{tmp_path / 'file'} is not a directory")


def test_calibration_file_write_errors_are_one_line(tmp_path):
    from genconf.catalog import calibration_file
    from genconf.plan.errors import GenconfError

    (tmp_path / "dir").mkdir()
    with pytest.raises(GenconfError, match="cannot write .*dir"):
        calibration_file.write_file(tmp_path / "dir", {"format": calibration_file.FORMAT})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir"]


@pytest.mark.parametrize("argv,needle", [
    (["models", "--force"], "-o/--name/--force go with --from-hf FILE"),
    (["models", "--from-hf", "tests/data/hf/gemma-2-2b", "--json"], "--from-hf writes the model's catalog YAML, not JSON"),
    (["models", "--from-hf", "tests/data/hf/gemma-2-2b", "--force"], "--force replaces an existing -o file: add -o OUT.yaml"),
    (["recipe", "-o", "out"], "-o goes with one recipe: name it"),
    (["recipe", "--smoke", "--json"], "--smoke/--json go with one recipe: name it"),
])
def test_flags_that_would_be_ignored_are_refused(tmp_path, monkeypatch, capsys, argv, needle):
    """models --from-hf F --json printed YAML; recipe -o DIR (no NAME) listed the recipes and wrote nothing."""
    from conftest import REPO

    argv = [str(REPO / a) if a.startswith("tests/") else a for a in argv]
    monkeypatch.chdir(tmp_path)
    one_line(capsys, argv, needle)
    assert list(tmp_path.iterdir()) == []


def test_verify_plot_into_a_file_is_refused_before_the_run_is_judged(tmp_path, capsys):
    reader_or_skip("matplotlib", "pip install -e '.[plot]'")
    from conftest import REPO

    (tmp_path / "file").write_text("x")
    # It printed the verdict's note first and failed after the verdict: two lines.
    one_line(capsys, ["verify", str(REPO / "tests/data/verify-run"), "--plot", str(tmp_path / "file")],
             "exists and is not a directory")


@pytest.mark.parametrize("name", ["../../elsewhere", "a/b", ".."])
def test_launch_name_is_one_directory_under_runs(tmp_path, capsys, name):
    # --name ../../x put the run outside DIR/runs (after planning the launch).
    one_line(capsys, ["launch", str(tmp_path), "--name", name], "a run's name is one directory under the runs directory")


@pytest.mark.parametrize("argv,needle", [
    (["--pp-layout", "Et|tL", "--pp", "2"], "--pp-layout places 2 layers, olmo-70b has 80: write a layout with 80 t's"),
    (["--first-stage-layers", "100", "--pp", "4"],
     "--first-stage-layers 100 leaves no layers for the other pipeline stages: olmo-70b has 80 layers"),
    (["--first-stage-layers", "40", "--last-stage-layers", "41"], "leaves no layers for the other pipeline stages"),
])
def test_a_pinned_split_with_more_layers_than_the_model_says_so(capsys, argv, needle):
    # With --pp pinned and no --framework, the search's reason was DeepSpeed's: "framework deepspeed runs data
    # parallelism only here ... pp=4 needs --framework megatron. Nothing tried makes it valid".
    one_line(capsys, ["--model", "70b", "--gpus", "64", *argv], needle)


def test_a_cp_that_does_not_split_the_sequence_names_the_nearest_that_does(capsys):
    # It said only what was wrong: "--cp 3 does not divide the sequence (4096) into 2 x cp chunks".
    one_line(capsys, ["--model", "70b", "--gpus", "64", "--cp", "3"],
             "--cp 3 does not divide the sequence (4096) into 2 x cp chunks; use --cp 2 or 4, or a --seq-len divisible "
             "by 6")


@pytest.mark.parametrize("submit", [False, True])
def test_launch_names_a_binary_sbatch_script(tmp_path, capsys, submit):
    out = tmp_path / "art"
    assert main(["recipe", "olmo-1b-ddp", "--smoke", "-o", str(out)]) == 0
    capsys.readouterr()
    for script in out.glob("launch_*.sbatch"):
        script.write_bytes(NOT_UTF8)
    one_line(capsys, ["launch", str(out), *(["--submit"] if submit else ["--steps", "1"])],
             "launch_fsdp.sbatch cannot be read as text")


@pytest.mark.parametrize("argv,needle", [
    # It planned "recompute=full(100/chunk)": megatron recomputes at most a chunk's layers.
    (["--recompute-layers", "100"], "--recompute-layers 100 is more than kempner-olmo-1b's 16 layers"),
    # 16 layers over pp 8 x vp 2: one a chunk (rules._recompute, with the most the search's plan takes)
    (["--recompute-layers", "2", "--pp", "8", "--vp", "2", "--tp", "1"],
     "--recompute-layers (2) is more than a model chunk holds: at most 1 layer (16 layers over pp 8 x vp 2); use "
     "--recompute-layers 1. It would be valid with: --pp 1 --vp 1; or --vp 1; or --recompute-layers 1"),
])
def test_block_recompute_of_more_layers_than_a_chunk_holds_is_refused(capsys, argv, needle):
    one_line(capsys, ["--model", "1b", "--gpus", "8", *argv], needle)


def test_render_names_the_plan_file_it_was_given(tmp_path, capsys):
    import json

    assert main(["--model", "1b", "--gpus", "8", "--json"]) == 0
    run = json.loads(capsys.readouterr().out)
    del run["cluster"]
    other = tmp_path / "OTHER.json"
    other.write_text(json.dumps(run))
    # It said "plan.json is missing 'cluster'" of a file named otherwise.
    one_line(capsys, ["render", str(other), "-o", str(tmp_path / "out")], f"{other} is missing 'cluster'")
    assert not (tmp_path / "out").exists()


def test_render_checks_the_stage_split_and_derives_what_is_left_out(tmp_path, capsys):
    import json

    assert main(["--model", "1b", "--gpus", "8", "--json"]) == 0
    run = json.loads(capsys.readouterr().out)
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps({**run, "plan": {**run["plan"], "stage_layers": "x"}}))
    one_line(capsys, ["render", str(plan), "-o", str(tmp_path / "out")], "plan.stage_layers is 'x', genconf derives [16]")
    assert not (tmp_path / "out").exists()
    del run["layout"]  # it was a KeyError traceback
    plan.write_text(json.dumps(run))
    assert main(["render", str(plan), "-o", str(tmp_path / "out")]) == 0
    assert json.loads((tmp_path / "out" / "plan.json").read_text())["layout"].startswith("megatron tp=1")


@pytest.mark.parametrize("edit,needle", [
    # Each was a KeyError or TypeError traceback: the run README's template reads these predictions.
    (lambda run: run.pop("memory"), "p.json is missing 'memory': the plan's predictions"),
    (lambda run: run.update(perf=[]), "p.json 'perf' is list, not a JSON object"),
    (lambda run: run["memory"].update(total_gib="x"), "p.json's memory/perf/training hold a value of the wrong type"),
])
def test_render_needs_the_plans_predictions(tmp_path, capsys, edit, needle):
    import json

    assert main(["--model", "1b", "--gpus", "8", "--json"]) == 0
    run = json.loads(capsys.readouterr().out)
    edit(run)
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps(run))
    one_line(capsys, ["render", str(plan), "-o", str(tmp_path / "out")], needle)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flag,name,needle", [
    ("--cluster", "lab.json", "cluster file lab.json: cluster files are YAML, named .yaml or .yml"),
    ("--model", "m.txt", "model file m.txt: genconf reads a model YAML (.yaml or .yml, as in models/) or a Hugging Face "
                         "config.json"),
])
def test_a_file_that_is_not_yaml_is_named_as_a_file(tmp_path, monkeypatch, capsys, flag, name, needle):
    # Both said "unknown cluster/model" of a file that was there.
    monkeypatch.chdir(tmp_path)
    (tmp_path / name).write_text("gpu: h100-sxm\n")
    one_line(capsys, [flag, name, "--gpus", "8"], needle)


@pytest.mark.parametrize("argv,needle", [
    (["--nproc", "2"], "--nproc sets up --bench's measurements; fitting run directories reads what the runs measured: "
                       "drop it, or calibrate with --bench"),
    (["--model", "1b", "--tokens", "64", "--tp", "1,2"], "--model/--tokens/--tp set up --bench's measurements"),
    (["--bench", "--terms", "gemm"], "--terms chooses what run directories refit; --bench fits every term it measures"),
])
def test_calibrate_refuses_the_flags_of_the_other_mode(tmp_path, capsys, argv, needle):
    # calibrate RUN_DIR --nproc 2 --model 1b fitted the runs and dropped both in silence.
    args = argv if "--bench" in argv else [str(tmp_path / "run"), *argv]
    one_line(capsys, ["calibrate", *args, "-o", str(tmp_path / "c.yaml")], needle)
    assert list(tmp_path.iterdir()) == []


def test_a_cluster_size_that_is_not_whole_nodes_names_the_cluster_and_gpus(tmp_path, capsys):
    # It read '384 GPUs is not a whole number of 5-GPU nodes; use 380 or 385': 384, the preset's size, was no number
    # the user gave, and 'use' did not say where.
    cluster = tmp_path / "c.yaml"
    cluster.write_text("name: c\ngpu: h100-sxm\ngpus_per_node: 5\nib_gbit_per_s_per_gpu: 400\ntotal_gpus: 384\n")
    one_line(capsys, ["--model", "1b", "--cluster", str(cluster)],
             "cluster c has 384 GPUs (its total_gpus), not a whole number of 5-GPU nodes: give --gpus 380 or --gpus 385")
    cluster.write_text("name: c\ngpu: h100-sxm\ngpus_per_node: 8\nib_gbit_per_s_per_gpu: 400\ntotal_gpus: 12\n")
    one_line(capsys, ["--model", "1b", "--cluster", str(cluster)], "cluster c has 12 GPUs (its total_gpus)")
    one_line(capsys, ["--model", "1b", "--cluster", str(cluster), "--gpus", "12"],
             "12 GPUs is not a whole number of 8-GPU nodes; use 8 or 16")


def test_verify_and_launch_name_a_path_that_is_missing_or_a_file(tmp_path, capsys):
    # verify read 'has no metrics.jsonl (is it a genconf run directory?)' for a typo or a file; launch of a file said
    # 'write one with: genconf ... -o FILE', which fails there.
    afile = tmp_path / "afile"
    afile.write_text("x")
    one_line(capsys, ["verify", str(tmp_path / "nosuch")], f"{tmp_path / 'nosuch'} does not exist: give a run directory")
    one_line(capsys, ["verify", str(afile)], f"{afile} is a file: give a run directory")
    one_line(capsys, ["launch", str(afile)], f"{afile} is a file: give an artifacts directory")
    one_line(capsys, ["launch", str(tmp_path / "nosuch")], f"{tmp_path / 'nosuch'} does not exist: give an artifacts")


@pytest.mark.parametrize("argv,needle", [
    (["--model", "1b", "--gpus", "8", "--account", "foo"], "--account says how the artifacts are written: add -o DIR"),
    (["--model", "1b", "--gpus", "8", "--force", "--run-dir", "/x"], "--force/--run-dir say how the artifacts are "
                                                                      "written: add -o DIR, or leave them out"),
    (["recipe", "olmo-1b-ddp", "--job-name", "j"], "--job-name says how the artifacts are written"),
    # --time, of the same group, was still ignored in silence (its argparse default hid whether it was given)
    (["--model", "1b", "--gpus", "8", "--time", "1:00:00"], "--time says how the artifacts are written: add -o DIR"),
    (["recipe", "olmo-1b-ddp", "--time", "30"], "--time says how the artifacts are written"),
])
def test_artifact_flags_without_o_are_refused(capsys, argv, needle):
    # They were ignored in silence: the plan printed and no file was written.
    one_line(capsys, argv, needle)


def test_the_default_slurm_time_still_reaches_the_script(tmp_path, capsys):
    # --time has no argparse default (so that one given without -o is refused): without it the script keeps 24:00:00.
    out = tmp_path / "out"
    assert main(["--model", "1b", "--gpus", "8", "-o", str(out)]) == 0
    assert "#SBATCH --time=24:00:00\n" in (out / "launch_megatron.sbatch").read_text()


def test_a_large_gpu_count_reads_with_separators_in_the_refusal(capsys):
    # It read 'no valid layout for kempner-olmo-1b on 1000000 x h100-sxm' and then '1,000,000 GPUs' in the same line.
    one_line(capsys, ["--model", "1b", "--gpus", "1000000"], "no valid layout for kempner-olmo-1b on 1,000,000 x h100-sxm")


def test_a_resume_without_the_run_says_which_to_give(tmp_path, capsys):
    # It read '--resume: DIR/runs/20261130-085143 has no config.json': a fresh timestamp, named as if it were the run.
    out = tmp_path / "out"
    assert main(["--model", "1b", "--gpus", "8", "-o", str(out)]) == 0
    capsys.readouterr()
    one_line(capsys, ["launch", str(out), "--resume"], f"--resume continues a saved run: give its --name under "
                                                      f"{out / 'runs'} or its --run-dir (none under {out / 'runs'} yet)")
    (out / "runs" / "first").mkdir()
    (out / "runs" / "first" / "config.json").write_text("{}")
    one_line(capsys, ["launch", str(out), "--resume"], "or its --run-dir (first)")


def test_a_data_dtype_without_data_is_refused(tmp_path, capsys):
    # It was ignored: the run trained on synthetic tokens.
    one_line(capsys, ["launch", str(tmp_path), "--data-dtype", "uint32"],
             "--data-dtype uint32 is the dtype of a --data file: add --data FILE, or drop it")


@pytest.mark.parametrize("flags,needle", [
    (["--heads", "3", "--hidden", "64"], "--hidden 64 is not divisible by 3 attention heads: give --heads dividing it, "
                                         "or another --hidden"),
    (["--hidden", "100"], "--hidden 100 is not divisible by 16 attention heads (the model's): give --heads dividing "
                          "100, or a --hidden divisible by 16"),
    (["--heads", "3"], "--heads 3 does not divide the model's hidden size 2048: give --heads dividing it, or --hidden"),
])
def test_a_shrink_whose_heads_do_not_divide_the_hidden_size_names_what_was_given(tmp_path, capsys, flags, needle):
    # Each read '--hidden H is not divisible by A attention heads (give --heads)': --heads 3 alone named a --hidden
    # the user never gave, and with --heads given it said to give --heads.
    out = tmp_path / "out"
    assert main(["--model", "1b", "--gpus", "8", "-o", str(out)]) == 0
    capsys.readouterr()
    one_line(capsys, ["launch", str(out), *flags], needle)


@pytest.mark.parametrize("flag", ["--cluster", "--calibration"])
def test_a_directory_given_for_a_file_says_so(tmp_path, capsys, flag):
    # It read 'cluster file X.yaml does not exist' / 'calibration file X does not exist' for a directory that does.
    folder = tmp_path / "c.yaml"
    folder.mkdir()
    one_line(capsys, ["--model", "1b", "--gpus", "8", flag, str(folder)], f"file {folder} is a directory")


@pytest.mark.parametrize("where,key,needle", [
    (("plan",), "tpp", "plan.tpp is not a plan setting genconf knows (did you mean plan.tp?)"),
    (("model",), "num_layer", "model.num_layer is not a model setting genconf knows (did you mean model.num_layers?)"),
    (("cluster",), "gpus_per_nod", "cluster.gpus_per_nod is not a cluster setting genconf knows (did you mean "
                                   "cluster.gpus_per_node?)"),
    (("cluster", "gpu_spec"), "hbm", "cluster.gpu_spec.hbm is not a GPU setting genconf knows (did you mean "
                                     "cluster.gpu_spec.hbm_gib?)"),
])
def test_an_unknown_key_in_a_plan_json_section_is_refused_by_name(tmp_path, capsys, where, key, needle):
    # plan.tpp (for tp) was dropped in silence: render wrote the plan without it, as unknown train keys were not.
    import json

    assert main(["--model", "1b", "--gpus", "8", "--json"]) == 0
    run = json.loads(capsys.readouterr().out)
    section = run
    for part in where:
        section = section[part]
    section[key] = 2
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(run))
    one_line(capsys, ["render", str(plan), "-o", str(tmp_path / "out")], f"{plan} is invalid: {needle}")
    assert not (tmp_path / "out").exists()
    assert main(["check", str(tmp_path)]) == 2
    assert needle in capsys.readouterr().out


def test_the_keys_plan_json_writes_beside_the_specs_are_read_back(tmp_path, capsys):
    # Every key genconf itself writes must read back (a sliding-window model, an imported config's notes, a cluster note).
    from conftest import REPO

    for argv in (["--model", str(REPO / "tests/data/tiny-window.yaml"), "--gpus", "8", "--gpu", "b200"],
                 ["--model", str(REPO / "tests/data/hf/gemma-3-1b/config.json"), "--gpus", "8"]):
        out = tmp_path / str(len(list(tmp_path.iterdir())))
        assert main([*argv, "-o", str(out)]) == 0
        assert main(["render", str(out / "plan.json"), "-o", str(tmp_path / "again"), "--force"]) == 0
        assert main(["check", str(tmp_path / "again")]) == 0
    capsys.readouterr()


@pytest.mark.parametrize("argv,needle", [
    (["--gpus", "380", "--gpus-per-node", "5"], "--gpus-per-node 5: h100-sxm nodes hold 8 or 4 GPUs: give 8 or 4, or 2 "
                                                 "or 1 to use part of each node; a node of another size goes in a "
                                                 "cluster file"),
    (["--gpus", "384", "--gpus-per-node", "16"], "--gpus-per-node 16: h100-sxm nodes hold 8 or 4 GPUs"),
    (["--gpus", "384", "--gpus-per-node", "1000"], "--gpus-per-node 1000: h100-sxm nodes hold 8 or 4 GPUs"),
    (["--gpus", "8", "--gpu", "gb200", "--gpus-per-node", "8"], "--gpus-per-node 8: gb200 nodes hold 4 GPUs: give 4, "
                                                                 "or 2 or 1 to use part of each node"),
])
def test_gpus_per_node_that_no_node_of_the_gpu_has_is_refused(capsys, argv, needle):
    # --gpus 380 --gpus-per-node 5 planned 76 five-GPU H100 nodes (and 1000 one 1,000-GPU NVLink domain).
    one_line(capsys, ["--model", "1b", *argv], needle)


@pytest.mark.parametrize("argv", [["--gpus-per-node", "8"], ["--gpus-per-node", "2"],
                                  ["--gpu", "h100-pcie", "--gpus-per-node", "2"],
                                  # a tray of 4 on a preset of 8-GPU nodes: --gpus-per-node gives the node (it was
                                  # refused as "gb200 nodes hold 4 GPUs, not dgx-h100's 8")
                                  ["--cluster", "dgx-h100", "--gpu", "gb200", "--gpus-per-node", "4"]])
def test_gpus_per_node_of_a_node_or_part_of_one_plans(capsys, argv):
    assert main(["--model", "1b", "--gpus", "8", "--json", *argv]) == 0
    assert json.loads(capsys.readouterr().out)["cluster"]["gpus_per_node"] == int(argv[-1])


@pytest.mark.parametrize("argv", [["--model", "{long}"], ["--model", "1b", "--cluster", "{long}.yaml"],
                                  ["--model", "1b", "-o", "{long}"], ["verify", "{long}"], ["check", "{long}"],
                                  ["launch", "{long}"], ["models", "--from-hf", "{long}"], ["recipe", "{long}"]])
def test_a_path_longer_than_the_filesystem_takes_is_one_line(tmp_path, capsys, monkeypatch, argv):
    # A 5,000-character name was a traceback (OSError ENAMETOOLONG) from the first stat of each of these.
    monkeypatch.chdir(tmp_path)
    long = "a" * 5000
    if argv[0] not in ("verify", "check", "launch", "models", "recipe"):
        argv = [*argv, "--gpus", "8"]
    one_line(capsys, [a.replace("{long}", long) for a in argv], "characters): File name too long")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name,text,needle", [
    ("config.json", "{\n", "config.json: not valid JSON (line 2: Expecting property name enclosed in double quotes)"),
    ("versions.json", "[1]", "versions.json: expected a JSON object, got list"),
    ("config.json", '{"model": [1], "plan": {}}', "config.json: 'model' must be a JSON object, got list"),
])
def test_verify_and_calibrate_name_a_damaged_run_json(tmp_path, capsys, name, text, needle):
    # A truncated config.json was a JSONDecodeError traceback from verify, and calibrate's an AttributeError.
    import shutil

    from conftest import REPO

    run = tmp_path / "run"
    shutil.copytree(REPO / "tests/data/verify-run", run)
    (run / name).write_text(text)
    commands = [["calibrate", str(run), "--gpu", "h100-sxm", "-o", str(tmp_path / "c.yaml")]]
    if "must be a JSON object" not in needle:  # verify reads only what it judges from config.json
        commands.append(["verify", str(run)])
    for argv in commands:
        one_line(capsys, argv, f"{run / name}"[:-len(name)] + needle)
    assert not (tmp_path / "c.yaml").exists()


def test_render_of_an_artifacts_directory_names_its_plan_json(tmp_path, capsys):
    # 'genconf render DIR -o OUT' read 'cannot read DIR: Is a directory'.
    assert main(["--model", "1b", "--gpus", "8", "-o", str(tmp_path / "art")]) == 0
    capsys.readouterr()
    one_line(capsys, ["render", str(tmp_path / "art"), "-o", str(tmp_path / "out")],
             f"{tmp_path / 'art'} is a directory: give a plan.json file ({tmp_path / 'art' / 'plan.json'})")
    one_line(capsys, ["render", str(tmp_path), "-o", str(tmp_path / "out")], f"{tmp_path} is a directory: give a "
                                                                              f"plan.json file")
    assert not (tmp_path / "out").exists()


def test_a_plan_json_node_sizes_that_is_not_a_list_is_named(tmp_path, capsys):
    # cluster.gpu_spec.node_sizes: 5 read "plan.json is invalid: 'int' object is not iterable".
    assert main(["--model", "1b", "--gpus", "8", "--json"]) == 0
    run = json.loads(capsys.readouterr().out)
    run["cluster"]["gpu_spec"]["node_sizes"] = 5
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(run))
    one_line(capsys, ["render", str(plan), "-o", str(tmp_path / "out")],
             "is invalid: cluster.gpu_spec.node_sizes must be a list of GPU counts per node, got 5")
    assert not (tmp_path / "out").exists()


def test_gpus_per_node_of_the_cluster_files_own_node_is_taken(tmp_path, capsys):
    # The refusal above sends other nodes to a cluster file; that file's 16-GPU node, or 8 of it, was refused again
    # when --gpus-per-node repeated it ('h100-sxm nodes hold 8 or 4 GPUs').
    cluster = tmp_path / "c16.yaml"
    cluster.write_text("name: c16\ngpu: h100-sxm\ngpus_per_node: 16\nib_gbit_per_s_per_gpu: 400\n")
    for n in ("16", "8"):
        assert main(["--model", "1b", "--gpus", "32", "--cluster", str(cluster), "--gpus-per-node", n]) == 0
        capsys.readouterr()
    one_line(capsys, ["--model", "1b", "--gpus", "32", "--cluster", str(cluster), "--gpus-per-node", "5"],
             "--gpus-per-node 5: h100-sxm nodes hold 16, 8 or 4 GPUs")
