"""A model's config.json in the repository: batching, tensor specs, device, artifact.

    {
      "max_batch_size": 32, "max_wait_ms": 2, "max_queue": 10000, "slo_ms": 250,
      "inputs":  [{"name": "x", "dtype": "float32", "shape": [-1, 8], "max_length": 64}],
      "outputs": [{"name": "y", "dtype": "float32", "shape": [4]}],
      "padding_value": 0, "mask": "attention_mask",
      "device": "auto", "half": false,
      "artifact": "model.pt"
    }

Shapes leave out the batch dimension; -1 marks a variable dimension, bounded by
max_length. An input with a "tokenizer" (a tokenizer.json) takes a string and
feeds the token ids. "mask" is null, "attention_mask" or "lengths". "artifact"
is "model.pt" (TorchScript), "model.pt2" (torch.export), or
{"factory": "module:function", "weights": "model.safetensors"}. A path may be
"pkg:PACKAGE/relative/path" for files shipped inside an installed package.
"parameters" holds a factory's own settings; any key not listed here is refused.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tandem.broker.errors import ModelLoadError
from tandem.broker.extras import extra_of, install_hint
from tandem.broker.payload import DTYPES

MASKS = (None, "attention_mask", "lengths")


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[int, ...]
    max_length: int | None = None
    tokenizer: Path | None = None

    @property
    def variable(self) -> bool:
        return -1 in self.shape

    def describe(self) -> str:
        dims = ", ".join("*" if d == -1 else str(d) for d in self.shape)
        text = "string" if self.tokenizer else f"{self.dtype}[{dims}]"
        return f"{self.name}: {text}" + (f" (max {self.max_length})" if self.max_length else "")


@dataclass(frozen=True)
class Artifact:
    kind: str  # torchscript | export | factory
    path: Path | None = None
    factory: str | None = None
    weights: Path | None = None

    def describe(self) -> str:
        return f"{self.kind}: {self.factory or self.path}"


@dataclass(frozen=True)
class ModelConfig:
    name: str
    version: str
    directory: Path
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    artifact: Artifact
    max_batch_size: int = 32
    max_wait_ms: float = 0.0
    max_queue: int = 0
    slo_ms: float = 0.0
    padding_value: float = 0.0
    mask: str | None = None
    device: str = "auto"
    half: bool = False
    #: Free-form settings for a factory (Triton's name for them), e.g. minilm's bert_config.
    parameters: dict[str, Any] = field(default_factory=dict)

    @property
    def ref(self) -> str:
        return f"{self.name}:{self.version}"


class PackageMissing(FileNotFoundError):
    """A pkg: path whose package is not installed; `extra`: the extra that brings it."""

    def __init__(self, text: str, extra: str | None) -> None:
        super().__init__(text)
        self.extra = extra


def resolve(value: str, directory: Path) -> Path:
    """A path from a config: relative to the model version's folder, or pkg:PACKAGE/path."""
    if value.startswith("pkg:"):
        package, _, rest = value.removeprefix("pkg:").partition("/")
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            extra = extra_of(package)
            hint = f"; install it with {install_hint(extra)}" if extra else ""
            raise PackageMissing(f"package {package!r} is not installed{hint}", extra)
        return Path(next(iter(spec.submodule_search_locations))) / rest
    path = (directory / value).resolve()
    if directory.resolve() not in path.parents:
        raise FileNotFoundError(f"{value!r} is outside the model folder")
    return path


def load_config(path: Path) -> ModelConfig:
    """Read and check NAME/VERSION/config.json; every error names the file and the problem."""
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError as e:
        raise ModelLoadError(f"{path}: missing") from e
    except ValueError as e:
        raise ModelLoadError(f"{path}: not valid JSON: {e}") from e
    try:
        return _parse(raw, path)
    except (KeyError, TypeError, ValueError, FileNotFoundError) as e:
        problem = f"missing field {e}" if isinstance(e, KeyError) else str(e)
        error = ModelLoadError(f"{path}: {problem}")
        error.extra = e.extra if isinstance(e, PackageMissing) else None
        raise error from e


#: The keys a config, a tensor and a factory artifact may have; any other is refused, as
#: Triton refuses one (a typo would otherwise run with the default, silently).
KEYS = {
    "config": (
        "max_batch_size",
        "max_wait_ms",
        "max_queue",
        "slo_ms",
        "inputs",
        "outputs",
        "padding_value",
        "mask",
        "device",
        "half",
        "artifact",
        "parameters",
    ),
    "tensor": ("name", "dtype", "shape", "max_length", "tokenizer"),
    "artifact": ("factory", "weights"),
}


def _known(raw: Any, kind: str, where: str) -> None:
    if not isinstance(raw, dict):
        raise TypeError(f"{where} must be a JSON object, got {type(raw).__name__}")
    for key in raw:
        if key not in KEYS[kind]:
            close = difflib.get_close_matches(str(key), KEYS[kind], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(
                f"unknown key {key!r} in {where}{hint}; known: {', '.join(KEYS[kind])}"
            )


def _parse(raw: dict, path: Path) -> ModelConfig:
    _known(raw, "config", "the config")
    directory = path.parent
    inputs = tuple(_tensor(t, directory, "inputs") for t in raw["inputs"])
    outputs = tuple(_tensor(t, directory, "outputs") for t in raw["outputs"])
    if not inputs or not outputs:
        raise ValueError("inputs and outputs must each list at least one tensor")
    mask = raw.get("mask")
    if mask not in MASKS:
        raise ValueError(f"mask must be one of {MASKS}, got {mask!r}")
    batch = int(raw.get("max_batch_size", 32))
    if batch < 1:
        raise ValueError("max_batch_size must be at least 1")
    slo_ms = float(raw.get("slo_ms", 0.0))
    if not math.isfinite(slo_ms) or slo_ms < 0:
        raise ValueError(f"slo_ms must be a finite number >= 0, got {raw.get('slo_ms')!r}")
    parameters = raw.get("parameters", {})
    if not isinstance(parameters, dict):
        raise TypeError(f"parameters must be a JSON object, got {type(parameters).__name__}")
    return ModelConfig(
        name=directory.parent.name,
        version=directory.name,
        directory=directory,
        inputs=inputs,
        outputs=outputs,
        artifact=_artifact(raw["artifact"], directory),
        max_batch_size=batch,
        max_wait_ms=float(raw.get("max_wait_ms", 0.0)),
        max_queue=int(raw.get("max_queue", 0)),
        slo_ms=slo_ms,
        padding_value=float(raw.get("padding_value", 0.0)),
        mask=mask,
        device=str(raw.get("device", "auto")),
        half=bool(raw.get("half", False)),
        parameters=parameters,
    )


def _tensor(raw: dict, directory: Path, where: str) -> TensorSpec:
    _known(raw, "tensor", f"a tensor of {where}")
    name = raw["name"]
    tokenizer = raw.get("tokenizer")
    dtype = "int64" if tokenizer else raw["dtype"]
    if dtype not in DTYPES:
        raise ValueError(f"{where} {name}: dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    shape = tuple(int(d) for d in raw.get("shape", [-1] if tokenizer else []))
    if any(d == 0 or d < -1 for d in shape):
        raise ValueError(f"{where} {name}: dimensions must be positive or -1, got {list(shape)}")
    max_length = raw.get("max_length")
    if tokenizer and max_length is None:
        raise ValueError(f"{where} {name}: a tokenized input needs max_length")
    path = resolve(tokenizer, directory) if tokenizer else None
    if path and not path.is_file():
        raise FileNotFoundError(f"{where} {name}: tokenizer {path} does not exist")
    return TensorSpec(
        name=name,
        dtype=dtype,
        shape=shape,
        max_length=int(max_length) if max_length else None,
        tokenizer=path,
    )


def _artifact(raw: Any, directory: Path) -> Artifact:
    if isinstance(raw, str):
        path = resolve(raw, directory)
        kind = {".pt": "torchscript", ".pt2": "export"}.get(path.suffix)
        if kind is None:
            raise ValueError(
                f"artifact {raw!r}: expected a .pt (TorchScript) or .pt2 "
                "(torch.export) file, or {factory, weights}"
            )
        if not path.is_file():
            raise FileNotFoundError(f"artifact {path} does not exist")
        return Artifact(kind=kind, path=path)
    _known(raw, "artifact", "artifact")
    factory = raw["factory"]
    if ":" not in factory:
        raise ValueError(f"factory must be 'module:function', got {factory!r}")
    weights = resolve(raw["weights"], directory) if raw.get("weights") else None
    if weights and not weights.is_file():
        raise FileNotFoundError(f"weights {weights} do not exist")
    return Artifact(kind="factory", factory=factory, weights=weights)
