"""Redis clients from a URL: a plain one (redis://, rediss://, unix://), or the current
primary behind Redis Sentinel, in kombu's form, which Celery and Flower read too:

    sentinel://[:PASSWORD@]HOST:PORT[/DB][;sentinel://HOST:PORT ...]

with the master's name in the setting sentinel_master (TANDEM_SENTINEL_MASTER). A Sentinel
client asks the sentinels for the primary on each new connection, so after a failover
every process reconnects to the new one (a connection to a demoted primary fails as a
ConnectionError, which every caller already retries)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import redis
from redis.sentinel import Sentinel

from tandem.broker.errors import BadSetting

SCHEME = "sentinel://"


def is_sentinel(url: str) -> bool:
    return url.startswith(SCHEME)


def sentinel_parts(url: str) -> tuple[list[tuple[str, int]], str | None, int]:
    """The sentinels' addresses, the password and the database of a sentinel:// URL."""
    hosts, password, db = [], None, 0
    for part in filter(None, url.split(";")):
        if not part.startswith(SCHEME):
            raise BadSetting(f"{part!r} in a Sentinel URL is not {SCHEME}HOST:PORT")
        split = urlsplit(part)
        try:
            hosts.append((split.hostname or "localhost", split.port or 26379))
            if split.path.strip("/"):
                db = int(split.path.strip("/"))
        except ValueError as e:
            raise BadSetting(f"{part!r}: {e}") from None
        password = split.password or password
    if not hosts:
        raise BadSetting(f"{url!r} names no sentinel")
    return hosts, password, db


def connect(url: str, master: str = "", **options: Any) -> redis.Redis:
    """A client of the Redis at `url`; of the current primary if it is a Sentinel URL."""
    if not is_sentinel(url):
        return redis.Redis.from_url(url, **options)
    return _primary(Sentinel, url, master, options)


def connect_async(url: str, master: str = "", **options: Any):
    """connect(), for asyncio: a redis.asyncio client."""
    from redis import asyncio as aioredis
    from redis.asyncio.sentinel import Sentinel as AsyncSentinel

    if not is_sentinel(url):
        return aioredis.Redis.from_url(url, **options)
    return _primary(AsyncSentinel, url, master, options)


def _primary(sentinel_class, url: str, master: str, options: dict[str, Any]):
    hosts, password, db = sentinel_parts(url)
    if not master:
        raise BadSetting("a sentinel:// URL needs the master's name: TANDEM_SENTINEL_MASTER")
    timeout = options.get("socket_timeout") or 5.0
    sentinels = sentinel_class(
        hosts,
        socket_timeout=timeout,
        sentinel_kwargs={"password": password, "socket_timeout": timeout},
    )
    return sentinels.master_for(master, password=password, db=db, **options)


def celery_options(url: str, master: str) -> dict[str, Any]:
    """The Celery settings that point broker and result backend at the same Redis."""
    if not is_sentinel(url):
        return {}
    transport = {"master_name": master}
    return {
        "broker_transport_options": transport,
        "result_backend_transport_options": transport,
    }
