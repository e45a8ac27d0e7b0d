"""The pipeline: batch N+1 is claimed and prepared while batch N computes, and the
no-pipeline switch turns that off. Real workers, a real Redis."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from helpers import executors_of, wait_until
from tandem.broker import keys
from tandem.broker.faults import ENV as FAULTS
from tandem.broker.table import Table
from tandem.producers.client import Client
from tandem.workers.models.sim import SimModel


def test_the_next_batch_is_claimed_and_prepared_while_one_computes(processes, settings, r):
    """A burst of 40 on an idle executor: one task to its L2, 39 to L1 in the same script
    call. While that one computes (3 s), the next 32 move into in-flight, prepared; then
    they compute as one batch, and the last 7 after them."""
    processes.worker("w1", sim_base_ms=3000.0, sim_per_item_ms=0.0)
    (executor,) = executors_of(r, "w1")
    with Client(settings=settings) as client:
        results = client.submit_many("sim:1", [[n] for n in range(40)])
        assert [x.route for x in results] == ["L2"] + ["L1"] * 39
        wait_until(lambda: r.llen(keys.inflight(executor.id)) == 33, 10, "claimed early")
        assert not results[0].ready()  # all this while the first batch computes
        assert Table(r).l1_depth("sim:1") == 7
        assert [x.get(timeout=60) for x in results] == [[n] for n in range(40)]
    wait_until(lambda: executors_of(r, "w1")[0].tasks == 40, 10, "all stored")
    assert executors_of(r, "w1")[0].batches == 3


def test_without_the_pipeline_nothing_is_claimed_during_a_compute(
    processes, settings, r, monkeypatch
):
    """Every claim.lua call fails, so a worker that used one would crash: with
    --no-pipeline it serves every task through claim_or_idle alone."""
    monkeypatch.setenv(FAULTS, "claim:before:*:crash")
    processes.worker("w1", sim_base_ms=200.0, pipeline=False)
    with Client(settings=settings) as client:
        first = client.submit("sim:1", [0])
        rest = client.submit_many("sim:1", [[n] for n in range(1, 6)])
        assert first.get(timeout=30) == [0]
        assert [x.get(timeout=30) for x in rest] == [[n] for n in range(1, 6)]
    assert "injected fault" not in processes.log("w1")


def test_sim_prep_costs_cpu_with_the_gil_held():
    model = SimModel(base_ms=0.0, per_item_ms=0.0, prep_ms=20.0)
    wall, cpu = time.perf_counter(), time.thread_time()
    assert model.validate([1, 2]) == [1, 2]
    assert time.perf_counter() - wall >= 0.020  # it lasts prep_ms ...
    assert time.thread_time() > cpu  # ... running on this thread, not sleeping


def test_the_gpu_check_runs_end_to_end_on_the_cpu(tmp_path):
    """tools/gpu_check.py, as benchmarks/gpu_check.sh runs it on a GPU, with the device
    swapped: each run, staging on and off, the outputs' check (device_busy, the idle gap
    and the copy bandwidth need CUDA)."""
    out = tmp_path / "rows.json"
    script = Path(__file__).parent.parent / "benchmarks" / "gpu_check.sh"
    args = [sys.executable, "-m", "tandem.tools.gpu_check", "--device", "cpu"]
    args += ["--sizes", "3", "--batches", "2", "--models", "cnn:1"]
    done = subprocess.run([*args, "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert result["identical"] == {"cnn:1": True}
    rows = result["runs"]
    assert [(r["max_batch"], r["staging"]) for r in rows] == [(3, True), (3, False)]
    for row in rows:
        assert row["tasks"] == 2 * row["max_batch"] and row["tasks_per_s"] > 0
        assert row["device_busy"] is None and 0 < row["forward_busy"] <= 1.5
        assert {"collate", "compute", "split"} <= set(row["stages_ms"])
    assert result["bandwidth"] == {"cnnx3": None, "minilmx3": None}
    shell = subprocess.run(["bash", "-n", str(script)], capture_output=True)
    assert shell.returncode == 0, shell.stderr


def test_a_gpu_time_reaches_the_metrics():
    """A model that reports last_device_ms (CUDA events) has it counted as device_ms."""
    from tandem.workers.computed import Computed
    from tandem.workers.hooks import Metrics

    done = Computed([], {0: [1]}, compute_ms=3.0, device_ms=2.5)
    counts = Metrics().counters(None, done)
    assert counts["device_ms:sum"] == 2.5 and counts["device_ms:count"] == 1
    assert "device_ms:sum" not in Metrics().counters(None, Computed([], {0: [1]}, compute_ms=3.0))
