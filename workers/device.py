"""The compute stage, on the executor's device thread: one forward pass over a batch's
inputs, bisected when it raises so that only the offending tasks fail. For a model with
stages only its forward pass runs here (workers/stages.py)."""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from tandem.broker.errors import ModelError
from tandem.workers.models import Model
from tandem.workers.stages import InFlight, compute, finish, stage_in


@dataclass
class Pass:
    """A batch's forward pass, as the executor hears of it."""

    outputs: list[Any] | None  # one per task (a ModelError where it failed); None if staged
    wall_ms: float
    device_ms: float | None = None  # the model's own GPU time (CUDA events), if measured
    staged: InFlight | None = None  # a staged batch: its outputs are still to split
    times: dict[str, float] = field(default_factory=dict)  # each stage's ms, where timed


def forward(model: Model, batch: list[Any]) -> Pass:
    """run() on the batch, bisected if it raises (run_isolated)."""
    started = time.perf_counter()
    outputs = run_isolated(model, batch)
    wall_ms = (time.perf_counter() - started) * 1000
    return Pass(outputs, wall_ms, getattr(model, "last_device_ms", None))


def run_isolated(model: Model, batch: list[Any]) -> list[Any]:
    """Run one forward pass; if it raises, bisect so only the offending tasks fail."""
    try:
        outputs = model.run(batch)
        if len(outputs) != len(batch):
            raise ModelError(f"returned {len(outputs)} outputs for {len(batch)} inputs")
    except Exception as e:  # noqa: BLE001 - any model failure is isolated, not fatal
        if len(batch) == 1:
            error = ModelError(f"model raised {type(e).__name__}: {e}")
            error.traceback = "".join(traceback.format_exception(e))
            return [error]
        mid = len(batch) // 2
        return run_isolated(model, batch[:mid]) + run_isolated(model, batch[mid:])
    return outputs


def forward_serially(model: Model, inputs: list[Any]) -> Pass:
    """A model with stages, staging off: every stage on the device thread, one after
    another, each timed; bisected as run_isolated if it raises (then untimed)."""
    started = time.perf_counter()
    try:
        job = compute(model, stage_in(model, inputs))
        outputs = finish(model, job)
        if len(outputs) != len(inputs):
            raise ModelError(f"returned {len(outputs)} outputs for {len(inputs)} inputs")
    except Exception:  # noqa: BLE001 - isolated below, task by task
        outputs, job = run_isolated(model, inputs), None
    wall_ms = (time.perf_counter() - started) * 1000
    return Pass(outputs, wall_ms, times=job.times if job is not None else {})


def forward_staged(model: Model, staged: InFlight, inputs: list[Any]) -> Pass:
    """The forward pass of a staged batch, its outputs left on the device for the
    returner to copy out and split. If it raises, the batch is run again serially,
    bisected (run_isolated)."""
    try:
        compute(model, staged)
    except Exception:  # noqa: BLE001 - isolated below, task by task
        staged.done()
        return forward(model, inputs)
    times = staged.times
    return Pass(None, times["compute"], times.get("device"), staged=staged)
