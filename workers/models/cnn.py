"""A small image CNN with seeded weights, shipped as TorchScript (workers/repository/cnn/1).

Rebuild the shipped artifact with:
    python -m tandem.workers.models.cnn workers/repository/cnn/1/model.pt
"""

from __future__ import annotations

import sys

import torch

SEED = 7
CLASSES = 10


class SmallCNN(torch.nn.Module):
    """3x32x32 image in, 10 class probabilities out."""

    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(8, 16, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
        )
        self.head = torch.nn.Linear(16, CLASSES)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.head(self.features(image).flatten(1)), dim=1)


def build() -> SmallCNN:
    torch.manual_seed(SEED)
    return SmallCNN().eval()


def export(path: str) -> None:
    torch.jit.script(build()).save(path)


if __name__ == "__main__":
    export(sys.argv[1])
