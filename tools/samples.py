"""Sample inputs for load tests and the demo, made from a model's name or its spec."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from tandem.broker.keys import parse_model

SENTENCES = (
    "A man is eating a piece of bread.",
    "The new movie is awesome and everyone loved it.",
    "A cheetah is running behind its prey across the savanna.",
    "The stock market fell sharply on Monday after the announcement.",
    "Two children are playing football in the park on a sunny afternoon.",
    "Please reset my password, I cannot log in to my account anymore.",
)


def sampler(model: str, repository: str = "") -> Callable[[int], Any]:
    """A function from a sequence number to valid inputs for `model`."""
    name, _ = parse_model(model)
    if name == "sim":
        return lambda n: [n]
    if name == "tiny":
        return lambda n: [float((n + k) % 7) for k in range(8)]
    from tandem.workers.models.repository import Repository

    specs = Repository(repository or None).config(model).inputs
    rng = random.Random(0)

    def make(n: int) -> Any:
        values = {s.name: _value(s, n, rng) for s in specs}
        return values[specs[0].name] if len(specs) == 1 else values

    return make


def _value(spec, n: int, rng: random.Random) -> Any:
    if spec.tokenizer:
        return SENTENCES[n % len(SENTENCES)]
    import torch

    shape = [min(spec.max_length or 8, 8) if d == -1 else d for d in spec.shape]
    if spec.dtype.startswith("float"):
        return torch.rand(shape, generator=torch.Generator().manual_seed(n)).to(
            getattr(torch, spec.dtype)
        )
    return torch.randint(0, 100, shape, dtype=getattr(torch, spec.dtype))
