"""`tandem demo`: a local stack under a low and a high Poisson rate, with a report."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table as RichTable

from tandem.broker.settings import Settings
from tandem.producers.client import Client
from tandem.stack import Stack
from tandem.tools.load import ResultWatcher, poisson, summary
from tandem.tools.samples import sampler

PHASES = ((20.0, 5.0), (1000.0, 5.0))  # (rate per second, seconds)


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
        watcher = ResultWatcher(client)
        try:
            make_inputs = sampler(model, settings.repository)
            for rate, seconds in phases:
                console.print(f"Poisson load: {rate:g} tasks/s for {seconds:g}s ...")
                report = poisson(
                    client,
                    watcher,
                    model,
                    rate,
                    seconds,
                    make_inputs=make_inputs,
                    check=stack.check,
                )
                rows.append(summary(report))
        finally:
            watcher.close()
            client.close()
    console.print(report_table(rows, model))
    return rows


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
