"""An executor's state (docs/design.md, "Executor states"), its row in the executor
table as readers see it, and the speed it publishes (its latency model)."""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

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


#: What the changes stream records when an executor leaves the table (reclaim.lua).
GONE = "GONE"
#: Every state change an executor may make, as the scripts and the executor write them
#: to the changes stream: from -> the states it may go to. An executor registers WORKING;
#: the coordinator may reclaim it from any state (GONE), and one still alive registers
#: again. tests/test_scripts.py checks the stream of a run against this table.
TRANSITIONS: dict[str, frozenset[str]] = {
    State.IDLE: frozenset({State.WAITING, State.WORKING, State.STOPPING, GONE}),
    State.WAITING: frozenset({State.WORKING, State.STOPPING, GONE}),
    State.WORKING: frozenset({State.IDLE, State.STOPPING, GONE}),
    State.STOPPING: frozenset({GONE}),
    GONE: frozenset({State.WORKING}),
}


@dataclass(eq=False)
class Batch(Sequence):
    """Messages an executor holds in its in-flight list, to compute together. A sequence
    of the raw messages (so `len`, `in`, indexing and comparing with a list work), with
    what the executor needs to know about them declared:

    - `redelivered`: it is one task from the retry list, taken alone, which may be what
      killed an executor before (the executor computes it with nothing else in flight);
    - `tasks`: the decoded, checked tasks, when it was prepared while the previous batch
      computed (the pipeline); None when it still has to be prepared;
    - `staged`: its live tasks collated and on their way to the device (a model with
      stages, workers/stages.py), or None;
    - `revokes_checked`: when (time.monotonic()) its tasks were last checked against
      Redis's revocation records, if that was done just before the previous batch's
      compute ended, or None."""

    raw: list[bytes] = field(default_factory=list)
    redelivered: bool = False
    tasks: list | None = None
    staged: Any = None
    revokes_checked: float | None = None

    def __getitem__(self, index):
        return self.raw[index]

    def __len__(self) -> int:
        return len(self.raw)

    def __iter__(self):
        return iter(self.raw)  # Sequence's own iterates in Python, by index

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Batch):
            return self.raw == other.raw and self.redelivered == other.redelivered
        return isinstance(other, list) and self.raw == other

    def __add__(self, more: Sequence[bytes]) -> Batch:
        """These messages and then more, as one batch (redelivered only if both are)."""
        both = getattr(more, "redelivered", False) and self.redelivered
        return Batch([*self.raw, *more], redelivered=both)

    @classmethod
    def claimed(cls, reply: list) -> Batch:
        """A claim script's reply: [redelivered flag, message, ...] (_lib.lua claimed)."""
        return cls(list(reply[1:]), redelivered=bool(reply[0]))


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
    #: Its latency model as last published (0 until its first batch, or deadline-aware
    #: off): compute_ms(n) = base_ms + per_item_ms x n, margin_ms the tail above it.
    base_ms: float = 0.0
    per_item_ms: float = 0.0
    margin_ms: float = 0.0
    rate: float = 0.0  # tasks/s at full batches
    lag_ms: float = 0.0  # from a claim to the stored result
    extra_ms: float = 0.0  # more, when claimed early into a batch that waits (pipeline)

    @property
    def mean_batch(self) -> float:
        return self.tasks / self.batches if self.batches else 0.0

    @classmethod
    def from_hash(
        cls, executor_id: str, h: dict, l2_depth: int, inflight_depth: int
    ) -> ExecutorInfo:
        """From the executor's hash as HGETALL returns it (bytes). Total: a missing field, or
        one that is not a number (or not UTF-8), reads as 0 (or with U+FFFD)."""

        def get(name: str) -> str:
            return h.get(name.encode(), b"").decode(errors="replace")

        def num(name: str) -> int:
            return int(_finite(h.get(name.encode())))

        def real(name: str) -> float:
            return _finite(h.get(name.encode()))

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
            base_ms=real("base_ms"),
            per_item_ms=real("per_item_ms"),
            margin_ms=real("margin_ms"),
            rate=real("rate"),
            lag_ms=real("lag_ms"),
            extra_ms=real("extra_ms"),
        )


@dataclass(frozen=True)
class Speed:
    """What an executor publishes of its latency model. Units are in the names; rate is
    tasks per second at full batches, lag_ms the time from a claim from L1 to the stored
    result, extra_ms what a task claimed early (the pipeline) waits more: the compute in
    hand."""

    base_ms: float
    per_item_ms: float
    margin_ms: float
    rate: float
    lag_ms: float
    max_batch: int
    extra_ms: float = 0.0

    def close_to(self, other: Speed | None, tolerance: float = 0.02, ms: float = 0.5) -> bool:
        """Within `tolerance` (relative) of other in rate, lag and extra, or within `ms`
        in lag, extra and a full batch's cycle: not worth republishing."""
        if other is None:
            return False
        cycles = [self.max_batch * 1000 / max(s.rate, 1e-9) for s in (self, other)]
        near = (
            (self.lag_ms, other.lag_ms),
            (self.extra_ms, other.extra_ms),
            (cycles[0], cycles[1]),
        )
        if all(abs(a - b) <= ms for a, b in near):
            return True
        return all(
            abs(a - b) <= tolerance * max(abs(b), 1e-9)
            for a, b in (
                (self.rate, other.rate),
                (self.lag_ms, other.lag_ms),
                (self.extra_ms, other.extra_ms),
            )
        )


@dataclass(frozen=True)
class ModelSpeed:
    """A model's speed over its live executors (keys.speed), as route.lua reads it: rate
    in tasks/s; lag_ms, extra_ms and batch the rate-weighted means of their lags, extra
    waits and max batches; held, the tasks their batches claimed early hold at most."""

    rate: float
    lag_ms: float
    extra_ms: float
    batch: float
    held: int

    @classmethod
    def from_hash(cls, h: dict) -> ModelSpeed | None:
        """From HGETALL of the speed hash; None while no executor has published a rate."""
        rate = _finite(h.get(b"rate"))
        if rate <= 1e-6:
            return None
        return cls(
            rate=rate,
            lag_ms=_finite(h.get(b"rate_lag")) / rate,
            extra_ms=_finite(h.get(b"rate_extra")) / rate,
            batch=_finite(h.get(b"rate_batch")) / rate,
            held=max(int(_finite(h.get(b"batches"))), 1),
        )

    def wait_ms(self, ahead: int) -> float:
        """The predicted time from a submit into L1 to its result, with `ahead` tasks
        before it: route.lua's formula. A claim comes after half a batch, on average; a
        task waits for the computes in hand too once the batches claimed early are full,
        as they surely are with `held` tasks ahead."""
        full = min(1.0, ahead / self.held)
        return (ahead + self.batch / 2) * 1000 / self.rate + self.lag_ms + self.extra_ms * full


def _finite(raw: bytes | None) -> float:
    """A number a script wrote, or 0.0 for one missing or not a finite number."""
    try:
        value = float(raw) if raw is not None else 0.0
    except ValueError:
        return 0.0
    return value if math.isfinite(value) else 0.0
