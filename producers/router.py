"""Producers for a deployment past one Redis: one Redis per group of models, each with its
own workers and coordinator, and a map from model to Redis (docs/scaling.md).

    with Router({"resnet18": "redis://a:6379/0", "minilm:1": "redis://b:6379/0"}) as router:
        router.submit("minilm:1", "a sentence").get(timeout=10)

The map's keys are NAME:VERSION or NAME (every version); the most precise key wins. A
model the map does not name goes to `default`, if given. Set it from the environment
with TANDEM_REDIS_MAP="resnet18=redis://a:6379/0,minilm:1=redis://b:6379/0".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tandem.broker import keys
from tandem.broker.errors import BadSetting, UnknownModel
from tandem.broker.settings import load_settings
from tandem.producers.client import Client, TandemResult

ENV = "TANDEM_REDIS_MAP"


def parse_map(text: str) -> dict[str, str]:
    """MODEL=URL pairs, comma-separated; raises BadSetting on a malformed one."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        model, sep, url = part.partition("=")
        model, url = model.strip(), url.strip()
        if not sep or not url or not _is_model_key(model):
            raise BadSetting(
                f"{ENV}: {part!r} is not MODEL=REDIS_URL (MODEL: NAME or NAME:VERSION)"
            )
        out[model] = url
    return out


def _is_model_key(model: str) -> bool:
    try:
        keys.parse_model(model if ":" in model else f"{model}:0")
    except ValueError:
        return False
    return True


class Router:
    """Submit to the Redis that serves each model: one Client per Redis, made on first use."""

    def __init__(self, redis_for: Mapping[str, str] | None = None, default: str | None = None):
        self.redis_for = (
            dict(redis_for) if redis_for is not None else parse_map(load_settings().redis_map)
        )
        for model in self.redis_for:
            if not _is_model_key(model):
                raise BadSetting(f"{model!r} is not NAME or NAME:VERSION")
        self.default = default
        self._clients: dict[str, Client] = {}

    def url_for(self, model: str) -> str:
        """The Redis URL of a model: its NAME:VERSION, else its NAME, else the default."""
        name, _ = keys.parse_model(model)
        url = self.redis_for.get(model) or self.redis_for.get(name) or self.default
        if url is None:
            raise UnknownModel(f"no Redis is mapped for {model!r} and there is no default")
        return url

    def client_for(self, model: str) -> Client:
        url = self.url_for(model)
        if url not in self._clients:
            self._clients[url] = Client(settings=load_settings(redis_url=url))
        return self._clients[url]

    def submit(self, model: str, inputs: Any, **options: Any) -> TandemResult:
        """Client.submit on the model's Redis; the same options and errors."""
        return self.client_for(model).submit(model, inputs, **options)

    def submit_many(self, model: str, inputs: Iterable[Any], **options: Any) -> list[TandemResult]:
        return self.client_for(model).submit_many(model, inputs, **options)

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    def __enter__(self) -> Router:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
