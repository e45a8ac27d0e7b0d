"""The import graph of the product code, read with ast (imports inside functions too).

The layers, bottom up (docs/architecture.md): the protocol (broker/), the roles
(producers/, workers/, coordinator/, which never import each other), the shell (shell/, the
`tandem` package itself) and the tools (tools/, which nothing else imports). Each folder
is a subpackage of `tandem`, mapped in pyproject.toml; these tests read that map."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from helpers import parse_file

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).parent.parent
#: Import package -> layer, bottom up. Packages of one layer may not import each other.
LAYERS = {
    "tandem.broker": 0,
    "tandem.producers": 1,
    "tandem.workers": 1,
    "tandem.coordinator": 1,
    "tandem": 2,
    "tandem.tools": 3,
}
OLD_NAMES = ("broker", "workers", "producers")


def folders() -> dict[str, Path]:
    """Import package -> its folder, as pyproject.toml maps them."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapped = config["tool"]["setuptools"]["package-dir"]
    return {package: ROOT / folder for package, folder in mapped.items() if package in LAYERS}


def modules() -> dict[str, Path]:
    out = {}
    for package, folder in folders().items():
        for path in folder.glob("*.py"):  # a subfolder is its own package, or a subpackage's
            out[f"{package}.{path.stem}".removesuffix(".__init__")] = path
        for path in folder.glob("*/**/*.py"):
            sub = ".".join(path.relative_to(folder).with_suffix("").parts)
            name = f"{package}.{sub}".removesuffix(".__init__")
            if not any(name.startswith(other + ".") for other in LAYERS if other != package):
                out[name] = path
    return out


def package_of(name: str) -> str:
    return max((p for p in LAYERS if name == p or name.startswith(p + ".")), key=len)


def imported(path: Path) -> list[str]:
    """Every module name an import in this file names (a from-import's names too)."""
    names = []
    for node in ast.walk(parse_file(path)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
    return names


def imports() -> dict[str, set[str]]:
    """Module -> the product modules it imports."""
    known = modules()
    return {
        name: {t for t in imported(path) if t in known and t != name}
        for name, path in known.items()
    }


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


def test_no_layer_imports_one_above_it_or_beside_it():
    wrong = []
    for name, targets in imports().items():
        mine = package_of(name)
        for target in targets:
            theirs = package_of(target)
            if LAYERS[theirs] > LAYERS[mine]:
                wrong.append(f"{name} imports {target}, a layer above")
            elif LAYERS[theirs] == LAYERS[mine] and theirs != mine:
                wrong.append(f"{name} imports {target}, a role beside it")
    if wrong:
        raise AssertionError("\n".join(sorted(wrong)))


def test_the_product_never_imports_the_tools():
    wrong = [
        f"{name} imports {target}"
        for name, targets in imports().items()
        if package_of(name) != "tandem.tools"
        for target in targets
        if package_of(target) == "tandem.tools"
    ]
    if wrong:
        raise AssertionError("\n".join(sorted(wrong)))


def test_the_tandem_package_itself_imports_nothing():
    """Every `import tandem.X` runs shell/__init__.py first: it must load nothing."""
    assert not imported(folders()["tandem"] / "__init__.py")


def test_every_folder_is_mapped_and_nothing_imports_the_folder_names():
    """The folders are importable only as tandem.*: a bare `import broker` would find the
    folder from the repository root and load a second copy of the code."""
    mapped = {path.name for path in folders().values()}
    assert mapped == {"shell", *OLD_NAMES, "coordinator", "tools"}
    bare = [
        f"{path.relative_to(ROOT)} imports {name}"
        for folder in (*folders().values(), ROOT / "tests", ROOT / "benchmarks")
        for path in folder.rglob("*.py")
        for name in imported(path)
        if name.partition(".")[0] in mapped
    ]
    assert not bare, "\n".join(bare)


def test_the_checks_see_a_circle_an_upward_import_and_a_tool_import(tmp_path, monkeypatch):
    """The checks above can fail: a circle, an upward import, a role importing a role and
    product code importing a tool, planted in a copy."""
    mapping = "\n".join(f'"{p}" = "{p.replace(".", "_")}"' for p in LAYERS)
    (tmp_path / "pyproject.toml").write_text(f"[tool.setuptools.package-dir]\n{mapping}\n")
    for package in LAYERS:
        (tmp_path / package.replace(".", "_")).mkdir()
        (tmp_path / package.replace(".", "_") / "__init__.py").write_text("")
    (tmp_path / "tandem_broker" / "a.py").write_text(
        "from tandem.broker import b\nimport tandem.workers.c\n"
    )
    (tmp_path / "tandem_broker" / "b.py").write_text(
        "def f():\n    from tandem.broker.a import x\n"
    )
    (tmp_path / "tandem_workers" / "c.py").write_text("from tandem.producers import d\n")
    (tmp_path / "tandem_producers" / "d.py").write_text("from tandem.tools.e import run\n")
    (tmp_path / "tandem_tools" / "e.py").write_text("from tandem.broker import a\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    with pytest.raises(
        AssertionError, match="tandem.broker.a -> tandem.broker.b -> tandem.broker.a"
    ):
        test_the_product_imports_have_no_circle()
    with pytest.raises(AssertionError) as wrong:
        test_no_layer_imports_one_above_it_or_beside_it()
    assert set(str(wrong.value).splitlines()) >= {
        "tandem.broker.a imports tandem.workers.c, a layer above",
        "tandem.workers.c imports tandem.producers.d, a role beside it",
        "tandem.producers.d imports tandem.tools.e, a layer above",
    }
    assert "tandem.tools.e imports" not in str(wrong.value)  # a tool may import any layer
    with pytest.raises(AssertionError, match="tandem.producers.d imports tandem.tools.e"):
        test_the_product_never_imports_the_tools()
