"""Factories for test models in temporary repositories (imported by worker processes too)."""

from __future__ import annotations

import torch


class MaskedMean(torch.nn.Module):
    """x [B, L, 4] with lengths [B]: the mean of the real rows, and each row doubled."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor, lengths: torch.Tensor):
        mask = (torch.arange(x.shape[1])[None, :] < lengths[:, None]).unsqueeze(-1)
        mean = (x * mask).sum(1) / lengths[:, None]
        if bool((x == 666).any()):
            raise RuntimeError("poisoned input")
        return mean * self.scale, x * 2


def masked_mean(config) -> torch.nn.Module:
    return MaskedMean()


def linear(config) -> torch.nn.Module:
    return torch.nn.Linear(4, 2)
