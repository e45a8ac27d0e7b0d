"""`tandem bench`: tandem, plain Celery and celery-batches under the same open-loop load.

Each (system, rate) point gets a fresh Redis and fresh workers, the same model
cost and the same Poisson arrivals. Latency runs from each task's scheduled
arrival to its result as a producer sees it (the result channel), so a
producer falling behind shows as latency, not as a lower rate.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tandem.broker.settings import Settings
from tandem.tools import baselines, harness
from tandem.tools.harness import (
    Point,
    Recorder,
    Report,
    System,
    arrivals,
    percentile,
    point_folder,
)
from tandem.tools.plots import figure, save_figure
from tandem.tools.samples import sampler

WARMUP_TASKS = 20


@dataclass(frozen=True)
class Profile:
    name: str
    model: str
    rates: tuple[float, ...]
    quick_rates: tuple[float, ...]
    #: Settings the profile changes (the sim model's costs).
    settings: tuple[tuple[str, Any], ...] = ()


PROFILES = {
    "sim": Profile("sim", "sim:1", (10, 100, 300, 600, 1000, 1500, 1800, 2200), (10, 300, 1500)),
    "embed": Profile("embed", "minilm:1", (5, 20, 50, 100, 200, 300), (5, 50, 200)),
    # sim with a CPU-bound preparation per task, as tokenizing is: 0.3 ms a task.
    "prep": Profile(
        "prep",
        "sim:1",
        (10, 300, 1000, 1400, 1800, 2200),
        (10, 1000, 2200),
        (("sim_prep_ms", 0.3),),
    ),
}


def drive(point: Point, schedule: list[float], make: Callable[[int], Any]) -> dict[str, float]:
    """Submit at the scheduled times (open loop); late arrivals go out together."""
    return harness.drive(schedule, lambda batch, at: point.submit(batch), point.check, make).due


def run_point(
    system: System,
    settings: Settings,
    rate: float,
    seconds: float,
    *,
    workers: int,
    drain_s: float,
    seed: int = 1,
) -> dict[str, Any]:
    make = sampler(settings.models[0], settings.repository)
    with point_folder("tandem-bench-", f"bench point {system.name} at {rate:g}/s") as folder:
        point = Point(system, settings, workers, folder)
        try:
            recorder = Recorder(point.url)
            try:
                warm, _ = point.submit([make(n) for n in range(WARMUP_TASKS)])
                recorder.wait(len(warm), 60, point.check)
                tasks0, batches0 = point.counters(at_least=len(warm))
                due = drive(point, arrivals(rate, seconds, seed), make)
                send_end = max(due.values(), default=time.time())
                answered = recorder.wait(len(warm) + len(due), drain_s, point.check)
                tasks1, batches1 = point.counters(at_least=answered)
                point.stop_workers()
                queued = point.queued()
            finally:
                got = recorder.collect()
        finally:
            point.close()
    arrived = {t: got[t] for t in due if t in got}
    latencies = [(a.at - due[t]) * 1000 for t, a in arrived.items()]
    in_time = sum(1 for a in arrived.values() if a.at <= send_end)
    batches = batches1 - batches0
    return {
        "system": system.name,
        "offered_rps": rate,
        "achieved_rps": round(in_time / seconds, 1),
        "p50_ms": round(percentile(latencies, 50), 2),
        "p95_ms": round(percentile(latencies, 95), 2),
        "p99_ms": round(percentile(latencies, 99), 2),
        "mean_batch": round((tasks1 - tasks0) / batches, 2) if batches else 1.0,
        "lost": len(due) - len(arrived) - queued,
        "failed": sum(1 for a in arrived.values() if a.status != "SUCCESS"),
        "sent": len(due),
        "backlog": len(due) - in_time,
        "unfinished": queued,
    }


def limits(settings: Settings, workers: int) -> dict[str, float]:
    """The latency floor (compute of one item) and the throughput ceiling. With a
    preparation cost the ceiling is set by the slower stage of a pipelined executor."""
    if settings.models[0].startswith("sim:"):

        def cost(b: int) -> float:
            compute = settings.sim_base_ms + settings.sim_per_item_ms * b
            return (
                max(compute, settings.sim_prep_ms * b) if b > 1 else compute + settings.sim_prep_ms
            )

    else:
        compute = baselines.make_compute(settings)
        make = sampler(settings.models[0], settings.repository)

        def cost(b: int) -> float:
            batch = [make(n) for n in range(b)]
            compute(batch)
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                compute(batch)
                times.append((time.perf_counter() - t0) * 1000)
            return sorted(times)[2]

    return {
        "floor_ms": round(cost(1), 2),
        "ceiling_rps": round(workers * settings.max_batch / cost(settings.max_batch) * 1000, 1),
    }


def limit_row(limit: dict[str, float], max_batch: int) -> dict[str, Any]:
    floor = limit["floor_ms"]
    return {
        "system": "limit",
        "offered_rps": None,
        "achieved_rps": limit["ceiling_rps"],
        "p50_ms": floor,
        "p95_ms": floor,
        "p99_ms": floor,
        "mean_batch": max_batch,
        "lost": 0,
        "failed": 0,
        "sent": 0,
        "backlog": 0,
        "unfinished": 0,
    }


def plot(rows: list[dict[str, Any]], limit: dict[str, float], path: str, title: str) -> None:
    fig, (latency, throughput) = figure(2, height=4.8)
    measured = [r for r in rows if r["system"] != "limit"]
    for name in dict.fromkeys(r["system"] for r in measured):
        mine = sorted((r for r in measured if r["system"] == name), key=lambda r: r["offered_rps"])
        offered = [r["offered_rps"] for r in mine]
        latency.plot(offered, [r["p99_ms"] for r in mine], marker="o", label=name)
        throughput.plot(offered, [r["achieved_rps"] for r in mine], marker="o", label=name)
    latency.axhline(limit["floor_ms"], color="grey", linestyle="--", label="floor (1 item)")
    throughput.axhline(limit["ceiling_rps"], color="grey", linestyle="--", label="ceiling")
    offered = sorted({r["offered_rps"] for r in measured})
    throughput.plot(offered, offered, color="lightgrey", linestyle=":", label="offered")
    latency.set(
        xlabel="offered load (req/s)",
        ylabel="p99 latency (ms)",
        yscale="log",
        title="p99 latency",
        xscale="log",
    )
    throughput.set(
        xlabel="offered load (req/s)", ylabel="achieved (req/s)", title="throughput", xscale="log"
    )
    save_figure(fig, path, title)


COLUMNS = (
    "system",
    "offered_rps",
    "achieved_rps",
    "p50_ms",
    "p95_ms",
    "p99_ms",
    "mean_batch",
    "lost",
    "failed",
    "backlog",
)


def point_line(row: dict[str, Any]) -> str:
    """One measured point, as a line for a log."""
    return (
        f"{row['system']} at {row['offered_rps']:g}/s: {row['achieved_rps']:g} done/s, "
        f"p50 {row['p50_ms']} ms, p99 {row['p99_ms']} ms"
    )


def run_bench(
    settings: Settings,
    *,
    profile: Profile,
    systems: list[System],
    rates: tuple[float, ...],
    seconds: float,
    workers: int,
    drain_s: float,
    console,
) -> Report:
    from rich.progress import Progress

    settings = settings.replace(models=(profile.model,), max_wait_ms=0.0, **dict(profile.settings))
    limit = limits(settings, workers)
    rows = []
    with Progress(console=console, transient=True) as progress:
        bar = progress.add_task("bench", total=len(systems) * len(rates))
        for system in systems:
            for rate in rates:
                progress.update(bar, description=f"{system.name} at {rate:g}/s")
                row = run_point(system, settings, rate, seconds, workers=workers, drain_s=drain_s)
                rows.append(row)
                progress.advance(bar)
                if not console.is_terminal:  # no progress bar in a log or a pipe: a line
                    console.print(point_line(row))
    rows.append(limit_row(limit, settings.max_batch))
    title = (
        f"tandem bench, profile {profile.name}: {profile.model}, {workers} workers, "
        f"max batch {settings.max_batch}, {seconds:g}s per point"
    )
    report = Report(rows, draw=lambda path: plot(rows, limit, path, title))
    report.table(title, COLUMNS, rows, dim=lambda row: row["system"] == "limit")
    return report.line(
        f"floor = compute of 1 item = {limit['floor_ms']} ms; ceiling = {workers} "
        f"workers x {settings.max_batch} / cost({settings.max_batch}) = "
        f"{limit['ceiling_rps']} req/s. lost = sent - done - still queued; "
        "backlog = not done when the arrivals ended."
    )
