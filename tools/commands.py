"""The tools' `tandem` subcommands: demo, bench and soak. They plug into the `tandem`
command through the `tandem.commands` entry points (pyproject.toml), so the shell never
imports the tools."""

from __future__ import annotations

import json
import sys

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
    workers,
    json_path,
    plot_path,
):
    """Compare tandem, plain Celery and celery-batches under the same Poisson load."""
    from tandem.broker.extras import require

    require("bench", "tandem bench")
    if profile == "embed":
        require("embed", "tandem bench --profile embed")
    if profile == "latency":
        setup_logging("WARNING")
        _latency_bench(quick, json_path)
        return
    if profile == "replicas":
        setup_logging("WARNING")
        _replicas_bench(quick, json_path)
        return
    if profile == "http":
        require("http", "tandem bench --profile http")
        setup_logging("WARNING")
        _http_bench(quick, workers, json_path)
        return
    if profile == "autoscale":
        setup_logging("WARNING")
        _autoscale_bench(quick, churn, json_path, plot_path)
        return
    if profile == "device":
        setup_logging("WARNING")
        _device_bench(quick, json_path)
        return
    if profile == "overload":
        setup_logging("WARNING")
        sweep = (loads, slos_ms, seconds, shed_tasks)
        _overload_bench(quick, systems, sweep, workers, json_path, plot_path)
        return
    systems = systems or ",".join(DEFAULT_SYSTEMS[profile == "prep"])
    if profile in ("fleet", "overhead"):
        setup_logging("WARNING")
        _fleet_bench(profile, quick, systems, workers, json_path, plot_path)
        return
    from tandem.tools.bench import PROFILES, SYSTEMS, run_bench

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
    setup_logging("WARNING")
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


def _numbers(text: str | None, default: tuple[float, ...], hint: str) -> tuple[float, ...]:
    if not text:
        return default
    try:
        return tuple(float(part) for part in text.split(","))
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint=hint) from e


def _latency_bench(quick, json_path) -> None:
    from rich.console import Console

    from tandem.tools import hops, latency
    from tandem.tools.bench import rows_table

    console = Console(width=140)
    report = latency.run_latency(
        load_settings(),
        tasks=100 if quick else latency.TASKS,
        progress=lambda text: console.print(f"[dim]{text}[/dim]"),
    )
    title = "tandem bench, profile latency: one task at a time, sim at zero cost, one worker"
    console.print(rows_table(title, latency.COLUMNS, report["rows"]))
    console.print(
        "send = LPUSH or submit(); wait = from then to the result in hand; ratio = over bare."
    )
    console.print(
        rows_table("Redis's own time per command, tandem blocks", latency.REDIS_COLUMNS,
                   report["redis_us"])
    )  # fmt: skip
    console.print(
        rows_table("Where one task's time goes: ms from the call to submit, medians "
                   "(tandem, and the floor's same step)", hops.COLUMNS, report["hops"])
    )  # fmt: skip
    if json_path:
        from pathlib import Path

        Path(json_path).write_text(json.dumps(report, indent=2) + "\n")


def _replicas_bench(quick, json_path) -> None:
    from rich.console import Console

    from tandem.tools import replicas
    from tandem.tools.bench import rows_table

    console = Console(width=140)
    report = replicas.run_replicas(
        load_settings(),
        tasks=100 if quick else 200,
        progress=lambda text: console.print(f"[dim]{text}[/dim]"),
    )
    title = (
        f"tandem bench, profile replicas: submit and get(), one at a time, "
        f"{report['spacing_ms']:g} ms apart, sim at zero cost, a primary and one replica"
    )
    console.print(rows_table(title, replicas.COLUMNS, report["rows"]))
    if json_path:
        from pathlib import Path

        Path(json_path).write_text(json.dumps(report, indent=2) + "\n")


def _http_bench(quick, workers, json_path) -> None:
    from rich.console import Console

    from tandem.tools import httpbench
    from tandem.tools.bench import rows_table

    console = Console(width=140)
    report = httpbench.run_http(
        load_settings(),
        quick=quick,
        workers=workers,
        progress=lambda text: console.print(f"[dim]{text}[/dim]"),
    )
    console.print(
        rows_table(
            "tandem bench, profile http: one request at a time, sim at zero cost, one worker",
            httpbench.LOW_COLUMNS,
            report["low_load"],
        )
    )
    console.print(
        rows_table("the gateway's CPU, a closed loop", httpbench.CPU_COLUMNS, report["cpu"])
    )
    console.print(
        rows_table(
            f"the sim sweep, {workers} workers: direct Client and through HTTP",
            httpbench.SWEEP_COLUMNS,
            report["sweep"],
        )
    )
    if json_path:
        from pathlib import Path

        Path(json_path).write_text(json.dumps(report, indent=2) + "\n")


def _overload_bench(quick, systems, sweep, workers, json_path, plot_path):
    from rich.console import Console

    from tandem.tools import overload, shed
    from tandem.tools.bench import SYSTEMS

    names = (
        systems.split(",")
        if systems
        else (overload.QUICK_SYSTEMS if quick else overload.DEFAULT_SYSTEMS)
    )
    unknown = [name for name in names if name.strip() not in SYSTEMS]
    if unknown:
        raise click.BadParameter(
            f"unknown system {unknown[0]!r}; known: {', '.join(SYSTEMS)}", param_hint="--systems"
        )
    loads, slos_ms, seconds, shed_tasks = sweep
    loads = _numbers(loads, (0.5, 2.0, 4.0) if quick else overload.LOADS, "--loads")
    slos = _numbers(slos_ms, (250.0,) if quick else overload.SLOS_MS, "--slos-ms")
    seconds = seconds or (4.0 if quick else 8.0)
    console = Console(width=140)
    rows = overload.run_overload(
        load_settings(),
        systems=[SYSTEMS[name.strip()] for name in names],
        loads=loads,
        slos_ms=slos,
        seconds=seconds,
        workers=workers,
        drain_s=5.0,
        progress=lambda text: console.print(f"[dim]{text}[/dim]"),
    )
    title = (
        f"tandem bench, profile overload: {overload.MODEL}, {workers} workers, "
        f"{seconds:g}s per point, capacity {rows[0]['capacity_rps']:g} req/s (measured)"
    )
    console.print(overload.table(rows, title))
    console.print(
        "goodput = SUCCESS within the SLO of its scheduled arrival, per second; met share = "
        "goodput over all computed; shed submit = Overloaded; shed claim = DeadlineExceeded "
        "(Celery: REVOKED, expired); late = computed after the deadline."
    )
    shed_tasks = (5000 if quick else 20000) if shed_tasks is None else shed_tasks
    costs = shed.measure(load_settings(), shed_tasks) if shed_tasks > 0 else []
    if costs:
        console.print(shed.table(costs))
    if json_path:
        from pathlib import Path

        out = {"points": rows, "shed_cost": costs}
        Path(json_path).write_text(json.dumps(out, indent=2) + "\n")
    if plot_path:
        overload.plot(rows, plot_path, title)


def _fleet_bench(profile, quick, systems, workers, json_path, plot_path) -> None:
    import json
    import tempfile
    from pathlib import Path

    from rich.console import Console

    from tandem.tools import fleet

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


def _autoscale_bench(quick, churn, json_path, plot_path):
    """Every policy on every trace, each on a stack of its own; --quick: a short step,
    tandem's signal and the KEDA-like policy, a 1 s cold start; --churn: 20 minutes of
    scale-ins under load, counting what they lose."""
    from rich.console import Console

    from tandem.broker.settings import load_settings
    from tandem.tools import autoscale
    from tandem.tools.bench import rows_table

    console = Console(width=180)  # the table has 14 columns
    if churn:
        plan = [("churn", autoscale.CHURN_TRACE, 1.0)]
    elif quick:
        plan = [(p, autoscale.QUICK_TRACE, 1.0) for p in ("tandem", "keda")]
    else:
        plan = [
            (p, trace, cold)
            for trace, colds in (
                (autoscale.TRACES["step"], (1.0, 4.0)),
                (autoscale.TRACES["ramp"], (4.0,)),
                (autoscale.TRACES["sawtooth"], (4.0,)),
            )
            for cold in colds
            for p in autoscale.POLICIES
        ]
    settings = load_settings()
    console.print("measuring one executor's capacity ...")
    capacity = autoscale.measure_capacity(settings)
    rows = []
    for policy, trace, cold in plan:
        console.print(f"{policy} on {trace.name}, cold start {cold:g} s ...")
        row = autoscale.run(policy, trace, cold_s=cold, settings=settings, capacity=capacity)
        rows.append(row)
        console.print(f"  {_brief(row, autoscale.COLUMNS)}")
    title = (
        f"tandem bench, profile autoscale: {autoscale.MODEL}, one executor {capacity:g} "
        f"tasks/s, SLO {autoscale.COST['slo_ms']:g} ms, time compressed {autoscale.COMPRESS}x"
    )
    console.print(rows_table(title, autoscale.COLUMNS, rows))
    if json_path:
        from pathlib import Path

        Path(json_path).write_text(json.dumps(rows, indent=1))
    if plot_path:
        autoscale.plot(rows, plot_path)


def _brief(row, columns) -> str:
    return ", ".join(f"{c} {row[c]}" for c in columns[3:])


def _device_bench(quick, json_path):
    """sim with host-stage costs, then cnn:1 (and minilm:1), staging on and off."""
    from rich.console import Console

    from tandem.broker.extras import installed
    from tandem.broker.settings import load_settings
    from tandem.tools import devicebench
    from tandem.tools.bench import rows_table

    console = Console(width=160)
    result = devicebench.main_rows(load_settings(), quick, embed=installed("embed"))
    columns = ("collate_ms", "copy_ms", "staging", "throughput", "of_ceiling", "mean_batch",
               "period_ms", "max_stage_ms", "sum_stages_ms")  # fmt: skip
    console.print(rows_table("tandem bench, profile device: sim, 20 ms a batch of 32", columns,
                             result["sim"]))  # fmt: skip
    for line in devicebench.period_check(result["sim"]):
        console.print(line)
    for row in result["models"]:
        shares = ", ".join(f"{k} {v:.0%}" for k, v in row["shares"].items())
        console.print(
            f"{row['model']} {'staged' if row['staging'] else 'serial'}: "
            f"{row['throughput']:g} tasks/s, batch {row['mean_batch']:g}; stage ms "
            f"{row['stages_ms']}; shares: {shares}"
        )
    if json_path:
        from pathlib import Path

        Path(json_path).write_text(json.dumps(result, indent=1))
