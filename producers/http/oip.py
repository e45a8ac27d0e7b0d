"""Open Inference Protocol v2 over REST: health, metadata, config and infer.

A request's inputs hold a batch dimension first. Infer splits them into one task per
item, so each item is batched with other callers' items by the executors, and joins the
items' results back in order. Triton's request parameters: `timeout` in microseconds
(the task's deadline) and `priority` (0: the default, tandem's 0; 1 the highest, then
tandem's priority p - 1, up to 9).
"""

from __future__ import annotations

import asyncio
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import numpy as np
from starlette.responses import JSONResponse, Response

from tandem.broker.errors import BadInput, UnknownModel
from tandem.producers.http.gateway import Call, Deadline, Gateway, HTTPError, endpoint, task_error
from tandem.producers.http.tensors import (
    DATATYPES,
    FROM_DTYPE,
    InferRequest,
    Tensor,
    encode_output,
    parse_request,
    response_body,
)

#: Seconds a request waits past its deadline for the task's own DeadlineExceeded.
GRACE_S = 0.05


def server_version() -> str:
    try:
        return version("tandem-serve")
    except PackageNotFoundError:
        return "0"


async def _model(gateway: Gateway, call: Call) -> tuple[str, dict]:
    """NAME:VERSION of the path's model and its signature; 404 if no worker serves it."""
    params = call.path_params
    return await find_model(gateway, params["name"], params.get("version"))


async def find_model(gateway: Gateway, name: str, version: str | None) -> tuple[str, dict]:
    """NAME:VERSION of a model (its highest version served, without one) and its
    signature; UnknownModel if no worker serves it."""
    model = await gateway.client.resolve(name, version)
    spec = await gateway.client.spec(model)
    if spec is None:
        raise UnknownModel(f"no worker has served {model}")
    return model, spec


def _shape(row: dict) -> list[int]:
    return [-1, *row["shape"]]


@endpoint("/v2")
async def server_metadata(gateway: Gateway, call: Call) -> Response:
    return JSONResponse(
        {"name": "tandem", "version": server_version(), "extensions": ["binary_tensor_data"]}
    )


@endpoint("/v2/health/live", guarded=False)
async def live(gateway: Gateway, call: Call) -> Response:
    return Response(status_code=200)


@endpoint("/v2/health/ready", guarded=False)
async def ready(gateway: Gateway, call: Call) -> Response:
    """Ready while Redis answers and the result reader runs."""
    reason = await gateway.not_ready()
    if reason:
        raise HTTPError(503, reason)
    return Response(status_code=200)


@endpoint("/v2/models/{name}")
async def model_metadata(gateway: Gateway, call: Call) -> Response:
    model, spec = await _model(gateway, call)
    name, _, model_version = model.partition(":")

    def rows(kind: str) -> list[dict]:
        return [
            {"name": r["name"], "datatype": FROM_DTYPE[r["dtype"]], "shape": _shape(r)}
            for r in spec[kind]
        ]

    return JSONResponse(
        {
            "name": name,
            "versions": [model_version],
            "platform": "tandem",
            "inputs": rows("inputs"),
            "outputs": rows("outputs"),
        }
    )


@endpoint("/v2/models/{name}/ready")
async def model_ready(gateway: Gateway, call: Call) -> Response:
    model, _ = await _model(gateway, call)
    if not await gateway.client.live(model):
        raise HTTPError(503, f"no live executor serves {model}", retry_after_s=1)
    return Response(status_code=200)


@endpoint("/v2/models/{name}/config")
async def model_config(gateway: Gateway, call: Call) -> Response:
    """The few fields of Triton's model config that perf_analyzer reads."""
    model, spec = await _model(gateway, call)

    def rows(kind: str) -> list[dict]:
        return [
            {
                "name": r["name"],
                "data_type": "TYPE_" + FROM_DTYPE[r["dtype"]].replace("BYTES", "STRING"),
                "dims": r["shape"],
            }
            for r in spec[kind]
        ]

    return JSONResponse(
        {
            "name": model.partition(":")[0],
            "platform": "tandem",
            "max_batch_size": spec["max_batch_size"],
            "input": rows("inputs"),
            "output": rows("outputs"),
        }
    )


@endpoint("/v2/models/{name}/infer", method="POST", bounded=True)
async def infer(gateway: Gateway, call: Call) -> Response:
    body = call.body
    model, spec = await _model(gateway, call)
    parsed = parse_request(body, call.headers.get("inference-header-content-length"))
    items, binary = split(parsed, spec, gateway.limits.max_items)
    priority, deadline_s = parameters(parsed.parameters)
    results = await run(gateway, model, spec, items, priority, deadline_s, binary)
    return _response(model, spec, parsed, results)


def parameters(parameters: dict) -> tuple[int, float | None]:
    """tandem's priority and deadline from Triton's `priority` and `timeout` (us)."""
    priority = parameters.get("priority", 0)
    if not isinstance(priority, int) or isinstance(priority, bool) or priority < 0:
        raise BadInput("parameters.priority must be an integer >= 0")
    timeout_us = parameters.get("timeout", 0)
    if not isinstance(timeout_us, int) or isinstance(timeout_us, bool) or timeout_us < 0:
        raise BadInput("parameters.timeout must be an integer of microseconds >= 0")
    return min(max(priority - 1, 0), 9), (timeout_us / 1e6 if timeout_us else None)


async def run(
    gateway: Gateway,
    model: str,
    spec: dict,
    items: list[Any],
    priority: int,
    deadline_s: float | None,
    binary: bool,
    protocol: str = "http",
) -> list[Any]:
    """Submit one task per item and wait for them all: their results, in order. The wait
    ends at the deadline (the caller's, else the model's SLO, else the gateway's request
    timeout, which then becomes the tasks' deadline too). If the caller gives up (the
    wait is cancelled), its tasks not yet computed are revoked."""
    client = gateway.client
    if not await client.live(model):
        raise HTTPError(503, f"no live executor serves {model}", retry_after_s=1)
    slo_s = spec.get("slo_ms", 0) / 1000
    if deadline_s is None and not slo_s:
        deadline_s = gateway.limits.request_timeout_s
    futures = await client.submit_many(
        model, items, priority=priority, deadline_s=deadline_s, binary=binary
    )
    gateway.metrics.items.labels(protocol, model).inc(len(items))
    refused = next((f for f in futures if isinstance(f, Exception)), None)
    waiting = [f for f in futures if not isinstance(f, Exception)]
    if refused is not None:
        for future in waiting:  # the caller gets its "no" now; nobody waits for these
            future.cancel()
        raise refused
    try:
        with Deadline((deadline_s or slo_s) + GRACE_S):
            metas = [await future for future in waiting]
    except TimeoutError:
        for future in waiting:
            future.cancel()
        raise HTTPError(504, f"no result from {model} within the deadline") from None
    except asyncio.CancelledError:
        client.revoke_soon(waiting)
        for future in waiting:
            future.cancel()
        raise
    for meta in metas:
        if meta.get("status") != "SUCCESS":
            raise task_error(meta)
    return [meta["result"] for meta in metas]


def split(request: InferRequest, spec: dict, max_items: int) -> tuple[list[Any], bool]:
    """One task's inputs per item of the batch dimension, and whether to send them as
    tensors (the binary payload)."""
    given = {t.name: t for t in request.inputs}
    rows = spec["inputs"]
    unknown = set(given) - {r["name"] for r in rows}
    if unknown:
        raise BadInput(f"unknown inputs {sorted(unknown)}; expected {_describe(rows)}")
    columns, count = [], None
    for row in rows:
        tensor = given.get(row["name"])
        if tensor is None:
            raise BadInput(f"missing input {row['name']!r}; expected {_describe(rows)}")
        column = _column(tensor, row, spec["tensors"])
        if count is not None and len(column) != count:
            raise BadInput("inputs disagree on the batch size (their first dimension)")
        count = len(column)
        columns.append(column)
    if not count:
        raise BadInput("the batch is empty: the first dimension must be at least 1")
    if count > max_items:
        raise BadInput(f"{count} items in one request is over the limit of {max_items}")
    if len(rows) == 1 and not spec["tensors"]:
        return columns[0], False
    names = [r["name"] for r in rows]
    items = [dict(zip(names, values, strict=True)) for values in zip(*columns, strict=True)]
    binary = spec["tensors"] and any(r["dtype"] != "string" for r in rows)
    return items, binary


def _column(tensor: Tensor, row: dict, tensors: bool) -> list[Any]:
    """The tensor's items along its first dimension, checked against the signature."""
    label = f"input {row['name']!r}"
    wanted = FROM_DTYPE[row["dtype"]]
    if tensor.datatype != wanted:
        raise BadInput(f"{label}: datatype {tensor.datatype}, expected {wanted}")
    shape, item = tensor.shape, row["shape"]
    if wanted == "BYTES":  # one string per item: [N] or [N, 1]
        if len(shape) not in (1, 2) or (len(shape) == 2 and shape[1] != 1):
            raise BadInput(f"{label}: shape {list(shape)}, expected [N] or [N, 1] strings")
        return list(tensor.value)
    if len(shape) != len(item) + 1 or any(
        d not in (-1, n) for d, n in zip(item, shape[1:], strict=True)
    ):
        raise BadInput(f"{label}: shape {list(shape)}, expected {_shape(row)} (-1: any)")
    array = tensor.value
    return list(array) if tensors else [a.tolist() for a in array]


def _describe(rows: list[dict]) -> list[str]:
    return [f"{r['name']}: {FROM_DTYPE[r['dtype']]}{_shape(r)}" for r in rows]


def joined(spec: dict, request: InferRequest, results: list[Any]) -> list[tuple]:
    """The outputs asked for (all of them if none is named), each joined into one tensor
    along the batch dimension: (name, datatype, array, sent as binary data)."""
    rows = {r["name"]: r for r in spec["outputs"]}
    asked = request.outputs or []
    for wanted in asked:
        if wanted.name not in rows:
            raise BadInput(f"unknown output {wanted.name!r}; the outputs are {sorted(rows)}")
    chosen = [(w.name, w.binary) for w in asked] or [(name, request.binary_output) for name in rows]
    single = len(rows) == 1
    out = []
    for name, binary in chosen:
        datatype = FROM_DTYPE[rows[name]["dtype"]]
        values = [r if single else r[name] for r in results]
        try:
            array = np.asarray(values, dtype=DATATYPES[datatype])
        except (ValueError, TypeError) as e:
            raise HTTPError(500, f"output {name!r} cannot be joined into one tensor: {e}") from e
        out.append((name, datatype, array, binary))
    return out


def _response(model: str, spec: dict, request: InferRequest, results: list[Any]) -> Response:
    entries, raws = [], []
    for name, datatype, array, binary in joined(spec, request, results):
        entry, raw = encode_output(name, datatype, array, binary)
        entries.append(entry)
        raws.append(raw)
    name, _, model_version = model.partition(":")
    head: dict[str, Any] = {"model_name": name, "model_version": model_version}
    if request.id is not None:
        head["id"] = request.id
    head["outputs"] = entries
    body, header_length = response_body(head, raws)
    if header_length is None:
        return Response(body, media_type="application/json")
    return Response(
        body,
        media_type="application/octet-stream",
        headers={"Inference-Header-Content-Length": str(header_length)},
    )
