"""A repository model loaded into torch: the device, the artifact, the forward pass.

Needs the worker extra (torch, safetensors); tandem.workers.models.repository, which
lists and resolves models, imports this only to load one.
"""

from __future__ import annotations

import importlib
import logging
import os
import zipfile
from typing import Any

import torch

from tandem.broker.errors import BadSetting, ModelLoadError, one_line
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
        """One forward pass of one example item, then of two (a fixed batch size shows
        there); the outputs are checked against the config's: count, dtype and shape."""
        sizes = (1, 2) if self.max_batch_size > 1 else (1,)
        for size in sizes:
            batch = self.collator.collate([self.collator.example() for _ in range(size)])
            try:
                with torch.inference_mode():
                    outputs = self.module(*self._to_device(batch))
            except Exception as e:
                where = self.config.artifact.path or self.config.directory
                raise ModelLoadError(
                    f"{where}: warm-up forward pass of {size} failed: "
                    f"{one_line(e)}{_batch_hint(self.config, e)}"
                ) from e
            problem = check_outputs(self.config, outputs, size)
            if problem:
                raise ModelLoadError(f"{self.config.directory / 'config.json'}: {problem}")


def check_outputs(config: ModelConfig, outputs: Any, size: int) -> str | None:
    """What differs between a batch's outputs and the config's declared ones, or None."""
    if isinstance(outputs, torch.Tensor):
        outputs = (outputs,)
    if isinstance(outputs, dict):
        names = [s.name for s in config.outputs]
        if sorted(outputs) != sorted(names):
            return f"the model returns outputs {sorted(outputs)}, the config declares {names}"
        outputs = tuple(outputs[n] for n in names)
    if not isinstance(outputs, (tuple, list)) or not all(
        isinstance(t, torch.Tensor) for t in outputs
    ):
        return f"the model returns {type(outputs).__name__}, not tensors"
    if len(outputs) != len(config.outputs):
        return (
            f"the model returns {len(outputs)} outputs, the config declares {len(config.outputs)}"
        )
    for spec, tensor in zip(config.outputs, outputs, strict=True):
        dtype = str(tensor.dtype).removeprefix("torch.")
        wanted = {spec.dtype} | ({"float16", "bfloat16"} if config.half else set())
        if dtype not in wanted:
            return f"output {spec.name} is {dtype}, the config declares {spec.dtype}"
        got = list(tensor.shape)
        declared = [size, *spec.shape]
        if len(got) != len(declared) or any(
            d not in (-1, g) for d, g in zip(declared, got, strict=True)
        ):
            shown = ", ".join("*" if d == -1 else str(d) for d in spec.shape)
            return (
                f"output {spec.name} has shape {got[1:]} per item (batch of {size}: {got}), "
                f"the config declares [{shown}]"
            )
    return None


def _batch_hint(config: ModelConfig, e: Exception) -> str:
    if config.artifact.kind == "export" and ("Guard failed" in str(e) or "size()[0]" in str(e)):
        # Positional dynamic shapes: they hold whatever the forward's arguments are named
        # (torch matches a dict by those names, not by the config's input names).
        return (
            "; the model was exported for a fixed batch size: export it with a dynamic "
            f"batch dimension on every argument, batch = torch.export.Dim('batch', min=1, "
            f"max={config.max_batch_size}); torch.export.export(model, args, "
            "dynamic_shapes=tuple({0: batch} for _ in args)), from an example batch of 2"
        )
    return ""


def _load_module(config: ModelConfig, device: torch.device) -> torch.nn.Module:
    artifact = config.artifact
    where = artifact.path or artifact.weights or config.directory / "config.json"
    try:
        if artifact.kind == "torchscript":
            if _saved_not_scripted(artifact.path):
                raise ModelLoadError(
                    f"{artifact.path}: a torch.save file (a state dict or a pickled module), "
                    "not TorchScript: save it with torch.jit.save(torch.jit.script(model), "
                    "'model.pt'), or load weights with {factory, weights}"
                )
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


def _saved_not_scripted(path) -> bool:
    """A torch.save archive holds data.pkl and no code/; a TorchScript one holds code/.
    Read from the zip's names alone, so nothing is unpickled."""
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
    return any(n.endswith("/data.pkl") for n in names) and not any("/code/" in n for n in names)


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
