"""The compute stage, on the executor's device thread: one forward pass over a batch's
inputs, bisected when it raises so that only the offending tasks fail. For a model with
stages only its forward pass runs here (workers/stages.py)."""

from __future__ import annotations

import time
import traceback
from typing import Any

from tandem.broker.errors import ModelError
from tandem.workers.models import Model
from tandem.workers.stages import InFlight, compute, finish, stage_in


def forward(model: Model, batch: list[Any]) -> tuple[list[Any], float, float | None]:
    """The outputs, the wall ms, and the model's own GPU ms (CUDA events), if it has one."""
    started = time.perf_counter()
    outputs = run_isolated(model, batch)
    wall_ms = (time.perf_counter() - started) * 1000
    return outputs, wall_ms, getattr(model, "last_device_ms", None)


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


def forward_serially(model: Model, inputs: list[Any]) -> tuple[list[Any], float, dict]:
    """A model with stages, staging off: every stage on the device thread, one after
    another, each timed; bisected as run_isolated if it raises. Returns the outputs, the
    wall ms, and the stages' times (empty if it was bisected)."""
    started = time.perf_counter()
    try:
        job = compute(model, stage_in(model, inputs))
        outputs = finish(model, job)
        if len(outputs) != len(inputs):
            raise ModelError(f"returned {len(outputs)} outputs for {len(inputs)} inputs")
    except Exception:  # noqa: BLE001 - isolated below, task by task
        outputs, job = run_isolated(model, inputs), None
    wall_ms = (time.perf_counter() - started) * 1000
    return outputs, wall_ms, job.times if job is not None else {}


def forward_staged(
    model: Model, staged: InFlight, inputs: list[Any]
) -> tuple[InFlight | None, list[Any] | None, float, float | None]:
    """The forward pass of a staged batch, its outputs left on the device for the
    returner to copy out and split: (the batch, None, wall ms, GPU ms). If it raises,
    the batch is run again serially, bisected (run_isolated): (None, outputs, ms, None)."""
    try:
        compute(model, staged)
    except Exception:  # noqa: BLE001 - isolated below, task by task
        staged.done()
        outputs, wall_ms, _ = forward(model, inputs)
        return None, outputs, wall_ms, None
    return staged, None, staged.times["compute"], staged.times.get("device")
