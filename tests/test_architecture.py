"""The house plan, held by walking every module's imports (ast, function-level imports included): no cycles, the
pure core imports only the standard library and itself, and the arrows between rooms point one way,

    cli -> run -> {check, train} -> render -> catalog -> plan

(a room may import any room to its right, never one to its left; check and train never import each other).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from conftest import REPO

PACKAGE = REPO / "genconf"
STDLIB = set(sys.stdlib_module_names) | {"__future__"}

ROOMS = {"plan": 0, "catalog": 1, "render": 2, "check": 3, "train": 3, "run": 4, "cli": 5}
"""Each room's floor: imports go to a lower floor or stay in the room."""
THIRD_PARTY = {
    # room -> what it may import besides the standard library and genconf (an allowlist)
    "plan": set(),
    "catalog": {"yaml"},
    "render": {"yaml", "jinja2"},
    "check": {"yaml"},
    "train": {"torch", "numpy", "deepspeed", "megatron", "transformer_engine", "torchao", "flash_attn"},
    "run": {"matplotlib", "torch", "numpy"},  # numpy: run/datacheck scans token files (the train extra brings it)
    "cli": set(),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(module: str) -> list[str]:
    """Every module `module` imports, anywhere in its body; `from a import b` counts as a.b when that is a module."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            for a in node.names:
                out.append(f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base)
    return out


GRAPH = {m: sorted({i for i in imports(m) if i in MODULES and i != m}) for m in MODULES}


def room(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ROOMS else None


def test_the_walk_sees_every_room():
    assert {room(m) for m in MODULES} - {None} == set(ROOMS)
    assert len(MODULES) > 60 and sum(len(v) for v in GRAPH.values()) > 150


def test_no_import_cycles():
    """Tarjan's strongly connected components: every component must be a single module."""
    index, low, stack, on_stack, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in GRAPH:
        if v not in index:
            visit(v)
    assert cycles == []


def test_the_root_package_imports_nothing():
    """plan/planfile reads genconf.__version__: the root package must stay an empty room."""
    assert GRAPH["genconf"] == [] and all(i.split(".")[0] in STDLIB for i in imports("genconf"))


@pytest.mark.parametrize("module", sorted(m for m in MODULES if room(m) is not None))
def test_arrows_point_one_way(module):
    here = room(module)
    for target in GRAPH[module]:
        there = room(target)
        if there is None or there == here:
            continue
        assert ROOMS[there] < ROOMS[here], f"{module} ({here}) imports {target} ({there}): that arrow points back"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if room(m) is not None))
def test_each_room_imports_only_what_it_may(module):
    here = room(module)
    allowed = STDLIB | THIRD_PARTY[here] | {"genconf"}
    for name in imports(module):
        top = name.split(".")[0]
        assert top in allowed, f"{module} imports {name}: {here}/ may import only the standard library, genconf and " \
                               f"{sorted(THIRD_PARTY[here]) or 'nothing else'}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if room(m) == "plan"))
def test_the_core_is_pure(module):
    """genconf/plan: the standard library and genconf.plan only (an allowlist), never a shell module."""
    for name in imports(module):
        assert name.split(".")[0] in STDLIB or name == "genconf" or name.startswith("genconf.plan"), \
            f"{module} imports {name}"


def test_render_and_train_never_import_check():
    for module, targets in GRAPH.items():
        if room(module) in ("render", "train"):
            assert not [t for t in targets if room(t) == "check"], module


def test_catalog_imports_plan_stdlib_and_yaml_only():
    for module in (m for m in MODULES if room(m) == "catalog"):
        for name in imports(module):
            assert name.split(".")[0] in STDLIB | {"yaml"} or name.startswith(("genconf.plan", "genconf.catalog")), \
                f"{module} imports {name}"


def test_every_room_is_installed():
    """pyproject.toml lists packages explicitly: a new room missing there works in a checkout and is absent from
    an installed genconf."""
    tomllib = pytest.importorskip("tomllib")
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    packages = {module_name(p.parent / "__init__.py") for p in PACKAGE.rglob("__init__.py")}
    assert packages <= listed, sorted(packages - listed)
