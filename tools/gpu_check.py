"""The stages on a GPU, in a few minutes (benchmarks/gpu_check.sh): for minilm:1 and cnn:1
at max batches of 1, 32 and 128, one worker at saturation with staging on and off:

- throughput, each stage's mean time, the device's busy share (CUDA events around each
  forward pass) and its idle gap between forward passes, per batch;
- the bandwidth of a batch's copy to the device from a reused pinned slot, from memory
  pinned for that batch (pin_memory()), and from pageable memory;
- whether the staged outputs, batches interleaved as the executor runs them, are
  bit-identical to the serial path's.

    python -m tandem.tools.gpu_check [--device cuda] [--sizes 1,32,128] [--batches 30]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

from tandem.broker import keys
from tandem.broker.settings import load_settings
from tandem.producers.client import Client
from tandem.stack import Stack
from tandem.tools.harness import counted
from tandem.workers import stages
from tandem.workers.models.repository import Repository

MODELS = ("minilm:1", "cnn:1")
STAGES = ("collate", "copy_in", "compute", "copy_out", "split")


def repository(folder: Path, model: str, max_batch: int) -> Path:
    """A copy of a shipped model's folder with this max batch and no batch window."""
    name, version = model.split(":")
    source = Repository().root / name / version
    target = folder / f"repo-{name}-{max_batch}" / name / version
    shutil.copytree(source, target, dirs_exist_ok=True)
    config = json.loads((target / "config.json").read_text())
    config.update(max_batch_size=max_batch, max_wait_ms=0)
    (target / "config.json").write_text(json.dumps(config))
    return target.parent.parent


def inputs(model: str, count: int) -> list[Any]:
    if model == "cnn:1":
        torch.manual_seed(0)
        return [torch.randn(3, 32, 32) for _ in range(count)]
    return [f"sentence number {n} about batching on a device" for n in range(count)]


def run(device: str, model: str, max_batch: int, staging: bool, batches: int, folder: Path):
    """One worker at saturation: a burst of `batches` full batches after a warm-up."""
    settings = load_settings(
        models=(model,),
        device=device,
        staging=staging,
        repository=str(repository(folder, model, max_batch)),
    )
    tasks = max_batch * batches
    data = folder / f"run-{model.replace(':', '.')}-{max_batch}-{staging}"
    with Stack(settings, workers=1, data_dir=data) as stack, Client(settings=stack.settings) as c:
        for result in c.submit_many(model, inputs(model, max_batch)):
            result.get(timeout=300)
        counted(c.redis, model, max_batch)  # the warm-up's counts in, before they go
        c.redis.delete(keys.metrics(model))
        started = time.perf_counter()
        for result in c.submit_many(model, inputs(model, tasks)):
            result.get(timeout=600)
        elapsed_ms = (time.perf_counter() - started) * 1000
        m = counted(c.redis, model, tasks)
    count = max(m.get("batch_size:count", 1), 1)
    device_ms = m.get("device_ms:sum")
    return {
        "model": model,
        "max_batch": max_batch,
        "staging": staging,
        "tasks": tasks,
        "tasks_per_s": round(tasks / elapsed_ms * 1000, 1),
        "mean_batch": round(m.get("batch_size:sum", 0) / count, 1),
        "stages_ms": {
            s: round(m[f"{s}_ms:sum"] / m[f"{s}_ms:count"], 3)
            for s in STAGES
            if m.get(f"{s}_ms:count")
        },
        "device_busy": round(device_ms / elapsed_ms, 3) if device_ms is not None else None,
        # The device idle between two forward passes, per batch, and against one of them.
        "idle_gap_ms": round((elapsed_ms - device_ms) / count, 3) if device_ms else None,
        "idle_of_forward": round((elapsed_ms - device_ms) / device_ms, 3) if device_ms else None,
        "forward_busy": round(m.get("compute_ms:sum", 0) / elapsed_ms, 3),
    }


def bandwidth(device: str, batch: torch.Tensor, repeats: int = 20) -> dict[str, float] | None:
    """GB/s of a batch's trip to the device: from a reused pinned slot, from memory pinned
    for it, from pageable memory (wall time, the host's side included). None off CUDA."""
    if not device.startswith("cuda"):
        return None
    slot = torch.empty_like(batch).pin_memory()
    ways = {
        "pinned_slot": lambda: slot.copy_(batch).to(device, non_blocking=True),
        "pin_per_batch": lambda: batch.pin_memory().to(device, non_blocking=True),
        "pageable": lambda: batch.to(device),
    }
    out = {}
    for name, way in ways.items():
        way()
        torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(repeats):
            way()
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - started) / repeats
        out[name] = round(batch.numel() * batch.element_size() / seconds / 1e9, 2)
    return out


def identical(device: str, model: str, sizes: list[int]) -> bool:
    """Staged, interleaved as the executor runs them, against the serial path."""
    loaded = Repository().load(model, device=device)
    batches = [[loaded.validate(x) for x in inputs(model, n)] for n in sizes]
    serial = [loaded.run(b) for b in batches]
    got, ahead = [], None
    for n, items in enumerate(batches):
        job = ahead or stages.stage_in(loaded, items)
        stages.compute(loaded, job)
        box: list = []
        if n + 1 < len(batches):
            stager = threading.Thread(
                target=lambda i=batches[n + 1], b=box: b.append(stages.stage_in(loaded, i))
            )
            stager.start()
            got.append(stages.finish(loaded, job))
            stager.join()
        else:
            got.append(stages.finish(loaded, job))
        ahead = box[0] if box else None
    return got == serial


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--sizes", default="1,32,128")
    parser.add_argument("--batches", type=int, default=30, help="Batches per run.")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--json", help="Write the rows here too.")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    out: dict[str, Any] = {"device": args.device, "runs": [], "bandwidth": {}, "identical": {}}
    if args.device.startswith("cuda"):
        out["card"] = torch.cuda.get_device_name(torch.device(args.device))
    with tempfile.TemporaryDirectory(prefix="tandem-gpu-") as folder:
        for model in args.models.split(","):
            out["identical"][model] = identical(args.device, model, sizes)
            print(model, "staged outputs identical:", out["identical"][model], flush=True)
            for size in sizes:
                for staging in (True, False):
                    row = run(args.device, model, size, staging, args.batches, Path(folder))
                    out["runs"].append(row)
                    print(json.dumps(row), flush=True)
    for size in sizes:
        for name, shape in (("cnn", (size, 3, 32, 32)), ("minilm", (size, 256))):
            batch = torch.randn(shape) if name == "cnn" else torch.randint(0, 30000, shape)
            out["bandwidth"][f"{name}x{size}"] = bandwidth(args.device, batch)
    print(json.dumps(out["bandwidth"]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
