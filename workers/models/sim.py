"""A simulated GPU: a batch of b tasks takes base_ms + per_item_ms * b of wall time, no CPU.
Preparing each task (validate) takes prep_ms of CPU with the GIL held, as Python
preprocessing such as tokenization does.

Its stages (workers/stages.py) cost what a GPU's do: collating a batch takes collate_ms
of CPU with the GIL held; each copy, in and out, takes copy_ms of wall time and no CPU,
on a copy engine of its own (one in, one out, as a GPU's DMA engines), so a copy waits
for the one before it on its engine and the forward pass waits for its batch's copy."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from tandem.workers import stages


@dataclass
class _Moving:
    """A batch on a copy engine: its items, and when its copy is done (monotonic s)."""

    items: list[Any]
    done_at: float
    times: dict[str, float] = field(default_factory=dict)


class _Engine:
    """One copy engine: copies run one after another."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free_at = 0.0

    def copy(self, ms: float, after: float = 0.0) -> float:
        """Queue a copy of ms, not before `after`; when it will be done (monotonic s)."""
        with self._lock:
            start = max(time.monotonic(), after, self._free_at)
            self._free_at = start + ms / 1000
            return self._free_at


def _until(at: float) -> None:
    left = at - time.monotonic()
    if left > 0:
        time.sleep(left)


def _spin(ms: float) -> None:
    if ms:
        end = time.perf_counter() + ms / 1000
        while time.perf_counter() < end:  # CPU work, the GIL held: the cost itself
            pass


class SimModel:
    """Returns each task's inputs unchanged, so a mix-up across a batch shows."""

    #: Any JSON goes in and comes back; gateways describe it as a vector of floats.
    SIGNATURE = {
        "inputs": [{"name": "x", "dtype": "float32", "shape": [-1]}],
        "outputs": [{"name": "y", "dtype": "float32", "shape": [-1]}],
    }

    def __init__(
        self,
        base_ms: float = 20.0,
        per_item_ms: float = 0.5,
        prep_ms: float = 0.0,
        collate_ms: float = 0.0,
        copy_ms: float = 0.0,
    ):
        self.base_ms = base_ms
        self.per_item_ms = per_item_ms
        self.prep_ms = prep_ms
        self.collate_ms = collate_ms
        self.copy_ms = copy_ms
        self._in, self._out = _Engine(), _Engine()

    def cost_ms(self, batch_size: int) -> float:
        return self.base_ms + self.per_item_ms * batch_size

    def validate(self, inputs: Any) -> Any:
        _spin(self.prep_ms)
        return inputs

    def run(self, batch: list[Any]) -> list[Any]:
        if not (self.collate_ms or self.copy_ms):
            self._compute(len(batch))
            return list(batch)
        return stages.run_serially(self, batch)

    # The stages

    def collate(self, items: list[Any]) -> list[Any]:
        _spin(self.collate_ms)
        return list(items)

    def to_device(self, host: list[Any]) -> _Moving:
        if not self.copy_ms:
            return _Moving(host, 0.0, {"copy_in": 0.0})
        return _Moving(host, self._in.copy(self.copy_ms), {"copy_in": self.copy_ms})

    def forward(self, moving: _Moving) -> _Moving:
        _until(moving.done_at)  # the compute waits on its batch's copy, not on the host
        self._compute(len(moving.items))
        return _Moving(moving.items, time.monotonic())

    def to_host(self, computed: _Moving) -> _Moving:
        if not self.copy_ms:
            return _Moving(computed.items, 0.0, {"copy_out": 0.0})
        done_at = self._out.copy(self.copy_ms, after=computed.done_at)
        _until(done_at)  # the caller waits for its copy's completion
        return _Moving(computed.items, done_at, {"copy_out": self.copy_ms})

    def split(self, host: _Moving) -> list[Any]:
        return list(host.items)

    def _compute(self, size: int) -> None:
        cost_ms = self.cost_ms(size)
        if cost_ms > 0:  # sleep(0) would still yield the thread: a zero-cost model costs 0
            time.sleep(cost_ms / 1000)

    def __repr__(self) -> str:
        return (
            f"SimModel(base_ms={self.base_ms}, per_item_ms={self.per_item_ms}, "
            f"prep_ms={self.prep_ms}, collate_ms={self.collate_ms}, copy_ms={self.copy_ms})"
        )
