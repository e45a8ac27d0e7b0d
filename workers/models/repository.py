"""The model repository: NAME/VERSION/config.json plus one artifact per version.

Models load only from the configured repository folder (or the one shipped
with tandem); a task can never name a file. Listing and resolving need no torch;
loading (tandem.workers.models.loading) needs the worker extra.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from tandem.broker.errors import MissingExtra, ModelLoadError
from tandem.broker.extras import install_hint, installed, require
from tandem.broker.keys import version_key
from tandem.workers.models.spec import ModelConfig, load_config

if TYPE_CHECKING:
    from tandem.workers.models.loading import RepoModel

#: The example repository shipped inside the package.
SHIPPED = Path(__file__).resolve().parent.parent / "repository"


class Repository:
    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root else SHIPPED

    def __repr__(self) -> str:
        return f"<Repository {self.root}>"

    def configs(self) -> list[Path]:
        return sorted(self.root.glob("*/*/config.json"))

    def versions(self, name: str) -> list[str]:
        found = [p.parent.name for p in (self.root / name).glob("*/config.json")]
        return sorted(found, key=version_key)

    def resolve(self, ref: str) -> str:
        """NAME:VERSION as given, or with `latest` replaced by the highest version here."""
        name, _, version = ref.partition(":")
        if version != "latest":
            return ref
        versions = self.versions(name)
        if not versions:
            raise ModelLoadError(f"{self.root / name}: no versions of {name!r}")
        return f"{name}:{versions[-1]}"

    def config(self, ref: str) -> ModelConfig:
        name, _, version = self.resolve(ref).partition(":")
        return load_config(self.root / name / version / "config.json")

    def load(self, ref: str, device: str | None = None) -> RepoModel:
        require("worker", f"loading {ref}")
        from tandem.workers.models.loading import RepoModel

        config = self.config(ref)
        return RepoModel(config, device=device or config.device)


def check(repository: Repository, device: str | None = None) -> list[dict[str, Any]]:
    """Check every model version in the repository; one row each, with the error if any.
    With the worker extra each one is loaded and warmed up; without it, only its config
    is checked, and the row says which extra loading needs."""
    loads = installed("worker")
    rows = []
    for path in repository.configs():
        ref = f"{path.parent.parent.name}:{path.parent.name}"
        row: dict[str, Any] = {
            "model": ref,
            "artifact": "",
            "inputs": "",
            "outputs": "",
            "batch": "",
            "status": "ok",
        }
        try:
            config = load_config(path)
            row.update(
                artifact=config.artifact.describe(),
                inputs="; ".join(s.describe() for s in config.inputs),
                outputs="; ".join(s.describe() for s in config.outputs),
                batch=f"{config.max_batch_size} / {config.max_wait_ms:g} ms",
            )
            if loads:
                from tandem.workers.models.loading import RepoModel

                RepoModel(config, device=device or config.device)
            else:
                row["status"] = "config ok; not loaded"
        except (ModelLoadError, MissingExtra) as e:
            if e.extra:  # not broken: this install lacks an optional extra
                row["status"] = f"needs the {e.extra} extra: {install_hint(e.extra)}"
            else:
                row["status"] = f"error: {e}"
        except ImportError as e:
            row["status"] = f"error: {path}: needs a package that is not installed: {e}"
        rows.append(row)
    return rows
