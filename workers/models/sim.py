"""A simulated GPU: a batch of b tasks takes base_ms + per_item_ms * b of wall time, no CPU."""

from __future__ import annotations

import time
from typing import Any


class SimModel:
    """Returns each task's inputs unchanged, so a mix-up across a batch shows."""

    def __init__(self, base_ms: float = 20.0, per_item_ms: float = 0.5) -> None:
        self.base_ms = base_ms
        self.per_item_ms = per_item_ms

    def cost_ms(self, batch_size: int) -> float:
        return self.base_ms + self.per_item_ms * batch_size

    def validate(self, inputs: Any) -> Any:
        return inputs

    def run(self, batch: list[Any]) -> list[Any]:
        time.sleep(self.cost_ms(len(batch)) / 1000)
        return list(batch)

    def __repr__(self) -> str:
        return f"SimModel(base_ms={self.base_ms}, per_item_ms={self.per_item_ms})"
