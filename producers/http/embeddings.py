"""OpenAI-style embeddings: POST /v1/embeddings, for text-embedding models.

A model qualifies when it takes one string and gives one vector of floats (minilm:1).
`input` is a string or a list of them, one task each; `encoding_format` is "float" or
"base64" (little-endian float32 bytes, what the `openai` package asks for by default).
Token arrays as input are refused: tandem tokenizes on its workers. Token counts are
not known at the gateway, so `usage` reports 0 tokens.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
from starlette.responses import JSONResponse, Response

from tandem.broker.errors import BadInput, UnknownModel
from tandem.producers.http import oip
from tandem.producers.http.gateway import Call, Gateway, endpoint
from tandem.producers.http.tensors import loads_object

#: Most strings one request may embed, as OpenAI's own limit.
MAX_INPUTS = 2048
FORMATS = ("float", "base64")


def _is_text_embedding(spec: dict) -> bool:
    ins, outs = spec["inputs"], spec["outputs"]
    return (
        len(ins) == 1
        and ins[0]["dtype"] == "string"
        and len(outs) == 1
        and outs[0]["dtype"].startswith("float")
    )


def parse(body: bytes) -> tuple[str, list[str], str]:
    """(model, the texts, the encoding format) of an embeddings request."""
    raw = loads_object(body)
    model = raw.get("model")
    if not isinstance(model, str) or not model:
        raise BadInput("'model' must be a model name, such as 'minilm:1'")
    texts = raw.get("input")
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list) or not texts:
        raise BadInput("'input' must be a string or a non-empty list of strings")
    if not all(isinstance(t, str) for t in texts):
        raise BadInput("'input' must hold strings: token arrays are not accepted")
    if not all(t.strip() for t in texts):
        raise BadInput("'input' holds an empty string")
    if len(texts) > MAX_INPUTS:
        raise BadInput(f"{len(texts)} inputs in one request is over the limit of {MAX_INPUTS}")
    encoding = raw.get("encoding_format", "float")
    if encoding not in FORMATS:
        raise BadInput(f"'encoding_format' must be one of {list(FORMATS)}")
    if raw.get("dimensions") is not None:
        raise BadInput("'dimensions' is not supported: the model gives its own size")
    return model, texts, encoding


def _encode(vector: list[float], encoding: str) -> Any:
    if encoding == "float":
        return vector
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()


@endpoint("/v1/embeddings", method="POST", bounded=True)
async def embeddings(gateway: Gateway, call: Call) -> Response:
    model_name, texts, encoding = parse(call.body)
    name, _, version = model_name.partition(":")
    model = await gateway.client.resolve(name, version or None)
    spec = await gateway.client.spec(model)
    if spec is None:
        raise UnknownModel(f"no worker has served {model}")
    if not _is_text_embedding(spec):
        raise BadInput(f"{model} is not a text-embedding model (one string in, one vector out)")
    vectors = await oip.run(gateway, model, spec, texts, 0, None, False)
    data = [
        {"object": "embedding", "index": n, "embedding": _encode(v, encoding)}
        for n, v in enumerate(vectors)
    ]
    usage = {"prompt_tokens": 0, "total_tokens": 0}
    return JSONResponse({"object": "list", "data": data, "model": model, "usage": usage})
