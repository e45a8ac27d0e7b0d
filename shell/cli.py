"""The `tandem` command line."""

from __future__ import annotations

import functools
import signal
import sys
import time

import click

from tandem import operate
from tandem.broker.discovery import STACK_FILE
from tandem.broker.errors import TandemError
from tandem.broker.settings import Settings, load_settings, names_redis
from tandem.options import DEFAULTS, default_url_note, joined, redis_option, setup_logging


def _watch_lifeline(settings: Settings) -> None:
    """Started by `tandem up`: stop as on SIGTERM once it is gone (broker/lifeline.py)."""
    if settings.lifeline_fd >= 0:
        from tandem.broker.lifeline import watch

        watch(settings.lifeline_fd)


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


for command in (
    operate.submit,
    operate.ready,
    operate.status,
    operate.dead,
    operate.purge,
    operate.models,
):
    main.add_command(command)


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
@click.option(
    "--standby",
    is_flag=True,
    help="Import everything, then wait for a line on stdin before loading the models and "
    "serving; exit if stdin closes first (tandem up's spare worker).",
)
def worker(standby, **flags) -> None:
    """Run a Celery worker that hosts one executor per --model."""
    from tandem.broker.extras import require

    require("worker", "tandem worker")
    from tandem.workers.bootstep import prepare, run_worker

    settings = joined(**flags)
    setup_logging(settings.loglevel)
    _watch_lifeline(settings)
    if standby:
        prepare()
        if not sys.stdin.readline():
            return  # never needed: the stack stopped first
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

    settings = joined(**flags)
    setup_logging(settings.loglevel)
    _watch_lifeline(settings)
    serve(settings)


@main.command("http")
@redis_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=int, default=8000, show_default=True, help="Port to listen on.")
@click.option(
    "--grpc-port",
    type=int,
    default=8001,
    show_default=True,
    help="Port for the Open Inference Protocol over gRPC (tritonclient.grpc); 0: none.",
)
@click.option(
    "--token",
    envvar="TANDEM_HTTP_TOKEN",
    help="Require 'Authorization: Bearer TOKEN', a header over HTTP and metadata over gRPC "
    "(health and /metrics stay open). Put a TLS proxy in front; the gateway speaks "
    "plain HTTP and gRPC.",
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
def http(redis_url, host, port, grpc_port, token, loglevel, **limits):
    """Serve the gateway: the Open Inference Protocol v2 over HTTP and gRPC (tritonclient,
    KServe) and OpenAI-style /v1/embeddings, each request routed like any producer's."""
    from tandem.broker.extras import require

    require("http", "tandem http")
    from tandem.producers.http.app import serve
    from tandem.producers.http.gateway import Limits

    settings = joined(redis_url=redis_url, loglevel=loglevel)
    setup_logging(settings.loglevel)
    mb = limits.pop("max_body_mb")
    limits = Limits(max_body_bytes=int(mb * 1024 * 1024), **limits)
    grpc = f", gRPC on {host}:{grpc_port}" if grpc_port else ""
    click.echo(f"tandem http on http://{host}:{port}{grpc}, Redis {settings.redis_url}")
    serve(settings, host=host, port=port, limits=limits, token=token, grpc_port=grpc_port)


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
@click.option(
    "--standby",
    type=click.IntRange(min=0),
    default=1,
    show_default=True,
    help="With --max-workers: spare worker processes kept ready, their imports done and no "
    "model loaded, so a scale-out waits only for the models' load; 0: none.",
)
def up(workers, min_workers, max_workers, standby, **flags) -> None:
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
    stack = Stack(
        settings, workers=workers, embedded=embedded, standby=standby if scaling else 0
    ).start()
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

    # A background job of a non-interactive shell starts with SIGINT ignored, and Python
    # then leaves it so: `kill -INT` (or a terminal's Ctrl-C, once in the foreground)
    # would never stop `up`, `demo` or `status --watch`. Every command stops on SIGINT.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        main(standalone_mode=True)
    except TandemError as e:
        click.echo(f"error: {type(e).__name__}: {e}{default_url_note(e)}", err=True)
        sys.exit(1)
    except (redis.ConnectionError, redis.TimeoutError) as e:
        click.echo(
            f"error: BrokerUnavailable: cannot reach Redis: {e}{default_url_note()}", err=True
        )
        sys.exit(1)


if __name__ == "__main__":
    run()
