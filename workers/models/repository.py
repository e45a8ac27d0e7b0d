"""The model repository: NAME/VERSION/config.json plus one artifact per version.

Models load only from the configured repository folder (or the one shipped
with tandem); a task can never name a file.
"""

from __future__ import annotations

import importlib
import logging
import os
from pathlib import Path
from typing import Any

import torch

from tandem.broker.errors import BadSetting, MissingExtra, ModelLoadError
from tandem.broker.extras import extra_of, install_hint
from tandem.broker.keys import version_key
from tandem.workers.models.collate import Batch, Collator, Item
from tandem.workers.models.spec import ModelConfig, load_config

log = logging.getLogger("tandem.models")

#: The example repository shipped inside the package.
SHIPPED = Path(__file__).resolve().parent.parent / "repository"


def pick_device(device: str) -> torch.device:
    """'auto' picks CUDA when it is present, else the CPU. A CUDA device this process
    cannot see is refused with BadSetting, never left to fail at the first batch."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        chosen = torch.device(device)
    except RuntimeError as e:
        raise BadSetting(f"device {device!r} is not a torch device: {e}") from None
    if chosen.type == "cuda":
        count = torch.cuda.device_count()
        if (chosen.index or 0) >= count:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
            raise BadSetting(
                f"device {device} is not visible: this process sees {count} CUDA device(s) "
                f"(CUDA_VISIBLE_DEVICES={visible}); a container given one GPU sees it as cuda:0"
            )
    return chosen


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
        config = self.config(ref)
        return RepoModel(config, device=device or config.device)


class RepoModel:
    """A repository model, as an executor sees it: validate one task, run a batch."""

    def __init__(self, config: ModelConfig, device: str = "auto") -> None:
        self.config = config
        self.device = pick_device(device)
        self.collator = Collator(config)
        self.module = _load_module(config, self.device)
        self.max_batch_size = config.max_batch_size
        self.max_wait_ms = config.max_wait_ms
        self.max_queue = config.max_queue
        self.slo_ms = config.slo_ms
        self.last_device_ms: float | None = None
        self._warm_up()

    def __repr__(self) -> str:
        return f"<RepoModel {self.config.ref} {self.config.artifact.kind} on {self.device}>"

    def validate(self, inputs: Any) -> Item:
        return self.collator.validate(inputs)

    def run(self, batch: list[Item]) -> list[Any]:
        collated = self.collator.collate(batch)
        with torch.inference_mode():
            args = self._to_device(collated)
            if self.device.type != "cuda":
                return self.collator.split(self.module(*args), collated, len(batch))
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            outputs = self.module(*args)
            end.record()
            out = self.collator.split(outputs, collated, len(batch))
        end.synchronize()
        #: The last forward pass's GPU time: the executor reports it as device_ms.
        self.last_device_ms = start.elapsed_time(end)
        return out

    def _to_device(self, batch: Batch) -> list[torch.Tensor]:
        args = []
        for tensor in batch.args:
            if self.config.half and tensor.is_floating_point():
                tensor = tensor.half()
            if self.device.type == "cuda":
                tensor = tensor.pin_memory().to(self.device, non_blocking=True)
            args.append(tensor)
        return args

    def _warm_up(self) -> None:
        try:
            self.run([self.collator.example()])
        except Exception as e:
            raise ModelLoadError(
                f"{self.config.directory}: warm-up forward pass failed: {type(e).__name__}: {e}"
            ) from e


def _load_module(config: ModelConfig, device: torch.device) -> torch.nn.Module:
    artifact = config.artifact
    where = artifact.path or artifact.weights or config.directory / "config.json"
    try:
        if artifact.kind == "torchscript":
            module = torch.jit.load(str(artifact.path), map_location=device)
        elif artifact.kind == "export":
            module = torch.export.load(str(artifact.path)).module()
        else:
            module = _from_factory(config)
    except ModelLoadError:
        raise
    except Exception as e:
        raise ModelLoadError(
            f"{where}: cannot load {artifact.describe()}: {type(e).__name__}: {e}"
        ) from e
    if hasattr(module, "eval") and artifact.kind != "export":
        module.eval()
    module = module.to(device)
    return module.half() if config.half else module


def _from_factory(config: ModelConfig) -> torch.nn.Module:
    artifact = config.artifact
    module_name, _, function = artifact.factory.partition(":")
    try:
        build = getattr(importlib.import_module(module_name), function)
    except (ImportError, AttributeError) as e:
        missing = getattr(e, "name", None) or ""
        hint = f"; install it with {install_hint(extra)}" if (extra := extra_of(missing)) else ""
        error = ModelLoadError(
            f"{config.directory / 'config.json'}: factory {artifact.factory!r} not found: {e}"
            + hint
        )
        error.extra = extra
        raise error from e
    module = build(config)
    if artifact.weights:
        from safetensors.torch import load_file

        try:
            state = load_file(str(artifact.weights))
        except Exception as e:
            raise ModelLoadError(f"{artifact.weights}: not a safetensors file: {e}") from e
        result = module.load_state_dict(state, strict=False)
        if result.missing_keys:
            raise ModelLoadError(f"{artifact.weights}: no weights for {result.missing_keys}")
        if result.unexpected_keys:
            log.info("%s: ignored weights %s", artifact.weights, result.unexpected_keys)
    return module


def check(repository: Repository, device: str | None = None) -> list[dict[str, Any]]:
    """Load every model version in the repository; one row each, with the error if any."""
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
            RepoModel(config, device=device or config.device)
        except (ModelLoadError, MissingExtra) as e:
            if e.extra:  # not broken: this install lacks an optional extra
                row["status"] = f"needs the {e.extra} extra: {install_hint(e.extra)}"
            else:
                row["status"] = f"error: {e}"
        except ImportError as e:
            row["status"] = f"error: {path}: needs a package that is not installed: {e}"
        rows.append(row)
    return rows
