"""`tandem demo`: a local stack under a low and a high Poisson rate, with a report."""

from __future__ import annotations

from collections import Counter
from typing import Any

from rich.console import Console
from rich.table import Table as RichTable

from tandem.broker.settings import Settings
from tandem.producers.client import Client
from tandem.stack import Stack
from tandem.tools.harness import Recorder, arrivals, drive, percentile
from tandem.tools.samples import sampler

PHASES = ((20.0, 5.0), (1000.0, 5.0))  # (rate per second, seconds)
DRAIN_S = 30.0


def run_demo(
    settings: Settings,
    *,
    workers: int = 2,
    embedded: bool = True,
    phases=PHASES,
    console: Console | None = None,
) -> list[dict]:
    console = console or Console()
    model = settings.models[0]
    if model.endswith(":latest"):
        from tandem.workers.models.repository import Repository

        model = Repository(settings.repository or None).resolve(model)
    console.print(f"starting Redis, a coordinator and {workers} workers serving {model} ...")
    rows = []
    with Stack(settings, workers=workers, embedded=embedded) as stack:
        client = Client(settings=stack.settings)
        recorder = Recorder(stack.url)
        try:
            make = sampler(model, settings.repository)
            for n, (rate, seconds) in enumerate(phases):
                console.print(f"Poisson load: {rate:g} tasks/s for {seconds:g}s ...")
                rows.append(phase(client, recorder, stack, model, rate, seconds, make, n))
        finally:
            recorder.collect()
            client.close()
    console.print(report_table(rows, model))
    return rows


def phase(client, recorder, stack, model, rate, seconds, make, seed) -> dict[str, Any]:
    """One open-loop Poisson phase; each task timed from its scheduled arrival to its
    result, as a caller elsewhere receives it."""
    routes: Counter = Counter()
    tasks0, batches0 = counters(client, model)
    before = recorder.count.value

    def submit(batch: list, at: float) -> tuple[list[str], int]:
        results = [client.submit(model, inputs) for inputs in batch]
        routes.update(r.route for r in results)
        return [r.id for r in results], 0

    sent = drive(arrivals(rate, seconds, seed), submit, stack.check, make)
    recorder.wait(before + len(sent.due), DRAIN_S, stack.check)
    arrived = recorder.collect_so_far()
    tasks1, batches1 = counters(client, model)
    done = {t: arrived[t] for t in sent.due if t in arrived}
    latencies = [(a.at - sent.due[t]) * 1000 for t, a in done.items()]
    elapsed = max((a.at for a in done.values()), default=sent.began) - sent.began
    batches = batches1 - batches0
    return {
        "offered_rps": rate,
        "achieved_rps": round(len(done) / elapsed, 1) if elapsed > 0 else 0.0,
        "sent": len(sent.due),
        "done": len(done),
        "failed": sum(1 for a in done.values() if a.status != "SUCCESS"),
        "p50_ms": round(percentile(latencies, 50), 2),
        "p99_ms": round(percentile(latencies, 99), 2),
        "l2_share": round(routes["L2"] / len(sent.due), 3) if sent.due else 0.0,
        "mean_batch": round((tasks1 - tasks0) / batches, 2) if batches > 0 else 0.0,
    }


def counters(client: Client, model: str) -> tuple[int, int]:
    """(tasks, batches) summed over the model's live executors."""
    rows = client.table.executors(model)
    return sum(r.tasks for r in rows), sum(r.batches for r in rows)


COLUMNS = (
    ("offered_rps", "offered/s"),
    ("achieved_rps", "done/s"),
    ("sent", "sent"),
    ("failed", "failed"),
    ("p50_ms", "p50 ms"),
    ("p99_ms", "p99 ms"),
    ("l2_share", "via L2"),
    ("mean_batch", "mean batch"),
)


def report_table(rows: list[dict], model: str) -> RichTable:
    table = RichTable(title=f"tandem demo: {model}")
    for _, title in COLUMNS:
        table.add_column(title, justify="right")
    for row in rows:
        cells = [f"{row[key]:.0%}" if key == "l2_share" else str(row[key]) for key, _ in COLUMNS]
        table.add_row(*cells)
    return table
