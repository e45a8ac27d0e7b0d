"""Built-in models. A model validates one task's inputs and computes a batch."""

from __future__ import annotations

from typing import Any, Protocol

from broker.errors import UnknownModel
from broker.keys import parse_model
from broker.settings import Settings


class Model(Protocol):
    """What an executor needs from a model."""

    def validate(self, inputs: Any) -> Any:
        """Check one task's inputs; return them ready to batch, or raise BadInput."""

    def run(self, batch: list[Any]) -> list[Any]:
        """Compute a batch in one pass; return one JSON-ready output per input, in order."""


BUILTIN = ("sim", "tiny")


def load_builtin(model: str, settings: Settings) -> Model:
    """Load a built-in model by its NAME:VERSION; any version label is accepted."""
    name, _version = parse_model(model)
    if name == "sim":
        from workers.models.sim import SimModel

        return SimModel(base_ms=settings.sim_base_ms, per_item_ms=settings.sim_per_item_ms)
    if name == "tiny":
        from workers.models.tiny import TinyModel

        return TinyModel(device=settings.device)
    raise UnknownModel(f"no built-in model {name!r}; built-in models are {', '.join(BUILTIN)}")
