"""A simulated GPU: a batch of b tasks takes base_ms + per_item_ms * b of wall time, no CPU.
Preparing each task (validate) takes prep_ms of CPU with the GIL held, as Python
preprocessing such as tokenization does."""

from __future__ import annotations

import time
from typing import Any


class SimModel:
    """Returns each task's inputs unchanged, so a mix-up across a batch shows."""

    #: Any JSON goes in and comes back; gateways describe it as a vector of floats.
    SIGNATURE = {
        "inputs": [{"name": "x", "dtype": "float32", "shape": [-1]}],
        "outputs": [{"name": "y", "dtype": "float32", "shape": [-1]}],
    }

    def __init__(self, base_ms: float = 20.0, per_item_ms: float = 0.5, prep_ms: float = 0.0):
        self.base_ms = base_ms
        self.per_item_ms = per_item_ms
        self.prep_ms = prep_ms

    def cost_ms(self, batch_size: int) -> float:
        return self.base_ms + self.per_item_ms * batch_size

    def validate(self, inputs: Any) -> Any:
        if self.prep_ms:
            end = time.perf_counter() + self.prep_ms / 1000
            while time.perf_counter() < end:  # CPU work, the GIL held: the prep cost itself
                pass
        return inputs

    def run(self, batch: list[Any]) -> list[Any]:
        cost_ms = self.cost_ms(len(batch))
        if cost_ms > 0:  # sleep(0) would still yield the thread: a zero-cost model costs 0
            time.sleep(cost_ms / 1000)
        return list(batch)

    def __repr__(self) -> str:
        return (
            f"SimModel(base_ms={self.base_ms}, per_item_ms={self.per_item_ms}, "
            f"prep_ms={self.prep_ms})"
        )
