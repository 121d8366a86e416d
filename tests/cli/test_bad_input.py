"""Bad input found by probing the command line as a careless user would: each case is one line on stderr, exit 2,
nothing on stdout and nothing written (never a traceback, never a silently ignored flag)."""

from __future__ import annotations

import pytest

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
