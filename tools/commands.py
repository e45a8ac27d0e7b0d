"""The tools' `tandem` subcommands: demo, bench and soak. They plug into the `tandem`
command through the `tandem.commands` entry points (pyproject.toml), so the shell never
imports the tools."""

from __future__ import annotations

import logging
import sys
import tempfile
from pathlib import Path

import click

from tandem.broker.settings import load_settings, names_redis
from tandem.cli import redis_option, setup_logging, stack_options


@click.command()
@stack_options
@click.option(
    "--rates",
    default="20,1000",
    show_default=True,
    help="Comma-separated Poisson rates, tasks per second.",
)
@click.option("--seconds", type=float, default=5.0, show_default=True, help="Seconds per rate.")
def demo(workers, rates, seconds, **flags) -> None:
    """Bring up a local stack, run a low and a high Poisson load, print the figures."""
    from tandem.broker.extras import require

    require("worker", "tandem demo")
    from tandem.tools.demo import run_demo

    try:
        phases = [(float(rate), seconds) for rate in rates.split(",")]
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--rates") from e
    settings = load_settings(**flags)
    setup_logging("WARNING")
    run_demo(settings, workers=workers, embedded=not names_redis(flags["redis_url"]), phases=phases)


@click.command()
@redis_option
@click.option("--quick", is_flag=True, help="A short sweep (under 2 minutes).")
@click.option(
    "--profile",
    type=click.Choice(
        [
            "sim",
            "embed",
            "prep",
            "fleet",
            "overhead",
            "overload",
            "latency",
            "http",
            "replicas",
            "autoscale",
            "device",
        ]
    ),
    default="sim",
    show_default=True,
    help="sim: the simulated GPU; embed: the real MiniLM model; prep: sim with 0.3 ms of "
    "CPU to prepare each task, pipelined or not; fleet: Redis cost as the fleet grows; "
    "overhead: a zero-cost model, tasks/s and Redis CPU per task; overload: goodput at "
    "multiples of the measured capacity, every task with a deadline; latency: tandem's own "
    "path against a bare LPUSH-BLMOVE-PUBLISH path, one task at a time; http: the HTTP "
    "gateway against a direct Client (latency added, CPU per request, the sim sweep); "
    "replicas: a task's latency with min_replicas 0 and 1 (a primary and one replica); "
    "autoscale: scaling policies (static, KEDA-like, Ray-like, tandem's signal) on load "
    "traces with a cold start, worker processes started and stopped; device: collate and "
    "copies overlapped with the compute or not (sim with host-stage costs, cnn, minilm).",
)
@click.option(
    "--systems",
    help="Comma-separated systems to compare (default: tandem, celery-plain, "
    "celery-batches/10ms and /50ms; prep adds tandem/no-pipeline).",
)
@click.option("--rates", help="Comma-separated offered rates (req/s); default per profile.")
@click.option("--seconds", type=float, help="Seconds of arrivals per point (default 5, quick 2).")
@click.option(
    "--loads", help="overload: comma-separated multiples of capacity (default 0.5,1,2,4)."
)
@click.option("--slos-ms", help="overload: comma-separated SLOs in ms (default 100,250).")
@click.option(
    "--shed-tasks",
    type=int,
    help="overload: tasks to shed at claim for the cost per shed task (default 20000, "
    "quick 5000; 0 skips it).",
)
@click.option(
    "--churn",
    is_flag=True,
    help="autoscale: 20 minutes of scale-ins under load instead, counting what they lose.",
)
@click.option(
    "--tracing",
    default="off",
    show_default=True,
    callback=lambda ctx, param, value: _tracing(value),
    help="tandem's traces: off; sampler-off (the otel extra, its sampler off); on (every "
    "span, over OTLP to a sink process); or a ratio of traces, such as 0.1.",
)
@click.option("--workers", type=int, default=2, show_default=True, help="Worker processes.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write rows here.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="Write a PNG here.")
def bench(
    redis_url,
    quick,
    profile,
    systems,
    rates,
    seconds,
    loads,
    slos_ms,
    shed_tasks,
    churn,
    tracing,
    workers,
    json_path,
    plot_path,
):
    """Compare tandem, plain Celery and celery-batches under the same Poisson load."""
    from tandem.broker.extras import require
    from tandem.tools.tracesink import traced

    require("bench", "tandem bench")
    if tracing != "off":
        require("otel", f"tandem bench --tracing {tracing}")
    with traced(tracing) as sink:
        _bench(redis_url, quick, profile, systems, rates, seconds, loads, slos_ms, shed_tasks,
               churn, workers, json_path, plot_path, sink)  # fmt: skip


def _bench(
    redis_url, quick, profile, systems, rates, seconds, loads, slos_ms, shed_tasks, churn,
    workers, json_path, plot_path, sink,
):  # fmt: skip
    from rich.console import Console

    from tandem.broker.extras import installed, require

    if profile == "embed":
        require("embed", "tandem bench --profile embed")
    if profile == "http":
        require("http", "tandem bench --profile http")
    names = _systems(systems, profile)
    setup_logging("WARNING")
    settings = load_settings()
    console = Console(width=max(Console().width, 180 if profile == "autoscale" else 140))

    def progress(text: str) -> None:
        console.print(f"[dim]{text}[/dim]")

    if profile == "latency":
        from tandem.tools import latency

        report = latency.report(settings, quick=quick, progress=progress)
    elif profile == "replicas":
        from tandem.tools import replicas

        report = replicas.report(settings, quick=quick, progress=progress)
    elif profile == "http":
        from tandem.tools import httpbench

        report = httpbench.report(settings, quick=quick, workers=workers, progress=progress)
    elif profile == "autoscale":
        from tandem.tools import autoscale

        report = autoscale.report(settings, quick=quick, churn=churn, progress=progress)
    elif profile == "device":
        from tandem.tools import devicebench

        report = devicebench.report(settings, quick=quick, embed=installed("embed"))
    elif profile == "overload":
        from tandem.tools import overload

        # A producer that falls behind sends Celery tasks whose expires has passed: Celery
        # warns once per task, which would slow the producer it measures.
        logging.getLogger("celery.app.base").setLevel(logging.ERROR)
        report = overload.report(
            settings,
            quick=quick,
            systems=names,
            loads=_numbers(loads, "--loads"),
            slos_ms=_numbers(slos_ms, "--slos-ms"),
            seconds=seconds,
            shed_tasks=shed_tasks,
            workers=workers,
            progress=progress,
        )
    elif profile in ("fleet", "overhead"):
        from tandem.tools import fleet

        with tempfile.TemporaryDirectory(prefix="tandem-fleet-") as folder:
            if profile == "fleet":
                report = fleet.fleet_report(Path(folder), quick)
            else:
                picked = [s.name for s in names or _systems(",".join(DEFAULT_SYSTEMS[False]), "")]
                report = fleet.overhead_report(picked, Path(folder), quick, workers)
    else:
        from tandem.tools.bench import PROFILES, run_bench

        chosen = PROFILES[profile]
        report = run_bench(
            settings,
            profile=chosen,
            systems=names or _systems(",".join(DEFAULT_SYSTEMS[profile == "prep"]), ""),
            rates=_numbers(rates, "--rates") or (chosen.quick_rates if quick else chosen.rates),
            seconds=seconds or (2.0 if quick else 5.0),
            workers=workers,
            drain_s=3.0 if quick else 5.0,
            console=Console(width=max(Console().width, 110)),
        )
    if sink is not None:
        report.line(f"traces: the sink received {sink.spans()} spans")
    report.show(console)
    report.save(json_path, plot_path)


#: The systems bench compares by default; with a preparation cost, the pipeline switch too.
DEFAULT_SYSTEMS = {
    False: ("tandem", "celery-plain", "celery-batches/10ms", "celery-batches/50ms"),
    True: ("tandem", "tandem/no-pipeline", "celery-plain", "celery-batches/10ms"),
}


def _tracing(value: str) -> str:
    """--tracing's value, checked."""
    from tandem.tools.tracesink import sampler

    if value != "off":
        try:
            sampler(value)
        except ValueError:
            raise click.BadParameter(
                f"{value!r}: give off, sampler-off, on, or a ratio over 0 and at most 1"
            ) from None
    return value


def _systems(text: str | None, profile: str) -> list | None:
    """The systems named in --systems, or None for the profile's own."""
    from tandem.tools.harness import system

    if not text:
        return None
    try:
        return [system(name) for name in text.split(",")]
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--systems") from e


def _numbers(text: str | None, hint: str) -> tuple[float, ...] | None:
    if not text:
        return None
    try:
        return tuple(float(part) for part in text.split(","))
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint=hint) from e


@click.command()
@click.option("--minutes", type=float, default=5.0, show_default=True, help="How long to run.")
@click.option(
    "--kill-every-s",
    type=float,
    default=20.0,
    show_default=True,
    help="Seconds between worker kills.",
)
@click.option(
    "--faults",
    type=click.Choice(["workers", "sentinel", "none"]),
    default="workers",
    show_default=True,
    help="workers: kills, poison tasks and a Redis restart; sentinel: the primary of a "
    "Redis under Sentinel killed --rounds times under steady load; none: steady load "
    "only, with RSS and key counts, to find leaks.",
)
@click.option("--rounds", type=int, default=3, show_default=True, help="sentinel: kills.")
@click.option(
    "--min-replicas",
    type=int,
    default=0,
    show_default=True,
    help="sentinel: submits wait for this many replicas (TANDEM_MIN_REPLICAS).",
)
@click.option("--rate", type=float, default=100.0, show_default=True, help="none: tasks/s.")
@click.option(
    "--ttl-s",
    type=int,
    default=60,
    show_default=True,
    help="none: seconds results and dead letters live (TANDEM_RESULT_EXPIRES_S).",
)
def soak(minutes, kill_every_s, faults, rounds, min_replicas, rate, ttl_s) -> None:
    """Mixed load with worker kills and a Redis restart (or, with --faults sentinel,
    primary kills under Sentinel); exits 1 if any task was lost. With --faults none,
    steady load only: exits 1 if a task went unanswered or a per-task key outlived its
    TTL."""
    from tandem.broker.extras import require

    require("worker", "tandem soak")
    setup_logging("WARNING")
    if faults == "sentinel":
        from tandem.tools.failover import run_failover

        found = run_failover(load_settings(), rounds=rounds, min_replicas=min_replicas)
        for line in found.lines():
            click.echo(line)
        sys.exit(1 if found.lost else 0)
    if faults == "none":
        from tandem.tools.steady import run_steady

        steady = run_steady(load_settings(), minutes, rate=rate, ttl_s=ttl_s)
        for line in steady.lines():
            click.echo(line)
        sys.exit(1 if steady.leaked else 0)
    from tandem.tools.soak import run_soak

    report = run_soak(load_settings(), minutes, kill_every_s)
    for line in report.lines():
        click.echo(line)
    if report.lost:
        sys.exit(1)
