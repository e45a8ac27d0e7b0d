"""`tandem bench --profile overload`: goodput when more is offered than can be served.

Goodput is the tasks answered with SUCCESS within their deadline, per second. Every
task is sent with a deadline of its scheduled arrival plus the SLO. First tandem's
capacity is measured (a burst, no deadlines); then each system gets open-loop Poisson
arrivals at multiples of it, each point on a fresh Redis and fresh workers (as in
bench.py). For each point: goodput, the share of computed tasks that met their
deadline (the rest was device time spent for nobody), the tasks shed at submit
(Overloaded) and at claim (DeadlineExceeded, or Celery's REVOKED for an expired task),
and the latency of the tasks served.

Results are recorded by a process of their own (harness.Recorder), as a caller
elsewhere would receive them: the producer's CPU (it sends up to 7,000 tasks a second
here) never delays what is recorded.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

from tandem.broker.settings import Settings
from tandem.tools import harness, shed
from tandem.tools.harness import (
    SYSTEMS,
    Point,
    Recorder,
    Report,
    System,
    arrivals,
    burst_rate,
    percentile,
    point_folder,
)
from tandem.tools.plots import figure, save_figure
from tandem.tools.samples import sampler

MODEL = "sim:1"
LOADS = (0.5, 1.0, 2.0, 4.0)
SLOS_MS = (100.0, 250.0)
DEFAULT_SYSTEMS = ("tandem", "tandem/no-deadline", "celery-batches/10ms", "celery-plain")
QUICK_SYSTEMS = ("tandem", "tandem/no-deadline")
#: Tasks of the capacity burst, and of the warm-up before each point (two full batches
#: per worker and a few alone, so the latency model has seen small and large batches).
CAPACITY_TASKS = 6000
WARMUP_BURST = 128
WARMUP_SINGLES = 8


def drive(point: Point, schedule: list[float], slo_ms: float) -> harness.Sent:
    """Open-loop arrivals, each group due by its earliest arrival plus the SLO."""
    make = sampler(MODEL, "")
    return harness.drive(
        schedule, lambda batch, at: point.submit(batch, at + slo_ms / 1000), point.check, make
    )


def _warm(point: Point, recorder: Recorder) -> None:
    """Bursts and singles, so that tandem's latency model has seen large and small
    batches before the load starts (and every system has run a batch)."""
    make = sampler(MODEL, "")
    sent, _ = point.submit([make(n) for n in range(WARMUP_BURST)])
    recorder.wait(len(sent), 60, point.check)
    for n in range(WARMUP_SINGLES):
        sent += point.submit([make(n)])[0]
        recorder.wait(len(sent), 10, point.check)


def measure_capacity(settings: Settings, workers: int, folder: Path) -> float:
    """tandem's throughput at saturation, tasks/s: a burst with no deadlines, timed between
    the 10th and the 90th percentile of its results' arrivals."""
    point = Point(SYSTEMS["tandem"], settings, workers, folder)
    try:
        recorder = Recorder(point.url)
        try:
            _warm(point, recorder)
            warm = recorder.count.value
            make = sampler(MODEL, "")
            ids, _ = point.submit([make(n) for n in range(CAPACITY_TASKS)])
            recorder.wait(warm + len(ids), 120, point.check)
        finally:
            arrived = recorder.collect()
    finally:
        point.close()
    return burst_rate([arrived[t].at for t in ids if t in arrived])


def run_point(
    system: System,
    settings: Settings,
    *,
    load: float,
    capacity: float,
    slo_ms: float,
    seconds: float,
    workers: int,
    drain_s: float,
) -> dict[str, Any]:
    rate = load * capacity
    what = f"overload point {system.name} at {load:g}x"
    with point_folder("tandem-overload-", what) as folder:
        point = Point(system, settings, workers, folder)
        try:
            recorder = Recorder(point.url)
            try:
                _warm(point, recorder)
                warm = recorder.count.value
                sent = drive(point, arrivals(rate, seconds, 1), slo_ms)
                recorder.wait(warm + len(sent.due), drain_s + slo_ms / 1000, point.check)
                point.stop_workers()
                queued = point.queued()
            finally:
                arrived = recorder.collect()
        finally:
            point.close()
    refused = len(sent.refused)
    row = _row(system, load, capacity, slo_ms, seconds, sent.due, refused, arrived, queued)
    row["behind_p50_ms"] = round(percentile(sent.behind_ms, 50), 1)
    row["behind_p99_ms"] = round(percentile(sent.behind_ms, 99), 1)
    return row


def _row(system, load, capacity, slo_ms, seconds, due, refused, arrived, queued) -> dict[str, Any]:
    good: list[float] = []
    late: list[float] = []
    shed = failed = 0
    for task_id, at in due.items():
        got = arrived.get(task_id)
        if got is None:
            continue
        latency = (got.at - at) * 1000
        if got.status == "SUCCESS":
            (good if latency <= slo_ms else late).append(latency)
        elif got.status == "REVOKED" or got.error == "DeadlineExceeded":
            shed += 1
        else:
            failed += 1
    computed = len(good) + len(late)
    served = good + late
    sent = len(due) + refused
    return {
        "system": system.name,
        "slo_ms": slo_ms,
        "load": load,
        "offered_rps": round(load * capacity, 1),
        "capacity_rps": capacity,
        "goodput_rps": round(len(good) / seconds, 1),
        "goodput_share": round(len(good) / seconds / capacity, 3),
        "met_share": round(len(good) / computed, 4) if computed else None,
        "computed": computed,
        "late": len(late),
        "shed_submit": refused,
        "shed_claim": shed,
        "failed": failed,
        "p50_ms": round(percentile(served, 50), 1),
        "p99_ms": round(percentile(served, 99), 1),
        "sent": sent,
        "unfinished": queued,
        "lost": len(due) - sum(1 for t in due if t in arrived) - queued,
    }


def run_overload(
    settings: Settings,
    *,
    systems: list[System],
    loads: tuple[float, ...],
    slos_ms: tuple[float, ...],
    seconds: float,
    workers: int,
    drain_s: float,
    progress=None,
) -> list[dict[str, Any]]:
    settings = settings.replace(models=(MODEL,), max_wait_ms=0.0)
    # A producer that falls behind sends Celery tasks whose expires has passed: Celery
    # warns once per task, which would slow the producer it measures.
    logging.getLogger("celery.app.base").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="tandem-capacity-") as folder:
        capacity = measure_capacity(settings, workers, Path(folder))
    rows = []
    for slo_ms in slos_ms:
        for system in systems:
            for load in loads:
                if progress:
                    progress(f"{system.name}, SLO {slo_ms:g} ms, {load:g}x of {capacity:g}/s")
                rows.append(
                    run_point(
                        system,
                        settings,
                        load=load,
                        capacity=capacity,
                        slo_ms=slo_ms,
                        seconds=seconds,
                        workers=workers,
                        drain_s=drain_s,
                    )
                )
    return rows


COLUMNS = (
    "system",
    "slo_ms",
    "load",
    "offered_rps",
    "goodput_rps",
    "goodput_share",
    "met_share",
    "shed_submit",
    "shed_claim",
    "late",
    "p50_ms",
    "p99_ms",
    "behind_p99_ms",
    "lost",
)


def plot(rows: list[dict[str, Any]], path: str, title: str) -> None:
    slos = sorted({r["slo_ms"] for r in rows})
    fig, axes = figure(len(slos))
    for axis, slo in zip(axes, slos, strict=True):
        mine = [r for r in rows if r["slo_ms"] == slo]
        capacity = mine[0]["capacity_rps"]
        for name in dict.fromkeys(r["system"] for r in mine):
            points = sorted((r for r in mine if r["system"] == name), key=lambda r: r["load"])
            axis.plot(
                [r["offered_rps"] for r in points],
                [r["goodput_rps"] for r in points],
                marker="o",
                label=name,
            )
        offered = sorted({r["offered_rps"] for r in mine})
        axis.plot(offered, offered, color="lightgrey", linestyle=":", label="offered")
        axis.axhline(capacity, color="grey", linestyle="--", label="capacity (measured)")
        axis.axhline(
            0.9 * capacity, color="grey", linestyle=":", linewidth=0.8, label="90 % of capacity"
        )
        axis.set(
            xlabel="offered load (req/s)",
            ylabel="goodput (SUCCESS within the SLO, req/s)",
            title=f"SLO {slo:g} ms",
            ylim=(0, capacity * 1.25),
        )
    save_figure(fig, path, title)


def report(
    settings: Settings,
    *,
    quick: bool,
    systems: list[System] | None,
    loads: tuple[float, ...] | None,
    slos_ms: tuple[float, ...] | None,
    seconds: float | None,
    shed_tasks: int | None,
    workers: int,
    progress,
) -> Report:
    """The profile: every system at every load and SLO, then the cost of shedding."""
    names = QUICK_SYSTEMS if quick else DEFAULT_SYSTEMS
    systems = systems or [SYSTEMS[name] for name in names]
    seconds = seconds or (4.0 if quick else 8.0)
    rows = run_overload(
        settings,
        systems=systems,
        loads=loads or ((0.5, 2.0, 4.0) if quick else LOADS),
        slos_ms=slos_ms or ((250.0,) if quick else SLOS_MS),
        seconds=seconds,
        workers=workers,
        drain_s=5.0,
        progress=progress,
    )
    title = (
        f"tandem bench, profile overload: {MODEL}, {workers} workers, "
        f"{seconds:g}s per point, capacity {rows[0]['capacity_rps']:g} req/s (measured)"
    )
    shed_tasks = (5000 if quick else 20000) if shed_tasks is None else shed_tasks
    costs = shed.measure(settings, shed_tasks) if shed_tasks > 0 else []
    out = Report({"points": rows, "shed_cost": costs}, draw=lambda path: plot(rows, path, title))
    out.table(title, COLUMNS, rows)
    out.line(
        "goodput = SUCCESS within the SLO of its scheduled arrival, per second; met share = "
        "goodput over all computed; shed submit = Overloaded; shed claim = DeadlineExceeded "
        "(Celery: REVOKED, expired); late = computed after the deadline."
    )
    if costs:
        out.table(shed.TITLE, shed.COLUMNS, costs)
    return out
