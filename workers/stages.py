"""A model's work split into stages, so that only the forward pass runs on the device
thread: the patent's pair of second-level sets, carried to the device.

A model may offer, besides validate and run (workers/models Staged):

    collate(items) -> host batch      the executor thread, while the batch before computes
    to_device(host) -> device batch   issued there too: on a GPU, a copy on a stream of its own
    forward(device) -> outputs        the device thread, and nothing else
    to_host(outputs) -> host outputs  the returner thread: on a GPU, a copy on another stream
    split(host outputs) -> results    the returner thread, one JSON-ready result per task

A model that offers only run() runs as before: all of it on the device thread. Each stage
is timed; a model that measures a stage itself (CUDA events) reports it in its batch's
`times`, which wins over the wall time taken here.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field
from typing import Any

#: The stages, in order; each batch's times are reported by these names (ms).
NAMES = ("collate", "copy_in", "compute", "copy_out", "split")


STAGE_METHODS = ("collate", "to_device", "forward", "to_host", "split")


def staged(model: Any) -> bool:
    """Whether the model offers every stage, and its run() is theirs: a subclass that
    defines a run() of its own (over a model with stages) means that run to be called."""
    if not all(callable(getattr(model, name, None)) for name in STAGE_METHODS):
        return False
    mro = type(model).__mro__

    def owner(name: str) -> int:  # how far down the class tree `name` is defined
        return next((n for n, cls in enumerate(mro) if name in vars(cls)), len(mro))

    return owner("run") >= min(owner(name) for name in STAGE_METHODS)


@dataclass
class InFlight:
    """One batch between its stages: its device batch, then its outputs, and its times.
    `key` names the tasks it was staged from, so a batch whose tasks changed before its
    compute (a revoke, a top-up) is staged again."""

    size: int
    key: tuple = ()
    device: Any = None
    outputs: Any = None
    times: dict[str, float] = field(default_factory=dict)
    _release: Any = None

    def hold(self, release: Any) -> None:
        """Call release once its results are split or it is dropped, whichever comes
        first: the model frees what the batch held, such as its host slot."""
        if release is not None:
            self._release = weakref.finalize(self, release)

    def done(self) -> None:
        if self._release is not None:
            self._release()  # a finalizer runs once


def stage_in(model: Any, items: list[Any], key: tuple = ()) -> InFlight:
    """Collate the items and issue their copy to the device (executor thread)."""
    batch = InFlight(len(items), key)
    started = time.perf_counter()
    host = model.collate(items)
    collated = time.perf_counter()
    batch.device = model.to_device(host)
    issued = time.perf_counter()
    batch.hold(getattr(batch.device, "release", None))
    own = getattr(batch.device, "times", None) or {}
    batch.times["collate"] = own.get("collate", (collated - started) * 1000)
    batch.times["copy_in"] = own.get("copy_in", (issued - collated) * 1000)
    return batch


def compute(model: Any, batch: InFlight) -> InFlight:
    """The forward pass (device thread)."""
    started = time.perf_counter()
    batch.outputs = model.forward(batch.device)
    batch.times["compute"] = (time.perf_counter() - started) * 1000
    own = getattr(batch.outputs, "times", None) or {}
    if "device" in own:  # the forward pass's GPU time, by CUDA events
        batch.times["device"] = own["device"]
    return batch


def finish(model: Any, batch: InFlight) -> list[Any]:
    """Copy the outputs back and split them into each task's result (returner thread);
    the batch's hold on the model's buffers ends here, whatever happens."""
    try:
        started = time.perf_counter()
        host = model.to_host(batch.outputs)
        copied = time.perf_counter()
        results = model.split(host)
        ended = time.perf_counter()
    finally:
        batch.done()
    own = getattr(host, "times", None) or {}
    batch.times.update({k: v for k, v in own.items() if k in NAMES})
    batch.times.setdefault("copy_out", (copied - started) * 1000)
    batch.times["split"] = (ended - copied) * 1000
    return results


def run_serially(model: Any, items: list[Any]) -> list[Any]:
    """Every stage one after another on the calling thread: a model's run()."""
    return finish(model, compute(model, stage_in(model, items)))
