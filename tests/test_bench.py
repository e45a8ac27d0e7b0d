"""The benchmark harness itself, on a tiny sweep. It asserts consistency, never speed."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from helpers import tandem, wait_until

COLUMNS = {
    "system",
    "offered_rps",
    "achieved_rps",
    "p50_ms",
    "p95_ms",
    "p99_ms",
    "mean_batch",
    "lost",
    "failed",
}


def test_a_tiny_sweep_writes_consistent_json_and_a_png(tmp_path):
    pytest.importorskip("celery_batches")
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    done = subprocess.run(
        [
            "tandem",
            "bench",
            "--rates",
            "20",
            "--seconds",
            "1",
            "--json",
            str(out),
            "--plot",
            str(png),
            "--systems",
            "tandem,celery-plain,celery-batches/10ms",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads(out.read_text())
    assert [r["system"] for r in rows] == ["tandem", "celery-plain", "celery-batches/10ms", "limit"]
    for row in rows:
        assert set(row) >= COLUMNS
    for row in rows[:-1]:
        assert row["lost"] == 0 and row["failed"] == 0
        assert 0 < row["achieved_rps"] <= row["offered_rps"] * 2 + 5  # Poisson noise over 1 s
        assert 0 < row["p50_ms"] <= row["p95_ms"] <= row["p99_ms"]
        assert row["mean_batch"] >= 1
    limit = rows[-1]
    assert limit["p50_ms"] == 20.5  # the sim model's cost of one item
    assert limit["achieved_rps"] == pytest.approx(2 * 32 / 36 * 1000, rel=1e-3)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "floor = compute of 1 item" in done.stdout
    # Not a terminal (a pipe here): a line per point as it is measured, not silence.
    for row in rows[:-1]:
        assert f"{row['system']} at 20/s: {row['achieved_rps']:g} done/s" in done.stdout


def test_the_fleet_profile_parts_measure_what_they_say(tmp_path):
    """Each part on a tiny scale: route cost, the whole path, idle load, fairness."""
    pytest.importorskip("matplotlib")
    from tandem.tools import fleet

    (row,) = [fleet.route_cost(4, 1000, tmp_path)]
    assert row["executors"] == 4
    assert row["all_busy_us_per_route"] > 0 and row["one_idle_us_per_route"] > 0
    path = fleet.path_cost(300, tmp_path / "path")
    assert path["tasks"] == 300 and path["batches"] >= 1
    assert path["redis_cpu_us_per_task"] > 0 and path["script_us_per_task"] > 0
    idle = fleet.idle_load(6, 3, 1.0, tmp_path)
    assert (idle["idle_executors"], idle["workers"]) == (6, 2)
    assert idle["redis_calls_per_s"] > 0 and idle["coordinator_cpu_percent"] > 0
    fair = fleet.fairness(3, 20, 0.5, tmp_path)
    assert fair["tasks"] == 10 and len(fair["per_executor"]) == 3
    report = {"route": [row], "path": path, "idle": idle, "fairness": fair}
    fleet.plot_fleet(report, str(tmp_path / "fleet.png"))
    assert (tmp_path / "fleet.png").stat().st_size > 0


def test_the_overhead_profile_counts_every_result_and_traced_every_span(tmp_path):
    """Run as `--tracing on`: every process exports to the sink, which gets each tandem
    task's spans; the workers' and the producer's CPU per task are measured."""
    pytest.importorskip("celery_batches")
    pytest.importorskip("opentelemetry.sdk")
    from tandem.broker import tracing
    from tandem.tools import fleet
    from tandem.tools.tracesink import traced

    with traced("on") as sink:
        rows = fleet.run_overhead(
            ["tandem", "celery-plain"], tmp_path, quick=True, workers=1, tasks=300
        )
        # Each task's process and queue wait spans, exported within the run's settling.
        wait_until(lambda: sink.spans() >= 2 * 300, 30, "every task's spans at the sink")
    assert tracing.tracer() is None  # the run's OTEL_* are gone, and so is its tracing
    assert [r["system"] for r in rows] == ["tandem", "celery-plain"]
    for row in rows:
        assert row["tasks"] == 300 and row["tasks_per_s"] > 0
        assert row["workers_cpu_us_per_task"] > 0 and row["producer_cpu_us_per_task"] > 0
        assert row["redis_cpu_us_per_task"] > 0 and row["mean_batch"] >= 1
        assert row["redis_us_per_task_by_command"]  # Redis's time per task, by command
    by_command = rows[0]["redis_us_per_task_by_command"]
    # tandem's scripts' own time, and the SET inside complete.lua that stores each result
    assert by_command["evalsha"] > 0 and by_command["set"] > 0
    fleet.plot_overhead(rows, str(tmp_path / "overhead.png"))
    assert (tmp_path / "overhead.png").stat().st_size > 0


def test_the_overhead_profile_names_an_unknown_system(tmp_path):
    done = tandem("bench", "--profile", "overhead", "--systems", "nope", cwd=tmp_path)
    assert done.returncode == 2
    assert "unknown system 'nope'" in done.stderr


def test_the_overload_profile_accounts_for_every_task(tmp_path):
    """One point at twice an assumed capacity, and the cost of shedding on a tiny scale:
    every task sent is good, late, shed, failed, unfinished or lost, and none is lost."""
    pytest.importorskip("matplotlib")
    from tandem.broker.settings import load_settings
    from tandem.tools import overload, shed
    from tandem.tools.harness import SYSTEMS

    settings = load_settings(env={}).replace(models=(overload.MODEL,), loglevel="WARNING")
    row = overload.run_point(
        SYSTEMS["tandem"],
        settings,
        load=2.0,
        capacity=400.0,
        slo_ms=250.0,
        seconds=1.0,
        workers=1,
        drain_s=5.0,
    )
    good = round(row["goodput_rps"] * 1.0)
    parts = ("late", "shed_submit", "shed_claim", "failed", "unfinished", "lost")
    assert row["sent"] == good + sum(row[p] for p in parts)
    assert row["lost"] == 0 and row["failed"] == 0 and row["sent"] > 0
    assert row["computed"] == good + row["late"]
    overload.plot([row], str(tmp_path / "overload.png"), "tiny")
    assert (tmp_path / "overload.png").stat().st_size > 0
    shedding, computing = shed.measure(settings, 200)
    assert shedding["answered"] == computing["answered"] == 200
    assert 0 < shedding["shed_by_prediction"] <= 200
    assert shedding["worker_cpu_us_per_task"] > 0 and computing["redis_cpu_us_per_task"] > 0


def test_the_overload_profile_names_a_bad_load(tmp_path):
    done = tandem("bench", "--profile", "overload", "--loads", "2,x", cwd=tmp_path)
    assert done.returncode == 2
    assert "--loads" in done.stderr


def test_the_http_profile_times_the_gateway_over_http_and_grpc_next_to_a_direct_client():
    pytest.importorskip("uvicorn")
    from tandem.broker.settings import load_settings
    from tandem.tools import httpbench

    report = httpbench.run_http(
        load_settings(env={}, loglevel="WARNING"),
        workers=1,
        progress=lambda text: None,
        spacings_ms=(1.0,),
        tasks=6,
        block=3,
        concurrencies=(4,),
        burst=200,
        rates=(20.0,),
        seconds=1.0,
    )
    direct, http, grpc, floor = report["low_load"]
    paths = [row["path"] for row in report["low_load"]]
    assert paths == ["direct", "http", "grpc", "grpc floor"]
    assert direct["added_p50_ms"] == 0
    assert all(row["requests"] == 6 and row["p50_ms"] > 0 for row in (http, grpc, floor))
    assert [cpu["protocol"] for cpu in report["cpu"]] == ["http", "grpc", "grpc floor"]
    for cpu in report["cpu"]:
        assert cpu["failed"] == 0 and cpu["requests"] == 200
        assert cpu["requests_per_s"] > 0 and cpu["gateway_cpu_us_per_request"] > 0
    assert [row["path"] for row in report["sweep"]] == ["direct", "http"]
    assert all(row["failed"] == 0 and row["p50_ms"] > 0 for row in report["sweep"])


def test_the_latency_profile_times_every_path_alike(tmp_path):
    from tandem.broker.settings import load_settings
    from tandem.tools import latency

    report = latency.run_latency(
        load_settings(env={}, loglevel="WARNING"), spacings_ms=(1.0,), tasks=6, block=3
    )
    bare, floor, tandem_row = report["rows"]
    assert [bare["path"], floor["path"], tandem_row["path"]] == ["bare", "floor", "tandem"]
    for row in report["rows"]:
        assert row["tasks"] == 6 and 0 < row["p50_ms"] <= row["p99_ms"]
        assert row["send_p50_ms"] > 0 and row["wait_p50_ms"] > 0
    assert bare["ratio_p50"] == 1.0 and floor["over_floor_p50"] == 1.0
    commands = {row["command"] for row in report["redis_us"]}
    assert {"route_one", "complete"} <= commands  # its own scripts, timed by Redis
    # The hop table: every step of a task's path, in the path's order. The producer's steps
    # are seen for each task; the worker's, for each task that found it idle (its L2 wait),
    # which a loaded machine may make fewer than all.
    hops = {row["step"]: row for row in report["hops"]}
    assert len(hops) == 7 and all(row["tasks"] >= 1 for row in hops.values())
    producer = ("the producer sends the route script", "submit returns",
                "the producer has the result")  # fmt: skip
    assert all(hops[step]["tasks"] == 3 for step in producer)
    at = {step: row["at_ms"] for step, row in hops.items()}
    assert (
        0 < at["the producer sends the route script"] < at["the worker's BLMOVE returns the task"]
    )
    assert at["the worker's BLMOVE returns the task"] < at["the worker sends the store script"]
    assert at["the worker sends the store script"] < at["the producer has the result"]
    assert at["the producer has the route script's reply"] <= at["submit returns"]
    # The floor's steps, noted the same way, alongside: seen for every step, in order.
    floor = [hops[step]["floor_at_ms"] for step in (
        "the producer sends the route script", "the worker's BLMOVE returns the task",
        "the worker sends the store script", "the producer has the result",
    )]  # fmt: skip
    assert all(v is not None for v in floor) and floor == sorted(floor) and floor[0] > 0


def test_a_hop_is_its_own_tasks_even_when_it_comes_after_the_next_submit():
    from tandem.tools.hops import hop_rows

    ms = 1_000_000
    timed = [(0, 2 * ms, 3 * ms), (4 * ms, 6 * ms, 7 * ms)]  # (submit, returned, result)
    worker = [
        (1 * ms, "wait_l2", "after"),
        (int(1.5 * ms), "complete", "before"),
        (int(4.5 * ms), "complete", "after"),  # the first task's reply, after the second submit
        (5 * ms, "wait_l2", "after"),
        (int(5.5 * ms), "complete", "before"),
        (int(6.5 * ms), "complete", "after"),
    ]
    producer = [(int(0.5 * ms), "route", "before"), (int(1.8 * ms), "route", "after")]
    producer += [(at + 4 * ms, step, when) for at, step, when in producer]
    rows = {row["step"]: row for row in hop_rows(timed, {"producer": producer, "worker": worker})}
    assert rows["the worker has the store script's reply"] == {
        "step": "the worker has the store script's reply",
        "at_ms": 3.5,
        "tasks": 2,
    }  # fmt: skip  (4.5 ms after the first submit, 2.5 ms after the second: median 3.5)
    assert rows["the worker's BLMOVE returns the task"]["at_ms"] == 1.0
    assert rows["the producer has the result"]["at_ms"] == 3.0
    assert all(row["tasks"] == 2 for row in rows.values())


def test_the_replicas_profile_times_both_settings(tmp_path):
    from tandem.broker.settings import load_settings
    from tandem.tools import replicas

    report = replicas.run_replicas(
        load_settings(env={}, loglevel="WARNING"), tasks=5, blocks=1, spacing_ms=1.0
    )
    assert [row["min_replicas"] for row in report["rows"]] == [0, 1]
    for row in report["rows"]:
        assert row["tasks"] == 5 and 0 < row["p50_ms"] <= row["p99_ms"]


def test_the_autoscale_profile_accounts_for_every_task(tmp_path):
    """tandem's signal on a short step with a cold start: the stack scales out, and every
    task offered is answered in time, late, shed, refused, failed or lost; none is lost
    or answered twice."""
    pytest.importorskip("matplotlib")
    from tandem.broker.settings import load_settings
    from tandem.tools import autoscale

    trace = autoscale.Trace("tiny-step", 12, lambda t: 3.0 if t >= 3 else 1.0, step_at=3)
    row = autoscale.run("tandem", trace, cold_s=0.5, settings=load_settings(env={}))
    good = round(row["attainment"] * row["offered"])
    parts = ("late", "shed", "refused", "failed", "lost")
    assert row["offered"] == good + sum(row[p] for p in parts)
    assert row["lost"] == 0 and row["duplicated"] == 0 and row["failed"] == 0
    assert max(alive for _, alive, _, _ in row["timeline"]) > 1  # it scaled out
    assert row["executor_s"] > 0 and row["vs_oracle"] > 0 and row["formula_vs_oracle"] > 0
    assert 0 <= row["attainment_after"] <= 1  # outside the reaction to the step
    autoscale.plot([row], str(tmp_path / "autoscale.png"))
    assert (tmp_path / "autoscale.png").stat().st_size > 0


def test_the_autoscale_measures_are_what_they_say():
    from tandem.tools import autoscale

    # A scale-in, then a scale-out within the flap window, is a flap; one after it is not.
    timeline = [(0, 2, 2, 2), (1, 1, 1, 1), (2, 2, 1, 2), (30, 1, 1, 1), (60, 2, 2, 2)]
    assert autoscale._flaps(timeline) == 1
    step = autoscale.Trace("s", 10, lambda t: 2.0 if t >= 4 else 1.0, step_at=4)
    assert autoscale._to_enough(step, [(4, 1, 1, 2), (5.5, 2, 1, 2), (7, 2, 2, 2)]) == 3.0
    # The oracle plans on the trace's own arrivals at the measured capacity, and starts
    # each executor its cold start ahead.
    low, high = (autoscale.Trace("flat", 10, lambda t, x=x: x) for x in (0.5, 2.5))
    assert autoscale.oracle_executor_s(low, 0, autoscale.NOMINAL_CAPACITY) == 10
    assert 20 < autoscale.oracle_executor_s(high, 0, autoscale.NOMINAL_CAPACITY) < 30
    assert autoscale.oracle_executor_s(step, 0, 40) < autoscale.oracle_executor_s(step, 3, 40)
    # The formula with no delay and no window: 1x is one executor's capacity, so any
    # headroom asks for two; 2x asks for three; with none, exactly what the load is.
    assert autoscale.formula_executor_s(step, 0) == 4 * 2 + 6 * 3
    assert autoscale.formula_executor_s(step, 0, headroom=0.0) == 4 * 1 + 6 * 2
    assert autoscale.formula_executor_s(step, 2, headroom=0.0) == 2 * 1 + 8 * 2
    assert autoscale.formula_executor_s(low, 0) == 10  # at least one


def test_the_script_cost_measures_every_script_on_a_tasks_path():
    """tools/scriptcost.py: its figures come from the scripts it says it ran, and they
    add up."""
    from tandem.tools import scriptcost

    found = scriptcost.run(rounds=1)
    assert found["tasks"] == scriptcost.BLOCK * scriptcost.BATCH
    assert found["metrics_fields"] > 20  # the histograms filled as a real model fills them
    spent = found["us_per_task"]
    assert set(spent) == {"route", "claim_or_idle", "complete", "count", "all"}
    parts = sum(v for k, v in spent.items() if k != "all")
    assert spent["all"] == pytest.approx(parts, abs=0.05) and all(spent.values())


def test_the_script_cost_times_claims_from_a_backlog():
    """tools/scriptcost.py --backlog: a figure per L1 length, from full claims only (the
    tool asserts each claim took a whole batch)."""
    from tandem.tools import scriptcost

    found = scriptcost.backlog([10, 9000], claims=3)
    assert list(found) == [10, 9000] and all(us > 0 for us in found.values())
