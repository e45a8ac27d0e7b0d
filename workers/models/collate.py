"""Validate one task's inputs against the spec, batch them with padding, split outputs.

Policy: JSON numbers are converted to the input's dtype when that loses
nothing (ints to floats, ints within range to a smaller int type); floats for
an integer input are refused. Binary tensors must carry the exact dtype. NaN and
infinite values are refused. Variable dimensions must be 1..max_length long.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch

from tandem.broker.errors import BadInput
from tandem.broker.extras import require
from tandem.workers.models.spec import ModelConfig, TensorSpec
from tandem.workers.models.staging import Slot

Item = dict[str, torch.Tensor]


@dataclass
class Batch:
    """Batched inputs, in config order, then the mask or lengths if the config asks."""

    args: list[torch.Tensor]
    lengths: list[int] | None  # each task's length along the first variable dimension


class Collator:
    def __init__(self, config: ModelConfig) -> None:
        self.config = config

    @cached_property
    def tokenizers(self) -> dict[str, Any]:
        require("embed", f"the tokenizer inputs of {self.config.directory}")
        from tokenizers import Tokenizer

        loaded = {}
        for spec in self.config.inputs:
            if spec.tokenizer:
                tokenizer = Tokenizer.from_file(str(spec.tokenizer))
                assert spec.max_length is not None  # a tokenizer's input needs one (spec.py)
                tokenizer.enable_truncation(spec.max_length)
                tokenizer.no_padding()
                loaded[spec.name] = tokenizer
        return loaded

    # One task

    def validate(self, inputs: Any) -> Item:
        specs = self.config.inputs
        if len(specs) == 1 and not isinstance(inputs, dict):
            inputs = {specs[0].name: inputs}  # a dict is by name: no tensor is a dict
        if not isinstance(inputs, dict):
            names = ", ".join(s.name for s in specs)
            raise BadInput(f"inputs must be an object with {names}")
        unknown = set(inputs) - {s.name for s in specs}
        if unknown:
            raise BadInput(
                f"unknown inputs {sorted(unknown)}; expected {[s.describe() for s in specs]}"
            )
        item = {}
        for spec in specs:
            if spec.name not in inputs:
                raise BadInput(f"missing input {spec.describe()}")
            item[spec.name] = self._tensor(spec, inputs[spec.name])
        return item

    def _tensor(self, spec: TensorSpec, value: Any) -> torch.Tensor:
        if spec.tokenizer:
            return self._tokenize(spec, value)
        tensor = value if isinstance(value, torch.Tensor) else _from_json(spec, value)
        expected = getattr(torch, spec.dtype)
        if tensor.dtype != expected:
            raise BadInput(
                f"input {spec.name}: dtype {str(tensor.dtype)[6:]}, expected {spec.dtype}"
            )
        _check_shape(spec, tuple(tensor.shape))
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise BadInput(f"input {spec.name}: NaN or infinite values are refused")
        return tensor

    def _tokenize(self, spec: TensorSpec, value: Any) -> torch.Tensor:
        if not isinstance(value, str) or not value.strip():
            raise BadInput(f"input {spec.name}: expected a non-empty string")
        ids = self.tokenizers[spec.name].encode(value).ids
        return torch.tensor(ids, dtype=torch.int64)

    # A batch

    def collate(self, items: list[Item], slot: Slot | None = None) -> Batch:
        """The items stacked (padded where variable), into the slot's buffers if given."""

        def new(shape: list[int], dtype: torch.dtype) -> torch.Tensor:
            if slot is None:
                return torch.empty(shape, dtype=dtype)
            return slot.tensor(len(args), shape, dtype)

        args: list[torch.Tensor] = []
        lengths = None
        for spec in self.config.inputs:
            tensors = [item[spec.name] for item in items]
            if not spec.variable:
                args.append(
                    torch.stack(
                        tensors, out=new([len(tensors), *tensors[0].shape], tensors[0].dtype)
                    )
                )
                continue
            dim = spec.shape.index(-1)
            if lengths is None:
                lengths = [t.shape[dim] for t in tensors]
            shape = [max(t.shape[d] for t in tensors) for d in range(tensors[0].dim())]
            args.append(
                _pad(
                    tensors,
                    self.config.padding_value,
                    new([len(tensors), *shape], tensors[0].dtype),
                )
            )
        if self.config.mask and lengths is not None:
            size = torch.tensor(lengths)
            if self.config.mask == "lengths":
                mask = size
            else:
                mask = (torch.arange(max(lengths))[None, :] < size[:, None]).long()
            args.append(new(list(mask.shape), mask.dtype).copy_(mask))
        return Batch(args=args, lengths=lengths)

    def split(self, outputs: Any, batch: Batch, count: int) -> list[Any]:
        """One JSON-ready result per task, with padding trimmed from variable outputs."""
        named = _named(outputs, self.config.outputs)
        results: list[dict[str, Any]] = [{} for _ in range(count)]
        for spec in self.config.outputs:
            tensor = named[spec.name]
            if tensor.shape[0] != count:
                raise ValueError(f"output {spec.name} has {tensor.shape[0]} rows for {count} tasks")
            tensor = tensor.detach().to("cpu")
            if tensor.dtype in (torch.float16, torch.bfloat16):
                tensor = tensor.float()
            for n in range(count):
                row = tensor[n]
                if spec.variable and batch.lengths is not None:
                    row = row.narrow(spec.shape.index(-1), 0, batch.lengths[n])
                results[n][spec.name] = row.tolist()
        if len(self.config.outputs) == 1:
            return [r[self.config.outputs[0].name] for r in results]
        return results

    def example(self) -> Item:
        """A small valid item, for the warm-up pass."""
        item = {}
        for spec in self.config.inputs:
            if spec.tokenizer:
                item[spec.name] = self._tokenize(spec, "warm up")
            else:
                shape = [1 if d == -1 else d for d in spec.shape]
                item[spec.name] = torch.zeros(shape, dtype=getattr(torch, spec.dtype))
        return item


def _from_json(spec: TensorSpec, value: Any) -> torch.Tensor:
    if isinstance(value, (str, bytes, dict)) or value is None:
        raise BadInput(f"input {spec.name}: expected {spec.describe()}, got {type(value).__name__}")
    try:
        tensor = torch.tensor(value)
    except OverflowError:
        raise BadInput(f"input {spec.name}: a number is too large for any tensor dtype") from None
    except (TypeError, ValueError, RuntimeError) as e:
        raise BadInput(f"input {spec.name}: not a rectangular array of numbers ({e})") from e
    target = getattr(torch, spec.dtype)
    if tensor.numel() == 0:
        return tensor.to(target)  # [] has no dtype of its own: its shape is the problem
    if tensor.dtype == target or tensor.dtype == torch.bool or target == torch.bool:
        return tensor  # equal, or a mismatch the caller reports
    if target.is_floating_point:
        return torch.tensor(value, dtype=target)  # parsed again, at full precision
    if tensor.dtype.is_floating_point:
        return tensor  # floats for an integer input: the caller reports the mismatch
    info = torch.iinfo(target)
    if tensor.numel() and (tensor.min() < info.min or tensor.max() > info.max):
        raise BadInput(f"input {spec.name}: values out of range for {spec.dtype}")
    return tensor.to(target)


def _check_shape(spec: TensorSpec, shape: tuple[int, ...]) -> None:
    if len(shape) != len(spec.shape):
        raise BadInput(
            f"input {spec.name}: rank {len(shape)} {list(shape)}, expected {spec.describe()}"
        )
    for got, want in zip(shape, spec.shape, strict=True):
        if want == -1:
            if got < 1:
                raise BadInput(f"input {spec.name}: empty along a variable dimension")
            if spec.max_length and got > spec.max_length:
                raise BadInput(
                    f"input {spec.name}: length {got} is over the maximum {spec.max_length}"
                )
        elif got != want:
            raise BadInput(f"input {spec.name}: shape {list(shape)}, expected {spec.describe()}")


def _pad(tensors: list[torch.Tensor], value: float, out: torch.Tensor) -> torch.Tensor:
    out.fill_(value)
    for n, tensor in enumerate(tensors):
        out[n][tuple(slice(0, s) for s in tensor.shape)] = tensor
    return out


def _named(outputs: Any, specs: tuple[TensorSpec, ...]) -> dict[str, torch.Tensor]:
    if isinstance(outputs, torch.Tensor):
        outputs = (outputs,)
    if isinstance(outputs, dict):
        missing = [s.name for s in specs if s.name not in outputs]
        if missing:
            raise ValueError(f"model returned no {missing}")
        return {s.name: outputs[s.name] for s in specs}
    outputs = tuple(outputs)
    if len(outputs) < len(specs):
        raise ValueError(f"model returned {len(outputs)} outputs, config lists {len(specs)}")
    return {s.name: t for s, t in zip(specs, outputs, strict=False)}
