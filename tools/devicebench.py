"""`tandem bench --profile device`: what moving the host stages off the device thread buys
(workers/stages.py), on this machine's CPU.

One worker, one executor, a burst far larger than a batch (saturation, no deadlines),
with staging on and off side by side:

- sim, its compute fixed, its host stages (collate; a copy in and a copy out, each
  COPY_MS of wall time as a DMA engine's) from none up to the compute's own length. The
  compute-only ceiling is max_batch / compute; serially a batch takes the sum of its
  stages, staged the longest of them;
- cnn:1 and minilm:1 (with the embed extra), the share of each stage in a batch's time.

Throughput is timed between the 10th and the 90th percentile of the results' arrivals;
the period is the mean time from one compute's start to the next (batch size /
throughput); stage times are the means of the executor's own histograms over the burst.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from tandem.broker.settings import Settings
from tandem.producers.client import Client
from tandem.stack import Stack
from tandem.tools.harness import Recorder, Report, burst_rate, counted

STAGES = ("collate", "copy_in", "compute", "copy_out", "split")
#: sim: a 20 ms compute per batch of 32 (1,600 tasks/s), host stages of (collate, copy) ms.
SIM = {"sim_base_ms": 20.0, "sim_per_item_ms": 0.0, "max_batch": 32, "max_wait_ms": 0.0}
SIM_STAGES = ((0.0, 0.0), (5.0, 5.0), (10.0, 10.0), (20.0, 20.0))
QUICK_STAGES = ((0.0, 0.0), (10.0, 10.0))


def burst(
    settings: Settings, model: str, inputs: list[Any], *, staging: bool, warm: list[Any]
) -> dict[str, Any]:
    """One worker at saturation on `inputs`; its throughput, period and stage means."""
    settings = settings.replace(models=(model,), staging=staging, slo_ms=0.0)
    with (
        tempfile.TemporaryDirectory(prefix="tandem-device-") as folder,
        Stack(settings, workers=1, data_dir=Path(folder)) as stack,
    ):
        client = redis.Redis.from_url(stack.url)
        recorder = Recorder(stack.url)
        producer = Client(settings=stack.settings)
        try:
            sent = producer.submit_many(model, warm)
            recorder.wait(len(sent), 120, stack.check)
            before = counted(client, model, len(sent))
            results = producer.submit_many(model, inputs)
            recorder.wait(len(sent) + len(results), 600, stack.check)
            after = counted(client, model, len(sent) + len(results))
        finally:
            arrived = recorder.collect()
            producer.close()
            client.close()
    times = [arrived[r.id].at for r in results if r.id in arrived]
    rate = burst_rate(times)
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    batches = delta.get("batch_size:count", 0.0)
    mean_batch = delta.get("batch_size:sum", 0.0) / batches if batches else 0.0
    means = {
        stage: round(delta[f"{stage}_ms:sum"] / delta[f"{stage}_ms:count"], 2)
        for stage in STAGES
        if delta.get(f"{stage}_ms:count")
    }
    return {
        "model": model,
        "staging": staging,
        "tasks": len(results),
        "answered": len(times),
        "throughput": round(rate, 1),
        "mean_batch": round(mean_batch, 1),
        "period_ms": round(mean_batch * 1000 / rate, 2) if rate else None,
        "stages_ms": means,
    }


def sim_rows(settings: Settings, quick: bool) -> list[dict[str, Any]]:
    """sim at each host-stage cost, staging on and off."""
    rows = []
    batches = 20 if quick else 60
    inputs = [[n] for n in range(batches * int(SIM["max_batch"]))]
    for collate_ms, copy_ms in QUICK_STAGES if quick else SIM_STAGES:
        chosen = settings.replace(**SIM, sim_collate_ms=collate_ms, sim_copy_ms=copy_ms)
        for staging in (True, False):
            row = burst(chosen, "sim:1", inputs, staging=staging, warm=inputs[:64])
            compute = SIM["sim_base_ms"]
            row.update(
                collate_ms=collate_ms,
                copy_ms=copy_ms,
                ceiling=round(SIM["max_batch"] * 1000 / compute, 1),
                max_stage_ms=max(compute, collate_ms, copy_ms),
                sum_stages_ms=compute + collate_ms + 2 * copy_ms,
            )
            row["of_ceiling"] = round(row["throughput"] / row["ceiling"], 3)
            rows.append(row)
    return rows


def model_rows(settings: Settings, quick: bool, embed: bool) -> list[dict[str, Any]]:
    """cnn:1 (and minilm:1), staging on and off: the stages' shares."""
    import torch

    rows = []
    count = 256 if quick else 1024
    torch.manual_seed(0)
    images = [torch.randn(3, 32, 32) for _ in range(64)]  # the binary tensor payload
    plans: list[tuple[str, list[Any]]] = [("cnn:1", [images[n % 64] for n in range(count)])]
    if embed:
        text = "the quick brown fox jumps over a lazy dog while tandem batches it"
        texts = [" ".join(text.split(" ")[: 3 + n % 10]) for n in range(count)]
        plans.append(("minilm:1", texts))
    for model, inputs in plans:
        for staging in (True, False):
            row = burst(settings, model, inputs, staging=staging, warm=inputs[:64])
            total = sum(row["stages_ms"].values()) or 1.0
            row["shares"] = {k: round(v / total, 3) for k, v in row["stages_ms"].items()}
            rows.append(row)
    return rows


def period_check(rows: list[dict[str, Any]]) -> list[str]:
    """One line per sim row: the period against max(stage) and the sum of the stages."""
    lines = []
    for row in rows:
        lines.append(
            f"collate {row['collate_ms']:g} ms, copies {row['copy_ms']:g} ms, "
            f"{'staged' if row['staging'] else 'serial'}: period {row['period_ms']} ms "
            f"(max stage {row['max_stage_ms']:g}, sum {row['sum_stages_ms']:g}), "
            f"{row['throughput']:g} tasks/s, {row['of_ceiling']:.0%} of the compute-only "
            f"ceiling {row['ceiling']:g}"
        )
    return lines


def main_rows(settings: Settings, quick: bool, embed: bool) -> dict[str, list]:
    started = time.monotonic()
    out: dict[str, list] = {
        "sim": sim_rows(settings, quick),
        "models": model_rows(settings, quick, embed),
    }
    out["seconds"] = [round(time.monotonic() - started)]
    return out


COLUMNS = (
    "collate_ms",
    "copy_ms",
    "staging",
    "throughput",
    "of_ceiling",
    "mean_batch",
    "period_ms",
    "max_stage_ms",
    "sum_stages_ms",
)


def report(settings: Settings, *, quick: bool, embed: bool) -> Report:
    """sim with host-stage costs, then cnn:1 (and minilm:1), staging on and off."""
    data = main_rows(settings, quick, embed)
    out = Report(data).table(
        "tandem bench, profile device: sim, 20 ms a batch of 32", COLUMNS, data["sim"]
    )
    for line in period_check(data["sim"]):
        out.line(line)
    for row in data["models"]:
        shares = ", ".join(f"{k} {v:.0%}" for k, v in row["shares"].items())
        out.line(
            f"{row['model']} {'staged' if row['staging'] else 'serial'}: "
            f"{row['throughput']:g} tasks/s, batch {row['mean_batch']:g}; stage ms "
            f"{row['stages_ms']}; shares: {shares}"
        )
    return out
