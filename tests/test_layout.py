"""The import graph of the product code, read with ast (imports inside functions too): no
circles, and the protocol layer (broker/) and the workers never import a layer above."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
PACKAGES = ("broker", "workers", "producers")
#: The shell: it starts every role, so it may import them all. It moves out of broker/
#: with the layout work (issue 14).
SHELL = {"broker.cli"}


def modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


def imports() -> dict[str, set[str]]:
    """Module -> the product modules it imports."""
    known = modules()
    edges: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            else:
                continue
            edges[name] |= {t for t in targets if t in known and t != name}
    return edges


def test_the_product_imports_have_no_circle():
    edges = imports()
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            raise AssertionError("import circle: " + " -> ".join(path[path.index(name) :] + [name]))
        if name in done:
            return
        for target in sorted(edges[name]):
            visit(target, [*path, name])
        done.add(name)

    for name in sorted(edges):
        visit(name, [])


def test_no_layer_imports_one_above_it():
    rank = {"broker": 0, "workers": 1, "producers": 2}
    upward = [
        f"{name} imports {target}"
        for name, targets in imports().items()
        if name not in SHELL
        for target in targets
        if rank[target.partition(".")[0]] > rank[name.partition(".")[0]]
    ]
    assert not upward, "\n".join(upward)


def test_the_check_sees_a_circle_and_an_upward_import(tmp_path, monkeypatch):
    """The checks above can fail: a circle and an upward import, planted in a copy."""
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "broker" / "a.py").write_text("from broker import b\nimport workers.c\n")
    (tmp_path / "broker" / "b.py").write_text("def f():\n    from broker.a import x\n")
    (tmp_path / "workers" / "c.py").write_text("")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    with pytest.raises(AssertionError, match="broker.a -> broker.b -> broker.a"):
        test_the_product_imports_have_no_circle()
    with pytest.raises(AssertionError, match="broker.a imports workers.c"):
        test_no_layer_imports_one_above_it()
