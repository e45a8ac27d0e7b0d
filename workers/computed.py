"""A computed batch, as the executor hands it to its returner and the returner to the
hooks (logs, metrics, Celery events)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tandem.broker import message


@dataclass
class Computed:
    """A batch's tasks and outputs (by index; a task with an error has none), waiting in
    the return slot. Times are epoch seconds."""

    tasks: list[message.Task]
    outputs: dict[int, Any]
    claimed_at: float = 0.0
    started_at: float = 0.0
    compute_ms: float = 0.0
    stored_at: float = 0.0  # when its results were sent to Redis
    store_ended_at: float = 0.0  # when Redis had them
    #: The forward pass's time on the GPU (CUDA events), when the model measures it.
    device_ms: float | None = None
    #: Its results are stored already (Returner.store_now, at low load): what is left is
    #: its bookkeeping (count.lua), the canvas's next steps and the hooks.
    results_out: bool = False
    #: Its store took effect (a task of it was in in-flight, or a result stored anew), so
    #: its bookkeeping is owed; False for a retry or a batch answered already.
    counts: bool = True
    #: A staged batch whose outputs are still to be copied out and split, with the
    #: indices of the tasks computed (workers/stages.py); None once they are outputs.
    pending: Any = None
    #: Each stage's time, ms (workers/stages.py NAMES), as far as the batch had them.
    stages: dict[str, float] = field(default_factory=dict)
