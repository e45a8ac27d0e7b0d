"""Both sides of each script's KEYS and ARGV held to its header: the script binds the
names of its `-- KEYS:` and `-- ARGV:` lines to locals at its top, in that order, and
reads no other KEYS[n] or ARGV[n]; broker/scripts/layouts.py lists the same names."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from tandem.broker import scripts
from tandem.broker.scripts import layouts

HERE = resources.files(scripts.__name__)


def text(part: str) -> str:
    return (HERE / f"{part}.lua").read_text()


def declaring(name: str) -> str:
    """The text of the file that names the script's KEYS and ARGV: its own, or, for a
    script that leaves them to what it includes (route, route_one), that include."""
    for part in (name, *scripts.INCLUDES.get(name, ())):
        if "-- KEYS:" in text(part):
            return text(part)
    raise AssertionError(f"{name}.lua names no KEYS")


def header(source: str, which: str) -> list[str]:
    """The names of a `-- KEYS:` or `-- ARGV:` header, continued on lines of `--` and
    spaces."""
    lines = source.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"-- {which}:"))
    words = lines[start].removeprefix(f"-- {which}:")
    for line in lines[start + 1 :]:
        if not re.match(r"--\s{3,}\S", line):
            break
        words += "," + line.removeprefix("--")
    return [w.strip() for w in words.split(",") if w.strip()]


def bound(source: str, which: str) -> list[str]:
    """The names the script binds from KEYS or ARGV, in order; the rest with "..."."""
    fixed = re.search(rf"local\s+([\w,\s]+?)\s*=\s*unpack\({which}, 1, (\d+)\)", source)
    names = [n.strip() for n in fixed.group(1).split(",")] if fixed else []
    if fixed:
        assert int(fixed.group(2)) == len(names), (which, names)
    rest = re.search(rf"local\s+(\w+)\s*=\s*rest\({which}, (\d+)\)", source)
    if rest:
        assert int(rest.group(2)) == len(names) + 1, (which, rest.group(0))
        names.append(rest.group(1) + "...")
    return names


def fields(layout: type) -> list[str]:
    names = list(layout._fields)
    if layout in layouts.WITH_REST:
        names[-1] += "..."
    return names


@pytest.mark.parametrize("name", scripts.NAMES)
def test_each_script_binds_its_header_and_its_layout_lists_it(name):
    source = declaring(name)
    keys_layout, args_layout = layouts.LAYOUTS[name]
    for which, layout in (("KEYS", keys_layout), ("ARGV", args_layout)):
        named = header(source, which)
        assert bound(source, which) == named, f"{name}.lua binds other {which} than it names"
        assert fields(layout) == named, f"layouts.{layout.__name__} differs from {name}.lua"


@pytest.mark.parametrize("part", [*scripts.NAMES, "_lib", "_route"])
def test_no_script_reads_keys_or_argv_by_a_bare_index(part):
    assert not re.findall(r"\b(?:KEYS|ARGV)\[", text(part))


def test_every_script_has_a_layout():
    assert set(layouts.LAYOUTS) == set(scripts.NAMES)


def test_pack_spreads_the_rest_in_order():
    keys = layouts.ClaimKeys(executor="e", inflight="f", retry="r", l1=["a", "b"])
    assert layouts.pack(keys) == ["e", "f", "r", "a", "b"]
    assert layouts.pack(layouts.LeaseArgs(holder="h", ttl_ms=5)) == ["h", 5]
