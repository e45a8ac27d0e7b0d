"""An executor's state (docs/design.md, "Executor states"), its row in the executor
table as readers see it, and the speed it publishes (its latency model)."""

from __future__ import annotations

import sys
from dataclasses import dataclass

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover
    from enum import Enum

    class StrEnum(str, Enum):
        pass


class State(StrEnum):
    IDLE = "IDLE"  # L2 open; nothing held
    WAITING = "WAITING"  # L2 open; a batch fills until full or max_wait_ms
    WORKING = "WORKING"  # computing; L2 closed
    STOPPING = "STOPPING"  # finishing the batch in hand; L2 closed


@dataclass(frozen=True)
class ExecutorInfo:
    """One row of the executor table, with its queue depths."""

    id: str
    model: str
    worker: str
    state: str
    room: int  # how many more tasks its L2 takes now (the hash field `cap`)
    max_batch: int
    expires_ms: int
    batches: int
    tasks: int
    l2_depth: int
    inflight_depth: int

    @property
    def mean_batch(self) -> float:
        return self.tasks / self.batches if self.batches else 0.0

    @classmethod
    def from_hash(
        cls, executor_id: str, h: dict, l2_depth: int, inflight_depth: int
    ) -> ExecutorInfo:
        """From the executor's hash as HGETALL returns it (bytes); a missing number is 0."""

        def get(name: str) -> str:
            return h.get(name.encode(), b"").decode()

        def num(name: str) -> int:
            return int(float(get(name) or 0))

        return cls(
            id=executor_id,
            model=get("model"),
            worker=get("worker"),
            state=get("state"),
            room=num("cap"),
            max_batch=num("max_batch"),
            expires_ms=num("expires_ms"),
            batches=num("batches"),
            tasks=num("tasks"),
            l2_depth=l2_depth,
            inflight_depth=inflight_depth,
        )


@dataclass(frozen=True)
class Speed:
    """What an executor publishes of its latency model. Units are in the names; rate is
    tasks per second at full batches, lag_ms the time from a claim from L1 under load to
    the stored result."""

    base_ms: float
    per_item_ms: float
    margin_ms: float
    rate: float
    lag_ms: float
    max_batch: int

    def close_to(self, other: Speed | None, tolerance: float = 0.02) -> bool:
        """Within `tolerance` (relative) of other in rate and lag: not worth republishing."""
        if other is None:
            return False
        return all(
            abs(a - b) <= tolerance * max(abs(b), 1e-9)
            for a, b in ((self.rate, other.rate), (self.lag_ms, other.lag_ms))
        )
