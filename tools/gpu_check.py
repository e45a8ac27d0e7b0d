"""The pipeline on a GPU: one worker serving minilm:1, a burst per batch size, with and
without the pipeline. For each: throughput, and the share of the run the device was
busy (CUDA events around each forward pass) and the device thread was (wall time of
each forward, with collate and copies). Run by benchmarks/gpu_check.sh.

    python -m tandem.tools.gpu_check [--device cuda] [--sizes 1,32,128] [--batches 30]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from tandem.broker import keys
from tandem.broker.settings import load_settings
from tandem.producers.client import Client
from tandem.stack import Stack
from tandem.workers.models.repository import Repository

MODEL = "minilm:1"


def repository(folder: Path, max_batch: int) -> Path:
    """A copy of the shipped minilm config with this max batch and no batch window."""
    config = json.loads((Repository().root / "minilm" / "1" / "config.json").read_text())
    config.update(max_batch_size=max_batch, max_wait_ms=0)
    target = folder / f"repo-{max_batch}" / "minilm" / "1"
    target.mkdir(parents=True, exist_ok=True)
    (target / "config.json").write_text(json.dumps(config))
    return target.parent.parent


def run(device: str, max_batch: int, pipeline: bool, batches: int, folder: Path) -> dict:
    settings = load_settings(
        models=(MODEL,),
        device=device,
        pipeline=pipeline,
        repository=str(repository(folder, max_batch)),
    )
    tasks = max_batch * batches
    texts = [f"sentence number {n} about batching on a device" for n in range(tasks)]
    data = folder / f"run-{max_batch}-{pipeline}"
    with Stack(settings, workers=1, data_dir=data) as stack, Client(settings=stack.settings) as c:
        c.submit(MODEL, "warm up").get(timeout=300)
        c.redis.delete(keys.metrics(MODEL))
        started = time.perf_counter()
        for result in c.submit_many(MODEL, texts):
            result.get(timeout=600)
        elapsed_ms = (time.perf_counter() - started) * 1000
        raw = c.redis.hgetall(keys.metrics(MODEL))
    m = {k.decode(): float(v) for k, v in raw.items()}
    device_ms = m.get("device_ms:sum")
    return {
        "max_batch": max_batch,
        "pipeline": pipeline,
        "tasks": tasks,
        "tasks_per_s": round(tasks / elapsed_ms * 1000, 1),
        "mean_batch": round(m.get("batch_size:sum", 0) / max(m.get("batch_size:count", 1), 1), 1),
        "device_busy": round(device_ms / elapsed_ms, 3) if device_ms is not None else None,
        "forward_busy": round(m.get("compute_ms:sum", 0) / elapsed_ms, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--sizes", default="1,32,128")
    parser.add_argument("--batches", type=int, default=30, help="Batches per run.")
    parser.add_argument("--json", help="Write the rows here too.")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="tandem-gpu-") as folder:
        for size in (int(s) for s in args.sizes.split(",")):
            for pipeline in (True, False):
                rows.append(run(args.device, size, pipeline, args.batches, Path(folder)))
                print(json.dumps(rows[-1]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
