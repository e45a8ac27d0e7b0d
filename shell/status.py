"""`tandem status`: each executor, and each queue's depth."""

from __future__ import annotations

import redis
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table as RichTable

from tandem.broker import keys
from tandem.broker.table import Table


def snapshot(client: redis.Redis) -> dict:
    """Executors and queue depths as plain data."""
    table = Table(client)
    executors = table.executors()
    models = table.models()
    speeds = {m: table.speed(m) for m in models}
    return {
        "executors": [
            {
                "id": e.id,
                "model": e.model,
                "worker": e.worker,
                "state": e.state,
                "batches": e.batches,
                "tasks": e.tasks,
                "mean_batch": round(e.mean_batch, 2),
                "l2": e.l2_depth,
                "inflight": e.inflight_depth,
            }
            for e in executors
        ],
        "queues": [
            {
                "model": m,
                "queue": keys.l1(m),
                "l1": table.l1_depth(m),
                "retry": table.retry_depth(m),
                # Measured by the executors; None before their first batch.
                "capacity_rps": round(speeds[m].rate, 1) if speeds[m] else None,
                "predicted_wait_ms": (
                    round(speeds[m].wait_ms(table.ahead(m))) if speeds[m] else None
                ),
            }
            for m in models
        ],
        "poison": table.poisoned(),
        "dead_letters": table.dead_letters(),
    }


def tables(data: dict) -> Group:
    executors = RichTable(title="executors")
    for column in ("id", "model", "state", "batches", "tasks", "mean batch", "L2", "in-flight"):
        executors.add_column(column)
    for e in data["executors"]:
        executors.add_row(  # names come from users (--hostname): escaped, never markup
            escape(e["id"]),
            escape(e["model"]),
            e["state"],
            str(e["batches"]),
            str(e["tasks"]),
            str(e["mean_batch"]),
            str(e["l2"]),
            str(e["inflight"]),
        )
    queues = RichTable(title="first-level queues")
    for column in ("model", "queue", "L1", "retry", "tasks/s", "wait ms"):
        queues.add_column(column)
    for q in data["queues"]:
        known = [q["capacity_rps"], q["predicted_wait_ms"]]
        queues.add_row(
            escape(q["model"]),
            escape(q["queue"]),
            str(q["l1"]),
            str(q["retry"]),
            *("-" if v is None else str(v) for v in known),
        )
    dead = f"dead letters: {data['dead_letters']} (see `tandem dead`)"
    if data["poison"]:
        dead += f"; {data['poison']} poison tasks waiting for the coordinator to bury them"
    return Group(executors, queues, dead)


def render(client: redis.Redis, console: Console | None = None) -> dict:
    console = console or Console()
    data = snapshot(client)
    console.print(tables(data))
    return data


def watch_live(client: redis.Redis, interval_s: float = 1.0) -> None:
    """Redraw the tables every interval_s until Ctrl-C."""
    import time

    # Live is entered before the first read, so a Ctrl-C at any moment leaves through its
    # exit, which draws the last frame (on a pipe, the only one drawn).
    try:
        with Live("reading Redis...", refresh_per_second=4) as live:
            while True:
                live.update(tables(snapshot(client)))
                time.sleep(interval_s)  # the refresh interval
    except KeyboardInterrupt:
        pass
