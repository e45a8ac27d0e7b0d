"""A repository model loaded into torch: the device, the artifact, the forward pass.

Needs the worker extra (torch, safetensors); tandem.workers.models.repository, which
lists and resolves models, imports this only to load one.
"""

from __future__ import annotations

import importlib
import logging
import os
import zipfile
from dataclasses import dataclass, field
from typing import Any

import torch

from tandem.broker.errors import BadSetting, ModelLoadError, one_line
from tandem.broker.extras import extra_of, install_hint
from tandem.workers import stages
from tandem.workers.models.collate import Batch, Collator, Item
from tandem.workers.models.spec import ModelConfig
from tandem.workers.models.staging import Slot, Slots, map_tensors

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


@dataclass
class _Host:
    """A batch collated into a host slot."""

    batch: Batch
    count: int
    slot: Slot


@dataclass
class _OnDevice:
    """A batch's inputs on the device (on a GPU, once events[1] has completed)."""

    args: list[torch.Tensor]
    host: _Host
    events: tuple | None = None  # the copy's start and end, on a GPU
    release: Any = None  # frees the host slot, where the forward pass reads it


@dataclass
class _Outputs:
    outputs: Any
    batch: _OnDevice
    events: tuple | None = None  # the forward pass's start and end, on a GPU
    times: dict[str, float] = field(default_factory=dict)


@dataclass
class _OnHost:
    outputs: Any
    batch: _OnDevice
    times: dict[str, float] = field(default_factory=dict)
    release: Any = None  # frees the output slot, once split


def _events() -> tuple[torch.cuda.Event, torch.cuda.Event]:
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


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
        cuda = self.device.type == "cuda"
        self._in_slots, self._out_slots = Slots(pinned=cuda), Slots(pinned=cuda)
        self._streams = (
            {name: torch.cuda.Stream(self.device) for name in ("copy_in", "compute", "copy_out")}
            if cuda
            else {}
        )
        self._warm_up()

    def __repr__(self) -> str:
        return f"<RepoModel {self.config.ref} {self.config.artifact.kind} on {self.device}>"

    def validate(self, inputs: Any) -> Item:
        return self.collator.validate(inputs)

    def run(self, batch: list[Item]) -> list[Any]:
        """Every stage, one after another (workers/stages.py)."""
        job = stages.compute(self, stages.stage_in(self, batch))
        #: The last forward pass's GPU time: the executor reports it as device_ms.
        self.last_device_ms = job.times.get("device")
        return stages.finish(self, job)

    # The stages. On a GPU: the copy in on a stream of its own, which the forward pass's
    # stream waits on by an event; the copy out on a third stream, into a pinned slot.
    # On the CPU the same steps, with no streams and no copies.

    def collate(self, items: list[Item]) -> _Host:
        slot = self._in_slots.take()
        try:
            return _Host(self.collator.collate(items, slot), len(items), slot)
        except BaseException:
            self._in_slots.back(slot)
            raise

    def to_device(self, host: _Host) -> _OnDevice:
        if self.device.type != "cuda":  # forward reads the slot: free it after the split
            release = self._in_slots.releaser(host.slot)
            return _OnDevice(self._half(host.batch.args), host, release=release)
        stream, events = self._streams["copy_in"], _events()
        with torch.cuda.stream(stream):
            events[0].record(stream)
            args = self._half([t.to(self.device, non_blocking=True) for t in host.batch.args])
            events[1].record(stream)
        for tensor in args:  # allocated on the copy stream, read on the compute stream
            tensor.record_stream(self._streams["compute"])
        self._in_slots.back(host.slot, events[1])  # free once the copy that read it is done
        return _OnDevice(args, host, events=events)

    def forward(self, batch: _OnDevice) -> _Outputs:
        with torch.inference_mode():
            if self.device.type != "cuda":
                return _Outputs(self.module(*batch.args), batch)
            stream, events = self._streams["compute"], _events()
            assert batch.events is not None  # to_device() records them on a GPU
            with torch.cuda.stream(stream):
                stream.wait_event(batch.events[1])  # on the copy, not on the host
                events[0].record(stream)
                outputs = self.module(*batch.args)
                events[1].record(stream)
        events[1].synchronize()
        return _Outputs(outputs, batch, events, {"device": events[0].elapsed_time(events[1])})

    def to_host(self, out: _Outputs) -> _OnHost:
        if self.device.type != "cuda":
            return _OnHost(out.outputs, out.batch)
        slot, stream, events = self._out_slots.take(), self._streams["copy_out"], _events()
        index = iter(range(1 << 30))

        def copy(tensor: torch.Tensor) -> torch.Tensor:
            tensor.record_stream(stream)  # made on the compute stream, read on this one
            pinned = slot.tensor(next(index), tensor.shape, tensor.dtype)
            return pinned.copy_(tensor, non_blocking=True)

        assert out.events is not None and out.batch.events is not None  # recorded on a GPU
        with torch.cuda.stream(stream):
            stream.wait_event(out.events[1])
            events[0].record(stream)
            outputs = map_tensors(out.outputs, copy)
            events[1].record(stream)
        events[1].synchronize()
        times = {"copy_out": events[0].elapsed_time(events[1])}
        copied_in = out.batch.events
        times["copy_in"] = copied_in[0].elapsed_time(copied_in[1])
        return _OnHost(outputs, out.batch, times, self._out_slots.releaser(slot))

    def split(self, host: _OnHost) -> list[Any]:
        try:
            batch = host.batch.host
            return self.collator.split(host.outputs, batch.batch, batch.count)
        finally:
            if host.release is not None:
                host.release()

    def _half(self, args: list[torch.Tensor]) -> list[torch.Tensor]:
        if not self.config.half:
            return args
        return [t.half() if t.is_floating_point() else t for t in args]

    def _to_device(self, batch: Batch) -> list[torch.Tensor]:
        """A batch's inputs on the device, plainly (the warm-up's)."""
        return self._half([t.to(self.device) for t in batch.args])

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
        full = [self.collator.example() for _ in range(self.max_batch_size)]
        for slot in self._in_slots.all:  # sized for the max batch before the first task
            self.collator.collate(full, slot)


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
    module_name, _, function = (artifact.factory or "").partition(":")
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
