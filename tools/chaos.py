"""A saboteur model for soaks and tests: y = x, except on its two marked inputs.

Serve it from a repository whose config names ``"artifact": {"factory":
"tandem.tools.chaos:saboteur"}`` (see `write_repository`). An input holding KILL makes the
worker process exit at once with code KILL, as a segfault would; one holding HANG blocks
the forward pass for ever, as a stuck kernel would. Never serve it in production.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import torch

KILL = 13
HANG = 14


class Saboteur(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool((x == KILL).any()):
            os._exit(KILL)
        if bool((x == HANG).any()):
            threading.Event().wait()  # a hung kernel: never returns
        return x.clone()


def saboteur(config) -> torch.nn.Module:
    return Saboteur()


def write_repository(root: Path, name: str = "saboteur", max_batch: int = 8) -> Path:
    """Write `name`:1, a saboteur taking float32 [4], into the repository `root`."""
    folder = Path(root) / name / "1"
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "max_batch_size": max_batch,
        "inputs": [{"name": "x", "dtype": "float32", "shape": [4]}],
        "outputs": [{"name": "y", "dtype": "float32", "shape": [4]}],
        "artifact": {"factory": "tandem.tools.chaos:saboteur"},
    }
    (folder / "config.json").write_text(json.dumps(config))
    return Path(root)
