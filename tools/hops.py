"""The hop table of `tandem bench --profile latency`: where one task's time goes, from
the steps a producer and a worker note as they pass them (TANDEM_TEST_TRACE, in
broker/faults.py), one task at a time. The worker that notes them is started for this
alone, so the profile's other blocks time a worker that notes nothing."""

from __future__ import annotations

import os
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import redis

from tandem.broker import faults
from tandem.broker.settings import Settings
from tandem.producers.client import Client
from tandem.stack import spawn, stop_process, wait_for_executors

#: The steps each process notes, in the order it passes them, and what each is.
STEPS = {
    "producer": (
        ("route", "before", "the producer sends the route script"),
        ("route", "after", "the producer has the route script's reply"),
    ),
    "worker": (
        ("wait_l2", "after", "the worker's BLMOVE returns the task"),
        ("complete", "before", "the worker sends the store script"),
        ("complete", "after", "the worker has the store script's reply"),
    ),
}
#: Tasks sent before the timed ones, to warm the new worker.
WARM = 20
COLUMNS = ("step", "at_ms", "floor_at_ms", "tasks")


def measure_hops(
    client: Client,
    settings: Settings,
    folder: Path,
    admin: redis.Redis,
    model: str,
    *,
    tasks: int,
    spacing_ms: float,
) -> list[dict[str, Any]]:
    """Start a worker that notes its steps, send it WARM then `tasks` tasks one at a time,
    and stop it. The caller has stopped every other worker of the model. One row per
    step: the median ms from the call to submit, over the tasks where it was seen."""
    trace = folder / "steps"
    trace.mkdir(exist_ok=True)
    log = folder / "hops-worker.log"
    worker = spawn(["worker"], settings, log, env={faults.TRACE_ENV: str(trace)})
    own = client.table.faults
    timed: list[tuple[int, int, int]] = []  # (submit called, submit returned, result)
    try:
        wait_for_executors(admin, 1, 120, [worker])
        client.table.faults = faults.Faults(trace=str(trace))
        for n in range(WARM + tasks):
            start = time.monotonic_ns()
            result = client.submit(model, 1)
            submitted = time.monotonic_ns()
            result.get(timeout=5.0)
            if n >= WARM:
                timed.append((start, submitted, time.monotonic_ns()))
            time.sleep(spacing_ms / 1000)  # the spacing between tasks: the load itself
        client.table.faults.flush()
        notes = {"producer": _read(trace, os.getpid()), "worker": []}
        # The worker writes its notes out before it waits on L2 again, after each task.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            notes["worker"] = _read(trace, worker.pid)
            stored = sum(
                step == "complete" and when == "after" for _, step, when in notes["worker"]
            )
            if stored >= WARM + tasks:
                break
            worker.check()
            time.sleep(0.05)  # polling a file another process appends to, bounded
    finally:
        client.table.faults = own
        stop_process(worker, 30)
    return hop_rows(timed, notes)


def measure_floor_hops(
    send, dump, trace: Path, consumer, *, tasks: int, spacing_ms: float
) -> list[dict[str, Any]]:
    """The same table for the latency profile's floor path: send(noted) sends one task
    and notes (start, route sent, route's reply, result) in monotonic ns; its consumer
    process notes its steps and writes them to the trace folder once dump is set."""
    noted: list[tuple[int, int, int, int]] = []
    for _ in range(WARM + tasks):
        send(noted)
        time.sleep(spacing_ms / 1000)  # the spacing between tasks: the load itself
    dump.set()
    deadline = time.monotonic() + 10
    while dump.is_set() and time.monotonic() < deadline:
        time.sleep(0.05)  # the consumer clears it once written, within its 0.2 s poll
    if dump.is_set():
        raise RuntimeError("the floor's consumer did not write its steps within 10 s")
    producer = []
    for _, routing, sent, _ in noted:
        producer += [(routing, "route", "before"), (sent, "route", "after")]
    timed = [(start, sent, done) for start, _, sent, done in noted[WARM:]]
    return hop_rows(timed, {"producer": producer, "worker": _read(trace, consumer.pid)})


def side_by_side(tandem: list[dict[str, Any]], floor: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """tandem's rows, each with the floor's median for the same step (None if unseen)."""
    at = {row["step"]: row["at_ms"] for row in floor}
    return [{**row, "floor_at_ms": at.get(row["step"])} for row in tandem]


def hop_rows(
    timed: list[tuple[int, int, int]], notes: dict[str, list[tuple[int, str, str]]]
) -> list[dict[str, Any]]:
    """Each step's median offset (ms) from its task's submit, in path order. A task's
    steps are found in the order each process passes them, each the first of its kind
    after the one before (so a reply that comes after the next task's submit is still
    this task's), and before the next task has its result."""
    offsets: dict[str, list[float]] = defaultdict(list)
    for n, (start, submitted, done) in enumerate(timed):
        limit = timed[n + 1][2] if n + 1 < len(timed) else done + 5 * 10**9
        for process, noted in notes.items():
            after = start
            for step, when, label in STEPS[process]:
                found = next(
                    (at for at, s, w in noted if s == step and w == when and after <= at < limit),
                    None,
                )
                if found is None:
                    break
                offsets[label].append((found - start) / 1e6)
                after = found
        offsets["submit returns"].append((submitted - start) / 1e6)
        offsets["the producer has the result"].append((done - start) / 1e6)
    rows = [
        {"step": label, "at_ms": round(statistics.median(values), 3), "tasks": len(values)}
        for label, values in offsets.items()
    ]
    return sorted(rows, key=lambda row: row["at_ms"])


def _read(trace: Path, pid: int) -> list[tuple[int, str, str]]:
    """The steps process pid noted: (ns, step, when)."""
    path = trace / f"{pid}.steps"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        at, step, when = line.split()
        out.append((int(at), step, when))
    return out
