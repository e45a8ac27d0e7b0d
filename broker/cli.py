"""The `tandem` command line."""

from __future__ import annotations

import json
import logging
import signal
import sys
import time

import click

from broker.errors import TandemError
from broker.settings import STACK_FILE, load_settings


def _settings(**flags):
    """Settings for a command that joins a stack: --redis, TANDEM_REDIS_URL, else the
    Redis of a `tandem up` running in this folder (its .tandem/stack.json), else localhost."""
    return load_settings(stack_file=STACK_FILE, **flags)


def _redis_option(f):
    return click.option(
        "--redis",
        "redis_url",
        envvar="TANDEM_REDIS_URL",
        default=None,
        help="Redis URL (redis://, rediss://, with user:pass@ for ACLs).",
    )(f)


def _logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


@click.group()
def main() -> None:
    """tandem: batched inference on Celery and Redis with two-level scheduling."""


@main.command()
@_redis_option
@click.option("--model", "models", multiple=True, help="NAME:VERSION to serve; repeatable.")
@click.option("--repository", help="Model repository folder (default: the shipped examples).")
@click.option("--max-batch", type=int, help="Largest batch (default 32).")
@click.option("--max-wait-ms", type=float, help="Batch window from the first task (default 0).")
@click.option("--max-queue", type=int, help="Bound on each model's L1; submit raises QueueFull.")
@click.option("--heartbeat-ttl-s", type=float, help="Dead after this long without a heartbeat.")
@click.option(
    "--compute-timeout-s", type=float, help="Exit (code 70) if a batch hangs this long; 0: never."
)
@click.option("--sim-base-ms", type=float, help="sim model: fixed cost per batch.")
@click.option("--sim-per-item-ms", type=float, help="sim model: cost per task.")
@click.option("--sim-prep-ms", type=float, help="sim model: CPU cost to prepare each task.")
@click.option(
    "--pipeline/--no-pipeline",
    default=None,
    help="Prepare the next batch while one computes (default: on).",
)
@click.option("--device", help="auto, cpu or cuda:N.")
@click.option("--hostname", help="Celery node name (default: MODEL-PID@<host>).")
@click.option("--loglevel", help="DEBUG, INFO, WARNING ...")
def worker(**flags) -> None:
    """Run a Celery worker that hosts one executor per --model."""
    from workers.bootstep import run_worker

    settings = _settings(**flags)
    _logging(settings.loglevel)
    run_worker(settings)


@main.command()
@_redis_option
@click.option(
    "--interval-s",
    "coordinator_interval_s",
    type=float,
    help="How often to look for dead executors (default 0.5).",
)
@click.option("--metrics-port", type=int, help="Serve Prometheus /metrics on this port.")
@click.option(
    "--max-deliveries", type=int, help="Quarantine a task after this many deaths (default 3)."
)
@click.option("--loglevel", help="DEBUG, INFO, WARNING ...")
def coordinator(**flags) -> None:
    """Expire dead executors, reclaim their tasks, publish state changes."""
    from broker.coordinator import serve

    settings = _settings(**flags)
    _logging(settings.loglevel)
    serve(settings)


@main.command()
@_redis_option
@click.argument("model")
@click.argument("inputs_json")
@click.option("--priority", type=int, default=0, help="0 (first) to 9.")
@click.option("--deadline-s", type=float, help="Fail the task if not computed in time.")
@click.option("--timeout-s", type=float, default=60.0, help="How long to wait for the result.")
def submit(redis_url, model, inputs_json, priority, deadline_s, timeout_s) -> None:
    """Submit one task and print its result as JSON."""
    from producers.client import Client

    try:
        inputs = json.loads(inputs_json)
    except ValueError as e:
        raise click.BadParameter(f"not JSON: {e}", param_hint="INPUTS_JSON") from e
    with Client(settings=_settings(redis_url=redis_url)) as client:
        result = client.submit(model, inputs, priority=priority, deadline_s=deadline_s)
        value = result.get(timeout=timeout_s)
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


@main.command()
@_redis_option
@click.option("--json", "as_json", is_flag=True, help="Print the data as JSON, for scripts.")
@click.option("--watch", is_flag=True, help="A live view until Ctrl-C.")
@click.option("--interval", type=float, default=1.0, show_default=True, help="Seconds, --watch.")
def status(redis_url, as_json, watch, interval) -> None:
    """Print each executor and each queue's depth."""
    import redis

    from broker.status import render, snapshot, watch_live

    settings = _settings(redis_url=redis_url)
    name = "tandem-status-watch" if watch else "tandem-status"
    client = redis.Redis.from_url(settings.redis_url, client_name=name)
    if as_json:
        click.echo(json.dumps(snapshot(client), indent=2))
    elif watch:
        watch_live(client, interval)
    else:
        render(client)


@main.command()
@_redis_option
@click.option("--limit", type=int, default=20, show_default=True, help="How many, newest first.")
@click.option("--requeue", is_flag=True, help="Submit the listed ones again, and drop them.")
@click.option("--purge", is_flag=True, help="Delete every dead letter.")
@click.option("--json", "as_json", is_flag=True, help="Print the data as JSON, for scripts.")
def dead(redis_url, limit, requeue, purge, as_json) -> None:
    """The dead letters (poison tasks, messages without an id): list, requeue or purge."""
    import redis

    from broker import deadletter
    from broker.table import Table

    if requeue and purge:
        raise click.UsageError("choose --requeue or --purge, not both")
    settings = _settings(redis_url=redis_url)
    client = redis.Redis.from_url(settings.redis_url, client_name="tandem-dead")
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
            click.echo(f"  {x.at[:19]}  {x.id or '(no id)'}  {x.model or '-'}  {x.reason}")
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
@click.argument("directory", required=False, type=click.Path(file_okay=False))
@click.option("--device", help="Load on this device instead of each config's own.")
def models(directory, device) -> None:
    """List and check the models of a repository (default: the shipped examples)."""
    from rich.console import Console
    from rich.table import Table as RichTable

    from workers.models.repository import Repository, check

    repository = Repository(directory)
    rows = check(repository, device)
    columns = ("model", "artifact", "inputs", "outputs", "batch", "status")
    table = RichTable(title=f"models in {repository.root}")
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(row[c] for c in columns))
    Console(width=160).print(table)
    if not rows:
        raise click.ClickException(f"no NAME/VERSION/config.json under {repository.root}")
    if any(row["status"] != "ok" for row in rows):
        sys.exit(1)


def _stack_options(f):
    f = click.option("--workers", type=int, default=2, help="Worker processes (default 2).")(f)
    f = click.option("--model", "models", multiple=True, help="NAME:VERSION; repeatable.")(f)
    f = click.option("--repository", help="Model repository folder.")(f)
    f = click.option("--max-batch", type=int)(f)
    f = click.option("--max-wait-ms", type=float)(f)
    return _redis_option(f)


@main.command()
@_stack_options
def up(workers, **flags) -> None:
    """Run a local stack until Ctrl-C: Redis (embedded unless --redis), coordinator, workers."""
    from broker.stack import Stack

    settings = load_settings(**flags)
    _logging("INFO")
    embedded = flags["redis_url"] is None
    stack = Stack(settings, workers=workers, embedded=embedded).start()
    found = (
        f"tandem commands run in this folder use it ({STACK_FILE})"
        if embedded
        else "give other tandem commands the same --redis or TANDEM_REDIS_URL"
    )
    click.echo(
        f"tandem up on {stack.url}: {workers} workers serving "
        f"{', '.join(settings.models)}; logs in {stack.data_dir / 'logs'}; {found}. "
        "Ctrl-C stops."
    )
    for sig in (signal.SIGTERM, signal.SIGHUP):  # a closed terminal stops the stack too
        signal.signal(sig, signal.default_int_handler)
    exited = None
    try:
        while (exited := stack.exited()) is None:
            time.sleep(0.5)  # idle until Ctrl-C, SIGTERM or a child exits
    except KeyboardInterrupt:
        pass
    finally:
        click.echo("stopping ...")
        stack.stop()
    if exited:
        raise exited


@main.command()
@_stack_options
@click.option(
    "--rates",
    default="20,1000",
    show_default=True,
    help="Comma-separated Poisson rates, tasks per second.",
)
@click.option("--seconds", type=float, default=5.0, show_default=True, help="Seconds per rate.")
def demo(workers, rates, seconds, **flags) -> None:
    """Bring up a local stack, run a low and a high Poisson load, print the figures."""
    from producers.demo import run_demo

    try:
        phases = [(float(rate), seconds) for rate in rates.split(",")]
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--rates") from e
    settings = load_settings(**flags)
    _logging("WARNING")
    run_demo(settings, workers=workers, embedded=flags["redis_url"] is None, phases=phases)


@main.command()
@_redis_option
@click.option("--quick", is_flag=True, help="A short sweep (under 2 minutes).")
@click.option(
    "--profile",
    type=click.Choice(["sim", "embed", "prep", "fleet", "overhead"]),
    default="sim",
    show_default=True,
    help="sim: the simulated GPU; embed: the real MiniLM model; prep: sim with 0.3 ms of "
    "CPU to prepare each task, pipelined or not; fleet: Redis cost as the fleet grows; "
    "overhead: a zero-cost model, tasks/s and Redis CPU per task.",
)
@click.option(
    "--systems",
    help="Comma-separated systems to compare (default: tandem, celery-plain, "
    "celery-batches/10ms and /50ms; prep adds tandem/no-pipeline).",
)
@click.option("--rates", help="Comma-separated offered rates (req/s); default per profile.")
@click.option("--seconds", type=float, help="Seconds of arrivals per point (default 5, quick 2).")
@click.option("--workers", type=int, default=2, show_default=True)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write rows here.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="Write a PNG here.")
def bench(redis_url, quick, profile, systems, rates, seconds, workers, json_path, plot_path):
    """Compare tandem, plain Celery and celery-batches under the same Poisson load."""
    from broker.extras import require

    require("bench", "tandem bench")
    if profile == "embed":
        require("embed", "tandem bench --profile embed")
    systems = systems or ",".join(DEFAULT_SYSTEMS[profile == "prep"])
    if profile in ("fleet", "overhead"):
        _logging("WARNING")
        _fleet_bench(profile, quick, systems, workers, json_path, plot_path)
        return
    from producers.bench import PROFILES, SYSTEMS, run_bench

    chosen = PROFILES[profile]
    try:
        picked = [SYSTEMS[name.strip()] for name in systems.split(",")]
        offered = (
            tuple(float(r) for r in rates.split(","))
            if rates
            else (chosen.quick_rates if quick else chosen.rates)
        )
    except KeyError as e:
        raise click.BadParameter(
            f"unknown system {e}; known: {', '.join(SYSTEMS)}", param_hint="--systems"
        ) from e
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--rates") from e
    _logging("WARNING")
    seconds = seconds or (2.0 if quick else 5.0)
    run_bench(
        load_settings(),
        profile=chosen,
        systems=picked,
        rates=offered,
        seconds=seconds,
        workers=workers,
        drain_s=3.0 if quick else 5.0,
        json_path=json_path,
        plot_path=plot_path,
    )


#: The systems bench compares by default; with a preparation cost, the pipeline switch too.
DEFAULT_SYSTEMS = {
    False: ("tandem", "celery-plain", "celery-batches/10ms", "celery-batches/50ms"),
    True: ("tandem", "tandem/no-pipeline", "celery-plain", "celery-batches/10ms"),
}


def _fleet_bench(profile, quick, systems, workers, json_path, plot_path) -> None:
    import json
    import tempfile
    from pathlib import Path

    from rich.console import Console

    from producers import fleet

    console = Console(width=110)
    with tempfile.TemporaryDirectory(prefix="tandem-fleet-") as folder:
        if profile == "fleet":
            report = fleet.run_fleet(Path(folder), quick=quick)
            fleet.print_fleet(report, console)
            draw = fleet.plot_fleet
        else:
            names = [name.strip() for name in systems.split(",")]
            unknown = [name for name in names if name not in fleet.SYSTEMS]
            if unknown:
                raise click.BadParameter(
                    f"unknown system {unknown[0]!r}; known: {', '.join(fleet.SYSTEMS)}",
                    param_hint="--systems",
                )
            report = fleet.run_overhead(names, Path(folder), quick=quick, workers=workers)
            fleet.print_overhead(report, console)
            draw = fleet.plot_overhead
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=2) + "\n")
    if plot_path:
        draw(report, plot_path)


@main.command()
@click.option("--minutes", type=float, default=5.0, show_default=True)
@click.option(
    "--kill-every-s",
    type=float,
    default=20.0,
    show_default=True,
    help="Seconds between worker kills.",
)
def soak(minutes, kill_every_s) -> None:
    """Mixed load with worker kills and a Redis restart; exits 1 if any task was lost."""
    from producers.soak import run_soak

    _logging("WARNING")
    report = run_soak(load_settings(), minutes, kill_every_s)
    for line in report.lines():
        click.echo(line)
    if report.lost:
        sys.exit(1)


def run() -> None:
    import redis

    try:
        main(standalone_mode=True)
    except TandemError as e:
        click.echo(f"error: {type(e).__name__}: {e}", err=True)
        sys.exit(1)
    except (redis.ConnectionError, redis.TimeoutError) as e:
        click.echo(f"error: BrokerUnavailable: cannot reach Redis: {e}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    run()
