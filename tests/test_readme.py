"""The README tells the truth: every command and flag it names exists, its blocks run."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from helpers import start_up, tandem
from tandem.cli import main

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
#: The pages the README hands on to, whose blocks and tables the tests hold too.
PAGES = ("guide", "models", "operating", "guarantees")
DOCS = "\n".join([README, *((ROOT / "docs" / f"{page}.md").read_text() for page in PAGES)])
#: Every `tandem` subcommand: its own and those the tools plug in (entry points).
COMMANDS = {
    name: main.get_command(click.Context(main), name)
    for name in main.list_commands(click.Context(main))
}
#: Commands a README block may show that can run against the test stack and return.
RUNNABLE = {"submit", "status", "models"}


def code_blocks(text: str) -> list[str]:
    return re.findall(r"```(?:bash|sh)\n(.*?)```", text, flags=re.S)


def block_commands(text: str) -> list[list[str]]:
    """Each `tandem ...` command in the bash blocks, as argv, comments and prompts dropped."""
    out = []
    for block in code_blocks(text):
        for line in block.splitlines():
            line = line.split(" #")[0].strip()
            for part in re.split(r"&&|;|\|", line):
                part = part.strip()
                if part.startswith("tandem "):  # other lines may be cut by `\`
                    out.append(shlex.split(part.removesuffix("&")))
    return out


def named_commands(text: str) -> dict[str, set[str]]:
    """Subcommand -> flags, from the command table, the bash blocks and inline code."""
    named: dict[str, set[str]] = {}
    for row in re.findall(r"^\| `tandem (\w+)[^|]*\|.*$", text, flags=re.M):
        named.setdefault(row, set())
    for line in re.findall(r"^\| `tandem \w+.*$", text, flags=re.M):
        sub = line.split()[2].strip("`")
        named[sub] |= set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", line))
    spans = re.findall(r"`(tandem [^`]+)`", text)
    for words in [s.split() for s in spans] + block_commands(text):
        if len(words) > 1 and not words[1].startswith("-"):
            named.setdefault(words[1], set()).update(w for w in words if w.startswith("--"))
    return named


def test_the_readme_names_every_command_it_has():
    named = named_commands(DOCS)
    assert {"up", "demo", "worker", "coordinator", "submit", "status", "models", "bench"} <= set(
        named
    )
    assert set(named) == set(COMMANDS), "README and CLI disagree on the commands"


@pytest.mark.parametrize("sub", sorted(named_commands(DOCS)))
def test_every_command_and_flag_the_readme_names_exists(sub):
    flags = named_commands(DOCS)[sub]
    assert sub in COMMANDS, f"the README names `tandem {sub}`, which does not exist"
    command = COMMANDS[sub]
    known = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}
    assert flags <= known, f"`tandem {sub}` has no {sorted(flags - known)}"
    done = CliRunner().invoke(main, [sub, "--help"])
    assert done.exit_code == 0, done.output


def test_the_installed_command_answers_help():
    done = subprocess.run(["tandem", "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    for sub in COMMANDS:
        assert sub in done.stdout


def test_the_readme_blocks_run_against_a_stack(processes, settings):
    processes.worker("w1")
    runnable = [w for w in block_commands(DOCS) if w[1] in RUNNABLE and "--watch" not in w]
    assert ["tandem", "submit", "sim:1", "[1, 2]"] in runnable
    for words in runnable:
        done = tandem(*words[1:], redis_url=settings.redis_url, timeout=120)
        assert done.returncode == 0, f"{shlex.join(words)}: {done.stderr}"
        if words[1] == "submit":
            assert json.loads(done.stdout)["result"] == json.loads(words[3])


def test_the_readme_opens_with_the_two_commands_ci_runs():
    first = code_blocks(README)[0]
    lines = [ln for ln in first.splitlines() if ln.strip() and not ln.startswith("#")]
    assert lines == [
        "pip install torch==2.13.0 '.[worker]' && tandem demo",
        "pip install torch==2.13.0 -e '.[test,worker,flower,embed,bench,http,otel]' && pytest",
    ]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "readme_command 1" in ci and "readme_command 2" in ci
    # The first installs a wheel built from the checkout, as users get it, not an editable
    # install; the second brings every extra, so the suite runs all of it.
    assert " -e " not in lines[0]
    extras = set(lines[1].split("[", 1)[1].split("]", 1)[0].split(","))
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert extras == set(declared["optional-dependencies"])


def test_every_link_in_the_repository_docs_stays_inside_it():
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    texts = [p for p in tracked if p.endswith((".md", ".py", ".toml", ".yml", ".yaml", ".lua"))]
    for path in texts:
        text = (ROOT / path).read_text()
        for outside in ("../" + "shared", "shared/" + "DESIGN", "shared/" + "STYLE"):
            assert outside not in text, f"{path} points outside the repository: {outside}"
        if path.endswith(".md"):
            for target in re.findall(r"\]\(([^)#\s]+)[^)]*\)", text):
                if not re.match(r"[a-z]+://", target):
                    resolved = (ROOT / path).parent / target
                    assert resolved.exists(), f"{path} links to missing {target}"
                    assert ROOT in resolved.resolve().parents or resolved.resolve() == ROOT


def python_blocks(*sections: str, text: str = DOCS) -> list[str]:
    """The python blocks of these sections (## headings), in order."""
    out = []
    for heading in sections:
        section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
        out += re.findall(r"```python\n(.*?)```", section, flags=re.S)
    return out


def test_the_python_and_celery_blocks_run_as_written_against_up(tmp_path):
    """The README's `tandem up`, then its Python and Celery blocks as written, in the same
    folder: the Client and the Celery app find up's Redis; the chain and the chord run
    their next steps in docs/examples/myapp.py's worker, started as the README says."""
    (tmp_path / "docs").symlink_to(ROOT / "docs")  # the README's paths, from this folder
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    up, _ = start_up(tmp_path, "--workers", "1")
    (start_worker,) = [b.strip() for b in code_blocks(DOCS) if b.strip().startswith("PYTHONPATH=")]
    worker = subprocess.Popen(
        start_worker + " --pool solo --loglevel WARNING",
        shell=True,
        cwd=tmp_path,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    blocks = python_blocks("From Python", "From any Celery client")
    assert len(blocks) == 4
    checks = """
assert result.get(timeout=10) == [1]  # the Deadlines block submitted last
assert [x.get(timeout=10) for x in results] == [[n] for n in range(100)]
assert r.get(timeout=10) == {"a": 1}
assert chain(infer, app.signature("myapp.total")).apply_async().get(timeout=30) == 6
assert chord(header, app.signature("myapp.total")).apply_async().get(timeout=30) == 6
print("all ran")
"""
    try:
        done = subprocess.run(
            [sys.executable, "-c", "\n".join(blocks) + checks],
            cwd=tmp_path,
            env={**env, "PYTHONPATH": "docs/examples"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0 and "all ran" in done.stdout, done.stdout + done.stderr
        # The README's own, shorter: Python and Celery (its gRPC blocks need a gateway and
        # run in tests/test_grpc.py).
        tour = python_blocks("A short tour", text=README)
        assert len(tour) == 4 and all("tritonclient" in block for block in tour[2:])
        tour = tour[:2]
        done = subprocess.run(
            [sys.executable, "-c", "\n".join(tour)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "[0.1, 0.2, 0.3]" in done.stdout and done.stdout.rstrip().endswith("[1]")
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(30)
        up.send_signal(signal.SIGINT)
        up.wait(60)


def test_the_settings_table_lists_every_setting():
    import dataclasses

    from tandem.broker.settings import Settings

    table = DOCS.split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    missing = [
        f"TANDEM_{f.name.upper()}"
        for f in dataclasses.fields(Settings)
        if f"`TANDEM_{f.name.upper()}`" not in table
    ]
    assert not missing, f"the README's settings table lacks {missing}"
