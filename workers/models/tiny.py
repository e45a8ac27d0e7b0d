"""A tiny torch MLP with fixed, seeded weights: 8 floats in, 4 floats out.

It exercises the real torch path on every commit: validate, collate, one
forward pass under inference_mode, split.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from tandem.broker.errors import BadInput
from tandem.workers import stages
from tandem.workers.models.loading import pick_device

IN_FEATURES = 8
OUT_FEATURES = 4
SEED = 1234


class TinyModel:
    SIGNATURE = {
        "inputs": [{"name": "x", "dtype": "float32", "shape": [IN_FEATURES]}],
        "outputs": [{"name": "y", "dtype": "float32", "shape": [OUT_FEATURES]}],
    }

    def __init__(self, device: str = "auto") -> None:
        self.device = pick_device(device)
        generator = torch.Generator().manual_seed(SEED)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(IN_FEATURES, 16), torch.nn.Tanh(), torch.nn.Linear(16, OUT_FEATURES)
        )
        with torch.no_grad():
            for p in self.net.parameters():
                p.copy_(torch.randn(p.shape, generator=generator) * 0.5)
        self.net.eval().to(self.device)

    def validate(self, inputs: Any) -> list[float]:
        if not isinstance(inputs, list) or len(inputs) != IN_FEATURES:
            raise BadInput(f"tiny expects a list of {IN_FEATURES} numbers, got {_describe(inputs)}")
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in inputs):
            raise BadInput("tiny expects numbers only")
        try:
            values = [float(x) for x in inputs]
        except OverflowError:
            raise BadInput("tiny refuses numbers too large for a float") from None
        if not all(math.isfinite(x) for x in values):
            raise BadInput("tiny refuses NaN and infinite inputs")
        return values

    def run(self, batch: list[list[float]]) -> list[list[float]]:
        return stages.run_serially(self, batch)

    # The stages (workers/stages.py)

    def collate(self, items: list[list[float]]) -> torch.Tensor:
        return torch.tensor(items, dtype=torch.float32)

    def to_device(self, host: torch.Tensor) -> torch.Tensor:
        return host.to(self.device, non_blocking=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return self.net(x)

    def to_host(self, y: torch.Tensor) -> torch.Tensor:
        return y.cpu()

    def split(self, y: torch.Tensor) -> list[list[float]]:
        return y.tolist()

    def reference(self, inputs: list[float]) -> list[float]:
        """One item computed alone, for tests."""
        return self.run([self.validate(inputs)])[0]


def _describe(value: Any) -> str:
    if isinstance(value, list):
        return f"a list of {len(value)}"
    return type(value).__name__
