"""The `tandem` commands an operator runs against a running stack: submit one task,
the readiness probe, status, the dead letters, purge; and the model repository check."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from tandem.broker.errors import TandemError
from tandem.broker.settings import load_settings
from tandem.options import fail, joined, redis_option


@click.command()
@redis_option
@click.argument("model")
@click.argument("inputs_json")
@click.option("--priority", type=int, default=0, help="0 (first) to 9.")
@click.option(
    "--deadline-s",
    type=float,
    help="Seconds the answer is worth waiting for: refused at once (Overloaded) or failed "
    "unrun (DeadlineExceeded) when it would come later (default: the model's slo_ms).",
)
@click.option(
    "--timeout-s",
    "--timeout",
    type=float,
    default=60.0,
    show_default=True,
    help="Seconds to wait for the result.",
)
def submit(redis_url, model, inputs_json, priority, deadline_s, timeout_s) -> None:
    """Submit one task and print its result as JSON. A task that fails, or no result in
    --timeout seconds, is one line on stderr and exit 1."""
    from celery.exceptions import TimeoutError as NoResult

    from tandem.broker.errors import one_line
    from tandem.producers.client import Client

    try:
        inputs = json.loads(inputs_json)
    except ValueError as e:
        raise click.BadParameter(f"not JSON: {e}", param_hint="INPUTS_JSON") from e
    with Client(settings=joined(redis_url=redis_url)) as client:
        result = client.submit(model, inputs, priority=priority, deadline_s=deadline_s)
        try:
            value = result.get(timeout=timeout_s)
        except NoResult:
            fail(f"no result for task {result.id} in {timeout_s:g} s; {_waiting(client, model)}")
        except Exception as e:  # noqa: BLE001 - the task's own error, as Celery raises it
            fail(f"task {result.id} failed: {one_line(e)}")
    click.echo(
        json.dumps(
            {
                "task_id": result.id,
                "route": result.route,
                "executor": result.executor,
                "result": value,
            }
        )
    )


def _waiting(client, model: str) -> str:
    """Where a task without a result stands: its model's L1 depth and live executors."""
    model = client.resolve(model)
    now = client.table.now_ms()
    live = [x for x in client.table.executors(model) if x.expires_ms > now]
    return (
        f"{model} has {client.table.l1_depth(model)} task(s) in its first-level queue and "
        f"{len(live)} live executor(s)" + ("" if live else ": start a worker (tandem worker)")
    )


@click.command()
@click.option(
    "--file",
    "ready_file",
    help="The worker's ready file (default: TANDEM_READY_FILE).",
)
def ready(ready_file) -> None:
    """Exit 0 if a worker on this machine is ready: every executor of it registered and
    beating (its --ready-file touched within heartbeat_ttl_s). For readiness probes."""
    settings = load_settings()
    path = ready_file or settings.ready_file
    if not path:
        raise click.UsageError("name the file: --file PATH, or TANDEM_READY_FILE")
    try:
        age_s = time.time() - float(Path(path).read_text().strip())
    except (OSError, ValueError):
        fail(f"not ready: no ready file {path} (the worker's executors are not registered)")
    if age_s > settings.heartbeat_ttl_s:
        fail(f"not ready: {path} is {age_s:.1f} s old, over heartbeat_ttl_s")
    click.echo(f"ready ({path}, {age_s:.1f} s old)")


@click.command()
@redis_option
@click.option("--json", "as_json", is_flag=True, help="Print the data as JSON, for scripts.")
@click.option("--watch", is_flag=True, help="A live view until Ctrl-C.")
@click.option("--interval", type=float, default=1.0, show_default=True, help="Seconds, --watch.")
def status(redis_url, as_json, watch, interval) -> None:
    """Print each executor and each queue's depth."""

    from tandem.broker.connect import connect
    from tandem.status import render, snapshot, watch_live

    settings = joined(redis_url=redis_url)
    name = "tandem-status-watch" if watch else "tandem-status"
    client = connect(settings.redis_url, settings.sentinel_master, client_name=name)
    if as_json:
        click.echo(json.dumps(snapshot(client), indent=2))
    elif watch:
        watch_live(client, interval)
    else:
        render(client)


@click.command()
@redis_option
@click.option("--limit", type=int, default=20, show_default=True, help="How many, newest first.")
@click.option("--requeue", is_flag=True, help="Submit the listed ones again, and drop them.")
@click.option("--purge", is_flag=True, help="Delete every dead letter.")
@click.option("--json", "as_json", is_flag=True, help="Print the data as JSON, for scripts.")
def dead(redis_url, limit, requeue, purge, as_json) -> None:
    """The dead letters (poison tasks, messages without an id): list, requeue or purge."""

    from tandem.broker import deadletter
    from tandem.broker.connect import connect
    from tandem.broker.table import Table

    if requeue and purge:
        raise click.UsageError("choose --requeue or --purge, not both")
    settings = joined(redis_url=redis_url)
    client = connect(settings.redis_url, settings.sentinel_master, client_name="tandem-dead")
    if purge:
        click.echo(f"purged {deadletter.purge(client)} dead letters")
        return
    total, letters = deadletter.count(client), deadletter.read(client, limit)
    if as_json and not requeue:
        click.echo(json.dumps({"count": total, "letters": [x.row() for x in letters]}, indent=2))
        return
    if not requeue:
        click.echo(f"{total} dead letters" + (f", the newest {len(letters)}:" if total else ""))
        for x in letters:
            kept = f"  (not requeueable: {x.blocked})" if x.blocked else ""
            click.echo(f"  {x.at[:19]}  {x.id or '(no id)'}  {x.model or '-'}  {x.reason}{kept}")
        return
    table, failed = Table(client, settings), 0
    for x in letters:
        try:
            click.echo(f"requeued {x.id or '(no id)'} to {deadletter.requeue(table, x)}")
        except TandemError as e:
            failed += 1
            click.echo(f"kept {x.id or '(no id)'}: {e}", err=True)
    if failed:
        sys.exit(1)


@click.command()
@redis_option
@click.argument("model")
@click.option("--yes", "-y", is_flag=True, help="Do not ask before removing the tasks.")
def purge(redis_url, model, yes) -> None:
    """Empty MODEL's first-level queue (every priority), as `celery purge` does. Each
    removed task gets a REVOKED result, so a caller waiting on it learns at once. Asks
    first, unless --yes."""
    from tandem.broker import keys, tracing
    from tandem.broker.connect import connect
    from tandem.broker.errors import BadArgument
    from tandem.broker.purge import purge as purge_l1
    from tandem.broker.table import Table

    if keys.parse_model(model)[1] == "latest":
        raise BadArgument(f"name the version to purge: {model} could mean another by now")
    settings = joined(redis_url=redis_url)
    client = connect(settings.redis_url, settings.sentinel_master, client_name="tandem-purge")
    waiting = Table(client).l1_depth(model)
    if not waiting:
        click.echo(f"the first-level queue of {model} is empty")
        return
    if not yes:
        click.confirm(
            f"Remove the {waiting} task(s) waiting in the first-level queue of {model} "
            f"({keys.l1(model)})? Their callers get REVOKED",
            abort=True,
        )
    removed = purge_l1(
        client,
        model,
        result_expires_s=settings.result_expires_s,
        max_bytes=settings.max_message_bytes,
        tracer=tracing.tracer("tandem-purge"),
    )
    click.echo(f"purged {removed} task(s) from the first-level queue of {model}")


@click.command()
@click.argument("directory", required=False, type=click.Path(file_okay=False))
@click.option("--device", help="Load on this device instead of each config's own.")
def models(directory, device) -> None:
    """List and check the models of a repository (default: the shipped examples)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table as RichTable

    from tandem.broker.extras import install_hint, installed
    from tandem.workers.models.repository import Repository, check

    repository = Repository(directory)
    rows = check(repository, device)
    columns = ("model", "artifact", "inputs", "outputs", "batch", "status")
    table = RichTable(title=escape(f"models in {repository.root}"))
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:  # escaped: an install hint holds [extra], which Rich reads as markup
        table.add_row(*(escape(str(row[c])) for c in columns))
    console = Console(width=160)
    console.print(table)
    if rows and not installed("worker"):
        hint = install_hint("worker")
        console.print(
            escape(f"Configs checked, models not loaded: loading needs the worker extra, {hint}")
        )
    if not rows:
        raise click.ClickException(f"no NAME/VERSION/config.json under {repository.root}")
    broken = [row for row in rows if row["status"].startswith("error")]
    for row in broken:  # each in one line, unwrapped: what a user reads and greps
        click.echo(f"{row['model']}: {row['status']}", err=True)
    if broken:
        sys.exit(1)  # a broken model; one that needs an extra this install lacks is not
