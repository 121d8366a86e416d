"""Byte-for-byte snapshots of what genconf produces: for every recipe (full size and smoke variant) and a few
plans from the command line, plan.json, every artifact file and what the command prints.

They hold the output still while the code moves (issue 11): a difference is either a bug or a change made on
purpose. To accept an intended change, rewrite the snapshots and commit them with the change:

    GENCONF_UPDATE_SNAPSHOTS=1 .venv/bin/python -m pytest tests/test_snapshots.py

Paths that depend on where the files were written are normalised: the output directory is <OUT>, genconf's
launchers folder <LAUNCHERS>, the Python interpreter <PYTHON>.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import os
import shutil
import sys
from pathlib import Path

import pytest

from conftest import REPO
from genconf.catalog.files import resource_dir
from genconf.catalog.recipes import list_recipes
from genconf.cli.main import main

SNAPSHOTS = REPO / "tests" / "data" / "snapshots"
UPDATE_ENV = "GENCONF_UPDATE_SNAPSHOTS"
UPDATE_HINT = (f"if the change is intended, rewrite the snapshots with `{UPDATE_ENV}=1 .venv/bin/python -m pytest "
               f"tests/test_snapshots.py` and commit tests/data/snapshots with it")

PLANS = {
    # case -> plan flags; each is planned twice: --json -o DIR (stdout.json and the files) and as text (stdout.txt)
    "plan-70b-384": ["--model", "70b", "--gpus", "384"],
    "plan-405b-256": ["--model", "llama3.1-405b", "--gpus", "256"],
    "plan-mixtral-64": ["--model", "mixtral-8x7b", "--gpus", "64", "--cluster", "dgx-h100"],
    "plan-1b-8": ["--model", "1b", "--gpus", "8"],
}
RECIPES = {f"recipe-{name}{'-smoke' if smoke else ''}": (name, smoke)
           for name in list_recipes() for smoke in (False, True)}


def _genconf(*args: str) -> str:
    """genconf's stdout for `args` (in-process); a non-zero exit fails the test."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    assert code == 0, f"genconf {' '.join(args)} exited {code}: {err.getvalue()}"
    return out.getvalue()


def _normalise(text: str, out_dir: Path) -> str:
    for path, name in ((str(out_dir), "<OUT>"), (str(resource_dir("launchers").resolve()), "<LAUNCHERS>"),
                       (sys.executable, "<PYTHON>")):
        text = text.replace(path, name)
    return text


def _produce(case: str, work: Path) -> dict[str, str]:
    """Every file of one case, normalised, by its name in the snapshot folder."""
    out_dir = work / "out"
    if case in PLANS:
        printed = {"stdout.json": _genconf(*PLANS[case], "--json", "-o", str(out_dir)),
                   "stdout.txt": _genconf(*PLANS[case])}
    else:
        name, smoke = RECIPES[case]
        printed = {"stdout.txt": _genconf("recipe", name, *(["--smoke"] if smoke else []), "-o", str(out_dir))}
    files = {f"out/{p.name}": p.read_text() for p in sorted(out_dir.iterdir()) if p.is_file()}
    return {name: _normalise(text, out_dir) for name, text in {**printed, **files}.items()}


def _stored(case: str) -> dict[str, str]:
    folder = SNAPSHOTS / case
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case", list(PLANS) + list(RECIPES))
def test_output_equals_its_snapshot(case, tmp_path):
    produced = _produce(case, tmp_path)
    if os.environ.get(UPDATE_ENV):
        shutil.rmtree(SNAPSHOTS / case, ignore_errors=True)
        for name, text in produced.items():
            (SNAPSHOTS / case / name).parent.mkdir(parents=True, exist_ok=True)
            (SNAPSHOTS / case / name).write_text(text)
        return
    stored = _stored(case)
    assert stored, f"no snapshot of {case} in {SNAPSHOTS}; {UPDATE_HINT}"
    assert sorted(produced) == sorted(stored), f"{case}: files {sorted(produced)} != snapshot {sorted(stored)}; {UPDATE_HINT}"
    for name in produced:
        if produced[name] != stored[name]:
            diff = list(difflib.unified_diff(stored[name].splitlines(), produced[name].splitlines(),
                                             f"snapshot {case}/{name}", f"now {case}/{name}", lineterm="", n=1))
            pytest.fail(f"{case}/{name} differs from its snapshot:\n" + "\n".join(diff[:40]) + f"\n{UPDATE_HINT}")


def test_no_stale_snapshots():
    cases = set(PLANS) | set(RECIPES)
    stale = sorted(p.name for p in SNAPSHOTS.iterdir() if p.is_dir() and p.name not in cases)
    assert not stale, f"snapshots of cases that no longer exist: {stale}; delete them"
