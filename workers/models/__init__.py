"""Built-in models. A model validates one task's inputs and computes a batch."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol

from tandem.broker.errors import UnknownModel
from tandem.broker.keys import parse_model
from tandem.broker.settings import Settings


class Model(Protocol):
    """What an executor needs from a model: validate and run. A model may also split
    run into stages, so that only its forward pass holds the device thread: collate,
    to_device, forward, to_host and split (workers/stages.py).

    A model may also carry, as attributes, what it knows better than the worker's
    settings (repository models take them from their config.json); options() reads them:
    `max_batch_size`, `max_wait_ms`, `max_queue`, `slo_ms`. After each run it may set
    `last_device_ms`, its GPU time (the executor reports it). Its tensors, for gateways,
    are its `config` (a repository model) or its class's `SIGNATURE` (describe())."""

    def validate(self, inputs: Any) -> Any:
        """Check one task's inputs; return them ready to batch, or raise BadInput."""

    def run(self, batch: list[Any]) -> list[Any]:
        """Compute a batch in one pass; return one JSON-ready output per input, in order."""


@dataclass(frozen=True)
class Options:
    """An executor's batching and admission for its model: the model's own, else the
    worker's settings."""

    max_batch: int
    max_wait_ms: float
    max_queue: int
    slo_ms: float


def options(model: Model, settings: Settings) -> Options:
    """The model's optional attributes (see Model) over the worker's settings. Raises
    BadSetting if out of range (a repository config may set its own)."""
    max_batch = getattr(model, "max_batch_size", None) or settings.max_batch
    max_wait_ms = getattr(model, "max_wait_ms", settings.max_wait_ms)
    settings.replace(max_batch=max_batch, max_wait_ms=max_wait_ms)  # validates both
    return Options(
        max_batch=max_batch,
        max_wait_ms=max_wait_ms,
        max_queue=getattr(model, "max_queue", 0) or settings.max_queue,
        slo_ms=getattr(model, "slo_ms", 0) or settings.slo_ms,
    )


def describe(model: Model, max_batch: int) -> dict[str, Any]:
    """The model's tensor signature, as gateways show and check it: per-task shapes (no
    batch dimension, -1 variable), dtype names of broker/payload.py, or "string" for text
    fed to a tokenizer. `tensors`: its inputs may come as tensors (the binary payload);
    else as JSON lists."""
    config = getattr(model, "config", None)
    if config is None:  # a built-in model: its class says (a model that does not: none)
        signature = getattr(model, "SIGNATURE", {"inputs": [], "outputs": []})
        return {"max_batch_size": max_batch, "tensors": False, **signature}

    def row(spec) -> dict[str, Any]:
        if spec.tokenizer:
            return {"name": spec.name, "dtype": "string", "shape": [1]}
        return {"name": spec.name, "dtype": spec.dtype, "shape": list(spec.shape)}

    return {
        "max_batch_size": max_batch,
        "tensors": True,
        "inputs": [row(s) for s in config.inputs],
        "outputs": [row(s) for s in config.outputs],
    }


BUILTIN = ("sim", "tiny")


def load_model(model: str, settings: Settings) -> tuple[str, Model]:
    """Load a built-in or a repository model. Returns the concrete NAME:VERSION and the model.

    Raises UnknownModel, or ModelLoadError naming the file that is wrong.
    """
    name, version = parse_model(model)
    if name in BUILTIN:
        return model, _builtin(name, settings)
    from tandem.workers.models.repository import Repository

    repository = Repository(settings.repository or None)
    if not (repository.root / name).is_dir():
        raise UnknownModel(
            f"no model {name!r}: not built in ({', '.join(BUILTIN)}) and not in {repository.root}"
        )
    ref = repository.resolve(model)
    device = settings.device if settings.device != "auto" else None
    return ref, repository.load(ref, device=device)


def _builtin(name: str, settings: Settings) -> Model:
    if name == "sim":
        from tandem.workers.models.sim import SimModel

        if settings.sim_load_s:
            time.sleep(settings.sim_load_s)  # the load a real model's weights would take
        return SimModel(
            base_ms=settings.sim_base_ms,
            per_item_ms=settings.sim_per_item_ms,
            prep_ms=settings.sim_prep_ms,
            collate_ms=settings.sim_collate_ms,
            copy_ms=settings.sim_copy_ms,
        )
    from tandem.workers.models.tiny import TinyModel

    return TinyModel(device=settings.device)
