"""The metrics schema: what executors record in Redis per batch, and how.

Each model has one hash, keys.metrics(model), with counters that only grow:
``route:L1`` and ``route:L2`` (route.lua), ``shed:submit`` (tasks route.lua refused as
Overloaded), ``refused:full`` (refused as QueueFull), ``stored`` (tasks answered, added
by complete.lua with their results), and from each batch (the counters the executor's
hooks give, sent by count.lua after the results, several batches at a time)
``outcome:SUCCESS|FAILURE``, ``failure:<reason>`` (``failure:DeadlineExceeded`` counts the
tasks shed at claim), ``deadline:met`` (successes stored by their deadline, or with none:
the goodput), ``deadline:missed`` (successes stored after it), and per histogram
``<name>:<bucket>`` (non-cumulative), ``<name>:sum`` and ``<name>:count``. A model with
stages (workers/stages.py) adds one histogram per host stage; ``compute_ms`` is then its
forward pass alone, and its sum over time the device's busy time. The coordinator's
exporter serves them to Prometheus.
"""

from __future__ import annotations

import bisect
from collections import Counter

HISTOGRAMS = {
    "batch_size": (1, 2, 4, 8, 16, 32, 64, 128, 256),
    "compute_ms": (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000),
    "device_ms": (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000),
    **{
        f"{stage}_ms": (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
        for stage in ("collate", "copy_in", "copy_out", "split")
    },
    "queue_wait_ms": (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000),
    "latency_ms": (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000),
}
HELP = {
    "batch_size": "Tasks per computed batch.",
    "compute_ms": "Wall time of one batch's forward pass, in milliseconds.",
    "device_ms": "GPU time of one batch's forward pass (CUDA events), in milliseconds.",
    "collate_ms": "Time to stack and pad one batch's inputs into its host slot, in milliseconds.",
    "copy_in_ms": "Time of one batch's copy to the device, in milliseconds.",
    "copy_out_ms": "Time of one batch's outputs' copy back to the host, in milliseconds.",
    "split_ms": "Time to split one batch's outputs into each task's result, in milliseconds.",
    "queue_wait_ms": "Time from submit to the claim that put a task in a batch, in milliseconds.",
    "latency_ms": "Time from submit to the stored result, in milliseconds.",
}
#: Counters of keys.STATS, kept by the scripts.
STATS = {
    "redelivered": "Tasks handed back from an executor's in-flight list.",
    "duplicates": "Second results of a redelivered task, dropped.",
    "poisoned": "Tasks that reached max_deliveries.",
    "dead_lettered": "Dead letters written (poison tasks and messages without an id).",
    "registrations": "Executor registrations: starts, restarts in place, re-registrations.",
}


def observe(counts: Counter, name: str, value: float) -> None:
    """Add one observation of histogram `name` to a batch's counters."""
    bounds = HISTOGRAMS[name]
    index = bisect.bisect_left(bounds, value)
    counts[f"{name}:{bounds[index] if index < len(bounds) else '+Inf'}"] += 1
    counts[f"{name}:sum"] += value  # type: ignore[assignment]  # a Counter sums floats too
    counts[f"{name}:count"] += 1
