"""The `tandem` command line."""

from __future__ import annotations

import functools
import json
import logging
import signal
import sys
import time
from pathlib import Path

import click

from tandem.broker.discovery import STACK_FILE, joined_settings
from tandem.broker.errors import TandemError
from tandem.broker.settings import Settings, load_settings, names_redis

#: The defaults, as every --help text states them.
DEFAULTS = Settings()


#: Set when a command took the default Redis URL: nothing named one and no `tandem up`
#: runs in this folder. A Redis that cannot be reached is then explained.
_DEFAULT_URL_NOTE: list[str] = []


def _settings(**flags):
    """Settings for a command that joins a stack: --redis, TANDEM_REDIS_URL, else the
    Redis of a `tandem up` running in this folder (its .tandem/stack.json), else localhost."""
    settings, note = joined_settings(**flags)
    _DEFAULT_URL_NOTE[:] = [note] if note else []
    return settings


def redis_option(f):
    return click.option(
        "--redis",
        "redis_url",
        default=None,
        help="Redis URL (redis://, rediss://, with user:pass@ for ACLs); else TANDEM_REDIS_URL.",
    )(f)


def _watch_lifeline(settings: Settings) -> None:
    """Started by `tandem up`: stop as on SIGTERM once it is gone (broker/lifeline.py)."""
    if settings.lifeline_fd >= 0:
        from tandem.broker.lifeline import watch

        watch(settings.lifeline_fd)


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


class Main(click.Group):
    """tandem's own commands, and those that other packages plug in through the
    `tandem.commands` entry points (the tools: demo, bench, soak), loaded when used."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *_plugged()})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        command = super().get_command(ctx, name)
        if command is None and name in (plugged := _plugged()):
            command = plugged[name].load()
        return command


@functools.cache
def _plugged() -> dict:
    """The plugged commands' entry points, read once (`tandem --help` asks for each)."""
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group="tandem.commands")}


@click.group(cls=Main)
@click.version_option(package_name="tandem-serve", prog_name="tandem")
def main() -> None:
    """tandem: batched inference on Celery and Redis with two-level scheduling."""


@main.command()
@redis_option
@click.option("--model", "models", multiple=True, help="NAME:VERSION to serve; repeatable.")
@click.option("--repository", help="Model repository folder (default: the shipped examples).")
@click.option("--max-batch", type=int, help=f"Largest batch (default {DEFAULTS.max_batch}).")
@click.option(
    "--max-wait-ms",
    type=float,
    help=f"Batch window from the first task (default {DEFAULTS.max_wait_ms:g}).",
)
@click.option("--max-queue", type=int, help="Bound on each model's L1; submit raises QueueFull.")
@click.option(
    "--slo-ms",
    type=float,
    help="Default deadline of a task from its submit, when it has none of its own (0: none).",
)
@click.option(
    "--deadline-aware/--no-deadline-aware",
    default=None,
    help="Shed by predicted finish: Overloaded at submit, DeadlineExceeded at claim "
    "(default: on). Off: only tasks already past their deadline fail unrun.",
)
@click.option("--heartbeat-ttl-s", type=float, help="Dead after this long without a heartbeat.")
@click.option(
    "--compute-timeout-s", type=float, help="Exit (code 70) if a batch hangs this long; 0: never."
)
@click.option("--sim-base-ms", type=float, help="sim model: fixed cost per batch.")
@click.option("--sim-per-item-ms", type=float, help="sim model: cost per task.")
@click.option("--sim-prep-ms", type=float, help="sim model: CPU cost to prepare each task.")
@click.option("--sim-collate-ms", type=float, help="sim model: CPU cost to collate each batch.")
@click.option(
    "--sim-copy-ms", type=float, help="sim model: wall time of each copy, in and out, per batch."
)
@click.option(
    "--pipeline/--no-pipeline",
    default=None,
    help="Prepare the next batch while one computes (default: on).",
)
@click.option(
    "--staging/--no-staging",
    default=None,
    help="Collate and copy the next batch while one computes, copy out and split after "
    "(default: on, for a model with stages).",
)
@click.option("--device", help="auto, cpu or cuda:N.")
@click.option("--hostname", help="Celery node name (default: MODEL-PID@<host>).")
@click.option("--loglevel", help="DEBUG, INFO, WARNING ...")
@click.option(
    "--ready-file",
    help="Keep this file fresh while every executor is registered (see tandem ready).",
)
def worker(**flags) -> None:
    """Run a Celery worker that hosts one executor per --model."""
    from tandem.broker.extras import require

    require("worker", "tandem worker")
    from tandem.workers.bootstep import run_worker

    settings = _settings(**flags)
    setup_logging(settings.loglevel)
    _watch_lifeline(settings)
    run_worker(settings)


@main.command()
@redis_option
@click.option(
    "--interval-s",
    "coordinator_interval_s",
    type=float,
    help=f"How often to look for dead executors (default {DEFAULTS.coordinator_interval_s:g}).",
)
@click.option("--metrics-port", type=int, help="Serve Prometheus /metrics on this port.")
@click.option(
    "--max-deliveries",
    type=int,
    help=f"Quarantine a task after this many deaths (default {DEFAULTS.max_deliveries}).",
)
@click.option("--loglevel", help="DEBUG, INFO, WARNING ...")
def coordinator(**flags) -> None:
    """Expire dead executors, reclaim their tasks, publish state changes."""
    from tandem.coordinator.service import serve

    settings = _settings(**flags)
    setup_logging(settings.loglevel)
    _watch_lifeline(settings)
    serve(settings)


@main.command()
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
    with Client(settings=_settings(redis_url=redis_url)) as client:
        result = client.submit(model, inputs, priority=priority, deadline_s=deadline_s)
        try:
            value = result.get(timeout=timeout_s)
        except NoResult:
            _fail(f"no result for task {result.id} in {timeout_s:g} s; {_waiting(client, model)}")
        except Exception as e:  # noqa: BLE001 - the task's own error, as Celery raises it
            _fail(f"task {result.id} failed: {one_line(e)}")
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


def _fail(text: str) -> None:
    click.echo(f"error: {text}", err=True)
    sys.exit(1)


def _waiting(client, model: str) -> str:
    """Where a task without a result stands: its model's L1 depth and live executors."""
    model = client.resolve(model)
    now = client.table.now_ms()
    live = [x for x in client.table.executors(model) if x.expires_ms > now]
    return (
        f"{model} has {client.table.l1_depth(model)} task(s) in its first-level queue and "
        f"{len(live)} live executor(s)" + ("" if live else ": start a worker (tandem worker)")
    )


@main.command()
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
        _fail(f"not ready: no ready file {path} (the worker's executors are not registered)")
    if age_s > settings.heartbeat_ttl_s:
        _fail(f"not ready: {path} is {age_s:.1f} s old, over heartbeat_ttl_s")
    click.echo(f"ready ({path}, {age_s:.1f} s old)")


@main.command()
@redis_option
@click.option("--json", "as_json", is_flag=True, help="Print the data as JSON, for scripts.")
@click.option("--watch", is_flag=True, help="A live view until Ctrl-C.")
@click.option("--interval", type=float, default=1.0, show_default=True, help="Seconds, --watch.")
def status(redis_url, as_json, watch, interval) -> None:
    """Print each executor and each queue's depth."""

    from tandem.broker.connect import connect
    from tandem.status import render, snapshot, watch_live

    settings = _settings(redis_url=redis_url)
    name = "tandem-status-watch" if watch else "tandem-status"
    client = connect(settings.redis_url, settings.sentinel_master, client_name=name)
    if as_json:
        click.echo(json.dumps(snapshot(client), indent=2))
    elif watch:
        watch_live(client, interval)
    else:
        render(client)


@main.command()
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
    settings = _settings(redis_url=redis_url)
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


@main.command()
@redis_option
@click.argument("model")
@click.option("--yes", "-y", is_flag=True, help="Do not ask before removing the tasks.")
def purge(redis_url, model, yes) -> None:
    """Empty MODEL's first-level queue (every priority), as `celery purge` does. Each
    removed task gets a REVOKED result, so a caller waiting on it learns at once. Asks
    first, unless --yes."""
    from tandem.broker import keys
    from tandem.broker.connect import connect
    from tandem.broker.errors import BadArgument
    from tandem.broker.purge import purge as purge_l1
    from tandem.broker.table import Table

    if keys.parse_model(model)[1] == "latest":
        raise BadArgument(f"name the version to purge: {model} could mean another by now")
    settings = _settings(redis_url=redis_url)
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
    )
    click.echo(f"purged {removed} task(s) from the first-level queue of {model}")


@main.command()
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


@main.command("http")
@redis_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=int, default=8000, show_default=True, help="Port to listen on.")
@click.option(
    "--token",
    envvar="TANDEM_HTTP_TOKEN",
    help="Require 'Authorization: Bearer TOKEN' (health and /metrics stay open). "
    "Put a TLS proxy in front; the gateway speaks plain HTTP.",
)
@click.option(
    "--max-body-mb",
    type=float,
    default=32,
    show_default=True,
    help="Largest request body, in MiB; a larger one gets 413.",
)
@click.option(
    "--max-concurrency",
    type=int,
    default=256,
    show_default=True,
    help="Inference requests served at once; more get 503 with Retry-After.",
)
@click.option(
    "--request-timeout-s",
    type=float,
    default=30,
    show_default=True,
    help="Deadline of a request that sets none, for a model without an SLO.",
)
@click.option(
    "--body-timeout-s",
    type=float,
    default=30,
    show_default=True,
    help="A client that takes longer to send its body gets 408.",
)
@click.option("--loglevel", help="DEBUG, INFO, WARNING ...")
def http(redis_url, host, port, token, loglevel, **limits):
    """Serve HTTP: the Open Inference Protocol v2 (tritonclient, KServe) and
    OpenAI-style /v1/embeddings, each request routed like any producer's."""
    from tandem.broker.extras import require

    require("http", "tandem http")
    from tandem.producers.http.app import serve
    from tandem.producers.http.gateway import Limits

    settings = _settings(redis_url=redis_url, loglevel=loglevel)
    setup_logging(settings.loglevel)
    mb = limits.pop("max_body_mb")
    limits = Limits(max_body_bytes=int(mb * 1024 * 1024), **limits)
    click.echo(f"tandem http on http://{host}:{port}, Redis {settings.redis_url}")
    serve(settings, host=host, port=port, limits=limits, token=token)


def stack_options(f):
    f = click.option("--workers", type=int, default=2, help="Worker processes (default 2).")(f)
    f = click.option(
        "--model",
        "models",
        multiple=True,
        help=f"NAME:VERSION to serve; repeatable (default {', '.join(DEFAULTS.models)}).",
    )(f)
    f = click.option("--repository", help="Model repository folder (default: the examples).")(f)
    f = click.option(
        "--max-batch", type=int, help=f"Largest batch (default {DEFAULTS.max_batch})."
    )(f)
    f = click.option(
        "--max-wait-ms",
        type=float,
        help=f"Batch window from the first task (default {DEFAULTS.max_wait_ms:g}: at once).",
    )(f)
    return redis_option(f)


@main.command()
@stack_options
@click.option(
    "--min-workers",
    type=int,
    help="With --max-workers: follow the scaling signal between these "
    "(see docs/operating.md, Scaling).",
)
@click.option("--max-workers", type=int, help="The most workers the stack scales out to.")
def up(workers, min_workers, max_workers, **flags) -> None:
    """Run a local stack until Ctrl-C: Redis (embedded unless --redis), coordinator, workers.

    Ctrl-C stops it in order (the workers hand back what they hold, then the coordinator,
    then Redis) within 30 s; Ctrl-C again stops everything at once."""
    from tandem.broker.extras import require

    require("worker", "tandem up")
    from tandem.stack import STOP_BOUND_S, Stack

    settings = load_settings(**flags)
    setup_logging("INFO")
    embedded = not names_redis(flags["redis_url"])
    scaling = min_workers is not None or max_workers is not None
    if scaling:
        min_workers = 0 if min_workers is None else min_workers
        max_workers = max(min_workers, 1) if max_workers is None else max_workers
        if not 0 <= min_workers <= max_workers or max_workers < 1:
            raise click.BadParameter(
                f"need 0 <= --min-workers <= --max-workers and 1 <= --max-workers, got "
                f"{min_workers} and {max_workers}",
                param_hint="--min-workers/--max-workers",
            )
        workers = max(min_workers, 1)  # one at least, so the models register at once
    stack = Stack(settings, workers=workers, embedded=embedded).start()
    scaler = None
    if scaling:
        import redis

        from tandem.autoscale import LocalScaler

        scaler = LocalScaler(
            stack,
            redis.Redis.from_url(stack.url),
            min_workers=min_workers,
            max_workers=max_workers,
        )
    found = (
        f"tandem commands run in this folder use it ({STACK_FILE})"
        if embedded
        else "give other tandem commands the same --redis or TANDEM_REDIS_URL"
    )
    size = f"{min_workers} to {max_workers} workers" if scaling else f"{workers} workers"
    click.echo(
        f"tandem up on {stack.url}: {size} serving "
        f"{', '.join(settings.models)}; logs in {stack.data_dir / 'logs'}; {found}. "
        "Ctrl-C stops."
    )
    for sig in (signal.SIGTERM, signal.SIGHUP):  # a closed terminal stops the stack too
        signal.signal(sig, signal.default_int_handler)
    exited = None
    try:
        while (exited := stack.exited()) is None:
            if scaler is not None:
                scaler.step()
            time.sleep(0.5)  # idle until Ctrl-C, SIGTERM or a child exits
    except KeyboardInterrupt:
        pass
    click.echo(
        f"stopping: the workers (each finishes its batch and hands back what it holds), "
        f"then the coordinator, then Redis; within {STOP_BOUND_S:g} s. Ctrl-C again stops "
        "everything at once."
    )
    try:
        stack.stop()
    except KeyboardInterrupt:
        click.echo(
            "stopped at once: the workers were killed; the tasks they held go back to L1 "
            "at the next `tandem up`"
        )
        sys.exit(130)
    click.echo("stopped")
    if exited:
        raise exited


def run() -> None:
    import redis

    try:
        main(standalone_mode=True)
    except TandemError as e:
        click.echo(f"error: {type(e).__name__}: {e}{_default_url_note(e)}", err=True)
        sys.exit(1)
    except (redis.ConnectionError, redis.TimeoutError) as e:
        click.echo(
            f"error: BrokerUnavailable: cannot reach Redis: {e}{_default_url_note()}", err=True
        )
        sys.exit(1)


def _default_url_note(error: Exception | None = None) -> str:
    from tandem.broker.errors import BrokerUnavailable

    if _DEFAULT_URL_NOTE and (error is None or isinstance(error, BrokerUnavailable)):
        return f"; {_DEFAULT_URL_NOTE[0]}"
    return ""


if __name__ == "__main__":
    run()
