"""mypy over the whole import package (tandem, its broker, producers, workers,
coordinator and tools), as pyproject.toml's [tool.mypy] configures it: the package
ships py.typed, so its types are checked, not only written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")
pytest.importorskip("mypy")

ROOT = Path(__file__).parent.parent


def layout(into: Path) -> Path:
    """The import package as installed, made of links to the checkout's folders
    (pyproject.toml maps each subpackage to its own top-level folder)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapped = config["tool"]["setuptools"]["package-dir"]
    top = into / "tandem"
    top.mkdir(parents=True)
    for child in (ROOT / mapped["tandem"]).iterdir():
        if child.name != "__pycache__":
            (top / child.name).symlink_to(child)
    for package, folder in mapped.items():
        if package != "tandem":
            (into / package.replace(".", "/")).symlink_to(ROOT / folder)
    return into


def test_the_product_packages_type_check(tmp_path):
    tree = layout(tmp_path / "src")
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")]
        + ["--cache-dir", str(tmp_path / "cache"), "-p", "tandem"],
        cwd=tree,
        capture_output=True,
        text=True,
        env={**os.environ, "MYPYPATH": ""},
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
