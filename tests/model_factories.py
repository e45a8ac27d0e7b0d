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


class Identity(torch.nn.Module):
    """Returns its input itself: its outputs are views of the batch's host slot."""

    def forward(self, x: torch.Tensor, lengths: torch.Tensor):
        return x, lengths


def identity(config) -> torch.nn.Module:
    return Identity()
