"""A repository model loaded into torch: the device, the artifact, the forward pass.

Needs the worker extra (torch, safetensors); tandem.workers.models.repository, which
lists and resolves models, imports this only to load one.
"""

from __future__ import annotations

import importlib
import logging
import os
from typing import Any

import torch

from tandem.broker.errors import BadSetting, ModelLoadError
from tandem.broker.extras import extra_of, install_hint
from tandem.workers.models.collate import Batch, Collator, Item
from tandem.workers.models.spec import ModelConfig

log = logging.getLogger("tandem.models")


def pick_device(device: str) -> torch.device:
    """'auto' picks CUDA when it is present, else the CPU. A CUDA device this process
    cannot see is refused with BadSetting, never left to fail at the first batch."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        chosen = torch.device(device)
    except RuntimeError as e:
        raise BadSetting(f"device {device!r} is not a torch device: {e}") from None
    if chosen.type == "cuda":
        count = torch.cuda.device_count()
        if (chosen.index or 0) >= count:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
            raise BadSetting(
                f"device {device} is not visible: this process sees {count} CUDA device(s) "
                f"(CUDA_VISIBLE_DEVICES={visible}); a container given one GPU sees it as cuda:0"
            )
    return chosen


class RepoModel:
    """A repository model, as an executor sees it: validate one task, run a batch."""

    def __init__(self, config: ModelConfig, device: str = "auto") -> None:
        self.config = config
        self.device = pick_device(device)
        self.collator = Collator(config)
        self.module = _load_module(config, self.device)
        self.max_batch_size = config.max_batch_size
        self.max_wait_ms = config.max_wait_ms
        self.max_queue = config.max_queue
        self.slo_ms = config.slo_ms
        self.last_device_ms: float | None = None
        self._warm_up()

    def __repr__(self) -> str:
        return f"<RepoModel {self.config.ref} {self.config.artifact.kind} on {self.device}>"

    def validate(self, inputs: Any) -> Item:
        return self.collator.validate(inputs)

    def run(self, batch: list[Item]) -> list[Any]:
        collated = self.collator.collate(batch)
        with torch.inference_mode():
            args = self._to_device(collated)
            if self.device.type != "cuda":
                return self.collator.split(self.module(*args), collated, len(batch))
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            outputs = self.module(*args)
            end.record()
            out = self.collator.split(outputs, collated, len(batch))
        end.synchronize()
        #: The last forward pass's GPU time: the executor reports it as device_ms.
        self.last_device_ms = start.elapsed_time(end)
        return out

    def _to_device(self, batch: Batch) -> list[torch.Tensor]:
        args = []
        for tensor in batch.args:
            if self.config.half and tensor.is_floating_point():
                tensor = tensor.half()
            if self.device.type == "cuda":
                tensor = tensor.pin_memory().to(self.device, non_blocking=True)
            args.append(tensor)
        return args

    def _warm_up(self) -> None:
        try:
            self.run([self.collator.example()])
        except Exception as e:
            raise ModelLoadError(
                f"{self.config.directory}: warm-up forward pass failed: {type(e).__name__}: {e}"
            ) from e


def _load_module(config: ModelConfig, device: torch.device) -> torch.nn.Module:
    artifact = config.artifact
    where = artifact.path or artifact.weights or config.directory / "config.json"
    try:
        if artifact.kind == "torchscript":
            module = torch.jit.load(str(artifact.path), map_location=device)
        elif artifact.kind == "export":
            module = torch.export.load(str(artifact.path)).module()
        else:
            module = _from_factory(config)
    except ModelLoadError:
        raise
    except Exception as e:
        raise ModelLoadError(
            f"{where}: cannot load {artifact.describe()}: {type(e).__name__}: {e}"
        ) from e
    if hasattr(module, "eval") and artifact.kind != "export":
        module.eval()
    module = module.to(device)
    return module.half() if config.half else module


def _from_factory(config: ModelConfig) -> torch.nn.Module:
    artifact = config.artifact
    module_name, _, function = artifact.factory.partition(":")
    try:
        build = getattr(importlib.import_module(module_name), function)
    except (ImportError, AttributeError) as e:
        missing = getattr(e, "name", None) or ""
        hint = f"; install it with {install_hint(extra)}" if (extra := extra_of(missing)) else ""
        error = ModelLoadError(
            f"{config.directory / 'config.json'}: factory {artifact.factory!r} not found: {e}"
            + hint
        )
        error.extra = extra
        raise error from e
    module = build(config)
    if artifact.weights:
        from safetensors.torch import load_file

        try:
            state = load_file(str(artifact.weights))
        except Exception as e:
            raise ModelLoadError(f"{artifact.weights}: not a safetensors file: {e}") from e
        result = module.load_state_dict(state, strict=False)
        if result.missing_keys:
            raise ModelLoadError(f"{artifact.weights}: no weights for {result.missing_keys}")
        if result.unexpected_keys:
            log.info("%s: ignored weights %s", artifact.weights, result.unexpected_keys)
    return module
