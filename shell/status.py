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
    now_ms = table.now_ms()
    live = {m: sum(e.model == m and e.expires_ms > now_ms for e in executors) for m in models}
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
                # 0: nothing computes its tasks; those with a deadline are refused.
                "live_executors": live[m],
                # The coordinator's scaling signal (coordinator/scaling.py); None before.
                **scaling(table.scale(m)),
                # Measured by the executors; None before their first batch.
                "capacity_rps": round(speed.rate, 1) if (speed := speeds[m]) else None,
                "predicted_wait_ms": round(speed.wait_ms(table.ahead(m))) if speed else None,
                **device(table.counters(m), table.scale(m)),
            }
            for m in models
        ],
        "poison": table.poisoned(),
        "dead_letters": table.dead_letters(),
    }


def scaling(published: dict[str, float]) -> dict:
    """The scaling signal's figures as status shows them; None where not published."""
    offered, capacity = published.get("offered_rps"), published.get("capacity_rps")
    wanted = published.get("wanted")
    return {
        "offered_rps": None if offered is None else round(offered, 1),
        "capacity_per_executor_rps": round(capacity, 1) if capacity else None,
        "executors_wanted": None if wanted is None else int(wanted),
    }


def device(counters: dict[str, float], published: dict[str, float]) -> dict:
    """Each stage's mean time per batch so far, ms (workers/stages.py; a model without
    stages has compute alone), and the devices' busy share; None where unmeasured."""
    means = {}
    for stage in STAGES:
        count = counters.get(f"{stage}_ms:count", 0.0)
        means[stage] = round(counters.get(f"{stage}_ms:sum", 0.0) / count, 2) if count else None
    busy = published.get("busy")
    return {"stages_ms": means, "device_busy": None if busy is None else round(busy, 3)}


#: The stages, in order, as the metrics name them.
STAGES = ("collate", "copy_in", "compute", "copy_out", "split")

#: What the less obvious columns mean, printed under their tables.
QUEUE_NOTES = (
    "live: executors with a heartbeat; none: tasks with a deadline are refused, the rest wait. "
    "wait ms: the predicted wait in L1 of a task submitted now."
)
DEVICE_NOTES = (
    "mean ms per batch of each stage, since the metrics began; busy: the share of the last "
    "10 s the live executors' devices computed. A model without stages has compute alone."
)
FLEET_NOTES = (
    "offered/s: tasks offered, refused ones too. each/s: what one executor computes at the "
    "largest batch that meets the SLO; all/s: the live executors at full batches. wanted: "
    "executors the demand wants (the coordinator's signal; see docs/operating.md, Scaling)."
)


def tables(data: dict) -> Group:
    executors = RichTable(title="executors")
    # An id holds its worker's name, model and a suffix: folded, never cut, in a narrow
    # terminal, so it can be copied whole.
    executors.add_column("id", overflow="fold", ratio=1)
    for column in ("state", "batches", "tasks", "mean", "L2", "in-flight"):
        executors.add_column(column, no_wrap=True)
    for e in data["executors"]:
        executors.add_row(  # names come from users (--hostname): escaped, never markup
            escape(e["id"]),
            e["state"],
            str(e["batches"]),
            str(e["tasks"]),
            str(e["mean_batch"]),
            str(e["l2"]),
            str(e["inflight"]),
        )
    queues = RichTable(title="first-level queues", caption=QUEUE_NOTES, caption_justify="left")
    fleet = RichTable(title="fleet size", caption=FLEET_NOTES, caption_justify="left")
    for table in (queues, fleet):
        table.add_column("model", overflow="fold")
    queues.add_column("queue", no_wrap=True)
    for column in ("L1", "retry", "live", "wait ms"):
        queues.add_column(column, no_wrap=True)
    for column in ("live", "wanted", "offered/s", "each/s", "all/s"):
        fleet.add_column(column, no_wrap=True)
    for q in data["queues"]:
        live = str(q["live_executors"]) if q["live_executors"] else "[bold red]none[/]"
        queues.add_row(
            escape(q["model"]),
            escape(q["queue"]),
            str(q["l1"]),
            str(q["retry"]),
            live,
            _shown(q["predicted_wait_ms"]),
        )
        fleet.add_row(
            escape(q["model"]),
            live,
            *map(
                _shown,
                (
                    q["executors_wanted"],
                    q["offered_rps"],
                    q["capacity_per_executor_rps"],
                    q["capacity_rps"],
                ),
            ),
        )
    stages = RichTable(title="device", caption=DEVICE_NOTES, caption_justify="left")
    stages.add_column("model", overflow="fold")
    for column in ("busy", "collate", "copy in", "compute", "copy out", "split"):
        stages.add_column(column, no_wrap=True)
    for q in data["queues"]:
        busy, means = q.get("device_busy"), q.get("stages_ms", {})
        stages.add_row(
            escape(q["model"]),
            _shown(None if busy is None else f"{busy:.0%}"),
            *(_shown(means.get(stage)) for stage in STAGES),
        )
    dead = f"dead letters: {data['dead_letters']} (see `tandem dead`)"
    if data["poison"]:
        dead += f"; {data['poison']} poison tasks waiting for the coordinator to bury them"
    idle = [q["model"] for q in data["queues"] if not q["live_executors"]]
    if idle:
        dead += (
            f"\nno live executor serves {', '.join(idle)}: start a worker, or empty a queue "
            "with `tandem purge MODEL`"
        )
    return Group(executors, queues, fleet, stages, escape(dead))


def _shown(value: float | str | None) -> str:
    return "-" if value is None else str(value)


def render(client: redis.Redis, console: Console | None = None) -> dict:
    console = console or Console()
    data = snapshot(client)
    console.print(tables(data))
    return data


def watch_live(
    client: redis.Redis, interval_s: float = 1.0, console: Console | None = None
) -> None:
    """Redraw the tables every interval_s until Ctrl-C. Written to a file or a pipe, each
    refresh is printed as a frame of its own, under a line with its time."""
    import time

    console = console or Console()
    try:
        if not console.is_terminal:
            while True:
                console.rule(time.strftime("%Y-%m-%d %H:%M:%S"))
                console.print(tables(snapshot(client)))
                console.file.flush()  # a file sees each frame as it is drawn
                time.sleep(interval_s)  # the refresh interval
        # Live is entered before the first read, so a Ctrl-C at any moment leaves through
        # its exit, which draws the last frame.
        with Live("reading Redis...", refresh_per_second=4, console=console) as live:
            while True:
                live.update(tables(snapshot(client)))
                time.sleep(interval_s)  # the refresh interval
    except KeyboardInterrupt:
        pass
