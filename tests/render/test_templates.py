"""The jinja2 environment: StrictUndefined, and #SBATCH values quoted the way sbatch parses them."""

from __future__ import annotations

import pytest

from genconf.check.slurm import sbatch_arguments


def test_sbatch_lines_parse_the_way_sbatch_parses_them():
    assert sbatch_arguments(' --output="/a b/\\"q\\"/%j.out" --x=1 # comment') == ['--output=/a b/"q"/%j.out', "--x=1"]
    from genconf.render.templates import sbatch_quote

    for value in ("/plain", "/with space", '/quo"te', "/back\\slash", "/$(touch x)", "/hash#tag"):
        assert sbatch_arguments(f" --chdir={sbatch_quote(value)}") == [f"--chdir={value}"]

def test_rendering_uses_strict_undefined():
    import jinja2

    from genconf.render.templates import environment

    with pytest.raises(jinja2.UndefinedError):
        environment().get_template("launch.sbatch.j2").render()
