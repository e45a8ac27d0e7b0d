"""Host slots for a model's batches: two per direction, reused in turn, so no batch
allocates (or, on a GPU, pins) memory of its own once the slots have grown to fit.

A slot is a set of byte buffers, one per tensor, viewed as each batch's dtype and shape
and grown (doubling) when a batch needs more. A slot goes back to the pool with the
completion of whatever still reads it: on a GPU, the event of the copy that read it;
without one, the split of the batch's outputs (a model's outputs may be views of its
inputs). The next batch that takes the slot waits on that completion first, so a slot is
never written while it is read.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
from typing import Any, Protocol

import torch

log = logging.getLogger("tandem.models")

#: How long to wait for a slot before a batch takes memory of its own (a batch dropped
#: without releasing its slot, say, which the executor's finalizer frees anyway).
WAIT_S = 2.0


class Completion(Protocol):
    """What a slot waits on before it is written again: a torch.cuda.Event is one."""

    def synchronize(self) -> None: ...


class Slot:
    def __init__(self, pinned: bool) -> None:
        self.pinned = pinned
        self.buffers: list[torch.Tensor] = []
        self.reader: Completion | None = None  # what still reads it, if anything
        self.grown = 0  # how many times a buffer was (re)allocated

    def tensor(self, index: int, shape: list[int] | tuple[int, ...], dtype: torch.dtype):
        """A tensor of `shape` and `dtype` over buffer `index`, grown if too small."""
        size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        while len(self.buffers) <= index:
            self.buffers.append(torch.empty(0, dtype=torch.uint8))
        if self.buffers[index].numel() < size:
            wanted = max(size, 2 * self.buffers[index].numel(), 64)
            self.buffers[index] = torch.empty(wanted, dtype=torch.uint8, pin_memory=self.pinned)
            self.grown += 1
        return self.buffers[index][:size].view(dtype).view(list(shape))


class Slots:
    """A pool of slots: take() one, give it back() with what still reads it."""

    def __init__(self, count: int = 2, *, pinned: bool = False) -> None:
        self.all = [Slot(pinned) for _ in range(count)]
        self._free: queue.Queue[Slot] = queue.Queue()
        for slot in self.all:
            self._free.put(slot)
        self._lock = threading.Lock()
        self.spares = 0  # batches that found no slot free in WAIT_S

    def take(self) -> Slot:
        """A free slot, once what read it last is complete."""
        try:
            slot = self._free.get(timeout=WAIT_S)
        except queue.Empty:
            with self._lock:
                self.spares += 1
            log.warning("no host slot free in %.0f s: a batch takes memory of its own", WAIT_S)
            return Slot(self.all[0].pinned)
        reader, slot.reader = slot.reader, None
        if reader is not None:
            reader.synchronize()
        return slot

    def back(self, slot: Slot, reader: Completion | None = None) -> None:
        """The slot is free to take once `reader` completes (None: at once)."""
        if slot in self.all:
            slot.reader = reader
            self._free.put(slot)

    def releaser(self, slot: Slot, reader: Completion | None = None):
        """A callable that gives the slot back once, whenever it is called."""
        given = threading.Event()

        def release() -> None:
            if not given.is_set():
                given.set()
                self.back(slot, reader)

        return release


def map_tensors(value: Any, fn) -> Any:
    """value with fn applied to each tensor in it (a tensor, or a tuple, list or dict)."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, dict):
        return {k: map_tensors(v, fn) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [map_tensors(v, fn) for v in value]
    return value
